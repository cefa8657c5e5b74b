"""Which chunks of a zarr array are stored, and refusing inputs whose chunks are missing.

zarr reads a chunk that has no file as the fill value: legitimate for a sparse array written that
way, but a store that lost chunk files (a copy interrupted, a file deleted) reads as zeros without a
word. blocklin records, when it commits an output, how many chunk files each of its arrays holds
(``stored_chunks`` in its ``blocklin`` attribute); an input with that record is checked against it
on every open (on by default: a blocklin output with fewer chunks than it was committed with is
damaged). Any other input is checked against its full chunk grid when ``require_complete`` is set
(CLI ``--require-complete``, ``BLOCKLIN_REQUIRE_COMPLETE=1``). ``blocklin info`` reports the count.

Listing costs one pass over the store's keys (a folder walk locally, list requests on an object
store); the default check runs on local stores only.
"""

from __future__ import annotations

import itertools
import re
from typing import Any

from blocklin.errors import StoreReadError, explain
from blocklin.storage.backend import backend
from blocklin.storage.location import Location

#: Attribute key (inside ``blocklin``) recording the chunk files an output was committed with.
STORED_KEY = "stored_chunks"


def _grid(arr: Any) -> tuple[int, ...]:
    block = arr.shards or arr.chunks
    return tuple(-(-int(s) // max(1, int(c))) for s, c in zip(arr.shape, block))


def _key_pattern(arr: Any) -> re.Pattern:
    """A regex of the array's chunk keys (``c/1/2``, ``c.1.2``, ``1.2``, ...), from its own encoder."""
    probe = str(arr.metadata.encode_chunk_key(tuple(7 for _ in arr.shape)))
    parts = re.split(r"7", probe)
    prefix, seps = parts[0], parts[1:-1]
    body = r"(\d+)".join([re.escape(prefix)] + [re.escape(s) for s in seps] + [""])
    return re.compile("^" + body + "$")


def stored_chunk_indices(arr: Any, loc: Location) -> set[tuple[int, ...]]:
    """Grid indices of the chunks (shards) of ``arr`` at ``loc`` that have a stored object."""
    pattern, grid = _key_pattern(arr), _grid(arr)
    found = set()
    for key in backend(loc).keys(""):
        m = pattern.match(key)
        if m:
            idx = tuple(int(g) for g in m.groups())
            if all(i < n for i, n in zip(idx, grid)):
                found.add(idx)
    return found


def chunk_census(arr: Any, loc: Location) -> dict[str, Any]:
    """``{"grid": total, "stored": count, "missing": total - count, "first_missing": key or None,
    "recorded": count at commit or None}`` for the array ``arr`` at ``loc``."""
    grid = _grid(arr)
    total = 1
    for n in grid:
        total *= n
    stored = stored_chunk_indices(arr, loc)
    first = None
    if len(stored) < total:  # the first gap in grid order: among the first len(stored) + 1 indices
        for idx in itertools.islice(itertools.product(*(range(n) for n in grid)), len(stored) + 1):
            if idx not in stored:
                first = str(arr.metadata.encode_chunk_key(idx))
                break
    prov = arr.attrs.get("blocklin") if hasattr(arr, "attrs") else None
    recorded = prov.get(STORED_KEY) if isinstance(prov, dict) else None
    return {"grid": total, "stored": len(stored), "missing": total - len(stored), "first_missing": first,
            "recorded": int(recorded) if isinstance(recorded, int) else None}


def check_complete(arr: Any, loc: Location, name: str, require: bool) -> None:
    """Refuse ``arr`` when it holds fewer chunk files than blocklin committed it with, or, with
    ``require``, fewer than its chunk grid.

    Raises
    ------
    StoreReadError
        Naming the count, the first missing chunk and the fix.
    """
    prov = arr.attrs.get("blocklin") if hasattr(arr, "attrs") else None
    recorded = prov.get(STORED_KEY) if isinstance(prov, dict) else None
    if not require and (not isinstance(recorded, int) or not loc.is_local):
        return
    census = chunk_census(arr, loc)
    if isinstance(recorded, int) and census["stored"] < recorded:
        raise StoreReadError(explain(name, "must hold every chunk file blocklin committed it with",
                                     f"{census['stored']} of {recorded} chunk files in {loc.url!r} (first missing: "
                                     f"{census['first_missing']})", "the store lost files: copy it again from "
                                     "where it came from, or rerun the operation that wrote it"))
    if require and census["missing"] and not isinstance(recorded, int):
        raise StoreReadError(explain(name, "must have a stored file for every chunk (--require-complete; missing "
                                     "chunks read as the fill value)", f"{census['stored']} of {census['grid']} "
                                     f"chunks in {loc.url!r} (first missing: {census['first_missing']})",
                                     "copy the store again completely, or drop --require-complete "
                                     "(require_complete=False) if its missing chunks are meant to be the fill "
                                     "value"))


def count_stored(loc: Location) -> int | None:
    """Chunk files of the zarr array at ``loc`` (None when it is not one); what commit records."""
    from blocklin.storage.zarr_store import open_zarr

    try:
        arr = open_zarr(loc, allow_pending=True)
    except Exception:  # noqa: BLE001 - a group: its members are not counted
        return None
    return len(stored_chunk_indices(arr, loc))


__all__ = ["STORED_KEY", "check_complete", "chunk_census", "count_stored", "stored_chunk_indices"]
