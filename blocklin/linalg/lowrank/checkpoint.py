"""What a resumed low-rank factorization (``svd``, ``pca``, ``eigsh``) needs to continue bit for bit.

The checkpoints themselves are kept in the unfinished output (:mod:`blocklin.runtime.checkpoints`); this
module holds the run's identity (the resume token), its seed, and the power of two its passes were
scaled by (:mod:`blocklin.linalg.blocks.scaling`).
"""

from __future__ import annotations

from typing import Any

from blocklin.linalg.blocks import random as rnd
from blocklin.linalg.blocks.scaling import Scaling
from blocklin.runtime.checkpoints import Checkpoints
from blocklin.storage.identity import plan_settings, resume_token
from blocklin.validate import resolve_seed


def low_rank_token(job: Any, A: Any, **params: Any) -> str:
    """Identity of a factorization for ``resume=True``: the input and every parameter that changes the
    passes or their bits, the job's settings its pass plans depend on (:func:`~blocklin.storage.identity.
    plan_settings`: the budget fixes the strips, and the workers how each pass's partial sums are split
    and added: a run resumed with ``workers=2`` after one with 1 had mixed the two, 1e-13 from either's
    result), and the version of the generator of the sketch's test matrices and the orthonormal
    completion's rows (:data:`~blocklin.linalg.blocks.random.SKETCH_GENERATOR`): a run interrupted under
    another generator is not continued (its partial output has another name; the rerun starts over)."""
    return resume_token("low-rank", [A], sorted({"generator": rnd.SKETCH_GENERATOR, **params}.items()),
                        plan_settings(job))


def checkpointed_seed(ckpt: Checkpoints, seed: int | None) -> int:
    """The seed: given, or the one an interrupted run drew (so that resuming draws the same numbers)."""
    saved = ckpt.load("seed")
    if saved is not None:
        return int(saved["seed"])
    seed = resolve_seed(seed)
    ckpt.save("seed", seed=seed)
    return seed


def save_scaling(ckpt: Checkpoints | None, scaling: Scaling) -> None:
    """Checkpoint the power of two once known (a resumed run makes its passes with the same)."""
    if ckpt is not None and scaling.exponent and ckpt.load("scaling") is None:  # e = 0: nothing to keep
        ckpt.save("scaling", e=scaling.exponent, amax=float(scaling.amax or 0.0))
