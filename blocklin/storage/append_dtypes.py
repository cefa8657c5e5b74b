"""Which rows an append casts to the matrix's dtype, shared by the dense and the sparse append.

Rows are cast where nothing is lost: where NumPy casts safely (float32 into float64, complex64 or real
rows into complex128) and integers into floats (as NumPy's linear algebra casts them), each integer
checked to be held exactly (an int64 ``2^53 + 1`` is not, in float64); anything else is refused.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from blocklin.errors import DTypeError, explain


def append_dtype(src: np.dtype, dt: np.dtype) -> np.dtype:
    """``dt`` when rows of dtype ``src`` convert to it without loss (up to :func:`check_exact` of integer
    values), else a :class:`DTypeError` naming the cast."""
    src, dt = np.dtype(src), np.dtype(dt)
    kinds = "biufc" if dt.kind == "c" else "biuf"  # complex rows into a complex matrix (real rows too: exact)
    if src.kind not in kinds or not np.can_cast(src, dt, "safe") and not (src.kind in "iub" and dt.kind in "fc"):
        lost = " (the imaginary parts)" if src.kind == "c" and dt.kind != "c" else ""
        raise DTypeError(explain("rows", f"must convert to the matrix's {dt.name} without loss{lost}", src.name,
                                 f"cast the rows first (rows.astype('{dt.name}')) if the loss is intended"))
    return dt


def check_exact(src: np.ndarray, dt: np.dtype, where: Callable[[tuple], str]) -> None:
    """Integer values the float dtype ``dt`` cannot hold exactly (beyond ``2^(p+1)``: an int64 ``2^53 + 1``
    in float64, an int32 ``2^24 + 1`` in float32) are refused, naming the first (``where(index)`` of its
    index in ``src``): they had been rounded silently (found by a randomized search). Integers beyond an
    integer ``dt``'s range too (sums of duplicate sparse entries, made in 64 bits, would wrap)."""
    if src.dtype.kind in "iu" and dt.kind in "iu" and src.size:
        _check_integer_range(src, dt, where)
        return
    if src.dtype.kind not in "iu" or dt.kind not in "fc" or not src.size:
        return
    limit = 2 ** (np.finfo(dt).nmant + 1)
    if np.iinfo(src.dtype).max <= limit:  # every value exact (NumPy calls int64 to float64 "safe": it is not)
        return
    big = (src > limit) | (src < -limit) if src.dtype.kind == "i" else src > limit
    if not big.any():
        return
    with np.errstate(invalid="ignore", over="ignore"):
        exact = ~big | (src.astype(dt).astype(src.dtype) == src)
        cast = src.astype(dt)
    if exact.all():
        return
    at = tuple(int(i) for i in np.argwhere(~exact)[0])
    # the wider float of the same kind, where there is one: a float64 matrix had been told to use float64
    wider = {"float16": "float64", "float32": "float64", "complex64": "complex128"}.get(dt.name)
    keep = (f"append to a matrix of a wider dtype ({wider})" if wider else
            f"keep such integers in an integer matrix (no float dtype wider than {dt.name} holds them)")
    raise DTypeError(explain("rows", f"must convert to the matrix's {dt.name} without loss",
                             f"{int(src[at])} at {where(at)}, which {dt.name} holds as "
                             f"{cast[at].real:.17g}", f"{keep}, or cast the "
                             f"rows first (rows.astype('{dt.name}')) if the rounding is intended"))


def _check_integer_range(src: np.ndarray, dt: np.dtype, where: Callable[[tuple], str]) -> None:
    info = np.iinfo(dt)
    if np.iinfo(src.dtype).min >= info.min and np.iinfo(src.dtype).max <= info.max:
        return
    # compared as Python integers' bounds (an int64 array against uint64's max would be cast to float64)
    out = (src > info.max) if np.iinfo(src.dtype).max > info.max else np.zeros(src.shape, bool)
    if np.iinfo(src.dtype).min < info.min:
        out |= src < info.min
    if not out.any():
        return
    at = tuple(int(i) for i in np.argwhere(out)[0])
    raise DTypeError(explain("rows", f"must convert to the matrix's {dt.name} without loss (its values stay "
                             f"within {info.min}..{info.max})", f"{int(src[at])} at {where(at)} (duplicate "
                             "entries of the rows are summed)", "append to a matrix of a wider dtype (convert it "
                             "with --dtype int64 or float64), or combine the entries first"))


__all__ = ["append_dtype", "check_exact"]
