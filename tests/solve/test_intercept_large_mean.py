"""fit_intercept on data whose column means dwarf their spread: every normal-equations route against an
explicitly centered NumPy solve.

The centered Gram quantities had been formed as ``A^T A - m mu mu^T``, rounded relative to
``||A||_F^2 = m (sd^2 + mu^2)``: with means ``10^6`` times the spread (float64) the solution came out
``5e-4`` relative off on a problem of condition near 1 (the update ``2e-3``, the leave-one-out and k-fold
choices then picked another lambda than ``RidgeCV``). The passes now sum the rows less the first row, so the
rounding is relative to ``||A - 1 a_1^T||_F^2``.
"""

from __future__ import annotations

import numpy as np
import pytest

import blocklin as bl
from support.tolerances import eps

M, N, LAM = 2000, 3, 10.0
GRID = np.array([0.3, 1.0, 3.0, 10.0, 30.0])


def _data(dtype, mean, m=M, seed=0):
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((m, N)) + mean * (1.0 + rng.random(N))
    if np.dtype(dtype).kind == "c":
        a = a + 1j * (rng.standard_normal((m, N)) + mean)
    b = a @ rng.standard_normal(N) + rng.standard_normal(m) + mean
    return a.astype(dtype), b.astype(dtype)[:, None]


def _check(x, a, b, lam, w=None, dtype=np.float64):
    """``x`` against NumPy's solve of the centered (weighted) regularized normal equations.

    Forward error by the condition number of ``K = A_c^H W A_c + lam^2 I`` (Higham Thm 7.2): the backward
    error of the two solves, ``8 n eps ||K||``, plus the rounding of the Gram sums over ``m`` rows,
    ``gamma_m`` times the squares summed: ``||A_c||_F^2`` in the reference, ``||A - 1 a_1^T||_F^2`` (the rows
    less the first row) in blocklin's pass, whose rank-one correction by the shifted mean ``d`` adds
    ``m ||d||^2 <= ||A - 1 a_1^T||_F^2`` more; ``eps`` of the output's dtype where it is coarser (the pass
    sums in float64 and rounds ``x`` once)."""
    a = a.astype(np.result_type(a, 1.0))
    b = b.astype(np.result_type(b, 1.0))
    w = np.ones(len(a)) if w is None else w
    mu, bbar = w @ a / w.sum(), w @ b / w.sum()
    ac, bc = (a - mu) * np.sqrt(w)[:, None], (b - bbar) * np.sqrt(w)[:, None]
    m, n = a.shape
    K = ac.conj().T @ ac + lam**2 * np.eye(n)
    ref = np.linalg.solve(K, ac.conj().T @ bc)
    shifted = (a - a[0]) * np.sqrt(w)[:, None]
    e64 = eps(np.float64)
    gram = m * e64 * (np.linalg.norm(ac) ** 2 + 2 * np.linalg.norm(shifted) ** 2)
    kappa = np.linalg.cond(K)
    bound = kappa * (8 * n * e64 * np.linalg.norm(K) + gram) / np.linalg.norm(K, 2) * np.linalg.norm(ref) \
        + 2 * eps(dtype) * np.linalg.norm(ref)
    err = np.linalg.norm(np.asarray(x).reshape(ref.shape) - ref)
    assert err <= bound, f"error {err:.3e} above the bound {bound:.3e} (ratio {err / bound:.3g}; cond {kappa:.3g})"
    return mu, bbar, ref


@pytest.mark.parametrize("dtype,mean", [(np.float64, 1e6), (np.float32, 1e3), (np.complex128, 1e6)])
@pytest.mark.parametrize("memory", [None, "256KiB"])
def test_intercept_of_large_means(dtype, mean, memory):
    a, b = _data(dtype, mean)
    x = bl.solve(a, b, lam=LAM, fit_intercept=True, **({"memory": memory} if memory else {}))
    mu, bbar, ref = _check(x.to_numpy(), a, b, LAM, dtype=dtype)
    # the intercept bbar - mu^T x: its rounding is that of mu^T x, eps |mu| ||x|| (the data's size, not its spread)
    icpt = bbar - mu @ ref
    assert np.abs(np.asarray(x.intercept) - icpt).max() <= 8 * N * eps(dtype) * (np.abs(mu) @ np.abs(ref) + np.abs(bbar)).max()


@pytest.mark.parametrize("memory", [None, "256KiB"])
def test_intercept_of_large_means_weighted_and_sequence(memory):
    a, b = _data(np.float64, 1e6, seed=1)
    w = np.random.default_rng(2).uniform(0.5, 2.0, M)
    kw = {"memory": memory} if memory else {}
    x = bl.solve(a, b, lam=LAM, fit_intercept=True, sample_weight=w, **kw)
    _check(x.to_numpy(), a, b, LAM, w)
    xs = bl.solve(a, b, lam=[1.0, LAM], fit_intercept=True, **kw).to_numpy()
    for j, lam in enumerate([1.0, LAM]):
        _check(xs[:, j:j + 1], a, b, lam)


@pytest.mark.parametrize("cv", [None, 5])
@pytest.mark.parametrize("weighted", [False, True])
def test_intercept_of_large_means_lambda_choice(cv, weighted):
    """Leave-one-out and k-fold: the choice of RidgeCV (on the centered data, which its own centering sees
    alike), and the solution at it."""
    from sklearn.linear_model import RidgeCV

    a, b = _data(np.float64, 1e6, seed=3)
    w = np.random.default_rng(4).uniform(0.5, 2.0, M) if weighted else None
    x = bl.solve(a, b, lam=("loo", GRID), fit_intercept=True, sample_weight=w, memory="256KiB",
                 **({"cv": cv} if cv else {}))
    ref = RidgeCV(alphas=GRID**2, fit_intercept=True, cv=cv).fit(a - a.mean(axis=0), b[:, 0], sample_weight=w)
    assert x.report["lam"] == pytest.approx(np.sqrt(ref.alpha_), rel=1e-12)
    _check(x.to_numpy(), a, b, x.report["lam"], w)


@pytest.mark.parametrize("dtype,mean", [(np.float64, 1e6), (np.complex128, 1e6)])
def test_update_of_large_means(tmp_path, dtype, mean):
    """The update adds the appended rows' sums taken less the same first row the solve kept."""
    a, b = _data(dtype, mean, m=M + 300, seed=5)
    bl.from_array(a[:M], tmp_path / "A.zarr", chunks=(256, N))
    bl.from_array(b[:M], tmp_path / "b.zarr", chunks=(256, 1))
    x = bl.solve(tmp_path / "A.zarr", tmp_path / "b.zarr", lam=LAM, fit_intercept=True, updatable=True,
                 out=tmp_path / "x.zarr")
    _check(x.to_numpy(), a[:M], b[:M], LAM, dtype=dtype)
    bl.append(tmp_path / "A.zarr", a[M:])
    bl.append(tmp_path / "b.zarr", b[M:])
    u = bl.update(tmp_path / "x.zarr")
    assert u.report["updated"]["rows_read"] == 300
    mu, bbar, ref = _check(u.to_numpy(), a, b, LAM, dtype=dtype)
    assert np.abs(np.asarray(u.intercept) - (bbar - mu @ ref)).max() <= \
        8 * N * eps(dtype) * (np.abs(mu) @ np.abs(ref) + np.abs(bbar)).max()


@pytest.mark.gpu
def test_intercept_of_large_means_on_the_gpu():
    """The device branches of the Gram and refinement passes subtract the first row there too (``refine=1``
    makes the refinement pass run)."""
    a, b = _data(np.float64, 1e6, seed=6)
    x = bl.solve(a, b, lam=LAM, fit_intercept=True, refine=1, memory="4MiB", device="gpu", scheduler="sync")
    assert x.report["device"] == "gpu" and x.report["refine_steps"] == 1
    _check(x.to_numpy(), a, b, LAM)
    test_wide_intercept_of_large_means(None, False, np.float64, device="gpu")  # the wide route's SYRK pass on the device


@pytest.mark.parametrize("dtype", [np.float64, np.complex128])
@pytest.mark.parametrize("memory", [None, "256KiB"])
@pytest.mark.parametrize("weighted", [False, True])
def test_wide_intercept_of_large_means(memory, weighted, dtype, device=None):
    """Wide ``A``: the SYRK pass sums the columns less their first entries, ``A_s A_s^T``, which the
    centering does not tell apart from ``A A^T`` (the centered ``P A A^T P`` of the uncentered sums had been
    off by 7e-4 relative with means 1e6 times the spread). Bound: the dual solve's forward error by the
    condition of ``K = A_c W A_c^T + lam^2 I`` (its backward error ``8 m eps ||K||`` and the sums' rounding over
    ``n`` columns, ``||A_c||_F^2`` in the reference and ``||A_s||_F^2`` twice in the pass), carried by
    ``x = A_c^T y``, plus that GEMM's rounding on the uncentered ``A`` (``2 m eps ||A||_F ||y||``: the means
    enter ``x`` once, as in the streaming QR)."""
    rng = np.random.default_rng(8)
    m, n, lam = 30, 60, 3.0
    a = rng.standard_normal((m, n)) + 1e6 * (1 + rng.random(n))
    if dtype == np.complex128:
        a = a + 1j * (rng.standard_normal((m, n)) - 1e6)
    b = a @ rng.standard_normal((n, 1)) / n + rng.standard_normal((m, 1)) + 1e6
    w = rng.uniform(0.5, 2.0, m) if weighted else np.ones(m)
    x = bl.solve(a, b, lam=lam, fit_intercept=True, sample_weight=w if weighted else None,
                 **({"memory": memory} if memory else {}), **({"device": device, "scheduler": "sync"} if device else {}))
    assert device is None or x.report["device"] == device
    S = w.sum()
    mu, bbar = w @ a / S, w @ b / S
    sw = np.sqrt(w)[:, None]
    ac, bc = (a - mu) * sw, (b - bbar) * sw
    K = ac @ ac.conj().T + lam**2 * np.eye(m)
    y = np.linalg.solve(K, bc)
    ref = ac.conj().T @ y
    e64 = eps(np.float64)
    shifted = (a - a[0]) * sw
    kappa = np.linalg.cond(K)
    bound = np.linalg.norm(ac, 2) * np.linalg.norm(y) * kappa * (
        8 * m * e64 * np.linalg.norm(K) + n * e64 * (np.linalg.norm(ac) ** 2 + 2 * np.linalg.norm(shifted) ** 2)) \
        / np.linalg.norm(K, 2) + 2 * m * e64 * np.linalg.norm(a) * np.linalg.norm(y)
    err = np.linalg.norm(x.to_numpy() - ref)
    assert err <= bound, f"error {err:.3e} above the bound {bound:.3e} (ratio {err / bound:.3g}; cond {kappa:.3g})"
    icpt = bbar - mu @ ref  # its rounding: eps |mu| |x| per term, and mu^T x's error from x's
    assert np.abs(np.asarray(x.intercept) - icpt).max() <= 8 * n * e64 * (np.abs(mu) @ np.abs(ref)).max() \
        + np.linalg.norm(mu) * bound


@pytest.mark.parametrize("method", ["auto", "normal", "qr"])
@pytest.mark.parametrize("wide", [False, True])
def test_constant_columns_near_1e200_give_x_zero_and_the_mean_as_intercept(method, wide):
    """``A`` constant per column near ``1e200`` with ``fit_intercept``: the centered ``A`` is exactly 0, so the
    ridge solution at any ``lam > 0`` is ``x = 0`` with the intercept ``mean(b)`` (sklearn's Ridge centers to
    0 and gives that). ``lam = 0.1`` squared underflows in the problem scaled by ``2^-667``: the normal
    equations' Cholesky of the zero Gram matrix failed and the solve was refused as "A^T A + lam^2 I must be
    positive definite ... a larger lam"; the QR route took the centering's rounding (``eps ||A||``) for data
    and gave ``x`` near ``1e-156`` with an intercept of ``5.7e44`` (``-9e49`` wide). The intercept is a mean
    of ``m`` values: ``m eps max|b|``."""
    if wide and method == "normal":
        pytest.skip("the wide route has one Gram form (auto)")
    rng = np.random.default_rng(0)
    m, n = (3, 4) if wide else (50, 3)
    a = np.tile(np.array([1.0, 2.0, -3.0, 4.0][:n]) * 1e200, (m, 1))
    b = rng.standard_normal(m)
    x = bl.solve(a, b, lam=0.1, fit_intercept=True, method=method)
    assert np.array_equal(x.to_numpy().ravel(), np.zeros(n))
    assert np.allclose(x.intercept, b.mean(), rtol=0, atol=m * np.finfo(float).eps * np.abs(b).max())


def _column_scaled_ridge(a, b, lam, intercept):
    """Ridge of ``a`` (centered with ``intercept``) in the column-scaled variables ``z = D x``: ``[A D^-1; lam
    D^-1] z = [b; 0]`` by NumPy's SVD least squares, accurate to its (small) condition; and that condition."""
    ac, bc = (a - a.mean(axis=0), b - b.mean(axis=0)) if intercept else (a, b)
    d = np.abs(ac).max(axis=0)
    m_ = np.vstack([ac / d, np.diag(lam / d)])
    z = np.linalg.lstsq(m_, np.vstack([bc, np.zeros((a.shape[1], b.shape[1]))]), rcond=None)[0]
    return z / d[:, None], np.linalg.cond(m_), d


@pytest.mark.parametrize("intercept", [True, False])
def test_lambda_below_what_the_gram_spectrum_resolves(intercept):
    """Columns of scales 1 and 1e-9 (independent), lam 5.5e-13: the Gram matrix resolves singular values down to
    about sqrt(n eps) ||A|| (3e-8 here), not the 1.6e-9 of the small column. ``method='auto'`` with
    ``fit_intercept`` and a lambda list took the centered Gram spectrum without that test and returned x 100%
    off; now it switches to the streaming QR of ``[1 | A | b]``, as it does without an intercept (and a scalar
    lam whose Cholesky fails switches too, instead of being refused). ``method='normal'`` keeps its route and
    warns (it had said nothing). Reference: the column-scaled problem (condition about 2: accurate to rounding);
    the TSQR and the SVD of ``R`` are normwise backward stable, so the bound is ``100 n kappa eps`` with
    ``kappa = cond([A_c; lam I])`` (1.6e9: a bound of 1e-4, where the Gram spectrum's error was 1)."""
    rng = np.random.default_rng(3)
    m, n = 8, 3
    a = rng.standard_normal((m, n))
    a[:, 1] *= 1e-9
    b = rng.standard_normal((m, 2))
    lams = [5.5e-13, 7.3e-7]
    for lam_arg in (lams, lams[0]):
        x = bl.solve(a, b, lam=lam_arg, fit_intercept=intercept)
        assert x.report["method"] == "qr"
        got = x.to_numpy()
        for j, lam in enumerate(lams if isinstance(lam_arg, list) else [lam_arg]):
            ref, _, _ = _column_scaled_ridge(a, b, lam, intercept)
            ac = a - a.mean(axis=0) if intercept else a
            kappa = np.linalg.cond(np.vstack([ac, lam * np.eye(n)]))  # normwise: the SVD of R is normwise stable
            err = np.linalg.norm(got[:, 2 * j:2 * j + 2] - ref) / np.linalg.norm(ref)
            assert err <= 100 * n * kappa * eps(np.float64), (err, kappa)
    with pytest.warns(Warning, match="does not resolve the directions of A"):
        bl.solve(a, b, lam=lams, fit_intercept=intercept, method="normal")
