"""A wide ``A`` with ``fit_intercept`` on the Gram route: ``x = A^T (P y)`` is a GEMM of the uncentered ``A``,
whose rounding, ``gamma_m |A|^T |P y|`` (Higham 2002, 3.5), is about ``c eps`` of ``x`` for column means ``c``
times their spread. ``report["condition_estimate"]`` counts it (``m ||A||_F ||P y|| / ||x||``) beside the
spectral bound, and warns where the sum reaches ``1 / eps``: the spectral bound alone had claimed ``3e-14``
for ``x`` 15-30% off (means ``1e6``, spread ``1e-9``) and ``3e-14`` for ``1e-8`` (means ``1e8``, spread 1),
without a word. Reference: the block normal equations of ``[1 | A]`` in mpmath (80 digits, the data exact)."""

from __future__ import annotations

import mpmath as mp
import numpy as np
import pytest

import blocklin as bl
from blocklin.errors import IllConditionedWarning
from support.tolerances import eps

EPS = eps(np.float64)


def _exact(a, b, lam):
    m, n = a.shape
    with mp.workdps(80):
        c = mp.matrix([[1] + [mp.mpf(float(v)) for v in row] for row in a])
        k = c.T * c
        for i in range(1, n + 1):
            k[i, i] += mp.mpf(float(lam)) ** 2
        cols = [mp.lu_solve(k, c.T * mp.matrix([mp.mpf(float(v)) for v in b[:, j]])) for j in range(b.shape[1])]
    z = np.array([[float(col[i]) for col in cols] for i in range(n + 1)])
    return z[1:], z[0]


def _data(mean, spread, seed=3, m=6, n=15, k=2):
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((m, n)) * spread + mean * (1 + rng.random(n))
    return a, rng.standard_normal((m, k)), 1e-3 * spread


@pytest.mark.parametrize("memory", [None, "256KiB"])
def test_large_means_are_in_the_condition_estimate(memory):
    a, b, lam = _data(1e8, 1.0)
    x_ref, _ = _exact(a, b, lam)
    x = bl.solve(a, b, lam=lam, fit_intercept=True, **({"memory": memory} if memory else {}))
    assert x.report["method"] == "normal"
    err = np.linalg.norm(x.to_numpy() - x_ref, axis=0) / np.linalg.norm(x_ref, axis=0)
    assert np.all(err <= x.report["condition_estimate"] * EPS), (err, x.report["condition_estimate"] * EPS)


def test_means_past_the_spread_by_one_over_eps_warn():
    a, b, lam = _data(1e6, 1e-9)
    x_ref, _ = _exact(a, b, lam)
    with pytest.warns(IllConditionedWarning, match="x = A\\^T y sums the uncentered a"):
        x = bl.solve(a, b, lam=lam, fit_intercept=True)
    err = np.linalg.norm(x.to_numpy() - x_ref, axis=0) / np.linalg.norm(x_ref, axis=0)
    assert np.all(err <= x.report["condition_estimate"] * EPS)
    assert x.report["condition_estimate"] * EPS >= 1


def test_centered_data_keep_their_estimate():
    """Means 0: the product's term is ``m ||A||_F ||y|| / ||x||``, of the size of the spectral bound's own."""
    a, b, lam = _data(0.0, 1.0)
    x_ref, _ = _exact(a, b, 1.0)
    x = bl.solve(a, b, lam=1.0, fit_intercept=True)
    err = np.linalg.norm(x.to_numpy() - x_ref, axis=0) / np.linalg.norm(x_ref, axis=0)
    assert np.all(err <= x.report["condition_estimate"] * EPS)
    assert x.report["condition_estimate"] * EPS < 1e-12


@pytest.mark.parametrize("mean", [1e3, 1e6])
def test_out_of_core_gram_fallback_stays_within_its_bound(monkeypatch, mean):
    """Where the SYRK pass's ``m x m`` sums do not fit the budget the wide route forms ``A A^T`` by an out-of-core
    GEMM of the uncentered ``A`` and centers it in memory (``P A A^T P``): rounded relative to ``||A||_F^2``, it
    loses about ``c^2 eps`` (docs/solve.md, Intercepts) where the SYRK pass's shifted sums keep the digits. Not a
    silent loss: ``x`` within ``report["condition_estimate"]`` times eps, warned where that reaches 1 (the
    budget that takes the fallback is forced here: at each shape tried the least budget fits the SYRK pass)."""
    import warnings

    import blocklin.linalg.solve.wide as wide
    from blocklin.errors import BudgetError
    from blocklin.linalg.products.gram_kernels import gram_pass_kernel

    real = wide.run_pass
    used = []

    def run_pass(job, kernel, *args, **kwargs):
        if kernel is gram_pass_kernel:
            raise BudgetError("memory: the m x m sums (forced)")
        return real(job, kernel, *args, **kwargs)

    real_gemm = wide._wide_gram_gemm
    monkeypatch.setattr(wide, "run_pass", run_pass)
    monkeypatch.setattr(wide, "_wide_gram_gemm", lambda ctx: used.append(1) or real_gemm(ctx))
    a, b, _ = _data(mean, 1.0, m=12, n=30, k=1)
    x_ref, _ = _exact(a, b, 0.5)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        x = bl.solve(a, b, lam=0.5, fit_intercept=True)
    assert used
    err = float(np.linalg.norm(x.to_numpy() - x_ref) / np.linalg.norm(x_ref))
    delta = x.report["condition_estimate"] * EPS
    assert err <= delta, (err, delta)
    if delta >= 1:
        assert any(issubclass(w.category, IllConditionedWarning) for w in caught)
