"""Physical bytes read from storage, counted where they are read.

Every read of stored data goes through :func:`blocklin.storage.zarr_store.read_block`, which adds
what it actually fetched (byte ranges of chunk files, or whole encoded chunks) to the current
:class:`ReadTally`. A tally is current in a context (:mod:`contextvars`): a tile task opens one
around its body (:func:`blocklin.runtime.tiles.with_task_settings`) and its loader threads run in
copies of the task's context (:func:`in_context`), so concurrent tasks of one process count
separately and their results carry their own ``bytes_physical``.
"""

from __future__ import annotations

import contextlib
import contextvars
import threading
from collections.abc import Callable, Iterator
from typing import Any

_current: contextvars.ContextVar[ReadTally | None] = contextvars.ContextVar("blocklin_read_tally", default=None)


class ReadTally:
    """Bytes read from storage in one context (thread-safe: loader threads share it)."""

    def __init__(self) -> None:
        self.bytes = 0
        self._lock = threading.Lock()

    def add(self, n: int) -> None:
        with self._lock:
            self.bytes += int(n)


def count(n: int) -> None:
    """Add ``n`` bytes read from storage to the current tally (if any)."""
    tally = _current.get()
    if tally is not None:
        tally.add(n)


@contextlib.contextmanager
def tallying() -> Iterator[ReadTally]:
    """Count the reads of this context (and of threads started with :func:`in_context`) in a new tally."""
    tally = ReadTally()
    token = _current.set(tally)
    try:
        yield tally
    finally:
        _current.reset(token)


def in_context(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` bound to a copy of the calling context: a thread running it counts into the caller's tally."""
    ctx = contextvars.copy_context()
    return lambda *args, **kwargs: ctx.run(fn, *args, **kwargs)


def measured(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> int:
    """Run ``fn(*args, **kwargs)`` and return the bytes its reads fetched from storage."""
    with tallying() as tally:
        fn(*args, **kwargs)
    return tally.bytes
