"""Tile graphs: deterministic Dask task graphs of tile tasks, and their execution.

A :class:`TileGraph` maps keys ``(name, i, j, ...)`` to tasks ``(func, *args)`` whose arguments are
small, picklable specs (paths, slices, plans) — never big arrays — so the same graph runs on the
threaded scheduler, on processes, or on a ``distributed`` cluster whose workers share the storage.
Names are ``<operation>-<tokenize(inputs, plan)>``, so equal work gets equal keys.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Hashable
from typing import Any

from dask.base import tokenize

from blocklin.progress import NullProgress
from blocklin.runtime.scheduler import Scheduler, resolve_scheduler


@dataclasses.dataclass
class TileGraph:
    """An ordered set of independent tile tasks (plus optional dependencies via key arguments)."""

    name: str
    tasks: dict[Hashable, tuple] = dataclasses.field(default_factory=dict)

    @classmethod
    def named(cls, operation: str, *identity: Any) -> TileGraph:
        """A graph whose name is deterministic in ``identity`` (inputs, parameters, plan)."""
        return cls(f"blocklin-{operation}-{tokenize(*identity)}")

    def add(self, index: tuple, func: Callable, *args: Any) -> tuple:
        key = (self.name, *index)
        self.tasks[key] = (func, *args)
        return key

    def keys(self) -> list[Hashable]:
        return list(self.tasks)

    def __len__(self) -> int:
        return len(self.tasks)


def _run_serial(dsk: dict, keys: list, progress: Any) -> list:
    """Reference executor: plain Python, tasks in insertion order (dependencies first)."""
    cache: dict = {}

    def evaluate(arg: Any) -> Any:
        try:  # specs may be frozen dataclasses holding unhashable parameters
            is_key = isinstance(arg, Hashable) and not isinstance(arg, (str, bytes)) and arg in dsk
        except TypeError:
            is_key = False
        if is_key:
            return run(arg)
        if isinstance(arg, list):
            return [evaluate(a) for a in arg]
        return arg

    def run(key: Hashable) -> Any:
        if key not in cache:
            func, *args = dsk[key]
            cache[key] = func(*[evaluate(a) for a in args])
            progress.advance(1)
        return cache[key]

    return [run(k) for k in keys]


def execute(graph: TileGraph, *, scheduler: Any = None, workers: int = 1, progress: Any = None,
            description: str = "tiles") -> list:
    """Run every task of ``graph``; return their results in key order.

    Parameters
    ----------
    graph : TileGraph
    scheduler : str, Client or Scheduler, optional
        See :func:`blocklin.runtime.resolve_scheduler`.
    workers : int
        Concurrent tasks on local schedulers (the plan's ``workers``).
    progress : object with start/advance/close, optional
    description : str
        Progress bar label.
    """
    sched = scheduler if isinstance(scheduler, Scheduler) else resolve_scheduler(scheduler)
    progress = progress or NullProgress()
    keys = graph.keys()
    dsk = dict(graph.tasks)
    progress.start(len(keys), description)
    if not keys:
        return []
    if sched.kind == "sync":
        return _run_serial(dsk, keys, progress)
    if sched.kind == "distributed":
        from distributed import as_completed

        futures = sched.client.get(dsk, keys, sync=False)
        for _ in as_completed(futures):
            progress.advance(1)
        return sched.client.gather(futures)
    from dask.callbacks import Callback

    key_set = set(keys)

    class _Progress(Callback):
        def _posttask(self, key, result, dsk_, state, worker_id):  # noqa: N805
            if key in key_set:
                progress.advance(1)

    if sched.kind == "processes":
        import dask.multiprocessing

        get = dask.multiprocessing.get
    else:
        import dask.threaded

        get = dask.threaded.get
    with _Progress():
        return list(get(dsk, keys, num_workers=max(1, workers)))
