"""A wide ``A`` with ``fit_intercept``: ``x = A^H (P y)`` with ``1^T (P y) = 0`` is computed as ``(A - 1 a_1^T)^H (P y)``
(the columns less their first entries), whose rounding, ``gamma_(m+1) |A_s|^T |P y|`` (Higham 2002, 3.5), is
relative to the spread of ``A``'s columns, not their means. The product of the uncentered ``A`` had been about
``c eps`` of ``x`` for column means ``c`` times their spread: ``x`` 15-30% off for means ``1e6`` and spread
``1e-9`` (scikit-learn, which centers ``A`` itself: 1e-15). ``report["condition_estimate"]`` counts the product's
rounding (``(m + 1) ||A_s||_F ||P y|| / ||x||``) beside the spectral bound, and warns where the sum reaches
``1 / eps``. Reference: the block normal equations of ``[1 | A]`` in mpmath (80 digits, the data exact)."""

from __future__ import annotations

import mpmath as mp
import numpy as np
import pytest

import blocklin as bl
from blocklin.errors import IllConditionedWarning
from support.tolerances import eps

EPS = eps(np.float64)


def _exact(a, b, lam, w=None):
    """``(x, intercept)`` minimizing ``sum_i w_i (b_i - c - a_i x)^2 + lam^2 ||x||^2`` (``w = 1`` without)."""
    m, n = a.shape
    with mp.workdps(80):
        c = mp.matrix([[1] + [mp.mpf(float(v)) for v in row] for row in a])
        cw = mp.matrix([[mp.mpf(float(1.0 if w is None else w[i])) * c[i, j] for j in range(n + 1)] for i in range(m)])
        k = cw.T * c
        for i in range(1, n + 1):
            k[i, i] += mp.mpf(float(lam)) ** 2
        cols = [mp.lu_solve(k, cw.T * mp.matrix([mp.mpf(float(v)) for v in b[:, j]])) for j in range(b.shape[1])]
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


def _relerr(x, ref):
    return np.linalg.norm(np.asarray(x, dtype=np.float64) - ref, axis=0) / np.linalg.norm(ref, axis=0)


@pytest.mark.parametrize("method", ["auto", "qr"])
@pytest.mark.parametrize("memory", [None, "256KiB"])
@pytest.mark.parametrize("mean,spread", [(1e6, 1e-9), (1e8, 1e-6), (1e8, 1.0)])
def test_means_far_past_the_spread_keep_x(memory, mean, spread, method):
    """Means ``1e8`` and more times the spread: ``x`` and the intercept to about ``m eps`` (the product of the
    shifted columns; on the QR route also the R factor of the shifted columns), at least as close as
    scikit-learn's ``Ridge(solver="svd")`` (0.5 off at the first two). The uncentered product had given ``x``
    15-30% off (means ``1e6``, spread ``1e-9``) with an IllConditionedWarning, and the QR route's factor of
    the uncentered ``A^T`` ``x`` 100% off there (``9e-9`` at means ``1e8``, spread 1)."""
    import warnings

    from sklearn.linear_model import Ridge

    a, b, lam = _data(mean, spread)
    x_ref, i_ref = _exact(a, b, lam)
    with warnings.catch_warnings():
        warnings.simplefilter("error", IllConditionedWarning)
        x = bl.solve(a, b, lam=lam, fit_intercept=True, method=method, **({"memory": memory} if memory else {}))
    assert x.report["method"] == ("normal" if method == "auto" else method)
    err = _relerr(x.to_numpy(), x_ref)
    delta = x.report["condition_estimate"] * EPS
    assert np.all(err <= delta), (err, delta)
    assert delta < 1e-12, delta
    sk = Ridge(alpha=lam ** 2, solver="svd").fit(a, b)
    assert np.all(err <= np.maximum(10 * _relerr(sk.coef_.T, x_ref), 1e3 * EPS)), (err, _relerr(sk.coef_.T, x_ref))
    icpt = np.asarray(x.report["intercept"])
    assert np.all(np.abs(icpt - i_ref) <= delta * (np.abs(i_ref) + np.abs(a.mean(axis=0)) @ np.abs(x_ref)))


def test_means_far_past_the_spread_keep_x_with_sample_weights():
    """The weighted centering ``P_w`` (``1^T P_w^T y = 0``): the same shifted product."""
    a, b, lam = _data(1e6, 1e-9)
    w = np.random.default_rng(5).uniform(0.5, 2.0, a.shape[0])
    x_ref, _ = _exact(a, b, lam, w)
    x = bl.solve(a, b, lam=lam, fit_intercept=True, sample_weight=w, memory="256KiB")
    err = _relerr(x.to_numpy(), x_ref)
    delta = x.report["condition_estimate"] * EPS
    assert np.all(err <= delta) and delta < 1e-12, (err, delta)


def test_float32_data_with_large_means():
    """float32 data (the product's sums in float64, rounded to float32 once): ``x`` within the float64 bound plus
    that one rounding, ``eps(float32)`` (the uncentered product had been ``1e6 eps(float64)`` more)."""
    a, b, _ = _data(1e6, 1.0)
    a, b = a.astype(np.float32), b.astype(np.float32)
    x_ref, _ = _exact(a.astype(np.float64), b.astype(np.float64), 1e-3)
    for memory in (None, "256KiB"):
        x = bl.solve(a, b, lam=1e-3, fit_intercept=True, **({"memory": memory} if memory else {}))
        assert x.to_numpy().dtype == np.float32
        err = _relerr(x.to_numpy(), x_ref)
        assert np.all(err <= x.report["condition_estimate"] * EPS + eps(np.float32)), err


def test_centered_data_keep_their_estimate():
    """Means 0: the product's term is ``m ||A||_F ||y|| / ||x||``, of the size of the spectral bound's own."""
    a, b, lam = _data(0.0, 1.0)
    x_ref, _ = _exact(a, b, 1.0)
    x = bl.solve(a, b, lam=1.0, fit_intercept=True)
    err = np.linalg.norm(x.to_numpy() - x_ref, axis=0) / np.linalg.norm(x_ref, axis=0)
    assert np.all(err <= x.report["condition_estimate"] * EPS)
    assert x.report["condition_estimate"] * EPS < 1e-12


def _force_gram_gemm(monkeypatch, tiles):
    """The wide route's out-of-core GEMM fallback for ``A A^T`` (at each shape tried the least budget fits the SYRK
    pass, so its refusal is forced), ``tiles``: its tiles forced to ``8 x 8`` and k-panels of 16 (several tiles,
    op(B)'s first column in one of them only, and several panels). Returns the list each GEMM run appends to."""
    import dataclasses

    import blocklin.linalg.solve.wide as wide
    from blocklin.errors import BudgetError
    from blocklin.linalg.products.gemm import Gemm
    from blocklin.linalg.products.gram_kernels import gram_pass_kernel

    real, real_gemm, real_plan = wide.run_pass, wide._wide_gram_gemm, Gemm.plan
    used = []

    def run_pass(job, kernel, *args, **kwargs):
        if kernel is gram_pass_kernel:
            raise BudgetError("memory: the m x m sums (forced)")
        return real(job, kernel, *args, **kwargs)

    def plan(self, job, *args, **kwargs):
        p = real_plan(self, job, *args, **kwargs)
        if tiles and self.shape[0] == self.shape[1] and self.trans_b:
            p = dataclasses.replace(p, tm=8, tn=8, tk=16, out_chunks=(8, 8), k_lead=0)
        return p

    monkeypatch.setattr(wide, "run_pass", run_pass)
    monkeypatch.setattr(wide, "_wide_gram_gemm", lambda ctx: used.append(1) or real_gemm(ctx))
    monkeypatch.setattr(Gemm, "plan", plan)
    return used


@pytest.mark.parametrize("tiles", [False, True])
@pytest.mark.parametrize("weights", [False, True])
@pytest.mark.parametrize("mean", [1e4, 1e6])
def test_out_of_core_gram_fallback_keeps_the_pass_accuracy(monkeypatch, mean, weights, tiles):
    """Where the SYRK pass's ``m x m`` sums do not fit the budget the wide route forms the Gram matrix by an
    out-of-core GEMM, which reads ``A``'s panels less ``a_1`` (row 0 of ``A``), as the SYRK pass shifts them
    (docs/solve.md, Intercepts): ``x`` and the intercept within the same bound as that pass, ``condition_estimate``
    eps, and that bound at the pass route's size (below 1e-12). The GEMM of the uncentered ``A`` rounded
    relative to ``||A||_F^2``: ``c^2 eps`` lost for means ``c`` times the spread (``c = 1e4``: ``x`` 1.3e-7
    off, the estimate 6e-6; ``c = 1e6``: 1.4e-3 and 7e-2, with an IllConditionedWarning)."""
    import warnings

    a, b, _ = _data(mean, 1.0, m=20, n=40, k=2)
    w = np.random.default_rng(5).uniform(0.5, 2.0, a.shape[0]) if weights else None
    x_ref, i_ref = _exact(a, b, 0.5, w)
    used = _force_gram_gemm(monkeypatch, tiles)
    with warnings.catch_warnings():
        warnings.simplefilter("error", IllConditionedWarning)
        x = bl.solve(a, b, lam=0.5, fit_intercept=True, sample_weight=w)
    assert used
    err = _relerr(x.to_numpy(), x_ref)
    delta = x.report["condition_estimate"] * EPS
    assert np.all(err <= delta) and delta < 1e-12, (err, delta)
    # the intercept bbar - mu^T x takes x's relative error times |mu|^T |x|
    icpt = np.asarray(x.report["intercept"])
    assert np.all(np.abs(icpt - i_ref) <= delta * (np.abs(i_ref) + np.abs(a.mean(axis=0)) @ np.abs(x_ref)))


@pytest.mark.gpu
@pytest.mark.parametrize("tiles", [False, True])
def test_out_of_core_gram_fallback_on_gpu(monkeypatch, tiles):
    """The shifted panels of the fallback GEMM (shifted on the host as read) through the device's tiles (a GPU,
    or the CuPy stand-in: ``pytest --cupy-standin``): the pass route's bound, as on the CPU."""
    a, b, _ = _data(1e6, 1.0, m=20, n=40, k=2)
    x_ref, _ = _exact(a, b, 0.5)
    used = _force_gram_gemm(monkeypatch, tiles)
    x = bl.solve(a, b, lam=0.5, fit_intercept=True, device="gpu", scheduler="sync")
    assert used and x.report["device"] == "gpu"
    err = _relerr(x.to_numpy(), x_ref)
    delta = x.report["condition_estimate"] * EPS
    assert np.all(err <= delta) and delta < 1e-12, (err, delta)


@pytest.mark.gpu
def test_means_far_past_the_spread_keep_x_on_gpu():
    """The shifted product's GPU branch (a GPU, or the CuPy stand-in: ``pytest --cupy-standin``)."""
    a, b, lam = _data(1e6, 1e-9)
    x_ref, _ = _exact(a, b, lam)
    x = bl.solve(a, b, lam=lam, fit_intercept=True, device="gpu", scheduler="sync", memory="256KiB")
    assert x.report["device"] == "gpu"
    err = _relerr(x.to_numpy(), x_ref)
    delta = x.report["condition_estimate"] * EPS
    assert np.all(err <= delta) and delta < 1e-12, (err, delta)


@pytest.mark.parametrize("kind", ["cpu", pytest.param("gpu", marks=pytest.mark.gpu)])
def test_tsqr_shift_first_factors_the_shifted_columns(kind):
    """The TSQR kernel's ``shift_first`` (the wide QR route's intercept): the factor ``[[R, c], [0, rho]]`` of
    ``[S - S[:, :1] 1^T | S[:, :1]]``, so ``R^H R = S_s^H S_s`` and ``R^H c = S_s^H S[:, 0]`` (``c = Q^H a_1``),
    on the host and on the device branch (a GPU, or the CuPy stand-in: ``pytest --cupy-standin``); the strip
    itself unchanged. Householder QR's backward error: a few ``(rows) eps`` of ``||[S_s | S[:, 0]]||^2``."""
    from blocklin.device import get_device
    from blocklin.linalg.blocks.tsqr import tsqr_kernel

    rng = np.random.default_rng(7)
    strips = [rng.standard_normal((9, 5)) + 1e6, rng.standard_normal((7, 5)) + 1e6]
    dev = get_device(kind)
    params = {"dtype": "float64", "shift_first": True, "ends": (16,)}
    state, r0 = None, 0
    for s in strips:
        d = dev.to_device(s.copy())
        state, _ = tsqr_kernel(dev, (d,), slice(r0, r0 + s.shape[0]), params, state)
        r0 += s.shape[0]
        assert np.array_equal(dev.to_host(d), s)
    stacked = np.vstack(strips)
    t = np.hstack([stacked - stacked[:, :1], stacked[:, :1]])
    full = np.asarray(state["r"])
    assert full.shape == (6, 6)
    tol = 50 * 16 * EPS * np.linalg.norm(t) ** 2
    assert np.linalg.norm(full.T @ full - t.T @ t) <= tol
    r, c = full[:5, :5], full[:5, 5]
    assert np.linalg.norm(r.T @ c - t[:, :5].T @ t[:, 5]) <= tol
