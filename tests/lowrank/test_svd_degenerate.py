"""Degenerate matrices (zero, rank one, constant) get their exact answers from every method of svd,
eigsh and pca, in memory and streamed, tall and wide.

Exact answer: the singular values of NumPy's dense SVD (zeros beyond the rank, to the rounding of
``eps * s_1``), ``A = U diag(s) Vt``, orthonormal ``V`` and orthonormal columns of ``U`` for the
nonzero singular values and an orthonormal completion for the zero ones (``U^T U = I``, as LAPACK's;
tests/lowrank/test_svd_zero_singular_values.py checks it on every route), converged residuals.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import blocklin as bl

M, N, K = 240, 36, 3
# A 240 x 36 float64 matrix is 69 KiB: 256 KiB streams it (twice its size plus the bases do not fit),
# 64 MiB reads it once into memory.
BUDGETS = {"streamed": "256KiB", "in-memory": "64MiB"}


def _matrices() -> dict:
    i = np.arange(1.0, M + 1)
    return {"zero": np.zeros((M, N)), "rank-one": np.outer(i, np.linspace(1.0, 2.0, N)),
            "constant": np.full((M, N), 3.0)}


def _dense(x):
    return x.to_numpy() if isinstance(x, bl.Matrix) else np.asarray(x)


@pytest.mark.parametrize("wide", [False, True], ids=["tall", "wide"])
@pytest.mark.parametrize("budget", list(BUDGETS))
@pytest.mark.parametrize("method", ["rsvd", "sketch", "lanczos"])
@pytest.mark.parametrize("name", ["zero", "rank-one", "constant"])
def test_svd_of_degenerate_matrices(name, method, budget, wide):
    a = _matrices()[name]
    a = a.T.copy() if wide else a
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no ConvergenceWarning, no LinAlgError: the answer is exact
        U, s, Vt = res = bl.svd(a, K, method=method, seed=0, memory=BUDGETS[budget])
    assert res.report["in_core"] == (budget == "in-memory")
    u, vt = _dense(U), _dense(Vt)
    exact = np.linalg.svd(a, compute_uv=False)[:K]
    s1 = max(exact[0], 1.0)
    eps = np.finfo(a.dtype).eps
    # rounding of products with M-long columns: a few eps * s_1 * sqrt(M), generously
    atol = 100 * eps * s1 * np.sqrt(max(a.shape))
    np.testing.assert_allclose(s, exact, rtol=0, atol=atol)
    # both factors orthonormal: the long one (U for tall A, Vt for wide A) completed where s is zero
    long, short = (vt.T, u) if wide else (u, vt.T)
    if name == "zero":
        assert np.all(s == 0)
    np.testing.assert_allclose(u * s @ vt, a, rtol=0, atol=atol)
    np.testing.assert_allclose(long.T @ long, np.eye(K), atol=1e-12)
    np.testing.assert_allclose(short.T @ short, np.eye(K), atol=1e-12)
    if method != "sketch":
        assert res.report["converged"] and all(res.report["converged_triplets"])


@pytest.mark.parametrize("budget", list(BUDGETS))
def test_eigsh_of_degenerate_symmetric_matrices(budget):
    x = np.linspace(1.0, 2.0, 120)
    cases = {"zero": np.zeros((120, 120)), "rank-one": np.outer(x, x), "constant": np.full((120, 120), 2.0)}
    for name, a in cases.items():
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            res = bl.eigsh(a, 3, seed=0, memory="360KiB" if budget == "streamed" else "64MiB", order="descending")
        w, V = res
        assert res.report["in_core"] == (budget == "in-memory")
        exact = np.linalg.eigvalsh(a)[::-1][:3]
        np.testing.assert_allclose(w, exact, rtol=0, atol=1e-12 * max(1.0, exact[0]), err_msg=name)
        np.testing.assert_allclose(V.T @ V, np.eye(3), atol=1e-12, err_msg=name)
        np.testing.assert_allclose(a @ V, V * w, atol=1e-10 * max(1.0, exact[0]), err_msg=name)


@pytest.mark.parametrize("budget", list(BUDGETS))
def test_pca_of_a_constant_matrix(budget):
    """No variance: the variances are 0 and their ratios nan (0 / 0) as scikit-learn's, with one warning
    that says why, and no other."""
    a = np.full((M, N), 7.0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        p = bl.pca(a, K, seed=0, memory=BUDGETS[budget])
    said = [str(w.message) for w in caught]
    assert len(said) == 1 and "the data have no variance" in said[0], said
    np.testing.assert_array_equal(p.mean_, np.full(N, 7.0))
    assert np.all(p.singular_values_ == 0) and np.all(p.explained_variance_ == 0)
    assert np.all(np.isnan(p.explained_variance_ratio_)) and p.total_variance_ == 0
    np.testing.assert_allclose(p.components_ @ p.components_.T, np.eye(K), atol=1e-12)
