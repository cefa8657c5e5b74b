"""SYRK helpers of the Gram sums: ``G += A^T A`` on one triangle by BLAS, and the mirror that completes it.

Host BLAS (the CPU device's HERK uses them, so they live in the device layer). Shared by every pass
that forms a Gram matrix in memory (the solver's normal equations, the
``gram`` operation's strips, the centered moments, the SVD's Gram route). A SYRK costs half the
flops of the GEMM ``A^T @ A``. Complex data takes HERK: ``G += A^H A``, Hermitian, its diagonal
real (LAPACK's ``zherk``/``cherk`` convention: the diagonal's imaginary parts are set to zero).
"""

from __future__ import annotations

import numpy as np


def _blas_syrk(dtype: np.dtype):
    """BLAS's SYRK for real ``dtype``, HERK for complex (``None`` for other dtypes)."""
    from scipy.linalg import blas

    return {np.dtype(np.float64): blas.dsyrk, np.dtype(np.float32): blas.ssyrk,
            np.dtype(np.complex128): blas.zherk, np.dtype(np.complex64): blas.cherk}.get(np.dtype(dtype))


def syrk_acc(g: np.ndarray, a: np.ndarray) -> None:
    """``lower(g) += a^H a`` in place (``a^T a`` of real data; ``g`` C-contiguous ``n x n``, ``a`` an
    ``h x n`` strip)."""
    f = _blas_syrk(g.dtype)
    if f is None or not g.flags.c_contiguous:
        g += a.conj().T @ a if a.dtype.kind == "c" else a.T @ a
        return
    at = np.asarray(a, dtype=g.dtype).T  # n x h in the accumulator's dtype (the cast BLAS's wrapper made)
    if not at.flags.f_contiguous:
        at = np.asfortranarray(at)
    # g.T is Fortran-ordered; BLAS fills its upper triangle with at at^H = (a^H a)^T, which is the
    # lower triangle of g = a^H a (a^T a of real data).
    f(1.0, at, beta=1.0, c=g.T, trans=0, lower=0, overwrite_c=1)


def symmetrize_lower(g: np.ndarray) -> np.ndarray:
    """Complete a matrix whose lower triangle (row-major view) holds the Gram sums: symmetric, or
    Hermitian with a real diagonal for complex data (HERK's convention)."""
    il = np.tril_indices(g.shape[0], -1)
    g[il[1], il[0]] = g[il].conj() if g.dtype.kind == "c" else g[il]
    if g.dtype.kind == "c":
        g.imag[np.diag_indices_from(g)] = 0
    return g
