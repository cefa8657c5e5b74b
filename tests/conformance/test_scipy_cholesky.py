"""SciPy's ``scipy/linalg/tests/test_decomp_cholesky.py`` ported to ``blocklin.cholesky``/``cho_solve``.

Each test names the SciPy test it ports. SciPy compares with ``assert_array_almost_equal`` (6
decimals), a tolerance of its own; here the residual ``||A - C^T C||`` is held to the Cholesky
backward-error bound and the factor to its forward-error bound (tests/support/tolerances.py). The
20 x 20 cases also run at the least budget the planner accepts (several tiles).

Not applicable (not ported):

=======================================================  ================================================
SciPy test                                               why
=======================================================  ================================================
TestCholesky.test_check_finite                           ``check_finite=False`` (no such switch: every
                                                         input is read and checked)
TestCholesky.test_int_overflow                           ``overwrite_a=True`` on a 47000^2 identity,
                                                         SciPy's ``xslow`` segfault regression
TestCholeskyBanded (all 7 tests),                        banded storage (``cholesky_banded``,
TestOverwrite.test_cholesky_banded/test_cho_solve_banded ``cho_solve_banded``): no banded format
TestOverwrite.test_cho_factor                            ``cho_factor`` is ``cholesky`` here (ported as
                                                         test_cholesky's no-overwrite case)
=======================================================  ================================================
"""

from __future__ import annotations

import numpy as np
import pytest
import scipy.linalg

import blocklin as bl
from blocklin.errors import BlocklinError
from support.conformance import dense, run
from support.tolerances import assert_close_to, assert_factorization, eps

COMPLEX = pytest.mark.filterwarnings("default")  # the complex cases: no mark (complex LU/Cholesky pass)
DTYPES = [int, float, np.float32, pytest.param(complex, marks=COMPLEX), pytest.param(np.complex64, marks=COMPLEX)]


def _check(a, lower, c):
    c = dense(c)
    a = np.asarray(a)
    prod = c @ c.conj().T if lower else c.conj().T @ c
    assert np.array_equal(c, np.tril(c) if lower else np.triu(c))
    assert_factorization(a, prod, factors=(c, c))  # Higham Thm 10.3
    ref = scipy.linalg.cholesky(a, lower=lower)
    # the factor is unique: forward error c n eps kappa(A) ||C|| (Higham Thm 10.8)
    assert_close_to(c, ref, bound=4 * a.shape[0] * eps(c.dtype) * np.linalg.cond(a) * np.linalg.norm(ref),
                    what="Cholesky factor against SciPy's")


def test_simple():
    """TestCholesky.test_simple: upper, then lower of ``C C^T``."""
    a = np.array([[8, 2, 3], [2, 9, 3], [3, 3, 6]], dtype=float)
    c = dense(bl.cholesky(a, lower=False))
    _check(a, False, c)
    c = c.T
    _check(c @ c.T, True, bl.cholesky(c @ c.T, lower=True))


@COMPLEX
def test_simple_complex():
    """TestCholesky.test_simple_complex: Hermitian from a complex triangular factor."""
    m = np.array([[3 + 1j, 3 + 4j, 5], [0, 2 + 2j, 2 + 7j], [0, 0, 7 + 4j]])
    a = m.conj().T @ m
    c = dense(bl.cholesky(a, lower=False))
    _check(a, False, c)
    c = c.T
    a = c @ c.conj().T
    _check(a, True, bl.cholesky(a, lower=True))


@pytest.mark.parametrize("memory", [None, "least"])
@pytest.mark.parametrize("k", [0, 1])
def test_random(k, memory):
    """TestCholesky.test_random (its two draws): 20 x 20 with a heavy diagonal."""
    rng = np.random.default_rng(k)
    m = rng.random([20, 20])
    m[np.diag_indices(20)] = 20 * (.1 + np.diag(m))
    a = m.T @ m
    c = dense(run(lambda mem: bl.cholesky(a, lower=False, memory=mem), memory))
    _check(a, False, c)
    a = c.T @ c.T.T
    _check(a, True, run(lambda mem: bl.cholesky(a, lower=True, memory=mem), memory))


@COMPLEX
@pytest.mark.parametrize("k", [0, 1])
def test_random_complex(k):
    """TestCholesky.test_random_complex (its two draws)."""
    rng = np.random.default_rng(k)
    m = rng.random([20, 20]) + 1j * rng.random([20, 20])
    m[np.diag_indices(20)] = 20 * (.1 + np.abs(np.diag(m)))
    a = m.conj().T @ m
    _check(a, False, bl.cholesky(a, lower=False))
    _check(a, True, bl.cholesky(a, lower=True))


@pytest.mark.parametrize("dt", DTYPES)
@pytest.mark.parametrize("dt_b", DTYPES)
def test_empty(dt, dt_b):
    """TestCholesky.test_empty: 0 x 0 factor and solves, SciPy's dtypes; an empty list is refused."""
    c = bl.cholesky(np.empty((0, 0), dtype=dt))
    assert c.shape == (0, 0)
    assert c.dtype == scipy.linalg.cholesky(np.eye(2, dtype=dt)).dtype
    ref = scipy.linalg.cho_solve((np.eye(2, dtype=dt), True), np.ones(2, dtype=dt_b)).dtype
    x = bl.cho_solve(c, np.asarray([], dtype=dt_b))
    assert dense(x).size == 0 and x.dtype == ref
    x = bl.cho_solve(c, np.empty((0, 0), dtype=dt_b))
    assert x.shape == (0, 0) and x.dtype == ref
    for bad in (np.array([]), np.array([[]]), [], [[]]):
        with pytest.raises((BlocklinError, ValueError)):
            bl.cholesky(bad)


@pytest.mark.parametrize("dt", DTYPES)
def test_cho_factor_empty(dt):
    """TestChoFactor.test_empty: a 0 x 0 factor of SciPy's dtype."""
    c = bl.cholesky(np.empty((0, 0), dtype=dt))
    assert c.shape == (0, 0) and c.dtype == scipy.linalg.cho_factor(np.eye(2, dtype=dt))[0].dtype


def test_no_overwrite():
    """TestOverwrite.test_cholesky / test_cho_factor / test_cho_solve: the inputs are never written."""
    rng = np.random.default_rng(2)
    a = rng.random((3, 3))
    a = a @ a.T + 3 * np.eye(3)
    keep = a.copy()
    c = bl.cholesky(a)
    x = np.array([[2, -1, 0], [-1, 2, -1], [0, -1, 2]], dtype=float)
    xc = bl.cholesky(x)
    b = rng.random(3)
    bkeep = b.copy()
    sol = dense(bl.cho_solve(xc, b)).ravel()
    assert np.array_equal(a, keep) and np.array_equal(b, bkeep) and c.shape == (3, 3)
    assert_close_to(sol, np.linalg.solve(x, b), bound=8 * 3 * eps(float) * np.linalg.cond(x) * np.linalg.norm(sol),
                    what="cho_solve")
