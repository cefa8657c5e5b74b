"""GEMM, SYRK/HERK, TRSM and LAPACK's GEQRF on the host without holding the GIL: SciPy's own OpenBLAS
called through ``ctypes``.

SciPy's ``scipy.linalg.blas`` wrappers (f2py) keep the GIL for the whole BLAS call. A row pass runs
two tasks at once on a 2-core machine, each with one BLAS thread, so their products ran one after the
other: two threads calling ``sgemm`` through SciPy took 2.1x the time of one (0.245 s against 0.117 s
for 100 products each), two calling ``numpy.matmul`` 1.0x (NumPy releases the GIL). ``ctypes`` releases
the GIL around a foreign call, so the same BLAS routine called through it runs beside the other task's.

The library is the one SciPy's wrappers call (the ``libscipy_openblas`` its wheels bundle, found
among the BLAS libraries ``threadpoolctl`` sees in the process, 32-bit integers), and its Fortran
entry points are the ones the wrappers call, with the same arguments: the results are the same bits.
A SciPy built against a system BLAS keeps its wrappers.
At the first call a probe compares both ways on small random operands of each dtype, bit for bit;
where the library is not found, or the probe differs, or ``BLOCKLIN_HOST_BLAS=scipy`` is set, every
call goes through SciPy's wrappers (the GIL then held, as before).

Operands follow BLAS's column-major layout: each array is Fortran-ordered with a leading dimension at
least its rows (``strides[0]`` the itemsize), which a C-ordered array's ``.T`` is; the callers pass
transposes as flags, never copies.
"""

from __future__ import annotations

import ctypes
import os
import threading
from typing import Any

import numpy as np

#: ``BLOCKLIN_HOST_BLAS=scipy`` keeps every host BLAS call in SciPy's wrappers (GIL held).
ENV = "BLOCKLIN_HOST_BLAS"

_PREFIX = {np.dtype(np.float32): "s", np.dtype(np.float64): "d",
           np.dtype(np.complex64): "c", np.dtype(np.complex128): "z"}
_SCALAR = {np.dtype(np.float32): ctypes.c_float, np.dtype(np.float64): ctypes.c_double,
           np.dtype(np.complex64): ctypes.c_float * 2, np.dtype(np.complex128): ctypes.c_double * 2}
_REAL = {np.dtype(np.complex64): np.dtype(np.float32), np.dtype(np.complex128): np.dtype(np.float64)}

_STATE: dict = {}
_LOCK = threading.Lock()


def _candidates() -> list[tuple[str, str]]:
    """``(path, symbol prefix)`` of the loaded scipy-openblas32 libraries (32-bit integer entry points)."""
    import importlib

    from blocklin._blas import _controller

    importlib.import_module("scipy.linalg.blas")  # SciPy's BLAS loaded before the search

    out = []
    for lib in _controller().info():
        path = lib.get("filepath")
        if lib.get("internal_api") != "openblas" or not path:
            continue
        try:
            handle = ctypes.CDLL(path)
        except OSError:
            continue
        # the wheels' scipy-openblas32 (renamed symbols, 32-bit integers; NumPy's scipy-openblas64 has
        # scipy_dgemm64_ only). A system OpenBLAS is not taken: its symbols do not say their integer
        # size, and a 64-bit build called with 32-bit integers could crash before the probe could tell
        if hasattr(handle, "scipy_dgemm_") and not hasattr(handle, "scipy_dgemm64_"):
            out.append((path, "scipy_"))
    return out


class _Library:
    """The Fortran entry points of one BLAS library, called with the GIL released."""

    def __init__(self, path: str, prefix: str) -> None:
        self.path = path
        handle = ctypes.CDLL(path)  # the already loaded library: dlopen returns the same handle
        self.fn = {}
        for dt, p in _PREFIX.items():
            for name in ("gemm", "trsm", "geqrf", "herk" if dt.kind == "c" else "syrk"):
                f = getattr(handle, f"{prefix}{p}{name}_")
                f.restype = None
                self.fn[(dt, name)] = f

    def gemm(self, alpha: Any, a: np.ndarray, b: np.ndarray, beta: Any, c: np.ndarray,
             trans_a: int, trans_b: int) -> None:
        m, n = c.shape
        k = a.shape[0] if trans_a else a.shape[1]
        dt = c.dtype
        scalar = _SCALAR[dt]
        self.fn[(dt, "gemm")](_char(trans_a), _char(trans_b), _int(m), _int(n), _int(k),
                              ctypes.byref(_scalar(scalar, alpha)), _ptr(a), _int(_ld(a)), _ptr(b), _int(_ld(b)),
                              ctypes.byref(_scalar(scalar, beta)), _ptr(c), _int(_ld(c)))

    def syrk(self, alpha: float, a: np.ndarray, beta: float, c: np.ndarray, trans: int, lower: int) -> None:
        dt = c.dtype
        n = c.shape[0]
        k = a.shape[0] if trans else a.shape[1]
        name = "herk" if dt.kind == "c" else "syrk"
        scalar = _SCALAR[_REAL.get(dt, dt)]  # HERK's alpha and beta are real
        trans_char = b"C" if (trans and dt.kind == "c") else (b"T" if trans else b"N")
        self.fn[(dt, name)](ctypes.c_char_p(b"L" if lower else b"U"), ctypes.c_char_p(trans_char), _int(n), _int(k),
                            ctypes.byref(scalar(alpha)), _ptr(a), _int(_ld(a)), ctypes.byref(scalar(beta)),
                            _ptr(c), _int(_ld(c)))

    def trsm(self, alpha: Any, a: np.ndarray, b: np.ndarray, side: int, lower: int, trans_a: int, diag: int) -> None:
        dt = b.dtype
        m, n = b.shape
        self.fn[(dt, "trsm")](ctypes.c_char_p(b"R" if side else b"L"), ctypes.c_char_p(b"L" if lower else b"U"),
                              _char(trans_a), ctypes.c_char_p(b"U" if diag else b"N"), _int(m), _int(n),
                              ctypes.byref(_scalar(_SCALAR[dt], alpha)), _ptr(a), _int(_ld(a)), _ptr(b), _int(_ld(b)))

    def geqrf(self, a: np.ndarray, tau: np.ndarray, work: np.ndarray, lwork: int) -> int:
        """LAPACK's ``?geqrf`` on the Fortran-ordered ``a`` in place; returns ``info`` (``lwork`` -1: the
        optimal workspace size into ``work[0]``)."""
        m, n = a.shape
        info = ctypes.c_int(0)
        self.fn[(a.dtype, "geqrf")](_int(m), _int(n), _ptr(a), _int(_ld(a)), _ptr(tau), _ptr(work), _int(lwork),
                                    ctypes.byref(info))
        return info.value


def _char(trans: int) -> ctypes.c_char_p:
    return ctypes.c_char_p(b"T" if trans else b"N")


def _int(x: int) -> Any:
    return ctypes.byref(ctypes.c_int(int(x)))


def _scalar(kind: Any, x: Any) -> Any:
    if isinstance(kind, type) and issubclass(kind, ctypes.Array):
        z = complex(x)
        return kind(z.real, z.imag)
    return kind(x)


def _ptr(x: np.ndarray) -> ctypes.c_void_p:
    return ctypes.c_void_p(x.ctypes.data)


def _ld(x: np.ndarray) -> int:
    return max(1, x.strides[1] // x.itemsize) if x.shape[1] > 1 else max(1, x.shape[0])


def _writable(x: np.ndarray, name: str) -> None:
    # SciPy's wrappers write into a read-only array as well (they ignore the flag); a read-only mapping
    # would fault: refused here instead
    if not x.flags.writeable:
        raise ValueError(f"host_blas.{name}: its output is read-only")


def blas_layout(x: np.ndarray) -> bool:
    """Whether ``x`` is a 2-D array BLAS takes as it is: column-major, unit row stride, a leading
    dimension at least its rows, aligned to its itemsize."""
    if x.ndim != 2 or x.size == 0:
        return False
    s0, s1 = x.strides
    item = x.itemsize
    if x.ctypes.data % min(item, 8):
        return False
    if x.shape[0] > 1 and s0 != item:
        return False
    if x.shape[1] > 1 and (s1 <= 0 or s1 % item or s1 // item < x.shape[0]):
        return False
    return True


def _probe(lib: _Library) -> bool:
    """Whether ``lib`` gives SciPy's wrappers' bits on small operands of every dtype: GEMM with every
    transpose pair and beta 1, TRSM on both sides and triangles, the R of a tall and a wide QR, SYRK/HERK
    into both triangles."""
    from scipy.linalg import blas

    rng = np.random.default_rng(20261205)
    for dt, p in _PREFIX.items():
        def rnd(*shape: int) -> np.ndarray:
            x = rng.standard_normal(shape)
            if dt.kind == "c":
                x = x + 1j * rng.standard_normal(shape)
            return np.asfortranarray(x.astype(dt))

        wrap_gemm = getattr(blas, f"{p}gemm")
        for ta, tb in ((0, 0), (1, 0), (0, 1), (1, 1)):
            a = rnd(*((37, 19) if ta else (19, 37)))
            b = rnd(*((23, 37) if tb else (37, 23)))
            c0 = rnd(19, 23)
            want = wrap_gemm(0.75, a, b, beta=1.0, c=c0.copy(order="F"), trans_a=ta, trans_b=tb)
            got = c0.copy(order="F")
            lib.gemm(0.75, a, b, 1.0, got, ta, tb)
            if not np.array_equal(want, got):
                return False
        wrap_trsm = getattr(blas, f"{p}trsm")
        for side, lower, ta, diag in ((0, 0, 0, 0), (1, 1, 1, 0), (0, 1, 1, 1), (1, 0, 0, 1)):
            t = np.asfortranarray(rnd(13, 13) + 8 * np.eye(13, dtype=dt))  # well conditioned
            b0 = rnd(*((13, 29) if side == 0 else (29, 13)))
            want = wrap_trsm(0.5, t, b0.copy(order="F"), side=side, lower=lower, trans_a=ta, diag=diag)
            got = b0.copy(order="F")
            lib.trsm(0.5, t, got, side, lower, ta, diag)
            if not np.array_equal(want, got):
                return False
        for shape in ((57, 23), (23, 57)):
            x = rnd(*shape)
            if not np.array_equal(_qr_r_scipy(x), _qr_r(lib, x)):
                return False
        wrap_syrk = getattr(blas, f"{p}herk" if dt.kind == "c" else f"{p}syrk")
        for trans in (0, 1):
            for lower in (0, 1):
                a = rnd(*((41, 17) if trans else (17, 41)))
                c0 = rnd(17, 17)
                if dt.kind == "c":
                    c0 = np.asfortranarray(c0 + c0.conj().T)
                    want = wrap_syrk(1.0, a, beta=1.0, c=c0.copy(order="F"), trans=2 if trans else 0, lower=lower)
                else:
                    want = wrap_syrk(1.0, a, beta=1.0, c=c0.copy(order="F"), trans=trans, lower=lower)
                got = c0.copy(order="F")
                lib.syrk(1.0, a, 1.0, got, trans, lower)
                if not np.array_equal(want, got):
                    return False
    return True


def library() -> _Library | None:
    """The GIL-free library, or ``None`` (SciPy's wrappers then serve every call); found and probed once."""
    if "lib" in _STATE:
        return _STATE["lib"]
    with _LOCK:
        if "lib" not in _STATE:
            lib = None
            if os.environ.get(ENV, "").strip().lower() != "scipy":
                for path, prefix in _candidates():
                    try:
                        cand = _Library(path, prefix)
                    except AttributeError:
                        continue
                    try:
                        passed = _probe(cand)
                    except Exception:  # noqa: BLE001 - any failure of the probe keeps SciPy's wrappers
                        passed = False
                    if passed:
                        lib = cand
                        break
            _STATE["lib"] = lib
    return _STATE["lib"]


def gemm(alpha: Any, a: np.ndarray, b: np.ndarray, *, beta: Any, c: np.ndarray, trans_a: int = 0,
         trans_b: int = 0) -> None:
    """``c = alpha op(a) op(b) + beta c`` in place (``op`` the transpose where flagged), as SciPy's
    ``?gemm(..., overwrite_c=True)`` computes it. Every operand in BLAS's layout (:func:`blas_layout`)
    and of ``c``'s dtype: then without the GIL; otherwise through SciPy's wrapper."""
    _writable(c, "gemm")
    lib = library()
    if (lib is not None and trans_a in (0, 1) and trans_b in (0, 1) and a.dtype == b.dtype == c.dtype
            and all(map(blas_layout, (a, b, c)))):
        lib.gemm(alpha, a, b, beta, c, trans_a, trans_b)
        return
    from scipy.linalg import blas

    f = getattr(blas, f"{_PREFIX[c.dtype]}gemm")
    out = f(alpha, a, b, beta=beta, c=c, trans_a=trans_a, trans_b=trans_b, overwrite_c=True)
    if not np.shares_memory(out, c):  # the wrapper worked on a copy of c
        c[...] = out


def syrk(alpha: float, a: np.ndarray, *, beta: float, c: np.ndarray, trans: int = 0, lower: int = 0) -> None:
    """``c = alpha op(a) op(a)^H + beta c`` on one triangle (``op(a) = a^H`` with ``trans``; ``^T`` of
    real data: SYRK, else HERK), as SciPy's ``?syrk``/``?herk(..., overwrite_c=1)`` computes it."""
    _writable(c, "syrk")
    lib = library()
    if lib is not None and a.dtype == c.dtype and blas_layout(a) and blas_layout(c):
        lib.syrk(alpha, a, beta, c, trans, lower)
        return
    from scipy.linalg import blas

    p = _PREFIX[c.dtype]
    if c.dtype.kind == "c":
        out = getattr(blas, f"{p}herk")(alpha, a, beta=beta, c=c, trans=2 if trans else 0, lower=lower, overwrite_c=1)
    else:
        out = getattr(blas, f"{p}syrk")(alpha, a, beta=beta, c=c, trans=trans, lower=lower, overwrite_c=1)
    if not np.shares_memory(out, c):
        c[...] = out


def trsm(alpha: Any, a: np.ndarray, b: np.ndarray, *, side: int = 0, lower: int = 0, trans_a: int = 0,
         diag: int = 0) -> np.ndarray:
    """``b = alpha op(a)^-1 b`` (``side`` 0) or ``alpha b op(a)^-1`` (``side`` 1), ``a`` triangular, as SciPy's
    ``?trsm(..., overwrite_b=1)`` computes it; returns the result: ``b`` itself where both operands are in
    BLAS's layout and of one dtype (then without the GIL), else the wrapper's (maybe a copy)."""
    _writable(b, "trsm")
    lib = library()
    if lib is not None and trans_a in (0, 1) and a.dtype == b.dtype and blas_layout(a) and blas_layout(b):
        lib.trsm(alpha, a, b, side, lower, trans_a, diag)
        return b
    from scipy.linalg import blas

    return getattr(blas, f"{_PREFIX[b.dtype]}trsm")(alpha, a, b, side=side, lower=lower, trans_a=trans_a, diag=diag,
                                                     overwrite_b=1)


def _qr_r_scipy(x: np.ndarray) -> np.ndarray:
    from scipy.linalg import qr

    (r,) = qr(np.array(x), mode="r", overwrite_a=True, check_finite=False)
    return r[: min(x.shape)]


def _qr_r(lib: _Library, x: np.ndarray) -> np.ndarray:
    """SciPy's ``qr(x, mode="r")`` steps (a workspace query, then ``?geqrf`` with the size it gives, the
    upper triangle of the factored rows) on a Fortran-ordered copy of ``x``."""
    a = np.array(x, order="F")
    m, n = a.shape
    k = min(m, n)
    tau = np.empty(max(1, k), dtype=a.dtype)
    query = np.empty(1, dtype=a.dtype)
    info = lib.geqrf(a, tau, query, -1)
    lwork = max(1, int(query[0].real)) if info == 0 else max(1, n)
    work = np.empty(lwork, dtype=a.dtype)
    info = lib.geqrf(a, tau, work, lwork)
    if info < 0:
        raise ValueError(f"illegal value in {-info}th argument of internal geqrf")
    return np.triu(a[:k])


def qr_r(x: np.ndarray) -> np.ndarray:
    """The ``min(m, n) x n`` upper-trapezoidal ``R`` of the Householder QR of ``x`` (not modified), the
    bits of ``scipy.linalg.qr(x, mode="r")``: LAPACK's ``?geqrf`` without the GIL where the library is
    found, else through SciPy."""
    lib = library()
    if lib is None or x.ndim != 2 or x.size == 0 or x.dtype not in _PREFIX:
        return _qr_r_scipy(x)
    return _qr_r(lib, x)
