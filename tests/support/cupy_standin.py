"""A NumPy-backed stand-in for the part of CuPy that blocklin uses, checking CUDA's ordering rules.

It lets the CUDA device code run (and be checked) on machines without a GPU. It models CUDA as
adversarially as CUDA allows:

- Work queued on a stream runs only when something forces it: ``Stream.synchronize``,
  ``Event.synchronize``, a blocking copy (``get`` with ``blocking=True``, a copy to or from
  pageable host memory, a copy on the legacy stream), ``Device.synchronize``, or a forced piece of
  work on another stream that waited on an event of this one. Until then device buffers keep their
  old contents and pinned host buffers that a download targets hold NaN (or 0x5A bytes).
- Copies from pinned host memory read the buffer when they run, not when they are queued, and
  report a race when the host changed the buffer in between (pageable memory is staged at the call,
  as the CUDA runtime does).
- Every device allocation keeps per-byte-range access records with the stream's vector clock (the
  idea of PyTorch's CUDA Stream Sanitizer): events are the happens-before edges, the legacy default
  stream is ordered with blocking streams only, non-blocking streams with nothing. A read/write or
  write/write pair on different streams without a happens-before path is a race, reported with both
  call sites.
- ``ndarray.set``/``get``, ``cublas.gemm``/``syrk`` and the arithmetic enforce CuPy's dtype, shape
  and contiguity contracts (the same exception types and messages), and device arrays refuse
  implicit conversion to NumPy and mixing with NumPy arrays.

Races are collected in :data:`STATE` (``STATE.races``); ``check()`` raises :class:`RaceError`.
``install()``/``uninstall()`` put the stand-in in ``sys.modules`` as ``cupy`` and ``cupyx``.

- Freed device memory goes back to the pool of the stream that was current at its allocation and
  is handed, with its access records, to the next allocation of that size on that stream (as
  CuPy's pool does, without waiting for other streams): a freed buffer another stream still uses
  shows up as a race.

- The pinned pool rounds every request up to a power of two (of at least 512 bytes) and caches
  freed blocks by size until ``free_all_blocks``; ``asarray`` of pageable host data takes a
  staging block of that pool, which stays cached after the copy. ``STATE.device_peak`` is the
  high-water mark of live device bytes.

Not modelled: multiple devices, kernels other than the ones below, size-class rounding of the
device pool, and streams per thread (``CUPY_CUDA_PER_THREAD_DEFAULT_STREAM``).
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import warnings
import time
import traceback
import types
import weakref
from typing import Any

import numpy as np

_LOCK = threading.RLock()
_THIS = os.path.abspath(__file__)
#: Total memory of the simulated device.
DEVICE_TOTAL = 1 << 30


class RaceError(AssertionError):
    """Unordered accesses (or host writes to a pinned buffer before its copy ran)."""


class CUDARuntimeError(RuntimeError):
    pass


# -- global state ----------------------------------------------------------------------------------
class _State:
    """Everything the stand-in device knows; ``reset()`` runs once :class:`Stream` exists."""

    def reset(self) -> None:
        # Blocks of an earlier installation freed later (by the cyclic collector, in another test)
        # must not change this one's counts: each block remembers the generation it was allocated in.
        self.generation = getattr(self, "generation", 0) + 1
        self.streams: list[Stream] = []
        self.races: list[str] = []
        self.pinned: dict[int, tuple[int, int]] = {}  # id -> (start address, end address)
        self.pinned_used = 0
        self.pinned_free = 0
        self.pinned_peak = 0  # high-water mark of pinned_used + pinned_free
        self.pinned_blocks: dict[int, int] = {}  # block size -> free blocks the pinned pool caches
        self.device_count = 1  # CUDA devices the runtime reports (tests of the per-worker mapping)
        self.device_used = 0  # bytes held by live device arrays (the pool's used bytes)
        self.device_peak = 0  # high-water mark of device_used
        self.device_cached = 0  # freed blocks the pool keeps
        self.free_blocks: dict[tuple[int, int], list] = {}  # (arena stream id, bytes) -> freed blocks
        self.others = 0  # bytes other processes hold on the device
        self.counts: dict[str, int] = {}
        self.math_mode = 0
        self.linalg = "ignore"
        self.local = threading.local()
        self.host_vc: dict[int, int] = {}  # what the host has waited for: later work is ordered after it
        self.legacy = Stream(_null=True)

    def count(self, what: str) -> None:
        self.counts[what] = self.counts.get(what, 0) + 1


STATE = _State()


def _site() -> str:
    """The innermost two frames outside this module: where the user code made the call."""
    frames = [f for f in traceback.extract_stack()[:-1]
              if os.path.abspath(f.filename) != _THIS and "_pytest" not in f.filename and "pluggy" not in f.filename]
    keep = frames[-2:][::-1]
    return " <- ".join(f"{os.path.relpath(f.filename)}:{f.lineno} in {f.name}" for f in keep)


def _report(msg: str) -> None:
    STATE.races.append(msg)


def check() -> None:
    """Run everything still queued, then raise :class:`RaceError` listing every race seen."""
    synchronize_all()
    if STATE.races:
        races, STATE.races = STATE.races, []
        raise RaceError(f"{len(races)} CUDA ordering violation(s):\n- " + "\n- ".join(races))


def take_races() -> list[str]:
    """Run everything still queued and return (and forget) the races seen so far."""
    synchronize_all()
    races, STATE.races = STATE.races, []
    return races


def synchronize_all() -> None:
    with _LOCK:
        for s in list(STATE.streams):
            _force(s, len(s.ops))
            _join(STATE.host_vc, s.vc)


# -- streams and events ------------------------------------------------------------------------------
def _join(a: dict[int, int], b: dict[int, int]) -> None:
    for k, v in b.items():
        if a.get(k, 0) < v:
            a[k] = v


class _Op:
    __slots__ = ("fn", "vc", "site", "what", "t")

    def __init__(self, fn, vc, site, what):
        self.fn, self.vc, self.site, self.what, self.t = fn, vc, site, what, None


def _force(stream: Stream, upto: int) -> None:
    """Run the ops of ``stream`` up to clock ``upto``, each after everything it depends on."""
    while stream.executed < upto:
        op = stream.ops[stream.executed]
        for sid, c in op.vc.items():
            if sid != stream.id:
                _force(STATE.streams[sid], c)
        if op.what == "d2h copy" and any(
                t is not stream and any(o.what == "cublas.gemm" for o in t.ops[t.executed:]) for t in STATE.streams):
            STATE.count("d2h copy overlapping queued gemm")  # a copy the GPU can run beside compute
        if op.fn is not None:
            op.fn()
            op.fn = None  # let the arrays it captured go
        op.t = time.perf_counter()
        stream.executed += 1


class Stream:
    """``cupy.cuda.Stream``. ``Stream.null`` is the legacy default stream."""

    def __init__(self, null: bool = False, non_blocking: bool = False, ptds: bool = False, *, _null: bool = False):
        if null and not _null:
            raise ValueError("use Stream.null for the legacy default stream")
        self.is_null = _null
        self.non_blocking = bool(non_blocking)
        with _LOCK:
            self.id = len(STATE.streams)
            STATE.streams.append(self)
        self.vc: dict[int, int] = {}
        self.ops: list[_Op] = []
        self.executed = 0
        self.ptr = 0 if _null else 0x1000 + self.id

    def __repr__(self) -> str:
        return "<legacy stream>" if self.is_null else f"<stream {self.id}{' non-blocking' if self.non_blocking else ''}>"

    def __enter__(self) -> Stream:
        stack = getattr(STATE.local, "stack", None)
        if stack is None:
            stack = STATE.local.stack = []
        stack.append(self)
        return self

    def __exit__(self, *exc) -> None:
        STATE.local.stack.pop()

    def use(self) -> Stream:
        stack = getattr(STATE.local, "stack", None)
        if stack is None:
            stack = STATE.local.stack = []
        if stack:
            stack[-1] = self
        else:
            stack.append(self)
        return self

    def synchronize(self) -> None:
        with _LOCK:
            _force(self, len(self.ops))
            _join(STATE.host_vc, self.vc)

    @property
    def done(self) -> bool:
        with _LOCK:
            return self.executed == len(self.ops)

    def record(self, event: Event | None = None) -> Event:
        event = event or Event()
        event.record(self)
        return event

    def wait_event(self, event: Event) -> None:
        with _LOCK:
            if event._vc is not None:  # waiting on a never-recorded event is a no-op in CUDA
                _join(self.vc, event._vc)


STATE.reset()


def get_current_stream() -> Stream:
    stack = getattr(STATE.local, "stack", None)
    return stack[-1] if stack else STATE.legacy


def _wait(stream: Stream, op: _Op) -> None:
    """The host waits for ``op`` (a synchronous copy): it and everything before it ran."""
    with _LOCK:
        _force(stream, op.vc[stream.id])
        _join(STATE.host_vc, op.vc)


def _order_legacy(stream: Stream) -> None:
    """The legacy stream waits for blocking streams and they wait for it; non-blocking ones don't."""
    if stream.is_null:
        for s in STATE.streams:
            if not s.is_null and not s.non_blocking:
                _join(stream.vc, s.vc)
    elif not stream.non_blocking:
        _join(stream.vc, STATE.legacy.vc)


def _enqueue(stream: Stream | None, fn, accesses: list[tuple[Any, str]], what: str) -> _Op:
    """Queue ``fn`` on ``stream`` after checking ``accesses`` (``(device array, 'r'|'w')``)."""
    stream = stream or get_current_stream()
    with _LOCK:
        STATE.count(what)
        _join(stream.vc, STATE.host_vc)
        _order_legacy(stream)
        clock = len(stream.ops) + 1
        stream.vc[stream.id] = clock
        vc = dict(stream.vc)
        site = _site()
        seen: set[int] = set()  # one report per earlier access, however many views this op touches
        for arr, kind in accesses:
            arr._alloc.access(arr._interval(), kind, stream, clock, vc, site, what, seen)
        op = _Op(fn, vc, site, what)
        stream.ops.append(op)
        return op


class Event:
    """``cupy.cuda.Event``: a marker queued on a stream; its vector clock is the happens-before edge."""

    def __init__(self, block: bool = False, disable_timing: bool = False, interprocess: bool = False):
        self.disable_timing = disable_timing
        self._vc: dict[int, int] | None = None
        self._stream: Stream | None = None
        self._op: _Op | None = None

    def record(self, stream: Stream | None = None) -> None:
        stream = stream or get_current_stream()
        self._op = _enqueue(stream, None, [], "event.record")
        with _LOCK:
            self._vc = dict(self._op.vc)
            self._stream = stream

    def synchronize(self) -> None:
        with _LOCK:
            if self._stream is not None:
                _force(self._stream, self._vc[self._stream.id])
                _join(STATE.host_vc, self._vc)

    @property
    def done(self) -> bool:
        with _LOCK:
            return self._op is None or self._op.t is not None


def get_elapsed_time(start: Event, end: Event) -> float:
    """Milliseconds between two completed, timing-enabled events (CUDA's rules)."""
    for e in (start, end):
        if e.disable_timing:
            raise CUDARuntimeError("cudaErrorInvalidResourceHandle: event created with disable_timing=True")
        if e._op is None or e._op.t is None:
            raise CUDARuntimeError("cudaErrorNotReady: event not completed (synchronize it first)")
    return (end._op.t - start._op.t) * 1e3


# -- device memory ----------------------------------------------------------------------------------
class _Access:
    __slots__ = ("lo", "hi", "kind", "stream", "clock", "site", "what")

    def __init__(self, lo, hi, kind, stream, clock, site, what):
        self.lo, self.hi, self.kind, self.stream, self.clock, self.site, self.what = lo, hi, kind, stream, clock, site, what


class _Alloc:
    """One device allocation: the bytes and the access records with their vector clocks."""

    _n = 0

    def __init__(self, nbytes: int) -> None:
        _Alloc._n += 1
        self.name = f"buffer#{_Alloc._n}"
        self.nbytes = nbytes
        # CuPy's pool hands a freed block to the next allocation of its size made while the same
        # stream is current, without waiting for other streams that still use it: reuse it here too,
        # with its access records, so a use on another stream unordered with the new owner is a race.
        arena = get_current_stream()
        blocks = STATE.free_blocks.get((arena.id, nbytes))
        if blocks:
            self.bytes, self.records, old = blocks.pop()
            self.name += f" (reusing {old}'s memory)"
            STATE.device_cached -= nbytes
        else:
            if STATE.device_used + STATE.device_cached + STATE.others + nbytes > DEVICE_TOTAL:
                STATE.device_cached = 0  # CuPy frees cached blocks and retries before failing
                STATE.free_blocks.clear()
            if STATE.device_used + STATE.others + nbytes > DEVICE_TOTAL:
                raise OutOfMemoryError(nbytes, DEVICE_TOTAL - STATE.device_used - STATE.others)
            self.bytes = np.full(max(nbytes, 1), 0x5A, dtype=np.uint8)  # garbage, as cudaMalloc leaves it
            self.records: list[_Access] = []
        STATE.device_used += nbytes
        STATE.device_peak = max(STATE.device_peak, STATE.device_used)
        weakref.finalize(self, _Alloc._free, STATE.generation, arena.id, nbytes, self.bytes, self.records, self.name)

    @staticmethod
    def _free(generation: int, arena: int, nbytes: int, data: np.ndarray, records: list, name: str) -> None:
        if generation != STATE.generation:  # the stand-in was reset since: its pool and counts are gone
            return
        STATE.device_used -= nbytes
        STATE.device_cached += nbytes  # the pool keeps the block until free_all_blocks()
        STATE.free_blocks.setdefault((arena, nbytes), []).append((data, records, name))

    def access(self, iv, kind, stream, clock, vc, site, what, seen: set[int]) -> None:
        lo, hi = iv
        keep = []
        for r in self.records:
            overlap = r.lo < hi and lo < r.hi
            ordered = r.stream is stream or r.clock <= vc.get(r.stream.id, 0)
            if overlap and not ordered and (kind == "w" or r.kind == "w") and id(r) not in seen:
                seen.add(id(r))
                _report(f"{_kind(r.kind)} of {self.name}[{r.lo}:{r.hi}] by {r.what} on {r.stream!r} at {r.site}\n"
                        f"  is unordered with the {_kind(kind)} of {self.name}[{lo}:{hi}] by {what} on {stream!r} "
                        f"at {site}")
            covered = lo <= r.lo and r.hi <= hi
            if covered and ordered and (kind == "w" or r.kind == kind):
                continue  # superseded: anything later that is ordered after this access is ordered after r
            keep.append(r)
        keep.append(_Access(lo, hi, kind, stream, clock, site, what))
        self.records[:] = keep


def _kind(k: str) -> str:
    return "write" if k == "w" else "read"


class OutOfMemoryError(MemoryError):
    def __init__(self, size: int, free: int) -> None:
        super().__init__(f"Out of memory allocating {size:,} bytes (free {free:,} bytes on the stand-in device)")


class MemoryPool:
    """``cupy.get_default_memory_pool()``: used bytes are live arrays, free bytes cached blocks."""

    def used_bytes(self) -> int:
        return STATE.device_used

    def free_bytes(self) -> int:
        return STATE.device_cached

    def total_bytes(self) -> int:
        return STATE.device_used + STATE.device_cached

    def free_all_blocks(self, stream: Any = None) -> None:
        STATE.device_cached = 0
        STATE.free_blocks.clear()

    def set_limit(self, size: int | None = None, fraction: float | None = None) -> None:
        pass


#: CuPy's pinned pool rounds requests up to this unit (the alignment of ``cudaHostAlloc``)...
PINNED_UNIT = 512


def pinned_block(nbytes: int) -> int:
    """...and then up to a power of two (``internal.clp2``, ``cupy/cuda/pinned_memory.pyx``, CuPy 13/14):
    the bytes a pinned request of ``nbytes`` really holds (0 stays 0)."""
    if nbytes <= 0:
        return 0
    units = -(-nbytes // PINNED_UNIT) * PINNED_UNIT
    return 1 << (units - 1).bit_length()


class PinnedMemoryPool:
    """``cupy.get_default_pinned_memory_pool()``: freed pinned blocks stay pinned until ``free_all_blocks``
    and are handed to the next request of their (rounded) size."""

    def n_free_blocks(self) -> int:
        return sum(STATE.pinned_blocks.values())

    def free_all_blocks(self) -> None:
        with _LOCK:
            STATE.pinned_free = 0
            STATE.pinned_blocks.clear()


_POOL = MemoryPool()
_PINNED_POOL = PinnedMemoryPool()


def get_default_memory_pool() -> MemoryPool:
    return _POOL


def get_default_pinned_memory_pool() -> PinnedMemoryPool:
    return _PINNED_POOL


def pinned_bytes_held() -> int:
    """Pinned host bytes in use plus those the pinned pool keeps."""
    return STATE.pinned_used + STATE.pinned_free


def _addr(a: np.ndarray) -> int:
    return a.__array_interface__["data"][0]


def _host_bounds(a: np.ndarray) -> tuple[int, int]:
    lo = hi = _addr(a)
    for n, st in zip(a.shape, a.strides):
        if n == 0:
            return lo, lo
        if st < 0:
            lo += (n - 1) * st
        else:
            hi += (n - 1) * st
    return lo, hi + a.itemsize


def is_pinned(a: np.ndarray) -> bool:
    lo, hi = _host_bounds(a)
    with _LOCK:
        return any(s <= lo and hi <= e for s, e in STATE.pinned.values())


def empty_pinned(shape, dtype=float, order="C") -> np.ndarray:
    """``cupyx.empty_pinned``: a NumPy array in page-locked memory (filled with NaN: never read it unset)."""
    dtype = np.dtype(dtype)
    n = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    size = pinned_block(n)  # what the pool takes: a cached block of that size, else a new one
    base = np.empty(max(size, 1), dtype=np.uint8)
    key = id(base)
    with _LOCK:
        _take_pinned(size)
        STATE.pinned[key] = (_addr(base), _addr(base) + base.nbytes)
    weakref.finalize(base, _unpin, key, size)
    out = base[:n].view(dtype).reshape(shape, order=order)
    _poison(out)
    return out


def _take_pinned(size: int) -> None:
    """Count a pinned block of ``size`` bytes in use: a cached one of that size, else a new one."""
    if STATE.pinned_blocks.get(size):
        STATE.pinned_blocks[size] -= 1
        STATE.pinned_free -= size
    STATE.pinned_used += size
    STATE.pinned_peak = max(STATE.pinned_peak, STATE.pinned_used + STATE.pinned_free)


def _unpin(key: int, size: int) -> None:
    with _LOCK:
        STATE.pinned.pop(key, None)
        _give_pinned(size)


def _give_pinned(size: int) -> None:
    """A pinned block back to the pool, which keeps it pinned (cached) until ``free_all_blocks``."""
    STATE.pinned_used -= size
    STATE.pinned_free += size
    STATE.pinned_blocks[size] = STATE.pinned_blocks.get(size, 0) + 1


def _poison(a: np.ndarray) -> None:
    if a.dtype.kind in "fc":
        a[...] = np.nan
    else:
        a[...] = np.frombuffer(b"\x5a" * a.itemsize, dtype=a.dtype)[0]


# -- ndarray ----------------------------------------------------------------------------------------
class _Flags:
    def __init__(self, a: np.ndarray) -> None:
        self.c_contiguous = a.flags.c_contiguous
        self.f_contiguous = a.flags.f_contiguous
        self.owndata = False

    def __getitem__(self, key: str) -> bool:
        return {"C_CONTIGUOUS": self.c_contiguous, "F_CONTIGUOUS": self.f_contiguous}[key]


def _is_scalar(x: Any) -> bool:
    return isinstance(x, (int, float, complex, bool, np.generic))


class ndarray:
    """``cupy.ndarray``: a view into a device allocation; contents exist once queued work ran."""

    __array_priority__ = 100

    def __init__(self, shape, dtype=float, *, _alloc: _Alloc | None = None, _view: np.ndarray | None = None,
                 order: str = "C") -> None:
        if _view is None:
            dtype = np.dtype(dtype)
            shape = (shape,) if isinstance(shape, (int, np.integer)) else tuple(int(s) for s in shape)
            n = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
            _alloc = _Alloc(n)
            _view = _alloc.bytes[:n].view(dtype).reshape(shape, order=order)
        self._alloc = _alloc
        self._a = _view

    # views ----------------------------------------------------------------------------------------
    def _wrap(self, v: np.ndarray) -> ndarray:
        return ndarray(None, _alloc=self._alloc, _view=v)

    def _interval(self) -> tuple[int, int]:
        lo, hi = _host_bounds(self._a)
        base = _addr(self._alloc.bytes)
        return lo - base, hi - base

    shape = property(lambda self: self._a.shape)
    dtype = property(lambda self: self._a.dtype)
    ndim = property(lambda self: self._a.ndim)
    size = property(lambda self: self._a.size)
    nbytes = property(lambda self: self._a.nbytes)
    itemsize = property(lambda self: self._a.itemsize)
    strides = property(lambda self: self._a.strides)
    flags = property(lambda self: _Flags(self._a))
    _c_contiguous = property(lambda self: self._a.flags.c_contiguous)
    _f_contiguous = property(lambda self: self._a.flags.f_contiguous)
    T = property(lambda self: self._wrap(self._a.T))

    @property
    def real(self) -> ndarray:
        """As CuPy: a view (of complex data, its real parts; else the array itself)."""
        return self._wrap(self._a.real)

    @property
    def imag(self) -> ndarray:
        """As CuPy: of complex data a view of the imaginary parts; else a new array of zeros."""
        if self.dtype.kind == "c":
            return self._wrap(self._a.imag)
        out = ndarray(self.shape, self.dtype)
        out[...] = 0
        return out

    def __len__(self) -> int:
        return len(self._a)

    def __repr__(self) -> str:
        return f"<stand-in cupy.ndarray {self.shape} {self.dtype} in {self._alloc.name}>"

    def __getitem__(self, key) -> ndarray:
        if _row_index(key):  # x[rows]: a gather kernel into a new array
            return _dense("gather", lambda v, k: v[k], self, key, outs=[((key.shape[0],) + self.shape[1:], self.dtype)])[0]
        if isinstance(key, ndarray) or (isinstance(key, tuple) and any(isinstance(k, ndarray) for k in key)):
            raise NotImplementedError("advanced indexing other than x[rows] is not modelled by the stand-in")
        v = self._a[key]
        if not isinstance(v, np.ndarray):
            raise NotImplementedError("scalar element access syncs the device; the stand-in refuses it")
        return self._wrap(v)

    def __setitem__(self, key, value) -> None:
        if _row_index(key):  # x[rows] = value: a scatter kernel writing (conservatively) all of x
            if not isinstance(value, ndarray):
                raise TypeError(f"Unsupported type {type(value)}: upload host arrays before assigning them")
            dst, k, v = self._a, key._a, value._a
            _enqueue(None, lambda: dst.__setitem__(k, v), [(key, "r"), (value, "r"), (self, "w")], "scatter")
            return
        target = self[key]
        if not (isinstance(value, ndarray) or _is_scalar(value)):
            raise TypeError(f"Unsupported type {type(value)}: upload host arrays before assigning them")
        _elementwise(lambda dst, *src: np.copyto(dst, src[0] if src else value, casting="unsafe"),
                     target, [value] if isinstance(value, ndarray) else [], "setitem")

    def fill(self, value) -> None:
        self[...] = value

    def reshape(self, *shape, order="C") -> ndarray:
        shape = shape[0] if len(shape) == 1 and isinstance(shape[0], (tuple, list)) else shape
        v = self._a.view()
        try:
            v.shape = shape
            return self._wrap(v)
        except AttributeError:
            return self.copy().reshape(shape)

    def ravel(self) -> ndarray:
        return self.reshape(-1) if self._a.flags.c_contiguous else self.copy().reshape(-1)

    def view(self, dtype=None) -> ndarray:
        return self._wrap(self._a.view() if dtype is None else self._a.view(dtype))

    def copy(self, order="C") -> ndarray:
        out = ndarray(self.shape, self.dtype, order=order)
        _elementwise(lambda dst, src: np.copyto(dst, src), out, [self], "copy")
        return out

    def astype(self, dtype, order="K", casting=None, subok=None, copy=True) -> ndarray:
        if not copy and np.dtype(dtype) == self.dtype:
            return self
        if self.dtype.kind == "c" and np.dtype(dtype).kind != "c":
            # as CuPy does, at the call (the copy itself runs later, on its stream)
            warnings.warn("Casting complex values to real discards the imaginary part", np.exceptions.ComplexWarning,
                          stacklevel=2)
        out = ndarray(self.shape, dtype)
        _elementwise(lambda dst, src: np.copyto(dst, src, casting="unsafe"), out, [self], "astype")
        return out

    def __array__(self, *args, **kwargs):
        raise TypeError("Implicit conversion to a NumPy array is not allowed. Please use `.get()` to construct "
                        "a NumPy array explicitly.")

    def __float__(self):
        raise TypeError("the stand-in refuses implicit device-to-host conversion (float()): use get()")

    __int__ = __bool__ = __index__ = __float__

    # copies -----------------------------------------------------------------------------------------
    def set(self, arr, stream: Stream | None = None) -> None:
        if not isinstance(arr, np.ndarray):
            raise TypeError("Only numpy.ndarray can be set to cupy.ndarray")
        if self.dtype != arr.dtype:
            raise TypeError(f"{arr.dtype} array cannot be set to {self.dtype} array")
        if self.shape != arr.shape:
            raise ValueError(f"Shape mismatch. Old shape: {self.shape}, new shape: {arr.shape}")
        if self._c_contiguous:
            src = np.ascontiguousarray(arr)
        elif self._f_contiguous:
            src = np.asfortranarray(arr)
        else:
            raise RuntimeError("Cannot set to non-contiguous array")
        sync = stream is None and get_current_stream().is_null
        pinned = np.shares_memory(src, arr) and is_pinned(arr) and not sync
        snapshot = src.copy(order="A")  # pageable memory is staged at the call
        dst = self._a
        site = _site()

        def run():
            if pinned:
                if src.tobytes() != snapshot.tobytes():
                    _report(f"host wrote pinned buffer {arr.shape} {arr.dtype} after the upload at {site} was queued "
                            f"and before it ran (wait for the upload's event before refilling it)")
                np.copyto(dst, src)  # the copy sees what is in the buffer when it runs
            else:
                np.copyto(dst, snapshot)

        op = _enqueue(stream, run, [(self, "w")], "h2d copy")
        if sync:
            _wait(get_current_stream(), op)

    def get(self, stream: Stream | None = None, order: str = "C", out: np.ndarray | None = None,
            blocking: bool = True) -> np.ndarray:
        src = self
        if out is not None:
            if not isinstance(out, np.ndarray):
                raise TypeError("Only numpy.ndarray can be obtained from cupy.ndarray")
            if self.dtype != out.dtype:
                raise TypeError(f"{out.dtype} array cannot be obtained from {self.dtype} array")
            if self.shape != out.shape:
                raise ValueError(f"Shape mismatch. Expected shape: {self.shape}, actual shape: {out.shape}")
            if not (out.flags.c_contiguous and self._c_contiguous or out.flags.f_contiguous and self._f_contiguous):
                if out.flags.c_contiguous:
                    src = ascontiguousarray(self)  # on the current stream, as CuPy does
                elif out.flags.f_contiguous:
                    src = asfortranarray(self)
                else:
                    raise RuntimeError("`out` cannot be specified when copying to non-contiguous ndarray")
            host = out
        else:
            order = "F" if order.upper() == "A" and self._f_contiguous else order.upper()
            if not (order == "C" and self._c_contiguous or order == "F" and self._f_contiguous):
                src = ascontiguousarray(self) if order == "C" else asfortranarray(self)
            host = np.empty(self.shape, dtype=self.dtype, order=order)
        s = stream or get_current_stream()
        pinned = is_pinned(host)
        if pinned:
            _poison(host)  # until the copy runs the host sees garbage
        srcv = src._a
        op = _enqueue(s, lambda: np.copyto(host, srcv), [(src, "r")], "d2h copy")
        # Pageable destinations and the legacy stream make the copy synchronous; blocking=True waits.
        if blocking:
            s.synchronize()
        elif not pinned or s.is_null:
            _wait(s, op)
        return host


def _row_index(key: Any) -> bool:
    """A 1-D integer device array used as a row index (``x[rows]``), the one advanced index modelled."""
    return isinstance(key, ndarray) and key.ndim == 1 and np.issubdtype(key.dtype, np.integer)


def _operand(x: Any) -> Any:
    if isinstance(x, np.ndarray) and x.ndim > 0:
        raise TypeError(f"Unsupported type {type(x)}: mix of numpy.ndarray and cupy.ndarray (upload it first)")
    return x


def _elementwise(fn, out: ndarray, inputs: list[ndarray], what: str) -> ndarray:
    dst = out._a
    srcs = [x._a for x in inputs]
    _enqueue(None, lambda: fn(dst, *srcs), [(x, "r") for x in inputs] + [(out, "w")], what)
    return out


def _binary(ufunc, a: ndarray, b: Any, out: ndarray | None = None) -> ndarray:
    b = _operand(b)
    if isinstance(b, ndarray):
        dtype = np.result_type(a.dtype, b.dtype)
        ins = [a, b]
        fn = lambda dst, x, y: ufunc(x, y, out=dst, casting="unsafe")  # noqa: E731
    else:
        dtype = np.result_type(a.dtype, np.asarray(b).dtype) if isinstance(b, np.generic) else \
            np.result_type(a._a[:0], b)
        ins = [a]
        fn = lambda dst, x: ufunc(x, b, out=dst, casting="unsafe")  # noqa: E731
    if out is None:
        out = ndarray(np.broadcast_shapes(a.shape, b.shape if isinstance(b, ndarray) else ()), dtype)
    elif isinstance(b, ndarray) and np.broadcast_shapes(a.shape, b.shape) != out.shape:
        raise ValueError(f"operands could not be broadcast together with shapes {a.shape} {b.shape}")
    return _elementwise(fn, out, ins, ufunc.__name__)


def _rbinary(ufunc, a: ndarray, b: Any) -> ndarray:
    b = _operand(b)
    out = ndarray(a.shape, np.result_type(a._a[:0], b))
    return _elementwise(lambda dst, x: ufunc(b, x, out=dst, casting="unsafe"), out, [a], ufunc.__name__)


for _name, _uf in (("add", np.add), ("sub", np.subtract), ("mul", np.multiply), ("truediv", np.true_divide)):
    setattr(ndarray, f"__{_name}__", lambda self, other, _uf=_uf: _binary(_uf, self, other))
    setattr(ndarray, f"__i{_name}__", lambda self, other, _uf=_uf: _binary(_uf, self, other, out=self))
    setattr(ndarray, f"__r{_name}__", lambda self, other, _uf=_uf: _rbinary(_uf, self, other))
ndarray.__matmul__ = lambda self, other: matmul(self, other)
ndarray.__neg__ = lambda self: _rbinary(np.multiply, self, -1)


def _conj(self: ndarray) -> ndarray:
    """``x.conj()``: ``x`` itself for real data (as CuPy), else a kernel into a new array of ``x``'s layout."""
    if self.dtype.kind != "c":
        return self
    fortran = self._a.flags.f_contiguous and not self._a.flags.c_contiguous
    out = ndarray(self.shape, self.dtype, order="F" if fortran else "C")
    return _elementwise(lambda dst, src: np.conjugate(src, out=dst), out, [self], "conj")


ndarray.conj = ndarray.conjugate = _conj


# -- creation and conversion --------------------------------------------------------------------------
def empty(shape, dtype=float, order="C") -> ndarray:
    return ndarray(shape, dtype, order=order)


def zeros(shape, dtype=float, order="C") -> ndarray:
    out = ndarray(shape, dtype, order=order)
    out.fill(0)
    return out


def full(shape, fill_value, dtype=None, order="C") -> ndarray:
    out = ndarray(shape, dtype if dtype is not None else np.asarray(fill_value).dtype, order=order)
    out.fill(fill_value)
    return out


def eye(n: int, m: int | None = None, k: int = 0, dtype=float) -> ndarray:
    out = zeros((n, n if m is None else m), dtype)
    _elementwise(lambda dst: np.fill_diagonal(dst[:, k:] if k >= 0 else dst[-k:], 1), out, [], "eye")
    return out


def asarray(a, dtype=None, order=None, *, blocking: bool = False) -> ndarray:
    """Host arrays are staged through pinned memory at the call and copied on the current stream."""
    if isinstance(a, ndarray):
        return a if dtype is None or np.dtype(dtype) == a.dtype else a.astype(dtype)
    if isinstance(a, np.ndarray) and is_pinned(a) and (dtype is None or np.dtype(dtype) == a.dtype):
        out = ndarray(a.shape, a.dtype)  # from pinned memory CuPy copies directly: read when the copy runs
        out.set(np.ascontiguousarray(a), stream=None if blocking else get_current_stream())
        if blocking:
            get_current_stream().synchronize()
        return out
    host = np.array(a, dtype=dtype, order="F" if order == "F" else "C", copy=True)
    out = ndarray(host.shape, host.dtype, order="F" if order == "F" else "C")
    # CuPy copies pageable data through a staging block of the pinned pool, returned to the pool
    # (still pinned) once the copy ran: it stays cached until free_all_blocks()
    with _LOCK:
        STATE.count("asarray pinned staging")
        _take_pinned(pinned_block(host.nbytes))
        _give_pinned(pinned_block(host.nbytes))
    op = _enqueue(None, lambda: np.copyto(out._a, host), [(out, "w")], "h2d copy (asarray)")
    if blocking:
        _wait(get_current_stream(), op)
    return out


array = asarray


def ascontiguousarray(a: ndarray, dtype=None) -> ndarray:
    if a._c_contiguous and (dtype is None or np.dtype(dtype) == a.dtype):
        return a
    out = ndarray(a.shape, dtype or a.dtype)
    return _elementwise(lambda dst, src: np.copyto(dst, src, casting="unsafe"), out, [a], "ascontiguousarray")


def asfortranarray(a: ndarray) -> ndarray:
    if a._f_contiguous:
        return a
    out = ndarray(a.shape, a.dtype, order="F")
    return _elementwise(lambda dst, src: np.copyto(dst, src), out, [a], "asfortranarray")


def asnumpy(a, stream=None, order="C", out=None, *, blocking=True) -> np.ndarray:
    return a.get(stream=stream, order=order, out=out, blocking=blocking) if isinstance(a, ndarray) else np.asarray(a)


def _require(*arrays: Any) -> None:
    for x in arrays:
        if not isinstance(x, ndarray):
            raise TypeError(f"Unsupported type {type(x)}")


def matmul(a: ndarray, b: ndarray, out: ndarray | None = None) -> ndarray:
    _require(a, b)
    dtype = np.result_type(a.dtype, b.dtype)
    shape = np.matmul(np.empty(a.shape, np.int8), np.empty(b.shape, np.int8)).shape
    if out is None:
        out = ndarray(shape, dtype)
    precision = "tf32" if dtype == np.float32 and os.environ.get("CUPY_TF32", "0") != "0" else None
    return _elementwise(lambda dst, x, y: np.copyto(dst, _round_tf32(x, precision) @ _round_tf32(y, precision),
                                                    casting="unsafe"), out, [a, b], "matmul")


def _round_tf32(x: np.ndarray, mode: str | None) -> np.ndarray:
    """TF32 keeps 10 mantissa bits: round float32 inputs so results differ from float32 as on a GPU."""
    if mode != "tf32" or x.dtype != np.float32:
        return x
    bits = np.ascontiguousarray(x).view(np.uint32)
    return ((bits + np.uint32(0x1000)) & np.uint32(0xFFFFE000)).view(np.float32)


# -- cuBLAS -------------------------------------------------------------------------------------------
def _trans(t: Any) -> int:
    if t in ("N", 0):
        return 0
    if t in ("T", 1):
        return 1
    if t in ("H", 2):
        return 2
    raise TypeError(f"invalid trans (actual: {t})")


def _op(x: np.ndarray, t: int) -> np.ndarray:
    return x if t == 0 else (x.T if t == 1 else x.conj().T)


def gemm(transa, transb, a: ndarray, b: ndarray, out: ndarray | None = None, alpha=1.0, beta=0.0) -> ndarray:
    """``cupy.cublas.gemm``: cublas<t>gemm on the current stream, with CuPy's assertions."""
    _require(a, b)
    assert a.ndim == b.ndim == 2
    assert a.dtype == b.dtype
    if a.dtype.char not in "fdFD":
        raise TypeError("invalid dtype")
    ta, tb = _trans(transa), _trans(transb)
    m, k = a.shape if ta == 0 else a.shape[::-1]
    if tb == 0:
        n = b.shape[1]
        assert b.shape[0] == k
    else:
        n = b.shape[0]
        assert b.shape[1] == k
    if out is None:
        out = ndarray((m, n), a.dtype, order="F")
        beta = 0.0
    else:
        _require(out)
        assert out.ndim == 2
        assert out.shape == (m, n)
        assert out.dtype == a.dtype
    mode = "tf32" if STATE.math_mode == CUBLAS_TF32_TENSOR_OP_MATH else None
    STATE.count(f"cublas.gemm {a.dtype.name}")  # which precision the products ran in
    if mode and a.dtype == np.float32:
        STATE.count("cublas.gemm tf32")
    dt = a.dtype.type

    def run(dst, x, y):
        if dt is np.float32:  # what the operands held: 16-bit values rounded by the caller (precision="fp16"/"bf16")
            for fmt in _half_formats(x, y):
                STATE.count(f"cublas.gemm {fmt} inputs")
        prod = _round_tf32(_op(x, ta), mode) @ _round_tf32(_op(y, tb), mode)
        if beta == 0:
            dst[...] = dt(alpha) * prod  # beta == 0: C is not read (cuBLAS semantics)
        else:
            dst[...] = dt(alpha) * prod + dt(beta) * dst

    ins = [a, b] + ([out] if beta != 0 else [])
    _enqueue(None, lambda: run(out._a, a._a, b._a), [(x, "r") for x in ins] + [(out, "w")], "cublas.gemm")
    return out


def _half_formats(*xs: np.ndarray) -> list[str]:
    """The 16-bit formats every float32 operand is exactly representable in (``"float16"`` first, then
    ``"bfloat16"``: 8 significand bits, float32's exponent range), for the GEMM counts by input format."""
    with np.errstate(over="ignore"):
        fp16 = all(np.array_equal(x.astype(np.float16).astype(np.float32), x) for x in xs)
    bf16 = all(not (np.ascontiguousarray(x).view(np.uint32) & np.uint32(0xFFFF)).any() for x in xs)
    return (["float16"] if fp16 else []) + (["bfloat16"] if bf16 else [])


def syrk(trans, a: ndarray, out: ndarray | None = None, alpha=1.0, beta=0.0, lower=False) -> ndarray:
    """``cupy.cublas.syrk``: only the ``lower`` (or upper) triangle of ``out`` is written."""
    _require(a)
    assert a.ndim == 2
    if a.dtype.char not in "fdFD":
        raise TypeError("invalid dtype")
    t = _trans(trans)
    n, k = a.shape if t == 0 else a.shape[::-1]
    if out is None:
        out = zeros((n, n), a.dtype, order="F")
        beta = 0.0
    else:
        _require(out)
        assert out.ndim == 2
        assert out.shape == (n, n)
        assert out.dtype == a.dtype
    dt = a.dtype.type

    def run(dst, x):
        x = x if t == 0 else x.T
        full_ = dt(alpha) * (x @ x.T) + (dt(beta) * dst if beta != 0 else 0)
        idx = np.tril_indices(n) if lower else np.triu_indices(n)
        dst[idx] = full_[idx]

    _enqueue(None, lambda: run(out._a, a._a), [(a, "r"), (out, "r"), (out, "w")], "cublas.syrk")
    return out


CUBLAS_DEFAULT_MATH = 0
CUBLAS_TENSOR_OP_MATH = 1
CUBLAS_PEDANTIC_MATH = 2
CUBLAS_TF32_TENSOR_OP_MATH = 3


def getMathMode(handle: int) -> int:
    return STATE.math_mode


def setMathMode(handle: int, mode: int) -> None:
    STATE.math_mode = int(mode)


def get_cublas_handle() -> int:
    return 0xC0B1A5


# -- dense linear algebra (cuSOLVER and friends) ------------------------------------------------------
def _dense(name: str, fn, *arrays: ndarray, outs: list[tuple[tuple[int, ...], Any]]) -> list[ndarray]:
    _require(*arrays)
    res = [ndarray(s, d) for s, d in outs]

    def run():
        values = fn(*[x._a for x in arrays])
        values = values if isinstance(values, tuple) else (values,)
        for r, v in zip(res, values):
            np.copyto(r._a, v, casting="unsafe")

    _enqueue(None, run, [(x, "r") for x in arrays] + [(r, "w") for r in res], name)
    return res


def _linalg_dtype(a: ndarray) -> np.dtype:
    if a.dtype.char not in "fdFD":
        raise TypeError(f"dtype {a.dtype} is not supported (float32/float64/complex only)")
    return a.dtype


def _checked(name: str, fn, a: ndarray, garbage) -> ndarray:
    """cuSOLVER reports failure in devInfo; CuPy raises only under ``cupyx.errstate(linalg='raise')``
    (which synchronizes). Otherwise the result is finite garbage, as a partial factorization leaves."""
    failed = []

    def run(x):
        try:
            return fn(x)
        except np.linalg.LinAlgError:
            failed.append(True)
            return garbage(x)

    out = _dense(name, run, a, outs=[(a.shape, _linalg_dtype(a))])[0]
    if STATE.linalg == "raise":
        get_current_stream().synchronize()
        if failed:
            raise np.linalg.LinAlgError(f"Error reported by {name} in cuSOLVER. devInfo = 1.")
    return out


def _cholesky(a: ndarray) -> ndarray:
    return _checked("linalg.cholesky", np.linalg.cholesky, a, lambda x: np.tril(x))


@contextlib.contextmanager
def errstate(*, linalg: str | None = None):
    """``cupyx.errstate``: ``linalg='raise'`` makes cuSOLVER failures raise (after a synchronization)."""
    prev = STATE.linalg
    STATE.linalg = linalg or prev
    try:
        yield
    finally:
        STATE.linalg = prev


def _qr(a: ndarray, mode: str = "reduced"):
    dt = _linalg_dtype(a)
    m, n = a.shape
    k = min(m, n)
    if mode == "r":
        return _dense("linalg.qr", lambda x: np.linalg.qr(x, mode="r"), a, outs=[((k, n), dt)])[0]
    q, r = _dense("linalg.qr", lambda x: np.linalg.qr(x, mode="reduced"), a, outs=[((m, k), dt), ((k, n), dt)])
    return q, r


def _svd(a: ndarray, full_matrices: bool = True, compute_uv: bool = True):
    dt = _linalg_dtype(a)
    m, n = a.shape
    k = min(m, n)
    if not compute_uv:
        return _dense("linalg.svd", lambda x: np.linalg.svd(x, compute_uv=False), a, outs=[((k,), dt)])[0]
    shapes = [((m, m if full_matrices else k), dt), ((k,), np.dtype(dt.char.lower())), ((n if full_matrices else k, n), dt)]
    return tuple(_dense("linalg.svd", lambda x: np.linalg.svd(x, full_matrices=full_matrices), a, outs=shapes))


def _eigh(a: ndarray, UPLO: str = "L"):
    dt = _linalg_dtype(a)
    n = a.shape[0]
    return tuple(_dense("linalg.eigh", lambda x: np.linalg.eigh(x, UPLO=UPLO), a,
                        outs=[((n,), np.dtype(dt.char.lower())), ((n, n), dt)]))


def _inv(a: ndarray) -> ndarray:
    return _checked("linalg.inv", np.linalg.inv, a, lambda x: np.zeros_like(x))


def _solve(a: ndarray, b: ndarray) -> ndarray:
    dt = np.result_type(_linalg_dtype(a), b.dtype)
    return _dense("linalg.solve", np.linalg.solve, a, b, outs=[(b.shape, dt)])[0]


def _norm(x: ndarray, ord=None) -> ndarray:
    return _dense("linalg.norm", lambda v: np.linalg.norm(v, ord), x, outs=[((), np.dtype(x.dtype.char.lower()))])[0]


def solve_triangular(a: ndarray, b: ndarray, trans=0, lower=False, unit_diagonal=False, overwrite_b=False,
                     check_finite=False) -> ndarray:
    """``cupyx.scipy.linalg.solve_triangular`` (cuBLAS TRSM)."""
    import scipy.linalg

    dt = np.result_type(_linalg_dtype(a), b.dtype)
    return _dense("trsm", lambda x, y: scipy.linalg.solve_triangular(x, y, trans=trans, lower=lower,
                                                                     unit_diagonal=unit_diagonal), a, b,
                  outs=[(b.shape, dt)])[0]


def _sum(x: ndarray, axis=None) -> ndarray:
    shape = np.sum(np.empty(x.shape, np.int8), axis=axis).shape
    return _dense("sum", lambda v: np.sum(v, axis=axis), x, outs=[(shape, x.dtype)])[0]


ndarray.sum = lambda self, axis=None: _sum(self, axis)


def concatenate(arrays: list, axis: int = 0) -> ndarray:
    _require(*arrays)
    shape = np.concatenate([np.empty(x.shape, np.int8) for x in arrays], axis=axis).shape
    dt = np.result_type(*[x.dtype for x in arrays])
    return _dense("concatenate", lambda *v: np.concatenate(v, axis=axis), *arrays, outs=[(shape, dt)])[0]


def isfinite(x: ndarray) -> ndarray:
    return _dense("isfinite", np.isfinite, x, outs=[(x.shape, np.dtype(bool))])[0]


ndarray.all = lambda self: _dense("all", lambda v: np.all(v), self, outs=[((), np.dtype(bool))])[0]


def tril(x: ndarray, k: int = 0) -> ndarray:
    return _dense("tril", lambda v: np.tril(v, k), x, outs=[(x.shape, x.dtype)])[0]


def triu(x: ndarray, k: int = 0) -> ndarray:
    return _dense("triu", lambda v: np.triu(v, k), x, outs=[(x.shape, x.dtype)])[0]


# -- runtime / device ------------------------------------------------------------------------------
class Device:
    """``cupy.cuda.Device``: ``Device()`` is this thread's current device; ``use()`` makes it current.

    Several devices (``STATE.device_count``) share one model of memory and streams: enough to test
    which device each thread selects, not transfers between devices.
    """

    def __init__(self, device: int | None = None) -> None:
        if device is None:
            device = _get_device()
        if not 0 <= int(device) < STATE.device_count:
            raise CUDARuntimeError(f"cudaErrorInvalidDevice: invalid device ordinal {device}")
        self.id = int(device)
        self.compute_capability = "90"

    def synchronize(self) -> None:
        synchronize_all()

    @property
    def mem_info(self) -> tuple[int, int]:
        return _mem_get_info()

    def use(self) -> None:
        STATE.local.device = self.id

    def __enter__(self):
        self._prev = _get_device()
        self.use()
        return self

    def __exit__(self, *exc):
        STATE.local.device = self._prev


def _mem_get_info() -> tuple[int, int]:
    """(free, total): the pool's cached blocks count as used, as ``cudaMemGetInfo`` sees them."""
    held = STATE.device_used + STATE.device_cached + STATE.others
    return DEVICE_TOTAL - held, DEVICE_TOTAL


def _device_count() -> int:
    return STATE.device_count


def _get_device() -> int:
    return getattr(STATE.local, "device", 0)


def _module(name: str, **attrs: Any) -> types.ModuleType:
    m = types.ModuleType(name)
    m.__dict__.update(attrs)
    m.__file__ = _THIS
    return m


def build() -> dict[str, types.ModuleType]:
    """The ``cupy``/``cupyx`` module tree as ``sys.modules`` entries."""
    Stream.null = STATE.legacy
    runtime = _module("cupy.cuda.runtime", getDeviceCount=_device_count, getDevice=_get_device,
                      memGetInfo=_mem_get_info, CUDARuntimeError=CUDARuntimeError,
                      deviceSynchronize=synchronize_all)
    cublas_lib = _module("cupy.cuda.cublas", getMathMode=getMathMode, setMathMode=setMathMode,
                         CUBLAS_DEFAULT_MATH=CUBLAS_DEFAULT_MATH, CUBLAS_TENSOR_OP_MATH=CUBLAS_TENSOR_OP_MATH,
                         CUBLAS_PEDANTIC_MATH=CUBLAS_PEDANTIC_MATH,
                         CUBLAS_TF32_TENSOR_OP_MATH=CUBLAS_TF32_TENSOR_OP_MATH)
    device_mod = _module("cupy.cuda.device", get_cublas_handle=get_cublas_handle, Device=Device)
    cuda = _module("cupy.cuda", Stream=Stream, Event=Event, Device=Device, runtime=runtime, cublas=cublas_lib,
                   device=device_mod, get_current_stream=get_current_stream, get_elapsed_time=get_elapsed_time,
                   MemoryPool=MemoryPool, PinnedMemoryPool=PinnedMemoryPool, is_available=lambda: True,
                   memory=_module("cupy.cuda.memory", OutOfMemoryError=OutOfMemoryError))
    cublas = _module("cupy.cublas", gemm=gemm, syrk=syrk)
    linalg = _module("cupy.linalg", cholesky=_cholesky, qr=_qr, svd=_svd, eigh=_eigh, inv=_inv, solve=_solve,
                     norm=_norm)
    cupy = _module("cupy", __version__="13.99.0+standin", ndarray=ndarray, cuda=cuda, cublas=cublas,
                   linalg=linalg, empty=empty, zeros=zeros, full=full, eye=eye, asarray=asarray, array=array,
                   ascontiguousarray=ascontiguousarray, asfortranarray=asfortranarray, asnumpy=asnumpy,
                   matmul=matmul, tril=tril, triu=triu, isfinite=isfinite, concatenate=concatenate, float32=np.float32, float64=np.float64,
                   get_default_memory_pool=get_default_memory_pool,
                   get_default_pinned_memory_pool=get_default_pinned_memory_pool, STANDIN=True)
    sp_linalg = _module("cupyx.scipy.linalg", solve_triangular=solve_triangular)
    scipy_ = _module("cupyx.scipy", linalg=sp_linalg)
    cupyx = _module("cupyx", empty_pinned=empty_pinned, scipy=scipy_, errstate=errstate)
    libs = _module("cupy_backends.cuda.libs", cublas=cublas_lib)
    backends_cuda = _module("cupy_backends.cuda", libs=libs)
    backends = _module("cupy_backends", cuda=backends_cuda)
    return {"cupy_backends": backends, "cupy_backends.cuda": backends_cuda, "cupy_backends.cuda.libs": libs,
            "cupy_backends.cuda.libs.cublas": cublas_lib,
            "cupy": cupy, "cupy.cuda": cuda, "cupy.cuda.runtime": runtime, "cupy.cuda.cublas": cublas_lib,
            "cupy.cuda.device": device_mod, "cupy.cublas": cublas, "cupy.linalg": linalg, "cupyx": cupyx,
            "cupyx.scipy": scipy_, "cupyx.scipy.linalg": sp_linalg}


_saved: dict[str, Any] = {}


def install() -> None:
    """Reset the stand-in and make ``import cupy`` / ``import cupyx`` return it."""
    STATE.reset()
    for name, mod in build().items():
        _saved.setdefault(name, sys.modules.get(name))
        sys.modules[name] = mod
    _reset_blocklin()


def uninstall() -> None:
    for name, mod in _saved.items():
        if mod is None:
            sys.modules.pop(name, None)
        else:
            sys.modules[name] = mod
    _saved.clear()
    _reset_blocklin()


def _reset_blocklin() -> None:
    """Forget cached device probes and per-thread CUDA devices."""
    from blocklin.device import select

    select.gpu_available.cache_clear()
    cuda_mod = sys.modules.get("blocklin.device.cuda")
    if cuda_mod is not None:
        reset = getattr(cuda_mod.CudaDevice, "reset", None)
        reset() if reset else cuda_mod.CudaDevice._instances.clear()


@contextlib.contextmanager
def installed():
    install()
    try:
        yield STATE
    finally:
        uninstall()
