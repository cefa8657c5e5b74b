"""Zero singular values: the long factor's columns are an orthonormal completion (``U^T U = I``), as
LAPACK's (``numpy.linalg.svd``) and ``scipy.sparse.linalg.svds``' are, on every route of ``svd``.

Rank-deficient tall and wide matrices (all zero, rank one, repeated columns as Dask's
``test_svd_supported_array_shapes`` builds them), in memory and streamed, on every scheduler. Checked
against NumPy with the error-analysis bounds of ``support.tolerances``: orthonormality of both factors
(``c n eps``), the reconstruction ``||A - U S V^T||`` (``c n eps ||A||``, ``n`` the long side: the
products are that long), the singular values (Weyl), and ``A^T u = 0`` for each completed column
(orthogonal to ``range(A)``: a singular vector of the zero singular value, not just any unit vector).
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from support.tolerances import assert_factorization, assert_orthonormal, assert_singular_values, eps

import blocklin as bl
from blocklin.errors import BudgetError

M, N = 2000, 30
# 2000 x 30 float64 is 469 KiB: 1 MiB streams every method (the whole space included), 64 MiB holds it
BUDGETS = {"streamed": "1MiB", "in-memory": "64MiB"}


def _matrix(name: str, dtype=np.float64) -> np.ndarray:
    rng = np.random.default_rng(5)
    if name == "zero":
        a = np.zeros((M, N))
    elif name == "rank-one":
        a = np.outer(rng.standard_normal(M), rng.standard_normal(N))
    else:  # repeated columns: rank 6
        a = np.repeat(rng.standard_normal((M, 6)), N // 6, axis=1)
    return a.astype(dtype)


def _dense(x) -> np.ndarray:
    return x.to_numpy() if isinstance(x, bl.Matrix) else np.asarray(x)


def check(a: np.ndarray, res, *, which: str = "LM") -> None:
    """Both factors orthonormal, the reconstruction of ``A`` (every triplet beyond the rank kept), the
    singular values against NumPy's and the completed columns in the null space of ``A^T``."""
    u, s, vt = _dense(res.U), np.asarray(res.s), _dense(res.Vt)
    k = s.size
    long_side = max(a.shape)
    exact = np.linalg.svd(a.astype(np.float64), compute_uv=False)
    ref = exact[:k] if which == "LM" else exact[-k:]
    assert_singular_values(s, ref, n=long_side, s1=max(exact[0], np.finfo(float).tiny), dtype=a.dtype)
    assert_orthonormal(u, dtype=a.dtype)
    assert_orthonormal(vt.T, dtype=a.dtype)
    if which == "LM":
        recon = (u * s) @ vt
        wide = a if a.shape[0] < a.shape[1] else a.T  # n in the bound: the long side
        assert_factorization(wide, recon if a.shape[0] < a.shape[1] else recon.T, const=4.0, dtype=a.dtype)
    zero = s == 0
    assert zero.any(), "the case must have a zero singular value"
    long, tall_a = (vt.T, a.T) if a.shape[0] < a.shape[1] else (u, a)
    # completed long-factor columns: B^T u = 0 to the rounding of the products (B the tall orientation)
    resid = np.linalg.norm(tall_a.astype(np.float64).T @ long[:, zero].astype(np.float64))
    bound = 4 * long_side * eps(a.dtype) * max(np.linalg.norm(a.astype(np.float64)), np.finfo(float).tiny)
    assert resid <= bound, f"||B^T u|| = {resid:.3e} > {bound:.3e} for the completed columns"


ROUTES = {"rsvd": dict(k=12, method="rsvd"), "lanczos": dict(k=12, method="lanczos"),
          "gram": dict(k=12, method="gram"), "sketch": dict(k=12, method="sketch"),
          "full": dict(), "full-smallest": dict(k=4, which="SM")}


@pytest.mark.parametrize("wide", [False, True], ids=["tall", "wide"])
@pytest.mark.parametrize("budget", list(BUDGETS))
@pytest.mark.parametrize("route", list(ROUTES))
@pytest.mark.parametrize("name", ["zero", "rank-one", "repeated"])
def test_long_factor_is_orthonormal_at_zero_singular_values(name, route, budget, wide):
    a = _matrix(name)
    a = a.T.copy() if wide else a
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no ConvergenceWarning: the answer is exact
        res = bl.svd(a, seed=3, memory=BUDGETS[budget], scheduler="sync", **ROUTES[route])
    assert res.report["in_core"] == (budget == "in-memory")
    check(a, res, which=ROUTES[route].get("which", "LM"))


@pytest.mark.parametrize("scheduler", ["threads", "processes"])
@pytest.mark.parametrize("route", ["rsvd", "full"])
def test_completion_is_the_same_on_every_scheduler(route, scheduler):
    a = _matrix("repeated")
    ref = bl.svd(a, seed=3, memory=BUDGETS["streamed"], scheduler="sync", **ROUTES[route])
    res = bl.svd(a, seed=3, memory=BUDGETS["streamed"], scheduler=scheduler, **ROUTES[route])
    assert res.report["scheduler"] == scheduler and not res.report["in_core"]
    check(a, res)
    np.testing.assert_array_equal(_dense(res.U), _dense(ref.U))  # the completion's numbers come from the seed
    np.testing.assert_array_equal(res.s, ref.s)


def test_float32():
    a = _matrix("rank-one", np.float32)
    for memory in BUDGETS.values():
        res = bl.svd(a, 8, method="lanczos", seed=0, memory=memory)
        assert res.U.dtype == np.float32
        check(a, res)


def test_numpy_full_svd_of_zeros():
    """``numpy.linalg.svd(np.zeros((m, n)), full_matrices=False)``: zeros and orthonormal factors."""
    for shape in [(50, 7), (7, 50), (9, 9)]:
        a = np.zeros(shape)
        res = bl.svd(a)  # no seed: a fresh draw for the completion on every run
        assert np.all(res.s == 0) and res.s.shape == (min(shape),)
        assert_orthonormal(_dense(res.U))
        assert_orthonormal(_dense(res.Vt).T)


@pytest.mark.parametrize("seed", [7, 52, 154])
def test_square_completion_of_an_ill_conditioned_draw(seed):
    """The whole space completed (9 x 9 zeros): with a square draw ``G`` these seeds' ``G`` had condition
    numbers 4.7e4, 1.3e5 and 2.0e4, and ``U^T U`` was off by up to 1e-11 (955 times the bound); the
    oversampled draw keeps the completion orthonormal to Householder's bound."""
    res = bl.svd(np.zeros((9, 9)), seed=seed)
    assert np.all(res.s == 0)
    assert_orthonormal(_dense(res.U))
    assert_orthonormal(_dense(res.Vt).T)


def test_square_singular_full_space():
    """A singular square matrix: the completion fills exactly the left null space (``r + z = n``)."""
    rng = np.random.default_rng(1)
    x = rng.standard_normal((40, 37))
    a = np.hstack([x, x[:, :3]])  # 40 x 40, rank 37
    check(a, bl.svd(a, memory=BUDGETS["in-memory"]))


def test_linear_operator_route():
    """``svd`` of a SciPy ``LinearOperator`` (blocks in memory): the zero operator's factors."""
    from scipy.sparse.linalg import aslinearoperator

    a = np.zeros((300, 20))
    for method in ("rsvd", "lanczos", "sketch"):
        res = bl.svd(aslinearoperator(a), 5, method=method, seed=0)
        assert np.all(res.s == 0)
        assert_orthonormal(_dense(res.U))
        assert_orthonormal(_dense(res.Vt).T)


def test_pca_of_a_wide_constant_matrix():
    """A wide matrix's components are its long factor: orthonormal where the variance is zero."""
    a = np.full((30, 400), 2.5)
    for memory in BUDGETS.values():
        p = bl.pca(a, 4, seed=0, memory=memory)
        assert np.all(p.singular_values_ == 0)
        assert_orthonormal(p.components_.T)


def test_named_minimum_covers_the_completion():
    """The budget a refusal names plans the completion's passes too: a retry there runs."""
    a = _matrix("zero")
    for kw in (dict(k=12, method="rsvd"), dict()):
        with pytest.raises(BudgetError) as err:
            bl.svd(a, seed=0, memory="64KiB", **kw)
        res = bl.svd(a, seed=0, memory=err.value.minimum, **kw)
        check(a, res)


@pytest.mark.gpu
def test_on_the_gpu():
    """In memory on a GPU the blocks stay on the device: the completion is made from their host copy."""
    a = _matrix("repeated")
    res = bl.svd(a, 12, method="rsvd", seed=3, memory=BUDGETS["in-memory"], device="gpu")
    assert res.report["device"] == "gpu"
    check(a, res)


def _rank_deficient(m: int, n: int, zeros: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    r = min(m, n) - zeros
    return rng.standard_normal((m, r)) @ rng.standard_normal((r, n))


@pytest.mark.parametrize("route", ["full", "lanczos", "rsvd", "gram", "sketch"])
@pytest.mark.parametrize("m, n, zeros", [(60, 60, 3), (60, 60, 20), (66, 60, 10), (60, 66, 5)])
def test_square_and_near_square_zeros(m, n, zeros, route):
    """``Q`` spans (nearly) every direction of a square or nearly square ``A``: a completion orthogonal to
    it has no room (it gave columns of norm 2 to 10, found by a randomized search). Those zeros' columns
    are the method's own (``complete.keep_spanned``). In memory: a budget below such an ``A`` cannot
    hold the methods' ``N x N`` work either."""
    a = _rank_deficient(m, n, zeros)
    kw = {} if route == "full" else dict(k=min(m, n) - 1, method=route)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        res = bl.svd(a, seed=1, memory=BUDGETS["in-memory"], scheduler="sync", **kw)
    check(a, res)


@pytest.mark.parametrize("method", ["full", "rsvd"])
def test_centered_square_data(method):
    """Centering a square ``A`` makes a zero singular value (the means' direction) while ``Q`` spans
    every other: the case that made the completion fail most often."""
    a = np.random.default_rng(4).standard_normal((50, 50))
    kw = {} if method == "full" else dict(k=50, method=method)
    res = bl.svd(a, seed=0, center=True, memory=BUDGETS["in-memory"], **kw)
    check(a - a.mean(axis=0), res)


@pytest.mark.parametrize("budget", ["6MiB", "64MiB"])
@pytest.mark.parametrize("route", ["full", "sketch"])
def test_graded_spectrum_below_the_rounding_level(route, budget):
    """``s_i = e^{-i/3}`` down to ``8e-17``: the whole space's rank-revealing QR keeps columns of ``Y W S^+``
    with condition up to ``1 / (eps sqrt(M))``, orthonormal to 1e-2 before their CholeskyQR steps
    (``orth._rank_deficient``); the sketch's core solved over ``Q``'s zero columns too put weight on them
    (columns of norm 0.6). Both factors orthonormal; ``B^T u = s v`` for the whole space (its residuals
    say so), streamed and in memory."""
    rng = np.random.default_rng(0)
    m, n = 12000, 112
    q1, _ = np.linalg.qr(rng.standard_normal((m, n)))
    q2, _ = np.linalg.qr(rng.standard_normal((n, n)))
    a = (q1 * np.exp(-np.arange(n) / 3.0)) @ q2.T
    kw = {} if route == "full" else dict(k=100, method="sketch")
    res = bl.svd(a, seed=0, memory=budget, scheduler="sync", **kw)
    assert res.report["in_core"] == (budget == "64MiB")
    u, s, vt = _dense(res.U), np.asarray(res.s), _dense(res.Vt)
    assert (s == 0).any()  # values at the rounding level are zeros: their columns completed
    assert_orthonormal(u)
    assert_orthonormal(vt.T)
    if route == "full":  # backward stable: every triplet's residual at eps ||A||, the reported ones too
        resid = np.linalg.norm(a.T @ u - vt.T * s, axis=0)
        assert resid.max() <= 4 * m * eps(np.float64) * s[0]
        assert max(res.report["residuals"]) <= 4 * m * eps(np.float64) * s[0]


@pytest.mark.parametrize("memory", ["571KiB", "700KiB"])
def test_centered_wide_streamed_whole_space(memory):
    """The zero that centering makes in a wide ``A``, streamed: at 571 KiB ``chol(Y^T Y)`` went through by
    rounding, and CholeskyQR's ``Q`` (condition of ``Y`` about ``1/eps``) was orthonormal to ``4e-3`` only:
    a row of ``Vt`` of norm 0.992, ``||X_c v|| = 2`` (found by a randomized search). A ``Y`` beyond
    ``orth.CHOLQR_MAX_CONDITION`` takes the rank-revealing TSQR."""
    rng = np.random.default_rng(0)
    m, n = 41, 460
    x = rng.standard_normal((m, n)) * rng.uniform(0.5, 3, n) + rng.standard_normal(n)
    res = bl.svd(x, seed=0, center=True, memory=memory)
    assert not res.report["in_core"]
    check(x - x.mean(axis=0), res)
