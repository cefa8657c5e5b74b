"""Columns of ``b`` far apart in scale on the ridge routes that take all columns at once: a sequence of lambdas,
``lam="gcv"``, ``lam="lcurve"`` and ``positive=True``. These scaled ``b`` by one power of two, its largest
entry's, and refused float64 columns ``2^1200`` apart (``result_range.refuse_flushed_rhs``), and a column near
``2^-600`` beside one near 1 (which one power keeps) had its ``residual_norm`` and ``solution_norm`` reported as
0, its squares below float64's range, ``x`` right. Each column is now divided by its own power of two; the rules
sum their score over the columns at the largest column's scale, where the small column's part (``2^-1200`` of
it, far below the sum's rounding) is nothing, as it is of the score of ``b`` as given: the choice is that of
the large column alone.

Bound, per column ``j`` (``b_j = 2^q_j b'_j``; ``x_j = 2^q_j x(A, b'_j)`` exactly in binary floating point): the
route's solution of the scaled problem is within ``c n eps cond(K)`` of the exact one (Cholesky of ``K = A^T A
+ lam^2 I`` or ``A A^T + lam^2 I``, the eigen-decomposition of the Gram matrix, or the QR of ``[A; lam I]``:
Higham 2002, Thms 10.4 and 20.3; ``c = 8``), ``cond(K) = (s_1^2 + lam^2) / (s_r^2 + lam^2)``, plus the error
of the right-hand side it is formed from mapped by ``K^-1`` (``A^T b`` to ``c m eps ||A||_F ||b_j||``: the
Gram routes) or by the augmented matrix's pseudo-inverse (``c m eps ||b_j||`` times ``(s_r^2 + lam^2)^(-1/2)``:
the QR routes and the reference); the reference (NumPy's least squares on the augmented system in float64) is
within the same, and the rounding of ``x`` adds ``eps``. So ``||2^-q_j x_j - ref_j|| <= dx_j = 2 (c n eps cond(K)
||ref_j|| + c m eps ||b_j|| (||A||_F / (s_r^2 + lam^2) + (s_r^2 + lam^2)^(-1/2))) + eps ||ref_j||`` (``n``, ``m``
the larger side). A huge ``lam`` (GCV's choice where ``b`` is noise) makes the second term the larger. The
reported norms: ``||x_j||`` within ``dx_j``, ``||r_j||`` (``r = b - A x``, linear in ``x``) within ``||A||_F dx_j``
plus the rounding of the Gram quantities it may come from, ``c m eps ||b_j||^2 / ||r_j||``. With
``fit_intercept`` the reference solves the centered data, with ``sample_weight`` the rows scaled by ``sqrt(w)``.
"""

from __future__ import annotations

import numpy as np
import pytest

import blocklin as bl
from blocklin.errors import ParameterError
from blocklin.runtime.powers import ldexp

ROUTES = {
    "tall normal": ((40, 6), {}),
    "tall qr": ((40, 6), {"method": "qr"}),
    "tall intercept": ((40, 6), {"fit_intercept": True}),
    "tall weights": ((40, 6), {"sample_weight": np.linspace(0.5, 2.0, 40)}),
    "wide gram": ((6, 15), {}),
    "wide intercept": ((6, 15), {"fit_intercept": True}),
}
APART = [(600, -600), (0, -600)]
SEQUENCE = [0.5, 1.0]


def problem(shape, seed):
    rng = np.random.default_rng(seed)
    return rng.standard_normal(shape) + 3, rng.standard_normal((shape[0], 2)) + 5


def prepared(a, b, kw):
    """The data the reference solves: centered with ``fit_intercept``, rows times ``sqrt(w)`` with weights."""
    if kw.get("fit_intercept"):
        a, b = a - a.mean(axis=0), b - b.mean(axis=0)
    w = kw.get("sample_weight")
    if w is not None:
        a, b = np.sqrt(w)[:, None] * a, np.sqrt(w)[:, None] * b
    return a, b


def ridge(a, b, lam):
    """Each column solved alone: NumPy's least squares on ``[A; lam I] x = [b; 0]``."""
    n = a.shape[1]
    aug = np.vstack([a, lam * np.eye(n)])
    return np.linalg.lstsq(aug, np.vstack([b, np.zeros((n, b.shape[1]))]), rcond=None)[0]


def bounds(a, b, ref, lam):
    """Per column: the bound ``dx_j`` on ``x_j``'s error and that on ``||r_j||``'s (module docstring)."""
    s = np.linalg.svd(a, compute_uv=False)
    low = s[-1] ** 2 + lam ** 2
    cond = (s[0] ** 2 + lam ** 2) / low
    eps, c, big = np.finfo(np.float64).eps, 8, max(a.shape)
    af = np.linalg.norm(a)
    out = []
    for j in range(b.shape[1]):
        size, bn = np.linalg.norm(ref[:, j]), np.linalg.norm(b[:, j])
        dx = 2 * (c * big * eps * cond * size + c * big * eps * bn * (af / low + 1 / np.sqrt(low))) + eps * size
        r = np.linalg.norm(b[:, j] - a @ ref[:, j])
        out.append((dx, af * dx + c * big * eps * bn ** 2 / r))
    return out


def check_block(x, rn, xn, a, b, q, lam, ref=None):
    """``x`` (``n x 2``), its reported norms ``rn``, ``xn`` against the reference (module docstring)."""
    ref = ridge(a, b, lam) if ref is None else ref
    for j, (dx, dr) in enumerate(bounds(a, b, ref, lam)):
        got = ldexp(x[:, j], -q[j])
        size = np.linalg.norm(ref[:, j])
        assert np.linalg.norm(got - ref[:, j]) <= dx, (j, np.linalg.norm(got - ref[:, j]), dx)
        assert abs(np.ldexp(xn[j], -q[j]) - size) <= dx, (j, xn[j], size)
        r = np.linalg.norm(b[:, j] - a @ ref[:, j])
        assert abs(np.ldexp(rn[j], -q[j]) - r) <= dr, (j, rn[j], r, dr)


@pytest.mark.parametrize("q", APART, ids=["2^1200 apart", "2^600 apart"])
@pytest.mark.parametrize("route", sorted(ROUTES))
def test_sequence_columns_apart(route, q):
    """A sequence of lambdas: every lambda's block of columns, each column at its own scale (refused, or its
    norms reported as 0, before)."""
    shape, kw = ROUTES[route]
    a, b = problem(shape, seed=11)
    q = np.array(q)
    x = bl.solve(a, ldexp(b, q[None, :]), lam=SEQUENCE, **kw)
    report, x = x.report, np.asarray(x)
    pa, pb = prepared(a, b, kw)
    for i, lam in enumerate(SEQUENCE):
        check_block(x[:, 2 * i:2 * i + 2], report["residual_norm"][i], report["solution_norm"][i], pa, pb, q, lam)
        if kw.get("fit_intercept"):  # bbar - mu^T x: x's error times ||mu||, and its own rounding
            ref, mu, bbar = ridge(pa, pb, lam), a.mean(axis=0), b.mean(axis=0)
            for j, (dx, _) in enumerate(bounds(pa, pb, ref, lam)):
                want = bbar[j] - mu @ ref[:, j]
                got = np.ldexp(report["intercept"][i][j], -int(q[j]))
                tol = np.linalg.norm(mu) * dx + 8 * max(shape) * np.finfo(float).eps * (
                    abs(bbar[j]) + np.linalg.norm(mu) * np.linalg.norm(ref[:, j]))
                assert abs(got - want) <= tol, (i, j, got, want)


@pytest.mark.filterwarnings("ignore:solve. the .* sits at the low end:UserWarning")
@pytest.mark.parametrize("rule", ["gcv", "lcurve"])
@pytest.mark.parametrize("q", APART, ids=["2^1200 apart", "2^600 apart"])
@pytest.mark.parametrize("route", sorted(ROUTES))
def test_rule_columns_apart(route, q, rule):
    """GCV and the L-curve: the score summed over the columns is the large column's (the small one's part is
    ``2^-1200`` of it), so the choice is that of the large column solved alone: GCV's to its refinement's
    tolerance (``xatol = 1e-4`` in ``log10 lam``, twice), the L-curve's the same grid point (tall routes; the
    wide problems interpolate, and their corner sits where the residual is rounding, which differs with the
    scale). ``x`` and the norms at the chosen lambda are those of the reference."""
    shape, kw = ROUTES[route]
    a, b = problem(shape, seed=12)
    q = np.array(q)
    got = bl.solve(a, ldexp(b, q[None, :]), lam=rule, **kw)
    lam = got.report["lam"]
    alone = bl.solve(a, ldexp(b[:, :1], int(q[0])), lam=rule, **kw).report["lam"]
    if rule == "gcv":
        assert abs(np.log10(lam / alone)) <= 2e-4, (lam, alone)
    elif shape[0] > shape[1]:
        assert abs(lam - alone) <= 1e-12 * alone, (lam, alone)
    pa, pb = prepared(a, b, kw)
    check_block(np.asarray(got), got.report["residual_norm"], got.report["solution_norm"], pa, pb, q, lam)


def nnls_reference(a, b, lam):
    """Each column alone: SciPy's Lawson-Hanson NNLS on ``[A; lam I] x = [b; 0]`` (float64)."""
    from scipy.optimize import nnls

    n = a.shape[1]
    aug = np.vstack([a, lam * np.eye(n)])
    return np.stack([nnls(aug, np.concatenate([b[:, j], np.zeros(n)]))[0] for j in range(b.shape[1])], axis=1)


@pytest.mark.parametrize("lam", [1.0, SEQUENCE], ids=["one lam", "sequence"])
@pytest.mark.parametrize("q", APART, ids=["2^1200 apart", "2^600 apart"])
@pytest.mark.parametrize("extra", [{}, {"fit_intercept": True}, {"sample_weight": np.linspace(0.5, 2.0, 40)}],
                         ids=["plain", "intercept", "weights"])
def test_positive_columns_apart(extra, q, lam):
    """``positive=True``: each column's NNLS is its own problem, at its own scale; ``x`` and the norms within the
    module docstring's bound of the NNLS on the augmented system (the active set is the same: the reference's
    smallest free coefficient is far above the bound, asserted). ``b`` of mixed signs so that some coefficients
    are held at 0."""
    rng = np.random.default_rng(13)
    a = rng.standard_normal((40, 6))
    b = rng.standard_normal((40, 2))
    q = np.array(q)
    got = bl.solve(a, ldexp(b, q[None, :]), lam=lam, positive=True, **extra)
    lams = [lam] if np.ndim(lam) == 0 else lam
    x = np.asarray(got)
    pa, pb = prepared(a, b, extra)
    for i, lm in enumerate(lams):
        ref = nnls_reference(pa, pb, lm)
        for j, (dx, _) in enumerate(bounds(pa, pb, ref, lm)):
            assert np.min(ref[ref[:, j] > 0, j]) > 10 * dx  # the same active set within the bound
        rn = got.report["residual_norm"] if np.ndim(lam) == 0 else got.report["residual_norm"][i]
        xn = got.report["solution_norm"] if np.ndim(lam) == 0 else got.report["solution_norm"][i]
        check_block(x[:, 2 * i:2 * i + 2], rn, xn, pa, pb, q, lm, ref)


@pytest.mark.parametrize("q", APART, ids=["2^1200 apart", "2^600 apart"])
def test_updatable_columns_apart_refused(q, tmp_path):
    """``updatable=True`` keeps ``A^T b`` and ``||b||^2`` at one scale in float64 for the update, which cannot hold
    a column ``2^600`` below another's squares: refused naming ``updatable``, the column and the fix (columns
    ``2^1200`` apart had been refused naming ``b``; ``2^600`` apart had been kept with that column's squares
    flushed to 0, its norms reported as 0). Each column alone is kept."""
    rng = np.random.default_rng(14)
    a, b = rng.standard_normal((40, 6)), rng.standard_normal((40, 2))
    q = np.array(q)
    with pytest.raises(ParameterError, match=r"^updatable: .*column\(s\) \[1\] of b more than 2\^511 below its "
                       r"largest.*solve the columns far apart in separate outputs"):
        bl.solve(a, ldexp(b, q[None, :]), lam=1.0, updatable=True, out=str(tmp_path / "x.zarr"))
    x = bl.solve(a, b[:, :1], lam=1.0, updatable=True, out=str(tmp_path / "x1.zarr"))
    assert np.isfinite(np.asarray(x)).all()


def loo_reference(a, b, lam, kw):
    """Per column: the sum over the rows of the squared leave-one-out errors of the ridge fit at ``lam`` on the
    data as given (``a``, ``b``), from the hat-matrix formula ``e_i / (1 - h_ii)`` on the prepared data (centered,
    rows times ``sqrt(w)``), with the intercept's leverage ``w_i / sum w`` (scikit-learn's ``RidgeCV``); and the
    smallest ``1 - h_ii`` (what the bound divides by)."""
    m = a.shape[0]
    w = kw.get("sample_weight", np.ones(m))
    if kw.get("fit_intercept"):
        mu, bbar = w @ a / w.sum(), w @ b / w.sum()
        a, b = a - mu, b - bbar
    sw = np.sqrt(w)
    aw, bw = sw[:, None] * a, sw[:, None] * b
    x = ridge(aw, bw, lam)
    h = np.einsum("ij,ij->i", aw, np.linalg.solve(aw.T @ aw + lam ** 2 * np.eye(a.shape[1]), aw.T).T)
    if kw.get("fit_intercept"):
        h = h + w / w.sum()
    e = (bw - aw @ x) / (1 - h)[:, None]
    return np.abs(e) ** 2, float(np.min(1 - h))


@pytest.mark.filterwarnings("ignore:solve. the leave-one-out minimum sits at:UserWarning")
@pytest.mark.parametrize("q", APART, ids=["2^1200 apart", "2^600 apart"])
@pytest.mark.parametrize("route", sorted(ROUTES))
def test_loo_columns_apart(route, q):
    """``lam="loo"`` (one lambda for all columns): the mean squared leave-one-out error over the columns at the
    largest column's scale is the large column's (the small one's part ``2^-1200`` of it), so the choice is that
    of the large column solved alone, and the reported curve is that of ``b`` as given (refused ``2^1200`` apart,
    the small column's norms reported as 0 ``2^600`` apart, before). The errors are linear in ``b``: the large
    column's, scaled by ``2^-q_0``, against the hat-matrix reference on the grid the solve reports, within
    ``2 (c n eps cond(K) + c m eps) / min(1 - h_ii)`` relative (the fit's error, module docstring, through the
    residual and the leverage's division); the choice's error within that of the reference's smallest. ``x``
    and the norms at the chosen lambda as for the other rules."""
    shape, kw = ROUTES[route]
    a, b = problem(shape, seed=15)
    q = np.array(q)
    got = bl.solve(a, ldexp(b, q[None, :]), lam="loo", store_cv_results=True, **kw)
    lam, curve = got.report["lam"], got.report["curve"]
    assert lam == bl.solve(a, ldexp(b[:, :1], int(q[0])), lam="loo", **kw).report["lam"]
    grid = np.asarray(curve["lam"])
    rows, low = zip(*(loo_reference(a, b, g, kw) for g in grid))
    rows = np.stack(rows, axis=2)  # m x k x L, as cv_results_
    ref0 = rows[:, 0, :].sum(axis=0)
    s = np.linalg.svd(prepared(a, b, kw)[0], compute_uv=False)
    eps, c, big = np.finfo(np.float64).eps, 8, max(shape)
    tol = 2 * (c * big * eps * (s[0] ** 2 + grid ** 2) / (s[-1] ** 2 + grid ** 2) + c * big * eps) / np.array(low)
    i = curve["chosen_index"]
    assert ref0[i] <= np.min(ref0 * (1 + tol)) * (1 + tol[i]), (ref0[i], np.min(ref0))
    mse = np.ldexp(np.asarray(curve["loo"]), -2 * int(q[0])) * (2 * shape[0])  # the large column's sum
    cv = np.ldexp(got.report["cv_results_"][:, 0, :], -2 * int(q[0]))  # each row's, the large column's
    if q[0] >= 512:  # the mean squared error of b as given, near 2^1200, overflows float64, as NumPy's would
        assert np.all(np.isinf(mse)) and np.all(np.isinf(cv))
    else:
        assert np.all(np.abs(mse - ref0) <= tol * ref0), np.max(np.abs(mse - ref0) / ref0)
        assert np.all(np.abs(cv - rows[:, 0, :]).sum(axis=0) <= tol * ref0)
    assert np.isclose(got.report["best_score_"], -curve["loo"][i], rtol=0, atol=0)
    check_block(np.asarray(got), got.report["residual_norm"], got.report["solution_norm"], *prepared(a, b, kw), q,
                lam)
