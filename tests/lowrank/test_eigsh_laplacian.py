"""blocklin.eigsh of a stored sparse graph's Laplacian (laplacian=), never formed, against SciPy's
``csgraph.laplacian`` and LAPACK; the sparse route's output group and integer adjacencies."""

from __future__ import annotations

import json

import numpy as np
import pytest
import scipy.sparse as sp
import zarr
from scipy.sparse.csgraph import laplacian as scipy_laplacian

import blocklin as bl
from blocklin.cli.main import main
from blocklin.errors import NotSymmetricError, ParameterError
from support.tolerances import assert_ritz_values, eps


def _graph(n=240, seed=0):
    """A weighted undirected graph with self-loops (ignored by the Laplacian) and an isolated node."""
    rng = np.random.default_rng(seed)
    w = sp.random(n, n, density=0.03, random_state=seed, format="lil")
    w.setdiag(rng.uniform(0.5, 1.5, n))
    w[7, :] = 0
    w[:, 7] = 0
    a = sp.csr_matrix(w)
    a = (a + a.T).tocsr()
    a.eliminate_zeros()
    return a


@pytest.mark.parametrize("kind", ["combinatorial", "normalized"])
@pytest.mark.parametrize("which", ["SA", "LA"])
def test_laplacian_eigenpairs_match_scipy_and_lapack(tmp_path, kind, which):
    a = _graph()
    s = bl.from_sparse(a, tmp_path / "G.zarr")
    lap = scipy_laplacian(a, normed=kind == "normalized").toarray()
    full = np.linalg.eigvalsh(lap)
    res = bl.eigsh(s, 4, which=which, laplacian=kind, order="ascending", seed=3, max_passes=400)
    w, V = res
    assert res.report["converged"] and w.dtype == np.float64 and V.shape == (240, 4)
    assert res.report["laplacian"] == kind and res.report["isolated_nodes"] == 1
    assert res.report["self_loops_ignored"] == 239
    ref = full[:4] if which == "SA" else full[-4:]
    norm = float(np.abs(full).max())
    resid = np.asarray(res.report["residuals"])
    # the Lanczos values are Ritz values of L: within residual^2 / gap of SciPy's L's eigenvalues
    # (plus the rounding of a product with L, n eps ||L||); the pairs' residuals are what Lanczos reports
    assert_ritz_values(w, ref, spectrum=full, residuals=resid, n=240, norm=norm)
    got = np.linalg.norm(lap @ V - V * w, axis=0)
    assert (got <= resid + 4 * 240 * eps(np.float64) * norm).all()


def test_integer_adjacency_gives_float64_eigenpairs_and_an_output_group(tmp_path):
    a = _graph(seed=1)
    a.data[:] = 1
    a = a.astype(np.int64)
    s = bl.from_sparse(a, tmp_path / "G.zarr")
    assert s.dtype == np.int64
    w, V = res = bl.eigsh(s.path, 3, order="descending", seed=0, max_passes=200, out=tmp_path / "E.zarr")
    full = np.linalg.eigvalsh(a.toarray().astype(np.float64))
    assert w.dtype == np.float64 and res.report["converged"]
    assert_ritz_values(w, full[::-1][:3], spectrum=full, residuals=np.asarray(res.report["residuals"]), n=240,
                       norm=float(np.abs(full).max()))
    g = zarr.open_group(str(tmp_path / "E.zarr"), mode="r")
    assert np.array_equal(g["w"][:], w) and np.array_equal(g["V"][:], V)
    rec = g.attrs["blocklin"]
    assert rec["operation"] == "eigsh" and rec["report"]["nnz"] == a.nnz
    assert res.report["bytes_read"] > 0  # the row blocks' reads are counted


def test_cli_eigs_laplacian_writes_the_smallest_pairs(tmp_path, capsys):
    a = _graph(seed=2)
    bl.from_sparse(a, tmp_path / "G.zarr")
    assert main(["eigs", str(tmp_path / "G.zarr"), "-k", "3", "--which", "SA", "--laplacian", "normalized",
                 "--max-passes", "400", "-o", str(tmp_path / "L.zarr"), "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    full = np.linalg.eigvalsh(scipy_laplacian(a, normed=True).toarray())
    w = zarr.open_group(str(tmp_path / "L.zarr"), mode="r")["w"][:]
    assert np.allclose(summary["w"], w)
    assert_ritz_values(w, full[:3], spectrum=full, residuals=np.asarray(summary["residuals"]), n=240,
                       norm=float(np.abs(full).max()))


def test_laplacian_refusals(tmp_path):
    a = _graph(seed=3)
    with pytest.raises(ParameterError, match="laplacian: takes a stored sparse adjacency"):
        bl.eigsh(a.toarray(), 2, laplacian="normalized", order="ascending")
    s = bl.from_sparse(a, tmp_path / "G.zarr")
    with pytest.raises(ParameterError, match="laplacian: must be one of"):
        bl.eigsh(s, 2, laplacian="random-walk", order="ascending")
    neg = a.copy()
    neg.data[:] = -neg.data
    with pytest.raises(ParameterError, match="laplacian: 'normalized' needs nonnegative degrees.*degree -"):
        bl.eigsh(bl.from_sparse(neg, tmp_path / "N.zarr"), 2, laplacian="normalized", order="ascending")
    rect = bl.from_sparse(sp.random(30, 20, density=0.2, random_state=0, format="csr"), tmp_path / "R.zarr")
    with pytest.raises(ParameterError, match="a: must be square and symmetric"):
        bl.eigsh(rect, 2, laplacian="combinatorial", order="ascending")
    directed = bl.from_sparse(sp.random(60, 60, density=0.2, random_state=1, format="csr"), tmp_path / "D.zarr")
    with pytest.raises(NotSymmetricError, match="must be symmetric"):
        bl.eigsh(directed, 2, laplacian="combinatorial", order="ascending")
    assert not (tmp_path / "E.zarr").exists()


@pytest.mark.parametrize("loop", [1e17, 1e300])
@pytest.mark.parametrize("kind", ["combinatorial", "normalized"])
@pytest.mark.parametrize("held", [True, False], ids=["held", "streamed"])
def test_large_self_loops_are_ignored_exactly(tmp_path, monkeypatch, kind, loop, held):
    """The Laplacian ignores self-loops; it had formed ``W X`` as ``A X - diag(A) X`` and the degrees as
    ``A 1 - diag(A)``, which cancel beside a self-loop far above the edges: at ``1e17`` two nodes with
    edges counted as isolated and the smallest eigenvalues 20-70% off (found by a search, 2026-12-06).
    Now the products read the diagonal as zeros: held in memory, or streamed as the job's tasks (several
    groups, processes)."""
    from blocklin.runtime import sparse_pass

    if not held:
        monkeypatch.setattr(sparse_pass, "HOLD_BLOCKS", False)
        monkeypatch.setattr(sparse_pass, "GROUP_ENTRIES", 300)
    a = _graph(seed=4).tolil()
    a[5, 5], a[9, 9] = loop, loop / 3
    a = a.tocsr()
    s = bl.from_sparse(a, tmp_path / "G.zarr")
    lap = scipy_laplacian(a.toarray(), normed=kind == "normalized")  # the dense form drops the diagonal first
    full = np.linalg.eigvalsh(lap)
    res = bl.eigsh(s, 4, which="SA", laplacian=kind, order="ascending", seed=3, max_passes=400,
                   scheduler="sync" if held else "processes", workers=2)
    w, V = res
    assert res.report["converged"] and res.report["isolated_nodes"] == 1
    resid = np.asarray(res.report["residuals"])
    norm = float(np.abs(full).max())
    assert_ritz_values(w, full[:4], spectrum=full, residuals=resid, n=240, norm=norm)
    got = np.linalg.norm(lap @ V - V * w, axis=0)
    assert (got <= resid + 4 * 240 * eps(np.float64) * norm).all()
