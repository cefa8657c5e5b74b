"""CSV/TSV (delimited text) matrices, streamed by row panels both ways.

Opening scans the file once (binary, line by line) to count the data rows, so the shape is known
before any data are converted; the data are then parsed panel by panel in batches of a few MiB of
text. A header line is detected when none of its fields is a number (``header="auto"``); lines
starting with ``#`` and blank lines are skipped; ``skip_rows`` drops leading lines first. Bad fields
are reported with their line and column. ``nan``, ``inf`` and ``-inf`` parse as numpy does.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from blocklin.errors import ConfigError, FormatError, InternalError, explain
from blocklin.storage.formats.base import Reader, TextFileWriter, check_matrix_dtype, require_file
from blocklin.storage.formats.text_util import (FORMAT_BATCH, PARSE_BATCH_BYTES, check_parsed, field_error, formatter,
                                                   quiet_string_overflow)

_ALIASES = {"tab": "\t", "\\t": "\t", "comma": ",", "space": " ", "semicolon": ";", "whitespace": None,
            "ws": None}


def parse_delimiter(delimiter: Any, path: str) -> str | None:
    """Delimiter from the option or the extension (``.tsv``/``.tab``: tab, ``.txt``/``.dat``: whitespace)."""
    if delimiter is None:
        ext = os.path.splitext(path.lower())[1]
        return {".tsv": "\t", ".tab": "\t", ".txt": None, ".dat": None}.get(ext, ",")
    if isinstance(delimiter, str) and delimiter.lower() in _ALIASES:
        return _ALIASES[delimiter.lower()]
    if not isinstance(delimiter, str) or len(delimiter) != 1 or delimiter in "\r\n\"#":
        raise ConfigError(explain("delimiter", "must be one character (or tab, space, whitespace)",
                                  repr(delimiter), "pass --delimiter , (or --delimiter tab)"))
    return delimiter


def _split(line: str, delimiter: str | None) -> list[str]:
    return line.split() if delimiter is None or delimiter == " " else line.strip("\r\n").split(delimiter)


#: The UTF-8 byte order mark some programs (Excel's "CSV UTF-8") put before the first line.
_BOM = b"\xef\xbb\xbf"


def _is_number(field: str) -> bool:
    """Whether ``field`` reads as a number, quoted (``"1.5"``) or not: a line of quoted numbers is
    data, not a header (the parse then names its first quoted field)."""
    field = field.strip()
    if len(field) >= 2 and field[0] == field[-1] == '"':
        field = field[1:-1]
    try:
        float(field)
        return True
    except ValueError:
        return False


_CANDIDATES = (",", ";", "\t", "|", ":", None)


def _name(delimiter: str | None) -> str:
    return {None: "whitespace", "\t": "tab", " ": "space"}.get(delimiter, delimiter)


def _check_not_misdelimited(text: str, delimiter: str | None, no: int, path: str) -> None:
    """A line taken for a header that is all numbers under another delimiter: the delimiter is wrong
    (a one-line ``1;2;3`` read with ``,`` would otherwise become a 0 x 1 matrix, silently)."""
    for other in _CANDIDATES:
        if other == delimiter or (other is None and delimiter == " "):
            continue
        fields = _split(text, other)
        if len(fields) > 1 and all(_is_number(f.strip()) for f in fields):
            opt = _name(other)
            raise FormatError(explain("delimiter", f"must split the lines of {os.path.basename(path)} into fields",
                                      f"{_name(delimiter)!r}, which leaves line {no} ({text.strip()[:60]!r}) one "
                                      f"field, while {opt!r} splits it into {len(fields)} numbers",
                                      f"pass --delimiter '{opt}' (delimiter='{opt}'), or --header if that line is "
                                      "a header"))


class CsvReader(Reader):
    """Delimited text, read forward by full-width row panels."""

    format = "csv"
    sequential = True
    overhead_bytes = 6 * PARSE_BATCH_BYTES  # a batch of lines as str, the parsed values

    def __init__(self, path: str, *, delimiter: Any = None, skip_rows: Any = None, header: Any = "auto",
                 dtype: Any = None, comments: str = "#", **_: Any) -> None:
        super().__init__(require_file(path))
        self.delimiter = parse_delimiter(delimiter, path)
        self.comments = comments
        self.dtype = check_matrix_dtype(dtype if dtype is not None else np.float64, "dtype")
        skip = 0 if skip_rows is None else int(skip_rows)
        if skip < 0:
            raise ConfigError(explain("skip_rows", "must be a non-negative integer", repr(skip_rows),
                                      "pass --skip-rows 0"))
        if header not in ("auto", True, False, None):
            raise ConfigError(explain("header", "must be 'auto', True or False", repr(header), "pass header='auto'"))
        self.skip_rows = skip
        self.header_line: str | None = None
        rows, ncols, first_data = 0, 0, None
        cb = comments.encode() if comments else None
        with open(path, "rb") as fh:
            for no, raw in enumerate(fh, start=1):
                if no == 1 and raw.startswith(_BOM):  # not part of the first field (a header's, or 1's)
                    raw = raw[len(_BOM):]
                if no <= skip:
                    continue
                s = raw.strip()
                if not s or (cb and s.startswith(cb)):
                    continue
                if first_data is None:
                    text = raw.decode("utf-8", "replace")
                    fields = _split(text, self.delimiter)
                    is_header = header is True or (header == "auto" and not any(_is_number(f) for f in fields))
                    if is_header and header == "auto":
                        _check_not_misdelimited(text, self.delimiter, no, path)
                    if is_header and self.header_line is None:
                        self.header_line = text.strip()
                        self._header_no = no
                        ncols = len(fields)
                        continue
                    first_data, ncols = no, len(fields)
                rows += 1
        self.shape = (rows, ncols if rows or self.header_line else 0)
        self._first_data = first_data
        self._fh = open(path, "rb")
        self._line = 0
        self._next_row = 0
        self._panel_lines: list[int] = []
        self._panel_r0 = 0

    def _data_lines(self, count: int):
        """Yield batches of (line numbers, decoded lines) for the next ``count`` data rows."""
        cb = self.comments.encode() if self.comments else None
        nums: list[int] = []
        lines: list[str] = []
        size = 0
        left = count
        while left > 0:
            raw = self._fh.readline()
            if not raw:  # pragma: no cover - the scan counted the rows
                raise FormatError(explain("csv input", "must not change while it is converted",
                                          f"end of file at line {self._line}", "convert it again"))
            self._line += 1
            self.bytes_read += len(raw)
            if self._line == 1 and raw.startswith(_BOM):
                raw = raw[len(_BOM):]
            s = raw.strip()
            if self._line <= self.skip_rows or not s or (cb and s.startswith(cb)):
                continue
            if self.header_line is not None and self._line == self._header_no:
                continue
            nums.append(self._line)
            lines.append(raw.decode("utf-8", "replace"))
            size += len(raw)
            left -= 1
            if size >= PARSE_BATCH_BYTES or left == 0:
                yield nums, lines
                nums, lines, size = [], [], 0

    def _parse(self, nums: list[int], lines: list[str]) -> np.ndarray:
        n = self.shape[1]
        try:
            # a number beyond the dtype: refused by check_parsed
            with np.errstate(over="ignore"), quiet_string_overflow(self.dtype):
                arr = np.loadtxt(lines, delimiter=self.delimiter if self.delimiter != " " else None,
                                 dtype=self.dtype, ndmin=2, comments=None)
        except ValueError:
            arr = None
        if arr is not None and arr.shape == (len(lines), n):
            check_parsed(arr, lambda k: _split(lines[k], self.delimiter), lambda k: nums[k], "csv input")
            return arr
        fix = "fix that field, or skip text lines with --skip-rows N (or --header)"
        for no, line in zip(nums, lines):
            fields = _split(line, self.delimiter)
            if len(fields) != n:
                raise FormatError(explain("csv input", f"every row must hold {n} fields (as the first row)",
                                          f"{len(fields)} fields at line {no}",
                                          "fix that line, or check --delimiter"))
            for c, f in enumerate(fields, start=1):
                try:
                    with quiet_string_overflow(self.dtype):
                        np.array([f.strip()]).astype(self.dtype)
                except (ValueError, OverflowError):
                    raise field_error("csv input", f, no, c, self.dtype, fix) from None
        raise FormatError(explain("csv input", "fields must be numbers", f"lines {nums[0]}-{nums[-1]}", fix))

    def read(self, rows: slice, cols: slice) -> np.ndarray:
        m, n = self.shape
        r0, r1, _ = rows.indices(m)
        c0, c1, _ = cols.indices(n)
        if r0 != self._next_row or (c0, c1) != (0, n):
            from blocklin.errors import StoreReadError

            raise StoreReadError(explain("csv input", "text is read forward in full-width row panels",
                                         f"rows {r0}:{r1} after row {self._next_row}",
                                         "convert to zarr first (blocklin convert FILE.csv OUT.zarr)"))
        out = np.empty((r1 - r0, n), self.dtype)
        pos = 0
        self._panel_lines = []
        self._panel_r0 = r0
        for nums, lines in self._data_lines(r1 - r0):
            out[pos:pos + len(lines)] = self._parse(nums, lines)
            pos += len(lines)
            self._panel_lines.extend(nums)
        self._next_row = r1
        return out

    def locate(self, row: int, col: int) -> str:
        k = row - self._panel_r0
        if 0 <= k < len(self._panel_lines):
            return f"line {self._panel_lines[k]}, column {col + 1}"
        return super().locate(row, col)

    def describe(self) -> dict[str, Any]:
        d = super().describe()
        d.update(codec="text", delimiter=self.delimiter or "whitespace", header=self.header_line)
        return d

    def close(self) -> None:
        self._fh.close()


class CsvWriter(TextFileWriter):
    """Delimited text output, row panel after row panel."""

    format = "csv"
    order = "C"
    sequential = True
    overhead_bytes = FORMAT_BATCH * 128

    def __init__(self, path: str, shape: tuple[int, int], dtype: Any, *, delimiter: Any = None,
                 inputs: list[str] = (), overwrite: bool = False, token: str | None = None, **_: Any) -> None:
        dt = check_matrix_dtype(dtype, "dtype")
        super().__init__(path, shape, dt)
        self.delimiter = parse_delimiter(delimiter, path) or " "
        self._fmt = formatter(dt)
        self._open_text(inputs, overwrite, token)
        self._next_row = 0
        self.bytes_written = 0

    def write(self, rows: slice, cols: slice, block: np.ndarray) -> None:
        r0, r1, _ = rows.indices(self.shape[0])
        if r0 != self._next_row:  # pragma: no cover - the planner guarantees the order
            raise InternalError("CsvWriter needs forward row panels")
        n = max(1, self.shape[1])
        step = max(1, FORMAT_BATCH // n)
        d = self.delimiter
        for s in range(0, r1 - r0, step):
            text = "".join(d.join(self._fmt(row)) + "\n" for row in block[s:s + step])
            self._fh.write(text)
            self.bytes_written += len(text)
        self._next_row = r1

