"""Results of finished passes kept beside an output's resume markers, so that ``resume=True`` skips them.

An operation whose output is written only at the end (a solve: passes over ``A``, then a small
in-core problem) resumes by loading what its finished passes computed instead of running them
again. Each result is a dict of NumPy arrays and numbers, saved exactly (``.npz``), so the resumed
run computes the same bits. Results are named by the pass and, where a pass depends on an earlier
result (a refinement pass on ``x``), by a token of that input.
"""

from __future__ import annotations

import io
from collections.abc import Callable
from typing import Any

import numpy as np

from blocklin.storage.backend import backend


class Checkpoints:
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


__all__ = ["Checkpoints"]
