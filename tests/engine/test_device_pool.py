"""Host buffers reused between the GEMM tiles of one run (blocklin.device.pool)."""

from __future__ import annotations

import numpy as np

import blocklin as bl
from blocklin.device import pool


def test_buffers_are_reused_only_inside_a_run_and_by_exact_shape():
    outside = pool.empty((4, 5), "float64")
    pool.give(outside)
    assert pool.empty((4, 5), "float64") is not outside  # no run: nothing kept
    with pool.reusing():
        a = pool.empty((4, 5), "float64")
        pool.give(a)
        assert pool.empty((4, 6), "float64") is not a and pool.empty((4, 5), "float32") is not a
        with pool.reusing():  # nested: the same pool
            assert pool.empty((4, 5), "float64") is a
        pool.give(a)
    with pool.reusing():
        assert pool.empty((4, 5), "float64") is not a  # dropped when the run ended


def test_tiles_reuse_buffers_and_give_numpy_results(tmp_path, monkeypatch):
    """Several tiles, edge tiles smaller than the plan's: each takes the buffers the previous one
    left (one accumulator and one set of slots are ever allocated on the sync scheduler), and the
    product is NumPy's: a reused accumulator holds nothing of the previous tile."""
    rng = np.random.default_rng(7)
    a, b = rng.standard_normal((300, 250)), rng.standard_normal((250, 290))
    ap = bl.from_array(a, tmp_path / "a.zarr", chunks=(64, 64)).path
    bp = bl.from_array(b, tmp_path / "b.zarr", chunks=(64, 64)).path
    plan = bl.matmul(ap, bp, memory="400KiB", explain=True)
    assert plan.n_tasks > 3 and (300 % plan.tm or 290 % plan.tn)  # edge tiles too
    made = []
    real = pool._fresh

    def counting(shape, dtype):
        made.append(tuple(shape))
        return real(shape, dtype)

    monkeypatch.setattr(pool, "_fresh", counting)
    c = bl.matmul(ap, bp, tmp_path / "c.zarr", memory="400KiB", scheduler="sync")
    np.testing.assert_allclose(c.to_numpy(), a @ b, rtol=0, atol=1e-12 * np.abs(a @ b).max())
    # one accumulator and prefetch + 1 slots of A and B panels, taken again by every later tile
    # (without reuse: that many per tile)
    assert (plan.tm, plan.tn) in made and len(made) == 1 + 2 * (plan.prefetch + 1)


def test_buffers_start_on_a_page():
    """Host buffers start on a page boundary (the page cache's copy into a chunk read's destination
    16 bytes past one, where glibc maps large blocks, is several times slower), whatever their shape,
    dtype or size; kept ones too; small ones are plain arrays."""
    for shape, dtype in (((1000, 513), "float64"), ((3, 70000), "complex64"), ((2**20 + 3,), "uint8"),
                         (12345, "float32")):
        a = pool.aligned_empty(shape, dtype)
        want = (shape,) if isinstance(shape, int) else shape
        assert a.shape == want and a.dtype == np.dtype(dtype) and a.flags.c_contiguous and a.flags.writeable
        assert a.ctypes.data % pool.ALIGNMENT == 0
        a[...] = 1  # the whole view is usable memory
        with pool.reusing():
            b = pool.empty(want, dtype)
            assert b.ctypes.data % pool.ALIGNMENT == 0
            pool.give(b)
            assert pool.empty(want, dtype) is b
    small = pool.aligned_empty((3, 4), "float64")
    assert small.shape == (3, 4) and small.base is None
