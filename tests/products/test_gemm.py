"""Blocked GEMM against NumPy: shapes, transposes, alpha/beta, dtypes, schedulers, errors."""

from __future__ import annotations

import os

import numpy as np
import pytest

import blocklin as bl
from blocklin.errors import (DTypeError, NonFiniteError, OutputExistsError, OutputIsInputError, ShapeError,
                             StoreNotFoundError, BudgetError)
from conftest import gemm_tol


def _ref(a, b, c=None, alpha=1.0, beta=0.0, ta=False, tb=False):
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    r = alpha * ((a64.T if ta else a64) @ (b64.T if tb else b64))
    if c is not None:
        r = r + beta * c.astype(np.float64)
    return r


def _check(result, ref, dtype, k):
    got = result.to_numpy()
    assert got.dtype == np.dtype(dtype)
    assert got.shape == ref.shape
    scale = max(1.0, float(np.abs(ref).max())) if ref.size else 1.0
    np.testing.assert_allclose(got, ref, rtol=0, atol=gemm_tol(dtype, k) * scale * 4)


SHAPES = [(64, 64, 64), (97, 53, 61), (1, 37, 29), (41, 1, 17), (23, 19, 1), (130, 7, 150), (7, 130, 150),
          (101, 103, 107)]


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("m,n,k", SHAPES)
def test_matmul_matches_numpy(tmp_path, rng, dtype, m, n, k):
    a = rng.standard_normal((m, k)).astype(dtype)
    b = rng.standard_normal((k, n)).astype(dtype)
    out = tmp_path / "c.zarr"
    c = bl.matmul(a, b, out, memory="1MiB")
    _check(c, _ref(a, b), dtype, k)
    assert c.path == str(out) and os.path.isdir(out)


@pytest.mark.parametrize("ta", [False, True])
@pytest.mark.parametrize("tb", [False, True])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_transposes_and_alpha_beta(tmp_path, rng, ta, tb, dtype):
    m, n, k = 67, 45, 83
    a = rng.standard_normal((k, m) if ta else (m, k)).astype(dtype)
    b = rng.standard_normal((n, k) if tb else (k, n)).astype(dtype)
    c0 = rng.standard_normal((m, n)).astype(dtype)
    a_path = bl.from_array(a, tmp_path / "a.zarr", chunks=(16, 32)).path
    b_path = bl.from_array(b, tmp_path / "b.zarr", chunks=(32, 16)).path
    res = bl.matmul(a_path, b_path, tmp_path / "c.zarr", c=c0, alpha=-0.5, beta=2.0, trans_a=ta, trans_b=tb,
                    memory="32KiB" if dtype == "float32" else "64KiB")
    _check(res, _ref(a, b, c0, -0.5, 2.0, ta, tb), dtype, k)
    assert res.report["tasks"] > 1  # the budget forced several tiles


def test_multiple_tiles_and_k_panels(tmp_path, rng):
    a = rng.standard_normal((300, 280))
    b = rng.standard_normal((280, 310))
    plan = bl.matmul(a, b, memory="300KiB", explain=True)
    assert plan.n_tasks > 1 and plan.k_steps > 1
    res = bl.matmul(a, b, tmp_path / "c.zarr", memory="300KiB")
    _check(res, _ref(a, b), "float64", 280)
    assert res.report["bytes_read"] >= a.nbytes + b.nbytes


def test_inputs_of_every_kind(tmp_path, rng):
    import dask.array as da
    import zarr

    a = rng.standard_normal((50, 40))
    b = rng.standard_normal((40, 30))
    za = zarr.create_array(store=str(tmp_path / "za.zarr"), shape=a.shape, chunks=(16, 16), dtype="f8")
    za[...] = a
    mb = bl.from_array(b, tmp_path / "mb.zarr")
    ref = a @ b
    for x, y in [(a, b), (za, mb), (str(tmp_path / "za.zarr"), da.from_array(b, chunks=(7, 11))),
                 (da.from_array(a, chunks=13), mb.path)]:
        np.testing.assert_allclose(bl.matmul(x, y).to_numpy(), ref, atol=1e-12)


def test_inputs_never_modified(tmp_path, rng):
    a = rng.standard_normal((40, 30))
    b = rng.standard_normal((30, 20))
    a_copy, b_copy = a.copy(), b.copy()
    ma = bl.from_array(a, tmp_path / "a.zarr")
    bl.matmul(ma, b, tmp_path / "c.zarr", memory="128KiB", alpha=3.0)
    np.testing.assert_array_equal(a, a_copy)
    np.testing.assert_array_equal(b, b_copy)
    np.testing.assert_array_equal(bl.open(tmp_path / "a.zarr").to_numpy(), a_copy)


def test_identical_across_schedulers_and_workers(tmp_path, rng):
    a = rng.standard_normal((130, 170))
    b = rng.standard_normal((170, 90))
    results = []
    for i, (sched, workers) in enumerate([("sync", 1), ("threads", 1), ("threads", 2), ("processes", 2)]):
        r = bl.matmul(a, b, tmp_path / f"c{i}.zarr", memory="256KiB", scheduler=sched, workers=workers)
        results.append(r.to_numpy())
    for r in results[1:]:
        np.testing.assert_array_equal(r, results[0])


def test_provenance_and_report(tmp_path, rng):
    a = rng.standard_normal((20, 10))
    a_path = bl.from_array(a, tmp_path / "a.zarr").path
    c = bl.matmul(a_path, a_path, tmp_path / "c.zarr", trans_b=True)  # A A^T of one store: the Gram route
    prov = c.provenance
    assert prov["operation"] == "matmul"
    assert prov["inputs"] == [a_path, a_path]
    assert prov["version"] == bl.__version__
    assert prov["plan"]["route"] == "pass" and prov["params"]["trans_b"] is True and prov["params"]["route"] == "gram"
    for key in ("seconds", "flops", "bytes_read", "bytes_written", "peak_memory"):
        assert key in c.report
    assert c.report["flops"] == 20 * 20 * 10  # SYRK
    d = bl.matmul(a_path, a, tmp_path / "d.zarr", trans_b=True, out_chunks=(20, 20))  # two operands: the GEMM
    assert d.provenance["plan"]["tm"] >= 1 and d.report["flops"] == 2 * 20 * 20 * 10


def test_dtype_rules(tmp_path, rng):
    a = rng.standard_normal((10, 8)).astype(np.float32)
    b = rng.standard_normal((8, 6))
    with pytest.raises(DTypeError, match="share one dtype.*a: float32, b: float64.*dtype="):
        bl.matmul(a, b)
    res = bl.matmul(a, b, dtype="float64")
    assert res.dtype == np.float64
    np.testing.assert_allclose(res.to_numpy(), a.astype(np.float64) @ b, atol=1e-12)
    res32 = bl.matmul(a, a.T.copy())
    assert res32.dtype == np.float32  # no silent upcast
    with pytest.raises(DTypeError, match="dtype must be one of"):
        bl.matmul(np.ones((3, 3), dtype=np.int64), np.ones((3, 3), dtype=np.int64))


def test_mixed_real_and_complex_refusal_names_the_complex_dtype(rng):
    """A complex and a real operand had been told to pass dtype='float64' (or 'float32'), a cast refused
    as dropping the imaginary parts: the fix now names NumPy's promotion, which loses nothing, and works."""
    from tests.support.tolerances import assert_product

    a = (rng.standard_normal((10, 8)) + 1j * rng.standard_normal((10, 8))).astype(np.complex64)
    b = rng.standard_normal((8, 6))
    with pytest.raises(DTypeError, match="a: complex64, b: float64.*pass dtype='complex128'"):
        bl.matmul(a, b)
    with pytest.raises(DTypeError, match="a: complex64, b: float64.*--dtype complex128"):
        bl.solve(a[:8], b)
    res = bl.matmul(a, b, dtype="complex128")
    assert res.dtype == np.complex128
    a64, b64 = a.astype(np.complex128), b.astype(np.complex128)
    assert_product(res.to_numpy(), a64 @ b64, a64, b64)


def test_shape_errors_never_broadcast(rng):
    with pytest.raises(ShapeError, match=r"rows of op\(B\) must equal columns of op\(A\).*got op\(A\) 4 x 5 "
                                          r"and op\(B\) 6 x 3.*Fix"):
        bl.matmul(np.ones((4, 5)), np.ones((6, 3)))
    # a 1-D operand is a column (n x 1), and its length must match like any other
    assert bl.matmul(np.ones((4, 5)), np.ones(5)).shape == (4, 1)
    with pytest.raises(ShapeError, match=r"got op\(A\) 4 x 5 and op\(B\) 4 x 1"):
        bl.matmul(np.ones((4, 5)), np.ones(4))
    with pytest.raises(ShapeError, match="must be 2-D.*shape \\(5, 1, 1\\)"):
        bl.matmul(np.ones((4, 5)), np.ones((5, 1, 1)))
    with pytest.raises(ShapeError, match="c: must have the shape of the result.*1 x 3, result 4 x 3"):
        bl.matmul(np.ones((4, 5)), np.ones((5, 3)), c=np.ones((1, 3)), beta=1.0)


def test_missing_store(tmp_path):
    with pytest.raises(StoreNotFoundError, match="a: must name an existing zarr array.*does not exist"):
        bl.matmul(str(tmp_path / "nope.zarr"), np.ones((2, 2)))
    (tmp_path / "empty").mkdir()
    with pytest.raises(Exception, match="must be a zarr array"):
        bl.matmul(str(tmp_path / "empty"), np.ones((2, 2)))


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_detected_while_streaming(tmp_path, bad):
    a = np.ones((40, 30))
    a[17, 23] = bad
    with pytest.raises(NonFiniteError, match=r"a: must be finite.*at \[17, 23\].*check_finite=False"):
        bl.matmul(a, np.ones((30, 10)), tmp_path / "c.zarr", memory="64KiB")
    assert not (tmp_path / "c.zarr").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".c.zarr")]  # no partial left
    res = bl.matmul(a, np.ones((30, 10)), tmp_path / "c.zarr", check_finite=False)
    assert not np.isfinite(res.to_numpy()[17]).all()


@pytest.mark.parametrize("where", ["a", "b"])
def test_non_finite_found_in_every_tile_row_and_column(tmp_path, where):
    """Each part of A (B) is checked by the first tile of its tile row (column) only: a NaN in the
    last tile row of A, or the last tile column of B, still fails the job with no output left."""
    a, b = np.ones((96, 64)), np.ones((64, 96))
    (a if where == "a" else b)[(95, 50) if where == "a" else (50, 95)] = np.nan
    ap = bl.from_array(a, tmp_path / "a.zarr", chunks=(32, 32)).path
    bp = bl.from_array(b, tmp_path / "b.zarr", chunks=(32, 32)).path
    plan = bl.matmul(ap, bp, memory="64KiB", explain=True)
    assert plan.grid[0] > 1 and plan.grid[1] > 1
    at = "[95, 50]" if where == "a" else "[50, 95]"
    with pytest.raises(NonFiniteError, match=rf"{where}: must be finite.*at \{at[:-1]}\]"):
        bl.matmul(ap, bp, tmp_path / "c.zarr", memory="64KiB")
    assert not (tmp_path / "c.zarr").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".c.zarr")]


def test_output_rules(tmp_path, rng):
    a = rng.standard_normal((8, 8))
    a_path = bl.from_array(a, tmp_path / "a.zarr").path
    with pytest.raises(OutputIsInputError, match="out: must differ from every input"):
        bl.matmul(a_path, a, a_path, overwrite=True)
    bl.matmul(a, a, tmp_path / "c.zarr")
    with pytest.raises(OutputExistsError, match="overwrite=True"):
        bl.matmul(a, a, tmp_path / "c.zarr")
    res = bl.matmul(a, 2 * a, tmp_path / "c.zarr", overwrite=True)
    np.testing.assert_allclose(res.to_numpy(), 2 * a @ a, atol=1e-12)


def test_budget_too_small_names_minimum(rng):
    a = rng.standard_normal((64, 64))
    with pytest.raises(BudgetError, match=r"memory: must hold the smallest tiles.*raise it to at least .*memory='"):
        bl.matmul(bl.from_array(a, os.path.join(bl.config.get_config().temp_dir, "a.zarr"), chunks=(64, 64)),
                  a, memory="8KiB")


def _interrupted_at_the_third_tile(a_path, b_path, out):
    """``matmul(a, b, out, resume=True)`` at 96 KiB, interrupted as its third tile starts (two finished)."""
    from blocklin.runtime import tiles

    calls = {"n": 0}
    real = tiles.run_tile

    def flaky(spec, i, j, rows, cols, run):
        calls["n"] += 1
        if calls["n"] == 3:
            raise KeyboardInterrupt("simulated kill")
        return real(spec, i, j, rows, cols, run)

    tiles.run_tile = flaky
    try:
        with pytest.raises(KeyboardInterrupt):
            bl.matmul(a_path, b_path, out, memory="96KiB", scheduler="sync", resume=True)
    finally:
        tiles.run_tile = real


def test_resume_skips_finished_tiles(tmp_path, rng):
    a = rng.standard_normal((120, 90))
    b = rng.standard_normal((90, 100))
    a_path = bl.from_array(a, tmp_path / "a.zarr", chunks=(32, 32)).path
    b_path = bl.from_array(b, tmp_path / "b.zarr", chunks=(32, 32)).path
    _interrupted_at_the_third_tile(a_path, b_path, tmp_path / "c.zarr")
    assert not (tmp_path / "c.zarr").exists()  # nothing that looks finished
    partial = [p for p in tmp_path.iterdir() if p.name.startswith(".c.zarr.partial-")]
    assert len(partial) == 1
    res = bl.matmul(a_path, b_path, tmp_path / "c.zarr", memory="96KiB", scheduler="sync", resume=True)
    assert res.report["skipped"] == 2
    np.testing.assert_allclose(res.to_numpy(), a @ b, atol=1e-12)
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".c.zarr.partial-")]


@pytest.mark.parametrize("scale,match", [(1e200, r"must give a product within float64's range .*got an output "
                                                  r"holding Inf or NaN"),
                                         (2.0 ** -530, r"must give a product within float64's normal range .*got a "
                                                       r"product whose entries are all below 2\^-\d+")],
                         ids=["beyond", "below"])
def test_a_resumed_product_beyond_the_range_is_refused(tmp_path, rng, scale, match):
    """A resumed run takes the peaks of the tiles it skips from their markers; where a marker kept none (an
    empty one, as a run that kept no peaks leaves) the tally was incomplete and the range check was
    skipped: a product of overflowing sums came back as Inf, silently. It reads the output then, and
    refuses as the fresh run does; with every marker's peaks it needs no read. The same read finds a
    product below the normal numbers (operands near ``2^-530``)."""
    from blocklin.errors import ParameterError

    a = rng.standard_normal((120, 90)) * scale
    b = rng.standard_normal((90, 100)) * scale
    a_path = bl.from_array(a, tmp_path / "a.zarr", chunks=(32, 32)).path
    b_path = bl.from_array(b, tmp_path / "b.zarr", chunks=(32, 32)).path
    _interrupted_at_the_third_tile(a_path, b_path, tmp_path / "c.zarr")
    markers = [p for p in tmp_path.glob(".c.zarr.partial-*/**/tile-*-*") if p.is_file()]
    assert len(markers) == 2
    for m in markers:
        m.write_bytes(b"")
    with pytest.raises(ParameterError, match=match):
        bl.matmul(a_path, b_path, tmp_path / "c.zarr", memory="96KiB", scheduler="sync", resume=True)
    assert not (tmp_path / "c.zarr").exists()


def test_progress_callback(rng):
    from blocklin.runtime import ProgressRecorder

    rec = ProgressRecorder()
    res = bl.matmul(rng.standard_normal((100, 60)), rng.standard_normal((60, 80)), memory="64KiB", progress=rec)
    # progress counts k-panels (a one-tile product still moves): every tile's panels, each once
    assert rec.total == res.report["tasks"] * res.report["plan"]["k_steps"] == rec.done > 1


def test_config_scoping_and_env(monkeypatch, rng):
    a = rng.standard_normal((64, 64))
    with bl.config.set(memory="128KiB"):
        assert bl.matmul(a, a, explain=True).memory == 128 * 1024
    monkeypatch.setenv("BLOCKLIN_MEMORY", "3MiB")
    bl.config.reset()
    assert bl.matmul(a, a, explain=True).memory == 3 * 2**20
    assert bl.matmul(a, a, explain=True, memory="1MiB").memory == 2**20


def test_zarr_v2_input_readable(tmp_path, rng):
    import zarr

    a = rng.standard_normal((30, 20))
    z = zarr.create_array(store=str(tmp_path / "v2.zarr"), shape=a.shape, chunks=(8, 8), dtype="f8", zarr_format=2)
    z[...] = a
    m = bl.open(tmp_path / "v2.zarr")
    assert m.shape == (30, 20)
    np.testing.assert_allclose(bl.matmul(m, a, trans_b=True).to_numpy(), a @ a.T, atol=1e-12)


def test_region_tiles_with_offsets_identity_and_statistics(tmp_path, rng):
    """The GEMM tile task on sub-blocks of stored matrices, as the inverse uses it (its probe products
    ``X P`` are a row pass of their own, `refine.probe_products`)."""
    from blocklin.linalg.inverse.kernels import InverseEpilogue
    from blocklin.runtime.blockops import BlockOps
    from blocklin.runtime.job import Job
    from blocklin.storage.zarr_store import open_zarr, write_block

    x = rng.standard_normal((64, 64))
    with Job("region-test", memory="32KiB", scheduler="sync") as job:
        ops = BlockOps(job, chunk=16)
        m = ops.store("m", 64, 64, "float64")
        write_block(open_zarr(m, mode="r+"), slice(0, 64), slice(0, 64), x)
        out = ops.store("out", 64, 64, "float64")
        results = ops.gemm(out, (16, 32), 32, 32, 48, m, (0, 16), m, (16, 0), dtype="float64", alpha=-1.0,
                           epilogue=InverseEpilogue(identity=True))
        got = open_zarr(out)[...]
    expected = -x[0:32, 16:64] @ x[16:64, 0:32]
    rows, cols = np.arange(16, 48), np.arange(32, 64)
    expected[(rows[:, None] == cols[None, :])] += 1.0  # global diagonal entries inside the region
    np.testing.assert_allclose(got[16:48, 32:64], expected, atol=1e-12)
    assert not got[:16].any() and not got[48:].any() and not got[:, :32].any()
    assert len(results) > 1  # several tiles
    assert sum(r["sumsq"] for r in results) == pytest.approx(float((expected**2).sum()), rel=1e-12)


@pytest.mark.filterwarnings("error::RuntimeWarning")  # an overflowing bound (Inf) would pass any error
@pytest.mark.parametrize("dtype,big", [(np.float64, 1e200), (np.float32, 1e30)])
@pytest.mark.parametrize("n,memory", [(2, None), (40, "64KiB")])  # the thin (rows) route and GEMM tiles
def test_a_product_beyond_the_range_is_refused_with_the_scaling_that_fits(tmp_path, rng, dtype, big, n, memory):
    """Finite operands near 1e200 whose product overflows had given a matrix of Inf, silently (``gram`` of the
    same data refuses). The product is refused, naming the power of two that brings max|a| max|b| k into the
    range; no output is left, and the fix it names gives the scaled product."""
    import re

    from blocklin.errors import ParameterError
    from support.tolerances import assert_product

    a = (rng.standard_normal((30, 20)) * big).astype(dtype)
    b = (rng.standard_normal((20, n)) * big).astype(dtype)
    kw = {"memory": memory} if memory else {}
    with pytest.raises(ParameterError, match=r"must give a product within .*got an output holding Inf or NaN") as e:
        bl.matmul(a, b, tmp_path / "c.zarr", **kw)
    assert not (tmp_path / "c.zarr").exists() and not list(tmp_path.glob(".c.zarr*"))
    p = int(re.search(r"scale a by 2\.0\*\*-(\d+)", str(e.value)).group(1))
    scaled = np.ldexp(a, -p).astype(dtype)
    c = bl.matmul(scaled, b, tmp_path / "c.zarr", **kw)[...]
    s64, b64 = scaled.astype(np.float64), b.astype(np.float64)
    assert_product(c, s64 @ b64, s64, b64, dtype=dtype)
    assert not np.isfinite(bl.matmul(a, b, check_finite=False, **kw)[...]).all()  # unchecked: as computed


@pytest.mark.filterwarnings("error::RuntimeWarning")
@pytest.mark.parametrize("dtype,e", [(np.float64, -520), (np.float64, -530), (np.float64, -600), (np.float32, -70),
                                     (np.float32, -80)])
@pytest.mark.parametrize("n,memory", [(2, None), (40, "64KiB")])  # the thin (rows) route and GEMM tiles
def test_a_product_below_the_normal_numbers_is_refused_with_the_scaling_that_fits(tmp_path, rng, dtype, e, n,
                                                                                  memory):
    """Operands near 2^-520 (float64) whose every term lies below the normal numbers had given a product 3e-11
    off, 3e-5 at 2^-530 and all zeros (relative error 1) at 2^-600, silently (float32 near 2^-70 and 2^-80 the
    same), where ``gram`` of the same data refuses. ``|alpha| k max|a| max|b|`` is below 2^minexp there, so every
    entry is: the product is refused, naming the powers of two that bring it into range; no output is left, and
    the fix it names gives the scaled product within the usual bound. ``check_finite=False`` keeps it as
    computed."""
    import re

    from blocklin.errors import ParameterError
    from support.tolerances import assert_product

    a = np.ldexp(rng.standard_normal((30, 20)), e).astype(dtype)
    b = np.ldexp(rng.standard_normal((20, n)), e).astype(dtype)
    kw = {"memory": memory} if memory else {}
    with pytest.raises(ParameterError, match=rf"^a: must give a product within {np.dtype(dtype).name}'s normal "
                                             r"range .*got a product whose entries are all below 2\^-\d+") as err:
        bl.matmul(a, b, tmp_path / "c.zarr", **kw)
    assert not (tmp_path / "c.zarr").exists() and not list(tmp_path.glob(".c.zarr*"))
    pa, pb, p = (int(g) for g in re.search(r"scale a by 2\^(\d+) and b by 2\^(\d+) .*then 2\^(\d+) times",
                                           str(err.value)).groups())
    assert pa + pb == p
    sa, sb = np.ldexp(a, pa), np.ldexp(b, pb)  # exact: a and b are normal numbers, and so are these
    assert np.array_equal(np.ldexp(sa, -pa), a) and np.array_equal(np.ldexp(sb, -pb), b)
    c = bl.matmul(sa, sb, tmp_path / "c.zarr", **kw)[...]
    s64, b64 = sa.astype(np.float64), sb.astype(np.float64)
    assert_product(c, s64 @ b64, s64, b64, dtype=dtype)
    with np.errstate(under="ignore"):
        bl.matmul(a, b, check_finite=False, **kw)  # unchecked: as computed


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_a_product_below_the_normal_numbers_by_its_recorded_column_peaks_is_refused(tmp_path, dtype):
    """A stored ``a`` (64 x 64) whose column 0 is near ``2^(minexp/2)`` and the others ``2^8`` below, its column
    peaks recorded by its writer: ``k max|a| max|b|`` reaches the normal numbers, but ``sum_l max_i |a_il|
    max|b|`` does not, so every entry lies below them, each of the 64 terms rounded to the subnormals'
    spacing: the product had come back ``6x`` (float32 ``2.6x``) past ``64 eps |A||B|`` entry by entry, against
    the reference on operands scaled by exact powers of two, without a word. Refused now by the recorded peaks'
    bound (no pass over ``a``), with the scalings that give the product within the usual bound."""
    import re

    from blocklin.errors import ParameterError
    from support.tolerances import assert_product, eps

    fi = np.finfo(dtype)
    rng = np.random.default_rng(3)
    ea, eb = fi.minexp // 2 - 1, fi.minexp // 2 - 5
    a = np.ldexp(rng.uniform(1, 2, (64, 64)) * rng.choice([-1, 1], (64, 64)), ea - 8)
    a[:, 0] = np.ldexp(a[:, 0], 8)
    a, b = a.astype(dtype), np.ldexp(rng.standard_normal((64, 3)), eb).astype(dtype)
    stored = bl.from_array(a, tmp_path / "a.zarr")
    a64, b64 = np.ldexp(a.astype(np.float64), -ea), np.ldexp(b.astype(np.float64), -eb)
    assert 64 * np.abs(a64).max() * np.abs(b64).max() * 2.0 ** (ea + eb) >= fi.tiny  # the k bound reaches it
    ref = a64 @ b64  # the product times 2^-(ea + eb)
    bound = 64 * eps(dtype) * (np.abs(a64) @ np.abs(b64))  # twice gamma_64 |A||B|, entry by entry
    with np.errstate(under="ignore"):
        unchecked = bl.matmul(stored.path, b, check_finite=False)[...]
    assert (np.abs(np.ldexp(unchecked.astype(np.float64), -(ea + eb)) - ref) > bound).any()  # what had come back
    with pytest.raises(ParameterError, match=rf"^a: must give a product within {fi.dtype.name}'s normal range .*"
                                             r"\(\|alpha\| sum_l max_i \|a_il\| max \|b\| \(a's recorded peaks\) "
                                             r"below 2\^-\d+, k = 64\)") as err:
        bl.matmul(stored.path, b, tmp_path / "c.zarr")
    assert not (tmp_path / "c.zarr").exists()
    pa, pb, p = (int(g) for g in re.search(r"scale a by 2\^(\d+) and b by 2\^(\d+) .*then 2\^(\d+) times",
                                           str(err.value)).groups())
    got = bl.matmul(np.ldexp(a, pa), np.ldexp(b, pb))[...]
    scaled = np.ldexp(got.astype(np.float64), -(p + ea + eb))
    assert np.all(np.abs(scaled - ref) <= bound)
    assert_product(scaled, ref, a64, b64, dtype=dtype)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_a_product_that_merely_cancels_below_the_normal_numbers_is_kept(tmp_path, dtype):
    """The refusal of a product below the normal numbers is the operands' bound's (``|alpha| k max|a| max|b|
    + |beta| max|c|`` below 2^minexp), never the output's alone: sums of normal terms that cancel to a
    subnormal carry the usual error (here none: the cancellation is exact), a zero product is exact, and
    ``beta c`` in the normal range keeps a product whose ``alpha A B`` alone is below it."""
    fi = np.finfo(dtype)
    h = fi.minexp // 2 + 1  # a_i b_i = 2^(2h), a normal number; their difference 2^(2h - nmant) is subnormal
    a = np.array([[2.0 ** h, -2.0 ** h]], dtype)
    b = np.array([[2.0 ** h * (1 + fi.eps)], [2.0 ** h]], dtype)
    got = bl.matmul(a, b, tmp_path / "c.zarr")[...]
    want = np.ldexp(1.0, 2 * h - fi.nmant)
    assert 0 < want < fi.tiny and got[0, 0] == want
    assert not bl.matmul(np.zeros((3, 2), dtype), b, overwrite=True)[...].any()
    tiny = np.ldexp(np.ones((3, 2), dtype), fi.minexp // 2 - 8)
    c = np.ones((3, 1), dtype)
    got = bl.matmul(tiny, tiny[:2, :1], c=c, beta=1.0)[...]
    assert np.array_equal(got, c)


@pytest.mark.parametrize("device", ["cpu", "gpu"])
@pytest.mark.parametrize("route", ["rows", "tiles"])
@pytest.mark.parametrize("which, scalar", [("alpha", 1.2345e-44), ("beta", 1.2345e-44), ("alpha", 3.0 * 2.0 ** 129),
                                           ("beta", 3.0 * 2.0 ** 129)])
def test_float32_product_with_a_scalar_outside_float32s_normal_range(request, tmp_path, rng, device, route, which,
                                                                      scalar):
    """``alpha`` or ``beta`` below float32's smallest normal number (``1.2345e-44`` is the subnormal
    ``9.8e-45`` in float32: 2% off) or beyond its largest (``3 2^129`` is Inf) of float32 operands whose
    result float32 holds: the scalar had been cast to float32 and the product returned 2% off without an
    error, or refused as overflowing (found by a randomized search, 2026-12-07). The scalar is applied as
    its significand times powers of two now. Bound: ``|fl(alpha A B) - alpha A B| <= (gamma_k + 2u)
    |alpha| |A||B|`` (Higham 2002, eq. 3.13, one rounding of the significand and one of the product), and
    ``|fl(beta C) - beta C| <= 2u |beta C|`` for the addend, so norm-wise ``2 k eps`` and ``2 eps``."""
    from support.tolerances import assert_product

    if device == "gpu":
        request.getfixturevalue("standin")
    big = scalar > 1
    a = (rng.standard_normal((30, 12)) * (2.0 ** -70 if big else 2.0 ** 60)).astype(np.float32)
    b = rng.standard_normal((12, 3)).astype(np.float32)
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    kw = {"alpha": scalar} if which == "alpha" else {
        "alpha": 0.0, "beta": scalar, "c": (rng.standard_normal((30, 3)) * (2.0 ** -130 if big else 2.0 ** 100)
                                              ).astype(np.float32)}
    # out_chunks= keeps the product off the row pass (:mod:`blocklin.linalg.products.thin`): the GEMM tiles
    res = bl.matmul(a, b, tmp_path / "c.zarr", memory="64MiB", device=device,
                    out_chunks=(16, 3) if route == "tiles" else None, **kw)
    assert res.report.get("route", "tiles") == (route if device == "cpu" else "tiles")
    got = res.to_numpy()
    assert got.dtype == np.float32 and np.isfinite(got).all()
    if which == "alpha":
        assert_product(got, scalar * (a64 @ b64), a64, b64, alpha=scalar, dtype=np.float32)
    else:
        ref = scalar * kw["c"].astype(np.float64)
        assert np.linalg.norm(got - ref) <= 2 * np.finfo(np.float32).eps * np.linalg.norm(ref)


@pytest.mark.filterwarnings("error::RuntimeWarning")
@pytest.mark.parametrize("c_peak, beta, param, rule", [
    (1e300, 1.0, "c", r"entries must lie within the output dtype float32's range .*max \|c\| = 1e\+300"),
    (1.0, 1e300, "beta", r"must lie within the output dtype float32's range .*beta = 1e\+300"),
    (1e30, 1e30, "beta", r"times c must lie within the output dtype float32's range .*max \|c\| = 1e\+30\)"),
])
def test_float32_result_of_a_float64_beta_c_beyond_its_range_is_refused_up_front(tmp_path, c_peak, beta, param,
                                                                                   rule):
    """``dtype='float32'`` of float64 operands with ``C``, ``beta`` or ``beta C`` beyond float32's range:
    refused as sums of ``a`` that are not finite, after the run, with NumPy's overflow warnings leaked
    (the cast of C, the product beta C). Now refused before any work, naming ``c`` or ``beta``."""
    from blocklin.errors import ParameterError

    a, b = np.ones((4, 3)), np.ones((3, 2))
    with pytest.raises(ParameterError, match=rf"^{param}: {rule}"):
        bl.matmul(a, b, tmp_path / "c.zarr", c=np.full((4, 2), c_peak), beta=beta, dtype="float32")
    assert not (tmp_path / "c.zarr").exists()


@pytest.mark.filterwarnings("error::RuntimeWarning")
def test_float32_result_of_a_float64_c_within_its_range_is_computed(tmp_path, rng):
    """The refusal above leaves alone a C that float32 holds (tiny entries flush to zero in the cast, as
    any entry rounds): ``|fl(A B + C) - (A B + C)| <= (gamma_k + 2u) (|A||B| + |C|)`` in float32 (Higham
    2002, eq. 3.13), plus ``u`` for each operand's cast, so ``(k + 4) eps`` norm-wise."""
    a, b = rng.standard_normal((5, 3)), rng.standard_normal((3, 2))
    c = rng.standard_normal((5, 2)) * 1e30
    got = bl.matmul(a, b, tmp_path / "c.zarr", c=c, beta=2.0, dtype="float32").to_numpy()
    ref = a @ b + 2.0 * c
    bound = 7 * np.finfo(np.float32).eps * (np.linalg.norm(a) * np.linalg.norm(b) + 2 * np.linalg.norm(c))
    assert got.dtype == np.float32 and np.linalg.norm(got - ref) <= bound


def test_beta_c_checks_of_a_narrowing_cast_read_c_once(tmp_path, rng):
    """``dtype='float32'`` of a float64 ``C`` with ``|beta| > 1`` wants both ``max |C|`` (beyond the range) and the
    smallest nonzero ``|c_ij|`` (below it, brought back by ``beta``): both come from one read of ``C``, as
    ``max |C|`` alone does for ``beta = 1`` (it had read ``C`` twice: ``bytes_read`` one ``C`` more)."""
    a, b, c = rng.standard_normal((40, 3)), rng.standard_normal((3, 2)), rng.standard_normal((40, 2))
    read = [bl.matmul(a, b, tmp_path / f"c{i}.zarr", c=c, beta=beta, dtype="float32").report["bytes_read"]
            for i, beta in enumerate((1.0, 2.0))]
    assert read[1] == read[0]


@pytest.mark.parametrize("c_low, beta, refused", [(1e-45, 1e30, True), (1e-42, 1e36, True), (1e-45, 2.0, False),
                                                  (1e-30, 1e30, False)])
def test_float32_result_of_a_float64_c_below_float32s_normal_range_magnified_by_beta(tmp_path, c_low, beta, refused):
    """``dtype='float32'`` of a float64 ``C`` with entries below float32's normal range (``1.2e-38``) and a
    ``beta`` that brings them back into it: the cast keeps such an entry to float32's smallest subnormal
    (``1.4e-45``) absolute only: ``C`` from ``1e-45`` to ``1e-40`` with ``beta = 1e30`` beside ``A B`` of
    ``3e-12`` came back with entries up to ``1.6e-4`` off (2,600 times float32's rounding unit), without a word. Refused naming ``c``; where ``beta c`` stays below the normal
    range or ``c`` is normal in float32, computed within ``(k + 4) eps`` (Higham 2002, eq. 3.13, and the
    casts), componentwise as that bound is."""
    from blocklin.errors import ParameterError

    a, b = np.full((4, 3), 1e-6), np.full((3, 2), 1e-6)
    c = np.geomspace(c_low, c_low * 1e5, 8).reshape(4, 2)
    if refused:
        with pytest.raises(ParameterError, match=r"^c: entries that beta brings into"):
            bl.matmul(a, b, tmp_path / "c.zarr", c=c, beta=beta, dtype="float32")
        assert not (tmp_path / "c.zarr").exists()
        return
    got = bl.matmul(a, b, tmp_path / "c.zarr", c=c, beta=beta, dtype="float32").to_numpy()
    ref = a @ b + beta * c
    bound = 7 * np.finfo(np.float32).eps * (np.abs(a) @ np.abs(b) + beta * np.abs(c))
    assert got.dtype == np.float32 and np.all(np.abs(got - ref) <= bound + np.finfo(np.float32).smallest_subnormal)


@pytest.mark.parametrize("bad", [np.inf, -np.inf, np.nan], ids=["inf", "-inf", "nan"])
@pytest.mark.parametrize("which", ["a", "b"])
def test_float32_precision_of_a_non_finite_operand(tmp_path, rng, which, bad):
    """``precision='float32'`` of float64 operands holding an Inf or NaN: the check of float32's range took the
    Inf for an entry its cast would overflow and refused it (``got max |a| = inf``), even with
    ``check_finite=False``, which returns the product as computed. Now judged by the finite entries: with
    ``check_finite=False`` the product comes back with NaN and Inf where NumPy's float32 product has them and
    the other entries within ``(k + 2) eps`` of it norm-wise (Higham 2002, eq. 3.13, plus each operand's cast);
    with the check on, the finite check names the operand and the entry; a finite entry beyond float32's range
    beside it is still refused as a range problem, naming that entry's magnitude."""
    from blocklin.errors import NonFiniteError, ParameterError

    a, b = rng.standard_normal((9, 5)), rng.standard_normal((5, 4))
    x = a if which == "a" else b
    x[2, 3] = bad
    got = bl.matmul(a, b, tmp_path / "c.zarr", precision="float32", check_finite=False).to_numpy()
    ref = a.astype(np.float32) @ b.astype(np.float32)
    assert np.array_equal(np.isnan(got), np.isnan(ref)) and np.array_equal(np.isposinf(got), np.isposinf(ref))
    assert np.array_equal(np.isneginf(got), np.isneginf(ref)) and not np.isfinite(ref).all()
    keep = np.isfinite(ref)
    exact = a.astype(np.float32).astype(np.float64) @ b.astype(np.float32).astype(np.float64)
    bound = 7 * np.finfo(np.float32).eps * np.linalg.norm(np.abs(np.nan_to_num(a, posinf=0, neginf=0)) @
                                                          np.abs(np.nan_to_num(b, posinf=0, neginf=0)))
    assert np.linalg.norm(got[keep] - exact[keep]) <= bound
    with pytest.raises(NonFiniteError, match=rf"^{which}: must be finite .*at \[2, 3\]"):
        bl.matmul(a, b, tmp_path / "d.zarr", precision="float32")
    x[0, 0] = 1e300
    with pytest.raises(ParameterError, match=rf"^precision: .*{which}'s entries must lie within float32's range .*"
                       rf"max \|{which}\| = 1e\+300"):
        bl.matmul(a, b, tmp_path / "e.zarr", precision="float32", check_finite=False)
