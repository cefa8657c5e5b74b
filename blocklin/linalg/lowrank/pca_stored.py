"""A stored PCA (``blocklin.pca(..., out=)``) back as :func:`blocklin.pca` returned it: a
:class:`~blocklin.linalg.lowrank.pca.PCAResult` from the group's factors and what its provenance
records (``params["pca"]``: :func:`~blocklin.linalg.lowrank.pca.pca_record`).

The group holds the centered (scaled) factorization ``U``, ``S``, ``Vt``, ``mean`` (and ``scale``);
the model's variances need the row count and the total variance beside it. An updatable PCA keeps the
co-moments (:mod:`blocklin.linalg.lowrank.updatable`): both come from them, those of every row the
group covers, so a PCA updated after appended rows (:func:`blocklin.update`) is the PCA of the grown
matrix, its ``explained_variance_ratio_`` and ``noise_variance_`` included, with the options it was
fitted with (``n_components``, ``whiten``, ``scale``). Without co-moments the provenance records the
count and the total variance (of ``2^-exponent A``: :func:`~blocklin.linalg.lowrank.pca.pca_variances`).
No pass over ``A``: small reads of the group.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from blocklin.linalg.blocks.center import Moments
from blocklin.linalg.lowrank.pca import PCAResult, pca_variances, fitted
from blocklin.linalg.lowrank.updatable import COMOMENTS, MEAN
from blocklin.storage.zarr_store import open_zarr


def stored_pca(res: Any, out: Any, params: dict) -> PCAResult:
    """The PCA a stored factorization ``res`` (:class:`~blocklin.linalg.lowrank.svd.SVDResult` of the
    group at ``out``, as :func:`blocklin.update` returns it) makes with the options ``params["pca"]``;
    ``params``: the group's provenance parameters (its ``update`` entry holds the co-moments' count)."""
    rec = params["pca"]
    scale = bool(rec["scale"])
    upd = params.get("update")
    if isinstance(upd, dict):  # the co-moments of every row covered: the count, means and variances
        m = int(upd["count"])
        c = np.asarray(open_zarr(out / COMOMENTS))
        mean = np.asarray(open_zarr(out / MEAN))
        res.moments, res.scaled_moments = Moments(mean, np.maximum(np.diag(c).real, 0.0) / max(m, 1), m), None
        variances = pca_variances(res, res.s, scale)
    else:  # the count and total variance the fit recorded (of 2^-e A)
        m, e = int(rec["n_samples"]), int(rec["exponent"])
        res.moments = Moments(np.asarray(res.mean), np.zeros(np.asarray(res.mean).shape, np.float64), m)
        ev_s = np.ldexp(np.asarray(res.s, np.float64), -e) ** 2 / max(m - (1 if m > 1 else 0), 1)
        variances = (ev_s, float(rec["total_variance"]), e)
    return fitted(res, rec["n_components"], whiten=bool(rec["whiten"]), variances=variances, kept=True)


__all__ = ["stored_pca"]
