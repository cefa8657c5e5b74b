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
