"""K-fold cross-validation of lambda: scikit-learn's ``RidgeCV(cv=...)``, exact from one pass over ``A``.

``RidgeCV(alphas, cv=cv, scoring=s)`` fits ``Ridge(alpha)`` on the training rows of every split and
scores it on the held-out rows (``GridSearchCV``: the score averaged over the splits, the first grid
value of the best mean wins; ``best_score_`` is that mean; with ``scoring=None`` the score is the
estimator's, ``r2``; ``sample_weight`` weighs the fits and, as scikit-learn 1.9's ``GridSearchCV`` passes
it on, the scores). Where every split holds out a
set of rows and trains on all the others (``KFold``, ``GroupKFold``, ``LeaveOneOut``, ``PredefinedSplit``,
...), the sums of the held-out sets give everything exactly:

* tall ``A``: one pass (:func:`~blocklin.linalg.solve.kernels.fold_kernel`) sums per fold ``f`` its
  ``A_f^T A_f``, ``A_f^T b_f``, ``||b_f||^2``, column sums and count (and their weighted versions). The
  training sums of fold ``f`` are the totals minus fold ``f``'s; the fit is centered by the training
  (weighted) means ``mu``, ``bbar`` as ``Ridge`` centers it, its spectrum ``G_t = V diag(e) V^T`` gives
  ``x_f(lam) = V diag(1 / (e + lam^2)) V^T c_t`` for every grid value (the pseudo-inverse where
  ``e + lam^2`` vanishes: ``Ridge(alpha=0)``'s minimum-norm fit), and the held-out errors
  ``r_i = (b_i - bbar) - (a_i - mu)^T x`` have ``sum r^2 = x^T G_c x - 2 x^T c_c + ||b_c||^2`` and
  ``sum r`` from the fold's sums centered by ``mu`` and ``bbar`` (rank-one corrections; the weighted
  sums with sample weights). The scores
  are those of :mod:`~blocklin.linalg.solve.scoring` from these sums (not ``neg_mean_absolute_error`` or a
  callable, which need every row's prediction: refused by name). Then ``x`` is solved at the chosen
  lambda from the totals, which are the Gram pass's sums (no further pass but the route's refinement).
* wide ``A`` (the dual form): in memory from ``A A^T`` (``m x m``, which the wide route holds): the
  training kernel matrix of each fold centered by its weighted means and scaled by ``sqrt(w)``, its
  eigen-decomposition for every grid value, and the held-out predictions from the cross kernel; every
  scorer applies, a callable too (on each fold's predictions, as ``scoring(identity, predictions, y)``).

Complex data (blocklin's extension; scikit-learn refuses it): the sums in complex128 (``A_f^H A_f``,
``A_f^H b_f``, ``||b_f||^2`` real), the training Gram's Hermitian spectrum, the held-out squared error
``x^H G_c x - 2 Re(x^H c_c) + ||b_c||^2`` and a complex ``sum r``; the scorers with moduli
(:mod:`~blocklin.linalg.solve.scoring`).

Memory: tall ``A`` holds ``folds + 1`` sets of ``n^2 + n k`` float64 sums (twice with sample weights, twice
again in complex128), planned in the budget with the pass (:mod:`~blocklin.linalg.solve.least_squares_budget`).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from blocklin.errors import ParameterError
from blocklin.errors import explain as _msg
from blocklin.linalg.solve import scaled_kernel
from blocklin.linalg.solve import scoring as scorers
from blocklin.runtime.powers import ldexp

_SPLIT_FIX = ("pass cv=5 (KFold(5) without shuffling), a splitter whose test sets partition the rows "
              "(KFold, GroupKFold with its groups given as cv=list(GroupKFold(k).split(X, y, groups)), "
              "LeaveOneOut), or a list of (train, test) index pairs")


@dataclasses.dataclass(frozen=True)
class Folds:
    """The held-out sets of ``cv``: ``count`` folds, given by ``bounds`` (fold ``f`` is rows
    ``bounds[f]:bounds[f+1]``) or ``labels`` (the fold of each row; ``-1``: in every training set)."""

    count: int
    bounds: tuple[int, ...] | None
    labels: np.ndarray | None
    what: str

    def rows(self, f: int, m: int) -> np.ndarray:
        if self.bounds is not None:
            return np.arange(self.bounds[f], self.bounds[f + 1])
        return np.flatnonzero(self.labels == f)


def folds_of(cv: Any, m: int) -> Folds:
    """``cv`` (an int: ``KFold(cv)`` without shuffling; a splitter with ``split``; or ``(train, test)``
    pairs) as :class:`Folds`, checked: held-out sets disjoint, each split training on all other rows."""
    if isinstance(cv, (bool, np.bool_)):
        raise ParameterError(_msg("cv", "must be an int >= 2, a splitter or (train, test) pairs", repr(cv), _SPLIT_FIX))
    if isinstance(cv, (int, np.integer)):
        k = int(cv)
        if k < 2 or k > m:
            raise ParameterError(_msg("cv", f"as an int must be 2 <= cv <= m = {m} (KFold's n_splits: at least two "
                                      "folds, each holding out a row at least)", repr(cv), "pass cv=5, or cv=None for "
                                      "the exact leave-one-out"))
        sizes = np.full(k, m // k)
        sizes[: m % k] += 1
        bounds = tuple(int(v) for v in np.concatenate([[0], np.cumsum(sizes)]))
        return Folds(count=k, bounds=bounds, labels=None, what=f"KFold(n_splits={k})")
    if hasattr(cv, "split"):
        try:
            splits = list(cv.split(np.broadcast_to(np.float64(0.0), (m, 1))))
        except (TypeError, ValueError) as err:
            raise ParameterError(_msg("cv", "a splitter's split(X) must give the splits from the rows alone",
                                      f"{type(cv).__name__}.split raised: {err}", _SPLIT_FIX)) from None
        what = type(cv).__name__
    else:
        try:
            splits = list(cv)
        except TypeError:
            raise ParameterError(_msg("cv", "must be an int >= 2, a splitter or (train, test) pairs",
                                      repr(cv), _SPLIT_FIX)) from None
        what = "given splits"
    return _labels(splits, m, what)


def _labels(splits: list, m: int, what: str) -> Folds:
    labels = np.full(m, -1, dtype=np.int64)
    if len(splits) < 2:
        raise ParameterError(_msg("cv", "must give at least two splits", f"{len(splits)} from {what}", _SPLIT_FIX))
    for f, split in enumerate(splits):
        train, test = (np.asarray(v).ravel() for v in split)
        train, test = (_indices(v, m, what) for v in (train, test))
        if test.size == 0 or train.size == 0:
            raise ParameterError(_msg("cv", "every split must hold out rows and train on rows",
                                      f"split {f} of {what}: {test.size} held out, {train.size} training", _SPLIT_FIX))
        if np.any(labels[test] >= 0) or np.unique(test).size != test.size:
            raise ParameterError(_msg("cv", "held-out sets must not overlap (the fold sums are exact for a "
                                      "partition of the rows)", f"split {f} of {what} holds out a row held out "
                                      "before", _SPLIT_FIX))
        labels[test] = f
        mark = np.zeros(m, dtype=bool)
        mark[train] = True
        if np.unique(train).size != train.size or mark[test].any() or train.size + test.size != m:
            raise ParameterError(_msg("cv", "each split must train on every row it does not hold out (the training "
                                      "sums are the totals minus the held-out fold's)",
                                      f"split {f} of {what}: {train.size} training + {test.size} held out of {m} rows",
                                      _SPLIT_FIX))
    k = len(splits)
    order = np.flatnonzero(np.diff(labels) != 0)
    contiguous = labels[0] == 0 and np.all(labels >= 0) and np.array_equal(labels[order + 1], np.arange(1, k)) \
        if len(order) == k - 1 else False
    if contiguous:
        bounds = tuple(int(v) for v in np.concatenate([[0], order + 1, [m]]))
        return Folds(count=k, bounds=bounds, labels=None, what=what)
    return Folds(count=k, bounds=None, labels=labels, what=what)


def _indices(v: np.ndarray, m: int, what: str) -> np.ndarray:
    if v.dtype == bool:
        v = np.flatnonzero(v)
    if v.size and (v.dtype.kind not in "iu" or v.min() < 0 or v.max() >= m):
        raise ParameterError(_msg("cv", f"splits must hold row indices in [0, {m})", f"{what}: {v[:5]!r}...",
                                  _SPLIT_FIX))
    return v.astype(np.int64)


def sums_bytes(folds: int, n: int, k: int, weighted: bool, cplx: bool = False) -> int:
    """The fold sums the tall route holds: ``folds + 1`` sets of ``n^2 + n k + n + 3 k + 1`` float64 (twice with
    sample weights; complex128 for complex data)."""
    return 8 * (2 if cplx else 1) * (2 if weighted else 1) * (folds + 1) * (n * n + n * k + n + 3 * k + 1)


def refuse_tall_scoring(scoring: Any, m: int, n: int) -> None:
    """Tall ``A``'s k-fold scores come from the fold sums: the scorers that need each row's prediction are
    refused by name."""
    if callable(scoring) or scoring == "neg_mean_absolute_error":
        what = "a callable" if callable(scoring) else repr(scoring)
        names = ", ".join(n_ for n_ in scorers.NAMES if n_ != "neg_mean_absolute_error")
        raise ParameterError(_msg("scoring", f"with cv= on a tall a must be one the fold sums give ({names}; "
                                  "None is r2, as RidgeCV's)", f"{what} with cv= on a {m} x {n} a (it needs every "
                                  "row's prediction of its fold's fit)", "pass one of those names, or cv=None (the "
                                  "exact leave-one-out takes any scorer)"))


# --- tall A: the fold pass and the choice from its sums -------------------------------------------------------

def fold_pass(ctx: Any) -> dict:
    """The fold sums (one pass over ``A``, ``B``, the weights and the fold numbers), recorded for resume."""
    from blocklin.linalg.solve.kernels import fold_kernel
    from blocklin.plan.solve import small_bytes
    from blocklin.runtime.passes import run_pass, source

    folds = ctx.folds
    weighted = ctx.weighted
    srcs = ctx.sources() + ([source(ctx.L)] if folds.labels is not None else [])
    params = {"folds": folds.count, "bounds": folds.bounds, "weighted": weighted}
    reserve = small_bytes(ctx.n, ctx.k) + sums_bytes(folds.count, ctx.n, ctx.k, weighted, cplx=ctx.cdtype != "float64")

    def one(scale: dict) -> dict:
        shift = ctx.shifts(scale) if ctx.intercept else None  # the sums of the rows less the first row
        states, _ = run_pass(ctx.job, fold_kernel, srcs, params | {"shift": shift}, reserve=reserve, scale=scale,
                             device="cpu", description=f"fold pass: the Gram sums of {folds.count} cross-validation "
                             "folds")
        states = [s for s in states if s is not None]
        out = {key: sum(s[key] for s in states) for key in states[0]}
        return out | ({"sa0": shift[0], "sb0": shift[1]} if shift is not None else {})

    ctx.phases["fold pass"] = "cpu"
    rec = ctx.saved.run("fold-pass", lambda: ctx.scaled_run(one))
    ctx.adopt(rec)
    return rec


def _training(sums: dict, f: int, weighted: bool, intercept: bool) -> tuple:
    """Fold ``f``'s training fit's centered Gram quantities and means: the totals minus fold ``f``."""
    p = "w" if weighted else ""
    g = sums[f"g{p}"].sum(axis=0) - sums[f"g{p}"][f]
    c = sums[f"c{p}"].sum(axis=0) - sums[f"c{p}"][f]
    n, k = g.shape[0], c.shape[1]
    if not intercept:
        return g, c, np.zeros(n, g.dtype), np.zeros(k, c.dtype)
    s = sums[f"cnt{p}"].sum() - sums[f"cnt{p}"][f]
    mu = (sums[f"sa{p}"].sum(axis=0) - sums[f"sa{p}"][f]) / s
    bbar = (sums[f"sb{p}"].sum(axis=0) - sums[f"sb{p}"][f]) / s
    g = g - s * np.outer(mu.conj(), mu)  # complex data: A_c^H A_c = A^H A - s conj(mu) mu^T
    return (g + g.conj().T) / 2, c - s * np.outer(mu.conj(), bbar), mu, bbar


def _filters(ev: np.ndarray, grid: np.ndarray, m: int) -> np.ndarray:
    """``1 / (e + lam^2)`` per eigenvalue and grid value, 0 where ``e + lam^2`` is at rounding level of the
    largest eigenvalue.

    At ``lam = 0`` that level is the formed Gram's rounding, ``max(m, n) eps e_max`` (the pseudo-inverse of
    ``Ridge(alpha=0)``'s minimum-norm fit over the eigenvalues above it). At ``lam > 0`` the fit
    ``(G + lam^2 I)^-1 c`` is defined whatever the eigenvalues, and a direction is left out only where
    ``e + lam^2`` is within the eigensolver's backward error, ``n eps e_max`` (Weyl): the Gram's rounding
    had dropped directions that ``lam^2`` keeps, so that with columns ``1e4`` and ``5e-4`` apart and
    ``lam^2 = 1.9e-6`` a fold's held-out error was 4% off ``Ridge``'s and the score 1.2% off ``RidgeCV``'s.
    """
    top = float(ev.max()) if ev.size else 0.0
    eps = np.finfo(np.float64).eps
    tol = np.where(grid == 0, top * max(m, ev.size) * eps, top * ev.size * eps)[None, :]
    den = ev[:, None] + grid[None, :] ** 2
    with np.errstate(divide="ignore"):
        return np.where(den > tol, 1.0 / np.where(den > tol, den, 1.0), 0.0)


def _scaled_fits(xs: np.ndarray, g: np.ndarray, c: np.ndarray, grid: np.ndarray, filt: np.ndarray,
                 ev: np.ndarray) -> None:
    """Refit, in place in ``xs`` (``L x n x k``), the grid values ``lam > 0`` whose fit from the eigen-decomposition
    is norm-wise where the problem is not (:mod:`~blocklin.linalg.solve.scaled_kernel`: a direction cut, or lines
    far apart), from the scaled ``D^-1 (G + lam^2 I) D^-1`` by Cholesky. ``G`` is a tall fold's Gram
    ``A_t^T A_t`` or a wide fold's kernel ``A_t A_t^T`` (the dual form: ``c`` its right-hand side, ``xs`` its
    ``y``). Tall, columns ``1e5`` and ``5e-4`` apart: the smallest eigenvalue (``2e-7``, under a cut of
    ``1e-5``) was dropped at ``lam^2 = 1.9e-6`` and the fold score came out ``0.0709`` for ``0.0641``; wide, rows
    ``1e5`` and ``5e-4`` apart: held-out predictions 7% off at ``lam^2 = 1e-8`` (a direction cut) and ``6e-6``
    off at ``lam^2 = 1e-2`` (none cut; ``cond(H) = 600``), scikit-learn's ``RidgeCV`` 1e-14 off. Kept as the
    eigen-decomposition gave it where the scaled matrix is not numerically positive definite."""
    for l in np.flatnonzero(scaled_kernel.refit(g, ev, grid, np.any(filt == 0, axis=0))):
        factor = scaled_kernel.scaled_factor(g, float(grid[l]) ** 2)
        if factor is not None:
            xs[l] = scaled_kernel.scaled_solve(factor, c)


def tall_stats(ctx: Any, sums: dict, grid: np.ndarray) -> list[scorers.Stats]:
    """The held-out sums of every fold at every grid value (``L x k``), in the scaled units of ``b``."""
    out = []
    cplx = np.iscomplexobj(sums["g"])
    for f in range(ctx.folds.count):
        g, c, mu, bbar = _training(sums, f, ctx.weighted, ctx.intercept)
        ev, v = np.linalg.eigh(g)  # Hermitian of complex data: G_t = V diag(e) V^H
        ev = np.clip(ev, 0.0, None)
        beta = v.conj().T @ c  # n x k
        filt = _filters(ev, grid, ctx.m)  # n x L
        p = "w" if ctx.weighted else ""  # the held-out sums weighted as the scorer weighs them
        nf = float(sums[f"cnt{p}"][f])
        gf, cf, sa, sb, bb = (sums[f"{q}{p}"][f] for q in ("g", "c", "sa", "sb", "bb"))
        # sum conj(a_i - mu) (a_i - mu)^T, sum conj(a_i - mu) (b_i - bbar)^T, sum |b_i - bbar|^2 (conj: no-op on
        # real data): the held-out squared error x^H G_c x - 2 Re(x^H c_c) + ||b_c||^2 is real
        mc, bc_ = mu.conj(), bbar.conj()
        gc = gf - np.outer(sa.conj(), mu) - np.outer(mc, sa) + nf * np.outer(mc, mu)
        cc = cf - np.outer(sa.conj(), bbar) - np.outer(mc, sb) + nf * np.outer(mc, bbar)
        bbc = (bb - 2 * (bc_ * sb).real + nf * (bc_ * bbar).real) if cplx else bb - 2 * bbar * sb + nf * bbar**2
        sac, sbc = sa - nf * mu, sb - nf * bbar
        xs = np.einsum("nl,nk->lnk", filt, beta)  # per lambda V^H x
        xs = np.einsum("mn,lnk->lmk", v, xs)  # L x n x k
        _scaled_fits(xs, g, c, grid, filt, ev)
        xc = xs.conj() if cplx else xs
        sse = bbc[None, :] - 2 * np.einsum("lnk,nk->lk", xc, cc).real + np.einsum("lnk,nm,lmk->lk", xc, gc, xs).real
        se = sbc[None, :] - np.einsum("n,lnk->lk", sac, xs)  # sum r_i, complex of complex data
        rows = float(sums["cnt"][f])  # about the fold's own mean, from sums as large as these:
        sst = scorers.centered_squares(bbc, sbc, nf, rows, np.abs(bb) + nf * np.abs(bbar) ** 2)
        out.append(scorers.Stats(n=nf, se=se, sse=np.maximum(sse, 0.0), sae=None,
                                 sst=np.broadcast_to(sst, se.shape).copy(), rows=rows))
    return out


def gram_from_sums(ctx: Any, sums: dict) -> dict:
    """The Gram pass's record from the fold totals (the route at the chosen lambda reads it: no Gram pass)."""
    p = "w" if ctx.weighted else ""
    g = sums[f"g{p}"].sum(axis=0)
    gp = {"g": (g + g.conj().T) / 2, "c": sums[f"c{p}"].sum(axis=0), "bb": sums[f"bb{p}"].sum(axis=0),
          "aa": float(np.trace(g).real)}
    if ctx.intercept:  # the shift the sums were taken about
        gp.update(sa0=sums["sa0"], sb0=sums["sb0"])
    if ctx.weighted:
        gp.update(aw=sums["saw"].sum(axis=0), bw=sums["sbw"].sum(axis=0))
    elif ctx.intercept:
        gp.update({"as": sums["sa"].sum(axis=0), "bs": sums["sb"].sum(axis=0)})
    return gp


# --- the choice --------------------------------------------------------------------------------------------

def _scale_free(ctx: Any) -> bool:
    """Whether the score is a mean over ``k > 1`` right-hand sides of scale-free scores (``r2``, the default, or
    ``explained_variance``), each read from its column's own sums of squares."""
    return ctx.k > 1 and (ctx.scoring is None or ctx.scoring in ("r2", "explained_variance"))


def _refuse_columns_apart(ctx: Any) -> None:
    """Tall ``A``: a scale-free score of a column whose squares the fold pass's one power for ``b`` took below
    float64's normal range (its largest entry below ``2^-485`` of ``b``'s: ``sqrt(tiny 2^52)``) is refused naming
    ``b``, the columns and the fix: its held-out sums had underflowed to 0, its ``r2`` read 1 at every lambda and
    the mean over the columns chose by the others alone, with a ``best_score_`` that was not the data's. Columns
    more than ``2^510`` apart are each divided by their own power instead (``Scaling.columns``) and pass; this
    judges the band between, which one power keeps in float64 but not its squares' bits."""
    from blocklin.linalg.blocks.result_range import column_maxima
    from blocklin.linalg.blocks.scaling import narrow_range

    if not _scale_free(ctx) or ctx.sb.columns is not None:  # each column by its own power: its squares in range
        return
    top = ctx.job.peaks.get(ctx.sb.path)
    if top is None or np.size(top) != ctx.k:
        top = column_maxima(ctx.B.path, first=int(getattr(ctx.B, "first_row", 0)), rows=ctx.m)
    top = np.asarray(top, dtype=np.float64).ravel()
    with np.errstate(under="ignore"):
        low = (top > 0) & (np.ldexp(top, -ctx.sb.exponent) < np.sqrt(narrow_range(np.float64)[0]))
    if not low.any():
        return
    j = np.flatnonzero(low)
    gap = int(np.frexp(float(top.max()))[1] - np.frexp(float(top[j].min()))[1])
    name = ctx.scoring or "r2"
    raise ParameterError(_msg(
        "b", f"must have each column's largest entry within 2^485 of its largest for cv= with scoring={name!r} on "
        "a tall a (the fold pass sums each column's squares with b scaled by one power of two: a column's held-out "
        "sums far below underflow, and its score reads 1 at every lambda)",
        f"{int(low.sum())} column(s) (index {', '.join(str(int(i)) for i in j[:5])}{', ...' if j.size > 5 else ''}) "
        f"about 2^{gap} below the largest", "scale each column of b by a power of two that brings its largest entry "
        f"near 1 ({name} does not change, nor the lambda chosen) and each column of x and the intercept back by it"))


def choose(ctx: Any, stats: list, grid: np.ndarray, ce: np.ndarray | None = None) -> tuple[float, dict]:
    """The grid value of best mean score over the folds (the first of ties, as ``GridSearchCV``), and the curve.
    ``ce``: the power of two each column's sums were divided by besides ``b``'s one (:func:`wide_choose`); where
    the passes divided each column of ``b`` by its own power, the largest column's is the one and ``ce`` each
    column's shift from it (:func:`~blocklin.linalg.solve.scoring.units`)."""
    eb, ce = scorers.units(ctx.sb, ce)
    name = ctx.scoring if ctx.scoring is not None else "r2"
    per_fold = []
    for f, st in enumerate(stats):
        if callable(name):
            per_fold.append(st)  # already the callable's score per grid value
        else:  # of the scaled problem's sums (each column's own scale with ce), then the mean of b's one scale
            per = scorers.per_target(name, st)
            per_fold.append((per if ce is None else scorers.in_units(name, per, ce)).mean(axis=-1))
    scores = np.asarray(per_fold, dtype=np.float64)  # folds x L
    mean = scores.mean(axis=0)
    idx = int(np.argmax(np.where(np.isfinite(mean), mean, -np.inf)))  # chosen where the sums are in range
    if not callable(name):  # then reported in the units of the problem given (exact powers of two)
        scores, mean = scorers.in_units(name, scores, eb), scorers.in_units(name, mean, eb)
    curve = {"lam": grid.tolist(), "score": mean.tolist(), "fold_scores": scores.T.tolist(),
             "scoring": name if isinstance(name, str) else "callable", "cv": ctx.folds.what,
             "folds": ctx.folds.count, "chosen": float(grid[idx]), "chosen_index": idx,
             "at_grid_end": None if len(grid) == 1 or 0 < idx < len(grid) - 1 else ("low" if idx == 0 else "high"),
             "grid": "given" if ctx.lams else "default"}
    return float(grid[idx]), curve


def report_entries(info: dict) -> None:
    """scikit-learn's names after unscaling: ``alpha_`` (``lam**2``), ``best_score_`` (the mean score over the
    folds at the choice); ``RidgeCV`` keeps no ``cv_results_`` with ``cv``, nor does this."""
    curve = info["curve"]
    info["alpha_"] = info["lam"] * info["lam"]
    info["best_score_"] = curve["score"][curve["chosen_index"]]
    info["lam_rule"] = "cv"


def solve_tall_cv(ctx: Any, x_path: str, route: Any) -> dict:
    """Tall ``A``: the fold pass, the choice, then ``route`` (the tall solve) at the chosen lambda from the
    totals (recorded as its Gram pass)."""
    sums = fold_pass(ctx)
    _refuse_columns_apart(ctx)
    grid = _grid(ctx, sums)
    lam, curve = choose(ctx, tall_stats(ctx, sums, grid), grid)
    ctx.gram = gram_from_sums(ctx, sums)
    ctx.folds, ctx.kind, ctx.lams = None, "scalar", [lam]
    info = route(ctx, x_path)
    info["curve"] = curve
    return info


def _grid(ctx: Any, sums: dict) -> np.ndarray:
    """The grid given, or the leave-one-out default grid from the spectrum of the whole (centered) problem."""
    if ctx.lams:
        return np.asarray(ctx.lams, dtype=np.float64)
    from blocklin.linalg.solve.loo import default_grid

    p = "w" if ctx.weighted else ""
    g = sums[f"g{p}"].sum(axis=0)
    if ctx.intercept:
        s = sums[f"cnt{p}"].sum()
        mu = sums[f"sa{p}"].sum(axis=0) / s
        g = g - s * np.outer(mu.conj(), mu)
    return default_grid(np.sqrt(np.clip(np.linalg.eigvalsh((g + g.conj().T) / 2), 0.0, None))[::-1])


# --- wide A: in memory from A A^T ---------------------------------------------------------------------------

def wide_choose(ctx: Any, spec: Any) -> tuple[list[float], dict]:
    """Wide ``A``: every fold's held-out predictions from ``A A^T`` in memory (``ctx.dual_sums``: ``A A^T``
    and ``b`` of the scaled problem, the weights), the scores, the choice."""
    gm, bm, w = ctx.dual_sums
    m = gm.shape[0]
    grid = np.asarray(ctx.lams, dtype=np.float64) if ctx.lams else _wide_default_grid(spec)
    if ctx.intercept and ctx.cdtype == "float64":  # the rows less a typical row where row 0 is far off (one pass)
        from blocklin.linalg.solve.shifted_gram import less_typical_row

        gm = less_typical_row(ctx, gm, w, grid**2)[1]
    raw = gm  # shifted by a row: the intercept's row-scaled fits (_bordered_fits)
    if ctx.intercept:  # a shift of the rows changes no centered quantity: center A A^T by the plain means first
        gm = gm - gm.mean(axis=0)[None, :]
        gm = gm - gm.mean(axis=1)[:, None]
        gm = (gm + gm.conj().T) / 2
    b_orig = bm
    # a named score's sums of each column divided by a power of two near its largest entry where b's one power
    # takes a column's squares out of range (a column near 2^-600 beside one near 1: its r2 had read 1)
    ce = None if callable(ctx.scoring) or ctx.k < 2 else scorers.own_powers(np.abs(bm).max(axis=0, initial=0.0), 0)
    stats = []
    for f in range(ctx.folds.count):
        held = ctx.folds.rows(f, m)
        train = np.setdiff1d(np.arange(m), held)
        pred = _wide_predictions(gm, bm, w, train, held, grid, ctx.intercept, raw)  # held x L x k
        err = b_orig[held][:, None, :] - pred
        if callable(ctx.scoring):  # in the units given: b's one power, or each column's own (Scaling.columns)
            eb = ctx.sb.column_exponents if ctx.sb is not None else 0
            p, t = ldexp(pred, eb), ldexp(b_orig[held], eb)  # complex predictions of complex data
            wh = w[held] if ctx.weighted else None
            stats.append(np.array([scorers.call(ctx.scoring, p[:, i, :], t, t.shape[1] == 1, wh)
                                   for i in range(len(grid))]))
        elif ce is not None:
            stats.append(scorers.from_errors(ldexp(err, -ce), ldexp(b_orig[held], -ce), w[held] if ctx.weighted else None))
        else:
            stats.append(scorers.from_errors(err, b_orig[held], w[held] if ctx.weighted else None))
    lam, curve = choose(ctx, stats, grid, ce)
    return [lam], curve


def _wide_default_grid(spec: Any) -> np.ndarray:
    from blocklin.linalg.solve.loo import default_grid

    return default_grid(spec.s)


def _wide_predictions(gm: np.ndarray, bm: np.ndarray, w: np.ndarray, train: np.ndarray, held: np.ndarray,
                      grid: np.ndarray, intercept: bool, raw: np.ndarray | None = None) -> np.ndarray:
    """Held-out predictions of the fits on ``train`` (dual form): ``x = (D C A_t)^T (K + lam^2 I)^-1 D C b_t``
    with ``C = I - 1 w^T / S`` the weighted centering (identity without an intercept) and ``D = diag(sqrt(w))``;
    prediction ``bbar + (A_h - 1 mu^T) x`` from ``A A^T`` alone. ``raw``: the kernel before centering (of rows
    shifted by one row), for the intercept's row-scaled fits (:func:`_bordered_fits`)."""
    wt = w[train]
    s = wt.sum()
    mtt, mht = gm[np.ix_(train, train)], gm[np.ix_(held, train)]
    bt = bm[train]
    if intercept:
        bbar = wt @ bt / s
        cen = np.eye(train.size) - np.outer(np.ones(train.size), wt) / s  # C
        kt = cen @ mtt @ cen.T
        cross = (mht - np.outer(np.ones(held.size), wt @ mtt) / s) @ cen.T
        rhs = bt - bbar
    else:
        bbar = np.zeros(bm.shape[1])
        kt, cross, rhs = mtt, mht, bt
    sw = np.sqrt(wt)
    kt = sw[:, None] * kt * sw[None, :]
    ev, u = np.linalg.eigh((kt + kt.conj().T) / 2)  # A A^H of complex data: K_t = U diag(e) U^H
    ev = np.clip(ev, 0.0, None)
    wrhs = sw[:, None] * rhs
    beta = u.conj().T @ wrhs
    filt = _filters(ev, grid, gm.shape[0])
    ys = np.einsum("tl,tk->ltk", filt, beta)
    ys = np.einsum("st,ltk->lsk", u, ys)  # L x train x k
    # rows far apart in scale: K_t rounds relative to its rows, as the tall Gram to its columns (_scaled_fits)
    _scaled_fits(ys, (kt + kt.conj().T) / 2, wrhs, grid, filt, ev)
    pred = np.einsum("hs,lsk->hlk", cross * sw[None, :], ys) + bbar[None, None, :]
    if intercept and raw is not None:
        _bordered_fits(pred, raw, bm, sw, train, held, grid, (kt + kt.conj().T) / 2, filt, ev)
    return pred


def _bordered_fits(pred: np.ndarray, raw: np.ndarray, bm: np.ndarray, sw: np.ndarray, train: np.ndarray,
                   held: np.ndarray, grid: np.ndarray, kc: np.ndarray, filt: np.ndarray, ev: np.ndarray) -> None:
    """Refit with an intercept, in place in ``pred`` (``held x L x k``), the grid values whose centered
    eigen-decomposition's fit is norm-wise where the rows are far apart (:func:`scaled_kernel.refit
    <blocklin.linalg.solve.scaled_kernel.refit>` of the weighted centered kernel ``kc``, the intercept's own null
    direction not counted as cut): the dual ridge problem with an unpenalized intercept,
    ``[[K + lam^2 I, u], [u^T, 0]] [y; x0] = [D b_t; 0]`` with ``K = D K_s D`` the kernel of the rows shifted by one
    row (``raw``; the problem is the same for any shift), ``u = sqrt(w)``, solved on the row-scaled kernel
    (:func:`~blocklin.linalg.solve.bordered_kernel.bordered_fit`, as the leave-one-out and the solve at the chosen
    lambda); prediction ``K_s[h, t] D y + x0``. The centered kernel mixes the rows by their mean, which a row far
    from the others dominates: rows ``1e5`` and ``5e-4`` apart gave fold scores ``6e-6`` off at
    ``lam^2 = 1e-8`` (``8e-5`` with the large row first, whose shift
    :func:`~blocklin.linalg.solve.shifted_gram.less_typical_row` moves). Kept as the eigen-decomposition gave it
    where the bordered system is not numerically positive definite."""
    from blocklin.linalg.solve import bordered_kernel

    cut = np.count_nonzero(filt == 0, axis=0) > 1
    redo = scaled_kernel.refit(kc, ev, grid, cut)
    if not redo.any():
        return
    ks = sw[:, None] * raw[np.ix_(train, train)] * sw[None, :]
    ks = (ks + ks.conj().T) / 2
    cross = raw[np.ix_(held, train)] * sw[None, :]
    rhs = sw[:, None] * bm[train]
    for l in np.flatnonzero(redo):
        lam2 = float(grid[l]) ** 2
        factor = bordered_kernel.bordered_factor(ks, sw, lam2)
        if factor is None:
            continue
        y, x0 = bordered_kernel.bordered_fit(factor, ks, sw, lam2, rhs)
        pred[:, l, :] = cross @ y + x0[None, :]


def refuse_options(cv: Any, *, kind: str, per_target: bool, store_cv: bool) -> None:
    """What ``cv=`` does not go with, refused by name as ``RidgeCV`` refuses it."""
    if kind != "loo":
        raise ParameterError(_msg("cv", "applies to the cross-validated choice of lambda (lam='loo' or ('loo', grid))",
                                  f"cv={cv!r} with lam of kind {kind!r}", "pass lam=('loo', grid) with cv"))
    for name, on in (("lam_per_target", per_target), ("store_cv_results", store_cv)):
        if on:
            raise ParameterError(_msg(name, "applies to the exact leave-one-out (cv=None), as RidgeCV's "
                                      "alpha_per_target and store_cv_results", f"{name}=True with cv={cv!r}",
                                      f"drop {name}, or pass cv=None"))


__all__ = ["Folds", "choose", "folds_of", "refuse_options", "refuse_tall_scoring", "report_entries",
           "solve_tall_cv", "sums_bytes", "tall_stats", "wide_choose"]
