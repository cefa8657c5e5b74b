"""Tile graphs: deterministic Dask task graphs of tile tasks, and their execution.

A :class:`TileGraph` maps keys ``(name, i, j, ...)`` to tasks ``(func, *args)`` whose arguments are
small, picklable specs (paths, slices, plans) — never big arrays — so the same graph runs on the
threaded scheduler, on processes, or on a ``distributed`` cluster whose workers share the storage.

Keys are deterministic in everything that makes a task distinct: when a graph runs, its name gets a
token of every task's function and arguments (inputs, outputs, parameters, plan). Tile tasks write
their results as a side effect, so two jobs that differ only in their output must never share a key:
a ``distributed`` scheduler runs a key once and hands the second job the first job's result.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
from collections.abc import Callable, Hashable
from typing import Any

from dask.base import tokenize
from dask.callbacks import Callback

from blocklin import interrupt
from blocklin.progress import NullProgress, unit_sink
from blocklin.runtime.scheduler import Scheduler, resolve_scheduler


#: Most tasks one graph may hold. A graph lives in memory (with the scheduler's state, a few KiB a
#: task), so a shape whose tiles run into the millions (a 10^12 x 10 matrix) is refused here, before
#: it grows without bound, instead of ending in an empty ``MemoryError``.
MAX_GRAPH_TASKS = 200_000


def _too_many_tasks(name: str, func: Callable) -> Exception:
    from blocklin.errors import BudgetError, explain

    what = getattr(func, "__name__", "tile")
    return BudgetError(explain("shape", f"one pass of blocklin runs at most {MAX_GRAPH_TASKS} tasks (its graph is "
                               "held in memory)", f"more than {MAX_GRAPH_TASKS} {what} tasks in {name.split('-')[1]}",
                               "raise the memory budget (--memory / memory=) so that tiles are larger, or "
                               "rechunk the input with larger chunks (blocklin convert IN OUT.zarr --chunks auto); "
                               "check that the shape in the input's metadata is the intended one"))


@dataclasses.dataclass
class TileGraph:
    """An ordered set of independent tile tasks (plus optional dependencies via key arguments)."""

    name: str
    tasks: dict[Hashable, tuple] = dataclasses.field(default_factory=dict)
    #: Work of each task in ``unit`` (rows of a row pass) when the tasks declare it; progress then
    #: counts units, reported within the tasks (:func:`blocklin.progress.report_units`).
    weights: dict[Hashable, int] = dataclasses.field(default_factory=dict)
    unit: str | None = None
    #: Units of work the tasks run (tiles, groups), at least one per task: what the graph's size limit counts.
    units: int = 0

    @classmethod
    def named(cls, operation: str, *identity: Any) -> TileGraph:
        """A graph whose name is deterministic in ``identity`` (inputs, parameters, plan)."""
        return cls(f"blocklin-{operation}-{tokenize(*identity)}")

    def add(self, index: tuple, func: Callable, *args: Any, units: int = 1) -> tuple:
        """Add task ``func(*args)`` under ``index``; ``units``: the tiles or groups it runs, counted
        against :data:`MAX_GRAPH_TASKS` as tasks of their own (a run of a million tiles is no smaller)."""
        self.expect(units, func)
        self.units += units
        key = (self.name, *index)
        self.tasks[key] = (func, *args)
        return key

    def expect(self, units: int, func: Callable) -> None:
        """Refuse up front ``units`` more units of ``func`` than the graph may hold (before a caller
        builds their list)."""
        if self.units + units > MAX_GRAPH_TASKS:
            raise _too_many_tasks(self.name, func)

    def weigh(self, key: Hashable, units: int, unit: str) -> None:
        """Declare the work of task ``key`` (every task of a weighed graph is weighed in one unit)."""
        self.weights[key] = int(units)
        self.unit = unit

    def keys(self) -> list[Hashable]:
        return list(self.tasks)

    def distinct(self) -> TileGraph:
        """This graph with its name extended by a token of every task (functions and arguments).

        Keys naming other tasks of the graph (dependencies) are renamed with it.
        """
        name = f"{self.name}-{tokenize(list(self.tasks.items()))}"
        out = TileGraph(name, unit=self.unit)
        for key, (func, *args) in self.tasks.items():
            out.tasks[_renamed(key, self, name)] = (func, *[_renamed(a, self, name) for a in args])
            if key in self.weights:
                out.weights[_renamed(key, self, name)] = self.weights[key]
        return out

    def __len__(self) -> int:
        return len(self.tasks)


def _renamed(arg: Any, graph: TileGraph, name: str) -> Any:
    """``arg`` with the keys of ``graph``'s tasks renamed to ``name`` (lists searched). A module-level
    function: a closure calling itself is a reference cycle, which held the graph's arguments (an
    iterative method's ``X`` at every step) until the cyclic collector's oldest generation ran."""
    if isinstance(arg, tuple) and arg and arg[0] == graph.name and arg in graph.tasks:
        return (name, *arg[1:])
    if isinstance(arg, list):
        return [_renamed(a, graph, name) for a in arg]
    return arg


def _run_serial(dsk: dict, keys: list, finished: Callable[[Hashable, Any], None]) -> list:
    """Reference executor: plain Python, tasks in insertion order (dependencies first). Module-level
    helpers rather than closures that call each other: such closures form a reference cycle holding
    the graph (its arguments) and every result until the cyclic collector runs, which an iterative
    method's hundreds of small graphs outpace (measured: 24 products' blocks alive at once)."""
    cache: dict = {}
    return [_run_key(k, dsk, cache, finished) for k in keys]


def _run_key(key: Hashable, dsk: dict, cache: dict, finished: Callable[[Hashable, Any], None]) -> Any:
    if key not in cache:
        func, *args = dsk[key]
        cache[key] = func(*[_evaluate(a, dsk, cache, finished) for a in args])
        finished(key, cache[key])
    return cache[key]


def _evaluate(arg: Any, dsk: dict, cache: dict, finished: Callable[[Hashable, Any], None]) -> Any:
    try:  # specs may be frozen dataclasses holding unhashable parameters
        is_key = isinstance(arg, Hashable) and not isinstance(arg, (str, bytes)) and arg in dsk
    except TypeError:
        is_key = False
    if is_key:
        return _run_key(arg, dsk, cache, finished)
    if isinstance(arg, list):
        return [_evaluate(a, dsk, cache, finished) for a in arg]
    return arg


#: Times a local process pool is rebuilt after one of its processes died (SIGKILL, out of memory).
POOL_RETRIES = 2


class ProcessPools:
    """Process pools kept for one job's graphs under ``processes``, one per concurrency: a pool's
    processes start once (each imports blocklin, about a second) rather than once per graph, which
    an iterative method (a product per step) would pay at every step."""

    def __init__(self) -> None:
        self._pools: dict[int, Any] = {}

    def get(self, workers: int, *, fresh: bool = False) -> Any:
        """The pool of ``workers`` processes; ``fresh``: a new one (after one of its processes died)."""
        if fresh and workers in self._pools:
            self._pools.pop(workers).shutdown(wait=False, cancel_futures=True)
        if workers not in self._pools:
            from concurrent.futures import ProcessPoolExecutor

            from dask.multiprocessing import get_context, initialize_worker_process

            if os.environ.get("PYTHONHASHSEED") in (None, "0"):  # as dask's own pools: consistent hashing
                os.environ["PYTHONHASHSEED"] = "6640"
            self._pools[workers] = ProcessPoolExecutor(
                workers, mp_context=get_context(),
                initializer=functools.partial(initialize_worker_process, user_initializer=None))
        return self._pools[workers]

    def close(self) -> None:
        for pool in self._pools.values():
            pool.shutdown(wait=True, cancel_futures=True)
        self._pools.clear()


def execute(graph: TileGraph, *, scheduler: Any = None, workers: int = 1, progress: Any = None,
            description: str = "tiles", events: dict | None = None, pools: ProcessPools | None = None) -> list:
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
    events : dict, optional
        Receives ``retried_tasks``: tasks run again after their worker process died.
    pools : ProcessPools, optional
        Under ``processes``, the pools to run in (a job's, kept between its graphs); None: a pool for
        this graph alone.

    Raises
    ------
    WorkerLostError
        Under ``processes``, pool processes died more than :data:`POOL_RETRIES` times; tiles already
        written stay in the partial output for ``resume=True``.
    """
    sched = scheduler if isinstance(scheduler, Scheduler) else resolve_scheduler(scheduler)
    progress = progress or NullProgress()
    events = {} if events is None else events
    events.setdefault("retried_tasks", 0)
    graph = graph.distinct()
    keys = graph.keys()
    dsk = dict(graph.tasks)
    weighed = graph.unit is not None and len(graph.weights) == len(keys)
    if weighed:
        progress.start(sum(graph.weights.values()), f"{description} ({graph.unit})")
    else:
        progress.start(len(keys), description)
    if not keys:
        return []
    interrupt.reset()  # a previous run's interrupt does not stop this one

    def finished(key: Hashable, result: Any) -> None:
        """A task ended: count what it did not report on the way (all of it in another process)."""
        if not weighed:
            progress.advance(1)
            return
        units = result if isinstance(result, list) else [result]  # a run returns one result per unit
        told = sum(r.get("progress_units", 0) for r in units if isinstance(r, dict))
        if graph.weights[key] > told:
            progress.advance(graph.weights[key] - told)

    with unit_sink(progress.advance) if weighed else contextlib.nullcontext():
        if sched.kind == "sync":
            return _run_serial(dsk, keys, finished)
        if sched.kind == "distributed":
            return _run_distributed(sched.client, dsk, keys, finished, events)
        return _run_local(sched.kind, dsk, keys, workers, finished, events, pools)


def _run_distributed(client: Any, dsk: dict, keys: list, finished: Callable[[Hashable, Any], None],
                     events: dict) -> list:
    """Through ``client`` (never the default client: any client, or an address, works).

    ``distributed`` itself reruns the tasks of a worker that died; their count is read from the
    scheduler's retry records of this graph's keys.
    """
    from distributed import as_completed

    futures = client.get(dsk, keys, sync=False)
    for fut in as_completed(futures, loop=client.loop):
        finished(fut.key, fut.result() if fut.status == "finished" else None)
    results = client.gather(futures)

    def suspicious(keys, dask_scheduler=None):  # by value: the scheduler need not import blocklin
        return sum(dask_scheduler.tasks[k].suspicious for k in keys if k in dask_scheduler.tasks)

    try:
        events["retried_tasks"] += int(client.run_on_scheduler(suspicious, keys))
    except Exception:  # a scheduler that refuses run_on_scheduler: the count is unknown, not wrong
        events["retried_tasks"] = None
    return results


def _ignore(key: Hashable, result: Any) -> None:
    pass


def _progress_callback(key_set: set, done: dict, finished: Callable[[Hashable, Any], None]) -> Any:
    """A Dask callback recording each finished task of ``key_set`` in ``done`` and reporting it.

    One module-level class, not a class per run: a class made in a function is a reference cycle
    (the type and its namespace), and its method's closure held the run's graph, arguments and
    results until the cyclic collector's oldest generation ran (an iterative method's products each
    left their ``X`` and result behind: a sparse svd measured at 1.11x its budget, 0.59x without);
    :meth:`_Progress.release` lets go of them when the run ends."""
    cb = _Progress()
    cb.key_set, cb.done, cb.finished = key_set, done, finished
    return cb


class _Progress(Callback):
    key_set: set
    done: dict
    finished: Callable[[Hashable, Any], None]

    def _posttask(self, key: Hashable, result: Any, dsk: dict, state: dict, worker_id: Any) -> None:
        if key in self.key_set and key not in self.done:
            self.done[key] = result
            self.finished(key, result)

    def release(self) -> None:
        """Drop the run's results and graph: the scheduler's own closures (reference cycles in Dask's
        ordering and local scheduler) keep this callback until the cyclic collector runs."""
        self.key_set, self.done, self.finished = set(), {}, _ignore


def _run_local(kind: str, dsk: dict, keys: list, workers: int, finished: Callable[[Hashable, Any], None],
               events: dict, pools: ProcessPools | None = None) -> list:
    """Dask's threaded or multiprocessing scheduler; a dead pool process costs only its tasks.

    Tile tasks are idempotent (each writes whole chunks of its own), so after a pool process dies
    the tasks that had not reported back run again in a fresh pool; finished ones are kept.
    """
    from concurrent.futures.process import BrokenProcessPool

    done: dict = {}
    key_set = set(keys)
    has_deps = any(_refers(a, key_set) for _, *args in dsk.values() for a in args)
    attempt = 0
    while True:
        todo = [k for k in keys if k not in done]
        # with dependencies, finished inputs of unfinished tasks are recomputed (cheap, idempotent)
        sub = dsk if has_deps else {k: dsk[k] for k in todo}
        if kind == "processes":
            import dask.multiprocessing

            pool = pools.get(max(1, workers), fresh=attempt > 0) if pools is not None else None
            get = functools.partial(dask.multiprocessing.get, pool=pool)
        else:
            get = _threaded_get
        try:
            callback = _progress_callback(key_set, done, finished)
            try:
                with callback:
                    results = get(sub, todo, num_workers=max(1, workers))
            finally:
                callback.release()
            done.update(zip(todo, results))
            return [done[k] for k in keys]
        except BrokenProcessPool as exc:
            lost = len(keys) - len(done)
            if attempt == POOL_RETRIES:
                from blocklin.errors import WorkerLostError, explain

                raise WorkerLostError(explain(
                    "scheduler", "needs worker processes that survive the job",
                    f"a pool process died {attempt + 1} times ({exc}); {len(done)} of {len(keys)} tasks finished",
                    "rerun with resume=True (CLI: --resume) to keep the finished tiles; check the memory "
                    "limit of the processes, or use scheduler='threads'")) from exc
            events["retried_tasks"] += lost
            from blocklin.errors import warn

            warn(f"a worker process died; running its {lost} unfinished task(s) again in a new pool")
            attempt += 1


def _threaded_get(dsk: dict, keys: list, num_workers: int) -> list:
    """Dask's threaded scheduler on a pool of this run's own, which ends with the run.

    When the run ends early (an interrupt, a failed task), the tasks still running on the pool's
    threads are told to stop (:func:`blocklin.interrupt.cancel` on an interrupt) and waited for, and
    queued ones are dropped: nothing writes into the output once the caller cleans it up.
    """
    import dask.threaded

    try:
        from dask.threaded import ContextAwareThreadPoolExecutor as Pool
    except ImportError:  # older dask
        from concurrent.futures import ThreadPoolExecutor as Pool

    pool = Pool(num_workers)
    try:
        return dask.threaded.get(dsk, keys, num_workers=num_workers, pool=pool)
    except BaseException as exc:
        if not isinstance(exc, Exception):  # KeyboardInterrupt, SystemExit: stop the tasks too
            interrupt.cancel()
        pool.shutdown(wait=True, cancel_futures=True)
        raise
    finally:
        pool.shutdown(wait=True)


def start_order(n: int) -> list[int]:
    """The indices ``0..n-1`` in the order the local schedulers start ``n`` independent tasks of one graph
    keyed ``(name, i)``: the serial one in key order, Dask's threaded and multiprocessing ones in
    :func:`dask.order.order`'s (today the last key first). A graph whose results are consumed in a fixed
    order as they finish (:class:`~blocklin.runtime.sparse_pass.OrderedSum`) keys its ``i``-th task
    ``start_order(n)[i]``, so that what finishes early is what is consumed next, on any version of Dask."""
    import dask.order

    rank = dask.order.order({("order", i): (_ignore, None, None) for i in range(n)})
    return sorted(range(n), key=lambda i: rank[("order", i)])


def _refers(arg: Any, keys: set) -> bool:
    if isinstance(arg, tuple):
        try:
            return arg in keys
        except TypeError:
            return False
    if isinstance(arg, list):
        return any(_refers(a, keys) for a in arg)
    return False
