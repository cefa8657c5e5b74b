"""blocklin.linalg.solve.bordered_kernel: the intercept's bordered system on the row-scaled kernel (the wide
leave-one-out with fit_intercept, loo.intercept_kernel), and the loss of a kernel summed less a far-off row."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import blocklin as bl
from blocklin.linalg.solve import bordered_kernel as bk
from support.ridge import rows_apart

EPS = float(np.finfo(np.float64).eps)


def test_complement_is_orthonormal_and_orthogonal_to_v():
    """Householder's basis: orthonormal and orthogonal to ``v`` to ``O(m eps)`` (Higham 2002, 19.3), for entries of
    ``v`` from 1e-5 to 2e3 (the scaled ``D^-1 sqrt(w)`` of rows far apart)."""
    rng = np.random.default_rng(3)
    v = rng.uniform(0.5, 2.0, 20)
    v[3], v[-1] = 1e-5, 2e3
    basis = bk.complement(v)
    m = v.size
    assert basis.shape == (m, m - 1)
    assert np.linalg.norm(basis.T @ basis - np.eye(m - 1)) <= 8 * m * EPS
    assert np.linalg.norm(basis.T @ v) <= 8 * m * EPS * np.linalg.norm(v)


@pytest.mark.parametrize("weighted", [False, True])
def test_bordered_q_is_the_intercept_hat_matrix(weighted):
    """``Q = (I - H) / lam^2`` with ``H`` the hat matrix of ``S [1 A]`` and the penalty ``diag(0, lam^2 I)``; both
    sides of a well-conditioned problem within ``(m + n) eps`` times their conditions (norm-wise)."""
    rng = np.random.default_rng(4)
    m, n, lam2 = 12, 30, 0.3
    a = rng.standard_normal((m, n)) + 2.0
    w = rng.uniform(0.5, 2.0, m) if weighted else np.ones(m)
    u = np.sqrt(w)
    g = (a - a[5]) @ (a - a[5]).T  # any row's shift: Q does not change
    factor = bk.bordered_factor(u[:, None] * g * u[None, :], u, lam2)
    assert factor is not None
    z = u[:, None] * np.hstack([np.ones((m, 1)), a])
    pen = np.diag(np.r_[0.0, np.full(n, lam2)])
    normal = z.T @ z + pen
    hat = z @ np.linalg.solve(normal, z.T)
    ref = (np.eye(m) - hat) / lam2
    tol = 4 * (m + n) * EPS * (factor[3] + np.linalg.cond(normal))
    diag = bk.bordered_inverse_diagonal(factor)
    assert np.linalg.norm(diag - np.diag(ref)) <= tol * np.linalg.norm(np.diag(ref))
    b = rng.standard_normal((m, 2))
    got = bk.bordered_solve(factor, u[:, None] * b)
    want = ref @ (u[:, None] * b)
    assert np.linalg.norm(got - want) <= tol * np.linalg.norm(ref, 2) * np.linalg.norm(u[:, None] * b)


def test_shift_loss_finds_a_far_row_first():
    """Rows ``1e5`` and ``5e-4`` among rows near 1: the kernel of the rows less the ``1e5`` row rounds every row
    relative to ``1e5`` (``rho2`` near ``1e10`` at a small ``lam``); less a typical row, by at most a factor ``m``
    (a row less itself: its distance to the others), and the typical row found is not the far one."""
    rng = np.random.default_rng(0)
    m = 20
    a, _ = rows_apart(rng, m, 40)
    a = a[[3] + [i for i in range(m) if i != 3]]  # the 1e5 row first
    lam2 = np.array([1e-8, 1e-2])
    t, rho2 = bk.shift_loss((a - a[0]) @ (a - a[0]).T, np.ones(m), lam2)
    assert t != 0 and rho2.min() > 1e8
    t2, rho2_typical = bk.shift_loss((a - a[t]) @ (a - a[t]).T, np.ones(m), lam2)
    assert t2 != 0 and rho2_typical.max() <= m
    again = bk.shifted_by((a - a[t]) @ (a - a[t]).T, 0)  # in memory: the rounding of the kernel it came of
    assert np.allclose(again, (a - a[0]) @ (a - a[0]).T, rtol=0, atol=64 * 40 * EPS * 1e10)


def test_wide_loo_with_an_intercept_warns_where_the_scaled_kernel_is_ill_conditioned(tmp_path):
    """Rows far apart with two rows alike to 1e-9: at ``lam = 1e-7`` the bordered system's ``F`` is not numerically
    positive definite and the centered spectrum's errors are all there is; the leave-one-out errors there had been
    returned without a word."""
    rng = np.random.default_rng(0)
    a, b = rows_apart(rng, 20, 40)
    a[6] = a[5] * (1 + 1e-9) + 1e-9 * rng.standard_normal(40)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        bl.solve(a, b, lam=("loo", [1e-7, 1e-1]), fit_intercept=True, temp_dir=str(tmp_path))
    said = [str(c.message) for c in caught if "leave-one-out errors with fit_intercept" in str(c.message)]
    assert len(said) == 1 and "lam in [1e-07, 1e-07]" in said[0] and "no digit" in said[0], said


@pytest.mark.parametrize("weighted", [False, True])
def test_bordered_fit_solves_the_bordered_system(weighted):
    """``(y, x0)`` of ``[[K + lam^2 I, u], [u^T, 0]] [y; x0] = [c; 0]`` (the k-fold fits and the solve at given
    lambdas): against the bordered system solved whole, for a well-conditioned problem, within ``(m + n) eps``
    times its condition (norm-wise)."""
    rng = np.random.default_rng(6)
    m, n, lam2 = 12, 30, 0.3
    a = rng.standard_normal((m, n)) + 2.0
    u = np.sqrt(rng.uniform(0.5, 2.0, m) if weighted else np.ones(m))
    k = u[:, None] * ((a - a[2]) @ (a - a[2]).T) * u[None, :]
    c = rng.standard_normal((m, 2))
    factor = bk.bordered_factor(k, u, lam2)
    y, x0 = bk.bordered_fit(factor, k, u, lam2, c)
    big = np.block([[k + lam2 * np.eye(m), u[:, None]], [u[None, :], np.zeros((1, 1))]])
    want = np.linalg.solve(big, np.vstack([c, np.zeros((1, 2))]))
    tol = 4 * (m + n) * EPS * np.linalg.cond(big) * np.linalg.norm(want)
    assert np.linalg.norm(np.vstack([y, x0[None, :]]) - want) <= tol
    assert np.linalg.norm(u @ y) <= tol  # the border's constraint
