"""The leave-one-out choice of lambda of a wide complex ``a`` (issue 28; ``blocklin/linalg/solve/loo.py``).

The reference is the definition, computed here in complex128: for every row ``i``, the Tikhonov solution
of the other rows (their means removed with ``fit_intercept``; the dual form ``x = A^H (A A^H + lam^2 I)^-1 b``)
and its error ``|b_i - a_i x - x0|^2``, averaged over the rows per grid value and right-hand side.
Bound: the curve is a sum of squares of errors each computed from a solve with ``K = A A^H + lam^2 I``:
``2 * 8 m eps cond(K)`` relative (:func:`support.tolerances.assert_solve`'s bound, Higham 2002 Thm 7.2,
squared: the factor 2), times ``3 sqrt(2)`` for complex arithmetic (Higham 2002, Lemma 3.5), ``eps``
of the data's dtype and ``cond(K)`` at the grid's smallest lambda.
"""

from __future__ import annotations

import numpy as np
import pytest

import blocklin as bl
from support.conformance import least_budget
from support.tolerances import eps

COMPLEX = 3 * np.sqrt(2)
SCHEDULERS = ["sync", "threads", "processes"]
GRID = [0.3, 1.0, 3.0, 10.0]


def _problem(shape, dtype, k=2, seed=0):
    rng = np.random.default_rng(seed)
    a = (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(dtype)
    b = (rng.standard_normal((shape[0], k)) + 1j * rng.standard_normal((shape[0], k))).astype(dtype)
    return a, b


def _fit(a, b, lam, intercept):
    mu, bbar = (a.mean(axis=0), b.mean(axis=0)) if intercept else (np.zeros(a.shape[1]), np.zeros(b.shape[1]))
    ac, bc = a - mu, b - bbar
    x = ac.conj().T @ np.linalg.solve(ac @ ac.conj().T + lam**2 * np.eye(a.shape[0]), bc)
    return x, bbar - mu @ x


def _loo_curve(a, b, grid, intercept):
    """Mean squared leave-one-out error per grid value and right-hand side, by refitting without each row."""
    a, b = a.astype(np.complex128), b.astype(np.complex128)
    m = a.shape[0]
    out = []
    for lam in grid:
        sq = np.zeros(b.shape[1])
        for i in range(m):
            keep = np.arange(m) != i
            x, x0 = _fit(a[keep], b[keep], lam, intercept)
            sq += np.abs(b[i] - a[i] @ x - x0) ** 2
        out.append(sq / m)
    return np.array(out)


def _rtol(a, dtype):
    a = a.astype(np.complex128)
    k = a @ a.conj().T + min(GRID) ** 2 * np.eye(a.shape[0])
    return 2 * 8 * COMPLEX * a.shape[0] * eps(dtype) * np.linalg.cond(k)


@pytest.mark.parametrize("dtype", [np.complex64, np.complex128])
@pytest.mark.parametrize("intercept", [False, True])
def test_wide_loo_against_refitting(dtype, intercept):
    a, b = _problem((12, 40), dtype, seed=1)
    x = bl.solve(a, b, lam=("loo", GRID), fit_intercept=intercept)
    ref = _loo_curve(a, b, GRID, intercept)
    curve = x.report["curve"]
    np.testing.assert_allclose(curve["loo_per_target"], ref, rtol=_rtol(a, dtype))
    np.testing.assert_allclose(curve["loo"], ref.mean(axis=1), rtol=_rtol(a, dtype))
    lam = GRID[int(np.argmin(ref.mean(axis=1)))]
    assert x.report["lam"] == lam
    xr, x0 = _fit(a.astype(np.complex128), b.astype(np.complex128), lam, intercept)
    got = x.to_numpy()
    assert got.dtype == np.dtype(dtype)
    kk = a.astype(np.complex128) @ a.astype(np.complex128).conj().T + lam**2 * np.eye(a.shape[0])
    assert np.linalg.norm(got - xr) <= 8 * COMPLEX * a.shape[0] * eps(dtype) * np.linalg.cond(kk) * np.linalg.norm(xr)
    if intercept:
        np.testing.assert_allclose(x.intercept, x0, rtol=0, atol=_rtol(a, dtype) * np.abs(b).max())


def test_wide_loo_per_target():
    a, b = _problem((12, 40), np.complex128, seed=2)
    x = bl.solve(a, b, lam=("loo", GRID), lam_per_target=True)
    ref = _loo_curve(a, b, GRID, False)
    assert x.report["lam"] == [GRID[int(i)] for i in np.argmin(ref, axis=0)]


def test_wide_loo_out_of_core_on_every_scheduler():
    """At the least budget (``A A^H`` by the streamed SYRK pass, ``x = A^H y`` by the out-of-core GEMM): the
    curve of the definition, the same bits on every scheduler."""
    a, b = _problem((16, 600), np.complex128, k=1, seed=3)
    xs = [least_budget(lambda memory: bl.solve(a, b, lam=("loo", GRID), memory=memory, scheduler=s))
          for s in SCHEDULERS]
    ref = _loo_curve(a, b, GRID, False)
    np.testing.assert_allclose(xs[0].report["curve"]["loo_per_target"], ref, rtol=_rtol(a, np.complex128))
    for x in xs[1:]:
        np.testing.assert_array_equal(x.to_numpy(), xs[0].to_numpy())
        assert x.report["curve"]["loo"] == xs[0].report["curve"]["loo"]

