"""Scalars applied to a device's accumulators: ``alpha`` and ``beta`` of a GEMM kept to the dtype's precision.

A float32 accumulator multiplied by ``numpy.float32(alpha)`` takes ``alpha`` rounded to float32's range as
well as its precision: ``1.2345e-44`` becomes the subnormal ``9.8e-45`` (2% off), ``2^130`` becomes Inf.
The CPU and CUDA devices apply such scalars here, as a significand times powers of two.
"""

from __future__ import annotations

from typing import Any

import numpy as np


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


__all__ = ["scale_in_place", "scaled"]
