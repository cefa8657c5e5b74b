"""Sparse files to and from the ``blocklin-csr`` layout (:mod:`blocklin.storage.sparse`) in bounded memory.

Coordinate input (a Matrix Market ``coordinate`` file, a SciPy ``save_npz`` file in any of its
formats, an HDF5 CSC group of :mod:`blocklin.storage.sparse_hdf5`) comes in any order, so it goes
through an external sort by row block (an HDF5 CSR group is in row order already and streams its
row blocks instead):

1. **Runs.** The entries are parsed in batches and each batch is bucketed by row block (rows
   ``k R : (k + 1) R``, ``R`` planned from the announced entries and the budget) and appended to that
   block's run file in a work folder under the temp dir (24 bytes an entry: row, column, value).
2. **Blocks.** Each run is loaded alone, sorted by (row, column), its duplicates summed (as
   :func:`scipy.io.mmread`'s COO to CSR conversion does), and appended to the output as one row
   block. A run larger than the budget (skewed rows) is bucketed again into narrower row ranges,
   which become row blocks of their own (the layout's ``row_blocks`` records them).

The work folder goes when the conversion ends, however it ends; the output appears only when
complete. Export (``.mtx`` coordinate general, ``.npz`` by :func:`scipy.sparse.save_npz`) streams the
row blocks (the ``.npz`` is refused when the matrix exceeds the budget: SciPy writes it from memory).
"""

from __future__ import annotations

import dataclasses
import os
import time
import uuid
import zipfile
from typing import Any, Iterator

import numpy as np

from blocklin._memory import reused_allocations
from blocklin.config import format_size, resolve, size_hint
from blocklin.errors import (
    BudgetError, ConfigError, DTypeError, FormatError, InternalError, NonFiniteError, explain,
)
from blocklin.progress import make_progress
from blocklin.storage.formats.base import output_dtype
from blocklin.storage.location import as_location
from blocklin.storage.space import raise_naming
from blocklin.storage.sparse import (
    MIN_ENTRY_CHUNK, SparseStore, SparseWriter, entry_chunk_for, index_dtype_for, writer_bytes,
)

#: Bytes per entry while a run is sorted and summed: the loaded records (24), the sort key and
#: permutation (16), the gathered values (8), the records' positions (8) and the duplicates' starts
#: (8); the sums and columns are written over the records (``_SortSpace``, :func:`_sorted_block`);
#: with slack.
SORT_BYTES_PER_ENTRY = 72
#: Bytes per row of a row block: local offsets, row counts and their cumulative sum.
ROW_BYTES = 32
#: Bytes per parsed entry of one batch in the run step (values as parsed, the reader's row, column
#: and value buffers, block numbers, the bucketing permutation and the record buffer), beyond the
#: parser's own.
BATCH_BYTES_PER_ENTRY = 200
#: Largest block of Matrix Market text parsed at once (:meth:`MtxSource.fit_budget`).
MAX_PARSE_BLOCK = 4 << 20
#: Entries per batch of a SciPy ``.npz`` source.
NPZ_BATCH = 1 << 15
#: Fewest entries a run must be able to hold.
MIN_BLOCK_ENTRIES = 1 << 12
#: Run files kept open at once while bucketing.
_OPEN_RUNS = 64


def run_dtype(value_dtype: Any, *, values: bool = True) -> np.dtype:
    """One entry of a run file: row and column (int64), value. When ``values`` is False (every value
    is 1, as in a ``pattern`` file) only the linear index ``k = row * n + column`` (int64): a third
    of the bytes to gather, write and read, the sort's key as it is, and the duplicates counted."""
    if not values:
        return np.dtype([("k", "<i8")])
    return np.dtype([("r", "<i8"), ("c", "<i8"), ("v", np.dtype(value_dtype).newbyteorder("<"))])


@dataclasses.dataclass(frozen=True)
class SortPlan:
    """The external sort's sizes for one budget.

    Attributes
    ----------
    rows_per_block : int
        Rows of a first-pass row block (``R``).
    block_entries : int
        Most entries one run may hold to be sorted in memory (larger runs are split by rows).
    entry_chunk, row_chunk : int
        Chunks of the output's ``indices``/``data`` and ``indptr`` arrays.
    batch_bytes : int
        The run step's peak (a parsed batch and its buckets).
    peak_memory : int
        The larger of the two steps.
    """

    rows_per_block: int
    block_entries: int
    entry_chunk: int
    row_chunk: int
    batch_bytes: int
    peak_memory: int
    memory: int

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def plan_sort(shape: tuple[int, int], entries: int, value_dtype: Any, memory: int, *, batch_entries: int,
              parse_bytes: int = 0) -> SortPlan:
    """Plan the external sort of ``entries`` (announced, mirrored images included) into row blocks.

    Half of what the budget leaves after the writer's buffers holds the entries of one run; row
    blocks are sized for half of that on average, so runs of rows denser than the average still fit.

    Raises
    ------
    BudgetError
        The budget cannot hold the writer's buffers, a parsed batch and a run of a few rows.
    """
    m, n = (int(s) for s in shape)
    vdt = np.dtype(value_dtype)
    entry_chunk = entry_chunk_for(memory, vdt.itemsize + index_dtype_for(n).itemsize)
    row_chunk = entry_chunk
    # zarr stores an edge chunk whole: a small matrix gets chunks no larger than it needs
    entry_chunk = min(entry_chunk, max(MIN_ENTRY_CHUNK, 1 << max(0, int(entries - 1).bit_length())))
    row_chunk = min(row_chunk, max(MIN_ENTRY_CHUNK, 1 << int(m).bit_length()))
    fixed = writer_bytes(entry_chunk, row_chunk, vdt, index_dtype_for(n))
    batch = parse_bytes + batch_entries * BATCH_BYTES_PER_ENTRY + fixed
    room = memory - fixed
    # The minimum does not depend on the budget it is checked at (the writer's chunks grow with the
    # budget, to at most a tenth of it), so the budget it names suffices.
    base = max(parse_bytes + batch_entries * BATCH_BYTES_PER_ENTRY,
               SORT_BYTES_PER_ENTRY * MIN_BLOCK_ENTRIES + ROW_BYTES)
    need = base * 4 // 3
    if memory < need:
        hint = size_hint(need)
        raise BudgetError(explain("memory", "the sparse conversion needs a parsed batch of "
                                  f"{batch_entries} entries, a sort of at least {MIN_BLOCK_ENTRIES} entries and the "
                                  f"output writer's buffers", f"memory={format_size(memory)}",
                                  f"raise the budget to at least {hint} (--memory {hint})"),
                          minimum=need)
    per_row = max(entries, 1) / max(m, 1)
    # row blocks hold half a run on average (runs of denser rows still fit), their offsets a quarter
    rows_cap = max(1, room // 4 // ROW_BYTES)
    block_entries = max(MIN_BLOCK_ENTRIES, (room - min(rows_cap, max(m, 1)) * ROW_BYTES) // SORT_BYTES_PER_ENTRY)
    rows = int(min(max(m, 1), rows_cap, max(1, block_entries / 2 / per_row)))
    sort_peak = fixed + min(block_entries, max(entries, MIN_BLOCK_ENTRIES)) * SORT_BYTES_PER_ENTRY + rows * ROW_BYTES
    return SortPlan(rows_per_block=rows, block_entries=int(block_entries), entry_chunk=entry_chunk,
                    row_chunk=row_chunk, batch_bytes=int(batch), peak_memory=int(max(batch, sort_peak)),
                    memory=int(memory))


# -- sources: batches of checked, 0-based entries ---------------------------------------------------

@dataclasses.dataclass
class Batch:
    """Entries of one batch: ``rows``, ``cols`` (0-based int64), ``vals``; the first ``stored`` are in
    source order (``where(i)`` names the position of entry ``i``), the rest mirrored images."""

    rows: np.ndarray
    cols: np.ndarray
    vals: np.ndarray
    stored: int
    where: Any


class SparseSource:
    """What :func:`write_sparse` reads: ``shape``, ``dtype``, ``entries`` (an upper bound: mirrored
    images counted), ``batch_entries`` and ``parse_bytes`` (what one batch and the parser hold, for the
    plan), ``bytes_read``, :meth:`batches` and :meth:`close`."""

    kind = "source"

    def fit_budget(self, memory: int) -> None:
        """Size the batches for a budget of ``memory`` bytes before the plan reads ``batch_entries``
        (a source whose batches have one size keeps them)."""


class MtxSource(SparseSource):
    """A coordinate Matrix Market file as batches (:meth:`MtxReader.entries`); values as float64."""

    kind = "mtx"

    def __init__(self, reader: Any) -> None:
        self.reader = reader
        self.shape = reader.shape
        self.dtype = np.dtype(np.float64)
        self.entries = reader.nnz * (1 if reader.symmetry == "general" else 2)
        from blocklin.storage.formats.text_util import PARSE_BATCH_BYTES

        self.batch_entries = 2 * max(1, PARSE_BATCH_BYTES // 32)
        self.parse_bytes = reader.overhead_bytes
        #: Every value is 1 (a pattern file; skew-symmetric mirrors are -1): the runs hold no values.
        self.unit_values = reader.field == "pattern" and reader.symmetry in ("general", "symmetric")

    def fit_budget(self, memory: int) -> None:
        """Parse blocks of up to :data:`MAX_PARSE_BLOCK` bytes of text where a 64th of the budget holds one
        (fewer, longer calls of the C++ reader and of the bucketing), else the reader's 1 MiB."""
        from blocklin.storage.formats.text_util import PARSE_BATCH_BYTES

        block = PARSE_BATCH_BYTES
        while 2 * block <= min(MAX_PARSE_BLOCK, memory // 64):
            block *= 2
        self.reader.use_blocks(block)
        self.batch_entries = 2 * max(1, block // 32)
        self.parse_bytes = self.reader.overhead_bytes

    @property
    def bytes_read(self) -> int:
        return self.reader.bytes_read

    def batches(self) -> Iterator[Batch]:
        for first, r, c, v, k in self.reader.entries():
            yield Batch(r, c, v.astype(self.dtype, copy=False), k, lambda i, f=first: f"line {f + i}")

    def close(self) -> None:
        self.reader.close()


class _NpyStream:
    """One ``.npy`` member of a zip read forward in pieces (never whole)."""

    def __init__(self, zf: zipfile.ZipFile, name: str, what: str) -> None:
        from blocklin.storage.formats.npy import _read_header

        self.fh = zf.open(name)
        shape, fortran, dtype = _read_header(self.fh, what)
        if len(shape) != 1:
            raise FormatError(explain(what, "must be a 1-D array", f"shape {shape}", "write it with "
                                      "scipy.sparse.save_npz"))
        self.size, self.dtype, self.what, self.pos = int(shape[0]), np.dtype(dtype), what, 0
        self.bytes_read = 0

    def read(self, count: int) -> np.ndarray:
        count = min(count, self.size - self.pos)
        raw = self.fh.read(count * self.dtype.itemsize)
        if len(raw) != count * self.dtype.itemsize:
            raise FormatError(explain(self.what, "must hold the values its header announces",
                                      f"{self.pos + len(raw) // self.dtype.itemsize} of {self.size}",
                                      "the file is truncated; write it again with scipy.sparse.save_npz"))
        self.pos += count
        self.bytes_read += len(raw)
        return np.frombuffer(raw, self.dtype)

    def close(self) -> None:
        self.fh.close()


def _small_member(zf: zipfile.ZipFile, name: str) -> np.ndarray:
    with zf.open(name) as fh:
        return np.lib.format.read_array(fh, allow_pickle=False)


def is_scipy_npz(path: str) -> bool:
    """Whether ``path`` is a zip written by :func:`scipy.sparse.save_npz` (it names its ``format``)."""
    try:
        with zipfile.ZipFile(path) as zf:
            names = set(zf.namelist())
    except (OSError, zipfile.BadZipFile):
        return False
    return {"format.npy", "shape.npy", "data.npy"} <= names


class NpzSource(SparseSource):
    """A SciPy ``save_npz`` file (csr, csc or coo) as batches of entries, read forward in pieces."""

    kind = "npz"
    #: What messages about the entries name (:class:`~blocklin.storage.sparse_hdf5.Hdf5SparseSource`
    #: reads HDF5 groups through the same batches).
    label = "npz input"

    def __init__(self, path: str) -> None:
        self.path = path
        try:
            self.zf = zipfile.ZipFile(path)
        except (OSError, zipfile.BadZipFile) as exc:
            raise FormatError(explain("npz input", "must be a zip archive written by scipy.sparse.save_npz",
                                      f"{path!r} ({exc})", "write it with scipy.sparse.save_npz")) from None
        try:
            fmt = _small_member(self.zf, "format.npy").item()
            self.format = (fmt.decode("ascii", "replace") if isinstance(fmt, bytes) else str(fmt)).lower()
            shape = tuple(int(s) for s in _small_member(self.zf, "shape.npy"))
        except (KeyError, ValueError) as exc:
            self.zf.close()
            raise FormatError(explain("npz input", "must hold format.npy and shape.npy (scipy.sparse.save_npz)",
                                      f"{path!r} ({exc})", "write it with scipy.sparse.save_npz")) from None
        if self.format not in ("csr", "csc", "coo") or len(shape) != 2 or min(shape) < 0:
            self.zf.close()
            raise FormatError(explain("npz input", "must be a 2-D csr, csc or coo matrix",
                                      f"format {self.format!r}, shape {shape}", "convert it first: "
                                      "scipy.sparse.save_npz(path, x.tocsr())"))
        self.shape = shape
        names = ("row", "col", "data") if self.format == "coo" else ("indptr", "indices", "data")
        self._streams = []
        try:
            for nm in names:
                self._streams.append(_NpyStream(self.zf, f"{nm}.npy", f"npz member {nm}"))
        except KeyError as exc:
            self.close()
            raise FormatError(explain("npz input", f"a {self.format} file must hold {names}", f"{exc}",
                                      "write it with scipy.sparse.save_npz")) from None
        except BaseException:
            self.close()
            raise
        data = self._streams[2]
        if data.dtype.kind not in "biufc":
            self.close()
            raise DTypeError(explain("npz member data", "must hold numbers", f"dtype {data.dtype}",
                                     "convert the values to a numeric dtype"))
        self.dtype = data.dtype.newbyteorder("=")
        self.entries = data.size
        self.batch_entries = NPZ_BATCH
        self.parse_bytes = 0
        a, b = self._streams[0], self._streams[1]
        major = self.shape[0] if self.format == "csr" else self.shape[1]
        bad = (b.size != data.size) or (a.size != (data.size if self.format == "coo" else major + 1))
        if bad:
            self.close()
            raise FormatError(explain("npz input", f"the {names} arrays must have consistent lengths",
                                      f"{a.size}, {b.size}, {data.size} for shape {self.shape}",
                                      "the file is damaged; write it again with scipy.sparse.save_npz"))

    @property
    def bytes_read(self) -> int:
        return sum(s.bytes_read for s in self._streams)

    def _check_range(self, what: str, idx: np.ndarray, limit: int, pos: int) -> None:
        bad = np.flatnonzero((idx < 0) | (idx >= limit))
        if bad.size:
            raise FormatError(explain(self.label, f"{what} indices must lie in 0..{limit - 1}",
                                      f"{idx[bad[0]]} at entry {pos + int(bad[0])}",
                                      "fix the matrix and save it again"))

    def batches(self) -> Iterator[Batch]:
        m, n = self.shape
        a, b, data = self._streams
        if self.format == "coo":
            pos = 0
            while pos < data.size:
                k = min(NPZ_BATCH, data.size - pos)
                r, c, v = a.read(k).astype(np.int64), b.read(k).astype(np.int64), data.read(k)
                self._check_range("row", r, m, pos)
                self._check_range("column", c, n, pos)
                yield Batch(r, c, v.astype(self.dtype, copy=False), k, lambda i, p=pos: f"entry {p + i}")
                pos += k
            return
        major_n = m if self.format == "csr" else n
        minor_n = n if self.format == "csr" else m
        prev = int(a.read(1)[0]) if a.size else 0
        if prev != 0:
            raise FormatError(explain(self.label, "indptr must start at 0", str(prev), "save the matrix again"))
        i = 0  # next major index
        pos = 0
        while i < major_n:
            ptr = np.concatenate([[prev], a.read(NPZ_BATCH).astype(np.int64)])
            if np.any(np.diff(ptr) < 0) or ptr[-1] > data.size:
                raise FormatError(explain(self.label, "indptr must be non-decreasing and end at nnz",
                                          f"offsets up to {ptr.max()} near index {i}, nnz {data.size}",
                                          "the file is damaged; save the matrix again"))
            majors = np.arange(i, i + len(ptr) - 1)
            while pos < ptr[-1]:
                k = int(min(NPZ_BATCH, ptr[-1] - pos))
                idx, v = b.read(k).astype(np.int64), data.read(k)
                self._check_range("row" if self.format == "csc" else "column", idx, minor_n, pos)
                maj = majors[np.searchsorted(ptr, np.arange(pos, pos + k), side="right") - 1]
                r, c = (maj, idx) if self.format == "csr" else (idx, maj)
                yield Batch(r, c, v.astype(self.dtype, copy=False), k, lambda j, p=pos: f"entry {p + j}")
                pos += k
            i += len(ptr) - 1
            prev = int(ptr[-1])
        if pos != data.size:
            raise FormatError(explain(self.label, "indptr must end at nnz", f"{pos}, nnz {data.size}",
                                      "the file is damaged; save the matrix again"))

    def close(self) -> None:
        for s in getattr(self, "_streams", []):
            s.close()
        self.zf.close()


class ScipySource(SparseSource):
    """An in-memory SciPy sparse matrix (or array) as batches of its COO entries."""

    kind = "scipy"

    def __init__(self, x: Any) -> None:
        self.x = x.tocoo(copy=False) if hasattr(x, "tocoo") else x
        self.shape = tuple(int(s) for s in self.x.shape)
        self.dtype = np.dtype(self.x.dtype)
        self.entries = int(self.x.nnz)
        self.batch_entries = NPZ_BATCH
        self.parse_bytes = 0
        self.bytes_read = 0

    def batches(self) -> Iterator[Batch]:
        coo = self.x
        for p in range(0, self.entries, NPZ_BATCH):
            q = min(self.entries, p + NPZ_BATCH)
            yield Batch(np.asarray(coo.row[p:q], np.int64), np.asarray(coo.col[p:q], np.int64),
                        np.asarray(coo.data[p:q]), q - p, lambda i, s=p: f"entry {s + i}")

    def close(self) -> None:
        pass


# -- the external sort -----------------------------------------------------------------------------

class _Runs:
    """The run files of one sort in its work folder, a few kept open for appends."""

    def __init__(self, folder: str, rec: np.dtype) -> None:
        self.folder, self.rec = folder, rec
        self._open: dict[str, Any] = {}
        self.count = 0

    def path(self, name: str) -> str:
        return os.path.join(self.folder, name)

    def append(self, name: str, records: np.ndarray) -> None:
        fh = self._open.get(name)
        if fh is None:
            if len(self._open) >= _OPEN_RUNS:
                self._open.pop(next(iter(self._open))).close()
            fh = self._open[name] = open(self.path(name), "ab")
        records.tofile(fh)

    def close_all(self) -> None:
        for fh in self._open.values():
            fh.close()
        self._open.clear()

    def size(self, name: str) -> int:
        try:
            return os.path.getsize(self.path(name)) // self.rec.itemsize
        except FileNotFoundError:
            return 0

    def load(self, name: str, start: int = 0, count: int = -1) -> np.ndarray:
        p = self.path(name)
        if not os.path.exists(p):
            return np.empty(0, self.rec)
        return np.fromfile(p, self.rec, count=count, offset=start * self.rec.itemsize)

    def load_into(self, name: str, out: np.ndarray) -> np.ndarray:
        """The whole run ``name`` read into ``out`` (exactly its size)."""
        if out.size:
            with open(self.path(name), "rb") as fh:
                got = fh.readinto(memoryview(out.view(np.uint8)))
            if got != out.nbytes:
                raise InternalError(f"run {name}: {got} of {out.nbytes} bytes read")
        return out

    def remove(self, name: str) -> None:
        fh = self._open.pop(name, None)
        if fh is not None:
            fh.close()
        try:
            os.unlink(self.path(name))
        except FileNotFoundError:
            pass


def _bucket_order(keys: np.ndarray) -> tuple[np.ndarray, list[tuple[int, int, int]]]:
    """The stable order of ``keys`` and each key's ``(key, start, end)`` in it."""
    hi = int(keys.max())
    if int(keys.min()) >= 0 and hi < 1 << 16:
        # NumPy's stable sort of 8- and 16-bit integers is a radix sort: several times faster
        keys = keys.astype(np.uint8 if hi < 1 << 8 else np.uint16)
    order = np.argsort(keys, kind="stable")
    ks = keys[order]
    starts = np.flatnonzero(np.concatenate([[True], ks[1:] != ks[:-1]]))
    ends = np.append(starts[1:], len(ks))
    return order, [(int(ks[a]), a, b) for a, b in zip(starts.tolist(), ends.tolist())]


def _append_parts(runs: _Runs, prefix: str, recs: np.ndarray, parts: list[tuple[int, int, int]]) -> None:
    for key, a, b in parts:
        runs.append(f"{prefix}-{key}", recs[a:b])


def _bucket(runs: _Runs, prefix: str, rec: np.ndarray, keys: np.ndarray) -> None:
    """Append the records to the runs ``prefix-KEY`` of their ``keys`` (in source order within each)."""
    if rec.size == 0:
        return
    order, parts = _bucket_order(keys)
    # gathered as opaque items of the record's size: a copy each, not a field-by-field one
    whole = np.dtype((np.void, rec.dtype.itemsize))
    recs = np.ascontiguousarray(rec).view(whole)[order].view(rec.dtype)
    del order
    _append_parts(runs, prefix, recs, parts)


def _bucket_batch(runs: _Runs, batch: Batch, rpb: int, buffer: list, n: int) -> None:
    """:func:`_bucket` of a batch by row block, its records gathered in bucket order straight from the
    batch's arrays into ``buffer[0]`` (kept from batch to batch: the process maps large arrays afresh,
    and their page faults would cost more than the gathers); linear-index records (:func:`run_dtype`)
    from ``row * n + column``, formed in ``buffer[2]``."""
    count = len(batch.rows)
    if count == 0:
        return
    if buffer[0] is None or len(buffer[0]) < count:
        buffer[0] = np.empty(count, runs.rec)
    rec = buffer[0][:count]
    keys = buffer[1] if buffer[1] is not None and len(buffer[1]) >= count else np.empty(count, np.int64)
    buffer[1] = keys
    keys = np.floor_divide(batch.rows, rpb, out=keys[:count])
    order, parts = _bucket_order(keys)
    if rec.dtype.names == ("k",):
        if buffer[2] is None or len(buffer[2]) < count:
            buffer[2] = np.empty(count, np.int64)
        lin = np.multiply(batch.rows, n, out=buffer[2][:count])
        lin += batch.cols
        np.take(lin, order, out=rec.view(np.int64), mode="clip")
        del order
        _append_parts(runs, "run", rec, parts)
        return
    for field, src in (("r", batch.rows), ("c", batch.cols), ("v", batch.vals))[:len(rec.dtype.names)]:
        if src.dtype == rec.dtype[field] and src.dtype.itemsize == keys.itemsize:
            # gathered into the spent block numbers, then copied into the field: both together are
            # three times faster than a gather straight into the records' strided field
            rec[field] = np.take(src, order, out=keys.view(src.dtype), mode="clip")
        else:  # a cast (values narrowed to the output dtype)
            rec[field] = src[order]
    del order
    _append_parts(runs, "run", rec, parts)


def _stable_argsort(key: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``np.argsort(key, kind="stable")`` and the sorted keys, by the faster unstable sort: the positions
    of each run of equal keys (duplicate entries, usually few) are put back in ascending order."""
    order = np.argsort(key)
    ks = key[order]
    tie = np.flatnonzero(ks[1:] == ks[:-1])
    if tie.size:
        idx = np.union1d(tie, tie + 1)  # every position in a run of equal keys
        sub = order[idx]
        order[idx] = sub[np.lexsort((sub, ks[idx]))]
    return order, ks


class _SortSpace:
    """The buffers of one run's sort (records, keys, order, values, positions), kept from run to run:
    the process maps every large array afresh (:mod:`blocklin._memory`), and a run's page faults in
    new arrays would cost more than its sort."""

    def __init__(self, rec: np.dtype, value_dtype: Any = None) -> None:
        self.dtype, self.size = rec, 0
        self.value_dtype = rec["v"] if "v" in rec.names else np.dtype(value_dtype)
        self.rec = self.key = self.order = self.vals = self.positions = None

    def reserve(self, count: int) -> "_SortSpace":
        if count > self.size or self.rec is None:
            self.release()
            self.rec = np.empty(count, self.dtype)
            self.key, self.order = np.empty(count, np.int64), np.empty(count, np.int64)
            self.vals = np.empty(count, self.value_dtype)
            self.positions = np.arange(count, dtype=np.int64)
            self.size = count
        return self

    def release(self) -> None:
        self.rec = self.key = self.order = self.vals = self.positions = None
        self.size = 0


def _sorted_block(rec: np.ndarray, r0: int, r1: int, n: int, index_dtype: np.dtype,
                  space: _SortSpace | None = None, value_dtype: Any = np.float64
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """CSR of rows ``r0:r1`` from their records in any order: sorted by (row, column), duplicates summed
    (in source order, as SciPy's COO to CSR conversion sums them). Records without values (every
    value 1, :func:`run_dtype`) give each entry its count of duplicates, as ``value_dtype``.

    ``rec`` is consumed: once its keys and values are taken, its memory holds the returned columns and
    sums. The process maps every large array afresh (:mod:`blocklin._memory`), so each new array costs
    its page faults, more than the arithmetic here; the buffers are reused instead (``space``'s keys,
    order and values when given).
    """
    count = len(rec)
    span = (r1 - r0) * n
    bits = max(count - 1, 0).bit_length()
    if rec.dtype.names == ("k",):  # linear indices, every value 1: no order to keep
        key = np.subtract(rec["k"], r0 * n, out=space.key[:count] if space else None)
        key.sort()
        order = space.order[:count] if space else np.empty(count, np.int64)  # a buffer for what follows
    elif span << bits < 2**63:
        # The (row, column) key shifted left, with the record's position in the low bits, is unique:
        # a plain sort of it in place (NumPy's vectorized sort, several times a stable argsort's speed)
        # gives the stable order, so duplicates are summed in source order, as SciPy sums them.
        key = np.subtract(rec["r"], r0, out=space.key[:count] if space else None)
        key *= n
        key += rec["c"]
        key <<= bits
        key |= space.positions[:count] if space else np.arange(count, dtype=np.int64)
        key.sort()
        order = np.bitwise_and(key, (1 << bits) - 1, out=space.order[:count] if space else None)
        key >>= bits
    elif span < 2**62:
        key = rec["r"] - r0
        key *= n
        key += rec["c"]
        order, key = _stable_argsort(key)
    else:  # pragma: no cover - a key of row and column would overflow int64
        return _sorted_block_wide(rec, r0, r1, n, index_dtype)
    unit = "v" not in rec.dtype.names
    if unit:  # every value 1: nothing to gather (a random gather of the whole run), duplicates counted
        vals = space.vals[:count] if space else np.empty(count, value_dtype)
    else:
        vals = np.take(rec["v"], order, out=space.vals[:count] if space else None, mode="clip")
    new = order.view(np.bool_)[:count]  # the order is spent once the values are gathered
    if count:
        new[0] = True
        np.not_equal(key[1:], key[:-1], out=new[1:])
    starts = np.flatnonzero(new)
    del new
    u = len(starts)
    if u == count:  # no duplicates: nothing to gather or sum
        uk, sums = key, vals
        if unit:
            sums.fill(1)
    else:
        uk = np.take(key, starts, out=order[:u])
    # the sorted keys' row boundaries (r1 - r0 binary searches, not an int64 division of every key)
    indptr = np.searchsorted(uk, np.arange(r1 - r0 + 1, dtype=np.int64) * n)
    scratch = _scratch_of(rec)
    vdt = vals.dtype
    at = -(-u * vdt.itemsize // 8) * 8  # the columns after the sums, 8-byte aligned
    fits = scratch is not None and at + u * np.dtype(index_dtype).itemsize <= scratch.size
    if u != count and unit:  # the counts of equal keys
        sums = scratch[:u * vdt.itemsize].view(vdt) if fits else np.empty(u, vdt)
        np.subtract(starts[1:], starts[:-1], out=sums[:-1], casting="unsafe")
        sums[-1:] = count - starts[-1:]
    elif u != count:
        with np.errstate(over="ignore"):  # an overflow is refused by name just below
            sums = np.add.reduceat(vals, starts, out=scratch[:u * vdt.itemsize].view(vdt) if fits else None) \
                if u else vals[:0]
        check_sums_fit(vals, starts, sums, lambda i, keys=uk: divmod(int(keys[i]), n), r0)
    del vals, starts
    # each key's row start (row * n), in the int64 buffer the keys no longer need: n added at each
    # row's first key, then summed along (no new array: a new one costs its page faults)
    row_starts = (order if u == count else key)[:u]
    row_starts.fill(0)
    firsts = indptr[1:-1]
    np.add.at(row_starts, firsts[firsts < u], n)
    np.cumsum(row_starts, out=row_starts)
    cols = scratch[at:at + u * np.dtype(index_dtype).itemsize].view(index_dtype) if fits else \
        np.empty(u, index_dtype)
    np.subtract(uk, row_starts, out=cols, casting="unsafe")  # uk % n; it fits the index dtype (n does)
    del uk, row_starts
    return indptr, cols, sums


def check_sums_fit(vals: np.ndarray, starts: np.ndarray, sums: np.ndarray, entry: Any, r0: int) -> None:
    """Refuse a sum of finite duplicate entries that overflowed to inf (``sums``: ``vals`` summed from each
    of ``starts``), naming its entry (``entry(i)``: row within the block and column of sum ``i``; the block
    starts at row ``r0``).

    The sums are formed in the output dtype: duplicates each within a narrower float's range (each
    checked by :func:`check_values_fit`) can sum beyond it, where SciPy's float64 sum would not. A
    finite sum is the common case: one ``isfinite`` over the sums, the summands looked at only then.
    Integer sums wrap instead (int8 ``100 + 100`` is ``-56``, SciPy's ``sum_duplicates`` too): refused
    alike (:func:`_check_integer_sums`), as the float sums' inf is.
    """
    if sums.dtype.kind in "iu":
        _check_integer_sums(vals, starts, sums, entry, r0)
        return
    if sums.dtype.kind not in "fc" or np.isfinite(sums).all():
        return
    bad = ~np.isfinite(sums) & np.logical_and.reduceat(np.isfinite(vals), starts)  # inf or NaN from finite terms
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        row, col = entry(i)
        top = np.finfo(sums.dtype).max
        raise DTypeError(explain("dtype", f"must hold the sums of duplicate entries (finite {sums.dtype.name} "
                                 f"values stay below {top:.3g})",
                                 f"the duplicates at row {r0 + row}, column {col} (counted from 0) sum to "
                                 f"{sums[i]} in {sums.dtype.name}",
                                 "pass a wider dtype (float64, or no dtype to keep the input's), or combine "
                                 "the duplicate entries in the input"))


def _check_integer_sums(vals: np.ndarray, starts: np.ndarray, sums: np.ndarray, entry: Any, r0: int) -> None:
    """Refuse a sum of integer duplicate entries beyond its dtype's range (it wrapped), naming its entry.
    The sums again in float64 (exact for the narrower integers; within a few ulps of 2^63 for 64-bit ones):
    those that differ from the stored sums, or come within 2^62 of a 64-bit range's end, are summed exactly
    (Python integers) and compared with the range."""
    info = np.iinfo(sums.dtype)
    wide = np.add.reduceat(vals.astype(np.float64), starts) if len(starts) else np.zeros(0)
    ends = np.append(starts[1:], len(vals))
    if sums.dtype.itemsize < 8:
        suspect = np.flatnonzero(wide != sums)
    else:  # only sums of two or more entries may wrap (int64 keys or hashes near 2^63 stay single)
        suspect = np.flatnonzero(((wide != sums.astype(np.float64)) | (wide > 2.0**62) | (wide < -(2.0**62)))
                                 & (ends - starts > 1))
    for i in suspect:
        exact = sum(int(v) for v in vals[starts[i]:ends[i]])
        if info.min <= exact <= info.max:
            continue
        row, col = entry(int(i))
        raise DTypeError(explain("dtype", f"must hold the sums of duplicate entries ({sums.dtype.name} values stay "
                                 f"within {info.min}..{info.max})",
                                 f"the duplicates at row {r0 + row}, column {col} (counted from 0) sum to {exact}, "
                                 f"which {sums.dtype.name} wraps to {sums[i]}",
                                 f"pass a wider dtype ({'float64' if sums.dtype.itemsize == 8 else 'int64 or float64'}"
                                 "), or combine the duplicate entries in the input"))


def _scratch_of(rec: np.ndarray) -> np.ndarray | None:
    """``rec``'s memory as bytes to write results into, or None when it cannot be (a view, read-only)."""
    if not (rec.flags.c_contiguous and rec.flags.writeable):
        return None
    return rec.view(np.uint8)


def _sorted_block_wide(rec: np.ndarray, r0: int, r1: int, n: int, index_dtype: np.dtype
                       ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:  # pragma: no cover
    """:func:`_sorted_block` when a key of row and column would overflow int64."""
    order = np.lexsort((rec["c"], rec["r"]))
    vals = rec["v"][order]
    rr, cc = rec["r"][order] - r0, rec["c"][order]
    new = np.ones(len(rr), bool)
    new[1:] = (rr[1:] != rr[:-1]) | (cc[1:] != cc[:-1])
    starts = np.flatnonzero(new)
    rows_local, cols = rr[starts], cc[starts]
    with np.errstate(over="ignore"):  # an overflow is refused by name just below
        sums = np.add.reduceat(vals, starts) if len(starts) else vals[:0]
    check_sums_fit(vals, starts, sums, lambda i: (int(rows_local[i]), int(cols[i])), r0)
    indptr = np.zeros(r1 - r0 + 1, np.int64)
    np.cumsum(np.bincount(rows_local, minlength=r1 - r0), out=indptr[1:])
    return indptr, cols.astype(index_dtype), sums


def _emit(runs: _Runs, name: str, r0: int, r1: int, plan: SortPlan, writer: SparseWriter, n: int,
          space: _SortSpace, depth: int = 0) -> None:
    """Write rows ``r0:r1`` from run ``name``: sorted in memory when it fits, else split by rows."""
    count = runs.size(name)
    if count <= plan.block_entries:
        space.reserve(count)
        rec = runs.load_into(name, space.rec[:count])
        runs.remove(name)
        indptr, cols, sums = _sorted_block(rec, r0, r1, n, writer.index_dtype, space, writer.dtype)
        del rec
        # the writer copies them into its chunk buffers: the space can take the next run
        writer.write_rows(r0, r1, indptr, cols, sums.astype(writer.dtype, copy=False))
        return
    space.release()  # the pieces bucketed below are what the budget holds
    if r1 - r0 == 1:
        # the writer's chunks grow with the budget too (to a tenth of it): a quarter more covers them
        need = (plan.memory + (count - plan.block_entries) * SORT_BYTES_PER_ENTRY) * 5 // 4
        raise BudgetError(explain("memory", "the entries of one row must fit one in-memory sort",
                                  f"row {r0 + 1} holds {count} entries (the budget sorts {plan.block_entries})",
                                  f"raise the budget to at least {size_hint(need)} (--memory {size_hint(need)})"),
                          minimum=need)
    parts = int(min(r1 - r0, max(2, 2 * -(-count // plan.block_entries))))
    width = -(-(r1 - r0) // parts)
    sub = f"{name}.{depth}"
    for start in range(0, count, plan.block_entries):  # bucketed again in pieces the budget holds
        rec = runs.load(name, start, min(plan.block_entries, count - start))
        rows = rec["k"] // n if rec.dtype.names == ("k",) else rec["r"]
        _bucket(runs, sub, rec, (rows - r0) // width)
        del rows
        del rec
    runs.close_all()
    runs.remove(name)
    for k in range(parts):
        a, b = r0 + k * width, min(r1, r0 + (k + 1) * width)
        if a < b:
            _emit(runs, f"{sub}-{k}", a, b, plan, writer, n, space, depth + 1)


def external_sort(source: Any, writer: SparseWriter, plan: SortPlan, work: str, *, nan: str = "allow",
                  progress: Any = None, desc: str = "") -> dict:
    """Bucket ``source``'s batches into runs under ``work`` and write them as row blocks (see the
    module notes). Returns counts for the report.

    Every batch and every row block makes and frees the same temporaries (the bucketing's order and
    keys, the sort's permutations): they are reused from the heap (:func:`blocklin._memory.reused_allocations`)
    instead of mapped afresh, zeroed page by page, each time. Converting the 10^6-node graph of
    ``benchmarks/sparse_matrices.py`` (2x10^7 entries, ``memory="256MiB"``) took about 230 000 page faults
    and 0.65-1.2 s of system time so, 37 000 and 0.35-0.7 s with them reused (1.15-1.58 s against 1.56-2.02 s)."""
    with reused_allocations(plan.memory):
        return _external_sort(source, writer, plan, work, nan=nan, progress=progress, desc=desc)


def _external_sort(source: Any, writer: SparseWriter, plan: SortPlan, work: str, *, nan: str, progress: Any,
                   desc: str) -> dict:
    """The body of :func:`external_sort`."""
    m, n = source.shape
    rpb = plan.rows_per_block
    unit = bool(getattr(source, "unit_values", False)) and m * n < 2**63  # linear indices fit int64
    runs = _Runs(work, run_dtype(writer.dtype, values=not unit))
    n_runs = -(-m // rpb) if m else 0
    prog = make_progress(progress)
    prog.start(n_runs, desc)
    stored = 0
    buffer: list = [None, None, None]  # the records, block numbers and linear indices of one batch, reused
    try:
        for batch in source.batches():
            check_values_fit(batch.vals[:batch.stored], writer.dtype, batch.where)
            if nan == "error" and batch.vals.dtype.kind in "fc":
                bad = np.flatnonzero(np.isnan(batch.vals[:batch.stored]))
                if bad.size:
                    raise NonFiniteError(explain("input", "must not hold NaN when nan='error'",
                                                 f"NaN at {batch.where(int(bad[0]))}",
                                                 "fix the value, or pass nan='allow' (CLI: --nan allow)"))
            stored += len(batch.rows)
            _bucket_batch(runs, batch, rpb, buffer, n)
            del batch
        runs.close_all()
        del buffer[:]
        space = _SortSpace(runs.rec, writer.dtype)
        for k in range(n_runs):
            r0, r1 = k * rpb, min(m, (k + 1) * rpb)
            _emit(runs, f"run-{k}", r0, r1, plan, writer, n, space)
            prog.advance(1)
        space.release()
    finally:
        runs.close_all()
        prog.close()
    return {"entries_read": stored, "runs": n_runs}


# -- drivers ---------------------------------------------------------------------------------------

def _value_dtype(src: np.dtype, requested: Any, source_name: str = "x") -> np.dtype:
    """:func:`output_dtype`, integers never narrowed: the entries are bucketed and their duplicates
    summed in the output dtype, where a value or a sum out of its range would wrap silently (int64
    402 became int8 -110). float16 and extended precision are refused: SciPy's sparse matrices hold
    neither (a float16 group was written whose rows ``rows()`` and ``to_scipy()`` could not return), and
    zarr has no extended precision (its ValueError had been the refusal). ``source_name``: the caller's
    name of the matrix (``x``, convert's ``src``), named where no ``dtype`` was requested."""
    out = output_dtype(src, requested)
    src = np.dtype(src)
    given = "dtype" if requested is not None else source_name
    if out.kind in "fc" and np.finfo(out).bits > 64:
        wide = "complex128" if out.kind == "c" else "float64"
        raise DTypeError(explain(given, "must not be extended precision for a sparse matrix (zarr stores at most "
                                 "float64 and complex128, and a silent cast would drop the extra digits)",
                                 f"dtype {out.name}", f"convert it knowingly: pass dtype='{wide}' (CLI: --dtype "
                                 f"{wide})"))
    if out == np.float16:
        raise DTypeError(explain(given, "must be a value dtype SciPy's sparse matrices hold (float16 is not: the "
                                 "stored matrix's rows could not be read back as scipy.sparse)", "dtype float16",
                                 "pass dtype='float32' (CLI: --dtype float32; it holds every float16 value "
                                 "exactly)"))
    if src.kind in "iu" and out.kind in "iu" and not np.can_cast(src, out, "safe"):
        raise DTypeError(explain("dtype", f"must hold every {src.name} value of a sparse matrix (a narrower integer "
                                 "would wrap values and sums of duplicate entries)", f"{src.name} -> {out.name}",
                                 f"keep {src.name} (pass no dtype), or a float dtype"))
    return out


def check_values_fit(v: np.ndarray, out: np.dtype, where: Any) -> None:
    """Refuse a finite value of ``v`` that the narrower float dtype ``out`` cannot hold (it would become
    inf), naming its position (``where(i)`` of entry ``i``)."""
    if not v.size or out.kind not in "fc" or v.dtype.kind not in "fc" or np.can_cast(v.dtype, out, "safe"):
        return
    top = np.finfo(out).max
    parts = (v.real, v.imag) if v.dtype.kind == "c" else (v,)
    bad = np.zeros(v.shape, bool)
    for part in parts:
        bad |= np.isfinite(part) & (np.abs(part) > top)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise DTypeError(explain("dtype", f"must hold every value (finite {out.name} values stay below {top:.3g})",
                                 f"{v[i]} at {where(i)}", "keep the input's dtype (pass no dtype)"))


def write_sparse(source: Any, out: Any, *, memory: Any = None, dtype: Any = None, overwrite: bool = False,
                 nan: str = "allow", progress: Any = None, inputs: list = (), operation: str = "convert",
                 params: dict | None = None, source_name: str = "x") -> tuple[dict, Any]:
    """Write ``source`` (a :class:`SparseSource`: Matrix Market, ``.npz``, HDF5 or in memory) as a
    ``blocklin-csr`` group at ``out`` within the budget. Returns ``(report, committed location)``.
    ``source_name``: the caller's name of the matrix, in refusals of its dtype."""
    from blocklin._memory import check_budget, peak_rss
    from blocklin.storage.ownership import end_work_folder, start_work_folder
    from blocklin.storage.space import check_space

    t0 = time.perf_counter()
    cfg = resolve(memory=memory)
    check_budget(cfg.memory)
    out_dt = _value_dtype(source.dtype, dtype, source_name)
    m, n = source.shape
    source.fit_budget(cfg.memory)
    plan = plan_sort((m, n), source.entries, out_dt, cfg.memory, batch_entries=source.batch_entries,
                     parse_bytes=source.parse_bytes)
    idx = index_dtype_for(n)
    _check_rows_backed(source, out_dt.itemsize + idx.itemsize)
    check_space(as_location(out, name="out"), source.entries * (out_dt.itemsize + idx.itemsize) + (m + 1) * 8, "out",
                f"a {m} x {n} sparse matrix of up to {source.entries} entries")
    # A source already in row order (an HDF5 CSR group) streams its row blocks: no runs, no sort.
    streamed = bool(getattr(source, "row_ordered", False))
    root = as_location(cfg.temp_dir, cfg.storage_options, name="temp_dir")
    if not root.is_local and not streamed:
        raise ConfigError(explain("temp_dir", "the sparse conversion's run files need a local temp dir",
                                  root.url, "point BLOCKLIN_TEMP_DIR (--temp-dir) at a local folder"))
    writer = SparseWriter(out, (m, n), out_dt, inputs=list(inputs), overwrite=overwrite,
                          entry_chunk=plan.entry_chunk, row_chunk=plan.row_chunk)
    work = root / f"blocklin-sort-{uuid.uuid4().hex[:12]}"
    desc = f"convert {os.path.basename(str(out))} (sparse)"
    try:
        if streamed:
            counts = source.write_rows(writer, plan, nan=nan, progress=progress, desc=desc)
        else:
            check_space(work, source.entries * run_dtype(out_dt).itemsize, "temp_dir",
                        f"the run files of {source.entries} entries")
            try:  # started inside: an interrupt while the folder is being made still removes it
                start_work_folder(work, operation="convert-sort")
                counts = external_sort(source, writer, plan, work.url, nan=nan, progress=progress, desc=desc)
            finally:
                end_work_folder(work)
        report = {"output": str(out), "layout": "sparse", "format": "blocklin-csr", "shape": [m, n],
                  "dtype": out_dt.name, "nnz": int(writer.nnz), "entries_read": counts["entries_read"],
                  "row_blocks": writer.n_blocks, "runs": counts["runs"], "memory": cfg.memory,
                  "planned_memory": plan.peak_memory, "bytes_read": int(source.bytes_read),
                  "seconds": time.perf_counter() - t0}
        final = writer.commit(operation=operation, plan=plan.to_dict(),
                              params={"dtype": out_dt.name, "memory": cfg.memory, **(params or {})},
                              report=dict(report))
    except BaseException:
        writer.abort()
        raise
    from blocklin.storage.formats.base import disk_usage

    report.update(output=str(out), seconds=time.perf_counter() - t0, peak_memory=peak_rss(),
                  bytes_written=disk_usage(final.url), plan=plan.to_dict())
    return report, final


#: Row offsets (``indptr``, 8 bytes a row) allowed beyond :data:`ROWS_PER_ENTRY_BYTES` times the
#: entries' bytes: a size line declaring far more rows than its entries fill is refused up front.
ROW_OFFSET_SLACK = 1 << 30
ROWS_PER_ENTRY_BYTES = 64


def _check_rows_backed(source: Any, entry_bytes: int) -> None:
    """Refuse a declared row count whose offsets alone dwarf the entries (a size line the data does
    not back: ``10^9 x 10^9`` with two entries would write 8 GB of ``indptr``)."""
    m = source.shape[0]
    offsets, entries = (m + 1) * 8, source.entries * entry_bytes
    if offsets > ROW_OFFSET_SLACK + ROWS_PER_ENTRY_BYTES * entries:
        raise FormatError(explain(f"{source.kind} input", "the declared rows must be backed by entries: the CSR "
                                  f"row offsets (8 bytes a row) may exceed {ROWS_PER_ENTRY_BYTES} times the "
                                  f"entries' bytes by at most {format_size(ROW_OFFSET_SLACK)}",
                                  f"{m} rows ({format_size(offsets)} of offsets) for {source.entries} entries",
                                  "check the size line (or shape); a matrix this empty is better stored transposed "
                                  "or as its nonzero rows"))


def export_sparse(src: Any, out: Any, fmt: str, *, memory: Any = None, overwrite: bool = False,
                  progress: Any = None) -> dict:
    """Write the stored sparse matrix ``src`` as a coordinate ``general`` Matrix Market file (``fmt``
    ``"mtx"``, streamed by row blocks) or a SciPy ``.npz`` (``"npz"``, refused beyond the budget)."""
    from blocklin._memory import peak_rss
    from blocklin.storage.formats.base import AtomicFile

    t0 = time.perf_counter()
    cfg = resolve(memory=memory)
    store = SparseStore(src, name="input")
    m, n = store.shape
    fmt = fmt.lower()
    if fmt not in ("mtx", "npz"):
        raise FormatError(explain("out", "a sparse matrix is exported as .mtx (coordinate) or .npz "
                                  "(scipy.sparse.save_npz)", f"{str(out)!r} ({fmt})",
                                  "write OUT.mtx or OUT.npz"))
    nbytes = store.nnz * (store.dtype.itemsize + store.index_dtype.itemsize) + (m + 1) * 8
    if fmt == "npz" and 2 * nbytes > cfg.memory:  # the matrix and save_npz's compressed copy of each array
        raise BudgetError(explain("memory", "an .npz is written by scipy.sparse.save_npz from memory: twice the "
                                  f"CSR arrays must fit the budget ({format_size(cfg.memory)})",
                                  f"{m} x {n} with {store.nnz} entries ({format_size(nbytes)})",
                                  f"export to .mtx (streamed), or raise the budget to at least "
                                  f"{size_hint(2 * nbytes * 5 // 4)} (--memory {size_hint(2 * nbytes * 5 // 4)})"),
                          minimum=2 * nbytes)
    target = AtomicFile(out, inputs=[store.location.url], overwrite=overwrite, kind=fmt)
    prog = make_progress(progress)
    bounds = store.row_blocks
    prog.start(len(bounds) - 1, f"export {os.path.basename(str(out))}")
    try:
        if fmt == "npz":
            import scipy.sparse

            ptr, idx, val = store.read_rows(0, m)
            with open(target.partial, "wb") as fh:  # a file object: save_npz adds no ".npz" to the name
                scipy.sparse.save_npz(fh, scipy.sparse.csr_matrix((val, idx, ptr), shape=(m, n)))
            prog.advance(len(bounds) - 1)
        else:
            _write_mtx(store, target.partial, prog)
        final = target.commit()
    except BaseException as exc:
        target.abort()
        raise_naming(exc, str(target.partial))  # a full disk's write() names no file: name the export's
    finally:
        prog.close()
    return {"output": str(final), "input": str(src), "layout": "sparse", "from": "blocklin-csr", "to": fmt,
            "shape": [m, n], "dtype": store.dtype.name, "nnz": store.nnz, "memory": cfg.memory,
            "planned_memory": 2 * nbytes if fmt == "npz" else None, "bytes_written": os.path.getsize(final),
            "seconds": time.perf_counter() - t0, "peak_memory": peak_rss()}


def _write_mtx(store: SparseStore, path: Any, prog: Any) -> None:
    from blocklin.storage.formats.text_util import FORMAT_BATCH, check_mtx_integers, formatter

    m, n = store.shape
    field = "integer" if store.dtype.kind in "iub" else "real"
    if store.dtype.kind == "c":
        raise DTypeError(explain("dtype", "Matrix Market output holds real or integer values",
                                 f"dtype {store.dtype}", "export the real and imaginary parts separately"))
    fmt = formatter(store.dtype)
    bounds = store.row_blocks
    with open(path, "w", encoding="ascii", newline="\n") as fh:
        fh.write(f"%%MatrixMarket matrix coordinate {field} general\n% written by blocklin\n{m} {n} {store.nnz}\n")
        for k in range(len(bounds) - 1):
            r0, r1 = int(bounds[k]), int(bounds[k + 1])
            ptr, idx, val = store.read_rows(r0, r1)
            rows = np.repeat(np.arange(r0 + 1, r1 + 1), np.diff(ptr))
            check_mtx_integers(val, lambda k: f"row {rows[k[0]]}, column {int(idx[k[0]]) + 1}")
            for s in range(0, len(idx), FORMAT_BATCH):
                e = s + FORMAT_BATCH
                fh.write("".join(f"{r} {c} {v}\n" for r, c, v in zip(rows[s:e].tolist(), (idx[s:e] + 1).tolist(),
                                                                     fmt(val[s:e]))))
            prog.advance(1)


__all__ = ["MtxSource", "NpzSource", "ScipySource", "SortPlan", "export_sparse", "external_sort", "is_scipy_npz",
           "plan_sort", "write_sparse"]
