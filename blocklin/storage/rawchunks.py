"""A direct path for uncompressed zarr v3 arrays on local disk.

For an array whose only codec is ``bytes`` (little-endian, no compression, no sharding) on a local
store, a chunk file is exactly the chunk's C-ordered bytes, so a row range of a chunk is one
contiguous byte range. Reading just the rows a block needs with one ``preadv`` into the destination
(or one reused chunk buffer) reads no more than is used (a strip narrower than a chunk no longer
reads the whole chunk; a column range of a local chunk is mapped and only its columns copied)
and skips zarr's asynchronous machinery, whose many thread
hand-offs stall when BLAS keeps every core busy: measured here, a loader thread running beside a
2-thread GEMM fell behind compute through zarr, and keeps ahead through this path. Writes of whole
chunks go to the chunk files the same way. Anything else (compression, v2, sharding, other key
encodings, big-endian data) returns ``None`` from :func:`raw_access`, and callers use zarr.
Uncompressed arrays on fsspec stores are read the same way with range requests
(``raw_access(arr, remote=True)``) where a block covers part of a chunk. Every read adds the bytes
it fetched to :mod:`blocklin._readstats`.

Local arrays whose chunks are compressed by zstd or blosc alone (:func:`decoded_access`) are read
without zarr too: each chunk file is read whole and decoded by numcodecs straight into its place in
the destination (through one chunk buffer only where the block holds part of the chunk), the chunks
of one read decoded at once by the threads of a pool shared by every task of the process
(:data:`DECODE_THREADS`; numcodecs releases the GIL while it decodes). Such reads still fetch and
decode every chunk they touch whole, as zarr's do, so planners treat them as zarr reads (``"chunks"``).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import errno
import functools
import mmap
import os
import struct
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from blocklin.device import pool
from blocklin.errors import FormatError, StoreReadError
from blocklin.storage.space import raise_naming

import blocklin._readstats as readstats


_IOV_MAX = 1024
#: Alignment of a strip's first row that :meth:`RawChunks.mapped` asks for (that of every copied strip).
CACHE_LINE = 64
#: Most bytes of a chunk file mapped at once by a read of part of its width (what the mapping adds
#: to the resident memory while it lasts).
_MAP_WINDOW = 2**20


@contextlib.contextmanager
def chunk_file(path: str, writer: object) -> Iterator[Any]:
    """An unbuffered binary file for the chunk at ``path``, renamed into place when the block ends: a
    reader never sees half a chunk, and a failed write leaves the chunk as it was and no temporary
    (``writer``: the object writing, whose id keeps concurrent writers' temporaries apart)."""
    tmp = f"{path}.tmp-{os.getpid()}-{id(writer)}"
    try:
        with open(tmp, "wb", buffering=0) as f:
            yield f
        os.replace(tmp, path)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise_naming(exc, path)  # a full disk's write() names no file


def write_all(f: Any, data: memoryview) -> None:
    """Write all of ``data`` to the unbuffered file ``f``. Its ``write`` may write part and return the
    count (a disk that fills mid-write); the rest is written again, and the next write raises the
    ``OSError`` (ENOSPC): a chunk renamed into place is never short."""
    data = data.cast("B") if data.format != "B" or data.ndim != 1 else data
    done = 0
    while done < len(data):
        n = f.write(data[done:])
        if not n:  # pragma: no cover - a regular file's write returns > 0 or raises
            raise OSError(errno.EIO, "write wrote nothing", getattr(f, "name", None))
        done += n


class RawChunks:
    """Read and write blocks of an eligible array straight from and to its chunk files."""

    def __init__(self, root: str, shape: tuple[int, ...], chunks: tuple[int, ...], dtype: np.dtype,
                 fill_value: Any, separator: str, fs: Any = None) -> None:
        self.root = root
        self.fs = fs  # an fsspec filesystem (reads only), or None for a local folder
        self.vector = len(shape) == 1  # a 1-D array, read as one column (its chunk keys have one index)
        self.shape = (shape[0], 1) if self.vector else shape
        self.chunks = (chunks[0], 1) if self.vector else chunks
        self.dtype = dtype
        self.fill_value = fill_value
        self.separator = separator
        self._buf: np.ndarray | None = None
        self._rows: np.ndarray | None = None

    def _path(self, ci: int, cj: int) -> str:
        key = f"c{self.separator}{ci}" if self.vector else f"c{self.separator}{ci}{self.separator}{cj}"
        if self.fs is not None:
            return f"{self.root.rstrip('/')}/{key}"
        return os.path.join(self.root, key)

    def _rows_buffer(self, rows: int) -> np.ndarray:
        """A reused buffer of ``rows`` whole-width chunk rows (grown as needed, never past one chunk)."""
        if self._rows is None or self._rows.shape[0] < rows:
            self._rows = pool.aligned_empty((rows, self.chunks[1]), self.dtype)
        return self._rows[:rows]

    def _chunk_buffer(self) -> np.ndarray:
        if self._buf is None:
            self._buf = pool.aligned_empty(self.chunks, self.dtype)
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
            raise self._short(path, r0 * row + got)

    def _short(self, path: str, held: int) -> Exception:
        """The error for chunk file ``path`` found to hold only ``held`` bytes."""
        from blocklin.errors import explain

        whole = self.chunks[0] * self.chunks[1] * self.dtype.itemsize
        return StoreReadError(explain("chunk", f"must hold {whole} bytes", f"{held} bytes in {path}",
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
            return _pread(fd, view, offset)
        finally:
            os.close(fd)

    def _read_segments_into(self, path: str, r0: int, c0: int, dest: np.ndarray) -> None:
        """Fill ``dest`` (rows ``r0:`` and columns ``c0:`` of a local chunk; each row contiguous)
        straight into place, without a chunk buffer.

        The rows are mapped from the file (page-cache pages, no copy into a buffer) a window of at
        most :data:`_MAP_WINDOW` bytes at a time, and only the wanted columns of each row are
        copied into place, in one strided copy per window. Measured on a 1024 x 1024 float64 chunk
        read a quarter of its width at a time: 1.3 ms, against 3.9 ms for one ``preadv`` per row
        and 2.1 ms for reading the whole chunk; so narrow k-panels of a GEMM and narrow strips
        cost the bytes they use, not a system call per row.
        """
        isz = self.dtype.itemsize
        row, seg = self.chunks[1] * isz, dest.shape[1] * isz
        nrows = dest.shape[0]
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            dest.fill(self.fill_value)
            return
        try:
            # Checked before mapping: touching a mapped page past the end of a file is a SIGBUS.
            if os.fstat(fd).st_size < (r0 + nrows - 1) * row + c0 * isz + seg:
                from blocklin.errors import StoreReadError, explain

                raise StoreReadError(explain("chunk", f"must hold {self.chunks[0] * row} bytes",
                                             f"{os.fstat(fd).st_size} in {path}",
                                             "the store is truncated or corrupt; re-create it"))
            if seg == row:  # whole rows, each its own place in dest: one gathering preadv per _IOV_MAX
                for i0 in range(0, nrows, _IOV_MAX):
                    i1 = min(nrows, i0 + _IOV_MAX)
                    n = os.preadv(fd, [dest[i].view(np.uint8) for i in range(i0, i1)], (r0 + i0) * row)
                    for i in range(i0 + n // row, i1):  # a short count: the rest row by row
                        _pread_full(fd, dest[i].view(np.uint8), (r0 + i) * row, n % row if i == i0 + n // row else 0)
                readstats.count(nrows * seg)
                return
            # the mapped window is resident while it is copied (the kernel maps the page cache around each
            # fault) and no plan counts it: at most half the bytes this read delivers, which its plan counts
            # (a 64-column panel of a 1024-wide chunk had mapped 1 MiB windows for 512 KiB panels)
            per_window = max(1, min(_MAP_WINDOW, nrows * seg // 2) // row)
            for i0 in range(0, nrows, per_window):
                i1 = min(nrows, i0 + per_window)
                first = (r0 + i0) * row + c0 * isz  # the window's first wanted byte
                base = first - first % mmap.ALLOCATIONGRANULARITY
                length = (r0 + i1 - 1) * row + c0 * isz + seg - base
                m = mmap.mmap(fd, length, prot=mmap.PROT_READ, flags=mmap.MAP_SHARED, offset=base)
                try:
                    src = np.ndarray((i1 - i0, dest.shape[1]), dtype=self.dtype, buffer=m, offset=first - base,
                                     strides=(row, isz))
                    dest[i0:i1] = src
                    del src  # the mapping closes only once no view of it is left
                finally:
                    m.close()
        finally:
            os.close(fd)
        readstats.count(nrows * seg)

    def read(self, rows: slice, cols: slice, out: np.ndarray) -> np.ndarray:
        """``out[...] = array[rows, cols]`` (``out`` C-contiguous of the selection's shape).

        Each chunk is read only in the rows the selection covers: one range when the selection
        holds the chunk's whole width, else, from a local file, the rows mapped a window at a time
        and just the columns wanted copied into place (whole-width rows that are not contiguous in
        ``out``: one gathering ``preadv``); from an object store, one range of whole-width rows
        whose wanted columns are kept.

        The pieces that go straight into ``out`` are read by threads of the process's chunk I/O
        pool, as many as :data:`READ_THREADS` less the other reads under way in the process (each
        piece at least :data:`READ_PIECE_BYTES`): one thread copying from the page cache reaches
        about half of what two reach on the 2-core machine (``benchmarks/feed.py``: 2.7 against
        5.2 GB/s), so a task with one loader thread (a GEMM tile's) would read at half the
        storage's rate; where every core already has a read of its own (a row pass's two tasks)
        splitting only adds hand-offs (measured 4.2-4.4 against 4.6-4.8 GB/s).
        """
        ch_r, ch_c = self.chunks
        r0, r1, c0, c1 = rows.start, rows.stop, cols.start, cols.stop
        work: list[tuple] = []
        for ci in range(r0 // ch_r, (r1 - 1) // ch_r + 1 if r1 > r0 else 0):
            gr0 = ci * ch_r
            sr0, sr1 = max(r0, gr0), min(r1, gr0 + ch_r)
            for cj in range(c0 // ch_c, (c1 - 1) // ch_c + 1 if c1 > c0 else 0):
                gc0 = cj * ch_c
                sc0, sc1 = max(c0, gc0), min(c1, gc0 + ch_c)
                dest = out[sr0 - r0:sr1 - r0, sc0 - c0:sc1 - c0]
                if (sc0, sc1) == (gc0, gc0 + ch_c) and dest.flags.c_contiguous:
                    work.append((True, self._path(ci, cj), sr0 - gr0, dest, 0))  # straight into place
                elif self.fs is None:
                    work.append((False, self._path(ci, cj), sr0 - gr0, dest, sc0 - gc0))
                else:  # through the one reused rows buffer: not shared between threads
                    buf = self._rows_buffer(sr1 - sr0)
                    self._read_rows_into(self._path(ci, cj), sr0 - gr0, sr1 - gr0, buf)
                    dest[...] = buf[:, sc0 - gc0:sc1 - gc0]
        with _reading() as others:
            threads = READ_THREADS - others
            pieces = _split_pieces(work, out.nbytes, threads)
            if threads <= 1 or len(pieces) <= 1:
                for piece in pieces:
                    self._read_piece(*piece)
            else:
                _run_all(_io_pool(), self._read_piece, pieces, min(threads, len(pieces)))
        return out

    def pieces(self, rows: slice, out: np.ndarray, step: int) -> Iterator[tuple[int, int]]:
        """Read ``array[rows, :]`` into ``out`` ``step`` rows at a time (never across a chunk), and yield
        each piece's rows of ``out`` (``(a, b)``) once it is in, while it is still in the core's cache.

        For a local array one chunk wide, read into a C-contiguous ``out`` of its dtype
        (:meth:`reads_pieces`). Each chunk file is opened once for all its pieces: a first pass of a
        job read its strips in 1 MiB pieces through :meth:`read`, one open and one read set-up per
        piece, and the opens alone took a tenth of its loaders' time on the 2-core machine. A missing
        chunk is the fill value; a short one is refused, as :meth:`read` refuses it.
        """
        ch = self.chunks[0]
        row = self.chunks[1] * self.dtype.itemsize
        flat = memoryview(out.reshape(-1).view(np.uint8))
        r, stop = rows.start, rows.stop
        while r < stop:
            ci = r // ch
            end = min(stop, (ci + 1) * ch)
            path = self._path(ci, 0)
            try:
                fd = os.open(path, os.O_RDONLY)
            except FileNotFoundError:
                fd = None
            try:
                while r < end:
                    r1 = min(end, r + step)
                    a, b = r - rows.start, r1 - rows.start
                    if fd is None:
                        out[a:b].fill(self.fill_value)
                    else:
                        view = flat[a * row:b * row]
                        got = _pread(fd, view, (r - ci * ch) * row)
                        readstats.count(got)
                        if got != len(view):
                            raise self._short(path, (r - ci * ch) * row + got)
                    r = r1
                    yield a, b
            finally:
                if fd is not None:
                    os.close(fd)

    def reads_pieces(self, cols: slice, out: np.ndarray) -> bool:
        """Whether :meth:`pieces` reads ``[:, cols]`` blocks into ``out``: local, one chunk across,
        ``cols`` the whole width, ``out`` C-contiguous in the array's dtype."""
        return (self.fs is None and not self.vector and self.chunks[1] == self.shape[1]
                and (cols.start or 0) == 0 and (cols.stop is None or cols.stop == self.shape[1])
                and out.dtype == self.dtype and out.flags.c_contiguous)

    def maps(self, cols: slice) -> bool:
        """Whether :meth:`mapped` may map ``[:, cols]`` strips: local, one chunk across, ``cols`` the
        whole width, and chunks of a whole number of pages (a strip of several chunks is their
        mappings side by side), where mapping is available (:data:`blocklin.storage.mapped.AVAILABLE`)."""
        from blocklin.storage import mapped

        return (mapped.AVAILABLE and self.fs is None and not self.vector and self.chunks[1] == self.shape[1]
                and (cols.start or 0) == 0 and (cols.stop is None or cols.stop == self.shape[1])
                and self.chunks[0] * self.chunks[1] * self.dtype.itemsize % mapped.PAGE == 0)

    def map_bytes(self, rows: int) -> int:
        """The room :meth:`mapped` needs for a strip of ``rows`` rows (its first chunk's range starts on
        the page of its first row, its last ends on a page)."""
        from blocklin.storage import mapped

        return rows * self.chunks[1] * self.dtype.itemsize + 2 * mapped.PAGE

    def first_chunk(self) -> str:
        """The path of the array's first chunk file (what :func:`blocklin.storage.mapped.large_pages` probes)."""
        return self._path(0, 0)

    def mapped(self, rows: slice, region: Any = None) -> np.ndarray | None:
        """``array[rows, :]`` as a read-only array over the chunk files' pages in the page cache (no
        copy; :mod:`blocklin.storage.mapped`), in ``region`` (a
        :class:`~blocklin.storage.mapped.StripRegion` of at least :meth:`map_bytes`; default: one of
        its own), for an array :meth:`maps` accepts; None where a chunk of the rows is missing (its
        rows are the fill value), where the first row does not start on a cache line, or where no
        mapping can be made: read those with :meth:`read`. A short chunk is refused
        as :meth:`read` refuses it."""
        from blocklin.storage import mapped

        ch = self.chunks[0]
        row = self.chunks[1] * self.dtype.itemsize
        r0, r1 = rows.start, rows.stop
        # A strip starting off a cache line is read instead: a copied strip starts on a page, and a
        # kernel's vector loops may split their work by alignment, so the bits could differ.
        if r1 <= r0 or r0 % ch * row % CACHE_LINE:
            return None
        ranges = []
        for ci in range(r0 // ch, (r1 - 1) // ch + 1):
            a, b = max(r0, ci * ch) - ci * ch, min(r1, (ci + 1) * ch) - ci * ch
            start = a * row // mapped.PAGE * mapped.PAGE  # the first chunk's range may start mid-page
            ranges.append((self._path(ci, 0), start, b * row - start))
        skip = r0 % ch * row - ranges[0][1]
        try:
            into = region.map if region is not None else mapped.map_ranges
            got = into(ranges, skip, (r1 - r0, self.chunks[1]), self.dtype, lambda path, size: self._short(path, size))
        except StoreReadError:
            raise
        except OSError:  # no room to map (address space, map count): read it instead
            return None
        if got is not None:
            readstats.count(got.nbytes)
        return got

    def _read_piece(self, whole: bool, path: str, r0: int, dest: np.ndarray, c0: int) -> None:
        """One piece of :meth:`read`: rows ``r0:`` of a chunk, its whole width or from column ``c0``."""
        if whole:
            self._read_rows_into(path, r0, r0 + dest.shape[0], dest)
        else:
            self._read_segments_into(path, r0, c0, dest)

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
                full = src.shape == self.chunks and src.dtype == self.dtype
                with chunk_file(path, self) as f:
                    if full and src.flags.c_contiguous:
                        write_all(f, memoryview(src.reshape(-1).view(np.uint8)))
                    elif full and src.strides[1] == src.itemsize:  # rows of a wider block: no gathering copy
                        if not _writev_rows(f.fileno(), src):
                            f.seek(0)
                            f.truncate()
                            write_all(f, memoryview(np.ascontiguousarray(src).reshape(-1).view(np.uint8)))
                    else:  # edge chunks are stored at full size, padded with the fill value
                        buf = self._chunk_buffer()
                        if src.shape != self.chunks:
                            buf.fill(self.fill_value)
                        buf[: src.shape[0], : src.shape[1]] = src
                        write_all(f, memoryview(buf.reshape(-1).view(np.uint8)))


#: Bytes beyond a chunk's own (and 1/128 of it) that an encoded chunk may take in the reused frame
#: buffers (zstd's and blosc's bound for incompressible data is below this); a larger one is read into
#: a buffer of its own.
FRAME_SLACK = 64 * 1024

#: Most chunks of one read decoded at once by the chunk I/O pool (and at most as many as zarr
#: keeps in flight, whose temporaries the planners count: a decoding thread holds a chunk's
#: encoded bytes and, for a part of a chunk, one decoded chunk).
DECODE_THREADS = max(1, min(os.cpu_count() or 1, 4))
#: Most pieces of one uncompressed read in flight at once: one per core (a copy from the page cache
#: is bound by a core's memory copy rate), at most 16. Such pieces land straight in the caller's
#: buffer, so threads add no memory.
READ_THREADS = max(1, min(os.cpu_count() or 1, 16))
#: Smallest piece of an uncompressed read handed to a thread of its own (below it the hand-off
#: costs more than the copy saves: about 0.1 ms against 0.2 ms for 512 KiB at 2.7 GB/s on the 2-core
#: machine, and more where waking one of 16 threads of a virtual machine costs more: 4 MiB pieces
#: instead of 1 read later passes 1.2-2x faster on the H200 host, see :func:`_run_all`).
READ_PIECE_BYTES = 4 << 20

_pool_lock = threading.Lock()
_pool: tuple[int, concurrent.futures.ThreadPoolExecutor] | None = None  # (pid, pool)


def _io_pool() -> concurrent.futures.ThreadPoolExecutor:
    """The process's chunk I/O pool, shared by every task of the process: the reads of each task's
    loader split over it (a forked child makes its own: threads do not survive a fork)."""
    global _pool
    with _pool_lock:
        if _pool is None or _pool[0] != os.getpid():
            _pool = (os.getpid(), concurrent.futures.ThreadPoolExecutor(max(DECODE_THREADS, READ_THREADS),
                                                                        thread_name_prefix="blocklin-io"))
        return _pool[1]



_readers_lock = threading.Lock()
_readers = 0  # uncompressed reads under way in the process


@contextlib.contextmanager
def _reading() -> Iterator[int]:
    """Count one more read under way while inside; yields how many others are under way."""
    global _readers
    with _readers_lock:
        others = _readers
        _readers += 1
    try:
        yield others
    finally:
        with _readers_lock:
            _readers -= 1


def _split_pieces(work: list[tuple], total: int, threads: int) -> list[tuple]:
    """``work`` (``(whole width, path, first row, dest, first column)`` per chunk) cut along its rows into
    about ``threads`` pieces of at least :data:`READ_PIECE_BYTES` (rows of a chunk are independent
    byte ranges, and ``dest``'s rows independent places)."""
    if threads <= 1 or total < 2 * READ_PIECE_BYTES:
        return work
    target = max(READ_PIECE_BYTES, -(-total // threads))
    pieces = []
    for whole, path, r0, dest, c0 in work:
        n = dest.shape[0]
        parts = max(1, min(n, dest.nbytes // target))
        for p in range(parts):
            a, b = n * p // parts, n * (p + 1) // parts
            pieces.append((whole, path, r0 + a, dest[a:b], c0))
    return pieces


def _zstd_size(frame: np.ndarray) -> int | None:
    """The content size a zstd frame's header declares (RFC 8878), None when it declares none."""
    if len(frame) < 6 or int.from_bytes(frame[:4].tobytes(), "little") != 0xFD2FB528:
        return None
    fhd = int(frame[4])
    fcs_flag, single = fhd >> 6, (fhd >> 5) & 1
    pos = 5 + (0 if single else 1) + (0, 1, 2, 4)[fhd & 3]
    size = (1 if single else 0, 2, 4, 8)[fcs_flag]
    if size == 0 or len(frame) < pos + size:
        return None
    value = int.from_bytes(frame[pos:pos + size].tobytes(), "little")
    return value + 256 if size == 2 else value


def _blosc_size(frame: np.ndarray) -> int | None:
    """The decoded size a blosc header declares."""
    return struct.unpack_from("<I", frame, 4)[0] if len(frame) >= 16 else None


_DECODERS = {"ZstdCodec": ("Zstd", _zstd_size), "BloscCodec": ("Blosc", _blosc_size)}


class DecodedChunks:
    """Read blocks of a local array of zstd- or blosc-compressed chunks straight into place.

    Each chunk touched is read whole and decoded by numcodecs into the destination when the block
    holds the whole chunk, else into a chunk buffer whose wanted part is copied; a chunk whose
    header declares other than one chunk of bytes is an error (zarr then names it), and a zstd frame
    that declares no size is decoded into a buffer of its own and its length checked. A missing
    chunk is the fill value.
    """

    def __init__(self, root: str, shape: tuple[int, ...], chunks: tuple[int, ...], dtype: np.dtype,
                 fill_value: Any, separator: str, codec: str) -> None:
        self.root, self.shape, self.chunks, self.dtype = root, shape, chunks, dtype
        self.fill_value, self.separator = fill_value, separator
        name, self._size = _DECODERS[codec]
        import numcodecs

        self._codec = getattr(numcodecs, name)()
        self.chunk_bytes = int(np.prod(chunks)) * dtype.itemsize

    def _path(self, ci: int, cj: int) -> str:
        return os.path.join(self.root, "c" + self.separator + str(ci) + self.separator + str(cj))

    def _decode(self, ci: int, cj: int, dest: np.ndarray, r0: int, c0: int) -> None:
        """Chunk ``(ci, cj)``'s rows ``r0:`` and columns ``c0:`` (``dest``'s shape) into ``dest``."""
        try:
            fd = os.open(self._path(ci, cj), os.O_RDONLY)
        except FileNotFoundError:
            dest.fill(self.fill_value)
            return
        # The encoded bytes and a part's decoded chunk go through buffers a run reuses
        # (device.pool): a fresh mapping per chunk cost a page fault per page of it.
        cap = self.chunk_bytes + self.chunk_bytes // 128 + FRAME_SLACK
        try:
            size = os.fstat(fd).st_size
            buf = pool.empty((cap,), np.uint8) if size <= cap else pool.aligned_empty(size, np.uint8)
            frame = buf[:size]
            _pread_full(fd, frame, 0, 0)
        finally:
            os.close(fd)
        whole = dest.shape == self.chunks and dest.flags.c_contiguous
        target = dest if whole else pool.empty(self.chunks, self.dtype)
        try:
            readstats.count(frame.nbytes)
            declared = self._size(frame)
            if declared is None:
                # A valid zstd frame need not declare its size (a streaming encoder's does not), and zarr
                # reads it: decoded into a buffer of numcodecs' own (a chunk, which no plan counts; such
                # frames are other writers'), then checked and copied. It had been refused as damaged.
                data = np.frombuffer(self._codec.decode(frame), np.uint8)
                if data.nbytes != self.chunk_bytes:
                    raise FormatError(f"the chunk decodes to {data.nbytes} bytes, not {self.chunk_bytes}")
                target.reshape(-1).view(np.uint8)[:] = data
            elif declared != self.chunk_bytes:
                raise FormatError(f"the chunk's codec header declares {declared} bytes, not {self.chunk_bytes}")
            else:
                self._codec.decode(frame, out=target.reshape(-1).view(np.uint8))
            if not whole:
                dest[...] = target[r0:r0 + dest.shape[0], c0:c0 + dest.shape[1]]
        finally:
            del frame
            if size <= cap:
                pool.give(buf)
            if not whole:
                pool.give(target)

    def read(self, rows: slice, cols: slice, out: np.ndarray,
             each: Callable[[np.ndarray, int], None] | None = None, lanes: int | None = None) -> np.ndarray:
        """``out[...] = array[rows, cols]``, the chunks decoded by up to :data:`DECODE_THREADS` at once
        (at most ``lanes``: a plan whose budget holds fewer chunks' temporaries).

        ``each(part, column)``, when given, runs in the thread that decoded each chunk's part of ``out``
        right after it lands (``part`` a view of ``out``, ``column`` its first column there), while the
        part is still in that core's cache: a job's first pass takes its column peaks so.
        """
        ch_r, ch_c = self.chunks
        r0, r1, c0, c1 = rows.start, rows.stop, cols.start, cols.stop
        work = []
        for ci in range(r0 // ch_r, (r1 - 1) // ch_r + 1 if r1 > r0 else 0):
            gr0 = ci * ch_r
            sr0, sr1 = max(r0, gr0), min(r1, gr0 + ch_r)
            for cj in range(c0 // ch_c, (c1 - 1) // ch_c + 1 if c1 > c0 else 0):
                gc0 = cj * ch_c
                sc0, sc1 = max(c0, gc0), min(c1, gc0 + ch_c)
                work.append((ci, cj, out[sr0 - r0:sr1 - r0, sc0 - c0:sc1 - c0], sr0 - gr0, sc0 - gc0, sc0 - c0))

        def part(ci: int, cj: int, dest: np.ndarray, pr0: int, pc0: int, column: int) -> None:
            self._decode(ci, cj, dest, pr0, pc0)
            if each is not None:
                each(dest, column)

        threads = min(DECODE_THREADS, lanes or DECODE_THREADS)
        if len(work) <= 1 or threads == 1:
            for item in work:
                part(*item)
            return out
        _run_all(_io_pool(), part, work, min(threads, len(work)))
        return out


def _run_all(pool: concurrent.futures.ThreadPoolExecutor, fn: Any, work: list, lanes: int) -> None:
    """``fn(*item)`` for every item, on ``lanes`` threads at once (the calling thread and ``lanes - 1``
    of ``pool``); returns once none runs any more (also when one fails or the caller is interrupted:
    nothing writes into the caller's buffers after it), raising the first failure.

    The caller reads as a lane rather than wait: one thread fewer to wake per read. Measured on the
    H200 host of ``benchmarks/results/gpu-2026-12-04-5/`` (16 cores, later passes of
    ``benchmarks/feed.py``, medians of 5 alternated), with :data:`READ_PIECE_BYTES` from 1 to 4 MiB:
    CPU 9.1 -> 13.8 GB/s at 1/16 of the operand and 19.1 -> 23.8 at 1/4; the GPU's 9.5 -> 19.4 and
    18.3 -> 23.0.
    """
    items = iter(work)
    lock = threading.Lock()
    stop = threading.Event()

    def lane() -> None:
        while not stop.is_set():
            with lock:
                item = next(items, None)
            if item is None:
                return
            try:
                fn(*item)
            except BaseException:
                stop.set()
                raise

    futures = [pool.submit(readstats.in_context(lane)) for _ in range(lanes - 1)]
    try:
        lane()
        for f in futures:
            f.result()
    except BaseException:
        stop.set()
        for f in futures:
            f.cancel()
        concurrent.futures.wait(futures)
        raise


def _pread(fd: int, view: memoryview, offset: int) -> int:
    """Read up to ``len(view)`` bytes at ``offset`` of ``fd`` into ``view`` (``preadv`` may return short
    counts for large ranges); the count read, short only at the end of the file."""
    got = 0
    while got < len(view):
        n = os.preadv(fd, [view[got:]], offset + got)
        if n == 0:
            break
        got += n
    return got


def _pread_full(fd: int, buf: np.ndarray, offset: int, done: int) -> None:
    """Fill the rest of ``buf`` (its first ``done`` bytes are in) from ``offset`` of ``fd``."""
    view = memoryview(buf)
    while done < len(view):
        n = os.preadv(fd, [view[done:]], offset + done)
        if n <= 0:
            raise OSError(f"short read at byte {offset + done}")
        done += n


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
        layout = _layout(arr)
        if layout is None or layout[0]:
            return None
        args = layout[1:]
        store = arr.store
        if type(store).__name__ == "LocalStore":
            return _cached(str(store.root), *args)
        if remote and type(store).__name__ == "FsspecStore":
            return _remote(store, *args)
        return None
    except Exception:  # any unexpected metadata shape: use zarr
        return None


def raw_vector(arr: Any) -> RawChunks | None:
    """A :class:`RawChunks` reading ranges of an uncompressed 1-D array (a group's member too) on a
    local or fsspec store as one column (``read(rows, slice(0, 1), out[:, None])``), else None: only
    the bytes of the range are read, with no chunk-sized buffers (zarr decodes every chunk a range
    touches, several at once)."""
    try:
        layout = _layout(arr, ndim=1, member=True)
        if layout is None or layout[0]:
            return None
        path = str(getattr(arr, "path", "") or "").strip("/")
        store = arr.store
        if type(store).__name__ == "LocalStore":
            root = os.path.join(str(store.root), path) if path else str(store.root)
            return RawChunks(*_cached_meta(root, *layout[1:4], _fill_key(layout[4]), layout[5]))
        if type(store).__name__ == "FsspecStore":
            from blocklin.storage.backend import FsspecBackend
            from blocklin.storage.location import store_location

            loc = store_location(store)
            if loc is None or loc.is_local:
                return None
            be = FsspecBackend(loc)
            root = f"{be.root.rstrip('/')}/{path}" if path else be.root
            raw = RawChunks(*_cached_meta(root, *layout[1:4], _fill_key(layout[4]), layout[5]))
            raw.fs = be.fs
            return raw
        return None
    except Exception:  # any unexpected metadata shape: use zarr
        return None


class VectorChunkFiles:
    """Whole chunks of an uncompressed local 1-D array written straight to their files (each through a
    :func:`chunk_file`, as :meth:`RawChunks.write`), whatever the array's present length:
    an appender writes chunks past it and sets the length once at the end."""

    def __init__(self, root: str, chunk: int, dtype: np.dtype, separator: str) -> None:
        self.root, self.chunk, self.dtype, self.separator = root, chunk, dtype, separator

    def write(self, index: int, buf: np.ndarray) -> None:
        """Chunk ``index`` from ``buf`` (one whole chunk of the array's dtype)."""
        if buf.shape != (self.chunk,) or buf.dtype != self.dtype or not buf.flags.c_contiguous:
            from blocklin.errors import InternalError

            raise InternalError(f"VectorChunkFiles.write: a chunk of {self.chunk} {self.dtype}, got {buf.shape} "
                                f"{buf.dtype}")
        if self.separator == "/":
            os.makedirs(os.path.join(self.root, "c"), exist_ok=True)
        with chunk_file(os.path.join(self.root, f"c{self.separator}{index}"), self) as f:
            write_all(f, memoryview(buf.view(np.uint8)))


def vector_chunk_files(arr: Any) -> VectorChunkFiles | None:
    """:class:`VectorChunkFiles` of an uncompressed 1-D zarr v3 array on a local store (its own root,
    not a group member), else None (write through zarr)."""
    try:
        layout = _layout(arr, ndim=1)
        if layout is None or layout[0] or type(arr.store).__name__ != "LocalStore":
            return None
        return VectorChunkFiles(str(arr.store.root), int(layout[2][0]), np.dtype(layout[3]), layout[5])
    except Exception:  # any unexpected metadata shape: use zarr
        return None


def decoded_access(arr: Any) -> DecodedChunks | None:
    """A :class:`DecodedChunks` for a local zarr v3 array whose chunks are little-endian bytes
    compressed by zstd or blosc alone (no checksum codec, no sharding), else None."""
    try:
        layout = _layout(arr)
        if layout is None or layout[0] not in _DECODERS or type(arr.store).__name__ != "LocalStore":
            return None
        codec, shape, chunks, dt, fill, sep = layout
        return DecodedChunks(str(arr.store.root), shape, chunks, np.dtype(dt), _fill_key(fill), sep, codec)
    except Exception:  # any unexpected metadata shape: use zarr
        return None


def _layout(arr: Any, ndim: int = 2, member: bool = False) -> tuple | None:
    """``(compressor, shape, chunks, dtype str, fill value, separator)`` of an ``ndim``-D zarr v3
    array of C-ordered native little-endian chunks under the default key encoding (``compressor``:
    ``""`` for none, else the class name of its one bytes-to-bytes codec), or None for any other
    layout. ``member``: the array may sit under a path of its store (a group's member)."""
    meta = arr.metadata
    if getattr(meta, "zarr_format", None) != 3 or len(arr.shape) != ndim:
        return None
    codecs = tuple(meta.codecs)
    if not 1 <= len(codecs) <= 2 or type(codecs[0]).__name__ != "BytesCodec":
        return None
    compressor = type(codecs[1]).__name__ if len(codecs) == 2 else ""
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
    if getattr(arr, "path", "") and not member:
        return None
    return compressor, tuple(arr.shape), tuple(grid.chunk_shape), dtype.str, meta.fill_value, cke.separator


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
