"""Leave-one-out and k-fold scores of data near the ends of float64's range choose what scikit-learn
chooses on the same data unscaled.

The solve runs on ``2^-ea A``, ``2^-eb b`` (``docs/solve.md``, Scaled data); the held-out sums were
rescaled to the units given before the scores were formed, so near ``2^+-700`` the sums of squares
overflowed (``r2`` ``nan``) or underflowed (``r2`` read as a constant target's ``1``, squared errors
``0``), every grid value tied and the first won: ``cv=3`` chose ``lam = 0.1`` where ``RidgeCV`` chooses
10, with ``x`` 5x off and no warning. The scores are now formed from the scaled sums and only reported
in the units given (exact powers of two; ``r2`` and ``explained_variance`` are scale-free).
"""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.linear_model import RidgeCV

import blocklin as bl

GRID = np.array([0.1, 1.0, 10.0, 30.0])


def _data(wide: bool):
    rng = np.random.default_rng(0)
    m, n = (12, 30) if wide else (50, 8)
    a = rng.standard_normal((m, n)) + 2
    b = a @ np.ones(n) + 3 * rng.standard_normal(m)
    return a, b


@pytest.mark.parametrize("k", [-700, -300, 300, 700])
@pytest.mark.parametrize("wide", [False, True], ids=["tall", "wide"])
@pytest.mark.parametrize("opts", [dict(cv=3), dict(cv=3, scoring="neg_mean_squared_error"), dict(scoring="r2"),
                                  dict(scoring="explained_variance"), dict()],
                         ids=["cv-r2", "cv-mse", "loo-r2", "loo-ev", "loo-mse"])
# the first pass over data beyond 2^256 overflows and is repeated scaled: NumPy's overflow warnings of
# that pass (k-fold's printed them at 2^700) would only alarm
@pytest.mark.filterwarnings("error::RuntimeWarning")
def test_scaled_data_chooses_as_unscaled(k, wide, opts):
    a, b = _data(wide)
    sc = 2.0 ** k
    ref = RidgeCV(alphas=GRID ** 2, fit_intercept=True, **opts).fit(a, b)
    x = bl.solve(a * sc, b * sc, lam=("loo", list(GRID * sc)), fit_intercept=True, **opts)
    plain = bl.solve(a, b, lam=("loo", list(GRID)), fit_intercept=True, **opts)
    # the choice is a grid index: exact (it had been index 0 for every scaled case)
    assert np.ldexp(x.report["lam"], -k) == plain.report["lam"] and plain.report["lam"] ** 2 == ref.alpha_
    # x of the scaled problem is x of the unscaled one up to the rounding of two solves of a
    # well-conditioned (cond < 1e3) 8- or 30-column problem: 8 n eps cond, far below the 5x it was off
    got, want = np.asarray(x.to_numpy()), np.asarray(plain.to_numpy())
    assert np.linalg.norm(got - want) <= 8 * 30 * 2.2e-16 * 1e3 * np.linalg.norm(want)
    name = opts.get("scoring")
    if name in ("r2", "explained_variance") or (name is None and "cv" in opts):  # scale-free scores
        assert np.isclose(x.report["best_score_"], plain.report["best_score_"], rtol=1e-10, atol=0)
    elif abs(k) < 500:  # squared errors: 4^k of the unscaled (in range at 2^+-300)
        assert np.isclose(np.ldexp(x.report["best_score_"], -2 * k), plain.report["best_score_"], rtol=1e-10)
