"""The ridge routes say when ``x`` may carry no digit: ``report["condition_estimate"]`` and an
``IllConditionedWarning`` from the spectrum the route already has (``spectrum.accuracy``), silence on
well-posed problems, and the float32 / intercept cases whose result had been silently wrong.

References: the regularized problem solved in mpmath (``tests/support/ridge_mp.py`` is not needed: the
normal or dual equations of the centered problem at enough digits to hold rows ``2^600`` apart)."""

from __future__ import annotations

import warnings

import mpmath as mp
import numpy as np
import pytest

import blocklin as bl
from blocklin.errors import IllConditionedWarning

EPS = float(np.finfo(np.float64).eps)


def _ridge_mp(a, b, lam, fit_intercept, dps):
    """``x`` (n x k) and the intercept (k) of ``min ||A x + 1 x0 - b||^2 + lam^2 ||x||^2`` in mpmath."""
    m, n = a.shape
    k = b.shape[1]
    cplx = np.iscomplexobj(a) or np.iscomplexobj(b)
    conv = (lambda v: mp.mpc(complex(v))) if cplx else (lambda v: mp.mpf(float(v)))
    with mp.workdps(dps):
        A = [[conv(a[i, j]) for j in range(n)] for i in range(m)]
        B = [[conv(b[i, j]) for j in range(k)] for i in range(m)]
        mu = [mp.fsum(A[i][j] for i in range(m)) / m if fit_intercept else 0 for j in range(n)]
        bb = [mp.fsum(B[i][j] for i in range(m)) / m if fit_intercept else 0 for j in range(k)]
        ac = mp.matrix([[A[i][j] - mu[j] for j in range(n)] for i in range(m)])
        bc = mp.matrix([[B[i][j] - bb[j] for j in range(k)] for i in range(m)])
        ah = ac.H if cplx else ac.T
        if m >= n:
            kmat, rhs, post = ah * ac + mp.mpf(lam) ** 2 * mp.eye(n), ah * bc, None
        else:
            kmat, rhs, post = ac * ah + mp.mpf(lam) ** 2 * mp.eye(m), bc, ah
        cols = [mp.lu_solve(kmat, rhs.column(j)) for j in range(k)]
        y = mp.matrix([[cols[j][i] for j in range(k)] for i in range(rhs.rows)])
        x = post * y if post is not None else y
        x0 = [bb[j] - mp.fsum(mu[i] * x[i, j] for i in range(n)) for j in range(k)] if fit_intercept else None
        conv_out = complex if cplx else float
        return (np.array([[conv_out(x[i, j]) for j in range(k)] for i in range(n)]),
                None if x0 is None else np.array([conv_out(v) for v in x0]))


def _graded_wide(seed=0):
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((3, 11))
    a[1] = np.ldexp(a[1], 600)
    return a, rng.standard_normal((3, 1))


def test_wide_qr_intercept_below_the_centerings_rounding_warns():
    """Rows ``2^600`` apart with an intercept at ``lam = 1``: the centered ``A``'s second singular value, near 1,
    is below the centering's rounding ``eps 2^600``, and its filter ``s / (s^2 + lam^2)`` is near 1/2, not
    damped: ``x`` had come back 100% off (intercept 0.448 for 0.431) without a word. Now the route says so and
    reports the bound (the direction's possible part over the one resolved: about ``2^600``)."""
    a, b = _graded_wide()
    ref, _ = _ridge_mp(a, b, 1.0, True, 500)
    with pytest.warns(IllConditionedWarning, match="no correct digit"):
        x = bl.solve(a, b, lam=1.0, fit_intercept=True, method="qr")
    assert np.linalg.norm(x.to_numpy() - ref) > 0.5 * np.linalg.norm(ref)  # the result the warning is about
    assert x.report["condition_estimate"] * EPS >= 1


@pytest.mark.parametrize("lam", [1e99, 1e150])
def test_wide_qr_intercept_undamped_at_moderate_lambda_warns(lam):
    """The same rows at ``lam`` 1e99 and 1e150: the direction is left out of ``x`` and the true one's part,
    ``s_2 beta_2 / lam^2`` with ``s_2`` near 1, is below ``1e-190`` of ``x`` (test_qr_route_intercept_wide.py),
    but the route cannot tell ``s_2`` from anything up to its resolution ``eps 2^600`` (the centered rows carry
    errors of that size), and there ``tol / lam^2`` is ``1e-32`` and ``1e-134``, far above ``x``'s ``1 / s_1``
    near ``1e-181``: the warning says ``x`` *may* have no digit."""
    a, b = _graded_wide()
    with pytest.warns(IllConditionedWarning, match="no correct digit"):
        bl.solve(a, b, lam=lam, fit_intercept=True, method="qr")


def test_wide_qr_intercept_damped_direction_stays_silent():
    """At ``lam = 1e178`` any ``s`` below the resolution (``3.7e166``) adds at most ``tol / lam^2``, ``4e-190``,
    to ``x`` of size ``1 / s_1``, ``2.5e-181``: silent, and ``x`` and the intercept right to a few eps (the
    one resolved direction is of condition 1)."""
    a, b = _graded_wide()
    ref, ref0 = _ridge_mp(a, b, 1e178, True, 500)
    with warnings.catch_warnings():
        warnings.simplefilter("error", IllConditionedWarning)
        x = bl.solve(a, b, lam=1e178, fit_intercept=True, method="qr")
    assert x.report["condition_estimate"] * EPS < 1e-6
    scale = np.ldexp(1.0, -int(np.frexp(np.abs(ref).max())[1]))  # x near 2^-600: its norms in range
    assert np.linalg.norm((x.to_numpy() - ref) * scale) <= 1e-12 * np.linalg.norm(ref * scale)
    assert abs(np.ravel(x.intercept)[0] - ref0[0]) <= 1e-12 * abs(ref0[0])


@pytest.mark.parametrize("method", ["auto", "qr", "normal"])
def test_rank_deficient_tall_at_a_tiny_lambda_warns(method):
    """A repeated column and ``lam`` ``1e-13`` of ``||A||``: the zero singular value is computed as rounding
    (``eps ||A||``), which ``lam`` does not damp, so ``x`` carries ``beta / s`` of noise along it. The QR (and
    ``auto``, which switches to it) warns; the Gram route warns or refuses."""
    rng = np.random.default_rng(4)
    a = rng.standard_normal((40, 6))
    a[:, 5] = a[:, 0]
    b = rng.standard_normal((40, 1))
    lam = 1e-13 * np.linalg.norm(a, 2)
    ref, _ = _ridge_mp(a, b, lam, False, 60)
    with warnings.catch_warnings(record=True) as ws:
        warnings.simplefilter("always")
        try:
            x = bl.solve(a, b, lam=lam, method=method)
        except bl.errors.SingularMatrixError:
            assert method == "normal"
            return
    err = np.linalg.norm(x.to_numpy() - ref) / np.linalg.norm(ref)
    warned = any(issubclass(w.category, bl.errors.BlocklinWarning) and "accuracy" in str(w.message) or
                 issubclass(w.category, IllConditionedWarning) for w in ws)
    assert warned or err < 1e-6, (err, [str(w.message) for w in ws])


def _problem(m, n, k, dtype, seed):
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((m, n)) + 2.0
    b = rng.standard_normal((m, k))
    if np.dtype(dtype).kind == "c":
        a = a + 1j * rng.standard_normal((m, n))
        b = b + 1j * rng.standard_normal((m, k))
    return a.astype(dtype), b.astype(dtype)


@pytest.mark.parametrize("shape", [(60, 8), (8, 60), (20, 20)])
@pytest.mark.parametrize("dtype", [np.float64, np.float32, np.complex128])
@pytest.mark.parametrize("method", ["auto", "qr", "normal"])
@pytest.mark.parametrize("fit_intercept", [False, True])
def test_well_posed_problems_stay_silent(shape, dtype, method, fit_intercept):
    """Random well-posed problems (condition near 10) on every route, with and without an intercept, one
    lambda and a sequence: no ``IllConditionedWarning``, and a ``condition_estimate`` far below ``1 / eps``."""
    a, b = _problem(*shape, 2, dtype, seed=shape[0] + shape[1])
    with warnings.catch_warnings():
        warnings.simplefilter("error", IllConditionedWarning)
        for lam in (0.5, [0.1, 3.0]):
            x = bl.solve(a, b, lam=lam, method=method, fit_intercept=fit_intercept)
            assert x.report["condition_estimate"] * EPS < 1e-8, x.report["condition_estimate"]


def test_stored_out_of_core_well_posed_stays_silent(tmp_path):
    """The same on stored operands at a small budget and the threads scheduler."""
    a, b = _problem(400, 12, 1, np.float64, seed=3)
    A = bl.from_array(a, str(tmp_path / "a.zarr"), chunks=(50, 12))
    B = bl.from_array(b, str(tmp_path / "b.zarr"), chunks=(50, 1))
    with warnings.catch_warnings():
        warnings.simplefilter("error", IllConditionedWarning)
        for method in ("auto", "qr"):
            x = bl.solve(A, B, lam=[0.1, 1.0], method=method, fit_intercept=True, memory="256KiB",
                         scheduler="threads")
            assert x.report["condition_estimate"] * EPS < 1e-8


@pytest.mark.parametrize("method", ["auto", "qr"])
def test_wide_float32_intercept_with_large_means(method):
    """A wide float32 ``A`` whose last 20 columns are constant near ``1e8`` (the rest of spread 1), with an
    intercept: those columns' coefficients are exactly 0. ``x = A^T (P y)`` in float32 rounds ``1^T P y`` to
    ``eps32 ||y||``, times the means ``1e8``: ``x`` had been 3.3 relative off (0.55 where 0). The GEMM now sums in
    float64 and rounds ``x`` once: its error is ``c eps64`` (``c = 1e8``) plus float32's rounding."""
    rng = np.random.default_rng(0)
    m, n = 5, 40
    a = np.tile(rng.uniform(0.9e8, 1.1e8, n), (m, 1))
    a[:, :20] = rng.standard_normal((m, 20))
    a = a.astype(np.float32)
    b = rng.standard_normal((m, 1)).astype(np.float32)
    ref, _ = _ridge_mp(a.astype(np.float64), b.astype(np.float64), 1.0, True, 60)
    x = bl.solve(a, b, lam=1.0, fit_intercept=True, method=method).to_numpy()
    assert x.dtype == np.float32
    bound = 1e8 * 64 * EPS + 4 * float(np.finfo(np.float32).eps)
    assert np.linalg.norm(x - ref) <= bound * np.linalg.norm(ref)


@pytest.mark.parametrize("dtype", [np.float64, np.complex128])
def test_wide_qr_intercept_of_graded_columns(dtype):
    """Columns ``2^30``, ``2^-30`` and 1 apart with means 3, ``lam = 0``, wide, ``method="qr"``: ``x`` is right to
    ``1e-6`` and the intercept (condition ``|mu|^T |x| / |x0|`` near 8) had been ``5824`` for ``4.67``: it was
    formed as ``(R 1)^H (R y)``, whose ``R y`` multiplies ``y``'s rounding (``eps ||R|| ||b|| / s_min^2``) by
    ``||R||``. Now ``R y = U diag(s / s^2) beta`` from the SVD in hand: its error is that of ``x``, bounded by
    the reported ``condition_estimate`` times eps, times that condition."""
    rng = np.random.default_rng(5)
    m, n = 14, 23
    a = rng.standard_normal((m, n)) + 3.0
    b = rng.standard_normal((m, 1))
    if dtype == np.complex128:
        a = a + 1j * rng.standard_normal((m, n))
        b = b + 1j * rng.standard_normal((m, 1))
    a = a * np.ldexp(1.0, 30 * np.array([1, -1, 0])[rng.integers(0, 3, n)])[None, :]
    ref, ref0 = _ridge_mp(a, b, 0.0, True, 80)
    x = bl.solve(a, b, lam=0.0, fit_intercept=True, method="qr")
    delta = x.report["condition_estimate"] * EPS
    kappa0 = float(np.abs(a.mean(axis=0)) @ np.abs(ref[:, 0]) / abs(ref0[0]))
    assert np.linalg.norm(x.to_numpy() - ref) <= delta * np.linalg.norm(ref)
    assert abs(np.ravel(x.intercept)[0] - ref0[0]) <= 4 * kappa0 * delta * abs(ref0[0])


@pytest.mark.parametrize("method", ["qr", "auto"])
def test_wide_intercept_of_large_means(method):
    """Column means ``1e8`` against a spread of 1 (constant columns among them): the R factor of the uncentered
    ``A^T`` (``method="qr"``) had rounded to ``c eps`` relative and the intercept ``bbar - mu^T x`` taken that
    times ``||mu|| ||x||``, far above the intercept (0.32 for 0.37, warned). The factor of the columns less their
    first entries (as the Gram route's shifted sums) gives it to a few eps, without a warning."""
    import warnings

    rng = np.random.default_rng(0)
    m, n = 5, 40
    a = np.tile(rng.uniform(0.9e8, 1.1e8, n), (m, 1))
    a[:, :20] = rng.standard_normal((m, 20))
    b = rng.standard_normal((m, 1))
    _, ref0 = _ridge_mp(a, b, 1.0, True, 60)
    with warnings.catch_warnings():
        warnings.simplefilter("error", IllConditionedWarning)
        x = bl.solve(a, b, lam=1.0, fit_intercept=True, method=method)
    assert abs(np.ravel(x.intercept)[0] - ref0[0]) <= 1e-12 * abs(ref0[0])


@pytest.mark.parametrize("shape, method", [((24, 22), "qr"), ((24, 22), "auto"), ((6, 24), "auto"), ((6, 24), "qr")])
def test_intercept_of_rows_far_apart_warns(shape, method):
    """Every third row (of ``A`` and ``b``) ``2^600`` times the others, an intercept: ``mu`` and ``bbar`` are
    near ``2^600 / 3`` and cancel in ``x0 = bbar - mu^T x``, so ``x``'s relative error (a few eps here, right
    against mpmath) enters ``x0`` times ``|mu|^T |x| / |x0|``, about ``1e26``: the intercept had come back
    ``1e10`` times off without a word (randomized search: tall QR, wide Gram). Now warned."""
    rng = np.random.default_rng(7)
    m, n = shape
    a, b = rng.standard_normal((m, n)), rng.standard_normal((m, 1))
    big = np.arange(m) % 3 == 0
    a[big], b[big] = np.ldexp(a[big], 600), np.ldexp(b[big], 600)
    lam = 1e-13 * float(np.linalg.norm(a, 2))
    ref, ref0 = _ridge_mp(a, b, lam, True, 500)
    with pytest.warns(IllConditionedWarning, match="intercept may have no correct digit"):
        x = bl.solve(a, b, lam=lam, fit_intercept=True, method=method)
    assert np.linalg.norm(x.to_numpy() - ref) <= x.report["condition_estimate"] * EPS * np.linalg.norm(ref)
    kappa0 = float(np.abs(a.mean(axis=0)) @ np.abs(ref[:, 0]) / abs(ref0[0]))
    assert kappa0 * x.report["condition_estimate"] * EPS >= 1  # the warning's premise, from the reference


def test_wide_qr_intercept_at_lambda_zero_with_large_means_stays_silent():
    """A wide ``A`` with column means ``1e4`` at ``lam = 0`` (the minimum-norm fit), ``method="qr"``: the centered
    R factor's null direction is the intercept's, cut as rounding, and its rounding-level part of ``b`` (the
    null vector a few ``c eps`` off ``1 / sqrt(m)``) had been read as an unresolved direction of ``A`` weighed
    by ``1 / s``: ``condition_estimate`` inf and a warning on an ``x`` right to ``3e-12`` (randomized search)."""
    rng = np.random.default_rng(6)
    a = rng.standard_normal((22, 60)) + 1e4
    b = rng.standard_normal((22, 2))
    ref, ref0 = _ridge_mp(a, b, 0.0, True, 60)
    with warnings.catch_warnings():
        warnings.simplefilter("error", IllConditionedWarning)
        x = bl.solve(a, b, lam=0.0, fit_intercept=True, method="qr")
    delta = x.report["condition_estimate"] * EPS
    assert delta < 1e-6
    assert np.linalg.norm(x.to_numpy() - ref) <= delta * np.linalg.norm(ref)
