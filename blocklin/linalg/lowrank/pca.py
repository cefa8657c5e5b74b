"""Principal component analysis of out-of-core matrices: a centered truncated SVD, named as scikit-learn names it.

The rows of ``A`` are samples, its columns features. The components are the right singular vectors
of ``A - 1 mu^T`` (:func:`blocklin.svd` with ``center=True``; the centering is a rank-one correction
inside the passes, never a copy), the explained variances ``s^2 / (m - 1)``, and their ratios are
relative to the total variance ``sum_j var(A[:, j])`` (``ddof=1``) from the means pass. The fitted
model is scikit-learn's probabilistic PCA (Tipping and Bishop 1999): the noise variance is the mean
variance of the components left out, which the total variance gives without computing them.

Complex data (blocklin's extension: scikit-learn's PCA refuses complex input). The natural definition
is the centered SVD of ``A = U diag(s) V^H`` (LAPACK's conventions, :func:`blocklin.svd`): ``mean_`` the
complex column means, ``components_ = V^H`` (rows; each triplet's phase is the SVD's, the largest-modulus
entry of the short factor's vector real and positive), ``explained_variance_ = s^2 / (m - 1)`` real (the
eigenvalues of the Hermitian covariance ``A_c^H A_c / (m - 1)``), ``transform(x) = (x - mu) V``,
``inverse_transform(y) = y V^H + mu``. The probabilistic model is Tipping and Bishop's with circularly
symmetric complex Gaussian samples, ``x ~ CN(mu, C)``, ``C = V diag(ev - noise) V^H + noise I``, whose
density is ``exp(-(x - mu)^H C^-1 (x - mu)) / det(pi C)`` (the maximum-likelihood noise is again the mean
of the variances left out): ``get_covariance``, ``get_precision``, ``score_samples`` and ``score`` follow
it. ``n_components="mle"`` (Minka's evidence for real data) is refused.
"""

from __future__ import annotations

import math
from typing import Any, Unpack

import numpy as np
import scipy.special

from blocklin.config import Settings
from blocklin.errors import BlocklinWarning, ParameterError, ShapeError, SingularMatrixError, explain, warn
from blocklin.linalg.blocks.center import Moments, column_moments
from blocklin.linalg.blocks.scaling import Scaling, unscale
from blocklin.linalg.labels import check_features, label_pca, label_rows, labels_of
from blocklin.linalg.lowrank.run import check_standardizable
from blocklin.linalg.lowrank.svd import factorize
from blocklin.linalg.lowrank.triplets import triplet_report
from blocklin.linalg.lowrank.sparse_pca import sparse_pca, total_variance
from blocklin.sparse import SparseMatrix, as_sparse_matrix, refuse_complex
from blocklin.runtime.job import Job
from blocklin.runtime.passes import source
from blocklin.storage import remove
from blocklin.validate import is_int, float_operand, in_memory_array


class PCAResult:
    """A fitted PCA with the attribute names of ``sklearn.decomposition.PCA``.

    Attributes
    ----------
    components_ : ndarray, ``k x n_features``
        Principal axes (orthonormal rows), by decreasing explained variance. Signs follow
        scikit-learn (>= 1.5): the entry of largest magnitude of each row is positive.
    noise_variance_ : float
        The variance of the components left out, per component (``0`` when none is):
        ``(total_variance_ - sum(explained_variance_)) / (min(n_samples, n_features) - k)``, the
        maximum-likelihood noise of probabilistic PCA.
    whiten : bool
        Whether :meth:`transform` scales the projections to unit variance.
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
        The underlying factorization when ``out`` was given (its ``U`` holds the unnormalized scores,
        its ``Vt`` every computed component, with the signs of ``components_``: stored so too); ``None``
        otherwise, when its temporary store is removed once the attributes are read.
    """

    def __init__(self, **attrs: Any) -> None:
        self.__dict__.update(attrs)

    def _np(self, name: str) -> Any:
        """An attribute as NumPy (a DataArray's values when the PCA was fitted on a DataArray)."""
        v = getattr(self, name)
        return None if v is None else np.asarray(v)

    def _samples(self, x: Any, name: str = "x") -> tuple[np.ndarray, np.dtype]:
        """``(x - mean_) / scale_`` in float64 (complex128 of a complex model or ``x``), and the dtype
        scikit-learn returns for ``x``; a ``DataArray`` ``x`` of other features than the fitted ones (by
        its labels) is refused (:func:`blocklin.linalg.labels.check_features`)."""
        check_features(getattr(self, "labels", None), x, name)
        x = in_memory_array(x, name)  # masked entries and extended precision refused, not read wrongly
        out_dtype = np.result_type(x.dtype if x.dtype.kind in "fc" else np.float64, self._np("components_").dtype)
        x = x.astype(_wide(out_dtype), copy=False)
        if x.ndim != 2 or x.shape[1] != self.n_features_in_:
            raise ShapeError(f"{name}: must have {self.n_features_in_} columns (n_features_in_); got shape "
                             f"{x.shape}. Fix: pass samples as rows with the features the PCA was fitted on")
        x = x - self._np("mean_")
        if self.scale_ is not None:
            x = x / self._np("scale_")
        return x, out_dtype

    def _deviations(self) -> np.ndarray:
        """The components' standard deviations ``sqrt(explained_variance_)`` (float64), from
        ``singular_values_ / sqrt(n_samples_ - 1)`` where the variances left their dtype's range (inf,
        0 or a few bits, for data near ``2^+-512``, ``2^+-64`` in float32): the singular values scale
        with the data and stay in range, so the whitened scores do too."""
        raw = self._np("explained_variance_")
        ev = raw.astype(np.float64)
        sv = self._np("singular_values_").astype(np.float64)
        m = int(self.n_samples_)
        lost = ~np.isfinite(ev) | (ev < np.finfo(raw.dtype).tiny) & (sv > 0)
        return np.where(lost, sv / np.sqrt(max(m - (1 if m > 1 else 0), 1)), np.sqrt(np.where(lost, 0.0, ev)))

    def _axes(self) -> np.ndarray:
        """The components in float64, each scaled by its standard deviation when whitened."""
        c = self._np("components_").astype(_wide(self._np("components_").dtype))
        return c * self._deviations()[:, None] if self.whiten else c

    def transform(self, x: Any) -> np.ndarray:
        """Project in-memory samples ``x`` (``n x n_features``) on the components: ``((x - mean_) / scale_) C^T``
        (divided by ``sqrt(explained_variance_)`` when ``whiten``).

        Computed in float64, returned in the dtype scikit-learn's ``PCA.transform`` gives: float32 for
        float32 samples and components, float64 where either is float64 (integers count as float64).
        """
        xc, out_dtype = self._samples(x)
        c = self._np("components_")
        y = xc @ c.astype(_wide(c.dtype)).conj().T  # (x - mu) V: C^H = V of complex components
        if self.whiten:  # a component of zero variance stays zero (scikit-learn divides by its eps floor)
            sd = self._deviations()
            y = y / np.where(sd > 0, sd, 1.0)
        y = y.astype(out_dtype, copy=False)
        if self.labels is None:
            return y
        mode = self.labels.mode  # the components' dimension (mode_2 where the fitted data has a mode)
        return label_rows(y, x, ("", mode), {mode: np.arange(1, y.shape[1] + 1)})

    def inverse_transform(self, y: Any) -> np.ndarray:
        """Samples back in feature space from their projections ``y`` (``n x n_components_``):
        ``y C (* scale_) + mean_``, undoing the whitening when ``whiten``."""
        ya = np.asarray(y)
        out_dtype = np.result_type(ya.dtype if ya.dtype.kind in "fc" else np.float64, self._np("components_").dtype)
        if ya.ndim != 2 or ya.shape[1] != self.n_components_:
            raise ShapeError(f"y: must have {self.n_components_} columns (n_components_); got shape {ya.shape}. "
                             "Fix: pass the output of transform")
        x = np.asarray(y).astype(_wide(out_dtype)) @ self._axes()
        if self.scale_ is not None:
            x = x * self._np("scale_")
        x = (x + self._np("mean_")).astype(out_dtype, copy=False)
        if self.labels is None:
            return x
        feats = self.labels.cols
        return label_rows(x, y, ("", feats), self.labels.coord(feats))

    def get_covariance(self) -> np.ndarray:
        """The model's covariance of the (scaled) features: ``C^T diag(ev - noise) C + noise I``
        (``n_features x n_features``, in memory), as scikit-learn's ``PCA.get_covariance``; complex:
        ``C^H diag(ev - noise) C + noise I``, Hermitian."""
        c = self._axes()
        ev = self._np("explained_variance_").astype(np.float64)
        diff = np.where(ev > self.noise_variance_, ev - self.noise_variance_, 0.0)
        cov = (c.conj().T * diff) @ c
        cov[np.diag_indices_from(cov)] += self.noise_variance_
        return cov

    def get_precision(self) -> np.ndarray:
        """The inverse of :meth:`get_covariance`, by the matrix inversion lemma when the noise is nonzero
        (a ``k x k`` inverse instead of ``n_features x n_features``); with no component ``I / noise``
        (scikit-learn's, ``inf`` on the diagonal for constant data)."""
        noise = float(self.noise_variance_)
        n = self.n_features_in_
        if self.n_components_ == 0:
            with np.errstate(divide="ignore"):
                return np.eye(n) / noise
        if noise == 0.0:
            try:
                return np.linalg.inv(self.get_covariance())
            except np.linalg.LinAlgError:  # NumPy's bare "Singular matrix" had named no cause
                ev = self._np("explained_variance_")
                raise SingularMatrixError(explain(
                    "noise_variance_", "must be positive for the precision of a model whose covariance is "
                    "singular otherwise (a kept component of variance 0, or components that do not span the "
                    "features; scikit-learn's inversion fails there too)", f"0 with {self.n_components_} "
                    f"components of {n} features, explained_variance_ down to {float(ev.min()):.3g}",
                    "fit fewer components than the data's rank (its nonzero explained variances)")) from None
        c = self._axes()
        ev = self._np("explained_variance_").astype(np.float64)
        diff = np.where(ev > noise, ev - noise, 0.0)
        # (noise I + C^T D C)^-1 = I / noise - C^T (D^-1 + C C^T / noise)^-1 C / noise^2
        inner = c @ c.conj().T / noise
        with np.errstate(divide="ignore"):
            inner[np.diag_indices_from(inner)] += 1.0 / diff
        # divided by noise twice: noise ** 2 leaves float64's range for variances beyond about 2^+-512
        # (data beyond 2^+-256), where the quotient itself is in range
        prec = -(c.conj().T @ np.linalg.inv(inner) @ c) / noise / noise
        prec[np.diag_indices(n)] += 1.0 / noise
        return prec

    def score_samples(self, x: Any) -> np.ndarray:
        """Log-likelihood of each sample under the probabilistic PCA model (Tipping and Bishop 1999;
        Bishop, *Pattern Recognition and Machine Learning*, 12.2.1), as scikit-learn's ``score_samples``.
        Complex: the circularly symmetric complex Gaussian's ``-(x - mu)^H P (x - mu) - n log(pi) + log det P``
        (``P`` Hermitian positive definite: its determinant is real)."""
        xc, _ = self._samples(x)
        prec = self.get_precision()
        sign, logdet = np.linalg.slogdet(prec)
        logdet = float(np.real(logdet)) if np.real(sign) > 0 else -np.inf
        if xc.dtype.kind == "c" or prec.dtype.kind == "c":
            quad = np.sum(np.conj(xc) * (xc @ prec.T), axis=1).real
            return -quad - (self.n_features_in_ * math.log(math.pi) - logdet)
        return -0.5 * np.sum(xc * (xc @ prec), axis=1) - 0.5 * (self.n_features_in_ * math.log(2 * math.pi) - logdet)

    def score(self, x: Any, y: Any = None) -> float:
        """Mean log-likelihood of the samples ``x`` (:meth:`score_samples`)."""
        return float(np.mean(self.score_samples(x)))

    def __repr__(self) -> str:
        return (f"PCAResult(n_components_={self.n_components_}, n_samples_={self.n_samples_}, "
                f"n_features_in_={self.n_features_in_}, explained_variance_ratio_={self.explained_variance_ratio_})")


def _wide(dtype: Any) -> np.dtype:
    """The working dtype of the model's in-memory methods: float64, complex128 of complex data."""
    return np.dtype(np.complex128 if np.dtype(dtype).kind == "c" else np.float64)


def check_n_components(n_components: Any) -> Any:
    """``None``, an integer ``>= 0`` (0: the isotropic Gaussian model), a fraction of the variance in
    ``(0, 1)`` or ``"mle"``."""
    if n_components is None or (isinstance(n_components, str) and n_components == "mle"):
        return n_components
    if is_int(n_components) and not isinstance(n_components, bool) and n_components >= 0:
        return int(n_components)
    if isinstance(n_components, float) and 0.0 < n_components < 1.0:
        return n_components
    raise ParameterError(explain(
        "n_components", "must be None (every component), an integer >= 0 (0: no component), a fraction of the "
        "variance in (0, 1) or 'mle'", repr(n_components), "pass n_components=10, 0.95 or 'mle'"))


def minka_dimension(ev: np.ndarray, n_samples: int, exponent: int = 0) -> int:
    """The dimension of Minka's Laplace approximation to the PCA evidence (T. P. Minka, "Automatic choice
    of dimensionality for PCA", NIPS 2000), maximized over ``1 <= k < len(ev)``: ``n_components="mle"``.

    ``ev``: every explained variance (descending). Ranks at variances below ``1e-15`` are excluded as
    scikit-learn excludes them, so that both pick the same ``k``; with none left (one feature, or every
    variance below ``1e-15``) the choice is 0, scikit-learn's ``argmax`` of log-likelihoods all ``-inf``
    (it had been 1). ``exponent``: ``ev`` are the variances of ``2^-exponent A`` (data scaled into range),
    so the ``1e-15`` is scaled with them (the choice is otherwise scale-invariant: the evidence moves by
    the same constant for every ``k``); at ``1e-200`` the unscaled rule keeps none, as scikit-learn's."""
    ev = np.asarray(ev, dtype=np.float64)
    d, n = ev.size, float(n_samples)
    with np.errstate(over="ignore", under="ignore"):  # inf: every variance is below 1e-15 unscaled
        tiny = float(np.ldexp(1e-15, -2 * exponent))
    best, best_ll = 0, -np.inf
    logs = np.log(np.maximum(ev, np.finfo(np.float64).tiny))
    for k in range(1, d):
        if ev[k - 1] < tiny:
            break
        i = np.arange(1, k + 1)
        # log p(U): the uniform prior on the Stiefel manifold (Minka eq. 31)
        pu = -k * math.log(2.0) + float(np.sum(scipy.special.gammaln((d - i + 1) / 2.0)
                                               - math.log(math.pi) * (d - i + 1) / 2.0))
        pl = -float(np.sum(logs[:k])) * n / 2.0
        v = max(tiny, float(np.sum(ev[k:])) / (d - k))
        pv = -math.log(v) * n * (d - k) / 2.0
        mdim = d * k - k * (k + 1) / 2.0
        pp = math.log(2.0 * math.pi) * (mdim + k) / 2.0
        # log |A_Z|: the Hessian's determinant over the pairs (i, j), j beyond i (eq. 30)
        lam = np.concatenate([ev[:k], np.full(d - k, v)])
        hess = 0.0
        for a in range(k):
            j = np.arange(a + 1, d)
            hess += float(np.sum(np.log((ev[a] - ev[j]) * (1.0 / lam[j] - 1.0 / lam[a])))) + j.size * math.log(n)
        ll = pu + pl + pv + pp - hess / 2.0 - k * math.log(n) / 2.0
        if ll > best_ll:
            best, best_ll = k, ll
    return best


def pca_variances(res: Any, s: np.ndarray, scale: bool) -> tuple[np.ndarray, float, int]:
    """Explained and total variances of ``2^-e A`` and ``e`` (0 unless the data was scaled,
    :mod:`blocklin.linalg.blocks.scaling`: the variances themselves leave float64's range for entries
    beyond about 2^512, their ratios do not)."""
    moments = res.moments
    m = moments.count
    ddof = 1 if m > 1 else 0
    mom, e = res.scaled_moments if res.scaled_moments is not None else (moments, 0)
    var = mom.variance(ddof)
    if scale:  # a standardized column has variance 1 (ddof=0); a constant one stays 0; s does not scale
        var = np.where(mom.constant, 0.0, var / np.where(mom.constant, 1.0, mom.var))
        e = 0
    return np.ldexp(s.astype(np.float64), -e) ** 2 / max(m - ddof, 1), float(var.sum()), e


def _unscaled(ev_s: np.ndarray, total_s: float, noise_s: float, e: int,
              dtype: Any = np.float64) -> tuple[np.ndarray, float, float]:
    """The variances of ``A`` from those of ``2^-e A`` (inf or 0 beyond float64's range, or where
    ``explained_variance_`` leaves its ``dtype``'s: said once)."""
    with np.errstate(over="ignore", under="ignore"):
        ev, total = np.ldexp(ev_s, 2 * e), float(np.ldexp(total_s, 2 * e))
        noise = float(np.ldexp(noise_s, 2 * e))
    f64, fi = np.finfo(np.float64), np.finfo(np.dtype(dtype))
    pos = ev_s[ev_s > 0]
    top = int(np.frexp(total_s)[1]) + 2 * e if total_s > 0 else 0  # the variances are below 2^top
    total_out = total_s > 0 and not f64.minexp < top <= f64.maxexp
    ev_out = pos.size > 0 and not (int(np.frexp(pos.max())[1]) + 2 * e <= fi.maxexp
                                   and int(np.frexp(pos.min())[1]) + 2 * e > fi.minexp)
    if total_out or ev_out:
        where = "float64's" if total_out else f"{fi.dtype.name}'s"
        warn(f"pca: the variances are beyond {where} range (about 2^{top}); explained_variance_"
             f"{', noise_variance_ and total_variance_' if total_out else ''} hold inf or 0 (or lost digits), "
             "and so do score, score_samples, get_covariance and get_precision, which are built from them; "
             "explained_variance_ratio_, singular_values_, components_, mean_ and the whitened transform are "
             "exact; pass A scaled by a power of two for the variances", BlocklinWarning)
    return ev, total, noise


def _check_shape(n_components: Any, m: int, n: int, dtype: Any = None) -> None:
    """``n_components`` for an ``m x n`` matrix, before anything is read."""
    if n_components == "mle" and dtype is not None and np.dtype(dtype).kind == "c":
        raise ParameterError(explain(
            "n_components", "'mle' takes real data (Minka's evidence is derived for real Gaussian samples)",
            f"'mle' for {np.dtype(dtype).name} data", "pass an integer or a fraction of the variance"))
    if n_components == "mle" and m < n:
        raise ParameterError(explain(
            "n_components", "'mle' needs at least as many samples as features (Minka's evidence)",
            f"'mle' for {m} samples of {n} features", "pass an integer or a fraction of the variance"))
    if isinstance(n_components, int) and n_components > min(m, n):
        raise ParameterError(explain(
            "n_components", f"must satisfy 0 <= n_components <= min(n_samples, n_features) = {min(m, n)}",
            f"{n_components} for a {m} x {n} matrix", f"pass n_components <= {min(m, n)}, or None for all"))


def variance_ratios(ev: np.ndarray, total: float, stacklevel: int = 4) -> np.ndarray:
    """``explained_variance_ratio_``: the variances over their total; ``nan`` (0 / 0) for data of no
    variance (every column constant), as scikit-learn's ``PCA``, with a warning that says why (a ratio
    of 0 would claim that the components explain none of a variance there is not)."""
    if total > 0:
        return ev / total
    if ev.size:
        warn("explained_variance_ratio_ is nan (0 / 0): the data have no variance (every column is constant), "
             "so no share of it is explained, as scikit-learn's PCA gives; explained_variance_, "
             "singular_values_ and noise_variance_ are 0, mean_ and transform exact", BlocklinWarning,
             stacklevel=stacklevel)
    return np.full_like(ev, np.nan)


def _kept(n_components: Any, ev: np.ndarray, ratio: np.ndarray, m: int, exponent: int = 0) -> int:
    """How many of the computed components ``n_components`` keeps: Minka's choice for ``"mle"``, the
    fewest whose ratios sum past a fraction (scikit-learn's rule), else all."""
    if n_components == "mle":
        return minka_dimension(ev, m, exponent)
    if isinstance(n_components, float):
        return min(int(np.searchsorted(np.cumsum(ratio), n_components, side="right")) + 1, ev.size)
    return ev.size


def pca(a: Any, n_components: int | float | str | None = None, *, whiten: bool = False, scale: bool = False,
        method: str = "auto", oversample: int = 10, power_iters: int | str = "auto",
        n_iter: int | str | None = None, tol: float | None = None,
        seed: int | None = None, out: Any = None, overwrite: bool = False, resume: bool = False,
        k: int | None = None, updatable: bool = False, **settings: Unpack[Settings]) -> PCAResult:
    """Principal components of the rows of ``A`` (samples x features), out of core.

    Parameters
    ----------
    a : path, zarr array, Matrix, NumPy or Dask array, or xarray DataArray
        ``m x n``: ``m`` samples of ``n`` features, float32 or float64, or complex64 or complex128
        (blocklin's extension: module notes). A ``DataArray`` (samples,
        features) gives labelled results: ``components_`` over (``mode``, features), the variances
        over ``mode``, ``mean_`` over the features, and ``transform`` of a ``DataArray`` over (samples,
        ``mode``) with its sample coordinates (:mod:`blocklin.linalg.labels`).
    n_components : int, float, "mle" or None
        As scikit-learn's ``PCA``: an integer ``0 <= k <= min(m, n)``; ``None`` (default) for every
        component (``min(m, n)``); a fraction in ``(0, 1)`` for the fewest components whose explained
        variance ratios sum past it; ``"mle"`` for Minka's choice (``m >= n``). All but an integer
        ``k < min(m, n)`` compute every component (:func:`blocklin.svd`'s ``method="full"``: ``N x N``
        factors in memory, ``N = min(m, n)``) and keep those chosen.
    whiten : bool
        :meth:`PCAResult.transform` divides the projections by ``sqrt(explained_variance_)`` (unit
        variance), as scikit-learn's ``whiten=True``.
    scale : bool
        Standardize the columns (divide by their ``ddof=0`` standard deviation, as
        ``StandardScaler``) after centering: PCA on the correlation matrix.
    method, oversample, power_iters, n_iter, tol, seed, overwrite, resume, **settings
        As for :func:`blocklin.svd` (``resume=True`` continues an interrupted run writing ``out``).
    k : int, optional
        The number of components under :func:`blocklin.svd`'s name (``n_components`` or ``k``, not both).
    out : path, optional
        Keep the factorization (``U``, ``S``, ``Vt``, ``mean``, ``scale``) as a zarr group; without it
        the temporary factors are removed once the attributes are read. With ``None``, a fraction or
        ``"mle"`` it holds every component computed. Its provenance records the options
        (``params["pca"]``): :func:`blocklin.open` gives this PCA back, :func:`blocklin.update` the PCA
        of the grown matrix (:mod:`blocklin.linalg.lowrank.pca_stored`).
    updatable : bool
        Keep the co-moments of ``A`` in ``out`` (``n x n`` float64, one pass more) so that
        :func:`blocklin.update` brings the PCA up to date after rows are appended
        (:func:`blocklin.append`) by reading only those rows (:mod:`blocklin.linalg.update.svd`).

    Returns
    -------
    PCAResult
        scikit-learn's attribute names (``components_``, ``explained_variance_``, ``noise_variance_``,
        ...), its methods (``transform``, ``inverse_transform``, ``get_covariance``,
        ``get_precision``, ``score_samples``, ``score``) and ``report``.

    Notes
    -----
    Costs the SVD's passes plus one pass for the means (none when ``A`` fits the budget). The result
    matches ``sklearn.decomposition.PCA(n_components, whiten=whiten, svd_solver="full")`` to the
    accuracy of the truncated SVD (see :func:`blocklin.svd`'s ``tol`` and ``power_iters``); every
    component (``None``, a fraction, ``"mle"``) to that of LAPACK's SVD.

    References
    ----------
    N. Halko, P.-G. Martinsson, J. A. Tropp, "Finding structure with randomness", SIAM Review 53(2), 2011
    (Section 1.6: PCA as a centered low-rank approximation).
    M. E. Tipping, C. M. Bishop, "Probabilistic principal component analysis", J. R. Stat. Soc. B 61(3), 1999.
    T. P. Minka, "Automatic choice of dimensionality for PCA", NIPS 2000.
    """
    if k is not None:
        if n_components is not None:
            raise ParameterError(explain("k", "names n_components again: pass one of them",
                                         f"n_components={n_components!r} and k={k!r}", f"pass n_components={k!r}"))
        n_components = k
    n_components = check_n_components(n_components)
    whiten = bool(whiten)

    sparse = as_sparse_matrix(a, settings.get("storage_options"))
    if isinstance(sparse, SparseMatrix):  # centered implicitly through its operator (never densified)
        refuse_complex(sparse)  # before the moments pass, which reads the values as float64
        return _of_sparse(sparse, n_components, whiten=whiten, scale=scale, resume=resume, updatable=updatable,
                          out=out, svd_kw=dict(method=method, oversample=oversample, power_iters=power_iters,
                                               n_iter=n_iter, tol=tol, seed=seed, out=out, overwrite=overwrite,
                                               own_open=sparse is not a, **settings))
    lab = labels_of(a)
    if n_components == 0:
        if method in ("rsvd", "lanczos", "sketch"):  # as scikit-learn's randomized and arpack solvers
            raise ParameterError(explain(
                "n_components", f"0 fits the isotropic model from the column moments; method={method!r} computes "
                "at least one triplet", f"n_components=0 with method={method!r}", "pass method='auto'"))
        p = _isotropic(a, whiten=whiten, scale=scale, out=out, updatable=updatable, resume=resume, settings=settings)
        return label_pca(p, lab) if lab is not None else p
    k = n_components if isinstance(n_components, int) else None
    res = factorize(a, k, method=method, oversample=oversample, power_iters=power_iters, n_iter=n_iter, tol=tol,
                    seed=seed, out=out, overwrite=overwrite, center=True, scale=scale, resume=resume,
                    check_shape=lambda m, n, dt=None: _check_shape(n_components, m, n, dt), signs=True,
                    updatable=updatable, caller="pca", asked=f"n_components={n_components!r}",
                    record=lambda mom, scaled: pca_record(n_components, whiten=whiten, scale=scale, moments=None
                                                          if updatable else _Fitted(mom, scaled)), **settings)
    p = fitted(res, n_components, whiten=whiten, variances=pca_variances(res, res.s, scale), kept=out is not None)
    U, _, Vt = res
    if out is None:  # the scores U (or the long Vt) were a temporary store: nothing of it is returned
        remove((U if hasattr(U, "location") else Vt).location.parent)
    return label_pca(p, lab) if lab is not None else p


def pca_record(n_components: Any, *, whiten: bool, scale: bool, moments: Any = None,
               counted: tuple[int, float, int] | None = None) -> dict:
    """What a stored PCA records in its group's provenance (``params["pca"]``) so that
    :func:`blocklin.open` and :func:`blocklin.update` return it as :func:`pca` did: its options, and
    where no co-moments are kept (``moments``: the fit's, as :func:`pca_variances` reads them; or
    ``counted``, ``(m, total, e)`` as a sparse PCA's means pass gives them) the row count and
    the total variance of ``2^-exponent A`` (:mod:`blocklin.linalg.lowrank.pca_stored`)."""
    rec = {"n_components": n_components, "whiten": bool(whiten), "scale": bool(scale)}
    if moments is not None:
        _, total_s, e = pca_variances(moments, np.zeros(0), scale)
        counted = (moments.moments.count, total_s, e)
    if counted is not None:
        rec.update(n_samples=int(counted[0]), total_variance=float(counted[1]), exponent=int(counted[2]))
    return rec


def fitted(res: Any, n_components: Any, *, whiten: bool, variances: tuple, kept: bool) -> PCAResult:
    """The :class:`PCAResult` of a centered (scaled) factorization ``res`` (its ``moments``, ``scale``
    and report): ``variances`` = ``(explained, total, e)`` of ``2^-e A`` (:func:`pca_variances`), and the
    components ``n_components`` keeps of those computed; ``kept``: ``res`` is a stored one (``svd``)."""
    _, s, Vt = res
    moments = res.moments
    m = moments.count
    n = moments.mean.size
    vt = Vt.to_numpy() if hasattr(Vt, "to_numpy") else np.asarray(Vt)
    comps = vt.astype(np.result_type(s.dtype, vt.dtype), copy=False)  # V^H rows of complex data
    ev_s, total_s, e = variances
    ratio_s = variance_ratios(ev_s, total_s, stacklevel=5)
    keep = _kept(n_components, ev_s, ratio_s, m, e)
    comps, s, ev_s, ratio_s = comps[:keep], s[:keep], ev_s[:keep], ratio_s[:keep]
    rest = min(m, n) - keep
    noise_s = max(total_s - float(ev_s.sum()), 0.0) / rest if rest > 0 else 0.0
    ev, total, noise = _unscaled(ev_s, total_s, noise_s, e, s.dtype)
    report = res.report
    report["total_variance"] = total
    if keep < res.s.size and report.get("residuals") is not None:  # the report speaks of the kept triplets
        report.update(triplet_report(s.astype(np.float64), np.asarray(report["residuals"][:keep]), report["tol"],
                                     s.dtype))
        report["converged"] = all(report["converged_triplets"])
    with np.errstate(over="ignore", under="ignore"):  # beyond the dtype: said by _unscaled
        ev = ev.astype(s.dtype)
    p = PCAResult(components_=comps, explained_variance_=ev,
                  explained_variance_ratio_=ratio_s.astype(s.dtype), singular_values_=s, mean_=moments.mean,
                  scale_=res.scale, n_components_=int(s.size), n_samples_=int(m), n_features_in_=int(n),
                  total_variance_=total, noise_variance_=noise, whiten=whiten, report=report,
                  svd=res if kept else None, labels=None)
    return p


def _isotropic(a: Any, *, whiten: bool, scale: bool, out: Any, updatable: bool, resume: bool,
               settings: dict) -> PCAResult:
    """``n_components=0``: probabilistic PCA with no component, the isotropic Gaussian
    ``N(mu, noise I)`` (Tipping and Bishop 1999 with ``q = 0``), from one pass over ``A`` (the column
    moments: :func:`~blocklin.linalg.blocks.center.column_moments`, column strips of a wide ``A``).

    As scikit-learn's ``PCA(0)``: ``components_`` is ``0 x n``, the variances empty, and the noise
    variance the mean of all ``min(m, n)`` explained variances, ``total_variance_ / min(m, n)``
    (``ddof=1``; of the standardized columns with ``scale``)."""
    asked = [name for name, on in (("out", out is not None), ("updatable", bool(updatable)),
                                   ("resume", bool(resume))) if on]
    if asked:
        raise ParameterError(explain(
            "n_components", "0 fits the isotropic model from the column moments: there is no factorization to "
            "store, update or resume", f"n_components=0 with {', '.join(asked)}", f"drop {', '.join(asked)}"))
    with Job("pca", **settings) as job:
        A = job.operand(a, "a", integers="cast")
        dt = float_operand(A, "pca", complex_ok=True)
        m, n = A.shape
        # the power of two of data whose squares leave float64's range (blocklin.linalg.blocks.scaling)
        scaling = Scaling.of(source(A, transposed=m < n), A.dtype)
        mom = scaling.run(job, lambda sc: column_moments(job, A, scale=sc))
        check_standardizable(mom, scaling, scale=scale)  # as the SVD's: a lost variance is no constant column
        e = scaling.exponent
        passes = job.passes("a")
        report = job.report(method="moments", passes=passes, in_core=False,
                            passes_formula="1 (the column moments: no component)")
    report.update(center=True, scale=bool(scale), scaling=scaling.report())
    moments = Moments(unscale(mom.mean, e), unscale(mom.var, 2 * e), mom.count) if e else mom
    std = (np.where(mom.constant, 1.0, unscale(mom.std, e)) if e else mom.std) if scale else None
    kept = _Fitted(moments, (mom, e) if e else None)
    ev_s, total_s, e = pca_variances(kept, np.zeros(0, np.finfo(dt).dtype), scale)
    ev, total, noise = _unscaled(ev_s, total_s, total_s / min(m, n), e)
    report["total_variance"] = total
    real = np.finfo(dt).dtype
    return PCAResult(components_=np.zeros((0, n), dt), explained_variance_=np.zeros(0, real),
                     explained_variance_ratio_=np.zeros(0, real), singular_values_=np.zeros(0, real),
                     mean_=moments.mean, scale_=std, n_components_=0, n_samples_=int(m), n_features_in_=int(n),
                     total_variance_=total, noise_variance_=noise, whiten=whiten, report=report, svd=None,
                     labels=None)


class _Fitted:
    """The moments :func:`pca_variances` reads, as an SVD result carries them."""

    def __init__(self, moments: Any, scaled: Any) -> None:
        self.moments, self.scaled_moments = moments, scaled


def _of_sparse(s: SparseMatrix, n_components: Any, *, whiten: bool, scale: bool, resume: bool, updatable: bool,
               out: Any, svd_kw: dict) -> PCAResult:
    """PCA of a stored sparse matrix (:mod:`blocklin.linalg.lowrank.sparse_pca`): the centered operator's
    SVD, the variances from the means pass's centered sums of squares."""
    res, mean, m2, e, comps = sparse_pca(
        s, n_components, scale=scale, resume=resume, updatable=updatable, factorize=factorize, svd_kw=svd_kw,
        record=lambda count, total, exponent: pca_record(n_components, whiten=whiten, scale=False,
                                                         counted=(count, total, exponent)))
    U, sv, Vt = res
    m, n = s.shape
    if out is None:  # the temporary factors: nothing of them is returned
        remove((U if hasattr(U, "location") else Vt).location.parent)
    ddof = 1 if m > 1 else 0
    # the variances of 2^-e S (m2 is), their ratios exact however far out of range those of S are
    ev_s = np.ldexp(sv.astype(np.float64), -e) ** 2 / max(m - ddof, 1)
    total_s = total_variance(m2, m)
    ratio = variance_ratios(ev_s, total_s, stacklevel=5)
    rest = min(m, n) - sv.size
    noise_s = max(total_s - float(ev_s.sum()), 0.0) / rest if rest > 0 else 0.0
    ev, total, noise = _unscaled(ev_s, total_s, noise_s, e, sv.dtype)
    report = res.report
    report.update(total_variance=total, center="implicit (sparse operator)")
    with np.errstate(over="ignore", under="ignore"):  # beyond the dtype: said by _unscaled
        ev = ev.astype(sv.dtype)
    return PCAResult(components_=comps, explained_variance_=ev,
                     explained_variance_ratio_=ratio.astype(sv.dtype), singular_values_=sv, mean_=mean, scale_=None,
                     n_components_=int(sv.size), n_samples_=int(m), n_features_in_=int(n), total_variance_=total,
                     noise_variance_=noise, whiten=whiten, report=report, svd=res if out is not None else None,
                     labels=None)
