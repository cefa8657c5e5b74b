"""Appending rows to a stored sparse matrix (a ``blocklin-csr`` group), atomically and in bounded memory.

The group's attributes (``shape``, ``nnz``, ``row_blocks`` in its root ``zarr.json``) say how much of
its four arrays is the matrix, and :class:`~blocklin.storage.sparse.SparseStore` reads no further. So
:func:`append_sparse`, as the dense append (:mod:`blocklin.storage.append`):

1. writes the journal (:mod:`blocklin.storage.append_journal`) with the rows, entries and row blocks
   before and after, the source's stamp, the version history and what tells the old rows unchanged;
2. extends ``indptr``, ``indices``, ``data`` and ``row_blocks``: the chunk holding an array's last
   old elements is rewritten whole with their bytes unchanged, the new chunks are written beyond it
   (every chunk a temporary file renamed into place);
3. writes each array's ``zarr.json`` with its new length (a reader still takes the attributes');
4. writes the group's ``zarr.json`` with the new shape, entry count, row blocks and history
   (``blocklin_versions``, :mod:`blocklin.storage.versions`): that write is the commit;
5. removes the journal.

A reader sees the old matrix or the new one. An append that fails or is interrupted (Ctrl-C, SIGTERM)
undoes its writes; one whose process was killed leaves the old matrix readable and its journal: the
same append of stored rows finishes it (its writes start again from the committed lengths), and
:func:`rollback_sparse` removes what it wrote. The rows appended form row blocks of their own.

Rows that are not a ``blocklin-csr`` group already (a SciPy matrix, a NumPy array, a ``.mtx``, ``.npz``
or HDF5 sparse group) are written to one in the temp dir first by the conversion's bounded-memory sort
(:func:`~blocklin.storage.sparse_convert.write_sparse`: duplicates summed, columns sorted within a
row), so the entries appended are those ``blocklin.from_sparse`` of the stacked matrix stores.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import time
import uuid
from typing import Any

import numpy as np
import zarr

from blocklin.config import format_size, resolve
from blocklin.errors import BudgetError, ConfigError, ParameterError, ShapeError, UncommittedOutputError, explain
from blocklin.progress import make_progress
from blocklin.storage import ownership
from blocklin.storage.append_dtypes import append_dtype, check_exact
from blocklin.storage.append_journal import (JOURNAL, check_not_busy, interrupted_refusal, read_journal,
                                             source_stamp)
from blocklin.storage.backend import backend, zarr_store
from blocklin.storage.location import Location, as_location
from blocklin.storage.rawchunks import vector_chunk_files
from blocklin.storage.records import PENDING_RECORD
from blocklin.storage.sparse import SparseStore, index_dtype_for, is_sparse, sparse_attributes
from blocklin.storage.stamps import file_stamps
from blocklin.storage.versions import VERSIONS_KEY, data_stamp, history, now
from blocklin.storage.zarr_store import read_vector

#: Operations whose sparse outputs are data (rows of samples), which rows may be appended to.
SPARSE_DATA_OPERATIONS = ("convert", "from_sparse")
#: The arrays an append extends, in the order they are written.
_EXTENDED = ("indptr", "indices", "data", "row_blocks")
#: Copies of a strip's entries held at once: the source's, their cast, and the chunk being filled.
_STRIP_COPIES = 3


def sparse_target(loc: Location) -> dict:
    """The attributes of the sparse matrix appended to; refused unless it is a committed local
    ``blocklin-csr`` group that ``convert`` or ``from_sparse`` wrote, with uncompressed arrays."""
    be = backend(loc)
    if be.try_read(PENDING_RECORD) is not None:
        raise UncommittedOutputError(explain("a", "must be a committed output", f"{loc.url!r}, an output an "
                                             "interrupted run left unfinished", "finish that run (--resume) first"))
    attrs = sparse_attributes(loc)
    if attrs is None:
        raise ParameterError(explain("a", "must be a sparse matrix (a blocklin-csr group)", repr(loc.url),
                                     "convert it: blocklin convert A.mtx A.zarr"))
    if not loc.is_local:
        raise ConfigError(explain("a", "rows are appended to sparse matrices on local paths (their arrays are "
                                  "extended chunk file by chunk file)", loc.url, "copy the group to a local "
                                  "folder, append there, and copy it back"))
    op = (attrs.get("blocklin") or {}).get("operation")
    if op not in SPARSE_DATA_OPERATIONS:
        raise ParameterError(explain("a", "must be a sparse matrix blocklin wrote as data (" +
                                     ", ".join(SPARSE_DATA_OPERATIONS) + ")", f"{loc.url!r}, written by {op!r}",
                                     "write it again: blocklin.from_sparse(x, PATH)"))
    return attrs


class _Rows:
    """The rows to append as a ``blocklin-csr`` group: ``store``, what to call them, their stored
    location (None in memory), and the temp folder written for them (None: read where they are)."""

    def __init__(self, store: SparseStore, what: str, src_loc: Location | None, work: Location | None) -> None:
        self.store, self.what, self.src_loc, self.work = store, what, src_loc, work

    def close(self) -> None:
        if self.work is not None:
            ownership.end_work_folder(self.work)


def _rows_as_group(rows: Any, n: int, dt: np.dtype, memory: int, from_format: str | None, opts: dict) -> _Rows:
    """The rows to append as a ``blocklin-csr`` group (module notes), their width and dtype checked first."""
    import scipy.sparse

    from blocklin.matrix import Matrix
    from blocklin.sparse import SparseMatrix

    if isinstance(rows, SparseMatrix):
        rows = rows.location
    if isinstance(rows, Matrix):
        raise ParameterError(explain("rows", "appended to a sparse matrix must be sparse (a SciPy matrix, .mtx, "
                                     ".npz, an HDF5 sparse group, a blocklin-csr group) or a NumPy array",
                                     f"the dense stored matrix {rows.path!r}", "append rows of a sparse source, or "
                                     "read the dense rows into memory (np.asarray) and append that"))
    if isinstance(rows, (str, Location)) or hasattr(rows, "__fspath__"):
        return _stored_rows(rows, n, dt, memory, from_format, opts)
    if opts or from_format:
        raise ParameterError(explain("rows", "format options apply to rows in a file", f"{sorted(opts) or ''} "
                                     f"{from_format or ''} for rows in memory", "drop them"))
    if scipy.sparse.issparse(rows):
        if len(rows.shape) != 2:
            raise ShapeError(explain("rows", "must be 2-D", f"shape {rows.shape}", f"reshape it to (-1, {n})"))
        x, what = rows, f"a SciPy {rows.format} matrix of shape {tuple(rows.shape)}"
    elif type(rows).__module__.startswith(("dask", "zarr")):
        raise ParameterError(explain("rows", "appended to a sparse matrix must be sparse or a NumPy array",
                                     f"a {type(rows).__module__.split('.')[0]} array", "append "
                                     "scipy.sparse.csr_matrix(np.asarray(rows)) (its nonzero entries)"))
    else:
        from blocklin.validate import in_memory_array

        a = in_memory_array(rows, "rows")
        if a.ndim == 1:  # one row, as numpy.vstack takes it
            a = a.reshape((-1, 1) if n == 1 else (1, -1))
        if a.ndim != 2:
            raise ShapeError(explain("rows", "must be 2-D (rows to append)", f"shape {a.shape}",
                                     f"reshape it to (-1, {n})"))
        x, what = scipy.sparse.csr_matrix(a), f"an array of shape {a.shape} (its nonzero entries)"
    _check_width_dtype(x.shape, x.dtype, n, dt)
    from blocklin.storage.sparse_convert import ScipySource

    return _converted(ScipySource(x), what, None, memory)


def _stored_rows(rows: Any, n: int, dt: np.dtype, memory: int, from_format: str | None, opts: dict) -> _Rows:
    from blocklin.storage.location import split_spec
    from blocklin.storage.stamps import input_location

    spec = rows.url if isinstance(rows, Location) else os.fspath(rows)
    src_loc = input_location(rows)
    if is_sparse(src_loc) and not opts and not from_format:
        store = SparseStore(src_loc, name="rows")
        _check_width_dtype(store.shape, store.dtype, n, dt)
        return _Rows(store, spec, src_loc, None)
    path, member = split_spec(spec)
    from blocklin.storage.convert import sparse_source
    from blocklin.storage.formats import detect_format
    from blocklin.storage.sparse_convert import is_scipy_npz

    fmt = detect_format(str(path), from_format)
    sparse_h5 = fmt == "hdf5" and member is not None
    if not (fmt == "mtx" or (fmt == "npz" and member is None and is_scipy_npz(str(path))) or sparse_h5):
        raise ParameterError(explain("rows", "appended to a sparse matrix must be sparse: a coordinate .mtx, a "
                                     "scipy.sparse.save_npz .npz, an HDF5 sparse group (FILE.h5:/GROUP) or a "
                                     "blocklin-csr group", f"{spec!r} ({fmt})", "convert the rows to one of these "
                                     "first (blocklin convert ROWS ROWS.mtx), or pass a SciPy matrix"))
    source = sparse_source(str(path), member=member if sparse_h5 else None,
                           sparse_format=opts.pop("sparse_format", None), from_format=from_format)
    if opts:
        source.close()
        raise ParameterError(explain("rows", "sparse rows take no format options", str(sorted(opts)), "drop them"))
    try:
        _check_width_dtype(source.shape, source.dtype, n, dt)
    except BaseException:
        source.close()
        raise
    return _converted(source, spec, src_loc, memory)


def _converted(source: Any, what: str, src_loc: Location | None, memory: int) -> _Rows:
    """``source`` (a :class:`~blocklin.storage.sparse_convert.SparseSource`) written as a group in a work
    folder of the temp dir, in its own dtype (the cast is checked entry by entry as they are appended);
    integers in their kind's 64-bit dtype, where duplicate entries are summed: int8 ``100 + 100`` had been
    refused as wrapping in int8 (naming a ``dtype`` append does not take) where the matrix holds 200."""
    from blocklin.storage.sparse_convert import write_sparse

    kind = np.dtype(source.dtype).kind
    dtype = np.dtype(np.int64 if kind == "i" else np.uint64) if kind in "iu" else None
    if np.dtype(source.dtype) == np.float16:  # no sparse group holds float16: float32 holds each value exactly
        dtype = np.dtype(np.float32)

    cfg = resolve(memory=memory)
    work = as_location(cfg.temp_dir, cfg.storage_options, name="temp_dir") / f"blocklin-append-{uuid.uuid4().hex[:12]}"
    try:
        try:
            ownership.start_work_folder(work, operation="append-rows")
            _, loc = write_sparse(source, work / "rows.zarr", memory=memory, dtype=dtype, nan="allow",
                                  operation="convert", params={"from": "append"}, source_name="rows")
        finally:
            source.close()
        return _Rows(SparseStore(loc, name="rows"), what, src_loc, work)
    except BaseException:
        ownership.end_work_folder(work)
        raise


def _check_width_dtype(shape: tuple, src: Any, n: int, dt: np.dtype) -> None:
    if int(shape[1]) != n:
        raise ShapeError(explain("rows", f"must have the matrix's {n} columns", f"{shape[0]} x {shape[1]}",
                                 f"append rows of width {n}"))
    append_dtype(np.dtype(src), dt)


class _Extender:
    """Appends to a 1-D array of the group from ``start`` on, one whole chunk file at a time: the chunk
    holding its last old elements is written again with their bytes unchanged."""

    def __init__(self, loc: Location, name: str, start: int) -> None:
        arr = zarr.open_array(store=zarr_store(loc / name, read_only=True), mode="r")
        self.files = vector_chunk_files(arr)
        if self.files is None:
            raise ConfigError(explain("a", "rows are appended to uncompressed sparse arrays (as blocklin writes "
                                      "them)", f"{loc.url}/{name}, compressed or not a local zarr v3 array",
                                      "convert the matrix again (blocklin convert S.zarr S.mtx, then "
                                      "blocklin convert S.mtx S2.zarr)"))
        self.chunk = self.files.chunk
        self.buf = np.zeros(self.chunk, arr.dtype)
        self.index, self.fill = divmod(start, self.chunk)
        if self.fill:
            self.buf[:self.fill] = read_vector(arr, start - self.fill, start)
        self.count = start
        self.written = 0

    def append(self, values: np.ndarray) -> None:
        pos = 0
        while pos < values.size:
            take = min(self.chunk - self.fill, values.size - pos)
            self.buf[self.fill:self.fill + take] = values[pos:pos + take]
            self.fill, pos, self.count = self.fill + take, pos + take, self.count + take
            if self.fill == self.chunk:
                self._flush()

    def _flush(self) -> None:
        self.buf[self.fill:] = 0  # the fill value: the last chunk is stored whole, as zarr stores it
        self.files.write(self.index, self.buf)
        self.written += self.buf.nbytes
        self.index, self.fill = self.index + 1, 0

    def close(self) -> None:
        if self.fill:
            self._flush()


def _lengths(attrs: dict) -> dict[str, int]:
    """Each array's length in the matrix the attributes describe."""
    m, nnz, b = int(attrs["shape"][0]), int(attrs["nnz"]), int(attrs["row_blocks"])
    return {"indptr": m + 1, "indices": nnz, "data": nnz, "row_blocks": b + 1}


def _array_meta(loc: Location, name: str) -> dict:
    return json.loads(backend(loc).read_text(f"{name}/zarr.json"))


def _chunk(meta: dict) -> int:
    return int(meta["chunk_grid"]["configuration"]["chunk_shape"][0])


def _chunk_key(meta: dict, name: str, index: int) -> str:
    sep = ((meta.get("chunk_key_encoding") or {}).get("configuration") or {}).get("separator", "/")
    return f"{name}/c{sep}{index}"


def _written_keys(loc: Location, start: dict[str, int], end: dict[str, int]) -> set[str]:
    """The chunk files an append from lengths ``start`` to ``end`` writes."""
    keys = set()
    for name in _EXTENDED:
        meta = _array_meta(loc, name)
        c = _chunk(meta)
        keys |= {_chunk_key(meta, name, i) for i in range(start[name] // c, -(-end[name] // c))}
    return keys


def _old_rows_stamp(loc: Location, start: dict[str, int], end: dict[str, int]) -> dict:
    """What tells, when an interrupted append is finished or rolled back, that the old matrix was not
    changed meanwhile: the data stamp of the chunk files it never writes, and a digest of the old
    elements in the chunks it rewrites."""
    written = _written_keys(loc, start, end)
    kept = data_stamp(loc, {k: v for k, v in file_stamps(loc).items() if k not in written})
    h = hashlib.sha1()
    for name in _EXTENDED:
        arr = zarr.open_array(store=zarr_store(loc / name, read_only=True), mode="r")
        first = start[name] // _chunk(_array_meta(loc, name)) * _chunk(_array_meta(loc, name))
        if start[name] > first:
            h.update(np.ascontiguousarray(read_vector(arr, first, start[name])).tobytes())
    return {"kept_stamp": kept, "band_digest": h.hexdigest()[:16]}


def _old_rows_unchanged(loc: Location, attrs: dict, rec: dict) -> bool:
    try:
        end = {k: int(v) for k, v in rec["to_lengths"].items()}
        then = {"kept_stamp": rec["kept_stamp"], "band_digest": rec["band_digest"]}
    except (KeyError, TypeError, ValueError, AttributeError):
        return False
    return _old_rows_stamp(loc, _lengths(attrs), end) == then


def _versions_before(loc: Location, attrs: dict) -> list[dict]:
    """The history up to today's version (as the dense append's: version 0 recorded on the first
    append, a version marked ``rewritten`` when the chunks changed since the last append)."""
    chain = history({"attributes": attrs})
    stamp, rows = data_stamp(loc), int(attrs["shape"][0])
    if not chain:
        return [{"rows": rows, "stamp": stamp, "at": (attrs.get("blocklin") or {}).get("created") or now()}]
    last = chain[-1]
    if stamp != last.get("stamp") and stamp not in (last.get("aliases") or []):
        chain.append({"rows": rows, "stamp": stamp, "at": now(), "rewritten": True})
    return chain


def _strips(store: SparseStore, memory: int, entry_bytes: int, fixed: int) -> list[int]:
    """Row boundaries of the strips the rows are appended in: each strip's entries and offsets fit the
    budget left beside the chunk buffers ``fixed`` (a row of more entries than that is refused)."""
    room = memory - fixed
    per_entry, per_row = _STRIP_COPIES * entry_bytes, _STRIP_COPIES * 8
    if room < per_entry + per_row:
        need = fixed + per_entry + per_row
        raise BudgetError(explain("memory", "must hold the chunk buffers of the sparse arrays and a strip of rows "
                                  "while appending", format_size(memory), f"pass memory='{format_size(need)}' or "
                                  "more"), minimum=need)
    cap_rows = max(1, room // (2 * per_row))
    cap_entries = max(1, (room - per_row * min(cap_rows, store.shape[0])) // per_entry)
    bounds, r0, p = [0], 0, store.shape[0]
    while r0 < p:
        ptr = read_vector(store.indptr, r0, min(p, r0 + cap_rows) + 1).astype(np.int64, copy=False)
        r1 = r0 + int(np.searchsorted(ptr - ptr[0], cap_entries, side="right")) - 1
        if r1 == r0:
            need = fixed + per_row + per_entry * int(ptr[1] - ptr[0])
            raise BudgetError(explain("memory", "must hold the entries of one row of the rows appended a few times "
                                      "over", format_size(memory), f"pass memory='{format_size(need)}' or more (row "
                                      f"{r0} of the rows holds {int(ptr[1] - ptr[0])} entries)"), minimum=need)
        bounds.append(r1)
        r0 = r1
    return bounds


def append_sparse(loc: Location, rows: Any, *, memory: int, progress: Any = None, nan: str = "allow",
                  from_format: str | None = None, reader_options: dict | None = None) -> Any:
    """Append rows to the sparse matrix at ``loc`` (module notes); the caller holds the matrix's lock.

    Returns the grown :class:`~blocklin.sparse.SparseMatrix`, its ``report`` the rows and entries before
    and after, bytes written, seconds and the version.
    """
    from blocklin.sparse import SparseMatrix

    t0 = time.perf_counter()
    attrs = sparse_target(loc)
    m0, n = (int(s) for s in attrs["shape"])
    dt = np.dtype(attrs["dtype"])
    rec = read_journal(loc)
    if rec is not None:
        check_not_busy(loc, rec)
        if rec.get("to_lengths") == _lengths(attrs):  # killed after its commit: finished, but for the journal
            backend(loc).delete(JOURNAL)
            rec = None
    src = _rows_as_group(rows, n, dt, memory, from_format, dict(reader_options or {}))
    try:
        if src.src_loc is not None:
            from blocklin.storage.guard import relation

            if relation(src.src_loc, loc):
                raise ParameterError(explain("rows", "must not be the matrix appended to, nor inside it", src.what,
                                             "copy the rows elsewhere first"))
        p, q = src.store.shape[0], src.store.nnz
        stamp = source_stamp(src.src_loc)
        start = _lengths(attrs)
        if rec is not None:  # an interrupted append: the same one is finished, any other refused
            if rec.get("from_lengths") != start or rec.get("to_rows") != m0 + p or \
                    rec.get("source_stamp") != stamp or stamp is None:
                raise interrupted_refusal(loc, rec, stamp)
            chain = rec["versions"]
        else:
            chain = _versions_before(loc, attrs)
        if p == 0:
            out = SparseMatrix(loc)
            out.report = {"operation": "append", "rows_before": m0, "rows_added": 0, "rows": m0, "nnz_added": 0,
                          "source": src.what, "bytes_written": 0, "seconds": time.perf_counter() - t0,
                          "version": max(0, len(chain) - 1)}
            return out
        idx = index_dtype_for(n)
        fixed = sum(_chunk(_array_meta(loc, k)) * s for k, s in
                    (("indptr", 8), ("indices", idx.itemsize), ("data", dt.itemsize), ("row_blocks", 8)))
        bounds = _strips(src.store, memory, src.store.dtype.itemsize + dt.itemsize + idx.itemsize, fixed)
        end = {"indptr": m0 + p + 1, "indices": start["indices"] + q, "data": start["data"] + q,
               "row_blocks": start["row_blocks"] + len(bounds) - 1}
        if rec is not None and not _old_rows_unchanged(loc, attrs, rec):
            chain = chain + [{"rows": m0, "stamp": data_stamp(loc), "at": now(), "rewritten": True}]
        journal = {"owner": ownership.new_record(operation="append"), "from_rows": m0, "to_rows": m0 + p,
                   "from_lengths": start, "to_lengths": end, "source": src.what, "source_stamp": stamp,
                   "versions": chain, **_old_rows_stamp(loc, start, end)}
        backend(loc).write_text(JOURNAL, json.dumps(journal))
        try:
            written, widest = _copy(loc, src.store, start, bounds, dt, nan, progress)
            _set_lengths(loc, end)
        except BaseException:  # an error or Ctrl-C: undone here; only a killed process leaves the journal
            _undo(loc, attrs, journal)
            raise
    finally:
        src.close()
    chain = chain + [{"rows": m0 + p, "stamp": data_stamp(loc), "at": now(), "source": src.what, "added": p}]
    grown = dict(attrs, shape=[m0 + p, n], nnz=end["indices"], row_blocks=end["row_blocks"] - 1,
                 max_block_rows=max(int(attrs.get("max_block_rows") or 0), widest))
    grown[VERSIONS_KEY] = chain
    _commit(loc, grown)
    backend(loc).delete(JOURNAL)
    out = SparseMatrix(loc)
    out.report = {"operation": "append", "rows_before": m0, "rows_added": p, "rows": m0 + p, "nnz_added": q,
                  "row_blocks_added": len(bounds) - 1, "source": src.what, "bytes_written": written,
                  "seconds": time.perf_counter() - t0, "version": len(chain) - 1}
    return out


def _copy(loc: Location, store: SparseStore, start: dict[str, int], bounds: list[int], dt: np.dtype, nan: str,
          progress: Any) -> tuple[int, int]:
    """Write the rows strip by strip (each a row block); returns the bytes written and the most rows of a strip."""
    m0, nnz0 = start["indptr"] - 1, start["indices"]
    ext = {k: _Extender(loc, k, start[k]) for k in _EXTENDED}
    prog = make_progress(progress)
    prog.start(len(bounds) - 1, f"append {store.shape[0]} rows to {loc.name}")
    widest = 0
    try:
        for r0, r1 in zip(bounds[:-1], bounds[1:]):
            ptr, idx, val = store.read_rows(r0, r1)
            rows_of = lambda at, ptr=ptr, r0=r0: r0 + int(np.searchsorted(ptr, at[0], side="right")) - 1  # noqa: E731
            check_exact(val, dt, lambda at: f"row {rows_of(at)}, column {int(idx[at[0]])} of the rows")
            cast = val.astype(dt, copy=False)
            if nan == "error" and cast.dtype.kind in "fc" and not np.isfinite(cast).all():
                i = int(np.flatnonzero(~np.isfinite(cast))[0])
                raise ParameterError(explain("rows", "must be finite (nan='error')", f"{cast[i]} at row "
                                             f"{rows_of((i,))}, column {int(idx[i])} of the rows", "fix the data, "
                                             "or pass nan='allow' to store it"))
            base = ext["indices"].count - nnz0  # entries of the rows appended before this strip
            ext["indptr"].append(ptr[1:] + (nnz0 + base))
            ext["indices"].append(idx)
            ext["data"].append(cast)
            ext["row_blocks"].append(np.array([m0 + r1], np.int64))
            widest = max(widest, r1 - r0)
            prog.advance(1)
        for e in ext.values():
            e.close()
    finally:
        prog.close()
    return sum(e.written for e in ext.values()), widest


def _set_lengths(loc: Location, lengths: dict[str, int]) -> None:
    """Each array's ``zarr.json`` with its length (the group's attributes still say which is the matrix)."""
    be = backend(loc)
    for name in _EXTENDED:
        meta = _array_meta(loc, name)
        if meta["shape"] != [lengths[name]]:
            be.write_text(f"{name}/zarr.json", json.dumps(dict(meta, shape=[lengths[name]]), indent=2))


def _commit(loc: Location, attrs: dict) -> None:
    """Write the group's ``zarr.json`` with ``attrs``: one object written whole (the commit)."""
    meta = json.loads(backend(loc).read_text("zarr.json"))
    backend(loc).write_text("zarr.json", json.dumps(dict(meta, attributes=attrs), indent=2))


def _undo(loc: Location, attrs: dict, rec: dict) -> int:
    """Remove what an append beyond the matrix of ``attrs`` wrote (chunk files past its lengths, longer
    array metadata) and its journal; the history records a rewrite of the old rows where ``rec`` says
    they changed meanwhile, else the rewritten chunks' stamp as the same version's. Returns the chunk
    files removed."""
    unchanged = _old_rows_unchanged(loc, attrs, rec)  # before the chunks beyond are removed
    lengths = _lengths(attrs)
    _set_lengths(loc, lengths)
    removed = 0
    for name in _EXTENDED:
        meta = _array_meta(loc, name)
        keep = -(-lengths[name] // _chunk(meta))
        key = re.compile(re.escape(_chunk_key(meta, name, "")) + r"(\d+)(\.tmp-.*)?$")
        for k in backend(loc).keys(name):
            hit = key.fullmatch(k)
            if hit and (int(hit.group(1)) >= keep or hit.group(2)):
                backend(loc).delete(k)
                removed += 0 if hit.group(2) else 1
    chain = rec.get("versions") or _versions_before(loc, attrs)
    last, stamp = dict(chain[-1]), data_stamp(loc)
    if not unchanged:
        chain = chain + [{"rows": lengths["indptr"] - 1, "stamp": stamp, "at": now(), "rewritten": True}]
    elif stamp != last.get("stamp"):
        chain = chain[:-1] + [dict(last, aliases=list(last.get("aliases") or []) + [stamp])]
    _commit(loc, dict(attrs, **{VERSIONS_KEY: chain}))
    backend(loc).delete(JOURNAL)
    return removed


def rollback_sparse(loc: Location) -> dict:
    """Undo an interrupted append of the sparse matrix at ``loc`` (the caller holds its lock): as
    :func:`blocklin.storage.append.rollback`."""
    attrs = sparse_target(loc)
    rows = int(attrs["shape"][0])
    rec = read_journal(loc)
    if rec is None:
        return {"interrupted": False, "removed": 0, "rows": rows}
    check_not_busy(loc, rec)
    if rec.get("to_lengths") == _lengths(attrs):  # killed after its commit: it finished
        backend(loc).delete(JOURNAL)
        return {"interrupted": False, "removed": 0, "rows": rows}
    return {"interrupted": True, "removed": _undo(loc, attrs, rec), "rows": rows}


__all__ = ["SPARSE_DATA_OPERATIONS", "append_sparse", "rollback_sparse", "sparse_target"]
