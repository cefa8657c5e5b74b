"""Powers of two: exact scalings of blocks, and the power of two a block's largest magnitude needs.

Data near the ends of a dtype's range (``1e200``, ``1e-200`` in float64) is divided by a power of two
before squares or products would overflow or underflow, and the result multiplied back: exact in
binary floating point (no rounding where the scaled value stays normal), so the scaled computation
has the unscaled one's relative error. The row passes scale strips as they read them, the block
kernels and the solvers their own blocks; all take the two functions from here.
"""

from __future__ import annotations

from typing import Any

import numpy as np


def ldexp(x: np.ndarray, e: int, out: np.ndarray | None = None) -> np.ndarray:
    """``x * 2^e`` (exact where it fits), keeping a float or complex dtype (integers give float64, as
    ``numpy.ldexp`` gives them: never cast back, which would truncate); complex data by its real and
    imaginary parts (``numpy.ldexp`` takes real data only); in place with ``out=x``."""
    x = np.asarray(x)
    if x.dtype.kind != "c":
        if out is not None:
            return np.ldexp(x, e, out=out)
        y = np.ldexp(x, e)
        return y.astype(x.dtype, copy=False) if x.dtype.kind == "f" else y
    r = out if out is not None else np.empty_like(x)
    np.ldexp(x.real, e, out=r.real)
    np.ldexp(x.imag, e, out=r.imag)
    return r


def max_exponent(x: Any) -> int:
    """``e`` with ``max |x| = f 2^e``, ``f`` in ``[0.5, 1)``: the power of two of the largest magnitude in
    ``x`` (``0`` for zero, NaN, Inf or an empty ``x``), what dividing by ``2^e`` brings near 1 (exact)."""
    top = float(np.max(np.abs(x))) if np.size(x) else 0.0
    return int(np.frexp(top)[1]) if 0 < top < np.inf else 0


def scale_in_place(x: Any, s: float) -> None:
    """``x *= s`` for a NumPy or CuPy array of a float or complex dtype and a float64 scalar ``s``, with ``s``
    rounded to ``x``'s precision only, never to its range.

    Inside the dtype's normal range this is ``x *= x.dtype.type(s)``, bit for bit. Outside it (a float32
    ``alpha`` of ``1.2345e-44`` is the subnormal ``9.8e-45``, 2% off; ``2^130`` is Inf) ``s`` is applied as
    its significand times powers of two, each factor a normal number of the dtype, in one direction (all
    above 1 or all below), so no partial product leaves the range unless the result does: the error is
    that of ``s``'s significand rounded to the dtype, plus the final rounding.
    """
    s = float(s)
    fi = np.finfo(x.dtype)
    if s == 0 or not np.isfinite(s) or float(fi.tiny) <= abs(s) <= float(fi.max):
        x *= x.dtype.type(s)
        return
    m, e = np.frexp(s)
    lo, hi = int(fi.minexp) + 1, int(fi.maxexp) - 1  # m 2^d normal for every d in [lo, hi]
    d = max(lo, min(hi, int(e)))
    x *= x.dtype.type(float(m) * 2.0 ** d)
    e -= d
    while e:
        d = max(lo, min(hi, int(e)))
        x *= x.dtype.type(2.0 ** d)
        e -= d


def scaled(x: Any, s: float, dtype: Any) -> Any:
    """``dtype.type(s) * x`` as a new array (bit for bit where ``s`` lies inside ``dtype``'s normal range),
    with ``s`` kept to ``dtype``'s precision outside it (:func:`scale_in_place`)."""
    dt = np.dtype(dtype)
    fi = np.finfo(dt)
    s = float(s)
    if s == 0 or not np.isfinite(s) or float(fi.tiny) <= abs(s) <= float(fi.max):
        return dt.type(s) * x
    y = x.astype(np.result_type(dt, x.dtype))
    scale_in_place(y, s)
    return y
