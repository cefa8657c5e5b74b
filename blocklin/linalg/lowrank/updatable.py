"""What an ``svd`` or ``pca`` result keeps so that :func:`blocklin.update` can bring it up to date.

With ``updatable=True`` the stored result group also holds the *co-moments* of ``A``: the row count
``m``, the column means ``mu`` and the centered Gram ``C = (A - 1 mu^T)^T (A - 1 mu^T)`` (float64,
``n x n``), from one pass (:func:`blocklin.linalg.blocks.center.moments_and_gram`, Chan, Golub and
LeVeque's pairwise merge of each strip's co-moments, so no cancellation however large the means),
or from the means pass of the centered (scaled) Gram route, which makes them anyway.
They are sums over rows: rows appended later merge into them exactly as strips do, so the updated
co-moments are those of the whole grown matrix, and the Gram of what was factored (centered and/or
scaled, or ``A^T A = C + m mu mu^T``) follows from them without reading the old rows
(:mod:`blocklin.linalg.update.svd`).

Arrays in the group: ``state_comoments`` (``n x n``), ``state_mean`` (``n``); the count and what
was factored are in the provenance's ``params["update"]``.

The single-pass sketch (``method="sketch"``) keeps its own state instead, which is a sum over rows
as it stands: ``state_corange`` (``X^T``), ``state_core`` (``Phi^T [Y T]``), ``state_range_gram``
(``Y^T Y``) and the range sketch ``state_range`` (``Y``, ``m x kp``, one row per row of ``A``)
(:data:`SKETCH_XT` and beside it; :mod:`blocklin.linalg.update.sketch`).
Costs no pass more.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from blocklin.errors import ParameterError, explain
from blocklin.linalg.blocks.center import moments_and_gram

#: Group arrays of the kept co-moments.
COMOMENTS, MEAN = "state_comoments", "state_mean"
#: Group arrays of an updatable single-pass sketch: the co-range sketch ``X^T = B^T Upsilon^T``
#: (``N x kp``), ``Phi^T [Y T]`` (``s x (kp + s)``), ``Y^T Y`` (``kp x kp``), float64 sums over rows,
#: and the range sketch ``Y = B Omega`` (``M x kp``, one row per row of ``A``).
SKETCH_XT, SKETCH_CORE, SKETCH_GRAM, SKETCH_Y = "state_corange", "state_core", "state_range_gram", "state_range"


def check_updatable(*, out: Any, method: str, which: str, transposed: bool, shape: tuple[int, int],
                     center: bool = False, scale: bool = False) -> None:
    """Refuse ``updatable=True`` where an update could not be made (each reason with its fix)."""
    rule = "needs"
    if out is None:
        raise ParameterError(explain("updatable", f"{rule} out= (the result updated later is a stored one)",
                                     "out=None", "pass out='factors.zarr'"))
    if transposed:
        raise ParameterError(explain("updatable", "needs a tall A (rows appended to a wide A grow its short side, "
                                     "whose n x n Gram is kept)", f"A of shape {shape[0]} x {shape[1]}",
                                     "factor A^T, or recompute after each append"))
    if method == "sketch" and (center or scale):
        # the means (and scales) move with every appended row, and they enter every row's sketch
        raise ParameterError(explain("updatable", "keeps the single-pass sketch of A itself (a sum over rows): "
                                     "a centered or scaled sketch changes in every row when rows are appended",
                                     f"method='sketch' with center={center}, scale={scale}",
                                     "pass method='auto' (the co-moments are kept), or updatable=False"))
    if which != "LM":
        raise ParameterError(explain("updatable", "keeps the Gram, which resolves the largest singular values only",
                                     f"which={which!r}", "pass which='LM', or recompute after each append"))


def sketch_state(Xt: np.ndarray, PZ: np.ndarray, G: np.ndarray) -> dict[str, np.ndarray]:
    """The single-pass sketch's small sums as the group arrays of an updatable result (float64 copies)."""
    return {SKETCH_XT: np.array(Xt, dtype=_wide(Xt)), SKETCH_CORE: np.array(PZ, dtype=_wide(PZ)),
            SKETCH_GRAM: np.array(G, dtype=_wide(G))}


def _wide(x: np.ndarray) -> np.dtype:
    """float64, or complex128 of complex sums (their imaginary parts are kept)."""
    return np.dtype(np.complex128 if np.iscomplexobj(x) else np.float64)


def kept_state(moments: Any, c: np.ndarray) -> dict[str, np.ndarray]:
    """The group arrays of co-moments made elsewhere (the Gram route's means pass): copies. Refused where
    the squares of nonzero data underflowed to 0 (:func:`_refuse_lost_squares`)."""
    _refuse_lost_squares(moments, c)
    return {COMOMENTS: np.array(c, dtype=_wide(c)), MEAN: np.array(moments.mean, dtype=_wide(moments.mean))}


def _refuse_lost_squares(moments: Any, c: np.ndarray) -> None:
    """Refuse co-moments that are all 0 where a column holds nonzero entries too small for float64 to hold
    their squares (``|mean|^2`` below ``tiny / eps``): data near ``2^-600`` have centered squares near
    ``2^-1200``, which underflow to exactly 0, so :func:`keep_state`'s bound on the largest sum of squares
    (``0 < top``) let them pass; an update then read the grown matrix as having no variance (a PCA's
    ``explained_variance_ratio_`` NaN, "every column is constant"). Columns constant at a magnitude whose
    squares float64 holds keep their 0 co-moments."""
    top = float(np.max(np.abs(np.diag(c).real))) if c.size else 0.0
    if top != 0.0 or not c.size:
        return
    mean = np.abs(np.asarray(moments.mean))
    held = np.asarray(moments.nonzero) if getattr(moments, "nonzero", None) is not None else mean != 0
    lost = held & (mean < np.sqrt(np.finfo(np.float64).tiny / np.finfo(np.float64).eps))
    if lost.any():
        j = int(np.flatnonzero(lost)[0])
        raise ParameterError(explain(
            "updatable", "keeps A's co-moments in float64, which must hold its squares",
            f"column sums of squares that underflowed to 0 (column {j} holds nonzero entries, its mean "
            f"{float(np.asarray(moments.mean)[j]):.3g})", "scale A by a power of two so that its entries sit "
            "near 1 (exact), or pass updatable=False"))


def keep_state(job: Any, A: Any, memory: int, made: dict | None = None) -> dict[str, np.ndarray]:
    """The co-moments of ``A``: ``made`` where the method's means pass made them, else from one pass;
    as the group arrays. Refused where the squares leave float64's range (data near 1e154 or below
    1e-154: scale it by a power of two)."""
    if made and SKETCH_XT in made:  # the single-pass sketch's state: its sums, finite where its run was
        return made
    if made:
        c = made[COMOMENTS]
        moments = None
    else:
        moments, c = moments_and_gram(job, A, memory=memory)
    top = float(np.max(np.abs(np.diag(c).real))) if c.size else 0.0
    if not np.isfinite(c).all() or 0 < top < np.finfo(np.float64).tiny / np.finfo(np.float64).eps:
        got = f"a largest column sum of squares of {top:.3g}" if np.isfinite(c).all() else \
            "column sums of squares beyond float64's range (the co-moments overflowed)"  # inf, or inf - inf
        raise ParameterError(explain("updatable", "keeps A's co-moments in float64, which must hold its squares",
                                     got, "scale A by a power of two so that its entries sit near 1 (exact), or "
                                     "pass updatable=False"))
    return made if made else kept_state(moments, c)


__all__ = ["COMOMENTS", "MEAN", "SKETCH_CORE", "SKETCH_GRAM", "SKETCH_XT", "SKETCH_Y", "check_updatable", "keep_state",
           "kept_state", "sketch_state"]
