"""Ridge solves ``(G + lam^2 I) y = c`` of a Gram or kernel matrix ``G`` whose lines are far apart in scale.

The eigen-decomposition ``G = V diag(e) V^H`` that the lambda choices share gives every grid value at once, but
norm-wise: a relative error about ``n eps e_max / (e_min + lam^2)`` (the eigensolver's backward error
``n eps e_max``, Weyl), and the directions whose ``e + lam^2`` is under ``n eps e_max`` are left out. ``G``'s own
rounding is relative to its lines (``|dG_ij| <= m eps sqrt(G_ii G_jj)``): a tall ``A`` with columns, or a wide
``A`` with rows, far apart in scale gives eigenvalues far below ``n eps e_max`` that the data determine. The scaled
``H = D^-1 (G + lam^2 I) D^-1``, ``D = diag(sqrt(G_ii + lam^2))``, has the condition of the problem after that
scaling, and its Cholesky solve a forward error of about ``n eps cond(H)`` in ``D y`` (Higham 2002, 10.1), with
``cond(H) >= cond(G + lam^2 I) / cond(D)^2``: it does better than the eigen-decomposition by at most
``cond(D)^2`` (:func:`refit`, :func:`scaled_factor`).
"""

from __future__ import annotations

import numpy as np


def refit(g: np.ndarray, ev: np.ndarray, grid: np.ndarray, cut: np.ndarray) -> np.ndarray:
    """Per grid value: whether its solve is taken again from the scaled ``H``: ``lam > 0`` and a direction left
    out (``cut``), or both ``e_max / (e_min + lam^2)`` and ``cond(D)^2 = (max G_ii + lam^2) / (min G_ii + lam^2)``
    above ``n`` (the eigen-decomposition's solve could be off by more than ``n^2 eps`` and the scaling may gain more
    than a factor ``n``). Well-scaled lines (``cond(D)^2 <= n``) keep the eigen-decomposition's solve alone."""
    n = g.shape[0]
    diag = np.maximum(np.diag(g).real, 0.0)
    lam2 = np.asarray(grid, dtype=np.float64) ** 2
    top, low = (float(ev.max()), float(ev.min())) if ev.size else (0.0, 0.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        spread = np.where(low + lam2 > 0, top / (low + lam2), np.inf)
        scale = (diag.max(initial=0.0) + lam2) / (diag.min(initial=0.0) + lam2)
    return (lam2 > 0) & (np.asarray(cut, dtype=bool) | ((spread > n) & (scale > n)))


def scaled_factor(g: np.ndarray, lam2: float) -> tuple[np.ndarray, np.ndarray] | None:
    """``(L, d)``: the Cholesky factor ``L L^H = H = D^-1 (G + lam^2 I) D^-1`` and ``D``'s diagonal ``d``, so that
    ``(G + lam^2 I)^-1 = D^-1 L^-H L^-1 D^-1``; None where ``H`` is not numerically positive definite (``n eps
    cond(H)`` from 0.5: a direction the data do not determine, which the eigen-decomposition's cut leaves out)."""
    eps = np.finfo(np.float64).eps
    n = g.shape[0]
    d = np.sqrt(np.maximum(np.diag(g).real, 0.0) + lam2)
    h = g / np.outer(d, d) + np.diag(lam2 / d**2)
    h = (h + h.conj().T) / 2
    try:
        low = np.linalg.cholesky(h)
    except np.linalg.LinAlgError:
        return None
    if n * eps * condition(h, low) >= 0.5:
        return None
    return low, d


def condition(h: np.ndarray, low: np.ndarray) -> float:
    """``cond_1(H)`` estimated from its Cholesky factor (LAPACK ``pocon``: ``O(n^2)``, where an SVD of the factor
    costs more than the solve it guards, for each grid value)."""
    from scipy.linalg import lapack

    pocon, = lapack.get_lapack_funcs(("pocon",), (low,))
    rcond, info = pocon(low, float(np.abs(h).sum(axis=0).max(initial=0.0)), uplo="L")
    return float("inf") if info != 0 or not rcond > 0 else 1.0 / float(rcond)


def scaled_solve(factor: tuple[np.ndarray, np.ndarray], c: np.ndarray) -> np.ndarray:
    """``(G + lam^2 I)^-1 c`` from :func:`scaled_factor`'s ``(L, d)`` (``c``: ``n x k``)."""
    from scipy.linalg import solve_triangular

    low, d = factor
    y = solve_triangular(low, c / d[:, None], lower=True)
    return solve_triangular(low, y, lower=True, trans="C") / d[:, None]


def scaled_inverse_diagonal(factor: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
    """``diag((G + lam^2 I)^-1)`` from :func:`scaled_factor`'s ``(L, d)``: ``||L^-1 e_i||^2 / d_i^2``, sums of
    squares (no cancellation)."""
    from scipy.linalg import solve_triangular

    low, d = factor
    inv = solve_triangular(low, np.eye(low.shape[0], dtype=low.dtype), lower=True)
    return (np.abs(inv) ** 2).sum(axis=0) / d**2


__all__ = ["condition", "refit", "scaled_factor", "scaled_inverse_diagonal", "scaled_solve"]
