"""PCA of a stored sparse matrix, centered implicitly (the operator ``S x - 1 (mu^T x)``, never a
dense copy), against scikit-learn's dense PCA of ``S.toarray()``.

Bounds from :mod:`support.tolerances`: the means (:func:`assert_mean`), the explained variances and
ratios (:func:`assert_explained_variance`, Weyl at the uncentered data's size: the Lanczos run is
converged to ``tol = 10 sqrt(eps)``, whose Ritz values are then at the rounding level), the Ritz
values of a looser run (:func:`assert_ritz_values`), and each component within ``2 r_i / gap_i`` of
the reference (Wedin's sin-theta bound with the run's residual ``r_i``) plus the products' rounding.
"""

from __future__ import annotations


import numpy as np
import pytest
import scipy.sparse
from sklearn.decomposition import PCA

import blocklin as bl
from blocklin.errors import ParameterError
from support.interrupts import tree_bytes
from support.placements import PLACEMENTS, placement_kwargs
from support.tolerances import assert_explained_variance, assert_mean, assert_ritz_values, eps


def _sparse(m: int, n: int, seed: int, dtype=np.float64) -> scipy.sparse.csr_matrix:
    x = scipy.sparse.random(m, n, density=0.1, random_state=seed, format="csr", dtype=np.float64)
    x = (x @ scipy.sparse.diags(np.logspace(0, -2, n))).tolil()
    x[50:120] = 0  # all-zero rows
    return x.tocsr().astype(dtype)


def _check_components(comps, ref, sv, residuals, spectrum, n, dtype):
    for i in range(comps.shape[0]):
        others = np.delete(spectrum, np.argmin(np.abs(spectrum - sv[i])))
        gap = float(np.min(np.abs(others - sv[i])))
        bound = 2 * residuals[i] / gap + 8 * n * eps(dtype)
        assert np.linalg.norm(comps[i] - ref[i]) <= bound, (i, np.linalg.norm(comps[i] - ref[i]), bound)


@pytest.mark.parametrize("shape", [(600, 40), (40, 300)], ids=["tall", "wide"])
def test_sparse_pca_equals_dense_pca(tmp_path, shape):
    x = _sparse(*shape, seed=4) if shape[0] > shape[1] else _sparse(*shape[::-1], seed=4).T.tocsr()
    s = bl.from_sparse(x, tmp_path / "s.zarr")
    tol = 10 * np.sqrt(eps(np.float64))
    p = bl.pca(s, 4, seed=0, tol=tol, out=tmp_path / "p.zarr")
    dense = x.toarray()
    ref = PCA(4, svd_solver="full").fit(dense)
    assert_mean(p.mean_, dense)
    assert_explained_variance(p.explained_variance_, ref.explained_variance_, p.explained_variance_ratio_,
                              ref.explained_variance_ratio_, dense)
    spectrum = np.linalg.svd(dense - dense.mean(axis=0), compute_uv=False)
    _check_components(p.components_, ref.components_, p.singular_values_, np.array(p.report["residuals"]),
                      spectrum, max(shape), np.float64)
    assert p.report["operator_products"] >= 1 and p.n_samples_ == shape[0]
    # the stored factors carry the components' signs: U diag(s) are the scores
    U, sv, Vt = p.svd
    vt = Vt.to_numpy() if hasattr(Vt, "to_numpy") else Vt
    u = U.to_numpy() if hasattr(U, "to_numpy") else U
    assert np.array_equal(np.asarray(vt, p.components_.dtype), p.components_)
    scores = p.transform(dense)
    rounding = 8 * max(shape) * eps(np.float64) * np.linalg.norm(dense, 2)
    assert np.linalg.norm(scores - u * sv, axis=0).max() <= rounding + 2 * max(p.report["residuals"])


def test_sparse_pca_float32_by_path(tmp_path):
    x = _sparse(500, 30, seed=7, dtype=np.float32)
    bl.from_sparse(x, tmp_path / "s.zarr")
    p = bl.pca(str(tmp_path / "s.zarr"), 3, seed=1)
    assert p.components_.dtype == np.float32 and p.singular_values_.dtype == np.float32
    dense = x.toarray().astype(np.float64)
    spectrum = np.linalg.svd(dense - dense.mean(axis=0), compute_uv=False)
    assert_ritz_values(p.singular_values_, spectrum[:3], spectrum=spectrum, residuals=np.array(p.report["residuals"]),
                       n=500, norm=np.linalg.norm(dense, 2), dtype=np.float32)
    assert_mean(p.mean_, dense)  # the means are summed in float64


def test_sparse_pca_refusals(tmp_path):
    s = bl.from_sparse(_sparse(200, 20, seed=2), tmp_path / "s.zarr")
    with pytest.raises(ParameterError, match=r"a: a stored sparse matrix takes pca\(S, k\).*with scale.*Fix: drop"):
        bl.pca(s, 3, scale=True)
    with pytest.raises(ParameterError, match=r"n_components: must be an integer k with 1 <= k < min\(m, n\) = 20.*"
                                             r"got None"):
        bl.pca(s, None)
    with pytest.raises(ParameterError, match=r"method: must be one of \('rsvd', 'lanczos', 'sketch'\).*'gram'"):
        bl.pca(s, 3, method="gram")


def test_sparse_pca_of_integer_values_is_that_of_their_float64(tmp_path):
    """Integer values are computed on as float64 (the cast NumPy and SciPy make): the same bits."""
    x = scipy.sparse.random(300, 40, density=0.1, random_state=1, format="csr",
                            data_rvs=lambda k: np.random.default_rng(0).integers(1, 9, k)).astype(np.int64)
    p = bl.pca(bl.from_sparse(x, tmp_path / "i.zarr"), 3, seed=0, whiten=True)
    q = bl.pca(bl.from_sparse(x.astype(np.float64), tmp_path / "f.zarr"), 3, seed=0, whiten=True)
    assert p.components_.dtype == np.float64
    for name in ("components_", "explained_variance_", "singular_values_", "mean_"):
        assert np.array_equal(getattr(p, name), getattr(q, name)), name


@pytest.mark.parametrize("shape", [(600, 40), (40, 300)], ids=["tall", "wide"])
def test_stored_sparse_pca_opens_as_the_pca(tmp_path, shape):
    """``bl.open`` of a sparse PCA's ``out`` gives the ``PCAResult`` ``bl.pca`` returned (it had given the
    bare ``SVDResult``: no means nor record were stored): the group now holds the column means and the
    row count and total variance of the means pass, so every attribute is the fitted one, bit for bit,
    and the model's as scikit-learn's dense PCA's (the bounds of :func:`test_sparse_pca_equals_dense_pca`)."""
    x = _sparse(*shape, seed=5) if shape[0] > shape[1] else _sparse(*shape[::-1], seed=5).T.tocsr()
    s = bl.from_sparse(x, tmp_path / "s.zarr")
    p = bl.pca(s, 4, seed=0, tol=10 * np.sqrt(eps(np.float64)), whiten=True, out=tmp_path / "p.zarr")
    o = bl.open(tmp_path / "p.zarr")
    assert type(o).__name__ == "PCAResult" and o.whiten and o.n_components_ == 4 and o.n_samples_ == shape[0]
    for name in ("components_", "explained_variance_", "explained_variance_ratio_", "singular_values_", "mean_"):
        np.testing.assert_array_equal(np.asarray(getattr(o, name)), getattr(p, name), err_msg=name)
    assert (o.noise_variance_, o.total_variance_) == (p.noise_variance_, p.total_variance_)
    dense = x.toarray()
    ref = PCA(4, svd_solver="full", whiten=True).fit(dense)
    assert_mean(o.mean_, dense)
    assert_explained_variance(o.explained_variance_, ref.explained_variance_, o.explained_variance_ratio_,
                              ref.explained_variance_ratio_, dense)
    # the noise: the total variance less the kept ones (each off by the bounds above), over min(m, n) - 4
    m = shape[0]
    bound = 8 * m * eps(np.float64) * np.linalg.norm(dense) ** 2 / (m - 1) / (min(shape) - 4)
    assert abs(o.noise_variance_ - ref.noise_variance_) <= bound


@pytest.mark.parametrize("placement", PLACEMENTS)
def test_stored_sparse_pca_opens_as_the_pca_wherever_it_ran(tmp_path, placement, request):
    """The stored sparse PCA opens as the ``PCAResult`` that every scheduler and device returned, bit for
    bit, and is scikit-learn's dense PCA to the bounds of :func:`test_sparse_pca_equals_dense_pca`."""
    x = _sparse(600, 40, seed=6)
    s = bl.from_sparse(x, tmp_path / "s.zarr")
    p = bl.pca(s, 4, seed=0, tol=10 * np.sqrt(eps(np.float64)), out=tmp_path / "p.zarr",
               **placement_kwargs(placement, request))
    o = bl.open(tmp_path / "p.zarr")
    assert type(o).__name__ == "PCAResult" and o.n_components_ == 4 and o.n_samples_ == 600
    for name in ("components_", "explained_variance_", "singular_values_", "mean_"):
        np.testing.assert_array_equal(np.asarray(getattr(o, name)), getattr(p, name), err_msg=name)
    dense = x.toarray()
    ref = PCA(4, svd_solver="full").fit(dense)
    assert_mean(o.mean_, dense)
    assert_explained_variance(o.explained_variance_, ref.explained_variance_, o.explained_variance_ratio_,
                              ref.explained_variance_ratio_, dense)




@pytest.mark.parametrize("shape", [(600, 40), (40, 300)], ids=["tall", "wide"])
def test_sparse_pca_group_is_final_at_its_commit(tmp_path, shape, monkeypatch):
    """The components' signs (scikit-learn's rule) are given to the stored factors before the commit:
    they had been rewritten in the committed group afterwards (``U``'s and ``Vt``'s chunks), so an
    interrupt between the two writes left a committed PCA whose ``U`` and ``Vt`` disagreed in sign,
    and a reader could see either. The group as committed is the group returned, and its factors are
    the PCA's: ``Vt`` its components, ``U diag(s)`` the scores of the centered rows."""
    from blocklin.storage.atomic import AtomicOutput

    x = _sparse(*shape, seed=6) if shape[0] > shape[1] else _sparse(*shape[::-1], seed=6).T.tocsr()
    s = bl.from_sparse(x, tmp_path / "s.zarr")
    out = tmp_path / "p.zarr"
    at_commit = {}
    commit = AtomicOutput.commit

    def recording(self, *args, **kw):
        path = commit(self, *args, **kw)
        if str(path) == str(out):
            at_commit.update(tree_bytes(out))
        return path

    monkeypatch.setattr(AtomicOutput, "commit", recording)
    p = bl.pca(s, 4, seed=0, tol=10 * np.sqrt(eps(np.float64)), out=out)
    assert at_commit and tree_bytes(out) == at_commit
    o = bl.open(out)
    np.testing.assert_array_equal(np.asarray(o.components_), p.components_)
    u = bl.open(out / "U").to_numpy()
    dense = x.toarray()
    rounding = 8 * max(shape) * eps(np.float64) * np.linalg.norm(dense, 2)
    assert np.linalg.norm(p.transform(dense) - u * p.singular_values_, axis=0).max() <= \
        rounding + 2 * max(p.report["residuals"])
