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
pending record is written, so the prefix is never mistaken for a finished output).

Either way each finished unit of work (a tile, a block) leaves a marker under ``.blocklin-done/``
so a rerun with ``resume=True`` and the same token skips it; markers, deferred metadata and stray
temporary chunk names are gone from a committed output.
"""

from __future__ import annotations

import datetime
import json
import os
import re
import shutil
import uuid
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import zarr

from blocklin._version import __version__
from blocklin.errors import OutputExistsError, OutputIsInputError, explain
from blocklin.storage.backend import backend
from blocklin.storage.location import Location, as_location
from blocklin.storage.zarr_store import DEFERRED_META, PENDING_RECORD

_DONE = ".blocklin-done"
#: Names of chunk files a writer killed mid-write can leave behind (``rawchunks`` and local backends).
_TMP_RE = re.compile(r"\.tmp-\d+-[0-9a-f]+$")


def check_output_path(out: str | os.PathLike, inputs: Iterable[str | os.PathLike | None] = (), *,
                      overwrite: bool = False, name: str = "out") -> Path:
    """Validate a local output path: not an input, and not existing unless ``overwrite``."""
    p = Path(out).expanduser()
    real = os.path.realpath(p)
    for inp in inputs:
        if inp is None:
            continue
        base = str(inp).split(":", 1)[0] if ":" in str(inp) and not os.path.exists(str(inp)) else str(inp)
        if os.path.realpath(base) == real:
            raise OutputIsInputError(explain(name, "must differ from every input (inputs are never modified)",
                                             f"{str(p)!r}, which is also an input", "choose another output path"))
    if p.exists() and not overwrite:
        raise OutputExistsError(explain(name, "must not exist unless overwriting is asked for", f"{str(p)!r} exists",
                                        "pass overwrite=True (CLI: --overwrite) or choose another path"))
    if not p.parent.exists():
        raise OutputExistsError(explain(name, "must be in an existing folder", f"parent {str(p.parent)!r} is missing",
                                        f"create it first: mkdir -p {p.parent}"))
    return p


def _same(a: str, b: Location) -> bool:
    if b.is_local:
        return "://" not in a and os.path.realpath(a) == os.path.realpath(b.url)
    return a.rstrip("/") == b.url.rstrip("/")


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
        Inputs of the operation, refused as output and recorded in the provenance.
    overwrite : bool
        Replace an existing output (locally on commit; on object stores when the job starts).
    resume : bool
        Continue the unfinished output an interrupted run with the same ``token`` left.
    token : str, optional
        Deterministic identity of the job (operation, inputs, plan); a random one when not resuming.
    storage_options : dict, optional
        fsspec options for a URL (merged over the configured ones).

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
    """

    def __init__(self, path: Any, *, inputs: Iterable[Any] = (), overwrite: bool = False,
                 resume: bool = False, token: str | None = None, name: str = "out",
                 storage_options: dict | None = None) -> None:
        self.path = as_location(path, storage_options, name=name)
        self.inputs = [str(i) for i in inputs if i is not None]
        for inp in self.inputs:
            if _same(inp, self.path):
                raise OutputIsInputError(explain(name, "must differ from every input (inputs are never modified)",
                                                 f"{self.path.url!r}, which is also an input",
                                                 "choose another output path"))
        self.overwrite = overwrite
        self.resume = resume
        self.token = token or uuid.uuid4().hex[:16]
        self.committed = False
        self.name = name
        self.in_place = not self.path.is_local
        if self.in_place:
            self._begin_in_place()
        else:
            check_output_path(self.path.url, overwrite=overwrite, name=name)
            self.partial = self.path.with_name(f".{self.path.name}.partial-{self.token}")
            if os.path.exists(self.partial.url) and not resume:
                shutil.rmtree(self.partial.url)
            self.resumed = os.path.exists(self.partial.url)
            os.makedirs(self.partial.url, exist_ok=True)
        self.done = self.partial / _DONE
        self._be = backend(self.partial)

    # -- in-place protocol (object stores) ---------------------------------------------------------
    def _record(self) -> dict | None:
        raw = backend(self.path).try_read(PENDING_RECORD)
        try:
            return json.loads(raw) if raw is not None else None
        except ValueError:
            return None

    def _begin_in_place(self) -> None:
        be = backend(self.path)
        record = self._record()
        if record is None and be.keys(""):  # a finished output, or other data
            if not self.overwrite:
                raise OutputExistsError(explain(self.name, "must not exist unless overwriting is asked for",
                                                f"{self.path.url!r} exists",
                                                "pass overwrite=True (CLI: --overwrite) or choose another path"))
            if be.try_read("zarr.json") is None and be.try_read(".zarray") is None:
                # Deleting objects cannot be undone: replace zarr stores only, never a bucket's other data.
                raise OutputExistsError(explain(self.name, "may replace an existing zarr array or group only",
                                                f"{self.path.url!r}, which holds other objects",
                                                "choose a new prefix such as s3://bucket/result.zarr"))
        self.partial = self.path.with_pending()
        self.resumed = bool(record and self.resume and record.get("token") == self.token)
        if self.resumed:
            return
        # The record goes first, so that the prefix never looks finished while old data is removed.
        be.write_text(PENDING_RECORD, json.dumps({"token": self.token, "started": _now()}))
        be.delete_many([k for k in be.keys("") if k != PENDING_RECORD])

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

    # -- lifecycle -------------------------------------------------------------------------------
    def commit(self, operation: str, *, plan: dict | None = None, params: dict | None = None,
               report: dict | None = None, extra: dict | None = None) -> Location:
        """Record provenance and publish the output (rename locally, pending record removed in place)."""
        provenance = {
            "operation": operation,
            "inputs": self.inputs,
            "plan": plan or {},
            "params": params or {},
            "report": report or {},
            "version": __version__,
            "created": _now(),
        }
        if extra:
            provenance.update(extra)
        provenance = json.loads(json.dumps(provenance, default=_json_default))
        if self.in_place:
            self._commit_in_place(provenance)
        else:
            self._commit_local(provenance)
        self.committed = True
        return self.path

    def _commit_local(self, provenance: dict) -> None:
        partial = self.partial.url
        node = zarr.open(partial, mode="r+")
        node.attrs.update({"blocklin": provenance})
        shutil.rmtree(os.path.join(partial, _DONE), ignore_errors=True)
        remove_stray_temporaries(partial)
        final = self.path.url
        if os.path.exists(final):
            if not self.overwrite:  # appeared while we worked
                raise OutputExistsError(explain(self.name, "must not exist unless overwriting is asked for",
                                                f"{final!r} appeared during the run",
                                                "pass overwrite=True or choose another path"))
            trash = os.path.join(os.path.dirname(final), f".{os.path.basename(final)}.old-{uuid.uuid4().hex[:8]}")
            os.rename(final, trash)
            os.rename(partial, final)
            shutil.rmtree(trash, ignore_errors=True) if os.path.isdir(trash) else os.unlink(trash)
        else:
            os.rename(partial, final)

    def _commit_in_place(self, provenance: dict) -> None:
        be = backend(self.path)
        record = self._record()
        if not record or record.get("token") != self.token:
            raise OutputExistsError(explain(self.name, "must stay this job's output until it commits",
                                            f"{self.path.url!r} was taken over by another job during the run",
                                            "run one job per output; rerun this one with overwrite=True"))
        be.remove(_DONE)
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
        if self.in_place:
            be = backend(self.path)
            be.delete_many([k for k in be.keys("") if k != PENDING_RECORD])
        else:
            shutil.rmtree(self.partial.url, ignore_errors=True)
            os.makedirs(self.partial.url, exist_ok=True)
        self.resumed = False

    def abort(self) -> None:
        """Drop the unfinished output unless it may be resumed."""
        if self.committed or self.resume:
            return
        if self.in_place:
            record = self._record()
            if record and record.get("token") == self.token:
                backend(self.path).remove("")
        else:
            shutil.rmtree(self.partial.url, ignore_errors=True)

    def __enter__(self) -> AtomicOutput:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None:
            self.abort()


def open_or_create_array(ao: AtomicOutput, *, shape: tuple[int, ...], dtype: Any, chunks: tuple[int, ...],
                         codec: str | None) -> Any:
    """The output array of ``ao``: reopened when resuming a run that created it, else created.

    A partial output without array metadata is what an interrupted run leaves when tasks still
    running after the abort (Ctrl-C stops the scheduler, not the tasks in flight) write into the
    removed folder: its markers may name chunks the abort deleted, so it is started over.
    """
    from blocklin.errors import StoreNotFoundError, StoreReadError
    from blocklin.storage.zarr_store import create_array, open_zarr

    if ao.resumed:
        try:
            arr = open_zarr(ao.array_path(), mode="r+", allow_pending=True)
            if tuple(arr.shape) == tuple(shape) and tuple(arr.chunks) == tuple(chunks):
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
    import numpy as np

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
