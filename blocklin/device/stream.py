"""TileStream: the one prefetching pipeline that feeds every device.

Loader threads (one by default) read item ``i + 1`` (and up to ``depth`` ahead) into
preallocated host slots while the consumer computes on item ``i``. On a GPU the host slots are pinned and uploads run on
their own stream, so disk reads, host-to-device copies and compute all overlap. Slots are reused,
so memory stays at ``(depth + 1)`` sets of operand buffers however long the stream.

On host-resident devices the threads come from :func:`start_lane`: threads kept by the process
between streams (and the GEMM tiles' strip writers), so that a job of many short tasks does not
start two threads per task (measured on the loaded 2-core machine: 0.3 ms per stream of thread
starts and joins, against 0.1 ms).
"""

from __future__ import annotations

import os
import queue
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import numpy as np

from blocklin.interrupt import check_cancelled
from blocklin.device import pool
from blocklin.device.base import Device
import blocklin._readstats as readstats

#: ``load(i, buffers) -> views``: fill the given host buffers for item ``i`` and return views of
#: the filled region (edge tiles are smaller than the buffers).
Loader = Callable[[int, tuple[np.ndarray, ...]], tuple[np.ndarray, ...]]

_STOP = object()

#: Seconds an idle kept thread waits for its next lane before it ends.
KEEP_SECONDS = 30.0


class Lane:
    """One function run by :func:`start_lane`; :meth:`join` waits for its end."""

    def __init__(self) -> None:
        self._done = threading.Event()

    def join(self) -> None:
        self._done.wait()

    def is_alive(self) -> bool:
        return not self._done.is_set()


class _Kept:
    """A thread that runs lanes one after another, kept idle between them for :data:`KEEP_SECONDS`."""

    def __init__(self) -> None:
        self.queue: queue.SimpleQueue = queue.SimpleQueue()
        threading.Thread(target=self._run, name="blocklin-lane", daemon=True).start()

    def _run(self) -> None:
        me = threading.current_thread()
        while True:
            try:
                fn, name, lane = self.queue.get(timeout=KEEP_SECONDS)
            except queue.Empty:
                with _kept_lock:
                    if self in _idle:  # else just taken: its lane is on the way
                        _idle.remove(self)
                        return
                continue
            me.name = name
            try:
                fn()
            except BaseException:  # noqa: BLE001 - lanes hand their errors on themselves; never kill the thread
                pass
            finally:
                me.name = "blocklin-lane"
                with _kept_lock:
                    if _kept_pid == os.getpid():
                        _idle.append(self)
                lane._done.set()


_kept_lock = threading.Lock()
_idle: list[_Kept] = []
_kept_pid = os.getpid()


def _new_thread(fn: Callable[[], Any], name: str) -> threading.Thread:
    thread = threading.Thread(target=fn, name=name, daemon=True)
    thread.start()
    return thread


def start_lane(fn: Callable[[], Any], name: str) -> Lane:
    """Run ``fn()`` on a kept idle thread, or a new one (a forked child starts its own); ``fn``
    handles its own errors (one that escapes is dropped)."""
    global _kept_pid
    with _kept_lock:
        if _kept_pid != os.getpid():  # threads do not survive a fork
            _idle.clear()
            _kept_pid = os.getpid()
        kept = _idle.pop() if _idle else None
    lane = Lane()
    (kept or _Kept()).queue.put((fn, name, lane))
    return lane


def _dtypes(dtype: Any, n: int) -> list[np.dtype]:
    return [np.dtype(d) for d in dtype] if isinstance(dtype, (list, tuple)) else [np.dtype(dtype)] * n


class TileStream:
    """Iterate over ``n_items`` operand tuples, prefetched ``depth`` items ahead.

    Parameters
    ----------
    device : Device
        Where the operands are consumed.
    n_items : int
        Number of items (for example k-panels of a GEMM tile).
    load : callable
        ``load(i, buffers) -> views``; runs on the loader thread.
    buffer_shapes : sequence of shapes
        Shape of each operand's host buffer (the largest item).
    dtype : dtype or sequence of dtypes
        Buffer dtype, one for all buffers or one per buffer.
    depth : int
        Items read ahead of the one being computed (``depth + 1`` slots in all).
    device_dtype : dtype or sequence of dtypes, optional
        The dtype each operand arrives in from ``load`` (and so on the device), when the loader
        casts (for example float32 storage computed in float64). Defaults to ``dtype``.
    loaders : int
        Loader threads (at most ``depth``): several reads in flight keep a fast device fed when
        one reader cannot; items are still consumed in order.
    job_items : int, optional
        Items that streams of these slot shapes carry over the whole job (tasks reuse a GPU's
        cached slots); with the slot count it tells a GPU whether pinning the slots pays
        (:meth:`Device.host_empty`). None: pin.
    resident : blocklin.device.resident.Resident, optional
        On a GPU, the operand blocks to keep on the device (keys per item): a block found there is
        not read (``load(i, buffers, skip)`` gets ``skip[j]`` true and returns None for it) and is
        handed out from the device; one not found is read and uploaded into the cache. None: every
        item read and uploaded into the slots.

    Attributes
    ----------
    load_seconds, wait_seconds, compute_seconds : float
        Time spent reading on the loader threads, time the consumer waited for data (what the
        overlap failed to hide), and time the consumer held items (its compute and writes).
    """

    def __init__(self, device: Device, n_items: int, load: Loader, buffer_shapes: Sequence[tuple[int, ...]],
                 dtype: Any, depth: int = 1, device_dtype: Any = None, loaders: int = 1,
                 job_items: int | None = None, resident: Any = None) -> None:
        self.device = device
        self.resident = resident if not device.host_resident else None
        self.n_items = n_items
        self.load = load
        self.depth = max(0, int(depth))
        self.loaders = max(1, min(int(loaders), self.depth)) if self.depth else 0
        n_slots = min(self.depth + 1, max(1, n_items))
        dtypes = _dtypes(dtype, len(buffer_shapes))
        # Host-resident devices take their slots from the run's reused buffers (blocklin.device.pool)
        if device.host_resident:
            alloc = pool.empty
        else:
            uses = None if job_items is None else job_items / n_slots
            alloc = lambda s, d: device.host_empty(s, d, uses=uses)  # noqa: E731
        self.buffers = [tuple(alloc(s, d) for s, d in zip(buffer_shapes, dtypes)) for _ in range(n_slots)]
        device.slots(n_slots, list(buffer_shapes), _dtypes(dtype if device_dtype is None else device_dtype,
                                                           len(buffer_shapes)))
        self.load_seconds = 0.0
        self.wait_seconds = 0.0
        self.compute_seconds = 0.0
        self._free: queue.Queue[int] = queue.Queue()
        for s in range(n_slots):
            self._free.put(s)
        self._ready: dict[int, Any] = {}
        self._cond = threading.Condition()
        self._next = 0  # next item a loader claims
        self._stop = threading.Event()
        self._threads: list[Lane | threading.Thread] = []

    def start(self) -> None:
        """Start reading ahead now (iterating starts it otherwise): a consumer that has other set-up
        work (zeroing an accumulator) overlaps it with the first reads."""
        if self._threads or self.depth == 0 or self.n_items == 0:
            return
        # Kept threads on host-resident devices only: a GPU's loaders touch per-thread CUDA state
        # (the current device and stream), which must not carry over from an earlier stream.
        start = start_lane if self.device.host_resident else _new_thread
        self._threads = [start(readstats.in_context(self._loader), f"blocklin-prefetch-{t}")
                         for t in range(self.loaders)]

    def _loader(self) -> None:
        while True:
            slot = self._free.get()
            if self._stop.is_set() or slot is _STOP:
                self._free.put(_STOP)  # wake the other loaders too
                return
            with self._cond:  # claim the next item together with the slot, so items complete in order
                i = self._next
                self._next += 1
            if i >= self.n_items:
                self._free.put(slot)
                return
            try:
                self.device.host_slot_free(slot)
                t0 = time.perf_counter()
                views, kept = self._read(i, slot)
                dt = time.perf_counter() - t0
                item: Any = (slot, views, kept)
            except BaseException as exc:  # handed to the consumer, re-raised there
                dt, item = 0.0, exc
            with self._cond:
                self.load_seconds += dt
                self._ready[i] = item
                self._cond.notify_all()
            if isinstance(item, BaseException):
                return

    def _read(self, i: int, slot: int) -> tuple[tuple, Any]:
        """Item ``i`` read into host slot ``slot``: its views, and what the device keeps of it."""
        if self.resident is None:
            return self.load(i, self.buffers[slot]), None
        keys, found = self.resident.hits(i)
        try:
            views = self.load(i, self.buffers[slot], tuple(f is not None for f in found))
        except BaseException:
            self.resident.release(found)
            raise
        return views, (self.resident, keys, found)

    def _upload(self, slot: int, views: tuple, kept: Any) -> tuple:
        return self.device.upload(slot, views) if kept is None else self.device.upload(slot, views, kept)

    def stop(self) -> None:
        """End the loader threads (after iterating, or instead of it when the consumer failed first)."""
        self._stop.set()
        self._free.put(_STOP)  # wake loaders blocked on a free slot
        for t in self._threads:
            t.join()
        if self.resident is not None:  # items read ahead and never consumed: their cached blocks
            with self._cond:
                left = [item for item in self._ready.values() if isinstance(item, tuple)]
                self._ready.clear()
            for _slot, _views, kept in left:
                self.resident.release(kept[2])

    def release(self) -> None:
        """Hand the host slots back to the device for reuse, once no upload reads them any more."""
        for s in range(len(self.buffers)):
            self.device.host_slot_free(s)
        for bufs in self.buffers:
            for buf in bufs:
                self.device.release_host(buf)
                if self.device.host_resident:
                    pool.give(buf)
        self.buffers = []

    def __iter__(self) -> Iterator[tuple[int, tuple[Any, ...]]]:
        try:
            yield from self._iterate()
        finally:
            self.release()

    def _iterate(self) -> Iterator[tuple[int, tuple[Any, ...]]]:
        if self.n_items == 0:
            return
        if self.depth == 0:  # no thread: read, then compute (the serial reference)
            for i in range(self.n_items):
                check_cancelled()
                self.device.host_slot_free(0)  # the previous upload from the one slot has finished
                t0 = time.perf_counter()
                views, kept = self._read(i, 0)
                self.load_seconds += time.perf_counter() - t0
                t1 = time.perf_counter()
                try:
                    yield i, self._upload(0, views, kept)
                finally:  # also when the consumer stops here (see below)
                    self.device.after_use(0)
                self.compute_seconds += time.perf_counter() - t1
            return
        self.start()
        try:
            for i in range(self.n_items):
                check_cancelled()
                t0 = time.perf_counter()
                with self._cond:
                    while i not in self._ready:
                        self._cond.wait()
                    item = self._ready.pop(i)
                self.wait_seconds += time.perf_counter() - t0
                if isinstance(item, BaseException):
                    raise item
                slot, views, kept = item
                t1 = time.perf_counter()
                try:
                    yield i, self._upload(slot, views, kept)
                finally:
                    # Also when the consumer stops at this item (a run's last tile closes the stream
                    # here): the device keeps its slots for the thread's next stream, whose first
                    # upload into this slot must wait for the compute queued on this item.
                    self.device.after_use(slot)
                self.compute_seconds += time.perf_counter() - t1
                self._free.put(slot)
        finally:
            self.stop()
