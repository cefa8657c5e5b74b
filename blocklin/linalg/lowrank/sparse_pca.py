"""PCA of a stored sparse matrix, centered implicitly: the SVD of the operator ``x -> S x - 1 (mu^T x)``
(adjoint ``y -> S^T y - mu (1^T y)``), never a dense or centered copy of ``S``.

One pass over the row blocks gives the column means ``mu`` and the centered sums of squares (each
block's moments from its stored entries and its implicit zeros, merged pairwise: Chan, Golub and
LeVeque 1983); the components then come from :func:`blocklin.svd`'s operator route (block Lanczos
or rsvd through the centered operator's products, :mod:`blocklin.linalg.lowrank.operator_svd`),
each product one pass over ``S``'s row blocks plus a rank-one correction in memory.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from blocklin.errors import ParameterError, explain
from blocklin.linalg.blocks.scaling import exponent_for
from blocklin.sparse import SparseMatrix, centered_operator


def sparse_moments(s: SparseMatrix) -> tuple[np.ndarray, np.ndarray, int]:
    """Column means and centered sums of squares ``sum_i (s_ij - mu_j)^2`` (float64) in one pass over
    the row blocks, one block in memory: per block from its stored entries plus its implicit zeros
    (``(h - nnz_j) mean_j^2``), merged pairwise (Chan, Golub, LeVeque 1983).

    Returns ``(mean, m2, e)``: the sums of squares are those of ``2^-e S``, ``e`` the power of two of
    the largest entry read so far (:func:`~blocklin.linalg.blocks.scaling.exponent_for`; 0 inside
    the safe range), since squares of entries near ``1e+-200`` leave float64's range. A block that
    raises the largest entry rescales what was merged before it by the change of power (exact)."""
    n = s.shape[1]
    count, mean, m2, e, amax = 0, np.zeros(n), np.zeros(n), 0, 0.0
    for _r0, blk in s.iter_row_blocks():
        h = blk.shape[0]
        if h == 0:
            continue
        cols, vals = blk.indices, np.asarray(blk.data, np.float64)
        if vals.size:
            amax = max(amax, float(np.abs(vals).max()))
            now = exponent_for(amax, np.float64)
            if now != e:  # the means and squares merged so far, in the new power
                mean, m2, e = np.ldexp(mean, e - now), np.ldexp(m2, 2 * (e - now)), now
            vals = np.ldexp(vals, -e) if e else vals
        mean_b = np.bincount(cols, vals, minlength=n) / h
        d = vals - mean_b[cols]
        m2_b = np.bincount(cols, d * d, minlength=n) + (h - np.bincount(cols, minlength=n)) * mean_b ** 2
        delta = mean_b - mean
        total = count + h
        mean = mean + delta * (h / total)
        m2 = m2 + m2_b + delta ** 2 * (count * h / total)
        count = total
    return np.ldexp(mean, e), m2, e


def total_variance(m2: np.ndarray, m: int) -> float:
    """The total variance (``ddof=1``; 0 for one row) from the columns' centered sums of squares ``m2``."""
    return float(m2.sum()) / max(m - (1 if m > 1 else 0), 1)


def sparse_pca(s: SparseMatrix, n_components: Any, *, scale: bool, resume: bool, updatable: bool,
               factorize: Any, svd_kw: dict, record: Any = None) -> tuple:
    """The centered SVD of ``s`` and its moments: ``(res, mean, m2, e, comps)`` (``m2`` that of
    ``2^-e S``, :func:`sparse_moments`) with the components
    signed by scikit-learn's rule (the stored long factor too). ``factorize`` is
    :func:`blocklin.linalg.lowrank.svd.factorize`; ``svd_kw`` its method options and settings;
    ``record(m, total, e)``: the PCA's provenance record from the row count and the total variance of
    ``2^-e S`` (:func:`blocklin.linalg.lowrank.pca.pca_record`), stored with the means beside a kept
    factorization so that :func:`blocklin.open` gives the PCA back."""
    asked = [name for name, on in (("scale", scale), ("resume", resume)) if on]
    if asked:
        raise ParameterError(explain("a", "a stored sparse matrix takes pca(S, k) through its centered operator: "
                                     "the largest k components only", f"a sparse matrix with {', '.join(asked)}",
                                     "drop those options (or convert S to a dense array: blocklin convert S.mtx "
                                     "D.zarr --dense)"))
    m, n = s.shape
    if not isinstance(n_components, int) or isinstance(n_components, bool) or not 1 <= n_components < min(m, n):
        raise ParameterError(explain(
            "n_components", f"must be an integer k with 1 <= k < min(m, n) = {min(m, n)} for a stored sparse matrix "
            "(its centered operator gives the largest components; every one needs the dense matrix)",
            f"{n_components!r} for a {m} x {n} matrix", f"pass n_components={min(10, min(m, n) - 1)}" if min(m, n) > 1
            else "a matrix of one row or column has at most one component: compute it in memory "
            "(sklearn.decomposition.PCA of S.toarray())"))
    mean, m2, e = sparse_moments(s)
    op = centered_operator(s, mean)
    if record is not None:
        rec = record(m, total_variance(m2, m), e)
        svd_kw = dict(svd_kw, record=lambda *_: rec, operator_mean=mean)
    # signed in its group before the commit; updatable: S's co-moments kept beside (lowrank.sparse_comoments)
    res = factorize(op, n_components, signs=True, updatable=updatable, **svd_kw)
    _, sv, Vt = res
    comps = (Vt.to_numpy() if hasattr(Vt, "to_numpy") else np.asarray(Vt)).astype(sv.dtype, copy=False)
    res.report["passes_formula"] = f"{res.report.get('passes_formula', '')} + 1 (column means and variances)"
    return res, mean, m2, e, comps
