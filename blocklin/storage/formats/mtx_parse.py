"""The fast parse of a block of Matrix Market ``coordinate`` lines, by SciPy's C++ reader.

:func:`parse_coordinate_block` hands one block of whole entry lines, behind a synthesized
``coordinate`` header announcing exactly its lines, to ``scipy.io._fast_matrix_market`` (the
``fast_matrix_market`` reader that :func:`scipy.io.mmread` uses since SciPy 1.12), which parses
straight into the caller's row, column and value buffers: the memory stays that of one block.

That reader is laxer than the file format and than :meth:`MtxReader._parse`'s ``np.loadtxt``: it
ignores whatever follows the last field it reads on a line (``1 1 1.5 7`` reads as ``1 1 1.5``,
``1 1 1,5`` as ``1 1 1``, ``1 1.5 2`` in a pattern file as ``1 1``) and its float parser stops at
the first character it cannot use. So a block goes to it only when :func:`_well_formed` has found
every line to be exactly ``INT INT VALUE`` (``INT INT`` for ``pattern``) in a grammar that both
parsers read alike: unsigned decimal indices; values ``-?(D+.?D*|.D+)([eE][+-]?D+)?`` (``real``) or
``-?D+`` (``integer``); spaces and tabs between fields; lines ended by LF or CR LF. Anything else (NaN or inf spelled out, a
leading ``+``, blank or comment lines, other characters) returns None, and the caller parses the
block line by line as before, which reads it exactly or names the bad line; so does a block the C++
reader refuses (an index out of range, an integer that overflows int64).
"""

from __future__ import annotations

import io

import numpy as np

_SPACE, _NEWLINE, _ZERO, _NINE = 32, 10, 48, 57
_MINUS, _PLUS, _DOT = ord("-"), ord("+"), ord(".")
_DIGITS = b"0123456789"
#: Bytes each field allows (with spaces, tabs and newlines): what the grammar's fields are made of.
_ALLOWED = {"pattern": _DIGITS + b" \t\r\n", "integer": _DIGITS + b" \t\r\n-",
            "real": _DIGITS + b" \t\r\n-+.eE"}

try:  # private to SciPy (>= 1.12): without it every block takes the line-by-line parse
    from scipy.io._fast_matrix_market import _fmm_core
except ImportError:  # pragma: no cover - SciPy older than 1.12
    _fmm_core = None

#: Whether the C++ reader is there to use.
AVAILABLE = _fmm_core is not None and hasattr(_fmm_core, "read_body_coo")


def _well_formed(data: bytes, lines: int, ncols: int, field: str, work: np.ndarray | None = None,
                 offset: int = 0) -> bool:
    """Whether ``data[offset:]`` (``lines`` lines, each ended by ``"\\n"``, or ``"\\r\\n"``) is
    ``lines`` entries of ``ncols`` fields in the grammar of the module notes.

    A few vectorized passes over the bytes: the allowed bytes (``bytes.translate``) and the count of
    fields. A line with fewer fields than ``ncols`` the C++ reader refuses (it reads each field, or
    fails, before the line's newline), so with the count right each line has ``ncols``, as long as
    each field is read whole: ``pattern`` fields are digits; an ``integer`` minus must start its
    field. A ``real`` value may hold more than digits, so the order of field starts and newlines is
    checked (each line ``ncols`` starts, then its newline) and every byte that is not a digit against
    its neighbours and its field (a value's, the line's last) in order. ``work``: a bool buffer of at
    least twice the block's length for the two block-sized arrays (the process maps every large new
    array afresh, :mod:`blocklin._memory`, and their page faults cost as much as the check).
    """
    allowed = _ALLOWED[field]
    if data.translate(None, allowed) != data[:offset].translate(None, allowed) or not data.endswith(b"\n"):
        return False
    if b"\r" in data and data.count(b"\r") != data.count(b"\r\n"):
        return False  # a carriage return only before a newline (it then reads as a space)
    b = np.frombuffer(data, np.uint8, offset=offset)
    # two bool arrays of the block's length and the events' positions at most: with the bytes and
    # the caller's text, within the parse batch the plan counts (MtxReader.overhead_bytes)
    if work is None or len(work) < 2 * len(b):
        work = np.empty(2 * len(b), bool)
    sep, start = work[:len(b)], work[len(b):2 * len(b)]
    np.less_equal(b, _SPACE, out=sep)  # space, tab or newline: the allowed bytes below "0"
    start[0] = not sep[0]  # where a field starts: a non-separator after a separator, or first
    np.greater(sep[:-1], sep[1:], out=start[1:])
    if np.count_nonzero(start) != lines * ncols:
        return False
    if field == "pattern":
        return True
    mark = np.equal(b, _MINUS if field == "integer" else _NEWLINE, out=sep)  # in sep's spent buffer
    if field == "integer":
        return not np.any(mark > start)  # a minus where no field starts
    start |= mark
    at = np.flatnonzero(start)  # field starts and newlines
    per_line = ncols + 1
    kinds = (b[at] == _NEWLINE).reshape(lines, per_line)  # each line: ncols field starts, then its newline
    if kinds[:, :ncols].any() or not kinds[:, ncols].all():
        return False
    del kinds
    digit = start  # reused
    np.subtract(b, np.uint8(_ZERO), out=mark.view(np.uint8))  # uint8: the bytes below "0" wrap above 9
    np.less_equal(mark.view(np.uint8), _NINE - _ZERO, out=digit)
    np.greater(b, _SPACE, out=mark)  # not a separator
    np.greater(mark, digit, out=mark)  # nor a digit
    sp = np.flatnonzero(mark)
    del mark
    if not len(sp):
        return True
    # the field each special byte is in: the last event before it, which must be the value's start
    ev = np.searchsorted(at, sp, side="right") - 1
    if np.any(ev % per_line != ncols - 1):
        return False
    kind, prev, nxt = b[sp], b[sp - 1], b[sp + 1]  # sp >= 1 (a value is not first), sp + 1 < len (a newline ends)
    first = sp == at[ev]
    minus = kind == _MINUS
    nxt_digit = digit[sp + 1]
    prev_digit = digit[sp - 1]
    exp = (kind | 0x20) == ord("e")  # "e" or "E"
    dot = kind == _DOT
    after_exp = (prev | 0x20) == ord("e")
    # a sign starts the value (a minus, before a digit or a point) or the exponent (before a digit)
    sign = minus | (kind == _PLUS)
    lead = minus & first & (nxt_digit | (nxt == _DOT))
    if np.any(sign & ~(lead | (after_exp & nxt_digit))):
        return False
    # a point beside a digit; an exponent after the mantissa's digit or point, before a digit or sign
    if np.any(dot & ~prev_digit & ~nxt_digit):
        return False
    if np.any(exp & ~((prev_digit | (prev == _DOT)) & (nxt_digit | (nxt == _MINUS) | (nxt == _PLUS)))):
        return False
    # at most one point and one exponent a value, the point first
    mark = dot | exp
    e, d = ev[mark], dot[mark]
    return not np.any((e[1:] == e[:-1]) & ~(d[:-1] & ~d[1:]))


def parse_coordinate_block(data: bytes | str, lines: int, shape: tuple[int, int], field: str, rows: np.ndarray,
                           cols: np.ndarray, vals: np.ndarray, work: np.ndarray | None = None) -> bool:
    """Parse ``lines`` coordinate entry lines ``data`` (bytes, or ASCII text; each line ended by
    ``"\\n"``, the last one may not be) into ``rows``, ``cols`` (0-based int64) and ``vals``
    (float64; int64 for ``integer``; untouched for ``pattern``), each of length ``lines``.

    Returns False, with the buffers in any state, when the block is not in the module's grammar or
    the C++ reader refuses it (an index outside ``shape``, an overflow): the caller parses it line by
    line then, for the values or for the message naming the bad line. Transient memory: about four
    times the block's bytes (the bytes behind the header, the check's arrays, in ``work`` when given,
    see :func:`_well_formed`, and the C++ reader's copy).
    """
    if not AVAILABLE or not lines:
        return False
    ncols = 2 if field == "pattern" else 3
    if isinstance(data, str):
        data = data.encode("ascii", "replace")  # not ASCII: "?", which the check refuses
    header = b"%%%%MatrixMarket matrix coordinate %s general\n%d %d %d\n" % (
        field.encode(), shape[0], shape[1], lines)
    payload = b"".join([header, data] if data[-1:] == b"\n" else [header, data, b"\n"])
    if not _well_formed(payload, lines, ncols, field, work, len(header)):
        return False
    try:
        cursor = _fmm_core.open_read_stream(io.BytesIO(payload), 1)
        _fmm_core.read_body_coo(cursor, rows, cols, vals)
    except (ValueError, OverflowError, RuntimeError):
        return False
    return True
