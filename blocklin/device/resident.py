"""Operands that live on the device: a cache of stored operand blocks in GPU memory, per GPU and job.

A block of a stored operand (a GEMM k-panel of ``op(A)`` or ``op(B)``, a row strip of a pass) that
a job will read again is kept on the device after its first upload, so later tiles and passes take
it from there instead of reading it from storage and copying it over the host link again. This is
the device tile cache of BLASX (Wang, Wu, Xu, Cai, Chen, Hu: "BLASX: A High Performance Level-3
BLAS Library for Heterogeneous Multi-GPU Computing", ICS 2016): blocks keyed by what they hold,
least recently used evicted first, reused across tiles.

- **Keys** name the content: the stored array (its URL and, for passes, its content stamp), the
  stored region, the orientation, the dtype on the device and a scope. The scope is one job
  (:func:`job_scope`) for passes over the operation's own input, which the job never rewrites, and
  one tile run for GEMM panels (operands of a product may be intermediates a job rewrites between
  products under the same path, with the same sizes, within one tick of a file's timestamps).
- **Budget**: the blocks' bytes, at the size CuPy's pool gives them (:func:`~blocklin.plan.gpu.device_nbytes`),
  are part of the GPU's one :class:`~blocklin.device.budget.DeviceBudget` (``cached``, beside the
  tasks' ``held``). A block is admitted only within the caller's ``limit`` (the plan's cache size)
  and the job's ``device_memory``, evicting the least recently used idle blocks first; a task
  whose bytes do not fit beside the cache evicts idle blocks before it waits.
- **Streams**: a block is written once, on the uploading device's ``h2d`` stream (after the compute
  stream that allocated it, whose pool may have handed it memory that compute still used), and
  its ``ready`` event is waited on by every compute stream that reads it; each reader records its
  last use. A block is freed only after the host synchronized its upload and every recorded use
  (CuPy's pool would hand the memory to the next allocation at once), and never while a task that
  looked it up still holds it (``pins``).
- **Lifetime**: a GEMM run drops its blocks when it ends (:meth:`DeviceCache.drop`); the end of a
  job frees every idle block of every GPU (:meth:`DeviceCache.release_all`, from
  :meth:`~blocklin.device.cuda.CudaDevice.release_all`): no device bytes stay allocated after a job.
"""

from __future__ import annotations

import threading
import uuid
import weakref
from collections import OrderedDict
from collections.abc import Hashable
from typing import Any

from blocklin.device.budget import DeviceBudget
from blocklin.plan.gpu import device_nbytes

#: Use the cache where a plan provides one. Tests turn it off to compare against the streamed run
#: of the same plan (the same tiles and strips, each block read from storage every time).
ENABLED = True


class Entry:
    """One cached block: its device array (as the consumer sees it: a transposed view where the
    stream hands one out), the pool bytes it holds, its upload's event and its readers' last uses."""

    __slots__ = ("key", "array", "nbytes", "size", "ready", "uses", "pins", "checked")

    def __init__(self, key: Hashable, nbytes: int, size: int) -> None:
        self.key = key
        self.nbytes = nbytes  # in CuPy's pool
        self.size = size  # the block's own bytes
        self.array: Any = None  # None until the upload was queued (a placeholder others skip)
        self.ready: Any = None
        self.uses: dict[int, Any] = {}  # id of the reading device -> event after its last compute on it
        self.pins = 0
        self.checked = False  # checked for NaN/Inf when it was read


class DeviceCache:
    """The operand blocks kept on one GPU (shared by every thread's device on it; see module docstring)."""

    _caches: dict[int, DeviceCache] = {}
    _lock = threading.Lock()

    def __init__(self, budget: Any) -> None:
        self.lock = threading.Lock()
        self.entries: OrderedDict[Hashable, Entry] = OrderedDict()
        self.budget = budget
        self.bytes = 0
        #: High-water mark of the cache's bytes (tests and reports; reset by the caller).
        self.peak = 0
        budget.shrink = self.shrink

    @classmethod
    def of(cls, device_id: int) -> DeviceCache:
        budget = DeviceBudget.of(device_id)
        with cls._lock:
            cache = cls._caches.get(device_id)
            if cache is None or cache.budget is not budget:  # budgets forgotten (tests): a fresh cache
                cache = cls._caches[device_id] = cls(budget)
            return cache

    @classmethod
    def all(cls) -> list[DeviceCache]:
        with cls._lock:
            return list(cls._caches.values())

    @classmethod
    def release_all(cls) -> None:
        """End of a job: free every idle block on every GPU (a task of a concurrent job keeps the blocks
        it holds; they go at the next job's end)."""
        for cache in cls.all():
            cache.release()

    # -- lookups and admissions ---------------------------------------------------------------------
    def lookup(self, key: Hashable, *, checked: bool = False) -> Entry | None:
        """The block under ``key``, pinned for the caller (:meth:`unpin` after its use), or None; with
        ``checked`` only a block that was checked for NaN/Inf when it was read."""
        with self.lock:
            e = self.entries.get(key)
            if e is None or e.array is None or (checked and not e.checked):
                return None
            e.pins += 1
            self.entries.move_to_end(key)
            return e

    def admit(self, key: Hashable, nbytes: int, *, limit: int, budget: int) -> Entry | None:
        """Room for a new block of ``nbytes`` under ``key`` (pinned for the caller, to be filled by
        :meth:`fill`), or None where it does not fit: the cache kept within ``limit`` bytes and the
        GPU's budget within ``budget`` (``device_memory``), idle blocks evicted oldest first."""
        n = device_nbytes(nbytes)
        if n > limit:
            return None
        with self.lock:
            old = self.entries.get(key)
            if old is not None:  # being uploaded by another task, or read unchecked: keep what is there
                if old.pins or old.array is None:
                    return None
                self._evict(old)
            while self.bytes + n > limit:
                if not self._evict_oldest():
                    return None
            while not self.budget.take_cached(n, budget):
                if not self._evict_oldest():
                    return None
            e = Entry(key, n, int(nbytes))
            e.pins = 1
            self.entries[key] = e
            self.bytes += n
            self.peak = max(self.peak, self.bytes)
            return e

    def fill(self, e: Entry, array: Any, ready: Any, *, checked: bool) -> None:
        """The block's device array and the event after its upload (others may use it from now on)."""
        with self.lock:
            e.array, e.ready, e.checked = array, ready, checked

    def unpin(self, e: Entry, used: Any, reader: Any) -> None:
        """The caller's compute on ``e`` is queued; ``used`` is an event recorded after it."""
        with self.lock:
            e.uses[id(reader)] = used
            e.pins -= 1

    def discard(self, e: Entry) -> None:
        """Give up an admitted block whose upload failed (pinned by the caller)."""
        with self.lock:
            e.pins -= 1
            if self.entries.get(e.key) is e:
                self._evict(e)

    # -- eviction -------------------------------------------------------------------------------------
    def _evict_oldest(self) -> bool:
        for e in self.entries.values():
            if not e.pins:
                self._evict(e)
                return True
        return False

    def _evict(self, e: Entry) -> None:
        # The upload and every reader's compute must have run before the pool may reuse the memory.
        for ev in (e.ready, *e.uses.values()):
            if ev is not None:
                ev.synchronize()
        del self.entries[e.key]
        e.array = e.ready = None
        e.uses.clear()
        self.bytes -= e.nbytes
        self.budget.give_cached(e.nbytes)

    def shrink(self, nbytes: int) -> int:
        """Evict idle blocks, oldest first, until ``nbytes`` are freed (or none is left idle); the bytes
        freed. Called by :meth:`DeviceBudget.hold` for a task that does not fit beside the cache."""
        freed = 0
        with self.lock:
            while freed < nbytes:
                before = self.bytes
                if not self._evict_oldest():
                    break
                freed += before - self.bytes
        return freed

    def drop(self, scope: Hashable) -> None:
        """Free the idle blocks of ``scope`` (the first element of their keys): a run that ended."""
        with self.lock:
            for e in [e for e in self.entries.values() if e.key[0] == scope and not e.pins]:
                self._evict(e)

    def release(self) -> None:
        with self.lock:
            for e in [e for e in self.entries.values() if not e.pins]:
                self._evict(e)


_scopes: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_scopes_lock = threading.Lock()


def job_scope(job: Any) -> str:
    """A name for ``job`` unique in this process and across processes (the scope of its pass blocks)."""
    with _scopes_lock:
        scope = _scopes.get(job)
        if scope is None:
            scope = _scopes[job] = f"job-{uuid.uuid4().hex[:16]}"
        return scope


def run_scope() -> str:
    """A name for one GEMM tile run (the scope of its panels)."""
    return f"run-{uuid.uuid4().hex[:16]}"


class Resident:
    """What a :class:`~blocklin.device.stream.TileStream` keeps on the device: per item, one key per
    operand (None: streamed as usual), within ``limit`` cache bytes and the ``budget`` of the job.

    ``keys(i)`` gives the keys of item ``i``; ``checked`` whether the blocks the stream reads are
    checked for NaN/Inf (a block read unchecked does not serve a stream that checks); ``lookup``
    per operand whether to look blocks up (False: a stream that must read them itself, such as the
    pass that records each column's largest magnitude, still keeps what it reads).

    Counts, over the stream: ``served`` bytes taken from the device, ``kept`` bytes uploaded into the
    cache, ``blocks`` kept, ``peak`` the most bytes the GPU's cache held after one of its uploads.
    """

    def __init__(self, cache: DeviceCache, keys: Any, *, limit: int, budget: int, checked: bool,
                 lookup: tuple[bool, ...] | None = None, scope: Hashable = None) -> None:
        self.cache, self.keys, self.limit, self.budget = cache, keys, int(limit), int(budget)
        self.scope = scope
        self.checked = checked
        self.lookup = lookup
        self.served = 0
        self.kept = 0
        self.blocks = 0
        self.peak = 0
        self._count = threading.Lock()

    def hits(self, i: int) -> tuple[tuple[Hashable | None, ...], tuple[Entry | None, ...]]:
        """Item ``i``'s keys and the cached blocks found for them (pinned), on a loader thread."""
        keys = self.keys(i)
        found = tuple(None if k is None or (self.lookup is not None and not self.lookup[j])
                      else self.cache.lookup(k, checked=self.checked) for j, k in enumerate(keys))
        served = sum(e.size for e in found if e is not None)
        if served:
            with self._count:
                self.served += served
        return keys, found

    def kept_block(self, nbytes: int) -> None:
        with self._count:
            self.kept += nbytes
            self.blocks += 1
            self.peak = max(self.peak, self.cache.bytes)

    def release(self, found: tuple[Entry | None, ...]) -> None:
        """Unpin blocks looked up for an item that will not be consumed (a stream stopped early)."""
        for e in found:
            if e is not None:
                with self.cache.lock:
                    e.pins -= 1
