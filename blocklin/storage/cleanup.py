"""Finding and removing what runs that are gone left behind (``blocklin clean``).

A run killed without a chance to clean up (SIGKILL, power loss, the out-of-memory killer) leaves

* partial outputs, ``.OUT.partial-TOKEN`` beside the output (locally) or an output prefix holding
  the pending record (object stores); a file export's partial is a file, its owner record beside it
  (``.OUT.partial-TOKEN.owner``, :func:`blocklin.storage.file_records.write_owner`), and ``clean`` had
  not seen it (320 MB of a killed ``.npy`` export, "nothing to clean");
* job work folders, ``blocklin-OP-ID`` (and ``blocklin-stage-ID``) under the temp dir, with their
  scratch stores;
* rarely, ``.OUT.old-ID``: an old output set aside by a commit that was killed before removing it.

Besides, a file export's record ``.NAME.blocklin`` (:mod:`blocklin.storage.file_records`) outlives
its file when the user removes the file: such an orphan record is removed where it is one blocklin
wrote, and reported and left alone otherwise (a file of the user's with that name). A record whose
file exists is no leftover.
Such records (and a partial file's owner record) are written whole under a temporary name,
``.NAME.blocklin.tmp-PID-HEX``, and renamed into place; a writer killed between the two leaves that
file, removed once it is older than the lease and holds the start of a record blocklin writes (or
nothing).

Each holds an owner record (:mod:`blocklin.storage.ownership`); one whose owner is gone is removed,
one whose owner is alive never is. A work folder without a record (made by an older blocklin) is
reported and left alone, since nothing tells whether a run still uses it; so is a partial output
without a record that was written to in the last :data:`~blocklin.storage.ownership.LEASE_SECONDS`
(a run to that same output still takes it over, as before owner records), or that is not a zarr store
under blocklin's token (not blocklin's), and so is a ``.OUT.old-ID`` folder that is not an output
``overwrite`` may replace (a blocklin zarr store and nothing else, or an empty folder).
"""

from __future__ import annotations

import dataclasses
import os
import re
import stat
import time
from collections.abc import Iterable
from typing import Any

from blocklin.storage import file_records, ownership
from blocklin.storage.backend import backend, rmtree_owner_last
from blocklin.storage.guard import PARTIAL_TOKEN, blocklin_partial
from blocklin.storage.location import Location, as_location
from blocklin.storage.records import PENDING_RECORD, WORK_FOLDER_RECORD
from blocklin.storage.space import folder_size

_PARTIAL = re.compile(r"^\..+\.partial-[0-9A-Za-z]+$")
_OLD = re.compile(r"^\..+\.old-[0-9a-f]{8}$")
_WORK = re.compile(r"^blocklin-[A-Za-z0-9_]+-[0-9a-f]{12,32}$")
_RECORD = re.compile(r"^\..+" + re.escape(file_records.SUFFIX) + "$")
#: A record written whole under a temporary name (``file_records._write_whole``: a file export's record or a
#: partial file's owner record) that its writer, killed between the write and the rename, left behind.
_RECORD_TMP = re.compile(r"^\..+(?:" + re.escape(file_records.SUFFIX) + "|" + re.escape(file_records.OWNER_SUFFIX)
                         + r")\.tmp-\d+-[0-9a-f]{8}$")
#: How each such record begins (``json.dump`` of the dicts ``file_records`` writes), or nothing yet.
_RECORD_TMP_STARTS = ('{"blocklin": ', '{"pid": ')


@dataclasses.dataclass
class Leftover:
    """One partial output or work folder, its owner and what ``clean`` does with it."""

    path: str
    kind: str  # "partial output", "work folder", "old output", "file record", "partial file", "record temp"
    bytes: int
    owner: dict | None
    #: "removed", "would remove", "kept" (its owner is alive) or "skipped" (no owner record)
    action: str = ""
    reason: str = ""

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["owner"] = ownership.describe(self.owner) if self.owner else None
        return d


def _size(loc: Location) -> int:
    if loc.is_local:
        return folder_size(loc.url)
    return backend(loc).size("")


def _classify(loc: Location, kind: str, sizes: bool = True) -> Leftover:
    if kind == "file record":
        return _classify_record(loc.url)
    if kind == "partial file":
        return _classify_partial_file(loc.url, sizes)
    if kind == "record temp":
        return _classify_record_temp(loc.url)
    rec = ownership.read_record(loc)
    item = Leftover(loc.url, kind, 0, rec)
    if ownership.is_alive(rec) and not (ownership.is_mine(rec) and not ownership.Heartbeat.holds(rec)):
        item.action, item.reason = "kept", f"a live run owns it ({ownership.describe(rec)})"
    elif rec is None and kind == "work folder":
        item.action, item.reason = "skipped", "no owner record (an older blocklin made it); remove it by hand " \
                                              "when no run uses it"
    elif rec is None and kind == "partial output" and not _blocklin_partial(loc):
        item.action, item.reason = "skipped", "no owner record, and not a zarr store under blocklin's name " \
                                              "(.OUT.partial- and 16 hex digits): not blocklin's; left alone"
    elif rec is None and kind == "old output" and not _blocklin_old(loc):
        item.action, item.reason = "skipped", "not an output blocklin wrote (neither a zarr store with blocklin " \
                                              "provenance and nothing else, nor an empty folder): left alone"
    elif rec is None and kind == "old output" and time.time() - _mtime(loc) < ownership.HEARTBEAT_SECONDS:
        item.action, item.reason = "kept", "a commit may still be removing it"
    elif rec is None and kind == "partial output" and loc.is_local and time.time() - _newest(loc) < \
            ownership.LEASE_SECONDS:
        item.action, item.reason = "kept", "no owner record, and written to in the last 10 minutes (an older " \
                                           "blocklin may still be writing it)"
    else:
        item.action = "remove"
        item.reason = f"its run is gone ({ownership.describe(rec)})" if rec else "no owner record"
        if rec and rec.get("resumable"):
            item.reason += "; rerunning it with --resume would continue it instead"
    if sizes or item.action == "remove":
        item.bytes = _size(loc)
    return item


def _classify_record(path: str) -> Leftover:
    """An orphan ``.NAME.blocklin`` (its file ``NAME`` is gone): removed where blocklin wrote it."""
    try:
        size = os.lstat(path).st_size
    except OSError:
        size = 0
    item = Leftover(path, "file record", size, None)
    name = os.path.basename(file_records.exported_path(path) or "")
    rec = file_records.read_own(path)
    if os.path.lexists(file_records.exported_path(path) or path):
        item.action, item.reason = "kept", f"its file {name} exists"
    elif rec is None:
        item.action, item.reason = "skipped", "not a record blocklin wrote (a regular file holding blocklin's " \
                                              "version, the export's format and its file's identity): left alone"
    else:
        item.action, item.reason = "remove", f"its file {name} is gone (the record of a {rec['format']} export)"
    return item


def _classify_record_temp(path: str) -> Leftover:
    """A record's temporary file: removed where its writer is long gone and it holds what blocklin writes."""
    try:
        st = os.lstat(path)
        with open(path, "rb") as f:
            head = f.read(64).decode("utf-8", "replace")
    except OSError:
        return Leftover(path, "record temp", 0, None, "skipped", "unreadable: left alone")
    item = Leftover(path, "record temp", st.st_size, None)
    if not stat.S_ISREG(st.st_mode) or not (head == "" or head.startswith(_RECORD_TMP_STARTS)):
        item.action, item.reason = "skipped", "not a record blocklin was writing (it holds something else): " \
                                              "left alone"
    elif time.time() - st.st_mtime < ownership.LEASE_SECONDS:
        # its writer renames it into place milliseconds after writing it
        item.action, item.reason = "kept", "written to in the last 10 minutes (a run may be renaming it)"
    else:
        item.action, item.reason = "remove", "a record's temporary copy whose writer stopped before renaming it"
    return item


def _record_temp(path: str) -> bool:
    return bool(_RECORD_TMP.match(os.path.basename(path))) and os.path.isfile(path) and not os.path.islink(path)


def _orphan_record(path: str) -> bool:
    """Whether ``path`` has a file record's name and its file is gone."""
    exported = file_records.exported_path(path)
    return bool(_RECORD.match(os.path.basename(path))) and exported is not None and not os.path.lexists(exported)


#: The token of a partial output blocklin names (``uuid4().hex[:16]`` or a resume token of 16 hex digits).
_TOKEN = PARTIAL_TOKEN


def _blocklin_partial(loc: Location) -> bool:
    """Whether a partial output without an owner record is one blocklin could have written
    (:func:`blocklin.storage.guard.blocklin_partial`: a user's ``.data.zarr.partial-abc`` of notes was
    removed by ``clean`` before; found by a randomized search). Object-store prefixes are named by
    blocklin alone."""
    return not loc.is_local or blocklin_partial(loc.url)


def _blocklin_old(loc: Location) -> bool:
    """Whether a ``.NAME.old-ID`` folder is what a commit sets aside: an output that ``overwrite`` may
    replace (:func:`blocklin.storage.guard.check_replaceable`). The name alone says little (a user's
    ``.photos.old-20231225`` matches it), and ``clean`` had removed such folders."""
    from blocklin.errors import OutputExistsError
    from blocklin.storage.guard import check_replaceable

    if not loc.is_local or os.path.islink(loc.url):
        return False
    try:
        check_replaceable(loc)
    except OutputExistsError:
        return False
    return True


def _mtime(loc: Location) -> float:
    try:
        return os.stat(loc.url).st_mtime
    except OSError:
        return 0.0


def _newest(loc: Location) -> float:
    """Latest modification time of anything under a local folder."""
    newest = _mtime(loc)
    for root, dirs, files in os.walk(loc.url):
        for f in dirs + files:
            try:
                newest = max(newest, os.lstat(os.path.join(root, f)).st_mtime)
            except OSError:
                pass
    return newest


def _local_candidates(path: str) -> list[tuple[str, str]]:
    """(path, kind) of the leftovers at or directly under the local ``path``, or beside it."""
    path = os.path.abspath(os.path.expanduser(path))
    base, parent = os.path.basename(path), os.path.dirname(path)
    own = _kind(base)
    if own and os.path.isdir(path):
        return [(path, own)]
    if _partial_file(path):
        return [(_file_partial_of(path), "partial file")]
    if _orphan_record(path):
        return [(path, "file record")]
    if _record_temp(path):
        return [(path, "record temp")]
    found = []
    if os.path.isdir(path) and not _is_zarr(path):
        for f in sorted(os.listdir(path)):
            kind = _kind(f)
            if kind and os.path.isdir(os.path.join(path, f)):
                found.append((os.path.join(path, f), kind))
            elif _partial_file(os.path.join(path, f)):
                found.append((_file_partial_of(os.path.join(path, f)), "partial file"))
            elif _orphan_record(os.path.join(path, f)):
                found.append((os.path.join(path, f), "file record"))
            elif _record_temp(os.path.join(path, f)):
                found.append((os.path.join(path, f), "record temp"))
    if os.path.isdir(parent):  # an output path: its partials, set-aside old versions and a file export's record
        for f in sorted(os.listdir(parent)):
            if f.startswith((f".{base}.partial-", f".{base}.old-")) and os.path.isdir(os.path.join(parent, f)):
                found.append((os.path.join(parent, f), _kind(f)))
            elif f.startswith(f".{base}.partial-") and _partial_file(os.path.join(parent, f)):
                found.append((_file_partial_of(os.path.join(parent, f)), "partial file"))
            elif f == f".{base}{file_records.SUFFIX}" and _orphan_record(os.path.join(parent, f)):
                found.append((os.path.join(parent, f), "file record"))
            elif f.startswith((f".{base}{file_records.SUFFIX}.tmp-", f".{base}.partial-")) and \
                    _record_temp(os.path.join(parent, f)):
                found.append((os.path.join(parent, f), "record temp"))
    return found


def _partial_file(path: str) -> bool:
    """Whether ``path`` is a file export's partial (``.NAME.partial-TOKEN``, a regular file) or the owner
    record beside one (:data:`~blocklin.storage.file_records.OWNER_SUFFIX`)."""
    name = os.path.basename(path)
    if name.endswith(file_records.OWNER_SUFFIX):
        name = name[:-len(file_records.OWNER_SUFFIX)]
    return bool(_PARTIAL.match(name)) and os.path.isfile(path) and not os.path.islink(path)


def _file_partial_of(path: str) -> str:
    """The partial file that ``path`` (the partial or its owner record) belongs to."""
    return path[:-len(file_records.OWNER_SUFFIX)] if path.endswith(file_records.OWNER_SUFFIX) else path


def _classify_partial_file(path: str, sizes: bool = True) -> Leftover:
    """A file export's partial: removed, with its owner record, where the run that wrote it is gone."""
    owner = file_records.read_owner(path)
    item = Leftover(path, "partial file", 0, owner)
    if owner is not None and ownership.is_alive(owner):
        item.action, item.reason = "kept", f"a live run owns it ({ownership.describe(owner)})"
    elif owner is None and not _TOKEN.search(os.path.basename(path)):
        item.action, item.reason = "skipped", "no owner record, and not under blocklin's name (.NAME.partial- " \
                                              "and 16 hex digits): not blocklin's; left alone"
    elif owner is None and os.path.exists(path) and time.time() - _mtime(Location(path)) < ownership.LEASE_SECONDS:
        item.action, item.reason = "kept", "no owner record, and written to in the last 10 minutes (an older " \
                                           "blocklin may still be writing it)"
    else:
        item.action = "remove"
        item.reason = f"its run is gone ({ownership.describe(owner)})" if owner else "no owner record"
    if sizes or item.action == "remove":
        for p in (path, path + file_records.OWNER_SUFFIX):
            try:
                item.bytes += os.lstat(p).st_size
            except OSError:
                pass
    return item


def _is_zarr(path: str) -> bool:
    return os.path.exists(os.path.join(path, "zarr.json")) or os.path.exists(os.path.join(path, ".zarray"))


def _kind(name: str) -> str | None:
    if _PARTIAL.match(name):
        return "partial output"
    if _OLD.match(name):
        return "old output"
    if _WORK.match(name) or (name.startswith("blocklin-stage-") and "." not in name):
        return "work folder"
    return None


def _remote_candidates(loc: Location) -> list[tuple[Location, str]]:
    be = backend(loc)
    if be.try_read(PENDING_RECORD) is not None:
        return [(loc, "partial output")]
    found = []
    try:
        children = be.fs.ls(be.root, detail=False)  # type: ignore[attr-defined]
    except (FileNotFoundError, OSError):
        return []
    for child in sorted(children):
        name = child.rstrip("/").rsplit("/", 1)[-1]
        if _WORK.match(name):
            found.append((loc / name, "work folder"))
        elif backend(loc / name).try_read(PENDING_RECORD) is not None:
            found.append((loc / name, "partial output"))
    return found


def find_leftovers(paths: Iterable[Any], *, sizes: bool = True) -> list[Leftover]:
    """The leftovers at, under (one level) or beside each path, each with the action ``clean`` takes."""
    out: list[Leftover] = []
    seen: set[str] = set()
    for p in paths:
        loc = as_location(p, name="path")
        pairs = ([(Location(q), k) for q, k in _local_candidates(loc.url)] if loc.is_local
                 else _remote_candidates(loc))
        for cand, kind in pairs:
            for where, what in [(cand, kind), *_work_named_by(cand, kind)]:
                if where.url not in seen:
                    seen.add(where.url)
                    out.append(_classify(where, what, sizes))
    return out


def foreign_named(paths: Iterable[Any]) -> list[Leftover]:
    """The paths named that are themselves under a leftover's name (not found in a folder ``clean`` looks
    in, nor beside an output path) and that ``clean`` leaves alone, ``skipped``: not written by blocklin
    (a user's ``.notes.txt.partial-draft``), or a work folder without an owner record. ``blocklin clean``
    refuses those before it removes anything, where it had said "0 of 1 leftover(s) removed" and exited 0.
    Object-store prefixes are named by blocklin alone."""
    out = []
    for p in paths:
        loc = as_location(p, name="path")
        if not loc.is_local:
            continue
        own = _file_partial_of(os.path.abspath(os.path.expanduser(loc.url)))
        out += [i for i in find_leftovers([loc.url], sizes=False) if i.path == own and i.action == "skipped"]
    return out


def unowned_files(paths: Iterable[Any]) -> list[str]:
    """The local paths named that are ordinary files blocklin did not write: not a leftover itself (a file
    export's partial or orphan record, a record's temp), not a file export whose record ``.NAME.blocklin``
    describes it as it is now, and not such a record. ``clean`` looks beside such a file for the leftovers
    of an output of that name and never touches the file itself; it had said "nothing to clean" and exited 0,
    as though the file had been looked at and found clean."""
    out = []
    for p in paths:
        loc = as_location(p, name="path")
        if not loc.is_local:
            continue
        path = os.path.abspath(os.path.expanduser(loc.url))
        if not os.path.isfile(path) or _partial_file(path) or _orphan_record(path) or _record_temp(path):
            continue
        if file_records.read_own(path) is not None:  # a live export's own record
            continue
        if file_records.matches(path, file_records.read_own(file_records.record_path(path))):
            continue  # a file export blocklin wrote: an output path, looked beside as before
        out.append(path)
    return out


def _work_named_by(cand: Location, kind: str) -> list[tuple[Location, str]]:
    """The work folder a partial output's markers name (its run's steps, under whatever temp dir that run
    had: :data:`~blocklin.storage.records.WORK_FOLDER_RECORD`), so that ``blocklin clean PARTIAL``, what
    an interrupted run's line says, removes both; judged by its own owner record."""
    from blocklin.storage.atomic import DONE_DIR

    if kind != "partial output":
        return []
    named = named_work(cand / DONE_DIR)
    if not named:
        return []
    try:
        where = as_location(named, name="path")
    except (OSError, ValueError):
        return []
    return [(where, "work folder")] if ownership.read_record(where) is not None else []


def _remove(item: Leftover) -> bool:
    if item.kind == "file record":  # judged again: an export to that name may have written it meanwhile
        if _classify_record(item.path).action != "remove":
            return not os.path.lexists(item.path)
        os.unlink(item.path)
        return True
    if item.kind == "record temp":  # judged again: the same name is never written twice
        if _classify_record_temp(item.path).action != "remove":
            return False
        try:
            os.unlink(item.path)
        except FileNotFoundError:
            pass
        return True
    if item.kind == "partial file":  # judged again: a run may have taken that name meanwhile
        with ownership.claim_lock(os.path.dirname(item.path)):
            if _classify_partial_file(item.path, sizes=False).action != "remove":
                return False
            for p in (item.path, item.path + file_records.OWNER_SUFFIX):  # the partial first, its owner last
                try:
                    os.unlink(p)
                except FileNotFoundError:
                    pass
        return True
    loc = as_location(item.path, name="path")
    if not loc.is_local:
        backend(loc).remove("")
        return True
    with ownership.claim_lock(os.path.dirname(loc.url)):
        again = _classify(loc, item.kind, sizes=False) if os.path.isdir(loc.url) else None
        if again is None or again.action != "remove":  # gone already, or a run claimed it meanwhile
            return again is None
        rmtree_owner_last(loc.url)
    return not os.path.exists(loc.url)


def clean(paths: Iterable[Any] = (), *, dry_run: bool = False) -> list[Leftover]:
    """Remove the partial outputs and work folders whose owner is gone (never a live run's), and the
    records of file exports whose file is gone (where blocklin wrote them).

    Parameters
    ----------
    paths : iterable of paths or URLs
        Folders to look in (one level deep), output paths (their partials), or leftovers
        themselves. Default: the configured temp dir and the current folder.
    dry_run : bool
        Only say what would be removed.

    Returns
    -------
    list of Leftover
        Everything found, with ``action`` "removed" / "would remove" / "kept" / "skipped".
    """
    paths = list(paths)
    if not paths:
        from blocklin.config import get_config

        paths = [get_config().temp_dir, os.getcwd()]
    items = find_leftovers(paths)
    for item in items:
        if item.action == "remove":
            item.action = "would remove" if dry_run else ("removed" if _remove(item) else "kept")
    return items


def sweep_stale(root: Location) -> list[Leftover]:
    """Remove the work folders and partial outputs of gone runs directly under a local temp dir,
    saying what went (what a new job does before it adds its own)."""
    from blocklin.config import format_size
    from blocklin.errors import warn

    try:
        # resumable work of a gone run stays for its --resume rerun; `blocklin clean` removes it
        items = [i for i in find_leftovers([root.url], sizes=False)
                 if i.action == "remove" and i.kind not in ("file record", "record temp") and not (i.owner or {}).get("resumable")]
    except OSError:
        return []
    for item in items:
        if _remove(item):
            item.action = "removed"
            warn(f"removed the {item.kind} of a run that is gone: {item.path} ({format_size(item.bytes)})")
    return items


def remove_stale_work(root: Any, keep: Location | None, *, operation: str, output: str,
                      why: str = "whose inputs or parameters differ") -> list[Leftover]:
    """Remove the work folders under ``root`` (or ``root`` itself, a work folder) that gone runs of
    ``operation`` writing ``output`` left under another identity or in another place than ``keep``
    (no rerun can continue them: their inputs or parameters changed since, or their output started
    over), saying what went and ``why`` it can no longer be continued."""
    from blocklin.config import format_size
    from blocklin.errors import warn

    try:
        items = [i for i in find_leftovers([root], sizes=False)
                 if i.kind == "work folder" and i.action == "remove" and (keep is None or i.path != keep.url)
                 and (i.owner or {}).get("operation") == operation and (i.owner or {}).get("for_output") == output]
    except OSError:
        return []
    for item in items:
        if _remove(item):
            item.action = "removed"
            warn(f"removed the work folder of an earlier run of {operation} to {output} {why}: {item.path} "
                 f"({format_size(item.bytes)})")
    return items


def named_work(marker_dir: Location) -> str | None:
    """The work folder that an output's marker folder ``marker_dir`` names as its run's
    (:data:`~blocklin.storage.records.WORK_FOLDER_RECORD`), or None."""
    try:
        raw = backend(marker_dir).try_read(WORK_FOLDER_RECORD)
    except OSError:
        return None
    named = raw.decode(errors="replace").rstrip("/") if raw is not None else ""
    return named or None


def remove_named_work(named: str | None, *, output: str, why: str, keep: Location | None = None,
                      besides: Location | None = None) -> list[Leftover]:
    """Remove the work folder ``named`` by an output's markers (:func:`named_work`) where that output's
    run is started over or its partial removed: no rerun can continue the folder any more. Not
    ``keep`` (this run's folder), nor one directly under ``besides`` (the temp dir this run uses, where
    the job continues or replaces it itself). Removed only where it holds the owner record of a gone
    run writing ``output``, saying so with ``why``; what matters is a folder a run kept under another
    temp dir. Not under the claim lock of the folder that holds it (:func:`_remove` takes it)."""
    if not named or (keep is not None and named == keep.url.rstrip("/")):
        return []
    if besides is not None and named.rsplit("/", 1)[0] == besides.url.rstrip("/"):
        return []
    try:
        rec = ownership.read_record(as_location(named, name="path"))
    except (OSError, ValueError):
        return []
    operation = (rec or {}).get("operation")
    if not operation:
        return []
    try:
        return remove_stale_work(named, keep, operation=operation, output=output, why=why)
    except OSError:  # not this run's business to fail on: `blocklin clean` removes it later
        return []


def abandon_held(*, keep_partials: bool) -> None:
    """After an interrupt, drop what this process still owns: a signal that lands between a claim
    and the code that would clean it up leaves it held. What a rerun with ``--resume`` continues
    (resumable partial outputs and work folders, every partial output when ``keep_partials``) is
    kept with its record marked released (:func:`keep_for_resume`); the rest is removed."""
    from blocklin.storage.zarr_store import wait_for_pending_io

    held = ownership.Heartbeat.held()
    if not held:
        return
    wait_for_pending_io()
    for loc, rec in held:
        ownership.Heartbeat.release(loc)
        if rec.get("resumable") or ("output" in rec and keep_partials):
            ownership.mark_released(loc, rec)
            keep_for_resume(loc, "partial output" if "output" in rec else "work folder")
        else:
            backend(loc).remove("")


#: What interrupted runs of this process kept for a rerun with ``--resume``, not reported yet.
_KEPT: list[tuple[str, str]] = []


def keep_for_resume(loc: Location, kind: str) -> None:
    """Note that an interrupted run kept ``loc`` (a partial output or a work folder) for ``--resume``."""
    if loc.url not in {p for p, _ in _KEPT}:
        _KEPT.append((loc.url, kind))


def take_kept() -> list[tuple[str, str]]:
    """``(path, kind)`` of what interrupted runs kept since the last call (and forget them)."""
    kept = list(_KEPT)
    _KEPT.clear()
    return kept


#: Outputs a CLI command committed: an interrupt that lands after a commit (while the job removes its work
#: folder, or between the two outputs of a QR) says they are complete. None while no command records them
#: (the Python API: a long session would have kept every output's name).
_WRITTEN: list[str] | None = None


def note_written(path: Any) -> None:
    """Note that ``path`` (an output just committed: complete, in place) was written, while recording."""
    url = str(getattr(path, "url", path))
    if _WRITTEN is not None and url not in _WRITTEN:
        _WRITTEN.append(url)


def take_written(*, record: bool = False) -> list[str]:
    """The outputs committed since the last call; ``record``: go on recording (a command starting), else stop."""
    global _WRITTEN
    written, _WRITTEN = list(_WRITTEN or ()), ([] if record else None)
    return written


def kept_message(kept: list[tuple[str, str]]) -> str:
    """How to continue or remove what an interrupted run kept (one line)."""
    paths = " ".join(p for p, _ in kept)
    what = " and ".join(f"{kind} {p}" for p, kind in kept)
    return (f"the finished work is kept in {what}: rerun with --resume (resume=True) to continue it (a rerun "
            f"without it starts over and removes it), or remove it with `blocklin clean {paths}`")


def report_kept() -> None:
    """Say what interrupted runs kept (a warning), unless the CLI says it in its own line."""
    from blocklin import interrupt
    from blocklin.errors import warn

    if _KEPT and not interrupt.signals_handled():
        warn(kept_message(take_kept()))


__all__ = ["Leftover", "abandon_held", "clean", "find_leftovers", "keep_for_resume", "kept_message",
           "named_work", "note_written", "remove_named_work", "remove_stale_work", "report_kept", "sweep_stale", "take_kept",
           "take_written"]
