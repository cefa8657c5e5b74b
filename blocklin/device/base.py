"""The device interface (selection lives in :mod:`blocklin.device.select`)."""

from __future__ import annotations

import abc
import contextlib
from collections.abc import Iterator
from typing import Any

import numpy as np

from blocklin.device import pool
from blocklin.errors import InternalError


class Device(abc.ABC):
    """What a tile kernel needs from a compute device.

    Host buffers come from :meth:`host_empty` (pinned on a GPU) and are filled by the caller;
    :meth:`upload` makes them usable by :meth:`gemm_acc` (asynchronously on a GPU, with the
    returned handle released through :meth:`after_use`). Results come back with :meth:`download`.
    """

    name = "device"
    #: Whether accumulator tiles live in host memory (CPU) or device memory (GPU).
    host_resident = True

    def host_empty(self, shape: tuple[int, ...], dtype: Any, uses: float | None = None) -> np.ndarray:
        """A host buffer for transfers; ``uses`` (copies it will carry over the job, None: many)
        lets a GPU decide whether pinning it pays (:data:`blocklin.device.cuda.PIN_MIN_USES`)."""
        return pool.aligned_empty(shape, dtype)

    def release_host(self, buf: np.ndarray) -> None:
        """Return a host buffer from :meth:`host_empty` for reuse (pinned buffers are costly)."""

    def slots(self, n: int, shapes: list[tuple[int, ...]], dtype: Any) -> None:
        """Prepare ``n`` device slots of the given operand shapes (no-op on the CPU)."""

    def upload(self, slot: int, arrays: tuple[np.ndarray, ...]) -> tuple[Any, ...]:
        return arrays

    def after_use(self, slot: int) -> None:
        """Called after the compute that read ``slot`` was issued."""

    def host_slot_free(self, slot: int) -> None:
        """Block until the host buffers of ``slot`` may be overwritten."""

    @abc.abstractmethod
    def zeros(self, shape: tuple[int, int], dtype: Any) -> Any:
        """A zeroed accumulator tile where the device computes."""

    @abc.abstractmethod
    def gemm_acc(self, acc: Any, a: Any, b: Any, alpha: float = 1.0) -> None:
        """``acc += alpha * a @ b`` in place (``a``/``b`` may be transposed views)."""

    def empty(self, shape: tuple[int, int], dtype: Any) -> Any:
        """An accumulator tile whose first product is written with :meth:`gemm_into` (default: zeroed)."""
        return self.zeros(shape, dtype)

    def gemm_into(self, out: Any, a: Any, b: Any) -> None:
        """``out = a @ b`` into a tile from :meth:`empty` (default: accumulate into the zeroed tile)."""
        self.gemm_acc(out, a, b)

    @abc.abstractmethod
    def axpby(self, acc: Any, alpha: float, c: np.ndarray | None, beta: float) -> None:
        """``acc = alpha * acc + beta * c`` in place (``c`` a host block of ``acc``'s shape)."""

    @abc.abstractmethod
    def download(self, acc: Any, rows: slice, out: np.ndarray | None = None) -> np.ndarray:
        """Host copy of ``acc[rows]`` (a view on the CPU)."""

    def synchronize(self) -> None:
        """Wait for all queued work (before reading a clock)."""

    def download_async(self, acc: Any, rows: slice, out: np.ndarray) -> tuple[np.ndarray, Any]:
        """Start copying ``acc[rows]`` into ``out``: ``(view, event or None)``; the view is valid once
        ``event.synchronize()`` returned. Without a device the copy is immediate."""
        return self.download(acc, rows, out=out), None

    @contextlib.contextmanager
    def reserve(self, nbytes: int) -> Iterator[None]:
        """Hold ``nbytes`` of the device budget that all tasks on this device share (no-op on a CPU,
        whose tasks the host budget already bounds)."""
        yield

    @contextlib.contextmanager
    def math(self, precision: str | None) -> Iterator[None]:
        """Within the block, float32 GEMMs may use ``precision`` (``"tf32"``: TF32 tensor cores on a GPU;
        a no-op on devices without such a mode)."""
        yield

    # -- dense operations on device arrays (small in-core steps of the algorithms) -------------
    # Operands and results live where the device computes (NumPy arrays on the CPU, CuPy arrays
    # on a GPU); inputs are never modified. Failures (not positive definite, singular) raise
    # SingularMatrixError on every device: a GPU library would return NaN silently.
    @abc.abstractmethod
    def cast(self, x: Any, dtype: Any) -> Any:
        """``x`` in ``dtype`` (``x`` itself when it already is)."""

    @abc.abstractmethod
    def copy(self, x: Any) -> Any:
        """A C-contiguous copy of device array ``x``."""

    @abc.abstractmethod
    def sumsq_cols_acc(self, acc: Any, x: Any) -> None:
        """``acc += sum(|x|**2, axis=0)`` accumulated in float64 (``acc`` a float64 vector); of complex
        ``x``, the squares of its real and imaginary parts (never the complex squares)."""

    @abc.abstractmethod
    def to_device(self, x: np.ndarray) -> Any:
        """``x`` where the device computes (a C-contiguous array; ``x`` itself on the CPU if possible)."""

    @abc.abstractmethod
    def to_host(self, x: Any) -> np.ndarray:
        """A host NumPy array with the contents of device array ``x`` (waits for it)."""

    @abc.abstractmethod
    def syrk_acc(self, acc: Any, a: Any) -> None:
        """``acc += a.T @ a`` (both triangles), with SYRK's half of the GEMM flops; ``a^H a`` of
        complex data (HERK: Hermitian, its diagonal real)."""

    def syrk_lower_acc(self, acc: Any, a: Any) -> None:
        """The lower triangle of ``acc += a.T @ a`` (``a^H a`` of complex data; the strictly upper
        triangle is then undefined).

        Default: the full product; a device overrides it with an in-place SYRK (half the flops, no
        temporary).
        """
        if a.dtype.kind == "c":
            with self.on_compute():  # conjugated where the device computes (ordered with its uploads)
                ah = a.T.conj()
            self.gemm_acc(acc, ah, a)
            return
        self.gemm_acc(acc, a.T, a)

    @abc.abstractmethod
    def cholesky(self, x: Any) -> Any:
        """Lower Cholesky factor ``L`` with ``x = L @ L.T``."""

    @abc.abstractmethod
    def solve_triangular(self, t: Any, b: Any, *, lower: bool, trans: bool = False, unit: bool = False) -> Any:
        """``op(t)^-1 @ b`` for triangular ``t`` (``op`` transposes when ``trans``); only the ``lower``
        (or upper) triangle of ``t`` is read, and with ``unit`` not its diagonal (taken as ones)."""

    @abc.abstractmethod
    def qr(self, x: Any) -> tuple[Any, Any]:
        """Reduced QR factorization ``(q, r)``."""

    @abc.abstractmethod
    def qr_r(self, x: Any) -> Any:
        """The ``min(m, n) x n`` upper-triangular (trapezoidal) R of Householder QR of ``x``."""

    @abc.abstractmethod
    def concat(self, arrays: list, axis: int) -> Any:
        """Device arrays joined along ``axis`` (0: stacked rows, 1: side by side)."""

    @abc.abstractmethod
    def svd(self, x: Any) -> tuple[Any, Any, Any]:
        """Thin SVD ``(u, s, vt)``, singular values descending."""

    @abc.abstractmethod
    def eigh(self, x: Any) -> tuple[Any, Any]:
        """Eigenvalues (ascending) and eigenvectors of symmetric ``x``."""

    @abc.abstractmethod
    def inv(self, x: Any) -> Any:
        """Inverse of a square (leaf) block."""

    def on_compute(self) -> contextlib.AbstractContextManager:
        """Context in which array-library calls on device arrays run where this device computes (its
        compute stream on a GPU, so that they are ordered with the uploads and GEMMs)."""
        return contextlib.nullcontext()

    def rotate_pairs(self, x: Any, p0: int, q0: int, h: int, c: Any, s: Any, *, axis: int) -> None:
        """Plane (Givens) rotations in place: for ``i < h``, ``(x_p, x_q) <- (c_i x_p + s_i x_q, c_i x_q - s_i x_p)``
        with ``p = p0 + i``, ``q = q0 + i`` the columns (``axis=1``) or rows (``axis=0``) of ``x``.

        ``c``/``s`` are length-``h`` vectors where the device computes (:meth:`to_device`). The building
        block of the random butterfly transforms (Parker 1995), applied one contiguous range pair at
        a time: slices, no gathers, a few temporaries of the pair's size.
        """
        with self.on_compute():
            if axis == 1:
                xp, xq = x[:, p0:p0 + h], x[:, q0:q0 + h]
            else:
                xp, xq = x[p0:p0 + h], x[q0:q0 + h]
                c, s = c.reshape(h, 1), s.reshape(h, 1)
            p_new = xp * c  # in the wider of x's and the rotations' dtypes, rounded once on assignment
            p_new += xq * s
            q_new = xq * c
            q_new -= xp * s
            xp[...] = p_new
            xq[...] = q_new

    def add_identity(self, x: Any, col0: int) -> None:
        """``x[i, col0 + i] += 1`` for every row ``i`` of a C-contiguous ``x`` (the identity's part in a row strip)."""
        h, n = x.shape
        if h and not x.flags.c_contiguous:
            raise InternalError("add_identity: x must be C-contiguous")
        with self.on_compute():
            diag = x.reshape(-1)[col0::n + 1][:h]  # strided view of the entries (i, col0 + i)
            diag += 1

    def lu_panel(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """LU with partial pivoting of a tall host panel (``m x w``, ``m >= w``): the packed factors
        (unit lower ``L`` below the diagonal, ``U`` on and above) and LAPACK's 0-based row swaps.

        LAPACK ``getrf`` on the host on every device: a panel is tall and narrow, so its
        factorization is bound by memory traffic, not flops. It runs on one BLAS thread: OpenBLAS's
        threaded ``getrf`` synchronizes its threads at every column of a tall panel and is no faster
        than one thread on an idle machine, and 2 to 10 times slower when other work shares the cores
        (measured on 4096 x 512 to 16384 x 1024 panels). A zero pivot is kept (``U`` singular), as
        LAPACK does; callers check ``U``'s diagonal.
        """
        from scipy.linalg import lapack
        from blocklin._blas import blas_threads

        getrf = lapack.get_lapack_funcs("getrf", (x,))
        with blas_threads(PANEL_GETRF_THREADS):
            lu, piv, info = getrf_in_range(getrf, x, overwrite_a=False)
        if info < 0:
            raise InternalError(f"getrf: illegal argument {-info}")
        return lu, piv.astype(np.int64)


def getrf_in_range(getrf: Any, x: np.ndarray, *, overwrite_a: bool) -> tuple[np.ndarray, np.ndarray, int]:
    """LAPACK ``getrf(x)`` with each column whose largest magnitude sits near the underflow threshold first
    scaled by a power of two near 1, and ``U``'s columns scaled back: exact, and the same factors, since
    partial pivoting compares entries within a column (``A D = P L (U D)``, the same ``L`` and pivots).

    OpenBLAS's ``getrf`` multiplies a column by the reciprocal of its pivot, which overflows for a
    subnormal pivot: a float32 matrix of entries near ``1e-39`` had been factored with multipliers near
    ``1e-39``, ``||PA - LU|| / ||A|| = 0.7`` and a log-determinant 235 off (found by a randomized search;
    NumPy's own LU was right). A column whose largest entry sits within ``2^3`` of the overflow threshold
    is scaled by ``2^-3`` for the same reason at the other end: the reciprocal of a real pivot above
    ``2^(maxexp - 2)`` is subnormal, and a complex pivot's (Smith's quotient, its denominator
    ``|z|^2 / |Re|`` up to twice the largest part) overflowed to zero: a complex64 column led by
    ``-2.4e38 - 1.9e38j`` had been factored with multipliers 0 for ``1e-3 - 0.14j``
    (``||PA - LU|| / (||L|| ||U||)`` 2e5 ``eps``; SciPy's ``lu_factor`` gives the same zeros). Columns
    within the range are not touched: their bits are ``getrf``'s.
    """
    from blocklin.peaks import column_peaks

    fi = np.finfo(x.dtype)
    peaks = column_peaks(x) if x.size else np.zeros(0)
    # below 2^(minexp + nmant) a column's entries keep a few bits, and its pivots may be subnormal
    small = (peaks > 0) & (peaks < 2.0 ** (fi.minexp + fi.nmant))
    # peaks are max(|Re|, |Im|): 2^-3 leaves |z|^2 / |Re| and 1 / |pivot| in range for every entry
    large = peaks >= 2.0 ** (fi.maxexp - 3)
    if not (small.any() or large.any()):
        return getrf(x, overwrite_a=overwrite_a)
    e = np.where(small, np.frexp(peaks)[1], np.where(large, 3, 0)).astype(np.intc)
    y = x if overwrite_a and x.flags.f_contiguous else np.array(x, order="F")
    for part in ((y.real, y.imag) if y.dtype.kind == "c" else (y,)):
        np.ldexp(part, -e[None, :], out=part)
    lu, piv, info = getrf(y, overwrite_a=True)
    w = min(lu.shape)
    for j in np.flatnonzero(small | large):  # U's column j: rows 0..j (L below is unchanged)
        col = lu[: min(j + 1, w), j]
        # over: a U entry beyond the range (the elimination's growth) becomes Inf, as getrf's own overflow
        # would; the LU panels' max |U| reads it, and every caller refuses a non-finite one (blocklin.lu,
        # the square solve's _lu, the inverse's LU route)
        with np.errstate(under="ignore", over="ignore"):
            for part in ((col.real, col.imag) if col.dtype.kind == "c" else (col,)):
                np.ldexp(part, int(e[j]), out=part)
    return lu, piv, info


#: BLAS threads of the panel factorization (:meth:`Device.lu_panel`).
PANEL_GETRF_THREADS = 1


def not_positive_definite(n: int) -> Exception:
    from blocklin.errors import SingularMatrixError, explain

    return SingularMatrixError(explain("matrix", "must be symmetric positive definite for Cholesky",
                                       f"a {n} x {n} block that is not (a pivot <= 0 or NaN)",
                                       "add Tikhonov regularization (lam > 0), or use a QR-based method"))


def singular(n: int) -> Exception:
    from blocklin.errors import SingularMatrixError, explain

    return SingularMatrixError(explain("matrix", "must be nonsingular to invert", f"a singular {n} x {n} block",
                                       "check the input, or solve a regularized problem (lam > 0)"))
