"""``method="auto"`` of a wide ridge (``m < n``) takes the QR route (the R factor of ``A^T``) where the dual form's
error bound is :data:`~blocklin.linalg.solve.wide_auto.AUTO_DUAL_MARGIN` times the QR route's or more.

The dual form ``x = A^T (A A^T + lam^2 I)^-1 b`` is off by up to ``eps ||A||^2 / lam^2`` relative (the computed
``A A^T``): with singular values from ``||A||`` down to ``1e-8 ||A||`` it gave ``x`` ``3e-5`` off at
``lam = 1e-6 ||A||`` and ``2e-9`` at ``1e-4 ||A||``, where the stacked problem ``[A; lam I]`` allows ``5e-8`` and
``7e-10``; the QR route gives ``5e-10`` and ``8e-12``.

Bound (the QR route, backward stable for the stacked least-squares problem ``min ||K x - [b; 0]||``,
``K = [A_c; lam I]``, ``A_c`` the centered ``A`` with an intercept): Wedin's theorem (Higham, *Accuracy and
Stability of Numerical Algorithms*, 2002, Theorem 20.1), to first order,
``||dx|| / ||x|| <= d kappa (2 + (kappa + 1) ||r_K|| / (||K|| ||x||))`` with ``kappa = ||K|| / lam`` (a wide ``A``
leaves ``n - m`` singular values of ``K`` at ``lam``), ``||K|| = (||A_c||^2 + lam^2)^(1/2)``,
``||r_K||^2 = ||b_c - A_c x||^2 + lam^2 ||x||^2``, and ``d`` the relative backward error: the Householder TSQR of the
``n x m`` ``A^T`` (``gamma_(c n)``, Higham 19.4, with the tree's few levels), the SVD of ``R`` (``max(m, n) eps``),
``y = V diag(.) V^T b`` and ``x = A^T y`` (``gamma_m``), together ``d = 2 (m + n) eps`` (``c = 2`` covers the
levels and the second-order terms). All of ``kappa``, ``||r_K||`` and ``||x||`` are the reference's (exact), per
right-hand side. The reference: the ridge solution in mpmath at 60 digits on the data as given (exact in binary).
"""

from __future__ import annotations

import warnings

import mpmath as mp
import numpy as np
import pytest

import blocklin as bl
from blocklin.errors import BudgetError, IllConditionedWarning
from support.ridge import EPS64

M, N = 9, 16
SCALE = 3.7  # ||A||: the rule is relative to it


def _matrix(seed: int = 5, low: float = -8) -> np.ndarray:
    """``M x N``, singular values ``SCALE`` down to ``10^low SCALE`` (log-spaced), plus column means with
    ``offset`` (none here: the intercept tests add their own)."""
    rng = np.random.default_rng(seed)
    u = np.linalg.qr(rng.standard_normal((M, M)))[0]
    v = np.linalg.qr(rng.standard_normal((N, N)))[0][:M]
    return (u * (SCALE * np.logspace(0, low, M))) @ v


def _reference(a: np.ndarray, b: np.ndarray, lam: float, intercept: bool = False, w=None):
    """``(x, intercept, ||r_K||, ||A_c||)`` per column, ``min ||D (A_c x - b_c)||^2 + lam^2 ||x||^2`` in mpmath."""
    m, n = a.shape
    w = np.ones(m) if w is None else w
    with mp.workdps(60):
        A, B = mp.matrix(a.tolist()), mp.matrix(b.tolist())
        W = [mp.mpf(float(v)) for v in w]
        S = mp.fsum(W)
        mu = [mp.fsum(W[i] * A[i, j] for i in range(m)) / S if intercept else mp.mpf(0) for j in range(n)]
        bb = [mp.fsum(W[i] * B[i, c] for i in range(m)) / S if intercept else mp.mpf(0) for c in range(B.cols)]
        d = [mp.sqrt(v) for v in W]
        Ac = mp.matrix([[d[i] * (A[i, j] - mu[j]) for j in range(n)] for i in range(m)])
        Bc = mp.matrix([[d[i] * (B[i, c] - bb[c]) for c in range(B.cols)] for i in range(m)])
        K = Ac * Ac.T + mp.mpf(lam) ** 2 * mp.eye(m)
        xs, icpt, rk = [], [], []
        for c in range(B.cols):
            x = Ac.T * mp.lu_solve(K, Bc.column(c))
            r = Bc.column(c) - Ac * x
            rk.append(float(mp.sqrt(mp.fsum(v**2 for v in r) + mp.mpf(lam) ** 2 * mp.fsum(v**2 for v in x))))
            icpt.append(float(bb[c] - mp.fsum(mu[j] * x[j] for j in range(n))))
            xs.append([float(v) for v in x])
        norm_a = float(mp.svd_r(Ac, compute_uv=False)[0])
    return np.array(xs).T, np.array(icpt), np.array(rk), norm_a


def _stacked_bound(x_ref: np.ndarray, rk: np.ndarray, norm_a: float, lam: float, m: int, n: int) -> np.ndarray:
    """The QR route's bound on ``||dx||`` per column (module docstring)."""
    norm_k = float(np.hypot(norm_a, lam))
    kappa = norm_k / lam
    xn = np.linalg.norm(x_ref, axis=0)
    return 2 * (m + n) * EPS64 * kappa * (2 * xn + (kappa + 1) * rk / norm_k)


def _rhs(seed: int = 7) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((M, 2))


@pytest.mark.parametrize("intercept", [False, True])
@pytest.mark.parametrize("rel", [1e-6, 1e-4, 1e-2])
def test_wide_auto_within_the_stacked_problems_bound(rel, intercept):
    """``lam = rel ||A||``: ``x`` (and the intercept) within the stacked problem's bound; at ``1e-6`` and ``1e-4``
    the dual form's ``x`` was not (``method="auto"`` had kept it), and the report says which route and why."""
    a = _matrix() + (np.random.default_rng(3).standard_normal(N) if intercept else 0.0)
    b = _rhs()
    lam = rel * SCALE
    x_ref, icpt_ref, rk, norm_a = _reference(a, b, lam, intercept)
    bound = _stacked_bound(x_ref, rk, norm_a, lam, M, N)
    assert np.all(bound < 0.1 * np.linalg.norm(x_ref, axis=0))  # the bound leaves x a digit
    with warnings.catch_warnings():
        warnings.simplefilter("error", IllConditionedWarning)
        x = bl.solve(a, b, lam=lam, fit_intercept=intercept)
    err = np.linalg.norm(x.to_numpy() - x_ref, axis=0)
    assert np.all(err <= bound), (rel, err, bound)
    if rel <= 1e-4:
        assert x.report["method"] == "qr"
        assert "switched to the QR route" in x.report["method_reason"]
    if intercept:  # x0 = bbar - mu^T x: mu^T dx, plus the rounding of the means' products
        mu = np.abs(a).mean(axis=0)
        tol = np.linalg.norm(mu) * bound + 4 * (M + N) * EPS64 * (np.abs(b).max() + mu @ np.abs(x_ref))
        assert np.all(np.abs(np.asarray(x.intercept) - icpt_ref) <= tol)


def test_wide_auto_keeps_the_dual_form_where_it_is_as_accurate():
    """At ``lam`` near ``||A||`` the dual form's bound is below the QR route's: one pass, ``method="normal"``."""
    a, b = _matrix(), _rhs()
    x = bl.solve(a, b, lam=SCALE)
    assert x.report["method"] == "normal"
    x_ref, _, rk, norm_a = _reference(a, b, SCALE)
    assert np.all(np.linalg.norm(x.to_numpy() - x_ref, axis=0) <= _stacked_bound(x_ref, rk, norm_a, SCALE, M, N))


def test_wide_explicit_normal_keeps_the_dual_form():
    """``method="normal"`` is the dual form as documented: its ``x`` off by about ``eps ||A||^2 / lam^2`` at
    ``lam = 1e-6 ||A||``, which ``report["condition_estimate"]`` covers (docs/solve.md, the dual form's accuracy)."""
    a, b = _matrix(), _rhs()
    lam = 1e-6 * SCALE
    x_ref, _, _, _ = _reference(a, b, lam)
    x = bl.solve(a, b, lam=lam, method="normal")
    assert x.report["method"] == "normal" and "dual form" in x.report["method_reason"]
    rel = np.linalg.norm(x.to_numpy() - x_ref, axis=0) / np.linalg.norm(x_ref, axis=0)
    assert np.all(rel <= x.report["condition_estimate"] * EPS64)


def test_wide_auto_with_sample_weights_keeps_the_dual_form():
    """The R factor is of the unweighted ``A`` (``method="qr"`` refuses weights): ``auto`` keeps the dual form, and
    its condition estimate covers the error."""
    a, b = _matrix(), _rhs()
    w = np.random.default_rng(2).uniform(0.5, 2.0, M)
    lam = 1e-4 * SCALE
    x_ref, _, _, _ = _reference(a, b, lam, w=w)
    x = bl.solve(a, b, lam=lam, sample_weight=w)
    assert x.report["method"] == "normal"
    rel = np.linalg.norm(x.to_numpy() - x_ref, axis=0) / np.linalg.norm(x_ref, axis=0)
    assert np.all(rel <= x.report["condition_estimate"] * EPS64)


def test_wide_auto_sequence_takes_the_qr_route_for_every_lambda():
    """A sequence holding a small lambda: one spectrum, the QR route's, for all of them, each within its bound."""
    a, b = _matrix(), _rhs()
    lams = [1e-6 * SCALE, SCALE]
    x = bl.solve(a, b, lam=lams)
    xs = x.to_numpy()
    for i, lam in enumerate(lams):
        x_ref, _, rk, norm_a = _reference(a, b, lam)
        err = np.linalg.norm(xs[:, 2 * i:2 * i + 2] - x_ref, axis=0)
        assert np.all(err <= _stacked_bound(x_ref, rk, norm_a, lam, M, N)), (lam, err)
    assert x.report["method"] == "qr"


@pytest.mark.parametrize("rule", ["gcv", ("loo", [1e-6 * SCALE, 1e-5 * SCALE])])
def test_wide_auto_rule_with_a_small_choice_gives_the_qr_routes_x(rule):
    """A rule whose choice is small: the final ``x`` is that of the QR route, as ``method="qr"`` gives it (the
    choice made again on the R factor's spectrum), within the stacked problem's bound at the chosen lambda."""
    a = _matrix()
    b = a @ np.random.default_rng(4).standard_normal((N, 1)) + 1e-13 * np.random.default_rng(6).standard_normal((M, 1))
    x = bl.solve(a, b, lam=rule)
    lam = float(x.report["lam"])
    assert lam < 1e-3 * SCALE and x.report["method"] == "qr", (lam, x.report["method_reason"])
    q = bl.solve(a, b, lam=rule, method="qr")
    assert float(q.report["lam"]) == lam
    np.testing.assert_array_equal(x.to_numpy(), q.to_numpy())
    x_ref, _, rk, norm_a = _reference(a, b, lam)
    assert np.all(np.linalg.norm(x.to_numpy() - x_ref, axis=0) <= _stacked_bound(x_ref, rk, norm_a, lam, M, N))


def test_wide_auto_keeps_the_dual_form_where_the_qr_pass_does_not_fit(monkeypatch):
    """The TSQR pass over the budget: the dual form is kept, with a warning that gives the bounds' ratio and the
    memory the QR route needs (the call's plan asks only for the dual form's passes)."""
    from blocklin.linalg.solve import least_squares_budget

    monkeypatch.setattr(least_squares_budget, "wide_qr_refusal",
                        lambda *args, **kw: BudgetError("the TSQR pass needs more", minimum=1 << 40))
    a, b = _matrix(), _rhs()
    with pytest.warns(IllConditionedWarning, match="does not fit memory=.*at least 1.00 TiB"):
        x = bl.solve(a, b, lam=1e-6 * SCALE)
    assert x.report["method"] == "normal"


def test_wide_auto_switch_resumes_from_both_passes(tmp_path, monkeypatch):
    """Interrupted after the dual form's pass and the TSQR pass, the resumed run loads both (the same choice from
    the recorded Gram matrix) and gives the uninterrupted run's bits."""
    import blocklin.linalg.solve.wide as wide

    a, b = _matrix(), _rhs()
    args = (bl.from_array(a, tmp_path / "a.zarr").path, bl.from_array(b, tmp_path / "b.zarr").path)
    lam = 1e-6 * SCALE
    ref = bl.solve(*args, lam=lam, out=str(tmp_path / "ref.zarr"))
    assert ref.report["method"] == "qr"

    def interrupted(*_args, **_kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(wide, "unscaled_x", interrupted)
    with pytest.raises(KeyboardInterrupt):
        bl.solve(*args, lam=lam, out=str(tmp_path / "x.zarr"), resume=True)
    monkeypatch.undo()
    x = bl.solve(*args, lam=lam, out=str(tmp_path / "x.zarr"), resume=True)
    assert {"wide-gram", "wide-tsqr-pass"} <= set(x.report["resumed_passes"])
    assert x.report["method"] == "qr"
    np.testing.assert_array_equal(x.to_numpy(), ref.to_numpy())


@pytest.mark.parametrize("intercept", [False, True])
def test_wide_auto_complex_takes_the_qr_route(intercept):
    """Complex data: the same rule on ``A A^H``'s spectrum; switched, ``x`` is ``method="qr"``'s bit for bit (the
    QR route's accuracy on complex data: tests/solve/test_complex_least_squares.py), and the dual form's was
    about ``2e-5`` from it."""
    rng = np.random.default_rng(1)
    u = np.linalg.qr(rng.standard_normal((M, M)) + 1j * rng.standard_normal((M, M)))[0]
    v = np.linalg.qr(rng.standard_normal((N, N)) + 1j * rng.standard_normal((N, N)))[0][:M]
    a = (u * (SCALE * np.logspace(0, -8, M))) @ v
    b = rng.standard_normal((M, 2)) + 1j * rng.standard_normal((M, 2))
    lam = 1e-6 * SCALE
    x = bl.solve(a, b, lam=lam, fit_intercept=intercept)
    q = bl.solve(a, b, lam=lam, fit_intercept=intercept, method="qr")
    assert x.report["method"] == "qr"
    np.testing.assert_array_equal(x.to_numpy(), q.to_numpy())
    if intercept:
        np.testing.assert_array_equal(x.intercept, q.intercept)


def _min_norm_bound(a: np.ndarray, x_ref: np.ndarray) -> np.ndarray:
    """The QR route's bound on ``||dx||`` per column at ``lam = 0`` (the minimum-norm solution of a full-row-rank
    wide ``A``, ``r = 0``): Wedin's ``d kappa(A) (2 + ...)`` as the module docstring's, taken as ``3 d kappa(A)``
    relative (docs/solve.md), ``kappa(A)`` in mpmath at 60 digits."""
    with mp.workdps(60):
        s = mp.svd_r(mp.matrix(a.tolist()), compute_uv=False)
        kappa = float(max(s) / min(s))
    return 3 * 2 * (M + N) * EPS64 * kappa * np.linalg.norm(x_ref, axis=0)


def _auto_minimum_norm(a, b):
    """``solve(a, b, lam=0)`` with ``method="auto"``, its ``x`` checked within the QR route's bound
    (:func:`_min_norm_bound`, itself under a tenth of ``||x||``) of the mpmath minimum-norm solution."""
    x_ref, _, _, _ = _reference(a, b, 0.0)
    bound = _min_norm_bound(a, x_ref)
    assert np.all(bound < 0.1 * np.linalg.norm(x_ref, axis=0))
    x = bl.solve(a, b, lam=0.0)
    err = np.linalg.norm(x.to_numpy() - x_ref, axis=0)
    assert np.all(err <= bound), (err, bound)
    return x


@pytest.mark.parametrize("low", [-7, -4])
def test_wide_auto_minimum_norm_takes_the_qr_route(low):
    """``lam = 0`` (the minimum-norm solution), singular values ``||A||`` to ``10^low ||A||``: the dual form squares
    ``kappa(A)`` (``5e-4`` off at ``1e-7``, ``3e-9`` at ``1e-4``), the QR route's bound is ``3 d kappa(A)``.
    ``method="auto"`` had never switched at ``lam = 0`` (both bounds read as infinite, their ratio as 0); now it
    takes the QR route and ``x`` is within that route's bound."""
    a, b = _matrix(low=low), _rhs()
    x = _auto_minimum_norm(a, b)
    assert x.report["method"] == "qr" and "switched to the QR route" in x.report["method_reason"]


def test_wide_auto_minimum_norm_beyond_the_gram_resolution_takes_the_qr_route():
    """``lam = 0`` with singular values ``||A||`` to ``1e-10 ||A||``: ``A A^T`` resolves them to about
    ``sqrt(eps) ||A||`` only, so the dual form refuses ``a`` as rank-deficient (``SingularMatrixError``, which
    ``method="auto"`` had passed on); the R factor of ``A^T`` resolves them, and ``x`` is within the QR route's
    bound. An exactly rank-deficient ``a`` is still refused (the R factor does not resolve it either); the dual
    form's other refusal, ``s^2 + lam^2`` beyond float64, the QR route meets as well (tests/solve/test_solve.py,
    ``test_wide_dual_form_refuses_a_direction_whose_filter_leaves_the_range``), so it stands."""
    from blocklin.errors import SingularMatrixError

    a, b = _matrix(low=-10), _rhs()
    with pytest.raises(SingularMatrixError, match="full row rank"):
        bl.solve(a, b, lam=0.0, method="normal")
    x = _auto_minimum_norm(a, b)
    assert x.report["method"] == "qr" and "does not resolve" in x.report["method_reason"]
    deficient = a.copy()
    deficient[-1] = deficient[0] + deficient[1]
    with pytest.raises(SingularMatrixError, match="lam"):
        bl.solve(deficient, b, lam=0.0)
