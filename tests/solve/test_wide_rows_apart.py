"""Wide ridge solves whose rows are far apart in scale (tests/support/ridge.py's ``rows_apart``: rows of norm
``1e5`` and ``5e-4`` among rows near 1), the large row first, in the middle and last.

``K = A A^T`` rounds relative to its rows (``|dK_ij| <= n eps ||a_i|| ||a_j||``), its eigen-decomposition
norm-wise (``m eps e_max``, ``e_max`` near ``1e10``): the bounds here are those of the row-scaled problem,
``H = D^-1 (K + lam^2 I) D^-1`` with ``D = diag(sqrt(K_ii + lam^2))``, whose Cholesky solve has a forward error
of about ``(m + n) eps cond(H)`` in ``D y`` (Higham 2002, 10.1), not ``cond(K + lam^2 I)``. With an intercept the
problem is the bordered ``[[K + lam^2 I, 1], [1^T, 0]] [y; x0] = [b; 0]`` of the rows shifted by any one row
(the same problem for every shift): the bound takes the shift by the row nearest the mean, scaled the same way.

References: mpmath at 50 digits on the data as given (exact in binary).
"""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.model_selection import KFold

import blocklin as bl
from support.ridge import EPS64, rows_apart

M, N = 20, 40
LAMS2 = [1e-8, 1e-2]


def _data(where: str) -> tuple[np.ndarray, np.ndarray]:
    """``rows_apart`` with its large row (row 3) moved first, to the middle or last but one (the small row last)."""
    a, b = rows_apart(np.random.default_rng(0), M, N)
    p = np.arange(M)
    j = {"first": 0, "middle": M // 2, "last": M - 2}[where]
    p[[3, j]] = p[[j, 3]]
    return a[p], b[p]


def _dual_mp(a: np.ndarray, b: np.ndarray, lam2: float, intercept: bool,
             w: np.ndarray | None = None) -> tuple[np.ndarray, float]:
    """``(y, x0)`` of the dual ridge problem (bordered with an intercept), in mpmath; with weights ``w`` (an
    intercept) of ``[[S A A^T S + lam^2 I, u], [u^T, 0]] [y; x0] = [S b; 0]`` (``u = sqrt(w)``, ``S = diag(u)``,
    ``x = A^T S y``)."""
    import mpmath as mp

    m = len(a)
    with mp.workdps(50):
        am = mp.matrix(a.tolist())
        k = am * am.T + mp.mpf(lam2) * mp.eye(m)
        if intercept:
            u = [mp.sqrt(mp.mpf(float(v))) for v in (np.ones(m) if w is None else w)]
            big = mp.zeros(m + 1, m + 1)
            rhs = mp.zeros(m + 1, 1)
            for i in range(m):
                for j in range(m):
                    big[i, j] = u[i] * u[j] * (k[i, j] - (mp.mpf(lam2) if i == j else 0))
                big[i, i] += mp.mpf(lam2)
                big[i, m] = big[m, i] = u[i]
                rhs[i] = u[i] * mp.mpf(float(b[i]))
            s = mp.lu_solve(big, rhs)
            return np.array([float(s[i]) for i in range(m)]), float(s[m])
        y = mp.lu_solve(k, mp.matrix([float(v) for v in b]))
        return np.array([float(v) for v in y]), 0.0


def _x_mp(a: np.ndarray, y: np.ndarray) -> np.ndarray:
    import mpmath as mp

    with mp.workdps(50):
        x = mp.matrix(a.T.tolist()) * mp.matrix(y.tolist())
        return np.array([float(v) for v in x])


@pytest.mark.parametrize("method", ["auto", "qr"])
@pytest.mark.parametrize("where", ["first", "middle", "last"])
@pytest.mark.parametrize("lam2", LAMS2)
def test_wide_solve_at_one_lambda_rows_apart(where, lam2, method):
    """``solve(a, b, lam)`` without an intercept: ``x`` had been ``9e-7`` off (relative) with the large row in the
    middle or last at both lambdas, no warning; the row-scaled condition is about 1e3 (wide._rows_apart_solves).
    ``method="qr"`` takes the SVD of the streaming ``R`` (``A A^T = R^H R`` never formed, its values to
    ``eps ||A||``): ``3e-11`` off, within the same bound, so it keeps its spectrum.

    Bound: ``||d(D y)|| <= (m + n) eps cond(H) ||D y||``, reaching ``x = A^T y`` through ``||A^T D^-1||_2``, plus
    the product's own rounding ``n eps || |A|^T |y| ||`` and the output's ``eps ||x||``."""
    a, b = _data(where)
    x = np.asarray(bl.solve(a, b, lam=np.sqrt(lam2), method=method)).ravel()
    y, _ = _dual_mp(a, b, lam2, False)
    xr = _x_mp(a, y)
    k = a @ a.T
    d = np.sqrt(np.diag(k) + lam2)
    h = k / np.outer(d, d) + np.diag(lam2 / d**2)
    dz = (M + N) * EPS64 * np.linalg.cond(h) * np.linalg.norm(d * y)
    bound = np.linalg.norm(a.T / d, 2) * dz + N * EPS64 * np.linalg.norm(np.abs(a).T @ np.abs(y)) \
        + EPS64 * np.linalg.norm(xr)
    assert np.linalg.norm(x - xr) <= bound, (np.linalg.norm(x - xr) / np.linalg.norm(xr), bound)


def _bordered_bound(at, lam2, y, x0, u=None):
    """``(dz, c, d)``: the forward error of ``(D y, x0 / c)`` of the bordered dual problem of the (shifted) rows
    ``at`` (weighted by ``u = sqrt(w)``: ``S at``, the border ``u``), scaled by ``D = diag(sqrt(K_ii + lam^2))`` and
    its border by ``c = 1 / ||D^-1 u||``: ``(m + n) eps`` times its condition (Higham 2002, 10.1, with the kernel's
    rounding relative to its rows)."""
    u = np.ones(len(at)) if u is None else u
    kt = (u[:, None] * at) @ (u[:, None] * at).T
    d = np.sqrt(np.diag(kt) + lam2)
    c = 1.0 / np.linalg.norm(u / d)
    mt = len(at)
    big = np.zeros((mt + 1, mt + 1))
    big[:mt, :mt] = kt / np.outer(d, d) + np.diag(lam2 / d**2)
    big[:mt, mt] = big[mt, :mt] = c * u / d
    z = np.concatenate([d * y, [x0 / c]])
    return (M + N) * EPS64 * np.linalg.cond(big) * np.linalg.norm(z), c, d


def _typical_row(a: np.ndarray) -> int:
    """The row of smallest median squared distance to the others (the shift the route takes where row 0 is far)."""
    dist = ((a[:, None, :] - a[None, :, :]) ** 2).sum(axis=2)
    return int(np.argmin(np.median(dist, axis=0)))


def _check_intercept_solve(a, b, lam2, got, shift, w=None):
    """``x`` and the intercept of ``got`` against the bordered dual problem in mpmath (weights ``w``). Bound:
    :func:`_bordered_bound` of the rows less row ``shift`` (the route's), reaching ``x = A_s^T S D^-1 (D y)``
    through ``||A_s^T S D^-1||_2`` plus the product's rounding ``(m + 1) eps || |A_s|^T |S y| ||``; the intercept
    ``x0 = x0_s - a_s^T x`` through ``c`` and ``||a_s|| ||dx||`` plus ``n eps |a_s|^T |x|``. Returns ``x``'s
    relative error."""
    x, icpt = np.asarray(got).ravel(), float(np.ravel(got.intercept)[0])
    u = np.ones(len(a)) if w is None else np.sqrt(w)
    y, x0 = _dual_mp(a, b, lam2, True, w)
    xr = _x_mp(a, u * y)
    at = a - a[shift]
    dz, c, d = _bordered_bound(at, lam2, y, x0 + a[shift] @ xr, u)
    dx = np.linalg.norm((u[:, None] * at).T / d, 2) * dz \
        + (M + 1) * EPS64 * np.linalg.norm(np.abs(at).T @ np.abs(u * y)) + EPS64 * np.linalg.norm(xr)
    assert np.linalg.norm(x - xr) <= dx, (np.linalg.norm(x - xr) / np.linalg.norm(xr), dx)
    di = c * dz + np.linalg.norm(a[shift]) * dx + N * EPS64 * (np.abs(a[shift]) @ np.abs(xr) + abs(x0))
    assert abs(icpt - x0) <= di, (abs(icpt - x0) / abs(x0), di)
    return float(np.linalg.norm(x - xr) / np.linalg.norm(xr))


@pytest.mark.parametrize("where", ["first", "middle", "last"])
@pytest.mark.parametrize("lam2", LAMS2)
def test_wide_solve_at_one_lambda_with_intercept_rows_apart(where, lam2):
    """``solve(a, b, lam, fit_intercept=True)``: with the large row after row 0 ``x`` had been ``1e-5`` off and the
    intercept ``1e-2`` (relative; warned by the norm-wise bound); with it first ``5e-4`` and ``1.5`` (warned: the
    kernel and the product less row 0 had lost the other rows). Now from the bordered row-scaled solve
    (wide._bordered_solves), with the large row first of the kernel summed again less a typical row and the
    product less that row (one more pass), without a warning. Bound: :func:`_check_intercept_solve` with the
    route's shift, row 0 where it is typical, else the typical row."""
    import warnings

    a, b = _data(where)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = bl.solve(a, b, lam=np.sqrt(lam2), fit_intercept=True)
    assert not [c for c in caught if issubclass(c.category, bl.errors.IllConditionedWarning)]
    assert got.report["passes"] == 2 + (where == "first")
    _check_intercept_solve(a, b, lam2, got, _typical_row(a) if where == "first" else 0)


@pytest.mark.parametrize("where", ["first", "middle"])
@pytest.mark.parametrize("lam2", LAMS2)
def test_wide_solve_at_one_lambda_with_intercept_and_weights_rows_apart(where, lam2):
    """As :func:`test_wide_solve_at_one_lambda_with_intercept_rows_apart` with sample weights: with the large row
    first ``x`` had been ``4.6e-4`` off (warned); now within the bordered bound, and ``report["condition_estimate"]``
    is the bordered system's (it covers ``x``'s error), no longer the norm-wise one of the spectrum, which at
    ``lam^2 = 1e-8`` had said no correct digit for an ``x`` right to ``4e-12``."""
    import warnings

    a, b = _data(where)
    w = np.random.default_rng(2).uniform(0.5, 2.0, M)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = bl.solve(a, b, lam=np.sqrt(lam2), fit_intercept=True, sample_weight=w)
    assert not [c for c in caught if issubclass(c.category, bl.errors.IllConditionedWarning)]
    err = _check_intercept_solve(a, b, lam2, got, _typical_row(a) if where == "first" else 0, w)
    assert err <= got.report["condition_estimate"] * EPS64 < 1e-6


def _fold_bound(a, train, test, lam2, y, x0, s):
    """``||dp||`` of one fold's held-out predictions: :func:`_bordered_bound` of the training rows shifted by
    ``s`` (``x0`` that of the shifted rows), reaching the predictions through ``||K_ht D^-1||_2 + c sqrt(m_h)``,
    plus the cross kernel's rounding ``n eps |A_h - s| |A_t - s|^T |y|``."""
    at, ah = a[train] - s, a[test] - s
    dz, c, d = _bordered_bound(at, lam2, y, x0)
    dp = (np.linalg.norm(ah @ at.T / d, 2) + c * np.sqrt(len(test))) * dz
    dp += N * EPS64 * np.linalg.norm(np.abs(ah) @ np.abs(at).T @ np.abs(y))
    return dp


@pytest.mark.parametrize("where", ["first", "middle", "last"])
def test_wide_kfold_with_intercept_rows_apart(where):
    """``solve(a, b, lam=("loo", grid), cv=5, fit_intercept=True)``: the fold scores had been ``8e-5`` off with the
    large row first (the kernel shifted by that row: every row near ``1e5``) and ``6e-6`` with it in the middle (the
    centered kernel's eigen-decomposition), no warning; scikit-learn's ``RidgeCV`` ``1e-7..1e-6``.

    Reference: each fold's bordered dual fit in mpmath; bound per fold :func:`_fold_bound` with the shift by the
    row nearest the mean of all rows."""
    a, b = _data(where)
    x = bl.solve(a, b, lam=("loo", np.sqrt(LAMS2)), cv=5, fit_intercept=True)
    got = np.asarray(x.report["curve"]["fold_scores"])  # L x folds
    s = a[np.argmin(np.linalg.norm(a - a.mean(axis=0), axis=1))]
    for l, lam2 in enumerate(LAMS2):
        for f, (train, test) in enumerate(KFold(5).split(a)):
            y, x0 = _dual_mp(a[train], b[train], lam2, True)
            pred = _x_mp(a[train], y) @ a[test].T + x0
            r = b[test] - pred
            sse, sst = float(r @ r), float(np.sum((b[test] - b[test].mean()) ** 2))
            dp = _fold_bound(a, train, test, lam2, y, x0 + s @ _x_mp(a[train], y), s)
            # the sum of squares moves by 2 ||r|| ||dp|| + ||dp||^2, plus its own rounding m eps sse
            tol = (2 * np.sqrt(sse) * dp + dp**2 + M * EPS64 * sse) / sst
            assert abs(got[l][f] - (1 - sse / sst)) <= tol, (where, lam2, f, got[l][f], 1 - sse / sst, tol)


def test_wide_kfold_intercept_passes():
    """The kernel shifted again (one more pass over ``a``) only where the shift by row 0 loses the rows near 1:
    the large row first; in the middle, and well-scaled rows, the two passes of the route."""
    for where, passes in (("first", 3), ("middle", 2)):
        a, b = _data(where)
        assert bl.solve(a, b, lam=("loo", [1e-4, 0.1]), cv=5, fit_intercept=True).report["passes"] == passes
    rng = np.random.default_rng(1)
    a = rng.standard_normal((M, N)) + 3.0
    b = a @ rng.standard_normal(N) + 1.0
    assert bl.solve(a, b, lam=("loo", [1e-4, 0.1]), cv=5, fit_intercept=True).report["passes"] == 2


@pytest.mark.parametrize("where", ["first", "middle"])
def test_wide_kfold_with_intercept_rows_apart_solution(where):
    """The k-fold's solve at the chosen lambda with an intercept: with the large row first it had been the solve
    less row 0 (``x`` ``5e-4`` off, the intercept ``1.5``, warned); now the bordered solve of the kernel the folds
    took (less a typical row, the one extra pass) and the product less the same row. Bound as
    :func:`test_wide_solve_at_one_lambda_with_intercept_rows_apart`."""
    a, b = _data(where)
    got = bl.solve(a, b, lam=("loo", np.sqrt(LAMS2)), cv=5, fit_intercept=True)
    lam2 = float(got.report["alpha_"])
    assert got.report["passes"] == 2 + (where == "first")
    _check_intercept_solve(a, b, lam2, got, _typical_row(a) if where == "first" else 0)


@pytest.mark.parametrize("where", ["first", "middle", "last"])
def test_wide_qr_solve_with_intercept_rows_apart(where):
    """``method="qr"`` with an intercept at one lambda: the route keeps the kernel of the rows less row 0 for the
    leave-one-out's bordered system (``dual_kernel``), which the solves without an intercept must not take (they
    had, once both fixes met: ``x`` ``9e9`` relative off, no warning).

    Bound: the route's norm-wise one, the SVD of the centered factor with ``(m + n) eps ||A_c||_2`` absolute error
    in its values, reaching ``x`` through ``(||A_c||_2^2 + lam^2) / lam^2`` (Hansen 1998, 4.4)."""
    lam2 = 1e-2
    a, b = _data(where)
    x = np.asarray(bl.solve(a, b, lam=np.sqrt(lam2), fit_intercept=True, method="qr")).ravel()
    y, _ = _dual_mp(a, b, lam2, True)
    xr = _x_mp(a, y)
    ac = a - a.mean(axis=0)
    bound = (M + N) * EPS64 * (np.linalg.norm(ac, 2) ** 2 + lam2) / lam2 * np.linalg.norm(xr)
    assert np.linalg.norm(x - xr) <= bound, (np.linalg.norm(x - xr) / np.linalg.norm(xr), bound)


def _force_gemms(monkeypatch):
    """The SYRK passes' ``m x m`` sums refused (forced), so the route's Gram matrix less row 0 and the kernel summed
    again less the typical row are both out-of-core GEMMs, in ``8 x 8`` tiles with k-panels of 16. Returns the
    tokens of the GEMMs run."""
    import dataclasses

    import blocklin.linalg.solve.shifted_gram as shifted_gram
    import blocklin.linalg.solve.wide as wide
    from blocklin.errors import BudgetError
    from blocklin.linalg.products.gemm import Gemm
    from blocklin.linalg.products.gram_kernels import gram_pass_kernel

    tokens = []
    real_wide, real_shifted, real_plan, real_run = wide.run_pass, shifted_gram.run_pass, Gemm.plan, Gemm.run

    def refuse(real):
        def run_pass(job, kernel, *args, **kwargs):
            if kernel in (gram_pass_kernel, shifted_gram.gram_less_row_kernel):
                raise BudgetError("memory: the m x m sums (forced)")
            return real(job, kernel, *args, **kwargs)
        return run_pass

    def plan(self, job, *args, **kwargs):
        p = real_plan(self, job, *args, **kwargs)
        if self.shift is not None:
            p = dataclasses.replace(p, tm=8, tn=8, tk=16, out_chunks=(8, 8), k_lead=0)
        return p

    def run(self, job, plan, *args, **kwargs):
        if self.shift is not None:
            tokens.append(self.token(plan))
        return real_run(self, job, plan, *args, **kwargs)

    monkeypatch.setattr(wide, "run_pass", refuse(real_wide))
    monkeypatch.setattr(shifted_gram, "run_pass", refuse(real_shifted))
    monkeypatch.setattr(Gemm, "plan", plan)
    monkeypatch.setattr(Gemm, "run", run)
    return tokens


def test_wide_intercept_rows_apart_through_the_out_of_core_gemms(monkeypatch):
    """The large row first with the SYRK passes over the budget: the route's GEMM less row 0 and the kernel's again
    less the typical row (shifted_gram.gram_less_row's fallback; its column 0 read less row 0 only on one side, so
    replaced by its row 0): the solve at one lambda and the k-fold's within the bounds of the pass route. The two
    GEMMs had one resume token (the shift named, not its row), so one could be taken for the other."""
    tokens = _force_gemms(monkeypatch)
    a, b = _data("first")
    lam2 = LAMS2[1]
    got = bl.solve(a, b, lam=np.sqrt(lam2), fit_intercept=True)
    assert got.report["passes"] == 3 and len(tokens) == 2 and tokens[0] != tokens[1]
    _check_intercept_solve(a, b, lam2, got, _typical_row(a))
    got = bl.solve(a, b, lam=("loo", np.sqrt(LAMS2)), cv=5, fit_intercept=True)
    _check_intercept_solve(a, b, float(got.report["alpha_"]), got, _typical_row(a))


@pytest.mark.gpu
def test_wide_solve_with_intercept_large_row_first_on_gpu():
    """The product less the typical row and its ``a_t^T x`` through the shifted product's device branch (a GPU, or
    the CuPy stand-in: ``pytest --cupy-standin``): the bounds of the CPU."""
    a, b = _data("first")
    lam2 = LAMS2[1]
    got = bl.solve(a, b, lam=np.sqrt(lam2), fit_intercept=True, device="gpu", scheduler="sync")
    assert got.report["device"] == "gpu"
    _check_intercept_solve(a, b, lam2, got, _typical_row(a))


def test_wide_intercept_large_row_first_resumes_after_the_pass_less_a_row(tmp_path, monkeypatch):
    """Interrupted after the pass less the typical row (at the product), ``resume=True`` takes the Gram matrix and
    the kernel less that row from their records (``wide-gram``, ``wide-gram-less-row-t``): only the product runs
    again, and the bits are those of an uninterrupted run."""
    import blocklin.linalg.solve.shifted_gram as shifted_gram
    import blocklin.linalg.solve.wide as wide

    a, b = _data("first")
    bl.from_array(a, tmp_path / "A.zarr", chunks=(M, 10))
    bl.from_array(b[:, None], tmp_path / "B.zarr", chunks=(M, 1))
    (tmp_path / "tmp").mkdir()
    kw = dict(lam=0.1, fit_intercept=True, scheduler="sync", temp_dir=str(tmp_path / "tmp"))
    ref = bl.solve(str(tmp_path / "A.zarr"), str(tmp_path / "B.zarr"), out=str(tmp_path / "ref.zarr"), **kw)
    assert ref.report["passes"] == 3

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(wide, "_shifted_product", interrupted)
    with pytest.raises(KeyboardInterrupt):
        bl.solve(str(tmp_path / "A.zarr"), str(tmp_path / "B.zarr"), out=str(tmp_path / "x.zarr"), resume=True, **kw)
    monkeypatch.undo()
    ran = []
    real = shifted_gram.run_pass
    monkeypatch.setattr(shifted_gram, "run_pass", lambda *args, **kwargs: ran.append(1) or real(*args, **kwargs))
    x = bl.solve(str(tmp_path / "A.zarr"), str(tmp_path / "B.zarr"), out=str(tmp_path / "x.zarr"), resume=True, **kw)
    assert not ran and x.report["passes"] == 1
    np.testing.assert_array_equal(x.to_numpy(), ref.to_numpy())
