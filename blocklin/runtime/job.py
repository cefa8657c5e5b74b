"""A :class:`Job`: the lifetime of one operation (settings, staged inputs, scheduler, output, report).

Algorithms open a job, resolve their operands through it, plan, build tile graphs, run them
through :meth:`Job.run`, and publish their output atomically; the job accumulates the statistics
every operation reports (seconds, flops, bytes read and written, passes, peak memory).
"""

from __future__ import annotations

import contextlib
import os
import resource
import time
import uuid
from typing import Any

from blocklin import _memory
from blocklin.config import Config, resolve
from blocklin.device.base import gpu_available, resolved_kind
from blocklin.errors import WorkerLostError
from blocklin.operands import Operand, as_operand, temp_root
from blocklin.runtime.graph import TileGraph, execute
from blocklin.progress import make_progress
from blocklin.runtime.scheduler import resolve_scheduler
from blocklin.runtime.tiles import FROM_WORKER
from blocklin.storage.atomic import AtomicOutput
from blocklin.storage.backend import remove
from blocklin.storage.location import Location


def peak_rss() -> int:
    """Peak resident memory of this process so far, in bytes.

    Reads the kernel's high-water mark (``VmHWM``), which belongs to this process alone; the
    ``ru_maxrss`` fallback (non-Linux) can include a parent's memory inherited at fork.
    """
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


class Job:
    """See module docstring. Use as a context manager."""

    def __init__(self, operation: str, *, memory: Any = None, device: str | None = None,
                 device_memory: Any = None, scheduler: Any = None, workers: int | None = None,
                 progress: Any = None, check_finite: bool | None = None, temp_dir: Any = None,
                 storage_options: dict | None = None) -> None:
        self.operation = operation
        _memory.tune()  # this process chose blocklin (a worker that only runs its tasks is left alone)
        cfg = resolve(memory=memory, device=device, device_memory=device_memory, scheduler=scheduler,
                      workers=workers, check_finite=check_finite, temp_dir=temp_dir)
        if storage_options:
            cfg = cfg.replace(storage_options={**(cfg.storage_options or {}), **storage_options})
        self.cfg: Config = cfg
        self.stack = contextlib.ExitStack()
        if temp_dir is not None or storage_options:
            # Scoped, so that nested operations (solve's GEMMs) and the opener see the same storage.
            from blocklin import config as _config

            self.stack.enter_context(_config.set(temp_dir=cfg.temp_dir, storage_options=cfg.storage_options))
        try:
            self.scheduler = resolve_scheduler(self.cfg.scheduler)
            if self.scheduler.kind == "distributed":
                from blocklin.storage.probe import check_workers_reach

                check_workers_reach(self.scheduler.client, temp_root(self.cfg))
        except BaseException:
            self.stack.close()
            raise
        self.device = resolved_kind(self.cfg.device)
        if self.device == "gpu" and not gpu_available():
            from blocklin.device import get_device

            get_device("gpu")  # raises DeviceError with the fix
        self.progress = make_progress(self.cfg.progress if progress is None else progress)
        self.t0 = time.perf_counter()
        self.stats = {"flops": 0, "bytes_read": 0, "bytes_written": 0, "tasks": 0, "skipped": 0, "retried_tasks": 0,
                      "load_seconds": 0.0, "wait_seconds": 0.0}
        self.outputs: list[AtomicOutput] = []

    # -- inputs -------------------------------------------------------------------------------
    def operand(self, x: Any, name: str, ndim: int = 2) -> Operand:
        return as_operand(x, name, self.cfg, self.stack, ndim=ndim,
                          client=self.scheduler.client if self.scheduler.kind == "distributed" else None)

    @property
    def check_finite(self) -> bool:
        return self.cfg.check_finite

    def device_memory(self) -> int | None:
        """Device budget: configured, else 80% of the free device memory (GPU only)."""
        if self.device != "gpu":
            return None
        if self.cfg.device_memory:
            return self.cfg.device_memory
        from blocklin.device import get_device

        return int(0.8 * get_device("gpu").free_memory())

    # -- workers and threads --------------------------------------------------------------------
    def cores(self) -> int:
        return os.cpu_count() or 1

    def workers(self, default: int = 1) -> int:
        """Concurrent tasks on local schedulers (config, else ``default``)."""
        return self.cfg.workers or default

    def task_blas_threads(self, blas_threads: int) -> int | None:
        """BLAS threads each task sets itself (and restores when it ends).

        ``None`` on the local threaded/sync schedulers (the job limits BLAS around the whole run);
        on a cluster, each task takes its own worker's share of that machine's cores
        (:data:`~blocklin.runtime.tiles.FROM_WORKER`), never a figure from the client's machine.
        """
        if self.scheduler.kind in ("threads", "sync"):
            return None
        if self.scheduler.kind == "distributed":
            return FROM_WORKER
        return blas_threads

    # -- temporary stores and outputs -----------------------------------------------------------
    def temp_dir(self) -> Location:
        """A folder (or URL prefix) for this job's intermediates, removed when the job ends.

        Join names with ``/`` (``job.temp_dir() / "Y.zarr"``); the location carries its storage
        options into task specs.
        """
        if not hasattr(self, "_tmp"):
            self._tmp = temp_root(self.cfg) / f"blocklin-{self.operation}-{uuid.uuid4().hex[:12]}"
            if self._tmp.is_local:
                os.makedirs(self._tmp.url)
            self.stack.callback(remove, self._tmp)
        return self._tmp

    def output(self, out: Any, *, inputs: list[Any], overwrite: bool = False, resume: bool = False,
               token: str | None = None, suffix: str = ".zarr") -> AtomicOutput:
        """An atomic output at ``out`` (path, URL, Location or zarr store), or a new store under the
        temp dir when ``out`` is None (the caller owns it)."""
        if out is None:
            out = temp_root(self.cfg) / f"blocklin-{self.operation}-{uuid.uuid4().hex[:12]}{suffix}"
            resume = False
        ao = AtomicOutput(out, inputs=inputs, overwrite=overwrite, resume=resume, token=token,
                          storage_options=self.cfg.storage_options)
        self.outputs.append(ao)
        return ao

    # -- execution -----------------------------------------------------------------------------------
    def run(self, graph: TileGraph, *, workers: int = 1, blas_threads: int | None = None,
            description: str | None = None) -> list:
        """Execute ``graph`` and add the tasks' statistics to the job's."""
        ctx = contextlib.nullcontext()
        if blas_threads and self.scheduler.kind in ("threads", "sync"):
            from threadpoolctl import threadpool_limits

            ctx = threadpool_limits(limits=blas_threads, user_api="blas")
        events: dict = {}
        with ctx:
            results = execute(graph, scheduler=self.scheduler, workers=workers, progress=self.progress,
                              description=description or f"{self.operation}", events=events)
        if events["retried_tasks"] is None or self.stats["retried_tasks"] is None:
            self.stats["retried_tasks"] = None  # unknown on this scheduler
        else:
            self.stats["retried_tasks"] += events["retried_tasks"]
        for r in results:
            if isinstance(r, dict):
                self.add_stats(r)
        return results

    def add_stats(self, r: dict) -> None:
        self.stats["tasks"] += 1
        for key in ("flops", "bytes_read", "bytes_written", "skipped", "load_seconds", "wait_seconds"):
            if key in r:
                self.stats[key] += r[key]

    def seconds(self) -> float:
        return time.perf_counter() - self.t0

    def report(self, **extra: Any) -> dict:
        """The operation's report: statistics, time, peak memory, device, scheduler."""
        secs = self.seconds()
        rep = dict(self.stats)
        rep.update(seconds=secs, peak_memory=peak_rss(), memory_budget=self.cfg.memory, device=self.device,
                   scheduler=self.scheduler.kind, gflops=self.stats["flops"] / secs / 1e9 if secs > 0 else 0.0)
        rep.update(extra)
        return rep

    # -- lifecycle ------------------------------------------------------------------------------------
    def __enter__(self) -> Job:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        try:
            # after lost worker processes the finished tiles stay for resume=True (the error says so)
            if exc_type is not None and not issubclass(exc_type, WorkerLostError):
                for ao in self.outputs:
                    ao.abort()
        finally:
            self.progress.close()
            self.stack.close()
