"""Tile tasks: read operand tiles from storage, compute on the device, write whole output chunks.

These are the functions a :class:`~blocklin.runtime.graph.TileGraph` schedules. They receive
small frozen specs (paths, plan, flags) and tile indices, open the stores themselves (cached per
process), and return small statistics dicts. The arithmetic itself is the device's.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import os
import queue
import sys
import threading
import time
from typing import Any

import numpy as np

import blocklin._memory as _memory
from blocklin.device import TileStream, get_device, pool
from blocklin.device.stream import start_lane
from blocklin.errors import InternalError, NonFiniteError, explain
from blocklin.plan.chunks import split
from blocklin.plan.gemm import GemmPlan
import blocklin._readstats as readstats
from blocklin.progress import report_units
from blocklin.peaks import block_peaks
from blocklin.storage.atomic import is_done, mark_done
from blocklin.storage.backend import backend
from blocklin.storage.zarr_store import open_cached, read_block, write_block


def open_array(path: Any, mode: str = "r") -> Any:
    """Open a zarr array (path, URL or Location), cached per process (keyed by its metadata's version)."""
    return open_cached(path, mode)


_blas_lock = threading.Lock()
_blas_users = 0
_blas_limiter: Any = None

#: ``blas_threads`` value of a task spec meaning "as many as this worker process's share of its
#: machine's cores" (a ``distributed`` worker with ``nthreads`` threads gets ``cores // nthreads``).
FROM_WORKER = 0


def _current_worker() -> Any:
    """The ``distributed`` worker running this task, else None (without importing distributed)."""
    if "distributed" not in sys.modules:
        return None
    from distributed import get_worker

    try:
        return get_worker()
    except ValueError:
        return None


def _worker_share() -> int | None:
    worker = _current_worker()
    if worker is None:
        return None
    nthreads = getattr(getattr(worker, "state", worker), "nthreads", None) or 1
    return max(1, (os.cpu_count() or 1) // nthreads)


def with_task_settings(task: Any) -> Any:
    """Run ``task(spec, ...)`` with the process settings it needs, then restore the process's own.

    BLAS is limited to ``spec.blas_threads`` threads (``None`` leaves BLAS alone: the job limited it
    around the whole run; :data:`FROM_WORKER` takes the share of the worker the task runs on). In a
    ``distributed`` worker, which blocklin does not tune on import, zarr's chunk I/O concurrency is
    capped as the planners assume (``blocklin._memory.IO_CONCURRENCY``). Both are process-wide, so
    concurrent tasks of one process share them: the first task to start sets them and the last to
    finish restores what the process had, so a worker's other workloads see their own settings.
    The task's statistics gain ``process_peak`` (where it ran, that process's peak memory) and
    ``bytes_physical`` (the bytes its reads fetched from storage, next to the logical ``bytes_read``).
    """

    @functools.wraps(task)
    def run(spec: Any, *args: Any, **kwargs: Any) -> Any:
        global _blas_users, _blas_limiter
        n = spec.blas_threads
        if n == FROM_WORKER:
            n = _worker_share()
        scoped_io = _memory.in_dask_worker_process() and "ZARR_ASYNC__CONCURRENCY" not in os.environ
        if n is None and not scoped_io:
            return _with_peak(_counted(task, spec, *args, **kwargs))
        with _blas_lock:
            if _blas_users == 0:
                _blas_limiter = _Scoped(n, scoped_io)
            _blas_users += 1
        try:
            return _with_peak(_counted(task, spec, *args, **kwargs))
        finally:
            with _blas_lock:
                _blas_users -= 1
                if _blas_users == 0:
                    _blas_limiter.restore()
                    _blas_limiter = None

    return run


def _counted(task: Any, *args: Any, **kwargs: Any) -> Any:
    """Run the task, adding ``bytes_physical``: what its reads fetched from storage (readstats)."""
    with readstats.tallying() as tally:
        result = task(*args, **kwargs)
    if isinstance(result, dict):
        result["bytes_physical"] = result.get("bytes_physical", 0) + tally.bytes
    return result


def _with_peak(result: Any) -> Any:
    """Add ``process_peak``: (this worker's address, else this process's id; its peak RSS)."""
    if isinstance(result, dict):
        worker = _current_worker()
        where = worker.address if worker is not None else f"pid {os.getpid()}"
        result["process_peak"] = (where, _memory.peak_rss())
    return result


class _Scoped:
    """The settings of :func:`with_task_settings` and what they replaced."""

    def __init__(self, blas_threads: int | None, io: bool) -> None:
        self.blas = None
        if blas_threads is not None:
            from blocklin._blas import blas_threads as limit_blas

            self.blas = limit_blas(blas_threads)
        self.io = None
        if io:
            import zarr

            self.io = zarr.config.get("async.concurrency")
            zarr.config.set({"async.concurrency": _memory.IO_CONCURRENCY})

    def restore(self) -> None:
        if self.blas is not None:
            self.blas.restore_original_limits()
        if self.io is not None:
            import zarr

            zarr.config.set({"async.concurrency": self.io})


def region(buf: np.ndarray, shape: tuple[int, int]) -> np.ndarray:
    """A C-contiguous ``shape`` view at the start of ``buf`` (edge tiles are smaller)."""
    return buf.reshape(-1)[: shape[0] * shape[1]].reshape(shape)


def check_finite(block: np.ndarray, name: str, rows: slice, cols: slice) -> None:
    """Raise :class:`NonFiniteError` naming where NaN/Inf sits in ``block``."""
    # A sum is a cheap single pass; an overflowing sum falls back to the exact check.
    with np.errstate(over="ignore", invalid="ignore"):
        if np.isfinite(np.add.reduce(block, axis=None)):
            return
    bad = ~np.isfinite(block)
    if not bad.any():
        return
    r, c = np.argwhere(bad)[0]
    value = block[r, c]
    raise NonFiniteError(explain(
        name, "must be finite (check_finite is on)",
        f"{value} at [{rows.start + r}, {cols.start + c}] ({int(bad.sum())} non-finite values in "
        f"rows {rows.start}:{rows.stop}, cols {cols.start}:{cols.stop})",
        "clean the input (for example numpy.nan_to_num), or pass check_finite=False to skip the check"))


class StripWriter:
    """Writes row strips of an output tile on a background thread (a kept one: :func:`start_lane`).

    Strips cover whole chunk rows of the output, so concurrent writes never touch one chunk. Queued
    strips are views of the accumulator (host) or rotating download buffers (GPU, bounded by their
    count), so the queue itself holds no memory and compute never waits on it. Errors are
    re-raised by :meth:`submit` or :meth:`close`.
    """

    def __init__(self, arr: Any, rows: slice, cols: slice) -> None:
        self.arr, self.rows, self.cols = arr, rows, cols
        self.queue: queue.Queue = queue.Queue()
        self.error: BaseException | None = None
        self.thread = start_lane(self._run, "blocklin-writer")  # a kept thread: no thread start per tile

    def _run(self) -> None:
        while True:
            item = self.queue.get()
            if item is None:
                return
            r0, r1, block, done = item
            try:
                if self.error is None:
                    write_block(self.arr, slice(self.rows.start + r0, self.rows.start + r1), self.cols, block)
            except BaseException as exc:  # re-raised in close()
                self.error = exc
            finally:
                if done is not None:
                    done()

    def submit(self, r0: int, r1: int, block: np.ndarray, done: Any = None) -> None:
        if self.error is not None:
            raise self.error
        self.queue.put((r0, r1, block, done))

    def close(self) -> None:
        from blocklin.interrupt import wait_through

        self.queue.put(None)
        wait_through(self.thread.join)  # even when Ctrl-C lands here: no strip may land after the cleanup
        if self.error is not None:
            raise self.error


@dataclasses.dataclass(frozen=True)
class GemmSpec:
    """Everything one GEMM tile task needs (small and picklable)."""

    a: str
    b: str
    c: str | None
    out: str
    trans_a: bool
    trans_b: bool
    alpha: float
    beta: float
    dtype: str
    plan: GemmPlan
    device: str
    device_memory: int | None
    check_finite: bool
    done_dir: Any  # Location of the output's resume markers, or None
    blas_threads: int | None = None
    names: tuple[str, str, str] = ("a", "b", "c")
    # Regions: offsets of op(A), op(B), C and the output inside their stores (multiples of the
    # output chunks, so tiles still own whole chunks). C may be the output itself at the same offset:
    # each strip is read before it is written.
    a_off: tuple[int, int] = (0, 0)
    b_off: tuple[int, int] = (0, 0)
    c_off: tuple[int, int] = (0, 0)
    out_off: tuple[int, int] = (0, 0)
    #: Caller-supplied work on each finished strip before it is written (see :class:`Epilogue`).
    epilogue: Epilogue | None = None
    #: ``"tf32"``: float32 GEMMs on a GPU use TF32 tensor cores (``Device.math``).
    precision: str | None = None
    #: Output dtype when it differs from the compute dtype ``dtype`` (``matmul(precision=...)``):
    #: ``alpha`` and ``beta * C`` are then applied on the host in the output dtype.
    out_dtype: str | None = None
    #: The peaks each tile returns of the strips it wrote (``peaks`` in its result): each column's
    #: (False), each row's (True, a wide output), none (None). See :func:`tile_peaks`.
    peaks: bool | None = None
    #: Path of a stored ``1 x K`` row ``s`` (``K`` the inner dimension) that both operands' panels are
    #: shifted by as they are read, in the compute dtype: ``op(A) - 1 s^T`` and ``op(B) - s 1^T`` except
    #: op(B)'s first column, read as stored. The wide solve's intercept: with ``s = a_1`` (row 0 of ``A``)
    #: ``A A^T`` becomes ``A_s A_s^T`` (``A_s = A - 1 a_1^T``, rounded relative to the spread of the columns,
    #: not their means) with ``A_s a_1`` in its first column (where ``A_s A_s^T`` has zeros).
    shift: str | None = None


class Epilogue:
    """Work an algorithm adds to the GEMM tile task on each finished output strip.

    The tile task calls :meth:`begin` once per tile with the tile's rows and columns (relative to
    the output region) and the region's offset in the output store, :meth:`strip` on each finished
    host strip (``block`` is rows ``r0:r1`` of the tile, scaled and with ``beta * C`` added; it
    may be changed in place before it is written), and merges the dict :meth:`end` returns into the
    tile's result. Subclasses are small picklable objects defined by the algorithm.

    An epilogue with ``on_device = True`` does its work where the accumulator lives instead: on a GPU
    :meth:`device_strip` gets the strip on the device (queued on its compute stream before the
    download, so the host never waits for it) and :meth:`strip` is not called; on the CPU
    :meth:`strip` runs as usual.
    """

    on_device = False

    def device_strip(self, state: Any, device: Any, acc: Any, r0: int, r1: int) -> None:
        return None

    def begin(self, rows: slice, cols: slice, out_off: tuple[int, int]) -> Any:
        return None

    def strip(self, state: Any, block: np.ndarray, r0: int, r1: int) -> None:
        return None

    def end(self, state: Any) -> dict:
        return {}


@with_task_settings
def gemm_tiles(spec: GemmSpec, tiles: tuple[tuple[int, int, slice, slice], ...]) -> list[dict]:
    """Compute the output tiles ``tiles`` one after another, each ``(i, j, rows, cols)``:
    ``alpha * op(A)[rows, :] @ op(B)[:, cols] + beta * C0[rows, cols]``; one result per tile.

    One :class:`TileStream` reads the k-panels of all of them in order, so the next tile's first
    panels are read while this tile computes its last panel and its strips are written, where a task
    per tile starts its stream cold (its first read overlapping nothing) and leaves the loader idle
    while its writes finish. Each tile's sums are those of a task of its own: the same panels in the
    same order into a fresh accumulator.
    """
    return _run_tiles(spec, tiles)


def gemm_runs(tiles: list[tuple[int, int, slice, slice]], workers: int,
              scheduler: str) -> list[tuple[tuple[int, int, slice, slice], ...]]:
    """The tasks of a tiled GEMM: runs of consecutive tiles, one :func:`gemm_tiles` task each.

    In one process (``threads``, ``sync``) one run per concurrent task; other schedulers keep a
    task per tile (spread over processes and hosts; a lost worker's retry redoes one tile).
    """
    if scheduler not in ("threads", "sync") or not tiles:
        return [(t,) for t in tiles]
    k = max(1, min(len(tiles), workers))
    n = len(tiles)
    return [tuple(tiles[n * r // k:n * (r + 1) // k]) for r in range(k)]


def _run_tiles(spec: GemmSpec, tiles: tuple[tuple[int, int, slice, slice], ...]) -> list[dict]:
    """The tiles not yet done, their panels read by one stream; one result per tile."""
    results: list[dict] = [{"skipped": 1, "bytes_read": 0, "bytes_written": 0, "flops": 0} for _ in tiles]
    todo = [(t, i, j, rows, cols) for t, (i, j, rows, cols) in enumerate(tiles)
            if not is_done(spec.done_dir, f"tile-{i}-{j}")]
    if spec.peaks is not None:  # a finished tile's peaks, kept in its marker (None: not kept)
        undone = {t for t, *_ in todo}
        for t, (i, j, rows, cols) in enumerate(tiles):
            if t not in undone:
                results[t]["peaks"] = _kept_peaks(spec, i, j, rows, cols)
    if not todo:
        return results
    device = get_device(spec.device, device_memory=spec.device_memory)
    plan = spec.plan
    # The task's planned device bytes come from the one budget of all tasks on this GPU (it waits
    # while others hold it); the device cache's blocks are counted there as they are kept. TF32
    # only where the spec asks for it.
    task_bytes = ((plan.device_peak or 0) - plan.cache_bytes) // max(1, plan.workers)
    with device.reserve(task_bytes), device.math(spec.precision):
        readers = [_PanelReader(spec, rows, cols) for _, _, _, rows, cols in todo]
        kept = _resident_panels(spec, device, readers)
        for r in readers:
            r.resident = kept is not None
        stream = _panel_stream(spec, device, readers, kept)
        items = iter(stream)
        try:
            for (t, i, j, rows, cols), reader in zip(todo, readers):
                results[t] = run_tile(spec, i, j, rows, cols, (device, reader, stream, items))
        finally:
            items.close()  # stops the loaders and hands the slots back (also on failure)
            if kept is not None:
                kept.cache.drop(kept.scope)  # the run's panels: no other run reads them
    return results


def _resident_panels(spec: GemmSpec, device: Any, readers: list[_PanelReader]) -> Any:
    """The device cache of a run's panels (:mod:`blocklin.device.resident`), or None.

    Where the plan gives the GPU a cache (``plan.cache_bytes``) and the run has several tiles, each
    k-panel of ``op(A)`` and ``op(B)`` is kept on the device after its first read and reused by the
    run's later tiles that need it (the tiles of a row share ``op(A)``'s panels, those of a column
    ``op(B)``'s). Keys are scoped to the run: operands of a product may be intermediates that the
    job rewrites under the same path between products.
    """
    from blocklin.device import resident

    plan = spec.plan
    if not plan.cache_bytes or device.host_resident or len(readers) < 2 or not resident.ENABLED:
        return None
    scope = resident.run_scope()
    per = len(readers[0].panels)
    dt = np.dtype(spec.dtype).str

    def keys(i: int) -> tuple:
        reader = readers[i // per]
        k0, k1 = reader.panels[i % per]
        rows, cols = reader.rows, reader.cols
        return ((scope, "a", rows.start, rows.stop, k0, k1, dt), (scope, "b", k0, k1, cols.start, cols.stop, dt))

    kept = resident.Resident(resident.DeviceCache.of(device.device_id), keys, limit=plan.cache_bytes,
                             budget=spec.device_memory or plan.device_memory or 0, checked=spec.check_finite,
                             scope=scope)
    return kept


def run_tile(spec: GemmSpec, i: int, j: int, rows: slice, cols: slice, run: tuple) -> dict:
    """Tile ``(i, j)`` of a run: its panels taken from the run's stream, computed, written, marked
    done; its result. ``run``: the run's device, the tile's panel reader, the stream and its items."""
    device, reader, stream, items = run
    t_start = time.perf_counter()
    before = (stream.load_seconds, stream.wait_seconds, stream.compute_seconds)
    kept = stream.resident
    served = kept.served if kept is not None else 0
    tile = _GemmTile(spec, rows, cols, device, reader, itertools.islice(items, len(reader.panels)))
    try:
        tile.compute()
    finally:
        tile.close()
    if spec.done_dir is not None and tile.peaks is not None:  # the marker holds the tile's peaks (one write)
        backend(spec.done_dir).write_bytes(f"tile-{i}-{j}", np.asarray(tile.peaks, dtype="<f8").tobytes())
    elif spec.done_dir is not None:
        mark_done(spec.done_dir, f"tile-{i}-{j}")
    result = tile.result(time.perf_counter() - t_start, stream.load_seconds - before[0],
                         stream.wait_seconds - before[1], stream.compute_seconds - before[2])
    if tile.peaks is not None:
        result["peaks"] = _placed(spec, rows, cols, tile.peaks)
    if not device.host_resident:
        # panels served from the device cache (read ahead of this tile's own k-loop included, as its
        # reads are), and the most bytes the device cache held after one of the run's uploads
        result["bytes_device_cache"] = (kept.served if kept is not None else 0) - served
        result["device_resident"] = kept.peak if kept is not None else 0
    return result


def _placed(spec: GemmSpec, rows: slice, cols: slice, peaks: np.ndarray) -> tuple[int, int, np.ndarray]:
    """A tile's peaks with its first row and column in the output store."""
    return spec.out_off[0] + rows.start, spec.out_off[1] + cols.start, peaks


def _kept_peaks(spec: GemmSpec, i: int, j: int, rows: slice, cols: slice) -> tuple | None:
    """The peaks an earlier run of tile ``(i, j)`` kept in its marker (:func:`run_tile`: written at once,
    never half), placed as :func:`_placed`; None where the marker holds none (an empty marker, of a run
    that kept no peaks): then the output's peaks are unknown."""
    raw = backend(spec.done_dir).try_read(f"tile-{i}-{j}")
    count = (rows.stop - rows.start) if spec.peaks else (cols.stop - cols.start)
    if raw is None or len(raw) != 8 * count:
        return None
    return _placed(spec, rows, cols, np.frombuffer(raw, dtype="<f8").astype(np.float64))


def tile_peaks(results: list, tally: Any, tiles: int) -> bool:
    """Merge the ``peaks`` of a GEMM's tile results (run with :attr:`GemmSpec.peaks`) into ``tally``
    (a :class:`~blocklin.storage.recorded_peaks.PeakTally` of the output); False, with the tally marked
    incomplete, unless every one of the output's ``tiles`` tiles gave its peaks."""
    merged = 0
    for r in results:
        got = r.get("peaks") if isinstance(r, dict) else None
        if got is None:
            continue
        r0, c0, peaks = got
        tally.merge(np.asarray(peaks, dtype=np.float64), r0, c0)
        merged += 1
    if merged != tiles:  # a tile skipped unseen (its peaks not kept), or one without peaks
        tally.skipped()
        return False
    return True


def _panel_stream(spec: GemmSpec, device: Any, readers: list[_PanelReader], kept: Any = None) -> TileStream:
    """One stream over the k-panels of ``readers``' tiles in order (each tile has the plan's panels);
    ``kept``: the panels kept on the device (:func:`_resident_panels`)."""
    plan = spec.plan
    dt = np.dtype(spec.dtype)
    per = len(readers[0].panels)
    a_shape = (plan.tk, plan.tm) if spec.trans_a else (plan.tm, plan.tk)
    b_shape = (plan.tn, plan.tk) if spec.trans_b else (plan.tk, plan.tn)

    def load(i: int, bufs: tuple[np.ndarray, ...], skip: tuple[bool, ...] = (False, False)) -> tuple:
        return readers[i // per].load(i % per, bufs, skip)

    # cast operands arrive in the compute dtype; on a GPU one loader thread per panel read ahead, on
    # a CPU the plan's loaders (two for read-bound tiles over decoded chunks)
    return TileStream(device, per * len(readers), load, [a_shape, b_shape], [readers[0].A.dtype, readers[0].B.dtype],
                      depth=plan.prefetch, device_dtype=[dt, dt], loaders=plan.loaders if device.host_resident else plan.prefetch,
                      job_items=plan.n_tasks * per, resident=kept)


class _PanelReader:
    """Reads the k-panels of op(A) and op(B) for one output tile (on the stream's loader threads)."""

    def __init__(self, spec: GemmSpec, rows: slice, cols: slice) -> None:
        self.spec, self.rows, self.cols = spec, rows, cols
        self.A, self.B = open_array(spec.a), open_array(spec.b)
        self.dtype = dt = np.dtype(spec.dtype)
        self.panels = spec.plan.k_panels()
        self.casts = (self.A.dtype != dt, self.B.dtype != dt)
        self.shift = open_array(spec.shift) if spec.shift is not None else None
        self.nbytes = 0
        # Each part of op(A) and op(B) is checked for NaN/Inf by one tile only, the first of its tile
        # row (A) or column (B): every tile runs before the output is committed, so a non-finite
        # input still fails the job, and the check costs one pass over each input, not one per read.
        self.checks = (spec.check_finite and cols.start == 0, spec.check_finite and rows.start == 0)
        #: Panels kept on the device (set by the run): a panel is then read once, by whichever tile
        #: comes first, so every read is checked.
        self.resident = False

    def load(self, p: int, bufs: tuple[np.ndarray, ...], skip: tuple[bool, bool] = (False, False)) -> tuple:
        """Read panel ``p`` of op(A) and op(B) into the stream's slots (cast, transposed views);
        ``skip[j]``: operand ``j`` is on the device already (None in its place)."""
        spec = self.spec
        ks = slice(*self.panels[p])
        out: list = []
        shift = self._shift(ks) if self.shift is not None else None
        for arr, buf, trans, cast, name, sel, off, check, cached in (
            (self.A, bufs[0], spec.trans_a, self.casts[0], spec.names[0], (self.rows, ks), spec.a_off, self.checks[0],
             skip[0]),
            (self.B, bufs[1], spec.trans_b, self.casts[1], spec.names[1], (ks, self.cols), spec.b_off, self.checks[1],
             skip[1]),
        ):
            if cached:
                out.append(None)
                continue
            check = check or (self.resident and spec.check_finite)
            stored = (sel[1], sel[0]) if trans else sel
            if off != (0, 0):
                stored = (slice(stored[0].start + off[0], stored[0].stop + off[0]),
                          slice(stored[1].start + off[1], stored[1].stop + off[1]))
            shape = (stored[0].stop - stored[0].start, stored[1].stop - stored[1].start)
            view = read_block(arr, stored[0], stored[1], out=region(buf, shape))
            self.nbytes += view.nbytes
            if check:
                check_finite(view, name, *stored)
            if cast:
                view = view.astype(self.dtype)
            op = view.T if trans else view
            if shift is not None and not out:  # op(A) - 1 s^T, in the panel's slot (a read copy, or the cast's)
                np.subtract(op, shift[None, :], out=op)
            elif shift is not None:  # op(B) - s 1^T, its column 0 of the whole product kept as read
                keep = 1 if self.cols.start == 0 else 0
                np.subtract(op[:, keep:], shift[:, None], out=op[:, keep:])
            out.append(op)
        return tuple(out)

    def _shift(self, ks: slice) -> np.ndarray:
        """The k-range ``ks`` of the spec's shift row, in the compute dtype."""
        s = read_block(self.shift, slice(0, 1), ks)
        self.nbytes += s.nbytes
        return np.asarray(s[0], dtype=self.dtype)


class _GemmTile:
    """One output tile: takes its k-panels from the run's stream, computes, writes finished strips."""

    def __init__(self, spec: GemmSpec, rows: slice, cols: slice, device: Any, reader: _PanelReader,
                 items: Any) -> None:
        self.spec, self.rows, self.cols = spec, rows, cols
        self.reader, self.items = reader, items
        self.dtype = dt = np.dtype(spec.dtype)
        self.device = device
        plan = spec.plan
        self.panels = reader.panels
        self.tm, self.tn = tm, tn = rows.stop - rows.start, cols.stop - cols.start
        self.nbytes = 0  # C's reads; the panels' are the reader's
        self.told = 0  # k-panels reported to this process's progress bar
        self.acc: Any = None  # allocated once the first panels are being read (compute)
        self.acc_buf: np.ndarray | None = None  # the host buffer under acc, handed back on close
        self.C = open_array(spec.c) if spec.c is not None and spec.beta != 0.0 else None
        self.strips = split(tm, plan.out_chunks[0])
        o0, o1 = spec.out_off
        self.writer = StripWriter(open_array(spec.out, mode="r+"), slice(o0 + rows.start, o0 + rows.stop),
                                  slice(o1 + cols.start, o1 + cols.stop))
        self.host_bufs: queue.Queue = queue.Queue()
        if not device.host_resident:  # rotating download buffers: one filling, one queued, one writing
            n_bufs = min(3, len(self.strips))
            for _ in range(n_bufs):
                self.host_bufs.put(device.host_empty((min(plan.out_chunks[0], tm), tn), dt,
                                                     uses=plan.n_tasks * len(self.strips) / n_bufs))
        self.cbuf = np.empty((min(plan.out_chunks[0], tm), tn), dtype=self.C.dtype) if self.C is not None else None
        # A product computed in another dtype than it is stored in: strips are cast on the host into
        # two rotating buffers of the output dtype (one filling, one being written)
        self.out_dtype = np.dtype(spec.out_dtype) if spec.out_dtype is not None else dt
        self.cast_bufs: queue.Queue = queue.Queue()
        if self.out_dtype != dt:
            if spec.epilogue is not None:
                raise InternalError("gemm_tiles: an epilogue needs the output in the compute dtype")
            for _ in range(min(2, len(self.strips))):
                self.cast_bufs.put(np.empty((min(plan.out_chunks[0], tm), tn), dtype=self.out_dtype))
        self.extra = spec.epilogue.begin(rows, cols, spec.out_off) if spec.epilogue is not None else None
        #: The peaks of the strips written (:attr:`GemmSpec.peaks`): each row's or each column's.
        self.peaks = None if spec.peaks is None else np.zeros(tm if spec.peaks else tn)

    def compute(self) -> None:
        # Allocating the accumulator overlaps the first panel's read; the first panel's product is
        # written into it (Device.gemm_into) rather than added to zeros.
        if self.panels and self.device.host_resident:  # the plan's full tile, reused between tiles
            self.acc_buf = pool.empty((self.spec.plan.tm, self.spec.plan.tn), self.dtype)
            self.acc = region(self.acc_buf, (self.tm, self.tn))
        else:
            self.acc = self.device.empty((self.tm, self.tn), self.dtype) if self.panels else \
                self.device.zeros((self.tm, self.tn), self.dtype)
        last = len(self.panels) - 1
        for p, (_, (a_dev, b_dev)) in enumerate(self.items):
            gemm = self.device.gemm_into if p == 0 else self.device.gemm_acc
            if p < last:
                gemm(self.acc, a_dev, b_dev)
                self.told += report_units(1)  # progress in k-panels within a tile
                continue
            # The last panel is applied strip by strip so that writing finished strips overlaps the
            # rest of the compute; each element still sees the same k-panels in the same order. On a
            # GPU a strip's C read (host) and download (d2h stream) run while the next strip's GEMM
            # computes: a strip is waited for only after the next GEMM was queued.
            pending = None
            for r0, r1 in self.strips:
                gemm(self.acc[r0:r1], a_dev[r0:r1], b_dev)
                queued = self.start(r0, r1)
                if pending is not None:
                    self.finish(pending)
                pending = queued
            if pending is not None:
                self.finish(pending)
        if not self.panels:  # k == 0: the result is beta * C (or zeros)
            for r0, r1 in self.strips:
                self.finish(self.start(r0, r1))

    def _read_c(self, r0: int, r1: int) -> np.ndarray:
        """Rows ``r0:r1`` of the tile's ``C`` (stored dtype), checked."""
        spec = self.spec
        c0, c1 = spec.c_off
        rs = slice(c0 + self.rows.start + r0, c0 + self.rows.start + r1)
        cs = slice(c1 + self.cols.start, c1 + self.cols.stop)
        block = read_block(self.C, rs, cs, out=region(self.cbuf, (r1 - r0, self.tn)))
        self.nbytes += block.nbytes
        if spec.check_finite:
            check_finite(block, spec.names[2], rs, cs)
        return block

    def start(self, r0: int, r1: int) -> tuple:
        """Scale strip ``r0:r1`` and add ``beta * C``; on a GPU queue its download (not waited for)."""
        spec, device, acc = self.spec, self.device, self.acc
        scale = self.out_dtype == self.dtype  # else scaled in the output dtype on the host (finish)
        if scale and self.C is not None:
            block = self._read_c(r0, r1)
            device.axpby(acc[r0:r1], spec.alpha, block.astype(self.dtype, copy=False), spec.beta)
        elif scale and spec.alpha != 1.0:
            device.axpby(acc[r0:r1], spec.alpha, None, 0.0)
        if spec.epilogue is not None and spec.epilogue.on_device and not device.host_resident:
            spec.epilogue.device_strip(self.extra, device, acc[r0:r1], r0, r1)
        if device.host_resident:
            return r0, r1, acc[r0:r1], None, None
        buf = self.host_bufs.get()
        host, ready = device.download_async(acc, slice(r0, r1), out=region(buf, (r1 - r0, self.tn)))
        return r0, r1, host, ready, lambda b=buf: self.host_bufs.put(b)

    def finish(self, pending: tuple) -> None:
        """Wait for the strip's download, run the epilogue, hand the strip to the writer."""
        r0, r1, host, ready, done = pending
        if ready is not None:
            ready.synchronize()
        if self.out_dtype != self.dtype:
            host, done = self._cast_strip(r0, r1, host, done)
        epi = self.spec.epilogue
        if epi is not None and not (epi.on_device and not self.device.host_resident):
            epi.strip(self.extra, host, r0, r1)
        if self.peaks is not None:  # of the bits written: after the cast and the epilogue
            if self.spec.peaks:
                self.peaks[r0:r1] = block_peaks(host, rows=True)
            else:
                np.maximum(self.peaks, block_peaks(host, rows=False), out=self.peaks)  # propagates NaN
        self.writer.submit(r0, r1, host, done=done)

    def _cast_strip(self, r0: int, r1: int, host: np.ndarray, done: Any) -> tuple[np.ndarray, Any]:
        """Strip ``r0:r1`` in the output dtype: ``alpha * strip + beta * C`` computed there."""
        spec = self.spec
        buf = self.cast_bufs.get()  # waits while both buffers are queued for writing
        out = region(buf, (r1 - r0, self.tn))
        out[...] = host
        if done is not None:  # the compute-dtype strip is copied: its download buffer is free again
            done()
        odt = self.out_dtype
        if spec.alpha == 0.0:
            out.fill(0)  # assign: 0 * NaN is NaN
        elif spec.alpha != 1.0:
            out *= odt.type(spec.alpha)
        if self.C is not None:
            c = self._read_c(r0, r1)
            if spec.beta == 1.0:
                out += c
            else:
                out += odt.type(spec.beta) * c.astype(odt, copy=False)
        return out, lambda b=buf: self.cast_bufs.put(b)

    def close(self) -> None:
        """Flush the writer and free the buffers now.

        The stream holds :meth:`load`, so tile and stream form a reference cycle: without dropping
        them here, the accumulator and the panel slots would wait for the cyclic garbage collector
        while the next tile allocates its own, and the peak would exceed the plan.
        """
        try:
            self.writer.close()
            # Written, and the stream's slots handed back: the next tile may take the accumulator.
            self.acc = None
            pool.give(self.acc_buf)
        finally:
            while not self.host_bufs.empty():
                self.device.release_host(self.host_bufs.get())
            self.items = self.acc = self.acc_buf = self.cbuf = self.cast_bufs = None

    def result(self, seconds: float, load_seconds: float, wait_seconds: float, compute_seconds: float) -> dict:
        """The tile's statistics; the stream's times while the tile ran (its reads ahead included)."""
        spec = self.spec
        return {
            "skipped": 0,
            "progress_units": self.told,
            "bytes_read": self.reader.nbytes + self.nbytes,
            "bytes_written": self.tm * self.tn * self.out_dtype.itemsize,
            "flops": 2 * self.tm * self.tn * (self.panels[-1][1] if self.panels else 0),
            "seconds": seconds,
            "load_seconds": load_seconds,
            "wait_seconds": wait_seconds,
            "compute_seconds": compute_seconds,
            **(spec.epilogue.end(self.extra) if spec.epilogue is not None else {}),
        }
