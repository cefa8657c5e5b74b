"""Leave-one-out choice of lambda from a grid: scikit-learn's ``RidgeCV`` (``cv=None``, ``scoring=None``).

For ridge regression the leave-one-out error of row ``i`` has a closed form, ``e_i / (1 - h_ii)``,
with ``e_i`` the residual of the fit on every row and ``h_ii`` the hat diagonal
``a_i^T (A^T A + lam^2 I)^{-1} a_i`` (Golub, Heath and Wahba 1979; Rifkin and Lippert 2007, the
notes scikit-learn's ``_RidgeGCV`` cites: exact leave-one-out, which its code calls "gcv" mode).
From a spectrum ``A = U diag(s) V^T`` (the eigen-decomposition of the Gram matrix or the SVD of the
streaming ``R``, whichever the route has) every lambda of the grid costs one product per row:

* tall ``A``: one more pass over ``A`` and ``B`` (:func:`~blocklin.linalg.solve.kernels.loo_kernel`),
  ``p_i = V^T a_i``, ``h_ii = sum_j p_ij^2 / (s_j^2 + lam^2)`` and
  ``e_i = b_i - p_i^T diag(s / (s^2 + lam^2)) beta`` for the whole grid at once;
* wide ``A`` (the dual form): in memory from ``A A^T = U diag(s^2) U^T`` (``m x m``, held already),
  ``c = U D U^T b``, ``d = diag(U D U^T)``, ``D = (s^2 + lam^2)^{-1}``, error ``c_i / d_i`` (the
  kernel form of ``_RidgeGCV``'s ``gram`` mode).

As scikit-learn does: rows weighted by ``sqrt(w_i)`` and centered by the (weighted) means, and with
``fit_intercept`` the unpenalized intercept's leverage ``w_i / sum w`` added to ``h_ii`` (its column
``sqrt(w)`` is orthogonal to the centered ones, the correction ``_RidgeGCV`` applies as
``d -= sqrt_sw * G^-1 sqrt_sw / sum(sw)``). The score is the mean squared error over the rows and
right-hand sides (``best_score_`` is its negative), or per right-hand side with ``per_target``
(``alpha_per_target``); the first grid value of the smallest error wins, as there. Where ``b``'s columns were
each divided by their own power of two (too far apart for one), the mean weighs each column's squared errors by
its power relative to the largest (:meth:`~blocklin.linalg.solve.spectrum.Spectrum.column_weights`): the score of
``b`` as given, in the largest column's units. Per right-hand side,
each column's errors are squared divided by a power of two near its own largest entry where one power for
``b`` would take a column's squares out of float64's range (:func:`column_powers`).

The default grid (``lam="loo"``) spans the GCV grid (:func:`blocklin.linalg.solve.lambda_select.base_grid`)
widened by :data:`~blocklin.linalg.solve.lambda_select.EXTEND_DECADES` on each side, at
:data:`PER_DECADE` points per decade: one pass evaluates it all, so it is not extended afterwards; a
choice at its end is reported (``curve["at_grid_end"]``) with a warning.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from blocklin.config import format_size
from blocklin.errors import BudgetError, ParameterError, warn
from blocklin.errors import explain as _msg
from blocklin.linalg.solve.kernels import loo_kernel
from blocklin.linalg.solve import bordered_kernel, scaled_kernel
from blocklin.linalg.solve.shifted_gram import less_typical_row
from blocklin.linalg.solve.lambda_select import EXTEND_DECADES, base_grid
from blocklin.linalg.solve.spectrum import weigh_columns
from blocklin.plan.solve import small_bytes
from blocklin.runtime.passes import run_pass
from blocklin.runtime.powers import ldexp

#: Points per decade of the default leave-one-out grid.
PER_DECADE = 20


def default_grid(s: np.ndarray, floor: float = 0.0) -> np.ndarray:
    """The GCV grid's span widened by ``EXTEND_DECADES`` on each side, ``PER_DECADE`` points a decade,
    none below ``floor`` (a Gram spectrum's resolution, :attr:`~blocklin.linalg.solve.spectrum.Spectrum.floor`)."""
    base = base_grid(s, floor=floor)
    lo, hi = math.log10(base[0]) - EXTEND_DECADES, math.log10(base[-1]) + EXTEND_DECADES
    if floor:
        lo = max(lo, math.log10(floor))
    return np.logspace(lo, hi, int(math.ceil((hi - lo) * PER_DECADE)) + 1)


def max_grid() -> int:
    """The most points :func:`default_grid` gives: the GCV grid spans at most 13 decades (from a tenth of
    ``1e-12`` times the largest singular value), widened by ``EXTEND_DECADES`` on each side (what the
    leave-one-out pass is planned for before the spectrum is known)."""
    return int(math.ceil((13 + 2 * EXTEND_DECADES) * PER_DECADE)) + 2


def choose(ctx: Any, spec: Any) -> tuple[list[float], dict]:
    """The lambda(s) of smallest leave-one-out error on the grid, and the curve (cached per spectrum)."""
    if ctx.loo_choice is not None and ctx.loo_choice[0] is spec:
        return ctx.loo_choice[1], ctx.loo_choice[2]
    given = bool(ctx.lams)
    grid = np.asarray(ctx.lams, dtype=np.float64) if given else default_grid(spec.s, spec.floor)
    res = _dual(ctx, spec, grid) if spec.dual else _pass(ctx, spec, grid)
    rows, ce = res.get("rows"), res.get("col_e")
    sq = _one_power(None, res["sq"], ce)  # in the units of b scaled by its one power, as the report takes them
    k = sq.shape[1]
    per = sq / ctx.m  # mean squared error per lambda and right-hand side (each column's own units)
    # columns of b scaled each by its own power (least_squares' per-column switch): the mean at the largest
    # column's scale, as of b as given, where a column 2^600 below weighs nothing (Spectrum.column_weights)
    weights = weigh_columns(ctx, spec).column_weights(k)
    mse = sq @ weights / (ctx.m * k)
    several = ctx.per_target and k > 1
    if ctx.scoring is None:  # RidgeCV's default: minus the mean squared error
        score_per, score = -per, -mse
        by_column = -res["sq"] / ctx.m
    else:
        score_per, score, by_column = _scores(ctx, res, len(grid), k, several)

    def first_max(v: np.ndarray) -> int:
        return int(np.argmax(np.where(np.isfinite(v), v, -np.inf)))

    if several:  # each column's choice in its own units (column_powers): its squares had underflowed to ties
        idx = [first_max(by_column[:, j]) for j in range(k)]
        lams = [float(grid[i]) for i in idx]
    else:
        idx = first_max(score)
        lams = [float(grid[idx])]
    ends = {("low" if i == 0 else "high") for i in np.atleast_1d(idx) if i in (0, len(grid) - 1)}
    end = ",".join(sorted(ends)) if ends else None
    curve = {"lam": grid.tolist(), "loo": mse.tolist(), "loo_per_target": per.tolist(),
             "chosen": lams if len(lams) > 1 else lams[0], "chosen_index": idx, "at_grid_end": end,
             "grid": "given" if given else "default"}
    if ctx.scoring is not None:  # in the units of the problem given (not rescaled with the report)
        from blocklin.linalg.solve import scoring as scorers

        named = isinstance(ctx.scoring, str)
        eb, ce = scorers.units(ctx.sb, res.get("col_e"))
        e = eb if named else 0  # a callable's: in the units given already
        curve["scoring"] = ctx.scoring if named else "callable"
        curve["score"] = scorers.in_units(ctx.scoring if named else None, score, e).tolist()
        if named:  # each column's from its own units (in the largest's, a column's squares 2^1200 below had read 0)
            own = eb if ce is None else eb + ce
            curve["score_per_target"] = scorers.in_units(ctx.scoring, by_column, own).tolist()
        elif score_per is not None:
            curve["score_per_target"] = np.asarray(score_per).tolist()
    if end and not given:
        warn(f"solve: the leave-one-out minimum sits at the {end} end of lambda in [{grid[0]:.3g}, {grid[-1]:.3g}]; "
             "the chosen value is a bound (pass lam=('loo', [...]) with a grid beyond it)")
    ctx.loo_choice = (spec, lams, curve, rows)
    return lams, curve


def pass_reserve(m: int, n: int, k: int, n_lam: int, store: bool, memory: int, errors: bool = False) -> int:
    """What the leave-one-out pass holds outside its strips: the in-core problem and, with ``store``
    (``store_cv_results``), the ``m x k x L`` squared errors, with ``errors`` (a callable ``scoring=``) the
    ``m x k x L`` signed errors, their predictions and the ``m x k`` targets; refused where they exceed
    ``memory``."""
    kept = (8 * m * n_lam * k if store else 0) + (8 * m * k * (2 * n_lam + 1) if errors else 0)
    reserve = small_bytes(n, k) + kept
    if kept and reserve > memory:
        what = "cv_results_ (m x k x L float64, store_cv_results=True)" if store else \
            "the leave-one-out predictions a callable scoring= is called on (m x k x L float64)"
        raise BudgetError(_msg("memory", f"must hold {what} beside the in-core problem",
                               f"{format_size(kept)} for {m} rows x {k} x {n_lam} lambdas over "
                               f"memory={format_size(memory)}",
                               f"raise memory= to at least {format_size(reserve)} (plus a strip), pass a shorter "
                               "grid, or drop store_cv_results / pass a scoring= name (computed from sums)"),
                          minimum=reserve)
    return reserve


def _scores(ctx: Any, res: dict, n_lam: int, k: int, several: bool) -> tuple[np.ndarray | None, np.ndarray, Any]:
    """``scoring=``'s score per lambda (``L``) and per lambda and right-hand side (``L x k``; None where a
    callable scores all of them together), RidgeCV's: the scorer on every row's leave-one-out prediction
    on the unweighted target, in the units of the problem given; and the scores per right-hand side the
    choice reads (a name's: of each column divided by its own power, ``res["col_e"]``)."""
    from blocklin.linalg.solve import scoring

    eb, ce = scoring.units(ctx.sb, res.get("col_e"))  # b's one power, or the largest column's and the shifts
    if isinstance(ctx.scoring, str):  # of the scaled problem's sums: choose() reports them in_units
        own = scoring.per_target(ctx.scoring, res["stats"])
        per = _one_power(ctx.scoring, own, ce)
        return per, per.mean(axis=1), own
    err = res["errors"]  # m x L x k (complex of complex data), each column by its own power where ce is set
    e = eb if ce is None else eb + ce
    err = ldexp(err, e) if np.any(e) else err
    b = _targets(ctx)
    pred = b[:, None, :] - err
    w = _weights(ctx)
    per = None
    if several:
        per = np.array([[scoring.call(ctx.scoring, pred[:, i, j:j + 1], b[:, j:j + 1], True, w) for j in range(k)]
                        for i in range(n_lam)])
    score = np.array([scoring.call(ctx.scoring, pred[:, i, :], b, k == 1, w) for i in range(n_lam)])
    return per, score, per


def by_column(ctx: Any) -> bool:
    """Whether the scores are read column by column: the choice per right-hand side (``per_target``), or a
    scale-free score (``r2``, ``explained_variance``) averaged over the right-hand sides; ``k > 1``."""
    return ctx.k > 1 and (bool(ctx.per_target) or ctx.scoring in ("r2", "explained_variance"))


def column_powers(ctx: Any, top: Any = None) -> np.ndarray | None:
    """The power of two ``c_j`` each right-hand side's leave-one-out errors are divided by before they are
    squared, where the scores are read column by column (:func:`by_column`) and ``b`` (scaled by its one
    power ``2^eb``) has a column whose largest entry lies outside :func:`safe_range`: its squared errors near
    ``2^-1200`` (a column near ``2^-600`` beside one near 1) had underflowed to 0 for every lambda, and the
    first grid value won the tie without a word (another lambda than the column solved alone), or its ``r2``
    read 1 (``0 / 0``) at every lambda and the mean over the columns chose by the others alone. ``c_j`` brings column ``j``'s largest entry (``top``; else the peaks its first pass recorded,
    else read) near 1; the errors are linear in ``b_j``, so each column's comparison is exact and the
    reported sums are multiplied back (:func:`_one_power`). None where every column's squares are in range
    (the bits of one power)."""
    from blocklin.linalg.blocks.result_range import column_maxima
    from blocklin.linalg.solve.scoring import own_powers

    if not by_column(ctx) or (ctx.sb is not None and ctx.sb.columns is not None):
        return None  # b's columns each divided by their own power already (Scaling.columns): each near 1
    eb = ctx.sb.exponent if ctx.sb is not None else 0
    if top is None:
        top = ctx.job.peaks.get(ctx.sb.path) if ctx.sb is not None else None
        if top is None or np.size(top) != ctx.k:
            top = column_maxima(ctx.B.path, first=int(getattr(ctx.B, "first_row", 0)), rows=ctx.m)
    return own_powers(top, eb)


def _one_power(name: str | None, scores: np.ndarray, ce: np.ndarray | None) -> np.ndarray:
    """Sums or scores per right-hand side (last axis) of columns divided by their own powers ``2^ce``
    (:func:`column_powers`) in the units of ``b`` divided by its one power, exactly where they fit
    (:func:`~blocklin.linalg.solve.scoring.in_units`); as they are without ``ce``."""
    from blocklin.linalg.solve.scoring import in_units

    return np.asarray(scores) if ce is None else in_units(name, scores, ce)


def _weights(ctx: Any) -> np.ndarray | None:
    """``sample_weight`` in memory (None without): the callable scorer's ``sample_weight``, as RidgeCV's."""
    if not ctx.weighted:
        return None
    if ctx.wvec is None:
        from blocklin.matrix import Matrix

        ctx.wvec = np.asarray(Matrix(ctx.W.path)[...], dtype=np.float64)[:, 0]
    return ctx.wvec


def _targets(ctx: Any) -> np.ndarray:
    """``b`` in memory (float64, complex128 for complex data; the units given): what a callable scorer compares
    the predictions with."""
    from blocklin.matrix import Matrix

    return np.asarray(Matrix(ctx.B.path)[...], dtype=np.result_type(ctx.B.dtype, np.float64))


def _pass(ctx: Any, spec: Any, grid: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
    """Tall ``A``: the squared leave-one-out errors of every grid value from one pass over ``A`` and ``B``."""
    from dask.base import tokenize

    k, n_lam = spec.beta.shape[1], len(grid)
    s2 = spec.s**2
    with np.errstate(divide="ignore"):
        finv = np.where(s2[:, None] + grid[None, :] ** 2 > 0, 1.0 / (s2[:, None] + grid[None, :] ** 2), 0.0)
    # V^T x per lambda: from vc = V^T A^T b where the spectrum keeps it (what its solutions take)
    every = spec.every_direction(grid)
    coef = spec.s[:, None, None] * finv[:, :, None] * spec.beta[:, None, :]
    if every.any():
        coef[:, every, :] = finv[:, every, None] * spec.vc[:, None, :]
    coef = coef.reshape(spec.s.size, n_lam * k)
    stats, errors = ctx.scoring is not None, callable(ctx.scoring)
    params = {"v": np.ascontiguousarray(spec.basis), "finv": finv, "coef": coef, "lams": grid,
              "mu": ctx.mu if ctx.intercept else None, "bbar": ctx.bbar if ctx.intercept else None,
              # rows centered as the Gram pass summed them: less the first row, then less the shifted mean
              **({"sa0": ctx.shift_a, "sb0": ctx.shift_b, "mu": ctx.dmu, "bbar": ctx.dbbar}
                 if ctx.intercept and ctx.shift_a is not None else {}),
              "intercept": bool(ctx.intercept), "wsum": ctx.total_weight, "store": bool(ctx.store_cv),
              "stats": stats, "errors": errors,
              "shift": ctx.bbar if ctx.intercept and ctx.bbar is not None else np.zeros(k),
              "col_e": column_powers(ctx)}
    ratio = spec.interpolates(ctx.intercept)
    if ratio:
        params.update(ratio_params(spec, finv))
    else:
        params.update(_scaled_directions(spec, grid, finv, every, params["v"], params["coef"], k))
    reserve = pass_reserve(ctx.m, ctx.n, k, n_lam, ctx.store_cv, ctx.job.cfg.memory, errors)

    def run() -> dict:
        states, _ = run_pass(ctx.job, loo_kernel, ctx.sources(), params, reserve=reserve, check_finite=False,
                             scale=ctx.scale, device="cpu",
                             description=f"leave-one-out pass: hat diagonals and residuals of {n_lam} lambdas")
        states = [st for st in states if st is not None]
        out = {"sq": sum(st["sq"] for st in states)}
        if ctx.store_cv:
            out["rows"] = np.concatenate([blk for st in states for _, blk in st["blocks"]], axis=0)
        if stats:
            out.update({key: sum(st[key] for st in states) for key in ("sb", "bb", "se", "sse", "sae")})
        if errors:
            out["errors"] = np.concatenate([blk for st in states for _, blk in st["errors"]], axis=0)
        return out

    ctx.phases["leave-one-out pass"] = "cpu"
    ce = params["col_e"]
    rec = ctx.saved.run(f"loo-{tokenize(grid, spec.s, spec.beta, ctx.store_cv, stats, errors, ratio, ce)[:16]}", run)
    res = {"sq": np.asarray(rec["sq"]), "rows": _rows_one_power(rec.get("rows"), ce, n_lam), "col_e": ce}
    if stats:
        from blocklin.linalg.solve.scoring import Stats, centered_squares

        total = ctx.total_weight
        bb = np.asarray(rec["bb"])  # sum w |y - shift|^2: the centered sum comes from it and sb
        sst = centered_squares(bb, np.asarray(rec["sb"]), total, ctx.m, bb)
        res["stats"] = Stats(n=total, se=np.asarray(rec["se"]), sse=np.asarray(rec["sse"]), sae=np.asarray(rec["sae"]),
                             sst=np.broadcast_to(sst, (n_lam, k)).copy())
    if errors:
        res["errors"] = np.asarray(rec["errors"]).reshape(ctx.m, n_lam, k)
    return res


def _rows_one_power(rows: Any, ce: np.ndarray | None, n_lam: int) -> Any:
    """The kept squared errors (``m x (L k)``, ``store_cv_results``) of columns divided by their own powers
    (:func:`column_powers`) in the units of ``b`` divided by its one power, as :func:`report_entries` takes them."""
    if rows is None or ce is None:
        return rows
    r = np.asarray(rows, dtype=np.float64)
    with np.errstate(under="ignore", over="ignore"):
        return np.ldexp(r.reshape(r.shape[0], n_lam, -1), 2 * ce).reshape(r.shape)


def _scaled_directions(spec: Any, grid: np.ndarray, finv: np.ndarray, every: np.ndarray, v: np.ndarray,
                       coef: np.ndarray, k: int) -> dict:
    """The pass's ``v``, ``finv`` and ``coef`` with direction ``j`` carried as ``V_j 2^-e_j``, ``2^(2 e_j) /
    (s_j^2 + lam^2)`` and ``2^e_j`` times its coefficients (``s_j = f 2^e_j``), where ``s_j`` is beyond
    ``2^+-400``: ``p_ij = a_i^T V_j`` is about ``s_j`` (``A V_j = s_j U_j``), and its square and
    ``1 / (s_j^2 + lam^2)`` left float64 (columns ``2^600`` apart: ``s_j`` and the grid's ``lam`` near
    ``1e-189``). The direction's hat and fit terms were then 0 and the leave-one-out errors were those of a
    fit without it: a curve 4% off, the choice at the grid's other end. Powers of two (exact); the other
    directions keep their bits."""
    s = np.abs(np.asarray(spec.s, dtype=np.float64))
    e = np.where((s > 0) & ((s < 2.0 ** -400) | (s > 2.0 ** 400)), np.frexp(s)[1], 0)
    if not e.any():
        return {}
    sel = e != 0
    es = e[sel][:, None]
    sj, lam = s[sel][:, None], grid[None, :]
    top = np.maximum(sj, lam)
    t = np.where(top > 0, -np.frexp(top)[1], 0)
    st, lt = np.ldexp(sj, t), np.ldexp(lam, t)
    den = st**2 + lt**2
    with np.errstate(divide="ignore", under="ignore", over="ignore"):
        ft = np.where(den > 0, 1.0 / np.where(den > 0, den, 1.0), 0.0)
        finv = finv.copy()
        finv[sel] = np.ldexp(ft, 2 * t + 2 * es)  # 2^(2e) / (s^2 + lam^2), s^2 + lam^2 = 2^(-2t) den
        sf = np.ldexp(st * ft, t + es)  # 2^e s / (s^2 + lam^2)
        cf = np.ldexp(ft, 2 * t + es)  # 2^e / (s^2 + lam^2): the coefficients from vc
    coef = coef.reshape(s.size, grid.size, k).copy()
    coef[sel] = sf[:, :, None] * spec.beta[sel][:, None, :]
    if every.any():
        coef[np.ix_(sel, every)] = cf[:, every, None] * spec.vc[sel][:, None, :]
    return {"v": np.ascontiguousarray(ldexp(v, -e[None, :])),
            "finv": finv, "coef": coef.reshape(s.size, grid.size * k)}


def ratio_params(spec: Any, finv: np.ndarray) -> dict:
    """The leave-one-out pass's ``v``, ``finv`` and ``coef`` for a fit that interpolates as ``lam -> 0``
    (:meth:`~blocklin.linalg.solve.spectrum.Spectrum.interpolates`: a square ``A``, or ``m = n + 1``
    with ``fit_intercept``).

    There ``1 - h_ii = (1 - w_i / sum w - |u_i|^2) + lam^2 sum_j |u_ij|^2 / (s_j^2 + lam^2)`` with the
    bracket exactly 0; formed, it leaves rounding of order ``n eps``, which the ``lam^2`` term falls
    below at the grid's low end, and the residual ``e_i`` is a difference of the same kind (a square
    ``A`` with ``fit_intercept`` scored errors near ``1e-30`` where refitting without each row gives 81).
    With ``U_r = A V_r diag(1 / s_r)`` spanning the rows beside the intercept's column,
    ``I - H = lam^2 U_r diag(1 / (s^2 + lam^2)) U_r^H``, so ``e_i = lam^2 u_i^T diag(f) beta_r`` and
    ``1 - h_ii = lam^2 |u_i|^2 f``: the kernel (:func:`~blocklin.linalg.solve.kernels.loo_kernel`) takes
    their ratio, no difference formed. Directions the spectrum does not resolve are left out: in exact
    arithmetic they lie in ``A``'s null space."""
    r = spec.resolved()
    fr = np.ascontiguousarray(finv[r])
    coef = (fr[:, :, None] * spec.beta[r][:, None, :]).reshape(int(r.sum()), -1)
    return {"v": np.ascontiguousarray(spec.basis[:, r] / spec.s[r]), "finv": fr, "coef": coef, "ratio": True,
            "s2": np.abs(spec.s[r]) ** 2}  # the full fit's coefficients are s^2 times coef (a weight-0 row's error)


def without_intercept(spec: Any, sw: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(U', beta', s'^2)`` of a wide spectrum with the intercept's direction ``sqrt(w)`` taken out:
    the unpenalized intercept removes it from ``(A A^T + lam^2 I)^-1`` (scikit-learn's ``_RidgeGCV``
    cancels its eigenvalue, ``w[intercept_dim] = 0``).

    The centered ``A`` has ``sqrt(w)`` in its left null space, so it lies among the directions the
    spectrum does not resolve, whose weight ``1 / (s^2 + lam^2)`` is of order ``1 / lam^2``. Subtracted
    afterwards (``d -= sqrt_sw G^-1 sqrt_sw / sum(w)``), it cancels against itself, leaving rounding
    times ``1 / lam^2``: a wide ``A`` with ``fit_intercept`` and ``method='qr'`` scored infinite and
    negative errors at the grid's low end. Here the unresolved directions are replaced by an orthonormal
    basis of their span without ``sqrt(w)`` (an SVD of ``N - s s^H N``, ``s = sqrt(w) / ||sqrt(w)||``,
    keeping what is not ``s``), with ``s^2 = 0``: every weight stays a positive sum, nothing cancels."""
    u, beta, s2 = spec.basis, spec.beta, np.abs(spec.s) ** 2
    unit = sw / np.linalg.norm(sw)
    null = ~spec.resolved()
    along = np.abs(u.conj().T @ unit)
    if np.linalg.norm(along[null]) < 0.5:  # not resolved as null: the direction nearest sqrt(w) (sklearn's rule)
        null[int(np.argmax(along))] = True
    n0 = u[:, null]
    rest = n0 - np.outer(unit, unit @ n0)
    q, sv, _ = np.linalg.svd(rest, full_matrices=False)
    q = q[:, sv > 0.5]  # the span of the null directions without sqrt(w): singular values 1 and 0
    b = u @ beta  # the centered, weighted b (U is square for a wide spectrum)
    keep = ~null
    return (np.hstack([u[:, keep], q]), np.vstack([beta[keep], q.conj().T @ b]),
            np.concatenate([s2[keep], np.zeros(q.shape[1])]))


def _dual(ctx: Any, spec: Any, grid: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
    """Wide ``A``: the squared leave-one-out errors from ``A A^T = U diag(s^2) U^T`` in memory.

    The error of row ``i`` is ``e_i / (1 - h_ii)`` with ``b - A x = lam^2 y`` and
    ``1 - h_ii = lam^2 (U diag(1 / (s^2 + lam^2)) U^H)_ii`` (the factor ``lam^2`` cancels). Complex data:
    ``A A^H = U diag(s^2) U^H``, the hat matrix Hermitian, so ``h_ii`` is real (``sum_j |u_ij|^2 ...``) and the
    squared error is ``|e_i / (1 - h_ii)|^2``.
    """
    u, beta, s2 = spec.basis, spec.beta, spec.s**2
    sw = np.sqrt(ctx.wvec) if ctx.wvec is not None else np.ones(ctx.m)
    if callable(ctx.scoring) and not sw.all():
        # a weight-0 row's prediction is the full fit's, which the weighted A A^T (its row 0) no longer holds:
        # it had been handed to the scorer as 0 / 0 (NaN or inf)
        raise ParameterError(_msg(
            "scoring", "a callable on a wide a needs every row's leave-one-out prediction, which a row of "
            "sample_weight 0 does not have in the weighted dual form", f"a callable with {int((sw == 0).sum())} "
            f"rows of weight 0 on a {ctx.m} x {ctx.n} a", "drop the rows of weight 0, or pass a scorer's name "
            "(a weight-0 row scores 0 there)"))
    if ctx.intercept:
        u, beta, s2 = without_intercept(spec, sw)
    u2 = (u * u.conj()).real
    ce = column_powers(ctx, np.abs(_targets(ctx)).max(axis=0, initial=0.0)) if by_column(ctx) else None
    sq, rows, errs = [], [], []
    if ctx.intercept:
        apart = intercept_kernel(ctx, spec, sw, grid)
        redo = apart["redo"]
    else:
        redo = _rows_apart(ctx, s2, grid)
    for l, lam in enumerate(grid):
        with np.errstate(divide="ignore"):
            d_ = 1.0 / (s2 + lam**2)
        c = u @ (d_[:, None] * beta)
        d = u2 @ d_
        if ctx.intercept and redo[l]:  # the bordered system on the row-scaled kernel (bordered_kernel)
            factor = bordered_kernel.bordered_factor(apart["k"], sw, float(lam) ** 2)
            apart["cond"][l] = factor[3] if factor is not None else np.inf
            if factor is not None:
                c = bordered_kernel.bordered_solve(factor, ctx.dual_kernel[1])
                d = bordered_kernel.bordered_inverse_diagonal(factor)
        elif redo[l]:
            factor = scaled_kernel.scaled_factor(ctx.dual_kernel[0], float(lam) ** 2)
            if factor is not None:  # (K + lam^2 I)^-1 = D^-1 L^-H L^-1 D^-1: its diagonal from the columns of L^-1
                c = scaled_kernel.scaled_solve(factor, ctx.dual_kernel[1])
                d = scaled_kernel.scaled_inverse_diagonal(factor)
        if ce is not None:  # each column by its own power before its squares (column_powers)
            c = ldexp(c, -ce)
        with np.errstate(divide="ignore", invalid="ignore"):
            e2 = np.abs(c / d[:, None]) ** 2
        sq.append(e2.sum(axis=0))
        rows.append(e2)
        if ctx.scoring is not None:
            with np.errstate(divide="ignore", invalid="ignore"):
                errs.append(c / d[:, None] / sw[:, None])  # the error on the unweighted target
    if ctx.intercept:
        _warn_unresolved(ctx, apart, grid)
    stored = np.stack(rows, axis=1).reshape(ctx.m, -1) if ctx.store_cv else None
    res = {"sq": np.array(sq), "rows": _rows_one_power(stored, ce, len(grid)), "col_e": ce}
    if ctx.scoring is not None:
        from blocklin.linalg.solve.scoring import from_errors, units

        err = np.stack(errs, axis=1)  # m x L x k, in the scaled units of b (each column's own, with ce)
        eb, shift = units(ctx.sb, ce)
        e = eb if shift is None else eb + shift
        res["stats"] = from_errors(err, ldexp(_targets(ctx), -e) if np.any(e) else _targets(ctx), ctx.wvec)
        res["errors"] = err
    return res


def _rows_apart(ctx: Any, s2: np.ndarray, grid: np.ndarray) -> np.ndarray:
    """Per grid value: whether the wide leave-one-out's ``c = (K + lam^2 I)^-1 b`` and ``diag((K + lam^2 I)^-1)``
    are taken again from the row-scaled kernel by Cholesky (:mod:`~blocklin.linalg.solve.scaled_kernel`), as the
    k-fold route's fits: ``K = A A^T`` rounds relative to its rows, its eigen-decomposition norm-wise. Rows ``1e5``
    and ``5e-4`` apart: the errors' mean ``8.7e-5`` off at ``lam^2 = 1e-8`` and ``4.4e-6`` at ``1e-2`` (the scaled
    kernel's condition about 1e3; scikit-learn's ``RidgeCV`` as far off). Without an intercept (with one:
    :func:`intercept_kernel`)."""
    if ctx.dual_kernel is None or ctx.intercept:
        return np.zeros(len(grid), dtype=bool)
    kernel = ctx.dual_kernel[0]
    ev = np.clip(np.asarray(s2, dtype=np.float64), 0.0, None)
    noise = kernel.shape[0] * np.finfo(np.float64).eps * float(ev.max(initial=0.0))
    cut = np.any(ev[:, None] + grid[None, :] ** 2 <= noise, axis=0)  # eigenvalues under the eigensolver's rounding
    return scaled_kernel.refit(kernel, ev, grid, cut)


def intercept_kernel(ctx: Any, spec: Any, sw: np.ndarray, grid: np.ndarray) -> dict:
    """Per grid value: whether the wide leave-one-out with ``fit_intercept`` takes ``c`` and ``d`` from the bordered
    system on the row-scaled kernel (:mod:`~blocklin.linalg.solve.bordered_kernel`) instead of the centered spectrum,
    and that kernel ``k`` (weighted).

    The centered ``P K P`` mixes a far-off row into every row and rounds relative to it; its spectrum left the errors of
    rows ``1e5`` and ``5e-4`` apart ``1.6e-2`` to ``0.99`` relative off (``RidgeCV`` 3 to 3600 times off), and with the
    ``1e5`` row first (the row the wide Gram pass sums the rows less) ``3.5e3`` for ``2.3e8``. Taken where
    :func:`~blocklin.linalg.solve.scaled_kernel.refit` asks it of the kernel's eigenvalues (the intercept's direction
    left out) and its diagonal, or where the row the kernel's rows were summed less lies far from the others
    (:func:`~blocklin.linalg.solve.bordered_kernel.shift_loss` over ``m``): the kernel is then summed again less a
    typical row (:func:`~blocklin.linalg.solve.shifted_gram.less_typical_row`, one more pass over ``A``, shared with
    the solve at the chosen lambda); were that row
    far off too, it is shifted in memory and its rounding is ``rho2`` times what the scaling assumes
    (:func:`_warn_unresolved`)."""
    m = len(sw)
    none = {"redo": np.zeros(len(grid), dtype=bool), "cond": np.full(len(grid), np.nan), "rho2": np.ones(len(grid)),
            "apart": np.zeros(len(grid), dtype=bool)}
    if ctx.dual_kernel is None:
        return none
    g = ctx.dual_kernel[0]
    lam2 = np.asarray(grid, dtype=np.float64) ** 2
    w = sw**2
    g = less_typical_row(ctx, g, w, lam2)[1]  # summed again less a typical row where row 0 is far: one more pass
    t, rho2 = bordered_kernel.shift_loss(g, w, lam2)
    if float(rho2.max(initial=1.0)) > m:  # in memory, the rounding kept (rho2)
        g = bordered_kernel.shifted_by(g, t)
    k = sw[:, None] * g * sw[None, :]
    ev = np.clip(np.abs(np.asarray(spec.s, dtype=np.float64)) ** 2, 0.0, None)
    if ev.size:  # the intercept's direction (the eigenvalue of sqrt(w), 0 of the centered kernel) is not cut
        ev = np.delete(ev, int(np.argmax(np.abs(spec.basis.conj().T @ (sw / np.linalg.norm(sw))))))
    noise = m * np.finfo(np.float64).eps * float(ev.max(initial=0.0))
    cut = np.any(ev[:, None] + lam2[None, :] <= noise, axis=0)
    redo = scaled_kernel.refit(k, ev, grid, cut) | ((rho2 > m) & (lam2 > 0))
    diag = np.maximum(np.diag(k).real, 0.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        apart = (rho2 > m) | ((diag.max(initial=0.0) + lam2) / (diag.min(initial=0.0) + lam2) > m)
    return {"redo": redo, "k": k, "rho2": np.where(rho2 > m, rho2, 1.0), "cond": np.full(len(grid), np.nan),
            "shift": t, "apart": apart}


def _warn_unresolved(ctx: Any, apart: dict, grid: np.ndarray) -> None:
    """A warning where the bordered system's bound ``(m + n) eps rho2 cond(F)`` on the leave-one-out errors'
    relative error (:mod:`~blocklin.linalg.solve.bordered_kernel`; ``rho2`` the shift's loss) passes
    ``sqrt(eps)`` where the rows are far apart (``rho2`` or the spread of the kernel's diagonal over ``m``), ``F``
    not numerically positive definite (infinite: the spectrum's errors, kept there, are no better) included. Rows
    alike keep the spectrum's errors without a word where ``F`` is ill-conditioned (a rank-deficient ``a`` at the
    grid's low end), as without an intercept."""
    eps = np.finfo(np.float64).eps
    cond, rho2 = apart["cond"], apart["rho2"]
    bound = (ctx.m + ctx.n) * eps * rho2 * np.where(np.isnan(cond), 0.0, cond)
    bad = apart["redo"] & apart["apart"] & (bound > math.sqrt(eps))
    if not bad.any():
        return
    worst = float(np.nanmax(np.where(bad, bound, np.nan)))
    shown = "no digit" if not math.isfinite(worst) or worst >= 1 else f"{worst:.1e} relative"
    where = f"lam in [{float(grid[bad].min()):.3g}, {float(grid[bad].max()):.3g}]"
    cause = (f"the Gram pass summed the rows of a less a row far from the others, which rounds the kernel "
             f"{float(rho2[bad].max()):.1e} times coarser than the rows less row {apart.get('shift', 0)} would; "
             "put a typical row first") if float(rho2[bad].max()) > 1 else \
        "the row-scaled kernel is ill-conditioned there"
    warn(f"solve: the leave-one-out errors with fit_intercept may be off by up to {shown} at {len(np.flatnonzero(bad))} "
         f"grid value(s), {where}: {cause}")


def report_entries(ctx: Any, info: dict) -> None:
    """scikit-learn's names, in the units of the problem given (after unscaling): ``alpha_`` (``lam**2``),
    ``best_score_`` (minus the mean squared leave-one-out error at the choice; per right-hand side with
    ``per_target``) and, with ``store_cv_results``, ``cv_results_`` (``m x k x L`` squared errors)."""
    curve = info["curve"]
    lam = info["lam"]
    info["alpha_"] = [v * v for v in lam] if isinstance(lam, list) else lam * lam
    idx = curve["chosen_index"]
    if "score" in curve:  # scoring=: the scorer's value (already in the units given)
        info["best_score_"] = [curve["score_per_target"][i][j] for j, i in enumerate(idx)] \
            if isinstance(idx, list) else curve["score"][idx]
    elif isinstance(idx, list):
        info["best_score_"] = [-curve["loo_per_target"][i][j] for j, i in enumerate(idx)]
    else:
        info["best_score_"] = -curve["loo"][idx]
    rows = ctx.loo_choice[3] if ctx.loo_choice is not None else None
    if rows is not None:
        eb = np.asarray(ctx.sb.column_exponents if ctx.sb is not None else 0, dtype=np.int64)  # one, or per column
        cv = np.asarray(rows, dtype=np.float64).reshape(ctx.m, len(curve["lam"]), -1)
        if np.any(eb):
            with np.errstate(over="ignore", under="ignore"):
                cv = np.ldexp(cv, 2 * eb)
        info["cv_results_"] = cv.transpose(0, 2, 1)


__all__ = ["PER_DECADE", "choose", "column_powers", "default_grid", "max_grid", "pass_reserve", "report_entries"]
