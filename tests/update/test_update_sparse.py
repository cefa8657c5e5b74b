"""blocklin.update of the svd and pca of a stored sparse matrix kept with updatable=True, after rows were
appended to it: against NumPy's SVD of the grown matrix (the dense update's bounds), and against a fresh
run where the update recomputes."""

from __future__ import annotations

import json

import numpy as np
import pytest
import scipy.sparse

import blocklin as bl
from blocklin.errors import BudgetError, ParameterError
from support.updated_factors import check_updated_factors

N, K = 40, 3


def _rows(p, seed, *, noise=0.0):
    """Sparse rows of rank K: each a multiple of one of K sparse vectors with disjoint supports, the
    groups' sizes 40, 12 and 4 apart (well separated singular values); ``noise``: a sparse matrix of
    its size on top, which turns the subspace."""
    r = np.random.default_rng(99)
    basis = np.zeros((K, N))
    for j, cols in enumerate(np.array_split(r.permutation(N)[:24], K)):
        basis[j, cols] = r.standard_normal(cols.size)
    g = np.random.default_rng(seed)
    coef = np.zeros((p, K))
    coef[np.arange(p), g.integers(0, K, p)] = g.standard_normal(p)
    x = scipy.sparse.csr_matrix((coef * [40.0, 12.0, 4.0]) @ basis)
    if noise:
        x = x + noise * scipy.sparse.random(p, N, density=0.3, random_state=g.integers(1 << 30), format="csr")
    return x.tocsr()


@pytest.mark.parametrize("kind", ["svd", "pca"])
def test_update_rotates_the_scores_when_the_subspace_holds(tmp_path, kind):
    x, new = _rows(500, 1), _rows(60, 2)
    s = bl.from_sparse(x, tmp_path / "S.zarr")
    make = bl.pca if kind == "pca" else bl.svd
    make(s, K, out=tmp_path / "F.zarr", updatable=True, seed=0, tol=1e-10)
    bl.append(tmp_path / "S.zarr", new)
    res = bl.update(tmp_path / "F.zarr")
    r = res.report
    assert r["updated"]["scores"] == "rotated" and r["updated"]["rows_read"] == 60
    assert r["converged"] and max(r["u_errors"]) <= r["tol"]
    full = scipy.sparse.vstack([x, new]).toarray()
    check_updated_factors(res, full, k=K, center=kind == "pca", dtype=np.float64, u_errors=r["u_errors"])
    if kind == "pca":
        assert res.n_samples_ == 560
        np.testing.assert_allclose(res.mean_, full.mean(axis=0), rtol=0, atol=1e-14 * np.abs(full).max())
    prov = json.load(open(tmp_path / "F.zarr" / "zarr.json"))["attributes"]["blocklin"]
    assert prov["params"]["update"]["count"] == 560 and prov["covers"][0]["shape"] == [560, N]
    assert bl.update(tmp_path / "F.zarr").report["current"]


def test_update_recomputes_when_the_subspace_turns(tmp_path):
    """Noise turns the subspace: rotating the old scores would miss tol, so the sparse route runs again
    with the recorded parameters: the bits of a fresh updatable PCA of the grown matrix (its row blocks:
    a fresh ``from_sparse`` of the stacked rows has others, whose sums round otherwise)."""
    x, new = _rows(500, 1, noise=0.5), _rows(60, 2, noise=0.5)
    s = bl.from_sparse(x, tmp_path / "S.zarr")
    bl.pca(s, K, out=tmp_path / "F.zarr", updatable=True, seed=0, tol=1e-8)
    bl.append(tmp_path / "S.zarr", new)
    res = bl.update(tmp_path / "F.zarr")
    assert res.report["updated"]["how"].startswith("recomputed:") and res.report["updated"]["rows_read"] == 560
    fresh = bl.pca(tmp_path / "S.zarr", K, out=tmp_path / "H.zarr", updatable=True, seed=0, tol=1e-8)
    assert res.components_.tobytes() == fresh.components_.tobytes()
    assert res.explained_variance_.tobytes() == fresh.explained_variance_.tobytes()
    assert res.svd.U.to_numpy().tobytes() == fresh.svd.U.to_numpy().tobytes()
    assert json.load(open(tmp_path / "F.zarr" / "zarr.json"))["attributes"]["blocklin"]["params"]["update"][
        "count"] == 560


def test_updatable_sparse_refusals(tmp_path):
    x = _rows(200, 3)
    s = bl.from_sparse(x, tmp_path / "S.zarr")
    with pytest.raises(ParameterError, match="updatable.*out="):
        bl.svd(s, K, updatable=True)
    wide = bl.from_sparse(scipy.sparse.random(10, 30, density=0.5, random_state=0), tmp_path / "W.zarr")
    with pytest.raises(ParameterError, match="updatable.*tall A"):
        bl.svd(wide, 2, out=tmp_path / "WF.zarr", updatable=True)
    with pytest.raises(ParameterError, match="updatable.*tall A"):
        bl.pca(wide, 2, out=tmp_path / "WP.zarr", updatable=True)
    many_columns = bl.from_sparse(scipy.sparse.random(3000, 2000, density=0.001, random_state=0), tmp_path / "N.zarr")
    with pytest.raises(BudgetError, match=r"n x n co-moments.*n = 2000.*got 32.00 MiB"):  # 64 MB of co-moments
        bl.svd(many_columns, 2, out=tmp_path / "NF.zarr", updatable=True, memory="32MiB")
    assert not (tmp_path / "NF.zarr").exists()
    bl.svd(s, K, out=tmp_path / "F.zarr", seed=0)  # not updatable
    bl.append(tmp_path / "S.zarr", _rows(5, 4))
    with pytest.raises(ParameterError, match=r"updatable=True.*grew from 200 to 205 rows.*rerun blocklin\.svd.*"
                                             r"updatable=True"):
        bl.update(tmp_path / "F.zarr")


def test_rows_appended_after_the_matrix_was_opened_are_not_covered(tmp_path):
    """A result covers the rows its run read: rows appended after the handle was opened (and before the
    output's claim) are read by the update; they had been recorded as covered, so the update called
    the result current without them."""
    x, new = _rows(500, 1), _rows(60, 2)
    bl.from_sparse(x, tmp_path / "S.zarr")
    s = bl.open(tmp_path / "S.zarr")  # 500 rows
    bl.append(tmp_path / "S.zarr", new)
    bl.svd(s, K, out=tmp_path / "F.zarr", updatable=True, seed=0, tol=1e-10)
    prov = json.load(open(tmp_path / "F.zarr" / "zarr.json"))["attributes"]["blocklin"]
    assert prov["covers"][0]["shape"] == [500, N] and prov["params"]["update"]["count"] == 500
    res = bl.update(tmp_path / "F.zarr")
    assert res.report["updated"]["rows_read"] == 60
    full = scipy.sparse.vstack([x, new]).toarray()
    check_updated_factors(res, full, k=K, center=False, dtype=np.float64, u_errors=res.report["u_errors"])


def test_update_refuses_rows_rewritten_while_it_reads_them(tmp_path, monkeypatch):
    """The update reads the appended rows' co-moments before it claims the output; a rewrite of the group
    during that read (another program's values) was not seen: the claim's listing, taken after the read,
    stood for the version read. The update's run now takes the stamp of its open of ``S``, so the commit
    refuses and the stored result is unchanged."""
    import zarr

    import blocklin.linalg.update.svd as update_svd
    from blocklin.errors import InputChangedError

    x, new = _rows(500, 1), _rows(60, 2)
    s = bl.from_sparse(x, tmp_path / "S.zarr")
    bl.svd(s, K, out=tmp_path / "F.zarr", updatable=True, seed=0, tol=1e-10)
    bl.append(tmp_path / "S.zarr", new)
    real = update_svd.sparse_comoments

    def read_then_rewrite(*args, **kwargs):
        out = real(*args, **kwargs)
        data = zarr.open_array(str(tmp_path / "S.zarr" / "data"), mode="r+")
        data[...] = data[...] * 7 + 1
        return out

    monkeypatch.setattr(update_svd, "sparse_comoments", read_then_rewrite)
    with pytest.raises(InputChangedError, match=r"S\.zarr changed"):
        bl.update(tmp_path / "F.zarr")
    prov = json.load(open(tmp_path / "F.zarr" / "zarr.json"))["attributes"]["blocklin"]
    assert prov["covers"][0]["shape"] == [500, N]  # the stored result is the old one
