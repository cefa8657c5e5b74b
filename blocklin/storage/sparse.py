"""The sparse stored matrix: CSR row blocks in a zarr v3 group (format ``blocklin-csr``, version 1).

Layout (``docs/sparse.md`` is the specification; any zarr v3 reader opens it)::

    A.zarr/                 group; attributes: format, format_version, shape, dtype, nnz,
                            index_dtype, row_blocks, blocklin (provenance)
        indptr              int64 [m + 1]    global offsets: row i holds entries indptr[i]:indptr[i+1]
        indices             int32|int64 [nnz] column indices, sorted (and unique) within each row
        data                dtype [nnz]       the values
        row_blocks          int64 [b + 1]    row-block boundaries: block k is rows row_blocks[k]:row_blocks[k+1]

A row strip is a contiguous range of ``indices`` and ``data``, so reading one costs one range of
each array. :class:`SparseWriter` builds the group through the same
:class:`~blocklin.storage.atomic.AtomicOutput` as every output (a partial folder renamed into place
when complete), appending row blocks in row order and writing every chunk of every array once,
whole (chunk-sized buffers: no read-modify-write, bounded memory). :class:`SparseStore` reads it.
"""

from __future__ import annotations

import json
from array import array
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np
import zarr

from blocklin.errors import ConfigError, FormatError, InternalError, StoreNotFoundError, StoreReadError, explain
from blocklin.storage.atomic import AtomicOutput
from blocklin.storage.backend import backend, zarr_store
from blocklin.storage.location import Location, as_location
from blocklin.storage.rawchunks import vector_chunk_files
from blocklin.storage.space import writing
from blocklin.storage.zarr_store import _inside_partial, create_array, create_group, read_vector, uncommitted_message
from blocklin.storage.records import PENDING_RECORD

FORMAT_NAME = "blocklin-csr"
FORMAT_VERSION = 1
ARRAYS = ("indptr", "indices", "data", "row_blocks")
#: Entries per chunk of ``indices`` and ``data`` at most (1 Mi: 12 MiB of float64 values and int32
#: indices), and fewest.
MAX_ENTRY_CHUNK = 1 << 20
MIN_ENTRY_CHUNK = 1 << 10
#: Chunk copies of one 1-D write in flight: the writer's buffer, and zarr's encoded copy or (chunk files
#: written directly) the buffer a writer thread is writing while the next chunk fills.
_CHUNK_COPIES = 2


def entry_chunk_for(memory: int, entry_bytes: int = 12) -> int:
    """Entries per chunk of ``indices``/``data`` for a budget: a sixteenth of it over both arrays'
    buffers and write copies, between :data:`MIN_ENTRY_CHUNK` and :data:`MAX_ENTRY_CHUNK`."""
    fit = memory // (16 * _CHUNK_COPIES * max(1, entry_bytes))
    return int(min(MAX_ENTRY_CHUNK, max(MIN_ENTRY_CHUNK, 1 << max(0, int(fit).bit_length() - 1))))


def index_dtype_for(n: int) -> np.dtype:
    """Column indices: int32 while every column fits, else int64 (scipy's rule for its own arrays)."""
    return np.dtype(np.int32 if n <= np.iinfo(np.int32).max else np.int64)


def writer_bytes(entry_chunk: int, row_chunk: int, value_dtype: Any, index_dtype: Any) -> int:
    """Bytes a :class:`SparseWriter` holds: one chunk buffer of each array and its write copy."""
    per_entry = np.dtype(value_dtype).itemsize + np.dtype(index_dtype).itemsize
    return _CHUNK_COPIES * (entry_chunk * per_entry + row_chunk * 8)


def group_metadata(loc: Any) -> dict | None:
    """The parsed ``zarr.json`` when ``loc`` holds a zarr v3 group, else None (one small read: an array,
    nothing, or not a store blocklin can name). :func:`blocklin.open` reads it once and asks it both
    whether the group is a sparse matrix and whether it is a stored result."""
    try:
        loc = as_location(loc)
        raw = backend(loc).try_read("zarr.json")
    except Exception:  # noqa: BLE001 - not a store blocklin can name: not a group
        return None
    if raw is None or b'"group"' not in raw:
        return None
    try:
        meta = json.loads(raw)
    except ValueError:
        return None
    return meta if isinstance(meta, dict) and meta.get("node_type") == "group" else None


def sparse_group_attributes(meta: dict | None) -> dict | None:
    """The attributes of a group's metadata (:func:`group_metadata`) when it is a ``blocklin-csr`` group."""
    attrs = (meta or {}).get("attributes") or {}
    return attrs if meta is not None and attrs.get("format") == FORMAT_NAME else None


def sparse_attributes(loc: Any) -> dict | None:
    """The group attributes when ``loc`` holds a committed ``blocklin-csr`` group, else None (one small
    read: the root ``zarr.json``)."""
    return sparse_group_attributes(group_metadata(loc))


def is_sparse(loc: Any) -> bool:
    """Whether ``loc`` (a path, URL or Location) is a committed ``blocklin-csr`` group."""
    return sparse_attributes(loc) is not None


class _Appender:
    """Appends to a 1-D zarr array through a buffer of one chunk, writing each chunk once, whole.

    ``grow``: the array starts empty and is resized as chunks are written (``indices``, ``data``:
    their length is known only at the end); otherwise it has its final length (``indptr``).
    """

    def __init__(self, arr: Any, chunk: int, dtype: Any, *, grow: bool) -> None:
        self.arr, self.chunk, self.grow = arr, int(chunk), grow
        self.buf = np.empty(self.chunk, dtype)
        self.fill = 0
        self.flushed = 0  # elements written to the array
        # an uncompressed local array's chunks go straight to their files, and a growing array is
        # resized once, when it is closed: through zarr each chunk cost a copy and a metadata rewrite
        # (0.8 s of a 4 s conversion of 2x10^7 entries)
        self.files = vector_chunk_files(arr)
        # chunk files: written by a thread of their own while the next chunk fills (the two buffers
        # writer_bytes counts); the sort and the writes overlapped (0.46 s of writes in a 1.8 s conversion)
        self.spare = np.empty(self.chunk, dtype) if self.files is not None else None
        self.pending: Future | None = None
        self.thread = ThreadPoolExecutor(1, thread_name_prefix="blocklin-sparse-writer") \
            if self.files is not None else None

    @property
    def count(self) -> int:
        return self.flushed + self.fill

    def append(self, values: np.ndarray) -> None:
        values = np.asarray(values)
        pos = 0
        while pos < values.size:
            take = min(self.chunk - self.fill, values.size - pos)
            self.buf[self.fill:self.fill + take] = values[pos:pos + take]
            self.fill += take
            pos += take
            if self.fill == self.chunk:
                self._flush()

    def _flush(self) -> None:
        if self.fill == 0:
            return
        end = self.flushed + self.fill
        if self.files is not None:
            self.buf[self.fill:] = 0  # the fill value: the last chunk is stored whole, as zarr stores it
            self.wait()  # the spare buffer's write finished: it takes the next chunk
            self.pending = self.thread.submit(self._write_chunk, self.flushed // self.chunk, self.buf)
            self.buf, self.spare = self.spare, self.buf
        else:
            with writing(self.arr):
                if self.grow and self.arr.shape[0] < end:
                    self.arr.resize((end,))
                self.arr[self.flushed:end] = self.buf[:self.fill]
        self.flushed, self.fill = end, 0

    def _write_chunk(self, index: int, buf: np.ndarray) -> None:
        with writing(self.arr):
            self.files.write(index, buf)

    def wait(self) -> None:
        """The chunk being written is written (its error raised here)."""
        pending, self.pending = self.pending, None
        if pending is not None:
            pending.result()

    def close(self) -> None:
        self._flush()
        self.stop()
        if self.files is not None and self.grow and self.arr.shape[0] < self.flushed:
            with writing(self.arr):
                self.arr.resize((self.flushed,))

    def stop(self) -> None:
        """Wait for the chunk being written (raising its error) and end the writer thread."""
        try:
            self.wait()
        finally:
            if self.thread is not None:
                self.thread.shutdown(wait=True)


class SparseWriter:
    """A ``blocklin-csr`` group built atomically, row block after row block.

    Parameters
    ----------
    path : path or Location
        The output (a local path: the layout grows its arrays as entries arrive, which object
        stores' deferred metadata does not allow yet).
    shape : (int, int)
    dtype : dtype
        Value dtype (float or integer).
    inputs, overwrite : as :class:`~blocklin.storage.atomic.AtomicOutput`
    entry_chunk : int
        Entries per chunk of ``indices`` and ``data`` (:func:`entry_chunk_for`).
    row_chunk : int
        Offsets per chunk of ``indptr``.
    """

    def __init__(self, path: Any, shape: tuple[int, int], dtype: Any, *, inputs: list = (), overwrite: bool = False,
                 entry_chunk: int = MAX_ENTRY_CHUNK, row_chunk: int = MAX_ENTRY_CHUNK, name: str = "out") -> None:
        loc = as_location(path, name=name)
        if not loc.is_local:
            raise ConfigError(explain(name, "sparse outputs are written to local paths (their arrays grow as "
                                      "entries arrive)", loc.url, "convert to a local A.zarr, then copy the "
                                      "folder to the object store"))
        self.shape = (int(shape[0]), int(shape[1]))
        self.dtype = np.dtype(dtype)
        self.index_dtype = index_dtype_for(self.shape[1])
        self.entry_chunk, self.row_chunk = int(entry_chunk), max(1, min(int(row_chunk), self.shape[0] + 1))
        self._out = AtomicOutput(loc, inputs=list(inputs), overwrite=overwrite, name=name)
        try:
            part = self._out.partial
            create_group(part)
            m = self.shape[0]
            self._indptr = _Appender(create_array(part / "indptr", shape=(m + 1,), dtype=np.int64,
                                                  chunks=(self.row_chunk,), codec="none"),
                                     self.row_chunk, np.int64, grow=False)
            self._indices = _Appender(create_array(part / "indices", shape=(0,), dtype=self.index_dtype,
                                                   chunks=(self.entry_chunk,), codec="none"),
                                      self.entry_chunk, self.index_dtype, grow=True)
            self._data = _Appender(create_array(part / "data", shape=(0,), dtype=self.dtype,
                                                chunks=(self.entry_chunk,), codec="none"),
                                   self.entry_chunk, self.dtype, grow=True)
        except BaseException:
            self._out.abort()
            raise
        self._bounds = array("q", [0])
        self.nnz = 0

    @property
    def next_row(self) -> int:
        return self._bounds[-1]

    @property
    def n_blocks(self) -> int:
        return len(self._bounds) - 1

    def write_rows(self, r0: int, r1: int, indptr: np.ndarray, indices: np.ndarray, data: np.ndarray) -> None:
        """Append rows ``r0:r1`` (one row block): ``indptr`` local (``r1 - r0 + 1`` offsets from 0),
        ``indices`` sorted within each row, ``data`` the values."""
        if r0 != self.next_row or r1 < r0 or r1 > self.shape[0] or len(indptr) != r1 - r0 + 1 or \
                int(indptr[-1]) != len(indices) or len(indices) != len(data):
            raise InternalError(f"SparseWriter.write_rows({r0}, {r1}) after row {self.next_row} with "
                                f"{len(indptr)} offsets, {len(indices)} indices, {len(data)} values")
        self._indptr.append(np.asarray(indptr[:-1], np.int64) + self.nnz)
        self._indices.append(indices)
        self._data.append(data)
        self.nnz += len(indices)
        self._bounds.append(r1)

    def commit(self, *, operation: str = "convert", plan: dict | None = None, params: dict | None = None,
               report: dict | None = None) -> Location:
        """Finish the arrays, record the layout's attributes and publish the group."""
        if self.next_row != self.shape[0]:
            raise InternalError(f"SparseWriter.commit after row {self.next_row} of {self.shape[0]}")
        self._indptr.append(np.array([self.nnz], np.int64))
        for app in (self._indptr, self._indices, self._data):
            app.close()
        part = self._out.partial
        bounds = np.frombuffer(self._bounds, np.int64)
        rb = create_array(part / "row_blocks", shape=(len(bounds),), dtype=np.int64, chunks=(max(1, len(bounds)),),
                          codec="none")
        rb[:] = bounds
        group = zarr.open_group(store=zarr_store(part), mode="r+")
        group.attrs.update(self.attributes())
        return self._out.commit(operation, plan=plan, params=params, report=report)

    def attributes(self) -> dict:
        rows = np.diff(np.frombuffer(self._bounds, np.int64))
        return {"format": FORMAT_NAME, "format_version": FORMAT_VERSION, "shape": list(self.shape),
                "dtype": self.dtype.name, "nnz": int(self.nnz), "index_dtype": self.index_dtype.name,
                "row_blocks": self.n_blocks, "max_block_rows": int(rows.max()) if rows.size else 0,
                "entry_chunk": self.entry_chunk}

    def abort(self) -> None:
        for name in ("_indptr", "_indices", "_data"):  # no chunk write left to race the removal
            try:
                app = getattr(self, name, None)
                if app is not None:
                    app.stop()
            except Exception:  # noqa: BLE001 - the failure being handled is the one to report
                pass
        self._out.abort()


class SparseStore:
    """Reads a committed ``blocklin-csr`` group: metadata, row ranges as CSR pieces.

    Raises
    ------
    StoreNotFoundError, StoreReadError, UncommittedOutputError, FormatError
        Missing path, not a sparse group (or an unfinished output), a format version this
        blocklin does not read, or arrays that disagree with the attributes.
    """

    def __init__(self, path: Any, *, storage_options: dict | None = None, name: str = "path") -> None:
        self.location = loc = as_location(path, storage_options, name=name)
        be = backend(loc)
        if loc.is_local and _inside_partial(loc.url) or be.try_read(PENDING_RECORD) is not None:
            from blocklin.errors import UncommittedOutputError

            raise UncommittedOutputError(uncommitted_message(loc, name))
        attrs = sparse_attributes(loc)
        if attrs is None:
            if not be.exists(""):
                raise StoreNotFoundError(explain(name, "must name an existing sparse matrix (a blocklin-csr group)",
                                                 f"{loc.url!r}, which does not exist", "check the path, or "
                                                 "create it with blocklin convert A.mtx A.zarr"))
            raise StoreReadError(explain(name, f"must be a zarr group with attribute format={FORMAT_NAME!r}",
                                         repr(loc.url), "open dense arrays with blocklin.open, or convert the "
                                         "sparse file again"))
        version = attrs.get("format_version")
        if version != FORMAT_VERSION:
            raise FormatError(explain(name, f"{FORMAT_NAME} format_version must be {FORMAT_VERSION} for this "
                                      "blocklin", f"format_version {version!r} in {loc.url!r}",
                                      "upgrade blocklin, or convert the source file again"))
        self.attrs = attrs
        self.shape = tuple(int(s) for s in attrs["shape"])
        self.dtype = np.dtype(attrs["dtype"])
        self.nnz = int(attrs["nnz"])
        group = zarr.open_group(store=zarr_store(loc, read_only=True), mode="r")
        m = self.shape[0]
        try:
            self.indptr, self.indices, self.data = group["indptr"], group["indices"], group["data"]
            blocks = group["row_blocks"]
            # the attributes are the matrix: an append extends the arrays first and commits them last
            # (storage.sparse_append), so an array may be longer than they say; the rest is not read
            b = int(attrs.get("row_blocks", blocks.shape[0] - 1))
            self.row_blocks = np.asarray(blocks[: b + 1], np.int64) if blocks.shape[0] >= b + 1 else np.empty(0)
        except KeyError as exc:
            raise FormatError(explain(name, f"a {FORMAT_NAME} group must hold the arrays {ARRAYS}",
                                      f"{exc} missing in {loc.url!r}", "convert the source file again")) from None
        if self.indptr.shape[0] < m + 1 or self.indices.shape[0] < self.nnz or self.data.shape[0] < self.nnz \
                or self.row_blocks.size < 1 or self.row_blocks[0] != 0 or self.row_blocks[-1] != m:
            raise FormatError(explain(name, "the arrays must hold what the attributes say (indptr m+1, indices "
                                      "and data nnz, row_blocks from 0 to m)",
                                      f"indptr {self.indptr.shape}, indices {self.indices.shape}, data "
                                      f"{self.data.shape}, nnz {self.nnz}, m {m} in {loc.url!r}",
                                      "the store is damaged; convert the source file again"))
        self.index_dtype = np.dtype(self.indices.dtype)
        self._block_ends: np.ndarray | None = None

    def block_ends(self) -> np.ndarray:
        """``indptr`` at the row-block boundaries (int64): the entries before each block. Read once, on
        first use: products ask for it every call, and each small zarr read costs milliseconds."""
        if self._block_ends is None:
            self._block_ends = np.asarray(self.indptr.get_coordinate_selection(self.row_blocks), np.int64)
        return self._block_ends

    def read_rows(self, r0: int, r1: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Rows ``r0:r1`` as ``(indptr from 0, indices, data)``."""
        ptr = read_vector(self.indptr, r0, r1 + 1).astype(np.int64, copy=False)
        p0, p1 = int(ptr[0]), int(ptr[-1])
        if p1 < p0 or p1 > self.nnz:
            raise FormatError(explain("path", "indptr must be non-decreasing and end at nnz",
                                      f"offsets {p0}..{p1} for rows {r0}:{r1}, nnz {self.nnz} in "
                                      f"{self.location.url!r}", "the store is damaged; convert the source again"))
        # the ranges' bytes only, straight from the chunk files (zarr would hold every chunk they touch)
        idx, val = read_vector(self.indices, p0, p1), read_vector(self.data, p0, p1)
        return ptr - p0, idx, val

    def bytes_on_disk(self) -> int:
        return int(backend(self.location).size(""))


__all__ = ["ARRAYS", "FORMAT_NAME", "FORMAT_VERSION", "SparseStore", "SparseWriter", "entry_chunk_for",
           "index_dtype_for", "is_sparse", "sparse_attributes", "writer_bytes"]
