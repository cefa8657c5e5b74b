"""How the SVD judges its triplets: the rounding levels of ``B^T B`` and of products with ``B``, each
triplet's residual relative to its own singular value (and the report of them), and the residual
directions the Lanczos SVD's final Rayleigh-Ritz step adds to its Ritz vectors.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np


def resolution_floor(dtype: Any) -> float:
    """Relative size ``sqrt(eps)`` below which a singular value is judged against ``s_1`` instead of itself.

    Singular values under ``sqrt(eps) s_1`` are at the rounding level of the normal operator
    ``B^T B`` the iterations apply; their residuals are bounded by ``tol * sqrt(eps) * s_1``.
    """
    return math.sqrt(float(np.finfo(np.dtype(dtype)).eps))


def rounding_level(dtype: Any, M: int) -> float:
    """Relative size of the rounding in a product with ``M``-long columns: ``eps sqrt(M)``."""
    return float(np.finfo(np.dtype(dtype)).eps) * math.sqrt(max(M, 1))


def numerically_zero(s: np.ndarray, ref: float, dtype: Any, M: int) -> np.ndarray:
    """Which computed singular values are zeros of ``A``: ``s_i <= eps sqrt(M) ref``, ``ref`` the largest
    singular value (or what the products were rounded at, when larger).

    The methods compute ``s`` from a factor of a product with ``M``-long columns, whose rounding is
    ``eps sqrt(M) ||A||`` (the probabilistic bound of Higham and Mary, SIAM J. Sci. Comput. 41(5), 2019;
    LAPACK's own bound on the singular values, Weyl's ``p(M, N) eps s_1``, is above it): a value at or
    below it may be a zero of ``A`` and is reported as ``0``, its long factor's column an orthonormal
    completion (:mod:`blocklin.linalg.blocks.complete`). Moving it to ``0`` stays within that rounding;
    it is NumPy's ``matrix_rank`` rule with ``sqrt(M)`` for its worst-case ``max(m, n)``."""
    return np.asarray(s) <= rounding_level(dtype, M) * ref


def triplet_scale(sig: np.ndarray, dtype: Any) -> np.ndarray:
    """What each triplet's residual is relative to: its own ``s_i``, floored at ``sqrt(eps) s_1``."""
    s1 = float(sig.max(initial=0.0))
    floor = resolution_floor(dtype) * s1
    return np.maximum(sig, floor if floor > 0 else np.finfo(np.float64).tiny)


def triplet_report(s: np.ndarray, resid: np.ndarray | None, tol: float | None, dtype: Any) -> dict:
    """Per-triplet residuals relative to each triplet's own singular value, converged flags, the worst one.

    ``relative_residuals[i] = ||A^T u_i - s_i v_i|| / max(s_i, sqrt(eps) s_1)``: a triplet is judged
    against its own ``s_i`` (the floor keeps triplets at the rounding level of ``s_1``, such as the
    zero singular values of a rank-deficient matrix, from reading as unconverged)."""
    if resid is None:
        return {"residuals": None, "relative_residuals": None, "converged_triplets": None, "worst_triplet": None}
    rel = resid / triplet_scale(s, dtype)
    # a NaN residual (or singular value) was not checked: never converged
    conv = np.isfinite(rel) & np.isfinite(s) & ((rel <= tol * (1 + 1e-9)) if tol is not None else True)
    worst = int(np.argmax(rel)) if rel.size else 0
    return {"residuals": resid.tolist(), "relative_residuals": rel.tolist(), "converged_triplets": conv.tolist(),
            "worst_triplet": {"index": worst + 1, "s": float(s[worst]), "relative_residual": float(rel[worst]),
                              "converged": bool(conv[worst])} if rel.size else None}


def enrich_width(k: int, block: int, N: int) -> int:
    """Columns the final Rayleigh-Ritz step of the Lanczos SVD adds to the ``k`` Ritz vectors: their
    residual directions, at most ``k`` (and at most the block, and what ``N`` leaves)."""
    return max(0, min(k, block, N - k))
