"""CPU device: NumPy arrays, BLAS GEMM accumulating in place."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

import numpy as np

from blocklin.device import host_blas
from blocklin.device.base import Device, not_positive_definite, singular
from blocklin.device.half import is_half, round_to
from blocklin.device.scalars import scale_in_place, scaled

#: The math mode of this thread's tasks (``CpuDevice`` objects are made per call; a task's mode is
#: set by :meth:`CpuDevice.math` around it, in its thread).
_MODE = threading.local()


#: Largest order factored by a threaded LAPACK ``potrf``. The OpenBLAS builds in the NumPy and SciPy
#: wheels (0.3.30, 0.3.31) segfault in their threaded ``potrf`` from about n = 16000 (n = 15500 ran,
#: 16000 and 16384 crashed, with two threads, whatever the stack limit); larger matrices are
#: factored on one thread, which costs time and not the process.
THREADED_POTRF_MAX = 15000


def potrf_threads(n: int) -> Any:
    """A context for a ``potrf`` of order ``n`` on the CPU: one BLAS thread above
    :data:`THREADED_POTRF_MAX`, else the threads the runtime set."""
    import contextlib

    if n <= THREADED_POTRF_MAX:
        return contextlib.nullcontext()
    from blocklin._blas import blas_threads

    return blas_threads(1)


class CpuDevice(Device):
    """NumPy/BLAS device. Tiles stay in host memory; ``gemm_acc`` uses BLAS with ``beta=1``.

    BLAS threads are limited by the runtime (threadpoolctl) so that BLAS threads x Dask threads
    never exceed the cores.
    """

    name = "cpu"
    host_resident = True

    def zeros(self, shape: tuple[int, int], dtype: Any) -> np.ndarray:
        # Filling touches every page up front (fast, with transparent huge pages); calloc's lazily
        # zeroed pages would instead fault one by one inside the first GEMM (measured: +0.5 s on
        # a 512 MiB accumulator).
        acc = np.empty(shape, dtype=dtype)
        acc.fill(0)
        return acc

    @contextlib.contextmanager
    def math(self, precision: str | None) -> Iterator[None]:
        """Within the block, float32 GEMMs take ``"fp16"``/``"bf16"`` inputs (each operand rounded to the
        format, products accumulated in float32: an emulation of a tensor-core GEMM, see
        :mod:`blocklin.device.half`); ``"tf32"`` and ``None`` leave them in float32."""
        prev = getattr(_MODE, "half", None)
        _MODE.half = precision if is_half(precision) else None
        try:
            yield
        finally:
            _MODE.half = prev

    def gemm_acc(self, acc: np.ndarray, a: np.ndarray, b: np.ndarray, alpha: float = 1.0) -> None:
        _gemm_acc(acc, *_half_inputs(acc, a, b), alpha)

    def empty(self, shape: tuple[int, int], dtype: Any) -> np.ndarray:
        # Not zeroed: the first product overwrites it (BLAS beta=0), faulting each page in once
        # inside that GEMM, instead of a zeroing pass over the whole tile before it.
        return np.empty(shape, dtype=dtype)

    def gemm_into(self, out: np.ndarray, a: np.ndarray, b: np.ndarray) -> None:
        _gemm_acc(out, *_half_inputs(out, a, b), beta=0.0)

    def axpby(self, acc: np.ndarray, alpha: float, c: np.ndarray | None, beta: float) -> None:
        if alpha == 0.0:
            acc.fill(0)  # assign: 0 * NaN is NaN
        elif alpha != 1.0:
            scale_in_place(acc, alpha)  # alpha outside the dtype's normal range kept to its precision
        if c is not None and beta != 0.0:
            if beta == 1.0:
                acc += c
            else:
                acc += scaled(c, beta, acc.dtype)

    def download(self, acc: np.ndarray, rows: slice, out: np.ndarray | None = None) -> np.ndarray:
        return acc[rows]

    # -- dense operations (LAPACK through NumPy/SciPy) ----------------------------------------------
    def cast(self, x: np.ndarray, dtype: Any) -> np.ndarray:
        return x.astype(dtype, copy=False)

    def copy(self, x: np.ndarray) -> np.ndarray:
        return np.array(x, order="C")

    def sumsq_cols_acc(self, acc: np.ndarray, x: np.ndarray) -> None:
        for part in ((x.real, x.imag) if x.dtype.kind == "c" else (x,)):
            acc += np.einsum("ij,ij->j", part, part, dtype=np.float64)

    def to_device(self, x: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(x)

    def to_host(self, x: np.ndarray) -> np.ndarray:
        return x

    def syrk_acc(self, acc: np.ndarray, a: np.ndarray) -> None:
        from blocklin.device.syrk import symmetrize_lower, syrk_acc

        if a.dtype.kind == "c":  # HERK: a^H a, Hermitian with a real diagonal
            low = np.zeros((a.shape[1], a.shape[1]), dtype=acc.dtype)
            syrk_acc(low, a)
            acc += symmetrize_lower(low)
            return
        if a.dtype not in (np.float64, np.float32) or acc.dtype != a.dtype:
            _gemm_acc(acc, a.T, a)
            return
        up = np.zeros((a.shape[1], a.shape[1]), dtype=a.dtype, order="F")  # upper triangle of a.T @ a (small)
        host_blas.syrk(1.0, np.asfortranarray(a), beta=0.0, c=up, trans=1, lower=0)
        acc += np.triu(up) + np.triu(up, 1).T

    def syrk_lower_acc(self, acc: np.ndarray, a: np.ndarray) -> None:
        if a.dtype.kind == "c":  # HERK: lower(a^H a)
            from blocklin.device.syrk import syrk_acc

            syrk_acc(acc, a) if acc.flags.c_contiguous else _gemm_acc(acc, a.conj().T, a)
            return
        if a.dtype not in (np.float64, np.float32) or acc.dtype != a.dtype or not acc.flags.c_contiguous:
            _gemm_acc(acc, a.T, a)
            return
        # BLAS is column-major: the upper triangle of the Fortran view acc.T is acc's lower triangle;
        # a.T @ a is a product "A A^T" of at = a.T, passed as a flag when a is C- or F-ordered
        at, trans = ((a.T, 0) if a.T.flags.f_contiguous else
                     (a, 1) if a.flags.f_contiguous else (np.asfortranarray(a.T), 0))
        host_blas.syrk(1.0, at, beta=1.0, c=acc.T, trans=trans, lower=0)

    def cholesky(self, x: np.ndarray) -> np.ndarray:
        try:
            with potrf_threads(x.shape[0]):
                return np.linalg.cholesky(x)
        except np.linalg.LinAlgError:
            raise not_positive_definite(x.shape[0]) from None

    def solve_triangular(self, t: np.ndarray, b: np.ndarray, *, lower: bool, trans: bool = False,
                         unit: bool = False) -> np.ndarray:
        trsm = _blas_trsm(t.dtype)
        if (trsm is None or b.dtype != t.dtype or t.ndim != 2 or b.ndim != 2 or t.shape[0] != t.shape[1]
                or (not unit and not np.diagonal(t).all())):  # an exact zero pivot: SciPy's error
            from scipy.linalg import solve_triangular

            return solve_triangular(t, b, lower=lower, trans=1 if trans else 0, unit_diagonal=unit,
                                    check_finite=False)
        return _trsm(trsm, t, b, lower=lower, trans=trans, unit=unit)

    def qr(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return np.linalg.qr(x, mode="reduced")

    def qr_r(self, x: np.ndarray) -> np.ndarray:
        return np.linalg.qr(x, mode="r")

    def concat(self, arrays: list, axis: int) -> np.ndarray:
        return np.concatenate(arrays, axis=axis)

    def svd(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        return np.linalg.svd(x, full_matrices=False)

    def eigh(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return np.linalg.eigh(x)

    def inv(self, x: np.ndarray) -> np.ndarray:
        try:
            out = np.linalg.inv(x)
        except np.linalg.LinAlgError:
            raise singular(x.shape[0]) from None
        if not np.isfinite(out).all():
            raise singular(x.shape[0])
        return out


def _blas_gemm(dtype: np.dtype):
    from scipy.linalg import blas

    return {np.dtype(np.float64): blas.dgemm, np.dtype(np.float32): blas.sgemm,
            np.dtype(np.complex128): blas.zgemm, np.dtype(np.complex64): blas.cgemm}.get(np.dtype(dtype))


def _blas_trsm(dtype: np.dtype):
    from scipy.linalg import blas

    # complex too: the calls below use only transposes (trans_a 0 or 1), never BLAS's conjugate (2),
    # so the C-ordered operands passed as their transposes stay exact for complex data
    return {np.dtype(np.float64): blas.dtrsm, np.dtype(np.float32): blas.strsm,
            np.dtype(np.complex128): blas.ztrsm, np.dtype(np.complex64): blas.ctrsm}.get(np.dtype(dtype))


def _fortran_operand(t: np.ndarray) -> tuple[np.ndarray, bool]:
    """``t`` as BLAS takes it (Fortran-ordered) without a copy where possible: a C-ordered ``t`` is
    passed as its transpose (``flipped``: the other triangle, transposition flipped)."""
    if t.flags.f_contiguous:
        return t, False
    if t.flags.c_contiguous:
        return t.T, True
    return np.asfortranarray(t), False


def _trsm(trsm: Any, t: np.ndarray, b: np.ndarray, *, lower: bool, trans: bool, unit: bool) -> np.ndarray:
    """``op(t)^-1 b`` by one BLAS TRSM on a copy of ``b``, with no other copy (without the GIL:
    :mod:`blocklin.device.host_blas`).

    BLAS is column-major: a C-ordered ``t`` is passed as its Fortran-ordered transpose (the other
    triangle, ``trans`` flipped); a C-ordered ``b`` is solved as ``X^T = B^T op(t)^-T`` from the right
    on its Fortran-ordered transpose (SciPy's ``solve_triangular`` copies both to Fortran order).
    """
    a, flipped = _fortran_operand(t)
    a_lower = lower != flipped
    if b.flags.f_contiguous and not b.flags.c_contiguous:
        out = np.array(b, order="F")  # op(t)^-1 B, from the left
        return host_blas.trsm(1.0, a, out, side=0, lower=int(a_lower), trans_a=int(trans != flipped), diag=int(unit))
    out = np.array(b, order="C")  # (B^T op(t)^-T)^T, from the right on out.T
    return host_blas.trsm(1.0, a, out.T, side=1, lower=int(a_lower), trans_a=int((not trans) != flipped),
                          diag=int(unit)).T


def trsm_inplace(t: np.ndarray, b: np.ndarray, *, lower: bool, unit: bool = False) -> np.ndarray:
    """``b = t^-1 b`` in place by one BLAS TRSM; returns ``b``. A C-contiguous ``b`` is solved as its
    Fortran-ordered view ``b.T`` (``side`` right, as :func:`_trsm` does on its copy); any other ``b``
    directly (``side`` left: in place when Fortran-ordered, else on the wrapper's Fortran copy, copied
    back). ``t`` in either order is passed without a copy. A non-unit ``t`` with a zero on its
    diagonal goes through SciPy (its error)."""
    trsm = _blas_trsm(t.dtype)
    # BLAS's own layout, or a strided b (the wrapper solves a Fortran-ordered copy, copied back)
    fortran = not b.flags.c_contiguous
    if (trsm is None or b.dtype != t.dtype or b.ndim != 2
            or t.ndim != 2 or (not unit and not np.diagonal(t).all())):
        b[...] = CpuDevice().solve_triangular(t, b, lower=lower, unit=unit)
        return b
    a, flipped = _fortran_operand(t)
    if fortran:
        out = host_blas.trsm(1.0, a, b, side=0, lower=int(lower != flipped), trans_a=int(flipped), diag=int(unit))
        if not np.shares_memory(out, b):  # the wrapper copied after all
            b[...] = out
        return b
    out = host_blas.trsm(1.0, a, b.T, side=1, lower=int(lower != flipped), trans_a=int(not flipped), diag=int(unit))
    if not np.shares_memory(out, b):  # the wrapper copied after all
        b[...] = out.T
    return b


def _half_inputs(acc: np.ndarray, a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The GEMM's operands in this thread's 16-bit math mode (float32 GEMMs only)."""
    mode = getattr(_MODE, "half", None)
    if mode is None or acc.dtype != np.float32:
        return a, b
    return round_to(np.asarray(a, dtype=np.float32), mode), round_to(np.asarray(b, dtype=np.float32), mode)


def _gemm_acc(acc: np.ndarray, a: np.ndarray, b: np.ndarray, alpha: float = 1.0, beta: float = 1.0) -> None:
    """``acc = alpha * a @ b + beta * acc`` (``beta`` 1 or 0) without a temporary: BLAS gemm into ``acc``
    (without the GIL: :mod:`blocklin.device.host_blas`).

    A C-contiguous ``acc``: BLAS is column-major, so compute ``acc.T += b.T @ a.T`` on the
    Fortran-ordered view ``acc.T``; a Fortran-contiguous ``acc`` directly. Transposed operands are
    passed as flags, never copied.
    """
    gemm = _blas_gemm(acc.dtype)
    if gemm is not None and acc.flags.f_contiguous and not acc.flags.c_contiguous:
        # a Fortran-ordered acc is BLAS's own layout: acc = a @ b directly (operands as flags)
        af, trans_a = (a, 0) if a.flags.f_contiguous else ((a.T, 1) if a.T.flags.f_contiguous else (np.asfortranarray(a), 0))
        bf, trans_b = (b, 0) if b.flags.f_contiguous else ((b.T, 1) if b.T.flags.f_contiguous else (np.asfortranarray(b), 0))
        host_blas.gemm(alpha, af, bf, beta=beta, c=acc, trans_a=trans_a, trans_b=trans_b)
        return
    if gemm is None or not acc.flags.c_contiguous:
        prod = a @ b if alpha == 1.0 else acc.dtype.type(alpha) * (a @ b)
        if beta == 0.0:
            acc[...] = prod
        else:
            acc += prod
        return
    bt, trans_b = (b.T, 0) if b.T.flags.f_contiguous else ((b, 1) if b.flags.f_contiguous else (np.asfortranarray(b.T), 0))
    rows = thin_rows(acc, a)
    if rows:  # a thin product: BLAS calls over pieces of its rows (see thin_rows)
        for r0 in range(0, acc.shape[0], rows):
            host_blas.gemm(alpha, bt, a[r0:r0 + rows].T, beta=beta, c=acc[r0:r0 + rows].T, trans_a=trans_b, trans_b=0)
        return
    at, trans_a = (a.T, 0) if a.T.flags.f_contiguous else ((a, 1) if a.flags.f_contiguous else (np.asfortranarray(a.T), 0))
    host_blas.gemm(alpha, bt, at, beta=beta, c=acc.T, trans_a=trans_b, trans_b=trans_a)


#: Largest ``m n k`` of one BLAS call over the rows of a thin product (:func:`thin_rows`).
THIN_PIECE_MNK = 1 << 19
#: Widest output that :func:`thin_rows` splits, and the fewest rows of a piece.
THIN_MAX_COLUMNS = 48
THIN_MIN_ROWS = 32
#: Shortest inner dimension that :func:`thin_rows` splits.
THIN_MIN_INNER = 256


def thin_rows(acc: np.ndarray, a: np.ndarray) -> int:
    """Rows per BLAS call of ``acc = a @ b`` for a thin product (a C-ordered real ``acc`` of at most
    :data:`THIN_MAX_COLUMNS` columns, a C-ordered ``a`` of at least :data:`THIN_MIN_INNER` columns), or 0
    for one call over all of them.

    OpenBLAS runs a GEMM of ``m n k`` below about ``10^6`` with its small-matrix kernels, which read the
    operands where they lie, and a larger one by packing panels of ``a`` first: for a thin product that
    packing is a second trip of ``a`` through memory for a few flops per element. Calls of at most
    :data:`THIN_PIECE_MNK` stay on the first path. Measured on the 2-core machine (one thread, 8 MiB
    strips of a 1 GiB float64 ``a`` not in the cache, ``k = 512``): ``n = 4`` 7.6 -> 13.6 GB/s, ``n = 8``
    6.5 -> 14.0, ``n = 16`` 5.3 -> 9.8, ``n = 32`` 3.8 -> 5.5; float32 ``n = 4`` 6.7 -> 10.3. Each output
    row is the same dot products in any split of the rows into calls; a split's bits are those of a call
    of its height, fixed by the shapes (never by the scheduler). Complex products gained nothing and are
    not split, nor are short inner dimensions (float32 ``k = 64`` lost).
    """
    m, n = acc.shape
    k = a.shape[1] if a.ndim == 2 else 0
    if acc.dtype.kind != "f" or not (acc.flags.c_contiguous and a.flags.c_contiguous) or n > THIN_MAX_COLUMNS \
            or k < THIN_MIN_INNER:
        return 0
    rows = THIN_PIECE_MNK // max(1, n * k)
    return rows if THIN_MIN_ROWS <= rows < m else 0
