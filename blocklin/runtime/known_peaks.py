"""Column peaks of stored inputs known from earlier jobs of this process, by content stamp.

A job's first pass over an input takes each column's largest magnitude beside its reads
(:mod:`blocklin.runtime.passes`): the power of two of data near overflow
(:mod:`blocklin.linalg.blocks.scaling`), the Gram routes' test for columns their squares lose, and,
where finite, the proof that the input holds no NaN or Inf. On local uncompressed chunks those max
and min cost about what the read does: a first pass delivered 0.2-0.3x the raw read rate where a
later pass, which needs no peaks and may map its strips from the page cache, reaches 0.7-0.87x
(``benchmarks/feed.py``, ``docs/benchmarks.md``).

The peaks are a function of the input's bits, which its content stamp follows
(:func:`blocklin.storage.stamps.content_stamp`: every file's size, times and inode; a rewrite in
place changes them). A first pass over a local input records its peaks here under the stamp taken
before it read anything; a later job over the same input at the same stamp takes them, and its
first pass then reads as a later pass does. Any change to the input gives a new stamp and the peaks
are taken again. Inputs on object stores are not kept: listing every object for its stamp would cost
a first pass more than the peaks, which their reads outweigh anyway. Peaks holding NaN or Inf are
not kept either (the pass that meets them refuses or reports them again).

The record lives in this process only (the client of a cluster job, where the peaks are gathered),
bounded to :data:`ENTRIES` inputs and :data:`MAX_BYTES`; :func:`clear` forgets it.
"""

from __future__ import annotations

import collections
import threading
from typing import Any

import numpy as np

#: How many (input, orientation, row range) records are kept, the least recently used dropped first.
ENTRIES = 64
#: The widest peaks kept (entries; 8 bytes each): a record stays small beside any job's budget.
MAX_COLUMNS = 1 << 20
#: The most bytes of peaks kept in all (the least recently used dropped first).
MAX_BYTES = 64 << 20

_known: collections.OrderedDict = collections.OrderedDict()
_lock = threading.Lock()


def _key(source: Any, stamp: str) -> tuple:
    return (str(source.path), stamp, bool(source.transposed), int(source.first_row), int(source.rows),
            int(source.width))


def is_local(source: Any) -> bool:
    """Whether ``source`` is stored on the local file system (the inputs this record keeps)."""
    from blocklin.storage.location import as_location

    try:
        return as_location(str(source.path)).is_local
    except Exception:  # noqa: BLE001 - not a location blocklin resolves: not kept
        return False


def lookup(source: Any, stamp: str) -> np.ndarray | None:
    """The column peaks recorded for ``source`` at ``stamp`` (a copy), or None."""
    with _lock:
        peaks = _known.get(_key(source, stamp))
        if peaks is None:
            return None
        _known.move_to_end(_key(source, stamp))
        return peaks.copy()


def remember(source: Any, stamp: str, peaks: np.ndarray | None) -> None:
    """Record the finite column ``peaks`` a pass took of ``source`` read at ``stamp``."""
    if peaks is None:
        return
    peaks = np.asarray(peaks, dtype=np.float64)
    if peaks.size > MAX_COLUMNS or not np.isfinite(peaks).all():
        return
    with _lock:
        _known[_key(source, stamp)] = peaks.copy()
        _known.move_to_end(_key(source, stamp))
        while len(_known) > ENTRIES or sum(p.nbytes for p in _known.values()) > MAX_BYTES:
            _known.popitem(last=False)


def clear() -> None:
    """Forget every record (the next job's first passes take their peaks again)."""
    with _lock:
        _known.clear()


__all__ = ["ENTRIES", "MAX_BYTES", "MAX_COLUMNS", "clear", "is_local", "lookup", "remember"]
