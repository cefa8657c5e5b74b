"""Columns of ``b`` far apart in scale on the cross-validated choices that score them: ``cv=k`` (k-fold, tall and
wide) and ``lam="loo"`` with ``scoring=`` (a name or a callable). These took ``b`` at one power of two: columns
``2^1200`` apart were refused (``result_range.refuse_flushed_rhs``), and the tall ``cv=`` with a scale-free score
(``r2``, the default) refused a column ``2^600`` below the other. Each column is now divided by its own power, and
the scores of ``b`` as given are formed from each column's at the largest column's scale
(``scoring.units``): a scale-free score (``r2``) is the mean of the columns' own, a scale-dependent one (squared or
absolute errors) is the large column's, where the small one's part (``2^-600`` or ``2^-1200`` of it) is below the
sum's rounding, as it is of ``b`` as given.

Reference: each column solved alone (``b_j = 2^q_j b'_j``, a normal problem) by the same route on the same grid;
its scores are those of ``b'_j`` times ``2^q_j`` (squared: ``4^q_j``; ``r2``: as they are), exactly in binary
floating point. Both runs are within ``d`` of the exact scores, so they agree within ``2 d``. Bound on one held-out
set's errors ``r_h = b_h - A_h x_t`` (``x_t`` the fit on the training rows at ``lam``): the fit's error
``dx = c n eps cond(K_t) ||x_t|| + c m eps ||b_t|| (||A_t||_F / low + low^(-1/2))`` (Higham 2002, Thms 10.4 and
20.3; ``K_t = A_t^T A_t + lam^2 I`` or the dual ``A_t A_t^T + lam^2 I``, ``low`` its smallest eigenvalue, ``c = 8``,
``n``, ``m`` the larger side), so ``||dr_h|| <= ||A_h||_F dx + c m eps ||b_h||``; then ``d(sse) <= 2 ||r_h|| ||dr_h||
+ ||dr_h||^2``, ``d(sae) <= sqrt(rows) ||dr_h||``, and the scores follow (``r2 = 1 - sse / sst``: ``d(sse) / sst``
plus ``sst``'s rounding ``c m eps``). The leave-one-out's held-out sets are the single rows (the hat-matrix form's
division by ``1 - h_ii`` adds its rounding, ``c n eps cond(K) / min(1 - h_ii)`` relative, to each error).
With ``fit_intercept`` the fits are those of the training rows centered by
their means (``Ridge``'s), whose rounding adds ``c m eps (|bbar| + ||mu|| ||x||)`` to each error, and the
leave-one-out's leverage has the intercept's ``1 / m``. The choice: the grid value of best score of the reference, or one whose reference score is within the tolerance
of it. ``x`` at the choice, column by column, within ``dx`` of NumPy's least squares on ``[A; lam I]``.
"""

from __future__ import annotations

import numpy as np
import pytest

import blocklin as bl
from blocklin.runtime.powers import ldexp

SHAPES = {"tall": (40, 6), "wide": (12, 30)}
APART = [(600, -600), (0, -600), (0, 600)]
GRID = np.logspace(-2, 2, 9)
#: with fit_intercept in the slow job (the same per-column scaling, centered)
INTERCEPT = [pytest.param(False, id="plain"), pytest.param(True, id="intercept", marks=pytest.mark.slow)]
EPS, C = np.finfo(np.float64).eps, 8
TINY = np.finfo(np.float64).smallest_subnormal


def problem(shape, seed):
    rng = np.random.default_rng(seed)
    return rng.standard_normal(shape) + 3, rng.standard_normal((shape[0], 2)) + 5


def ridge(a, b, lam):
    """NumPy's least squares on ``[A; lam I] x = [b; 0]`` (each column alone)."""
    n = a.shape[1]
    aug = np.vstack([a, lam * np.eye(n)])
    return np.linalg.lstsq(aug, np.vstack([b, np.zeros((n, b.shape[1]))]), rcond=None)[0]


def fit_error(a, b, lam):
    """The fit at ``lam`` of each column of ``b`` and the bound ``dx`` on its error (module docstring)."""
    s = np.linalg.svd(a, compute_uv=False)
    low = (s[-1] ** 2 if a.shape[0] >= a.shape[1] else 0.0) + lam ** 2
    cond = (s[0] ** 2 + lam ** 2) / low
    big = max(a.shape)
    x = ridge(a, b, lam)
    dx = C * big * EPS * cond * np.linalg.norm(x, axis=0) + C * big * EPS * np.linalg.norm(b, axis=0) * (
        np.linalg.norm(a) / low + 1 / np.sqrt(low))
    return x, dx


def held_out(a, b, sets, lam, hat=0.0, intercept=False):
    """Per held-out set and column: the sums ``sse``, ``sae``, ``sst`` (about the set's mean), the row count,
    and the bounds on ``sse`` and ``sae`` (module docstring; ``hat``: the relative rounding added to each error).
    With ``intercept`` the fit is that of the training rows centered by their means, its predictions
    ``bbar + (a_i - mu)^T x`` (``Ridge``'s); the means' rounding, ``c m eps (|bbar| + ||mu|| ||x||)`` per row, adds
    to each error."""
    out = []
    m = a.shape[0]
    for held in sets:
        train = np.setdiff1d(np.arange(m), held)
        mu = a[train].mean(axis=0) if intercept else np.zeros(a.shape[1])
        bbar = b[train].mean(axis=0) if intercept else np.zeros(b.shape[1])
        x, dx = fit_error(a[train] - mu, b[train] - bbar, lam)
        ah = a[held] - mu
        r = b[held] - bbar - ah @ x
        rn = np.linalg.norm(r, axis=0)
        means = C * m * EPS * np.sqrt(len(held)) * (np.abs(bbar) + np.linalg.norm(mu) * np.linalg.norm(x, axis=0))
        dr = np.linalg.norm(ah) * dx + C * m * EPS * np.linalg.norm(b[held], axis=0) + hat * rn + means
        sst = ((b[held] - b[held].mean(axis=0)) ** 2).sum(axis=0)
        out.append({"sse": rn ** 2, "sae": np.abs(r).sum(axis=0), "sst": sst, "n": len(held),
                    "dsse": 2 * rn * dr + dr ** 2 + C * m * EPS * rn ** 2, "dsae": np.sqrt(len(held)) * dr})
    return out


def score_bounds(name, stats):
    """Per column: the score over the held-out sets (their mean; one set's for the leave-one-out's pooled rows)
    and its bound."""
    vals, bnds = [], []
    for st in stats:
        n = st["n"]
        if name in (None, "r2"):
            vals.append(1 - st["sse"] / st["sst"])
            bnds.append(st["dsse"] / st["sst"] + C * n * EPS * st["sse"] / st["sst"])
        elif name == "neg_mean_squared_error":
            vals.append(-st["sse"] / n)
            bnds.append(st["dsse"] / n)
        elif name == "neg_mean_absolute_error":
            vals.append(-st["sae"] / n)
            bnds.append(st["dsae"] / n)
        else:
            raise AssertionError(name)
    return np.mean(vals, axis=0), np.mean(bnds, axis=0)


def kfold_sets(m, k):
    sizes = np.full(k, m // k)
    sizes[: m % k] += 1
    edges = np.concatenate([[0], np.cumsum(sizes)])
    return [np.arange(edges[f], edges[f + 1]) for f in range(k)]


def loo_hat(a, lam, intercept=False):
    """The leave-one-out's hat-matrix rounding, relative to each error (module docstring; with ``intercept`` of
    the centered data, the intercept's leverage ``1 / m`` added to ``h_ii``)."""
    a = a - a.mean(axis=0) if intercept else a
    s = np.linalg.svd(a, compute_uv=False)
    low = (s[-1] ** 2 if a.shape[0] >= a.shape[1] else 0.0) + lam ** 2
    kk = a.T @ a + lam ** 2 * np.eye(a.shape[1])
    h = np.einsum("ij,ij->i", a, np.linalg.solve(kk, a.T).T) + (1.0 / a.shape[0] if intercept else 0.0)
    return C * max(a.shape) * EPS * (s[0] ** 2 + lam ** 2) / low / float(np.min(1 - h))


def pooled(stats):
    """The leave-one-out's rows pooled into one held-out set (RidgeCV scores all the rows' predictions at once):
    ``sse``, ``sae`` and their bounds summed, ``sst`` about the mean of all rows (given by the caller)."""
    keys = ("sse", "sae", "dsse", "dsae")
    return {key: sum(st[key] for st in stats) for key in keys}


def check(got, alone, a, b, q, name, sets, loo, intercept=False):
    """The choice, the scores of ``b`` as given and ``x`` at the choice against each column solved alone; each
    column's own score curve (in its units as given) and the bound on it."""
    curve = got.report["curve"]
    m = a.shape[0]
    refs, bnds = [], []
    for j in range(2):  # each column's own score curve (its units as given) and the bound on it
        per_lam, per_bnd = [], []
        for lam in GRID:
            hat = loo_hat(a, lam, intercept) if loo else 0.0
            stats = held_out(a, b[:, j:j + 1], sets, lam, hat, intercept)
            if loo:
                st = pooled(stats) | {"n": m, "sst": ((b[:, j] - b[:, j].mean()) ** 2).sum(keepdims=True)}
                stats = [st]
            v, d = score_bounds(name, stats)
            per_lam.append(float(v[0]))
            per_bnd.append(float(d[0]))
        unit = 0 if name in (None, "r2") else (2 * int(q[j]) if name == "neg_mean_squared_error" else int(q[j]))
        mine = np.asarray(alone[j].report["curve"]["score"])
        refs.append(mine)
        with np.errstate(over="ignore", under="ignore"):
            bnds.append(np.ldexp(np.asarray(per_bnd), unit))
        # the column alone against the sums' bound, in the units given (a score near 2^-1200 is rounded to the
        # subnormals there, within their spacing, as NumPy's of b as given)
        with np.errstate(over="ignore", under="ignore"):
            want = np.ldexp(np.asarray(per_lam), unit)
            ok = (np.isinf(mine) & np.isinf(want)) | (np.abs(mine - want) <= 2 * bnds[-1] + TINY)
        assert ok.all(), (j, mine, per_lam)
    with np.errstate(over="ignore", invalid="ignore"):
        ref = (refs[0] + refs[1]) / 2  # the mean over the columns in the units given (b as given)
        tol = 2 * (bnds[0] + bnds[1]) / 2
    score = np.asarray(curve["score"])
    assert np.array_equal(np.isinf(score), np.isinf(ref)), (score, ref)
    fin = np.isfinite(ref)
    assert np.all(np.abs(score[fin] - ref[fin]) <= tol[fin] + np.abs(ref[fin]) * 4 * EPS + TINY), (score, ref, tol)
    if not loo:
        assert got.report["best_score_"] == score[curve["chosen_index"]]
    # the choice: best of the reference where the scores are finite, else (squared errors near 2^1200, -inf at
    # every lambda as of b as given) the large column's own choice, which the finite scaled sums still rank
    i = curve["chosen_index"]
    big = int(np.argmax(q))
    if fin.all():
        assert ref[i] + tol[i] >= np.max(ref - tol), (i, ref, tol)
    else:
        assert i == alone[big].report["curve"]["chosen_index"], (i, alone[big].report["curve"]["chosen_index"])
    lam = got.report["lam"]
    assert lam == GRID[i]
    x = np.asarray(got)
    pa, pb = (a - a.mean(axis=0), b - b.mean(axis=0)) if intercept else (a, b)
    for j in range(2):
        xr, dx = fit_error(pa, pb[:, j:j + 1], lam)
        assert np.linalg.norm(ldexp(x[:, j], -int(q[j])) - xr[:, 0]) <= 2 * dx[0] + EPS * np.linalg.norm(xr), j
    return refs, bnds


KFOLD = [("tall", None), ("tall", "neg_mean_squared_error"), ("wide", None), ("wide", "neg_mean_squared_error"),
         ("wide", "neg_mean_absolute_error")]  # the tall fold sums give no absolute errors (refused by name)


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("intercept", INTERCEPT)
@pytest.mark.parametrize("route, scoring", KFOLD, ids=[f"{r}-{s or 'r2'}" for r, s in KFOLD])
@pytest.mark.parametrize("q", APART, ids=["2^1200 apart", "2^600 below", "2^600 above"])
def test_kfold_columns_apart(route, scoring, q, intercept):
    """``cv=3``: the fold scores of ``b`` as given (refused before: ``2^1200`` apart on both routes, and with
    ``r2`` a column ``2^600`` from the other on the tall one), the choice and ``x`` at it, against each column
    solved alone."""
    a, b = problem(SHAPES[route], seed=21)
    q = np.array(q)
    kw = {"lam": ("loo", GRID), "cv": 3, "scoring": scoring, "fit_intercept": intercept}
    got = bl.solve(a, ldexp(b, q[None, :]), **kw)
    alone = [bl.solve(a, ldexp(b[:, j:j + 1], int(q[j])), **kw) for j in range(2)]
    check(got, alone, a, b, q, scoring, kfold_sets(a.shape[0], 3), loo=False, intercept=intercept)


def _mse(estimator, x, y):
    return -float(np.mean((estimator.predict(x) - y) ** 2))


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("intercept", INTERCEPT)
@pytest.mark.parametrize("scoring", ["r2", "neg_mean_squared_error", "neg_mean_absolute_error", "callable"])
@pytest.mark.parametrize("q", APART, ids=["2^1200 apart", "2^600 below", "2^600 above"])
@pytest.mark.parametrize("route", sorted(SHAPES))
def test_loo_scoring_columns_apart(route, q, scoring, intercept):
    """``lam="loo"`` with ``scoring=`` (refused ``2^1200`` apart before): the scores of ``b`` as given, the choice
    and ``x`` at it against each column solved alone; named scores per right-hand side too. The callable (minus
    the mean squared error over rows and columns) is scored as ``neg_mean_squared_error``."""
    a, b = problem(SHAPES[route], seed=22)
    q = np.array(q)
    kw = {"lam": ("loo", GRID), "scoring": _mse if scoring == "callable" else scoring, "fit_intercept": intercept}
    got = bl.solve(a, ldexp(b, q[None, :]), **kw)
    alone = [bl.solve(a, ldexp(b[:, j:j + 1], int(q[j])), **kw) for j in range(2)]
    name = "neg_mean_squared_error" if scoring == "callable" else scoring
    refs, bnds = check(got, alone, a, b, q, name, [np.array([i]) for i in range(a.shape[0])], loo=True,
                       intercept=intercept)
    if scoring != "callable":  # each column's own scores, in its units as given
        per = np.asarray(got.report["curve"]["score_per_target"])
        for j in range(2):
            assert np.array_equal(np.isinf(per[:, j]), np.isinf(refs[j])), (j, per[:, j], refs[j])
            fin = np.isfinite(refs[j])
            assert np.all(np.abs(per[fin, j] - refs[j][fin]) <= 2 * bnds[j][fin] + 4 * EPS * np.abs(refs[j][fin]) + TINY), \
                (j, per[:, j], refs[j])
