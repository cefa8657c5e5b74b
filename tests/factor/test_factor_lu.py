"""Out-of-core LU with partial pivoting (blocklin.lu) against SciPy, on matrices that break block-local pivoting."""

from __future__ import annotations

import os

import numpy as np
import pytest
import scipy.linalg as sl

import blocklin as bl
from blocklin.errors import BlocklinWarning, ParameterError, WorkerLostError


def _unpack(packed, pivots):
    """``(P, L, U)`` with ``P A = L U`` from the packed factors and LAPACK's 0-based swaps."""
    n = packed.shape[0]
    low = np.tril(packed, -1) + np.eye(n)
    up = np.triu(packed)
    perm = np.arange(n)
    for i, p in enumerate(pivots):
        perm[[i, p]] = perm[[p, i]]
    return perm, low, up


def _check(a, f, dtype):
    packed = f[...].astype(np.float64)
    perm, low, up = _unpack(packed, f.report["pivots"])
    a64 = a.astype(np.float64)
    # GEPP is backward stable with the growth factor rho: ||P A - L U|| <= c n u rho ||A||
    # (Higham 2002, Thm. 9.5); c = 4 allows for the blocked sums.
    rho = f.report["growth_factor"]
    bound = 4 * a.shape[0] * np.finfo(dtype).eps * max(rho, 1.0) * np.abs(a64).max() * a.shape[0]
    assert np.abs(a64[perm] - low @ up).max() <= bound
    assert np.all(np.abs(np.tril(packed, -1)) <= 1.0)  # partial pivoting: |L_ij| <= 1


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("n,tile", [(1, 32), (13, 32), (37, 8), (64, 16), (101, 32)])
def test_lu_matches_scipy(tmp_path, dtype, n, tile):
    a = np.random.default_rng(n).standard_normal((n, n)).astype(dtype)
    f = bl.lu(a, tmp_path / "lu.zarr", tile=tile, scheduler="sync")
    assert f.dtype == dtype and f.provenance["operation"] == "lu"
    assert f.provenance["pivots"] == f.report["pivots"].tolist()
    _check(a, f, dtype)
    lu_ref, piv_ref = sl.lu_factor(a.astype(np.float64))
    if dtype == np.float64:  # the same pivot choices as LAPACK on the whole matrix
        np.testing.assert_array_equal(f.report["pivots"], piv_ref)


def _singular_leading_block(n):
    a = np.zeros((n, n))
    h = n // 2
    a[:h, h:] = np.eye(h)
    a[h:, :h] = np.eye(n - h)
    return a + 1e-3 * np.random.default_rng(0).standard_normal((n, n))  # well conditioned, A11 ~ 0


def _graded(n):
    d = np.logspace(0, -12, n)
    return d[:, None] * np.random.default_rng(1).standard_normal((n, n)) * d[None, :]


@pytest.mark.parametrize("make", [_singular_leading_block, lambda n: np.eye(n)[np.random.default_rng(2).permutation(n)],
                                  _graded], ids=["singular-leading-block", "permutation", "graded"])
def test_lu_pivots_where_block_pivoting_fails(tmp_path, make):
    a = make(48)
    f = bl.lu(a, tile=16, scheduler="sync")
    _check(a, f, np.float64)
    x = sl.lu_solve((f[...], f.report["pivots"]), np.ones(48))
    ref = np.linalg.solve(a, np.ones(48))
    # forward error <= cond(A) * backward error: the three matrices are modestly conditioned except
    # the graded one, whose solution is checked through its residual instead
    assert np.linalg.norm(a @ x - 1) <= 1e3 * 48 * np.finfo(float).eps * np.linalg.norm(a, 1) * np.linalg.norm(x)
    if make is not _graded:
        np.testing.assert_allclose(x, ref, rtol=1e-8, atol=1e-8)


def test_lu_singular_warns(tmp_path):
    a = np.ones((20, 20))
    with pytest.warns(BlocklinWarning, match="zero pivot"):
        f = bl.lu(a, tile=8, scheduler="sync")
    assert f.report["min_pivot"] == 0.0


def test_lu_identical_bits_across_schedulers(tmp_path):
    a = bl.from_array(np.random.default_rng(4).standard_normal((90, 90)), tmp_path / "a.zarr", chunks=(32, 32))
    outs = [bl.lu(a, scheduler=s)[...] for s in ("sync", "threads", "processes")]
    for x in outs[1:]:
        np.testing.assert_array_equal(x, outs[0])


@pytest.mark.parametrize("m,n,tile", [(64, 64, 16), (64, 40, 8), (40, 64, 8)], ids=["square", "tall", "wide"])
def test_lu_resume_keeps_finished_panels(tmp_path, m, n, tile):
    a = bl.from_array(np.random.default_rng(5).standard_normal((m, n)), tmp_path / "a.zarr", chunks=(tile, tile))
    ref = bl.lu(a, tmp_path / "ref.zarr", scheduler="sync", tile=tile)
    import blocklin.linalg.factor.lu_panels as bo

    real = bo._panel_pivots
    state = {"fail": True}

    def flaky(spec, j):
        if state["fail"] and j == 2:  # panel 3 reads the pivots of panel 2: lose the worker there
            raise WorkerLostError("lost")
        return real(spec, j)

    bo._panel_pivots = flaky
    try:
        with pytest.raises(WorkerLostError):
            bl.lu(a, tmp_path / "lu.zarr", scheduler="sync", resume=True, tile=tile)
    finally:
        bo._panel_pivots = real
    assert len([p for p in os.listdir(tmp_path) if p.startswith(".lu.zarr.partial")]) == 1
    f = bl.lu(a, tmp_path / "lu.zarr", scheduler="sync", resume=True, tile=tile)
    assert f.report["skipped"] == 3
    np.testing.assert_array_equal(f[...], ref[...])
    np.testing.assert_array_equal(f.report["pivots"], ref.report["pivots"])
    assert f.report["growth_factor"] == ref.report["growth_factor"]


def test_factors_on_an_object_store():
    """URL outputs (the in-place commit protocol): factors, pivots; markers and the LU work store are gone."""
    import fsspec

    g = np.random.default_rng(6).standard_normal((70, 70))
    u = bl.lu(g, "memory://factor-test/lu.zarr", tile=32, scheduler="sync")
    lu_ref, piv_ref = sl.lu_factor(g)
    np.testing.assert_allclose(u[...], lu_ref, rtol=0, atol=1e-12)
    np.testing.assert_array_equal(u.provenance["pivots"], piv_ref)
    spd = g @ g.T / 70 + np.eye(70)
    f = bl.cholesky(spd, "memory://factor-test/l.zarr", tile=32, scheduler="sync")
    np.testing.assert_allclose(f[...], sl.cholesky(spd, lower=True), rtol=0, atol=1e-12)
    keys = fsspec.filesystem("memory").find("/factor-test")
    assert not [k for k in keys if "blocklin-done" in k or "lu-work" in k or "pending" in k]
    fsspec.filesystem("memory").rm("/factor-test", recursive=True)


@pytest.mark.filterwarnings("error::RuntimeWarning")
def test_lu_whose_growth_leaves_the_range_is_refused_with_the_scaling_that_fits(tmp_path):
    """A float32 matrix with entries up to 2^126 (float32's largest is just under 2^128): the elimination's
    growth passes the range, and ``U`` would hold Inf and NaN (NumPy's float32 LU overflows too). The
    factors, and the determinant read from them, had been returned as they were (``slogdet`` (nan, nan),
    where float64 gives sign 1, 17621.3), with NumPy's overflow warnings only. Refused, naming ``a``, the
    sizes, and the power of two after which the same matrix factors; the factors of the scaled matrix are
    checked as every LU here (Higham Thm 9.5)."""
    rng = np.random.default_rng(5)
    n = 200
    q, _ = np.linalg.qr(rng.standard_normal((n, n)))
    a = q + 0.1 * rng.standard_normal((n, n))
    a = (np.ldexp(1.0, 126) * a / np.abs(a).max()).astype(np.float32)
    e = int(np.frexp(np.abs(a).max())[1])  # 2^-e a has max |a| in [1/2, 1)
    out = tmp_path / "lu.zarr"
    for call in (lambda: bl.lu(a, out, memory="512KiB"), lambda: bl.slogdet(a, memory="512KiB")):
        with pytest.raises(ParameterError) as err:
            call()
        msg = str(err.value)
        assert msg.startswith("a: must keep its LU factors within float32's range"), msg
        assert f"2.0**-{e}" in msg, msg
    assert not out.exists()  # nothing written under the refused output's name
    scaled = np.ldexp(a, -e)
    _check(scaled, bl.lu(scaled, tmp_path / "scaled.zarr", memory="512KiB"), np.float32)
