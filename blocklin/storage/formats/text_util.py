"""Parsing and formatting helpers shared by the text formats (CSV/TSV and Matrix Market)."""

from __future__ import annotations

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
    if dt.kind == "f":
        # The shortest string that round-trips the value *as a float64*: exact whichever dtype the
        # text is later read as (a float32 written with 9 digits would not read back equal as float64).
        return lambda a: [repr(v) for v in a.astype(np.float64, copy=False).tolist()]
    raise FormatError(explain("dtype", "text formats hold real numbers only", f"dtype {dt}",
                              "convert to a real dtype first (--dtype float64)"))


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
