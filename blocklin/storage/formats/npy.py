"""NumPy ``.npy`` files (C and Fortran order) and ``.npz`` members (``file.npz:name``, read only).

The header is parsed with :mod:`numpy.lib.format`; the data are read by positioned reads of one
block at a time (see :mod:`blocklin.storage.formats.raw`), never loaded or mapped whole. A member
of an ``.npz`` stored without compression (``np.savez``) is read the same way at its offset inside
the zip; a compressed member (``np.savez_compressed``) is streamed forward once.
"""

from __future__ import annotations

import os
import struct
import zipfile
from typing import Any

import numpy as np
from numpy.lib import format as npformat

from blocklin.errors import FormatError, StoreReadError, explain
from blocklin.storage.formats.base import Reader, check_2d, check_matrix_dtype, nbytes, require_file
from blocklin.storage.formats.raw import DenseFileReader, DenseFileWriter


def _read_header(fh, what: str) -> tuple[tuple[int, ...], bool, np.dtype]:
    try:
        version = npformat.read_magic(fh)
        if version == (1, 0):
            shape, fortran, dtype = npformat.read_array_header_1_0(fh, max_header_size=1 << 20)
        else:
            shape, fortran, dtype = npformat.read_array_header_2_0(fh, max_header_size=1 << 20)
    except (ValueError, OSError, SyntaxError, struct.error) as exc:
        raise FormatError(explain(what, "must start with a valid .npy header", f"{exc}",
                                  "check that the file is a .npy written by numpy.save, or pass --from")) from None
    return shape, fortran, dtype


class NpyReader(DenseFileReader):
    """A ``.npy`` file read by blocks at its data offset."""

    format = "npy"

    def __init__(self, path: str, **_: Any) -> None:
        require_file(path)
        with open(path, "rb") as fh:
            shape, fortran, dtype = _read_header(fh, "npy input")
            offset = fh.tell()
        m, n = check_2d(shape, "npy input", vector=True)  # 1-D: the same bytes as n x 1
        dtype = check_matrix_dtype(dtype, "npy input")
        size = os.path.getsize(path)
        need = offset + nbytes((m, n), dtype)
        if size < need:
            raise FormatError(explain("npy input", "must hold the bytes its header announces",
                                      f"{size} bytes, header says shape {(m, n)} {dtype.str} ({need} bytes)",
                                      "the file is truncated; re-create it"))
        if size > need:  # np.save writes nothing after the data: the header is wrong (damaged or edited)
            raise FormatError(explain("npy input", "must hold exactly the bytes its header announces",
                                      f"{size} bytes, header says shape {(m, n)} {dtype.str} ({need} bytes)",
                                      "the header does not match the data; re-create the file"))
        super().__init__(path, offset=offset, shape=(m, n), dtype=dtype, order="F" if fortran else "C")
        self.ndim = len(shape)


class NpzStreamReader(Reader):
    """A compressed ``.npz`` member: decompressed forward once, panel after panel."""

    format = "npz"
    sequential = True
    overhead_bytes = 1 << 20

    def __init__(self, path: str, zf: zipfile.ZipFile, info: zipfile.ZipInfo) -> None:
        super().__init__(path)
        self._zf = zf
        self._fh = zf.open(info)
        shape, fortran, dtype = _read_header(self._fh, "npz member")
        self.shape = check_2d(shape, "npz member", vector=True)
        self.dtype = check_matrix_dtype(dtype, "npz member")
        self.order = "F" if fortran else "C"
        need = self.shape[0] * self.shape[1] * self.dtype.itemsize
        if self._fh.tell() + need > info.file_size:  # the zip records the member's uncompressed size
            raise FormatError(explain("npz member", "must hold the bytes its header announces",
                                      f"{info.file_size} bytes (uncompressed) for shape {self.shape} {self.dtype.str} "
                                      f"({need} bytes of data)", "the archive is truncated; re-create it"))
        self._next = 0  # next row (C) or column (F) of the stream

    def read(self, rows: slice, cols: slice) -> np.ndarray:
        m, n = self.shape
        r0, r1, _ = rows.indices(m)
        c0, c1, _ = cols.indices(n)
        lo, hi, full = (r0, r1, (c0, c1) == (0, n)) if self.order == "C" else (c0, c1, (r0, r1) == (0, m))
        if lo != self._next or not full:
            raise StoreReadError(explain("npz member", "a compressed member can only be read forward in full panels",
                                         f"panel {lo}:{hi} after {self._next}", "extract it with numpy first"))
        shape = (r1 - r0, n) if self.order == "C" else (m, c1 - c0)
        buf = np.empty(shape, self.dtype, order=self.order)
        view = memoryview(buf.reshape(-1, order="A").view(np.uint8)) if buf.size else memoryview(b"")
        got = 0
        while got < len(view):
            k = self._fh.readinto(view[got:])
            if not k:
                raise FormatError(explain("npz member", "must hold the bytes its header announces",
                                          f"end of data after {got} of {len(view)} bytes of panel {lo}:{hi}",
                                          "the file is truncated; re-create it"))
            got += k
        self.bytes_read += got
        self._next = hi
        return buf

    def describe(self) -> dict[str, Any]:
        d = super().describe()
        d["codec"] = "deflate"
        return d

    def close(self) -> None:
        self._fh.close()
        self._zf.close()


def open_npz(path: str, member: str | None = None, **_: Any) -> Reader:
    """Open one array of an ``.npz`` (``member`` may omit ``.npy``; optional when there is one array)."""
    require_file(path)
    try:
        zf = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError) as exc:
        raise FormatError(explain("npz input", "must be a zip archive written by numpy.savez", f"{path!r} ({exc})",
                                  "check the file, or pass --from")) from None
    names = [i.filename for i in zf.infolist()]
    arrays = [nm[:-4] if nm.endswith(".npy") else nm for nm in names]
    if member is None:
        if len(names) != 1:
            zf.close()
            raise FormatError(explain("npz input", "must name its member when it holds several arrays",
                                      f"members {arrays}", f"write {path}:{arrays[0] if arrays else 'NAME'}"))
        member = names[0]
    key = member if member in names else f"{member}.npy"
    if key not in names:
        zf.close()
        raise FormatError(explain("npz member", "must be one of the archive's arrays", repr(member),
                                  f"pick one of {arrays}"))
    info = zf.getinfo(key)
    if info.compress_type != zipfile.ZIP_STORED:
        return NpzStreamReader(path, zf, info)
    # Stored member: its bytes lie verbatim in the zip; find the local header to get the offset.
    with open(path, "rb") as fh:
        fh.seek(info.header_offset)
        local = fh.read(30)
        if len(local) < 30 or local[:4] != b"PK\x03\x04":
            zf.close()
            raise FormatError(explain("npz input", "must be a valid zip archive", "a broken local header",
                                      "re-create the file"))
        name_len, extra_len = struct.unpack("<HH", local[26:30])
        start = info.header_offset + 30 + name_len + extra_len
        fh.seek(start)
        shape, fortran, dtype = _read_header(fh, "npz member")
        offset = fh.tell()
    zf.close()
    m, n = check_2d(shape, "npz member", vector=True)
    dtype = check_matrix_dtype(dtype, "npz member")
    if offset + nbytes((m, n), dtype) > start + info.file_size:
        raise FormatError(explain("npz member", "must hold the bytes its header announces",
                                  f"{info.file_size} bytes stored for shape {(m, n)} {dtype.str}",
                                  "the archive is truncated; re-create it"))
    reader = DenseFileReader(path, offset=offset, shape=(m, n), dtype=dtype, order="F" if fortran else "C")
    reader.format = "npz"
    return reader


class NpyWriter(DenseFileWriter):
    """A ``.npy`` output (``out_order`` C or F), written by positioned writes and renamed when complete."""

    format = "npy"

    def __init__(self, path: str, shape: tuple[int, int], dtype: Any, *, order: str = "C", vector: bool = False,
                 **kw: Any) -> None:
        import io

        header = io.BytesIO()
        # A 1-D source (``vector``, an n x 1 column) stays 1-D: the same bytes under the header (n,).
        d = {"descr": npformat.dtype_to_descr(np.dtype(dtype)), "fortran_order": str(order).upper() == "F",
             "shape": (int(shape[0]),) if vector and int(shape[1]) == 1 else tuple(int(s) for s in shape)}
        _write_header(header, d)
        super().__init__(path, shape, dtype, order=order, header=header.getvalue(), **kw)


def _write_header(fh, d: dict) -> None:
    try:
        npformat.write_array_header_1_0(fh, d)
    except ValueError:  # header over 64 KiB (never for 2-D shapes, but be safe)
        npformat.write_array_header_2_0(fh, d)
