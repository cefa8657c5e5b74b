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
from blocklin.runtime.powers import ldexp

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


@pytest.mark.parametrize("q", [(0, -600), (500, -515), (-600, 0)])
@pytest.mark.parametrize("scoring", [None, "r2", "neg_mean_absolute_error"])
@pytest.mark.parametrize("opts", [dict(), dict(fit_intercept=True), dict(sample_weight="ramp")],
                         ids=["plain", "intercept", "weights"])
@pytest.mark.parametrize("wide", [False, True], ids=["tall", "wide"])
def test_per_target_columns_far_apart_choose_as_alone(wide, opts, scoring, q):
    """``lam_per_target`` with a column of ``b`` near ``2^-600`` beside one near 1 (or ``2^500`` and
    ``2^-515``, within the ``2^1021`` one power of two keeps): one power for ``b`` left that column's squared
    leave-one-out errors near ``2^-1200``, flushed to 0 for every lambda, and the first grid value won the tie
    (``0.01`` where the column solved alone chooses 10, ``x`` 3.2x off tall, 970x wide; ``r2`` reported as 1),
    without a word. Each column's errors are squared divided by its own power of two now: the choice is each
    column's alone (a grid index: exact; the grid's scores are far from ties), and ``x_j`` is ``2^q_j`` times
    the unscaled column's solution up to the rounding of two solves of the same problem, ``2 * 8 n eps
    cond(K)`` with ``cond(K) <= 1 + (s_1 / lam)^2``, below ``1 + 50^2 / 0.01^2`` for these Gaussian ``A``
    at the grid's smallest ``lam``, and far smaller at the lambdas chosen (bounded by ``cond`` at the choice)."""
    rng = np.random.default_rng(3)
    m, n = (6, 15) if wide else (40, 6)
    a, b = rng.standard_normal((m, n)), rng.standard_normal((m, 2))
    kw = dict(opts)
    if kw.get("sample_weight") == "ramp":
        kw["sample_weight"] = np.linspace(0.5, 2.0, m)
    grid = [0.01, 0.1, 1.0, 10.0, 100.0]
    e = np.array(q)
    x = bl.solve(a, ldexp(b, e[None, :]), lam=("loo", grid), lam_per_target=True, scoring=scoring, **kw)
    s1 = np.linalg.norm(a, 2)
    for j in range(2):
        alone = bl.solve(a, b[:, j:j + 1], lam=("loo", grid), scoring=scoring, **kw)
        assert x.report["lam"][j] == alone.report["lam"], (j, x.report["lam"], alone.report["lam"])
        lam = alone.report["lam"]
        want = np.asarray(alone.to_numpy())[:, 0]
        got = ldexp(np.asarray(x.to_numpy())[:, j], -int(e[j]))
        cond = 1 + (s1 / lam) ** 2
        assert np.linalg.norm(got - want) <= 2 * 8 * n * np.finfo(float).eps * cond * np.linalg.norm(want), j
        if scoring == "r2":  # scale-free: the column's own score (it had read 1, 0 / 0 of flushed sums)
            assert np.isclose(x.report["best_score_"][j], alone.report["best_score_"], rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("scoring", ["r2", "explained_variance"])
@pytest.mark.parametrize("how", ["loo tall", "loo wide", "cv wide"])
def test_scale_free_mean_of_columns_far_apart(how, scoring):
    """``r2`` and ``explained_variance`` averaged over a column near 1 and one near ``2^-600``: the one power for
    ``b`` had left the small column's held-out sums of squares near ``2^-1200``, flushed to 0, its score read 1 at
    every lambda, and the mean chose by the other column alone (leave-one-out: 100 where the data choose 10, and
    a ``best_score_`` of 0.48 for -0.004; ``cv=3`` wide: a ``best_score_`` of -0.75 for -3.6), without a word.
    The scores are scale-free column by column, so the answer is the unscaled ``b``'s: the same grid index
    (exact), ``best_score_`` to the rounding of two runs (``rtol`` as ``test_scaled_data_chooses_as_unscaled``),
    ``x_j`` to ``2 * 8 n eps cond(K)``, ``cond(K) <= 1 + (s_1 / lam)^2`` at the chosen ``lam``."""
    rng = np.random.default_rng(3)
    m, n = (40, 6) if how == "loo tall" else (6, 15)
    a, b = rng.standard_normal((m, n)), rng.standard_normal((m, 2))
    kw = {"scoring": scoring} | ({"cv": 3} if how.startswith("cv") else {})
    grid = [0.01, 0.1, 1.0, 10.0, 100.0]
    e = np.array([0, -600])
    x = bl.solve(a, ldexp(b, e[None, :]), lam=("loo", grid), **kw)
    ref = bl.solve(a, b, lam=("loo", grid), **kw)
    assert x.report["lam"] == ref.report["lam"]
    assert np.isclose(x.report["best_score_"], ref.report["best_score_"], rtol=1e-10, atol=0)
    got, want = ldexp(np.asarray(x.to_numpy()), -e[None, :]), np.asarray(ref.to_numpy())
    cond = 1 + (np.linalg.norm(a, 2) / ref.report["lam"]) ** 2
    assert np.linalg.norm(got - want) <= 2 * 8 * n * np.finfo(float).eps * cond * np.linalg.norm(want)


