"""Saved results of finished passes, so that ``resume=True`` skips them.

Two shapes of the same idea, both kept inside the unfinished output (so the commit removes them and
a run without ``resume`` starts clean):

* :class:`Checkpoints`, for the iterative factorizations (svd, eigsh, pca), whose whole state lives
  in memory between passes (the ``N x l`` block of a power iteration, the Krylov basis of block
  Lanczos, the column means). Each pass over ``A`` is deterministic in that state (seeded random
  blocks, a plan that does not depend on the scheduler). After every completed pass the state is
  saved in the output's partial folder (``OUT.partial-TOKEN/work/NAME.npz``, written to a temporary
  name and renamed, so a checkpoint is either complete or absent); a rerun with the same token
  restores the newest and continues with the next pass, bit for bit.
* :class:`PassResults`, for operations whose output is written only at the end (a solve: passes
  over ``A``, then a small in-core problem): each pass's result (a dict of arrays and numbers) is
  saved exactly beside the output's resume markers, through the storage backend (object stores
  too), named by the pass and, where a pass depends on an earlier result (a refinement pass on
  ``x``), by a token of that input.

Operations that run many steps over intermediate stores (the inverse) use
:class:`blocklin.runtime.stages.Stages` instead.
"""

from __future__ import annotations

import io
import os
from collections.abc import Callable
from typing import Any

import numpy as np

from blocklin.storage.backend import backend


class Checkpoints:
    """Named checkpoints in an atomic output's partial folder (disabled: every call a no-op)."""

    def __init__(self, ao: Any = None, *, enabled: bool = True) -> None:
        self.folder = None
        self.restored: list[str] = []
        if ao is not None and enabled and ao.partial.is_local:
            self.folder = os.path.join(ao.partial.url, "work")
            os.makedirs(self.folder, exist_ok=True)

    @property
    def enabled(self) -> bool:
        return self.folder is not None

    def _path(self, name: str) -> str:
        return os.path.join(self.folder, f"{name}.npz")

    def load(self, name: str) -> dict | None:
        """The arrays saved under ``name`` (scalars come back as 0-d arrays), or None."""
        if self.folder is None or not os.path.exists(self._path(name)):
            return None
        with np.load(self._path(name), allow_pickle=False) as z:
            data = {key: z[key] for key in z.files}
        self.restored.append(name)
        return data

    def save(self, name: str, **arrays: Any) -> None:
        """Save ``arrays`` under ``name`` atomically (a temporary file renamed over the old one)."""
        if self.folder is None:
            return
        tmp = os.path.join(self.folder, f".{name}.tmp.npz")
        with open(tmp, "wb") as f:
            np.savez(f, **{key: np.asarray(value) for key, value in arrays.items()})
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self._path(name))

    def clear(self) -> None:
        """Remove every checkpoint (before the output is committed: they are no part of it)."""
        if self.folder is not None:
            import shutil

            shutil.rmtree(self.folder, ignore_errors=True)
            self.folder = None


class PassResults:
    """Pass results saved under ``done`` (an atomic output's marker folder), or nowhere when ``done`` is None."""

    def __init__(self, done: Any = None) -> None:
        self.done = done
        self.loaded: list[str] = []

    def __call__(self, name: str, compute: Callable[[], dict]) -> dict:
        """``compute()``, or its saved result from an interrupted run."""
        if self.done is None:
            return compute()
        key = f"result-{name}.npz"
        raw = backend(self.done).try_read(key)
        if raw is not None:
            with np.load(io.BytesIO(raw), allow_pickle=False) as z:
                self.loaded.append(name)
                return {k: (z[k][()] if z[k].ndim == 0 else z[k]) for k in z.files}
        result = compute()
        buf = io.BytesIO()
        np.savez(buf, **{k: np.asarray(v) for k, v in result.items()})
        backend(self.done).write_bytes(key, buf.getvalue())
        return result


__all__ = ["Checkpoints", "PassResults"]
