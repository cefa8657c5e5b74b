"""Shared problems and error bounds of the RidgeCV / sample_weight / positive tests (tests/solve/test_ridge_*.py; shared here).

Bounds (Higham, *Accuracy and Stability*, Thm 7.2 and the normal equations' analysis): a solution of the
regularized normal equations ``K x = c`` with ``K = A_c^T W A_c + lam^2 I`` computed by a backward-stable
method differs from the exact one by ``<= c n eps cond(K) ||x||``; the Gram matrix formed from centered
rows by a rank-one correction rounds relative to the uncentered entries, which multiplies that by
``1 + max(mu^2 / var)`` (tests/solve/test_center_solve.py). blocklin and scikit-learn both compute in
float64 (scikit-learn's RidgeCV casts float32 data to float64; blocklin's passes sum in float64), so
``eps`` is float64's, plus one rounding of the result to the output dtype.
"""

from __future__ import annotations

import numpy as np

EPS64 = float(np.finfo(np.float64).eps)


def rows_apart(rng: np.random.Generator, m: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    """A wide ``m x n`` ``A`` whose rows 3 and ``m - 1`` have norms about ``1e5`` and ``5e-4`` (the others about 1,
    each shifted by a random multiple of its scale) and ``b = A x + 1e-4`` noise: the kernel ``A A^T`` rounds
    relative to its rows, and its eigen-decomposition, norm-wise, cuts directions the data determine."""
    sc = np.ones(m)
    sc[3], sc[-1] = 1e5, 5e-4
    a = rng.standard_normal((m, n))
    a = a / np.linalg.norm(a, axis=1)[:, None] * sc[:, None] + rng.random(m)[:, None] * sc[:, None]
    b = a @ rng.standard_normal(n) + 1e-4 * rng.standard_normal(m)
    return a, b


def problem(m: int, n: int, k: int, *, seed: int = 0, offset: float = 3.0, noise: float = 1.0,
            dtype=np.float64) -> tuple[np.ndarray, np.ndarray]:
    """Columns with singular values spread over one decade (cond(A) ~ 10), means ``offset`` against a
    spread about 1, ``b`` with an intercept of 1 and noise: the leave-one-out minimum is interior for grids
    around lam ~ 1..100."""
    rng = np.random.default_rng(seed)
    q1, _ = np.linalg.qr(rng.standard_normal((m, n)))
    q2, _ = np.linalg.qr(rng.standard_normal((n, n)))
    a = (q1 * np.sqrt(m) * np.logspace(0, -1, n)) @ q2.T + offset
    b = a @ rng.standard_normal((n, k)) + 1.0 + noise * rng.standard_normal((m, k))
    return a.astype(dtype), b.astype(dtype)


def weights(m: int, seed: int = 1, zeros: int = 5) -> np.ndarray:
    w = np.random.default_rng(seed).uniform(0.0, 2.0, m)
    w[:zeros] = 0.0  # rows left out
    return w


def centered(a, b, w, fit_intercept: bool):
    """``sqrt(w) (A - mu)``, ``sqrt(w) (b - bbar)`` in float64 (weighted means; none without an intercept)."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64).reshape(len(a), -1)
    w = np.ones(len(a)) if w is None else np.asarray(w, np.float64)
    if fit_intercept:
        a, b = a - w @ a / w.sum(), b - w @ b / w.sum()
    sw = np.sqrt(w)[:, None]
    return a * sw, b * sw


def coef_bound(a, b, w, lam: float, fit_intercept: bool, dtype, coef_ref, const: float = 16.0) -> float:
    """Norm-wise bound on ``||x - x_ref||`` (both solutions of the same float64 problem, the result in ``dtype``)."""
    ac, _ = centered(a, b, w, fit_intercept)
    s = np.linalg.svd(ac, compute_uv=False)
    cond = (s[0] ** 2 + lam**2) / (s[-1] ** 2 + lam**2)
    a64 = np.asarray(a, np.float64)
    growth = 1 + float(np.max(a64.mean(axis=0) ** 2 / a64.var(axis=0))) if fit_intercept else 1.0
    norm = float(np.linalg.norm(coef_ref))
    return const * a.shape[1] * EPS64 * cond * growth * norm + 2 * float(np.finfo(dtype).eps) * norm


def intercept_bound(a, w, coef_ref, intercept_ref, xbound: float, dtype) -> float:
    """``x0 = bbar - mu^T x`` inherits ``|mu| ||x - x_ref||`` (plus its own rounding)."""
    a64 = np.asarray(a, np.float64)
    wv = np.ones(len(a)) if w is None else np.asarray(w, np.float64)
    mu = wv @ a64 / wv.sum()
    scale = float(np.linalg.norm(mu)) * float(np.linalg.norm(coef_ref)) + float(np.max(np.abs(intercept_ref)))
    return float(np.linalg.norm(mu)) * xbound + 4 * float(np.finfo(dtype).eps) * scale + 64 * EPS64 * scale


def loo_score_bound(a, b, w, lam: float, fit_intercept: bool, coef_ref, looe_ref) -> float:
    """Bound on ``|mean(looe^2) - mean(looe_ref^2)|`` at one lambda.

    With ``delta = c n eps cond(K)`` the relative error of ``K^-1``-products: ``||dx|| <= delta ||x||`` and
    ``|dh_ii| <= delta h_ii``, so ``||d looe|| <= (||A_c||_2 delta ||x|| + delta ||looe||) / (1 - max h)``
    and the mean of squares moves by ``(2 ||looe|| ||d looe|| + ||d looe||^2) / (m k)``.
    """
    ac, bc = centered(a, b, w, fit_intercept)
    s = np.linalg.svd(ac, compute_uv=False)
    k_mat = ac.T @ ac + lam**2 * np.eye(ac.shape[1])
    h = np.einsum("ij,ji->i", ac, np.linalg.solve(k_mat, ac.T))
    if fit_intercept:
        wv = np.ones(len(a)) if w is None else np.asarray(w, np.float64)
        h = h + wv / wv.sum()
    cond = (s[0] ** 2 + lam**2) / (s[-1] ** 2 + lam**2)
    a64 = np.asarray(a, np.float64)
    growth = 1 + float(np.max(a64.mean(axis=0) ** 2 / a64.var(axis=0))) if fit_intercept else 1.0
    delta = 16 * a.shape[1] * EPS64 * cond * growth
    nl = float(np.linalg.norm(looe_ref))
    dl = (s[0] * delta * float(np.linalg.norm(coef_ref)) + delta * nl) / (1 - float(h.max()))
    return (2 * nl * dl + dl**2) / looe_ref.size + 4 * EPS64 * nl**2 / looe_ref.size
