"""Checking, before a cluster job starts, that every worker reaches the temp dir.

The client writes a small probe object under the temp dir and every worker reads it back
(``client.run``); a worker that cannot (a local folder on another machine, a ``memory://`` URL,
which lives in one process) fails the job up front with a message naming the fix, instead of a task
failing later with a misleading "does not exist".
"""

from __future__ import annotations

import threading
import uuid
from typing import Any

from blocklin.errors import TempDirError, explain
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


__all__ = ["check_workers_reach"]
