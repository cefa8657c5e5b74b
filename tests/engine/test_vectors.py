"""Vectors and skinny matrices: 1-D inputs as n x 1 columns, and chunks the planner reads whole."""

from __future__ import annotations

import numpy as np
import pytest
import zarr

import blocklin as bl
from blocklin.plan.chunks import auto_chunks
from blocklin.plan.gemm import plan_gemm
from support.tolerances import assert_gram, assert_product


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("cols", [200, 2000])
def test_vector_chunks_divide_tall_chunks(dtype, cols):
    # a 300000-vector beside a 300000 x cols matrix, both chunked by blocklin: X^T y plans k-panels of
    # whole chunks of both at 512 MiB (no re-reads), where one 300000-row chunk forced 147 re-reads
    n = 300000
    xc, yc = auto_chunks((n, cols), dtype), auto_chunks((n, 1), dtype)
    assert yc[0] < n and (xc[0] % yc[0] == 0 or yc[0] % xc[0] == 0)
    p = plan_gemm(cols, 1, n, dtype, a_chunks=(xc[1], xc[0]), b_chunks=yc, memory=512 * 2**20)
    assert p.panel_rereads == 1 and p.peak_memory <= 512 * 2**20
    q = plan_gemm(n, 1, cols, dtype, a_chunks=xc, b_chunks=auto_chunks((cols, 1), dtype), memory=512 * 2**20)
    assert q.panel_rereads == 1


def test_convert_1d_npy_is_a_column(tmp_path):
    y = np.random.default_rng(0).standard_normal(40000).astype(np.float32)
    np.save(tmp_path / "y.npy", y)
    bl.convert(tmp_path / "y.npy", tmp_path / "y.zarr")
    z = zarr.open_array(tmp_path / "y.zarr", mode="r")
    assert z.shape == (40000, 1) and z.chunks[0] < 40000
    assert np.array_equal(z[:, 0], y)


def test_1d_operands_everywhere(tmp_path):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((3000, 40))
    y = rng.standard_normal(3000)
    xt_y = bl.matmul(x, y, trans_a=True, memory="16MiB").to_numpy()
    assert xt_y.shape == (40, 1)
    assert_product(xt_y[:, 0], x.T @ y, x.T, y)
    ones = bl.matmul(x, np.ones(40), memory="16MiB").to_numpy()
    assert_product(ones[:, 0], x.sum(axis=1), x, np.ones(40))  # a product with ones is a sum
    zarr.create_array(tmp_path / "v.zarr", shape=(3000,), chunks=(700,), dtype="float64")[:] = y  # a stored vector
    stored = bl.matmul(x, tmp_path / "v.zarr", trans_a=True, memory="16MiB").to_numpy()
    assert np.array_equal(stored, xt_y)
    g = bl.gram(y, memory="16MiB").to_numpy()
    assert g.shape == (1, 1)
    assert_gram(g, [[y @ y]], y[:, None])


def test_papercuts_get_clear_errors_or_work(tmp_path):
    v = np.arange(5.0)
    m = bl.from_array(v, tmp_path / "v.zarr")  # a 1-D array is stored as a column
    assert m.shape == (5, 1) and np.array_equal(m.to_numpy()[:, 0], v)
    a = bl.from_array(np.arange(12.0).reshape(4, 3), tmp_path / "a.zarr")
    rep = bl.convert(a, tmp_path / "b.zarr", chunks=(2, 3))  # a Matrix is converted (rechunked) from its store
    assert rep["chunks"] == [2, 3] and np.array_equal(bl.open(tmp_path / "b.zarr").to_numpy(), a.to_numpy())
    with pytest.raises(bl.errors.ParameterError, match="from_array"):
        bl.convert([[1.0, 2.0]], tmp_path / "c.zarr")  # not a raw TypeError
    with pytest.raises(bl.errors.ParameterError, match="trans"):
        bl.gram(np.eye(3), trans="yes")
    with pytest.raises(bl.errors.ShapeError, match=r"\(5, 1\)"):
        bl.random(tmp_path / "r.zarr", 5)
