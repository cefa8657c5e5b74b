"""Content stamps of inputs: how a resumed run tells that an input changed since it was interrupted.

A run's partial output holds the bits of the inputs it read then. A rerun with ``resume=True`` may
continue it only if every input still holds those bits, and an input rewritten in place (same
shape, chunks and dtype, new values) keeps its zarr metadata unchanged, so the stamp must cover
every object of the input:

* locally, each file's relative key, size, modification and change times (ns) and inode, from one
  ``scandir`` walk (a rewrite in place changes the times; a rewrite by rename the inode);
* on fsspec stores (S3, GCS, Azure, memory), each object's key, size and version (ETag,
  generation, or the modification time a store without either reports), from one listing.

A non-zarr input (``A.npy``, ``A.mtx``, ``A.h5``, the file of ``A.h5:/dataset``, a CSV) is stamped
by its file. Reading an input changes none of these. Timestamps are only as fine as the file
system keeps them: a rewrite that keeps the size, inode and both times (within one clock tick of
the original write) is not seen locally; object stores' ETags do not have that limit. Nor are
writes through a writable memory map to a page already written since its last writeback: Linux
updates the times on the first write to a clean page only (on ext4 a page stays dirty for the
writeback delay, about 30 s; tmpfs pages always), so a map kept open across a run hides its later
writes from the stamp.

:func:`stamp_inputs` builds the record a claimed output keeps (``.blocklin-inputs.json`` in its
partial, :mod:`blocklin.storage.atomic`); :func:`changes` compares a recorded one with today's and
says, per changed input, how many of its files differ (:mod:`blocklin.storage.input_guard` compares
them again at every commit).
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Iterable
from typing import Any

from blocklin.storage.backend import backend
from blocklin.storage.location import Location, as_location, split_spec
from blocklin.storage.records import PEAKS_COLUMNS, PEAKS_RECORD

#: Inputs with more files than this are recorded by their digest and file count only (the record
#: then says that they changed, not how many files did).
MAX_LISTED = 20000
_VERSION = 1


def input_location(x: Any, storage_options: dict | None = None) -> Location:
    """The location of an input as operations name it: a :class:`Location`, a URL, a path, or a file
    spec such as ``A.h5:/dataset`` or ``A.npz:name`` (its file)."""
    if isinstance(x, Location):
        return x
    if (isinstance(x, str) and "://" in x) or not isinstance(x, (str, os.PathLike)):
        return as_location(x, storage_options, name="input")
    return as_location(split_spec(x)[0], name="input")


def _entry(stamp: tuple) -> str:
    return hashlib.sha1(repr(stamp).encode()).hexdigest()[:10]


def file_stamps(loc: Location) -> dict[str, str]:
    """``{key: short stamp}`` of every object under ``loc`` (one listing), but the record of its
    peaks (:mod:`blocklin.storage.recorded_peaks`: written after the data, about the data)."""
    return {key: _entry(st) for key, st in backend(loc).file_stamps().items()
            if key.rsplit("/", 1)[-1] not in (PEAKS_RECORD, PEAKS_COLUMNS)}


def _digest(entries: dict[str, str]) -> str:
    return hashlib.sha1(json.dumps(sorted(entries.items())).encode()).hexdigest()[:16]


def content_stamp(loc: Any, storage_options: dict | None = None) -> str:
    """A short digest over every object of an input (see module docstring): equal while the input
    holds the same bits, different once any of its files or objects was rewritten, added or removed."""
    return _digest(file_stamps(input_location(loc, storage_options)))


def stamp_inputs(inputs: Iterable[Location]) -> list[dict]:
    """The record of the inputs' content stamps: per input its URL, digest, file count and (up to
    :data:`MAX_LISTED` files) the stamp of each file."""
    record = []
    for loc in inputs:
        entries = file_stamps(loc)
        record.append({"url": loc.url, "digest": _digest(entries), "files": len(entries),
                       "entries": entries if len(entries) <= MAX_LISTED else None})
    return record


def record_json(record: list[dict]) -> str:
    return json.dumps({"version": _VERSION, "inputs": record})


def read_record(raw: bytes | None) -> list[dict] | None:
    """A record written by :func:`record_json`, or None (missing, unreadable, another version)."""
    if raw is None:
        return None
    try:
        data = json.loads(raw)
    except ValueError:
        return None
    if not isinstance(data, dict) or data.get("version") != _VERSION or not isinstance(data.get("inputs"), list):
        return None
    return data["inputs"]


def digest(record: list[dict]) -> str:
    """One digest of every input's stamp (what names a resumable work folder)."""
    return hashlib.sha1(json.dumps(sorted((i["url"], i["digest"]) for i in record)).encode()).hexdigest()[:16]


def changes(recorded: list[dict], today: list[dict], *, since: str = "since the interrupted run") -> list[str]:
    """What changed between the recorded stamps and today's: one phrase per changed input, such as
    ``input /data/A.zarr changed since the interrupted run (3 of 64 files differ)`` (``since``: when the
    record was taken, as the phrase says it); empty when none."""
    then = {i["url"]: i for i in recorded}
    out = []
    for now in today:
        old = then.get(now["url"])
        if old is None:
            out.append(f"input {now['url']} was not an input of the interrupted run")
        elif old.get("digest") != now["digest"]:
            out.append(f"input {now['url']} changed {since} ({_how_many(old, now)})")
    gone = set(then) - {i["url"] for i in today}
    out += [f"input {url} of the interrupted run is not an input now" for url in sorted(gone)]
    return list(dict.fromkeys(out))  # an input read twice (A @ A) is named once


def _how_many(old: dict, now: dict) -> str:
    a, b = old.get("entries"), now.get("entries")
    if a is None or b is None:
        return f"its files differ: {old.get('files')} then, {now['files']} now"
    if set(b) == {""}:
        return "its file differs"
    n = sum(1 for k in set(a) | set(b) if a.get(k) != b.get(k))
    if len(a) != len(b):  # files added or removed: "37 of 1 files differ" said neither
        return f"{n} files differ, {len(a)} then, {len(b)} now"
    return f"{n} of {len(b)} files differ"


__all__ = ["MAX_LISTED", "changes", "content_stamp", "digest", "file_stamps", "input_location", "read_record",
           "record_json", "stamp_inputs"]
