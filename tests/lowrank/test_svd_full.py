"""Every singular triplet, or the smallest: ``svd(a)`` / ``svd(a, min(m, n))`` and ``which="SM"``
(``method="full"``, the Rayleigh-Ritz step over the whole space), with ``return_singular_vectors`` as
``scipy.sparse.linalg.svds`` takes it.

References are NumPy's LAPACK SVD of the same data. The bounds are those of a backward-stable SVD
(:mod:`support.tolerances`): singular values within ``c M eps ||A||_2`` of the reference (Weyl), the
smallest included, which a route through ``A^T A`` cannot give (it loses them below ``sqrt(eps) s_1``);
``A = U diag(s) Vt`` to ``c N eps ||A||_F`` (each row of ``U`` is a product with ``N x N`` factors),
orthonormal factors to ``c M eps``. Ported cases cite the peer test they come from.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

import blocklin as bl
from blocklin.errors import ParameterError
from support.tolerances import assert_factorization, assert_orthonormal, assert_singular_values

# A 2000 x 30 float64 matrix is 469 KiB: 1 MiB streams it (the whole space needs its copy, four times its
# size, beside it in memory), 256 MiB reads it once.
BUDGETS = {"streamed": "1MiB", "in-memory": "256MiB"}


def dense(x):
    return x.to_numpy() if isinstance(x, bl.Matrix) else np.asarray(x)


def graded(m: int, n: int, *, cond: float = 1e8, seed: int = 0, dtype=np.float64) -> np.ndarray:
    """``m x n`` with singular values from 1 down to ``1 / cond`` (geometric), random singular vectors."""
    rng = np.random.default_rng(seed)
    k = min(m, n)
    u, _ = np.linalg.qr(rng.standard_normal((m, k)))
    v, _ = np.linalg.qr(rng.standard_normal((n, k)))
    return ((u * np.logspace(0, -np.log10(cond), k)) @ v.T).astype(dtype)


def check_full(a, res, *, dtype=None) -> None:
    """``res`` is the thin SVD of ``a`` within a backward-stable SVD's bounds."""
    U, s, Vt = dense(res.U), res.s, dense(res.Vt)
    ref = np.linalg.svd(a.astype(np.float64), compute_uv=False)
    assert s.shape == ref.shape and np.all(np.diff(s) <= 0)
    assert_singular_values(s, ref, n=max(a.shape), dtype=dtype)
    assert_factorization(a.T if a.shape[0] < a.shape[1] else a,
                         ((U * s) @ Vt).T if a.shape[0] < a.shape[1] else (U * s) @ Vt, dtype=dtype, const=4.0)
    assert_orthonormal(U, dtype=dtype, n=max(a.shape))
    assert_orthonormal(Vt.T, dtype=dtype, n=max(a.shape))


@pytest.mark.parametrize("budget", list(BUDGETS))
@pytest.mark.parametrize("shape", [(2000, 30), (30, 2000), (300, 300)], ids=["tall", "wide", "square"])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_full_svd_matches_lapack(shape, budget, dtype):
    """NumPy's ``svd(a, full_matrices=False)`` (Dask's ``test_svd`` and SciPy's ``test_svds`` shapes).

    A square matrix is never streamed: its ``N x N`` factors are larger than itself (the smallest budget
    that holds them reads it into memory)."""
    a = graded(*shape, cond=1e3 if dtype == np.float32 else 1e8, dtype=dtype)
    if shape == (300, 300) and budget == "streamed":
        with pytest.raises(bl.errors.BudgetError) as e:
            bl.svd(a, memory="2MiB")
        assert "whole space" in str(e.value) and "lower k" not in str(e.value)
        assert bl.svd(a, memory=e.value.minimum).report["in_core"]
        return
    memory = BUDGETS[budget]
    res = bl.svd(a, memory=memory)
    assert res.report["method"] == "full" and res.report["in_core"] == (budget == "in-memory")
    assert res.report["passes"] == 1 and res.s.dtype == dtype
    assert bl.svd(a, min(shape), memory=memory).s.tolist() == res.s.tolist()  # k = min(m, n) is the same
    check_full(a, res, dtype=dtype)


@pytest.mark.parametrize("budget", list(BUDGETS))
@pytest.mark.parametrize("wide", [False, True], ids=["tall", "wide"])
def test_smallest_singular_values(budget, wide):
    """``which="SM"``, as ``scipy.sparse.linalg.svds`` (``test_svds.py``'s ``which`` cases): the smallest
    of a matrix with condition 1e8, where ``A^T A`` carries no digit of them (``eps s_1^2 / s_k^2 > 1``)."""
    a = graded(2000, 30, cond=1e8, seed=3)
    a = a.T.copy() if wide else a
    U, s, Vt = res = bl.svd(a, 4, which="SM", memory=BUDGETS[budget])
    assert res.report["method"] == "full" and res.report["which"] == "SM"
    full = np.linalg.svd(a)
    assert_singular_values(s, full.S[-4:], n=2000, s1=full.S[0])
    u, vt = dense(U), dense(Vt)
    assert u.shape == (a.shape[0], 4) and vt.shape == (4, a.shape[1])
    # each triplet: A v = s u and A^T u = s v to the backward error eps ||A|| of the whole SVD
    bound = 4 * 2000 * np.finfo(np.float64).eps * full.S[0]
    assert np.linalg.norm(a @ vt.T - u * s, axis=0).max() <= bound
    assert np.linalg.norm(a.T @ u - vt.T * s, axis=0).max() <= bound
    assert_orthonormal(u, n=2000)


def test_return_singular_vectors_as_svds(tmp_path):
    """``False``: the values alone; ``"u"`` / ``"vh"``: the other factor ``None``; a long factor that is
    not returned is not written (SciPy's ``test_svds_parameter_tol``/``return_singular_vectors`` cases)."""
    a = graded(2000, 30, seed=5)
    ref = np.linalg.svd(a, compute_uv=False)
    s = bl.svd(a, 5, return_singular_vectors=False, memory="1MiB", seed=0)
    assert isinstance(s, np.ndarray) and s.shape == (5,)
    assert_singular_values(s, ref[:5], n=2000)
    out = tmp_path / "vh.zarr"
    U, s, Vt = res = bl.svd(a, 5, return_singular_vectors="vh", memory="1MiB", seed=0, out=out)
    assert U is None and Vt.shape == (5, 30)
    assert sorted(p for p in os.listdir(out) if not p.endswith(".json")) == ["S", "Vt"]  # no U written
    assert res.report["passes_total"] < bl.svd(a, 5, memory="1MiB", seed=0).report["passes_total"]
    U, s, Vt = bl.svd(a, 5, return_singular_vectors="u", memory="1MiB", seed=0)
    assert Vt is None and dense(U).shape == (2000, 5)
    # every triplet without vectors: one pass over A and none over the stored copy to write U
    s = bl.svd(a, which="LM", return_singular_vectors=False, memory="1MiB")
    assert_singular_values(s, ref, n=2000)


def test_full_centered_is_full_pca():
    """Every component of the centered matrix (``PCA(n_components=None)``), streamed and in memory."""
    rng = np.random.default_rng(7)
    a = graded(2000, 30, cond=1e4, seed=7) + rng.standard_normal(30) * 10
    ac = a - a.mean(axis=0)
    ref = np.linalg.svd(ac, compute_uv=False)
    for memory in BUDGETS.values():
        res = bl.svd(a, center=True, memory=memory)
        # centered products are rounded at ||A|| with its means (support.tolerances.assert_explained_variance)
        assert_singular_values(res.s, ref, n=2000, s1=np.linalg.norm(a, 2))
        U, Vt = dense(res.U), dense(res.Vt)
        assert_factorization(ac, (U * res.s) @ Vt, const=4.0 * np.linalg.norm(a) / np.linalg.norm(ac))


@pytest.mark.parametrize("scheduler", ["threads", "processes"])
def test_full_svd_on_every_scheduler(scheduler):
    a = graded(2000, 30, seed=11)
    ref = bl.svd(a, memory="1MiB", scheduler="sync")
    res = bl.svd(a, memory="1MiB", scheduler=scheduler)
    assert res.report["scheduler"] == scheduler
    check_full(a, res)
    assert_singular_values(res.s, ref.s, n=2000)


@pytest.mark.slow
def test_full_svd_on_a_cluster(client):
    a = graded(2000, 30, seed=13)
    res = bl.svd(a, 3, which="SM", memory="1MiB", scheduler=client)
    assert res.report["scheduler"] == "distributed"
    full = np.linalg.svd(a, compute_uv=False)
    assert_singular_values(res.s, full[-3:], n=2000, s1=full[0])


@pytest.mark.gpu
def test_full_svd_on_the_gpu():
    a = graded(2000, 30, seed=17)
    res = bl.svd(a, memory="1MiB", device="gpu")
    assert res.report["device"] == "gpu"
    check_full(a, res)


@pytest.mark.parametrize("memory", [None, "1MiB"], ids=["in-memory", "streamed"])
@pytest.mark.parametrize("shape", [(2000, 30), (30, 2000)], ids=["tall", "wide"])
def test_rsvd_of_every_triplet_is_the_whole_space(shape, memory):
    """``method="rsvd"`` with ``k = min(m, n)``, as scikit-learn's ``randomized_svd`` takes it: the
    subspace is the whole space, so its Rayleigh-Ritz step gives LAPACK's SVD (within the full route's
    bounds, ``check_full``)."""
    a = graded(*shape, cond=1e8)
    res = bl.svd(a, min(shape), method="rsvd", seed=0, **({"memory": memory} if memory else {}))
    assert res.report["method"] == "rsvd"
    check_full(a, res)


@pytest.mark.parametrize("kwargs, words", [
    (dict(k=31), ["k", "1 <= k <= min(m, n) = 30", "k=31"]),
    (dict(k=30, method="lanczos"), ["method", "method='full'", "k=30"]),
    (dict(k=3, which="SM", method="lanczos"), ["method", "which='SM'"]),
    (dict(k=3, which="BE"), ["which", "'LM'", "'BE'"]),
    (dict(k=3, return_singular_vectors="v"), ["return_singular_vectors", "'vh'", "'v'"]),
])
def test_bad_arguments_are_refused_by_name(kwargs, words):
    a = graded(200, 30)
    with pytest.raises(ParameterError) as e:
        bl.svd(a, **kwargs)
    for w in words:
        assert w in str(e.value)


def test_numpy_generators_as_seeds():
    """scikit-learn's ``random_state`` and SciPy's ``rng``: a Generator, RandomState or SeedSequence gives
    one integer drawn from it (recorded in the report), so the same state gives the same bits."""
    a = graded(600, 30, seed=19)
    for make in (lambda: np.random.default_rng(5), lambda: np.random.RandomState(5),
                 lambda: np.random.SeedSequence(5)):
        first, again = (bl.svd(a, 3, method="rsvd", seed=make(), memory="256KiB") for _ in range(2))
        assert first.report["seed"] == again.report["seed"] and np.array_equal(first.s, again.s)
        assert np.array_equal(bl.svd(a, 3, method="rsvd", seed=first.report["seed"], memory="256KiB").s, first.s)
    w = bl.eigsh(a.T @ a, 2, seed=np.random.default_rng(1), order="descending").w
    assert w.shape == (2,)
    with pytest.raises(ParameterError, match="seed: must be a non-negative integer, None, or a NumPy Generator"):
        bl.svd(a, 3, seed=-1)


@pytest.mark.parametrize("method", ["rsvd", "lanczos"])
@pytest.mark.parametrize("budget", list(BUDGETS))
def test_a_starting_vector_as_svds_v0(method, budget):
    """SciPy's ``v0``: the first column of the starting block. The exact top right singular vector makes
    the top triplet exact after one product (rsvd with no power iteration), a random one does not."""
    a = graded(2000, 30, cond=10.0, seed=23)
    full = np.linalg.svd(a)
    kw = {"power_iters": 0} if method == "rsvd" else {}
    res = bl.svd(a, 2, method=method, seed=0, v0=full.Vh[0], memory=BUDGETS[budget], **kw)
    assert_singular_values(res.s[:1], full.S[:1], n=2000)
    w = bl.eigsh(a.T @ a, 1, seed=0, v0=full.Vh[0], order="descending").w
    # Kato-Temple with eigsh's default residual 10 sqrt(eps) lambda_1, plus the rounding of A^T A's products
    lam, tol = full.S ** 2, 10 * np.sqrt(np.finfo(float).eps)
    assert abs(w[0] - lam[0]) <= (tol * lam[0]) ** 2 / (lam[0] - lam[1]) + 4 * 30 * np.finfo(float).eps * lam[0]
    with pytest.raises(ParameterError, match=r"v0: must be a finite, nonzero real vector of length min\(m, n\) = 30"):
        bl.svd(a, 2, method=method, v0=np.zeros(30))


@pytest.mark.parametrize("budget", list(BUDGETS))
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_full_svd_of_a_triangular_matrix_beyond_cholesky_qr(budget, dtype):
    """A random triangular block (zeros below): its condition grows like ``2^n`` (4e13 here) while its QR's
    ``R``, the block itself, has a diagonal of order 1 that does not show it. ``chol(A^T A)`` breaks down
    and the TSQR's ``R`` is taken; its basis ``Y R^-1``, rounded in ``A``'s dtype, is off by
    ``eps kappa``, and refining it had moved ``R`` by as much: ``s_1`` 1e6 times too large in float32, the
    values in float64 off by ``1e-6 s_1`` (found by a randomized search)."""
    n = 40
    a = np.zeros((1200 if budget == "streamed" else 125, n), dtype=dtype)
    a[:n] = np.triu(np.random.default_rng(3).standard_normal((n, n)))
    assert np.linalg.cond(a.astype(np.float64)) > 1e13
    res = bl.svd(a, memory=BUDGETS[budget])
    assert res.report["method"] == "full" and res.report["in_core"] == (budget == "in-memory")
    check_full(a, res, dtype=dtype)
    wide = bl.svd(a.T.copy(), memory=BUDGETS[budget])  # the same tall orientation, read by columns
    assert_singular_values(wide.s, np.linalg.svd(a.astype(np.float64), compute_uv=False), n=a.shape[0], dtype=dtype)
