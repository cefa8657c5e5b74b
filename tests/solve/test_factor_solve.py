"""Out-of-core triangular solves and SPD solves (assume_a='pos') against SciPy."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.linalg as sl

import blocklin as bl
from blocklin.errors import NotPositiveDefiniteError, ParameterError, SingularMatrixError
from support.tolerances import assert_residual, assert_solve

DTYPES = [np.float32, np.float64]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("lower", [True, False])
@pytest.mark.parametrize("trans", [False, True])
@pytest.mark.parametrize("n,k,tile", [(1, 1, 32), (53, 3, 16), (64, 70, 32)])
def test_solve_triangular_matches_scipy(tmp_path, dtype, lower, trans, n, k, tile):
    rng = np.random.default_rng(n + k)
    t = rng.standard_normal((n, n)) / np.sqrt(n) + 2 * np.eye(n)
    t = (np.tril(t) if lower else np.triu(t)).astype(dtype)
    b = rng.standard_normal((n, k)).astype(dtype)
    x = bl.solve_triangular(t, b, tmp_path / "x.zarr", lower=lower, trans=trans, tile=tile, scheduler="sync")[...]
    ref = sl.solve_triangular(t.astype(np.float64), b.astype(np.float64), lower=lower, trans=int(trans))
    # well conditioned T (diagonal >= ~2, off-diagonal ~1/sqrt(n)): forward error a small multiple of n eps
    assert np.abs(x - ref).max() <= 8 * n * np.finfo(dtype).eps * np.abs(ref).max()


def test_solve_triangular_vector(tmp_path):
    t = np.tril(np.ones((9, 9))) + np.eye(9)
    x = bl.solve_triangular(t, np.arange(9.0), lower=True, scheduler="sync")
    assert x.shape == (9, 1)
    assert_solve(x[...][:, 0], sl.solve_triangular(t, np.arange(9.0), lower=True), t)


@pytest.mark.parametrize("lower", [True, False])
@pytest.mark.parametrize("trans", [False, True])
@pytest.mark.parametrize("memory", [None, "64KiB"])
def test_solve_triangular_whose_products_overflow_is_scaled(lower, trans, memory):
    """A nonsingular float32 ``T`` with entries ``2^100`` and an ``x`` near ``2^47`` (both in range): the
    substitution's products ``t_ik x_k`` reach ``2^148`` before they cancel back to ``b``, and the solve had
    been refused as "a singular or overflowing diagonal tile". It is solved once more with ``T`` and ``b``
    scaled by a power of two (``x`` unchanged), chosen from the triangle the solve reads: the other
    triangle's ``3e38`` does not choose it."""
    n = 48
    unit = np.eye(n) - 2 * np.eye(n, k=1)  # x grows as 2^n for b = 1, and so does that of its transpose
    t = (unit if not lower else unit.T) * 2.0 ** 100
    junk = np.triu(np.full((n, n), 3e38), 1) if lower else np.tril(np.full((n, n), 3e38), -1)
    b = np.ones((n, 2)) * 2.0 ** 100
    kw = {"tile": 16, "memory": memory} if memory else {}
    x = bl.solve_triangular((t + junk).astype(np.float32), b.astype(np.float32), lower=lower, trans=trans, **kw)
    assert x.report["scaling"]["t_exponent"] == -102  # max |t_ij| = 2^101 brought into [1/2, 1)
    op = t.T if trans else t
    assert_residual(op, x[...], b, dtype=np.float32)  # the backward error of a triangular solve (Higham Thm 8.5)
    assert np.abs(x[...]).max() >= 2.0 ** 46
    singular = t.copy()
    singular[n // 2, n // 2] = 0.0  # an exact zero on the diagonal: named (it was NumPy's LinAlgError)
    with pytest.raises(SingularMatrixError, match=f"got a zero on the diagonal at row {n // 2}"):
        bl.solve_triangular(singular.astype(np.float32), b.astype(np.float32), lower=lower, trans=trans, **kw)


@pytest.mark.parametrize("memory", [None, "64KiB"])
def test_factored_solves_whose_products_overflow_are_scaled(memory):
    """``lu_solve`` and ``cho_solve`` with stored float32 factors whose entries are near ``2^100`` and an
    intermediate ``y`` near ``2^47``: their substitutions overflowed as ``solve_triangular``'s did, and were
    refused as singular. The non-unit solves are made again scaled (``L``'s unit diagonal never is)."""
    n = 48
    unit = np.eye(n) - 2 * np.eye(n, k=1)
    b = np.full((n, 2), 2.0 ** 100)
    kw = {"memory": memory} if memory else {}
    u = (unit * 2.0 ** 100).astype(np.float32)  # A = U: its LU is P = I, L = I, U = A
    x = bl.lu_solve(bl.lu(u, **kw), b.astype(np.float32), **kw)
    assert x.report["scaling"]["t_exponent"] == -102
    assert_residual(u, x[...], b, dtype=np.float32)
    lower = (unit.T * 2.0 ** 100).astype(np.float32)
    x = bl.cho_solve(lower, b.astype(np.float32), **kw)
    assert x.report["scaling"]["t_exponent"] == -102
    # two backward-stable triangular solves: (L L^T + dA) x = b with |dA| <= c n u |L| |L^T| (Higham Thm
    # 10.4's argument without the factorization's term), so ||b - L L^T x|| <= 4 n u || |L| |L^T| || ||x||
    low, xs = lower.astype(np.float64), x[...].astype(np.float64)
    r = np.linalg.norm(b - low @ (low.T @ xs))
    assert r <= 4 * n * np.finfo(np.float32).eps * np.linalg.norm(np.abs(low) @ np.abs(low.T)) * np.linalg.norm(xs)


def _spd(n, dtype, cond=100.0, seed=0):
    rng = np.random.default_rng(seed)
    q, _ = np.linalg.qr(rng.standard_normal((n, n)))
    a = (q * np.logspace(0, np.log10(cond), n)) @ q.T
    return ((a + a.T) / 2).astype(dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n,k", [(1, 1), (61, 2), (130, 5)])
def test_solve_pos_matches_scipy(tmp_path, dtype, n, k):
    a = bl.from_array(_spd(n, dtype, seed=n), tmp_path / "a.zarr", chunks=(32, 32))
    b = np.random.default_rng(1).standard_normal((n, k)).astype(dtype)
    x = bl.solve(a, b, assume_a="pos", out=tmp_path / "x.zarr", scheduler="sync")
    r = x.report
    assert r["method"] == "cholesky" and "assume_a='pos'" in r["method_reason"]
    eps = np.finfo(dtype).eps
    # refinement drives the normwise backward error to the target sqrt(n) eps
    assert r["backward_error"] <= max(1, n) ** 0.5 * eps
    a64, x64 = a[...].astype(np.float64), x[...].astype(np.float64)
    eta = np.linalg.norm(b - a64 @ x64) / (np.linalg.norm(a64) * np.linalg.norm(x64) + np.linalg.norm(b))
    # the reported backward error is that of the stored x, up to the rounding of the residual itself
    assert eta <= 4 * max(1, n) ** 0.5 * eps
    ref = sl.solve(a64, b.astype(np.float64), assume_a="pos")
    # forward error <= 2 cond(A) * backward error (cond = 100 here), in the max norm up to sqrt(n)
    assert np.abs(x64 - ref).max() <= 2 * 100 * 4 * max(1, n) * eps * np.abs(ref).max()


def test_solve_pos_not_spd_and_bad_params(tmp_path):
    a = -np.eye(20)
    with pytest.raises(NotPositiveDefiniteError, match="assume_a='gen'"):
        bl.solve(a, np.ones(20), assume_a="pos")
    with pytest.raises(ParameterError, match="lam"):
        bl.solve(np.eye(3), np.ones(3), assume_a="pos", lam=1.0)
    with pytest.raises(ParameterError, match="assume_a"):
        bl.solve(np.eye(3), np.ones(3), assume_a="her")


def test_solve_pos_identical_bits_across_schedulers(tmp_path):
    a = bl.from_array(_spd(90, np.float64, seed=2), tmp_path / "a.zarr", chunks=(32, 32))
    b = np.random.default_rng(2).standard_normal((90, 2))
    xs = [bl.solve(a, b, assume_a="pos", scheduler=s, workers=2)[...] for s in ("sync", "threads", "processes")]
    for x in xs[1:]:
        np.testing.assert_array_equal(x, xs[0])
