"""``report["condition_estimate"]`` of the ridge routes that had none: the out-of-core stored-Gram route
(:mod:`blocklin.linalg.solve.stored_gram`: a lower estimate of ``cond_2(K)`` from the diagonals of the stored
``K = A^T A + lam^2 I`` and of its Cholesky factor) and ``positive=True`` (:mod:`blocklin.linalg.solve.positive`:
LAPACK's ``pocon`` estimate of ``cond_1(K)``, as the normal equations report it). Each warns as the
in-memory normal equations do past ``1 / AUTO_RCOND`` and stays silent on a well-posed problem.

References: NumPy's ``cond`` of ``K`` (the estimates are lower bounds of it, and ``pocon``'s within a
factor 10 of it, Higham 2002, 15.3), ``numpy.linalg.solve`` of the normal equations and
``scipy.optimize.nnls`` of the stacked ``[A; lam I]`` for ``x``.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import scipy.optimize

import blocklin as bl
from blocklin.errors import BlocklinWarning
from support.conformance import least_budget
from support.placements import DEVICES, PLACEMENTS, placement_kwargs
from support.tolerances import assert_solve, eps


def _problem(cond: float, seed: int, m: int = 300, n: int = 48) -> tuple[np.ndarray, np.ndarray]:
    """Columns graded from 1 to ``1 / cond``: ``cond_2(A^T A)`` about ``cond^2`` (times the Gaussian's few)."""
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((m, n)) * np.logspace(0, -np.log10(cond), n)
    return a, rng.standard_normal((m, 2))


def _k(a: np.ndarray, lam: float) -> np.ndarray:
    return a.T @ a + lam**2 * np.eye(a.shape[1])


@pytest.mark.parametrize("placement", PLACEMENTS)
def test_stored_gram_well_posed_reports_an_estimate_and_stays_silent(placement, request):
    """``cond(A)`` near 10: an estimate at most ``cond_2(K)^(1/2)`` (a lower bound, refined: the stacked
    problem's), no warning, and ``x`` to Higham's ``8 n eps cond(K)`` of the normal equations; on every
    scheduler and device."""
    a, b = _problem(10.0, seed=1)
    lam = 0.1
    with warnings.catch_warnings():
        warnings.simplefilter("error", BlocklinWarning)
        x = least_budget(lambda memory: bl.solve(a, b, lam=lam, memory=memory, **placement_kwargs(placement, request)))
    r = x.report
    assert r["gram"] == "out of core" and r["refine_steps"] == 1
    kappa = np.linalg.cond(_k(a, lam))
    assert 1.0 <= r["condition_estimate"] <= np.sqrt(kappa) * (1 + 1e-8), (r["condition_estimate"], kappa)
    assert r["condition_estimate"] * eps(np.float64) < 1e-10
    assert_solve(x.to_numpy(), np.linalg.solve(_k(a, lam), a.T @ b), _k(a, lam), cond=kappa)


def test_stored_gram_ill_conditioned_warns_with_the_estimate():
    """Columns graded over 1e7 at a tiny ``lam``: ``cond_2(K)`` near 1e14, past ``1 / AUTO_RCOND``; the
    estimate (from ``K``'s and ``L``'s diagonals) within a factor 10 below it, and the warning names it
    (the route had reported ``condition_estimate`` nowhere and said nothing)."""
    a, b = _problem(1e7, seed=2)
    lam = 1e-9
    with pytest.warns(BlocklinWarning, match=r"the stored A\^T A \+ lam\^2 I \(over the budget\) has a condition "
                                             r"estimate of [0-9.]+e\+1[34]"):
        x = least_budget(lambda memory: bl.solve(a, b, lam=lam, memory=memory))
    assert x.report["gram"] == "out of core"
    kappa = np.linalg.cond(_k(a, lam))
    est = x.report["condition_estimate"] ** 2  # refined: cond_2(K)^(1/2) reported
    assert kappa / 10 <= est <= kappa * (1 + 1e-8), (est, kappa)


def _nnls(a, b, lam):
    """``argmin_{x >= 0} ||A x - b||^2 + lam^2 ||x||^2`` per column: NNLS of the stacked ``[A; lam I]``."""
    n = a.shape[1]
    stacked = np.vstack([a, lam * np.eye(n)])
    return np.column_stack([scipy.optimize.nnls(stacked, np.concatenate([b[:, j], np.zeros(n)]))[0]
                            for j in range(b.shape[1])])


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("memory", [None, "least"], ids=["in-memory", "streamed"])
def test_positive_well_posed_reports_an_estimate_and_stays_silent(memory, device):
    """``positive=True`` on a well-posed problem: ``cond_1(K)``'s ``pocon`` estimate (within a factor 10
    below NumPy's), no warning, ``x`` that of the stacked NNLS to ``8 n eps cond(K)``; its Gram pass on
    the device, and streamed at the least budget."""
    a, b = _problem(10.0, seed=3)
    lam = 0.1
    with warnings.catch_warnings():
        warnings.simplefilter("error", BlocklinWarning)
        x = (least_budget if memory else lambda f: f(None))(
            lambda mem: bl.solve(a, b, lam=lam, positive=True, device=device, **({"memory": mem} if mem else {})))
    kappa1 = np.linalg.cond(_k(a, lam), 1)
    assert kappa1 / 10 <= x.report["condition_estimate"] <= kappa1 * (1 + 1e-8)
    assert_solve(x.to_numpy(), _nnls(a, b, lam), _k(a, lam))


def test_positive_ill_conditioned_warns_with_the_estimate():
    """The graded columns at a tiny ``lam`` with ``positive=True``: the estimate near ``cond_1(K)`` (1e14),
    and the normal equations' warning (without the refinement it does not make)."""
    a, b = _problem(1e7, seed=4)
    lam = 1e-9
    with pytest.warns(BlocklinWarning, match=r"A\^T A \+ lam\^2 I has reciprocal condition") as rec:
        x = bl.solve(a, b, lam=[lam, 10.0], positive=True)
    assert not any("refinement helps" in str(w.message) for w in rec)
    kappa1 = np.linalg.cond(_k(a, lam), 1)
    assert kappa1 / 10 <= x.report["condition_estimate"] <= kappa1 * (1 + 1e-8)  # the worst lambda's
