"""Atomic outputs on every backend, resumable after an interruption.

Two commit protocols behind one class, :class:`AtomicOutput`:

*Local paths* (rename). The output ``OUT`` is built in a sibling folder ``.OUT.partial-<token>``
and renamed into place when complete; an interrupted job leaves nothing at ``OUT``.

*URLs* (``s3://``, ``gs://``, ``memory://``, ``file://``...: no rename on object stores). Chunks
are written under the final prefix. The job first writes the pending record
``OUT/.blocklin-pending.json`` (its token); zarr metadata of every node is deferred to
``NODE/.blocklin-meta.json``. The commit deletes the resume markers, writes each node's
``zarr.json`` (the root's last, with the provenance), and finally deletes the pending record: that
deletion is the commit. Until then plain zarr readers find no ``zarr.json`` at ``OUT``, and
:func:`blocklin.open` / ``blocklin info`` refuse the output with a message saying how to resume or
remove it. With ``overwrite=True`` the old output is removed when the job starts (after the
pending record is written, so the prefix is never mistaken for a finished output); only an output
blocklin wrote is ever removed (:mod:`blocklin.storage.guard` holds the rules every output obeys).

Either way each run *owns* its partial output: an owner record
(:mod:`blocklin.storage.ownership`: pid, host, start time, heartbeat) is written inside it before any
data. A second run to the same output fails with :class:`~blocklin.errors.OutputBusyError` ("another
run is writing OUT (pid P on HOST since T)") while that owner is alive, with or without ``resume``;
the partial of an owner that is gone is taken over (``resume=True``) or removed. Locally a commit
that replaces an existing output swaps the two folders in one step (``renameat2`` with
``RENAME_EXCHANGE`` on Linux) and removes the old one afterwards, so the path always holds one
whole output, never a mix; chunks of a committed output are never rewritten in place.

Either way each finished unit of work (a tile, a block) leaves a marker under ``.blocklin-done/``
so a rerun with ``resume=True`` and the same token skips it; markers, deferred metadata and stray
temporary chunk names are gone from a committed output.

A resumable output (one claimed with a deterministic ``token``) records its inputs' content stamps
(:mod:`blocklin.storage.stamps`) in ``.blocklin-inputs.json`` beside the markers when it is claimed;
a run that resumes it compares them with today's and starts over, saying which input changed,
when any differs (or the record is missing). So every resumable operation either continues work
done on the inputs it reads today or starts over; no token builder has to stamp its inputs. An
interrupt (Ctrl-C, SIGTERM) keeps a resumable output's partial for a rerun with ``resume=True``
(with or without ``resume`` on the interrupted run); other errors remove it unless ``resume``.
"""

from __future__ import annotations

import datetime
import json
import os
import re
import shlex
import shutil
import sys
import uuid
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import zarr

from blocklin._version import __version__
from blocklin import jsonsafe
from blocklin.errors import OutputBusyError, OutputExistsError, explain, warn
from blocklin.storage import input_guard, ownership, stamps
from blocklin.storage.backend import backend, rmtree_owner_last
from blocklin.storage.cleanup import note_written
from blocklin.storage.completeness import STORED_KEY, count_stored
from blocklin.storage.guard import (MEMBERS_KEY, check_output, check_replaceable, check_replaceable_prefix,
                                     complete_output_refusal, partial_folders, output_members)
from blocklin.storage.location import Location, as_location
from blocklin.storage.space import folder_size
from blocklin.storage.records import DEFERRED_META, INPUTS_RECORD, OWNER_RECORD, PENDING_RECORD
from blocklin.storage.zarr_store import wait_for_pending_io

_DONE = ".blocklin-done"
#: The markers' folder inside a partial output (public for :mod:`blocklin.storage.cleanup`).
DONE_DIR = _DONE
#: Names of chunk files a writer killed mid-write can leave behind: ``NAME.tmp-PID-HEX`` (``rawchunks``,
#: local backends) and zarr's own ``NAME.<uuid4 hex>.partial`` (its LocalStore writes every chunk
#: and ``zarr.json`` to that name and then renames it; a SIGKILL in between leaves it).
_TMP_RE = re.compile(r"(?:\.tmp-\d+-[0-9a-f]+|\.[0-9a-f]{32}\.partial)$")


def check_output_path(out: str | os.PathLike, inputs: Iterable[str | os.PathLike | None] = (), *,
                      overwrite: bool = False, name: str = "out", kind: str = "zarr", resume: bool = False) -> Path:
    """Validate a local output path (:func:`blocklin.storage.guard.check_output`: not an input, not
    inside or holding one, and existing only where ``overwrite`` may replace it); returns it."""
    check_output(out, inputs, overwrite=overwrite, name=name, kind=kind, resume=resume)
    return Path(out).expanduser()


def _coverage(inputs: list, storage_options: dict | None, record: list[dict]) -> list[dict]:
    """What the output is computed from, per stored zarr input (:func:`blocklin.storage.versions.coverage`),
    from the inputs' stamp ``record`` where it lists their files (no second listing): recorded in the
    provenance so that :func:`blocklin.update` can tell which rows are new."""
    out = []
    for i in inputs:
        i, rows = i if isinstance(i, tuple) else (i, None)  # (input, the rows the operation reads of it)
        try:
            loc = stamps.input_location(i, storage_options)
        except (OSError, ValueError, TypeError, KeyError):  # not a zarr array: nothing a later append grows
            continue
        c = input_guard.covered_by(loc, record)
        if c is not None and rows is not None and c["shape"][0] != rows:
            c = _covered_version(loc, c, rows)
        if c is not None:
            out.append(c)
    return out


def _covered_version(loc: Any, today: dict, rows: int) -> dict | None:
    """What an operation that reads the first ``rows`` rows of an input covers, where appends committed
    since it opened the input (today's shape has more rows): the version of ``rows`` rows, whose rows
    no append changes. None where the history does not lead from it to today's by appends alone (no
    coverage: an update is refused rather than told the result holds rows it never read)."""
    from blocklin.storage.versions import input_history

    chain = input_history(loc)
    last = max((j for j, v in enumerate(chain) if v.get("rows") == rows), default=None)
    if last is None or rows > today["shape"][0] or any(v.get("rewritten") for v in chain[last + 1:]) or \
            today["stamp"] not in [chain[-1].get("stamp")] + list(chain[-1].get("aliases") or []):
        return None
    return dict(today, shape=[rows] + list(today["shape"][1:]), stamp=chain[last].get("stamp"))


def remove_stray_temporaries(folder: str) -> int:
    """Delete chunk files that a killed writer left under a temporary name; returns how many."""
    n = 0
    for root, _dirs, files in os.walk(folder):
        for f in files:
            if _TMP_RE.search(f):
                try:
                    os.unlink(os.path.join(root, f))
                    n += 1
                except FileNotFoundError:
                    pass
    return n


class AtomicOutput:
    """A zarr output that readers see only when complete (see module docstring).

    Parameters
    ----------
    path : path, URL, Location or zarr store
        Final location.
    inputs : iterable
        Inputs of the operation (Locations, paths, URLs or file specs), refused as output, recorded
        in the provenance, and stamped for resume (see module docstring).
    overwrite : bool
        Replace an existing output (locally on commit; on object stores when the job starts): only
        one blocklin wrote, or an empty folder (:func:`blocklin.storage.guard.check_output`).
    resume : bool
        Continue the unfinished output an interrupted run with the same ``token`` left.
    token : str, optional
        Deterministic identity of the job (operation, inputs, plan): the output is then resumable
        (an interrupt keeps its partial; see module docstring). None: a random one, not resumable.
    storage_options : dict, optional
        fsspec options for a URL (merged over the configured ones).
    covered : iterable, optional
        The inputs whose version the provenance records as ``covers`` (for :func:`blocklin.update`);
        default all of ``inputs``.
    temp_dir : path, URL or Location, optional
        The job's temp dir (default: the configured one), which the output may not be nor hold.
    reads_output : bool
        The run reads the stored result it replaces (:func:`blocklin.update` adds the appended rows'
        terms to it): a local one is stamped with the inputs, so a resume after it was rewritten starts
        over instead of keeping units computed from its old values. (On object stores the old result
        is removed when the run starts and read from a copy made then; nothing to stamp.)

    Attributes
    ----------
    path : Location
        The final location.
    partial : Location
        Where the job writes: the sibling partial folder (local) or the final prefix marked pending.
    done : Location
        Folder of the resume markers.
    resumed : bool
        Whether an interrupted run's work is being continued.
    resumable : bool
        Whether a rerun with ``resume=True`` may continue this output (a ``token`` was given).
    input_record : list of dict
        The inputs' content stamps, taken when the run first opened each input (its job's, before any
        read: :func:`blocklin.storage.input_guard.stamps_for`), else at the claim (recorded in the
        partial where resumable); the commit refuses when they differ from the inputs' stamps then.
    """

    def __init__(self, path: Any, *, inputs: Iterable[Any] = (), overwrite: bool = False,
                 resume: bool = False, token: str | None = None, name: str = "out",
                 storage_options: dict | None = None, on_claim: Any = None, temp_dir: Any = None,
                 covered: Iterable[Any] | None = None, reads_output: bool = False) -> None:
        self.path = as_location(path, storage_options, name=name)
        inputs = [i for i in inputs if i is not None]
        covered = inputs if covered is None else [i for i in covered if i is not None]
        self.inputs = [str(i) for i in inputs]
        if temp_dir is None:
            from blocklin.config import get_config

            temp_dir = get_config().temp_dir
        check_output(self.path, self.inputs, overwrite=overwrite, name=name, temp_dir=temp_dir,
                     resume=resume)  # before any claim
        self._temp_root = as_location(temp_dir, storage_options, name="temp_dir")
        self._dead_work: list[tuple[str, str]] = []  # (work folder, why): removed once the claim is made
        self.overwrite = overwrite
        self.resume = resume
        self.resumable = token is not None
        self.token = token or uuid.uuid4().hex[:16]
        self._other_runs: list[dict] = []  # owner records of unfinished runs a resume could not continue
        # stamped at the run's first open (else at the claim), before the first read, and again at the
        # commit (every output), and kept in the partial for a resume (resumable outputs)
        self._input_locations = [stamps.input_location(i, storage_options) for i in inputs]
        if reads_output and self.path.is_local:
            self._input_locations.append(self.path)
        self.input_record: list[dict] = []
        self.committed = False
        self.kept = False  # the partial was kept for a rerun with resume=True (abort)
        self.name = name
        self.in_place = not self.path.is_local
        self.owner: dict | None = None
        self._claimed = False
        self._on_claim = on_claim
        try:
            if self.in_place:
                self._begin_in_place()
            else:
                self.partial = self.path.with_name(f".{self.path.name}.partial-{self.token}")
                with ownership.claim_lock(os.path.dirname(self.partial.url)):
                    self._claim_local()
            self._drop_named_work()  # outside the lock: the work folder may lie in the same folder
            input_guard.writes(self.partial, self.path)  # read back by the run: its own, not an input
            self.done = self.partial / _DONE
            self._be = backend(self.partial)
            # before any read: what the result is computed from (the stamps just listed, where resumable)
            self.covers = _coverage(covered, storage_options, self.input_record)
        except BaseException:  # refused, or interrupted mid-claim: nothing of this run stays
            self.abort()
            raise

    # -- in-place protocol (object stores) ---------------------------------------------------------
    def _record(self) -> dict | None:
        raw = backend(self.path).try_read(PENDING_RECORD)
        try:
            return json.loads(raw) if raw is not None else None
        except ValueError:
            return None

    # -- ownership ------------------------------------------------------------------------------
    @property
    def owner_location(self) -> Location:
        """Where this run's owner record lives (the partial folder, or the pending prefix)."""
        return self.path if self.in_place else self.partial

    def _check_not_busy(self, loc: Location, what: str) -> dict | None:
        """The owner record at ``loc``; raises :class:`OutputBusyError` when its run is alive."""
        rec = ownership.read_record(loc)
        if ownership.is_alive(rec) and not (ownership.is_mine(rec) and not ownership.Heartbeat.holds(rec)):
            raise OutputBusyError(busy_message(what, rec))
        return rec

    def _claim_local(self) -> None:
        """Under the folder's claim lock: refuse a live writer, clear what gone runs left, own the partial."""
        parent = os.path.dirname(self.partial.url)
        siblings = partial_folders(self.path)  # blocklin's: a folder of the user's named like one stays
        if os.path.lexists(self.partial.url) and self.partial.name not in siblings:
            raise OutputExistsError(explain(
                self.name, "needs its partial output's name free (a run writes there until it commits)",
                f"{self.partial.url!r} exists and is not a partial output blocklin wrote",
                f"move it away (mv {shlex.quote(self.partial.url)} ...) and rerun, or choose another path"))
        gone = {f: self._check_not_busy(Location(os.path.join(parent, f)), self.path.url) for f in siblings}
        self._claim()
        for f in siblings:
            stale = os.path.join(parent, f)
            if stale != self.partial.url or not self.resume:
                self._note_named_work(Location(stale) / _DONE, "whose partial output is removed")
                other = self.resume and stale != self.partial.url
                if other:
                    self._other_runs.append(gone[f] or {})
                report_removed(stale, "the partial output of an interrupted run with other arguments" if other
                               else "the partial output of a run that is gone")
        self.resumed = os.path.exists(self.partial.url)
        if self.resumed:  # its killed writer's temporaries; the commit sweeps again what this run leaves
            remove_stray_temporaries(self.partial.url)
        os.makedirs(self.partial.url, exist_ok=True)
        self._own()
        self._check_inputs()

    def _claim(self) -> None:
        """From here on the partial is this run's: :meth:`abort` removes it (the caller, a job,
        learns of the output now through ``on_claim``, before anything is written)."""
        self._claimed = True
        if self._on_claim is not None:
            self._on_claim(self)

    def _own(self) -> None:
        # before the write: undo finds it
        self.owner = ownership.new_record(output=self.path.url, token=self.token, resumable=self.resumable)
        ownership.write_record(self.owner_location, self.owner)
        ownership.Heartbeat.hold(self.owner_location, self.owner)

    def _note_named_work(self, marker_dir: Location, why: str) -> None:
        """Note the work folder the markers in ``marker_dir`` name, before they go: the run it belongs
        to is removed or started over here, and no rerun under this run's temp dir would find it."""
        from blocklin.storage.cleanup import named_work

        named = named_work(marker_dir)
        if named:
            self._dead_work.append((named, why))

    def _drop_named_work(self) -> None:
        """Remove the work folders noted by :meth:`_note_named_work` that a gone run of this output
        kept under another temp dir than this run's (never a live run's, never another output's)."""
        from blocklin.storage.cleanup import remove_named_work

        while self._dead_work:
            named, why = self._dead_work.pop(0)
            remove_named_work(named, output=self.path.url, besides=self._temp_root,
                              why=f"kept in another temp dir, {why}")

    def release(self) -> None:
        """Stop owning the partial (after the commit, or when it is kept for a resume)."""
        owner = self.owner
        if owner is None:
            return
        ownership.Heartbeat.release(self.owner_location)
        self.owner = None
        if self.committed:
            return
        try:
            current = ownership.read_record(self.owner_location)
            if current is not None and current.get("run") == owner["run"]:
                backend(self.owner_location).delete(OWNER_RECORD)
        except OSError:
            pass

    def _begin_in_place(self) -> None:
        be = backend(self.path)
        record = self._record()
        if record is not None:
            rec = self._check_not_busy(self.path, self.path.url)
            if self.resume and record.get("token") != self.token:
                self._other_runs.append(rec or {})
        if record is None and be.keys(""):  # a finished output, or other data
            complete = complete_output_refusal(self.path, be.try_read, self.name) if self.resume else None
            if complete is not None and not self.overwrite:
                raise complete
            if not self.overwrite:
                raise OutputExistsError(explain(self.name, "must not exist unless overwriting is asked for",
                                                f"{self.path.url!r} exists",
                                                "pass overwrite=True (CLI: --overwrite) or choose another path"))
            # Deleting objects cannot be undone: only an output blocklin wrote, never other data.
            check_replaceable_prefix(be, self.path, self.name)
        self.partial = self.path.with_pending()
        self.resumed = bool(record and self.resume and record.get("token") == self.token)
        self._claim()
        if not self.resumed:
            if record is not None:
                self._note_named_work(self.path / _DONE, "whose partial output is removed")
            # The record goes first, so that the prefix never looks finished while old data is removed.
            be.write_text(PENDING_RECORD, json.dumps({"token": self.token, "started": _now()}))
            be.delete_many([k for k in be.keys("") if k != PENDING_RECORD])
        self._own()
        # No lock on object stores: the last writer of the owner record wins, the others step back.
        won = ownership.read_record(self.path)
        if won is None or won.get("run") != self.owner["run"]:
            ownership.Heartbeat.release(self.path)
            self.owner, self._claimed = None, False  # the other run's now: abort leaves it alone
            raise OutputBusyError(busy_message(self.path.url, won or {}))
        self._check_inputs()

    # -- inputs ---------------------------------------------------------------------------------
    def _check_inputs(self) -> None:
        """Record the inputs' content stamps in the partial; a resumed partial whose inputs changed
        since its run (or that holds no record of them) is started over, with a warning that names
        the input. A resume that finds nothing to continue says so too. A run that is not resumable
        keeps the stamps for its commit's check only."""
        today = input_guard.stamps_for(self._input_locations)  # the run's, where it opened them already
        if not self.resumable:
            self.input_record = today
            return
        be = backend(self.partial)
        if self.resumed:
            recorded = stamps.read_record(be.try_read(INPUTS_RECORD))
            what = (["no record of the interrupted run's inputs was found"] if recorded is None
                    else stamps.changes(recorded, today))
            if what:
                warn(f"{'; '.join(what)}; starting over (the interrupted run's work on {self.path.url} is "
                     "discarded)")
                self.restart()
        elif self.resume and self._other_runs:
            warn(f"resume: no unfinished run of {self.path.url} to continue with these arguments; "
                 f"{_other_run(self._other_runs[0])} was made with another resume identity: another operation, "
                 "other parameters, inputs of other names, shapes, dtypes or chunks, or other settings its plans "
                 "depend on (memory, workers, device, codec). Its partial output was removed; starting fresh "
                 "(to continue such a run, rerun its command with --resume)")
        elif self.resume:
            warn(f"resume: no unfinished run of {self.path.url} to continue; starting fresh")
        be.write_text(INPUTS_RECORD, stamps.record_json(today))
        self.input_record = today

    @property
    def input_digest(self) -> str:
        """One digest of the inputs' content stamps (names the work folders tied to this output)."""
        return stamps.digest(self.input_record)

    # -- work units -----------------------------------------------------------------------------
    def is_done(self, unit: str) -> bool:
        return self._be.try_read(f"{_DONE}/{unit}") is not None

    def mark_done(self, unit: str) -> None:
        mark_done(self.done, unit)

    def completed_units(self) -> set[str]:
        return {k.rsplit("/", 1)[-1] for k in self._be.keys(_DONE)}

    def clear_units(self) -> None:
        """Forget every marker (their array was re-created)."""
        self._be.remove(_DONE)

    # -- zarr helpers -----------------------------------------------------------------------------
    def array_path(self, name: str | None = None) -> Location:
        """Location of the (sub-)array the job writes."""
        return self.partial if name is None else self.partial / name

    def has_array(self, name: str | None = None) -> bool:
        """Whether the partial holds the (sub-)array's metadata: a resumed run interrupted before
        creating it must create it, not open it."""
        be = backend(self.array_path(name))
        return be.exists("zarr.json") or be.exists(DEFERRED_META)

    # -- lifecycle -------------------------------------------------------------------------------
    def commit(self, operation: str, *, plan: dict | None = None, params: dict | None = None,
               report: dict | None = None, extra: dict | None = None) -> Location:
        """Record provenance and publish the output (rename locally, pending record removed in place),
        unless an input changed since the claim other than by appended rows
        (:mod:`blocklin.storage.input_guard`: :class:`~blocklin.errors.InputChangedError`)."""
        today = input_guard.check_unchanged(self.input_record, self._input_locations, self.path.url,
                                            covers=self.covers)
        input_guard.checked(self.input_record, today)
        provenance = {
            "operation": operation,
            "inputs": self.inputs,
            "plan": plan or {},
            "params": params or {},
            "report": report or {},
            "version": __version__,
            "created": _now(),
        }
        if self.covers:
            provenance["covers"] = self.covers
        if extra:
            provenance.update(extra)
        # the arrays this run wrote below the root: overwrite replaces those, never one added later
        members = output_members(self._be.keys(""))
        if members:
            provenance[MEMBERS_KEY] = members
        stored = count_stored(self.partial)  # an array's chunk files, checked when it is read again
        if stored is not None:
            provenance[STORED_KEY] = stored
        provenance = jsonsafe.strict(provenance, default=_json_default)  # zarr attributes: strict JSON, no NaN
        if self.in_place:
            self._commit_in_place(provenance)
        else:
            self._commit_local(provenance)
        self.committed = True
        note_written(self.path)
        self.release()
        return self.path

    def _check_still_owned(self) -> None:
        """Refuse the commit of a partial another run took over (a run on another host that found this
        one's heartbeat older than the lease, as a process stopped that long leaves it): its markers
        and chunks are that run's now, neither published nor touched here."""
        current = ownership.read_record(self.partial)
        if self.owner is not None and (current is None or current.get("run") != self.owner["run"]):
            raise OutputBusyError(explain(
                self.name, "must stay this run's output until it commits",
                f"{self.partial.url!r} taken over during this run by "
                f"{ownership.describe(current) if current else 'another run'}",
                "run one job per output at a time; rerun this one once the other is done or gone"))

    def _commit_local(self, provenance: dict) -> None:
        partial = self.partial.url
        self._check_still_owned()
        node = zarr.open(partial, mode="r+")
        node.attrs.update({"blocklin": provenance})
        shutil.rmtree(os.path.join(partial, _DONE), ignore_errors=True)
        backend(self.partial).delete(INPUTS_RECORD)
        final = self.path.url
        if os.path.lexists(final):  # appeared while we worked (overwrite replaces only what may go)
            if not self.overwrite:
                raise OutputExistsError(explain(self.name, "must not exist unless overwriting is asked for",
                                                f"{final!r} appeared during the run",
                                                "pass overwrite=True or choose another path"))
            check_replaceable(self.path, "zarr", self.name)
        remove_stray_temporaries(partial)
        # A claim that found the partial without its record would take its run for gone and remove it:
        # from the record's removal to the rename, no claim runs (they take this lock).
        with ownership.claim_lock(os.path.dirname(partial)):
            self._check_still_owned()
            ownership.Heartbeat.release(self.partial)  # no heartbeat may recreate the record below
            backend(self.partial).delete(OWNER_RECORD)
            old = swap_in(partial, final)
        _remove_replaced(old)

    def _commit_in_place(self, provenance: dict) -> None:
        be = backend(self.path)
        record = self._record()
        if not record or record.get("token") != self.token:
            raise OutputExistsError(explain(self.name, "must stay this job's output until it commits",
                                            f"{self.path.url!r} was taken over by another job during the run",
                                            "run one job per output; rerun this one with overwrite=True"))
        owner = ownership.read_record(self.path)
        if self.owner is not None and (owner is None or owner.get("run") != self.owner["run"]):
            raise OutputExistsError(explain(self.name, "must stay this run's output until it commits",
                                            f"{self.path.url!r} was taken over by another run during this one",
                                            "run one job per output; rerun this one with overwrite=True"))
        ownership.Heartbeat.release(self.path)
        be.delete(OWNER_RECORD)
        be.remove(_DONE)
        be.delete(INPUTS_RECORD)
        metas = [k for k in be.keys("") if k == DEFERRED_META or k.endswith("/" + DEFERRED_META)]
        # Children first, the root last: the root's zarr.json makes the output an array or group.
        for key in sorted(metas, key=lambda k: (-k.count("/"), k)):
            meta = json.loads(be.read_text(key))
            node = key[: -len(DEFERRED_META)]
            if node == "":
                meta.setdefault("attributes", {})["blocklin"] = provenance
            be.write_text(node + "zarr.json", json.dumps(meta, indent=2))
            be.delete(key)
        if DEFERRED_META not in metas:  # the root was created with its metadata in place
            node = zarr.open(store=_store(self.path), mode="r+")
            node.attrs.update({"blocklin": provenance})
        be.delete(PENDING_RECORD)  # the commit

    def restart(self) -> None:
        """Forget an interrupted run's work (markers and chunks): the output is started over."""
        keep = (PENDING_RECORD, OWNER_RECORD, INPUTS_RECORD)  # this run's, for the same inputs
        self._note_named_work(self.owner_location / _DONE, "whose output is started over")
        if getattr(self, "done", None) is not None:  # claimed: no claim lock is held now
            self._drop_named_work()
        if self.in_place:
            be = backend(self.path)
            be.delete_many([k for k in be.keys("") if k not in keep])
        else:
            os.makedirs(self.partial.url, exist_ok=True)
            for entry in os.listdir(self.partial.url):
                if entry not in keep:
                    backend(self.partial).remove(entry)
        self.resumed = False

    def abort(self, *, interrupted: bool | None = None, report: bool = True, refused: bool = False) -> None:
        """Drop the unfinished output unless it may be resumed: after an error with ``resume``, or
        after an interrupt (Ctrl-C, SIGTERM) of a resumable output, the partial is kept for a rerun
        with ``resume=True``, its owner record marked released.

        ``interrupted`` None: whether the exception being handled is a ``KeyboardInterrupt``.
        ``refused``: the run was refused before its work began (its budget): a partial it created goes
        even with ``resume``, one it took over stays as the interrupted run left it.
        ``report``: say at once what was kept (a job says it once for all it kept). Call it only
        once no task writes to the partial any more (:meth:`Job.run` waits for the tasks in flight
        before an interrupt or an error leaves it).
        """
        if self.committed or not self._claimed:
            return
        if interrupted is None:
            interrupted = isinstance(sys.exc_info()[1], KeyboardInterrupt)
        ownership.Heartbeat.release(self.owner_location)
        wait_for_pending_io()  # writes of an interrupted zarr call would recreate the folder or land later
        if (self.resume and not (refused and not self.resumed)) or (interrupted and self.resumable):
            self._keep(interrupted, report)
            return
        if self.in_place:
            owner = ownership.read_record(self.path)
            if owner is None or self.owner is None or owner.get("run") == self.owner["run"]:
                backend(self.path).remove("")
        else:  # never a partial another run took over (its record names that run)
            owner = ownership.read_record(self.partial)
            if owner is None or self.owner is None or owner.get("run") == self.owner["run"]:
                rmtree_owner_last(self.partial.url)
        self.owner, self._claimed = None, False

    def __enter__(self) -> AtomicOutput:
        return self

    def _keep(self, interrupted: bool, report: bool) -> None:
        """Keep the partial for a rerun with ``resume=True``: its record says its run let it go."""
        owner, self.owner, self._claimed, self.kept = self.owner, None, False, True
        current = ownership.read_record(self.owner_location)
        if owner is not None and current is not None and current.get("run") == owner["run"]:
            ownership.mark_released(self.owner_location, current)
        if interrupted:
            from blocklin.storage import cleanup

            cleanup.keep_for_resume(self.owner_location, "partial output")
            if report:
                cleanup.report_kept()

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None:
            self.abort(interrupted=issubclass(exc_type, KeyboardInterrupt))


def busy_message(out: str, rec: dict) -> str:
    """The error of a second writer: who writes ``out`` and what to do."""
    pid = rec.get("pid", "?")
    return (f"another run is writing {out} ({ownership.describe(rec)}). Fix: wait for it to finish, or stop it "
            f"(kill {pid} on {rec.get('host')}) and rerun with --resume (resume=True) to keep its finished "
            "work, or write to another path")


def _other_run(rec: dict) -> str:
    """The interrupted run an owner record names, as a resume that cannot continue it says it: when it
    started, its command, and the arguments in which that command differs from this process's."""
    when = f" started {rec['started']}" if rec.get("started") else ""
    command = f" by `{rec['command']}`" if rec.get("command") else ""
    differ = _arguments_that_differ(rec.get("command") or "", ownership.command_line())
    return f"the interrupted run{when}{command}" + (f" (its arguments differ: {differ})" if differ else "")


def _arguments_that_differ(then: str, now: str) -> str:
    """```-k 4` then, `-k 5` now``: the runs of arguments in which two command lines differ (``--resume`` and
    the program's name aside), or empty when they do not (a Python program calls with what it computes)."""
    import difflib

    def words(line: str) -> list[str]:
        try:
            return [w for w in shlex.split(line)[1:] if w != "--resume"]
        except ValueError:
            return []

    if not (then.startswith("blocklin ") and now.startswith("blocklin ")):  # only the CLI's say what they ran
        return ""
    a, b = words(then), words(now)
    out = []
    for tag, i0, i1, j0, j1 in difflib.SequenceMatcher(a=a, b=b, autojunk=False).get_opcodes():
        if tag != "equal":
            was, is_ = (f"`{shlex.join(w)}`" if w else "nothing" for w in (a[i0:i1], b[j0:j1]))
            out.append(f"{was} then, {is_} now")
    return "; ".join(out)


def report_removed(path: str, what: str) -> int:
    """Remove a local folder a gone run left and say so (with its size); returns the bytes freed."""
    size = folder_size(path)
    rmtree_owner_last(path)
    if os.path.exists(path):
        return 0
    from blocklin.config import format_size

    warn(f"removed {what}: {path} ({format_size(size)})")
    return size


def publish(partial: str, final: str) -> None:
    """Move the finished folder ``partial`` to ``final``, replacing what is there in one step
    (:func:`swap_in`), and remove what it replaced."""
    _remove_replaced(swap_in(partial, final))


def swap_in(partial: str, final: str) -> str | None:
    """Move the finished folder ``partial`` to ``final``; returns where what it replaced now is (None
    where ``final`` was free), for the caller to remove.

    With an existing ``final``, the two are exchanged atomically (``renameat2(RENAME_EXCHANGE)``,
    Linux) and the old output is then at ``partial``; where that call is missing, ``final`` is first
    renamed aside (readers then briefly find no output, never a mix).
    """
    if not os.path.lexists(final):
        os.rename(partial, final)
        return None
    if _exchange(partial, final):
        return partial
    old = os.path.join(os.path.dirname(final), f".{os.path.basename(final)}.old-{uuid.uuid4().hex[:8]}")
    os.rename(final, old)
    os.rename(partial, final)
    return old


def _remove_replaced(old: str | None) -> None:
    if old is not None:
        shutil.rmtree(old, ignore_errors=True) if os.path.isdir(old) and not os.path.islink(old) else os.unlink(old)


def _exchange(a: str, b: str) -> bool:
    """Swap two paths atomically (Linux ``renameat2`` with ``RENAME_EXCHANGE``); False when unsupported."""
    import ctypes
    import sys

    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    at_fdcwd, rename_exchange = -100, 2
    rc = renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange)
    return rc == 0


def open_or_create_array(ao: AtomicOutput, *, shape: tuple[int, ...], dtype: Any, chunks: tuple[int, ...],
                         codec: str | None) -> Any:
    """The output array of ``ao``: reopened when resuming a run that created it, else created.

    A partial output without array metadata is what an interrupted run leaves when tasks still
    running after the abort (Ctrl-C stops the scheduler, not the tasks in flight) write into the
    removed folder: its markers may name chunks the abort deleted, so it is started over. So is one
    whose array has another shape, chunking, dtype or codec than this run's: the resume tokens name
    what decides those, and this keeps a token that misses one from committing the other run's array.
    """
    from blocklin.errors import StoreNotFoundError, StoreReadError
    from blocklin.storage.zarr_store import create_array, describe_codecs, open_zarr

    if ao.resumed:
        try:
            arr = open_zarr(ao.array_path(), mode="r+", allow_pending=True)
            if (tuple(arr.shape) == tuple(shape) and tuple(arr.chunks) == tuple(chunks)
                    and np.dtype(arr.dtype) == np.dtype(dtype) and describe_codecs(arr) == (codec or "none").lower()):
                return arr
        except (StoreReadError, StoreNotFoundError):
            pass
        ao.restart()
    return create_array(ao.array_path(), shape=shape, dtype=dtype, chunks=chunks, codec=codec)


def mark_done(done: Location, unit: str) -> None:
    """Leave the resume marker of ``unit`` (an empty object) under the marker folder ``done``."""
    if done.is_local:
        os.makedirs(done.url, exist_ok=True)
        open(os.path.join(done.url, unit), "w").close()
    else:
        backend(done).write_bytes(unit, b"")


def is_done(done: Location | None, unit: str) -> bool:
    """Whether ``unit`` has its resume marker (tasks call this; ``done`` None means no resume)."""
    if done is None:
        return False
    if done.is_local:
        return os.path.exists(os.path.join(done.url, unit))
    return backend(done).try_read(unit) is not None


def _store(loc: Location) -> Any:
    from blocklin.storage.backend import zarr_store

    return zarr_store(loc)


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def _json_default(obj: Any) -> Any:
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    if isinstance(obj, (Path, Location)):
        return str(obj)
    if hasattr(obj, "__dataclass_fields__"):
        import dataclasses

        return dataclasses.asdict(obj)
    return str(obj)
