"""Results beyond their dtype's range: a solution or an inverse whose entries a float32 matrix cannot hold.

A nonsingular ``A`` whose entries sit near float32's smallest normal number (``1e-38``) has an inverse
near ``1e38`` or beyond, and ``x = A^-1 b`` is about ``||b|| / sigma_min(A)``: past float32's largest
(``3.4e38``) its substitutions overflow, and the overflow had been named a singular ``A``. These helpers
build the refusal that names the range instead, with the size the result would have; the routes measure
it on the failure path only (from the LU's pivots, or LAPACK's condition estimate).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np


def beyond(value: float, dtype: Any) -> bool:
    """Whether a magnitude (float64, ``inf`` where it left float64 too) is above ``dtype``'s largest."""
    return not value <= float(np.finfo(np.dtype(dtype)).max)


def wide_name(dtype: Any) -> str:
    """The dtype of the same kind in double precision (what a cast of the input gives)."""
    return "complex128" if np.dtype(dtype).kind == "c" else "float64"


def solution_range_error(name: str, dtype: Any, *, what: str, actual: str, fix: str) -> Exception:
    """The :class:`~blocklin.errors.ParameterError` for a result (``what``) beyond ``dtype``'s range, naming
    ``name``, the size found (``actual``) and ``fix``."""
    from blocklin.errors import ParameterError, explain

    fi = np.finfo(np.dtype(dtype))
    return ParameterError(explain(
        name, f"must give {what} within {fi.dtype.name}'s range (largest {float(fi.max):.3g}), the precision it is "
              f"computed in: A^-1 is about 1 / sigma_min(A) and x = A^-1 b about ||b|| / sigma_min(A), so a "
              f"nonsingular A with entries near {float(fi.tiny):.2g} has an inverse near {1 / float(fi.tiny):.2g} "
              "or beyond", actual, fix))


def lu_growth_error(max_a: float, max_u: float, dtype: Any, fix: str) -> Exception:
    """The :class:`~blocklin.errors.ParameterError` for an LU of ``A`` in its own ``dtype`` that overflowed:
    entries near the dtype's largest, which the elimination's growth passed (not a singular ``A``)."""
    from blocklin.errors import ParameterError, explain

    name = np.dtype(dtype).name
    return ParameterError(explain(
        "a", f"must keep its LU factors within {name}'s range (the elimination's growth max |U| / max |A| is a few "
        "times 1 for most matrices, up to 2^(n-1): entries near the largest value overflow)",
        f"max |A| = {max_a:.3g}, max |U| = {max_u:.3g} (the factorization overflowed)", fix))


#: :attr:`ColumnRange.ez` of a column without a nonzero entry (below every entry's exponent).
_NO_ENTRY = np.iinfo(np.int32).min // 4


class ColumnRange:
    """What a result written as ``x = 2^e z`` (``z`` the solution of a problem scaled by powers of two, ``e`` the
    exponent that undoes the scaling) keeps of each column: whether ``z`` has a nonzero entry, the binary exponent
    of its largest magnitude (exact, ``|z| < 2^ez``) and the largest magnitude written. Gathered block by block
    (:meth:`add`), merged in any order (:meth:`merge`), judged once (:func:`check_columns`)."""

    def __init__(self, k: int) -> None:
        self.nonzero = np.zeros(k, dtype=bool)
        self.ez = np.full(k, _NO_ENTRY, dtype=np.int64)
        self.top = np.zeros(k, dtype=np.float64)
        self.finite = np.ones(k, dtype=bool)

    def add(self, z: Any, x: Any) -> None:
        """The rows ``z`` (as scaled) and ``x`` (as written) of the same columns."""
        z, x = np.abs(np.asarray(z)), np.abs(np.asarray(x))
        if z.ndim == 1:
            z, x = z[:, None], x[:, None]
        if not z.shape[0]:
            return
        live = z > 0
        self.nonzero |= live.any(axis=0)
        e = np.where(live, np.frexp(np.where(np.isfinite(z), z, 0.0))[1], self.ez[None, :]).max(axis=0)
        np.maximum(self.ez, e, out=self.ez)
        self.finite &= np.isfinite(x).all(axis=0)
        with np.errstate(invalid="ignore"):
            np.maximum(self.top, np.where(np.isfinite(x), x, 0.0).max(axis=0), out=self.top)

    def merge(self, other: ColumnRange) -> None:
        self.nonzero |= other.nonzero
        np.maximum(self.ez, other.ez, out=self.ez)
        np.maximum(self.top, other.top, out=self.top)
        self.finite &= other.finite


def scaled_columns(z: np.ndarray, e: Any, dtype: Any) -> tuple[np.ndarray, ColumnRange]:
    """``x = 2^e z`` in ``dtype`` (``e`` one exponent, or one per column), rounded once (``ldexp`` rounds a result
    below the normal range once; a float32 ``x`` is ``2^e z`` exact in float64 first, then cast), with its
    :class:`ColumnRange`."""
    from blocklin.runtime.powers import ldexp

    z = np.asarray(z)
    e = np.asarray(e, dtype=np.int64)
    with np.errstate(over="ignore", under="ignore"):
        x = (ldexp(z, e if e.ndim == 0 or z.ndim == 1 else e[None, :]) if np.any(e) else z).astype(dtype, copy=False)
    cols = ColumnRange(z.shape[1] if z.ndim == 2 else 1)
    cols.add(z, x)
    return x, cols


def check_columns(cols: ColumnRange, e: Any, dtype: Any, *, name: str = "b", what: str = "x",
                  detail: str = "", op: str = "solve", fix: str = "") -> None:
    """Judge a result ``x = 2^e z`` as every solve route judges its ``x``: :func:`refuse_columns`, then the
    warning of :func:`subnormal_note` (``op: note``)."""
    from blocklin.errors import BlocklinWarning, warn

    refuse_columns(cols, e, dtype, name=name, what=what, detail=detail, fix=fix)
    note = subnormal_note(cols, e, dtype, name=name, what=what)
    if note:
        warn(f"{op}: {note}", BlocklinWarning)


def refuse_columns(cols: ColumnRange, e: Any, dtype: Any, *, name: str = "b", what: str = "x", rule: str = "",
                   detail: str = "", fix: str = "", error: type[Exception] | None = None) -> None:
    """Refuse a result ``x = 2^e z`` with a column whose ``z`` is nonzero but whose ``x`` is 0 (below the dtype's
    range) or not finite (beyond it), naming ``name`` and the power of two that brings the column's largest entry
    near 1. A column whose ``z`` is unknown (0 here, nonzero by the caller's ``nonzero``) is named without a size,
    with the caller's ``fix``. ``rule``: the solution as the rule names it (default ``what``); ``error``: the
    class raised (default :class:`~blocklin.errors.ParameterError`)."""
    from blocklin.errors import ParameterError, explain

    fi, dname = np.finfo(np.dtype(dtype)), np.dtype(dtype).name
    true_e = cols.ez + np.asarray(e, dtype=np.int64)  # |x_j| < 2^true_e, exact (e: one, or one per column)
    gone = cols.nonzero & ((cols.top == 0) | ~cols.finite)
    if not gone.any():
        return
    j = np.flatnonzero(gone)
    over = ~cols.finite[j]
    count = f"in {int(gone.sum())} column(s) whose {name} is not 0"
    if over.any():
        p = int(true_e[j][over].max())
        actual = f"{what} beyond {float(fi.max):.3g} {count}"
    else:
        p = int(true_e[j].min())
        actual = f"{what} = 0 {count} (below {float(fi.smallest_subnormal):.1e}, flushed to 0)"
    sized = bool(over.any()) or bool((cols.ez[j] > _NO_ENTRY).all())
    raise (error or ParameterError)(explain(
        name, f"must give a solution {rule or what} within the range of {dname} (nonzero entries from "
        f"{float(fi.smallest_subnormal):.1e} to {float(fi.max):.3g})",
        actual + (f": max |{what}| about 2^{p}" if sized else "") + (f" ({detail})" if detail else ""),
        fix if fix and not sized else
        f"scale {name} by 2^{-p} (exact: {what} is then 2^{-p} times the solution, its largest entry near 1) "
        f"and scale {what} back by 2^{p} yourself"))


def subnormal_note(cols: ColumnRange, e: Any, dtype: Any, *, name: str = "b", what: str = "x") -> str | None:
    """Where a column's largest entry of ``x = 2^e z`` is subnormal, the note saying so (``None`` elsewhere): the
    column keeps its value to the smallest subnormal only (relative ``2^-1074 / max |x|`` where a normal one
    keeps ``eps``); a smaller entry of a column whose largest is normal costs less than ``eps max |x|``."""
    fi, dname = np.finfo(np.dtype(dtype)), np.dtype(dtype).name
    low = cols.nonzero & (cols.top > 0) & (cols.top < float(fi.tiny))
    if not low.any():
        return None
    p = int((cols.ez + np.asarray(e, dtype=np.int64))[low].min())
    return (f"{what} is subnormal in {int(low.sum())} column(s) (largest entries down to "
            f"{float(cols.top[low].min()):.1e}, below {dname}'s smallest normal {float(fi.tiny):.1e}): its "
            f"entries are resolved to {float(fi.smallest_subnormal):.1e} absolute; scale {name} by 2^{-p} (exact) "
            f"for full precision")


def stored_columns(x_path: Any, b_path: Any, dtype: Any, *, b_first: int = 0, b_rows: int | None = None,
                   judged: np.ndarray | None = None) -> ColumnRange:
    """The :class:`ColumnRange` of a stored solution ``x`` (read by bands of rows, as written: ``e = 0``, cast
    to ``dtype`` where it is stored wider), its columns called nonzero where ``b``'s (rows ``b_first`` on, of
    a stored operand) are: a solution of a nonsingular system is 0 only for ``b = 0``. ``judged``: the columns
    judged (the others are called 0, neither refused nor warned)."""
    from blocklin.storage.zarr_store import row_bands

    cols: ColumnRange | None = None
    for _, block in row_bands(x_path):
        if cols is None:
            cols = ColumnRange(block.shape[1])
        with np.errstate(over="ignore", under="ignore"):
            cols.add(block, block.astype(dtype, copy=False))
    live = None
    for _, block in row_bands(b_path, first=b_first, n=b_rows):
        live = np.any(block != 0, axis=0) if live is None else live | np.any(block != 0, axis=0)
    assert cols is not None and live is not None
    cols.nonzero |= live
    if judged is not None:
        cols.nonzero &= judged
    return cols


def column_maxima(path: Any, *, first: int = 0, rows: int | None = None) -> np.ndarray:
    """The largest magnitude of each column of a stored ``b`` (rows ``first`` on), read by bands of rows."""
    from blocklin.storage.zarr_store import row_bands

    top = None
    for _, block in row_bands(path, first=first, n=rows):
        with np.errstate(over="ignore"):
            v = np.abs(block).max(axis=0).astype(np.float64) if block.shape[0] else np.zeros(block.shape[1])
        top = v if top is None else np.maximum(top, v)
    return np.zeros(0) if top is None else top


def refuse_flushed_rhs(col_max: np.ndarray, eb: int, dtype: Any, *, name: str = "b") -> None:
    """Refuse where the one power of two ``2^-eb`` that brings ``b``'s largest entry near 1 takes a column's
    largest entry (``col_max``) below ``dtype``'s smallest normal, the dtype ``b`` is scaled in: that column
    was flushed to 0 or kept a few bits, and its ``x`` came back 0 (a column whose ``z`` is 0 is not judged
    by :func:`refuse_columns`) or inaccurate, without a word."""
    from blocklin.errors import ParameterError, explain

    col_max = np.asarray(col_max, dtype=np.float64)
    fi = np.finfo(np.dtype(dtype))
    with np.errstate(under="ignore"):
        low = (col_max > 0) & (np.ldexp(col_max, -int(eb)) < float(fi.tiny))
    if not low.any():
        return
    j = np.flatnonzero(low)
    gap = int(np.frexp(float(col_max.max()))[1] - np.frexp(float(col_max[j].min()))[1])
    raise ParameterError(explain(
        name, f"must have each column's largest entry within 2^{-fi.minexp - 1} of its largest (the solve scales "
        f"{name} by one power of two, 2^{-int(eb)}, that brings its largest entry near 1, in {fi.dtype.name}: a "
        "column far below it is flushed to 0 or keeps a few bits)",
        f"{int(low.sum())} column(s) (index {', '.join(str(int(i)) for i in j[:5])}{', ...' if j.size > 5 else ''}) "
        f"about 2^{gap} below the largest", f"solve those columns separately (each column of x is its own "
        f"problem), or scale each column of {name} by a power of two that brings it near 1 and the column of x "
        "back by it"))


def magnitude(value: float) -> str:
    """A float64 magnitude for a message (``inf``: beyond float64's range too)."""
    return f"{value:.3g}" if math.isfinite(value) else "beyond float64's range"


__all__ = ["ColumnRange", "beyond", "check_columns", "column_maxima", "refuse_flushed_rhs", "lu_growth_error", "magnitude", "refuse_columns", "scaled_columns",
           "solution_range_error", "stored_columns", "subnormal_note", "wide_name"]
