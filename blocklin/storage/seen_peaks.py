"""The peaks a job's first pass saw of a local input that no writer recorded, kept in the user's cache.

A writer that sees every value records its output's peaks beside it
(:mod:`blocklin.storage.recorded_peaks`), and a job's first pass over that output takes them instead of
scanning. Data another tool wrote has no record, and every job's first pass over it scans for the largest
magnitude (the scaling of data near overflow or underflow, :mod:`blocklin.linalg.blocks.scaling`): on the
2-core machine such a pass reads at about 0.4x of the raw rate, against 0.9-1.0x for a pass that need not
scan (``docs/benchmarks.md``).

So the first pass that scans a whole local input keeps what it found here: the largest magnitude, and
each column's peak where the pass took them (an SVD's: of its stored columns, or of its stored rows where
it streams a wide input transposed, which no writer records), with the input's content
stamp (:mod:`blocklin.storage.stamps`) taken before the pass and found unchanged after it (a file
rewritten during the pass leaves nothing). A later job's first pass takes them while the input's stamp is
that one, exactly as a writer's record (maxima are exact in any order: the same bits as a scan). Nothing
is written beside the input: blocklin never modifies an input it did not write.

The cache is ``$XDG_CACHE_HOME/blocklin/peaks/`` (``~/.cache/blocklin/peaks/`` without it), a JSON record
per input (its real path, stamp and largest magnitude) named by a digest of that path, and the columns'
peaks as raw float64 beside it (:func:`blocklin.storage.recorded_peaks.write_pair`'s pair). It keeps at
most :data:`MAX_ENTRIES` inputs, the most recently written. A cache that cannot be written (a read-only
home) is skipped: the next job scans again. Local inputs only: an object store's stamp is a listing of
every chunk, and its data is read by every worker of a cluster, not by the client that keeps the cache.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

import numpy as np

from blocklin.config import user_cache_dir
from blocklin.storage.backend import LocalBackend
from blocklin.storage.location import Location, as_location
from blocklin.storage.recorded_peaks import RecordedPeaks, read_pair, write_pair
from blocklin.storage.stamps import content_stamp, input_location

#: Inputs the cache keeps at most; writing one more removes the least recently written.
MAX_ENTRIES = 512


def cache_dir() -> Path:
    """``$XDG_CACHE_HOME/blocklin/peaks``, else ``~/.cache/blocklin/peaks``."""
    return user_cache_dir() / "peaks"


def _local(loc: Any) -> tuple[Location, str] | None:
    loc = input_location(loc)
    if not loc.is_local:
        return None
    return loc, os.path.realpath(loc.url)


def _keys(real: str) -> tuple[str, str]:
    key = hashlib.sha1(real.encode()).hexdigest()[:24]
    return f"{key}.json", f"{key}.f8"


def _cache() -> LocalBackend:
    return LocalBackend(as_location(str(cache_dir())))


def stamp_before(loc: Any) -> str | None:
    """The content stamp of the local input at ``loc`` before a pass that scans it (None: not local, or
    unreadable; nothing will be kept)."""
    got = _local(loc)
    if got is None:
        return None
    try:
        return content_stamp(got[0])
    except OSError:
        return None


def remember(loc: Any, stamp: str | None, amax: float, shape: tuple[int, int], peaks: np.ndarray | None = None,
             *, transposed: bool = False, after: str | None = None) -> bool:
    """Keep the peaks a pass found of the whole input at ``loc`` (its stored ``shape``): ``amax``, and
    ``peaks``, the peak of each column of the orientation the pass streamed (its stored columns', or
    with ``transposed`` its stored rows': an SVD streams a wide input transposed), or None; where its
    stamp is still ``stamp``, the one taken before the pass (:func:`stamp_before`, or the run's at its
    first open). ``after``: the stamp a listing after the pass took (the run's check before it returns,
    :meth:`blocklin.storage.input_guard.RunInputs.check`), else one taken here. Only finite peaks (a
    NaN or Inf is named by every scan). False where nothing was kept."""
    got = _local(loc)
    width = shape[0] if transposed else shape[1]
    if stamp is None or got is None or not np.isfinite(amax) or \
            peaks is not None and (len(peaks) != width or not np.isfinite(peaks).all()):
        return False
    loc, real = got
    record_key, columns_key = _keys(real)
    fields = {"location": real, "stamp": stamp, "shape": [int(shape[0]), int(shape[1])], "transposed": bool(transposed)}
    try:
        if (content_stamp(loc) if after is None else after) != stamp:  # changed during the pass: no one version's
            return False
        be = _cache()
        if peaks is None and be.exists(columns_key):
            be.delete(columns_key)  # an older entry's peaks: never paired with this record (its CRC is None)
        kept = write_pair(be, record_key, columns_key, lambda: fields, amax, width, peaks)
        if kept:
            _prune(cache_dir())
    except (OSError, RuntimeError):  # RuntimeError: no home folder to hold the cache
        return False
    return kept


def seen(loc: Any, shape: tuple[int, int], *, column_peaks: bool = True, transposed: bool = False,
         stamp: str | None = None) -> RecordedPeaks | None:
    """The peaks an earlier job's pass kept of the local input at ``loc`` (of stored ``shape``) while its
    content stamp is still the kept one, else None (as :func:`blocklin.storage.recorded_peaks.recorded`).
    ``column_peaks``: each column's too, of the orientation a pass streams (``transposed``: the stored
    rows'), where the pass that kept them streamed it so; else the largest magnitude alone. ``stamp``:
    the input's content stamp where the caller holds one that still stands (a run's, taken at its first
    open and checked before it returns), else one is taken here."""
    got = _local(loc)
    if got is None:
        return None
    loc, real = got
    record_key, columns_key = _keys(real)
    shape = [int(shape[0]), int(shape[1])]

    def holds(data: dict) -> bool:
        return data.get("location") == real and data.get("shape") == shape and \
            (not column_peaks or data.get("transposed") is bool(transposed)) and data.get("stamp") == (content_stamp(loc) if stamp is None else stamp)

    try:
        got = read_pair(_cache(), record_key, columns_key, holds, None, column_peaks)
    except (OSError, RuntimeError):
        return None
    return None if got is None or column_peaks and got.columns is None else got


def forget(loc: Any) -> None:
    """Drop what the cache keeps of the local input at ``loc`` (its next job's first pass scans)."""
    got = _local(loc)
    if got is not None:
        be = _cache()
        be.delete_many(list(_keys(got[1])))


def _prune(folder: Path) -> None:
    """Remove the least recently written entries beyond :data:`MAX_ENTRIES` (both files of each)."""
    try:
        records = [(e.stat().st_mtime_ns, e.path) for e in os.scandir(folder) if e.name.endswith(".json")]
    except OSError:
        return
    if len(records) <= MAX_ENTRIES:
        return
    for _, path in sorted(records)[: len(records) - MAX_ENTRIES]:
        for p in (path, path[: -len(".json")] + ".f8"):
            try:
                os.unlink(p)
            except OSError:
                pass
