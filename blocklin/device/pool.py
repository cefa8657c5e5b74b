"""Host buffers reused by the tile tasks of one run, in the process that runs them.

Every GEMM tile allocates the same buffers (its accumulator and its panel slots, sized by the
plan). Freshly mapped memory costs a page fault per page on first touch, and NumPy asks for
transparent huge pages, which the kernel may compact memory for inside the fault: measured here,
the first touch of a fresh 32 MiB buffer took 10-40 ms under load, once 299 ms, against 12-16 ms to
refill it. Within :func:`reusing` (one graph run on the local threaded or sync scheduler) a tile
hands its buffers back when it ends and the next tile takes them. Buffers are matched by exact
shape and dtype, so the pool holds no more than the tiles running at once held: the plan's peak.
Outside the scope (other processes, a cluster) nothing is kept.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

import numpy as np

_lock = threading.Lock()
_free: dict[tuple, list[np.ndarray]] | None = None  # None: no run reuses buffers now
_depth = 0


@contextlib.contextmanager
def reusing() -> Iterator[None]:
    """Reuse host buffers between the tasks run inside (nested scopes share the outermost one);
    everything kept is dropped when the outermost scope ends."""
    global _free, _depth
    with _lock:
        if _depth == 0:
            _free = {}
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0:
                _free = None


def _key(shape: tuple[int, ...], dtype: Any) -> tuple:
    return tuple(int(s) for s in shape), np.dtype(dtype).str


def empty(shape: tuple[int, ...], dtype: Any) -> np.ndarray:
    """A host buffer: a kept one of this shape and dtype when a run reuses buffers, else a new one."""
    with _lock:
        kept = _free.get(_key(shape, dtype)) if _free is not None else None
        if kept:
            return kept.pop()
    return np.empty(shape, dtype=dtype)


@contextlib.contextmanager
def borrowed(shape: tuple[int, ...], dtype: Any) -> Iterator[np.ndarray]:
    """:func:`empty` for the body, handed back by :func:`give` after it (no view of it may outlive the
    body): a kernel's temporaries, warm from the previous task of the run."""
    buf = empty(shape, dtype)
    try:
        yield buf
    finally:
        give(buf)


def give(buf: np.ndarray | None) -> None:
    """Hand ``buf`` (from :func:`empty`, no view of it left in use) back for the next task."""
    if buf is None:
        return
    with _lock:
        if _free is not None:
            _free.setdefault(_key(buf.shape, buf.dtype), []).append(buf)
