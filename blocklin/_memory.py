"""Process-level memory settings that make the engine's budgets hold.

glibc's malloc raises its mmap threshold dynamically (up to 32 MiB) after large blocks are freed,
after which tile-sized buffers come from heap arenas that are rarely returned to the OS: resident
memory then grows past the budget through fragmentation. Fixing the threshold at 256 KiB keeps
every tile-sized buffer in its own mapping, returned on free. zarr's chunk I/O concurrency is
capped so that its chunk temporaries match what the planner accounts for.

Set ``BLOCKLIN_MALLOC_TUNING=0`` to leave malloc alone; zarr's own ``ZARR_ASYNC__CONCURRENCY``
setting is respected when present. A ``distributed`` worker that imports blocklin for a task is
shared with other workloads and is not tuned on import (see :func:`tune_on_import`).
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import resource
import threading
from collections.abc import Iterator
from typing import Any

#: Chunks zarr reads or writes at once; the planners count one chunk temporary for each.
IO_CONCURRENCY = 4
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
#: The mmap threshold :func:`tune` sets (and :func:`reused_allocations` restores).
TUNED_MMAP_THRESHOLD = 256 * 1024
#: glibc's default trim threshold (what :func:`reused_allocations` restores).
_DEFAULT_TRIM_THRESHOLD = 128 * 1024
#: The largest mmap threshold glibc takes on 64-bit systems (half its heap size).
_MMAP_THRESHOLD_MAX = 32 * 1024 * 1024
_tuned: list = []  # the libc whose threshold tune() set (empty: malloc left alone)
_reuse_lock = threading.Lock()
_reuse_depth = [0]


def in_dask_worker_process() -> bool:
    """Whether this process hosts a ``distributed`` worker (blocklin came in with a task)."""
    import sys

    mod = sys.modules.get("distributed.worker")
    workers = getattr(mod, "_global_workers", ()) if mod else ()
    # weak references in some distributed versions, the workers themselves in others
    return any((w() if callable(w) else w) is not None for w in workers)


def _malloc_tuning() -> str:
    return os.environ.get("BLOCKLIN_MALLOC_TUNING", "").strip().lower()


_LIBC: list = []


def _glibc() -> Any:
    """The C library when it is glibc (it has ``mallopt`` and ``malloc_trim``), else None; loaded once."""
    if not _LIBC:
        try:
            lib = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
            _LIBC.append(lib if hasattr(lib, "mallopt") and hasattr(lib, "malloc_trim") else None)
        except OSError:
            _LIBC.append(None)
    return _LIBC[0]


def tune() -> None:
    """Apply both settings to this process (idempotent)."""
    libc = _glibc() if _malloc_tuning() not in ("0", "false", "no", "off") else None
    if libc is not None and libc.mallopt(_M_MMAP_THRESHOLD, TUNED_MMAP_THRESHOLD) and not _tuned:
        _tuned.append(libc)
    if "ZARR_ASYNC__CONCURRENCY" not in os.environ:
        import zarr

        zarr.config.set({"async.concurrency": IO_CONCURRENCY})


@contextlib.contextmanager
def reused_allocations(budget: int | None) -> Iterator[None]:
    """Inside: arrays up to 1/64 of ``budget`` (at most 32 MiB) come from the heap and go back to it when
    freed, to be reused by the next of their size; on leaving, the threshold :func:`tune` set is
    restored and the heap's free pages are returned to the OS. ``budget=None``: nothing changes.

    For loops whose every step makes and frees the same large temporaries (a Lanczos step's
    ``n x block`` blocks, its products): each in a mapping of its own is zeroed page by page by the
    kernel when first written. A sparse svd at ``10^5`` nodes (``memory="1GiB"``) took 150 000 to
    196 000 page faults and 0.7-1.2 s of system time so, about 30 000 and 0.3-0.5 s inside. The
    temporaries are the ones the plans count, but the heap keeps what is freed until it is reused,
    and arrays of other sizes freed between (a product's partials) stay resident too: a sparse svd
    at 10^6 nodes with every array up to 32 MiB on the heap peaked at 282 MiB of its 256 MiB budget
    (183 MiB mapped). Arrays up to 1/64 of the budget keep what the heap can hold back small beside it.
    Does nothing where :func:`tune` left malloc alone (not glibc, ``BLOCKLIN_MALLOC_TUNING=0``, a
    shared ``distributed`` worker) or where that size is below the tuned threshold. Nested and
    concurrent uses share the first one's setting: the last to leave restores it.
    """
    limit = min(_MMAP_THRESHOLD_MAX, int(budget) // 64) if budget else 0
    if not _tuned or limit <= TUNED_MMAP_THRESHOLD:
        yield
        return
    libc = _tuned[0]
    with _reuse_lock:
        _reuse_depth[0] += 1
        if _reuse_depth[0] == 1:
            libc.mallopt(_M_TRIM_THRESHOLD, limit)
            libc.mallopt(_M_MMAP_THRESHOLD, limit)
    try:
        yield
    finally:
        with _reuse_lock:
            _reuse_depth[0] -= 1
            if _reuse_depth[0] == 0:
                libc.mallopt(_M_MMAP_THRESHOLD, TUNED_MMAP_THRESHOLD)
                libc.mallopt(_M_TRIM_THRESHOLD, _DEFAULT_TRIM_THRESHOLD)
                release_free_memory()


def release_free_memory() -> None:
    """Return the allocator's free pages to the OS (glibc ``malloc_trim(0)``; elsewhere nothing).

    Buffers below the mmap threshold come from heap arenas, and what a task frees there stays
    resident (fragmentation, a pool thread's own arena) until a later allocation reuses it. A task
    that runs alone at a small budget calls this before and after its work, so that the memory the
    previous step freed does not add to its own peak.
    """
    libc = _glibc()
    if libc is not None:
        libc.malloc_trim(0)


def tune_on_import() -> None:
    """Tune a process that chose blocklin; leave a shared ``distributed`` worker alone.

    A worker imports blocklin when its first blocklin task arrives, and its other workloads must
    not inherit blocklin's allocator or zarr settings: there tasks scope zarr's concurrency to
    themselves (:func:`blocklin.runtime.tiles.with_task_settings`), and the mmap threshold is set
    only when the worker's environment asks for it (``BLOCKLIN_MALLOC_TUNING=1``).
    """
    if not in_dask_worker_process():
        tune()
    elif _malloc_tuning() in ("1", "true", "yes", "on"):
        tune()


def io_concurrency() -> int:
    """Chunk I/O concurrency in force (what the planners account for)."""
    import zarr

    return int(zarr.config.get("async.concurrency"))


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


def machine_memory() -> tuple[int, str] | None:
    """Bytes of memory this process may use on this machine, and where the figure comes from.

    The smaller of the physical memory and the cgroup limit (v2 ``memory.max``, v1
    ``memory.limit_in_bytes``) a container sets; None when neither can be read.
    """
    found: list[tuple[int, str]] = []
    try:
        found.append((os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"), "physical memory"))
    except (ValueError, OSError, AttributeError):  # pragma: no cover - not POSIX
        pass
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            with open(path) as f:
                raw = f.read().strip()
        except OSError:
            continue
        if raw.isdigit() and int(raw) < (1 << 60):  # "max" or a huge number: no limit
            found.append((int(raw), f"cgroup limit {path}"))
    return min(found) if found else None


def check_budget(memory: int) -> None:
    """Refuse a host budget above what this machine gives the process (``--memory 1024TiB`` on a
    24 GiB machine would plan tiles that cannot be allocated)."""
    limit = machine_memory()
    if limit is None or memory <= limit[0]:
        return
    from blocklin.config import format_size, size_hint
    from blocklin.errors import ConfigError, explain

    suggestion = size_hint(limit[0] * 3 // 4).replace(".", "")
    raise ConfigError(explain("memory", f"must not exceed the memory of this machine ({format_size(limit[0])}, "
                              f"{limit[1]})", format_size(memory),
                              f"pass --memory {suggestion} (memory='{suggestion}') or less, leaving room for "
                              "the interpreter and other processes"))
