"""scikit-learn's ``sklearn/linear_model/tests/test_ridge.py`` ported to ``blocklin.solve``.

Each test names the scikit-learn test it ports. ``Ridge(alpha, fit_intercept=).fit(X, y,
sample_weight=w)`` is ``bl.solve(X, y, lam=sqrt(alpha), fit_intercept=, sample_weight=w)`` (``coef_``
is ``x`` transposed, ``intercept_`` is ``x.intercept``), ``positive=True`` likewise, and
``ridge_regression(..., return_intercept=)`` is the same call with ``fit_intercept=``.
``RidgeCV(alphas, alpha_per_target=, store_cv_results=)`` (its default ``cv=None``, ``scoring=None``:
the exact leave-one-out) is ``bl.solve(X, y, lam=("loo", sqrt(alphas)), lam_per_target=,
store_cv_results=)`` with ``report["alpha_"]``, ``report["best_score_"]`` and ``x.cv_results_``; its
default ``alphas=(0.1, 1, 10)`` is passed as that grid. ``Ridge(alpha=array)`` (one alpha per target)
is a ``lam`` sequence, whose block ``l`` of ``x`` holds every target at ``lam[l]``: target ``l`` is
column ``l`` of block ``l``. The peers' ``solver=`` and ``gcv_mode=`` axes choose scikit-learn's
algorithm; blocklin picks its route, so each such case is ported once (the axis collapsed) and not
counted again per solver. ``global_random_seed`` is scikit-learn's default, 42.

Conventions mapped (blocklin's, by design): a 1-D ``y`` is one column, so ``x`` is ``n x 1``,
``x.intercept`` has one value and ``cv_results_`` is ``m x 1 x L`` (scikit-learn: ``(m, L)``); a
scalar ``sample_weight`` is refused (a constant weight ``c`` is ``lam / sqrt(c)``) and an ``m x 1``
column accepted (a stored weight vector); ``cv_results_`` holds the squared leave-one-out errors,
``w_i e_i^2`` (scikit-learn's ``scoring=None`` content; with a ``scoring=`` scikit-learn keeps the
predictions there, blocklin the same squared errors, so test_ridge_cv_results_predictions compares the
errors of the same naive refits). ``RidgeCV(cv=cv, scoring=s)`` is ``bl.solve(..., lam=("loo", grid),
cv=cv, scoring=s)``.

Tolerances: every comparison of a solution is against scikit-learn's result (or NumPy's) computed in
the test, with the norm-wise bound of the regularized normal equations (:func:`coef_bound`: Higham
Thm 7.2 with ``cond(A_c^T W A_c + lam^2 I)`` on the row space, tests/support/ridge.py's analysis), the
intercept's (:func:`intercept_bound`) and the leave-one-out score's
(:func:`support.ridge.loo_score_bound`); float32 data are compared with the float64 solution of the
same (rounded) data, which blocklin's float64 sums reach before rounding ``x``. Statements about the
model (``ridge_regression``'s ``atol=1e-4`` from the true coefficients: the bias of ``alpha=1e-3``)
keep the peer's tolerance. Cases large enough to stream also run at the least budget the planner
accepts (``memory="least"``).

Not applicable (not ported):

==============================================================  ===========================================
scikit-learn test                                               why
==============================================================  ===========================================
test_ridge_regression*, test_ridge_regression_sample_weights,   the ``solver=`` axis (ported once per case,
test_solver_consistency, test_ridge_sample_weight_consistency,  above); the sparse containers (issue 29)
test_regularization_limits_ridge,
test_ridge_regression_check_arguments_validity, test_dtype_match,
test_ridge_regression_dtype_stability: ``solver`` / ``sparse``
test_ridge_gcv_vs_ridge_loo_cv, test_ridge_gcv_sample_weights,  ``gcv_mode=`` (svd / eigen: scikit-learn's
test_regularization_limits_ridge_gcv,                           algorithm; blocklin's route) and the sparse
test_ridge_cv_results_predictions,                              containers
test_ridge_cv_multioutput_sample_weight: ``gcv_mode`` / sparse
test_ridge_regression_convergence_fail, test_sparse_cg_max_iter, solver-only: iterative solvers' ``tol``,
test_n_iter, test_lbfgs_solver_consistency,                     ``max_iter``, ``n_iter_``, convergence
test_lbfgs_solver_error, test_ridge_positive_error_test,        warnings, which solver takes ``positive``
test_dense_sparse[_test_tolerance]                              or sparse data with an intercept
test_X_CenterStackOp, test_compute_gram, test_compute_covariance sparse input (issue 29), scikit-learn
test_ridge_fit_intercept_sparse, _sparse_error, _sparse_sag,    internals
test_sparse_design_with_sample_weights, the sparse halves of
test_dense_sparse
test_check_gcv_mode_choice                                      scikit-learn's GCV mode selection
test_dense_sparse[_test_ridge_classifiers],                     classifiers (RidgeClassifier,
test_regularization_limits_ridge_classifier_gcv,                RidgeClassifierCV)
test_ridge_classifier_with_scoring,
test_ridge_regression_custom_scoring, test_class_weights,
test_class_weight_vs_sample_weight, test_class_weights_cv,
test_ridge_classifier_cv_store_cv_results,
test_ridgeclassifier_multilabel, the RidgeClassifierCV rows of
test_ridge_gcv_cv_results_not_stored, test_ridge_best_score,
test_ridgecv_alphas_conversion, test_ridgecv_alphas_zero,
test_ridgecv_alphas_validation, test_ridgecv_alphas_scalar
test_ridge_array_api_compliance,                                array-API namespaces
test_ridge_classifier_multilabel_array_api,
test_ridge_per_target_alpha_array_api,
test_array_api_error_and_warnings_for_solver_parameter,
test_array_api_numpy_namespace_no_warning
test_metadata_routing_with_default_scoring,                     estimator API (metadata routing)
test_set_score_request_with_default_scoring
test_ridgecv_store_cv_results ``cv=3`` refusal,                 refused by blocklin as by scikit-learn
test_ridge_cv_individual_penalties ``cv=`` refusals             (tests/solve/test_ridge_kfold.py)
==============================================================  ===========================================
"""

from __future__ import annotations

import numpy as np
import pytest
from scipy import linalg
from scipy.optimize import nnls
from sklearn import datasets
from sklearn.datasets import make_low_rank_matrix, make_regression
from sklearn.linear_model import LinearRegression, Ridge, RidgeCV
from sklearn.metrics import mean_squared_error
from sklearn.model_selection import GroupKFold, LeaveOneOut, cross_val_predict
from sklearn.preprocessing import minmax_scale

import blocklin as bl
from blocklin.errors import BlocklinError
from support.conformance import dense, least_budget, run
from support.ridge import EPS64, centered, loo_score_bound

SEED = 42  # scikit-learn's global_random_seed (its default)
ALPHAS = (0.1, 1.0, 10.0)  # RidgeCV's default grid

_diabetes = datasets.load_diabetes()
_ind = np.arange(_diabetes.data.shape[0])
np.random.RandomState(0).shuffle(_ind)
X_DIABETES, Y_DIABETES = _diabetes.data[_ind[:200]], _diabetes.target[_ind[:200]]

MIN_NORM_OLS = pytest.mark.xfail(strict=True, reason="solve(lam=0) without an intercept refuses a rank-deficient A "
                                                     "(SingularMatrixError naming bl.lstsq, the minimum-norm solution "
                                                     "from the SVD; with fit_intercept the centered normal equations "
                                                     "give it)")
MIN_NORM_INTERCEPT = pytest.mark.xfail(strict=True, reason="solve(lam=0, fit_intercept=True) of a wide A: the "
                                                           "centered A (rank m - 1) is refused as rank-deficient; "
                                                           "the minimum norm of (x0, x) the peer asks for is not "
                                                           "scikit-learn's either (the peer xfails these)")
WIDE_POSITIVE = pytest.mark.xfail(strict=True, reason="positive=True needs a tall A (NNLS on the Cholesky factor "
                                                      "of the n x n Gram): wide A refused")


# --- bounds -----------------------------------------------------------------------------------------

def coef_bound(a, b, lam, coef_ref, *, w=None, fit_intercept=False, dtype=np.float64, const=16.0,
               ref_lam=None) -> float:
    """``||x - x_ref||_F`` for two solutions of ``min ||W^1/2 (A_c x - b_c)||^2 + lam^2 ||x||^2``.

    A backward-stable solve of the regularized normal equations (primal, or the dual form for wide A)
    is off by ``c N eps cond(K) ||x||`` (Higham Thm 7.2; tests/support/ridge.py), N the larger
    dimension, times the centering's growth ``1 + max(mu^2 / var)``; ``cond(K)`` is taken on the row
    space of ``A_c``, ``(s_1^2 + lam^2) / (s_r^2 + lam^2)`` with r its rank: the solution, the
    right-hand side ``A_c^T b_c`` and the dual's ``b_c`` lie there (a duplicated column or the
    centering's ``1`` direction carry no data). ``ref_lam``: the reference solves at another
    lambda (LinearRegression for ``alpha -> 0``), which moves ``x`` by at most
    ``|lam^2 - ref_lam^2| / (s_r^2 + lam^2) ||x||``. Plus one rounding to ``dtype``.
    """
    ac, _ = centered(a, b, w, fit_intercept)
    s = np.linalg.svd(ac, compute_uv=False)
    r = max(int(np.sum(s > s[0] * max(ac.shape) * EPS64)), 1) if s[0] > 0 else 1
    cond = (s[0] ** 2 + lam**2) / (s[r - 1] ** 2 + lam**2)
    a64 = np.asarray(a, np.float64)
    growth = 1.0
    if fit_intercept:
        growth += float(np.max(a64.mean(axis=0) ** 2 / np.maximum(a64.var(axis=0), np.finfo(float).tiny)))
    norm = float(np.linalg.norm(coef_ref))
    bound = const * max(a64.shape) * EPS64 * cond * growth * norm + 2 * float(np.finfo(dtype).eps) * norm
    # the right-hand side A^T W b is summed from the uncentered rows (the rank-one correction comes after):
    # off by gamma_m ||W^1/2 A||_F ||W^1/2 b||_F (Higham §3.5), moved by ||K^-1||_2 <= 1 / (s_r^2 + lam^2)
    sw = np.sqrt(np.ones(len(a64)) if w is None else np.asarray(w, np.float64))[:, None]
    rhs = float(np.linalg.norm(a64 * sw) * np.linalg.norm(np.asarray(b, np.float64).reshape(len(a64), -1) * sw))
    bound += const * a64.shape[0] * EPS64 * rhs / (s[r - 1] ** 2 + lam**2)
    if a64.shape[0] < a64.shape[1]:
        # the dual form's x = A^T (D y) is a GEMM in the data's dtype (y rounded to it first), with
        # ||D y|| <= sqrt(max w) ||W^1/2 b|| / (s_r^2 + lam^2): gamma_m |A|^T |D y| (Higham §3.5)
        wmax = 1.0 if w is None else float(np.max(w))
        bnorm = float(np.linalg.norm(np.asarray(b, np.float64).reshape(len(a64), -1) * sw))
        bound += const * a64.shape[0] * float(np.finfo(dtype).eps) * float(np.linalg.norm(a64)) * np.sqrt(wmax) \
            * bnorm / (s[r - 1] ** 2 + lam**2)
    if ref_lam is not None:
        bound += abs(lam**2 - ref_lam**2) / (s[r - 1] ** 2 + lam**2) * norm
    return bound


def intercept_bound(a, b, coef_ref, intercept_ref, xbound, *, w=None, dtype=np.float64) -> float:
    """``x0 = bbar - mu^T x``: ``|mu| ||x - x_ref||``, plus the weighted means' rounding (a sum of m
    terms, ``m eps mean |.|`` each, Higham §4.2, for two computations) and one rounding to ``dtype``."""
    a64, b64 = np.asarray(a, np.float64), np.asarray(b, np.float64).reshape(len(a), -1)
    wv = np.ones(len(a)) if w is None else np.asarray(w, np.float64)
    mu = wv @ a64 / wv.sum()
    m = a64.shape[0]
    sums = wv @ np.abs(b64) / wv.sum() + (wv @ np.abs(a64) / wv.sum()) @ np.abs(np.asarray(coef_ref).reshape(
        a64.shape[1], -1))
    return float(np.linalg.norm(mu) * xbound + 4 * m * EPS64 * np.max(sums)
                 + 2 * float(np.finfo(dtype).eps) * np.max(np.abs(intercept_ref)))


def check_solution(x, a, b, coef_ref, intercept_ref, lam, *, w=None, fit_intercept=False, dtype=np.float64,
                   ref_lam=None, const=16.0):
    """``x`` (n x k) and ``x.intercept`` against scikit-learn's ``coef_`` (k x n or n) and ``intercept_``."""
    coef = dense(x).T
    ref = np.asarray(coef_ref, np.float64).reshape(coef.shape)
    xb = coef_bound(a, b, lam, ref, w=w, fit_intercept=fit_intercept, dtype=dtype, ref_lam=ref_lam, const=const)
    err = float(np.linalg.norm(coef - ref))
    assert err <= xb, f"coef: error {err:.3e} exceeds the bound {xb:.3e}"
    if fit_intercept:
        iref = np.atleast_1d(np.asarray(intercept_ref, np.float64))
        ib = intercept_bound(a, b, ref, iref, xb, w=w, dtype=dtype)
        ierr = float(np.max(np.abs(x.intercept - iref)))
        assert ierr <= ib, f"intercept: error {ierr:.3e} exceeds the bound {ib:.3e}"
    else:
        assert getattr(x, "intercept", None) is None  # the stored-Gram route sets no attribute
    return xb


def _lam(alpha):
    return float(np.sqrt(alpha))


def _grid(alphas):
    return ("loo", np.sqrt(np.asarray(alphas, dtype=float)))


# --- data generators (the peer's) -------------------------------------------------------------------

def ols_ridge_dataset(kind, seed=SEED):
    """The peer's ``ols_ridge_dataset`` fixture: X with a last column of ones, y, the minimum-norm OLS and
    the alpha=1 ridge solutions (the intercept column unpenalized)."""
    n_samples, n_features = (12, 4) if kind == "long" else (4, 12)
    k = min(n_samples, n_features)
    rng = np.random.RandomState(seed)
    X = make_low_rank_matrix(n_samples=n_samples, n_features=n_features, effective_rank=k, random_state=rng)
    X[:, -1] = 1
    U, s, Vt = linalg.svd(X)
    assert np.all(s > 1e-3)
    U1, U2 = U[:, :k], U[:, k:]
    Vt1 = Vt[:k, :]
    if kind == "long":
        coef_ols = rng.uniform(low=-10, high=10, size=n_features)
        y = X @ coef_ols
        y += U2 @ rng.normal(size=n_samples - n_features) ** 2
    else:
        y = rng.uniform(low=-10, high=10, size=n_samples)
        coef_ols = Vt1.T @ np.diag(1 / s) @ U1.T @ y
    d = np.identity(n_features)
    d[-1, -1] = 0
    coef_ridge = linalg.solve(X.T @ X + d, X.T @ y)
    assert np.linalg.norm(y - X @ coef_ols) < np.linalg.norm(y - X @ coef_ridge)
    return X, y, coef_ols, coef_ridge


def make_sparse_offset_regression(n_samples=100, n_features=100, proportion_nonzero=0.5, n_informative=10,
                                  n_targets=1, bias=13.0, X_offset=30.0, noise=30.0, shuffle=True, coef=False,
                                  positive=False, random_state=None):
    """The peer's ``_make_sparse_offset_regression`` (dense arrays with zeroed entries)."""
    X, y, c = make_regression(n_samples=n_samples, n_features=n_features, n_informative=n_informative,
                              n_targets=n_targets, bias=bias, noise=noise, shuffle=shuffle, coef=True,
                              random_state=random_state)
    if n_features == 1:
        c = np.asarray([c])
    X += X_offset
    mask = np.random.RandomState(random_state).binomial(1, proportion_nonzero, X.shape) > 0
    removed_X = X.copy()
    X[~mask] = 0.0
    removed_X[mask] = 0.0
    y -= removed_X.dot(c)
    if positive:
        y += X.dot(np.abs(c) + 1 - c)
        c = np.abs(c) + 1
    if n_features == 1:
        c = c[0]
    if coef:
        return X, y, c
    return X, y


def _r2(a, b, coef, intercept):
    res = b - a @ coef - intercept
    return 1 - np.sum(res**2) / np.sum((b - b.mean()) ** 2)


def _r2_bound(a, b, coef, intercept, xb, ib):
    """``|R2 - R2_ref|`` from the solution's errors: ``(||r|| + ||r_ref||) ||dr|| / ||b - bbar||^2`` with
    ``||dr|| <= ||A||_2 ||dx|| + sqrt(m) |dx0|``, plus the sums' rounding (m eps relative)."""
    r = np.linalg.norm(b - a @ coef - intercept)
    dr = np.linalg.norm(a, 2) * xb + np.sqrt(len(b)) * ib
    tot = np.sum((b - b.mean()) ** 2)
    return (2 * r + dr) * dr / tot + 4 * len(b) * EPS64 * (1 + r**2 / tot)


# --- Ridge on the constructed OLS / ridge data set ----------------------------------------------------

@pytest.mark.parametrize("kind", ["long", "wide"])
@pytest.mark.parametrize("fit_intercept", [True, False])
def test_ridge_regression(fit_intercept, kind):
    """test_ridge_regression: the known solution, its R2, and the same with unit sample weights (the
    peer fits with ``fit_intercept=True`` in both branches, on centered data in the ``False`` one)."""
    X, y, _, coef = ols_ridge_dataset(kind)
    r2_ref = 1 - np.sum((y - X @ coef) ** 2) / np.sum((y - y.mean()) ** 2)
    X = X[:, :-1]
    if fit_intercept:
        intercept = coef[-1]
    else:
        X, y = X - X.mean(axis=0), y - y.mean()
        intercept = 0.0
    coef = coef[:-1]
    for w in (None, np.ones(X.shape[0])):
        x = bl.solve(X, y, lam=1.0, fit_intercept=True, sample_weight=w)
        xb = check_solution(x, X, y, coef, intercept, 1.0, fit_intercept=True, w=w)
        got = dense(x).ravel()
        ib = intercept_bound(X, y, coef, [intercept], xb)
        assert abs(_r2(X, y, got, x.intercept[0]) - r2_ref) <= _r2_bound(X, y, got, x.intercept[0], xb, ib)


def _intercept_or_centered(X, y, coef, fit_intercept):
    """scikit-learn's setup of the stacked cases: the dataset's intercept, or without one X and y centered."""
    if fit_intercept:
        return X, y, coef[-1]
    return X - X.mean(axis=0), y - y.mean(), 0.0


@pytest.mark.parametrize("kind", ["long", "wide"])
@pytest.mark.parametrize("fit_intercept", [True, False])
def test_ridge_regression_hstacked_X(fit_intercept, kind):
    """test_ridge_regression_hstacked_X: ``[X, X] / 2`` with alpha/2 is X with alpha (singular for long X)."""
    X, y, _, coef = ols_ridge_dataset(kind)
    n_samples, n_features = X.shape
    X = 0.5 * np.concatenate((X[:, :-1], X[:, :-1]), axis=1)
    assert np.linalg.matrix_rank(X) <= min(n_samples, n_features - 1)
    X, y, intercept = _intercept_or_centered(X, y, coef, fit_intercept)
    x = bl.solve(X, y, lam=_lam(0.5), fit_intercept=fit_intercept)
    check_solution(x, X, y, np.r_[coef[:-1], coef[:-1]], intercept, _lam(0.5), fit_intercept=fit_intercept)


@pytest.mark.parametrize("kind", ["long", "wide"])
@pytest.mark.parametrize("fit_intercept", [True, False])
def test_ridge_regression_vstacked_X(fit_intercept, kind):
    """test_ridge_regression_vstacked_X: ``[X; X]``, ``[y; y]`` with 2 alpha is X with alpha (singular for wide X)."""
    X, y, _, coef = ols_ridge_dataset(kind)
    n_samples, n_features = X.shape
    X = np.concatenate((X[:, :-1], X[:, :-1]), axis=0)
    assert np.linalg.matrix_rank(X) <= min(n_samples, n_features)
    y = np.r_[y, y]
    X, y, intercept = _intercept_or_centered(X, y, coef, fit_intercept)
    x = bl.solve(X, y, lam=_lam(2.0), fit_intercept=fit_intercept)
    check_solution(x, X, y, coef[:-1], intercept, _lam(2.0), fit_intercept=fit_intercept)


def _unpenalized(X, y, coef, fit_intercept, kind, stack):
    """The body of the three unpenalized tests: the minimum-norm OLS solution (the wide fit with an
    intercept: ``X w + x0 = y`` solved, then the minimum norm of ``(x0, w)`` the peer asks for)."""
    if fit_intercept:
        X, intercept, coef = X[:, :-1], coef[-1], coef[:-1]
    else:
        intercept = 0.0
    X, y, coef_ref = stack(X, y, coef)
    x = bl.solve(X, y, lam=0.0, fit_intercept=fit_intercept)
    got = dense(x).ravel()
    if kind == "long" or not fit_intercept:
        check_solution(x, X, y, coef_ref, intercept, 0.0, fit_intercept=fit_intercept)
        return
    x0 = x.intercept[0]
    # a solution of X w + x0 = y: its residual is a backward error (assert_residual's bound, order n + 1)
    res = np.linalg.norm(X @ got + x0 - y)
    assert res <= 4 * (X.shape[1] + 1) * EPS64 * np.linalg.norm(np.c_[X, np.ones(len(y))]) * np.linalg.norm(
        np.r_[x0, got])
    ref = np.r_[intercept, coef_ref]
    assert np.linalg.norm(np.r_[x0, got] - ref) <= 16 * X.shape[1] * EPS64 * np.linalg.cond(X) * np.linalg.norm(ref)


def _params_unpenalized(marks):
    return [pytest.param(fi, kind, marks=marks[(fi, kind)]) if (fi, kind) in marks else (fi, kind)
            for fi in (True, False) for kind in ("long", "wide")]


@pytest.mark.parametrize("fit_intercept,kind", _params_unpenalized({(True, "wide"): MIN_NORM_INTERCEPT}))
def test_ridge_regression_unpenalized(fit_intercept, kind):
    """test_ridge_regression_unpenalized: alpha=0 is OLS (the minimum-norm solution for wide X)."""
    X, y, coef, _ = ols_ridge_dataset(kind)
    _unpenalized(X, y, coef, fit_intercept, kind, lambda X, y, c: (X, y, c))


@pytest.mark.parametrize("fit_intercept,kind", _params_unpenalized({
    (False, "long"): MIN_NORM_OLS, (True, "wide"): MIN_NORM_INTERCEPT}))
def test_ridge_regression_unpenalized_hstacked_X(fit_intercept, kind):
    """test_ridge_regression_unpenalized_hstacked_X: OLS on ``[X, X] / 2`` is ``(w, w)`` (singular for long X)."""
    X, y, coef, _ = ols_ridge_dataset(kind)
    _unpenalized(X, y, coef, fit_intercept, kind, lambda X, y, c: (0.5 * np.concatenate((X, X), axis=1), y, np.r_[c, c]))


@pytest.mark.parametrize("fit_intercept,kind", _params_unpenalized({
    (False, "wide"): MIN_NORM_OLS, (True, "wide"): MIN_NORM_INTERCEPT}))
def test_ridge_regression_unpenalized_vstacked_X(fit_intercept, kind):
    """test_ridge_regression_unpenalized_vstacked_X: OLS on ``[X; X]``, ``[y; y]`` (singular for wide X)."""
    X, y, coef, _ = ols_ridge_dataset(kind)
    _unpenalized(X, y, coef, fit_intercept, kind, lambda X, y, c: (np.concatenate((X, X), axis=0), np.r_[y, y], c))


@pytest.mark.parametrize("alpha", [1.0, 1e-2])
@pytest.mark.parametrize("kind", ["long", "wide"])
@pytest.mark.parametrize("fit_intercept", [True, False])
def test_ridge_regression_sample_weights(fit_intercept, kind, alpha):
    """test_ridge_regression_sample_weights: ``[X; X]`` with weights ``alpha [s; 1 - s]`` and alpha is X with
    alpha=1 (the weights from ``RandomState(0)``: the peer draws them from its module's shared generator)."""
    X, y, _, coef = ols_ridge_dataset(kind)
    sw = np.random.RandomState(0).uniform(low=0, high=1, size=X.shape[0])
    X = np.concatenate((X[:, :-1], X[:, :-1]), axis=0)
    y = np.r_[y, y]
    sw = np.r_[sw, 1 - sw] * alpha
    if fit_intercept:
        intercept = coef[-1]
    else:
        X, y = X - X.mean(axis=0), y - y.mean()
        intercept = 0.0
    x = bl.solve(X, y, lam=_lam(alpha), fit_intercept=fit_intercept, sample_weight=sw)
    check_solution(x, X, y, coef[:-1], intercept, _lam(alpha), w=sw, fit_intercept=fit_intercept)


# --- small Ridge checks ---------------------------------------------------------------------------------

def test_primal_dual_relationship():
    """test_primal_dual_relationship: ``(X^T X + a I)^-1 X^T y = X^T (X X^T + a I)^-1 y`` (blocklin's tall
    route against its Cholesky solve of the kernel system)."""
    X, y = X_DIABETES, Y_DIABETES.reshape(-1, 1)
    coef = dense(bl.solve(X, y, lam=_lam(1e-2)))
    K = X @ X.T + 1e-2 * np.eye(len(X))
    dual = dense(bl.solve(K, y, assume_a="pos"))
    coef2 = X.T @ dual
    ref = np.linalg.solve(X.T @ X + 1e-2 * np.eye(X.shape[1]), X.T @ y)
    # each against the exact solution: the primal's bound, and the dual's (cond(K) = (s_1^2 + a) / a)
    # carried through X^T (plus the product's rounding)
    xb = coef_bound(X, y, _lam(1e-2), ref)
    s1 = np.linalg.norm(X, 2)
    db = 8 * len(X) * EPS64 * (s1**2 + 1e-2) / 1e-2 * np.linalg.norm(dual)
    pb = 2 * len(X) * EPS64 * np.linalg.norm(X) * np.linalg.norm(dual)
    assert np.linalg.norm(coef - ref) <= xb
    assert np.linalg.norm(coef2 - coef) <= 2 * xb + s1 * db + pb


def test_ridge_shapes_type():
    """test_ridge_shapes_type: ``x`` is ``n x k`` and ``intercept`` has k values (a 1-D y is one column)."""
    rng = np.random.RandomState(0)
    n_samples, n_features = 5, 10
    X = rng.randn(n_samples, n_features)
    y = rng.randn(n_samples)
    for target, k in ((y, 1), (y[:, np.newaxis], 1), (np.c_[y, 1 + y], 2)):
        x = bl.solve(X, target, lam=1.0, fit_intercept=True)
        assert x.shape == (n_features, k) and isinstance(x.intercept, np.ndarray) and x.intercept.shape == (k,)
        ref = Ridge().fit(X, target)
        check_solution(x, X, target, ref.coef_, ref.intercept_, 1.0, fit_intercept=True)


def test_ridge_intercept():
    """test_ridge_intercept: with targets ``[y, 1 + y]`` the intercepts are ``x0`` and ``x0 + 1``."""
    rng = np.random.RandomState(0)
    X = rng.randn(5, 10)
    y = rng.randn(5)
    one = bl.solve(X, y, lam=1.0, fit_intercept=True)
    two = bl.solve(X, np.c_[y, 1.0 + y], lam=1.0, fit_intercept=True)
    ref = Ridge().fit(X, y)
    xb = check_solution(one, X, y, ref.coef_, ref.intercept_, 1.0, fit_intercept=True)
    ib = intercept_bound(X, np.c_[y, 1 + y], ref.coef_, [ref.intercept_ + 1], xb)
    assert abs(two.intercept[0] - one.intercept[0]) <= 2 * ib
    assert abs(two.intercept[1] - (one.intercept[0] + 1.0)) <= 2 * ib


def test_ridge_vs_lstsq():
    """test_ridge_vs_lstsq: alpha=0 is LinearRegression (5 x 4, no intercept)."""
    rng = np.random.RandomState(0)
    y = rng.randn(5)
    X = rng.randn(5, 4)
    ols = LinearRegression(fit_intercept=False).fit(X, y)
    check_solution(bl.solve(X, y, lam=0.0), X, y, ols.coef_, 0.0, 0.0)


def test_ridge_individual_penalties():
    """test_ridge_individual_penalties: ``Ridge(alpha=[a_0, ..., a_4])`` on 5 targets is target l at a_l:
    a lam sequence, column l of block l (each block holds every target)."""
    rng = np.random.RandomState(42)
    n_samples, n_features, n_targets = 20, 10, 5
    X = rng.randn(n_samples, n_features)
    y = rng.randn(n_samples, n_targets)
    penalties = np.arange(n_targets)
    x = bl.solve(X, y, lam=np.sqrt(penalties), fit_intercept=True)
    got = dense(x)
    assert got.shape == (n_features, n_targets * n_targets)
    for j, (alpha, target) in enumerate(zip(penalties, y.T)):
        ref = Ridge(alpha=alpha, solver="cholesky").fit(X, target)
        coef = got[:, j * n_targets + j]
        xb = coef_bound(X, target, _lam(alpha), ref.coef_, fit_intercept=True)
        assert np.linalg.norm(coef - ref.coef_) <= xb
        ib = intercept_bound(X, target, ref.coef_, [ref.intercept_], xb)
        assert abs(x.intercept[j][j] - ref.intercept_) <= ib


@pytest.mark.parametrize("solver", ["ridge", "ridgecv"])
@pytest.mark.parametrize("n_samples,dtype,proportion_nonzero",
                         [(20, "float32", 0.1), (40, "float32", 1.0), (20, "float64", 0.2)])
def test_solver_consistency(solver, proportion_nonzero, n_samples, dtype):
    """test_solver_consistency: Ridge and ``RidgeCV(alphas=[1])`` against ``Ridge(solver="svd")`` (of the
    same, possibly float32-rounded, data), 30 min-max scaled features with an intercept."""
    noise = 50.0 if proportion_nonzero > 0.9 else 500.0
    X, y = make_sparse_offset_regression(bias=10, n_features=30, proportion_nonzero=proportion_nonzero, noise=noise,
                                         random_state=SEED, n_samples=n_samples)
    X = minmax_scale(X).astype(dtype)
    y = y.astype(dtype)
    ref = Ridge(solver="svd", alpha=1.0).fit(X.astype(np.float64), y.astype(np.float64))
    lam = ("loo", [1.0]) if solver == "ridgecv" else 1.0
    x = bl.solve(X, y, lam=lam, fit_intercept=True)
    assert x.dtype == np.dtype(dtype)
    check_solution(x, X, y, ref.coef_, ref.intercept_, 1.0, fit_intercept=True, dtype=dtype)


# --- RidgeCV: leave-one-out ------------------------------------------------------------------------------

def test_ridge_gcv_integer_arrays():
    """test_ridge_gcv_integer_arrays: integer X and y are cast to float64 (the same bits as the float
    data), ``cv_results_`` float64; the peer's ``scoring="neg_mean_squared_error"`` chooses as the default."""
    rng = np.random.RandomState(0)
    X = rng.randint(0, 5, size=(20, 10))
    y = rng.randint(0, 5, size=(20,))
    grid = _grid([0.1, 1.0, 10.0])
    xi = bl.solve(X, y, lam=grid, store_cv_results=True, fit_intercept=True)
    xf = bl.solve(X.astype(np.float64), y.astype(np.float64), lam=grid, store_cv_results=True, fit_intercept=True)
    assert np.array_equal(dense(xi), dense(xf)) and np.array_equal(xi.cv_results_, xf.cv_results_)
    assert xi.cv_results_.dtype == np.float64 and xi.dtype == np.float64
    ref = RidgeCV(alphas=[0.1, 1.0, 10.0]).fit(X.astype(np.float64), y.astype(np.float64))
    assert xi.report["alpha_"] == pytest.approx(ref.alpha_)
    check_solution(xi, X, y, ref.coef_, ref.intercept_, _lam(ref.alpha_), fit_intercept=True)


def _check_cv(x, X, y, ref, *, w=None, fit_intercept=False, dtype=np.float64):
    """alpha_ (the same grid value), coef_ and intercept_, and best_score_ against a RidgeCV or k-fold ``ref``."""
    assert x.report["alpha_"] == pytest.approx(ref.alpha_, rel=1e-12)
    check_solution(x, X, y, ref.coef_, ref.intercept_, _lam(ref.alpha_), w=w, fit_intercept=fit_intercept,
                   dtype=dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("X_shape", [(11, 8), (11, 20)], ids=["tall", "wide"])
@pytest.mark.parametrize("fit_intercept", [True, False])
@pytest.mark.parametrize("y_shape, noise", [((11,), 1.0), ((11, 1), 30.0), ((11, 3), 150.0)])
def test_ridge_gcv_vs_ridge_loo_cv(dtype, X_shape, y_shape, fit_intercept, noise):
    """test_ridge_gcv_vs_ridge_loo_cv: the closed form against ``RidgeCV(cv=n_samples)`` (refits, one row
    left out each), alpha_, coef_ and intercept_ (float32 data against the refits of the rounded data)."""
    n_samples, n_features = X_shape
    n_targets = y_shape[-1] if len(y_shape) == 2 else 1
    X, y = make_sparse_offset_regression(n_samples=n_samples, n_features=n_features, n_targets=n_targets,
                                         random_state=0, shuffle=False, noise=noise, n_informative=5)
    y = y.reshape(y_shape)
    X, y = X.astype(dtype), y.astype(dtype)
    alphas = [1e-3, 0.1, 1.0, 10.0, 1e3]
    loo = RidgeCV(cv=n_samples, fit_intercept=fit_intercept, alphas=alphas, scoring="neg_mean_squared_error")
    loo.fit(X.astype(np.float64), y.astype(np.float64))
    x = bl.solve(X, y, lam=_grid(alphas), fit_intercept=fit_intercept)
    assert x.dtype == np.dtype(dtype)
    _check_cv(x, X, y, loo, fit_intercept=fit_intercept, dtype=dtype)


def _limits(alpha, X, y, fit_intercept):
    """The peer's ``_ridge_regularization_limits``: LinearRegression for alpha -> 0, zeros (and mean y) for
    alpha -> inf."""
    if np.isclose(alpha, 0):
        lin = LinearRegression(fit_intercept=fit_intercept).fit(X, y)
        return lin.coef_, lin.intercept_
    return np.zeros(X.shape[1]), (np.mean(y) if fit_intercept else 0.0)


def _check_limits(x, X, y, alpha, fit_intercept, dtype):
    X64, y64 = np.asarray(X, np.float64), np.asarray(y, np.float64)
    coef, intercept = _limits(alpha, X64, y64, fit_intercept)
    lam = _lam(alpha)
    if np.isclose(alpha, 0):  # LinearRegression is lam = 0
        check_solution(x, X64, y64, coef, intercept, lam, fit_intercept=fit_intercept, dtype=dtype, ref_lam=0.0)
        return
    # lam -> inf: ||x|| <= ||A_c^T b_c|| / lam^2, x0 = bbar - mu^T x
    ac, bc = centered(X64, y64, None, fit_intercept)
    xb = np.linalg.norm(ac.T @ bc) / lam**2 * (1 + 16 * max(X.shape) * EPS64 + 2 * float(np.finfo(dtype).eps))
    assert np.linalg.norm(dense(x)) <= xb
    if fit_intercept:
        ib = intercept_bound(X64, y64, np.zeros(X.shape[1]), [intercept], xb, dtype=dtype)
        assert abs(x.intercept[0] - intercept) <= ib
    else:
        assert getattr(x, "intercept", None) is None


@pytest.mark.parametrize("memory", [None, "least"])
@pytest.mark.parametrize("alpha", [1e-16, 1e16], ids=["zero_alpha", "inf_alpha"])
@pytest.mark.parametrize("fit_intercept", [True, False])
@pytest.mark.parametrize("X_shape", [(100, 50), (50, 100)], ids=["tall", "wide"])
def test_regularization_limits_ridge(alpha, fit_intercept, X_shape, memory):
    """test_regularization_limits_ridge: alpha near 0 is LinearRegression, near inf zero coefficients."""
    n_samples, n_features = X_shape
    X, y = make_regression(n_samples=n_samples, n_features=n_features, noise=0, bias=10, random_state=42)
    x = run(lambda mem: bl.solve(X, y, lam=_lam(alpha), fit_intercept=fit_intercept, memory=mem), memory)
    _check_limits(x, X, y, alpha, fit_intercept, np.float64)


@pytest.mark.parametrize("alpha", [1e-16, 1e16], ids=["zero_alpha", "inf_alpha"])
@pytest.mark.parametrize("fit_intercept", [True, False])
@pytest.mark.parametrize("X_shape", [(100, 50), (50, 50), (50, 100)], ids=["tall", "square", "wide"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_regularization_limits_ridge_gcv(alpha, fit_intercept, X_shape, dtype):
    """test_regularization_limits_ridge_gcv: ``RidgeCV(alphas=[alpha])`` at the same limits (float32 data
    against the limits of the rounded data)."""
    n_samples, n_features = X_shape
    X, y = make_regression(n_samples=n_samples, n_features=n_features, noise=0, bias=10, random_state=42)
    X, y = X.astype(dtype), y.astype(dtype)
    x = bl.solve(X, y, lam=_grid([alpha]), fit_intercept=fit_intercept)
    assert x.dtype == np.dtype(dtype)
    _check_limits(x, X, y, alpha, fit_intercept, dtype)


def test_ridge_loo_cv_asym_scoring():
    """test_ridge_loo_cv_asym_scoring: ``scoring="explained_variance"``, against ``RidgeCV(cv=n_samples)``."""
    X, y = make_sparse_offset_regression(n_samples=10, n_features=5, n_targets=1, random_state=0, shuffle=False,
                                         noise=1, n_informative=5)
    alphas = [1e-3, 0.1, 1.0, 10.0, 1e3]
    loo = RidgeCV(cv=10, fit_intercept=True, alphas=alphas, scoring="explained_variance").fit(X, y)
    x = bl.solve(X, y, lam=_grid(alphas), fit_intercept=True, scoring="explained_variance")
    _check_cv(x, X, y, loo, fit_intercept=True)


@pytest.mark.parametrize("n_features", [8, 20])
@pytest.mark.parametrize("y_shape, fit_intercept, noise",
                         [((11,), True, 1.0), ((11, 1), True, 20.0), ((11, 3), True, 150.0), ((11, 3), False, 30.0)])
def test_ridge_gcv_sample_weights(fit_intercept, n_features, y_shape, noise):
    """test_ridge_gcv_sample_weights: integer weights are repeated rows: the weighted leave-one-out errors
    ``w_i e_i^2`` are the group k-fold errors of the tiled data, alpha_, coef_ and intercept_ its choice."""
    alphas = [1e-3, 0.1, 1.0, 10.0, 1e3]
    rng = np.random.RandomState(0)
    n_targets = y_shape[-1] if len(y_shape) == 2 else 1
    X, y = make_sparse_offset_regression(n_samples=11, n_features=n_features, n_targets=n_targets, random_state=0,
                                         shuffle=False, noise=noise)
    y = y.reshape(y_shape)
    sample_weight = 3 * rng.randn(len(X))
    sample_weight = (sample_weight - sample_weight.min() + 1).astype(int)
    indices = np.repeat(np.arange(X.shape[0]), sample_weight)
    sample_weight = sample_weight.astype(float)
    X_tiled, y_tiled = X[indices], y[indices]
    cv = GroupKFold(n_splits=X.shape[0])
    kfold = RidgeCV(alphas=alphas, cv=cv.split(X_tiled, y_tiled, groups=indices), scoring="neg_mean_squared_error",
                    fit_intercept=fit_intercept).fit(X_tiled, y_tiled)
    predictions = cross_val_predict(Ridge(alpha=kfold.alpha_, fit_intercept=fit_intercept), X_tiled, y_tiled,
                                    cv=cv.split(X_tiled, y_tiled, groups=indices)).reshape(y_tiled.shape)
    kfold_errors = (y_tiled - predictions) ** 2
    kfold_errors = np.asarray([np.sum(kfold_errors[indices == i], axis=0) for i in np.arange(X.shape[0])])

    x = bl.solve(X, y, lam=_grid(alphas), sample_weight=sample_weight, store_cv_results=True,
                 fit_intercept=fit_intercept)
    assert x.cv_results_.shape == (11, n_targets, len(alphas))
    i = alphas.index(kfold.alpha_)
    errors = x.cv_results_[:, :, i].reshape(kfold_errors.shape)
    _check_cv(x, X, y, kfold, w=sample_weight, fit_intercept=fit_intercept)
    # sum |e^2 - e_ref^2| <= (2 ||e_ref|| + ||de||) ||de||: loo_score_bound (a mean over m k) times m k
    lam = _lam(kfold.alpha_)
    looe = np.sqrt(kfold_errors).ravel()
    bound = loo_score_bound(X, y, sample_weight, lam, fit_intercept, np.asarray(kfold.coef_).T, looe) * looe.size
    assert np.abs(errors - kfold_errors).sum() <= bound


def test_dense_sparse_ridge_loo():
    """test_dense_sparse[_test_ridge_loo] (its dense half): diabetes, the default grid; the peer's scorer
    variants (``make_scorer(mean_squared_error)``, ``-mean_squared_error``, ``neg_mean_squared_error``, all
    the default's choice) without an intercept pick the same alpha; unit weights too; two equal targets
    give equal predictions."""
    X, y = X_DIABETES, Y_DIABETES
    x = bl.solve(X, y, lam=_grid(ALPHAS), fit_intercept=True)
    ref = RidgeCV(alphas=ALPHAS, fit_intercept=True).fit(X, y)
    _check_cv(x, X, y, ref, fit_intercept=True)
    alpha_ = x.report["alpha_"]
    assert bl.solve(X, y, lam=_grid(ALPHAS)).report["alpha_"] == pytest.approx(alpha_)
    xw = bl.solve(X, y, lam=_grid(ALPHAS), fit_intercept=True, sample_weight=np.ones(len(y)))
    assert xw.report["alpha_"] == pytest.approx(alpha_)
    two = bl.solve(X, np.vstack((y, y)).T, lam=_grid(ALPHAS), fit_intercept=True)
    pred2 = X @ dense(two) + two.intercept
    pred = X @ dense(x).ravel() + x.intercept[0]
    xb = coef_bound(X, y, _lam(alpha_), ref.coef_, fit_intercept=True)
    pb = np.linalg.norm(X, 2) * xb + np.sqrt(len(y)) * intercept_bound(X, y, ref.coef_, [ref.intercept_], xb)
    assert np.linalg.norm(pred2 - np.vstack((pred, pred)).T) <= 2 * pb


def test_dense_sparse_ridge_cv():
    """test_dense_sparse[_test_ridge_cv] (dense, ``cv=None``): one target gives one column and one intercept."""
    x = bl.solve(X_DIABETES, Y_DIABETES, lam=_grid(ALPHAS), fit_intercept=True)
    assert x.shape == (X_DIABETES.shape[1], 1) and x.intercept.shape == (1,) and x.intercept.dtype == np.float64


def test_dense_sparse_ridge_cv_kfold():
    """test_dense_sparse[_test_ridge_cv] (dense, ``cv=KFold(5)``)."""
    from sklearn.model_selection import KFold

    x = bl.solve(X_DIABETES, Y_DIABETES, lam=_grid(ALPHAS), fit_intercept=True, cv=KFold(5))
    ref = RidgeCV(alphas=ALPHAS, cv=KFold(5)).fit(X_DIABETES, Y_DIABETES)
    _check_cv(x, X_DIABETES, Y_DIABETES, ref, fit_intercept=True)


@pytest.mark.parametrize("memory", [None, "least"])
def test_dense_sparse_ridge_diabetes(memory):
    """test_dense_sparse[_test_ridge_diabetes] (dense): Ridge(fit_intercept=False)'s R2 on diabetes."""
    X, y = X_DIABETES, Y_DIABETES
    x = run(lambda mem: bl.solve(X, y, lam=1.0, memory=mem), memory)
    ref = Ridge(fit_intercept=False).fit(X, y)
    xb = check_solution(x, X, y, ref.coef_, 0.0, 1.0)
    got = dense(x).ravel()
    assert abs(_r2(X, y, got, 0.0) - ref.score(X, y)) <= _r2_bound(X, y, got, 0.0, xb, 0.0)


@pytest.mark.parametrize("memory", [None, "least"])
def test_dense_sparse_multi_ridge_diabetes(memory):
    """test_dense_sparse[_test_multi_ridge_diabetes] (dense): two equal targets, equal predictions."""
    X, y = X_DIABETES, Y_DIABETES
    Y = np.vstack((y, y)).T
    x2 = run(lambda mem: bl.solve(X, Y, lam=1.0, memory=mem), memory)
    assert x2.shape == (X.shape[1], 2)
    x1 = bl.solve(X, y, lam=1.0)
    ref = Ridge(fit_intercept=False).fit(X, y)
    xb = check_solution(x1, X, y, ref.coef_, 0.0, 1.0)
    pred2, pred = X @ dense(x2), X @ dense(x1).ravel()
    assert np.linalg.norm(pred2 - np.vstack((pred, pred)).T) <= 2 * np.sqrt(2) * np.linalg.norm(X, 2) * xb


def test_ridge_gcv_cv_results_not_stored():
    """test_ridge_gcv_cv_results_not_stored (RidgeCV): no ``cv_results_`` unless asked for."""
    X, y = make_regression(n_samples=6, random_state=42)
    x = bl.solve(X, y, lam=_grid(ALPHAS), fit_intercept=True)
    assert not hasattr(x, "cv_results_") and "cv_results_" not in x.report


@pytest.mark.parametrize("cv", [None, 3])
def test_ridge_best_score(cv):
    """test_ridge_best_score (RidgeCV): ``best_score_`` is a float (``cv=3``: 3-fold)."""
    X, y = make_regression(n_samples=6, random_state=42)
    kw = {} if cv is None else {"cv": cv}
    x = bl.solve(X, y, lam=_grid(ALPHAS), fit_intercept=True, **kw)
    assert isinstance(x.report["best_score_"], float)
    ref = RidgeCV(alphas=ALPHAS, cv=cv).fit(X, y)
    assert x.report["alpha_"] == pytest.approx(ref.alpha_)


def _individual_penalties_data():
    rng = np.random.RandomState(42)
    n_samples, n_features, n_targets = 20, 5, 3
    y = rng.randn(n_samples, n_targets)
    X = (np.dot(y[:, [0]], np.ones((1, n_features))) + np.dot(y[:, [1]], 0.05 * np.ones((1, n_features)))
         + np.dot(y[:, [2]], 0.001 * np.ones((1, n_features))) + rng.randn(n_samples, n_features))
    return X, y, (1, 100, 1000)


def test_ridge_cv_individual_penalties():
    """test_ridge_cv_individual_penalties: ``alpha_per_target`` chooses each target's own alpha, the
    coefficients are Ridge's at those alphas; the shapes of alpha_, best_score_ and cv_results_ (``m x k x
    L``; one target: scalars, ``m x 1 x L``)."""
    X, y, alphas = _individual_penalties_data()
    grid = _grid(alphas)
    optimal = [bl.solve(X, t, lam=grid, fit_intercept=True).report["alpha_"] for t in y.T]
    x = bl.solve(X, y, lam=grid, lam_per_target=True, fit_intercept=True)
    assert x.report["alpha_"] == pytest.approx(optimal, rel=1e-12)
    assert optimal == pytest.approx([RidgeCV(alphas=alphas).fit(X, t).alpha_ for t in y.T], rel=1e-12)
    ref = Ridge(alpha=np.asarray(x.report["alpha_"])).fit(X, y)
    coef = dense(x).T
    for j in range(3):
        xb = coef_bound(X, y[:, j], _lam(ref.alpha[j]), ref.coef_[j], fit_intercept=True)
        assert np.linalg.norm(coef[j] - ref.coef_[j]) <= xb
    x = bl.solve(X, y, lam=grid, lam_per_target=True, store_cv_results=True, fit_intercept=True)
    assert len(x.report["alpha_"]) == 3 and len(x.report["best_score_"]) == 3
    assert x.cv_results_.shape == (20, 3, len(alphas))
    x = bl.solve(X, y, lam=("loo", 1), lam_per_target=True, store_cv_results=True, fit_intercept=True)
    assert len(x.report["alpha_"]) == 3 and len(x.report["best_score_"]) == 3 and x.cv_results_.shape == (20, 3, 1)
    x = bl.solve(X, y[:, 0], lam=grid, lam_per_target=True, store_cv_results=True, fit_intercept=True)
    assert np.isscalar(x.report["alpha_"]) and np.isscalar(x.report["best_score_"])
    assert x.cv_results_.shape == (20, 1, len(alphas))


def test_ridge_cv_individual_penalties_r2_scoring():
    """test_ridge_cv_individual_penalties' ``scoring="r2"`` part: the same per-target alphas."""
    X, y, alphas = _individual_penalties_data()
    x = bl.solve(X, y, lam=_grid(alphas), lam_per_target=True, fit_intercept=True, scoring="r2")
    assert x.report["alpha_"] == pytest.approx([RidgeCV(alphas=alphas).fit(X, t).alpha_ for t in y.T])


def _mean_squared_error_callable(x, y):
    return ((x - y) ** 2).mean()


@pytest.mark.parametrize("scoring", [None, "neg_mean_squared_error", "callable"])
def test_ridgecv_store_cv_results(scoring):
    """test_ridgecv_store_cv_results: ``cv_results_`` is ``m x k x L`` (a 1-D y: ``m x 1 x L``)."""
    rng = np.random.RandomState(42)
    x_ = rng.randn(8, 5)
    alphas = [1e-1, 1e0, 1e1]
    from sklearn.metrics import make_scorer

    kw = {} if scoring is None else {"scoring": make_scorer(_mean_squared_error_callable)
                                     if scoring == "callable" else scoring}
    y = rng.randn(8)
    r = bl.solve(x_, y, lam=_grid(alphas), store_cv_results=True, fit_intercept=True, **kw)
    assert r.cv_results_.shape == (8, 1, 3)
    ref = RidgeCV(alphas=alphas, store_cv_results=True).fit(x_, y)
    lam = _lam(ref.alpha_)
    looe = np.sqrt(ref.cv_results_[:, alphas.index(ref.alpha_)])
    bound = loo_score_bound(x_, y, None, lam, True, ref.coef_, looe) * looe.size
    assert np.abs(r.cv_results_[:, 0, alphas.index(ref.alpha_)] - looe**2).sum() <= bound
    y = rng.randn(8, 3)
    r = bl.solve(x_, y, lam=_grid(alphas), store_cv_results=True, fit_intercept=True, **kw)
    assert r.cv_results_.shape == (8, 3, 3)


def test_ridgecv_alphas_conversion():
    """test_ridgecv_alphas_conversion (RidgeCV): the grid given is not modified and is the one evaluated."""
    rng = np.random.RandomState(0)
    alphas = (0.1, 1.0, 10.0)
    y = rng.randn(5)
    X = rng.randn(5, 5)
    lam = tuple(np.sqrt(alphas))
    arg = ("loo", lam)
    x = bl.solve(X, y, lam=arg, fit_intercept=True)
    assert arg[1] is lam and lam == tuple(np.sqrt(alphas))
    assert np.array_equal(x.report["curve"]["lam"], np.asarray(lam))


@pytest.mark.parametrize("cv", [None, 3])
def test_ridgecv_alphas_zero(cv):
    """test_ridgecv_alphas_zero (RidgeCV): a zero alpha is refused for leave-one-out, taken by k-fold."""
    rng = np.random.RandomState(0)
    alphas = (0.0, 1.0, 10.0)
    y = rng.randn(5)
    X = rng.randn(5, 5)
    if cv is None:
        with pytest.raises(BlocklinError, match=r"lam: grid values of \('loo', grid\) must be finite and > 0.*got "
                                                r"0\.0.*Fix"):
            bl.solve(X, y, lam=_grid(alphas), fit_intercept=True)
    else:
        x = bl.solve(X, y, lam=_grid(alphas), fit_intercept=True, cv=cv)
        assert x.report["alpha_"] == pytest.approx(RidgeCV(alphas=alphas, cv=cv).fit(X, y).alpha_)


def test_ridgecv_sample_weight():
    """test_ridgecv_sample_weight: ``cv=KFold(5)`` with weights, against GridSearchCV over Ridge."""
    from sklearn.model_selection import GridSearchCV, KFold

    rng = np.random.RandomState(0)
    alphas = (0.1, 1.0, 10.0)
    for n_samples, n_features in ((6, 5), (5, 10)):
        y = rng.randn(n_samples)
        X = rng.randn(n_samples, n_features)
        sample_weight = 1.0 + rng.rand(n_samples)
        x = bl.solve(X, y, lam=_grid(alphas), fit_intercept=True, sample_weight=sample_weight, cv=KFold(5))
        gs = GridSearchCV(Ridge(), {"alpha": alphas}, cv=KFold(5)).fit(X, y, sample_weight=sample_weight)
        assert x.report["alpha_"] == pytest.approx(gs.best_estimator_.alpha)


def test_raises_value_error_if_sample_weights_greater_than_1d():
    """test_raises_value_error_if_sample_weights_greater_than_1d: a ``1 x m`` row of weights is refused,
    naming sample_weight; the vector works (an ``m x 1`` column too: blocklin's stored weight vectors)."""
    rng = np.random.RandomState(42)
    for n_samples, n_features in ((2, 3), (3, 2)):
        X = rng.randn(n_samples, n_features)
        y = rng.randn(n_samples)
        ok = rng.randn(n_samples) ** 2 + 1
        ref = Ridge(alpha=1).fit(X, y, ok)
        for w in (ok, ok[:, np.newaxis]):
            check_solution(bl.solve(X, y, lam=1.0, fit_intercept=True, sample_weight=w), X, y, ref.coef_,
                           ref.intercept_, 1.0, w=ok, fit_intercept=True)
        with pytest.raises(BlocklinError, match=r"sample_weight: must have one weight per row.*Fix"):
            bl.solve(X, y, lam=1.0, fit_intercept=True, sample_weight=ok[np.newaxis, :])


@pytest.mark.xfail(strict=True, reason="a scalar sample_weight: refused by design (a constant weight c is "
                                       "lam / sqrt(c); the message says so)")
def test_raises_value_error_if_sample_weights_greater_than_1d_scalars():
    """test_raises_value_error_if_sample_weights_greater_than_1d: the scalar weights 1.0 and 2.0 it accepts."""
    rng = np.random.RandomState(42)
    X, y = rng.randn(3, 2), rng.randn(3)
    for w in (1.0, 2.0):
        ref = Ridge(alpha=1).fit(X, y, w)
        check_solution(bl.solve(X, y, lam=1.0, fit_intercept=True, sample_weight=w), X, y, ref.coef_,
                       ref.intercept_, 1.0, w=np.full(3, w), fit_intercept=True)


def test_ridgecv_int_alphas():
    """test_ridgecv_int_alphas: an integer grid."""
    X = np.array([[-1.0, -1.0], [-1.0, 0], [-0.8, -1.0], [1.0, 1.0], [1.0, 0.0]])
    y = [1, 1, 1, -1, -1]
    x = bl.solve(X, np.asarray(y), lam=("loo", (1, 10, 100)), fit_intercept=True)
    assert x.report["alpha_"] == pytest.approx(RidgeCV(alphas=(1, 100, 10000)).fit(X, y).alpha_)


@pytest.mark.parametrize("grid, match", [
    ((1, -1, -100), r"lam: grid values .* must be finite and > 0.*got -1\.0.*Fix"),
    ((-0.1, -1.0, -10.0), r"lam: grid values .* must be finite and > 0.*got -0\.1.*Fix"),
    ((1, 1.0, "1"), r"lam: grid of \('loo', grid\) must be numbers.*Fix"),
], ids=["one-negative", "all-negative", "a-string"])
def test_ridgecv_alphas_validation(grid, match):
    """test_ridgecv_alphas_validation (RidgeCV): negative values and a string in the grid are refused, naming
    lam, the rule and the value (the grid here is lam's; the peer's alphas are its squares)."""
    rng = np.random.RandomState(0)
    X = rng.randn(5, 5)
    y = rng.randint(0, 2, 5).astype(float)
    with pytest.raises(BlocklinError, match=match):
        bl.solve(X, y, lam=("loo", grid), fit_intercept=True)


def test_ridgecv_alphas_scalar():
    """test_ridgecv_alphas_scalar (RidgeCV): a scalar grid."""
    rng = np.random.RandomState(0)
    X, y = rng.randn(5, 5), rng.randn(5)
    x = bl.solve(X, y, lam=("loo", 1), fit_intercept=True)
    assert x.report["alpha_"] == 1.0


# --- ridge_regression, dtypes, layouts --------------------------------------------------------------------

@pytest.mark.parametrize("memory", [None, "least"])
@pytest.mark.parametrize("with_weights", [False, True], ids=["sample_weight=None", "sample_weight=ones"])
@pytest.mark.parametrize("return_intercept", [False, True])
def test_ridge_regression_check_arguments_validity(return_intercept, with_weights, memory):
    """test_ridge_regression_check_arguments_validity (dense): the true coefficients (and intercept 1e4)
    within the peer's ``atol=1e-4`` (the bias of alpha=1e-3 on 1000 rows), and Ridge's own solution
    within the rounding bound."""
    rng = np.random.RandomState(42)
    X = rng.rand(1000, 3)
    true_coefs = [1, 2, 0.1]
    y = np.dot(X, true_coefs)
    true_intercept = 10000.0 if return_intercept else 0.0
    y += true_intercept
    w = np.ones(1000) if with_weights else None
    x = run(lambda mem: bl.solve(X, y, lam=_lam(1e-3), fit_intercept=return_intercept, sample_weight=w, memory=mem),
            memory)
    np.testing.assert_allclose(dense(x).ravel(), true_coefs, rtol=0, atol=1e-4)
    if return_intercept:
        np.testing.assert_allclose(x.intercept[0], true_intercept, rtol=0, atol=1e-4)
    ref = Ridge(alpha=1e-3, fit_intercept=return_intercept, solver="svd").fit(X, y, sample_weight=w)
    check_solution(x, X, y, ref.coef_, ref.intercept_, _lam(1e-3), w=w, fit_intercept=return_intercept)


def _dtype_pair(X64, y64, lam, fit_intercept):
    """The float32 and float64 solutions; each against Ridge's float64 solution of its own data."""
    out = {}
    for dtype in (np.float32, np.float64):
        X, y = X64.astype(dtype), y64.astype(dtype)
        x = bl.solve(X, y, lam=lam, fit_intercept=fit_intercept)
        assert x.dtype == dtype and (X @ dense(x)).dtype == dtype
        out[dtype] = (x, X, y)
    return out


def test_dtype_match():
    """test_dtype_match: float32 in, float32 out (and float64); each solution against Ridge of its data."""
    rng = np.random.RandomState(0)
    X64, y64 = rng.randn(6, 5), rng.randn(6)
    for dtype, (x, X, y) in _dtype_pair(X64, y64, 1.0, True).items():
        ref = Ridge(alpha=1.0).fit(X.astype(np.float64), y.astype(np.float64))
        check_solution(x, X, y, ref.coef_, ref.intercept_, 1.0, fit_intercept=True, dtype=dtype)


def test_dtype_match_cholesky():
    """test_dtype_match_cholesky: per-target alphas [1, 0.5] (a lam sequence, target l in block l), both dtypes."""
    rng = np.random.RandomState(0)
    X64, y64 = rng.randn(6, 7), rng.randn(6, 2)
    alpha = np.array([1.0, 0.5])
    for dtype, (x, X, y) in _dtype_pair(X64, y64, np.sqrt(alpha), True).items():
        got = dense(x)
        ref = Ridge(alpha=alpha, solver="cholesky").fit(X.astype(np.float64), y.astype(np.float64))
        for j in range(2):
            coef = got[:, j * 2 + j]
            assert np.linalg.norm(coef - ref.coef_[j]) <= coef_bound(X, y[:, j], _lam(alpha[j]), ref.coef_[j],
                                                                      fit_intercept=True, dtype=dtype)


def test_ridge_regression_dtype_stability():
    """test_ridge_regression_dtype_stability (seed 0): ``ridge_regression`` (no intercept) in both dtypes."""
    rs = np.random.RandomState(0)
    X64 = rs.randn(6, 5)
    coef = rs.randn(5)
    y64 = X64 @ coef + 0.01 * rs.randn(6)
    for dtype, (x, X, y) in _dtype_pair(X64, y64, 1.0, False).items():
        ref = Ridge(alpha=1.0, fit_intercept=False).fit(X.astype(np.float64), y.astype(np.float64))
        check_solution(x, X, y, ref.coef_, 0.0, 1.0, dtype=dtype)


def test_ridge_sag_with_X_fortran():
    """test_ridge_sag_with_X_fortran (its input; SAG's own copy is the solver's): a Fortran-ordered, strided X
    (every other row) and y, against Ridge of the contiguous copy."""
    X, y = make_regression(random_state=42)
    X = np.asfortranarray(X)[::2, :]
    y = y[::2]
    x = bl.solve(X, y, lam=1.0, fit_intercept=True)
    ref = Ridge().fit(np.ascontiguousarray(X), y)
    check_solution(x, X, y, ref.coef_, ref.intercept_, 1.0, fit_intercept=True)


# --- positive=True -------------------------------------------------------------------------------------------

def _nnls_reference(a, b, lam, fit_intercept):
    """``argmin_{x >= 0} ||A_c x - b_c||^2 + lam^2 ||x||^2`` by SciPy's NNLS on the stacked system, its intercept."""
    ac, bc = centered(a, b, None, fit_intercept)
    n = a.shape[1]
    coef = nnls(np.vstack([ac, lam * np.eye(n)]), np.r_[bc.ravel(), np.zeros(n)])[0]
    a64 = np.asarray(a, np.float64)
    intercept = float(np.mean(b) - a64.mean(axis=0) @ coef) if fit_intercept else 0.0
    return coef, intercept


def _check_positive(x, a, b, lam, fit_intercept):
    """The active-set solutions agree on the zero set; the free coefficients solve the ridge problem on the
    free columns, so they carry its bound."""
    coef_ref, intercept_ref = _nnls_reference(a, b, lam, fit_intercept)
    got = dense(x).ravel()
    assert np.all(got >= 0)
    free = coef_ref > 0
    assert np.array_equal(got > 0, free)
    xb = coef_bound(np.asarray(a, np.float64)[:, free], b, lam, coef_ref[free], fit_intercept=fit_intercept) \
        if free.any() else 0.0
    assert np.linalg.norm(got - coef_ref) <= xb
    if fit_intercept:
        ib = intercept_bound(a, b, coef_ref, [intercept_ref], xb)
        assert abs(x.intercept[0] - intercept_ref) <= ib


@pytest.mark.parametrize("fit_intercept", [True, False])
@pytest.mark.parametrize("alpha", [1e-3, 1e-2, 0.1, 1.0])
def test_ridge_positive_regression_test(fit_intercept, alpha):
    """test_ridge_positive_regression_test: nonnegative coefficients where the truth has a negative one
    (and against SciPy's NNLS of the stacked system)."""
    X = np.array([[1, 2], [3, 4], [5, 6], [7, 8]])
    coef = np.array([1, -10])
    y = X.dot(coef) + (20 if fit_intercept else 0)
    x = bl.solve(X, y.astype(float), lam=_lam(alpha), positive=True, fit_intercept=fit_intercept)
    _check_positive(x, X, y, _lam(alpha), fit_intercept)


@pytest.mark.parametrize("memory", [None, "least"])
@pytest.mark.parametrize("fit_intercept", [True, False])
@pytest.mark.parametrize("alpha", [1e-3, 1e-2, 0.1, 1.0])
def test_ridge_ground_truth_positive_test(fit_intercept, alpha, memory):
    """test_ridge_ground_truth_positive_test: with positive true coefficients, positive=True and False give
    the same solution (two solutions of one problem: the bound, not the peer's atol)."""
    rng = np.random.RandomState(42)
    X = rng.randn(300, 100)
    coef = rng.uniform(0.1, 1.0, size=X.shape[1])
    y = X @ coef + (1 if fit_intercept else 0)
    y += rng.normal(size=X.shape[0]) * 0.01
    lam = _lam(alpha)
    pos = run(lambda mem: bl.solve(X, y, lam=lam, positive=True, fit_intercept=fit_intercept, memory=mem), memory)
    unc = bl.solve(X, y, lam=lam, fit_intercept=fit_intercept)
    assert np.all(dense(unc) > 0)  # the premise: the constraint is inactive
    ref = Ridge(alpha=alpha, fit_intercept=fit_intercept).fit(X, y)
    check_solution(pos, X, y, ref.coef_, ref.intercept_, lam, fit_intercept=fit_intercept)
    check_solution(unc, X, y, ref.coef_, ref.intercept_, lam, fit_intercept=fit_intercept)


@pytest.mark.parametrize("alpha", [1e-3, 1e-2, 0.1, 1.0])
def test_positive_ridge_loss(alpha):
    """test_positive_ridge_loss (the peer sets alpha = 0.1 in every case): the unconstrained loss is below the
    constrained one, and the constrained one below its small positive perturbations."""
    X, y = make_regression(n_samples=300, n_features=300, random_state=42)
    alpha = 0.10

    def ridge_loss(coef, intercept, random_state=None, noise_scale=1e-8):
        if random_state is not None:
            coef = coef + np.random.RandomState(random_state).uniform(0, noise_scale, size=coef.shape)
        return 0.5 * np.sum((y - X @ coef - intercept) ** 2) + 0.5 * alpha * np.sum(coef**2)

    unc = bl.solve(X, y, lam=_lam(alpha), fit_intercept=True)
    pos = bl.solve(X, y, lam=_lam(alpha), fit_intercept=True, positive=True)
    loss = ridge_loss(dense(unc).ravel(), unc.intercept[0])
    loss_positive = ridge_loss(dense(pos).ravel(), pos.intercept[0])
    assert loss <= loss_positive
    for random_state in range(100):
        assert loss_positive <= ridge_loss(dense(pos).ravel(), pos.intercept[0], random_state=random_state)


@pytest.mark.parametrize("positive", [False, pytest.param(True, id="lbfgs-positive")])
@pytest.mark.parametrize("data", ["tall", "wide"])
@pytest.mark.parametrize("fit_intercept", [False, True])
def test_ridge_sample_weight_consistency(fit_intercept, data, positive, request):
    """test_ridge_sample_weight_consistency (its ``lbfgs`` rows are ``positive=True``): unit weights are no
    weights; zero weights are rows removed; scaling the weights and alpha together changes nothing;
    doubling a weight is repeating its row. Each pair: two solutions of one problem, within the bound."""
    if positive and data == "wide":
        request.applymarker(WIDE_POSITIVE)
    rng = np.random.RandomState(42)
    n_samples = 12
    n_features = n_samples // 2 if data == "tall" else n_samples * 2
    X = rng.rand(n_samples, n_features)
    y = rng.rand(n_samples)

    def fit(a, b, w, alpha=1.0):
        return bl.solve(a, b, lam=_lam(alpha), fit_intercept=fit_intercept, sample_weight=w, positive=positive)

    def same(x1, x2, a, b, w, alpha=1.0):
        ref = dense(x2).ravel()
        xb = coef_bound(a, b, _lam(alpha), ref, w=w, fit_intercept=fit_intercept)
        if positive:  # the free columns' problem (both solutions' zero sets agree)
            free = ref > 0
            assert np.array_equal(dense(x1).ravel() > 0, free)
            xb = coef_bound(a[:, free], b, _lam(alpha), ref[free], w=w, fit_intercept=fit_intercept)
        assert np.linalg.norm(dense(x1).ravel() - ref) <= xb
        if fit_intercept:
            assert abs(x1.intercept[0] - x2.intercept[0]) <= intercept_bound(a, b, ref, x2.intercept, xb, w=w)

    # 1) unit weights are no weights
    same(fit(X, y, np.ones_like(y)), fit(X, y, None), X, y, None)
    # 2) zero weights are rows removed
    sample_weight = rng.uniform(low=0.01, high=2, size=X.shape[0])
    sample_weight[-5:] = 0
    y[-5:] *= 1000
    full = fit(X, y, sample_weight)
    same(full, fit(X[:-5], y[:-5], sample_weight[:-5]), X[:-5], y[:-5], sample_weight[:-5])
    # 3) weights and alpha scaled together
    same(fit(X, y, np.pi * sample_weight, np.pi), full, X, y, sample_weight)
    # 4) a doubled weight is a repeated row
    X2 = np.concatenate([X, X[: n_samples // 2]], axis=0)
    y2 = np.concatenate([y, y[: n_samples // 2]])
    sw1 = sample_weight.copy()
    sw1[: n_samples // 2] *= 2
    sw2 = np.concatenate([sample_weight, sample_weight[: n_samples // 2]], axis=0)
    same(fit(X, y, sw1), fit(X2, y2, sw2), X, y, sw1)


# --- cv_results_ and best_score_ against naive leave-one-out refits ----------------------------------------

@pytest.mark.parametrize("X_shape", [(50, 10), (10, 50)], ids=["tall", "wide"])
@pytest.mark.parametrize("with_sample_weight", [False, True], ids=["no_sw", "with_sw"])
@pytest.mark.parametrize("fit_intercept", [False, True], ids=["no_intercept", "with_intercept"])
@pytest.mark.parametrize("n_targets", [1, 2])
def test_ridge_cv_results_predictions(X_shape, with_sample_weight, fit_intercept, n_targets):
    """test_ridge_cv_results_predictions: ``cv_results_`` on the original scale, against a naive leave-one-out
    grid search with Ridge(solver="svd"): blocklin keeps the squared errors ``w_i (y_i - pred_i)^2``."""
    n_samples, n_features = X_shape
    X, y = make_regression(n_samples=n_samples, n_features=n_features, n_targets=n_targets, random_state=0)
    sample_weight = None
    if with_sample_weight:
        sample_weight = np.ones(shape=(X.shape[0],))
        sample_weight[::2] = 0.5
    alphas = np.logspace(-5, 7, 5)
    x = bl.solve(X, y, lam=_grid(alphas), fit_intercept=fit_intercept, sample_weight=sample_weight,
                 store_cv_results=True)
    predictions = np.empty(shape=(*y.shape, len(alphas)))
    for alpha_idx, alpha in enumerate(alphas):
        for idx, (train, test) in enumerate(LeaveOneOut().split(X, y)):
            ridge = Ridge(alpha=alpha, fit_intercept=fit_intercept, solver="svd")
            ridge.fit(X[train], y[train], sample_weight=None if sample_weight is None else sample_weight[train])
            predictions[idx, ..., alpha_idx] = ridge.predict(X[test])
    wv = np.ones(n_samples) if sample_weight is None else sample_weight
    y2 = y.reshape(n_samples, n_targets)
    errors = wv[:, None, None] * (y2[:, :, None] - predictions.reshape(n_samples, n_targets, len(alphas))) ** 2
    assert x.cv_results_.shape == errors.shape
    for i, alpha in enumerate(alphas):
        ref = Ridge(alpha=alpha, fit_intercept=fit_intercept, solver="svd").fit(X, y, sample_weight=sample_weight)
        looe = np.sqrt(errors[:, :, i]).ravel()
        bound = loo_score_bound(X, y, sample_weight, _lam(alpha), fit_intercept, np.asarray(ref.coef_).T,
                                looe) * looe.size
        assert np.abs(x.cv_results_[:, :, i] - errors[:, :, i]).sum() <= bound, f"alpha {alpha}"


@pytest.mark.parametrize("X_shape", [(50, 10), (10, 50)], ids=["tall", "wide"])
def test_ridge_cv_multioutput_sample_weight(X_shape):
    """test_ridge_cv_multioutput_sample_weight: with two targets and unit weights, best_score_ is minus the
    mean squared error of naive leave-one-out refits at alpha_ (the peer's ``neg_mean_squared_error``
    scorer averages over the targets as the default)."""
    n_samples, n_features = X_shape
    X, y = make_regression(n_samples=n_samples, n_features=n_features, n_targets=2, random_state=SEED)
    sample_weight = np.ones(n_samples)
    x = bl.solve(X, y, lam=_grid(ALPHAS), fit_intercept=True, sample_weight=sample_weight)
    ridge = Ridge(alpha=x.report["alpha_"])
    y_pred_loo = np.squeeze([ridge.fit(X[train], y[train], sample_weight=sample_weight[train]).predict(X[test])
                             for train, test in LeaveOneOut().split(X)])
    ref = RidgeCV(alphas=ALPHAS, scoring="neg_mean_squared_error").fit(X, y, sample_weight=sample_weight)
    assert x.report["alpha_"] == pytest.approx(ref.alpha_)
    full = Ridge(alpha=ref.alpha_).fit(X, y)
    looe = (y - y_pred_loo).ravel()
    bound = loo_score_bound(X, y, None, _lam(ref.alpha_), True, full.coef_.T, looe)
    assert abs(x.report["best_score_"] - (-mean_squared_error(y, y_pred_loo))) <= bound


@pytest.mark.parametrize("X_shape", [(50, 10), (10, 50)], ids=["tall", "wide"])
def test_ridge_cv_custom_multioutput_scorer(X_shape):
    """test_ridge_cv_custom_multioutput_scorer: a scorer weighing the second target twice."""
    n_samples, n_features = X_shape
    X, y = make_regression(n_samples=n_samples, n_features=n_features, n_targets=2, random_state=0)

    def custom_error(y_true, y_pred):
        return -np.average(np.mean((y_true - y_pred) ** 2, axis=0), weights=[2, 1])

    x = bl.solve(X, y, lam=_grid(ALPHAS), fit_intercept=True,
                 scoring=lambda est, X_, y_: -custom_error(y_, est.predict(X_)))
    ridge = Ridge(alpha=x.report["alpha_"])
    y_pred_loo = np.squeeze([ridge.fit(X[tr], y[tr]).predict(X[te]) for tr, te in LeaveOneOut().split(X)])
    assert x.report["best_score_"] == pytest.approx(-custom_error(y, y_pred_loo))


# --- schedulers (not a peer case) ---------------------------------------------------------------------------

@pytest.mark.parametrize("scheduler", ["sync", "threads", "processes"])
def test_schedulers(scheduler, tmp_path):
    """The weighted ridge with an intercept, the leave-one-out choice and the positive solution out of core on
    every scheduler: the same bits as ``sync``, and Ridge's / RidgeCV's solution within the bound."""
    rng = np.random.RandomState(42)
    X = rng.rand(1000, 3)
    y = X @ [1, 2, 0.1] + 10 + 0.01 * rng.randn(1000)
    w = rng.uniform(0.5, 2.0, 1000)
    pa = bl.from_array(X, str(tmp_path / "a.zarr"), chunks=(100, 3))
    for kw, ref in (({"lam": _lam(1e-3)}, Ridge(alpha=1e-3).fit(X, y, sample_weight=w)),
                    ({"lam": _grid(ALPHAS)}, RidgeCV(alphas=ALPHAS).fit(X, y, sample_weight=w)),
                    ({"lam": 1.0, "positive": True}, Ridge(alpha=1.0).fit(X, y, sample_weight=w))):  # inactive
        base = least_budget(lambda mem: bl.solve(pa, y, fit_intercept=True, sample_weight=w, memory=mem,
                                                 scheduler="sync", workers=2, **kw))
        assert base.report["memory_budget"] < X.nbytes  # out of core: A streams in strips
        x = bl.solve(pa, y, fit_intercept=True, sample_weight=w, memory=base.report["memory_budget"],
                     scheduler=scheduler, workers=2, **kw)
        assert x.report["scheduler"] == scheduler and np.array_equal(dense(x), dense(base))
        alpha = ref.alpha_ if hasattr(ref, "alpha_") else ref.alpha
        check_solution(x, X, y, ref.coef_, ref.intercept_, _lam(alpha), w=w, fit_intercept=True)


def test_lam_with_a_string_refused():
    """Not a peer case: a string in a lam sequence or leave-one-out grid is refused (NumPy would read "1" as
    1.0), naming lam and the rule."""
    X, y = np.random.RandomState(0).randn(5, 5), np.ones(5)
    for lam in ([1.0, "2"], ("loo", ["1"]), ("loo", np.array(["1", "2"]))):
        with pytest.raises(BlocklinError, match=r"lam: .*must (hold |be )numbers \(a string is not read as one\).*Fix"):
            bl.solve(X, y, lam=lam)


@pytest.mark.parametrize("fit_intercept", [True, False])
def test_cv_fold_with_a_constant_target_scores_as_scikit_learn_does(fit_intercept):
    """``cv=`` with the default ``r2``: a held-out fold whose target is constant scores 0 (scikit-learn's
    ``force_finite``), not the rounding residue of its sums (about -7e15, which moved the choice to the
    other end of the grid); alpha_ and best_score_ are RidgeCV's."""
    rng = np.random.default_rng(0)
    X = rng.standard_normal((30, 4))
    y = X @ rng.standard_normal(4) + 0.3 * rng.standard_normal(30)
    y[10:20] = 0.1  # the second of three folds
    alphas = np.array([0.01, 0.1, 1.0, 10.0, 100.0]) ** 2
    x = bl.solve(X, y, lam=("loo", np.sqrt(alphas)), cv=3, fit_intercept=fit_intercept)
    ref = RidgeCV(alphas=alphas, cv=3, fit_intercept=fit_intercept).fit(X, y)
    assert x.report["alpha_"] == pytest.approx(ref.alpha_, rel=1e-12)
    assert x.report["best_score_"] == pytest.approx(ref.best_score_, rel=1e-9)
    assert x.report["curve"]["fold_scores"][x.report["curve"]["chosen_index"]][1] == 0.0
