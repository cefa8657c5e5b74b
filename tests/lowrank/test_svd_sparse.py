"""``svd`` of a stored sparse matrix (``blocklin-csr``): block Lanczos or rsvd through its row-block
operator (:class:`blocklin.sparse.SparseOperator`), against LAPACK's SVD of the dense matrix.

Bounds as in ``test_svd_operator_input.py``: Ritz values within the residual's square over the gap
plus the products' rounding (:func:`assert_ritz_values`); the products against SciPy's own within
the rounding of their dot products (the stored rows' entries are summed in sorted column order).
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import scipy.sparse

import blocklin as bl
from blocklin.errors import OutputIsInputError
from blocklin.sparse import SparseOperator
from support.interrupts import tree_bytes
from support.tolerances import assert_ritz_values, eps


def _decaying_sparse(m: int, n: int, seed: int) -> scipy.sparse.csr_matrix:
    """A sparse ``m x n`` matrix whose columns decay from 1 to 1e-4 (a decaying spectrum)."""
    x = scipy.sparse.random(m, n, density=0.05, random_state=seed, format="csr")
    return (x @ scipy.sparse.diags(np.logspace(0, -4, n))).tocsr()


@pytest.fixture
def stored(tmp_path):
    x = _decaying_sparse(1500, 60, 1)
    return x, bl.from_sparse(x, tmp_path / "x.zarr")


def test_operator_products_equal_scipy(stored, rng):
    x, s = stored
    op = s.aslinearoperator()
    assert isinstance(op, SparseOperator) and op.shape == x.shape and op.dtype == np.float64
    v, w = rng.standard_normal((60, 3)), rng.standard_normal((1500, 2))
    # the same products in another summation order: the rounding of a dot product of the row's length
    tol = 4 * 60 * eps(np.float64) * abs(x).max() * np.abs(v).max() * 60
    np.testing.assert_allclose(op.matmat(v), x @ v, rtol=0, atol=tol)
    np.testing.assert_allclose(op.matvec(v[:, 0]), x @ v[:, 0], rtol=0, atol=tol)
    tol = 4 * 1500 * eps(np.float64) * abs(x).max() * np.abs(w).max() * 1500
    np.testing.assert_allclose(op.rmatmat(w), x.T @ w, rtol=0, atol=tol)
    np.testing.assert_allclose(op.H.matvec(w[:, 0]), x.T @ w[:, 0], rtol=0, atol=tol)
    assert op.products == 4


@pytest.mark.parametrize("kw", [{"method": "lanczos"}, {"method": "rsvd", "power_iters": 6}],
                         ids=["lanczos", "rsvd"])
def test_svd_of_a_sparse_matrix(stored, kw):
    x, s = stored
    U, sv, Vt = res = bl.svd(s, 5, seed=0, **kw)
    assert res.report["method"] == kw["method"] and res.report["operator_products"] >= 1
    full = np.linalg.svd(x.toarray(), compute_uv=False)
    residuals = np.array(res.report["residuals"])
    assert_ritz_values(sv, full[:5], spectrum=full, residuals=residuals, n=1500, norm=full[0])
    u = U.to_numpy() if isinstance(U, bl.Matrix) else U
    rounding = 8 * 1500 * eps(np.float64) * full[0]
    assert np.linalg.norm(x @ Vt.T - u * sv, axis=0).max() <= rounding


def test_svd_refuses_what_an_operator_cannot_do(stored):
    _x, s = stored
    from blocklin.errors import ParameterError

    with pytest.raises(ParameterError, match="for a LinearOperator"):
        bl.svd(s, 3, method="gram")
    # named as what it is, with a fix that applies to it (the message had called it a LinearOperator and
    # told to pass "the matrix itself", which it was)
    for kw in ({"center": True}, {"which": "SM"}):
        with pytest.raises(ParameterError, match="a stored sparse matrix takes rsvd or block Lanczos.*--dense"):
            bl.svd(s, 3, **kw)


def test_svd_of_a_sparse_group_path(stored, tmp_path):
    """A path to a sparse group takes the operator route, as the opened matrix does (same bits)."""
    x, s = stored
    U, sv, Vt = res = bl.svd(s.path, 4, method="lanczos", seed=0, out=tmp_path / "f.zarr")
    U2, sv2, Vt2 = bl.svd(s, 4, method="lanczos", seed=0)
    assert np.array_equal(sv, sv2) and np.array_equal(Vt, Vt2) and res.report["operator_products"] >= 1
    full = np.linalg.svd(x.toarray(), compute_uv=False)
    assert_ritz_values(sv, full[:4], spectrum=full, residuals=np.array(res.report["residuals"]), n=1500,
                       norm=full[0])
    assert U.shape == (1500, 4) and bl.open(tmp_path / "f.zarr" / "U").shape == (1500, 4)


@pytest.mark.parametrize("method", ["gram", "full"])
def test_sparse_group_path_refuses_dense_methods(stored, method):
    _x, s = stored
    from blocklin.errors import ParameterError

    with pytest.raises(ParameterError, match=rf"method.*\('rsvd', 'lanczos', 'sketch'\).*'{method}'.*method='auto'"):
        bl.svd(s.path, 3, method=method)


def test_cli_svd_of_a_sparse_group(stored, tmp_path, capsys):
    import json

    from blocklin.cli.main import main

    x, s = stored
    out = tmp_path / "cli.zarr"
    assert main(["svd", s.path, "-k", "3", "-o", str(out), "--json", "--seed", "0"]) == 0
    summary = json.loads(capsys.readouterr().out)
    full = np.linalg.svd(x.toarray(), compute_uv=False)
    got = np.asarray(summary["s"])
    # converged to the default tol: the Ritz values within the residuals' squares over the gaps
    import zarr

    r = zarr.open_group(str(out), mode="r").attrs["blocklin"]["report"]
    assert_ritz_values(got, full[:3], spectrum=full, residuals=np.array(r["residuals"]), n=1500, norm=full[0])


def test_dense_operations_name_the_sparse_route(stored):
    _x, s = stored
    from blocklin.errors import StoreReadError

    with pytest.raises(StoreReadError, match=r"a sparse matrix \(blocklin-csr group\).*blocklin.open\(PATH\)"):
        bl.qr(s.path)  # a dense operation (eigsh takes a sparse symmetric matrix: test_eigsh_sparse.py)


def test_svd_of_integer_values_is_float64(tmp_path):
    x = scipy.sparse.random(300, 80, density=0.05, random_state=2, format="csr")
    x.data[:] = np.arange(x.nnz) % 5 + 1
    x = x.astype(np.int32)
    s = bl.from_sparse(x, tmp_path / "i.zarr")
    res = bl.svd(s, 3, seed=0)
    _, S, _ = res
    full = np.linalg.svd(x.toarray().astype(np.float64), compute_uv=False)
    assert S.dtype == np.float64  # integer values multiply as float64 (SparseOperator), never truncated
    assert_ritz_values(S, full[:3], spectrum=full, residuals=np.asarray(res.report["residuals"]), n=300,
                       norm=float(full[0]))


def test_sketch_of_a_sparse_matrix_recovers_a_low_rank_one(tmp_path):
    """method="sketch" through the operator: ``S [Omega | Psi]`` and ``S^T Upsilon^T`` with the stored
    route's test matrices, so the same seed gives the dense sketch. A matrix of rank 4 <= k is recovered
    exactly in exact arithmetic (Tropp, Yurtsever, Udell, Cevher 2019, Sec. 5); in floating point the
    error passes through two least-squares solves with Gaussian test matrices (14 x 5 and 29 x 14 here),
    whose condition numbers stay below 1e3 but with negligible probability, times the products'
    rounding (n eps s_1): within 1e3 * 60 * eps * s_1."""
    rng = np.random.default_rng(5)
    base = scipy.sparse.random(4, 60, density=0.3, random_state=6, format="csr").toarray() + np.eye(4, 60)
    rows = rng.integers(0, 4, 2000)
    x = scipy.sparse.csr_matrix(base[rows] * rng.uniform(0.5, 2.0, (2000, 1)))
    s = bl.from_sparse(x, tmp_path / "r4.zarr")
    res = bl.svd(s, 5, method="sketch", seed=2)
    _, sv, Vt = res
    full = np.linalg.svd(x.toarray(), compute_uv=False)
    assert res.report["method"] == "sketch" and res.report["passes"] == 1
    bound = 1e3 * 60 * eps(np.float64) * full[0]
    assert np.abs(sv[:4] - full[:4]).max() <= bound and sv[4] <= bound
    dense = bl.svd(x.toarray(), 5, method="sketch", seed=2)  # the stored route's sketch, same test matrices
    assert np.abs(dense[1][:4] - sv[:4]).max() <= 2 * bound


@pytest.mark.parametrize("shape", [(3000, 400), (400, 3000)], ids=["tall", "wide"])
@pytest.mark.parametrize("method", ["lanczos", "rsvd", "sketch"])
def test_sparse_svd_runs_at_the_minimum_its_refusal_names(tmp_path, shape, method):
    """The minimum a refusal names is the whole call's: with k = 20 the block Lanczos route's last
    Rayleigh-Ritz product is 40 columns wide against a block of 30, and the sketch's ``B [Omega | Psi]``
    is wider than its ``B^T Upsilon^T``; a retry at the named minimum runs (issue 28's sweep, on the
    sparse route), and the plan (``sparse_lowrank_plan``) names the same minimum."""
    from blocklin.linalg.lowrank.sparse_plan import sparse_lowrank_plan

    x = scipy.sparse.random(*shape, density=0.02, random_state=3, format="csr")
    s = bl.from_sparse(x, tmp_path / "s.zarr")
    kw = dict(method=method, **({"power_iters": 1} if method == "rsvd" else {}))
    budget, retried = 64 << 10, 0
    while budget <= 64 << 20:
        try:
            bl.svd(s, 20, memory=budget, scheduler="sync", seed=0, **kw)
            break
        except bl.errors.BudgetError as exc:
            assert exc.minimum and exc.minimum > budget, str(exc)
            with pytest.raises(bl.errors.BudgetError) as planned:
                sparse_lowrank_plan(s, 20, memory=budget, **kw)
            assert planned.value.minimum == exc.minimum
            res = bl.svd(s, 20, memory=exc.minimum, scheduler="sync", seed=0, **kw)  # not refused again
            assert res.report["operator_products"] >= 1
            retried += 1
            budget *= 4
    assert retried >= 1




@pytest.mark.parametrize("where", ["same", "inside"])
@pytest.mark.parametrize("route", ["svd", "pca", "svd of a Matrix", "pca of a Matrix"])
def test_a_result_never_goes_onto_or_inside_its_sparse_input(tmp_path, route, where):
    """The operator route records the stored matrix it reads as its input: ``out=`` the sparse
    matrix itself with ``overwrite=True`` had replaced it with the result (the input gone), and ``out``
    inside it had written a group into it; both refused now, the input byte for byte as it was, and
    the result's provenance names its input."""
    path = tmp_path / "S.zarr"
    bl.from_sparse(_decaying_sparse(300, 20, 2), path)
    a = bl.open(path) if route.endswith("Matrix") else str(path)
    run = bl.pca if route.startswith("pca") else bl.svd
    before = tree_bytes(path)
    out = path if where == "same" else path / "R"
    with pytest.raises(OutputIsInputError, match="inputs are never modified"):
        run(a, 3, out=out, overwrite=True, seed=0)
    assert tree_bytes(path) == before
    run(a, 3, out=tmp_path / "R.zarr", seed=0)
    assert json.loads((tmp_path / "R.zarr" / "zarr.json").read_text())["attributes"]["blocklin"]["inputs"] == [str(path)]
