"""The column moments of a streamed centered or scaled SVD (:mod:`blocklin.linalg.blocks.center`): one
pass over ``A`` before the method's, fused where it can be with the method's first product
(``B_c^T B_c Q``) or, for the Gram route, with the centered Gram; restored from the checkpoints of an
interrupted run.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from blocklin.linalg.blocks.center import (Moments, column_moments, moments_and_gram, moments_and_normal,
                                           moments_and_normal_fits, moments_and_row_gram)
from blocklin.linalg.blocks.scaling import Scaling
from blocklin.linalg.lowrank.checkpoint import save_scaling
from blocklin.linalg.lowrank.lanczos import start_block
from blocklin.linalg.lowrank.methods import gram_subspace, rsvd_start
from blocklin.linalg.lowrank.sources import moments_gram_split, passes_device
from blocklin.linalg.lowrank.updatable import kept_state
from blocklin.plan.svd import SvdPlan
from blocklin.runtime.checkpoints import Checkpoints
from blocklin.runtime.job import Job


def fused_start(job: Job, A: Any, plan: SvdPlan, seed: int, q: int | None,
                v0: np.ndarray | None = None) -> np.ndarray | None:
    """The block the first product of a centered streamed run is taken with, when the means pass can
    make that product too (tall ``A``, a pass on the CPU, a method that starts with ``B_c^T B_c Q``, a
    budget that holds the fused pass)."""
    if plan.transposed or passes_device(job, plan, A.dtype) != "cpu":
        return None
    start = None
    if plan.method == "lanczos":
        start = start_block(plan.N, plan.block, seed, v0)
    elif plan.method == "rsvd" and q != 0:
        start = rsvd_start(plan.N, plan.block, seed, v0)
    return start if start is not None and moments_and_normal_fits(job, A, start, memory=plan.memory,
                                                                       reserve=plan.client_bytes) else None


def moments_gram(job: Job, A: Any, plan: SvdPlan, ckpt: Checkpoints | None, *, center: bool,
                 scale: bool, scaling: Scaling, keep: dict | None = None) -> tuple[Moments, np.ndarray | None]:
    """The column moments and the Gram route's subspace (the top eigenvectors of the centered and/or
    scaled Gram of ``B``) from one pass over ``A``, or from the checkpoints of an interrupted run (then
    ``None``: the subspace is in the ``gram`` checkpoint). Tall ``A``: the co-moments ``A_c^T A_c``
    (:func:`moments_and_gram`); wide ``A``: the ``m x m`` Gram of its columns centered and/or scaled as
    they are read (:func:`moments_and_row_gram`). ``keep``: filled with the co-moments
    (:func:`blocklin.linalg.lowrank.updatable.kept_state`) when made here (tall ``A``)."""
    saved = ckpt.load("moments") if ckpt is not None else None
    if saved is not None and ckpt.load("gram") is not None:
        return _restored(saved), None
    if plan.transposed:  # B = A^T: the rows of B (columns of A) are whole in every strip
        row_gram = {"center": center, "standardize": scale}
        split = moments_gram_split(job, A, plan.memory, plan.client_bytes, row_gram=row_gram)
        moments, g = scaling.run(job, lambda sc: moments_and_row_gram(
            job, A, memory=plan.memory, reserve=plan.client_bytes, scale=sc, **row_gram, **split))
        save_scaling(ckpt, scaling)
        return _saved(ckpt, moments, g, plan)
    split = moments_gram_split(job, A, plan.memory, plan.client_bytes)
    moments, g = scaling.run(job, lambda sc: moments_and_gram(job, A, memory=plan.memory, reserve=plan.client_bytes,
                                                               scale=sc, **split))
    save_scaling(ckpt, scaling)
    if keep is not None and not scaling.exponent:  # the co-moments an updatable result keeps (unscaled data)
        keep.update(kept_state(moments, g))
    if not center:  # scaled only: the uncentered Gram, A^T A = A_c^T A_c + m mu mu^T (a sum, no cancellation;
        # A^H A = A_c^H A_c + m conj(mu) mu^T of complex data)
        g += moments.count * np.outer(np.conjugate(moments.mean), moments.mean)
    if scale:
        inv = 1.0 / moments.std
        g *= inv[:, None]
        g *= inv[None, :]
    return _saved(ckpt, moments, g, plan)


def _saved(ckpt: Checkpoints | None, moments: Moments, g: np.ndarray, plan: SvdPlan) -> tuple[Moments, np.ndarray]:
    """The Gram's subspace, and the moments checkpointed (the subspace is, by the Gram route)."""
    q = gram_subspace(g, plan.block)
    del g
    if ckpt is not None:
        ckpt.save("moments", **_checkpointed(moments))
    return moments, q


def means_pass(job: Job, A: Any, plan: SvdPlan, ckpt: Checkpoints | None,
               start: np.ndarray | None = None, *, scaling: Scaling) -> tuple[Moments, np.ndarray | None]:
    """The column moments from one pass (with ``start``: and ``B_c^T B_c start`` from the same pass), or
    from the checkpoint of an interrupted run."""
    saved = ckpt.load("moments") if ckpt is not None else None
    if saved is not None:
        return _restored(saved), saved.get("first")
    first = None
    if start is not None:
        moments, first = scaling.run(job, lambda sc: moments_and_normal(job, A, start, memory=plan.memory,
                                                                        reserve=plan.client_bytes, scale=sc))
    else:
        moments = scaling.run(job, lambda sc: column_moments(job, A, memory=plan.memory,
                                                             reserve=plan.client_bytes, scale=sc))
    save_scaling(ckpt, scaling)
    if ckpt is not None:
        ckpt.save("moments", **_checkpointed(moments), **({"first": first} if first is not None else {}))
    return moments, first


def _checkpointed(moments: Moments) -> dict:
    """The arrays of ``moments`` a checkpoint keeps (which columns are nonzero where the pass knew it:
    :func:`~blocklin.linalg.lowrank.run.check_standardizable` reads it)."""
    kept = {"mean": moments.mean, "var": moments.var, "count": moments.count}
    return kept if moments.nonzero is None else {**kept, "nonzero": moments.nonzero}


def _restored(saved: dict) -> Moments:
    """The :class:`Moments` of a checkpoint (:func:`_checkpointed`)."""
    return Moments(saved["mean"], saved["var"], int(saved["count"]), saved.get("nonzero"))
