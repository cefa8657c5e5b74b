"""Appending rows to a stored matrix, atomically and in bounded memory.

A zarr array's chunks beyond its shape are invisible to every reader, and its shape lives in one
object, ``zarr.json``. So :func:`append` (``blocklin append A NEW``):

1. writes a journal, ``A/.blocklin-append.json`` (the rows before and after, the source's stamp,
   the version history, and an owner record: on an object store, which has no locks, a second
   append is refused while the first runs; locally appends to one matrix take turns under a lock);
2. writes the new rows' chunks beyond the old shape, and rewrites the chunk band that held the
   last old rows (its old rows' bytes unchanged) whole: every chunk write is one object written
   whole (a temporary file renamed into place locally, one PUT on object stores), so a reader of
   the old shape finds the same values in it before and after;
3. writes ``zarr.json`` with the new shape, the version history (:mod:`blocklin.storage.versions`)
   and the new chunk count: that write is the commit (atomic locally and on object stores);
4. removes the journal.

A reader sees the old matrix or the new one, never a mix. An append that fails or is interrupted
(Ctrl-C, SIGTERM) before its commit undoes its writes itself; one whose process was killed leaves
the old matrix readable and its journal, and then running the same append again finishes it (its
writes are idempotent), or :func:`rollback` (``blocklin append --rollback A``) removes what it
wrote. Only matrices blocklin wrote are appended to (files blocklin did not write are never
modified).
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

import numpy as np

from blocklin.config import format_size, resolve
from blocklin.errors import (BudgetError, ParameterError, ShapeError, StoreNotFoundError, StoreReadError,
                             UncommittedOutputError, explain)
from blocklin.progress import make_progress
from blocklin.storage import ownership
from blocklin.storage.backend import backend
from blocklin.storage.completeness import STORED_KEY, stored_chunk_indices
from blocklin.storage.location import Location, as_location
from blocklin.storage.recorded_peaks import PeakTally, recordable, recorded, record as record_peaks
from blocklin.storage.records import PENDING_RECORD
from blocklin.storage.append_dtypes import append_dtype, check_exact
from blocklin.storage.append_journal import (JOURNAL, check_not_busy, exclusive, interrupted_refusal, matrix_location,
                                              read_journal, source_stamp)
from blocklin.storage.sparse import is_sparse
from blocklin.storage.sparse_append import append_sparse, rollback_sparse
from blocklin.storage.stamps import file_stamps
from blocklin.storage.versions import VERSIONS_KEY, chunk_grid, data_stamp, history, now, read_meta
from blocklin.storage.zarr_store import _from_metadata, read_block, write_block
from blocklin.validate import in_memory_array

#: Copies of a panel an append holds at once: the source block, its cast, zarr's write temporaries.
PANEL_COPIES = 3


def _target(a: Any, storage_options: dict | None) -> tuple[Location, dict]:
    """The matrix appended to and its metadata; refused unless it is a committed 2-D zarr v3 array
    blocklin wrote."""
    loc = matrix_location(a, storage_options)
    be = backend(loc)
    meta = read_meta(loc)
    if meta is None:
        if not be.exists(""):
            raise StoreNotFoundError(explain("a", "must name an existing zarr array", f"{loc.url!r}, which does "
                                             "not exist", "convert the first rows: blocklin convert FILE A.zarr"))
        raise StoreReadError(explain("a", "must be a zarr v3 array that blocklin wrote", repr(loc.url),
                                     "convert it first: blocklin convert A A2.zarr, then append to A2.zarr"))
    if be.try_read(PENDING_RECORD) is not None:
        raise UncommittedOutputError(explain("a", "must be a committed output", f"{loc.url!r}, an output an "
                                             "interrupted run left unfinished", "finish that run (--resume) first"))
    if not isinstance((meta.get("attributes") or {}).get("blocklin"), dict):
        _check_member(loc)
        raise ParameterError(explain("a", "must be a matrix blocklin wrote (blocklin never modifies data it did not "
                                     "write)", f"{loc.url!r}, which has no blocklin provenance",
                                     "copy it first: blocklin convert A.zarr A2.zarr, then append to A2.zarr"))
    if len(meta["shape"]) != 2:
        raise ShapeError(explain("a", "must be 2-D", f"shape {tuple(meta['shape'])}", "append to a matrix"))
    _check_data(loc, meta)
    return loc, meta


#: The operations whose outputs are data (rows of samples), which rows may be appended to; every other
#: output is a result computed from its inputs (its record says of which version of each).
DATA_OPERATIONS = ("from_array", "convert", "random")


def _check_data(loc: Location, meta: dict) -> None:
    """Refuse a result of an operation: rows appended to a Gram (``n x n``), a factor, an inverse, a
    solution or a product made a matrix that is no longer what its record says (a non-square "Gram"
    that ``update`` then called current), where the rows belong to its inputs."""
    op = meta["attributes"]["blocklin"].get("operation")
    if op in DATA_OPERATIONS:
        return
    m, n = (int(s) for s in meta["shape"])
    _refuse_result(loc, op, f"{loc.url!r}, a result of {op} ({m} x {n})")


def _check_member(loc: Location) -> None:
    """Refuse a member of a result group (an SVD's ``U``, a QR's ``Q``), whose provenance its group holds."""
    import json

    raw = backend(loc.parent).try_read("zarr.json")
    try:
        prov = (json.loads(raw).get("attributes") or {}).get("blocklin") if raw is not None else None
    except ValueError:
        return
    if isinstance(prov, dict) and prov.get("operation") not in DATA_OPERATIONS:
        op = prov.get("operation")
        _refuse_result(loc, op, f"{loc.url!r}, the member {loc.name!r} of a result of {op}")


def _refuse_result(loc: Location, op: Any, what: str) -> None:
    raise ParameterError(explain(
        "a", "must be data (a matrix from " + ", ".join(DATA_OPERATIONS) + "), not a result computed from other "
        f"matrices: appended rows would make it no longer the {op} of its inputs that its record says it is", what,
        "append the rows to its inputs, then bring the result up to date (blocklin update, where its operation "
        "can be updated) or recompute it with --overwrite; to keep it as data of its own, copy it first "
        f"(blocklin convert {loc.url} DATA.zarr) and append to the copy"))


class _ArrayRows:
    """Rows from a NumPy, Dask or zarr array (the reader interface of :mod:`blocklin.storage.formats`)."""

    def __init__(self, x: Any) -> None:
        self.x = x
        self.shape = tuple(int(s) for s in x.shape)
        self.dtype = np.dtype(x.dtype)

    def read(self, rows: slice, cols: slice) -> np.ndarray:
        block = self.x[rows, cols]
        return np.asarray(block.compute() if hasattr(block, "compute") else block)

    def close(self) -> None:
        pass


def _rows_source(rows: Any, width: int, from_format: str | None, opts: dict) -> tuple[Any, str, Location | None]:
    """A reader of the rows to append, what to call them, and the stored location (None in memory)."""
    from blocklin.matrix import Matrix

    if isinstance(rows, Matrix):
        rows = rows.location  # read by row panels, never loaded whole
    if isinstance(rows, (str, Location)) or hasattr(rows, "__fspath__"):
        from blocklin.storage.formats import open_reader
        from blocklin.storage.stamps import input_location

        reader = open_reader(rows if isinstance(rows, Location) else str(rows), format=from_format, **opts)
        return reader, str(getattr(rows, "url", rows)), input_location(rows)
    if type(rows).__module__.startswith(("dask", "zarr")):
        x = rows
        if any(not isinstance(s, (int, np.integer)) for s in x.shape):  # unknown (NaN): a Dask array filtered by value
            raise ShapeError(explain("rows", "must have a known shape (its rows are counted before any is written)",
                                     f"a Dask array of shape {tuple(x.shape)}", "compute its chunk sizes first: "
                                     "rows = rows.compute_chunk_sizes()"))
    else:  # a masked array with masked entries refused (numpy.asarray would append the values under the mask)
        x = in_memory_array(rows, "rows")
    if x.ndim == 1:  # one row (as numpy.vstack takes it), or a column of a one-column matrix
        x = x.reshape((-1, 1) if width == 1 else (1, -1))
    if x.ndim != 2:
        raise ShapeError(explain("rows", "must be 2-D (rows to append)", f"shape {tuple(x.shape)}",
                                 f"reshape it to (-1, {width})"))
    return _ArrayRows(x), f"an array of shape {tuple(x.shape)}", None


def _check_source(reader: Any, meta: dict, loc: Location) -> np.dtype:
    n, dt = int(meta["shape"][1]), np.dtype(meta["data_type"])
    if reader.shape[1] != n:
        raise ShapeError(explain("rows", f"must have the matrix's {n} columns", f"{reader.shape[0]} x "
                                 f"{reader.shape[1]}", f"append rows of width {n} to {loc.url}"))
    return append_dtype(reader.dtype, dt)


def _check_exact(src: np.ndarray, dt: np.dtype, first: int) -> None:
    """:func:`~blocklin.storage.append_dtypes.check_exact` of a panel whose first row is row ``first`` of
    the rows given."""
    check_exact(src, dt, lambda at: f"row {first + at[0]}, column {at[1]} of the rows")


def _panel_rows(chunk: int, width: int, dt: np.dtype, memory: int) -> int:
    """Rows per panel: a multiple of the chunk height whose copies fit the budget."""
    row_bytes = width * dt.itemsize * PANEL_COPIES
    need = chunk * row_bytes
    if need > memory:
        raise BudgetError(explain("memory", "must hold one chunk band of the matrix a few times over while "
                                  "appending", format_size(memory), f"pass memory='{format_size(need)}' or more "
                                  f"({PANEL_COPIES} copies of {chunk} rows x {width} columns)"), minimum=need)
    return max(chunk, memory // row_bytes // chunk * chunk)


def _versions_before(loc: Location, meta: dict) -> list[dict]:
    """The history up to today's version: version 0 recorded on the first append, and a version
    marked ``rewritten`` when the chunks changed since the last append (not by an append)."""
    chain = history(meta)
    stamp = data_stamp(loc)
    rows = int(meta["shape"][0])
    if not chain:
        created = (meta.get("attributes") or {}).get("blocklin", {}).get("created")
        return [{"rows": rows, "stamp": stamp, "at": created or now()}]
    last = chain[-1]
    if stamp != last.get("stamp") and stamp not in (last.get("aliases") or []):
        chain.append({"rows": rows, "stamp": stamp, "at": now(), "rewritten": True})
    return chain


def append(a: Any, rows: Any, *, memory: Any = None, storage_options: dict | None = None, progress: Any = None,
           nan: str = "allow", from_format: str | None = None, **reader_options: Any) -> Any:
    """Append rows to a stored matrix, atomically, in bounded memory.

    Parameters
    ----------
    a : path, URL, Location, Matrix or SparseMatrix
        A 2-D zarr v3 matrix blocklin wrote (``blocklin convert``, ``from_array``, an operation's output),
        or a stored sparse matrix (a ``blocklin-csr`` group: its CSR arrays are extended, the rows given
        as a SciPy matrix, a NumPy array, ``.mtx``, ``.npz``, an HDF5 sparse group or another group;
        :mod:`blocklin.storage.sparse_append`).
    rows : array_like, Dask array, Matrix, or path
        The rows: ``p x n`` (a 1-D array of ``n`` values is one row), in memory or in any format
        ``blocklin convert`` reads (``.npy``, ``.zarr``, ``FILE.h5:/DATASET``, ``.csv``, ...; format
        options such as ``delimiter`` or ``shape`` as keywords). Cast to ``a``'s dtype where NumPy casts
        safely (float32 into float64, complex64 or real rows into complex128) and integers into floats
        (as NumPy's linear algebra casts them); other dtypes (float64 into float32, complex rows into a real
        matrix) are refused.
    memory : int or str, optional
        Budget (default from the config): a panel of rows and its copies.
    storage_options : dict, optional
        fsspec options for URLs.
    progress : bool or object, optional
        Progress bar (:func:`blocklin.progress.make_progress`).
    nan : {"allow", "error"}
        NaN or Inf in the rows: stored (default, as ``convert`` does), or an error naming the position.

    Returns
    -------
    Matrix
        ``a`` with its new shape; ``.report`` holds the rows before and after, bytes and seconds.

    Notes
    -----
    A reader sees the old matrix or the new one (module notes). The matrix records every version in
    its attributes (``blocklin_versions``), which :func:`blocklin.update` reads to bring results up
    to date by reading only the new rows. An interrupted append is finished by running it again or
    undone by :func:`rollback`. Appends to one local matrix run one at a time (a second waits for the
    first); on an object store a second one is refused while the first runs.

    Examples
    --------
    >>> import numpy as np
    >>> import blocklin as bl
    >>> _ = bl.from_array(np.ones((4, 3)), "G.zarr", chunks=(2, 3))
    >>> bl.append("G.zarr", np.zeros((3, 3))).shape
    (7, 3)
    """
    if nan not in ("allow", "error"):
        raise ParameterError(explain("nan", "must be 'allow' or 'error'", repr(nan), "pass nan='error'"))
    cfg = resolve(memory=memory)
    loc = matrix_location(a, storage_options)
    if isinstance(rows, str) and "://" in rows:  # a URL is read with the call's storage_options, as a's
        rows = as_location(rows, storage_options, name="rows")
    with exclusive(loc):  # a second append here waits for this one
        if is_sparse(loc):  # a blocklin-csr group: its CSR arrays are extended (storage.sparse_append)
            return append_sparse(loc, rows, memory=cfg.memory, progress=progress, nan=nan, from_format=from_format,
                                 reader_options=reader_options)
        return _append(a, rows, cfg.memory, storage_options, progress, nan, from_format, reader_options)


def _append(a: Any, rows: Any, memory: int, storage_options: dict | None, progress: Any, nan: str,
            from_format: str | None, reader_options: dict) -> Any:
    from blocklin.matrix import Matrix

    t0 = time.perf_counter()
    loc, meta = _target(a, storage_options)
    m0, n = (int(s) for s in meta["shape"])
    chunks = chunk_grid(meta)
    rec = read_journal(loc)
    if rec is not None:
        check_not_busy(loc, rec)
    reader, what, src_loc = _rows_source(rows, n, from_format, reader_options)
    try:
        if src_loc is not None:
            from blocklin.storage.guard import relation

            if relation(src_loc, loc):
                raise ParameterError(explain("rows", "must not be the matrix appended to, nor inside it", what,
                                             "copy the rows elsewhere first"))
        dt = _check_source(reader, meta, loc)
        p = int(reader.shape[0])
        stamp = source_stamp(src_loc)
        if rec is not None:  # an interrupted append: the same one is finished, any other refused
            if rec.get("from_rows") != m0 or rec.get("to_rows") != m0 + p or rec.get("source_stamp") != stamp or \
                    stamp is None:
                raise interrupted_refusal(loc, rec, stamp)
            chain = rec["versions"]
        else:
            chain = _versions_before(loc, meta)
        if p == 0:  # nothing to add: the matrix as it is, with the report of an append of no rows
            out = Matrix(loc)
            out.report = {"operation": "append", "rows_before": m0, "rows_added": 0, "rows": m0, "source": what,
                          "bytes_written": 0, "seconds": time.perf_counter() - t0, "version": max(0, len(chain) - 1)}
            return out
        panel = _panel_rows(chunks[0], n, dt, memory)
        # the peaks recorded of the rows already there, if they still hold: with the new rows' they are
        # the grown matrix's (storage.recorded_peaks); of the side the record holds, or the largest
        # magnitude alone where the grown matrix's side is another
        held = recorded(loc, (m0, n), column_peaks=False) if recordable(dt) else None
        tally = PeakTally((m0 + p, n)) if held is not None else None
        if held is not None and tally.transposed is held.transposed:
            held = recorded(loc, (m0, n), transposed=held.transposed) or held
        if rec is not None and not _old_rows_unchanged(loc, meta, rec):
            chain = chain + [_rewritten(loc, m0)]  # the old rows changed while the append was interrupted
        journal = {"owner": ownership.new_record(operation="append"), "from_rows": m0, "to_rows": m0 + p,
                   "source": what, "source_stamp": stamp, "versions": chain, **_old_rows_stamp(loc, meta, m0 + p)}
        backend(loc).write_text(JOURNAL, json.dumps(journal))
        try:
            written = _copy(loc, meta, reader, m0, p, dt, panel, nan, progress, tally)
        except BaseException:  # an error or Ctrl-C: undone here; only a killed process leaves the journal
            _rollback(loc, None)
            raise
    finally:
        reader.close()
    new = dict(meta, shape=[m0 + p, n])
    big = _from_metadata(loc, new, "r")
    chain = chain + [{"rows": m0 + p, "stamp": data_stamp(loc), "at": now(), "source": what, "added": p}]
    _commit(loc, new, chain, len(stored_chunk_indices(big, loc)))
    backend(loc).delete(JOURNAL)
    if tally is not None:
        if held.columns is not None and held.transposed is tally.transposed:
            tally.merge(held.columns, 0, 0)  # the kept rows' (or columns') peaks at their place
        else:
            tally.merge_amax(held.amax)
        record_peaks(loc, tally)
    out = Matrix(loc)
    out.report = {"operation": "append", "rows_before": m0, "rows_added": p, "rows": m0 + p, "source": what,
                  "bytes_written": written, "seconds": time.perf_counter() - t0, "version": len(chain) - 1}
    return out


def _written_keys(loc: Location, meta: dict, to_rows: int) -> set[str]:
    """The chunk files an append from ``meta``'s rows to ``to_rows`` writes: the band holding the last old
    rows and every band beyond."""
    m0, n = (int(s) for s in meta["shape"])
    ch = chunk_grid(meta)
    keys = _from_metadata(loc, meta, "r").metadata
    return {str(keys.encode_chunk_key((r, c))) for r in range(m0 // ch[0], -(-to_rows // ch[0]))
            for c in range(-(-n // ch[1]))}


def _old_rows_stamp(loc: Location, meta: dict, to_rows: int) -> dict:
    """What tells, when an interrupted append is finished or rolled back, that its old rows were not
    changed meanwhile: the data stamp of the chunk files it never writes, and a digest of the old rows'
    values in the band it rewrites (its files change with the append itself)."""
    import hashlib

    m0, n = (int(s) for s in meta["shape"])
    written = _written_keys(loc, meta, to_rows)
    kept = data_stamp(loc, {k: v for k, v in file_stamps(loc).items() if k not in written})
    start = m0 // chunk_grid(meta)[0] * chunk_grid(meta)[0]
    band = read_block(_from_metadata(loc, meta, "r"), slice(start, m0), slice(0, n)) if m0 > start else \
        np.empty((0, n))
    return {"kept_stamp": kept, "band_digest": hashlib.sha1(np.ascontiguousarray(band).tobytes()).hexdigest()[:16]}


def _old_rows_unchanged(loc: Location, meta: dict, rec: dict) -> bool:
    """Whether the old rows are those the interrupted append of ``rec`` started from (False where its
    journal does not say)."""
    try:
        to_rows = int(rec["to_rows"])
        then = {"kept_stamp": rec["kept_stamp"], "band_digest": rec["band_digest"]}
    except (KeyError, TypeError, ValueError):
        return False
    return _old_rows_stamp(loc, meta, to_rows) == then


def _rewritten(loc: Location, rows: int) -> dict:
    """A version recording that the rows were rewritten (not by an append): results computed before
    it are not updated from it (:func:`blocklin.storage.versions.growth`)."""
    return {"rows": rows, "stamp": data_stamp(loc), "at": now(), "rewritten": True}


def _copy(loc: Location, meta: dict, reader: Any, m0: int, p: int, dt: np.dtype, panel: int, nan: str,
          progress: Any, tally: PeakTally | None = None) -> int:
    """Write rows ``m0:m0 + p`` (and the old rows sharing their first chunk band) panel by panel, their
    peaks merged into ``tally``."""
    n, ch = int(meta["shape"][1]), chunk_grid(meta)[0]
    old = _from_metadata(loc, meta, "r")
    big = _from_metadata(loc, dict(meta, shape=[m0 + p, n]), "r+")
    start = m0 // ch * ch  # the band holding the last old rows is rewritten whole
    prog = make_progress(progress)
    prog.start(-(-(m0 + p - start) // panel), f"append {p} rows to {loc.name}")
    written = 0
    try:
        for r0 in range(start, m0 + p, panel):
            r1 = min(m0 + p, r0 + panel)
            block = np.empty((r1 - r0, n), dtype=dt)
            if r0 < m0:
                read_block(old, slice(r0, m0), slice(0, n), out=block[: m0 - r0])
            s0 = max(r0, m0)
            src = reader.read(slice(s0 - m0, r1 - m0), slice(0, n))
            if nan == "error" and src.dtype.kind in "fc" and not np.isfinite(src).all():
                i, j = np.argwhere(~np.isfinite(src))[0]
                raise ParameterError(explain("rows", "must be finite (nan='error')", f"{src[i, j]} at row "
                                             f"{s0 - m0 + i}, column {j} of the rows", "fix the data, or pass "
                                             "nan='allow' to store it"))
            _check_exact(src, dt, s0 - m0)
            block[s0 - r0:] = src
            write_block(big, slice(r0, r1), slice(0, n), block)
            if tally is not None:
                tally.add(block, r0, 0)
            written += block.nbytes
            prog.advance(1)
    finally:
        prog.close()
    return written


def _commit(loc: Location, meta: dict, chain: list[dict], stored: int) -> None:
    """Write ``zarr.json`` with the new shape and history: one object written whole (the commit)."""
    attrs = dict(meta.get("attributes") or {})
    attrs[VERSIONS_KEY] = chain
    prov = dict(attrs.get("blocklin") or {})
    if STORED_KEY in prov:
        prov[STORED_KEY] = stored
    attrs["blocklin"] = prov
    backend(loc).write_text("zarr.json", json.dumps(dict(meta, attributes=attrs), indent=2))


def rollback(a: Any, *, storage_options: dict | None = None) -> dict:
    """Undo an interrupted append: remove the chunks it wrote beyond the matrix's shape.

    The chunk band it rewrote holds the old rows' bytes unchanged; its new stamp is recorded as the
    same version's (so results computed before stay updatable). Returns ``{"interrupted": whether an
    append was, "removed": chunk files removed, "rows": the matrix's rows}``.
    """
    loc = matrix_location(a, storage_options)
    with exclusive(loc):
        if is_sparse(loc):
            return rollback_sparse(loc)
        return _rollback(a, storage_options)


def _rollback(a: Any, storage_options: dict | None) -> dict:
    loc, meta = _target(a, storage_options)
    rec = read_journal(loc)
    if rec is None:
        return {"interrupted": False, "removed": 0, "rows": int(meta["shape"][0])}
    check_not_busy(loc, rec)
    m0, n = (int(s) for s in meta["shape"])
    ch = chunk_grid(meta)
    unchanged = _old_rows_unchanged(loc, meta, rec)  # before the chunks beyond are removed
    big = _from_metadata(loc, dict(meta, shape=[int(rec.get("to_rows") or m0), n]), "r")
    keep = -(-m0 // ch[0])
    beyond = [str(big.metadata.encode_chunk_key(idx)) for idx in stored_chunk_indices(big, loc) if idx[0] >= keep]
    backend(loc).delete_many(beyond)
    if loc.is_local:  # the chunk rows' folders the append made (c/<row>), now empty
        for folder in sorted({os.path.dirname(os.path.join(loc.url, k)) for k in beyond}, reverse=True):
            while folder.startswith(loc.url + os.sep):
                try:
                    os.rmdir(folder)
                except OSError:  # not empty: it holds chunks of the matrix
                    break
                folder = os.path.dirname(folder)
    chain = rec.get("versions") or _versions_before(loc, meta)
    last = dict(chain[-1])
    stamp = data_stamp(loc)
    if not unchanged:  # rows rewritten while the append was interrupted: no alias of the version before
        chain = chain + [_rewritten(loc, m0)]
    elif stamp != last.get("stamp"):
        chain = chain[:-1] + [dict(last, aliases=list(last.get("aliases") or []) + [stamp])]
    _commit(loc, meta, chain, len(stored_chunk_indices(_from_metadata(loc, meta, "r"), loc)))
    backend(loc).delete(JOURNAL)
    return {"interrupted": True, "removed": len(beyond), "rows": m0}


__all__ = ["JOURNAL", "append", "rollback"]
