"""Parsing and formatting helpers shared by the text formats (CSV/TSV and Matrix Market)."""

from __future__ import annotations

import contextlib
import math
import warnings
from typing import Any

import numpy as np

from blocklin.errors import DTypeError, FormatError, explain

#: Values formatted per batch when writing text: bounds the Python strings alive at once
#: (about 100 bytes per value: the float object, its string and the list slot).
FORMAT_BATCH = 1 << 14
#: Text parsed per batch when reading (held as str lines, about 3x the bytes, plus the parsed values).
PARSE_BATCH_BYTES = 1 << 20


def formatter(dtype: np.dtype):
    """Function mapping a 1-D array to a list of strings that read back to the same values."""
    dt = np.dtype(dtype)
    if dt.kind in "iub":
        return lambda a: [str(v) for v in a.astype(np.int64 if dt.kind != "u" else np.uint64).tolist()]
    if dt.kind == "f" and dt.itemsize > 8:
        # Extended precision: the shortest string that round-trips the value in its own dtype (the
        # float64 repr would drop its last 11 bits: 1 + 2**-63 written as 1.0).
        return lambda a: [np.format_float_scientific(v, unique=True, trim="-") for v in a]
    if dt.kind == "f":
        # The shortest string that round-trips the value *as a float64*: exact whichever dtype the
        # text is later read as (a float32 written with 9 digits would not read back equal as float64).
        return lambda a: [repr(v) for v in a.astype(np.float64, copy=False).tolist()]
    raise FormatError(explain("dtype", "text formats hold real numbers only", f"dtype {dt}",
                              "convert to a real dtype first (--dtype float64)"))


@contextlib.contextmanager
def quiet_string_overflow(dtype: np.dtype):
    """Silence NumPy's ``overflow encountered in conversion from string`` around a text parse.

    NumPy's extended-precision string parse (``strtold``) reports ERANGE for a subnormal result as
    this warning although the value it returns is exact (``1e-4950`` as longdouble); it is a Python
    warning, not a floating-point flag, so ``np.errstate`` does not reach it. A true overflow parses
    as Inf, which :func:`check_parsed` refuses by line and column. Only extended precision takes
    that route, and only its parse is wrapped: ``warnings.catch_warnings`` swaps process-wide
    state, which parses in other threads share.
    """
    if np.dtype(dtype).kind != "f" or np.dtype(dtype).itemsize <= 8:
        yield
        return
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="overflow encountered in conversion from string",
                                category=RuntimeWarning)
        yield


def check_parsed(values: np.ndarray, fields: Any, first_line: Any, what: str,
                 integer_fix: str = "pass --dtype int64 (dtype='int64') to read the integers exactly") -> None:
    """Refuse text a float parse changed beyond rounding: a finite number beyond the dtype's range
    (``1e400`` parsed as Inf) or an integer beyond the integers it holds exactly (``2**53 + 1`` parsed
    as ``2**53`` in float64), named by line and column.

    Parameters
    ----------
    values : numpy.ndarray
        The parsed batch, one row per line (2-D).
    fields : callable
        ``fields(k)`` is the list of field texts of the batch's line ``k``.
    first_line : callable
        ``first_line(k)``: the file's line number of the batch's line ``k``.
    what : str
        The input named in messages (``"csv input"``).
    integer_fix : str
        The fix an inexact integer's message names; empty: integers are not checked (a format whose
        header declares its values real). Only integers int64 holds are checked, so that the fix,
        reading them as int64, always exists; larger ones can only be read as floats.

    Notes
    -----
    Only entries at or beyond ``2**(nmant + 1)`` in magnitude (Inf included) are looked at, each line
    of them split once, so a batch of ordinary values costs one comparison a value. Real dtypes only.
    """
    dt = values.dtype
    if dt.kind != "f" or not values.size:
        return
    with np.errstate(invalid="ignore"):
        suspect = np.abs(values) >= float(2 ** (np.finfo(dt).nmant + 1))
    if not suspect.any():
        return
    top = np.finfo(dt).max
    for k in np.flatnonzero(suspect.any(axis=1)):  # line by line, each split once
        # Python floats (no NumPy scalar per value), but extended precision as it is
        line, row = fields(int(k)), (values[k].tolist() if dt.itemsize <= 8 else values[k])
        for c in np.flatnonzero(suspect[k]).tolist():
            text = line[c].strip()
            number = text.lstrip("+-")
            v = row[c]
            if abs(v) == math.inf and number.lower() not in ("inf", "infinity"):
                raise FormatError(explain(what, f"numbers must fit {dt.name} (magnitudes up to {top:.6g}), or the "
                                          "parse turns them into Inf", f"{text[:40]!r} at line "
                                          f"{first_line(int(k))}, column {c + 1}", "fix that value, or scale the "
                                          "data before converting"))
            if integer_fix and number.isdigit() and int(number) < 2**63 and int(text) != int(v):
                raise FormatError(explain(what, f"integers must be exact in the parse dtype {dt.name} (every integer "
                                          f"up to 2**{np.finfo(dt).nmant + 1})", f"{text[:40]!r} at line "
                                          f"{first_line(int(k))}, column {c + 1}, which {dt.name} holds as "
                                          f"{int(v)}", integer_fix))


def parse_field(text: str, dtype: np.dtype) -> Any:
    """Parse one field the way numpy does, raising ValueError when it is not a number."""
    t = text.strip()
    if np.dtype(dtype).kind in "iub":
        return int(t)
    return float(t)


def field_error(what: str, field: str, line: int, column: int, dtype: np.dtype, fix: str) -> FormatError:
    kind = "integers" if np.dtype(dtype).kind in "iub" else "numbers"
    shown = field if len(field) <= 40 else field[:37] + "..."
    return FormatError(explain(what, f"fields must be {kind} ({np.dtype(dtype).name})",
                               f"{shown!r} at line {line}, column {column}", fix))


#: Readers of Matrix Market ``integer`` files (scipy, blocklin, most others) take the values as int64.
_MTX_INT_MAX = int(np.iinfo(np.int64).max)


def check_mtx_integers(values: np.ndarray, locate: Any) -> None:
    """Refuse a uint64 value beyond int64 before it is written as a Matrix Market integer (no reader
    could take it back); ``locate(index)`` names the position of ``values[index]`` (an index tuple)."""
    if values.dtype != np.uint64 or not values.size or int(values.max()) <= _MTX_INT_MAX:
        return
    where = tuple(int(i) for i in np.argwhere(values > _MTX_INT_MAX)[0])
    raise DTypeError(explain("dtype", f"Matrix Market integers must fit int64 (at most {_MTX_INT_MAX}: readers "
                             "take them as int64)", f"uint64 value {int(values[where])} at {locate(where)}",
                             "pass --dtype float64 (exact up to 2**53), or write .npy, .h5 or .zarr, which keep "
                             "uint64"))
