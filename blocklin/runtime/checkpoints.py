"""Pass checkpoints of the iterative factorizations, so that ``resume=True`` skips finished passes.

:class:`Checkpoints` serves svd, eigsh and pca, whose whole state lives in memory between passes
(the ``N x l`` block of a power iteration, the Krylov basis of block Lanczos, the column means).
Each pass over ``A`` is deterministic in that state (seeded random blocks, a plan that does not
depend on the scheduler). After every completed pass the state is saved in the output's partial
folder (``OUT.partial-TOKEN/work/NAME.npz``, written to a temporary name and renamed, so a
checkpoint is either complete or absent), overwriting the previous one; a rerun with the same token
restores the newest and continues with the next pass, bit for bit. The commit removes them, a run
without ``resume`` starts clean, and so does a resumed run whose input changed since (the output's
``restart``, :mod:`blocklin.storage.stamps`): the checkpoints live inside the partial.

Operations that record the result of each step instead of one evolving state (a solve's passes,
the inverse's and the square solve's steps over intermediate stores) use
:mod:`blocklin.runtime.stages` (:class:`~blocklin.runtime.stages.StepRecords`,
:class:`~blocklin.runtime.stages.Stages`).
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np



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


__all__ = ["Checkpoints"]
