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
process (``SIGBUS``); blocklin itself replaces chunk files by renaming, which leaves a mapping intact.

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


class MappedStrip:
    """An address range holding file ranges side by side; unmapped when the last array over it goes.

    ``numpy.asarray(strip)`` is the read-only ``shape`` array of ``dtype`` that starts ``skip`` bytes
    into the range (the array keeps this object, and so the mapping, alive)."""

    def __init__(self, base: int, length: int, skip: int, shape: tuple[int, ...], dtype: np.dtype) -> None:
        self._base, self._length = base, length
        self.__array_interface__ = {"data": (base + skip, True), "shape": tuple(shape),
                                    "typestr": np.dtype(dtype).str, "version": 3}

    def __del__(self) -> None:
        if self._length and _LIBC is not None:
            _LIBC.munmap(self._base, self._length)
            self._length = 0


def map_ranges(ranges: Sequence[tuple[str, int, int]], skip: int, shape: tuple[int, ...], dtype: Any,
               short: Callable[[str, int], Exception]) -> np.ndarray | None:
    """The read-only array of ``shape`` that starts ``skip`` bytes into the file ranges ``(path, offset,
    length)`` laid side by side (each offset and every length but the last a whole number of pages).

    None where a file is missing (the caller fills the fill value); ``short(path, size)`` is raised
    for a file that ends before its range does (a mapped page past the end of a file is a ``SIGBUS``).
    Each range sits where its file offset is aligned as in the file, modulo :data:`LARGE_PAGE` where
    the ranges before it allow, so that pages the kernel holds as 2 MiB ones can be mapped as such.
    """
    total = sum(-(-length // PAGE) * PAGE for _, _, length in ranges)
    lead = ranges[0][1] % LARGE_PAGE if ranges else 0
    reserved = total + LARGE_PAGE
    raw = _mmap(None, reserved, _PROT_NONE, mmap.MAP_PRIVATE | _MAP_ANONYMOUS | _MAP_NORESERVE, -1, 0)
    base = raw + ((lead - raw) % LARGE_PAGE)  # base = lead (mod LARGE_PAGE)
    # the reserve around the used range goes back now; the used range is unmapped by MappedStrip
    if base > raw:
        _LIBC.munmap(raw, base - raw)
    if raw + reserved > base + total:
        _LIBC.munmap(base + total, raw + reserved - base - total)
    strip = MappedStrip(base, total, skip, shape, dtype)
    at = base
    for path, offset, length in ranges:
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            return None  # strip's mapping goes with it
        try:
            size = os.fstat(fd).st_size
            if size < offset + length:
                raise short(path, size)
            span = -(-length // PAGE) * PAGE
            _mmap(at, span, mmap.PROT_READ, mmap.MAP_SHARED | _MAP_FIXED | _MAP_POPULATE, fd, offset)
        finally:
            os.close(fd)
        at += span
    return np.asarray(strip)


_probe_lock = threading.Lock()


def _pmd_mapped_kib() -> int | None:
    try:
        with open("/proc/self/smaps_rollup") as f:
            for line in f:
                if line.startswith("FilePmdMapped:"):
                    return int(line.split()[1])
    except (OSError, ValueError):
        pass
    return None


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
            before = _pmd_mapped_kib()
            if before is None:
                return False
            reserved = 2 * LARGE_PAGE
            raw = _mmap(None, reserved, _PROT_NONE, mmap.MAP_PRIVATE | _MAP_ANONYMOUS | _MAP_NORESERVE, -1, 0)
            try:
                at = raw + (-raw % LARGE_PAGE)
                _mmap(at, LARGE_PAGE, mmap.PROT_READ, mmap.MAP_SHARED | _MAP_FIXED | _MAP_POPULATE, fd, 0)
                during = _pmd_mapped_kib()
            finally:
                _LIBC.munmap(raw, reserved)
    except OSError:
        return False
    finally:
        os.close(fd)
    return during is not None and (during - before) * 1024 >= LARGE_PAGE
