"""A refusal of a least-squares ``solve`` (tall and wide, every route: normal equations with refinement,
streaming QR, ``method="auto"``, lambda sequences, GCV, L-curve, leave-one-out, ``fit_intercept``,
``sample_weight``, ``positive``, ``updatable``, the stored-Gram route) and of ``lstsq`` names the minimum
of the whole call, carries it as ``.minimum``, and a retry at exactly that budget runs
(``blocklin/linalg/solve/least_squares_budget.py``): budgets from 16 KiB doubling, each refusal retried
once at its named minimum, ``x`` checked against scikit-learn's ``Ridge`` (SVD solver), SciPy's NNLS on
the stacked problem or NumPy's ``lstsq``, within the normal equations' forward-error bound
(``tests/support/ridge.py``: ``c n eps cond(K) ||x||``).
"""

from __future__ import annotations

import numpy as np
import pytest
from scipy.optimize import nnls
from sklearn.linear_model import Ridge
from support.ridge import EPS64, centered, coef_bound, intercept_bound, problem, weights

import blocklin as bl
from blocklin.errors import BudgetError
from support.budgets import sweep


def ridge_check(a, b, w=None, fit_intercept=False, lams=None):
    """``x`` (the blocks of a lambda sequence side by side) against Ridge at the lambda(s) the report names."""
    def check(x):
        lam = x.report["lam"] if lams is None else lams
        seq = isinstance(lam, list)
        got = x.to_numpy().astype(np.float64)
        k = b.shape[1]
        for i, value in enumerate(lam if seq else [lam]):
            ref = Ridge(alpha=value**2, fit_intercept=fit_intercept, solver="svd").fit(a, b, sample_weight=w)
            coef = np.asarray(ref.coef_, np.float64).reshape(k, -1).T
            xb = coef_bound(a, b, w, value, fit_intercept, np.float64, coef)
            assert np.linalg.norm(got[:, i * k:(i + 1) * k] - coef) <= xb, (value, x.report["method"])
            if fit_intercept:
                icpt = np.atleast_1d(ref.intercept_)
                got_i = np.asarray(x.intercept)[i] if seq else x.intercept
                assert np.abs(got_i - icpt).max() <= intercept_bound(a, w, coef, icpt, xb, np.float64)
    return check


def nnls_check(a, b, lam):
    """``positive=True`` against SciPy's NNLS of the stacked ``[A; lam I]`` (the Cholesky route squares
    its condition number)."""
    def check(x):
        ac, bc = centered(a, b, None, False)
        big = np.vstack([ac, lam * np.eye(ac.shape[1])])
        ref = np.column_stack([nnls(big, np.r_[bc[:, j], np.zeros(ac.shape[1])])[0] for j in range(bc.shape[1])])
        s = np.linalg.svd(big, compute_uv=False)
        bound = 16 * a.shape[1] * EPS64 * (s[0] / s[-1]) ** 2 * np.linalg.norm(ref)
        got = x.to_numpy()
        assert (got >= 0).all() and np.linalg.norm(got - ref) <= bound
    return check


def lstsq_check(a, b):
    def check(x):
        ref = np.linalg.lstsq(a, b, rcond=None)[0]
        s = np.linalg.svd(a, compute_uv=False)
        got = x[0]  # lstsq's (x, residuals, rank, s), x in memory
        assert np.linalg.norm(got - ref) <= 16 * max(a.shape) * EPS64 * (s[0] / s[-1]) ** 2 * np.linalg.norm(ref)
    return check


def stored(folder, name, x, chunks):
    if chunks is None:
        return x
    return bl.from_array(x, str(folder / f"{name}.zarr"), chunks=chunks)


def _tall_calls(m, n, chunks, folder):
    a, b = problem(m, n, 2, seed=3)
    w = weights(m)
    sa, sb = stored(folder, "a", a, chunks), stored(folder, "b", b, None if chunks is None else (chunks[0], 2))
    sw = stored(folder, "w", w.reshape(-1, 1), None if chunks is None else (chunks[0], 1))
    grid = [0.3, 3.0, 30.0]

    def solve(**kw):
        return lambda memory: bl.solve(sa, sb, memory=memory, scheduler="sync", **kw)

    return {
        "normal": (solve(lam=0.1, method="normal"), ridge_check(a, b)),
        "normal-refine2": (solve(lam=0.1, method="normal", refine=2), ridge_check(a, b)),
        "qr": (solve(lam=0.1, method="qr"), ridge_check(a, b)),
        "auto": (solve(lam=0.1), ridge_check(a, b)),
        "sequence": (solve(lam=[0.1, 1.0]), ridge_check(a, b)),
        "sequence-qr": (solve(lam=[0.1, 1.0], method="qr"), ridge_check(a, b)),
        "gcv": (solve(lam="gcv"), ridge_check(a, b)),
        "lcurve": (solve(lam="lcurve"), ridge_check(a, b)),
        "loo": (solve(lam="loo"), ridge_check(a, b)),
        "loo-grid-cv": (solve(lam=("loo", grid), store_cv_results=True, fit_intercept=True),
                        ridge_check(a, b, fit_intercept=True)),
        "intercept": (solve(lam=0.1, fit_intercept=True), ridge_check(a, b, fit_intercept=True)),
        "intercept-sequence": (solve(lam=[0.1, 1.0], fit_intercept=True), ridge_check(a, b, fit_intercept=True)),
        "weights": (solve(lam=0.1, sample_weight=sw, fit_intercept=True), ridge_check(a, b, w, True)),
        "positive": (solve(lam=0.1, positive=True), nnls_check(a, b, 0.1)),
        "updatable": (lambda memory: bl.solve(sa, sb, lam=0.1, updatable=True, out=str(folder / "x.zarr"),
                                              overwrite=True, memory=memory, scheduler="sync"), ridge_check(a, b)),
        "lstsq": (lambda memory: bl.lstsq(sa, sb, memory=memory, scheduler="sync"), lstsq_check(a, b)),
    }


def _wide_calls(m, n, chunks, folder):
    a = np.ascontiguousarray(problem(n, m, 1, seed=4)[0].T)  # m x n, m < n
    b = np.random.default_rng(5).standard_normal((m, 2))
    w = weights(m, zeros=2)
    sa = stored(folder, "a", a, chunks)

    def solve(**kw):
        return lambda memory: bl.solve(sa, b, memory=memory, scheduler="sync", **kw)

    return {
        "wide": (solve(lam=0.5), ridge_check(a, b)),
        "wide-sequence": (solve(lam=[0.5, 5.0]), ridge_check(a, b)),
        "wide-intercept-weights": (solve(lam=0.5, fit_intercept=True, sample_weight=w), ridge_check(a, b, w, True)),
        "wide-gcv": (solve(lam="gcv"), ridge_check(a, b)),
    }


TALL = ["normal", "normal-refine2", "qr", "auto", "sequence", "sequence-qr", "gcv", "lcurve", "loo", "loo-grid-cv",
        "intercept", "intercept-sequence", "weights", "positive", "updatable", "lstsq"]
WIDE = ["wide", "wide-sequence", "wide-intercept-weights", "wide-gcv"]
#: The default job's cases: one of each kind of step (the rest in the slow job).
DEFAULT = {"auto", "loo-grid-cv", "wide-intercept-weights"}


def _params(calls, shapes):
    out = []
    for shape, chunks in shapes:
        for call in calls:
            slow = call not in DEFAULT or chunks is not None
            out.append(pytest.param(call, shape, chunks, marks=pytest.mark.slow if slow else (),
                                    id=f"{call}-{shape[0]}x{shape[1]}-{'default' if chunks is None else chunks[0]}"))
    return out


@pytest.mark.parametrize("call,shape,chunks", _params(TALL, [((400, 30), None), ((400, 30), (64, 16))]))
def test_tall_named_minimum_of_the_whole_call_runs(call, shape, chunks, tmp_path):
    run, check = _tall_calls(*shape, chunks, tmp_path)[call]
    assert sweep(run, check) >= 1  # the sweep starts below every route's minimum


@pytest.mark.parametrize("call,shape,chunks", _params(WIDE, [((30, 300), None), ((30, 300), (16, 64))]))
def test_wide_named_minimum_of_the_whole_call_runs(call, shape, chunks, tmp_path):
    run, check = _wide_calls(*shape, chunks, tmp_path)[call]
    assert sweep(run, check) >= 1


@pytest.mark.parametrize("chunks", [(32, 32), pytest.param((64, 64), marks=pytest.mark.slow)])
def test_stored_gram_route_at_its_named_minimum(chunks, tmp_path):
    """A Gram matrix over the budget: the stored, out-of-core route, run at the minimum its refusal names."""
    a, b = problem(400, 160, 2, seed=6)
    sa = stored(tmp_path, "a", a, chunks)
    err = pytest.raises(BudgetError, bl.solve, sa, b, lam=0.1, memory=16 << 10, scheduler="sync")
    x = bl.solve(sa, b, lam=0.1, memory=err.value.minimum, scheduler="sync")
    assert x.report["gram"] == "out of core"
    ridge_check(a, b)(x)


def test_refusal_names_the_whole_call():
    a, b = problem(400, 30, 2)
    with pytest.raises(BudgetError) as err:
        bl.solve(a, b, lam=0.1, method="normal", memory="16KiB", scheduler="sync")
    assert err.value.minimum > 16 << 10 and "every step of the least-squares solve" in str(err.value)
    with pytest.raises(BudgetError) as err:  # the stored-Gram route has no intercept: the in-memory minimum
        bl.solve(a, b, lam=0.1, fit_intercept=True, memory="16KiB", scheduler="sync")
    assert err.value.minimum >= 5 * 32**2 * 8
