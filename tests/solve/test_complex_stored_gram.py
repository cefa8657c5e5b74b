"""The stored-Gram route of complex data (issue 28): ``solve`` of a complex ``A`` whose regularized
``min(m, n)``-square Gram matrix exceeds the budget (``blocklin/linalg/solve/stored_gram.py``).

``K = A^H A + lam^2 I`` (``A A^H + lam^2 I`` for wide ``A``) stored by the region HERK, factored
``K = L L^H`` by the out-of-core Cholesky, ``x`` from the two triangular solves (``L^H`` with
``trans="C"``) and refined with complex residuals; the dual ``x = A^H y`` for wide ``A``.

References are the regularized normal equations in complex128, computed here with NumPy
(``numpy.linalg.solve`` of ``A^H A + lam^2 I`` against ``A^H b``; the dual form for wide ``A``). Bounds:
:func:`support.tolerances.assert_solve`'s ``8 n eps cond(K)`` (Higham 2002, Thm 7.2) with ``eps`` of
the parts' dtype, times ``3 sqrt(2)`` for complex arithmetic (Higham 2002, Lemma 3.5). Every case runs
at the least budget the call names (:func:`support.conformance.least_budget`) and asserts that the
stored-Gram route was taken (the report's ``gram`` and ``method_reason``).
"""

from __future__ import annotations

import numpy as np
import pytest

import blocklin as bl
from support.budgets import sweep
from support.conformance import least_budget
from support.complex_ridge import CDTYPES, COMPLEX, check as _check, crandn as _crandn, problem as _problem
from support.tolerances import eps

SCHEDULERS = ["sync", "threads", "processes"]


def _stored(x):
    r = x.report
    assert r["gram"] == "out of core" and "stored and factored by the out-of-core tiled Cholesky" in r["method_reason"]


@pytest.mark.parametrize("dtype", CDTYPES)
@pytest.mark.parametrize("shape", [(300, 64), (64, 300)])
@pytest.mark.parametrize("lam", [0.0, 0.5])
def test_stored_gram_against_the_normal_equations(dtype, shape, lam):
    if lam == 0.0 and shape[0] < shape[1]:
        lam = 1e-3  # the dual system of a wide A needs lam > 0 to be definite in the working precision
    a, b = _problem(shape, dtype, seed=1)
    x = least_budget(lambda memory: bl.solve(a, b, lam=lam, memory=memory))
    _stored(x)
    assert ("A^H A" if shape[0] >= shape[1] else "A A^H") in x.report["method_reason"]
    got = x.to_numpy()
    _check(got, a, b, lam, dtype)
    # the reported norms are those of the complex residual and solution (a sum of |.|^2)
    g = got.astype(np.complex128)
    res = np.linalg.norm(b.astype(np.complex128) - a.astype(np.complex128) @ g, axis=0)
    tol = 100 * COMPLEX * max(shape) * eps(dtype)
    # x was rounded to the output's dtype after the residual pass: |dr| <= ||A|| ||dx|| + ||b|| eps (absolute)
    scale = np.linalg.norm(a.astype(np.complex128), 2) * np.linalg.norm(g, axis=0) + np.linalg.norm(b, axis=0)
    np.testing.assert_allclose(x.report["residual_norm"], res, rtol=tol, atol=float(tol * scale.max()))
    np.testing.assert_allclose(x.report["solution_norm"], np.linalg.norm(g, axis=0), rtol=tol)


@pytest.mark.parametrize("shape", [(300, 64), (64, 300)])
def test_every_scheduler_gives_the_same_bits(shape):
    a, b = _problem(shape, np.complex128, seed=2)
    xs = [least_budget(lambda memory: bl.solve(a, b, lam=0.3, memory=memory, scheduler=s)) for s in SCHEDULERS]
    for x in xs:
        _stored(x)
    _check(xs[0].to_numpy(), a, b, 0.3, np.complex128)
    for x in xs[1:]:
        np.testing.assert_array_equal(x.to_numpy(), xs[0].to_numpy())


@pytest.mark.parametrize("refine", [0, 2])
def test_refinement_steps(refine):
    """``refine=0`` is the factored solve alone (its error ``cond(K) eps``), ``refine=2`` two complex refinement
    steps ``x += K^-1 (A^H (b - A x) - lam^2 x)``: both within the bound; the report counts the steps."""
    a, b = _problem((300, 64), np.complex64, seed=3)
    x = least_budget(lambda memory: bl.solve(a, b, lam=0.2, refine=refine, memory=memory))
    _stored(x)
    assert x.report["refine_steps"] == refine
    _check(x.to_numpy(), a, b, 0.2, np.complex64)


def test_real_a_with_complex_b_is_promoted():
    rng = np.random.default_rng(4)
    a = rng.standard_normal((300, 64))
    b = _crandn(rng, (300, 1), np.complex128)
    x = least_budget(lambda memory: bl.solve(a, b, lam=0.1, memory=memory))
    _stored(x)
    _check(x.to_numpy(), a.astype(np.complex128), b, 0.1, np.complex128)


@pytest.mark.parametrize("shape", [(400, 120), (120, 400)])
def test_budget_minimums_hold_for_the_complex_stored_gram(shape):
    """The sweep of tests/solve/test_least_squares_budget_minimums.py: every refusal names the whole call's
    minimum, a retry there runs and is right, and the stored-Gram route is among the budgets met."""
    a, b = _problem(shape, np.complex128, k=1, seed=5)
    lam, routes = 0.4, set()

    def run(memory):
        return bl.solve(a, b, lam=lam, memory=memory)

    def check(x):
        routes.add(x.report["gram"])
        _check(x.to_numpy(), a, b, lam, np.complex128)

    assert sweep(run, check) >= 1
    assert "out of core" in routes
