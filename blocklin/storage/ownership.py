"""Who is writing a partial output or a work folder, and whether that run is still alive.

Every partial output (``.OUT.partial-TOKEN`` locally, the pending prefix on object stores) and
every job work folder (``blocklin-OP-ID`` under the temp dir) holds an owner record,
``.blocklin-owner.json``: the writer's pid, host, boot id, process start time, a random run id, the
start time and a heartbeat (a file export's partial, a file, has it beside it:
``.OUT.partial-TOKEN.owner``, :mod:`blocklin.storage.file_records`). It is written whole (a
temporary name renamed into place locally, one object write on object stores), so a reader never
sees half of it.

A record's owner is *gone* when

* it ran on this host and its process no longer exists (the pid is dead, or now belongs to a
  process started at another time, or the machine rebooted since), or
* it ran on another host and its heartbeat is older than :data:`LEASE_SECONDS` (a live writer
  refreshes it every :data:`HEARTBEAT_SECONDS` from a background thread).

A record marked ``released`` belongs to a run that let its location go on purpose (an interrupted
resumable run keeps its work for a rerun with ``resume``): its owner counts as gone at once, on
every host.

A location holding data but no readable record is treated as gone: runs create the record under
the claim lock before writing anything else, so only a run that died at that instant, or an
older blocklin, leaves such a folder.

Local claims are serialised by an advisory lock (``flock``) on the parent folder, held for the few
milliseconds a claim takes; object stores have no locks, so a claim there writes the record and
reads it back, and the commit checks the run id again (locally too, under the lock: a partial taken
over during a run is never published by it).
"""

from __future__ import annotations

import contextlib
import datetime
import errno
import json
import os
import socket
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

from blocklin.storage.backend import backend
from blocklin.storage.location import Location
from blocklin.storage.space import make_temp_folder
from blocklin.storage.records import OWNER_RECORD

#: Seconds between heartbeats of a live writer.
HEARTBEAT_SECONDS = 30.0
#: A record from another host whose heartbeat is older than this belongs to a gone run.
LEASE_SECONDS = 10 * 60.0

_RUN_ID = uuid.uuid4().hex[:16]


def _boot_id() -> str | None:
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return None


def _proc_start(pid: int) -> str | None:
    """Start time of process ``pid`` in clock ticks since boot (Linux), None where unknown."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return None
    # the command name (field 2) may hold spaces and parentheses: split after its closing one
    return stat.rsplit(")", 1)[-1].split()[19]


def host() -> str:
    return socket.gethostname()


#: Characters of the command line an owner record keeps (what a resume that cannot continue the run shows).
COMMAND_CHARS = 400


_COMMAND: list[list[str]] = []  # the command the CLI runs (innermost last)


@contextlib.contextmanager
def running_command(argv: list[str]) -> Iterator[None]:
    """While the CLI runs ``argv`` (``["blocklin", "svd", ...]``), owner records name it as the command."""
    _COMMAND.append([str(a) for a in argv])
    try:
        yield
    finally:
        _COMMAND.pop()


def command_line() -> str:
    """The command this process runs, shell-quoted: the CLI's (``blocklin svd A.zarr -k 4 ...``, see
    :func:`running_command`), else the Python program's script and arguments; cut to :data:`COMMAND_CHARS`."""
    import shlex

    text = shlex.join(_COMMAND[-1] if _COMMAND else [str(a) for a in sys.argv])
    return text if len(text) <= COMMAND_CHARS else text[:COMMAND_CHARS - 3] + "..."


def new_record(**extra: Any) -> dict:
    """The owner record of this process, with ``extra`` fields (operation, token, path)."""
    now = time.time()
    rec = {"pid": os.getpid(), "host": host(), "boot_id": _boot_id(), "proc_start": _proc_start(os.getpid()),
           "run": f"{_RUN_ID}-{uuid.uuid4().hex[:8]}",
           "started": datetime.datetime.fromtimestamp(now, datetime.timezone.utc).isoformat(timespec="seconds"),
           "heartbeat": now, "command": command_line()}
    rec.update(extra)
    return rec


def read_record(loc: Location) -> dict | None:
    """The owner record under ``loc``, or None when missing or unreadable."""
    raw = backend(loc).try_read(OWNER_RECORD)
    if raw is None:
        return None
    try:
        rec = json.loads(raw)
    except ValueError:
        return None
    return rec if isinstance(rec, dict) and "pid" in rec else None


def write_record(loc: Location, rec: dict) -> None:
    """Write the record whole (readers never see half of it)."""
    backend(loc).write_text(OWNER_RECORD, json.dumps(rec))


def is_alive(rec: dict | None, *, now: float | None = None) -> bool:
    """Whether the run that wrote ``rec`` may still be writing (see module docstring)."""
    if not rec or rec.get("released"):
        return False
    if rec.get("host") != host():
        beat = float(rec.get("heartbeat") or 0.0)
        return (time.time() if now is None else now) - beat < LEASE_SECONDS
    boot = _boot_id()
    if rec.get("boot_id") and boot and rec["boot_id"] != boot:
        return False
    pid = int(rec.get("pid", -1))
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # a process of another user: it exists
    start = rec.get("proc_start")
    return not (start and _proc_start(pid) not in (None, start))  # the pid was reused


def is_mine(rec: dict | None) -> bool:
    return bool(rec) and rec.get("host") == host() and int(rec.get("pid", -1)) == os.getpid()


def describe(rec: dict) -> str:
    """``pid P on HOST since T`` for messages."""
    return f"pid {rec.get('pid')} on {rec.get('host')} since {rec.get('started')}"


@contextlib.contextmanager
def claim_lock(folder: str) -> Iterator[None]:
    """Serialise claims of outputs in one local folder (an advisory lock on the folder itself)."""
    try:
        import fcntl
    except ImportError:  # no flock (Windows): claims are not serialised
        yield
        return
    try:
        fd = os.open(folder or ".", os.O_RDONLY)
    except OSError:
        yield
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
        except OSError as exc:  # file systems without flock (some network mounts)
            if exc.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.EINVAL):
                raise
        yield
    finally:
        os.close(fd)  # releases the lock


class Heartbeat:
    """Refreshes the owner records this process holds, every :data:`HEARTBEAT_SECONDS`.

    One daemon thread per process; it stops refreshing a record whose run id changed (another run
    took the location over), so the commit of this run then fails instead of overwriting it. A
    folder's record is ``OWNER_RECORD`` inside it (:meth:`hold`); a file export's lies beside its
    partial file, read and written by the callables :meth:`hold` takes (``read``, ``write``).
    """

    _lock = threading.Lock()
    #: url -> (location, record, whether it is a folder's, read, write)
    _held: dict[str, tuple[Location, dict, bool, Any, Any]] = {}
    _thread: threading.Thread | None = None
    _wake = threading.Event()

    @classmethod
    def hold(cls, loc: Location, rec: dict, *, read: Any = None, write: Any = None) -> None:
        """Refresh ``rec`` at ``loc`` from now on; ``read()`` and ``write(rec)`` where the record is not
        ``OWNER_RECORD`` inside ``loc`` (a file export's, beside its partial file)."""
        folder = read is None
        read = read or (lambda: read_record(loc))
        write = write or (lambda r: write_record(loc, r))
        with cls._lock:
            cls._held[loc.url] = (loc, rec, folder, read, write)
            if cls._thread is None or not cls._thread.is_alive():
                cls._thread = threading.Thread(target=cls._run, name="blocklin-heartbeat", daemon=True)
                cls._thread.start()

    @classmethod
    def holds(cls, rec: dict | None) -> bool:
        """Whether this process still holds the run that wrote ``rec`` (its output or job is open)."""
        if not rec:
            return False
        with cls._lock:
            return any(h[1]["run"] == rec.get("run") for h in cls._held.values())

    @classmethod
    def held(cls) -> list[tuple[Location, dict]]:
        """The folders (partial outputs, work folders) whose records this process holds, with the
        records (a file export's partial, which its own abort removes, is not among them)."""
        with cls._lock:
            return [(loc, rec) for loc, rec, folder, _, _ in cls._held.values() if folder]

    @classmethod
    def release(cls, loc: Location) -> None:
        """Stop refreshing the record at ``loc``; once this returns, no beat of it runs or follows."""
        with cls._lock:
            cls._held.pop(loc.url, None)

    @classmethod
    @contextlib.contextmanager
    def paused(cls) -> Iterator[None]:
        """No beat runs inside: a caller that empties an owned folder and restores its record (zarr's
        ``overwrite``) is neither raced by a record being renamed into it nor taken for gone."""
        with cls._lock:
            yield

    @classmethod
    def _run(cls) -> None:
        while True:
            cls._wake.wait(HEARTBEAT_SECONDS)
            cls._wake.clear()
            with cls._lock:
                held = list(cls._held.values())
                if not held:
                    cls._thread = None
                    return
                for loc, rec, _, read, write in held:
                    cls._beat(loc, rec, read, write)

    @classmethod
    def _beat(cls, loc: Location, rec: dict, read: Any, write: Any) -> None:
        try:
            current = read()
            if current is None or current.get("run") != rec["run"]:
                cls._held.pop(loc.url, None)  # gone or taken over: never resurrect it
                return
            rec["heartbeat"] = time.time()
            write(rec)
        except OSError:  # a transient storage error: the next beat tries again
            pass


def mark_released(loc: Location, rec: dict) -> None:
    """Stop owning ``loc`` and keep it, its record saying that its run let it go (see
    :func:`is_alive`): a rerun with ``resume`` takes it over, ``blocklin clean`` may remove it."""
    Heartbeat.release(loc)
    try:
        write_record(loc, {**rec, "released": True})
    except OSError:  # the record stays as it was: the owner is gone once this process is
        pass


def start_work_folder(loc: Location, **extra: Any) -> dict:
    """Create the work folder ``loc`` (locally) and own it: record written, heartbeat held."""
    if loc.is_local:
        make_temp_folder(loc.url)  # an unusable temp dir is a TempDirError naming the setting
    rec = new_record(**extra)
    write_record(loc, rec)
    Heartbeat.hold(loc, rec)
    return rec


def claim_work_folder(loc: Location, **extra: Any) -> dict:
    """Own the deterministic work folder ``loc``, creating it or continuing what a gone run left
    there (``resume``). Its record says ``resumable``: the automatic sweep of a new job leaves it for
    the rerun that continues it; ``blocklin clean`` removes it once its owner is gone."""
    if loc.is_local and not os.path.isdir(loc.url):
        make_temp_folder(loc.url)
    rec = new_record(resumable=True, **extra)
    write_record(loc, rec)
    Heartbeat.hold(loc, rec)
    return rec


def end_work_folder(loc: Location) -> None:
    """Stop owning the work folder ``loc`` and remove it with everything in it."""
    Heartbeat.release(loc)
    backend(loc).remove("")


__all__ = ["HEARTBEAT_SECONDS", "LEASE_SECONDS", "OWNER_RECORD", "Heartbeat", "claim_lock", "describe",
           "claim_work_folder", "end_work_folder", "host", "is_alive", "is_mine", "mark_released", "new_record", "read_record", "start_work_folder", "write_record"]
