"""A :class:`Job`: the lifetime of one operation (settings, staged inputs, scheduler, output, report).

Algorithms open a job, resolve their operands through it, plan, build tile graphs, run them
through :meth:`Job.run`, and publish their output atomically; the job accumulates the statistics
every operation reports (seconds, flops, bytes read and written, passes, peak memory).
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import gc
import os
import time
import uuid
from typing import Any, Unpack

import numpy as np

import blocklin._readstats as readstats
import blocklin._memory as _memory
from blocklin._memory import peak_rss
from blocklin.config import Config, Settings, check_settings, format_size, resolve, size_hint
from blocklin.device.select import gpu_available, release_device_caches, resolved_kind
from blocklin.errors import BudgetError, ConfigError, DeviceError, InputChangedError, WorkerLostError, explain
from blocklin.matrix import Matrix
from blocklin.operands import Operand, as_operand, cast_integers, stored_input, stored_location, temp_root
from blocklin.runtime.graph import ProcessPools, TileGraph, execute
from blocklin.progress import make_progress
from blocklin.runtime.scheduler import resolve_scheduler
from blocklin.runtime.tiles import FROM_WORKER
from blocklin.storage.atomic import AtomicOutput
from blocklin.storage import input_guard, seen_peaks
from blocklin.storage.guard import check_not_output
from blocklin.storage.backend import remove
from blocklin.storage.formats import check_zarr_output
from blocklin.storage.space import check_space, check_writable
from blocklin.storage.stamps import input_location
from blocklin.storage.cleanup import keep_for_resume, remove_stale_work, report_kept, sweep_stale
from blocklin.storage.location import Location
from blocklin.storage.ownership import (Heartbeat, claim_work_folder, end_work_folder, mark_released, read_record,
                                        start_work_folder)
from blocklin.storage.zarr_store import create_array, wait_for_pending_io


#: Above this part of their time spent waiting for data, the streaming tasks' consumers were bound
#: by the feed (the report's ``bound``). A consumer always waits for its first item, so a stream
#: whose reads keep pace with its compute still waits ``1 / (n + 1)`` of its time over ``n`` items
#: (20% at 4 strips or k-panels, the fewest a planned task usually has); above a quarter the reads
#: fall behind the compute, and a feed fast enough to stop the waits would save that quarter or more
#: of the run.
FEED_BOUND_WAIT = 0.25


@dataclasses.dataclass(frozen=True)
class ClusterInfo:
    """What plans need to know of a ``distributed`` cluster's workers."""

    workers: int
    threads: int
    threads_per_worker: int
    cores_per_worker: int
    #: The smallest worker memory limit in bytes (None: no worker has one).
    memory_limit: int | None
    #: Workers that see a CUDA device (each worker process drives one).
    gpus: int

    @classmethod
    def read(cls, client: Any) -> ClusterInfo:
        ws = client.scheduler_info(n_workers=-1).get("workers", {})
        if not ws:
            raise ConfigError(explain("scheduler", "needs at least one worker in the cluster", "none",
                                      "start workers (dask worker ADDRESS) or wait for them: client.wait_for_workers(1)"))
        threads = {addr: max(1, int(w.get("nthreads", 1))) for addr, w in ws.items()}
        limits = [int(w["memory_limit"]) for w in ws.values() if w.get("memory_limit")]
        # a worker's share of its machine's cores: the machine's cores times its part of the threads
        # of every worker there (tasks still resolve their own share on their worker)
        try:
            machine_cores = client.run(os.cpu_count)
        except Exception:  # a worker that refuses client.run: assume one core per thread
            machine_cores = {}
        per_host: dict[str, int] = {}
        for addr, w in ws.items():
            per_host[str(w.get("host"))] = per_host.get(str(w.get("host")), 0) + threads[addr]
        shares = [max(1, (machine_cores.get(addr) or per_host[str(w.get("host"))]) * threads[addr]
                      // per_host[str(w.get("host"))]) for addr, w in ws.items()]
        def visible_gpus() -> int:  # by value: runs on workers that may lack blocklin or CuPy
            try:
                import cupy

                return int(cupy.cuda.runtime.getDeviceCount())
            except Exception:
                return 0

        try:
            gpus = sum(min(1, n) for n in client.run(visible_gpus).values())  # one device per worker process
        except Exception:
            gpus = 0
        return cls(workers=len(ws), threads=sum(threads.values()), threads_per_worker=max(threads.values()),
                   cores_per_worker=min(shares), memory_limit=min(limits) if limits else None, gpus=gpus)

    def check_budget(self, memory: int) -> None:
        """``memory=`` is per worker process: it must fit the workers' memory limit."""
        if self.memory_limit is not None and memory > self.memory_limit:
            raise BudgetError(explain(
                "memory", "is the budget of each worker process and must fit the workers' memory limit",
                f"{format_size(memory)} with a worker limit of {format_size(self.memory_limit)}",
                f"pass memory='{size_hint(int(self.memory_limit * 0.8))}' (80% of the limit leaves room for "
                "the worker itself) or start workers with a larger --memory-limit"))

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


#: The job whose ``with`` block the caller is in (the innermost): where the products of a stored
#: sparse matrix's operator run (:mod:`blocklin.runtime.sparse_pass`), wrapped however deep.
_running: contextvars.ContextVar[Job | None] = contextvars.ContextVar("blocklin_job", default=None)


def current_job() -> Job | None:
    """The innermost :class:`Job` whose ``with`` block is running in this context, if any."""
    return _running.get()


class Job:
    """See module docstring. Use as a context manager."""

    def __init__(self, operation: str, **settings: Unpack[Settings]) -> None:
        check_settings(settings)
        self.operation = operation
        _memory.tune()  # this process chose blocklin (a worker that only runs its tasks is left alone)
        #: The call's settings as given (``None`` entries keep the configured value); what a nested
        #: object that opens its own jobs (the LinearOperator) passes on.
        self.settings: dict[str, Any] = dict(settings)
        progress = settings.get("progress")
        storage_options = settings.get("storage_options")
        cfg = resolve(**{k: v for k, v in settings.items() if k not in ("progress", "storage_options")})
        if storage_options:  # added to the configured ones, not replacing them
            cfg = cfg.replace(storage_options={**(cfg.storage_options or {}), **storage_options})
        self.cfg: Config = cfg
        self.stack = contextlib.ExitStack()
        self.pools = ProcessPools()  # processes kept between this job's graphs (scheduler "processes")
        self.stack.callback(self.pools.close)
        if settings.get("temp_dir") is not None or storage_options:
            # Scoped, so that nested operations (solve's GEMMs) and the opener see the same storage.
            import blocklin.config as _config

            self.stack.enter_context(_config.set(temp_dir=cfg.temp_dir, storage_options=cfg.storage_options))
        try:
            self.scheduler = resolve_scheduler(self.cfg.scheduler)
            if self.scheduler.kind == "distributed":
                from blocklin.storage.probe import check_workers_reach

                check_workers_reach(self.scheduler.client, temp_root(self.cfg))
            else:  # memory= is this machine's (on a cluster it is per worker, checked against them)
                _memory.check_budget(self.cfg.memory)
            self.device = self._resolve_device()  # on a cluster: also checks memory= against the workers
        except BaseException:
            self.stack.close()  # the scoped settings above end with the failed job
            raise
        self.progress = make_progress(self.cfg.progress if progress is None else progress)
        #: Stored inputs a completed row pass has checked for NaN/Inf (every element read): later
        #: passes over them skip the check (see :func:`blocklin.runtime.passes.run_pass`).
        self.checked_finite: set[str] = set()
        #: Largest magnitude of each input, by path, recorded by the first row pass that read it whole
        #: (what :mod:`blocklin.linalg.blocks.scaling` chooses its power of two from).
        self.amax: dict[str, float] = {}
        #: ... and of each column of the streamed orientation (rows of a source streamed transposed), for
        #: the inputs in ``column_peaks`` (what the SVD's squares need to know: ``scaling.squares_lose_columns``)
        self.peaks: dict[str, Any] = {}
        #: Inputs whose first pass records each column's peak: the others record the largest magnitude
        #: alone, a flat max and min of each piece (a third faster a first pass, measured)
        self.column_peaks: set[str] = set()
        #: Names of the inputs whose writer's recorded peaks stood in for that scan, and of those whose
        #: peaks an earlier job's pass saw (:mod:`blocklin.storage.seen_peaks`)
        #: (:func:`blocklin.runtime.passes.take_recorded_peaks`)
        self.recorded_peaks: list[str] = []
        self.seen_peaks: list[str] = []
        #: The stored shape of each input the caller named (staged copies left out): a first pass over
        #: all of one may keep what it saw (:mod:`blocklin.storage.seen_peaks`)
        self.input_shapes: dict[str, tuple[int, int]] = {}
        #: What first passes saw of such inputs, kept when the job ends (:meth:`keep_seen_peaks`)
        self._seen_pending: list[tuple] = []
        #: Whether each local uncompressed input's later passes map its strips from the page cache
        #: (:func:`blocklin.runtime.passes.mapped_inputs`), probed once per input in the job
        self.mapped_inputs: dict[str, bool] = {}
        self.t0 = time.perf_counter()
        self.stats = {"flops": 0, "bytes_read": 0, "bytes_physical": 0, "bytes_written": 0, "tasks": 0, "skipped": 0,
                      "retried_tasks": 0, "load_seconds": 0.0, "wait_seconds": 0.0, "compute_seconds": 0.0}
        #: The feed's figures (see :meth:`report`): tasks that reported a stream, their waits, the
        #: most tasks one :meth:`run` ran at once, and the device's compute seconds (each task's
        #: divided by the tasks its run ran at once, which share the device).
        self._streams = {"tasks": 0, "wait": 0.0, "concurrent": 0, "device_compute": 0.0}
        # Reads made here rather than in tasks (small factors, in-core problems) count too.
        self.driver_reads = self.stack.enter_context(readstats.tallying())
        #: Bytes of the budget the operation holds in this process outside its passes (an iterative
        #: method's bases and factors); what its sparse products may take is the rest.
        self.client_reserved = 0
        self.outputs: list[AtomicOutput] = []
        #: Where an input's chunking forced extra reads, with the rechunk that avoids them.
        self.read_notes: list[str] = []
        self.pass_counts: dict[str, int] = {}
        self._scratch = 0
        #: ``"tf32"``: the float32 GEMMs of this job's tile tasks use TF32 tensor cores on a GPU
        #: (``precision="tf32"``); block operations take it as their default math mode.
        self.math: str | None = None
        #: dtypes of the operands resolved through :meth:`operand` (see :meth:`_roofline`).
        self.operand_dtypes: set[np.dtype] = set()

    def _resolve_device(self) -> str:
        """``auto``, ``cpu`` or ``gpu`` resolved where the tasks run: this machine, or the workers."""
        cluster = self.cluster()
        if cluster is None:
            kind = resolved_kind(self.cfg.device)
            if kind == "gpu" and not gpu_available():
                from blocklin.device import get_device

                get_device("gpu")  # raises DeviceError with the fix
            return kind
        on_every_worker = cluster.gpus >= cluster.workers
        if self.cfg.device == "auto":
            return "gpu" if on_every_worker else "cpu"
        if self.cfg.device == "gpu" and not on_every_worker:
            raise DeviceError(explain(
                "device", "'gpu' on a cluster needs a GPU on every worker (tasks run on any of them)",
                f"{cluster.gpus} GPU(s) seen by {cluster.workers} worker(s)",
                "run one worker per GPU (dask-cuda's LocalCUDACluster, see docs/gpu.md) or pass device='cpu'"))
        return self.cfg.device

    # -- inputs -------------------------------------------------------------------------------
    def operand(self, x: Any, name: str, ndim: int = 2, *, integers: str = "refuse") -> Operand:
        """``x`` as a stored operand (:func:`blocklin.operands.as_operand`). ``integers="cast"``: integer
        and boolean data become a staged float64 copy, as ``numpy.linalg`` casts them (the report's
        ``read_notes`` say so); ``"refuse"`` leaves them to the operation's dtype check.

        A stored ``x`` is stamped first, before any read (a staged copy's included): the run's value is
        refused if it changes before the run returns or commits (:meth:`stamp_input`)."""
        self.stamp_input(stored_location(x, self.cfg))
        op = as_operand(x, name, self.cfg, self.stack, ndim=ndim,
                        client=self.scheduler.client if self.scheduler.kind == "distributed" else None)
        if integers == "cast" and np.dtype(op.dtype).kind in "biu":
            was = np.dtype(op.dtype).name
            op = cast_integers(op, self.cfg, self.stack)
            self.read_notes.append(f"{name}: {was} data cast to float64 (a staged copy), as numpy.linalg casts it")
        # a staged copy of in-memory data has a new path each run, so no token of this job names it twice:
        # nothing to resume (a copy of a stored array is named by that array, :func:`stored_input`)
        self.staged_inputs = getattr(self, "staged_inputs", False) or stored_input(op) is None
        if not op.staged and len(op.shape) == 2:
            self.input_shapes[str(op.path)] = tuple(int(d) for d in op.shape)
        self.operand_dtypes.add(np.dtype(op.dtype))  # the roofline's arithmetic where no report names it
        return op

    def stamp_input(self, loc: Location | None, taken: dict | None = None, *, own_open: bool = False) -> None:
        """Stamp the stored input ``loc`` before the run first reads it (:class:`~blocklin.storage.input_guard.RunInputs`:
        one listing per input per run; ``taken``: the stamp its handle took when it opened it, before
        the handle's first read, :func:`~blocklin.storage.input_guard.opened`; ``own_open``: this
        operation opened that handle itself, :meth:`~blocklin.storage.input_guard.RunInputs.stamp`): checked before the run's
        value is returned, or at its outputs' commits. Not this run's own work (the temp dir's
        ``blocklin-*`` folders: staged copies, intermediates, temporary results) nor its outputs."""
        if loc is None:
            return
        root = temp_root(self.cfg)
        if loc.url.startswith(root.url.rstrip("/") + "/blocklin-"):
            return
        try:
            self.inputs.stamp(loc, taken, own_open=own_open)
        except OSError:  # unreadable: opening it says why
            pass

    @property
    def check_finite(self) -> bool:
        return self.cfg.check_finite

    def device_memory(self) -> int | None:
        """Device budget: configured, else 80% of what this process may use on the GPU (GPU only).

        That is total memory minus what other processes hold (CuPy's pool, cached or live, is ours).
        """
        if self.device != "gpu":
            return None
        if self.cfg.device_memory:
            return self.cfg.device_memory
        from blocklin.device import get_device

        return int(0.8 * get_device("gpu").usable_memory())

    # -- workers and threads --------------------------------------------------------------------
    def cores(self) -> int:
        """Cores of one machine that runs tasks (a cluster's smallest worker machine's share)."""
        cluster = self.cluster()
        return cluster.cores_per_worker if cluster else os.cpu_count() or 1

    def workers(self, default: int = 1) -> int:
        """Tasks that share one process's ``memory`` budget at once.

        Local schedulers: the ``workers`` setting, else ``default``. A ``distributed`` cluster: the
        threads of its busiest worker process, since ``memory=`` is per worker process there.
        """
        cluster = self.cluster()
        return cluster.threads_per_worker if cluster else self.cfg.workers or default

    def parallelism(self) -> int:
        """Tasks that run at once across the scheduler (row passes split into at least this many)."""
        cluster = self.cluster()
        return cluster.threads if cluster else self.workers(1)

    def cluster(self) -> ClusterInfo | None:
        """The workers of a ``distributed`` scheduler (read once per job), else None."""
        if self.scheduler.kind != "distributed":
            return None
        if not hasattr(self, "_cluster"):
            self._cluster = ClusterInfo.read(self.scheduler.client)
            self._cluster.check_budget(self.cfg.memory)
        return self._cluster

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
            root = temp_root(self.cfg)
            if root.is_local:  # what killed runs left here goes first (their owners are gone)
                sweep_stale(root)
            tmp = root / f"blocklin-{self.operation}-{uuid.uuid4().hex[:12]}"
            self.stack.callback(end_work_folder, tmp)  # registered first: an interrupt cannot slip between
            self.stack.callback(wait_for_pending_io)  # runs first: no write lands after the removal
            start_work_folder(tmp, operation=self.operation)
            self._tmp = tmp
        return self._tmp

    def work_dir(self, name: str, token: str, *, output: AtomicOutput, resume: bool = False) -> Location:
        """A deterministic folder for intermediates that a rerun may continue, tied to ``output``:
        ``blocklin-NAME-ID`` under the temp dir, ``ID`` a digest of ``token`` (the operation's
        parameters and plan), the output's path (two runs without ``out=`` never share one) and its
        inputs' content stamps (``output.input_digest``), so a changed input names a new folder.

        Without ``resume`` whatever an earlier run left there is removed first; so are the folders
        that gone runs of the same operation and output left under another identity (no rerun can
        continue them: their partial output is gone or started over). The folder is removed when
        the job ends, except after an interrupt (Ctrl-C, SIGTERM) of a resumable output, or an error
        with ``resume``: then a rerun with ``resume`` continues it.
        """
        from dask.base import tokenize

        root = temp_root(self.cfg)
        loc = root / f"blocklin-{name}-{tokenize(token, output.path.url, output.input_digest)[:16]}"
        if not resume:
            remove(loc)
        # registered first: an interrupt cannot slip between
        self.stack.callback(self._end_work_dir, loc, resume, output.resumable)
        self.stack.callback(wait_for_pending_io)  # runs first: no write lands after the removal (as in temp_dir)
        claim_work_folder(loc, operation=name, for_output=output.path.url)
        remove_stale_work(root, loc, operation=name, output=output.path.url)
        return loc

    def _end_work_dir(self, loc: Location, keep_after_error: bool, resumable: bool) -> None:
        interrupted = resumable and getattr(self, "_interrupted", False)
        if interrupted or (keep_after_error and getattr(self, "_failed", False)):
            # kept, its record marked released, for the rerun (or `blocklin clean`)
            rec = read_record(loc)
            mark_released(loc, rec) if rec else Heartbeat.release(loc)
            if interrupted:
                keep_for_resume(loc, "work folder")
        else:
            end_work_folder(loc)

    def scratch(self, name: str, shape: tuple[int, int], dtype: Any, chunks: tuple[int, int]) -> Location:
        """A new intermediate zarr array under :meth:`temp_dir`, removed with the job.

        Named ``NAME-N.zarr`` with ``N`` counting the job's scratch stores in creation order, so
        the same operation with the same inputs names them the same way.
        """
        self._scratch += 1
        path = self.temp_dir() / f"{name}-{self._scratch}.zarr"
        create_array(path, shape=shape, dtype=dtype, chunks=chunks, codec=self.cfg.codec)
        return path

    def output(self, out: Any, *, inputs: list[Any], overwrite: bool = False, resume: bool = False,
               token: str | None = None, suffix: str = ".zarr", size: tuple | None = None,
               temp_size: tuple | None = None, covered: list[Any] | None = None,
               reads_output: bool = False) -> AtomicOutput:
        """An atomic output at ``out`` (path, URL, Location or zarr store), or a new store under the
        temp dir when ``out`` is None (the caller owns it).

        ``inputs``: the stored arrays the operands read (:func:`~blocklin.operands.stored_input`); with a
        ``token`` the output is resumable and records their content stamps, against which a resumed
        run is checked (:mod:`blocklin.storage.atomic`). Without ``out``, or with a staged copy of
        in-memory data, the output is not resumable (no rerun names it again). ``covered``: the inputs
        whose version the provenance records for :func:`blocklin.update` (default: all). ``reads_output``:
        the run reads the stored result it replaces (an update), whose content a resume checks too.

        ``size`` (shape, dtype) of the output and ``temp_size`` (shape, dtype) of the intermediates the
        operation will keep under the temp dir are checked against the free space of their
        destinations before anything is claimed or written (:func:`~blocklin.storage.space.check_space`).
        """
        if out is None:  # a new name each run: nothing to resume, nothing kept after an interrupt
            out = temp_root(self.cfg) / f"blocklin-{self.operation}-{uuid.uuid4().hex[:12]}{suffix}"
            resume, token = False, None
        if getattr(self, "staged_inputs", False):  # in-memory inputs: no rerun can continue it (see operand)
            token = None
        check_zarr_output(out)
        check_not_output(out, [o.path for o in self.outputs])  # one commit would replace the other
        check_writable(getattr(out, "url", out) if isinstance(out, (str, os.PathLike, Location)) else None)
        self.check_space(out, size=size, temp_size=temp_size)
        # known to the job from its claim on, so an interrupt at any point still aborts it
        return AtomicOutput(out, inputs=inputs, overwrite=overwrite, resume=resume, token=token, covered=covered,
                            storage_options=self.cfg.storage_options, on_claim=self.outputs.append,
                            temp_dir=temp_root(self.cfg), reads_output=reads_output)

    def claim(self, out: Any, operands: list[Operand], *, token: str | None = None, overwrite: bool = False,
              resume: bool = False, size: tuple | None = None, temp_size: tuple | None = None,
              reads_output: bool = False) -> AtomicOutput:
        """The output of this job's operation on ``operands``: :meth:`output` with the stored arrays they
        read as the inputs (:func:`~blocklin.operands.stored_input`: a staged copy's source, none for
        in-memory data), which the output may not replace and whose content a resume checks.
        ``token``: :func:`~blocklin.storage.identity.resume_token`; with it the output is resumable.
        ``reads_output``: the run reads the stored result it replaces (:meth:`output`)."""
        # a staged copy's source is read as cast: no update reads its appended rows as the result's input;
        # each with the rows it reads (an append may commit between its opening and this claim)
        return self.output(out, inputs=[p for p in map(stored_input, operands) if p is not None],
                           covered=[(o.path, o.first_row + int(o.shape[0])) for o in operands if not o.staged],
                           overwrite=overwrite, resume=resume, token=token, size=size, temp_size=temp_size,
                           reads_output=reads_output)

    def finish(self, ao: AtomicOutput, out: Any, report: dict, *, operation: str, plan: dict | None = None,
               params: dict | None = None, keys: tuple[str, ...] | None = None, recorded: dict | None = None,
               extra: dict | None = None) -> Matrix:
        """Commit ``ao`` with its provenance (``plan``, ``params``, the report's ``keys`` or the
        ``recorded`` entries) and return the result as a :class:`~blocklin.matrix.Matrix` with its
        report; without ``out`` the result is a temporary store the caller owns."""
        path = ao.commit(operation, plan=plan, params=params,
                         report=recorded if recorded is not None else self.brief(report, keys or ()), extra=extra)
        return Matrix(path, report=report, temporary=out is None)

    def check_space(self, out: Any, *, size: tuple | None = None, temp_size: tuple | None = None) -> None:
        """Refuse up front an output of ``size`` (shape, dtype) at ``out`` (None: under the temp dir) or
        intermediates of ``temp_size`` under the temp dir that do not fit the free space there."""
        local = getattr(out, "url", out) if isinstance(out, (str, os.PathLike, Location)) else None
        if out is None:
            local = temp_root(self.cfg) / f"blocklin-{self.operation}.zarr"
        for where, what, shape_dtype in ((local, "out", size), (temp_root(self.cfg) / "blocklin-work", "temp data",
                                                                 temp_size)):
            if shape_dtype is not None and where is not None:
                shape, dtype = shape_dtype
                nbytes = int(np.prod([int(d) for d in shape], dtype=object)) * np.dtype(dtype).itemsize
                check_space(where, nbytes, what, f"{' x '.join(map(str, shape))} {np.dtype(dtype).name}")

    # -- execution -----------------------------------------------------------------------------------
    def run(self, graph: TileGraph, *, workers: int = 1, blas_threads: int | None = None,
            description: str | None = None, count_pass: str | None = None, in_caller: bool = False) -> list:
        """Execute ``graph`` and add the tasks' statistics to the job's.

        ``count_pass`` names what the graph reads once through when it is a pass (``"a"``: the
        operation's input, ``"intermediate"``: a store the operation wrote); see :meth:`passes`.
        ``in_caller``: on the local threaded scheduler, run the tasks one after another in the
        calling thread, as ``"sync"`` does (for graphs that run one task at a time anyway: a pool
        thread only adds cost, up to 3x for the LU panels, whose large temporaries glibc serves from
        a per-thread arena there; measured with ``MALLOC_ARENA_MAX=1`` giving most of it back).
        """
        ctx = contextlib.nullcontext()
        if blas_threads and self.scheduler.kind in ("threads", "sync"):
            from blocklin._blas import blas_threads as limit_blas

            ctx = limit_blas(blas_threads)
        events: dict = {}
        with ctx:
            sched = self.scheduler
            if in_caller and sched.kind == "threads":
                sched = dataclasses.replace(sched, kind="sync")
            slots = self._slots(sched.kind, workers, len(graph.tasks))
            self._streams["concurrent"] = max(self._streams["concurrent"], slots)
            results = execute(graph, scheduler=sched, workers=workers, progress=self.progress, pools=self.pools,
                              description=description or f"{self.operation}", events=events)
        # A graph's arguments and results must not outlive it in a reference cycle: an iterative
        # method's hundreds of small graphs (a sparse product per step) would each leave its X and
        # result behind. The local executors make none (graph._Progress is one module-level class);
        # what the schedulers' own frames and closures leave is young: collecting it costs about half
        # a millisecond.
        gc.collect(1)
        if events["retried_tasks"] is None or self.stats["retried_tasks"] is None:
            self.stats["retried_tasks"] = None  # unknown on this scheduler
        else:
            self.stats["retried_tasks"] += events["retried_tasks"]
        # a task that ran several units (a run of GEMM tiles) returns a list: one result per unit
        results = [u for r in results for u in (r if isinstance(r, list) else [r])]
        for r in results:
            if isinstance(r, dict):
                self.add_stats(r, share=slots)
        self.inputs.reading()  # read after a commit's check: checked again at the end
        if count_pass is not None:
            self.stats["passes"] = self.stats.get("passes", 0) + 1
            self.pass_counts[count_pass] = self.pass_counts.get(count_pass, 0) + 1
        return results

    def _slots(self, kind: str, workers: int, tasks: int) -> int:
        """Tasks a run of ``tasks`` tasks runs at once: one on ``sync`` (and in the caller), else its
        ``workers`` (a cluster: all its threads), never more than its tasks."""
        if kind == "sync" or tasks <= 1:
            return 1
        cluster = self.cluster()
        return max(1, min(cluster.threads if cluster else int(workers or 1), tasks))

    def passes(self, over: str | None = None) -> int:
        """Passes run so far: all of them, or those over one kind of data (``"a"``, ``"intermediate"``)."""
        return self.stats.get("passes", 0) if over is None else self.pass_counts.get(over, 0)

    def add_stats(self, r: dict, *, share: int = 1) -> None:
        """Add one task's statistics; ``share``: the tasks that ran beside it at once (itself
        included), which shared the device with it."""
        self.stats["tasks"] += 1
        for key in ("flops", "bytes_read", "bytes_written", "skipped", "load_seconds", "wait_seconds",
                    "compute_seconds"):
            if key in r:
                self.stats[key] += r[key]
        if "compute_seconds" in r:  # a task that streamed its data (TileStream): its waits judge the feed
            self._streams["tasks"] += 1
            self._streams["wait"] += r.get("wait_seconds", 0.0)
            self._streams["device_compute"] += r["compute_seconds"] / max(1, share)
        # a task that does not count its reads (none of blocklin's) is taken at its logical bytes
        self.stats["bytes_physical"] += r.get("bytes_physical", r.get("bytes_read", 0))
        if r.get("bytes_mapped"):  # CPU row passes: strips mapped from the page cache, not copied
            self.stats["bytes_mapped"] = self.stats.get("bytes_mapped", 0) + r["bytes_mapped"]
        if "bytes_device_cache" in r:  # GPU tasks: blocks served from the device cache, and what it kept
            self.stats["bytes_device_cache"] = self.stats.get("bytes_device_cache", 0) + r["bytes_device_cache"]
            self.stats["device_resident"] = max(self.stats.get("device_resident", 0), r.get("device_resident", 0))
        if "process_peak" in r:
            where, peak = r["process_peak"]
            peaks = self.stats.setdefault("worker_peaks", {})
            peaks[where] = max(peaks.get(where, 0), peak)

    def note_reads(self, note: str) -> None:
        """Record advice about forced extra reads (``read_notes`` in the report), once each."""
        if note not in self.read_notes:
            self.read_notes.append(note)

    def seconds(self) -> float:
        return time.perf_counter() - self.t0

    def report(self, *, flops: float | None = None, **extra: Any) -> dict:
        """The operation's report: statistics, time, peak memory, device, scheduler, and what bounded it.

        ``bytes_read`` is what the reads fetched from storage (chunk bytes, counted where they are
        read) and ``bytes_logical`` the bytes of the blocks the operation used; more read than used
        means chunks re-read or read in part of their width. ``peak_memory`` is this process's; where tasks ran in other processes (``processes``, a
        cluster), ``worker_peak_memory`` maps each of them (worker address or pid) to its peak,
        and ``cluster`` describes the workers the plans were made for. ``flops``: the operation's
        count (a plan's), replacing the tasks' sum; ``gflops`` is the rate of whichever is reported.
        GPU jobs whose tasks streamed blocks also report ``bytes_device_cache``, the bytes of stored
        blocks served from the device operand cache instead of storage (:mod:`blocklin.device.resident`),
        and ``device_resident``, the most bytes of blocks the device cache held while the job kept some.
        CPU jobs whose row passes mapped strips from the page cache instead of copying them
        (:func:`blocklin.runtime.passes.mapped_inputs`) report ``bytes_mapped``, those strips' bytes
        (part of ``bytes_read``). ``peaks_recorded`` names the inputs whose first pass took the peaks
        their writer recorded instead of scanning them (:mod:`blocklin.storage.recorded_peaks`).

        What bounded the run, from the tasks that streamed their data through a
        :class:`~blocklin.device.stream.TileStream` (GEMM tiles, row passes; other tasks report no
        stream and count as not computing):

        ``load_seconds``, ``wait_seconds``, ``compute_seconds``
            Summed over the tasks: time their loader threads spent reading, time their consumer
            waited for an item, and time it held items (its compute and writes).
        ``concurrent_tasks``
            The most tasks one graph of the run ran at once: 1 on ``sync`` (and in the caller),
            else the run's ``workers`` (a cluster: its threads), at most the graph's tasks.
        ``device_compute_seconds``
            The device's compute time: each task's ``compute_seconds`` divided by the
            ``concurrent_tasks`` of its own graph, since the tasks that run at once share the device
            (on a CPU each gets ``cores // workers`` BLAS threads). With one graph run it is
            ``compute_seconds / concurrent_tasks``.
        ``compute_fraction``
            ``device_compute_seconds / seconds``, clamped to [0, 1]: the fraction of the run during
            which the device computed (planning, in-core steps and commits count as not computing).
            None when no task reported a stream.
        ``feed_gbps``
            ``bytes_read / seconds / 1e9``: what the operation's reads delivered over the whole run.
        ``wait_fraction``
            ``wait / (wait + compute_seconds)`` over the streaming tasks: the part of their consumers'
            time spent waiting for data. None when no task reported a stream.
        ``bound``
            ``"feed"`` when ``wait_fraction`` exceeds :data:`FEED_BOUND_WAIT`, else ``"compute"``;
            ``"unknown"`` when no task reported a stream (or the streams took no time).

        How close a GPU run came to what its device and storage allow (GPU jobs only: a CPU's
        default rates are planning estimates, not limits, so an efficiency from them would mean
        nothing; see :meth:`_roofline`):

        ``roofline_seconds``
            ``max(flops / in-core GEMM rate, (bytes_read + bytes_written) / raw feed limit)``
            (:func:`blocklin.plan.rates.roofline`): the least time the run could take.
        ``roofline_efficiency``
            ``roofline_seconds / seconds`` (1 at the roofline).
        ``roofline``
            The rates it used and where they came from: ``gflops`` and ``gflops_source``, ``feed_gbps``
            and ``feed_source`` (``"measured YYYY-MM-DD"``, from ``blocklin calibrate`` or
            ``benchmarks/gpu_check.py``, else ``"default (...)"``: the GPU's peak and host link from
            :data:`blocklin.plan.gpu.GPUS`), ``rate`` (``float64``, ``float32`` or ``tf32``), the two
            times and which one bounds (``bound``).
        """
        secs = self.seconds()
        rep = dict(self.stats)
        rep.pop("worker_peaks", None)
        # bytes_read: what was fetched from storage; bytes_logical: the bytes of the blocks used
        rep["bytes_logical"] = rep["bytes_read"]
        rep["bytes_read"] = rep.pop("bytes_physical") + self.driver_reads.bytes
        if self.read_notes:
            rep["read_notes"] = list(self.read_notes)
        if self.recorded_peaks:
            rep["peaks_recorded"] = list(self.recorded_peaks)
        if self.seen_peaks:
            rep["peaks_seen"] = list(self.seen_peaks)
        if flops is not None:
            rep["flops"] = flops
        rep.update(seconds=secs, peak_memory=peak_rss(), memory_budget=self.cfg.memory, device=self.device,
                   scheduler=self.scheduler.kind, gflops=rep["flops"] / secs / 1e9 if secs > 0 else 0.0)
        rep.update(self._feed(rep["bytes_read"], rep["compute_seconds"], secs))
        rep.update(self._roofline(rep, extra))
        if self.scheduler.kind in ("processes", "distributed"):
            rep["worker_peak_memory"] = dict(self.stats.get("worker_peaks", {}))
        if self.cluster() is not None:
            rep["cluster"] = self.cluster().to_dict()
        rep.update(extra)
        return rep

    def _feed(self, bytes_read: int, compute: float, secs: float) -> dict:
        """The report's feed entries (defined in :meth:`report`)."""
        st = self._streams
        streamed = st["tasks"] > 0
        held = st["wait"] + compute
        wait_fraction = st["wait"] / held if streamed and held > 0 else None
        return {"feed_gbps": bytes_read / secs / 1e9 if secs > 0 else 0.0,
                "concurrent_tasks": st["concurrent"], "device_compute_seconds": st["device_compute"],
                "compute_fraction": min(1.0, max(0.0, st["device_compute"] / secs)) if streamed and secs > 0 else None,
                "wait_fraction": wait_fraction,
                "bound": "unknown" if wait_fraction is None else "feed" if wait_fraction > FEED_BOUND_WAIT else "compute"}

    def _roofline(self, rep: dict, extra: dict) -> dict:
        """The report's roofline entries (defined in :meth:`report`): GPU jobs run by a local scheduler.

        The arithmetic is the lowest precision the job computed in (its report's ``compute_dtype``,
        ``factor_dtype`` or ``work_dtype``, else its operands' narrowest dtype; TF32 where its GEMMs
        used it), so that the roofline time is a lower bound. On a cluster none is reported: the
        rates are one machine's, and the workers' GPUs and storage add up to limits not measured.
        """
        if self.device != "gpu":
            return {}
        if self.scheduler.kind == "distributed":
            return {"roofline_seconds": None, "roofline_efficiency": None,
                    "roofline": {"reason": "a cluster's aggregate GPU and feed rates are not measured"}}
        from blocklin.device.calibrate import gpu_name
        from blocklin.plan.rates import load_rates, roofline

        dtype = next((extra[k] for k in ("compute_dtype", "factor_dtype", "work_dtype") if extra.get(k)), None)
        if dtype is None:
            floats = [d for d in self.operand_dtypes if d.kind in "fc"]
            dtype = min(floats, key=lambda d: (d.itemsize // (2 if d.kind == "c" else 1), d.kind == "c")) if floats \
                else np.float64
        name = gpu_name()
        rl = roofline(rep["flops"], rep["bytes_read"] + rep["bytes_written"], dtype=dtype,
                      tf32=self.math == "tf32" or extra.get("precision") == "tf32",
                      rates=load_rates(f"gpu {name}"), gpu=name)
        return {"roofline_seconds": rl.seconds, "roofline_efficiency": rl.efficiency(rep["seconds"]),
                "roofline": rl.to_dict()}

    @staticmethod
    def brief(report: dict, keys: tuple[str, ...]) -> dict:
        """The entries of ``report`` named in ``keys`` (what an output's attributes record)."""
        return {k: report[k] for k in keys if k in report}

    # -- lifecycle ------------------------------------------------------------------------------------
    def __enter__(self) -> Job:
        #: The stored inputs of the run (:class:`~blocklin.storage.input_guard.RunInputs`): this job's,
        #: or the outermost running job's when it runs inside one (each input stamped once per run)
        self.inputs, self._outermost = self.stack.enter_context(input_guard.run_inputs())
        self._running_token = _running.set(self)
        return self

    def input_stamp(self, path: Any) -> str | None:
        """The content stamp the run took of the stored input at ``path`` when it first opened it, before
        any read (:meth:`~blocklin.storage.input_guard.RunInputs.digest`); None where it took none."""
        inputs = getattr(self, "inputs", None)
        return inputs.digest(input_location(path).url) if inputs is not None else None

    def keep_seen_peaks(self, path: Any, before: str, amax: float, peaks: Any = None, *,
                        transposed: bool = False) -> None:
        """Keep what a first pass saw of the whole input at ``path`` for a later job
        (:func:`blocklin.storage.seen_peaks.remember`) when this job ends without an error: where the run's check before
        it returns lists the input (:meth:`~blocklin.storage.input_guard.RunInputs.check`), that
        listing is the stamp after the pass, else one is taken then. ``before``: its stamp before the
        pass."""
        self._seen_pending.append((path, before, amax, self.input_shapes[str(path)], peaks, transposed))

    def _remember_seen_peaks(self, listed: dict[str, str]) -> None:
        for path, before, amax, shape, peaks, transposed in self._seen_pending:
            seen_peaks.remember(path, before, amax, shape, peaks, transposed=transposed,
                                after=listed.get(input_location(path).url))
        self._seen_pending.clear()

    def __exit__(self, exc_type, exc, tb) -> None:
        changed = None
        listed: dict[str, str] = {}  # the inputs' stamps after the run's last read, by URL
        if exc_type is None and self._outermost:  # before the value is returned (outputs: at their commit)
            try:
                listed = self.inputs.check(f"the {self.operation} result")
            except InputChangedError as err:
                changed, exc_type = err, InputChangedError
        self._failed = exc_type is not None  # work folders kept for resume (work_dir)
        self._interrupted = exc_type is not None and issubclass(exc_type, KeyboardInterrupt)
        try:
            # after lost worker processes the finished tiles stay for resume=True (the error says so)
            keep = exc_type is None or issubclass(exc_type, WorkerLostError)
            for ao in self.outputs:
                ao.release() if keep else ao.abort(interrupted=self._interrupted, report=False)
            # a failed run keeps nothing for later jobs (a listing more on a path already failing), and a cache
            # that cannot be written costs a later job its scan, never this run's cleanup
            if exc_type is None:
                with contextlib.suppress(Exception):
                    self._remember_seen_peaks(listed)
        finally:
            with contextlib.suppress(ValueError):  # exited in another context than it was entered
                _running.reset(self._running_token)
            self.progress.close()
            self.stack.close()
            if self._interrupted:
                report_kept()  # what the interrupted run kept for a rerun with resume, said once
            if self.device == "gpu":
                release_device_caches()
                if self.scheduler.kind == "distributed":  # the workers' pinned buffers too
                    with contextlib.suppress(Exception):  # a lost worker keeps nothing pinned
                        self.scheduler.client.run(release_device_caches)
        if isinstance(exc, Exception):  # an unreachable endpoint or a missing bucket, said as such (reads and writes)
            from blocklin.storage.readerrors import storage_error

            mapped = storage_error(exc, tuple(str(ao.path) for ao in self.outputs))
            if mapped is not None:
                raise mapped from exc
        if changed is not None:
            raise changed
