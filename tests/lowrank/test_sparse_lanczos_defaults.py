"""The sparse route's block Lanczos defaults and fast paths (issue 29's speed goal): the smaller block and
basis of a stored sparse matrix or an operator (:func:`blocklin.plan.svd.sparse_block`,
:func:`~blocklin.plan.svd.sparse_basis`), the products that skip their copies, and the strip products
of a thick restart.

Every result is checked against LAPACK (NumPy's ``svd``/``eigh`` of the dense matrix) within the
Ritz-value bound of its reported residuals (:func:`support.tolerances.assert_ritz_values`), the new
defaults against the old block and basis within the same bounds, the bits on every scheduler, and the
plans (``--explain``) against the runs.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
import scipy.sparse as sp

import blocklin as bl
import blocklin.runtime.sparse_pass as sparse_pass
from blocklin.errors import ConvergenceWarning
from blocklin.linalg.lowrank.basis import MemoryBasis, ritz_residuals, strip_times
from blocklin.linalg.lowrank.sparse_eigsh import eigsh_defaults
from blocklin.linalg.lowrank.sparse_plan import sparse_lowrank_plan
from blocklin.plan.svd import default_basis, sparse_basis, sparse_block
from support.tolerances import assert_ritz_values, eps

K = 6


@pytest.fixture(scope="module")
def graph(tmp_path_factory):
    """A symmetric power-law-like sparse matrix (a few hubs), 900 nodes: eigenvalues of both signs."""
    rng = np.random.default_rng(7)
    n = 900
    w = (1 + np.arange(n)) ** -0.6
    rows = rng.choice(n, 12000, p=w / w.sum())
    cols = rng.integers(0, n, 12000)
    a = sp.coo_matrix((np.ones(12000), (rows, cols)), shape=(n, n)).tocsr()
    a = (a + a.T).tocsr()
    a.sum_duplicates()
    return a, bl.from_sparse(a, tmp_path_factory.mktemp("g") / "S.zarr", memory="9MiB")


@pytest.fixture(scope="module")
def spectrum(graph):
    """LAPACK's singular values and eigenvalues (descending) of the graph, once (one BLAS thread: two spin
    on a busy machine)."""
    from threadpoolctl import threadpool_limits

    with threadpool_limits(1, "blas"):
        dense = graph[0].toarray()
        return np.linalg.svd(dense, compute_uv=False), np.linalg.eigvalsh(dense)[::-1]


def test_sparse_block_and_basis_rules():
    assert sparse_block(20, 10, 10**5) == 4  # about an eighth of k + oversample
    assert sparse_block(100, 10, 10**5) == 14
    assert sparse_block(1, 10, 10**5) == 4  # at least 4
    assert sparse_block(20, 10, 3) == 3  # at most N
    assert sparse_block(200, 10, 10**5) == 27
    for k, n in ((20, 10**5), (1, 50), (6, 900), (40, 60)):
        b = sparse_block(k, 10, n)
        mb = sparse_basis(k, 10, b, n)
        assert k + b <= mb and (mb <= n or mb == k + b)
    assert sparse_basis(20, 10, 4, 10**5) == 68
    # a given block keeps the dense route's basis for it; both given are taken as they are
    assert eigsh_defaults(20, 10**5, None, None) == (4, 68)
    assert eigsh_defaults(20, 10**5, 15, None) == (15, default_basis(20, 10, 15))
    assert eigsh_defaults(20, 10**5, 15, 50) == (15, 50)


def test_runs_and_plans_take_the_sparse_defaults(graph):
    _, s = graph
    n = s.shape[0]
    b = sparse_block(K, 10, n)
    res = bl.svd(s, K, seed=0)
    assert (res.report["block"], res.report["plan"]["max_basis"]) == (b, sparse_basis(K, 10, b, n))
    plan = sparse_lowrank_plan(s, K, operation="svd")
    assert (plan.details["block"], plan.details["max_basis"]) == (b, sparse_basis(K, 10, b, n))
    w, _ = eig = bl.eigsh(s, K, order="descending", seed=0)
    assert (eig.report["block"], eig.report["max_basis"]) == eigsh_defaults(K, n, None, None)
    plan = sparse_lowrank_plan(s, K, operation="eigsh")
    assert (plan.details["block"], plan.details["max_basis"]) == (eig.report["block"], eig.report["max_basis"])


def _svd_checked(a, s, full, **kw):
    """``bl.svd`` of ``s`` against LAPACK's singular values ``full``, within its reported residuals' bound."""
    U, sv, Vt = res = bl.svd(s, K, seed=0, tol=1e-10, **kw)
    assert res.report["converged"]
    residuals = np.array(res.report["residuals"])
    assert_ritz_values(sv, full[:K], spectrum=full, residuals=residuals, n=a.shape[0], norm=full[0])
    u = U.to_numpy() if isinstance(U, bl.Matrix) else np.asarray(U)
    # B v - s u = 0 by construction (U = B V S^-1 from the last pass), to the products' rounding
    assert np.linalg.norm(a @ Vt.T - u * sv, axis=0).max() <= 8 * a.shape[0] * eps(np.float64) * full[0]
    return sv, res


def test_svd_defaults_against_lapack_and_the_old_block(graph, spectrum):
    a, s = graph
    full = spectrum[0]
    new, res = _svd_checked(a, s, full)
    old, ref = _svd_checked(a, s, full, block_size=K + 10, max_basis=2 * (K + 10))  # the route's block before
    assert res.report["block"] < ref.report["block"]
    # both within their bounds of LAPACK's: within the sum of the two of each other
    gaps = np.abs(np.diff(full))[:K]
    bound = (np.array(res.report["residuals"]) ** 2 + np.array(ref.report["residuals"]) ** 2) / gaps.min() \
        + 8 * a.shape[0] * eps(np.float64) * full[0]
    assert (np.abs(new - old) <= bound).all()


def test_an_unconverged_sparse_svd_counts_its_products_in_the_warning(graph):
    """The warning names the products with the operator it ran (a stored sparse matrix makes no pass over a
    dense ``A``: it once said "within 0 passes over A")."""
    _, s = graph
    with pytest.warns(ConvergenceWarning, match=r"not reached within (\d+) products with the operator") as rec:
        res = bl.svd(s, K, tol=1e-12, max_passes=2, seed=0)
    said = int(re.search(r"within (\d+) products", str(rec[-1].message)).group(1))
    assert said == res.report["operator_products"] > 0 and res.report["converged"] is False


@pytest.mark.parametrize("scheduler", ["threads", "processes"])
def test_eigsh_defaults_against_lapack_and_their_bits_on_every_scheduler(graph, spectrum, scheduler, monkeypatch):
    a, s = graph
    monkeypatch.setattr(sparse_pass, "SPLIT_ENTRIES", 2000)  # the held S X split between threads off sync
    w, V = res = bl.eigsh(s, K, order="descending", seed=0, tol=1e-10, scheduler="sync")
    assert res.report["converged"]
    full = spectrum[1]
    norm = float(np.abs(full).max())
    assert_ritz_values(w, full[:K], spectrum=full, residuals=np.array(res.report["residuals"]), n=a.shape[0],
                       norm=norm)
    # each pair's residual, recomputed here
    assert (np.linalg.norm(a @ V - V * w, axis=0) <= np.array(res.report["residuals"]) * 1.01
            + 8 * a.shape[0] * eps(np.float64) * norm).all()
    w2, V2 = bl.eigsh(s, K, order="descending", seed=0, tol=1e-10, scheduler=scheduler, workers=2)
    assert np.array_equal(w, w2) and np.array_equal(V, V2)


def test_a_single_group_product_has_the_bits_of_the_combined_one(tmp_path, monkeypatch, rng):
    a = sp.random(30000, 300, density=0.03, random_state=4, format="csr")
    s = bl.from_sparse(a, tmp_path / "S.zarr", memory="9MiB")  # several row blocks, one group
    store = s._store
    assert len(sparse_pass.row_groups(store)) == 1 and s.n_blocks >= 2
    x, y = rng.standard_normal((a.shape[1], 5)), rng.standard_normal((a.shape[0], 5))
    sx = sparse_pass.product_in_process(store, x, False, np.float64)
    sty = sparse_pass.product_in_process(store, y, True, np.float64)
    # the old way: each block's SciPy product copied into place; the partial added to zeros
    bounds = store.row_blocks
    ref = np.vstack([sparse_pass.read_block(store, int(bounds[b]), int(bounds[b + 1]), np.float64) @ x
                     for b in range(len(bounds) - 1)])
    assert np.array_equal(sx, ref)
    part = sparse_pass.group_product(store, 0, len(bounds) - 1, y, True, np.float64)
    assert np.array_equal(sty, np.zeros_like(part) + part)
    # several groups: placed and summed as before, the same rows
    monkeypatch.setattr(sparse_pass, "GROUP_ENTRIES", 4000)
    assert len(sparse_pass.row_groups(store)) >= 2
    assert np.array_equal(sparse_pass.product_in_process(store, x, False, np.float64), sx)
    assert np.linalg.norm(sparse_pass.product_in_process(store, y, True, np.float64) - a.T @ y) <= \
        4 * a.shape[0] * eps(np.float64) * np.linalg.norm(abs(a).T @ abs(y))


@pytest.mark.parametrize("dtype", [np.float64, np.complex128])
def test_strip_products_agree_with_numpy_and_each_other(dtype, rng):
    n, m, r = 500, 7, 4

    def rand(*shape):
        x = rng.standard_normal(shape)
        return (x + 1j * rng.standard_normal(shape)).astype(dtype) if np.dtype(dtype).kind == "c" else x

    v, w, y = rand(n, m), rand(n, m), rand(m, r)
    V, W = MemoryBasis(n, 10, dtype), MemoryBasis(n, 10, dtype)
    V.append(v)
    W.append(w)
    t = V.times(y)
    assert np.linalg.norm(t - v @ y) <= 4 * m * eps(np.float64) * np.linalg.norm(abs(v) @ abs(y))
    theta = rng.random(r)
    _, ritz, res = ritz_residuals(V, W, y, theta, keep=True)
    assert np.array_equal(ritz, t)  # the Ritz vectors a spilled run forms by a restart: the same bits
    assert np.array_equal(res, strip_times(W.strip(0), np.ascontiguousarray(y.T)) - t * theta)
    V.restart(y)
    assert np.array_equal(V.to_numpy(), t)


def test_a_split_product_has_the_bits_of_one_call(monkeypatch, rng):
    from concurrent.futures import ThreadPoolExecutor

    a = sp.random(5000, 700, density=0.02, random_state=3, format="csr")
    x = rng.standard_normal((700, 6))
    one = np.zeros((5000, 6))
    sparse_pass._put_product(one, a, x)
    assert np.array_equal(one, a @ x)  # SciPy's own product: the same kernel on zeros
    monkeypatch.setattr(sparse_pass, "SPLIT_ENTRIES", 1000)
    for threads in (2, 3, 7):
        cuts = sparse_pass._row_cuts(a.indptr, threads)
        assert cuts[0] == 0 and cuts[-1] == 5000 and len(cuts) == threads + 1
        split = np.zeros((5000, 6))
        with ThreadPoolExecutor(threads) as pool:
            sparse_pass._put_product(split, a, x, pool)
        assert np.array_equal(split, one), threads
    monkeypatch.setattr(sparse_pass, "SPLIT_ENTRIES", 1 << 18)
    assert sparse_pass._row_cuts(a.indptr, 4) == [0, 5000]  # too few entries to split
