"""Atomic outputs: write under a temporary name, rename when complete, resume an interrupted job.

An output ``OUT`` is built in a sibling folder ``.OUT.partial-<token>``. Each finished unit of work
(a tile, a chunk panel) leaves a marker file in ``<partial>/.blocklin-done/``, so a rerun with
``resume=True`` and the same token skips it. :meth:`AtomicOutput.commit` records provenance,
drops the markers and renames the folder into place; nothing at ``OUT`` ever looks finished early.
"""

from __future__ import annotations

import datetime
import json
import os
import shutil
import uuid
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import zarr

from blocklin.errors import OutputExistsError, OutputIsInputError, explain

_DONE = ".blocklin-done"


def _version() -> str:
    from blocklin import __version__

    return __version__


def check_output_path(out: str | os.PathLike, inputs: Iterable[str | os.PathLike | None] = (), *,
                      overwrite: bool = False, name: str = "out") -> Path:
    """Validate an output path: not an input, and not existing unless ``overwrite``."""
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


class AtomicOutput:
    """A zarr output folder that appears at its final path only when complete.

    Parameters
    ----------
    path : path-like
        Final location.
    inputs : iterable of paths
        Inputs of the operation, refused as output and recorded in the provenance.
    overwrite : bool
        Replace an existing output on commit.
    resume : bool
        Reuse a partial folder left by an interrupted run with the same ``token``.
    token : str, optional
        Deterministic identity of the job (operation, inputs, plan); a random one when not resuming.
    """

    def __init__(self, path: str | os.PathLike, *, inputs: Iterable[Any] = (), overwrite: bool = False,
                 resume: bool = False, token: str | None = None, name: str = "out") -> None:
        self.inputs = [str(i) for i in inputs if i is not None]
        self.path = check_output_path(path, self.inputs, overwrite=overwrite, name=name)
        self.overwrite = overwrite
        self.resume = resume
        self.token = token or uuid.uuid4().hex[:16]
        self.partial = self.path.parent / f".{self.path.name}.partial-{self.token}"
        self.committed = False
        if self.partial.exists() and not resume:
            shutil.rmtree(self.partial)
        self.resumed = self.partial.exists()
        self.partial.mkdir(exist_ok=True)
        (self.partial / _DONE).mkdir(exist_ok=True)

    # -- work units -----------------------------------------------------------------------------
    def done_marker(self, unit: str) -> Path:
        return self.partial / _DONE / unit

    def is_done(self, unit: str) -> bool:
        return self.done_marker(unit).exists()

    def mark_done(self, unit: str) -> None:
        self.done_marker(unit).touch()

    def completed_units(self) -> set[str]:
        return {p.name for p in (self.partial / _DONE).iterdir()}

    # -- zarr helpers -----------------------------------------------------------------------------
    def array_path(self, name: str | None = None) -> str:
        """Path of the (sub-)array inside the partial folder."""
        return str(self.partial if name is None else self.partial / name)

    # -- lifecycle -------------------------------------------------------------------------------
    def commit(self, operation: str, *, plan: dict | None = None, params: dict | None = None,
               report: dict | None = None, extra: dict | None = None) -> Path:
        """Record provenance, drop markers, and move the result into place."""
        provenance = {
            "operation": operation,
            "inputs": self.inputs,
            "plan": plan or {},
            "params": params or {},
            "report": report or {},
            "version": _version(),
            "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        }
        if extra:
            provenance.update(extra)
        node = zarr.open(str(self.partial), mode="r+")
        node.attrs.update({"blocklin": json.loads(json.dumps(provenance, default=_json_default))})
        shutil.rmtree(self.partial / _DONE, ignore_errors=True)
        if self.path.exists():
            if not self.overwrite:  # appeared while we worked
                raise OutputExistsError(explain("out", "must not exist unless overwriting is asked for",
                                                f"{str(self.path)!r} appeared during the run",
                                                "pass overwrite=True or choose another path"))
            trash = self.path.parent / f".{self.path.name}.old-{uuid.uuid4().hex[:8]}"
            os.rename(self.path, trash)
            os.rename(self.partial, self.path)
            shutil.rmtree(trash, ignore_errors=True) if trash.is_dir() else trash.unlink()
        else:
            os.rename(self.partial, self.path)
        self.committed = True
        return self.path

    def abort(self) -> None:
        """Drop the partial output unless it may be resumed."""
        if not self.committed and not self.resume:
            shutil.rmtree(self.partial, ignore_errors=True)

    def __enter__(self) -> AtomicOutput:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None:
            self.abort()


def _json_default(obj: Any) -> Any:
    import numpy as np

    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    if isinstance(obj, Path):
        return str(obj)
    if hasattr(obj, "__dataclass_fields__"):
        import dataclasses

        return dataclasses.asdict(obj)
    return str(obj)
