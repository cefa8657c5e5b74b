"""Principal component analysis of out-of-core matrices: a centered truncated SVD, named as scikit-learn names it.

The rows of ``A`` are samples, its columns features. The components are the right singular vectors
of ``A - 1 mu^T`` (:func:`blocklin.svd` with ``center=True``; the centering is a rank-one correction
inside the passes, never a copy), the explained variances ``s^2 / (m - 1)``, and their ratios are
relative to the total variance ``sum_j var(A[:, j])`` (``ddof=1``) from the means pass.
"""

from __future__ import annotations

from typing import Any, Unpack

import numpy as np

from blocklin.config import Settings
from blocklin.errors import BlocklinWarning, ShapeError, warn
from blocklin.linalg.lowrank.svd import svd
from blocklin.storage import remove


class PCAResult:
    """A fitted PCA with the attribute names of ``sklearn.decomposition.PCA``.

    Attributes
    ----------
    components_ : ndarray, ``k x n_features``
        Principal axes (orthonormal rows), by decreasing explained variance. Signs follow
        scikit-learn (>= 1.5): the entry of largest magnitude of each row is positive.
    explained_variance_ : ndarray, ``k``
        Variance along each axis, ``s^2 / (n_samples - 1)``.
    explained_variance_ratio_ : ndarray, ``k``
        ``explained_variance_`` over the total variance of the (scaled) columns.
    singular_values_ : ndarray, ``k``
        Singular values of the centered (scaled) matrix.
    mean_ : ndarray, ``n_features``
        Column means (float64).
    scale_ : ndarray or None
        Column standard deviations divided by (``scale=True``), else ``None``.
    n_components_, n_samples_, n_features_in_ : int
    total_variance_ : float
        Sum of the column variances (``ddof=1``) of the matrix that was factored.
    report : dict
        The SVD's report (passes, bytes read, peak memory, residuals, ...).
    svd : SVDResult or None
        The underlying factorization when ``out`` was given (its ``U`` holds the unnormalized scores
        ``U`` with the signs of the SVD, not those of ``components_``); ``None`` otherwise, when
        its temporary store is removed once the attributes are read.
    """

    def __init__(self, **attrs: Any) -> None:
        self.__dict__.update(attrs)

    def transform(self, x: Any) -> np.ndarray:
        """Project in-memory samples ``x`` (``n x n_features``) on the components: ``((x - mean_) / scale_) C^T``.

        Computed in float64, returned in the dtype scikit-learn's ``PCA.transform`` gives: float32 for
        float32 samples and components, float64 where either is float64 (integers count as float64).
        """
        x = np.asarray(x)
        out_dtype = np.result_type(x.dtype if x.dtype.kind == "f" else np.float64, self.components_.dtype)
        x = x.astype(np.float64, copy=False)
        if x.ndim != 2 or x.shape[1] != self.n_features_in_:
            raise ShapeError(f"x: must have {self.n_features_in_} columns (n_features_in_); got shape {x.shape}. "
                             "Fix: pass samples as rows with the features the PCA was fitted on")
        x = x - self.mean_
        if self.scale_ is not None:
            x = x / self.scale_
        return (x @ self.components_.T.astype(np.float64)).astype(out_dtype, copy=False)

    def __repr__(self) -> str:
        return (f"PCAResult(n_components_={self.n_components_}, n_samples_={self.n_samples_}, "
                f"n_features_in_={self.n_features_in_}, explained_variance_ratio_={self.explained_variance_ratio_})")


def pca(a: Any, k: int, *, scale: bool = False, method: str = "auto", oversample: int = 10,
        power_iters: int | str = "auto", tol: float | None = None, seed: int | None = None, out: Any = None,
        overwrite: bool = False, resume: bool = False, **settings: Unpack[Settings]) -> PCAResult:
    """Principal components of the rows of ``A`` (samples x features), out of core.

    Parameters
    ----------
    a : path, zarr array, Matrix, NumPy or Dask array
        ``m x n``: ``m`` samples of ``n`` features, float32 or float64.
    k : int
        Number of components, ``1 <= k < min(m, n)``.
    scale : bool
        Standardize the columns (divide by their ``ddof=0`` standard deviation, as
        ``StandardScaler``) after centering: PCA on the correlation matrix.
    method, oversample, power_iters, tol, seed, overwrite, resume, **settings
        As for :func:`blocklin.svd` (``resume=True`` continues an interrupted run writing ``out``).
    out : path, optional
        Keep the factorization (``U``, ``S``, ``Vt``, ``mean``, ``scale``) as a zarr group; without it
        the temporary factors are removed once the attributes are read.

    Returns
    -------
    PCAResult
        scikit-learn's attribute names (``components_``, ``explained_variance_``, ...) and ``report``.

    Notes
    -----
    Costs the SVD's passes plus one pass for the means (none when ``A`` fits the budget). The result
    matches ``sklearn.decomposition.PCA(n_components=k, svd_solver="full")`` to the accuracy of the
    truncated SVD (see :func:`blocklin.svd`'s ``tol`` and ``power_iters``).

    References
    ----------
    N. Halko, P.-G. Martinsson, J. A. Tropp, "Finding structure with randomness", SIAM Review 53(2), 2011
    (Section 1.6: PCA as a centered low-rank approximation).
    """
    res = svd(a, k, method=method, oversample=oversample, power_iters=power_iters, tol=tol, seed=seed, out=out,
              overwrite=overwrite, center=True, scale=scale, resume=resume, **settings)
    U, s, Vt = res
    moments = res.moments
    m = moments.count
    n = moments.mean.size
    comps = (Vt.to_numpy() if hasattr(Vt, "to_numpy") else np.asarray(Vt)).astype(s.dtype, copy=False)
    if out is None:  # the scores U (or the long Vt) were a temporary store: nothing of it is returned
        remove((U if hasattr(U, "location") else Vt).location.parent)
    big = np.argmax(np.abs(comps), axis=1)
    signs = np.sign(comps[np.arange(comps.shape[0]), big])
    comps = comps * np.where(signs == 0, 1, signs)[:, None].astype(comps.dtype)
    ddof = 1 if m > 1 else 0
    # the ratios from the variances of 2^-e A when the data was scaled (blocklin.linalg.blocks.scaling): the
    # variances themselves leave float64's range for entries beyond about 2^512
    mom, e = res.scaled_moments if res.scaled_moments is not None else (moments, 0)
    var = mom.variance(ddof)
    if scale:  # a standardized column has variance 1 (ddof=0); a constant one stays 0; s does not scale
        var = np.where(mom.var > 0, var / np.where(mom.var > 0, mom.var, 1.0), 0.0)
        e = 0
    total_s = float(var.sum())
    ev_s = np.ldexp(s.astype(np.float64), -e) ** 2 / max(m - ddof, 1)
    with np.errstate(over="ignore", under="ignore"):
        ev, total = np.ldexp(ev_s, 2 * e), float(np.ldexp(total_s, 2 * e))
    if e and not (np.isfinite(total) and (total_s == 0 or total > 0)):
        warn(f"pca: the variances are beyond float64's range (about 2^{int(np.frexp(total_s)[1]) + 2 * e}); "
             "explained_variance_ and total_variance_ hold inf or 0, explained_variance_ratio_, "
             "singular_values_, components_ and mean_ are exact; pass A scaled by a power of two for them",
             BlocklinWarning)
    report = res.report
    report["total_variance"] = total
    return PCAResult(components_=comps, explained_variance_=ev.astype(s.dtype),
                     explained_variance_ratio_=(ev_s / total_s if total_s > 0 else np.zeros_like(ev_s)).astype(s.dtype),
                     singular_values_=s, mean_=moments.mean, scale_=res.scale, n_components_=int(s.size),
                     n_samples_=int(m), n_features_in_=int(n), total_variance_=total, report=report,
                     svd=res if out is not None else None)
