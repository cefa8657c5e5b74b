"""``blocklin.update`` of a stored PCA and ``blocklin.open`` of a stored PCA or SVD: what ``bl.pca``
(``bl.svd``) returns, with the options it was fitted with, against scikit-learn's ``PCA`` and a fresh
``bl.pca`` of the grown matrix (scikit-learn's ``IncrementalPCA.partial_fit`` ported: its users expect
the PCA, not bare factors).

Bounds (:mod:`support.tolerances`): the update takes the grown matrix's factors from its merged
co-moments, the Gram route on the centered (scaled) data ``B``, whose rounding is
``||dG|| <= c m eps s_1^2`` (``s_1`` of ``B``). Weyl moves each ``s_i^2`` by at most that much
(``assert_singular_values(gram=True)``), so ``explained_variance_ = s_i^2 / (m - 1)`` is within
``c m eps s_1^2 / (m - 1)``; the total variance (the co-moments' trace) within ``c m eps ||B||_F^2 /
(m - 1)``, and each ratio carries both relative errors. Each component is within Davis-Kahan's
``||dG|| / gap_i`` (``gap_i`` to the nearest other eigenvalue of the whole spectrum), up to sign (both
take scikit-learn's sign rule, which only a tie leaves open); the means as :func:`assert_mean`.
"""

from __future__ import annotations

import numpy as np
import pytest
import zarr
from sklearn.decomposition import PCA
from sklearn.preprocessing import StandardScaler

import blocklin as bl
from blocklin.errors import StoreReadError
from support.tolerances import assert_close_to, assert_mean, assert_singular_values, eps

M, P, N = 600, 80, 12
C = 4.0  # two Gram computations (the update's and the reference's), each of order m


def _rows(rng, p):
    """A spectrum of well separated variances (gaps of at least a tenth of the largest) plus offsets."""
    basis = np.linalg.qr(np.random.default_rng(7).standard_normal((N, N)))[0]
    return (rng.standard_normal((p, N)) * np.linspace(12.0, 1.0, N)) @ basis.T + np.arange(N) * 3.0


def _check_pca(p, x, *, n_components, whiten, scale):
    """``p`` against scikit-learn's PCA of ``x`` (standardized first with ``scale``): the bounds of the
    module notes."""
    b = StandardScaler().fit_transform(x) if scale else x
    ref = PCA(n_components, whiten=whiten, svd_solver="full").fit(b)
    m = x.shape[0]
    assert (p.n_components_, p.n_samples_, p.n_features_in_, p.whiten) == (ref.n_components_, m, N, whiten)
    k = ref.n_components_
    s_all = np.linalg.svd(b - b.mean(axis=0), compute_uv=False)
    dg = C * m * eps(np.float64) * s_all[0] ** 2
    assert_singular_values(p.singular_values_, ref.singular_values_, n=m, const=C, gram=True, s1=s_all[0])
    assert_close_to(p.explained_variance_, ref.explained_variance_, bound=dg / (m - 1), what="explained_variance_")
    total = float(np.sum(s_all ** 2)) / (m - 1)
    t_err = C * m * eps(np.float64) * float(np.sum(s_all ** 2)) / (m - 1)
    assert_close_to(p.explained_variance_ratio_, ref.explained_variance_ratio_,
                    bound=float(np.max(dg / (m - 1) / total + ref.explained_variance_ratio_ * t_err / total)),
                    what="explained_variance_ratio_")
    assert_close_to(p.noise_variance_, ref.noise_variance_, bound=(t_err + k * dg / (m - 1)) / max(N - k, 1),
                    what="noise_variance_")
    lam = s_all ** 2
    gaps = np.array([min(lam[i - 1] - lam[i] if i else np.inf, lam[i] - lam[i + 1] if i + 1 < N else np.inf)
                     for i in range(k)])
    sign = np.sign(np.einsum("ij,ij->i", p.components_, ref.components_))
    v_err = np.linalg.norm(p.components_ - ref.components_ * sign[:, None], axis=1)
    assert (v_err <= dg / gaps + 4 * np.sqrt(N) * eps(np.float64)).all(), (v_err, dg / gaps)
    assert_mean(p.mean_, x)
    assert (p.scale_ is not None) == scale
    if scale:
        assert_close_to(p.scale_, x.std(axis=0), bound=C * m * eps(np.float64) * float(np.abs(x).max()), what="scale_")
    # transform: the scores of each component within what its axis and its variance carry
    y, y_ref = p.transform(x), ref.transform(b)
    sd = np.sqrt(ref.explained_variance_) if whiten else np.ones(k)
    allowed = (s_all[0] * (dg / gaps + 4 * np.sqrt(N) * eps(np.float64)) / sd
               + (s_all[:k] * dg / (2 * lam[:k]) if whiten else 0.0) + C * m * eps(np.float64) * s_all[0] / sd)
    err = np.linalg.norm(y - y_ref * sign, axis=0)
    assert (err <= allowed).all(), (err, allowed)
    return ref


@pytest.mark.parametrize("n_components, whiten, scale", [
    (3, False, False), (3, True, False), (3, False, True), (None, False, False), (0.8, True, True)],
    ids=["k", "whiten", "scale", "all", "fraction-whiten-scale"])
def test_update_of_a_stored_pca_is_the_pca_of_the_grown_matrix(tmp_path, n_components, whiten, scale):
    """It had returned the bare factors ``(U, s, Vt)``: no ``explained_variance_``, ``components_``,
    ``mean_`` nor ``transform``, and neither the whitening nor the count a fraction keeps."""
    rng = np.random.default_rng(3)
    a, new = _rows(rng, M), _rows(rng, P)
    path = tmp_path / "X.zarr"
    bl.from_array(a, path, chunks=(128, N))
    bl.pca(path, n_components, whiten=whiten, scale=scale, out=tmp_path / "P.zarr", updatable=True)
    bl.append(path, new)
    p = bl.update(tmp_path / "P.zarr")
    assert isinstance(p, type(bl.pca(a[:20], 2)))
    assert p.report["updated"]["rows_before"] == M and p.report["updated"]["rows"] == M + P
    x = np.vstack([a, new])
    _check_pca(p, x, n_components=n_components, whiten=whiten, scale=scale)
    fresh = bl.pca(x, n_components, whiten=whiten, scale=scale)
    assert set(vars(fresh)) == set(vars(p)) and fresh.n_components_ == p.n_components_
    assert p.svd is not None and np.asarray(p.svd.s).size >= p.n_components_  # its factors, as pca(out=) keeps them
    current = bl.update(tmp_path / "P.zarr")  # up to date: the same PCA, nothing read
    assert current.report["current"] and current.n_samples_ == M + P
    np.testing.assert_array_equal(current.components_, p.components_)
    np.testing.assert_array_equal(current.explained_variance_ratio_, p.explained_variance_ratio_)
    opened = bl.open(tmp_path / "P.zarr")
    np.testing.assert_array_equal(opened.explained_variance_, p.explained_variance_)
    assert opened.whiten == whiten and opened.n_samples_ == M + P


@pytest.mark.parametrize("n_components, whiten, scale", [(3, True, False), (0.8, False, True), ("mle", False, False)])
def test_open_of_a_stored_pca_gives_the_pca_back(tmp_path, n_components, whiten, scale):
    """A stored PCA without co-moments: its count and total variance are recorded, so the opened PCA is the
    one ``bl.pca`` returned, bit for bit (``bl.open`` had refused the group: 'must be a zarr array')."""
    rng = np.random.default_rng(4)
    x = _rows(rng, M)
    p = bl.pca(x, n_components, whiten=whiten, scale=scale, out=tmp_path / "P.zarr")
    o = bl.open(tmp_path / "P.zarr")
    assert type(o) is type(p)
    for name in ("components_", "explained_variance_", "explained_variance_ratio_", "singular_values_", "mean_",
                 "scale_"):
        np.testing.assert_array_equal(getattr(o, name), getattr(p, name), err_msg=name)
    for name in ("noise_variance_", "total_variance_", "n_components_", "n_samples_", "n_features_in_", "whiten"):
        assert getattr(o, name) == getattr(p, name), name
    np.testing.assert_array_equal(o.transform(x[:5]), p.transform(x[:5]))
    _check_pca(o, x, n_components=n_components, whiten=whiten, scale=scale)


def test_open_of_a_stored_svd_gives_the_factors_back(tmp_path):
    """A stored ``svd`` opens as ``svd`` returned it: ``U`` stored, ``s`` and ``Vt`` in memory."""
    x = _rows(np.random.default_rng(5), M)
    res = bl.svd(x, 3, out=tmp_path / "S.zarr")
    o = bl.open(tmp_path / "S.zarr")
    np.testing.assert_array_equal(o.s, res.s)
    np.testing.assert_array_equal(o.Vt, res.Vt)
    np.testing.assert_array_equal(o.U.to_numpy(), res.U.to_numpy())
    assert o.report["method"] == res.report["method"]
    zarr.open_group(str(tmp_path / "G.zarr"), mode="w")  # a group that is no blocklin result: refused as before
    with pytest.raises(StoreReadError, match="a zarr group.*name one of its arrays"):
        bl.open(tmp_path / "G.zarr")


def test_update_of_a_sparse_pca_says_why_it_is_refused(tmp_path):
    """A stored sparse matrix's PCA records the version of its input (``covers``): current, ``update``
    returns it; after rows were appended, the refusal names the growth and the recompute (it had said
    that no rows are appended to a sparse matrix, and before that that the result recorded no input
    version); a result recording none (an older blocklin's) says so. The group is unchanged."""
    import json
    import os

    import scipy.sparse

    from blocklin.errors import ParameterError

    x = scipy.sparse.random(60, 8, density=0.3, random_state=3, format="csr")
    s = bl.from_sparse(x, tmp_path / "S.zarr")
    bl.pca(s, 2, out=tmp_path / "P.zarr", seed=0)
    assert bl.update(tmp_path / "P.zarr").report["current"]
    bl.append(tmp_path / "S.zarr", x[:4])
    before = {f: os.stat(os.path.join(r, f)).st_mtime_ns for r, _, fs in os.walk(tmp_path / "P.zarr") for f in fs}
    with pytest.raises(ParameterError, match=r"the pca of the sparse matrix .*S\.zarr.*grew from 60 to 64 rows.*"
                                             r"rerun blocklin\.pca"):
        bl.update(tmp_path / "P.zarr")
    after = {f: os.stat(os.path.join(r, f)).st_mtime_ns for r, _, fs in os.walk(tmp_path / "P.zarr") for f in fs}
    assert after == before
    meta = json.loads((tmp_path / "P.zarr" / "zarr.json").read_text())
    prov = meta["attributes"]["blocklin"]
    assert prov["inputs"] == [str(tmp_path / "S.zarr")] and prov["covers"][0]["shape"] == [60, 8]
    del prov["covers"]  # as an older blocklin wrote it
    (tmp_path / "P.zarr" / "zarr.json").write_text(json.dumps(meta))
    with pytest.raises(ParameterError, match=r"the pca of the sparse matrix .*S\.zarr.*records none.*"
                                             r"rerun blocklin\.pca"):
        bl.update(tmp_path / "P.zarr")
