"""scikit-learn's ``sklearn/decomposition/tests/test_pca.py`` ported to ``blocklin.pca``.

Each test names the scikit-learn test it ports. Its ``svd_solver`` axis maps to blocklin's methods
(``full`` -> ``full``, ``covariance_eigh`` -> ``gram`` (the covariance's eigenvectors), ``arpack`` ->
``lanczos``, ``randomized`` -> ``rsvd``, ``auto`` -> ``auto``), so each solver case runs the blocklin
route of the same kind; ``random_state`` is ``seed``. ``PCA(...).fit(X)`` is ``bl.pca(X, ...)`` and
``fit_transform(X)`` is ``transform(X)`` of the fitted result. The peer's tolerances that state an
accuracy of the model (``rtol=5e-3`` of a variance against the covariance's eigenvalues, the score's
5 % of the entropy) are kept; exact identities (``cov @ precision = I``, singular values against
scores) use the error bounds of tests/support/tolerances.py. Cases with enough rows to stream run
also at the least budget the planner accepts (``memory="least"``).

Not applicable (not ported):

===========================================================  ===========================================
scikit-learn test                                            why
===========================================================  ===========================================
test_pca_sparse, test_pca_sparse_fit_transform,              sparse input (issue 29)
test_sparse_pca_solver_error,
test_sparse_pca_auto_arpack_singular_values_consistency
test_no_empty_slice_warning                                  NumPy warning of sklearn's own code path
test_whitening ``copy`` axis                                 ``copy=``: blocklin never modifies its input
test_pca_validation ("arpack", 2) row                        ARPACK's ``k < min(m, n)`` rule: the
                                                             solver's own limit (the ``n_components=0``
                                                             rows and ``3 > 2`` are ported)
test_n_components_mle_error                                  'mle' refused by arpack/randomized: a
                                                             solver choice (blocklin computes it)
test_pca_svd_solver_auto                                     sklearn's solver-choice table
test_assess_dimension_bad_rank, test_small_eigenvalues_mle,  sklearn-internal ``_assess_dimension``
test_assess_dimension_rank_one, test_infer_dim_1/2           and ``_infer_dimension`` helpers
test_pca_randomized_svd_n_oversamples                        ``n_oversamples``' default rule of sklearn
test_feature_names_out, test_pca_n_features_deprecation      estimator API (feature names)
test_pca_array_api_compliance, test_pca_mle_array_api_...,   array-API namespace machinery
test_array_api_error_and_warnings_on_unsupported_params
test_variance_correctness ``copy`` axis                      ``copy=`` (the variance check is ported)
===========================================================  ===========================================
"""

from __future__ import annotations

import numpy as np
import pytest
from sklearn import datasets
from sklearn.decomposition import PCA

import blocklin as bl
from blocklin.errors import BlocklinError
from support.conformance import dense, run
from support.tolerances import assert_close_to, assert_explained_variance, assert_singular_values, eps

iris = datasets.load_iris()
SOLVERS = {"full": "full", "covariance_eigh": "gram", "arpack": "lanczos", "randomized": "rsvd", "auto": "auto"}
PCA_SOLVERS = list(SOLVERS)


def _pca(x, n_components=None, solver="auto", **kw):
    return bl.pca(x, n_components, method=SOLVERS[solver], **kw)


@pytest.mark.parametrize("svd_solver", PCA_SOLVERS)
@pytest.mark.parametrize("n_components", range(1, iris.data.shape[1]))
def test_pca(svd_solver, n_components):
    """test_pca: shape of the transform, ``get_covariance() @ get_precision() = I``."""
    x = iris.data
    p = _pca(x, n_components, svd_solver, seed=0)
    xr = dense(p.transform(x))
    assert xr.shape[1] == n_components
    cov, prec = p.get_covariance(), p.get_precision()
    # an inverse to cond(cov) eps (Higham Thm 14.x): the peer's atol 1e-12 holds for iris' cond ~ 1e2
    assert_close_to(cov @ prec, np.eye(4), bound=16 * 4 * eps(np.float64) * np.linalg.cond(cov), what="cov @ prec")


@pytest.mark.parametrize("svd_solver", PCA_SOLVERS)
def test_whitening(svd_solver):
    """test_whitening (``iterated_power=7``): unit variance and zero mean of whitened scores."""
    rng = np.random.RandomState(0)
    x = np.dot(rng.randn(100, 50), np.dot(np.diag(np.linspace(10.0, 1.0, 50)), rng.randn(50, 80)))
    x[:, :50] *= 3
    assert x.std(axis=0).std() > 43.8
    kw = {"n_iter": 7} if svd_solver == "randomized" else {}
    p = _pca(x, 30, svd_solver, whiten=True, seed=0, **kw)
    w = dense(p.transform(x))
    assert w.shape == (100, 30)
    np.testing.assert_allclose(w.std(ddof=1, axis=0), np.ones(30))
    np.testing.assert_allclose(w.mean(axis=0), np.zeros(30), atol=1e-12)
    u = dense(_pca(x, 30, svd_solver, seed=0).transform(x))
    assert u.std(axis=0).std() == pytest.approx(74.1, rel=1e-1)


@pytest.mark.parametrize("x", [np.random.RandomState(0).randn(100, 80),
                               datasets.make_classification(100, 80, n_informative=78, random_state=0)[0],
                               np.random.RandomState(0).randn(10, 100)],
                         ids=["random-tall", "correlated-tall", "random-wide"])
@pytest.mark.parametrize("svd_solver", PCA_SOLVERS)
def test_pca_explained_variance_empirical(x, svd_solver):
    """test_pca_explained_variance_empirical: the variances of the scores, and the covariance's eigenvalues."""
    p = _pca(x, 2, svd_solver, seed=0)
    xp = dense(p.transform(x))
    np.testing.assert_allclose(p.explained_variance_, np.var(xp, ddof=1, axis=0))
    expected = sorted(np.linalg.eig(np.cov(x, rowvar=False))[0].real, reverse=True)[:2]
    np.testing.assert_allclose(p.explained_variance_, expected, rtol=5e-3)


@pytest.mark.parametrize("svd_solver", ["arpack", "randomized"])
def test_pca_singular_values_consistency(svd_solver):
    """test_pca_singular_values_consistency (the peer's rtol 5e-3 between solvers)."""
    x = np.random.RandomState(0).randn(100, 80)
    full = _pca(x, 2, "full", seed=0)
    other = _pca(x, 2, svd_solver, seed=0)
    np.testing.assert_allclose(full.singular_values_, other.singular_values_, rtol=5e-3)


@pytest.mark.parametrize("memory", [None, "least"])
@pytest.mark.parametrize("svd_solver", PCA_SOLVERS)
def test_pca_singular_values(svd_solver, memory):
    """test_pca_singular_values: against the scores' norms, and set singular values recovered."""
    rng = np.random.RandomState(0)
    x = rng.randn(100, 80)
    p = run(lambda mem: _pca(x, 2, svd_solver, seed=0, memory=mem), memory)
    xt = dense(p.transform(x))
    assert_singular_values(p.singular_values_, np.sqrt(np.sum(xt ** 2, axis=0)), n=100, s1=np.linalg.norm(x, 2))
    x = rng.randn(100, 110)
    xt = dense(_pca(x, 3, svd_solver, seed=0).transform(x)).copy()
    comps = _pca(x, 3, svd_solver, seed=0).components_
    xt /= np.sqrt(np.sum(xt ** 2, axis=0))
    xt[:, 0] *= 3.142
    xt[:, 1] *= 2.718
    x_hat = np.dot(xt, comps)
    p = run(lambda mem: _pca(x_hat, 3, svd_solver, seed=0, memory=mem), memory)
    # the peer's rtol 1e-7: the randomized and Lanczos routes stop at their tolerance, not at rounding
    np.testing.assert_allclose(p.singular_values_, [3.142, 2.718, 1.0], rtol=1e-7)


@pytest.mark.parametrize("svd_solver", PCA_SOLVERS)
def test_pca_check_projection(svd_solver):
    """test_pca_check_projection (the peer's rtol 5e-3: a statement about the data's direction)."""
    rng = np.random.RandomState(0)
    x = rng.randn(100, 3) * 0.1
    x[:10] += np.array([3, 4, 5])
    xt = 0.1 * rng.randn(1, 3) + np.array([3, 4, 5])
    yt = dense(_pca(x, 2, svd_solver, seed=0).transform(xt))
    yt = yt / np.sqrt((yt ** 2).sum())
    np.testing.assert_allclose(np.abs(yt[0][0]), 1.0, rtol=5e-3)


@pytest.mark.parametrize("svd_solver", PCA_SOLVERS)
def test_pca_check_projection_list(svd_solver):
    """test_pca_check_projection_list: a 2 x 2 list input."""
    x = [[1.0, 0.0], [0.0, 1.0]]
    xt = dense(_pca(np.array(x), 1, svd_solver, seed=0).transform(np.array(x)))
    assert xt.shape == (2, 1)
    np.testing.assert_allclose(xt.mean(), 0.0, atol=1e-12)
    np.testing.assert_allclose(xt.std(), 0.71, rtol=5e-3)


@pytest.mark.parametrize("svd_solver", ["full", "arpack", "randomized"])
@pytest.mark.parametrize("whiten", [False, True])
def test_pca_inverse(svd_solver, whiten):
    """test_pca_inverse: ``inverse_transform(transform(X)) = X`` for data of rank ~2 (the peer's
    rtol 5e-6 is the dropped component's size relative to the mean 5, 4, 3)."""
    rng = np.random.RandomState(0)
    x = rng.randn(50, 3)
    x[:, 1] *= 0.00001
    x += [5, 4, 3]
    p = _pca(x, 2, svd_solver, whiten=whiten, seed=0)
    np.testing.assert_allclose(x, dense(p.inverse_transform(dense(p.transform(x)))), rtol=5e-6)


@pytest.mark.parametrize("data", [np.array([[0, 1, 0], [1, 0, 0]]), np.array([[0, 1, 0], [1, 0, 0]]).T],
                         ids=["2x3", "3x2"])
@pytest.mark.parametrize(("svd_solver", "n_components"), [("arpack", 0), ("randomized", 0), ("auto", 3)])
def test_pca_validation(data, svd_solver, n_components):
    """test_pca_validation's ``n_components=0`` rows (arpack, randomized: the iterative methods compute a
    triplet at least) and ``3 > min(n_samples, n_features) = 2``: refused, naming it."""
    with pytest.raises((BlocklinError, ValueError), match="n_components"):
        _pca(data, n_components, svd_solver)


@pytest.mark.parametrize("data", [iris.data, iris.data.T], ids=["iris", "iris.T"])
@pytest.mark.parametrize("solver", ["full", "randomized"])
def test_n_components_none(data, solver):
    """test_n_components_none (full, randomized: every component; ARPACK's ``min - 1`` is its own limit)."""
    assert _pca(data, None, solver, seed=0).n_components_ == min(iris.data.shape)


@pytest.mark.parametrize("svd_solver", ["auto", "full"])
def test_n_components_mle(svd_solver):
    """test_n_components_mle: Minka's choice on 600 x 10 noise is 1."""
    x = np.random.RandomState(0).randn(600, 10)
    assert _pca(x, "mle", svd_solver).n_components_ == 1


def test_pca_dim():
    """test_pca_dim: 'mle' finds one direction."""
    rng = np.random.RandomState(0)
    x = rng.randn(100, 5) * 0.1
    x[:10] += np.array([3, 4, 5, 1, 2])
    assert bl.pca(x, "mle", method="full").n_components_ == 1


def test_infer_dim_3():
    """test_infer_dim_3 (through ``n_components="mle"``, the public face of ``_infer_dimension``)."""
    rng = np.random.RandomState(0)
    x = rng.randn(100, 5) * 0.1
    x[:10] += np.array([3, 4, 5, 1, 2])
    x[10:20] += np.array([6, 0, 7, 2, -1])
    x[30:40] += 2 * np.array([-1, 1, -1, 1, -1])
    assert bl.pca(x, "mle").n_components_ > 2


@pytest.mark.parametrize("x,n_components,validated", [(iris.data, 0.95, 2), (iris.data, 0.01, 1),
                                                      (np.random.RandomState(0).rand(5, 20), 0.5, 2)],
                         ids=["iris-0.95", "iris-0.01", "wide-0.5"])
def test_infer_dim_by_explained_variance(x, n_components, validated):
    """test_infer_dim_by_explained_variance: a fraction of the variance."""
    assert bl.pca(x, n_components, method="full").n_components_ == validated


@pytest.mark.parametrize("memory", [None, "least"])
@pytest.mark.parametrize("svd_solver", PCA_SOLVERS)
def test_pca_score(svd_solver, memory):
    """test_pca_score: the average log-likelihood near the entropy (the peer's 5 %), and ordered."""
    rng = np.random.RandomState(0)
    x = rng.randn(1000, 3) * 0.1 + np.array([3, 4, 5])
    p = run(lambda mem: _pca(x, 2, svd_solver, seed=0, memory=mem), memory)
    ll1 = p.score(x)
    h = -0.5 * np.log(2 * np.pi * np.exp(1) * 0.1 ** 2) * 3
    np.testing.assert_allclose(ll1 / h, 1, rtol=5e-2)
    assert ll1 > p.score(rng.randn(1000, 3) * 0.2 + np.array([3, 4, 5]))
    assert ll1 > _pca(x, 2, svd_solver, whiten=True, seed=0).score(x)
    ref = PCA(2, svd_solver="full").fit(x)
    assert abs(ll1 - ref.score(x)) <= 1e-8 * abs(ref.score(x))


def test_pca_score3():
    """test_pca_score3: the held-out score picks one component (n_components 0, 1, 2)."""
    rng = np.random.RandomState(0)
    xl = rng.randn(200, 3) + rng.randn(200, 1) * np.array([3, 4, 5]) + np.array([1, 0, 7])
    xt = rng.randn(200, 3) + rng.randn(200, 1) * np.array([3, 4, 5]) + np.array([1, 0, 7])
    ll = [bl.pca(xl, k, method="full").score(xt) for k in range(3)]
    assert int(np.argmax(ll)) == 1


@pytest.mark.parametrize("svd_solver", PCA_SOLVERS)
def test_pca_sanity_noise_variance(svd_solver):
    """test_pca_sanity_noise_variance: digits, 30 components: every kept variance >= the noise variance."""
    x, _ = datasets.load_digits(return_X_y=True)
    p = _pca(x, 30, svd_solver, seed=0)
    assert np.all((p.explained_variance_ - p.noise_variance_) >= 0)


@pytest.mark.parametrize("svd_solver", ["arpack", "randomized"])
def test_pca_score_consistency_solvers(svd_solver):
    """test_pca_score_consistency_solvers (the peer's rtol 5e-6 between solvers, digits, 30 components)."""
    x, _ = datasets.load_digits(return_X_y=True)
    full = _pca(x, 30, "full", seed=0)
    other = _pca(x, 30, svd_solver, seed=0)
    np.testing.assert_allclose(full.score(x), other.score(x), rtol=5e-6)


@pytest.mark.parametrize("svd_solver", ["full", "randomized"])
def test_pca_zero_noise_variance_edge_cases(svd_solver):
    """test_pca_zero_noise_variance_edge_cases: ``n_components = min(m, n)``: noise variance 0, score defined.

    ``x`` (100 x 3, rank 3) is a proper model: its score is finite. ``x.T`` (3 samples) centers to rank 2:
    its third variance is 0 in exact arithmetic, the covariance singular, and the score of that model
    is whatever the rounding of that zero makes it (scikit-learn's own: finite through ``full`` and
    ``covariance_eigh``, ``-inf`` through ``randomized``, flipping with the BLAS thread count). As
    scikit-learn's test, this checks that it is computed (no error, not NaN), not its value.
    """
    rng = np.random.RandomState(0)
    x = rng.randn(100, 3) * 0.1 + np.array([3, 4, 5])
    p = _pca(x, 3, svd_solver, seed=0)
    assert p.noise_variance_ == 0
    assert np.isfinite(p.score(x))
    p = _pca(x.T, 3, svd_solver, seed=0)
    assert p.noise_variance_ == 0
    assert not np.isnan(p.score(x.T))


@pytest.mark.parametrize("svd_solver", [s if s == "auto" else pytest.param(s, marks=pytest.mark.slow)
                                        for s in PCA_SOLVERS])  # 20 fits each: 2 s
def test_pca_deterministic_output(svd_solver):
    """test_pca_deterministic_output: 20 fits from one generator give the same scores."""
    rng = np.random.RandomState(0)
    x = rng.rand(10, 10)
    rows = np.array([dense(_pca(x, 2, svd_solver, seed=rng).transform(x))[0] for _ in range(20)])
    np.testing.assert_allclose(rows, np.tile(rows[0], (20, 1)))


@pytest.mark.parametrize("svd_solver", PCA_SOLVERS)
def test_pca_dtype_preservation(svd_solver):
    """test_pca_dtype_preservation (seed 42): float32 stays float32, integers become float64."""
    x = np.random.RandomState(42).rand(1000, 4)
    p64 = _pca(x, 3, svd_solver, seed=42)
    p32 = _pca(x.astype(np.float32), 3, svd_solver, seed=42)
    assert p64.components_.dtype == np.float64 and p32.components_.dtype == np.float32
    assert dense(p64.transform(x)).dtype == np.float64
    assert dense(p32.transform(x.astype(np.float32))).dtype == np.float32
    np.testing.assert_allclose(p64.components_, p32.components_, rtol=1e-3, atol=1e-3)
    xi = np.random.RandomState(0).randint(0, 1000, (1000, 4))
    q64, q32 = _pca(xi, 3, svd_solver, seed=0), _pca(xi.astype(np.int32), 3, svd_solver, seed=0)
    assert q64.components_.dtype == q32.components_.dtype == np.float64
    assert dense(q64.transform(xi)).dtype == dense(q32.transform(xi.astype(np.int32))).dtype == np.float64
    np.testing.assert_allclose(q64.components_, q32.components_, rtol=1e-4)


def test_pca_n_components_mostly_explained_variance_ratio():
    """test_pca_n_components_mostly_explained_variance_ratio: the second-to-last cumulative ratio keeps every feature."""
    x = iris.data
    n = bl.pca(x).explained_variance_ratio_.cumsum()[-2]
    assert bl.pca(x, n).n_components_ == x.shape[1]


def test_mle_redundant_data():
    """test_mle_redundant_data: one informative feature repeated: 'mle' gives 1."""
    x, _ = datasets.make_classification(n_features=20, n_informative=1, n_repeated=18, n_redundant=1,
                                        n_clusters_per_class=1, random_state=42)
    assert bl.pca(x, "mle").n_components_ == 1


def test_fit_mle_too_few_samples():
    """test_fit_mle_too_few_samples: 'mle' with fewer samples than features is refused."""
    x, _ = datasets.make_classification(n_samples=20, n_features=21, random_state=42)
    with pytest.raises((BlocklinError, ValueError), match="mle"):
        bl.pca(x, "mle", method="full")


def test_mle_simple_case():
    """test_mle_simple_case: a column the mean of the others: 'mle' gives n - 1."""
    x = np.random.RandomState(0).randn(1000, 10)
    x[:, -1] = np.mean(x[:, :-1], axis=-1)
    assert bl.pca(x, "mle", method="full").n_components_ == 9


@pytest.mark.parametrize("memory", [None, "least"])
def test_variance_correctness(memory):
    """test_variance_correctness: ``explained_variance_ / explained_variance_ratio_`` is the total
    variance (every component; the peer's rtol 1e-7, a ratio of two sums of 1000 x 200 squares)."""
    x = np.random.RandomState(0).randn(1000, 200)
    p = run(lambda mem: bl.pca(x, memory=mem), memory)
    np.testing.assert_allclose(p.explained_variance_ / p.explained_variance_ratio_, np.var(x, ddof=1, axis=0).sum())
    ref = PCA().fit(x)
    assert_explained_variance(p.explained_variance_, ref.explained_variance_, p.explained_variance_ratio_,
                              ref.explained_variance_ratio_, x)
