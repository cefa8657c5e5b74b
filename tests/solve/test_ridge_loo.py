"""solve(lam="loo" | ("loo", grid)) against sklearn.linear_model.RidgeCV (cv=None: its exact leave-one-out).

Ports of scikit-learn's sklearn/linear_model/tests/test_ridge.py: test_ridge_gcv_vs_ridge_loo_cv (alpha_,
coef_, intercept_ of the closed form against RidgeCV), test_ridge_gcv_sample_weights (weighted errors,
cv_results_), test_ridgecv_store_cv_results, test_ridge_alpha_per_target-style per-target choice
(RidgeCV(alpha_per_target=True)), test_ridgecv_alphas_zero / test_ridgecv_negative_alphas (grid values
must be > 0). Tall A is out of core: larger than memory=, streamed in row strips. Bounds: tests/support/ridge.py.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from sklearn.linear_model import RidgeCV

import blocklin as bl
from blocklin.errors import BudgetError, ParameterError
from support.ridge import coef_bound, intercept_bound, loo_score_bound, problem, rows_apart, weights

GRID = np.array([0.3, 1.0, 3.0, 10.0, 30.0, 100.0])  # lam; RidgeCV's alphas are GRID**2
M, N = 4000, 10
MEMORY = "256KiB"  # A is 4000 x 10 float64 = 312.5 KiB: streamed


def reference(a, b, w, fit_intercept, grid=GRID, **kw):
    return RidgeCV(alphas=np.asarray(grid) ** 2, fit_intercept=fit_intercept, **kw).fit(a, b, sample_weight=w)


def check_against(x, ref, a, b, w, fit_intercept, dtype, one_d: bool = False):
    r = x.report
    assert r["lam_rule"] == "loo"
    assert r["alpha_"] == pytest.approx(ref.alpha_, rel=1e-15)
    coef = x.to_numpy().T
    ref_coef = np.asarray(ref.coef_, np.float64).reshape(coef.shape)
    lam = float(np.sqrt(ref.alpha_))
    xb = coef_bound(a, b, w, lam, fit_intercept, dtype, ref_coef)
    assert np.linalg.norm(coef - ref_coef) <= xb
    ac = np.asarray(a, np.float64)
    looe = np.sqrt(-ref.best_score_ * b.size)  # the norm of the errors at the choice, from the mean
    sb = loo_score_bound(a, b, w, lam, fit_intercept, ref_coef, np.full(b.size, looe / np.sqrt(b.size)))
    assert abs(r["best_score_"] - ref.best_score_) <= sb
    if fit_intercept:
        ib = intercept_bound(ac, w, ref_coef, np.atleast_1d(ref.intercept_), xb, dtype)
        assert np.abs(x.intercept - np.atleast_1d(ref.intercept_)).max() <= ib
    else:
        assert x.intercept is None


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("fit_intercept", [False, True])
@pytest.mark.parametrize("k", [1, 3])
@pytest.mark.parametrize("weighted", [False, True])
def test_loo_matches_ridgecv_out_of_core(dtype, fit_intercept, k, weighted, tmp_path):
    """test_ridge_gcv_vs_ridge_loo_cv / test_ridge_gcv_sample_weights: alpha_, best_score_, coef_, intercept_."""
    a, b = problem(M, N, k, seed=k, dtype=dtype)
    memory = 256 * 1024 if dtype == np.float64 else 128 * 1024
    assert a.nbytes > memory  # larger than the budget: the passes stream it
    w = weights(M) if weighted else None
    pa = bl.from_array(a, str(tmp_path / "a.zarr"), chunks=(500, N))
    rhs = b[:, 0] if k == 1 else b
    x = bl.solve(pa, rhs, lam=("loo", GRID), fit_intercept=fit_intercept, sample_weight=w, memory=memory,
                 temp_dir=str(tmp_path))
    ref = reference(a, rhs, w, fit_intercept)
    check_against(x, ref, a, b, w, fit_intercept, dtype)
    assert x.dtype == dtype
    assert 0 < ref.alpha_ and GRID[0] ** 2 < ref.alpha_ < GRID[-1] ** 2  # an interior choice: a real test
    assert "leave-one-out pass" in x.report["phases"]


@pytest.mark.parametrize("fit_intercept", [False, True])
@pytest.mark.parametrize("weighted", [False, True])
def test_cv_results_match(fit_intercept, weighted, tmp_path):
    """test_ridgecv_store_cv_results: the squared errors per row, target and alpha (m x k x L)."""
    a, b = problem(1500, 6, 2, seed=4)
    w = weights(1500) if weighted else None
    x = bl.solve(a, b, lam=("loo", GRID), fit_intercept=fit_intercept, sample_weight=w, store_cv_results=True,
                 memory="1MiB", temp_dir=str(tmp_path))
    ref = reference(a, b, w, fit_intercept, store_cv_results=True)
    got = x.cv_results_
    assert got.shape == ref.cv_results_.shape == (1500, 2, len(GRID))
    assert x.report["cv_results_"] is got
    for i, lam in enumerate(GRID):  # per alpha, the bound of the mean of squares, times m k for the sum
        r = RidgeCV(alphas=[lam**2], fit_intercept=fit_intercept).fit(a, b, sample_weight=w)
        looe = np.sqrt(ref.cv_results_[:, :, i]).ravel()
        bound = loo_score_bound(a, b, w, lam, fit_intercept, r.coef_.T, looe) * looe.size
        assert np.abs(got[:, :, i] - ref.cv_results_[:, :, i]).sum() <= bound
    assert np.allclose(x.report["curve"]["loo"], ref.cv_results_.mean(axis=(0, 1)), rtol=1e-9, atol=0)


def test_per_target(tmp_path):
    """RidgeCV(alpha_per_target=True): one lambda per column, its own coefficients and score."""
    rng = np.random.default_rng(5)
    a, b = problem(M, N, 3, seed=5)
    b[:, 1] += 6 * rng.standard_normal(M)  # a noisier target wants a larger lambda
    x = bl.solve(a, b, lam=("loo", GRID), lam_per_target=True, memory=MEMORY, temp_dir=str(tmp_path))
    ref = reference(a, b, None, False, alpha_per_target=True)
    r = x.report
    assert r["alpha_"] == pytest.approx(list(ref.alpha_), rel=1e-15) and len(set(r["alpha_"])) > 1
    assert r["lam_per_target"] is True and len(r["lam"]) == 3
    coef = x.to_numpy().T
    for j, alpha in enumerate(ref.alpha_):
        bound = coef_bound(a, b[:, j], None, float(np.sqrt(alpha)), False, np.float64, ref.coef_[j])
        assert np.linalg.norm(coef[j] - ref.coef_[j]) <= bound
    assert np.allclose(r["best_score_"], ref.best_score_, rtol=1e-9, atol=0)


def test_default_grid_and_qr_route(tmp_path):
    """lam="loo": the grid spans the spectrum; the choice is RidgeCV's on that grid (one pass more than
    the Gram pass); method="qr" takes the same errors from the SVD of the streaming R."""
    a, b = problem(M, N, 2, seed=6)
    x = bl.solve(a, b, lam="loo", memory=MEMORY, temp_dir=str(tmp_path))
    curve = x.report["curve"]
    grid = np.asarray(curve["lam"])
    assert curve["grid"] == "default" and curve["at_grid_end"] is None and len(grid) > 100
    ref = reference(a, b, None, False, grid=grid)
    scores = np.asarray(curve["loo"])
    i = int(np.argmin(scores))
    assert x.report["lam"] == grid[i]
    j = int(np.argmin(np.abs(np.asarray(grid) ** 2 - ref.alpha_)))  # a tie within rounding may pick a neighbour
    assert i == j or abs(scores[i] - scores[j]) <= 1e-12 * scores[i]
    assert x.report["passes"] == 2 + x.report.get("refine_steps", 0)  # Gram pass, leave-one-out pass
    q = bl.solve(a, b, lam=("loo", GRID), method="qr", memory=MEMORY, temp_dir=str(tmp_path))
    assert q.report["method"] == "qr"
    check_against(q, reference(a, b, None, False), a, b, None, False, np.float64)


@pytest.mark.parametrize("fit_intercept", [False, True])
@pytest.mark.parametrize("weighted", [False, True])
def test_wide_loo_in_memory(fit_intercept, weighted, tmp_path):
    """Wide A: RidgeCV's gram mode (kernel form) from the eigen-decomposition of A A^T in memory."""
    rng = np.random.default_rng(7)
    a = rng.standard_normal((60, 150)) + 2.0
    b = a @ rng.standard_normal((150, 2)) * 0.1 + 1.0 + rng.standard_normal((60, 2))
    w = weights(60, zeros=2) if weighted else None
    grid = np.array([1.0, 3.0, 10.0, 30.0, 100.0])
    x = bl.solve(a, b, lam=("loo", grid), fit_intercept=fit_intercept, sample_weight=w, store_cv_results=True,
                 memory="256KiB", temp_dir=str(tmp_path))
    ref = reference(a, b, w, fit_intercept, grid=grid, store_cv_results=True)
    assert x.report["orientation"] == "wide" and x.report["alpha_"] == pytest.approx(ref.alpha_, rel=1e-15)
    lam = float(np.sqrt(ref.alpha_))
    # the dual problem's matrix is A_c A_c^T + lam^2 I (m x m): its condition bounds the forward error
    ac = np.asarray(a, np.float64) - (np.average(a, axis=0, weights=w) if fit_intercept else 0)
    s = np.linalg.svd(ac * np.sqrt(w if weighted else np.ones(60))[:, None], compute_uv=False)
    cond = (s[0] ** 2 + lam**2) / (s[-1] ** 2 + lam**2)
    bound = 16 * 60 * np.finfo(float).eps * cond * np.linalg.norm(ref.coef_) * (1 + 2.0**2 * fit_intercept)
    assert np.linalg.norm(x.to_numpy().T - ref.coef_) <= bound
    rel = 16 * 60 * np.finfo(float).eps * cond ** 2
    assert np.abs(x.cv_results_ - ref.cv_results_).max() <= rel * ref.cv_results_.max()


@pytest.mark.parametrize("scheduler", ["sync", "threads", "processes"])
def test_schedulers_same_bits(scheduler, tmp_path):
    """Every scheduler gives the same choice and the same bits (strips fixed by the data)."""
    a, b = problem(M, N, 2, seed=8)
    w = weights(M)
    pa = bl.from_array(a, str(tmp_path / "a.zarr"), chunks=(500, N))
    x = bl.solve(pa, b, lam=("loo", GRID), fit_intercept=True, sample_weight=w, memory=MEMORY, scheduler=scheduler,
                 workers=2, temp_dir=str(tmp_path))
    ref = bl.solve(pa, b, lam=("loo", GRID), fit_intercept=True, sample_weight=w, memory=MEMORY, scheduler="sync",
                   workers=2, temp_dir=str(tmp_path))
    assert x.report["scheduler"] == scheduler
    assert np.array_equal(x.to_numpy(), ref.to_numpy()) and x.report["alpha_"] == ref.report["alpha_"]
    check_against(x, reference(a, b, w, True), a, b, w, True, np.float64)


def test_refusals(tmp_path):
    a, b = problem(400, 5, 1)
    for bad in (("loo", [0.0, 1.0]), ("loo", [-1.0]), ("loo", [np.nan]), ("loo", []), ("gcv", [1.0])):
        with pytest.raises(ParameterError, match="lam.*Fix"):
            bl.solve(a, b, lam=bad, temp_dir=str(tmp_path))
    with pytest.raises(ParameterError, match="lam_per_target.*applies to the leave-one-out.*Fix"):
        bl.solve(a, b, lam=1.0, lam_per_target=True, temp_dir=str(tmp_path))
    with pytest.raises(ParameterError, match="store_cv_results.*Fix"):
        bl.solve(a, b, lam="gcv", store_cv_results=True, temp_dir=str(tmp_path))
    with pytest.raises(ParameterError, match="positive.*needs lam given.*Fix"):
        bl.solve(a, b, lam="loo", positive=True, temp_dir=str(tmp_path))
    with pytest.raises(ParameterError, match="updatable.*lam='loo'.*Fix"):
        bl.solve(a, b, lam="loo", updatable=True, out=str(tmp_path / "x.zarr"), temp_dir=str(tmp_path))
    with pytest.raises(ParameterError, match="lam.*must be 0 with assume_a"):
        bl.solve(a[:5], b[:5], lam="loo", assume_a="pos", temp_dir=str(tmp_path))
    big, bb = problem(M, N, 2)
    with pytest.raises(BudgetError, match="every step of the least-squares solve.*cv_results_.*got 375.00 KiB.*raise memory= to at least"):
        bl.solve(big, bb, lam=("loo", GRID), store_cv_results=True, memory=MEMORY, temp_dir=str(tmp_path))


def stored_sparse(path: str):
    """A small blocklin-csr group (two row blocks)."""
    import scipy.sparse as sp

    from blocklin.storage.sparse import SparseWriter

    x = sp.random(300, 20, density=0.2, random_state=0, format="csr")
    w = SparseWriter(path, x.shape, x.dtype, entry_chunk=128, row_chunk=32)
    for r0 in (0, 150):
        blk = x[r0:r0 + 150]
        w.write_rows(r0, r0 + 150, blk.indptr, blk.indices, blk.data)
    w.commit()
    return bl.open(path)


def test_sparse_refused(tmp_path):
    s = stored_sparse(str(tmp_path / "s.zarr"))
    with pytest.raises(ParameterError, match="lam.*not available for a stored sparse a.*Fix"):
        bl.solve(s, np.ones(300), lam="loo", temp_dir=str(tmp_path))


def test_cli_loo(tmp_path, capsys):
    from blocklin.cli.main import main

    a, b = problem(M, N, 1, seed=9)
    w = weights(M)
    pa, pb, pw = str(tmp_path / "a.zarr"), str(tmp_path / "b.zarr"), str(tmp_path / "w.npy")
    bl.from_array(a, pa, chunks=(500, N))
    bl.from_array(b, pb)
    np.save(pw, w)
    grid = ",".join(str(v) for v in GRID)
    assert main(["solve", pa, pb, "-o", str(tmp_path / "x.zarr"), "--lambda", f"loo:{grid}", "--fit-intercept",
                 "--sample-weight", pw, "--memory", MEMORY, "--explain"]) == 0
    text = capsys.readouterr().out
    assert "leave-one-out: one more pass" in text and "sample_weight" in text
    assert main(["solve", pa, pb, "-o", str(tmp_path / "x.zarr"), "--lambda", f"loo:{grid}", "--fit-intercept",
                 "--sample-weight", pw, "--memory", MEMORY, "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    ref = reference(a, b[:, 0], w, True)
    assert out["alpha_"] == pytest.approx(ref.alpha_, rel=1e-15) and out["sample_weight"] is True
    assert out["best_score_"] == pytest.approx(ref.best_score_, rel=1e-9)


def _refit_loo(a, b, lam, intercept):
    """The mean squared leave-one-out error by refitting without each row, in float64: ridge on the kept
    rows centered by their means (the intercept unpenalized) as the least squares problem
    ``[A_c; lam I] x = [b_c; 0]`` (backward stable), its minimum-norm solution for ``lam = 0``."""
    m, n = a.shape
    errs = []
    for i in range(m):
        keep = np.arange(m) != i
        z, y = a[keep], b[keep]
        zbar, ybar = (z.mean(axis=0), y.mean()) if intercept else (np.zeros(n), 0.0)
        z, y = z - zbar, y - ybar
        if lam > 0:
            z, y = np.vstack([z, lam * np.eye(n)]), np.concatenate([y, np.zeros(n)])
        x = np.linalg.lstsq(z, y, rcond=None)[0]
        errs.append(ybar + (a[i] - zbar) @ x - b[i])
    return float(np.mean(np.square(errs)))


@pytest.mark.parametrize("method", ["auto", "qr"])
@pytest.mark.parametrize("shape,intercept", [((16, 16), False), ((16, 16), True), ((17, 16), True),
                                             ((12, 30), True)], ids=["square", "square-intercept",
                                                                     "n+1-intercept", "wide-intercept"])
def test_loo_where_the_fit_interpolates(shape, intercept, method, tmp_path):
    """Where the fit reproduces every row as ``lam -> 0`` (``m <= rank + intercept``) every ``1 - h_ii``
    and ``e_i`` tends to 0; formed as differences they kept rounding of order ``n eps``, and at the
    grid's low end the errors were 1e-3 to 1 off (a square A with ``fit_intercept`` scored ``1e-30``
    where refits give 81; a wide one infinite). Now both are taken from their ``lam^2`` terms
    (``loo.ratio_params``) and the intercept's direction leaves the wide spectrum before any sum
    (``loo.without_intercept``).

    References: refits without each row (:func:`_refit_loo`) on the default grid from ``1e-3 s_max``
    up (least squares of condition at most ``1e3``), and at the grid's first value the ``lam = 0`` limit
    (minimum-norm refits), from which the curve differs by ``O(lam^2 / s_min^2)``, about 1e-10 there. A has
    condition 10, so both sides carry relative errors of order ``n eps kappa^2`` (the Gram route's
    eigenvalues, the references' least squares) ~ 4e-13; ``rtol = 1e-8`` leaves four decades for the
    cancellation in a row's error ``prediction - b_i``."""
    rng = np.random.default_rng(11)
    m, n = shape
    q1, q2 = np.linalg.qr(rng.standard_normal((m, m)))[0], np.linalg.qr(rng.standard_normal((n, n)))[0]
    a = (q1[:, :min(m, n)] * np.logspace(0, -1, min(m, n))) @ q2[:, :min(m, n)].T * 3.0
    b = rng.standard_normal(m) + 0.5
    x = bl.solve(a, b, lam="loo", fit_intercept=intercept, method=method, temp_dir=str(tmp_path))
    curve = x.report["curve"]
    grid, loo = np.asarray(curve["lam"]), np.asarray(curve["loo"])
    assert np.isfinite(loo).all() and x.report["best_score_"] == -loo[curve["chosen_index"]]
    smax = np.linalg.norm(a, 2)
    assert grid[0] <= 2e-6 * smax  # where the differences' rounding was 1e-3 of the errors
    limit = _refit_loo(a, b, 0.0, intercept)
    assert abs(loo[0] - limit) <= 1e-8 * limit, (loo[0], limit)
    for j in range(0, len(grid), 7):
        if grid[j] >= 1e-3 * smax:
            ref = _refit_loo(a, b, grid[j], intercept)
            assert abs(loo[j] - ref) <= 1e-8 * ref, (grid[j], loo[j], ref)


def _conditioned(m, n, seed):
    """``m x n`` of condition 10 (singular values 3 ... 0.3), and ``b``."""
    rng = np.random.default_rng(seed)
    q1, q2 = np.linalg.qr(rng.standard_normal((m, m)))[0], np.linalg.qr(rng.standard_normal((n, n)))[0]
    a = (q1[:, :min(m, n)] * np.logspace(0, -1, min(m, n))) @ q2[:, :min(m, n)].T * 3.0
    return a, rng.standard_normal(m) + 0.5


@pytest.mark.parametrize("shape,intercept", [((16, 16), False), ((17, 16), True), ((40, 5), True)],
                         ids=["square", "n+1-intercept", "tall"])
def test_loo_with_a_row_of_weight_zero(shape, intercept, tmp_path):
    """A row of ``sample_weight`` 0 counts 0, as in ``RidgeCV``. Where the fit interpolates (square ``A``,
    ``m = n + 1`` with an intercept: ``loo.ratio_params``) its error had been ``0 / 0``: ``best_score_`` NaN,
    ``alpha_`` the grid's first value whatever the data (``RidgeCV``: 10 of (0.1, 1, 10)). ``A`` has
    condition 10, so the scores carry ``n eps kappa^2`` relative errors on each side (the bound of
    ``test_loo_where_the_fit_interpolates``: ``rtol = 1e-8`` leaves decades for the rows' cancellations)."""
    a, b = _conditioned(*shape, seed=5)
    w = np.random.default_rng(6).uniform(0.5, 2.0, shape[0])
    w[3] = 0.0
    alphas = np.array([0.01, 0.1, 1.0, 10.0])
    x = bl.solve(a, b, lam=("loo", np.sqrt(alphas)), fit_intercept=intercept, sample_weight=w,
                 store_cv_results=True, temp_dir=str(tmp_path))
    ref = RidgeCV(alphas=alphas, fit_intercept=intercept, store_cv_results=True).fit(a, b, sample_weight=w)
    assert x.report["alpha_"] == pytest.approx(ref.alpha_, rel=1e-15)
    assert x.report["best_score_"] == pytest.approx(ref.best_score_, rel=1e-8)
    got, want = x.cv_results_[:, 0, :], ref.cv_results_
    assert np.isfinite(got).all() and np.linalg.norm(got - want) <= 1e-8 * np.linalg.norm(want)


def _weighted_mse(estimator, x, y, sample_weight=None):
    from sklearn.metrics import mean_squared_error

    return -mean_squared_error(y, estimator.predict(x), sample_weight=sample_weight)


@pytest.mark.parametrize("shape", [(40, 5), (16, 16)], ids=["tall", "square"])
def test_callable_scoring_with_a_row_of_weight_zero(shape, tmp_path):
    """A callable scorer gets every row's leave-one-out prediction; a row of weight 0 changes no fit, so
    its prediction is the full fit's. It had been ``0 / 0`` (a NaN the scorer refused; scikit-learn's
    ``RidgeCV`` fails the same way there). Reference: refits of ``Ridge(alpha, sample_weight)`` without each
    row, scored by the same callable; ``rtol`` as in the test above."""
    from sklearn.linear_model import Ridge

    a, b = _conditioned(*shape, seed=7)
    w = np.random.default_rng(8).uniform(0.5, 2.0, shape[0])
    w[3] = 0.0
    alphas = np.array([0.1, 1.0, 10.0])
    x = bl.solve(a, b, lam=("loo", np.sqrt(alphas)), fit_intercept=True, sample_weight=w, scoring=_weighted_mse,
                 temp_dir=str(tmp_path))
    scores = []
    for alpha in alphas:
        pred = np.array([Ridge(alpha=alpha).fit(np.delete(a, i, 0), np.delete(b, i), sample_weight=np.delete(w, i))
                         .predict(a[i:i + 1])[0] for i in range(shape[0])])
        scores.append(-np.average((b - pred) ** 2, weights=w))
    best = int(np.argmax(scores))
    assert x.report["alpha_"] == pytest.approx(alphas[best], rel=1e-15)
    assert x.report["best_score_"] == pytest.approx(scores[best], rel=1e-8)


def test_callable_scoring_with_a_row_of_weight_zero_on_wide_a_is_refused(tmp_path):
    """The wide route's weighted ``A A^T`` has that row 0: its full-fit prediction is not there."""
    a, b = _conditioned(10, 30, seed=9)
    w = np.ones(10)
    w[2] = 0.0
    with pytest.raises(ParameterError, match="scoring: a callable on a wide a needs every row's leave-one-out"):
        bl.solve(a, b, lam=("loo", [0.3, 1.0]), sample_weight=w, scoring=_weighted_mse, temp_dir=str(tmp_path))


@pytest.mark.parametrize("scoring", ["r2", "explained_variance"])
@pytest.mark.parametrize("cv", [None, 5])
def test_constant_target_scores_as_a_perfect_fit(scoring, cv):
    """A constant target with an intercept is fitted exactly by every lambda: each held-out error is 0, and
    scikit-learn's rule for a target of no variance scores a zero error 1.0 (its k-fold does; its
    leave-one-out's errors near 1e-16 score 0.0 by rounding). The sums of the target less its first value
    are exactly 0 here, so blocklin's errors are too (the sums of the uncentered target had left 1e-16)."""
    a = np.random.default_rng(0).standard_normal((50, 4))
    b = np.full(50, 3.7)
    x = bl.solve(a, b, lam=("loo", [0.1, 1.0, 10.0]), fit_intercept=True, scoring=scoring,
                 **({"cv": cv} if cv else {}))
    assert x.report["best_score_"] == 1.0
    assert np.array_equal(x.to_numpy(), np.zeros((4, 1))) and x.report["intercept"] == [3.7]


def test_loo_keeps_a_direction_whose_squares_underflow_in_the_scaled_problem():
    """Columns ``2^600`` apart and nearly collinear: the scaled problem's small singular value and the grid's
    ``lam`` are near ``1e-189``, so ``p_ij^2`` and ``1 / (s^2 + lam^2)`` left float64 and the leave-one-out
    pass left that direction out: every grid value scored the same (4% off at ``lam = 1e29``) and the first
    one was chosen, ``alpha_ = 1e58`` where the exact leave-one-out choice is ``1e80``.

    Reference: ``e_i / (1 - h_ii)`` with ``h_ii = a_i^T (A^T A + lam^2 I)^-1 a_i`` in mpmath at 800 digits
    (``A^T A`` spans ``2^1200``). The SVD of the streaming ``R`` has a column-wise backward error of
    ``O(m n eps)`` (Higham 2002, Thm. 19.4); the errors' relative sensitivity to it is bounded by the
    condition of the column-equilibrated ``[A D^-1; lam D^-1]`` (at most 1e7 here) squared through the
    ``1 / (1 - h_ii)`` factor: 1e-6 relative leaves room (measured 3e-10)."""
    import mpmath as mp

    rng = np.random.default_rng(0)
    m = 40
    a = rng.standard_normal((m, 2)) + 1e8
    a[:, 1] *= 2.0 ** 600
    a *= 1e30
    b = rng.standard_normal((m, 1)) * 1e30
    grid = [1e29, 2.3e30, 1e32, 1e34, 1e38, 1e40]
    ref = []
    with mp.workdps(800):
        A, B = mp.matrix(a.tolist()), mp.matrix(b.tolist())
        for lam in grid:
            g = A.T * A + mp.mpf(lam) ** 2 * mp.eye(2)
            det = g[0, 0] * g[1, 1] - g[0, 1] * g[1, 0]
            gi = mp.matrix([[g[1, 1], -g[0, 1]], [-g[1, 0], g[0, 0]]]) / det
            x = gi * (A.T * B)
            total = 0
            for i in range(m):
                h = (A[i, :] * gi * A[i, :].T)[0]
                total += ((B[i] - (A[i, :] * x)[0]) / (1 - h)) ** 2
            ref.append(float(total / m))
    ref = np.array(ref)
    x = bl.solve(a, b, lam=("loo", grid))
    assert np.allclose(x.report["curve"]["loo"], ref, rtol=1e-6, atol=0), (x.report["curve"]["loo"], ref)
    assert x.report["alpha_"] == grid[int(np.argmin(ref))] ** 2
    assert np.isclose(x.report["best_score_"], -ref.min(), rtol=1e-6)


@pytest.mark.parametrize("weighted,method", [(False, "auto"), (True, "auto"), (False, "qr")])
def test_wide_loo_from_the_row_scaled_kernel_where_rows_are_far_apart(weighted, method):
    """A wide ``a`` whose rows' norms are ``1e5`` and ``5e-4`` apart (no intercept): ``K = A A^T`` rounds relative
    to its rows (``|dK_ij| <= n eps ||a_i|| ||a_j||``), its eigen-decomposition norm-wise (``m eps e_max``,
    ``e_max`` near ``1e11``). The leave-one-out errors from the eigenvalues had been ``8.7e-5`` off at
    ``lam^2 = 1e-8`` and ``4.4e-6`` at ``1e-2`` where the row-scaled kernel's condition is about 1e3 (scikit-learn's
    ``RidgeCV`` as far off); ``c`` and ``diag((K + lam^2 I)^-1)`` now come from its Cholesky (loo._rows_apart).
    ``method="qr"`` (no weights) keeps the SVD of the streaming ``R``, its values to ``eps ||A||``: ``1.3e-10`` and
    ``2.3e-11`` off, within the same bound.

    Reference: refitting without each row in mpmath (60 digits, the data exact), the weights as ``sqrt(w)`` on the
    rows. Bound per row: ``z = D c`` off by ``delta ||z||`` and ``(H^-1)_ii`` by ``delta ||H^-1||``,
    ``delta = (m + n) eps cond(H)`` (``H = D^-1 (K + lam^2 I) D^-1``, ``D = diag(sqrt(K_ii + lam^2))``, the kernel's
    rounding relative to its rows, then Cholesky), so the error ``c_i / d_i`` by ``rel_i = delta (||z|| / (D_ii |c_i|)
    + ||H^-1|| / (H^-1)_ii)`` and its square by ``2 rel_i + rel_i^2``; plus the mean's own rounding ``m eps``."""
    import mpmath as mp

    rng = np.random.default_rng(0)
    m, n = 20, 40
    a, b = rows_apart(rng, m, n)
    w = rng.uniform(0.5, 2.0, m) if weighted else np.ones(m)
    alphas = [1e-8, 1e-2]
    x = bl.solve(a, b, lam=("loo", np.sqrt(alphas)), fit_intercept=False, sample_weight=w if weighted else None,
                 method=method)
    eps = np.finfo(np.float64).eps
    sw = np.sqrt(w)
    aw, bw = sw[:, None] * a, sw * b
    kernel = aw @ aw.T
    for l, lam2 in enumerate(alphas):
        errs = []
        for i in range(m):
            tr = np.setdiff1d(np.arange(m), [i])
            with mp.workdps(60):
                at = mp.matrix(aw[tr].tolist())
                y = mp.lu_solve(at * at.T + lam2 * mp.eye(m - 1), mp.matrix(bw[tr].tolist()))
                p = mp.fsum(mp.mpf(float(aw[i, j])) * v for j, v in enumerate(at.T * y))
                errs.append(float((mp.mpf(float(bw[i])) - p) ** 2))
        ref = np.mean(errs)
        d = np.sqrt(np.diag(kernel) + lam2)
        h = kernel / np.outer(d, d) + np.diag(lam2 / d**2)
        hinv = np.linalg.inv(h)
        z = np.linalg.solve(h, bw / d)
        delta = (m + n) * eps * np.linalg.cond(h)
        rel = delta * (np.linalg.norm(z) / np.abs(z) + np.linalg.norm(hinv, 2) / np.diag(hinv))
        tol = np.mean(np.asarray(errs) * (2 * rel + rel**2)) + m * eps * ref
        got = x.report["curve"]["loo"][l]
        assert abs(got - ref) <= tol, (lam2, got, ref, tol)
        if not weighted and method == "auto":  # RidgeCV's own closed form from the eigenvalues is as far off as blocklin's had been
            sk = RidgeCV(alphas=[lam2], fit_intercept=False, store_cv_results=True).fit(a, b)
            assert abs(sk.cv_results_.mean() - ref) <= 1e-3 * ref


def _refit_loo_intercept(a, b, w, lam2):
    """Each row's weighted squared leave-one-out error with an unpenalized intercept, refitting without it in mpmath
    (60 digits, the data exact): the kept rows' bordered system ``[[S A A^T S + lam^2 I, u], [u^T, 0]] [y; x0] =
    [S b; 0]`` (``u = sqrt(w)``, ``S = diag(u)``), the prediction ``a_i^T A^T S y + x0``."""
    import mpmath as mp

    m, n = a.shape
    errs = []
    with mp.workdps(60):
        rows = [[mp.mpf(float(v)) for v in r] for r in a]
        u = [mp.sqrt(mp.mpf(float(v))) for v in w]
        for i in range(m):
            tr = [j for j in range(m) if j != i]
            k = len(tr)
            lhs, rhs = mp.matrix(k + 1, k + 1), mp.matrix(k + 1, 1)
            for p in range(k):
                for q in range(p, k):
                    lhs[p, q] = lhs[q, p] = u[tr[p]] * u[tr[q]] * mp.fsum(x * y for x, y in zip(rows[tr[p]], rows[tr[q]]))
                lhs[p, p] += lam2
                lhs[p, k] = lhs[k, p] = u[tr[p]]
                rhs[p] = u[tr[p]] * mp.mpf(float(b[tr[p]]))
            sol = mp.lu_solve(lhs, rhs)
            pred = sol[k] + mp.fsum(u[tr[p]] * sol[p] * mp.fsum(x * y for x, y in zip(rows[i], rows[tr[p]]))
                                    for p in range(k))
            errs.append(float(u[i] ** 2 * (mp.mpf(float(b[i])) - pred) ** 2))
    return np.asarray(errs)


def _bordered_bound(a, b, w, lam2, errs):
    """The bound on the mean of :func:`_refit_loo_intercept`'s errors as the bordered system on the row-scaled kernel
    computes them (``blocklin.linalg.solve.bordered_kernel``). Shifting every row by the same vector changes nothing
    in exact arithmetic; summed less a typical row ``t`` the kernel rounds relative to ``||a_i - a_t||``, so with
    ``H = D^-1 (K_t + lam^2 I) D^-1`` (``D^2 = diag(K_t) + lam^2``), ``N`` an orthonormal basis of ``D^-1 sqrt(w)``'s
    complement and ``F = N^T H N``, ``z = F^-1 N^T D^-1 S b`` is off by ``delta ||z||`` and ``F^-1`` by
    ``delta ||F^-1||`` with ``delta = (m + n) eps cond(F)`` (the kernel's rounding ``n eps`` relative to ``H``, then
    Cholesky's ``m eps``). Row ``i``'s error is ``(n_i^T z) / (n_i^T F^-1 n_i)`` (``n_i`` row ``i`` of ``N``), so its
    relative error is at most ``rel_i = delta ||n_i|| (||z|| / |n_i^T z| + ||F^-1|| ||n_i|| / (n_i^T F^-1 n_i))``, its
    square's ``2 rel_i + rel_i^2``; plus the mean's own rounding ``m eps``."""
    from scipy.linalg import null_space

    m, n = a.shape
    eps = np.finfo(np.float64).eps
    dist = ((a[:, None, :] - a[None, :, :]) ** 2).sum(axis=2)
    t = int(np.argmin(np.median(dist, axis=0)))
    u = np.sqrt(w)
    at = u[:, None] * (a - a[t])
    kern = at @ at.T
    d = np.sqrt(np.diag(kern) + lam2)
    h = kern / np.outer(d, d) + np.diag(lam2 / d**2)
    basis = null_space((u / d)[None, :])
    f = basis.T @ h @ basis
    finv = np.linalg.inv(f)
    z = finv @ basis.T @ (u * b / d)
    delta = (m + n) * eps * np.linalg.cond(f)
    ni = np.linalg.norm(basis, axis=1)
    q = np.einsum("ij,jk,ik->i", basis, finv, basis)
    rel = delta * ni * (np.linalg.norm(z) / np.abs(basis @ z) + np.linalg.norm(finv, 2) * ni / q)
    return float(np.mean(errs * (2 * rel + rel**2)) + m * eps * np.mean(errs))


@pytest.mark.parametrize("weighted", [False, True], ids=["unweighted", "weighted"])
@pytest.mark.parametrize("big", ["first", "middle", "last"])
def test_wide_loo_with_an_intercept_where_rows_are_far_apart(big, weighted, tmp_path):
    """A wide ``a`` whose rows' norms are ``1e5`` and ``5e-4`` apart, with ``fit_intercept``. The centered kernel
    ``P A A^T P`` mixes the far row into every row, and its spectrum's errors had been ``1.6e-2`` (``1e5`` row 4th)
    to ``0.99`` (weighted) relative off; with the ``1e5`` row first, which the wide Gram pass sums the rows less,
    ``3.5e3`` for ``2.3e8`` (``RidgeCV`` 3 to 3600 times off), without a warning. Now ``c`` and ``diag(Q)`` come from
    the bordered system on the row-scaled kernel (``loo.intercept_kernel``), summed again less a typical row where
    row 0 lies far off, and no leave-one-out warning is given. Reference and bound: :func:`_refit_loo_intercept`,
    :func:`_bordered_bound`."""
    _check_rows_apart_intercept(big, weighted, "auto", tmp_path)


@pytest.mark.parametrize("big", ["first", "middle", "last"])
def test_wide_loo_with_an_intercept_where_rows_are_far_apart_qr(big, tmp_path):
    """As :func:`test_wide_loo_with_an_intercept_where_rows_are_far_apart` with ``method="qr"`` (no weights: refused
    there): the spectrum of the streaming ``R`` had left the errors ``3e-7`` to ``2e-6`` relative off, without a word;
    the kernel of the rows less row 0 is ``R^H R`` (rounded relative to its rows), and the bordered system serves."""
    _check_rows_apart_intercept(big, False, "qr", tmp_path)


def _check_rows_apart_intercept(big, weighted, method, tmp_path):
    import warnings

    rng = np.random.default_rng(0)
    m, n = 20, 40
    a, b = rows_apart(rng, m, n)  # the 1e5 row is row 3, the 5e-4 row the last
    w = rng.uniform(0.5, 2.0, m) if weighted else np.ones(m)
    order = np.arange(m)
    if big == "first":
        order[[0, 3]] = [3, 0]
    elif big == "last":
        order[[3, m - 1]] = [m - 1, 3]
    a, b, w = a[order], b[order], w[order]
    alphas = [1e-8, 1e-2]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        x = bl.solve(a, b, lam=("loo", np.sqrt(alphas)), fit_intercept=True,
                     sample_weight=w if weighted else None, method=method, temp_dir=str(tmp_path))
    assert not [c for c in caught if "leave-one-out errors" in str(c.message)]
    # the Gram pass (or the TSQR's), x = A^T y and the weights' check; one more where row 0 is far: the kernel again
    assert x.report["passes"] == 2 + weighted + (big == "first")
    for l, lam2 in enumerate(alphas):
        errs = _refit_loo_intercept(a, b, w, lam2)
        ref, tol = float(errs.mean()), _bordered_bound(a, b, w, lam2, errs)
        got = x.report["curve"]["loo"][l]
        assert abs(got - ref) <= tol, (lam2, got, ref, tol)
