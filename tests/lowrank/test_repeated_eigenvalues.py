"""An eigenvalue repeated more often than the Lanczos block is wide is never a silent wrong result.

A block Krylov space holds at most ``b`` vectors of an eigenspace (Golub and Underwood 1977), so block
Lanczos finds at most ``b`` copies; the values after them were then replaced by the next ones with
converged residuals (found by a randomized search of sparse graphs). Such a run now says so
(:func:`blocklin.linalg.lowrank.lanczos.full_block_cluster`: a ``ConvergenceWarning`` naming the value,
its count and a ``block_size`` that finds more, and ``converged=False``); a wide enough block gives
LAPACK's values within the residual bound.

The graph: six paths of five nodes (bipartite: each adds the eigenvalue 2 of the normalized
Laplacian) and odd cycles of 7 to 19 nodes (``1 + cos(pi / L)``: 1.9010 to 1.9864, each twice).
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import scipy.sparse as sp
from scipy.sparse.csgraph import laplacian

import blocklin as bl
from blocklin.errors import ConvergenceWarning
from blocklin.linalg.lowrank.lanczos import full_block_cluster


def _path(n):
    return sp.diags([np.ones(n - 1), np.ones(n - 1)], [1, -1])


def _cycle(n):
    a = _path(n).tolil()
    a[0, n - 1] = a[n - 1, 0] = 1
    return a.tocsr()


@pytest.fixture(scope="module")
def graph(tmp_path_factory):
    g = sp.block_diag([_path(5)] * 6 + [_cycle(n) for n in (7, 9, 11, 13, 15, 17, 19)]).tocsr()
    lap = laplacian(g, normed=True).toarray()
    path = tmp_path_factory.mktemp("graph") / "g.zarr"
    bl.from_sparse(g, path)
    return path, lap, np.linalg.eigvalsh(lap)[::-1]


def _run(call):
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        out = call()
    return out, [w for w in seen if issubclass(w.category, ConvergenceWarning)]


@pytest.mark.parametrize("stored", ["sparse", "dense"])
@pytest.mark.parametrize("seed", [0, 1])
def test_a_full_block_of_copies_is_said_not_hidden(graph, stored, seed):
    path, lap, ref = graph
    assert np.allclose(ref[:7], [2] * 6 + [1 + np.cos(np.pi / 19)])  # six 2s, then 1.9864
    a = path if stored == "sparse" else lap
    kw = {"laplacian": "normalized"} if stored == "sparse" else {}
    res, warned = _run(lambda: bl.eigsh(a, 7, block_size=4, order="descending", seed=seed, **kw))
    if not warned:  # the run found every copy (rounding can add directions): then it must be right
        assert np.allclose(res[0], ref[:7], atol=1e-6)
        assert res.report["converged"]
        return
    assert len(warned) == 1
    msg = str(warned[0].message)
    assert "found 4 times" in msg and "block_size=8" in msg and "Golub and Underwood" in msg
    assert res.report["converged"] is False
    # reported as svd reports it, on the sparse and dense routes alike
    assert set(res.report["repeated_beyond_block"]) == {"value", "count", "block"} and "found 4 times" in res.report["note"]


@pytest.mark.parametrize("stored", ["sparse", "dense"])
def test_a_wide_enough_block_finds_every_copy(graph, stored):
    path, lap, ref = graph
    a = path if stored == "sparse" else lap
    kw = {"laplacian": "normalized"} if stored == "sparse" else {}
    (w, _), warned = _run(lambda: bl.eigsh(a, 7, block_size=8, order="descending", seed=0, **kw))
    assert not warned
    # each Ritz value within its residual of an eigenvalue (Bauer-Fike for a symmetric matrix); the
    # default tol bounds the residuals at tol * |w|max
    tol = 10 * np.sqrt(np.finfo(np.float64).eps)
    assert np.all(np.abs(w - ref[:7]) <= 2 * tol * 2)


def test_copies_that_end_the_wanted_values_displace_nothing(graph):
    path, _, ref = graph
    (w, _), warned = _run(lambda: bl.eigsh(path, 4, laplacian="normalized", block_size=4, order="descending", seed=0))
    assert not warned and np.allclose(w, 2.0, atol=1e-6)


def test_svd_says_so_too(tmp_path):
    """Lanczos on ``B^T B``: a singular value repeated beyond the block, with smaller ones wanted after it."""
    rng = np.random.default_rng(3)
    m, n = 3000, 400
    q1, _ = np.linalg.qr(rng.standard_normal((m, n)))
    q2, _ = np.linalg.qr(rng.standard_normal((n, n)))
    s = np.concatenate([[10.0] * 8, 9.99 - 0.01 * np.arange(n - 8)])
    a = (q1 * s) @ q2.T
    res, warned = _run(lambda: bl.svd(a, 10, method="lanczos", block_size=4, seed=0, memory="4MiB"))
    if not warned:
        assert np.allclose(res.s, s[:10], rtol=1e-6)
        return
    assert len(warned) == 1 and "found 4 times" in str(warned[0].message) and "svd" in str(warned[0].message)
    assert res.report["converged"] is False and "found 4 times" in res.report["note"]
    assert set(res.report["repeated_beyond_block"]) == {"value", "count", "block"}


@pytest.mark.parametrize("theta,rn,block,found", [
    ([2, 2, 2, 2, 1.98, 1.97], [1e-9] * 6, 4, True),      # four copies, values after them: said
    ([2, 2, 2, 1.98, 1.97, 1.9], [1e-9] * 6, 4, False),    # three copies: all of them
    ([3, 2, 2, 2, 2], [1e-9] * 5, 4, False),               # the copies end the wanted values
    ([2, 2, 2, 2 - 1e-7, 1.9], [1e-7] * 5, 4, True),       # within their residuals of each other: one value
    ([2, 2, 2, 2 - 1e-7, 1.9], [1e-9] * 5, 4, False),      # apart by more than their residuals: distinct
    ([2, 2, 1.9], [1e-9] * 3, 4, False),                   # a block as wide as the values
])
def test_full_block_cluster_rule(theta, rn, block, found):
    got = full_block_cluster(np.array(theta, dtype=float), np.array(rn), block)
    assert (got is not None) == found


@pytest.mark.parametrize("conv,found", [
    ([True] * 6, True),
    ([False] + [True] * 5, False),                  # a copy not converged: three found, all of them
    ([True] * 3 + [False] + [True] * 2, False),
    ([True] * 4 + [False] * 2, True),                # four found; the values after them unconverged
])
def test_only_converged_pairs_count_as_found(conv, found):
    """A value counts as found only with converged residuals; the note says whether the values after the
    copies converged (it had said "although their residuals converged" of a run stopped unconverged)."""
    got = full_block_cluster(np.array([2, 2, 2, 2, 1.98, 1.97]), np.full(6, 1e-9), 4, np.array(conv))
    assert (got is not None) == found
    if got is not None:
        assert ("although their residuals converged" in got["note"]) == all(conv)
        assert ("not all of their residuals converged" in got["note"]) == (not all(conv))


def test_unconverged_pairs_are_not_said_to_repeat(tmp_path):
    """Distinct eigenvalues (1 to 2, evenly spread), a run stopped by ``max_passes`` with relative residuals
    near 0.1: their Bauer-Fike intervals overlapped, and the run had been said to find 1.96 four times
    ("as many as the Lanczos block holds"), its non-convergence left unsaid. Now only the
    non-convergence is said, and nothing is reported as repeated."""
    rng = np.random.default_rng(0)
    n = 1000
    q, _ = np.linalg.qr(rng.standard_normal((n, n)))
    a = (q * np.linspace(1, 2, n)) @ q.T
    a = (a + a.T) / 2
    path = tmp_path / "a.zarr"
    bl.from_array(a, path)
    res, warned = _run(lambda: bl.eigsh(path, 8, block_size=2, max_passes=5, order="descending", seed=0,
                                        memory="4MiB"))
    assert not res.report["in_core"] and res.report["converged"] is False
    assert len(warned) == 1 and "not reached within 5 passes" in str(warned[0].message)
    assert "found" not in str(warned[0].message)
    assert "repeated_beyond_block" not in res.report and "note" not in res.report


@pytest.mark.parametrize("with_out", [False, True])
def test_the_planned_block_is_widened_and_the_run_made_again(graph, tmp_path, with_out):
    """``block_size`` left to the planner (4 for ``k = 7`` here, sparse): the run that finds four copies
    is made again with a block of 8, which finds all six; no warning, ``converged``, the widening in the
    report; an output asked for holds the second run's pairs."""
    path, lap, ref = graph
    out = tmp_path / "w.zarr" if with_out else None
    res, warned = _run(lambda: bl.eigsh(path, 7, laplacian="normalized", order="descending", seed=0, out=out))
    assert not warned and res.report["converged"]
    widened = res.report["block_widened"]
    assert [(w["count"], w["block"]) for w in widened] == [(4, 4)] and res.report["block"] == 8
    tol = 10 * np.sqrt(np.finfo(np.float64).eps)
    assert np.all(np.abs(res[0] - ref[:7]) <= 2 * tol * 2)
    if with_out:
        import zarr

        assert np.array_equal(zarr.open_group(str(out), mode="r")["w"][:], res[0])


def test_a_wider_block_the_budget_refuses_keeps_the_warning():
    """The rerun is refused (``BudgetError``): the first result stands, with its warning."""
    from blocklin.errors import BudgetError
    from blocklin.linalg.lowrank.lanczos import rerun_wider_block

    class Result(tuple):
        report: dict

    calls = []

    def fn(a, k, block_size=None, out=None):
        calls.append(block_size)
        if block_size == 8:
            raise BudgetError("memory: too small for a block of 8")
        warnings.warn("eigsh: the value 2 was found 4 times", ConvergenceWarning)
        r = Result((np.ones(k), None))
        r.report = {"repeated_beyond_block": {"value": 2.0, "count": 4, "block": 4, "note": "..."}}
        return r

    res, warned = _run(lambda: rerun_wider_block(fn)(None, 7))
    assert calls == [None, 8] and len(warned) == 1 and "block_widened" not in res.report
    res, warned = _run(lambda: rerun_wider_block(fn)(None, 7, block_size=4))  # a block asked for: kept
    assert calls[-1] == 4 and len(warned) == 1


def _top_repeated(n, copies=5, seed=5):
    rng = np.random.default_rng(seed)
    lam = np.concatenate([[10.0] * copies, np.linspace(5, 0.1, n - copies)])
    q, _ = np.linalg.qr(rng.standard_normal((n, n)))
    a = (q * lam) @ q.T
    return (a + a.T) / 2, lam


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("n,k,block", [(20, 3, 2), (20, 6, 2), (30, 4, 3), (45, 4, 3)])
def test_vectors_orthonormal_when_the_top_value_repeats_beyond_the_block(n, k, block, dtype):
    """The top eigenvalue five times, a block of 2 or 3: every step after a copy converges leaves a block
    whose directions span eigenvalue gaps of ``10 / 0.1``; normalized after Gram-Schmidt twice it had lost
    orthogonality to the basis by ``u cond``, and the Ritz vectors with it (``||V^T V - I||`` 2e-12 to 9e-8
    here; up to 0.27, and values 1e-11 above the largest eigenvalue reported converged, for other seeds and
    ``k``: :func:`blocklin.linalg.lowrank.lanczos._keep_orthogonal`). Now orthonormal to a few ``u``,
    and every value reported converged is LAPACK's within its residual (Weyl/Kahan for orthonormal ``V``)."""
    a, lam = _top_repeated(n)
    a = a.astype(dtype)
    eps = float(np.finfo(dtype).eps)
    ref = np.linalg.eigvalsh(a.astype(np.float64))[::-1][:k]
    for seed in range(3):
        res, warned = _run(lambda: bl.eigsh(a, k, block_size=block, seed=seed, order="descending"))
        w, v = (np.asarray(x, dtype=np.float64) for x in res)
        # Gram-Schmidt against the basis leaves about u per step; a few such steps and storing V in ``dtype``
        # (sqrt(k) u) stay well inside 64 sqrt(k) u (before the fix: up to 1e12 u)
        assert np.linalg.norm(v.T @ v - np.eye(k), 2) <= 64 * np.sqrt(k) * eps
        if warned:  # a cluster as wide as the block with values after it: said, and never converged
            assert res.report["converged"] is False and "found" in str(warned[0].message)
            continue
        assert res.report["converged"]
        # Kahan: an orthonormal V has k eigenvalues within ||A V - V diag(w)||_2 of w; these are the top k.
        # The residual is formed here in float64 from the returned (rounded) V and w, so it includes their
        # rounding; the slack covers forming it (n terms of size ||A|| = 10 each, u each)
        r = np.linalg.norm(a.astype(np.float64) @ v - v * w, 2)
        assert np.all(np.abs(w - ref) <= r + 8 * n * eps * 10)
        assert np.all(w <= lam.max() + r + 8 * n * eps * 10)
