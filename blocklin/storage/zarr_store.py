"""Opening, creating, reading and writing zarr arrays (v3 written, v2 and v3 read)."""

from __future__ import annotations

import contextlib
import functools
import json
import os
import re
from typing import Any

import numpy as np
import zarr
import zarr.codecs
import zarr.storage
from zarr.core.buffer import default_buffer_prototype
from zarr.core.buffer.cpu import NDBuffer

from blocklin.device import pool
from blocklin.errors import ConfigError, FormatError, StoreNotFoundError, StoreReadError, UncommittedOutputError, explain
from blocklin.storage.backend import backend, zarr_store
from blocklin.storage.location import Location, as_location, store_location
import blocklin._readstats as readstats
from blocklin.storage.rawchunks import decoded_access, raw_access, raw_vector
from blocklin.storage.readerrors import check_metadata, reading
from blocklin.storage.records import DEFERRED_META, INPUTS_RECORD, OWNER_RECORD, PENDING_RECORD
from blocklin.storage.space import check_space, writing


def codec_chain(codec: str | None, checksum: bool = False) -> tuple[Any, ...]:
    """Zarr v3 bytes-to-bytes codecs for a codec name.

    ``"none"`` (the engine default: random floats do not compress), ``"zstd"``, ``"blosc-lz4"``,
    ``"blosc-zstd"``, ``"gzip"``; ``checksum=True`` appends a crc32c codec so that corrupted
    chunks fail loudly on read.
    """
    name = (codec or "none").lower()
    table = {
        "none": (),
        "zstd": (zarr.codecs.ZstdCodec(level=3),),
        "blosc-lz4": (zarr.codecs.BloscCodec(cname="lz4", clevel=5, shuffle="shuffle"),),
        "blosc-zstd": (zarr.codecs.BloscCodec(cname="zstd", clevel=3, shuffle="shuffle"),),
        "gzip": (zarr.codecs.GzipCodec(level=5),),
    }
    if name not in table:
        raise ConfigError(explain("codec", f"must be one of {sorted(table)}", repr(codec), "pass codec='none' or 'zstd'"))
    chain = table[name]
    if checksum:
        chain = chain + (zarr.codecs.Crc32cCodec(),)
    return chain


def describe_codecs(arr: zarr.Array) -> str:
    """A short human name for an array's encoding (``"none"``, ``"zstd"``, ``"delta+zstd"``, ...).

    Filters come first, as they are applied (a v2 array's ``Delta`` or ``AsType``, a v3 array's
    array-to-array codecs other than a transpose, which :func:`stored_order` reports): an array
    delta-encoded, or stored in a narrower dtype, is not ``"none"``.
    """
    try:
        filters = [f for f in arr.filters if type(f).__name__ != "TransposeCodec"]
        comps = list(arr.compressors)
    except Exception:  # pragma: no cover - exotic metadata
        return "unknown"
    # a numcodecs filter (v2) by its id, a zarr codec by its class
    names = [str(getattr(f, "codec_id", None) or type(f).__name__.replace("Codec", "")).lower() for f in filters]
    for c in comps:
        cls = type(c).__name__.replace("Codec", "").lower()
        if cls == "blosc":
            cname = getattr(c, "cname", None)
            cls = f"blosc-{getattr(cname, 'value', cname)}"
        names.append(cls)
    return "+".join(names) if names else "none"


def stored_order(arr: zarr.Array) -> str:
    """``"F"`` where a 2-D array's chunks hold their values column by column (a v2 array of
    ``order="F"``, a v3 array whose one array-to-array codec is the ``transpose`` of its two
    dimensions), else ``"C"``: what ``blocklin info`` reports as the order (reads return C either way)."""
    meta = arr.metadata
    if getattr(meta, "zarr_format", None) == 2:
        return "F" if getattr(meta, "order", "C") == "F" and len(arr.shape) == 2 else "C"
    try:
        filters = list(arr.filters)
    except Exception:  # pragma: no cover - exotic metadata
        return "C"
    if len(arr.shape) == 2 and len(filters) == 1 and type(filters[0]).__name__ == "TransposeCodec":
        return "F" if tuple(filters[0].order) == (1, 0) else "C"
    return "C"


def stored_dtype(arr: zarr.Array) -> np.dtype:
    """The dtype of the values as the chunks store them: a v3 array whose ``bytes`` codec is
    big-endian stores ``>f8`` where ``arr.dtype`` (what reads return) says ``<f8``."""
    dt = np.dtype(arr.dtype)
    if getattr(arr.metadata, "zarr_format", None) != 3 or dt.itemsize == 1:
        return dt
    try:
        endian = getattr(arr.serializer, "endian", None)
    except Exception:  # pragma: no cover - exotic metadata
        return dt
    endian = getattr(endian, "value", endian)
    return dt.newbyteorder(">" if endian == "big" else "<") if endian in ("big", "little") else dt




def uncommitted_message(loc: Location, name: str) -> str:
    return explain(name, "must be a committed output (an interrupted blocklin job left this one unfinished)",
                   f"{loc.url!r}, which holds {PENDING_RECORD} and no finished array",
                   "rerun the same operation with resume=True (CLI: --resume) to complete it, or pass "
                   "overwrite=True (--overwrite) to start again, or remove it (blocklin.storage.remove)")


_PARTIAL_NAME = re.compile(r"^\..+\.partial-[0-9a-zA-Z]+$")


def _inside_partial(path: str) -> bool:
    """Whether ``path`` is (or lies inside) an uncommitted local output ``.NAME.partial-TOKEN``."""
    return any(_PARTIAL_NAME.match(part) for part in os.path.abspath(path).split(os.sep))


def _not_found_hint(loc: Location) -> str:
    if loc.is_local:
        parent = os.path.dirname(loc.url) or "."
        prefix = f".{os.path.basename(loc.url)}.partial-"
        try:
            partials = [f for f in os.listdir(parent) if f.startswith(prefix)]
        except OSError:
            partials = []
        if partials:
            return (f"an interrupted blocklin job left {os.path.join(parent, partials[0])!r}: rerun it with "
                    "resume=True (CLI: --resume) to complete the output, or delete that folder")
    return "check the path, or create it with blocklin.from_array / blocklin convert"


def open_zarr(path: Any, *, name: str = "path", mode: str = "r", allow_pending: bool = False,
              storage_options: dict | None = None) -> zarr.Array:
    """Open a zarr array (v2 or v3) with errors that name the location and a fix.

    ``path`` is a local path, a URL, a :class:`~blocklin.storage.location.Location`, a zarr store or
    a ``zarr.Array``. Outputs an interrupted job left unfinished are refused
    (:class:`~blocklin.errors.UncommittedOutputError`) unless the location is the job's own pending
    output (``Location.pending``) or ``allow_pending``.
    """
    loc = as_location(path, storage_options, name=name)
    be = backend(loc)
    allowed = allow_pending or loc.pending
    # Reads, not existence checks: a missing object costs one request on an object store.
    meta = be.try_read("zarr.json")
    has_meta = meta is not None or be.try_read(".zarray") is not None
    if not allowed and mode == "r" and loc.is_local and _inside_partial(loc.url):
        raise UncommittedOutputError(explain(
            name, "must be a committed store, not the hidden partial folder (.NAME.partial-TOKEN) of an output "
            "being written or left by an interrupted run", repr(loc.url),
            "wait for the run writing it to finish, or rerun that operation with --resume (resume=True) to "
            "complete it, or delete the folder; then pass the finished output NAME"))
    if not allowed and (be.try_read(PENDING_RECORD) is not None
                        or (not has_meta and backend(loc.parent).try_read(PENDING_RECORD) is not None)):
        raise UncommittedOutputError(uncommitted_message(loc, name))
    if meta is not None and b'"group"' in meta and json.loads(meta).get("node_type") == "group":
        if (json.loads(meta).get("attributes") or {}).get("format") == "blocklin-csr":
            raise StoreReadError(explain(name, "must be a dense zarr array for this operation",
                                         f"{loc.url!r}, a sparse matrix (blocklin-csr group)",
                                         "open it with blocklin.open(PATH) (a SparseMatrix, which blocklin.svd "
                                         "takes), or convert its source with --dense for dense operations"))
        raise StoreReadError(explain(name, "must be a zarr array", f"{loc.url!r}, a zarr group",
                                     "name one of its arrays (PATH/NAME)"))
    if meta is not None and not loc.is_local:
        try:  # the metadata just read: no second round of requests through zarr's opener
            return _from_metadata(loc, json.loads(meta), mode)
        except Exception:  # noqa: BLE001 - let zarr's opener report what is wrong
            pass
    if not has_meta:
        if allowed and be.exists(DEFERRED_META):
            return _open_deferred(loc, mode)
        if not be.exists(""):
            raise StoreNotFoundError(explain(name, "must name an existing zarr array",
                                             f"{loc.url!r}, which does not exist", _not_found_hint(loc)))
        is_group = be.exists(".zgroup") or any(k.endswith("/zarr.json") for k in be.keys("")[:1000])
        hint = "it is a zarr group; name one of its arrays (PATH/NAME)" if is_group else \
            "convert it first: blocklin convert FILE OUT.zarr"
        raise StoreReadError(explain(name, "must be a zarr array (a folder with zarr.json or .zarray)",
                                     f"{loc.url!r}", hint))
    try:
        arr = zarr.open_array(store=zarr_store(loc, read_only=mode == "r"), mode=mode)
    except Exception as exc:
        raise StoreReadError(explain(name, "must be a readable zarr array", f"{loc.url!r} ({exc})",
                                     "check the store's metadata, or re-create it")) from exc
    check_metadata(arr, loc.url, name)
    return arr


def _from_metadata(loc: Location, meta: dict, mode: str) -> zarr.Array:
    from zarr.core.array import AsyncArray
    from zarr.storage import StorePath

    if meta.get("node_type") != "array":
        raise FormatError("not an array")
    store = zarr_store(loc, read_only=mode == "r")
    return zarr.Array(AsyncArray(metadata=meta, store_path=StorePath(store, "")))


def _open_deferred(loc: Location, mode: str) -> zarr.Array:
    """An array of an uncommitted output, from its deferred metadata (no ``zarr.json`` yet)."""
    return _from_metadata(loc, json.loads(backend(loc).read_text(DEFERRED_META)), mode)


@functools.lru_cache(maxsize=64)
def _open_cached(loc: Location, mode: str, stamp: Any) -> Any:
    return open_zarr(loc, mode=mode, allow_pending=True)


def open_cached(path: Any, mode: str = "r") -> Any:
    """Open an array for a task, cached per process and keyed by its metadata's version.

    Tasks open their job's own unfinished outputs, so pending ones are allowed here.
    """
    loc = as_location(path)
    be = backend(loc)
    stamp = None
    for key in ("zarr.json", ".zarray", DEFERRED_META):
        stamp = be.stamp(key)
        if stamp is not None:
            stamp = (key, stamp)
            break
    return _open_cached(loc, mode, stamp)


def store_path(arr: Any) -> Location | None:
    """Location of a zarr array on a store other processes can open (local or fsspec), else None."""
    store = getattr(arr, "store", None)
    if store is None:
        return None
    base = store_location(store)
    if base is None:
        return None
    sub = getattr(arr, "path", "") or ""
    return base.child(sub) if sub else base


def _metadata_dict(shape: tuple[int, ...], dtype: Any, chunks: tuple[int, ...], codec: str | None,
                   checksum: bool, attributes: dict | None) -> dict:
    """The zarr v3 metadata an array with these settings would have (built in memory, nothing written)."""
    tmp = zarr.create_array(store=zarr.storage.MemoryStore(), shape=shape, chunks=chunks, dtype=np.dtype(dtype),
                            compressors=codec_chain(codec, checksum) or None, fill_value=0, zarr_format=3,
                            attributes=attributes or {})
    return json.loads(tmp.metadata.to_buffer_dict(default_buffer_prototype())["zarr.json"].to_bytes())


def array_file_bytes(shape: tuple[int, ...], chunks: tuple[int, ...], dtype: Any) -> int:
    """Bytes the chunk files of an uncompressed array hold when every chunk is written (edge chunks
    are stored whole)."""
    count = 1
    for s, c in zip(shape, chunks):
        count *= -(-int(s) // max(1, int(c)))
    size = np.dtype(dtype).itemsize
    for c in chunks:
        size *= int(c)
    return count * size


def create_array(path: Any, *, shape: tuple[int, ...], dtype: Any, chunks: tuple[int, ...],
                 codec: str | None = "none", checksum: bool = False, attributes: dict | None = None,
                 overwrite: bool = False) -> zarr.Array:
    """Create a zarr v3 array at ``path`` (a local path, URL or Location).

    Inside an uncommitted output (``Location.pending``) the metadata is deferred: it is written to
    ``.blocklin-meta.json`` and becomes ``zarr.json`` when the output commits, so no reader sees an
    array before it is complete.
    """
    loc = as_location(path)
    chunks = tuple(max(1, int(c)) for c in chunks)
    shape = tuple(int(s) for s in shape)
    overwrite = overwrite or left_in_partial(loc)
    check_space(loc, array_file_bytes(shape, chunks, dtype), "store",
                " x ".join(map(str, shape)) + f" {np.dtype(dtype).name}")
    if loc.pending:
        meta = _metadata_dict(shape, dtype, chunks, codec, checksum, attributes)
        backend(loc).write_text(DEFERRED_META, json.dumps(meta))
        return _open_deferred(loc, "r+")
    # zarr's overwrite empties the folder: a partial output keeps its owner record (a second writer
    # must still find who writes it) and its inputs' stamps, with this process's heartbeat paused meanwhile
    from blocklin.storage.ownership import Heartbeat

    with Heartbeat.paused() if overwrite else contextlib.nullcontext():
        records = {k: backend(loc).try_read(k) for k in (OWNER_RECORD, INPUTS_RECORD)} if overwrite else {}
        arr = zarr.create_array(
            store=zarr_store(loc), shape=shape, chunks=chunks, dtype=np.dtype(dtype),
            compressors=codec_chain(codec, checksum) or None, fill_value=0, zarr_format=3,
            attributes=attributes or {}, overwrite=overwrite,
        )
        for key, raw in records.items():
            if raw is not None:
                backend(loc).write_bytes(key, raw)
    return arr


def left_in_partial(loc: Location) -> bool:
    """Whether the local ``loc`` already holds a zarr node inside a partial output (``.OUT.partial-TOKEN``):
    one that the interrupted run a resumed run continues created there. Callers that continue such an
    array open it (:meth:`~blocklin.storage.atomic.AtomicOutput.has_array`); a caller that creates it writes
    it anew (a result written whole from memory, as ``x`` of a solve or the factors of ``svd``, before the
    interrupted run reached its commit), and replaces it: zarr refused to create it again, so the resume
    failed after all its passes were done. Nothing outside blocklin's partial outputs is replaced."""
    from blocklin.storage.guard import PARTIAL_TOKEN

    if not loc.is_local or loc.pending or not os.path.exists(os.path.join(loc.url, "zarr.json")):
        return False
    path = os.path.abspath(loc.url)
    while os.path.dirname(path) != path:
        name = os.path.basename(path)
        if name.startswith(".") and PARTIAL_TOKEN.search(name):
            return True
        path = os.path.dirname(path)
    return False


def _norm(sel: slice, n: int) -> slice:
    start, stop, step = sel.indices(n)
    return slice(start, max(start, stop)) if step == 1 else sel


def read_block(arr: zarr.Array, rows: slice, cols: slice, out: np.ndarray | None = None,
               lanes: int | None = None) -> np.ndarray:
    """Read ``arr[rows, cols]``, into the preallocated ``out`` when given (no extra copy).

    Uncompressed zarr v3 arrays are read straight from their chunk files
    (:mod:`blocklin.storage.rawchunks`), only the rows of each chunk the block covers: local files
    always, fsspec stores by range requests when the block covers part of a chunk. Everything else
    goes through zarr, which reads every chunk it touches whole. The bytes fetched from storage
    are counted in :mod:`blocklin._readstats`.
    A chunk that fails to decode or to pass its checksum raises
    :class:`~blocklin.errors.StoreReadError` naming it (:mod:`blocklin.storage.readerrors`).
    ``lanes``: the most chunks decoded at once (a row pass whose budget holds fewer chunks' temporaries,
    :attr:`blocklin.plan.passes.RowPassPlan.lanes`): local compressed chunks by that many threads; through
    zarr (an object store's compressed chunks), which decodes every chunk of a call at once, by reads of
    at most that many chunks.
    """
    with reading(arr, rows, cols):
        return _read_block(arr, rows, cols, out, lanes)


def _read_block(arr: zarr.Array, rows: slice, cols: slice, out: np.ndarray | None,
                lanes: int | None = None) -> np.ndarray:
    raw = raw_access(arr, remote=True)
    if raw is not None:
        rows, cols = _norm(rows, arr.shape[0]), _norm(cols, arr.shape[1])
        if rows.step in (None, 1) and cols.step in (None, 1) and (raw.fs is None or not raw.aligned(rows, cols)):
            shape = (rows.stop - rows.start, cols.stop - cols.start)
            if out is None:
                out = pool.aligned_empty(shape, arr.dtype)
            if out.flags.c_contiguous and out.shape == shape and out.dtype == arr.dtype:
                return raw.read(rows, cols, out)
    dec = decoded_access(arr) if out is not None and out.flags.c_contiguous and out.dtype == arr.dtype else None
    if dec is not None:  # compressed local chunks: decoded straight into out, several at once
        rows, cols = _norm(rows, arr.shape[0]), _norm(cols, arr.shape[1])
        if rows.step in (None, 1) and cols.step in (None, 1) and out.shape == (rows.stop - rows.start,
                                                                               cols.stop - cols.start):
            return dec.read(rows, cols, out, lanes=lanes)
    if lanes:
        groups = _lane_groups(arr, rows, cols, lanes)
        if groups is not None:  # through zarr, which decodes every chunk of a call at once
            rows, cols = _norm(rows, arr.shape[0]), _norm(cols, arr.shape[1])
            if out is None:
                out = np.empty((rows.stop - rows.start, cols.stop - cols.start), dtype=arr.dtype.newbyteorder("="))
            for rs, cs in groups:
                sub = out[rs.start - rows.start:rs.stop - rows.start, cs.start - cols.start:cs.stop - cols.start]
                if sub.dtype == arr.dtype:
                    _read_block(arr, rs, cs, sub)
                else:  # a big-endian store read as native
                    sub[...] = arr[rs, cs]
                    readstats.count(fetched_bytes(arr, rs, cs))
            return out
    if out is None:
        out = np.asarray(arr[rows, cols])
        if out.dtype.byteorder not in ("=", "|"):  # a big-endian store (zarr v2 ``>f8``): read as native
            out = out.astype(out.dtype.newbyteorder("="))
    elif out.flags.c_contiguous:
        arr.get_basic_selection((rows, cols), out=NDBuffer.from_numpy_array(out))
    else:
        out[...] = arr[rows, cols]
    readstats.count(fetched_bytes(arr, rows, cols))
    return out


def _lane_groups(arr: zarr.Array, rows: slice, cols: slice, lanes: int) -> list[tuple[slice, slice]] | None:
    """The selection ``rows, cols`` of a 2-D array cut at its chunks' edges into reads of at most ``lanes``
    chunks each (a row band of chunks at a time, its columns in groups of ``lanes``); None where one read
    touches no more, or the selection is strided."""
    rows, cols = _norm(rows, arr.shape[0]), _norm(cols, arr.shape[1])
    if rows.step not in (None, 1) or cols.step not in (None, 1) or rows.stop <= rows.start or cols.stop <= cols.start:
        return None
    c0, c1 = (int(c) for c in arr.chunks)

    def cuts(sel: slice, c: int) -> list[int]:
        return [sel.start, *range((sel.start // c + 1) * c, sel.stop, c), sel.stop]

    rcuts, ccuts = cuts(rows, c0), cuts(cols, c1)
    if (len(rcuts) - 1) * (len(ccuts) - 1) <= lanes:
        return None
    return [(slice(r0, r1), slice(ccuts[j], ccuts[min(j + lanes, len(ccuts) - 1)]))
            for r0, r1 in zip(rcuts, rcuts[1:]) for j in range(0, len(ccuts) - 1, lanes)]


def row_bands(path: Any, band_bytes: int = 8 << 20, first: int = 0, n: int | None = None) -> Any:
    """``(rows, block)`` of a stored array (committed or a run's own partial; a vector as one column)
    read by bands of whole rows of about ``band_bytes``, over its rows ``first:first + n`` (default all),
    ``rows`` counted from ``first``: a check or a reduction that no pass plans (of a small operand,
    ``b`` or ``x``, or one pass made only to name a refusal's cause)."""
    arr = open_cached(path, "r")
    n = arr.shape[0] - first if n is None else n
    k = arr.shape[1] if arr.ndim == 2 else 1
    step = max(1, band_bytes // max(1, k * arr.dtype.itemsize))
    for r0 in range(first, first + n, step):
        rows = slice(r0, min(first + n, r0 + step))
        block = read_block(arr, rows, slice(0, k)) if arr.ndim == 2 else np.asarray(arr[rows])[:, None]
        yield slice(rows.start - first, rows.stop - first), block


def read_kind(path: Any) -> str:
    """How reads of the array at ``path`` fetch its chunks (see :func:`read_block`).

    ``"direct"``: local uncompressed C-order chunk files, a row range of a chunk read alone, no zarr
    temporaries; ``"ranges"``: the same layout on an fsspec store, row ranges by range requests;
    ``"chunks"``: through zarr, every chunk touched read (and decoded) whole. ``"chunks"`` also
    when the array cannot be opened yet.
    """
    try:
        arr = open_cached(path)
    except Exception:  # noqa: BLE001 - not readable yet: assume the general case
        return "chunks"
    raw = raw_access(arr, remote=True)
    if raw is None:
        return "chunks"
    return "ranges" if raw.fs is not None else "direct"


def read_vector(arr: zarr.Array, start: int, stop: int) -> np.ndarray:
    """``arr[start:stop]`` of a 1-D array. Uncompressed chunks (local, or on an fsspec store) are read
    straight into the result, only the range's bytes
    (:func:`~blocklin.storage.rawchunks.raw_vector`); anything else through zarr, which holds each
    chunk the range touches whole while it copies from it. The bytes are counted in
    :mod:`blocklin._readstats`."""
    raw = raw_vector(arr) if stop > start else None
    if raw is not None:
        out = pool.aligned_empty(stop - start, arr.dtype)
        raw.read(slice(start, stop), slice(0, 1), out.reshape(-1, 1))
        return out
    out = np.asarray(arr[start:stop])
    readstats.count(out.nbytes)
    return out


def fetched_bytes(arr: zarr.Array, rows: slice, cols: slice) -> int:
    """Bytes zarr fetches to read ``arr[rows, cols]``: every chunk it touches, whole.

    Encoded sizes of local chunk files (a ``stat`` each); on other stores the decoded chunk size
    (exact for uncompressed chunks, an upper bound for compressed ones).
    """
    rows, cols = _norm(rows, arr.shape[0]), _norm(cols, arr.shape[1])
    if rows.stop <= rows.start or cols.stop <= cols.start:
        return 0
    ch_r, ch_c = arr.chunks
    grid = [(ci, cj) for ci in range(rows.start // ch_r, (rows.stop - 1) // ch_r + 1)
            for cj in range(cols.start // ch_c, (cols.stop - 1) // ch_c + 1)]
    whole = ch_r * ch_c * np.dtype(arr.dtype).itemsize
    root = str(arr.store.root) if type(arr.store).__name__ == "LocalStore" else None
    if root is None:
        return whole * len(grid)
    total = 0
    for key in grid:
        try:
            total += os.stat(os.path.join(root, arr.path or "", arr.metadata.encode_chunk_key(key))).st_size
        except (OSError, AttributeError, ValueError):
            continue  # a missing chunk (the fill value) reads nothing
    return total


def write_block(arr: zarr.Array, rows: slice, cols: slice, block: np.ndarray) -> None:
    """Write ``block`` to ``arr[rows, cols]`` (callers align the block to whole chunks).

    Whole chunks of uncompressed local zarr v3 arrays are written straight to their chunk files. A
    write failing for a full disk names the array (:func:`blocklin.storage.space.writing`).
    """
    with writing(arr):
        _write_block(arr, rows, cols, block)


def _write_block(arr: zarr.Array, rows: slice, cols: slice, block: np.ndarray) -> None:
    raw = raw_access(arr)
    if raw is not None:
        rows, cols = _norm(rows, arr.shape[0]), _norm(cols, arr.shape[1])
        if raw.aligned(rows, cols) and block.shape == (rows.stop - rows.start, cols.stop - cols.start):
            raw.write(rows, cols, np.asarray(block, dtype=arr.dtype))
            return
    arr[rows, cols] = block


def create_group(path: Any, *, attributes: dict | None = None) -> Any:
    """Create a zarr v3 group at ``path`` (which may already exist); deferred inside pending outputs."""
    loc = as_location(path)
    if loc.pending:
        meta = {"zarr_format": 3, "node_type": "group", "attributes": attributes or {}}
        backend(loc).write_text(DEFERRED_META, json.dumps(meta))
        return None
    return zarr.open_group(store=zarr_store(loc), mode="a", zarr_format=3, attributes=attributes or {})


def write_array(path: Any, data: np.ndarray, *, chunks: tuple[int, ...] | None = None,
                codec: str | None = "none") -> zarr.Array:
    """Create a zarr v3 array at ``path`` holding the (small, in-memory) ``data``."""
    data = np.asarray(data)
    arr = create_array(path, shape=data.shape, dtype=data.dtype, chunks=chunks or tuple(max(1, s) for s in data.shape),
                       codec=codec)
    if data.size:
        arr[...] = data
    return arr


def wait_for_pending_io(timeout: float = 60.0) -> None:
    """Wait until zarr's I/O event loop has finished the reads and writes it still holds.

    A call that zarr runs on its loop thread goes on when the caller is interrupted (Ctrl-C lands
    in the waiting thread, not in the loop); cleanup waits for those writes before it removes a
    partial output, else they would recreate its folders after the removal.
    """
    import asyncio

    from zarr.core import sync as zsync

    loop = zsync.loop[0]
    if loop is None or not loop.is_running():
        return

    async def drain() -> None:
        me = asyncio.current_task()
        pending = [t for t in asyncio.all_tasks() if t is not me and not t.done()]
        if pending:
            await asyncio.wait(pending, timeout=timeout)

    try:
        asyncio.run_coroutine_threadsafe(drain(), loop).result(timeout + 1.0)
    except Exception:  # noqa: BLE001 - best effort: cleanup goes on after the timeout
        pass
