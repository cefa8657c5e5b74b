"""CUDA device: CuPy arrays with separate upload, compute and download streams.

Host slots are pinned (page-locked) so copies are truly asynchronous. Each upload goes to a
preallocated device slot on the ``h2d`` stream and records an event; the compute stream waits on
that event, runs cuBLAS GEMM with ``beta=1`` into the device accumulator, and records an event
that the next upload into the same slot waits on. Downloads use the ``d2h`` stream. Nothing
synchronizes the host until a result is needed (or a clock is read).
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

from blocklin.device.base import Device


class CudaDevice(Device):
    """CuPy device with overlapped transfers (see module docstring)."""

    name = "gpu"
    host_resident = False
    _instances: dict[int, CudaDevice] = {}
    _lock = threading.Lock()

    def __init__(self, device_memory: int | None = None) -> None:
        import cupy

        self.cp = cupy
        self.device_id = cupy.cuda.runtime.getDevice()
        self.device_memory = device_memory
        self.h2d = cupy.cuda.Stream(non_blocking=True)
        self.compute = cupy.cuda.Stream(non_blocking=True)
        self.d2h = cupy.cuda.Stream(non_blocking=True)
        self._dev_slots: list[tuple[Any, ...]] = []
        self._uploaded: dict[int, Any] = {}
        self._used: dict[int, Any] = {}
        self._pinned_cache: dict[tuple[tuple[int, ...], str], list[np.ndarray]] = {}

    @classmethod
    def current(cls, device_memory: int | None = None) -> CudaDevice:
        """One instance per thread (streams are not shared between concurrent tile tasks)."""
        key = threading.get_ident()
        with cls._lock:
            inst = cls._instances.get(key)
            if inst is None:
                inst = cls._instances[key] = cls(device_memory)
            return inst

    def free_memory(self) -> int:
        free, _total = self.cp.cuda.runtime.memGetInfo()
        return int(free)

    # -- host buffers ---------------------------------------------------------------------------
    def host_empty(self, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
        import cupyx

        key = (tuple(shape), np.dtype(dtype).str)
        pool = self._pinned_cache.setdefault(key, [])
        if pool:  # reuse pinned buffers across tiles: pinning is expensive
            return pool.pop()
        return cupyx.empty_pinned(shape, dtype=dtype)

    def release_host(self, buf: np.ndarray) -> None:
        self._pinned_cache.setdefault((buf.shape, buf.dtype.str), []).append(buf)

    def slots(self, n: int, shapes: list[tuple[int, ...]], dtype: Any) -> None:
        cp = self.cp
        want = [tuple(s) for s in shapes]
        have = [tuple(a.shape) for a in self._dev_slots[0]] if self._dev_slots else None
        if have != want or len(self._dev_slots) < n or self._dev_slots[0][0].dtype != np.dtype(dtype):
            self._dev_slots = [tuple(cp.empty(s, dtype=dtype) for s in want) for _ in range(n)]
        self._uploaded.clear()
        self._used.clear()

    def host_slot_free(self, slot: int) -> None:
        ev = self._uploaded.get(slot)
        if ev is not None:
            ev.synchronize()  # the previous upload from this host slot has finished reading it

    def upload(self, slot: int, arrays: tuple[np.ndarray, ...]) -> tuple[Any, ...]:
        cp = self.cp
        used = self._used.get(slot)
        if used is not None:
            self.h2d.wait_event(used)  # compute on the previous contents of this slot is done
        out = []
        for host, dev_full in zip(arrays, self._dev_slots[slot]):
            if host.flags.c_contiguous:
                dev = dev_full.ravel()[: host.size].reshape(host.shape)
                dev.set(host, stream=self.h2d)
            elif host.T.flags.c_contiguous:  # a transposed view: copy the stored layout, transpose on device
                dev = dev_full.ravel()[: host.size].reshape(host.T.shape)
                dev.set(host.T, stream=self.h2d)
                dev = dev.T
            else:  # pragma: no cover - loaders hand out contiguous views
                dev = cp.asarray(np.ascontiguousarray(host))
            out.append(dev)
        ev = cp.cuda.Event(disable_timing=True)
        ev.record(self.h2d)
        self._uploaded[slot] = ev
        self.compute.wait_event(ev)
        return tuple(out)

    def after_use(self, slot: int) -> None:
        ev = self.cp.cuda.Event(disable_timing=True)
        ev.record(self.compute)
        self._used[slot] = ev

    # -- compute ----------------------------------------------------------------------------------
    def zeros(self, shape: tuple[int, int], dtype: Any) -> Any:
        with self.compute:
            return self.cp.zeros(shape, dtype=dtype)

    def gemm_acc(self, acc: Any, a: Any, b: Any) -> None:
        from cupy import cublas

        with self.compute:
            cublas.gemm("N", "N", a, b, out=acc, alpha=1.0, beta=1.0)

    def axpby(self, acc: Any, alpha: float, c: np.ndarray | None, beta: float) -> None:
        cp = self.cp
        with self.compute:
            if alpha != 1.0:
                acc *= acc.dtype.type(alpha)
            if c is not None and beta != 0.0:
                dc = cp.asarray(c)
                acc += acc.dtype.type(beta) * dc

    def download(self, acc: Any, rows: slice, out: np.ndarray | None = None) -> np.ndarray:
        cp = self.cp
        ev = cp.cuda.Event(disable_timing=True)
        ev.record(self.compute)
        self.d2h.wait_event(ev)
        part = acc[rows]
        if out is None:
            out = self.host_empty(part.shape, part.dtype)
        view = out[: part.shape[0], : part.shape[1]] if out.shape != part.shape else out
        if not part.flags.c_contiguous:
            with self.d2h:
                part = cp.ascontiguousarray(part)
        if view.flags.c_contiguous:
            part.get(stream=self.d2h, out=view)
        else:
            tmp = part.get(stream=self.d2h)
            self.d2h.synchronize()
            view[...] = tmp
        self.d2h.synchronize()
        return view

    def synchronize(self) -> None:
        for s in (self.h2d, self.compute, self.d2h):
            s.synchronize()
