"""CUDA device: CuPy arrays with separate upload, compute and download streams.

Stream discipline (checked without a GPU by the CuPy stand-in in the tests):

- Host slots are pinned (page-locked), so uploads are truly asynchronous, unless a buffer carries
  too few copies over the job for pinning to pay (:data:`PIN_MIN_USES`): CUDA then stages a
  pageable upload before the call returns, and a pageable download completes within the call, so
  such a buffer is free again as soon as its copy is queued. Each upload goes to a
  preallocated device slot on the ``h2d`` stream and records an event; the compute stream waits on
  that event. A pinned host slot is refilled only after that event completed
  (:meth:`CudaDevice.host_slot_free`), and a device slot is overwritten only after the compute that
  read it (the ``h2d`` stream waits on the event :meth:`CudaDevice.after_use` recorded).
- cuBLAS GEMM with ``beta=1`` accumulates into the device tile on the ``compute`` stream; float32
  GEMMs use TF32 tensor cores only inside :meth:`CudaDevice.math` (cuBLAS math mode
  ``CUBLAS_TF32_TENSOR_OP_MATH``; ``CUPY_TF32`` does not reach ``cublas<t>gemm``).
- Downloads run on the ``d2h`` stream after an event of the compute stream. :meth:`download`
  waits for the copy; :meth:`download_async` returns an event so the next strip's GEMM is queued
  while the copy runs.
- Nothing runs on the legacy default stream, and nothing synchronizes the host except to refill
  a pinned slot, to hand a result to the host, or between two tile streams that change the slots.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

import numpy as np

from blocklin.plan.gpu import pinned_nbytes
from blocklin.device import pool
from blocklin.device.base import Device, not_positive_definite, singular
from blocklin.device.budget import DeviceBudget
from blocklin.device.half import is_half, round_to
from blocklin.device.scalars import scale_in_place
from blocklin.errors import DeviceError, explain

#: Pin a host transfer buffer only when it will carry at least this many copies in the job.
#: Measured on an H200 host (16 cores, a virtual machine), per GiB: pinning 0.53-0.76 s and
#: unpinning 0.15 s, against 0.36-0.43 s for the first touch of pageable memory; copies from
#: pinned memory ran at 50 GB/s each way, from pageable memory at 5.6 GB/s up and 10 GB/s down
#: (blocking the calling thread, a loader or the task). Pinning pays from about three copies; a
#: short job (an n = 16384 float64 GEMM in five k-panels) spent 3.8 s of its 6.1 s pinning and
#: unpinning buffers that each carried one or two copies.
PIN_MIN_USES = 3



#: cuBLAS math modes (cublasMath_t).
_DEFAULT_MATH = 0
_TF32_MATH = 3


class CudaDevice(Device):
    """CuPy device with overlapped transfers (see module docstring). One instance per thread."""

    name = "gpu"
    host_resident = False
    _instances: dict[int, CudaDevice] = {}
    _lock = threading.Lock()
    #: Idle pinned host buffers by (shape, dtype), shared by the devices of every thread.
    _pinned_cache: dict[tuple[tuple[int, ...], str], list[np.ndarray]] = {}
    _pinned_lock = threading.Lock()
    #: ids of the pageable buffers :meth:`host_empty` handed out (returned to the run's pool).
    _pageable: set[int] = set()
    #: Record CUDA timing events around every GEMM (see :meth:`profile`).
    _profiling = False

    def __init__(self, device_memory: int | None = None, device_id: int | None = None) -> None:
        import cupy

        self.cp = cupy
        if device_id is not None:  # this thread's tasks run on that GPU (streams belong to a device)
            cupy.cuda.Device(device_id).use()
        self.device_id = cupy.cuda.runtime.getDevice()
        self.device_memory = device_memory
        self.h2d = cupy.cuda.Stream(non_blocking=True)
        self.compute = cupy.cuda.Stream(non_blocking=True)
        self.d2h = cupy.cuda.Stream(non_blocking=True)
        self._dev_slots: list[tuple[Any, ...]] = []
        self._slot_spec: list[tuple[tuple[int, ...], np.dtype]] = []
        self._uploaded: dict[int, Any] = {}  # slot -> event after the last upload from its host buffers
        self._used: dict[int, Any] = {}  # slot -> event after the last compute that read its device buffers
        self._held: dict[int, tuple] = {}  # slot -> (cache, cached blocks its item reads), until after_use
        self._tf32 = False
        self._half: str | None = None  # "fp16"/"bf16": float32 GEMMs take 16-bit inputs (see math)
        self._state_lock = threading.Lock()
        self._active = 0  # tasks holding the budget through this device (see reserve)
        self._release_pending = False
        self._timeline: list[list[tuple[Any, Any]]] = []  # per tile stream: (start, end) events of each GEMM

    @classmethod
    def current(cls, device_memory: int | None = None) -> CudaDevice:
        """One instance per thread (streams are not shared between concurrent tile tasks), on the GPU of
        the worker it runs in (:func:`blocklin.device.workers.gpu_for_worker`).

        ``device_memory`` is the budget of the calling task's job, set on every call: the instance
        outlives the job that created it, and the tasks of a later job on this thread hold their own
        job's budget (a task asks for its device right before it reserves).
        """
        key = threading.get_ident()
        with cls._lock:
            inst = cls._instances.get(key)
            if inst is None:
                from blocklin.device.workers import worker_gpu

                inst = cls._instances[key] = cls(device_memory, device_id=worker_gpu())
            elif inst.cp.cuda.runtime.getDevice() != inst.device_id:
                # a new thread with the identifier of an ended one inherits its device and streams
                inst.cp.cuda.Device(inst.device_id).use()
            inst.device_memory = device_memory
            return inst

    @classmethod
    def instances(cls) -> list[CudaDevice]:
        with cls._lock:
            return list(cls._instances.values())

    @classmethod
    def profile(cls, on: bool) -> None:
        """Turn GEMM timing on or off for every thread (costs two events per GEMM)."""
        cls._profiling = on
        for inst in cls.instances():
            inst._timeline = []

    def compute_timeline(self) -> tuple[float, float]:
        """``(gemm seconds, k-loop seconds)`` since profiling began, from CUDA events.

        The k-loop of a tile stream spans its first GEMM's start to its last GEMM's end (reads,
        uploads, epilogues and downloads in between count as idle); their ratio is the fraction of
        the k-loop during which the GPU computed.
        """
        busy = span = 0.0
        elapsed = self.cp.cuda.get_elapsed_time
        for seg in self._timeline:
            if not seg:
                continue
            seg[-1][1].synchronize()
            busy += sum(elapsed(e0, e1) for e0, e1 in seg) / 1e3
            span += elapsed(seg[0][0], seg[-1][1]) / 1e3
        return busy, span

    @classmethod
    def release_all(cls) -> None:
        """End of a job: drain every thread's device, free its device slots and return its pinned host
        memory to the OS.

        The devices outlive the job (one per thread), their slots must not: CuPy's pool never returns
        live blocks, and the next job's budget would count them as free. The pool's cached blocks go
        back to the driver too, so other processes (and the next job's measured budget) see them free.
        """
        with cls._lock:
            insts = list(cls._instances.values())
        for inst in insts:
            inst.release_pinned()
            with inst._state_lock:
                busy = inst._release_pending = inst._active > 0  # a task of a concurrent job: freed after it
            if not busy:
                inst.release_slots()
        from blocklin.device.resident import DeviceCache

        DeviceCache.release_all()  # the job's device-resident operand blocks
        if insts:
            insts[0].cp.get_default_memory_pool().free_all_blocks()

    @classmethod
    def reset(cls) -> None:
        """Forget every instance (after releasing their pinned memory); for tests."""
        cls.release_all()
        with cls._lock:
            cls._instances.clear()

    # -- memory -----------------------------------------------------------------------------------
    @contextlib.contextmanager
    def reserve(self, nbytes: int) -> Iterator[None]:
        """Hold ``nbytes`` of this GPU's budget (``device_memory``, else 80% of :meth:`usable_memory`).

        While a task holds it, the end of another job (:meth:`release_all`) leaves this device's slots
        to the task and frees them when it ends.
        """
        budget = self.device_memory or int(0.8 * self.usable_memory())
        with self._state_lock:
            self._active += 1
        try:
            with DeviceBudget.of(self.device_id).hold(int(nbytes), budget):
                yield
        finally:
            with self._state_lock:
                self._active -= 1
                release = self._active == 0 and self._release_pending
                self._release_pending = self._release_pending and not release
            if release:
                self.release_slots()

    def free_memory(self) -> int:
        """Bytes this process may still allocate: free memory plus the blocks CuPy's pool caches.

        ``cudaMemGetInfo`` counts the pool's cached (free) blocks as used; they are ours to reuse,
        so the budget is total memory minus what other processes and our live arrays hold.
        """
        free, _total = self.cp.cuda.runtime.memGetInfo()
        return int(free) + int(self.cp.get_default_memory_pool().free_bytes())

    def usable_memory(self) -> int:
        """What this process's tasks may use on the GPU: total memory minus what other processes hold.

        ``cudaMemGetInfo``'s free memory plus every block CuPy's pool holds for this process (cached
        or live): a constant while our own tasks allocate, so the budget that :class:`DeviceBudget`
        shares between them is not shrunk by the tasks it already counts.
        """
        free, _total = self.cp.cuda.runtime.memGetInfo()
        return int(free) + int(self.cp.get_default_memory_pool().total_bytes())

    def total_memory(self) -> int:
        return int(self.cp.cuda.runtime.memGetInfo()[1])

    def pinned_bytes(self) -> int:
        """Pinned host bytes this process keeps cached for reuse (shared by every thread's device), as
        CuPy's pinned pool holds them (:func:`pinned_nbytes`)."""
        with CudaDevice._pinned_lock:
            return sum(pinned_nbytes(b.nbytes) for bufs in CudaDevice._pinned_cache.values() for b in bufs)

    # -- host buffers -----------------------------------------------------------------------------
    # One cache of idle pinned buffers per process, not per thread: tile tasks of one job may run on
    # fresh threads (one CudaDevice each), whose caches would each keep a plan's worth of buffers.
    def host_empty(self, shape: tuple[int, ...], dtype: Any, uses: float | None = None) -> np.ndarray:
        import cupyx

        if uses is not None and uses < PIN_MIN_USES:  # pinning would cost more than it saves
            buf = pool.empty(shape, dtype)
            with CudaDevice._pinned_lock:
                CudaDevice._pageable.add(id(buf))
            return buf
        key = (tuple(shape), np.dtype(dtype).str)
        with CudaDevice._pinned_lock:
            kept = CudaDevice._pinned_cache.get(key)
            if kept:  # reuse pinned buffers across tiles: pinning is expensive
                return kept.pop()
            stale = [k for k, bufs in CudaDevice._pinned_cache.items() if k != key and bufs]
            for k in stale:
                del CudaDevice._pinned_cache[k]
        if stale:
            # Unpin the idle buffers of other shapes before pinning a new one: the host budget counts
            # the buffers of the plan that runs, and those of an earlier plan of the job (the
            # inverse's GEMMs change shapes from level to level) would be held on top of it. Cached
            # buffers are idle (their copies completed before they were handed back).
            self.cp.get_default_pinned_memory_pool().free_all_blocks()
        return cupyx.empty_pinned(shape, dtype=dtype)

    def release_host(self, buf: np.ndarray) -> None:
        with CudaDevice._pinned_lock:
            pageable = id(buf) in CudaDevice._pageable
            if pageable:
                CudaDevice._pageable.discard(id(buf))
            else:
                CudaDevice._pinned_cache.setdefault((buf.shape, buf.dtype.str), []).append(buf)
        if pageable:  # its copies completed within their calls: the run's next task may take it
            pool.give(buf)

    def release_pinned(self) -> None:
        """Drop the cached pinned buffers and have CuPy unpin them (after the queued work ran)."""
        # Called at the end of a job, possibly from another thread than this device's: the upload
        # events stay (a concurrent stream of this thread still refills its slots after them).
        self.synchronize()
        with CudaDevice._pinned_lock:
            CudaDevice._pinned_cache.clear()
            CudaDevice._pageable.clear()  # ids of a failed task's unreturned buffers must not outlive the job
        self.cp.get_default_pinned_memory_pool().free_all_blocks()

    # -- operand slots ----------------------------------------------------------------------------
    def release_slots(self) -> None:
        """Free this device's slots (after the work queued on them ran); the next stream allocates anew."""
        self.synchronize()
        for cache, entries in self._held.values():  # an item never handed back (a failed task)
            for e in entries:
                cache.unpin(e, None, self)
        self._held.clear()
        self._dev_slots = []
        self._slot_spec = []
        self._used.clear()
        self._uploaded.clear()

    def slots(self, n: int, shapes: list[tuple[int, ...]], dtype: Any) -> None:
        """Prepare ``n`` device slots; ``dtype`` is one dtype or one per operand (the uploaded dtype)."""
        dtypes = [np.dtype(d) for d in dtype] if isinstance(dtype, (list, tuple)) else [np.dtype(dtype)] * len(shapes)
        want = [(tuple(s), d) for s, d in zip(shapes, dtypes)]
        if want != self._slot_spec or len(self._dev_slots) < n:
            # The previous stream's uploads into, and reads of, the old slots must be finished before
            # they are freed: CuPy's pool would hand the memory to the next allocation at once.
            self.synchronize()
            # Free the old slots before allocating the new ones: holding both would need their sum.
            self._dev_slots = []
            with self.compute:
                self._dev_slots = [tuple(self.cp.empty(int(np.prod(s)), dtype=d) for s, d in want) for _ in range(n)]
            self._slot_spec = want
            self._used.clear()
            self._uploaded.clear()
        if self._profiling:
            self._timeline.append([])
        # Reused slots keep their ``_used`` events: the first upload into a slot waits for the last
        # compute of the previous stream that read it.

    def host_slot_free(self, slot: int) -> None:
        ev = self._uploaded.get(slot)
        if ev is not None:
            ev.synchronize()  # the previous upload from this host slot has finished reading it

    def upload(self, slot: int, arrays: tuple[np.ndarray, ...], resident: Any = None) -> tuple[Any, ...]:
        """Queue the copies of ``arrays`` (host slot ``slot``) into device slot ``slot``; the device arrays.

        ``resident``: ``(res, keys, found)`` of a stream that keeps blocks on the device (``res`` a
        :class:`blocklin.device.resident.Resident`, ``keys`` and ``found`` from its ``hits``): an
        operand with a cached block in ``found`` arrives as ``None`` and is taken from the device
        (after its upload's event); one with a key and no block is uploaded into a new cached block
        where the cache admits it, else into the slot.
        """
        cp = self.cp
        used = self._used.get(slot)
        if used is not None:
            self.h2d.wait_event(used)  # compute on the previous contents of this slot is done
        out = []
        held = []
        for j, (host, dev_full) in enumerate(zip(arrays, self._dev_slots[slot])):
            hit = resident[2][j] if resident is not None else None
            if hit is not None:  # on the device already: read after its upload
                self.compute.wait_event(hit.ready)
                out.append(hit.array)
                held.append(hit)
                continue
            if host.dtype != dev_full.dtype:
                raise DeviceError(explain(f"operand {j} of the tile stream", f"must arrive as {dev_full.dtype}, "
                                          "the dtype its device slot was prepared for", host.dtype.name,
                                          "pass the compute dtype as TileStream(device_dtype=...)"))
            entry = None
            if resident is not None and resident[1][j] is not None:
                res = resident[0]
                entry = res.cache.admit(resident[1][j], host.nbytes, limit=res.limit, budget=res.budget)
            if entry is not None:  # a new block of the cache instead of the slot
                with self.compute:  # in compute's pool, written after compute's queued work (see resident)
                    dev_full = cp.empty(host.size, dtype=host.dtype)
                    after = cp.cuda.Event(disable_timing=True)
                    after.record(self.compute)
                self.h2d.wait_event(after)
            if host.flags.c_contiguous:
                dev = dev_full[: host.size].reshape(host.shape)
                dev.set(host, stream=self.h2d)
            elif host.T.flags.c_contiguous:  # a transposed view: copy the stored layout, transpose on device
                dev = dev_full[: host.size].reshape(host.T.shape)
                dev.set(host.T, stream=self.h2d)
                dev = dev.T
            else:  # strided view: staged through a contiguous copy, still on the upload stream
                dev = dev_full[: host.size].reshape(host.shape)
                dev.set(np.ascontiguousarray(host), stream=self.h2d)
            out.append(dev)
            if entry is not None:
                held.append((entry, dev))
        ev = cp.cuda.Event(disable_timing=True)
        ev.record(self.h2d)
        self._uploaded[slot] = ev
        self.compute.wait_event(ev)
        if held:
            res = resident[0]
            for e in held:
                if isinstance(e, tuple):  # uploaded now: others may read it after this event
                    res.kept_block(e[0].size)
                    res.cache.fill(e[0], e[1], ev, checked=res.checked)
            self._held[slot] = (res.cache, [e[0] if isinstance(e, tuple) else e for e in held])
        return tuple(out)

    def after_use(self, slot: int) -> None:
        ev = self.cp.cuda.Event(disable_timing=True)
        ev.record(self.compute)
        self._used[slot] = ev
        cache, entries = self._held.pop(slot, (None, ()))
        for e in entries:  # cached blocks this item read: their last use on this device
            cache.unpin(e, ev, self)

    # -- compute ----------------------------------------------------------------------------------
    @contextlib.contextmanager
    def math(self, precision: str | None) -> Iterator[None]:
        """Within the block, float32 GEMMs use TF32 tensor cores when ``precision == "tf32"``.

        Sets the cuBLAS math mode of this thread's handle (``CUBLAS_TF32_TENSOR_OP_MATH``), which is
        what ``cublasSgemm`` honours, and restores it afterwards. ``"fp16"``/``"bf16"``: the float32
        GEMMs' operands are rounded to the 16-bit format on the compute stream and multiplied by
        ``cublasSgemm`` (products of 16-bit numbers are exact in float32: the arithmetic of
        ``cublasGemmEx`` with 16-bit inputs and ``CUBLAS_COMPUTE_32F`` up to the order of the
        additions, without its tensor-core speed; :mod:`blocklin.device.half`).
        """
        prev, prev_half = self._tf32, self._half
        self._tf32 = precision == "tf32"
        self._half = precision if is_half(precision) else None
        try:
            yield
        finally:
            self._tf32, self._half = prev, prev_half

    def on_compute(self) -> contextlib.AbstractContextManager:
        return self.compute

    def zeros(self, shape: tuple[int, int], dtype: Any) -> Any:
        with self.compute:
            return self.cp.zeros(shape, dtype=dtype)

    def cast(self, x: Any, dtype: Any) -> Any:
        if x.dtype == np.dtype(dtype):
            return x
        with self.compute:
            return x.astype(dtype)

    def copy(self, x: Any) -> Any:
        with self.compute:
            return x.copy()

    def sumsq_cols_acc(self, acc: Any, x: Any) -> None:
        with self.compute:
            for part in ((x.real, x.imag) if x.dtype.kind == "c" else (x,)):
                x64 = part.astype(np.float64, copy=False)
                acc += (x64 * x64).sum(axis=0)

    def to_device(self, x: np.ndarray) -> Any:
        """A device copy of host array ``x``, ready for the compute stream."""
        return self._upload_pageable(np.ascontiguousarray(x))

    def _upload_pageable(self, x: np.ndarray) -> Any:
        """``x`` copied to a new device array on the compute stream, straight from its host memory.

        Not ``cupy.asarray``: from pageable memory it copies through a block of the pinned pool that
        stays pinned (cached) after the copy, beside the host budget; CUDA stages a pageable copy
        itself within the call.
        """
        with self.compute:
            dev = self.cp.empty(x.shape, dtype=x.dtype)
        dev.set(x, stream=self.compute)
        return dev

    def gemm_acc(self, acc: Any, a: Any, b: Any, alpha: float = 1.0) -> None:
        if self._profiling:
            e0, e1 = self.cp.cuda.Event(), self.cp.cuda.Event()
            e0.record(self.compute)
            self._gemm(acc, a, b, alpha)
            e1.record(self.compute)
            if not self._timeline:
                self._timeline.append([])
            self._timeline[-1].append((e0, e1))
        else:
            self._gemm(acc, a, b, alpha)

    def _gemm(self, acc: Any, a: Any, b: Any, alpha: float = 1.0) -> None:
        from cupy import cublas

        with self.compute:
            if self._half is not None and acc.dtype == np.float32:
                cublas.gemm("N", "N", round_to(a, self._half), round_to(b, self._half), out=acc, alpha=alpha,
                            beta=1.0)
            elif self._tf32 and acc.dtype == np.float32:
                from cupy.cuda import device

                try:  # where CuPy 13/14 keep the cuBLAS bindings
                    from cupy_backends.cuda.libs import cublas as lib
                except ImportError:  # pragma: no cover - older layouts
                    from cupy.cuda import cublas as lib

                handle = device.get_cublas_handle()
                mode = lib.getMathMode(handle)
                lib.setMathMode(handle, getattr(lib, "CUBLAS_TF32_TENSOR_OP_MATH", _TF32_MATH))
                try:
                    cublas.gemm("N", "N", a, b, out=acc, alpha=alpha, beta=1.0)
                finally:
                    lib.setMathMode(handle, mode)
            else:
                cublas.gemm("N", "N", a, b, out=acc, alpha=alpha, beta=1.0)

    def axpby(self, acc: Any, alpha: float, c: np.ndarray | None, beta: float) -> None:
        with self.compute:
            if alpha == 0.0:
                acc.fill(0)  # assign: 0 * NaN is NaN
            elif alpha != 1.0:
                scale_in_place(acc, alpha)  # alpha outside the dtype's normal range kept to its precision
            if c is not None and beta != 0.0:
                dc = self._upload_pageable(np.ascontiguousarray(c, dtype=acc.dtype))
                if beta != 1.0:
                    scale_in_place(dc, beta)
                acc += dc

    def _queue_download(self, acc: Any, rows: slice, out: np.ndarray | None) -> tuple[np.ndarray, Any]:
        cp = self.cp
        ev = cp.cuda.Event(disable_timing=True)
        ev.record(self.compute)
        self.d2h.wait_event(ev)
        part = acc[rows]
        if out is None:
            out = np.empty(part.shape, part.dtype)
        view = out[: part.shape[0], : part.shape[1]] if out.shape != part.shape else out
        if view.dtype != part.dtype:
            raise DeviceError(explain("out", f"must have the tile's dtype {part.dtype}", view.dtype.name,
                                      "allocate the host buffer with the compute dtype"))
        if not part.flags.c_contiguous or not view.flags.c_contiguous:
            with self.d2h:
                part = cp.ascontiguousarray(part)
            if not view.flags.c_contiguous:
                tmp = part.get(stream=self.d2h, blocking=True)
                view[...] = tmp
                return view, None
        part.get(stream=self.d2h, out=view, blocking=False)
        done = cp.cuda.Event(disable_timing=True)
        done.record(self.d2h)
        return view, done

    def download(self, acc: Any, rows: slice, out: np.ndarray | None = None) -> np.ndarray:
        view, done = self._queue_download(acc, rows, out)
        if done is not None:
            done.synchronize()
        return view

    def download_async(self, acc: Any, rows: slice, out: np.ndarray) -> tuple[np.ndarray, Any]:
        """Queue the copy of ``acc[rows]`` into pinned ``out``; return ``(view, event)``.

        ``view`` holds the data once ``event.synchronize()`` returned (``event`` is None when the
        copy already completed). The caller keeps ``out`` alive and unread until then.
        """
        return self._queue_download(acc, rows, out)

    def synchronize(self) -> None:
        for s in (self.h2d, self.compute, self.d2h):
            s.synchronize()

    # -- dense operations (cuBLAS / cuSOLVER through CuPy, on the compute stream) -------------------
    def to_host(self, x: Any) -> np.ndarray:
        return np.array(self.download(x, slice(0, x.shape[0]))) if x.ndim == 2 else self._small_to_host(x)

    def _small_to_host(self, x: Any) -> np.ndarray:
        """A vector or scalar result: copied on the compute stream that produced it."""
        return x.get(stream=self.compute, blocking=True)

    def _all_finite(self, x: Any) -> bool:
        with self.compute:
            flag = self.cp.isfinite(x).all()
        return bool(self._small_to_host(flag))

    def syrk_acc(self, acc: Any, a: Any) -> None:
        from cupy import cublas

        cp = self.cp
        n = a.shape[1]
        if a.dtype.kind == "c":  # HERK as a GEMM (CuPy's cuBLAS wrappers have no herk): a^H a made exactly
            with self.compute:  # Hermitian, its diagonal real ((z + conj z) / 2 is Re z, exactly)
                g = cp.matmul(a.T.conj(), a)
                g = g + g.T.conj()  # a new array: CuPy does not guard in-place overlap
                g *= 0.5
                acc += g
            return
        with self.compute:
            low = cp.zeros((n, n), dtype=a.dtype, order="F")
            cublas.syrk("T", a, out=low, alpha=1.0, beta=0.0, lower=True)  # lower triangle of a.T @ a
            acc += low
            acc += cp.tril(low, -1).T

    def cholesky(self, x: Any) -> Any:
        import cupyx

        # cuSOLVER reports a failed pivot in devInfo, which CuPy checks only under errstate(linalg="raise"):
        # without it the result is a partial factor with finite garbage.
        try:
            with self.compute, cupyx.errstate(linalg="raise"):
                return self.cp.linalg.cholesky(x)
        except np.linalg.LinAlgError:
            raise not_positive_definite(x.shape[0]) from None

    def solve_triangular(self, t: Any, b: Any, *, lower: bool, trans: bool = False, unit: bool = False) -> Any:
        from cupyx.scipy.linalg import solve_triangular

        with self.compute:
            return solve_triangular(t, b, lower=lower, trans=1 if trans else 0, unit_diagonal=unit)

    def qr(self, x: Any) -> tuple[Any, Any]:
        with self.compute:
            return self.cp.linalg.qr(x, mode="reduced")

    def qr_r(self, x: Any) -> Any:
        with self.compute:
            return self.cp.linalg.qr(x, mode="r")

    def concat(self, arrays: list, axis: int) -> Any:
        with self.compute:
            return self.cp.concatenate(arrays, axis=axis)

    def svd(self, x: Any) -> tuple[Any, Any, Any]:
        with self.compute:
            return self.cp.linalg.svd(x, full_matrices=False)

    def eigh(self, x: Any) -> tuple[Any, Any]:
        with self.compute:
            return self.cp.linalg.eigh(x)

    def inv(self, x: Any) -> Any:
        import cupyx

        try:
            with self.compute, cupyx.errstate(linalg="raise"):
                out = self.cp.linalg.inv(x)
        except np.linalg.LinAlgError:
            raise singular(x.shape[0]) from None
        if not self._all_finite(out):  # numerically singular: getrf succeeded, the inverse overflowed
            raise singular(x.shape[0])
        return out
