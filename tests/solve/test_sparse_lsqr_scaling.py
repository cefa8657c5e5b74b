"""LSQR of a stored sparse matrix whose entries (or right-hand sides) are near the ends of float64's range.

LSQR multiplies norms of the data together (``alpha beta`` of the bidiagonalization, ``||S|| ||x||``
in its stopping tests): with ``S`` and ``b`` near ``2^-600`` their product underflowed to 0, the
first test read "``S^T b = 0``" and ``x = 0`` came back with ``converged=True``; near ``2^700`` the
reported residual was ``inf``. The solve now runs on ``2^-es S``, ``2^-eb b`` (powers of two, exact),
so ``x`` of ``2^k S``, ``2^j b`` and ``2^k lam`` is ``2^(j-k)`` times ``x`` of ``S``, ``b``, ``lam``
bit for bit; the reference is the unscaled run, and the reported norms scale exactly with it.
"""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

import blocklin as bl


def _problem():
    rng = np.random.default_rng(5)
    a = sp.random(60, 12, density=0.3, random_state=3, format="csr")
    b = rng.standard_normal((60, 2))
    return a, b


def _solve(tmp_path, name, a, b, lam, **kw):
    s = bl.from_sparse(a, tmp_path / f"{name}.zarr")
    return bl.solve(s, b, lam=lam, memory="64MiB", **kw)


@pytest.mark.parametrize("ka, kb", [(-600, -600), (700, 700), (-700, 0), (0, -900), (600, -300)],
                         ids=["tiny", "huge", "tiny-S", "tiny-b", "huge-S-tiny-b"])
@pytest.mark.parametrize("lam", [0.0, 0.3, [0.1, 1.0]], ids=["lstsq", "ridge", "sequence"])
def test_scaled_data_gives_the_scaled_solution(tmp_path, ka, kb, lam):
    a, b = _problem()
    ref = _solve(tmp_path, "ref", a, b, lam)
    lams = np.ldexp(np.atleast_1d(np.asarray(lam, np.float64)), ka)
    got = _solve(tmp_path, "scaled", a * 2.0 ** ka, np.ldexp(b, kb), lams.tolist() if isinstance(lam, list)
                 else float(lams[0]))
    # powers of two are exact: the scaled run is the reference run, times 2^(kb - ka) (any tolerance
    # would be a choice; none is needed). It had returned x = 0 with converged=True.
    assert got.report["converged"] and ref.report["converged"]
    assert np.array_equal(np.asarray(got.to_numpy()), np.ldexp(np.asarray(ref.to_numpy()), kb - ka))
    for key, e in (("residual_norm", kb), ("solution_norm", kb - ka), ("objective", kb)):
        want = np.ldexp(np.asarray(ref.report[key], np.float64), e)
        # the norms of the scaled run are summed after dividing by the largest entry (their squares leave
        # the range): rounding of a few ulps of a 60-term sum, never the factor-of-zero or inf it had been
        np.testing.assert_allclose(np.asarray(got.report[key], np.float64), want, rtol=64 * 60 * 2.2e-16)


def test_scaled_data_with_an_intercept(tmp_path):
    a, b = _problem()
    ref = _solve(tmp_path, "ref", a, b, 0.5, fit_intercept=True)
    got = _solve(tmp_path, "scaled", a * 2.0 ** -650, np.ldexp(b, -650), 0.5 * 2.0 ** -650, fit_intercept=True)
    # the intercept path centers S by its means, computed at its own scale (not by a power of two of
    # the reference's), so equal within rounding: the tolerance of the LSQR tests (tol = 1e-10) on x
    np.testing.assert_allclose(np.asarray(got.to_numpy()), np.asarray(ref.to_numpy()), rtol=1e-8, atol=1e-8)
    np.testing.assert_allclose(np.ldexp(np.asarray(got.intercept, np.float64), 650), np.asarray(ref.intercept),
                               rtol=1e-8, atol=1e-8)
    assert got.report["converged"]


def test_in_range_data_keeps_its_bits(tmp_path):
    """Data within 2^+-256 is not scaled: 2^200 S and 2^200 b give x of S, b bit for bit (as before)."""
    a, b = _problem()
    ref = _solve(tmp_path, "ref", a, b, 0.3)
    got = _solve(tmp_path, "scaled", a * 2.0 ** 200, np.ldexp(b, 200), 0.3 * 2.0 ** 200)
    assert np.array_equal(np.asarray(got.to_numpy()), np.asarray(ref.to_numpy()))


def test_a_solution_beyond_float64_is_refused_by_name(tmp_path):
    """``S`` near ``2^-700`` and ``b`` near ``2^700`` ask for ``x`` near ``2^1400``: scaled back it had been
    Inf (and the residual NaN) with ``converged=True``; it is refused naming ``b`` and the power of two
    that brings it in range. ``x`` near ``2^1000`` still fits and is ``2^1000`` times the unscaled run's."""
    a, b = _problem()
    with pytest.raises(bl.errors.ParameterError, match=r"(?s)^b: .*x near 2\^14\d\d \(beyond float64's range\)"):
        _solve(tmp_path, "over", a * 2.0 ** -700, np.ldexp(b, 700), 0.0)
    ref = _solve(tmp_path, "ref", a, b, 0.0).to_numpy()
    got = _solve(tmp_path, "fits", a * 2.0 ** -700, np.ldexp(b, 300), 0.0).to_numpy()
    assert np.isfinite(got).all() and np.array_equal(np.ldexp(got, -1000), ref)


@pytest.mark.parametrize("lam", [0.0, 0.25, [0.25, 2.0]], ids=["lstsq", "ridge", "sequence"])
def test_a_matrix_of_subnormal_entries_gives_the_scaled_solution(tmp_path, lam):
    """Every entry of ``S`` subnormal (``2^-1040`` times entries of 8 bits, held exactly): the products of
    unscaled unit vectors landed among the subnormals and lost digits, ``x`` 0.1% off with ``converged=True``
    (found by a randomized search, 2026-12-06). The inputs are now scaled up first and the first product made
    again: ``x`` of ``2^-1040 S``, ``2^-1040 b``, ``2^-1040 lam`` is the unscaled run's ``x``, bit for bit."""
    a, b = _problem()
    a = a.copy()
    a.data = np.ldexp(np.ceil(a.data * 255), -8)
    b = np.round(b * 16) / 16
    ref = _solve(tmp_path, "ref", a, b, lam)
    tiny = a.copy()
    tiny.data = np.ldexp(tiny.data, -1040)
    assert np.array_equal(np.ldexp(tiny.data, 1040), a.data) and np.abs(tiny.data).max() < np.finfo(float).tiny
    lams = np.ldexp(np.atleast_1d(np.asarray(lam, np.float64)), -1040)
    got = _solve(tmp_path, "tiny", tiny, np.ldexp(b, -1040), lams.tolist() if isinstance(lam, list) else float(lams[0]))
    assert got.report["converged"] and np.array_equal(got.to_numpy(), ref.to_numpy())
    assert got.report["passes"] == ref.report["passes"] + 1  # the first product made again, scaled


@pytest.mark.parametrize("ka, kb, scaled, ein", [(-1070, -100, True, True), (600, 0, True, False), (0, 0, False, False)],
                         ids=["subnormal-S", "huge-S", "unscaled"])
def test_report_says_what_scaling_was_applied(tmp_path, ka, kb, scaled, ein):
    """An all-subnormal ``S`` (``2^-1070`` times a random pattern) is solved on ``2^1069 S`` with the first
    product made again on inputs multiplied by ``2^992``; the report said ``scaling: None``. It now gives the
    powers of two (``x`` is the unscaled run's times ``2^(kb - ka)``, as the other cases of this file check), and
    None where nothing was scaled."""
    a, b = _problem()
    b = b[:, :1]
    got = _solve(tmp_path, "scaled", a * 2.0 ** ka, np.ldexp(b, kb), 0.0)
    sc = got.report["scaling"]
    if not scaled:
        assert sc is None
        return
    # S is scaled by the power of two its first product S^T u_1 (||u_1|| = 1) names: within a few of ka
    assert abs(sc["exponent_a"] - ka) <= 8 and sc["exponent_b"] == 0
    assert (sc["exponent_products_input"] != 0) == ein
    assert sc["extra_passes"] == int(bool(ein))
    # the reference: the least-squares solution of S as stored (its subnormal entries rounded), scaled back
    # by 2^-ka exactly; LSQR stops at tol = 1e-10 of the problem's norms, cond(S) about 10: 1e-8 leaves room
    stored = np.ldexp((a * 2.0 ** ka).toarray(), -ka)
    ref = np.linalg.lstsq(stored, b, rcond=None)[0]
    np.testing.assert_allclose(np.ldexp(got.to_numpy(), ka - kb), ref, rtol=1e-8)


@pytest.mark.filterwarnings("error::RuntimeWarning")  # the report's norms are blocklin's to form, not NumPy's overflow
def test_an_x_that_underflows_to_zero_reports_the_objective(tmp_path):
    """``S`` near ``2^990`` (so ``lam`` near it) and ``b`` near ``2^-100``: ``x`` near ``2^-1090`` rounds to 0,
    and the residual and ``x`` were in range, so the objective was ``sqrt(r^2 + lam^2 x^2)`` with ``lam^2 = inf``:
    ``inf * 0``, NaN, reported beside ``converged=True`` (found by a randomized search, 2026-12-07). It is
    ``||r||`` there (``x = 0``), the residual norm's bits."""
    a, b = _problem()
    got = _solve(tmp_path, "s", a * 2.0 ** 990, np.ldexp(b, -100), 0.3 * 2.0 ** 990)
    assert not np.asarray(got.to_numpy()).any()  # x below float64's subnormals: 0, correctly rounded
    assert got.report["objective"] == got.report["residual_norm"]
    np.testing.assert_allclose(got.report["residual_norm"], np.linalg.norm(np.ldexp(b, -100), axis=0),
                               rtol=64 * 60 * 2.2e-16)  # r = b: a 60-term sum of squares, scaled
