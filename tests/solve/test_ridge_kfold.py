"""``solve(lam=("loo", grid), cv=, scoring=)`` against scikit-learn's ``RidgeCV(cv=, scoring=)``, computed here.

The k-fold scores come from the folds' Gram sums (tall ``a``) or from ``A A^T`` (wide ``a``); each fold's fit
is a regularized normal-equations solve, off by ``delta = 16 n eps cond(K_t) growth`` relative (Higham Thm
7.2, tests/support/ridge.py), and the held-out squared error from the Gram formula
``x^T G x - 2 x^T c + ||b||^2`` rounds by ``(n + 2)^2 eps (||b_c||^2 + ||G_c||_2 ||x||^2)``: :func:`score_bound`.
alpha_ must be the same grid value; the solution at it carries tests/support/ridge.py's bound.
"""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.linear_model import Ridge, RidgeCV
from sklearn.metrics import make_scorer, mean_absolute_error
from sklearn.model_selection import GridSearchCV, GroupKFold, KFold, TimeSeriesSplit

import blocklin as bl
from blocklin.errors import BlocklinError
from support.conformance import dense, least_budget
from support.ridge import EPS64, centered, coef_bound, intercept_bound, loo_score_bound, problem, rows_apart

ALPHAS = [1e-3, 0.1, 1.0, 10.0, 100.0]


def _data(m, n, k, seed):
    """tests/support/ridge.py's problem for tall a; a wide one: offset Gaussian columns, a noisy linear target."""
    if m >= n:
        return problem(m, n, k, seed=seed)
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((m, n)) + 3.0
    return a, a @ rng.standard_normal((n, k)) + 1.0 + rng.standard_normal((m, k))


def _grid(alphas=ALPHAS):
    return ("loo", np.sqrt(np.asarray(alphas, dtype=float)))


def score_bound(a, b, alpha, splits, fit_intercept, scoring, w=None):
    """``|best_score_ - ref|`` at one alpha: per fold the fit's error carried to its held-out sums, then the
    score's sensitivity to them (mean squared error: the sums / n_f; r2 and explained variance: / sst_f;
    mean absolute error: ``sum |dr_i| / n_f <= ||dr|| / sqrt(n_f)``). With weights ``w`` the fit is that of
    the rows scaled by ``sqrt(w)`` after the weighted centering (tests/support/ridge.py's ``centered``) and
    the held-out sums are weighted: ``w_f`` replaces the row count, ``sqrt(w_f)`` scales the rows."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64).reshape(len(a), -1)
    w = np.ones(len(a)) if w is None else np.asarray(w, np.float64)
    total = 0.0
    for train, test in splits:
        wt, wf = w[train], w[test]
        ac, bc = centered(a[train], b[train], wt, fit_intercept)
        s = np.linalg.svd(ac, compute_uv=False)
        smin = s[-1] if ac.shape[0] >= ac.shape[1] else 0.0
        cond = (s[0] ** 2 + alpha) / (smin**2 + alpha)
        growth = 1 + (float(np.max(a[train].mean(0) ** 2 / np.maximum(a[train].var(0), 1e-300))) if fit_intercept
                      else 0.0)
        x = np.linalg.solve(ac.T @ ac + alpha * np.eye(a.shape[1]), ac.T @ bc)
        mu = wt @ a[train] / wt.sum() if fit_intercept else 0.0
        ybar = wt @ b[train] / wt.sum() if fit_intercept else 0.0
        sw = np.sqrt(wf)[:, None]
        af, bf = (a[test] - mu) * sw, (b[test] - ybar) * sw
        r = bf - af @ x
        delta = 16 * max(a.shape) * EPS64 * cond * growth
        dr = np.linalg.norm(af, 2) * delta * np.linalg.norm(x)
        gram = (a.shape[1] + 2) ** 2 * EPS64 * (np.sum(bf**2) + np.linalg.norm(af, 2) ** 2 * np.sum(x**2)) * growth
        dsse = 2 * np.linalg.norm(r) * dr + dr**2 + gram
        ym = wf @ b[test] / wf.sum()
        sst = np.min(wf @ (b[test] - ym) ** 2)
        if scoring == "neg_mean_absolute_error":
            total += (dr / np.sqrt(wf.sum()) + np.sqrt(gram / wf.sum())) * np.sqrt(wf.max())
        else:
            total += dsse / (wf.sum() if scoring == "neg_mean_squared_error" else sst) * (
                2 if scoring == "explained_variance" else 1)
    return total / len(splits) + 1e-13


def _check(x, X, y, ref, splits, fit_intercept, scoring, w=None):
    assert x.report["alpha_"] == pytest.approx(ref.alpha_, rel=1e-12)
    assert x.report["lam_rule"] == "cv" and not hasattr(x, "cv_results_")
    bound = score_bound(X, y, ref.alpha_, splits, fit_intercept, scoring or "r2")
    assert abs(x.report["best_score_"] - ref.best_score_) <= bound
    xb = coef_bound(X, y, w, np.sqrt(ref.alpha_), fit_intercept, np.float64, ref.coef_)
    assert np.linalg.norm(dense(x).T.reshape(np.shape(ref.coef_)) - ref.coef_) <= xb
    if fit_intercept:
        ib = intercept_bound(X, w, ref.coef_, np.atleast_1d(ref.intercept_), xb, np.float64)
        assert np.max(np.abs(x.intercept - ref.intercept_)) <= ib


@pytest.mark.parametrize("scoring", [None, "neg_mean_squared_error", "explained_variance"])
@pytest.mark.parametrize("fit_intercept", [True, False])
@pytest.mark.parametrize("shape", [(60, 6), (12, 30)], ids=["tall", "wide"])
def test_kfold_against_ridgecv(shape, fit_intercept, scoring):
    """cv=4 (KFold(4)), in memory: alpha_, best_score_, coef_, intercept_ as RidgeCV(cv=4, scoring=)."""
    X, y = _data(*shape, 2, seed=3)
    ref = RidgeCV(alphas=ALPHAS, cv=4, fit_intercept=fit_intercept, scoring=scoring).fit(X, y)
    x = bl.solve(X, y, lam=_grid(), cv=4, fit_intercept=fit_intercept, scoring=scoring)
    _check(x, X, y, ref, list(KFold(4).split(X)), fit_intercept, scoring)


@pytest.mark.parametrize("scheduler", ["sync", "threads", "processes"])
def test_kfold_out_of_core(scheduler, tmp_path):
    """Tall a streamed at the least budget, folds from a non-contiguous GroupKFold (the fold numbers stream as
    an operand): the same bits on every scheduler, RidgeCV's choice and score."""
    X, y = problem(2000, 5, 1, seed=5)
    groups = np.arange(2000) % 7
    splits = list(GroupKFold(3).split(X, y, groups))
    pa = bl.from_array(X, str(tmp_path / "a.zarr"), chunks=(200, 5))
    base = least_budget(lambda mem: bl.solve(pa, y, lam=_grid(), cv=splits, fit_intercept=True, memory=mem,
                                             scheduler="sync", workers=2))
    assert base.report["memory_budget"] < X.nbytes
    x = bl.solve(pa, y, lam=_grid(), cv=splits, fit_intercept=True, memory=base.report["memory_budget"],
                 scheduler=scheduler, workers=2)
    assert np.array_equal(dense(x), dense(base)) and x.report["best_score_"] == base.report["best_score_"]
    ref = RidgeCV(alphas=ALPHAS, cv=splits, fit_intercept=True).fit(X, y.ravel())
    _check(x, X, y.ravel(), ref, splits, True, None)


@pytest.mark.parametrize("shape", [(40, 5), (8, 20)], ids=["tall", "wide"])
def test_kfold_sample_weight(shape):
    """sample_weight weighs the folds' fits and their scores (GridSearchCV over Ridge, as RidgeCV(cv=) runs it;
    scikit-learn 1.9 passes the weights to the scorer)."""
    X, y = _data(*shape, 1, seed=7)
    y = y.ravel()
    w = np.random.default_rng(2).uniform(0.5, 2.0, shape[0])
    gs = GridSearchCV(Ridge(), {"alpha": ALPHAS}, cv=KFold(4)).fit(X, y, sample_weight=w)
    x = bl.solve(X, y, lam=_grid(), cv=KFold(4), fit_intercept=True, sample_weight=w)
    assert x.report["alpha_"] == pytest.approx(gs.best_params_["alpha"], rel=1e-12)
    bound = score_bound(X, y, gs.best_params_["alpha"], list(KFold(4).split(X)), True, "r2", w=w)
    assert abs(x.report["best_score_"] - gs.best_score_) <= bound


def test_kfold_wide_callable_and_mae():
    """Wide a: every scorer applies (the folds' predictions are in memory), a callable too."""
    X, y = _data(10, 25, 1, seed=1)
    y = y.ravel()
    for scoring in ("neg_mean_absolute_error", make_scorer(mean_absolute_error, greater_is_better=False)):
        ref = RidgeCV(alphas=ALPHAS, cv=5, scoring=scoring).fit(X, y)
        x = bl.solve(X, y, lam=_grid(), cv=5, fit_intercept=True, scoring=scoring)
        assert x.report["alpha_"] == pytest.approx(ref.alpha_, rel=1e-12)
        bound = score_bound(X, y, ref.alpha_, list(KFold(5).split(X)), True, "neg_mean_absolute_error")
        assert abs(x.report["best_score_"] - ref.best_score_) <= bound


def test_kfold_refusals():
    """What cv= does not take is refused by name, with the rule, the value and a fix."""
    X, y = problem(30, 4, 1, seed=0)
    cases = [
        (dict(cv=3, store_cv_results=True), r"store_cv_results: applies to the exact leave-one-out.*Fix"),
        (dict(cv=3, lam_per_target=True), r"lam_per_target: applies to the exact leave-one-out.*Fix"),
        (dict(cv=TimeSeriesSplit(3)), r"cv: each split must train on every row.*Fix"),
        (dict(cv=1), r"cv: as an int must be 2 <= cv <= m = 30.*got 1.*Fix"),
        (dict(cv=3, scoring="neg_mean_absolute_error"), r"scoring: with cv= on a tall a must be one the fold sums.*Fix"),
        (dict(scoring="accuracy"), r"scoring: must be None, one of .*got 'accuracy'.*Fix"),
    ]
    for kw, match in cases:
        with pytest.raises(BlocklinError, match=match):
            bl.solve(X, y, lam=_grid(), fit_intercept=True, **kw)
    with pytest.raises(BlocklinError, match=r"cv: applies to the cross-validated choice.*Fix"):
        bl.solve(X, y, lam=1.0, cv=3)
    with pytest.raises(BlocklinError, match=r"scoring: applies to the cross-validated choice.*Fix"):
        bl.solve(X, y, lam=1.0, scoring="r2")


@pytest.mark.parametrize("shape", [(50, 6), (10, 30)], ids=["tall", "wide"])
def test_loo_scoring_weighted(shape):
    """Leave-one-out (cv=None) with scoring=: the scorer on every row's leave-one-out prediction, weighted by
    sample_weight as RidgeCV hands it to its scorer; best_score_ of neg_mean_squared_error within the
    leave-one-out bound (tests/support/ridge.py), the other scorers' choice the same."""
    X, y = _data(*shape, 1, seed=11)
    y = y.ravel()
    w = np.random.default_rng(4).uniform(0.5, 2.0, shape[0])
    for scoring in ("neg_mean_squared_error", "r2", "explained_variance", "neg_mean_absolute_error",
                    make_scorer(mean_absolute_error, greater_is_better=False)):
        ref = RidgeCV(alphas=ALPHAS, scoring=scoring).fit(X, y, sample_weight=w)
        x = bl.solve(X, y, lam=_grid(), fit_intercept=True, scoring=scoring, sample_weight=w)
        assert x.report["alpha_"] == pytest.approx(ref.alpha_, rel=1e-12)
        if scoring == "neg_mean_squared_error":  # sum w e^2 / sum w: the bound of the mean of m squares, scaled
            full = Ridge(alpha=ref.alpha_).fit(X, y, sample_weight=w)
            looe = np.sqrt(np.maximum(-ref.best_score_, 0) * np.ones(shape[0]))
            bound = loo_score_bound(X, y, w, np.sqrt(ref.alpha_), True, full.coef_, looe) * shape[0] / w.sum()
            assert abs(x.report["best_score_"] - ref.best_score_) <= bound


def test_cli_cv_and_scoring(tmp_path, capsys):
    """``blocklin solve --lambda loo:GRID --cv K --scoring NAME``: RidgeCV(cv=K, scoring=NAME)'s choice and
    score (the bounds of :func:`_check`); a fold count below 2 and an unknown scorer refused by name."""
    import json

    from blocklin.cli.main import main

    X, y = _data(120, 6, 1, seed=5)
    pa, pb = str(tmp_path / "a.zarr"), str(tmp_path / "b.zarr")
    bl.from_array(X, pa, chunks=(40, 6))
    bl.from_array(y, pb)
    grid = ",".join(str(v) for v in np.sqrt(ALPHAS))
    assert main(["solve", pa, pb, "-o", str(tmp_path / "x.zarr"), "--lambda", f"loo:{grid}", "--cv", "4",
                 "--scoring", "neg_mean_squared_error", "--fit-intercept", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    ref = RidgeCV(alphas=ALPHAS, cv=4, scoring="neg_mean_squared_error").fit(X, y.ravel())
    assert out["alpha_"] == pytest.approx(ref.alpha_, rel=1e-12) and out["scoring"] == "neg_mean_squared_error"
    splits = list(KFold(4).split(X))
    assert abs(out["best_score_"] - ref.best_score_) <= score_bound(X, y, ref.alpha_, splits, True,
                                                                     "neg_mean_squared_error")
    with pytest.raises(SystemExit) as exit_:  # argparse's usage error
        main(["solve", pa, pb, "-o", str(tmp_path / "y.zarr"), "--lambda", f"loo:{grid}", "--cv", "1"])
    assert exit_.value.code == 2 and "--cv: must be an integer >= 2" in capsys.readouterr().err
    assert main(["solve", pa, pb, "-o", str(tmp_path / "y.zarr"), "--lambda", f"loo:{grid}", "--scoring",
                 "accuracy"]) != 0
    assert "scoring: must be None, one of" in capsys.readouterr().err
    assert not (tmp_path / "y.zarr").exists()


def test_every_route_carries_the_intercept_attribute():
    """``x.intercept`` exists on every route's result (None without fit_intercept): the in-memory normal
    equations, the stored-Gram route at the least budget, and the square routes (Cholesky, LU)."""
    X, y = _data(400, 30, 1, seed=2)
    assert bl.solve(X, y, lam=0.5).intercept is None
    streamed = least_budget(lambda mem: bl.solve(X, y, lam=0.5, memory=mem))
    assert streamed.intercept is None
    sq = np.random.default_rng(3).standard_normal((40, 40)) + 40 * np.eye(40)
    assert bl.solve(sq, y[:40]).intercept is None
    assert bl.solve(sq @ sq.T, y[:40], assume_a="pos").intercept is None
    fitted = bl.solve(X, y, lam=0.5, fit_intercept=True)
    assert np.shape(fitted.intercept) == (1,)


def test_unpenalized_intercept_of_a_rank_deficient_a_is_the_minimum_norm_solution():
    """``lam=0, fit_intercept=True`` of a tall ``A`` with repeated columns (rank 6 of 9): the minimum-norm
    least-squares solution of the centered problem (NumPy's lstsq, as Ridge(alpha=0)), its rank reported
    and a warning given. Bound: the Gram's eigen-decomposition perturbs the retained part by
    ``n eps ||A_c||_2^2`` (Weyl/Davis-Kahan), so ``x`` moves by ``c n eps kappa_r^2`` relative with
    ``kappa_r = s_1 / s_r`` of the nonzero singular values (the normal equations square it)."""
    rng = np.random.default_rng(0)
    base = rng.standard_normal((400, 6))
    a = np.hstack([base, base[:, :3]])
    b = a @ rng.standard_normal((9, 1)) + 1.0 + 0.1 * rng.standard_normal((400, 1))
    with pytest.warns(UserWarning, match=r"rank 6 of 9.*minimum-norm"):
        x = bl.solve(a, b, lam=0, fit_intercept=True)
    ac, bc = a - a.mean(0), b - b.mean(0)
    ref = np.linalg.lstsq(ac, bc, rcond=None)[0]
    s = np.linalg.svd(ac, compute_uv=False)
    kappa = s[0] / s[5]
    assert x.report["rank"] == 6
    assert np.linalg.norm(dense(x) - ref) <= 16 * 9 * EPS64 * kappa**2 * np.linalg.norm(ref)
    assert abs(float(np.ravel(x.intercept)[0]) - float(b.mean() - a.mean(0) @ ref[:, 0])) <= (
        16 * 9 * EPS64 * kappa**2 * np.linalg.norm(a.mean(0)) * np.linalg.norm(ref) + 4 * 400 * EPS64 * abs(b).max())


def test_kfold_keeps_directions_that_lam_regularizes():
    """A fold's fit at ``lam > 0`` is ``(G_t + lam^2 I)^-1 c_t`` along every eigenvector of the training Gram:
    a direction whose eigenvalue lies below the Gram's rounding ``m eps e_max`` but above the eigensolver's
    ``n eps e_max`` had been dropped as at ``lam = 0``, which changed the held-out error by the whole part of
    ``b`` along it (here half the target) and the score with it, without a warning.

    Exact data: every fold is the same 128 rows of two Hadamard columns scaled by ``1`` and ``2^-22``, so the
    training and held-out Gram matrices are diagonal and exact (``e_2 / e_1 = 2^-44`` against ``m eps = 2^-43``),
    and so are the fits: ``x_j = c_j / (e_j + alpha)``. The score then rounds only in the held-out sums,
    ``(n + 2)^2 eps (||b_f||^2 + ||G_f|| ||x||^2)`` per fold over its ``sst`` (:func:`score_bound`'s Gram term),
    which the fit alone bounds here."""
    from scipy.linalg import hadamard

    block = hadamard(128)[:, 1:3].astype(np.float64) * np.array([1.0, 2.0**-22])
    X = np.vstack([block] * 4)
    rng = np.random.default_rng(4)
    y = X @ np.array([1.0, 2.0**22]) + rng.standard_normal(len(X))
    alphas = [128 * 3 * 2.0**-46, 1.0]  # the training e_1 = 384; e_2 = 384 * 2^-44
    splits = list(KFold(4).split(X))
    ref = RidgeCV(alphas=alphas, cv=4, fit_intercept=False).fit(X, y)
    x = bl.solve(X, y, lam=("loo", np.sqrt(alphas)), cv=4)
    scores = []
    tol = 0.0
    for train, test in splits:
        e = np.sum(X[train] ** 2, axis=0)
        xf = (X[train].T @ y[train]) / (e + alphas[0])
        r = y[test] - X[test] @ xf
        sst = np.sum((y[test] - y[test].mean()) ** 2)
        scores.append(1 - np.sum(r**2) / sst)
        tol += 16 * EPS64 * (np.sum(y[test] ** 2) + np.sum(X[test] ** 2) * np.sum(xf**2)) / sst / len(splits)
    assert ref.alpha_ == alphas[0] and abs(ref.best_score_ - np.mean(scores)) <= tol
    assert x.report["alpha_"] == pytest.approx(ref.alpha_, rel=1e-12)
    assert abs(x.report["best_score_"] - np.mean(scores)) <= tol


@pytest.mark.parametrize("shape", [(9, 2), (3, 5)], ids=["tall", "wide"])
def test_explained_variance_of_one_held_out_row(shape):
    """A held-out set of one row has no variance, of its errors or of its target: ``explained_variance`` is 1
    there by scikit-learn's ``force_finite`` rule (``0 / 0``). Formed from sums, ``sse / n - (se / n)^2`` and a
    weighted target's deviation from its own mean are rounding residues instead: the fold had scored 0, or
    ``1.8e11`` where the residue of ``sst`` was the smaller (weighted, wide), and the choice followed them.
    Every fold here holds out one row (``KFold(m)``), so every grid value scores exactly 1 and the first wins
    (``GridSearchCV``'s rule for ties), weighted or not."""
    m, n = shape
    rng = np.random.default_rng(11)
    X = rng.standard_normal((m, n)) * np.array([1e3, 1e-2, 1, 5, 0.1][:n])
    y = X @ rng.standard_normal((n, 3)) + rng.standard_normal((m, 3)) + 2
    w = rng.uniform(0.5, 3.0, m)
    alphas = [1e-6, 1e-3, 1.0, 1e3]
    for weights in (None, w):
        for fit_intercept in (False, True):
            x = bl.solve(X, y, lam=_grid(alphas), cv=m, scoring="explained_variance", sample_weight=weights,
                         fit_intercept=fit_intercept)
            assert x.report["best_score_"] == 1.0 and x.report["alpha_"] == pytest.approx(alphas[0], rel=1e-12)
            assert np.all(np.asarray(x.report["curve"]["fold_scores"]) == 1.0)
    ref = RidgeCV(alphas=alphas, cv=m, scoring="explained_variance").fit(X, y)
    assert ref.best_score_ == 1.0 and ref.alpha_ == alphas[0]


@pytest.mark.parametrize("fit_intercept", [False, True])
def test_kfold_keeps_directions_that_columns_far_apart_determine(fit_intercept):
    """Columns whose norms are ``1e5`` and ``5e-4`` apart: the training Gram's smallest eigenvalue (``2e-7``) lies
    under the eigen-decomposition's norm-wise cut ``n eps e_max`` (``1e-5``) but is determined by the data (the
    Gram rounds relative to its columns), and at ``lam^2 = 1.9e-6`` the fold fits are refitted from the scaled
    ``D^-1 (G + lam^2 I) D^-1`` (kfold._scaled_fits). The direction had been dropped: the score ``0.0709`` for
    ``0.0641`` without a word (scikit-learn's ``RidgeCV`` agrees with the exact score to 1e-13).

    Reference: each fold's fit and held-out sums in mpmath (60 digits, the data exact). Bound per fold: the
    held-out sums' rounding ``(n + 2)^2 eps (||b_f||^2 + |x|^T |G_f| |x|)`` and the fit's, ``dx`` with
    ``||D dx|| <= (m + n) eps cond(H) ||D x||`` (the Gram's rounding relative to its columns, then Cholesky),
    reaching the sum of squares as ``2 ||r_f|| ||A_f D^-1|| ||D dx||`` (and its square), over ``sst_f``
    (``A_f`` the held-out rows as summed: less the first row with an intercept)."""
    import mpmath as mp

    rng = np.random.default_rng(0)
    m, n = 200, 6
    sc = np.ones(n)
    sc[0], sc[-1] = 1e4, 5e-4
    a = rng.standard_normal((m, n))
    a = a / np.linalg.norm(a, axis=0) * sc + rng.random(n) * sc
    b = a[:, -1] + 1e-4 * rng.standard_normal(m)
    lam2 = 1.9e-6
    x = bl.solve(a, b, lam=("loo", [np.sqrt(lam2), 1.0]), cv=5, fit_intercept=fit_intercept)
    scores, tol = [], 0.0
    for train, test in KFold(5).split(a):
        at, af = (a[train], a[test])
        mu = at.mean(axis=0) if fit_intercept else np.zeros(n)
        bt_mean = b[train].mean() if fit_intercept else 0.0
        with mp.workdps(60):
            ac = mp.matrix((at - mu).tolist()) if not fit_intercept else mp.matrix(
                [[mp.mpf(float(v)) - mp.fsum(mp.mpf(float(u)) for u in at[:, j]) / len(train) for j, v in enumerate(r)]
                 for r in at])
            bc = mp.matrix([mp.mpf(float(v)) - (mp.fsum(mp.mpf(float(u)) for u in b[train]) / len(train)
                                                if fit_intercept else 0) for v in b[train]])
            xm = mp.lu_solve(ac.T * ac + lam2 * mp.eye(n), ac.T * bc)
            x0 = (mp.fsum(mp.mpf(float(u)) for u in b[train]) / len(train) - mp.fsum(
                mp.fsum(mp.mpf(float(u)) for u in at[:, j]) / len(train) * xm[j] for j in range(n))) if fit_intercept else 0
            r = [mp.mpf(float(b[i])) - x0 - mp.fsum(mp.mpf(float(a[i, j])) * xm[j] for j in range(n)) for i in test]
            y = [mp.mpf(float(b[i])) for i in test]
            ym = mp.fsum(y) / len(y)
            sse, sst = float(mp.fsum(v**2 for v in r)), float(mp.fsum((v - ym) ** 2 for v in y))
        scores.append(1 - sse / sst)
        xr = np.array([float(v) for v in xm])
        g = (at - mu).T @ (at - mu)
        d = np.sqrt(np.diag(g) + lam2)
        h = g / np.outer(d, d) + np.diag(lam2 / d**2)
        ddx = (m + n) * EPS64 * np.linalg.cond(h) * np.linalg.norm(d * xr)
        # the held-out sums are taken of the rows less the first row (fit_intercept) and centered from them: their
        # rounding is relative to |a_i - a_1| <= |a_i| + |a_1|, not to the centered rows
        held = np.abs(af) + (np.abs(a[0]) if fit_intercept else 0.0)
        pred = 2 * np.sqrt(sse) * np.linalg.norm(held / d, 2) * ddx
        pred += (np.linalg.norm(held / d, 2) * ddx) ** 2
        sums = (n + 2) ** 2 * EPS64 * (np.sum((np.abs(b[test]) + abs(bt_mean)) ** 2) + np.abs(xr) @ held.T @ held
                                       @ np.abs(xr))
        tol += (pred + sums) / sst / 5
    got = x.report["curve"]["score"][0]
    ref = RidgeCV(alphas=[lam2], cv=5, fit_intercept=fit_intercept).fit(a, b)
    assert abs(ref.best_score_ - np.mean(scores)) <= tol
    assert abs(got - np.mean(scores)) <= tol, (got, np.mean(scores), tol)


def test_wide_kfold_keeps_directions_that_rows_far_apart_determine():
    """A wide ``a`` whose rows' norms are ``1e5`` and ``5e-4`` apart: each fold's kernel ``A_t A_t^T`` rounds
    relative to its rows (``|dK_ij| <= n eps ||a_i|| ||a_j||``), as the tall Gram to its columns, and its
    eigen-decomposition norm-wise (``m eps e_max``, ``e_max`` near ``1e10``). At ``lam^2 = 1e-8`` the smallest
    eigenvalue (``1e-7``) fell under the cut and a fold scored ``0.393`` for ``0.433``; at ``lam^2 = 1e-2`` none was
    cut but the fit from the eigenvalues was ``6e-6`` off where the scaled kernel's condition is 600, the mean
    score ``1.6e-6`` off, no warning (kfold._scaled_fits now refits them; scikit-learn's ``RidgeCV`` 1e-14 off).

    Reference: each fold's dual fit and held-out errors in mpmath (60 digits, the data exact). Bound per fold: the
    fit's ``||dz|| <= (m + n) eps cond(H) ||z||`` of ``z = D y``, ``H = D^-1 (K_t + lam^2 I) D^-1``,
    ``D = diag(sqrt(K_ii + lam^2))`` (the kernel's rounding relative to its rows, then Cholesky), reaching the
    predictions through ``||K_ht D^-1||``, and the cross kernel's own rounding ``n eps |A_h| |A_t|^T |y|``; the
    sum of squares by ``2 ||r|| ||dp|| + ||dp||^2`` plus its own rounding ``m eps sse``, over ``sst``."""
    import mpmath as mp

    rng = np.random.default_rng(0)
    m, n = 20, 40
    a, b = rows_apart(rng, m, n)
    alphas = [1e-8, 1e-2]
    x = bl.solve(a, b, lam=_grid(alphas), cv=5, fit_intercept=False)
    got = np.asarray(x.report["curve"]["fold_scores"])  # L x folds
    for l, lam2 in enumerate(alphas):
        ref = RidgeCV(alphas=[lam2], cv=5, fit_intercept=False).fit(a, b).best_score_
        scores, tols = [], []
        for train, test in KFold(5).split(a):
            with mp.workdps(60):
                at, ah = mp.matrix(a[train].tolist()), mp.matrix(a[test].tolist())
                ym = mp.lu_solve(at * at.T + lam2 * mp.eye(len(train)), mp.matrix(b[train].tolist()))
                r = [mp.mpf(float(b[i])) - p for i, p in zip(test, ah * (at.T * ym))]
                yh = [mp.mpf(float(b[i])) for i in test]
                sse = float(mp.fsum(v**2 for v in r))
                sst = float(mp.fsum((v - mp.fsum(yh) / len(yh)) ** 2 for v in yh))
            scores.append(1 - sse / sst)
            y = np.array([float(v) for v in ym])
            kt = a[train] @ a[train].T
            d = np.sqrt(np.diag(kt) + lam2)
            h = kt / np.outer(d, d) + np.diag(lam2 / d**2)
            dz = (m + n) * EPS64 * np.linalg.cond(h) * np.linalg.norm(d * y)
            dp = np.linalg.norm(a[test] @ a[train].T / d, 2) * dz
            dp += n * EPS64 * np.linalg.norm(np.abs(a[test]) @ np.abs(a[train]).T @ np.abs(y))
            tols.append((2 * np.sqrt(sse) * dp + dp**2 + m * EPS64 * sse) / sst)
        assert abs(ref - np.mean(scores)) <= np.mean(tols), (lam2, ref, np.mean(scores))
        for f in range(5):
            assert abs(got[l][f] - scores[f]) <= tols[f], (lam2, f, got[l][f], scores[f], tols[f])
