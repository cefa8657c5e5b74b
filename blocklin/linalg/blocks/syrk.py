"""SYRK helpers of the Gram sums: ``G += A^T A`` on one triangle by BLAS, and the mirror that completes it.

Shared by every pass that forms a Gram matrix in memory (the solver's normal equations, the
``gram`` operation's strips, the centered moments, the SVD's Gram route). A SYRK costs half the
flops of the GEMM ``A^T @ A``.
"""

from __future__ import annotations

import numpy as np


def syrk_acc(g: np.ndarray, a: np.ndarray) -> None:
    """``upper(g) += a^T a`` in place (``g`` C-contiguous ``n x n``, ``a`` an ``h x n`` strip)."""
    from scipy.linalg import blas

    f = {np.dtype(np.float64): blas.dsyrk, np.dtype(np.float32): blas.ssyrk}.get(g.dtype)
    if f is None or not g.flags.c_contiguous:
        g += a.T @ a
        return
    at = a.T  # n x h, Fortran-ordered when a is C-ordered
    if not at.flags.f_contiguous:
        at = np.asfortranarray(at)
    # g.T is Fortran-ordered; BLAS fills its upper triangle = the lower triangle of g.
    f(1.0, at, beta=1.0, c=g.T, trans=0, lower=0, overwrite_c=1)


def symmetrize_lower(g: np.ndarray) -> np.ndarray:
    """Complete a matrix whose lower triangle (row-major view) holds the Gram sums."""
    il = np.tril_indices(g.shape[0], -1)
    g[il[1], il[0]] = g[il]
    return g
