"""The SVD's default tolerance: where the Lanczos SVD stops, and what the report judges the triplets of a
randomized SVD against when no ``tol`` is given (:func:`blocklin.linalg.lowrank.methods.judged_tol`)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np


def default_tol(dtype: Any) -> float:
    """Default residual tolerance of the Lanczos SVD: ``sqrt(10 sqrt(eps))`` (3.9e-4 in float64, 5.9e-2 in float32).

    It targets the singular values, not the residuals: the error of a Ritz value is about the square of
    its relative residual (Kato-Temple: ``|s_i^2 - theta_i| <= r_i^2 / gap_i``), so a residual of
    ``sqrt(10 sqrt(eps))`` gives singular values to about ``10 sqrt(eps)`` relative (better where the
    gap ``gap_i`` is wide), and the final Rayleigh-Ritz step over the Ritz vectors and their residuals
    (:func:`blocklin.linalg.lowrank.methods.lanczos`) squares the error once more. Pass ``tol=10 * sqrt(eps)`` for residuals (and
    singular vectors) at that level.
    """
    return math.sqrt(10.0 * math.sqrt(float(np.finfo(np.dtype(dtype)).eps)))


__all__ = ["default_tol"]
