"""solve(fit_intercept=True) against sklearn.linear_model.Ridge(alpha=lam**2, fit_intercept=True)."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.linear_model import Ridge

import blocklin as bl
from blocklin.errors import BudgetError, ParameterError


def problem(m: int, n: int, k: int = 2, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Columns with means about 30 against a spread of 2, and an offset of 5 in b."""
    rng = np.random.default_rng(seed)
    a = 2 * rng.standard_normal((m, n)) + 30 + rng.standard_normal(n)
    b = a @ rng.standard_normal((n, k)) + 5 + 0.1 * rng.standard_normal((m, k))
    return a, b


def tolerance(a: np.ndarray, lam: float) -> float:
    # the centered Gram matrix is formed as A^T A - m mu mu^T: its rounding is eps relative to the
    # uncentered entries, (mu / sd)^2 times the centered ones; the solve multiplies that by the condition
    # of A_c^T A_c + lam^2 I; a factor 100 covers the accumulation over m rows
    ac = a - a.mean(axis=0)
    s = np.linalg.svd(ac, compute_uv=False)
    cond = (s[0] ** 2 + lam**2) / (s[-1] ** 2 + lam**2) if a.shape[0] >= a.shape[1] else 1.0 + (s[0] / lam) ** 2
    growth = 1 + float(np.max(a.mean(axis=0) ** 2 / a.var(axis=0)))
    return 100 * np.finfo(np.float64).eps * cond * growth


def check(x, a, b, lam, tol) -> None:
    ref = Ridge(alpha=lam**2, fit_intercept=True, solver="svd").fit(a, b)
    coef = x.to_numpy().T
    np.testing.assert_allclose(coef, ref.coef_, atol=tol * np.abs(ref.coef_).max(), rtol=0)
    # the intercept bbar - mu^T x inherits mu^T (error of x)
    scale = np.linalg.norm(a.mean(axis=0)) * np.linalg.norm(ref.coef_, axis=1) + np.abs(ref.intercept_)
    np.testing.assert_allclose(x.intercept, ref.intercept_, atol=float(tol * scale.max()), rtol=0)
    assert x.report["intercept"] == pytest.approx(list(x.intercept))


@pytest.mark.parametrize("memory", ["1GiB", "256KiB"])
@pytest.mark.parametrize("lam", [0.3, 4.0])
def test_tall_intercept_matches_ridge(memory, lam, tmp_path):
    a, b = problem(2000, 25)
    x = bl.solve(a, b, lam=lam, fit_intercept=True, memory=memory, temp_dir=str(tmp_path))
    check(x, a, b, lam, tolerance(a, lam))
    assert x.report["fit_intercept"] and x.report["method"] == "normal"


@pytest.mark.parametrize("lam", [0.3, 4.0])
def test_wide_intercept_matches_ridge(lam, tmp_path):
    a, b = problem(30, 200, seed=1)
    x = bl.solve(a, b, lam=lam, fit_intercept=True, memory="256KiB", temp_dir=str(tmp_path))
    check(x, a, b, lam, tolerance(a, lam))


def test_single_column_b_and_sequence(tmp_path):
    a, b = problem(1500, 12, k=1, seed=2)
    lams = [0.1, 1.0, 10.0]
    x = bl.solve(a, b[:, 0], lam=lams, fit_intercept=True, temp_dir=str(tmp_path))
    assert x.intercept.shape == (3, 1)
    xs = x.to_numpy()
    for i, lam in enumerate(lams):
        ref = Ridge(alpha=lam**2, fit_intercept=True, solver="svd").fit(a, b[:, 0])
        t = tolerance(a, lam)
        np.testing.assert_allclose(xs[:, i], ref.coef_, atol=t * np.abs(ref.coef_).max(), rtol=0)
        np.testing.assert_allclose(x.intercept[i, 0], ref.intercept_,
                                   atol=t * (np.linalg.norm(a.mean(axis=0)) * np.linalg.norm(ref.coef_) + 5))


def test_without_intercept_unchanged(tmp_path):
    a, b = problem(500, 10)
    x = bl.solve(a, b, lam=1.0, temp_dir=str(tmp_path))
    assert x.intercept is None and x.report["fit_intercept"] is False
    ref = Ridge(alpha=1.0, fit_intercept=False, solver="svd").fit(a, b)
    np.testing.assert_allclose(x.to_numpy().T, ref.coef_, rtol=1e-8)


def test_qr_with_intercept_and_weights_refused(tmp_path):
    """``method="qr"`` fits an intercept (tests/solve/test_qr_route_intercept_wide.py), not sample weights."""
    a, b = problem(300, 5)
    with pytest.raises(ParameterError, match="method.*sample_weight.*Fix"):
        bl.solve(a, b, lam=1.0, method="qr", fit_intercept=True, sample_weight=np.ones(300), temp_dir=str(tmp_path))


def test_cli_fit_intercept(tmp_path, capsys):
    import json

    from blocklin.cli.main import main

    a, b = problem(400, 6, k=1, seed=3)
    pa, pb = str(tmp_path / "a.zarr"), str(tmp_path / "b.zarr")
    bl.from_array(a, pa)
    bl.from_array(b, pb)
    assert main(["solve", pa, pb, "-o", str(tmp_path / "x.zarr"), "--lambda", "2", "--fit-intercept", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    ref = Ridge(alpha=4.0, fit_intercept=True, solver="svd").fit(a, b[:, 0])
    t = tolerance(a, 2.0)
    np.testing.assert_allclose(out["intercept"], [ref.intercept_],
                               atol=t * (np.linalg.norm(a.mean(axis=0)) * np.linalg.norm(ref.coef_) + 5))
    np.testing.assert_allclose(bl.open(str(tmp_path / "x.zarr")).to_numpy()[:, 0], ref.coef_,
                               atol=t * np.abs(ref.coef_).max())


def test_intercept_refused_where_nothing_centers(tmp_path):
    a, b = problem(300, 5)
    spd = a.T @ a
    with pytest.raises(ParameterError, match="fit_intercept.*assume_a='pos'.*Fix"):
        bl.solve(spd, b[:5], assume_a="pos", fit_intercept=True, temp_dir=str(tmp_path))
    big = np.random.default_rng(0).standard_normal((3000, 400))
    # the stored-Gram route (a Gram over the budget) does not center: refused with the whole call's minimum
    with pytest.raises(BudgetError, match="every step of the least-squares solve.*fit_intercept needs.*Fix"):
        bl.solve(big, big[:, :1], lam=1.0, fit_intercept=True, memory="1MiB", temp_dir=str(tmp_path))
