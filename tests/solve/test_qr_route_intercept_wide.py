"""``method="qr"`` with ``fit_intercept`` (tall ``A``: ``[1 | A | b]`` streamed through the TSQR) and for a wide
``A`` (the dual form from the R factor of ``A^T``): against scikit-learn's ``Ridge`` and NumPy's solutions of the
centered, stacked problem ``[A_c; lam I] x = [b_c; 0]`` (tall) or the dual ``x = A^H (A A^H + lam^2 I)^-1 b``
from NumPy's SVD (wide), in memory and at the least budget, on every scheduler (bit-identical), and at the
minimum each budget refusal names (``blocklin/linalg/solve/qr_route.py``).

Tolerances: the QR route's forward error is ``c n eps (kappa + kappa^2 ||r|| / (||A_c|| ||x||)) g ||x||`` with
``kappa`` the regularized problem's condition number (not its square, the normal equations') and ``g`` the
growth of centering (``1 + max |mu_j| / std_j``: the means' rounding against the spread), plus the output dtype's
rounding of ``x``.
"""

from __future__ import annotations


import numpy as np
import pytest
from sklearn.linear_model import Ridge
from support.budgets import sweep
from support.conformance import run
from support.ridge import EPS64, problem

import blocklin as bl
from blocklin.errors import ParameterError

SCHEDULERS = ["sync", "threads", "processes"]


def _centered(a, b, intercept):
    a, b = np.asarray(a, np.complex128 if np.iscomplexobj(a) else np.float64), np.asarray(b).reshape(len(a), -1)
    b = b.astype(np.result_type(a, b, np.float64))
    if not intercept:
        return a, b, np.zeros(a.shape[1], a.dtype), np.zeros(b.shape[1], b.dtype)
    mu, bbar = a.mean(axis=0), b.mean(axis=0)
    return a - mu, b - bbar, mu, bbar


def reference(a, b, lam, intercept):
    """``x`` of ``min ||A_c x - b_c||^2 + lam^2 ||x||^2`` from NumPy's SVD of ``A_c``, and ``bbar - mu^T x``."""
    ac, bc, mu, bbar = _centered(a, b, intercept)
    u, s, vt = np.linalg.svd(ac, full_matrices=False)
    x = vt.conj().T @ ((s / (s**2 + lam**2))[:, None] * (u.conj().T @ bc))
    return x, bbar - mu @ x


def qr_bound(a, b, lam, intercept, x_ref, dtype, const=16.0):
    """``c n eps (kappa + kappa^2 ||r|| / (||A_c|| ||x||)) g ||x||`` + the output dtype's rounding."""
    ac, bc, mu, _ = _centered(a, b, intercept)
    s = np.linalg.svd(ac, compute_uv=False)
    kappa = np.sqrt((s[0] ** 2 + lam**2) / (s[-1] ** 2 + lam**2))
    xn = float(np.linalg.norm(x_ref))
    r = float(np.linalg.norm(bc - ac @ x_ref))
    g = 1 + float(np.max(np.abs(mu) / np.maximum(np.abs(ac).std(axis=0), 1e-300))) \
        if intercept else 1.0
    return const * max(a.shape) * EPS64 * (kappa + kappa**2 * r / (s[0] * max(xn, 1e-300))) * g * xn \
        + 2 * float(np.finfo(dtype).eps) * xn


def dual_rounding(a, b, lam, intercept, dtype):
    """The wide route's ``x = A^H y`` is a GEMM in the output dtype: ``2 m eps ||A||_F ||y||``."""
    ac, bc, _, _ = _centered(a, b, intercept)
    u, s, _ = np.linalg.svd(ac, full_matrices=False)
    y = u @ ((1 / (s**2 + lam**2))[:, None] * (u.conj().T @ bc))
    return 2 * a.shape[0] * float(np.finfo(dtype).eps) * float(np.linalg.norm(a)) * float(np.linalg.norm(y))


def check(x, a, b, lam, intercept, dtype):
    x_ref, i_ref = reference(a, b, lam, intercept)
    got = x.to_numpy()
    assert got.dtype == np.dtype(dtype)
    bound = qr_bound(a, b, lam, intercept, x_ref, dtype)
    if a.shape[0] < a.shape[1]:
        bound += dual_rounding(a, b, lam, intercept, dtype)
    assert np.linalg.norm(got - x_ref) <= bound, (np.linalg.norm(got - x_ref), bound)
    if intercept:
        _, _, mu, _ = _centered(a, b, True)
        ib = float(np.linalg.norm(mu)) * bound + 64 * float(np.finfo(dtype).eps) * (
            float(np.linalg.norm(mu)) * float(np.linalg.norm(x_ref)) + float(np.abs(i_ref).max()))
        assert np.abs(np.asarray(x.intercept) - i_ref).max() <= ib
    assert x.report["method"] == "qr"


def data(m, n, k, dtype, seed=0):
    a, b = problem(m, n, k, seed=seed)
    if np.dtype(dtype).kind == "c":
        a2, b2 = problem(m, n, k, seed=seed + 1)
        a, b = a + 1j * a2, b + 1j * b2
    return a.astype(dtype), b.astype(dtype)


@pytest.mark.parametrize("memory", [None, "least"])
@pytest.mark.parametrize("dtype", [np.float64, np.float32, np.complex128])
def test_tall_intercept_matches_the_centered_problem(dtype, memory):
    a, b = data(300, 12, 2, dtype)
    x = run(lambda mem: bl.solve(a, b, lam=0.7, method="qr", fit_intercept=True, memory=mem, scheduler="sync"),
            memory)
    check(x, a, b, 0.7, True, dtype)
    assert x.report["fit_intercept"] is True


def test_tall_intercept_matches_ridge():
    a, b = data(300, 12, 2, np.float64)
    x = bl.solve(a, b, lam=0.7, method="qr", fit_intercept=True, scheduler="sync")
    ref = Ridge(alpha=0.49, fit_intercept=True, solver="svd").fit(a, b)
    x_ref, _ = reference(a, b, 0.7, True)
    bound = qr_bound(a, b, 0.7, True, x_ref, np.float64)
    assert np.linalg.norm(x.to_numpy() - ref.coef_.T) <= 2 * bound
    assert np.abs(x.intercept - ref.intercept_).max() <= 1e3 * EPS64 * (1 + np.abs(ref.intercept_).max())


@pytest.mark.parametrize("lam", [[0.1, 1.0, 10.0], "gcv"])
def test_tall_intercept_sequence_and_rule(lam):
    a, b = data(250, 10, 1, np.float64, seed=2)
    x = bl.solve(a, b, lam=lam, method="qr", fit_intercept=True, scheduler="sync")
    lams = x.report["lam"] if isinstance(x.report["lam"], list) else [x.report["lam"]]
    got = x.to_numpy()
    icpt = np.asarray(x.intercept).reshape(len(lams), -1)
    for i, value in enumerate(lams):
        x_ref, i_ref = reference(a, b, value, True)
        bound = qr_bound(a, b, value, True, x_ref, np.float64)
        assert np.linalg.norm(got[:, i:i + 1] - x_ref) <= bound
        assert np.abs(icpt[i] - i_ref).max() <= 1e3 * EPS64 * (1 + np.abs(i_ref).max()) + 10 * bound * np.abs(a).max()


def test_large_means_ill_conditioned_qr_and_normal_keep_the_digits():
    """Means 1e6 times the spread and cond(A_c) ~ 1e4: the ones column's Householder step keeps the digits,
    and so do the normal equations, whose pass sums the rows less the first row (the rank-one correction
    ``A^T A - m mu mu^T`` of the uncentered sums had cancelled about 12 digits)."""
    rng = np.random.default_rng(7)
    m, n = 400, 6
    q1, _ = np.linalg.qr(rng.standard_normal((m, n)))
    q1 -= q1.mean(axis=0)
    ac = q1 * np.sqrt(m) * np.logspace(0, -4, n)
    a = ac + 1e6
    b = ac @ rng.standard_normal((n, 1)) + 5.0 + 1e-8 * rng.standard_normal((m, 1))
    lam = 1e-6
    x_ref, i_ref = reference(a, b, lam, True)
    bound = qr_bound(a, b, lam, True, x_ref, np.float64)
    for method in ("qr", "normal"):
        x = bl.solve(a, b, lam=lam, method=method, fit_intercept=True, scheduler="sync")
        assert np.linalg.norm(x.to_numpy() - x_ref) <= bound, method


def wide_reference(a, b, lam, intercept):
    """The dual form ``x = A_c^H (A_c A_c^H + lam^2 I)^-1 b_c`` from NumPy's SVD (the same minimizer)."""
    return reference(a, b, lam, intercept)


@pytest.mark.parametrize("intercept", [False, True])
@pytest.mark.parametrize("memory", [None, "least"])
@pytest.mark.parametrize("dtype", [np.float64, np.float32, np.complex128])
def test_wide_matches_the_dual_solution(dtype, memory, intercept):
    at, bt = data(160, 24, 2, dtype, seed=4)
    a = np.ascontiguousarray(at.T)  # 24 x 160
    b = bt[:24]
    x = run(lambda mem: bl.solve(a, b, lam=0.3, method="qr", fit_intercept=intercept, memory=mem,
                                 scheduler="sync"), memory)
    check(x, a, b, 0.3, intercept, dtype)
    assert x.report["orientation"] == "wide"


def test_wide_sequence():
    at, _ = data(120, 16, 1, np.float64, seed=5)
    a = np.ascontiguousarray(at.T)
    b = np.random.default_rng(1).standard_normal((16, 1))
    x = bl.solve(a, b, lam=[0.1, 1.0], method="qr", scheduler="sync")
    for i, lam in enumerate([0.1, 1.0]):
        x_ref, _ = wide_reference(a, b, lam, False)
        assert np.linalg.norm(x.to_numpy()[:, i:i + 1] - x_ref) <= qr_bound(a, b, lam, False, x_ref, np.float64)


@pytest.mark.parametrize("wide", [False, True])
def test_schedulers_bit_identical(wide, tmp_path):
    a, b = data(300, 12, 2, np.float64)
    if wide:
        a, b = np.ascontiguousarray(a[:40].T), b[:12]
    sa = bl.from_array(a, str(tmp_path / "a.zarr"), chunks=(32, 8) if wide else (64, 12))
    out = {}
    for s in SCHEDULERS:
        x = bl.solve(sa, b, lam=0.5, method="qr", fit_intercept=True, memory="2MiB", scheduler=s)
        out[s] = (x.to_numpy(), np.asarray(x.intercept))
    for s in SCHEDULERS[1:]:
        assert np.array_equal(out[s][0], out["sync"][0]) and np.array_equal(out[s][1], out["sync"][1])


@pytest.mark.parametrize("wide", [False, True])
def test_named_minimum_of_the_whole_call_runs(wide, tmp_path):
    a, b = data(400, 30, 2, np.float64, seed=3)
    if wide:
        a, b = np.ascontiguousarray(a[:300].T), b[:30]
    sa = bl.from_array(a, str(tmp_path / "a.zarr"), chunks=(16, 64) if wide else (64, 16))

    def call(memory):
        return bl.solve(sa, b, lam=0.5, method="qr", fit_intercept=True, memory=memory, scheduler="sync")

    assert sweep(call, lambda x: check(x, a, b, 0.5, True, np.float64)) >= 1


def test_sample_weight_still_refused_with_qr():
    a, b = data(100, 5, 1, np.float64)
    with pytest.raises(ParameterError, match="unweighted"):
        bl.solve(a, b, lam=0.5, method="qr", fit_intercept=True, sample_weight=np.ones(100))


@pytest.mark.parametrize("method", ["auto", "qr"])
def test_wide_intercept_at_a_small_lambda_keeps_the_solution(method):
    """Two rows ``2^600`` apart, ``fit_intercept``, ``lam`` 1e-82 of ``||A||``: the centered ``A A^T`` has the
    intercept's direction in its null space, weighted ``1 / lam^2`` against a rounding-level part of ``b``; that
    part of ``y`` dwarfed the rest and the centering cancelled it: ``x`` 100% off and the intercept that of
    ``x = 0`` (Gram route). The direction is taken out of the dual spectrum. Reference: the dual form in mpmath
    at 500 digits; the centered ``A`` is ``[d; -d]`` (rank one, condition 1 on its range): a few eps."""
    import mpmath as mp

    rng = np.random.default_rng(2)
    a = rng.standard_normal((2, 11))
    a[1] = np.ldexp(a[1], 600)
    b = rng.standard_normal(2)
    lam = 1e99
    with mp.workdps(500):
        A = mp.matrix(a.tolist())
        mu = [(A[0, j] + A[1, j]) / 2 for j in range(11)]
        ac = mp.matrix([[A[i, j] - mu[j] for j in range(11)] for i in range(2)])
        bc = mp.matrix([b[0] - (b[0] + b[1]) / 2, b[1] - (b[0] + b[1]) / 2])
        g = ac * ac.T + mp.mpf(lam) ** 2 * mp.eye(2)
        det = g[0, 0] * g[1, 1] - g[0, 1] * g[1, 0]
        y = mp.matrix([(g[1, 1] * bc[0] - g[0, 1] * bc[1]) / det, (g[0, 0] * bc[1] - g[1, 0] * bc[0]) / det])
        xm = ac.T * y
        ref = np.array([float(v) for v in xm])
        ref0 = float((b[0] + b[1]) / 2 - mp.fsum(mu[j] * xm[j] for j in range(11)))
    x = bl.solve(a, b, lam=lam, fit_intercept=True, method=method)
    assert np.allclose(x.to_numpy().ravel(), ref, rtol=1e-12, atol=0)
    assert np.allclose(x.intercept, ref0, rtol=1e-12, atol=0)


@pytest.mark.parametrize("method", ["auto", "qr", "normal"])
@pytest.mark.parametrize("lam", [1e99, 1e150])
def test_wide_intercept_drops_a_direction_below_the_centerings_rounding(method, lam):
    """Three rows, the middle one ``2^600`` times the others: the centered ``A`` has singular values near
    ``2^600`` and near 1 (rows 0 and 2 differ by O(1)), and the second is below the centering's rounding
    (``eps 2^600``), so float64 resolves it as 0. Its weight in the dual ``y``, ``beta / lam^2``, had only
    multiplied ``A^T``'s rounding: ``x`` 1e266 times too large and an intercept of ``-1.5e147`` (Gram route;
    ``2.7e130`` QR) for ``0.448``. Leaving it out of ``y`` drops its part of ``x``, at most ``s_2 |beta_2| /
    lam^2`` (below 1e-190 of ``x`` here), beside the rounding of the one resolved direction (condition 1 on
    it: a few eps); 1e-12 leaves room for ``m n eps``. Reference: the dual form in mpmath at 500 digits."""
    import mpmath as mp

    rng = np.random.default_rng(0)
    a = rng.standard_normal((3, 11))
    a[1] = np.ldexp(a[1], 600)
    b = rng.standard_normal(3)
    with mp.workdps(500):
        A, B = mp.matrix(a.tolist()), mp.matrix(b.tolist())
        mu = [mp.fsum(A[i, j] for i in range(3)) / 3 for j in range(11)]
        bbar = mp.fsum(B) / 3
        ac = mp.matrix([[A[i, j] - mu[j] for j in range(11)] for i in range(3)])
        bc = mp.matrix([B[i] - bbar for i in range(3)])
        xm = ac.T * mp.lu_solve(ac * ac.T + mp.mpf(lam) ** 2 * mp.eye(3), bc)
        ref = np.array([float(v) for v in xm])
        ref0 = float(bbar - mp.fsum(mu[j] * xm[j] for j in range(11)))
    x = bl.solve(a, b, lam=lam, fit_intercept=True, method=method)
    scale = np.ldexp(1.0, -int(np.frexp(np.abs(ref).max())[1]))  # x near 2^-600: its norms in range
    assert np.linalg.norm((x.to_numpy().ravel() - ref) * scale) <= 1e-12 * np.linalg.norm(ref * scale)
    assert np.allclose(x.intercept, ref0, rtol=1e-12, atol=0)
