"""A direct path for uncompressed zarr v3 arrays on local disk.

For an array whose only codec is ``bytes`` (little-endian, no compression, no sharding) on a local
store, a chunk file is exactly the chunk's C-ordered bytes. Reading it with one ``readinto`` into
the destination (or one reused chunk buffer) skips zarr's asynchronous machinery, whose many thread
hand-offs stall when BLAS keeps every core busy: measured here, a loader thread running beside a
2-thread GEMM fell behind compute through zarr, and keeps ahead through this path. Writes of whole
chunks go to the chunk files the same way. Anything else (compression, v2, sharding, other key
encodings, big-endian data) returns ``None`` from :func:`raw_access`, and callers use zarr.
"""

from __future__ import annotations

import functools
import os
import sys
from typing import Any

import numpy as np


class RawChunks:
    """Read and write blocks of an eligible array straight from and to its chunk files."""

    def __init__(self, root: str, shape: tuple[int, ...], chunks: tuple[int, ...], dtype: np.dtype,
                 fill_value: Any, separator: str) -> None:
        self.root = root
        self.shape = shape
        self.chunks = chunks
        self.dtype = dtype
        self.fill_value = fill_value
        self.separator = separator
        self._buf: np.ndarray | None = None

    def _path(self, ci: int, cj: int) -> str:
        return os.path.join(self.root, "c" + self.separator + str(ci) + self.separator + str(cj))

    def _chunk_buffer(self) -> np.ndarray:
        if self._buf is None:
            self._buf = np.empty(self.chunks, dtype=self.dtype)
        return self._buf

    def _read_chunk_into(self, path: str, dest: np.ndarray) -> None:
        """Fill the C-contiguous ``dest`` (a whole chunk) from ``path``, or with the fill value."""
        try:
            with open(path, "rb", buffering=0) as f:
                view = memoryview(dest.reshape(-1).view(np.uint8))
                got = f.readinto(view)
        except FileNotFoundError:
            dest.fill(self.fill_value)
            return
        if got != dest.nbytes:
            from blocklin.errors import StoreReadError, explain

            raise StoreReadError(explain("chunk", f"must hold {dest.nbytes} bytes", f"{got} bytes in {path}",
                                         "the store is truncated or corrupt; re-create it"))

    def read(self, rows: slice, cols: slice, out: np.ndarray) -> np.ndarray:
        """``out[...] = array[rows, cols]`` (``out`` C-contiguous of the selection's shape)."""
        ch_r, ch_c = self.chunks
        r0, r1, c0, c1 = rows.start, rows.stop, cols.start, cols.stop
        for ci in range(r0 // ch_r, (r1 - 1) // ch_r + 1 if r1 > r0 else 0):
            gr0, gr1 = ci * ch_r, (ci + 1) * ch_r
            sr0, sr1 = max(r0, gr0), min(r1, gr1)
            for cj in range(c0 // ch_c, (c1 - 1) // ch_c + 1 if c1 > c0 else 0):
                gc0, gc1 = cj * ch_c, (cj + 1) * ch_c
                sc0, sc1 = max(c0, gc0), min(c1, gc1)
                dest = out[sr0 - r0:sr1 - r0, sc0 - c0:sc1 - c0]
                whole = (sr0, sr1, sc0, sc1) == (gr0, gr1, gc0, gc1)
                if whole and dest.flags.c_contiguous:
                    self._read_chunk_into(self._path(ci, cj), dest)  # one copy, straight into place
                else:
                    buf = self._chunk_buffer()
                    self._read_chunk_into(self._path(ci, cj), buf)
                    dest[...] = buf[sr0 - gr0:sr1 - gr0, sc0 - gc0:sc1 - gc0]
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
        buf = self._chunk_buffer()
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
                        if src.shape != self.chunks:
                            buf.fill(self.fill_value)
                        buf[: src.shape[0], : src.shape[1]] = src
                        f.write(memoryview(buf.reshape(-1).view(np.uint8)))
                os.replace(tmp, path)  # a reader never sees half a chunk


_IOV_MAX = 1024


def _writev_rows(fd: int, src: np.ndarray) -> bool:
    """Write the rows of a row-strided block with ``writev`` (no gathering copy); False if short."""
    want = src.nbytes
    done = 0
    for r0 in range(0, src.shape[0], _IOV_MAX):
        done += os.writev(fd, [src[r] for r in range(r0, min(src.shape[0], r0 + _IOV_MAX))])
    return done == want


def raw_access(arr: Any) -> RawChunks | None:
    """A :class:`RawChunks` for ``arr`` when it is eligible (see module docstring), else None."""
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
        if type(store).__name__ != "LocalStore" or getattr(arr, "path", ""):
            return None
        root = str(store.root)
        return _cached(root, tuple(arr.shape), tuple(grid.chunk_shape), dtype.str, meta.fill_value, cke.separator)
    except Exception:  # any unexpected metadata shape: use zarr
        return None


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
