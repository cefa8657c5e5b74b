"""Host buffers reused by the tile tasks of one run, in the process that runs them.

Every GEMM tile allocates the same buffers (its accumulator and its panel slots, sized by the
plan). Freshly mapped memory costs a page fault per page on first touch, and NumPy asks for
transparent huge pages, which the kernel may compact memory for inside the fault: measured here,
the first touch of a fresh 32 MiB buffer took 10-40 ms under load, once 299 ms, against 12-16 ms to
refill it. Within :func:`reusing` (one graph run on the local threaded or sync scheduler) a tile
hands its buffers back when it ends and the next tile takes them. Buffers are matched by exact
shape and dtype, so the pool holds no more than the tiles running at once held: the plan's peak.
Outside the scope (other processes, a cluster) nothing is kept.

Every buffer starts on a page boundary (:func:`aligned_empty`): the kernel copies chunk files from the
page cache into them, and that copy is several times slower into a destination 16 bytes past a cache
line, where glibc puts every block it maps (blocklin fixes its mmap threshold, :mod:`blocklin._memory`).
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


#: Alignment of the buffers :func:`aligned_empty` hands out (a page).
ALIGNMENT = 4096


def aligned_empty(shape: tuple[int, ...] | int, dtype: Any) -> np.ndarray:
    """``numpy.empty(shape, dtype)`` whose data starts on a :data:`ALIGNMENT` boundary.

    glibc serves a block it maps (every block above blocklin's mmap threshold) 16 bytes into its first
    page, and NumPy's arrays start there. The kernel's copy from the page cache into such a destination
    (``preadv`` of a chunk file) is several times slower than into an aligned one: measured on the
    2-core machine, 8 MiB chunk files in the page cache read one thread into one reused buffer, 5.1-6.0
    GB/s at 16 bytes past a page boundary against 12-18 at 0, 32 or 64 bytes past it.
    """
    dt = np.dtype(dtype)
    shape = (int(shape),) if np.ndim(shape) == 0 else tuple(int(s) for s in shape)
    nbytes = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
    if nbytes < ALIGNMENT:
        return np.empty(shape, dtype=dt)
    raw = np.empty(nbytes + ALIGNMENT, dtype=np.uint8)
    skip = -raw.ctypes.data % ALIGNMENT
    return raw[skip:skip + nbytes].view(dt).reshape(shape)


def empty(shape: tuple[int, ...], dtype: Any) -> np.ndarray:
    """A host buffer, page-aligned (:func:`aligned_empty`): a kept one of this shape and dtype when a
    run reuses buffers, else a new one."""
    with _lock:
        kept = _free.get(_key(shape, dtype)) if _free is not None else None
        if kept:
            return kept.pop()
    return _fresh(shape, dtype)


def _fresh(shape: tuple[int, ...], dtype: Any) -> np.ndarray:
    """A buffer :func:`empty` could not take from the kept ones."""
    return aligned_empty(shape, dtype)


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
