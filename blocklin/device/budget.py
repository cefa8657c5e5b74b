"""The device budget of one GPU (:class:`DeviceBudget`): the bytes every task of this process that runs
on it holds, and the bytes the device operand cache (:mod:`blocklin.device.resident`) keeps there.

Its own module so that the CUDA device (:mod:`blocklin.device.cuda`) and the cache, which each need
it, do not import each other.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any


class DeviceBudget:
    """The device budget of one GPU, shared by every task of this process that runs on it.

    A task holds its planned device bytes while it runs; a task that would exceed the budget waits
    until others finish (a task larger than the whole budget runs alone rather than never). The
    device operand cache (:mod:`blocklin.device.resident`) keeps its blocks' bytes here too
    (``cached``): a task that does not fit beside them first evicts idle blocks (``shrink``).
    """

    _budgets: dict[int, DeviceBudget] = {}
    _lock = threading.Lock()

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.held = 0
        self.cached = 0
        self.peak = 0  # high-water mark of held + cached
        self.waits = 0
        #: ``shrink(nbytes) -> freed``: evicts idle cached blocks (set by the GPU's DeviceCache).
        self.shrink: Any = None

    @classmethod
    def of(cls, device_id: int) -> DeviceBudget:
        with cls._lock:
            return cls._budgets.setdefault(device_id, cls())

    def take_cached(self, nbytes: int, budget: int) -> bool:
        """Count ``nbytes`` of cached blocks if they fit ``budget`` beside everything held (never waits)."""
        with self.cond:
            if self.held + self.cached + nbytes > budget:
                return False
            self.cached += nbytes
            self.peak = max(self.peak, self.held + self.cached)
            return True

    def give_cached(self, nbytes: int) -> None:
        with self.cond:
            self.cached -= nbytes
            self.cond.notify_all()

    @contextlib.contextmanager
    def hold(self, nbytes: int, budget: int) -> Iterator[None]:
        with self.cond:
            waited = False
            while True:
                over = self.held + self.cached + nbytes - budget
                if over <= 0:
                    break
                if self.cached and self.shrink is not None:
                    # the cache takes its own lock, then this one: shrink it without holding ours
                    self.cond.release()
                    try:
                        freed = self.shrink(over)
                    finally:
                        self.cond.acquire()
                    if freed:
                        continue
                if not self.held:
                    break  # alone (beside blocks other tasks' lookups still pin): runs rather than never
                if not waited:
                    self.waits += 1
                    waited = True
                self.cond.wait()
            self.held += nbytes
            self.peak = max(self.peak, self.held + self.cached)
        try:
            yield
        finally:
            with self.cond:
                self.held -= nbytes
                self.cond.notify_all()


__all__ = ["DeviceBudget"]
