"""``solve(lam=("loo", grid), cv=, scoring=)`` of complex data (issue 28; ``blocklin/linalg/solve/kfold.py``,
``scoring.py``, ``loo.py``).

scikit-learn refuses complex input, so the reference is the definition, computed here in complex128 with
NumPy: for every split, the ridge fit on its training rows (weighted means removed with ``fit_intercept``,
rows scaled by ``sqrt(w)``: ``x = (A_t^H W A_t + lam^2 I)^-1 A_t^H W b_t``, intercept ``bbar - mu x``),
the predictions of its held-out rows, and the scorer's definition with ``|.|``: mean squared error
``sum w |r|^2 / sum w`` (root: its square root), mean absolute error ``sum w |r| / sum w``,
``r2 = 1 - sum w |r|^2 / sum w |y - ybar|^2``, explained variance with ``|r - rbar|^2``; the mean over
right-hand sides, then over the folds (``GridSearchCV``'s), or over every row's leave-one-out prediction
(``cv=None``, refitting without each row).

Bounds: tests/solve/test_ridge_kfold.py's :func:`score_bound` with ``A^H`` for ``A^T`` and ``|.|^2`` for
squares, times ``3 sqrt(2)`` for complex arithmetic (Higham 2002, Lemma 3.5). blocklin sums complex64 data
in complex128 and the reference refits the same (exactly widened) data in complex128, so ``eps`` is
float64's for both; ``x`` at the choice carries one more rounding to the data's dtype.
"""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.model_selection import GroupKFold, KFold

import blocklin as bl
from blocklin.errors import BlocklinError
from support.conformance import dense, least_budget
from support.ridge import EPS64
from support.tolerances import eps

COMPLEX = 3 * np.sqrt(2)
GRID = [0.3, 1.0, 3.0, 10.0, 30.0]
SCHEDULERS = ["sync", "threads", "processes"]
NAMED = [None, "neg_mean_squared_error", "neg_root_mean_squared_error", "r2", "explained_variance"]


def _problem(shape, dtype, k=2, seed=0):
    """Offset complex Gaussian columns, a noisy linear complex target with an intercept."""
    rng = np.random.default_rng(seed)
    m, n = shape
    a = rng.standard_normal((m, n)) + 1j * rng.standard_normal((m, n)) + (2.0 - 1.0j)
    coef = rng.standard_normal((n, k)) + 1j * rng.standard_normal((n, k))
    b = a @ coef + (1.0 + 0.5j) + rng.standard_normal((m, k)) + 1j * rng.standard_normal((m, k))
    return a.astype(dtype), b.astype(dtype)


def _weights(m, seed=5):
    return np.random.default_rng(seed).uniform(0.5, 2.0, m)


def _fit(a, b, w, lam, intercept):
    """The definition's fit on the rows given (complex128)."""
    mu = w @ a / w.sum() if intercept else np.zeros(a.shape[1], a.dtype)
    bbar = w @ b / w.sum() if intercept else np.zeros(b.shape[1], b.dtype)
    sw = np.sqrt(w)[:, None]
    ac, bc = (a - mu) * sw, (b - bbar) * sw
    x = np.linalg.solve(ac.conj().T @ ac + lam**2 * np.eye(a.shape[1]), ac.conj().T @ bc)
    return x, bbar - mu @ x


def _score(name, y, p, w):
    """The scorer's definition on complex targets and predictions (rows x k), mean over right-hand sides."""
    if callable(name):
        return name(y, p, w)
    r = y - p
    tot = w.sum()
    if name in ("neg_mean_squared_error", "neg_root_mean_squared_error"):
        mse = w @ np.abs(r) ** 2 / tot
        return float(np.mean(-mse if name == "neg_mean_squared_error" else -np.sqrt(mse)))
    if name == "neg_mean_absolute_error":
        return float(np.mean(-(w @ np.abs(r)) / tot))
    sst = w @ np.abs(y - w @ y / tot) ** 2
    num = w @ np.abs(r) ** 2 if name in (None, "r2") else w @ np.abs(r - w @ r / tot) ** 2
    return float(np.mean(1.0 - num / sst))


def _kfold_ref(a, b, w, splits, intercept, scoring):
    """The mean score over the splits per grid value, by refitting on each split's training rows."""
    a, b = a.astype(np.complex128), b.astype(np.complex128)
    out = []
    for lam in GRID:
        scores = []
        for train, test in splits:
            x, x0 = _fit(a[train], b[train], w[train], lam, intercept)
            scores.append(_score(scoring, b[test], a[test] @ x + x0, w[test]))
        out.append(np.mean(scores))
    return np.array(out)


def score_bound(a, b, w, alpha, splits, intercept, scoring):
    """tests/solve/test_ridge_kfold.py's ``score_bound`` of complex data: per fold the fit's error
    ``delta = 16 n eps cond(K_t) growth`` carried to the held-out sums, the Gram formula's rounding
    ``(n + 2)^2 eps (||b_f||^2 + ||A_f||_2^2 ||x||^2)``, then the score's sensitivity to the sums; times
    ``3 sqrt(2)`` (complex arithmetic)."""
    a, b = a.astype(np.complex128), b.astype(np.complex128)
    total = 0.0
    for train, test in splits:
        wt, wf = w[train], w[test]
        mu = wt @ a[train] / wt.sum() if intercept else 0.0
        ybar = wt @ b[train] / wt.sum() if intercept else 0.0
        ac = (a[train] - mu) * np.sqrt(wt)[:, None]
        s = np.linalg.svd(ac, compute_uv=False)
        smin = s[-1] if ac.shape[0] >= ac.shape[1] else 0.0
        cond = (s[0] ** 2 + alpha) / (smin**2 + alpha)
        growth = 1 + (float(np.max(np.abs(a[train].mean(0)) ** 2 / np.maximum(a[train].var(0), 1e-300)))
                      if intercept else 0.0)
        x, _ = _fit(a[train], b[train], wt, np.sqrt(alpha), intercept)
        sw = np.sqrt(wf)[:, None]
        af, bf = (a[test] - mu) * sw, (b[test] - ybar) * sw
        r = bf - af @ x
        delta = COMPLEX * 16 * max(a.shape) * EPS64 * cond * growth
        dr = np.linalg.norm(af, 2) * delta * np.linalg.norm(x)
        gram = COMPLEX * (a.shape[1] + 2) ** 2 * EPS64 * (np.sum(np.abs(bf) ** 2)
                                                          + np.linalg.norm(af, 2) ** 2 * np.sum(np.abs(x) ** 2)) * growth
        dsse = 2 * np.linalg.norm(r) * dr + dr**2 + gram
        sst = np.min(wf @ np.abs(b[test] - wf @ b[test] / wf.sum()) ** 2)
        if scoring == "neg_mean_absolute_error":
            total += (dr / np.sqrt(wf.sum()) + np.sqrt(gram / wf.sum())) * np.sqrt(wf.max())
        elif scoring == "neg_root_mean_squared_error":  # |d sqrt(s)| <= |ds| / (2 sqrt(s)), s the least mse
            sse = np.min(np.sum(np.abs(r) ** 2, axis=0))  # r: the held-out errors scaled by sqrt(w)
            total += dsse / wf.sum() / (2 * np.sqrt(max(sse - dsse, 1e-300) / wf.sum()))
        else:
            total += dsse / (wf.sum() if scoring == "neg_mean_squared_error" else sst) * (
                2 if scoring == "explained_variance" else 1)
    return total / len(splits) + 1e-13


def _check_choice(x, ref, bounds):
    """The curve within the bounds per grid value; the choice best within the bound of the reference's best."""
    curve = x.report["curve"]
    np.testing.assert_array_less(np.abs(np.asarray(curve["score"]) - ref), bounds)
    i = GRID.index(x.report["lam"])
    assert ref.max() - ref[i] <= 2 * bounds[i] + 2 * bounds[int(np.argmax(ref))]
    assert x.report["lam_rule"] == "cv" and x.report["alpha_"] == x.report["lam"] ** 2
    assert x.report["best_score_"] == curve["score"][i]


def _check_solution(x, a, b, w, intercept, dtype):
    """``x`` at the choice against the definition's fit on every row: the regularized normal equations' bound
    (16 n eps cond(K) growth, times 3 sqrt(2)) plus the rounding to the data's dtype."""
    lam = x.report["lam"]
    a64, b64 = a.astype(np.complex128), b.astype(np.complex128)
    xr, x0 = _fit(a64, b64, w, lam, intercept)
    mu = w @ a64 / w.sum() if intercept else 0.0
    s = np.linalg.svd((a64 - mu) * np.sqrt(w)[:, None], compute_uv=False)
    smin = s[-1] if a.shape[0] >= a.shape[1] else 0.0
    growth = 1 + (float(np.max(np.abs(a64.mean(0)) ** 2 / a64.var(0))) if intercept else 0.0)
    bound = (COMPLEX * 16 * max(a.shape) * EPS64 * (s[0] ** 2 + lam**2) / (smin**2 + lam**2) * growth
             + 2 * eps(dtype)) * np.linalg.norm(xr)
    got = dense(x)
    assert got.dtype == np.dtype(dtype)
    assert np.linalg.norm(got - xr) <= bound
    if intercept:
        assert np.max(np.abs(np.ravel(x.intercept) - x0)) <= np.linalg.norm(mu) * bound + 8 * eps(dtype) * (
            np.linalg.norm(mu) * np.linalg.norm(xr) + np.abs(x0).max())


@pytest.mark.parametrize("weighted", [False, True], ids=["unweighted", "weighted"])
@pytest.mark.parametrize("intercept", [False, True], ids=["no-intercept", "intercept"])
@pytest.mark.parametrize("shape", [(48, 5), (12, 30)], ids=["tall", "wide"])
@pytest.mark.parametrize("dtype", [np.complex64, np.complex128])
def test_kfold_against_refitting(dtype, shape, intercept, weighted):
    """cv=4 (KFold(4)), in memory, every scorer the route takes (tall: from the fold sums; wide: from the
    folds' predictions, mean absolute error too): the curve, the choice and ``x`` against the definition."""
    a, b = _problem(shape, dtype, seed=sum(shape) + intercept + 2 * weighted)
    w = _weights(shape[0]) if weighted else None
    wv = w if weighted else np.ones(shape[0])
    splits = list(KFold(4).split(a))
    names = NAMED + (["neg_mean_absolute_error"] if shape[0] < shape[1] else [])
    for scoring in names:
        x = bl.solve(a, b, lam=("loo", GRID), cv=4, fit_intercept=intercept, sample_weight=w, scoring=scoring)
        ref = _kfold_ref(a, b, wv, splits, intercept, scoring)
        bounds = np.array([score_bound(a, b, wv, lam**2, splits, intercept, scoring or "r2") for lam in GRID])
        _check_choice(x, ref, bounds)
    _check_solution(x, a, b, wv, intercept, dtype)


def test_kfold_wide_callable_given_complex_predictions():
    """Wide a: a callable ``scoring(estimator, X, y)`` is called per fold with the complex predictions (as
    ``X``, through the identity estimator) and targets; its scores against the definition's."""
    a, b = _problem((12, 30), np.complex128, k=1, seed=4)
    seen = []

    def scorer(est, pred, y):
        p = est.predict(pred)
        seen.append((p.dtype, np.shape(y)))
        return -float(np.mean(np.abs(y - p) ** 1.5))

    x = bl.solve(a, b, lam=("loo", GRID), cv=3, fit_intercept=True, scoring=scorer)
    assert all(dt == np.complex128 and sh == (4,) for dt, sh in seen) and len(seen) == 3 * len(GRID)
    ref = _kfold_ref(a, b, np.ones(12), list(KFold(3).split(a)), True,
                     lambda y, p, w: -float(np.mean(np.abs(y[:, 0] - p[:, 0]) ** 1.5)))
    bounds = np.array([score_bound(a, b, np.ones(12), lam**2, list(KFold(3).split(a)), True,
                                   "neg_mean_absolute_error") for lam in GRID])
    _check_choice(x, ref, 1.5 * bounds)  # d|r|^1.5 = 1.5 |r|^0.5 d|r|: within 1.5 x the MAE bound (|r| <= 1 here)
    assert x.report["curve"]["scoring"] == "callable"


@pytest.mark.parametrize("shape", [pytest.param((1200, 4), marks=pytest.mark.slow), (14, 400)], ids=["tall", "wide"])
def test_kfold_out_of_core_on_every_scheduler(shape, tmp_path):
    """At the least budget (tall: the fold pass streams the fold numbers of a non-contiguous GroupKFold;
    wide: ``A A^H`` by the streamed pass), with intercept and weights: the curve of the definition, the same
    bits on every scheduler."""
    a, b = _problem(shape, np.complex128, k=1, seed=9)
    w = _weights(shape[0], seed=3)
    splits = list(GroupKFold(3).split(a, b, np.arange(shape[0]) % 5))
    pa = bl.from_array(a, str(tmp_path / "a.zarr"), chunks=(min(shape[0], 200), min(shape[1], 100)))
    xs = []
    for s in SCHEDULERS:
        xs.append(least_budget(lambda memory: bl.solve(pa, b, lam=("loo", GRID), cv=splits, fit_intercept=True,
                                                       sample_weight=w, scoring="r2", memory=memory, scheduler=s,
                                                       workers=2)))
    assert xs[0].report["memory_budget"] < a.nbytes or shape[0] < shape[1]  # wide: A A^H streamed in tiles
    ref = _kfold_ref(a, b, w, splits, True, "r2")
    bounds = np.array([score_bound(a, b, w, lam**2, splits, True, "r2") for lam in GRID])
    _check_choice(xs[0], ref, bounds)
    for x in xs[1:]:
        assert np.array_equal(dense(x), dense(xs[0])) and x.report["curve"]["score"] == xs[0].report["curve"]["score"]


def _loo_ref(a, b, w, intercept, scoring):
    """Leave-one-out by its definition: each row's prediction by the fit without it, every row scored at once."""
    a, b = a.astype(np.complex128), b.astype(np.complex128)
    m = a.shape[0]
    out = []
    for lam in GRID:
        pred = np.empty_like(b)
        for i in range(m):
            keep = np.arange(m) != i
            x, x0 = _fit(a[keep], b[keep], w[keep], lam, intercept)
            pred[i] = a[i] @ x + x0
        out.append(_score(scoring, b, pred, w))
    return np.array(out), pred


def _loo_bound(a, b, w, intercept, scoring, ref_mse):
    """The leave-one-out errors come from solves with ``K = A_c^H W A_c + lam^2 I`` (or ``A A^H`` wide):
    relative ``delta = 8 n eps cond(K)`` times ``3 sqrt(2)`` norm-wise (Higham Thm 7.2, Lemma 3.5), so the mean
    of squares moves by ``2 delta + delta^2`` relative, ``r2`` and explained variance by that times their
    ``sse / sst`` (twice for explained variance), the mean absolute error by ``delta`` times the root mean
    square; ``cond`` at the grid's smallest lambda."""
    a = a.astype(np.complex128)
    mu = w @ a / w.sum() if intercept else 0.0
    ac = (a - mu) * np.sqrt(w)[:, None]
    g = ac.conj().T @ ac if a.shape[0] >= a.shape[1] else ac @ ac.conj().T
    delta = COMPLEX * 8 * max(a.shape) * EPS64 * np.linalg.cond(g + min(GRID) ** 2 * np.eye(len(g)))
    rel = 2 * delta + delta**2
    b = b.astype(np.complex128)
    sst = np.min(w @ np.abs(b - w @ b / w.sum()) ** 2) / w.sum()
    if scoring in ("neg_mean_squared_error",):
        return rel * ref_mse + 1e-13
    if scoring == "neg_mean_absolute_error":
        return delta * np.sqrt(ref_mse) + 1e-13
    return rel * ref_mse / sst * (2 if scoring == "explained_variance" else 1) + 1e-13


@pytest.mark.parametrize("weighted", [False, True], ids=["unweighted", "weighted"])
@pytest.mark.parametrize("shape", [(30, 4), (10, 25)], ids=["tall", "wide"])
@pytest.mark.parametrize("dtype", [np.complex64, np.complex128])
def test_loo_scoring_against_refitting(dtype, shape, weighted):
    """cv=None with scoring= (the loo kernel's sums of complex errors; wide: from the dual form in memory),
    with intercept: every named scorer and a callable on the complex leave-one-out predictions."""
    a, b = _problem(shape, dtype, k=2, seed=7 + weighted)
    w = _weights(shape[0], seed=8) if weighted else None
    wv = w if weighted else np.ones(shape[0])
    mse, _ = _loo_ref(a, b, wv, True, "neg_mean_squared_error")
    for scoring in ["neg_mean_squared_error", "r2", "explained_variance", "neg_mean_absolute_error"]:
        x = bl.solve(a, b, lam=("loo", GRID), fit_intercept=True, sample_weight=w, scoring=scoring)
        ref, _ = _loo_ref(a, b, wv, True, scoring)
        bounds = _loo_bound(a, b, wv, True, scoring, -mse)
        np.testing.assert_array_less(np.abs(np.asarray(x.report["curve"]["score"]) - ref), bounds)
        i = GRID.index(x.report["lam"])
        assert ref.max() - ref[i] <= 2 * bounds[i] + 2 * bounds[int(np.argmax(ref))]
        assert x.report["best_score_"] == x.report["curve"]["score"][i]
    seen = []

    def scorer(est, pred, y, sample_weight=None):
        seen.append(np.asarray(pred).dtype)
        r = np.abs(y - est.predict(pred)) ** 2
        return -float(np.average(r.mean(axis=1), weights=sample_weight))

    x = bl.solve(a, b, lam=("loo", GRID), fit_intercept=True, sample_weight=w, scoring=scorer)
    assert set(seen) == {np.dtype(np.complex128)}
    bounds = _loo_bound(a, b, wv, True, "neg_mean_squared_error", -mse)
    np.testing.assert_array_less(np.abs(np.asarray(x.report["curve"]["score"]) - mse), bounds)


@pytest.mark.slow  # about 4 s on 2 cores
def test_loo_scoring_out_of_core_on_every_scheduler(tmp_path):
    """Tall a at the least budget: the loo pass's complex sums, the same bits on every scheduler."""
    a, b = _problem((3000, 4), np.complex128, k=1, seed=12)
    pa = bl.from_array(a, str(tmp_path / "a.zarr"), chunks=(100, 4))
    xs = [least_budget(lambda memory: bl.solve(pa, b, lam=("loo", GRID), fit_intercept=True,
                                               scoring="explained_variance", memory=memory, scheduler=s, workers=2))
          for s in SCHEDULERS]
    assert xs[0].report["memory_budget"] < a.nbytes
    wv = np.ones(3000)
    mse = -np.array([_score("neg_mean_squared_error", *_loo_pred(a, b, lam), wv) for lam in GRID])
    ref = np.array([_score("explained_variance", *_loo_pred(a, b, lam), wv) for lam in GRID])
    np.testing.assert_array_less(np.abs(np.asarray(xs[0].report["curve"]["score"]) - ref),
                                 _loo_bound(a, b, wv, True, "explained_variance", mse))
    for x in xs[1:]:
        assert np.array_equal(dense(x), dense(xs[0])) and x.report["curve"]["score"] == xs[0].report["curve"]["score"]


def _loo_pred(a, b, lam):
    """Leave-one-out predictions with an intercept by the hat-matrix identity of the definition's fit:
    ``y_i - e_i / (1 - h_ii)`` of the augmented least squares (exact algebra, computed in complex128)."""
    a, b = a.astype(np.complex128), b.astype(np.complex128)
    m, n = a.shape
    aug = np.hstack([a, np.ones((m, 1))])
    pen = np.diag(np.r_[np.full(n, lam**2), 0.0])
    h = aug @ np.linalg.solve(aug.conj().T @ aug + pen, aug.conj().T)
    e = b - h @ b
    return b, b - e / (1 - np.diag(h).real)[:, None]


def test_tall_kfold_mean_absolute_error_of_complex_data_refused_by_name():
    """Tall a's k-fold scores come from the fold sums: the mean absolute error is refused by name, as of real
    data."""
    a, b = _problem((40, 4), np.complex128, seed=1)
    with pytest.raises(BlocklinError, match=r"scoring: with cv= on a tall a must be one the fold sums give.*Fix"):
        bl.solve(a, b, lam=("loo", GRID), cv=4, scoring="neg_mean_absolute_error")
