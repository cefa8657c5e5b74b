"""Complex least squares (issue 28): ``solve``'s Tikhonov routes and ``lstsq`` against NumPy/SciPy.

The normal equations (``A^H A``, ``A^H b``, Cholesky ``zpotrf``, refinement with complex residuals), the
spectrum of the Hermitian Gram (sequences, GCV, the L-curve), the streaming QR (``Q^H b``, the SVD of a
complex ``R``), the wide dual form (``A A^H``, ``x = A^H y``), ``fit_intercept`` (complex means),
``sample_weight`` (real weights), ``lam="loo"`` of tall ``A``; ``lstsq`` of any rank, tall and wide,
with NumPy's ``(x, residuals, rank, s)`` and ``rcond``; in memory and streamed, on every scheduler; the
refusals by name (``positive``, the stored-Gram route's extras).

References are computed in complex128 from the data: the regularized normal equations
``(A^H A + lam^2 I) x = A^H b`` (the dual ``x = A^H (A A^H + lam^2 I)^-1 b`` for wide ``A``),
``numpy.linalg.lstsq``. Bounds: the real ones of :mod:`support.tolerances` (a solve's forward error
``8 n eps cond(K)`` with ``K`` the regularized normal matrix, Weyl for singular values) with ``eps`` of
the parts' dtype, times :data:`COMPLEX` = ``3 sqrt(2)`` (Higham 2002, Lemma 3.5 and §3.6).
"""

from __future__ import annotations

import numpy as np
import pytest

import blocklin as bl
from blocklin.errors import BudgetError, ParameterError, SingularMatrixError
from support.budgets import sweep
from support.complex_ridge import CDTYPES, COMPLEX, check as _check, crandn as _crandn, problem as _problem
from support.tolerances import assert_singular_values, assert_solve, eps

SCHEDULERS = ["sync", "threads", "processes"]


@pytest.mark.parametrize("dtype", CDTYPES)
@pytest.mark.parametrize("method", ["normal", "qr", "auto"])
@pytest.mark.parametrize("lam", [0.0, 0.7])
def test_tall_routes(dtype, method, lam):
    a, b = _problem((300, 12), dtype, seed=1)
    x = bl.solve(a, b, lam=lam, method=method, memory="4MiB")
    r = x.report
    assert r["method"] == ("qr" if method == "qr" else "normal")
    _check(x.to_numpy(), a, b, lam, dtype)
    # the reported norms are those of the complex residual and solution
    got = x.to_numpy().astype(np.complex128)
    res = np.linalg.norm(b.astype(np.complex128) - a.astype(np.complex128) @ got, axis=0)
    np.testing.assert_allclose(r["residual_norm"], res, rtol=100 * COMPLEX * 300 * eps(dtype))
    np.testing.assert_allclose(r["solution_norm"], np.linalg.norm(got, axis=0), rtol=100 * COMPLEX * 300 * eps(dtype))


def test_tall_streamed_on_every_scheduler():
    """A over the budget: the Gram, refinement and QR passes stream its strips; the same bits everywhere."""
    a, b = _problem((3000, 16), np.complex128, seed=2)
    for method in ("normal", "qr"):
        xs = [bl.solve(a, b, lam=0.3, method=method, refine=1, memory="320KiB", scheduler=s).to_numpy()
              for s in SCHEDULERS]
        _check(xs[0], a, b, 0.3, np.complex128)
        assert all(np.array_equal(xs[0], other) for other in xs[1:])


@pytest.mark.parametrize("dtype", CDTYPES)
def test_lambda_sequences_and_rules(dtype):
    """Every lambda of a sequence, and the GCV and L-curve choices, from the Hermitian Gram's eigh or
    the complex R's SVD: each column the Tikhonov solution at its lambda."""
    a, b = _problem((400, 10), dtype, k=1, seed=3)
    b = b + (a @ np.arange(10)).reshape(-1, 1).astype(dtype)  # a signal, for the rules to find
    for method in ("normal", "qr"):
        lams = [0.1, 1.0, 10.0]
        x = bl.solve(a, b, lam=lams, method=method, memory="4MiB").to_numpy()
        for i, lam in enumerate(lams):
            _check(x[:, i:i + 1], a, b, lam, dtype)
    for rule, method in (("gcv", "auto"), ("lcurve", "qr"), ("gcv", "qr")):
        x = bl.solve(a, b, lam=rule, method=method, memory="4MiB")
        lam = x.report["lam"]
        assert lam > 0 and x.report["lam_rule"] == rule
        _check(x.to_numpy(), a, b, lam, dtype)


def test_gcv_curve_is_that_of_the_complex_problem():
    """GCV's ``m ||r||^2 / (m - dof)^2`` of the complex problem at a few lambdas, against the hat matrix."""
    a, b = _problem((200, 8), np.complex128, k=1, seed=4)
    x = bl.solve(a, b, lam="gcv", method="qr", memory="4MiB")
    curve = x.report["curve"]
    for lam, g in list(zip(curve["lam"], curve["gcv"]))[::60]:
        h = a @ np.linalg.solve(a.conj().T @ a + lam**2 * np.eye(8), a.conj().T)
        r = b - h @ b
        ref = 200 * np.vdot(r, r).real / (200 - np.trace(h).real) ** 2
        assert abs(g - ref) <= 1e-10 * ref


@pytest.mark.parametrize("dtype", CDTYPES)
@pytest.mark.parametrize("lam", [0.0, 0.7])
def test_wide_dual_form(dtype, lam):
    """Wide A: x = A^H (A A^H + lam^2 I)^-1 b; lam = 0 the minimum-norm solution."""
    a, b = _problem((12, 300), dtype, seed=5)
    x = bl.solve(a, b, lam=lam, memory="4MiB")
    assert "A^H" in x.report["method_reason"]
    _check(x.to_numpy(), a, b, lam, dtype)
    if lam == 0:
        ref = np.linalg.pinv(a.astype(np.complex128)) @ b.astype(np.complex128)
        assert np.linalg.norm(x.to_numpy() - ref) <= 8 * COMPLEX * 300 * eps(dtype) * np.linalg.cond(a) ** 2 \
            * np.linalg.norm(ref)


def test_wide_streamed_on_every_scheduler():
    a, b = _problem((40, 3000), np.complex128, seed=6)
    xs = [bl.solve(a, b, lam=0.5, memory="512KiB", scheduler=s).to_numpy() for s in SCHEDULERS]
    _check(xs[0], a, b, 0.5, np.complex128)
    assert all(np.array_equal(xs[0], other) for other in xs[1:])


def _centered(a, b, w=None):
    w = np.ones(a.shape[0]) if w is None else w
    mu, bbar = w @ a / w.sum(), w @ b / w.sum()
    return a - mu, b - bbar, mu, bbar


@pytest.mark.parametrize("shape", [(300, 10), (12, 200)])
def test_fit_intercept_complex_means(shape):
    """Ridge(fit_intercept=True) of complex data: the centered problem, ``x0 = bbar - mu^T x`` (no conjugate)."""
    a, b = _problem(shape, np.complex128, seed=7)
    b = b + (3 - 2j)
    x = bl.solve(a, b, lam=0.5, fit_intercept=True, memory="4MiB")
    ac, bc, mu, bbar = _centered(a, b)
    got = x.to_numpy()
    _check(got, ac, bc, 0.5, np.complex128)
    icpt = bbar - mu @ got
    np.testing.assert_allclose(x.intercept, icpt, rtol=0, atol=1e-12 * np.abs(icpt).max())


def test_sample_weight_real_weights():
    a, b = _problem((300, 10), np.complex128, seed=8)
    w = np.random.default_rng(9).random(300) + 0.5
    x = bl.solve(a, b, lam=0.5, sample_weight=w, fit_intercept=True, memory="4MiB")
    ac, bc, mu, bbar = _centered(a, b, w)
    sw = np.sqrt(w)[:, None]
    _check(x.to_numpy(), ac * sw, bc * sw, 0.5, np.complex128)


def test_loo_tall_against_the_hat_matrix():
    """RidgeCV's leave-one-out errors of complex data: ``e_i / (1 - h_ii)`` with the hat matrix
    ``A (A^H A + lam^2 I)^-1 A^H`` (its diagonal real), the mean of ``|.|^2`` per grid value."""
    a, b = _problem((120, 6), np.complex128, k=1, seed=10)
    b = b + (a @ np.arange(6)).reshape(-1, 1)
    grid = [0.1, 1.0, 3.0, 10.0]
    x = bl.solve(a, b, lam=("loo", grid), memory="4MiB")
    curve = x.report["curve"]
    ref = []
    for lam in grid:
        h = a @ np.linalg.solve(a.conj().T @ a + lam**2 * np.eye(6), a.conj().T)
        e = (b - h @ b)[:, 0] / (1 - np.diag(h).real)
        ref.append(np.mean(np.abs(e) ** 2))
    np.testing.assert_allclose(curve["loo"], ref, rtol=1e-10)
    assert x.report["lam"] == grid[int(np.argmin(ref))]
    _check(x.to_numpy(), a, b, x.report["lam"], np.complex128)


def test_real_a_with_complex_b_is_promoted():
    rng = np.random.default_rng(11)
    a = rng.standard_normal((200, 8))
    b = _crandn(rng, (200, 2))
    x = bl.solve(a, b, lam=0.2, memory="4MiB")
    assert x.dtype == np.complex128
    _check(x.to_numpy(), a.astype(np.complex128), b, 0.2, np.complex128)


def test_refusals_by_name():
    a, b = _problem((200, 8), np.complex128, seed=12)
    with pytest.raises(ParameterError, match=r"positive: applies to real data.*complex128"):
        bl.solve(a, b, lam=0.1, positive=True)
    # updatable=True takes complex data (tests/update/test_complex_update.py): refused only as for real data
    with pytest.raises(ParameterError, match=r"updatable: needs out="):
        bl.solve(a, b, lam=0.1, updatable=True, out=None)
    # lam='loo' of a wide complex a is built (tests/solve/test_complex_loo_cv.py)
    # the stored-Gram route takes complex data (tests/solve/test_complex_stored_gram.py); its extras are refused
    big, bb = _problem((400, 120), np.complex128, k=1, seed=14)
    with pytest.raises(BudgetError, match="fit_intercept needs"):
        bl.solve(big, bb, lam=0.1, fit_intercept=True, memory="256KiB")
    x = bl.solve(big, bb, lam=0.1, memory="256KiB")
    assert x.report["gram"] == "out of core"
    _check(x.to_numpy(), big, bb, 0.1, np.complex128)


@pytest.mark.parametrize("shape", [(2000, 12), (12, 2000)])
def test_budget_minimums_hold_for_complex(shape):
    """The sweep of tests/solve/test_least_squares_budget_minimums.py on complex data: every refusal names
    the whole call's minimum, and a retry there runs and is right."""
    a, b = _problem(shape, np.complex128, seed=15)
    lam = 0.4

    def run(memory):
        return bl.solve(a, b, lam=lam, memory=memory).to_numpy()

    assert sweep(run, lambda x: _check(x, a, b, lam, np.complex128)) >= 1


# -- lstsq ----------------------------------------------------------------------------------------------


def _check_lstsq(got, a, b, rcond=None):
    """``(x, residuals, rank, s)`` against ``numpy.linalg.lstsq``: the rank, Weyl's bound on ``s``, the
    forward error of a truncated-SVD solution (cond of the kept part) and the residuals."""
    x, res, rank, s = got
    xr, resr, rankr, sr = np.linalg.lstsq(a, b, rcond=rcond)
    dt = np.result_type(a, b)
    assert rank == rankr and x.dtype == xr.dtype and s.dtype == sr.dtype and res.dtype == resr.dtype
    assert res.shape == resr.shape
    n = max(a.shape)
    assert_singular_values(s, sr, n=n, dtype=np.float64, const=4 * COMPLEX)
    kappa = sr[0] / sr[rank - 1]
    bound = 8 * COMPLEX * n * eps(dt) * kappa * (np.linalg.norm(xr) + kappa * np.linalg.norm(b) / sr[0])
    assert np.linalg.norm(x.astype(np.complex128) - xr) <= bound
    if res.size:
        np.testing.assert_allclose(res, resr, rtol=100 * COMPLEX * n * eps(dt) * kappa**2)


@pytest.mark.parametrize("dtype", CDTYPES)
@pytest.mark.parametrize("shape", [(80, 12), (12, 80), (30, 30)])
@pytest.mark.parametrize("deficient", [False, True])
def test_lstsq_complex(dtype, shape, deficient):
    a, b = _problem(shape, dtype, k=2, seed=16)
    if deficient:
        a[:, 1] = (2j * a[:, 3]).astype(dtype)
        a[1, :] = (0.5 * a[3, :]).astype(dtype) if shape[0] < shape[1] else a[1, :]
    got = bl.lstsq(a, b, memory="4MiB")
    _check_lstsq(got, a, b)
    assert got.report["rank"] == got[2]
    x1 = bl.lstsq(a, b[:, 0], memory="4MiB")[0]  # a 1-D b gives a 1-D x
    assert x1.shape == (shape[1],)


@pytest.mark.parametrize("shape", [(80, 12), (12, 80)], ids=["tall", "wide"])
@pytest.mark.parametrize("ka,kb", [(700, 300), (300, -700), (-700, -700), (-300, 0)])
def test_lstsq_complex_near_the_range_ends(shape, ka, kb):
    """``A`` and ``b`` times exact powers of two: scaled back, ``(x, residuals, rank, s)`` meet the
    bounds of :func:`_check_lstsq` against NumPy on the unscaled problem (a power of two is exact;
    LAPACK's QR rescales near the range ends, so the bits may differ). The wide route's ``1 / s^2``
    had underflowed to 0 (``x = 0``) or overflowed (NaN, blamed on ``b``)."""
    a, b = _problem(shape, np.complex128, k=2, seed=18)
    a2 = np.ldexp(a.real, ka) + 1j * np.ldexp(a.imag, ka)
    b2 = np.ldexp(b.real, kb) + 1j * np.ldexp(b.imag, kb)
    x, res, rank, sv = bl.lstsq(a2, b2, memory="4MiB")
    back = np.ldexp(x.real, ka - kb) + 1j * np.ldexp(x.imag, ka - kb)
    if 2 * abs(kb) < 1000:
        res = np.ldexp(res, -2 * kb)
    else:  # the squared residuals are 2^(2 kb) times the unscaled ones: below float64's range, 0
        assert kb < 0 and np.all(res == 0)
        res = np.linalg.lstsq(a, b, rcond=None)[1]
    _check_lstsq((back, res, rank, np.ldexp(sv, -ka)), a, b)


def test_lstsq_rcond_and_streamed_on_every_scheduler():
    """Out of core (A over the budget), NumPy's rcond convention, the same bits on every scheduler."""
    rng = np.random.default_rng(17)
    u, _ = np.linalg.qr(_crandn(rng, (3000, 10)))
    v, _ = np.linalg.qr(_crandn(rng, (10, 10)))
    a = (u * np.logspace(0, -6, 10)) @ v.conj().T
    b = _crandn(rng, (3000, 1))
    for rcond in (None, 3e-4):  # s_i = 10^(-2i/3): six above 3e-4 s_1, none near it
        outs = [bl.lstsq(a, b, rcond=rcond, memory="320KiB", scheduler=s) for s in SCHEDULERS]
        _check_lstsq(outs[0], a, b, rcond)
        assert outs[0][2] == (10 if rcond is None else 6)
        assert all(np.array_equal(outs[0][0], o[0]) for o in outs[1:])
    wide = bl.lstsq(a.T.copy(), _crandn(rng, (10, 2)), memory="320KiB")
    assert wide.report["passes_total"] >= 2


def test_cli_solves_complex_stores(tmp_path, capsys):
    import json

    from blocklin.cli.main import main

    a, b = _problem((200, 6), np.complex128, seed=18)
    bl.from_array(a, tmp_path / "a.zarr")
    bl.from_array(b, tmp_path / "b.zarr")
    rc = main(["solve", str(tmp_path / "a.zarr"), str(tmp_path / "b.zarr"), "-o", str(tmp_path / "x.zarr"),
               "--lam", "0.5", "--json"])
    capsys.readouterr()
    assert rc == 0
    _check(bl.open(tmp_path / "x.zarr").to_numpy(), a, b, 0.5, np.complex128)
    rc = main(["solve", str(tmp_path / "a.zarr"), str(tmp_path / "b.zarr"), "-o", str(tmp_path / "y.zarr"),
               "--lam", "gcv", "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0 and out is not None


@pytest.mark.gpu
@pytest.mark.parametrize("method", ["normal", "qr"])
def test_tall_routes_on_gpu_report_complex_norms(method):
    """On the GPU the Gram and TSQR passes sum ``|b|^2`` and ``|A|^2`` on the device: of the real and
    imaginary parts, as the CPU does (the real parts alone once gave residual norms and ``norm_a`` that
    were wrong while ``x`` was right)."""
    a, b = _problem((300, 12), np.complex128, seed=1)
    x = bl.solve(a, b, lam=0.0, method=method, memory="4MiB", device="gpu", scheduler="sync")
    r = x.report
    assert r["device"] == "gpu" and r["method"] == method
    _check(x.to_numpy(), a, b, 0.0, np.complex128)
    got = x.to_numpy()
    res = np.linalg.norm(b - a @ got, axis=0)
    np.testing.assert_allclose(r["residual_norm"], res, rtol=100 * COMPLEX * 300 * eps(np.complex128))
    if "norm_a" in r:
        np.testing.assert_allclose(r["norm_a"], np.linalg.norm(a), rtol=100 * COMPLEX * 300 * eps(np.complex128))


@pytest.mark.parametrize("lam", ["gcv", 0.5])
@pytest.mark.parametrize("k", [300, -300])
def test_complex_solve_with_intercept_near_the_range_ends(lam, k):
    """Complex ``A`` and ``b`` times ``2^k`` (outside the safe range ``2^+-256``) with ``fit_intercept``:
    the scaled route's report held a complex intercept it could not scale (``TypeError``). The problem
    scaled by a power of two is the problem: ``x``, and the intercept times ``2^-k``, are the unscaled
    run's bits."""
    rng = np.random.default_rng(19)
    a = _crandn(rng, (200, 20))
    b = a @ np.ones(20) + 0.3 * _crandn(rng, (200,)) + (2 - 1j)
    ref = bl.solve(a, b, lam=lam, fit_intercept=True, memory="256KiB")
    got = bl.solve(a * 2.0 ** k, b * 2.0 ** k, lam=lam if lam == "gcv" else lam * 2.0 ** k, fit_intercept=True,
                   memory="256KiB")
    assert np.array_equal(got.to_numpy(), ref.to_numpy())
    assert np.array_equal(got.intercept * 2.0 ** -k, ref.intercept)
    assert np.array_equal(np.asarray(got.report["intercept"]) * 2.0 ** -k, np.asarray(ref.report["intercept"]))


@pytest.mark.parametrize("dtype", [np.complex128, np.float64])
def test_singular_regularized_gram_refusal_names_lam_as_given(dtype):
    """A refusal of a singular ``A^H A + lam^2 I`` on data near ``1e200`` names the ``lam`` passed and, for
    complex data, ``A^H A``: it had named the scaled problem's ``lam`` (``0.1 * 2^-665``, 6.5e-202) and
    ``A^T A``. Columns proportional (rank one), ``lam = 1e170`` (``1e-30`` of ``||A||``): the normal
    equations cannot resolve it.

    Rows all alike with ``fit_intercept`` (the case this refusal was first seen on) are no longer refused: the
    centered ``A`` is 0, so ``x = 0`` and the intercept is ``mean(b)`` (``(0.1 * 2^-665)^2`` underflowed and
    the Cholesky of the zero Gram matrix had been refused as if a larger lam were needed)."""
    row = np.array([1 + 2j, 3.0] if np.dtype(dtype).kind == "c" else [1.0, 3.0])
    a = (np.random.default_rng(0).standard_normal((6, 1)) * row[None, :]).astype(dtype) * 1e200
    b = np.arange(6.0).reshape(6, 1).astype(dtype)
    gram = "A\\^H A" if np.dtype(dtype).kind == "c" else "A\\^T A"
    with pytest.raises(SingularMatrixError, match=rf"a: {gram} \+ lam\^2 I must be positive definite.* at lam = 1e\+170\."):
        bl.solve(a, b, lam=1e170, method="normal", scheduler="sync")
    a = np.array([row] * 4, dtype=dtype) * 1e200
    b = np.arange(4.0).reshape(4, 1).astype(dtype)
    x = bl.solve(a, b, lam=0.1, fit_intercept=True, scheduler="sync")
    assert np.array_equal(x.to_numpy(), np.zeros((2, 1)))
    assert np.allclose(x.intercept, 1.5, rtol=4 * np.finfo(float).eps, atol=0)  # the mean of 0..3, a few roundings


def test_lstsq_budget_refusal_states_the_total_it_needs():
    """A budget below the streaming QR's least is refused stating the total it needs, and the memory= it
    suggests runs: the refusal had said "must hold 65.66 KiB ...; got 256.00 KiB" (the in-core part alone,
    below the budget it refused) and suggested memory='1MiB' for a least of 349 KiB."""
    import re

    from blocklin.config import parse_size

    rng = np.random.default_rng(4)
    a = rng.standard_normal((300, 40)) + 1j * rng.standard_normal((300, 40))
    b = rng.standard_normal(300) + 1j * rng.standard_normal(300)
    with pytest.raises(BudgetError) as err:
        bl.lstsq(a, b, memory="256KiB", scheduler="sync")
    text = str(err.value)
    need = parse_size(re.search(r"must hold ([\d.]+ [KMG]iB)", text).group(1))
    assert need > parse_size("256KiB"), text
    hint = re.search(r"memory='([^']+)'", text).group(1)
    assert need <= parse_size(hint) <= 1.25 * need, text
    x = bl.lstsq(a, b, memory=hint, scheduler="sync")[0]
    # least squares by a backward-stable QR: the forward bound of the normal matrix A^H A (cond squared)
    assert_solve(np.ravel(x), np.linalg.lstsq(a, b, rcond=None)[0], a.conj().T @ a, const=8 * COMPLEX)


@pytest.mark.parametrize("lam", [np.complex128(2j), np.array([1.0, 2j]), np.array(2j), np.array([1 + 0j]), [1.0, 1j],
                                 ("loo", np.array([1.0, 2j])), ("loo", [1.0, 2j])])
def test_complex_lam_is_refused(lam):
    """``lam`` is real: a NumPy complex ``lam`` had been cast to float, its imaginary part dropped with
    only NumPy's ``ComplexWarning`` (``lam=np.complex128(2j)`` solved as ``lam=0``, ``[1, 2j]`` as
    ``[1, 0]``), a list holding a Python complex crashed in ``float()``; each is refused naming ``lam``."""
    a, b = _crandn(np.random.default_rng(6), (40, 12)), _crandn(np.random.default_rng(7), (40,))
    with pytest.raises(ParameterError, match=r"^lam: .*must be real"):
        bl.solve(a, b, lam=lam, scheduler="sync")


@pytest.mark.parametrize("shape", [(80, 12), (12, 80)], ids=["tall", "wide"])
def test_lstsq_complex_singular_values_beyond_float64_refused_by_name(shape):
    """``A`` near ``2^1022`` (``s_1`` near ``2^1026``, beyond float64) had failed in LAPACK's SVD of the
    overflowed R factor (``LinAlgError: SVD did not converge``). The strips are divided by a power of
    two now (the real route's scaling); singular values float64 cannot return are refused naming ``a``,
    the range and the power of two, after which the scaled problem meets :func:`_check_lstsq`'s bounds
    (``x`` of ``2^-p A`` is ``2^p x``, exactly)."""
    a, b = _problem(shape, np.complex128, k=2, seed=19)
    a2 = np.ldexp(a.real, 1022) + 1j * np.ldexp(a.imag, 1022)
    with pytest.raises(ParameterError, match=r"^a: must have singular values within the range of float64.* "
                       r"Fix: scale the data by 2\.0\*\*-(\d+)") as err:
        bl.lstsq(a2, b, memory="4MiB")
    p = int(str(err.value).split("2.0**-")[1].split(" ")[0])
    a3 = np.ldexp(a.real, 1022 - p) + 1j * np.ldexp(a.imag, 1022 - p)
    _check_lstsq(bl.lstsq(a3, b, memory="4MiB"), a3, b)
