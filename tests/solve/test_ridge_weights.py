"""solve(sample_weight=w) against sklearn.linear_model.Ridge.fit(X, y, sample_weight=w).

Ports of scikit-learn's sklearn/linear_model/tests/test_ridge.py: test_ridge_regression_sample_weights
(Ridge with weights against the data stacked twice with weights w and 1 - w), test_ridge_sample_weights
(weighted against Ridge), test_ridge_gcv_sample_weights (integer weights are repeated rows), and
test_sample_weight_invariance-style checks (zero weight = row removed; bad weights refused). Tall A is out
of core (larger than memory=), and the rules (sequences, gcv) are checked on the weighted problem's
definition: the unweighted solve of sqrt(w)-scaled rows with the zero-weight rows dropped.
"""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.linear_model import Ridge, RidgeCV

import blocklin as bl
from blocklin.errors import BudgetError, NonFiniteError, ParameterError, ShapeError
from support.ridge import coef_bound, intercept_bound, problem, weights

M, N = 4000, 10


def check(x, a, b, w, lam, fit_intercept, dtype=np.float64):
    # Ridge keeps float32 data in float32 (its error would be cond * eps32); the reference is the float64
    # solution of the same data, which blocklin's float64 sums reach before rounding x to float32
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    ref = Ridge(alpha=lam**2, fit_intercept=fit_intercept, solver="svd").fit(a, b, sample_weight=w)
    coef = x.to_numpy().T
    ref_coef = np.asarray(ref.coef_, np.float64).reshape(coef.shape)
    xb = coef_bound(a, b, w, lam, fit_intercept, dtype, ref_coef)
    assert np.linalg.norm(coef - ref_coef) <= xb
    if fit_intercept:
        ib = intercept_bound(a, w, ref_coef, np.atleast_1d(ref.intercept_), xb, dtype)
        assert np.abs(x.intercept - np.atleast_1d(ref.intercept_)).max() <= ib


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("fit_intercept", [False, True])
@pytest.mark.parametrize("k", [1, 3])
def test_weighted_matches_ridge_out_of_core(dtype, fit_intercept, k, tmp_path):
    """test_ridge_sample_weights: weighted coefficients and intercept, A streamed, w stored."""
    a, b = problem(M, N, k, seed=10 + k, dtype=dtype)
    memory = 256 * 1024 if dtype == np.float64 else 128 * 1024
    assert a.nbytes > memory
    w = weights(M)
    pa = bl.from_array(a, str(tmp_path / "a.zarr"), chunks=(500, N))
    pw = bl.from_array(w, str(tmp_path / "w.zarr"))
    x = bl.solve(pa, b[:, 0] if k == 1 else b, lam=2.0, fit_intercept=fit_intercept, sample_weight=pw,
                 memory=memory, temp_dir=str(tmp_path))
    check(x, a, b[:, 0] if k == 1 else b, w, 2.0, fit_intercept, dtype)
    assert x.dtype == dtype and x.report["sample_weight"] is True and x.report["phases"]["gram pass"] == "cpu"


@pytest.mark.parametrize("fit_intercept", [False, True])
def test_stacked_twice_with_complementary_weights(fit_intercept, tmp_path):
    """test_ridge_regression_sample_weights: [X; X] with weights [s; 1 - s] is X unweighted."""
    a, b = problem(2000, 8, 2, seed=12)
    s = np.random.default_rng(3).uniform(0, 1, 2000)
    x2 = bl.solve(np.vstack([a, a]), np.vstack([b, b]), lam=1.5, sample_weight=np.r_[s, 1 - s],
                  fit_intercept=fit_intercept, memory="256KiB", temp_dir=str(tmp_path))
    x1 = bl.solve(a, b, lam=1.5, fit_intercept=fit_intercept, memory="256KiB", temp_dir=str(tmp_path))
    bound = coef_bound(a, b, None, 1.5, fit_intercept, np.float64, x1.to_numpy())
    assert np.linalg.norm(x2.to_numpy() - x1.to_numpy()) <= bound
    check(x2, np.vstack([a, a]), np.vstack([b, b]), np.r_[s, 1 - s], 1.5, fit_intercept)


def test_integer_weights_are_repeated_rows_and_zero_drops(tmp_path):
    """test_ridge_gcv_sample_weights' premise: weight 3 is a row three times, weight 0 no row at all."""
    a, b = problem(1500, 6, 1, seed=13)
    w = np.random.default_rng(4).integers(0, 4, 1500).astype(float)
    rep = np.repeat(np.arange(1500), w.astype(int))
    for lam in (0.5, [0.1, 1.0, 10.0]):
        xw = bl.solve(a, b, lam=lam, sample_weight=w, fit_intercept=True, memory="128KiB", temp_dir=str(tmp_path))
        xr = bl.solve(a[rep], b[rep], lam=lam, fit_intercept=True, memory="128KiB", temp_dir=str(tmp_path))
        bound = coef_bound(a[rep], b[rep], None, 0.1, True, np.float64, xr.to_numpy())
        assert np.linalg.norm(xw.to_numpy() - xr.to_numpy()) <= bound
        assert np.abs(xw.intercept - xr.intercept).max() <= bound * np.abs(a.mean(axis=0)).sum() + 1e-12


def test_rules_mean_the_weighted_problem(tmp_path):
    """gcv / lcurve / a sequence with weights: those of sqrt(w) A, sqrt(w) b without the zero-weight rows
    (GCV's m is the rows of positive weight)."""
    a, b = problem(3000, 8, 2, seed=14)
    w = weights(3000, zeros=40)
    keep = w > 0
    sa, sb = a[keep] * np.sqrt(w[keep])[:, None], b[keep] * np.sqrt(w[keep])[:, None]
    for rule in ("gcv", "lcurve"):
        xw = bl.solve(a, b, lam=rule, sample_weight=w, memory="256KiB", temp_dir=str(tmp_path))
        xs = bl.solve(sa, sb, lam=rule, method="normal", memory="256KiB", temp_dir=str(tmp_path))
        assert xw.report["lam"] == pytest.approx(xs.report["lam"], rel=1e-6)
        bound = coef_bound(sa, sb, None, xs.report["lam"], False, np.float64, xs.to_numpy())
        assert np.linalg.norm(xw.to_numpy() - xs.to_numpy()) <= bound
    lams = [0.3, 3.0, 30.0]
    xw = bl.solve(a, b, lam=lams, sample_weight=w, fit_intercept=True, memory="256KiB", temp_dir=str(tmp_path))
    for i, lam in enumerate(lams):
        ref = Ridge(alpha=lam**2, solver="svd").fit(a, b, sample_weight=w)
        got = xw.to_numpy()[:, 2 * i:2 * i + 2].T
        assert np.linalg.norm(got - ref.coef_) <= coef_bound(a, b, w, lam, True, np.float64, ref.coef_)
        assert np.abs(xw.intercept[i] - ref.intercept_).max() <= 1e-9 * np.abs(ref.intercept_).max()


@pytest.mark.parametrize("fit_intercept", [False, True])
def test_wide_weighted(fit_intercept, tmp_path):
    rng = np.random.default_rng(15)
    a = rng.standard_normal((50, 120)) + 1.5
    b = rng.standard_normal((50, 2)) + 2.0
    w = weights(50, zeros=3)
    x = bl.solve(a, b, lam=3.0, sample_weight=w, fit_intercept=fit_intercept, memory="256KiB",
                 temp_dir=str(tmp_path))
    ref = Ridge(alpha=9.0, fit_intercept=fit_intercept, solver="svd").fit(a, b, sample_weight=w)
    assert x.report["orientation"] == "wide"
    ac = (a - np.average(a, axis=0, weights=w) * fit_intercept) * np.sqrt(w)[:, None]
    s = np.linalg.svd(ac, compute_uv=False)
    cond = (s[0] ** 2 + 9.0) / 9.0  # the dual matrix A_c A_c^T + lam^2 I (its smallest eigenvalue >= lam^2)
    bound = 16 * 50 * np.finfo(float).eps * cond * np.linalg.norm(ref.coef_) * (1 + 1.5**2 * fit_intercept)
    assert np.linalg.norm(x.to_numpy().T - ref.coef_) <= bound
    if fit_intercept:
        assert np.abs(x.intercept - ref.intercept_).max() <= bound * np.linalg.norm(a.mean(axis=0)) + 1e-12


@pytest.mark.parametrize("scheduler", ["sync", "threads", "processes"])
def test_schedulers(scheduler, tmp_path):
    a, b = problem(M, N, 2, seed=16)
    w = weights(M)
    pa = bl.from_array(a, str(tmp_path / "a.zarr"), chunks=(500, N))
    kw = dict(lam=2.0, fit_intercept=True, sample_weight=w, memory="256KiB", workers=2, temp_dir=str(tmp_path))
    x = bl.solve(pa, b, scheduler=scheduler, **kw)
    ref = bl.solve(pa, b, scheduler="sync", **kw)
    assert np.array_equal(x.to_numpy(), ref.to_numpy())
    check(x, a, b, w, 2.0, True)


def test_bad_weights(tmp_path):
    a, b = problem(400, 5, 1)
    w = np.ones(400)
    cases = [
        (np.r_[w[:-1], -0.5], ParameterError, r"sample_weight: must be >= 0.*-0.5 at row 399.*Fix"),
        (np.r_[np.nan, w[1:]], NonFiniteError, r"sample_weight: must be finite.*1 NaN or Inf.*row 0.*Fix"),
        (np.r_[w[:5], np.inf, w[6:]], NonFiniteError, r"sample_weight: must be finite.*row 5"),
        (np.ones(399), ShapeError, r"sample_weight: must have one weight per row.*399.*Fix: pass a vector of length 400"),
        (np.ones((400, 2)), ShapeError, r"sample_weight.*shape \(400, 2\)"),
        (np.zeros(400), ParameterError, r"sample_weight: must have a positive weight.*all zero.*Fix"),
        (2.0, ParameterError, r"sample_weight: must be a vector.*Fix"),
        (np.array(["a"] * 400), ParameterError, r"sample_weight: must hold real numbers"),
    ]
    for bad, err, match in cases:
        with pytest.raises(err, match=match):
            bl.solve(a, b, lam=1.0, sample_weight=bad, temp_dir=str(tmp_path))
    with pytest.raises(ParameterError, match=r"method: 'qr' cannot take sample_weight.*Fix"):
        bl.solve(a, b, lam=1.0, sample_weight=w, method="qr", temp_dir=str(tmp_path))
    with pytest.raises(ParameterError, match=r"updatable.*sample_weight.*Fix"):
        bl.solve(a, b, lam=1.0, sample_weight=w, updatable=True, out=str(tmp_path / "x.zarr"), temp_dir=str(tmp_path))
    with pytest.raises(ParameterError, match=r"sample_weight: needs the least-squares problem"):
        bl.solve(a[:5], b[:5], sample_weight=w[:5], assume_a="pos", temp_dir=str(tmp_path))
    big = np.random.default_rng(0).standard_normal((3000, 400))
    # the stored-Gram route (a Gram over the budget) weighs no rows: refused with the whole call's minimum
    with pytest.raises(BudgetError, match=r"every step of the least-squares solve.*sample_weight needs.*stored, "
                       r"out-of-core Gram route") as err:
        bl.solve(big, big[:, :1], lam=1.0, sample_weight=np.ones(3000), memory="1MiB", temp_dir=str(tmp_path))
    assert err.value.minimum >= 5 * 401**2 * 8
    # a square A with lam=0 stays least squares when weighted (never the unweighted LU)
    sq, sb = problem(12, 12, 1, seed=2)
    x = bl.solve(sq, sb, sample_weight=np.arange(1.0, 13.0), temp_dir=str(tmp_path))
    assert x.report["method"] == "normal"
    check(x, sq, sb, np.arange(1.0, 13.0), 0.0, False)


def test_sparse_refused(tmp_path):
    from test_ridge_loo import stored_sparse

    s = stored_sparse(str(tmp_path / "s.zarr"))
    with pytest.raises(ParameterError, match="sample_weight.*not available for a stored sparse a.*Fix"):
        bl.solve(s, np.ones(300), lam=1.0, sample_weight=np.ones(300), temp_dir=str(tmp_path))


def test_dask_and_column_weights(tmp_path):
    """w as a Dask vector and as an m x 1 column give the NumPy vector's bits."""
    import dask.array as da

    a, b = problem(2000, 6, 1, seed=17)
    w = weights(2000)
    kw = dict(lam=1.0, fit_intercept=True, memory="128KiB", temp_dir=str(tmp_path))
    ref = bl.solve(a, b, sample_weight=w, **kw).to_numpy()
    assert np.array_equal(bl.solve(a, b, sample_weight=da.from_array(w, chunks=700), **kw).to_numpy(), ref)
    assert np.array_equal(bl.solve(a, b, sample_weight=w[:, None], **kw).to_numpy(), ref)
    check(bl.solve(a, b, sample_weight=w, **kw), a, b, w, 1.0, True)


def _ill_conditioned(rng, m, n, decades):
    """``A = U diag(s) V^T sqrt(m)``, ``s`` log-spaced over ``decades``, and ``b`` a fit plus noise."""
    u, _ = np.linalg.qr(rng.standard_normal((m, n)))
    v, _ = np.linalg.qr(rng.standard_normal((n, n)))
    a = (u * np.logspace(0, -decades, n)) @ v.T * np.sqrt(m)
    return a, a @ rng.standard_normal(n) + np.abs(a).mean() * rng.standard_normal(m)


def test_rules_on_an_ill_conditioned_gram_stay_above_its_rounding_level():
    """fit_intercept and sample_weight take the eigen-decomposition of the centered or weighted A^T A,
    whose eigenvalues under n eps ||A||^2 are rounding noise. Scored there, leave-one-out chose lam
    3e-13 on a matrix of condition 1e9 with an error near 1e-14 (RidgeCV: 0.58, 0.040), and GCV with
    weights chose 5e-18 (x wrong, the same lam refused as a number). Their default grids now start at
    the spectrum's resolution; leave-one-out then agrees with RidgeCV on that grid."""
    rng = np.random.default_rng(5)
    a, b = _ill_conditioned(rng, 103, 18, 9)
    x = bl.solve(a, b, lam="loo", fit_intercept=True)
    grid = np.asarray(x.report["curve"]["lam"])
    ref = RidgeCV(alphas=grid**2, fit_intercept=True).fit(a, b)
    assert x.report["lam"] == pytest.approx(np.sqrt(ref.alpha_), rel=1e-9)
    assert x.report["best_score_"] == pytest.approx(ref.best_score_, rel=1e-6)
    # GCV with weights: lambda at or above the floor, and x the weighted ridge solution at it (bound as above)
    a, b = _ill_conditioned(rng, 32, 32, 12)
    w = rng.uniform(0.1, 2.0, 32)
    x = bl.solve(a, b, lam="gcv", sample_weight=w)
    lam = x.report["lam"]
    assert lam >= x.report["curve"]["floor"] > 0
    want = Ridge(alpha=lam**2, fit_intercept=False, solver="svd").fit(a, b, sample_weight=w).coef_
    assert np.linalg.norm(x.to_numpy()[:, 0] - want) <= coef_bound(a, b[:, None], w, lam, False, np.float64, want)


def test_a_sequence_reports_the_residual_of_its_solution_on_an_ill_conditioned_gram():
    """The residual norm of a weighted sequence counts the directions under the Gram's rounding level as
    not fitted (their beta = V^T A^T b / s is noise): it was 21% off on a matrix of condition 1e12 (a
    randomized search's case: its generator's other draws are kept, so that the data are the same)."""
    rng = np.random.default_rng(5)
    rng.choice(4), rng.integers(3, 40), rng.integers(1, 4), rng.choice(5), rng.random()
    u, _ = np.linalg.qr(rng.standard_normal((32, 32)))
    v, _ = np.linalg.qr(rng.standard_normal((32, 32)))
    a = (u * np.logspace(0, -12, 32)) @ v.T * np.sqrt(32)
    xt = rng.standard_normal((32, 1))
    rng.choice(3)
    b = a @ xt + np.abs(a).mean() * rng.standard_normal((32, 1))
    rng.choice(5)
    w = rng.uniform(0.1, 2.0, 32)
    lams = [0.16771153320398285, 1.0]
    x = bl.solve(a, b, lam=lams, sample_weight=w)
    sw = np.sqrt(w)[:, None]
    for i, lam in enumerate(lams):
        got = x.to_numpy()[:, i:i + 1]
        # the Gram sums' accuracy in ||r||: about sqrt(eps) ||b|| (docs/solve.md)
        assert x.report["residual_norm"][i] == pytest.approx(np.linalg.norm(sw * (b - a @ got)),
                                                              abs=1e-7 * np.linalg.norm(sw * b))


@pytest.mark.parametrize("case", ["missing", "folder", "object", "garbage"])
def test_cli_sample_weight_file_refused_naming_the_option(tmp_path, case, capsys):
    # a bad --sample-weight .npy is refused naming the option and the file, with the fix: a missing file had
    # been reported as an output folder to create, a folder, an object array or a damaged header by NumPy's
    # own messages (no option, no fix), and nothing is written
    from blocklin.cli.main import main

    rng = np.random.default_rng(0)
    pa, pb, pw = str(tmp_path / "a.zarr"), str(tmp_path / "b.zarr"), tmp_path / "w.npy"
    bl.from_array(rng.standard_normal((30, 4)), pa)
    bl.from_array(rng.standard_normal((30, 1)), pb)
    if case == "folder":
        pw.mkdir()
    elif case == "object":
        np.save(pw, np.array([1.0, "x"], dtype=object), allow_pickle=True)
    elif case == "garbage":
        pw.write_bytes(b"not a npy file" * 10)
    out = tmp_path / "x.zarr"
    assert main(["solve", pa, pb, "-o", str(out), "--sample-weight", str(pw), "--no-progress"]) == 1
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--sample-weight" in err and "Fix: " in err, err
    assert {"missing": "does not exist", "folder": "is a folder", "object": "dtype object",
            "garbage": ".npy header"}[case] in err, err
    assert not out.exists()


def test_cli_sample_weight_zarr(tmp_path):
    """``blocklin solve A B --sample-weight W.zarr`` (a stored vector, as the option's help says): ``x`` is
    ``Ridge.fit(..., sample_weight=w)``'s within :func:`check`'s bound. A path had been refused as a scalar
    weight (``np.isscalar`` is True of a str)."""
    from blocklin.cli.main import main

    a, b = problem(600, 5, 1, seed=14)
    w = weights(600)
    pa, pb, pw, out = (str(tmp_path / n) for n in ("a.zarr", "b.zarr", "w.zarr", "x.zarr"))
    bl.from_array(a, pa)
    bl.from_array(b, pb)
    bl.from_array(w[:, None], pw)
    assert main(["solve", pa, pb, "-o", out, "--lambda", "2.0", "--fit-intercept", "--sample-weight", pw,
                 "--temp-dir", str(tmp_path), "--no-progress"]) == 0
    x = bl.open(out)
    x.intercept = np.asarray(x.provenance["report"]["intercept"])  # as the run returned it (its stored report)
    check(x, a, b, w, 2.0, True)
