"""The record that marks a file export as blocklin's: ``.NAME.blocklin`` beside the file ``NAME``.

A file (``.npy``, Matrix Market, CSV/TSV, raw binary, ``.npz``, HDF5) carries no attribute where
blocklin could leave its provenance, as a zarr store does. So every commit of a file export writes
this small JSON record in the same folder, after the file is in place: its format, and what
identifies the file as the one blocklin left there (size, modification and status-change times in
nanoseconds, device and inode, from ``lstat``); for HDF5 also the datasets blocklin wrote into it.
``overwrite`` replaces a file only while its record *matches* it
(:func:`blocklin.storage.guard.check_replaceable`): a file a user rewrote since, replaced by another
file of that name, moved there, or turned into a link, no longer matches and is refused. Checking
is one ``lstat`` and one small read: no hashing of the file.

The record is written whole (a temporary name renamed into place). A run killed (SIGKILL) between the
file's rename and its record leaves a file without a matching record: refused later, the safe side; a
Ctrl-C or SIGTERM there still writes the record (the commit's ``finally``). An
in-place HDF5 write marks the record ``writing`` once it holds the open file, before its first
change, and rewrites it when the file is closed (committed or aborted); a record still marked
``writing`` whose file changed names that write (interrupted, or still running) in the refusal.
"""

from __future__ import annotations

import json
import os
import socket
import stat
import uuid
from typing import Any

from blocklin._version import __version__
from blocklin.storage.records import FILE_RECORD_SUFFIX as SUFFIX
_FIELDS = ("size", "mtime_ns", "ctime_ns", "dev", "ino")
#: Beside a file export's partial ``.NAME.partial-TOKEN`` while a run writes it: that run's owner record
#: (:func:`blocklin.storage.ownership.new_record`, its heartbeat refreshed: :func:`keep_alive`), so that
#: ``blocklin clean`` removes the partial of a run that is gone, and never a live run's
#: (:mod:`blocklin.storage.cleanup`).
OWNER_SUFFIX = ".owner"


def write_owner(partial: str | os.PathLike, **extra: Any) -> dict:
    """Record this process as the writer of the file export's partial ``partial`` (written whole);
    returns the record."""
    from blocklin.storage.ownership import new_record

    rec = new_record(**extra)
    _write_whole(os.fspath(partial) + OWNER_SUFFIX, rec)
    return rec


def keep_alive(partial: str | os.PathLike, rec: dict) -> None:
    """Refresh the heartbeat of ``rec``, the owner record beside ``partial``, until :func:`let_go`
    (:class:`blocklin.storage.ownership.Heartbeat`): on another host sharing the folder, an export
    that runs past the lease had looked gone, to ``blocklin clean`` and to a second run, which removed
    its partial."""
    from blocklin.storage.location import Location
    from blocklin.storage.ownership import Heartbeat

    path = os.path.abspath(os.fspath(partial))
    Heartbeat.hold(Location(path), rec, read=lambda: read_owner(path),
                   write=lambda r: _write_whole(path + OWNER_SUFFIX, r))


def let_go(partial: str | os.PathLike) -> None:
    """Stop refreshing the owner record beside ``partial`` (before the commit's rename or the abort's
    removal: no beat recreates the record afterwards)."""
    from blocklin.storage.location import Location
    from blocklin.storage.ownership import Heartbeat

    Heartbeat.release(Location(os.path.abspath(os.fspath(partial))))


def read_owner(partial: str | os.PathLike) -> dict | None:
    """The owner record beside the partial ``partial``, or None (missing, unreadable, not one)."""
    try:
        with open(os.fspath(partial) + OWNER_SUFFIX, "rb") as f:
            rec = json.loads(f.read(1 << 16))
    except (OSError, ValueError):
        return None
    return rec if isinstance(rec, dict) and "pid" in rec else None


def drop_owner(partial: str | os.PathLike) -> None:
    """Remove the owner record beside ``partial`` (its run committed or removed the partial)."""
    try:
        os.unlink(os.fspath(partial) + OWNER_SUFFIX)
    except FileNotFoundError:
        pass


def record_path(path: str | os.PathLike) -> str:
    """Where the record of the file ``path`` lives: ``.NAME.blocklin`` in the same folder."""
    folder, name = os.path.split(os.path.abspath(os.fspath(path)))
    return os.path.join(folder, f".{name}{SUFFIX}")


def _identity(path: str) -> dict[str, int] | None:
    """What identifies the file at ``path`` as it is now (None: missing, a link, not a regular file)."""
    try:
        st = os.lstat(path)
    except OSError:
        return None
    if not stat.S_ISREG(st.st_mode):
        return None
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "ctime_ns": st.st_ctime_ns, "dev": st.st_dev,
            "ino": st.st_ino}


def read(path: str | os.PathLike) -> dict | None:
    """The record of the file ``path``, or None when there is none (or it is unreadable)."""
    return _load(record_path(path))


def _load(record: str) -> dict | None:
    try:
        with open(record, "rb") as f:
            rec = json.loads(f.read(1 << 20))
    except (OSError, ValueError):
        return None
    return rec if isinstance(rec, dict) and isinstance(rec.get("blocklin"), str) else None


def exported_path(record: str | os.PathLike) -> str | None:
    """The file whose record is named ``record`` (``.NAME.blocklin`` -> ``NAME`` in the same folder), or
    None when the name is not a record's."""
    folder, name = os.path.split(os.path.abspath(os.fspath(record)))
    if not (name.startswith(".") and name.endswith(SUFFIX)) or len(name) <= len(SUFFIX) + 1:
        return None
    return os.path.join(folder, name[1:-len(SUFFIX)])


def read_own(record: str | os.PathLike) -> dict | None:
    """The record in the file ``record`` when it is one :func:`write` wrote: a regular file (not a link)
    holding a JSON object with blocklin's version, the export's format and every identity field;
    otherwise None (a file of the user's that only has a record's name)."""
    record = os.fspath(record)
    try:
        if not stat.S_ISREG(os.lstat(record).st_mode) or os.path.getsize(record) >= 1 << 20:
            return None
    except OSError:
        return None
    rec = _load(record)
    if rec is None or not isinstance(rec.get("format"), str):
        return None
    ints = all(isinstance(rec.get(k), int) and not isinstance(rec.get(k), bool) for k in _FIELDS)
    return rec if ints else None


def matches(path: str | os.PathLike, rec: dict | None) -> bool:
    """Whether ``rec`` describes the file at ``path`` as it is now (a regular file, unchanged since)."""
    now = _identity(os.fspath(path))
    return rec is not None and now is not None and all(rec.get(k) == now[k] for k in _FIELDS)


def write(path: str | os.PathLike, kind: str, *, datasets: list[str] | None = None,
          writing: str | None = None) -> dict:
    """Record the file at ``path`` (just committed or closed) as blocklin's ``kind`` export; returns the record.

    ``datasets`` (HDF5) are the datasets blocklin wrote into the file; ``writing`` names the dataset
    of an in-place write about to start (the record then says so until it is rewritten).
    """
    path = os.fspath(path)
    ident = _identity(path)
    if ident is None:  # pragma: no cover - the caller just wrote it
        raise FileNotFoundError(path)
    rec: dict[str, Any] = {"blocklin": __version__, "format": kind, **ident}
    if datasets is not None:
        rec["datasets"] = sorted(set(datasets))
    if writing is not None:
        rec["writing"] = {"dataset": writing, "pid": os.getpid(), "host": socket.gethostname()}
    _write_whole(record_path(path), rec)
    return rec


def _write_whole(target: str, rec: dict) -> None:
    """``rec`` as JSON at ``target``, under a temporary name renamed into place (never half a record)."""
    tmp = f"{target}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(rec, f)
        os.replace(tmp, target)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise


__all__ = ["OWNER_SUFFIX", "SUFFIX", "drop_owner", "exported_path", "keep_alive", "let_go", "matches", "read",
           "read_own", "read_owner", "record_path", "write", "write_owner"]
