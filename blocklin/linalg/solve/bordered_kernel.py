"""Ridge solves with an unpenalized intercept from a kernel whose rows are far apart in scale: the bordered system.

With weights ``w`` (``u = sqrt(w)``), the fit ``min ||S (b - A x - 1 x0)||^2 + lam^2 ||x||^2`` (``S = diag(u)``) has
``x = A^T S y`` where ``[[C, u], [u^T, 0]] [y; x0] = [S b; 0]``, ``C = K + lam^2 I`` and ``K = S A A^T S``. The
residual is ``lam^2 y`` and ``I - hat = lam^2 Q`` with ``Q`` the bordered inverse's leading block,
``Q = N (N^T C N)^-1 N^T`` for ``N`` an orthonormal basis of ``u``'s complement: the leave-one-out error of row
``i`` is ``(Q S b)_i / Q_ii`` (Cawley and Talbot 2004, the exact leave-one-out of a least-squares kernel machine
with a bias). ``Q`` does not change when every row of ``A`` is shifted by the same vector (``N^T u = 0``), so
``K`` may be summed of ``A - 1 r^T`` for any row ``r``; it does not change when ``b`` is shifted either.

The centered kernel ``P K P`` that the spectrum takes mixes a far-off row into every row, and subtracting the
intercept's term ``C^-1 u u^T C^-1 / (u^T C^-1 u)`` afterwards cancels where one row carries the intercept (a row
near 0 among rows near 1). Here the kernel is scaled as :mod:`~blocklin.linalg.solve.scaled_kernel` does,
``H = D^-1 C D^-1``, ``D = diag(sqrt(C_ii))``, and ``N`` is the Householder basis of ``v = D^-1 u``'s complement
(each entry within a rounding of its value, Higham 2002, 19.3), so ``F = N^T H N`` is positive definite with
``cond(F) <= cond(H)`` (interlacing) and ``diag(Q) = ||L^-1 N^T e_i||^2 / D_ii^2`` (``L L^H = F``) are sums of
squares: ``D Q S b`` and ``D^2 diag(Q)`` carry a forward error of about ``(m + n) eps cond(F)`` times their norms,
where ``K`` rounds relative to its rows, ``|dK_ij| <= n eps ||u_i (a_i - r)|| ||u_j (a_j - r)||``.

The shift ``r`` matters there: rows ``a_i - r`` far larger than ``a_i - a_t`` for a typical row ``a_t`` (``r`` a
row far from the others) round the kernel relative to ``||r||``, a loss :func:`shift_loss` measures.
"""

from __future__ import annotations

import numpy as np


def shift_loss(g: np.ndarray, w: np.ndarray, lam2: np.ndarray) -> tuple[int, np.ndarray]:
    """``(t, rho2)``: a typical row ``t`` (smallest median squared distance to the others) and, per ``lam^2``,
    ``rho2 = max_i (w_i g_ii + lam^2) / (w_i s_i^2 + lam^2)``, ``s_i^2`` the median of row ``i``'s positive squared
    distances to the others (which no shift changes): the factor by which ``g``'s rounding (``g`` of the rows less
    some row ``r``, ``g_ii = ||a_i - r||^2``) exceeds that of rows as far from the shift as from the others,
    relative to the scaled ``H`` (``r`` far from every row: about ``||r||^2 / s_i^2``). The distances
    ``g_ii - 2 g_ij + g_jj`` come from ``g`` itself, within ``n eps max g_ii`` (enough to tell a factor from 1)."""
    m = g.shape[0]
    diag = np.maximum(np.diag(g).real, 0.0)
    dist = np.maximum(diag[:, None] - 2 * g.real + diag[None, :], 0.0)
    t = int(np.argmin(np.median(dist, axis=0)))
    floor = m * np.finfo(np.float64).eps * float(diag.max(initial=0.0))
    positive = np.where(dist > floor, dist, np.nan)
    with np.errstate(all="ignore"):
        spread = np.nanmedian(positive, axis=1) if m > 1 else np.full(m, np.nan)
    spread = np.where(np.isfinite(spread), spread, floor)
    lam2 = np.asarray(lam2, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = (w[:, None] * diag[:, None] + lam2[None, :]) / (w[:, None] * spread[:, None] + lam2[None, :])
    ratio = np.where(np.isnan(ratio), 1.0, ratio)  # a row of weight 0 with lam = 0
    return t, np.maximum(ratio.max(axis=0, initial=1.0), 1.0)


def shifted_by(g: np.ndarray, t: int) -> np.ndarray:
    """The kernel of the rows less row ``t``, ``(I - 1 e_t^T) g (I - e_t 1^T)``, from ``g`` of the rows less any
    row (rounded relative to ``g``'s entries)."""
    col = g[:, t]
    out = g - col[None, :] - col.conj()[:, None] + g[t, t]
    return (out + out.conj().T) / 2


def complement(v: np.ndarray) -> np.ndarray:
    """An orthonormal basis (``m x (m - 1)``, real) of ``v``'s complement: the Householder reflector that takes
    ``v / ||v||`` to ``-sign(v_p) e_p`` (``p`` its largest entry), less its column ``p``; entries
    ``delta_ij - v_i v_j / (1 + |v_p|)`` and ``-sign(v_p) v_j`` in row ``p``, each within a rounding of its value."""
    vh = v / np.linalg.norm(v)
    p = int(np.argmax(np.abs(vh)))
    h = vh.copy()
    h[p] += 1.0 if vh[p] >= 0 else -1.0
    reflector = np.eye(v.size) - np.outer(h, h) / (1.0 + abs(vh[p]))
    return np.delete(reflector, p, axis=1)


def bordered_factor(k: np.ndarray, u: np.ndarray, lam2: float) -> tuple | None:
    """``(L, d, N, cond)``: ``L L^H = F = N^T D^-1 (k + lam^2 I) D^-1 N``, ``D``'s diagonal ``d`` and ``N``
    (:func:`complement` of ``D^-1 u``), and ``cond_1(F)``; None where ``F`` is not numerically positive definite
    (``m eps cond(F)`` from 0.5), as :func:`~blocklin.linalg.solve.scaled_kernel.scaled_factor`."""
    from blocklin.linalg.solve.scaled_kernel import condition

    m = k.shape[0]
    d = np.sqrt(np.maximum(np.diag(k).real, 0.0) + lam2)
    h = k / np.outer(d, d) + np.diag(lam2 / d**2)
    basis = complement(u / d)
    f = basis.T @ h @ basis
    f = (f + f.conj().T) / 2
    try:
        low = np.linalg.cholesky(f)
    except np.linalg.LinAlgError:
        return None
    cond = condition(f, low)
    if m * np.finfo(np.float64).eps * cond >= 0.5:
        return None
    return low, d, basis, cond


def bordered_solve(factor: tuple, c: np.ndarray) -> np.ndarray:
    """``Q c`` (``c``: ``m x k``) from :func:`bordered_factor`'s factor."""
    from scipy.linalg import solve_triangular

    low, d, basis = factor[:3]
    y = solve_triangular(low, basis.T @ (c / d[:, None]), lower=True)
    return basis @ solve_triangular(low, y, lower=True, trans="C") / d[:, None]


def bordered_fit(factor: tuple, k: np.ndarray, u: np.ndarray, lam2: float, c: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(y, x0)`` of the bordered system ``[[k + lam^2 I, u], [u^T, 0]] [y; x0] = [c; 0]`` (``c``: ``m x k``; ``x0``
    one per column) from :func:`bordered_factor`'s factor of the same ``k``, ``u`` and ``lam2``: ``y = Q c``
    (:func:`bordered_solve`) and ``x0`` from the border's residual in the scaled system,
    ``D^-1 c - H D y = v x0`` (``v = D^-1 u``, ``H = D^-1 (k + lam^2 I) D^-1``, whose entries are at most 1), read
    along ``v``: ``x0 = v^T (D^-1 c - H D y) / ||v||^2``, off by about ``||H|| ||d(D y)|| / ||v||``, the bordered
    system's own forward error in ``x0 / ||v||^-1``. The k-fold fits, the solve at given lambdas and the
    leave-one-out's ``Q`` thus share one factorization (:func:`bordered_factor`)."""
    low, d, basis = factor[:3]
    y = bordered_solve(factor, c)
    v = u / d
    dy = d[:, None] * y
    resid = c / d[:, None] - (k / np.outer(d, d)) @ dy - (lam2 / d**2)[:, None] * dy
    return y, (v @ resid) / float(v @ v)


def bordered_inverse_diagonal(factor: tuple) -> np.ndarray:
    """``diag(Q)`` from :func:`bordered_factor`'s factor: ``||L^-1 N^T e_i||^2 / d_i^2``, sums of squares."""
    from scipy.linalg import solve_triangular

    low, d, basis = factor[:3]
    inv = solve_triangular(low, basis.T.astype(low.dtype), lower=True)
    return (np.abs(inv) ** 2).sum(axis=0) / d**2


__all__ = ["bordered_factor", "bordered_fit", "bordered_inverse_diagonal", "bordered_solve", "complement", "shift_loss",
           "shifted_by"]
