"""Probing storage: whether every worker of a cluster reaches the temp dir, and how fast blocklin
reads and writes a store (what ``blocklin calibrate`` records as the machine's feed and write rates).

The client writes a small probe object under the temp dir and every worker reads it back
(``client.run``); a worker that cannot (a local folder on another machine, a ``memory://`` URL,
which lives in one process) fails the job up front with a message naming the fix, instead of a task
failing later with a misleading "does not exist".
"""

from __future__ import annotations

import dataclasses
import os
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from blocklin.device.pool import aligned_empty
from blocklin.errors import ParameterError, TempDirError, explain
from blocklin.storage.backend import backend
from blocklin.storage.location import Location

_checked: set[tuple[str, str, str]] = set()
_lock = threading.Lock()


def _read_probe(loc: Location, key: str, expected: str) -> str | None:
    """Run on a worker: ``None`` when the probe reads back, else why not."""
    try:
        got = backend(loc).read_text(key)
    except Exception as exc:  # noqa: BLE001 - reported to the client
        return f"{type(exc).__name__}: {exc}"
    return None if got == expected else f"read {got[:40]!r} instead of the probe"


def check_workers_reach(client: Any, temp: Location) -> None:
    """Raise :class:`~blocklin.errors.TempDirError` unless every worker of ``client`` reads ``temp``.

    Checked once per client, temp dir and storage options in a process.
    """
    ident = (str(getattr(getattr(client, "scheduler", None), "address", id(client))), temp.url, temp.options)
    with _lock:
        if ident in _checked:
            return
    key = f".blocklin-probe-{uuid.uuid4().hex[:12]}"
    token = uuid.uuid4().hex
    be = backend(temp)
    try:
        be.write_text(key, token)
    except Exception as exc:  # noqa: BLE001
        raise TempDirError(explain("temp_dir", "must be writable by the client", f"{temp.url!r} ({exc})",
                                   "pass temp_dir= (CLI: --temp-dir, env BLOCKLIN_TEMP_DIR) naming a folder or "
                                   "bucket you can write, e.g. s3://bucket/tmp")) from exc
    try:
        results = client.run(_read_probe, temp, key, token)
    finally:
        be.delete(key)
    bad = {w: why for w, why in results.items() if why is not None}
    if bad:
        worker, why = next(iter(bad.items()))
        raise TempDirError(explain(
            "temp_dir", "must be reachable by every worker of the cluster (staged inputs, intermediates and "
            "outputs without out= live there)",
            f"{temp.url!r}, which {len(bad)} of {len(results)} workers cannot read (worker {worker}: {why})",
            "set BLOCKLIN_TEMP_DIR or pass temp_dir= (CLI: --temp-dir) to storage every worker shares, e.g. "
            "temp_dir='s3://bucket/blocklin-tmp' with storage_options for its credentials, or a shared "
            "network folder"))
    with _lock:
        _checked.add(ident)


#: Columns of the probe store, and the rows of its chunks: 8 MiB float64 chunks, as blocklin's
#: automatic chunking gives a tall matrix.
PROBE_COLS = 1024
PROBE_CHUNK_ROWS = 1024


@dataclasses.dataclass(frozen=True)
class StorageRates:
    """What :func:`measure_storage` measured (10^9 bytes/s).

    ``read_gbps`` is the first read of the store, after its pages were written out and dropped from
    the page cache where the OS allows it (``evicted``: a local store on a system with
    ``posix_fadvise``), so it is what the storage itself delivers; ``cached_read_gbps`` the second
    read, from the page cache where the first one left it; ``write_gbps`` the writes as the OS
    absorbs them (blocklin does not fsync, and neither does this).
    """

    read_gbps: float
    cached_read_gbps: float
    write_gbps: float
    nbytes: int
    evicted: bool
    threads: int


def _drop_cached_pages(loc: Location) -> bool:
    """Write the store's files out and ask the OS to drop their pages (``POSIX_FADV_DONTNEED`` drops
    clean pages only, hence the ``fdatasync`` first); False where that is not possible."""
    if not loc.is_local or not hasattr(os, "posix_fadvise"):
        return False
    try:
        for root, _, files in os.walk(loc.url):
            for name in files:
                fd = os.open(os.path.join(root, name), os.O_RDONLY)
                try:
                    os.fdatasync(fd)
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                finally:
                    os.close(fd)
    except OSError:
        return False
    return True


def measure_storage(folder: Location, nbytes: int = 256 * 2**20, *, threads: int = 2,
                    codec: str | None = "none") -> StorageRates:
    """Write a float64 store of about ``nbytes`` under ``folder`` with blocklin's writer
    (:func:`~blocklin.storage.zarr_store.write_block`, ``threads`` strips at a time), then read it back
    twice with its reader (:func:`~blocklin.storage.zarr_store.read_block`, ``threads`` loader threads
    as a row pass's loaders, into reused buffers). ``folder`` is the caller's: it removes it.

    Raises
    ------
    ParameterError
        ``nbytes`` below one chunk row of :data:`PROBE_COLS` float64 columns, or ``threads`` < 1.
    """
    from blocklin.storage.zarr_store import create_array, read_block, wait_for_pending_io, write_block

    row_bytes = PROBE_COLS * 8
    if int(nbytes) < row_bytes or int(threads) < 1:
        bad, rule, value = (("nbytes", f"must be at least one row of the probe store ({row_bytes} bytes)", nbytes)
                            if int(nbytes) < row_bytes else ("threads", "must be at least 1", threads))
        raise ParameterError(explain(bad, rule, repr(value), "pass nbytes=256 * 2**20 and threads=2 (the defaults)"))
    chunk_rows = min(PROBE_CHUNK_ROWS, int(nbytes) // row_bytes)
    rows = int(nbytes) // row_bytes // chunk_rows * chunk_rows
    loc = folder / "calibrate.zarr"
    arr = create_array(loc, shape=(rows, PROBE_COLS), dtype=np.float64, chunks=(chunk_rows, PROBE_COLS), codec=codec)
    block = np.random.default_rng(0).standard_normal((chunk_rows, PROBE_COLS))  # made before the clock starts
    strips = [slice(r, r + chunk_rows) for r in range(0, rows, chunk_rows)]
    cols = slice(0, PROBE_COLS)
    with ThreadPoolExecutor(threads) as pool:
        t0 = time.perf_counter()
        list(pool.map(lambda s: write_block(arr, s, cols, block), strips))
        wait_for_pending_io()
        write_s = time.perf_counter() - t0
        evicted = _drop_cached_pages(loc)
        local = threading.local()

        def read(s: slice) -> None:
            out = getattr(local, "out", None)
            if out is None:  # one buffer per loader, page-aligned and reused as a stream's host slots
                out = local.out = aligned_empty((chunk_rows, PROBE_COLS), np.float64)
                out.fill(0.0)  # its pages mapped before the clock counts them
            read_block(arr, s, cols, out=out)

        list(pool.map(lambda _: read(strips[0]), range(threads)))  # map the buffers; the first chunks
        evicted = evicted and _drop_cached_pages(loc)
        seconds = []
        for _ in range(2):
            t0 = time.perf_counter()
            list(pool.map(read, strips))
            seconds.append(time.perf_counter() - t0)
    total = rows * row_bytes
    return StorageRates(read_gbps=total / seconds[0] / 1e9, cached_read_gbps=total / seconds[1] / 1e9,
                        write_gbps=total / write_s / 1e9, nbytes=total, evicted=evicted, threads=int(threads))


__all__ = ["PROBE_CHUNK_ROWS", "PROBE_COLS", "StorageRates", "check_workers_reach", "measure_storage"]
