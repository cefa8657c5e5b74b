"""Process-level memory settings that make the engine's budgets hold.

glibc's malloc raises its mmap threshold dynamically (up to 32 MiB) after large blocks are freed,
after which tile-sized buffers come from heap arenas that are rarely returned to the OS: resident
memory then grows past the budget through fragmentation. Fixing the threshold at 256 KiB keeps
every tile-sized buffer in its own mapping, returned on free. zarr's chunk I/O concurrency is
capped so that its chunk temporaries match what the planner accounts for.

Set ``BLOCKLIN_MALLOC_TUNING=0`` to leave malloc alone; zarr's own ``ZARR_ASYNC__CONCURRENCY``
setting is respected when present.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os

#: Chunks zarr reads or writes at once; the planners count one chunk temporary for each.
IO_CONCURRENCY = 4
_M_MMAP_THRESHOLD = -3


def tune() -> None:
    if os.environ.get("BLOCKLIN_MALLOC_TUNING", "1") not in ("0", "false", "no", "off"):
        try:
            libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
            libc.mallopt(_M_MMAP_THRESHOLD, 256 * 1024)
        except (OSError, AttributeError):  # not glibc: nothing to tune
            pass
    if "ZARR_ASYNC__CONCURRENCY" not in os.environ:
        import zarr

        zarr.config.set({"async.concurrency": IO_CONCURRENCY})


def io_concurrency() -> int:
    """Chunk I/O concurrency in force (what the planners account for)."""
    import zarr

    return int(zarr.config.get("async.concurrency"))
