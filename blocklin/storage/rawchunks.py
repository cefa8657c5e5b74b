"""A direct path for uncompressed zarr v3 arrays on local disk.

For an array whose only codec is ``bytes`` (little-endian, no compression, no sharding) on a local
store, a chunk file is exactly the chunk's C-ordered bytes, so a row range of a chunk is one
contiguous byte range. Reading just the rows a block needs with one ``preadv`` into the destination
(or one reused chunk buffer) reads no more than is used (a strip narrower than a chunk no longer
reads the whole chunk) and skips zarr's asynchronous machinery, whose many thread
hand-offs stall when BLAS keeps every core busy: measured here, a loader thread running beside a
2-thread GEMM fell behind compute through zarr, and keeps ahead through this path. Writes of whole
chunks go to the chunk files the same way. Anything else (compression, v2, sharding, other key
encodings, big-endian data) returns ``None`` from :func:`raw_access`, and callers use zarr.
Uncompressed arrays on fsspec stores are read the same way with range requests
(``raw_access(arr, remote=True)``) where a block covers part of a chunk. Every read adds the bytes
it fetched to :mod:`blocklin._readstats`.
"""

from __future__ import annotations

import functools
import os
import sys
from typing import Any

import numpy as np

import blocklin._readstats as readstats


_IOV_MAX = 1024


class RawChunks:
    """Read and write blocks of an eligible array straight from and to its chunk files."""

    def __init__(self, root: str, shape: tuple[int, ...], chunks: tuple[int, ...], dtype: np.dtype,
                 fill_value: Any, separator: str, fs: Any = None) -> None:
        self.root = root
        self.fs = fs  # an fsspec filesystem (reads only), or None for a local folder
        self.shape = shape
        self.chunks = chunks
        self.dtype = dtype
        self.fill_value = fill_value
        self.separator = separator
        self._buf: np.ndarray | None = None
        self._rows: np.ndarray | None = None

    def _path(self, ci: int, cj: int) -> str:
        if self.fs is not None:
            return f"{self.root.rstrip('/')}/c{self.separator}{ci}{self.separator}{cj}"
        return os.path.join(self.root, "c" + self.separator + str(ci) + self.separator + str(cj))

    def _rows_buffer(self, rows: int) -> np.ndarray:
        """A reused buffer of ``rows`` whole-width chunk rows (grown as needed, never past one chunk)."""
        if self._rows is None or self._rows.shape[0] < rows:
            self._rows = np.empty((rows, self.chunks[1]), dtype=self.dtype)
        return self._rows[:rows]

    def _chunk_buffer(self) -> np.ndarray:
        if self._buf is None:
            self._buf = np.empty(self.chunks, dtype=self.dtype)
        return self._buf

    def _read_rows_into(self, path: str, r0: int, r1: int, dest: np.ndarray) -> None:
        """Fill the C-contiguous ``dest`` (rows ``r0:r1`` of a whole-width chunk) from ``path``.

        Rows of a C-ordered chunk are one contiguous byte range: only that range is read (one
        ``preadv``, or one range request on an object store). A missing chunk is the fill value.
        """
        row = self.chunks[1] * self.dtype.itemsize
        view = memoryview(dest.reshape(-1).view(np.uint8))
        got = self._read_range(path, r0 * row, view)
        if got is None:
            dest.fill(self.fill_value)
            return
        readstats.count(got)
        if got != dest.nbytes:
            from blocklin.errors import StoreReadError, explain

            raise StoreReadError(explain("chunk", f"must hold {self.chunks[0] * row} bytes",
                                         f"{r0 * row + got} bytes in {path}",
                                         "the store is truncated or corrupt; re-create it"))

    def _read_range(self, path: str, offset: int, view: memoryview) -> int | None:
        """Read ``len(view)`` bytes at ``offset`` into ``view``; the count read, None for a missing chunk."""
        if self.fs is not None:
            try:
                data = self.fs.cat_file(path, start=offset, end=offset + len(view))
            except FileNotFoundError:
                return None
            view[: len(data)] = data
            return len(data)
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            return None
        try:
            got = 0
            while got < len(view):  # preadv may return short counts for large ranges
                n = os.preadv(fd, [view[got:]], offset + got)
                if n == 0:
                    break
                got += n
            return got
        finally:
            os.close(fd)

    def _read_segments_into(self, path: str, r0: int, c0: int, dest: np.ndarray) -> None:
        """Fill ``dest`` (rows ``r0:`` and columns ``c0:`` of a local chunk; each row contiguous)
        straight into place, without a chunk buffer.

        Whole-width rows (a block wider than the chunk) and segments of more than half a row come
        in with one scattering ``preadv`` per :data:`_IOV_MAX` buffers (the columns not wanted land
        in a reused scratch row); narrower segments with one ``preadv`` each, reading only them.
        """
        isz = self.dtype.itemsize
        row, seg = self.chunks[1] * isz, dest.shape[1] * isz
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            dest.fill(self.fill_value)
            return
        try:
            if 2 * seg <= row:
                got = self._per_row(fd, r0 * row + c0 * isz, row, dest)
            else:
                got = self._scattered(fd, r0 * row, row, c0 * isz, dest)
        finally:
            os.close(fd)
        readstats.count(got)
        if got < 0:
            from blocklin.errors import StoreReadError, explain

            raise StoreReadError(explain("chunk", f"must hold {self.chunks[0] * row} bytes", f"fewer in {path}",
                                         "the store is truncated or corrupt; re-create it"))

    @staticmethod
    def _per_row(fd: int, base: int, row: int, dest: np.ndarray) -> int:
        """One ``preadv`` per row of just the segment; the bytes read, negative when a row is short."""
        got, seg = 0, dest.shape[1] * dest.itemsize
        for i in range(dest.shape[0]):
            n = os.preadv(fd, [dest[i].view(np.uint8)], base + i * row)
            if n != seg:
                return -1
            got += n
        return got

    def _scattered(self, fd: int, base: int, row: int, lead: int, dest: np.ndarray) -> int:
        """Whole rows from ``base``, scattered: ``lead`` bytes and the rest of each row past the
        segment go to a scratch row, the segment into ``dest``; negative when the file is short."""
        seg = dest.shape[1] * dest.itemsize
        tail = row - lead - seg
        scratch = memoryview(bytearray(max(lead, tail, 1)))
        per_call = _IOV_MAX // (1 + (lead > 0) + (tail > 0))
        got = 0
        for i0 in range(0, dest.shape[0], per_call):
            bufs = []
            for i in range(i0, min(dest.shape[0], i0 + per_call)):
                if lead:
                    bufs.append(scratch[:lead])
                bufs.append(dest[i].view(np.uint8))
                if tail:
                    bufs.append(scratch[:tail])
            want = (min(dest.shape[0], i0 + per_call) - i0) * row
            done = 0
            while done < want:  # a short count resumes at the first buffer not yet filled
                n = os.preadv(fd, _skip(bufs, done), base + i0 * row + done)
                if n <= 0:
                    return -1
                done += n
            got += done
        return got

    def read(self, rows: slice, cols: slice, out: np.ndarray) -> np.ndarray:
        """``out[...] = array[rows, cols]`` (``out`` C-contiguous of the selection's shape).

        Each chunk is read only in the rows the selection covers: one range when the selection
        holds the chunk's whole width, else, from a local file, one ``preadv`` per row of just the
        columns wanted, straight into place; from an object store, one range of whole-width rows
        whose wanted columns are kept.
        """
        ch_r, ch_c = self.chunks
        r0, r1, c0, c1 = rows.start, rows.stop, cols.start, cols.stop
        for ci in range(r0 // ch_r, (r1 - 1) // ch_r + 1 if r1 > r0 else 0):
            gr0 = ci * ch_r
            sr0, sr1 = max(r0, gr0), min(r1, gr0 + ch_r)
            for cj in range(c0 // ch_c, (c1 - 1) // ch_c + 1 if c1 > c0 else 0):
                gc0 = cj * ch_c
                sc0, sc1 = max(c0, gc0), min(c1, gc0 + ch_c)
                dest = out[sr0 - r0:sr1 - r0, sc0 - c0:sc1 - c0]
                if (sc0, sc1) == (gc0, gc0 + ch_c) and dest.flags.c_contiguous:
                    self._read_rows_into(self._path(ci, cj), sr0 - gr0, sr1 - gr0, dest)  # straight into place
                elif self.fs is None:
                    self._read_segments_into(self._path(ci, cj), sr0 - gr0, sc0 - gc0, dest)
                else:
                    buf = self._rows_buffer(sr1 - sr0)
                    self._read_rows_into(self._path(ci, cj), sr0 - gr0, sr1 - gr0, buf)
                    dest[...] = buf[:, sc0 - gc0:sc1 - gc0]
        return out

    def aligned(self, rows: slice, cols: slice) -> bool:
        """Whether ``[rows, cols]`` covers whole chunks (edge chunks up to the array's end)."""
        ch_r, ch_c = self.chunks
        return (rows.start % ch_r == 0 and cols.start % ch_c == 0
                and (rows.stop % ch_r == 0 or rows.stop == self.shape[0])
                and (cols.stop % ch_c == 0 or cols.stop == self.shape[1]))

    def write(self, rows: slice, cols: slice, block: np.ndarray) -> None:
        """Write ``block`` to whole chunks ``[rows, cols]`` (see :meth:`aligned`)."""
        ch_r, ch_c = self.chunks
        r0, c0 = rows.start, cols.start
        for ci in range(r0 // ch_r, -(-rows.stop // ch_r)):
            gr0 = ci * ch_r
            gr1 = min(gr0 + ch_r, self.shape[0])
            os.makedirs(os.path.join(self.root, "c" + self.separator + str(ci)), exist_ok=True)
            for cj in range(c0 // ch_c, -(-cols.stop // ch_c)):
                gc0 = cj * ch_c
                gc1 = min(gc0 + ch_c, self.shape[1])
                src = block[gr0 - r0:gr1 - r0, gc0 - c0:gc1 - c0]
                path = self._path(ci, cj)
                tmp = f"{path}.tmp-{os.getpid()}-{id(self)}"
                full = src.shape == self.chunks and src.dtype == self.dtype
                with open(tmp, "wb", buffering=0) as f:
                    if full and src.flags.c_contiguous:
                        f.write(memoryview(src.reshape(-1).view(np.uint8)))
                    elif full and src.strides[1] == src.itemsize:  # rows of a wider block: no gathering copy
                        if not _writev_rows(f.fileno(), src):
                            f.seek(0)
                            f.truncate()
                            f.write(memoryview(np.ascontiguousarray(src).reshape(-1).view(np.uint8)))
                    else:  # edge chunks are stored at full size, padded with the fill value
                        buf = self._chunk_buffer()
                        if src.shape != self.chunks:
                            buf.fill(self.fill_value)
                        buf[: src.shape[0], : src.shape[1]] = src
                        f.write(memoryview(buf.reshape(-1).view(np.uint8)))
                os.replace(tmp, path)  # a reader never sees half a chunk


def _skip(bufs: list, n: int) -> list:
    """The buffers after the first ``n`` bytes (for resuming a short ``preadv``)."""
    if n == 0:
        return bufs
    out = []
    for b in bufs:
        size = len(memoryview(b).cast("B"))
        if n >= size:
            n -= size
            continue
        out.append(memoryview(b).cast("B")[n:] if n else b)
        n = 0
    return out


def _writev_rows(fd: int, src: np.ndarray) -> bool:
    """Write the rows of a row-strided block with ``writev`` (no gathering copy); False if short."""
    want = src.nbytes
    done = 0
    for r0 in range(0, src.shape[0], _IOV_MAX):
        done += os.writev(fd, [src[r] for r in range(r0, min(src.shape[0], r0 + _IOV_MAX))])
    return done == want


def raw_access(arr: Any, *, remote: bool = False) -> RawChunks | None:
    """A :class:`RawChunks` for ``arr`` when it is eligible (see module docstring), else None.

    ``remote=True`` also accepts arrays on fsspec stores (object stores, ``memory://``), read by
    range requests; callers use it for reads of part of a chunk, where a range request fetches
    only the rows wanted (whole chunks are left to zarr, which fetches several at once).
    """
    try:
        meta = arr.metadata
        if getattr(meta, "zarr_format", None) != 3 or len(arr.shape) != 2:
            return None
        codecs = tuple(meta.codecs)
        if len(codecs) != 1 or type(codecs[0]).__name__ != "BytesCodec":
            return None
        dtype = np.dtype(arr.dtype)
        endian = getattr(codecs[0], "endian", None)
        if dtype.itemsize > 1 and (getattr(endian, "value", endian) != "little" or sys.byteorder != "little"):
            return None
        if dtype.kind not in "fciub" or not dtype.isnative:
            return None
        cke = meta.chunk_key_encoding
        if type(cke).__name__ != "DefaultChunkKeyEncoding":
            return None
        grid = meta.chunk_grid
        if type(grid).__name__ != "RegularChunkGrid":
            return None
        store = arr.store
        if getattr(arr, "path", ""):
            return None
        args = (tuple(arr.shape), tuple(grid.chunk_shape), dtype.str, meta.fill_value, cke.separator)
        if type(store).__name__ == "LocalStore":
            return _cached(str(store.root), *args)
        if remote and type(store).__name__ == "FsspecStore":
            return _remote(store, *args)
        return None
    except Exception:  # any unexpected metadata shape: use zarr
        return None


def _remote(store: Any, *args: Any) -> RawChunks | None:
    from blocklin.storage.backend import FsspecBackend
    from blocklin.storage.location import store_location

    loc = store_location(store)
    if loc is None or loc.is_local:
        return None
    be = FsspecBackend(loc)  # its synchronous filesystem (cached per URL and options)
    raw = _cached(be.root, *args)
    raw.fs = be.fs
    return raw


@functools.lru_cache(maxsize=256)
def _cached_meta(root: str, shape: tuple, chunks: tuple, dtype: str, fill: Any, sep: str) -> tuple:
    return (root, shape, chunks, np.dtype(dtype), fill, sep)


def _cached(root: str, shape: tuple, chunks: tuple, dtype: str, fill: Any, sep: str) -> RawChunks:
    # One RawChunks per call site: its chunk buffer must not be shared between threads.
    return RawChunks(*_cached_meta(root, shape, chunks, dtype, _fill_key(fill), sep))


def _fill_key(fill: Any) -> Any:
    try:
        return fill.item()
    except AttributeError:
        return fill
