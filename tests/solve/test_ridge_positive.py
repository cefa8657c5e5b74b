"""solve(positive=True) against exact nonnegative least squares and sklearn.linear_model.Ridge(positive=True).

Ports of scikit-learn's sklearn/linear_model/tests/test_ridge.py: test_ridge_positive_regression_test
(coefficients >= 0 where the unconstrained ones are not), test_ridge_ground_truth_positive_test (positive
and unconstrained agree when the true coefficients are positive), test_positive_ridge_loss (the constrained
loss is no larger than Ridge(positive=True)'s, which L-BFGS-B reaches only to a tolerance, and no larger
than that of positive perturbations). The exact reference is scipy.optimize.nnls on the stacked problem
[sqrt(w) A_c; lam I] x ~ [sqrt(w) b_c; 0]: on the same active set both solve one least-squares problem, so
they differ by at most c n eps cond(stacked) ||x|| (a column subset is no worse conditioned).
"""

from __future__ import annotations

import numpy as np
import pytest
from scipy.optimize import nnls
from sklearn.linear_model import Ridge

import blocklin as bl
from blocklin.errors import ParameterError
from support.placements import SCHEDULERS, scheduler_arg
from support.ridge import EPS64, centered, intercept_bound, problem, weights

M, N = 4000, 10


def stacked_nnls(a, b, w, lam, fit_intercept):
    """The exact reference: one NNLS per right-hand side of the stacked problem, and its intercepts."""
    ac, bc = centered(a, b, w, fit_intercept)
    big = np.vstack([ac, lam * np.eye(ac.shape[1])])
    x = np.column_stack([nnls(big, np.r_[bc[:, j], np.zeros(ac.shape[1])])[0] for j in range(bc.shape[1])])
    s = np.linalg.svd(big, compute_uv=False)
    a64, b64 = np.asarray(a, np.float64), np.asarray(b, np.float64).reshape(len(a), -1)
    wv = np.ones(len(a)) if w is None else w
    icpt = (wv @ b64 - (wv @ a64) @ x) / wv.sum() if fit_intercept else None
    return x, icpt, s[0] / s[-1]


def objective(a, b, w, lam, x, icpt):
    a64, b64 = np.asarray(a, np.float64), np.asarray(b, np.float64).reshape(len(a), -1)
    wv = np.ones(len(a)) if w is None else w
    r = a64 @ x + (0 if icpt is None else icpt) - b64
    return (wv[:, None] * r**2).sum(axis=0) + lam**2 * (x**2).sum(axis=0)


def check(x, a, b, w, lam, fit_intercept, dtype=np.float64):
    ref, icpt, cond = stacked_nnls(a, b, w, lam, fit_intercept)
    got = x.to_numpy().astype(np.float64)
    growth = 1 + float(np.max(np.mean(a, axis=0) ** 2 / np.var(a, axis=0))) if fit_intercept else 1.0
    # the Cholesky route squares the stacked condition number (cond(K) = cond(stacked)^2)
    bound = 16 * a.shape[1] * EPS64 * cond**2 * growth * np.linalg.norm(ref) + 2 * np.finfo(dtype).eps * np.linalg.norm(ref)
    assert (got >= 0).all() and np.linalg.norm(got - ref) <= bound
    if fit_intercept:
        assert np.abs(x.intercept - icpt).max() <= intercept_bound(a, w, ref, icpt, bound, dtype)
    return ref, icpt


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("fit_intercept", [False, True])
@pytest.mark.parametrize("weighted", [False, True])
def test_positive_out_of_core(dtype, fit_intercept, weighted, tmp_path):
    a, b = problem(M, N, 3, seed=20, dtype=dtype)
    memory = 256 * 1024 if dtype == np.float64 else 128 * 1024
    assert a.nbytes > memory
    w = weights(M) if weighted else None
    pa = bl.from_array(a, str(tmp_path / "a.zarr"), chunks=(500, N))
    x = bl.solve(pa, b, lam=2.0, positive=True, fit_intercept=fit_intercept, sample_weight=w, memory=memory,
                 temp_dir=str(tmp_path))
    ref, icpt = check(x, a, b, w, 2.0, fit_intercept, dtype)
    assert 0 < (ref == 0).sum() < ref.size  # some constraints active, some not: a real test
    assert x.report["positive"] is True and x.report["nonzero"] == np.count_nonzero(ref, axis=0).tolist()
    # test_positive_ridge_loss: no larger than scikit-learn's (L-BFGS-B, to a tolerance)
    sk = Ridge(alpha=4.0, positive=True, fit_intercept=fit_intercept).fit(np.asarray(a, np.float64), b,
                                                                          sample_weight=w)
    ours = objective(a, b, w, 2.0, x.to_numpy().astype(np.float64), x.intercept)
    theirs = objective(a, b, w, 2.0, sk.coef_.T, sk.intercept_ if fit_intercept else None)
    assert (ours <= theirs * (1 + 1e-10)).all()


def test_positive_regression_test(tmp_path):
    """test_ridge_positive_regression_test: the tiny example whose unconstrained coefficients are negative."""
    a = np.array([[1, 2], [3, 4], [5, 6], [7, 8]], dtype=float)
    for fit_intercept in (True, False):
        y = a @ np.array([1.0, -10.0]) + (20 if fit_intercept else 0)
        for alpha in (1e-3, 1e-2, 0.1, 1.0):
            x = bl.solve(a, y, lam=np.sqrt(alpha), positive=True, fit_intercept=fit_intercept, temp_dir=str(tmp_path))
            check(x, a, y, None, np.sqrt(alpha), fit_intercept)


def test_ground_truth_positive(tmp_path):
    """test_ridge_ground_truth_positive_test: true coefficients > 0, so the constraint is inactive."""
    rng = np.random.RandomState(42)
    a = rng.randn(300, 100)
    y = a @ rng.uniform(0.1, 1.0, size=100) + 1 + rng.normal(size=300) * 0.01
    for alpha in (1e-3, 0.1, 1.0):
        xp = bl.solve(a, y, lam=np.sqrt(alpha), positive=True, fit_intercept=True, memory="1MiB",
                      temp_dir=str(tmp_path))
        xu = bl.solve(a, y, lam=np.sqrt(alpha), fit_intercept=True, memory="1MiB", temp_dir=str(tmp_path))
        assert np.abs(xp.to_numpy() - xu.to_numpy()).max() <= 1e-6  # scikit-learn's own check
        check(xp, a, y, None, np.sqrt(alpha), True)


def test_sequence(tmp_path):
    a, b = problem(2000, 8, 2, seed=21)
    lams = [0.5, 5.0, 50.0]
    x = bl.solve(a, b, lam=lams, positive=True, fit_intercept=True, memory="128KiB", temp_dir=str(tmp_path))
    assert x.shape == (8, 6) and x.intercept.shape == (3, 2)
    for i, lam in enumerate(lams):
        ref, icpt, cond = stacked_nnls(a, b, None, lam, True)
        got = x.to_numpy()[:, 2 * i:2 * i + 2]
        growth = 1 + float(np.max(a.mean(axis=0) ** 2 / a.var(axis=0)))
        assert np.linalg.norm(got - ref) <= 16 * 8 * EPS64 * cond**2 * growth * np.linalg.norm(ref)
        assert np.abs(x.intercept[i] - icpt).max() <= 1e-9 * np.abs(icpt).max()


@pytest.mark.parametrize("scheduler", SCHEDULERS)
def test_schedulers(scheduler, tmp_path, request):
    """The sync run's bits, its condition estimate among them, on every scheduler (a LocalCluster's
    among them)."""
    a, b = problem(M, N, 2, seed=22)
    pa = bl.from_array(a, str(tmp_path / "a.zarr"), chunks=(500, N))
    kw = dict(lam=2.0, positive=True, fit_intercept=True, sample_weight=weights(M), memory="256KiB", workers=2,
              temp_dir=str(tmp_path))
    x = bl.solve(pa, b, scheduler=scheduler_arg(scheduler, request), **kw)
    ref = bl.solve(pa, b, scheduler="sync", **kw)
    assert np.array_equal(x.to_numpy(), ref.to_numpy())
    assert x.report["condition_estimate"] == ref.report["condition_estimate"]
    check(x, a, b, weights(M), 2.0, True)


def test_refusals(tmp_path):
    a, b = problem(300, 5, 1)
    wide = np.random.default_rng(0).standard_normal((20, 40))
    with pytest.raises(ParameterError, match=r"positive: needs a tall or square a.*a 20 x 40.*Fix"):
        bl.solve(wide, np.ones(20), lam=1.0, positive=True, temp_dir=str(tmp_path))
    for rule in ("gcv", "lcurve", "loo"):
        with pytest.raises(ParameterError, match=rf"positive: needs lam given.*positive=True with lam='{rule}'.*Fix"):
            bl.solve(a, b, lam=rule, positive=True, temp_dir=str(tmp_path))
    with pytest.raises(ParameterError, match=r"method: 'qr' cannot take positive.*Fix"):
        bl.solve(a, b, lam=1.0, positive=True, method="qr", temp_dir=str(tmp_path))
    with pytest.raises(ParameterError, match=r"positive: needs the least-squares problem"):
        bl.solve(a[:5], b[:5], positive=True, assume_a="pos", temp_dir=str(tmp_path))
    with pytest.raises(ParameterError, match=r"positive.*must be a bool|positive"):
        bl.solve(a, b, lam=1.0, positive="yes", temp_dir=str(tmp_path))
    from test_ridge_loo import stored_sparse

    s = stored_sparse(str(tmp_path / "s.zarr"))
    with pytest.raises(ParameterError, match="positive.*not available for a stored sparse a"):
        bl.solve(s, np.ones(300), lam=1.0, positive=True, temp_dir=str(tmp_path))


def test_cli_positive(tmp_path, capsys):
    import json

    from blocklin.cli.main import main

    a, b = problem(2000, 6, 1, seed=23)
    pa, pb = str(tmp_path / "a.zarr"), str(tmp_path / "b.zarr")
    bl.from_array(a, pa)
    bl.from_array(b, pb)
    assert main(["solve", pa, pb, "-o", str(tmp_path / "x.zarr"), "--lambda", "1.5", "--positive", "--fit-intercept",
                 "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["positive"] is True
    ref, icpt, _ = stacked_nnls(a, b, None, 1.5, True)
    assert np.allclose(bl.open(str(tmp_path / "x.zarr")).to_numpy(), ref, rtol=0, atol=1e-9 * np.abs(ref).max())
    assert main(["solve", pa, pb, "-o", str(tmp_path / "y.zarr"), "--lambda", "1.5", "--positive", "--explain"]) == 0
    assert "nonnegative least squares" in capsys.readouterr().out
