"""Progress reporting for tile tasks and passes.

Operations take ``progress=``: ``None``/``False`` (silent), ``True`` (a rich progress bar on
stderr when it is a terminal, else silent), or any object with ``start(total, description)``,
``advance(n)`` and ``close()`` (for example :class:`ProgressRecorder` in tests).

Progress counts tasks, or units of work within them: a graph whose tasks declare a weight (rows
of a row pass) starts its bar at the total weight, and tasks running in this process (the ``sync``
and ``threads`` schedulers) report their units as they go through :func:`report_units`, so a pass
of one long task moves row strip by row strip instead of showing ``0/1``. Tasks in other processes
report nothing on the way; their whole weight is counted when they finish.
"""

from __future__ import annotations

import contextlib
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any, Protocol


class Progress(Protocol):
    def start(self, total: int, description: str) -> None: ...
    def advance(self, n: int = 1) -> None: ...
    def close(self) -> None: ...


_SINKS: list[Callable[[int], None]] = []
_SINKS_LOCK = threading.Lock()


@contextlib.contextmanager
def unit_sink(advance: Callable[[int], None]) -> Iterator[None]:
    """Deliver the units that tasks of this process report (:func:`report_units`) to ``advance``."""
    with _SINKS_LOCK:
        _SINKS.append(advance)
    try:
        yield
    finally:
        with _SINKS_LOCK:
            _SINKS.remove(advance)


def report_units(n: int) -> int:
    """Report ``n`` units of a task's work done; returns ``n`` when a progress bar of this process took
    them, else 0 (the task's remaining weight is then counted when it finishes)."""
    with _SINKS_LOCK:
        sink = _SINKS[-1] if _SINKS else None
    if sink is None or n <= 0:
        return 0
    sink(n)
    return n


class NullProgress:
    """Discards progress."""

    def start(self, total: int, description: str) -> None:
        pass

    def advance(self, n: int = 1) -> None:
        pass

    def close(self) -> None:
        pass


class ProgressRecorder:
    """Records progress events; useful in tests and for callers that poll."""

    def __init__(self) -> None:
        self.events: list[tuple[str, Any]] = []
        self.done = 0
        self.total = 0
        self._lock = threading.Lock()

    def start(self, total: int, description: str) -> None:
        with self._lock:
            self.events.append(("start", (total, description)))
            self.total += total

    def advance(self, n: int = 1) -> None:
        with self._lock:
            self.done += n
            self.events.append(("advance", n))

    def close(self) -> None:
        self.events.append(("close", None))


class RichProgress:
    """A rich progress bar on stderr (one task line per started phase)."""

    def __init__(self) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress as _P, TextColumn, TimeElapsedColumn, \
            TimeRemainingColumn

        self._p = _P(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                     TimeRemainingColumn(), console=Console(stderr=True), transient=False)
        self._task = None
        self._lock = threading.Lock()
        self._p.start()

    def start(self, total: int, description: str) -> None:
        with self._lock:
            if self._task is not None:
                self._p.update(self._task, completed=self._p.tasks[-1].total)
            self._task = self._p.add_task(description, total=total)

    def advance(self, n: int = 1) -> None:
        with self._lock:
            if self._task is not None:
                self._p.advance(self._task, n)

    def close(self) -> None:
        self._p.stop()


def make_progress(progress: Any) -> Any:
    """Resolve a ``progress=`` argument into an object with start/advance/close."""
    if progress is None or progress is False:
        return NullProgress()
    if progress is True:
        return RichProgress() if sys.stderr.isatty() else NullProgress()
    for attr in ("start", "advance", "close"):
        if not hasattr(progress, attr):
            from blocklin.errors import ConfigError, explain

            raise ConfigError(explain("progress", "must be None, a bool, or an object with start/advance/close",
                                      repr(progress), "pass progress=True"))
    return progress
