"""Strips mapped from the page cache: a row range of local uncompressed chunk files as one read-only
array, without a copy.

A row pass copies each strip from the page cache into a slot (``preadv``) and its kernel then reads the
slot: every byte crosses memory twice more. Mapped instead, the kernel reads the page cache itself. On
the 2-core machine (``benchmarks/feed.py``, every byte of 1 GiB of 8 MiB chunk files summed by two
threads) the mapped sum ran at 32.3 GB/s against 21.6 for copy-then-sum, but only while the kernel
held the files in 2 MiB pages, as it does for files it has just written (large folios, mapped by PMD
entries). Read back after an eviction they come in small pages, and the mapped sum fell to 12.9
against 16.2: every 4 KiB page then costs a mapping entry, a fault and a TLB miss. So a pass maps an
input only where a probe (:func:`large_pages`) finds its first chunk file mapped in 2 MiB pages;
everywhere else it copies, as before. Mapped or copied, the kernel sees the same bytes: the bits of
every result are the same either way.

The strips of several chunks are made contiguous by mapping each chunk file's range at its place in
one reserved address range (``MAP_FIXED``), which needs chunks of a whole number of pages. The
mappings are populated by the loader thread that asks for them (``MAP_POPULATE``), so a cold read
waits there, not in the kernel. A mapped strip is read-only: a kernel that wrote into its input
strip would fail loudly. A chunk file truncated by another process while it is mapped ends the
process (``SIGBUS``); blocklin, like zarr's ``LocalStore``, replaces chunk files by renaming, which
leaves a mapping intact.

Linux with glibc only (:data:`AVAILABLE`); elsewhere nothing is mapped.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import mmap
import os
import sys
import threading
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

PAGE = mmap.PAGESIZE
#: The size of the pages the probe looks for (x86-64's and arm64's PMD size with 4 KiB pages).
LARGE_PAGE = 2 << 20

_PROT_NONE = 0
_MAP_FIXED = 0x10
_MAP_ANONYMOUS = getattr(mmap, "MAP_ANONYMOUS", 0x20)
_MAP_NORESERVE = 0x4000
_MAP_POPULATE = getattr(mmap, "MAP_POPULATE", 0x8000)


def _libc() -> Any:
    if not sys.platform.startswith("linux"):
        return None
    try:
        lib = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        lib.mmap.restype = ctypes.c_void_p
        lib.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int,
                             ctypes.c_int64]
        lib.munmap.restype = ctypes.c_int
        lib.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        return lib
    except (OSError, AttributeError):
        return None


_LIBC = _libc()
#: Whether strips can be mapped here (Linux, a C library with ``mmap``, 64-bit offsets).
AVAILABLE = _LIBC is not None and ctypes.sizeof(ctypes.c_void_p) == 8
_FAILED = ctypes.c_void_p(-1).value


def _mmap(addr: int | None, length: int, prot: int, flags: int, fd: int, offset: int) -> int:
    got = _LIBC.mmap(addr, length, prot, flags, fd, offset)
    if got is None or got == _FAILED:
        err = ctypes.get_errno()
        raise OSError(err, f"mmap: {os.strerror(err)}")
    return int(got)


class StripRegion:
    """An address range reserved for the strips mapped into it in turn (a task's slot holds one strip
    at a time), unmapped when the region and the last array over it go.

    Each strip's file ranges are mapped over the previous strip's (``MAP_FIXED`` replaces a mapping in
    one call). A strip mapped into a fresh range and unmapped after took three calls that each hold
    the process's mapping lock, against the other threads' mappings and faults, and the unmap's TLB
    shootdown fell on the kernel's thread. As with a slot, an array of an earlier strip then shows
    the later one: a kernel keeps no strip past its call.
    """

    def __init__(self, capacity: int) -> None:
        self.capacity = -(-int(capacity) // PAGE) * PAGE
        self._length = self.capacity + LARGE_PAGE  # room to place a strip on a 2 MiB boundary
        self._base = _mmap(None, self._length, _PROT_NONE, mmap.MAP_PRIVATE | _MAP_ANONYMOUS | _MAP_NORESERVE,
                           -1, 0)

    def __del__(self) -> None:
        if getattr(self, "_length", 0) and _LIBC is not None:
            _LIBC.munmap(self._base, self._length)
            self._length = 0

    def map(self, ranges: Sequence[tuple[str, int, int]], skip: int, shape: tuple[int, ...], dtype: Any,
            short: Callable[[str, int], Exception]) -> np.ndarray | None:
        """The read-only array of ``shape`` that starts ``skip`` bytes into the file ranges ``(path,
        offset, length)`` laid side by side here (each offset and every length but the last a whole
        number of pages, their pages within :attr:`capacity`).

        None where a file is missing (the caller fills the fill value); ``short(path, size)`` is raised
        for a file that ends before its range does (a mapped page past the end of a file is a
        ``SIGBUS``). The ranges start where the first one's file offset is aligned as in the file,
        modulo :data:`LARGE_PAGE`, so that pages the kernel holds as 2 MiB ones can be mapped as such.
        """
        spans = [-(-length // PAGE) * PAGE for _, _, length in ranges]
        if sum(spans) > self.capacity:
            raise ValueError(f"a strip of {sum(spans)} bytes in a region of {self.capacity}")
        lead = ranges[0][1] % LARGE_PAGE if ranges else 0
        base = self._base + (lead - self._base) % LARGE_PAGE
        at = base
        for (path, offset, length), span in zip(ranges, spans):
            try:
                fd = os.open(path, os.O_RDONLY)
            except FileNotFoundError:
                if at > base:  # the files mapped so far go: the caller reads the strip into its slot
                    _mmap(base, at - base, _PROT_NONE, mmap.MAP_PRIVATE | _MAP_ANONYMOUS | _MAP_NORESERVE | _MAP_FIXED,
                          -1, 0)
                return None
            try:
                size = os.fstat(fd).st_size
                if size < offset + length:
                    raise short(path, size)
                _mmap(at, span, mmap.PROT_READ, mmap.MAP_SHARED | _MAP_FIXED | _MAP_POPULATE, fd, offset)
            finally:
                os.close(fd)
            at += span
        return np.asarray(_View(self, base + skip, shape, dtype))


class _View:
    """What a mapped strip's array is made from: its address and shape, and its region (kept alive)."""

    def __init__(self, region: StripRegion, data: int, shape: tuple[int, ...], dtype: Any) -> None:
        self.region = region
        self.__array_interface__ = {"data": (data, True), "shape": tuple(shape),
                                    "typestr": np.dtype(dtype).str, "version": 3}


def map_ranges(ranges: Sequence[tuple[str, int, int]], skip: int, shape: tuple[int, ...], dtype: Any,
               short: Callable[[str, int], Exception]) -> np.ndarray | None:
    """:meth:`StripRegion.map` into a region of its own (unmapped when the array goes)."""
    return StripRegion(sum(-(-length // PAGE) * PAGE for _, _, length in ranges)).map(ranges, skip, shape, dtype,
                                                                                     short)


_probe_lock = threading.Lock()


def pmd_mapped_kib() -> int | None:
    """The file pages this process maps 2 MiB at a time, in KiB (``FilePmdMapped`` of
    ``/proc/self/smaps_rollup``); None where that is not reported."""
    try:
        with open("/proc/self/smaps_rollup") as f:
            for line in f:
                if line.startswith("FilePmdMapped:"):
                    return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return None


#: Where a pass may map its strips, the share of its budget (one in this many bytes) that its plan may
#: set aside for their large pages (:func:`reservation`): at most a fifth, so from 50 MiB with two
#: tasks, 30 MiB with one. ``benchmarks/feed.py``'s later pass over 1 GiB on the 2-core machine (medians
#: of 3 alternated runs, docs/benchmarks.md "Mapped strips from a sixteenth of the operand"): at 64 MiB
#: (10 MiB set aside, 16%; the strips stay one 8 MiB chunk) 6.82 GB/s mapped against 1.87 copied, at
#: 51.2 MiB (20%: strips of 1757 rows mapped against 2048 copied) 5.63 against 1.88.
RESERVE_SHARE = 5


def reservation(tasks: int) -> int:
    """The memory the large pages of a pass's mapped strips may take beyond their bytes, with ``tasks``
    concurrent tasks: ``(2 tasks + 1) x 2 MiB``.

    Mapped pages are resident while mapped, 2 MiB at a time: a task's mapped strip can hold up to one
    large page more at each end than its bytes, and the probe (:func:`large_pages`) maps one. A plan
    that may map sets this aside from the budget its strips are sized from
    (:func:`blocklin.plan.passes.plan_pass`, ``mapped``) where it is at most a :data:`RESERVE_SHARE`-th of
    the budget (:func:`worth_reserving`); below, its strips are copied."""
    return (2 * max(1, int(tasks)) + 1) * LARGE_PAGE


def worth_reserving(budget: int, tasks: int) -> bool:
    """Whether a pass of ``tasks`` concurrent tasks under ``budget`` bytes sets :func:`reservation` aside
    for mapped strips: where it is at most a :data:`RESERVE_SHARE`-th of the budget."""
    return reservation(tasks) * RESERVE_SHARE <= budget


def within_budget(budget: int, tasks: int) -> bool:
    """Whether a pass of ``tasks`` concurrent tasks under ``budget`` bytes whose plan set nothing aside
    for its mapped strips (:func:`reservation`) may map them all the same: where their large pages
    stay within a tenth of the budget (the allowance of the budget sweep, ``benchmarks/budgets.py``),
    from about 100 MiB with two tasks. Plans made by :func:`blocklin.plan.passes.plan_pass` without
    ``mapped`` (a Gram's, an inverse's staging pass) map under this rule only. Below, a 1024 x 1024
    float64 input in one chunk, solved at 2 MiB, had peaked 4.5 MiB of mapped pages above its plan."""
    return reservation(tasks) <= budget // 10


def large_pages(path: str) -> bool:
    """Whether the page cache holds the file at ``path`` (its first 2 MiB) in pages the kernel maps 2
    MiB at a time: the probe of the module docstring, one mapping and two reads of
    ``/proc/self/smaps_rollup`` (about 2 ms). False where that is not reported, the file is shorter
    than a large page, or missing. Probes are serialized, and a mapping made by another thread of the
    process meanwhile could only make this say True wrongly: a slower pass, never other bits."""
    if not AVAILABLE:
        return False
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return False
    try:
        if os.fstat(fd).st_size < LARGE_PAGE:
            return False
        with _probe_lock:
            before = pmd_mapped_kib()
            if before is None:
                return False
            reserved = 2 * LARGE_PAGE
            raw = _mmap(None, reserved, _PROT_NONE, mmap.MAP_PRIVATE | _MAP_ANONYMOUS | _MAP_NORESERVE, -1, 0)
            try:
                at = raw + (-raw % LARGE_PAGE)
                _mmap(at, LARGE_PAGE, mmap.PROT_READ, mmap.MAP_SHARED | _MAP_FIXED | _MAP_POPULATE, fd, 0)
                during = pmd_mapped_kib()
            finally:
                _LIBC.munmap(raw, reserved)
    except OSError:
        return False
    finally:
        os.close(fd)
    return during is not None and (during - before) * 1024 >= LARGE_PAGE
