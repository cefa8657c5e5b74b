"""Wide ridge through the dual form ``x = A^T (A A^T + lam^2 I)^-1 b`` (``method="normal"``; ``"auto"`` takes the QR
route where the dual form's bound is far above the QR's, tests/solve/test_wide_auto_route.py) where ``A`` has
singular values far below ``sqrt(eps) ||A||``, the resolution of ``A A^T``'s eigenvalues.

The dual route had left out of ``y`` every direction whose computed eigenvalue came out negative (``s = 0``)
at every ``lam``. Those directions are rounding-level mixtures of ``A``'s small singular directions and, at
``sqrt(eps) / s_k``, of the resolved ones just above them, so ``x`` lost up to ``sqrt(eps) ||A|| |beta| / lam^2``:
``x`` 1e-9 relative off at ``lam = 8.73`` where ``cond([A; lam I]) = 1.0`` (``method='qr'`` 5e-16), without a
word. With an intercept, taking the intercept's direction out of the unresolved directions only had left it in a
resolved direction near the resolution (``x`` 9e-11 off at ``lam = 1``).

Bound (the dual form's own, first order): ``y`` is the exact solution of ``(G + dG + lam^2 I) y = b`` with
``||dG|| <= (n + 3 m) eps (||A_r||_F^2 + lam^2)`` (the SYRK's ``gamma_n |A| |A^T|`` over the rows ``A_r`` it sums:
``A`` itself, or with an intercept the rows less the first, ``sqrt(max w)`` times that with weights; the
eigen-decomposition's backward error and the two products of ``U diag(.) U^T b``, Higham 2002, 3.5 and 19.3), so
``||dx|| <= ||A^T (G + lam^2 I)^-1|| ||dG|| ||y||`` with ``||A^T (G + lam^2 I)^-1|| = max_i s_i / (s_i^2 + lam^2)``,
plus ``x = A_r^T y``'s own ``gamma_m ||A_r||_F ||y||`` and one rounding of ``x``; ``c = 2`` covers the rest
(the reference is exact). Where ``lam`` is near ``||A||`` this is the stacked problem's backward-stable bound
(a few ``eps`` here); at ``lam`` far below it, ``eps ||A||^2 / lam^2`` relative, as the normal equations (the dual
form cannot be that accurate; ``method='qr'`` is). Reference: the dual problem in mpmath at 80 digits on the data
as given (exact in binary).
"""

from __future__ import annotations

import warnings

import mpmath as mp
import numpy as np
import pytest

import blocklin as bl
from blocklin.errors import IllConditionedWarning
from support.ridge import EPS64

M, N = 9, 16
LAMS = [1e-6, 1e-3, 0.1, 1.0, 8.73, 10.0]


def _orth(rng: np.random.Generator, k: int) -> np.ndarray:
    return np.linalg.qr(rng.standard_normal((k, k)))[0]


def _matrix(kind: str, seed: int = 5) -> np.ndarray:
    """``M x N`` with singular values from 1 down to 1e-13 or 1e-17 (rows of equal size, nothing far apart);
    ``"rank6"``: six such rows (to 1e-3) and copies of three of them (rank 6 exactly); ``"near"``: centered
    singular values 1, 0.3, 0.1, 6e-8 and 1e-10..1e-14, one just above ``A A^T``'s resolution, plus column means."""
    rng = np.random.default_rng(seed)
    if kind == "near":
        u = _orth(rng, M)
        u = u - np.outer(np.ones(M), np.ones(M) @ u) / M  # columns orthogonal to 1: the centered A
        q = np.linalg.qr(u)[0][:, :M - 1]
        sv = np.r_[1.0, 0.3, 0.1, 6e-8, np.logspace(-10, -14, 4)]
        return (q * sv) @ _orth(rng, N)[:M - 1] + rng.standard_normal(N)
    if kind == "rank6":
        a = (_orth(rng, 6) * np.logspace(0, -3, 6)) @ _orth(rng, N)[:6]
        return np.vstack([a, a[:3]])
    low = {"1e-13": -13, "1e-17": -17}[kind]
    return (_orth(rng, M) * np.logspace(0, low, M)) @ _orth(rng, N)[:M]


def _dual_mp(a, b, lam, intercept, w):
    """``(x, y)`` of ``min ||D (A_c x - b_c)||^2 + lam^2 ||x||^2`` (``D = diag(sqrt(w))``, centered by the weighted
    means with an intercept): ``y = (A' A'^T + lam^2 I)^-1 b'``, ``x = A'^T y`` with ``A' = D A_c``, ``b' = D b_c``."""
    m, n = a.shape
    w = np.ones(m) if w is None else w
    with mp.workdps(80):
        A, B = mp.matrix(a.tolist()), mp.matrix(b.tolist())
        W = [mp.mpf(float(v)) for v in w]
        S = mp.fsum(W)
        if intercept:
            mu = [mp.fsum(W[i] * A[i, j] for i in range(m)) / S for j in range(n)]
            bb = [mp.fsum(W[i] * B[i, c] for i in range(m)) / S for c in range(B.cols)]
            A = mp.matrix([[A[i, j] - mu[j] for j in range(n)] for i in range(m)])
            B = mp.matrix([[B[i, c] - bb[c] for c in range(B.cols)] for i in range(m)])
        d = mp.diag([mp.sqrt(v) for v in W])
        A, B = d * A, d * B
        K = A * A.T + mp.mpf(lam) ** 2 * mp.eye(m)
        cols = [mp.lu_solve(K, B.column(c)) for c in range(B.cols)]
        y = mp.matrix([[cols[c][i] for c in range(B.cols)] for i in range(m)])
        x = A.T * y
        sv = mp.svd_r(A, compute_uv=False)
        return (np.array(x.tolist(), dtype=float), np.array(y.tolist(), dtype=float),
                np.array([float(v) for v in sv]))


def _bound(a, lam, intercept, w, x_ref, y_ref, s_ref) -> float:
    """The dual form's bound on ``||x - x_ref||_F`` (module docstring)."""
    m, n = a.shape
    rows = a - a[0] if intercept else a  # the rows the SYRK sums (with an intercept, less the first)
    f2 = (1.0 if w is None else float(np.max(w))) * float(np.linalg.norm(rows)) ** 2
    phi = float(np.max(s_ref / (s_ref**2 + lam**2)))  # ||A^T (A A^T + lam^2 I)^-1||_2
    yn, xn = float(np.linalg.norm(y_ref)), float(np.linalg.norm(x_ref))
    return 2 * EPS64 * (((n + 3 * m) * (f2 + lam**2) * phi + m * np.sqrt(f2)) * yn + xn)


@pytest.mark.parametrize("weights", [False, True])
@pytest.mark.parametrize("intercept", [False, True])
@pytest.mark.parametrize("kind", ["1e-13", "1e-17", "rank6"])
def test_wide_dual_keeps_directions_below_the_resolution(kind, intercept, weights):
    """Every ``lam`` of 1e-6..10: ``x`` within the dual form's bound (at ``lam >= 1`` a few eps; the cut had left
    it 1e-9 to 3e-8 off), with no warning (``x`` keeps at least four digits everywhere here)."""
    a = _matrix(kind)
    rng = np.random.default_rng(7)
    b = rng.standard_normal((M, 2))
    w = rng.uniform(0.5, 2.0, M) if weights else None
    for lam in LAMS:
        x_ref, y_ref, s_ref = _dual_mp(a, b, lam, intercept, w)
        bound = _bound(a, lam, intercept, w, x_ref, y_ref, s_ref)
        assert bound < 0.5 * np.linalg.norm(x_ref)  # the bound itself leaves x a correct digit
        with warnings.catch_warnings():
            warnings.simplefilter("error", IllConditionedWarning)
            x = bl.solve(a, b, lam=lam, fit_intercept=intercept, sample_weight=w, method="normal")
        assert x.report["method"] == "normal"
        err = float(np.linalg.norm(x.to_numpy() - x_ref))
        assert err <= bound, f"lam {lam:g}: error {err:.2e} > bound {bound:.2e} (||x|| {np.linalg.norm(x_ref):.2e})"


@pytest.mark.parametrize("method", ["auto", "normal"])
@pytest.mark.parametrize("lam", [1.0, 8.73])
def test_wide_dual_intercept_direction_taken_out_of_the_resolved_directions(method, lam):
    """Centered singular values down to ``6e-8``, just above ``A A^T``'s resolution (``sqrt(m eps)``): taking the
    intercept's direction ``1 / sqrt(m)`` out of the unresolved directions alone left a part of it, near
    ``m eps / (6e-8)^2``, in that resolved one, which the centering of ``y`` then cut (``x`` 5e-11 off at
    ``lam = 1`` where the stacked problem's condition is 1.4). Now within the bound (a few eps)."""
    a = _matrix("near", seed=0)
    b = np.random.default_rng(1).standard_normal((M, 1))
    x_ref, y_ref, s_ref = _dual_mp(a, b, lam, True, None)
    x = bl.solve(a, b, lam=lam, fit_intercept=True, method=method)
    err = float(np.linalg.norm(x.to_numpy() - x_ref))
    assert err <= _bound(a, lam, True, None, x_ref, y_ref, s_ref)


@pytest.mark.parametrize("intercept", [False, True])
@pytest.mark.parametrize("kind", ["1e-13", "rank6"])
def test_wide_dual_condition_estimate_covers_the_error(kind, intercept):
    """``report["condition_estimate"]`` times ``eps`` bounds each column's relative error at every ``lam`` (from
    the spectrum: the resolved directions' intervals, and the unresolved ones' part of ``y`` through ``dG``,
    ``e ||y_u|| max f(s)``), and stays below 1 (no warning) where ``x`` keeps digits: at ``lam = 1e-6`` the dual
    form's ``x`` is near ``1e-4`` off (``eps ||A||^2 / lam^2``), and the estimate says so."""
    a = _matrix(kind)
    b = np.random.default_rng(7).standard_normal((M, 2))
    for lam in LAMS:
        x_ref, _, _ = _dual_mp(a, b, lam, intercept, None)
        x = bl.solve(a, b, lam=lam, fit_intercept=intercept, method="normal")
        rel = np.linalg.norm(x.to_numpy() - x_ref, axis=0) / np.linalg.norm(x_ref, axis=0)
        delta = x.report["condition_estimate"] * EPS64
        assert np.all(rel <= delta) and delta < 1, (lam, rel, delta)
