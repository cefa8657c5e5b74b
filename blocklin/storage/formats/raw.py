"""Raw binary matrices (``--shape R,C --dtype f8 --order C|F --offset N``) and the positioned
reads/writes that ``.npy`` and stored ``.npz`` members share.

Blocks are read with ``os.preadv`` into fresh anonymous buffers instead of through a memory map:
mapped file pages count in the process RSS, so a map of a file larger than the budget would grow
the RSS with the file; positioned reads keep only the block.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from blocklin.errors import ConfigError, FormatError, explain
from blocklin.storage.formats.base import (
    AtomicFile, Reader, Writer, check_matrix_dtype, nbytes, pread_into, pwrite_from, require_file,
)


def _parse_shape(shape: Any) -> tuple[int, int]:
    if isinstance(shape, str):
        parts = shape.replace("x", ",").split(",")
    else:
        parts = list(shape) if shape is not None else []
    try:
        dims = tuple(int(p) for p in parts)
    except (TypeError, ValueError):
        dims = ()
    if len(dims) != 2 or min(dims) < 0:
        raise ConfigError(explain("shape", "must be two non-negative integers ROWS,COLS", repr(shape),
                                  "pass --shape 1000,500 (shape=(1000, 500))"))
    return dims


def _parse_order(order: Any, name: str = "order") -> str:
    o = "C" if order is None else str(order).upper()
    if o not in ("C", "F"):
        raise ConfigError(explain(name, "must be 'C' (row-major) or 'F' (column-major)", repr(order),
                                  f"pass {name}='C'"))
    return o


class DenseFileReader(Reader):
    """A dense C- or F-ordered matrix stored at ``offset`` in a file."""

    format = "raw"

    def __init__(self, path: str, *, offset: int, shape: tuple[int, int], dtype: Any, order: str) -> None:
        super().__init__(path)
        self.offset = int(offset)
        self.shape = (int(shape[0]), int(shape[1]))
        self.dtype = check_matrix_dtype(dtype, "dtype")
        self.order = order
        self._fd = os.open(path, os.O_RDONLY)

    def read(self, rows: slice, cols: slice) -> np.ndarray:
        m, n = self.shape
        r0, r1, _ = rows.indices(m)
        c0, c1, _ = cols.indices(n)
        item = self.dtype.itemsize
        if self.order == "C":
            buf = np.empty((r1 - r0, c1 - c0), self.dtype)
            if c0 == 0 and c1 == n:
                self.bytes_read += pread_into(self._fd, buf, self.offset + r0 * n * item)
            else:
                for i in range(r1 - r0):
                    self.bytes_read += pread_into(self._fd, buf[i], self.offset + ((r0 + i) * n + c0) * item)
        else:
            buf = np.empty((r1 - r0, c1 - c0), self.dtype, order="F")
            if r0 == 0 and r1 == m:
                self.bytes_read += pread_into(self._fd, buf.T, self.offset + c0 * m * item)
            else:
                for j in range(c1 - c0):
                    self.bytes_read += pread_into(self._fd, buf[:, j], self.offset + ((c0 + j) * m + r0) * item)
        return buf

    def describe(self) -> dict[str, Any]:
        d = super().describe()
        d["offset"] = self.offset
        return d

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


class RawReader(DenseFileReader):
    """Raw binary file: the caller states shape, dtype, order and header offset."""

    format = "raw"

    def __init__(self, path: str, *, shape: Any = None, dtype: Any = None, order: Any = None, offset: Any = 0,
                 **_: Any) -> None:
        require_file(path)
        if shape is None or dtype is None:
            raise ConfigError(explain("raw input", "needs its shape and dtype (a raw file has no header)",
                                      f"shape={shape!r}, dtype={dtype!r}",
                                      "pass --shape ROWS,COLS --dtype f8 (and --order, --offset if needed)"))
        dims = _parse_shape(shape)
        try:
            dt = np.dtype(dtype)
        except TypeError:
            raise ConfigError(explain("dtype", "must be a numpy dtype name", repr(dtype), "pass --dtype f8")) from None
        off = int(offset or 0)
        if off < 0:
            raise ConfigError(explain("offset", "must be a non-negative byte count", repr(offset), "pass --offset 0"))
        size = os.path.getsize(path)
        need = off + nbytes(dims, dt)
        if size != need:
            avail = size - off
            hint = ""
            if avail > 0 and dims[1] and avail % (dims[1] * dt.itemsize) == 0:
                hint = f" (the data would fit shape {avail // (dims[1] * dt.itemsize)},{dims[1]})"
            raise FormatError(explain(
                "raw input", "file size must equal offset + rows*cols*itemsize",
                f"{size} bytes for --shape {dims[0]},{dims[1]} --dtype {dt.str} --offset {off} (expects {need})",
                "check --shape, --dtype and --offset" + hint))
        super().__init__(path, offset=off, shape=dims, dtype=dt, order=_parse_order(order))


class DenseFileWriter(Writer):
    """Writes a dense C- or F-ordered matrix after an optional header, by positioned writes.

    Blocks may come in any order and shape; the file is built under a temporary name and renamed
    into place on :meth:`commit`.
    """

    format = "raw"
    relayout_copy = True

    def __init__(self, path: str, shape: tuple[int, int], dtype: Any, *, order: str = "C",
                 header: bytes = b"", inputs: list[str] = (), overwrite: bool = False, token: str | None = None,
                 **_: Any) -> None:
        super().__init__(path, shape, check_matrix_dtype(dtype, "dtype"))
        self.order = _parse_order(order, "out_order")
        self._atomic = AtomicFile(path, inputs=list(inputs), overwrite=overwrite, token=token, kind=self.format)
        self._fd = os.open(self._atomic.partial, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            pwrite_from(self._fd, np.frombuffer(header, np.uint8), 0)  # loops over a short write (a filling disk)
            self.offset = len(header)
            os.ftruncate(self._fd, self.offset + nbytes(self.shape, self.dtype))
        except BaseException:
            self.abort()
            raise
        self.bytes_written = 0

    def write(self, rows: slice, cols: slice, block: np.ndarray) -> None:
        m, n = self.shape
        r0, r1, _ = rows.indices(m)
        c0, c1, _ = cols.indices(n)
        item = self.dtype.itemsize
        block = np.asarray(block, dtype=self.dtype)
        if self.order == "C":
            if c0 == 0 and c1 == n:
                self.bytes_written += pwrite_from(self._fd, np.ascontiguousarray(block), self.offset + r0 * n * item)
            else:
                for i in range(r1 - r0):
                    self.bytes_written += pwrite_from(self._fd, np.ascontiguousarray(block[i]),
                                                      self.offset + ((r0 + i) * n + c0) * item)
        else:
            if r0 == 0 and r1 == m:
                self.bytes_written += pwrite_from(self._fd, np.ascontiguousarray(block.T),
                                                  self.offset + c0 * m * item)
            else:
                for j in range(c1 - c0):
                    self.bytes_written += pwrite_from(self._fd, np.ascontiguousarray(block[:, j]),
                                                      self.offset + ((c0 + j) * m + r0) * item)

    def commit(self, **_: Any) -> str:
        os.close(self._fd)
        self._fd = -1
        return str(self._atomic.commit())

    def abort(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        self._atomic.abort()


class RawWriter(DenseFileWriter):
    """Raw binary output (no header); ``out_order`` picks C or F layout."""

    format = "raw"
