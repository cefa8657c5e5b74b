"""Versions of a stored matrix that grows by rows, and which version a result covers.

A matrix that :func:`blocklin.append` grows keeps its row-count history in its zarr attributes,
``blocklin_versions``: one entry per version, ``{"rows": m, "stamp": S, "at": time}`` (and
``"source"`` for an append). ``S`` is the *data stamp*: a digest of the stamps of the array's chunk
files alone (size, times and inode locally; ETag or generation on object stores;
:mod:`blocklin.storage.stamps`), so rewriting ``zarr.json`` (which an append does) leaves it, and
rewriting any chunk changes it.

Every output records, for each stored input, what it covers (``covers`` in its ``blocklin``
attribute: URL, shape, chunks, dtype, data stamp and, for a dense array, its *layout*: a digest of
the metadata that says how its chunk files decode, the fill value and codecs with them, which an
append leaves and a chunk's stamp does not see; a missing chunk reads as the fill value). An update
(:func:`blocklin.update`) may read only the rows added since if the input's history leads from the
covered stamp to today's by appends alone (:func:`growth`); anything else (rows rewritten, columns
added, chunks, dtype or layout changed) is refused, naming what changed.

The rows of the version an output covered are rows an append never changes: an append rewrites
the chunk band that held the last rows (its new rows share that band) with those rows' bytes
unchanged, and the history records the stamp after each append, so a rewrite between two appends
breaks the chain.
"""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import json

from blocklin.errors import ParameterError, explain
from blocklin.storage.backend import backend
from blocklin.storage.location import Location
from blocklin.storage.stamps import file_stamps

#: Attribute of a grown matrix holding its versions.
VERSIONS_KEY = "blocklin_versions"
#: Metadata objects of a zarr node, left out of the data stamp (an append rewrites them).
_METADATA = {"zarr.json", ".zarray", ".zattrs", ".zgroup", ".zmetadata"}
#: ``format`` of the coverage of a stored sparse matrix (the layout's name).
SPARSE_FORMAT = "blocklin-csr"


def data_stamp(loc: Location, entries: dict[str, str] | None = None) -> str:
    """A digest of the stamps of the chunk files under ``loc`` (metadata and blocklin's records left
    out): equal while no chunk was rewritten, added or removed. ``entries``: the location's
    :func:`~blocklin.storage.stamps.file_stamps`, when already listed."""
    import hashlib

    listed = file_stamps(loc) if entries is None else entries
    return hashlib.sha1(json.dumps(sorted((k, v) for k, v in listed.items() if _is_data(k))).encode()).hexdigest()[:16]


def _is_data(key: str) -> bool:
    parts = key.split("/")
    return parts[-1] not in _METADATA and not any(p.startswith(".blocklin") for p in parts) and \
        ".tmp-" not in parts[-1]


def now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def read_meta(loc: Location) -> dict | None:
    """The zarr v3 metadata of the array at ``loc``, or None (no array there, or a v2 one)."""
    raw = backend(loc).try_read("zarr.json")
    if raw is None:
        return None
    try:
        meta = json.loads(raw)
    except ValueError:
        return None
    return meta if isinstance(meta, dict) and meta.get("node_type") == "array" else None


def history(meta: dict) -> list[dict]:
    """The versions recorded in an array's metadata (empty for a matrix never appended to)."""
    versions = (meta.get("attributes") or {}).get(VERSIONS_KEY)
    return [v for v in versions if isinstance(v, dict)] if isinstance(versions, list) else []


def input_history(loc: Location) -> list[dict]:
    """The versions recorded of the stored input at ``loc``: a zarr array's, or a sparse group's (its
    attributes hold them); empty for anything else."""
    meta = read_meta(loc)
    if meta is not None:
        return history(meta)
    from blocklin.storage.sparse import sparse_attributes

    attrs = sparse_attributes(loc)
    return history({"attributes": attrs}) if attrs is not None else []


def layout(meta: dict) -> str:
    """A digest of the zarr v3 metadata that decides what an array's chunk files (and its missing chunks)
    read as: all of it but its shape, which an append grows, and its attributes and dimension names,
    which hold no values."""
    kept = {k: v for k, v in meta.items() if k not in ("shape", "attributes", "dimension_names")}
    return hashlib.sha1(json.dumps(kept, sort_keys=True).encode()).hexdigest()[:16]


def chunk_grid(meta: dict) -> tuple[int, ...]:
    """The chunk shape of v3 metadata (regular grids)."""
    return tuple(int(c) for c in meta["chunk_grid"]["configuration"]["chunk_shape"])


def coverage(loc: Location, entries: dict[str, str] | None = None) -> dict | None:
    """What an output records of a stored input: URL, shape, chunks, dtype and data stamp (None for
    inputs that are not zarr v3 arrays: files of other formats are never appended to); ``entries``
    as for :func:`data_stamp`."""
    meta = read_meta(loc)
    if meta is None:
        return _sparse_coverage(loc, entries)
    return {"url": loc.url, "shape": [int(s) for s in meta["shape"]], "chunks": list(chunk_grid(meta)),
            "dtype": str(meta.get("data_type")), "stamp": data_stamp(loc, entries), "layout": layout(meta)}


def _sparse_coverage(loc: Location, entries: dict[str, str] | None) -> dict | None:
    """The coverage of a stored sparse matrix (a ``blocklin-csr`` group, whose attributes hold its shape
    and history): ``format`` says so, ``chunks`` is its entry chunk. Where the chunk files were listed
    before an append committed (``entries``), the version they hold, by its recorded stamp; None
    where no version has it (the group changed otherwise)."""
    from blocklin.storage.sparse import sparse_attributes

    attrs = sparse_attributes(loc)
    if attrs is None:
        return None
    stamp = data_stamp(loc, entries)
    rows = int(attrs["shape"][0])
    if entries is not None and stamp != data_stamp(loc):
        rows = next((int(v["rows"]) for v in history({"attributes": attrs}) if stamp in _stamps(v)), None)
        if rows is None:
            return None
    return {"url": loc.url, "format": SPARSE_FORMAT, "shape": [rows, int(attrs["shape"][1])],
            "chunks": [int(attrs.get("entry_chunk") or 0)], "dtype": str(attrs.get("dtype")), "stamp": stamp}


def _described(loc: Location, covered: dict) -> tuple[list[int], list[int], str, list[dict], str | None] | None:
    """Today's shape, chunks, dtype, history and layout (None: a sparse group's) of the input at ``loc``,
    as ``covered`` records them (a dense zarr array, or a sparse group where ``covered`` says so); None
    where it is neither now."""
    if covered.get("format") == SPARSE_FORMAT:
        from blocklin.storage.sparse import sparse_attributes

        attrs = sparse_attributes(loc)
        if attrs is None:
            return None
        return ([int(s) for s in attrs["shape"]], [int(attrs.get("entry_chunk") or 0)], str(attrs.get("dtype")),
                history({"attributes": attrs}), None)
    meta = read_meta(loc)
    if meta is None:
        return None
    return ([int(s) for s in meta["shape"]], list(chunk_grid(meta)), str(meta.get("data_type")), history(meta),
            layout(meta))


@dataclasses.dataclass(frozen=True)
class Growth:
    """How an input grew since the version a result covered: rows ``old_rows:rows`` are new."""

    url: str
    old_rows: int
    rows: int
    stamp: str

    @property
    def current(self) -> bool:
        return self.rows == self.old_rows


def growth(covered: dict, loc: Location, *, name: str = "input") -> Growth:
    """Check that the input at ``loc`` is the covered version with rows appended, and say how many.

    Raises
    ------
    ParameterError
        When the input was changed in another way: columns, chunks or dtype differ, rows were
        removed, or its chunks were rewritten (the history does not lead from the covered stamp to
        today's by appends).
    """
    today = _described(loc, covered)
    url = covered.get("url", loc.url)
    fix = "recompute the result on today's input (the command that made it, with --overwrite)"
    if today is None:
        what = "sparse matrix (blocklin-csr group)" if covered.get("format") == SPARSE_FORMAT else "zarr v3 array"
        raise ParameterError(explain(name, f"must still be the {what} the result was computed from",
                                     f"{url!r}, which is no longer a {what}", fix))
    shape, chunks, dtype, chain, kept = today
    old = covered["shape"]
    for what, then, today in (("columns", old[1], shape[1]), ("chunks", covered["chunks"], chunks),
                              ("dtype", covered["dtype"], dtype)):
        if then != today:
            raise ParameterError(explain(name, f"may only have grown by rows since the result was computed "
                                         f"(its {what} must be unchanged)", f"{url!r}: {what} {then} then, "
                                         f"{today} now", fix))
    if covered.get("layout", kept) != kept:  # a coverage recorded before layouts were has none to compare
        raise ParameterError(explain(name, "may only have grown by rows since the result was computed (the "
                                     "metadata that says how its chunks read must be unchanged)", f"{url!r}: its "
                                     "zarr.json changed otherwise (its fill value, which missing chunks read as, "
                                     "its codecs or its chunk key encoding)", fix))
    if shape[0] < old[0]:
        raise ParameterError(explain(name, "may only have grown by rows since the result was computed",
                                     f"{url!r}: {old[0]} rows then, {shape[0]} now", fix))
    stamp = data_stamp(loc)
    if stamp == covered["stamp"] and shape[0] == old[0]:
        return Growth(url, old[0], shape[0], stamp)
    start = next((i for i, v in enumerate(chain) if covered["stamp"] in _stamps(v)), None)
    if start is None or chain[start].get("rows") != old[0]:
        raise ParameterError(explain(name, "must hold the rows the result was computed from, unchanged",
                                     f"{url!r}: its chunk files changed since, and not by blocklin.append "
                                     "(rows rewritten or the array replaced)", fix))
    if any(v.get("rewritten") for v in chain[start + 1:]):
        raise ParameterError(explain(name, "must hold the rows the result was computed from, unchanged",
                                     f"{url!r}: rows were rewritten after the result (seen by a later append, or by the finish "
                                     "or rollback of an interrupted one)", fix))
    if stamp not in _stamps(chain[-1]):
        raise ParameterError(explain(name, "must hold the rows the result was computed from, unchanged",
                                     f"{url!r}: its chunk files changed since its last append (rows rewritten, "
                                     "or an append interrupted: finish it with blocklin append, or roll it back "
                                     "with blocklin append --rollback)", fix))
    return Growth(url, old[0], shape[0], stamp)


def _stamps(version: dict) -> list[str]:
    """A version's data stamp and the stamps it kept after a rolled-back append (same bits)."""
    return [version.get("stamp")] + list(version.get("aliases") or [])


__all__ = ["Growth", "SPARSE_FORMAT", "VERSIONS_KEY", "chunk_grid", "coverage", "data_stamp", "growth", "history",
           "input_history", "layout", "read_meta"]
