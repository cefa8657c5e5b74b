"""SYRK helpers of the Gram sums: ``G += A^T A`` on one triangle by BLAS, and the mirror that completes it.

Host BLAS (the CPU device's HERK uses them, so they live in the device layer). Shared by every pass
that forms a Gram matrix in memory (the solver's normal equations, the
``gram`` operation's strips, the centered moments, the SVD's Gram route). A SYRK costs half the
flops of the GEMM ``A^T @ A``. Complex data takes HERK: ``G += A^H A``, Hermitian, its diagonal
real (LAPACK's ``zherk``/``cherk`` convention: the diagonal's imaginary parts are set to zero).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from blocklin.device import host_blas


def _blas_syrk(dtype: np.dtype):
    """BLAS's SYRK for real ``dtype``, HERK for complex (``None`` for other dtypes)."""
    from scipy.linalg import blas

    return {np.dtype(np.float64): blas.dsyrk, np.dtype(np.float32): blas.ssyrk,
            np.dtype(np.complex128): blas.zherk, np.dtype(np.complex64): blas.cherk}.get(np.dtype(dtype))


#: Bytes of the accumulator-dtype copy of one block of a strip's rows that :func:`syrk_acc` casts and
#: sums at a time: the copy stays in the core's cache for the SYRK that reads it. A float32 strip of
#: 32768 x 64 cast whole to float64 (16 MiB) and summed took 0.99 s per GiB on one thread, in blocks
#: of 4096 rows through one reused buffer 0.76-0.81 s (the SYRK alone 0.76 s).
SYRK_CAST_BLOCK_BYTES = 2 << 20


def block_rows(width: int, dtype: Any, nbytes: int | None = None) -> int:
    """Rows of a ``width``-wide block of ``dtype`` within ``nbytes`` (default :data:`SYRK_CAST_BLOCK_BYTES`;
    at least one row): the blocks a strip's copies are made and summed by, so that each stays in the
    core's cache for the SYRK that reads it (a constant split of the rows: the same sums on every
    scheduler)."""
    return max(1, (SYRK_CAST_BLOCK_BYTES if nbytes is None else nbytes) // max(1, width * np.dtype(dtype).itemsize))


def syrk_acc(g: np.ndarray, a: np.ndarray) -> None:
    """``lower(g) += a^H a`` in place (``a^T a`` of real data; ``g`` C-contiguous ``n x n``, ``a`` an
    ``h x n`` strip). A strip that must be copied (another dtype; complex data not C-ordered; an order
    BLAS cannot read) is copied and summed in blocks of :data:`SYRK_CAST_BLOCK_BYTES` (a fixed split of
    its rows: the same sums on every scheduler)."""
    f = _blas_syrk(g.dtype)
    if f is None or not g.flags.c_contiguous:
        a = np.asarray(a, dtype=g.dtype)  # the products in the sum's dtype
        g += a.conj().T @ a if a.dtype.kind == "c" else a.T @ a
        return
    # A real strip stored by columns (a strip of a source streamed transposed: a wide A's columns) is
    # summed as it lies, by SYRK's transposed form: a 65536 x 64 float64 strip 8.7 ms, against 14.2 ms
    # copied into rows by blocks first. (HERK's transposed form would sum the conjugate: complex strips
    # are copied into rows.)
    by_columns = g.dtype.kind != "c" and not a.flags.c_contiguous and host_blas.blas_layout(a)
    if a.dtype == g.dtype and (a.flags.c_contiguous or by_columns):
        _syrk_block(g, a, by_columns)
        return
    rows = min(a.shape[0], block_rows(a.shape[1], g.dtype))
    # one buffer reused by the blocks (a new one per block is a new mapping whose pages fault in each
    # time: 0.88 s per GiB for the casts alone, against 0.35 s for one strip-sized copy); in the strip's
    # own order, so that each block's copy runs along contiguous memory
    buf = np.empty((rows, a.shape[1]), dtype=g.dtype, order="F" if by_columns else "C")
    for r0 in range(0, a.shape[0], rows):
        b = buf[: min(rows, a.shape[0] - r0)]
        np.copyto(b, a[r0:r0 + b.shape[0]], casting="unsafe")  # the cast BLAS's wrapper made, by blocks
        _syrk_block(g, b, by_columns)


def _syrk_block(g: np.ndarray, a: np.ndarray, by_columns: bool) -> None:
    # g.T is Fortran-ordered; BLAS fills its upper triangle with (a^H a)^T, which is the lower triangle
    # of g = a^H a (a^T a of real data): from a.T (n x h, Fortran-ordered where a's rows are C-ordered)
    # as a.T a.T^H, or from a real a stored by columns as a^T a. Without the GIL: blocklin.device.host_blas.
    if by_columns:
        host_blas.syrk(1.0, a, beta=1.0, c=g.T, trans=1, lower=0)
    else:
        host_blas.syrk(1.0, a.T, beta=1.0, c=g.T, trans=0, lower=0)


def symmetrize_lower(g: np.ndarray) -> np.ndarray:
    """Complete a matrix whose lower triangle (row-major view) holds the Gram sums: symmetric, or
    Hermitian with a real diagonal for complex data (HERK's convention)."""
    il = np.tril_indices(g.shape[0], -1)
    g[il[1], il[0]] = g[il].conj() if g.dtype.kind == "c" else g[il]
    if g.dtype.kind == "c":
        g.imag[np.diag_indices_from(g)] = 0
    return g
