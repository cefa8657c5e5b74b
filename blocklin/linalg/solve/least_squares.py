"""The in-memory Tikhonov least squares: the run that the tall and wide routes share.

The regularized Gram matrix (or the R factor) fits the budget: one output, one
:class:`~blocklin.linalg.solve.tikhonov.TikhonovRun`, the tall (:func:`~blocklin.linalg.solve.normal.solve_tall`)
or wide (:func:`~blocklin.linalg.solve.wide.solve_wide`) route, then the report in the units of the
problem given (the routes solve it scaled by powers of two) and the committed ``x``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from blocklin.linalg.blocks.scaling import Scaling, check_finite_result
from blocklin.linalg.solve.normal import solve_tall
from blocklin.linalg.solve.report import solve_report
from blocklin.linalg.solve.tikhonov import TikhonovRun
from blocklin.linalg.solve.updatable import check_updatable, keep_sums
from blocklin.linalg.solve.wide import solve_wide
from blocklin.matrix import Matrix
from blocklin.plan.solve import SolvePlan
from blocklin.runtime.job import Job
from blocklin.runtime.passes import source
from blocklin.runtime.stages import StepRecords
from blocklin.storage.identity import plan_settings, resume_token


def solve_least_squares(job: Job, A: Any, B: Any, plan: SolvePlan, *, lam: Any, kind: str, lams: list[float],
                        method: str, refine: Any, fit_intercept: bool, out: Any, overwrite: bool,
                        resume: bool, updatable: bool = False, W: Any = None, weights: tuple | None = None,
                        positive: bool = False, per_target: bool = False, store_cv: bool = False,
                        scoring: Any = None, folds: Any = None) -> Matrix:
    """``x`` of ``min ||A x - b||^2 + lam^2 ||x||^2`` on the route of ``plan``, committed with its report;
    ``updatable``: with the sums :func:`blocklin.update` reads (:mod:`blocklin.linalg.solve.updatable`).
    ``W``: the checked ``sample_weight`` operand, ``weights`` its ``(sum, positive count)``
    (:mod:`blocklin.linalg.solve.weights`); ``positive``, ``per_target``, ``store_cv`` as :func:`blocklin.solve`
    says; ``scoring`` (:mod:`blocklin.linalg.solve.scoring`) and ``folds`` (``cv=``,
    :mod:`blocklin.linalg.solve.kfold`) those of the cross-validated choice."""
    (m, n), k = A.shape, B.shape[1]
    if updatable:
        check_updatable(out=out, orientation=plan.orientation)
    options = _options(W, positive, per_target, store_cv, scoring, folds)
    L = None
    if folds is not None and folds.labels is not None and plan.orientation != "wide":  # streamed with the rows
        L = job.operand(folds.labels.astype(np.float64)[:, None], "cv_folds")
    inputs = [A, B] + ([W] if W is not None else []) + ([L] if L is not None else [])
    ao = job.claim(out, inputs, overwrite=overwrite, resume=resume,
                   token=_token(inputs, lam, method, refine, fit_intercept, plan, updatable, options, folds,
                                plan_settings(job)))
    ctx = TikhonovRun(job=job, A=A, B=B, m=m, n=n, k=k, kind=kind, lams=lams, refine=refine, method=method,
                      intercept=bool(fit_intercept), saved=StepRecords(ao.done if out is not None else None),
                      W=W, wsum=weights[0] if weights else None, wpos=weights[1] if weights else None,
                      positive=bool(positive), per_target=bool(per_target), store_cv=bool(store_cv),
                      scoring=scoring, folds=folds, L=L)
    ctx.sa = Scaling.of(source(A), A.dtype)
    ctx.sb = Scaling.of(source(B), B.dtype)
    if k > 1 and kind in ("scalar", "sequence", "gcv", "lcurve", "loo"):
        # each column of x its own problem: b's columns far apart are each scaled by their own power of two (a
        # rule's score sums the columns at the largest one's scale, spectrum.Spectrum.col_shift, leave-one-out's
        # mean squared error too, loo.choose, and the scorers' sums of scoring= and cv=, scoring.units;
        # positive's NNLS is per column; updatable refuses to keep sums of columns apart, updatable.keep_sums).
        # Where one power keeps every column, leave-one-out per target or with a scale-free score scales its
        # errors itself (loo.column_powers) from the same peaks
        ctx.sb.per_column = True
        if plan.orientation != "wide":  # from the peaks the first pass records (the wide route holds b)
            job.column_peaks.add(ctx.sb.path)
    solve_route = solve_wide if plan.orientation == "wide" else solve_tall
    info = _unscale_info(ctx, solve_route(ctx, ao.array_path()))
    _check_finite_info(info)
    if kind == "loo" and folds is not None:
        from blocklin.linalg.solve.kfold import report_entries as cv_entries

        cv_entries(info)
    elif kind == "loo":
        from blocklin.linalg.solve.loo import report_entries

        report_entries(ctx, info)
    if updatable:
        keep_sums(ctx, ao.array_path())
    report, recorded = solve_report(job, route="least squares", orientation=plan.orientation, **info,
                                    phases=ctx.phases, fit_intercept=bool(fit_intercept),
                                    resumed_passes=list(ctx.saved.loaded), **options)
    params = {"lam": _lam_param(lam), "method": method,
              "fit_intercept": bool(fit_intercept), "refine": refine, "updatable": bool(updatable), **options}
    x = job.finish(ao, out, report, operation="solve", plan=plan.to_dict(), params=params, recorded=recorded)
    x.intercept = np.asarray(report["intercept"]) if fit_intercept else None
    if "cv_results_" in report:
        x.cv_results_ = report["cv_results_"]
    return x


def _options(W: Any, positive: bool, per_target: bool, store_cv: bool, scoring: Any = None,
             folds: Any = None) -> dict:
    """The options beyond the original ones, as the report and the provenance record them (only those set;
    a callable scorer as ``"callable"``, the folds by their splitter and count)."""
    opts = {"sample_weight": W is not None, "positive": bool(positive), "lam_per_target": bool(per_target),
            "store_cv_results": bool(store_cv),
            "scoring": scoring if scoring is None or isinstance(scoring, str) else "callable",
            "cv": None if folds is None else f"{folds.what}: {folds.count} folds"}
    return {k: v for k, v in opts.items() if v}


def _lam_param(lam: Any) -> Any:
    """``lam`` as JSON: a number, a list, a rule, or ``["loo", [grid]]``."""
    if isinstance(lam, np.ndarray):
        return lam.tolist()
    if isinstance(lam, tuple):
        return [_lam_param(v) for v in lam]
    return lam


def _token(inputs: list, lam: Any, method: str, refine: Any, fit_intercept: bool, plan: SolvePlan,
           updatable: bool = False, options: dict | None = None, folds: Any = None, settings: tuple = ()) -> str:
    """Deterministic in the inputs, parameters, plan and the job's ``settings`` the passes depend on
    (:func:`~blocklin.storage.identity.plan_settings`: the workers split a pass's sums, so a Gram pass
    recorded with 1 worker had been reused by a resume with 2, whose fresh ``x`` has other last bits):
    what resuming an output checks. Folds of contiguous
    rows are named by their bounds (``options`` names only the splitter and the count: two lists of splits
    with other bounds had continued each other's recorded fold sums); scattered folds are a staged operand,
    and a run that stages one is not resumed (:meth:`~blocklin.runtime.job.Job.output`)."""
    extra = ("updatable",) if updatable else ()
    if options:
        extra += (sorted(options.items()),)
    if folds is not None and folds.bounds is not None:
        extra += (("fold bounds", np.asarray(folds.bounds).tolist()),)
    return resume_token("solve", inputs, _lam_param(lam), method, refine, bool(fit_intercept), plan.to_dict(), *extra,
                        *((settings,) if settings else ()))


def _check_finite_info(info: dict) -> None:
    """A NaN residual or solution norm is never reported (it would read as a finished solve)."""
    for key in ("residual_norm", "solution_norm"):
        if key in info:
            check_finite_result(key, np.asarray(info[key], dtype=np.float64),
                                f"the solve's {key.replace('_', ' ')} (method {info.get('method')})")


def _unscale_info(ctx: TikhonovRun, info: dict) -> dict:
    """The report of the scaled problem in the units of the problem given: ``lam``, norms of ``A``,
    residuals (``2^eb``), solutions (``2^(eb - ea)``), the intercept and the lambda curve."""
    if ctx.sa is None or not (ctx.sa.exponent or ctx.sb.exponent or ctx.sb.columns is not None):
        if ctx.xe and "solution_norm" in info:  # reported for 2^-xe x (spectrum.x_exponent)
            info["solution_norm"] = [float(np.ldexp(v, ctx.xe)) for v in info["solution_norm"]] \
                if isinstance(info["solution_norm"], list) else float(np.ldexp(info["solution_norm"], ctx.xe))
        return info
    ea, eb = ctx.sa.exponent, ctx.sb.column_exponents  # eb: one per column where b's were scaled apart

    def sc(v: Any, e: Any) -> Any:
        if v is None or isinstance(v, str):
            return v
        if isinstance(v, (list, tuple)):  # per column where e is; a sequence's outer list is per lambda
            per_column = np.ndim(e) and not any(isinstance(x, (list, tuple)) for x in v)
            return [sc(x, e[i] if per_column else e) for i, x in enumerate(v)]
        e = int(e) if np.ndim(e) == 0 else int(np.max(e))
        with np.errstate(over="ignore", under="ignore"):
            if isinstance(v, (complex, np.complexfloating)):  # a complex problem's intercept
                return complex(np.ldexp(v.real, e), np.ldexp(v.imag, e))
            return float(np.ldexp(float(v), e))

    for key, e in (("lam", ea), ("norm_a", ea), ("residual_norm", eb), ("objective", eb),
                   ("solution_norm", eb - ea + ctx.xe), ("intercept", eb)):
        if key in info:
            info[key] = sc(info[key], e)
    # the curve's and the GCV's sums over the columns are in the units of the largest column's power
    # (spectrum.Spectrum.col_shift), each column's leave-one-out sums in its own
    top = int(np.max(eb))
    if "gcv" in info:  # m ||r||^2 / (m - dof)^2
        info["gcv"] = sc(info["gcv"], 2 * top)
    curve = info.get("curve")
    if isinstance(curve, dict):
        for key, e in (("lam", ea), ("chosen", ea), ("residual_norm", top), ("solution_norm", top - ea),
                       ("gcv", 2 * top), ("loo", 2 * top), ("loo_per_target", 2 * eb)):
            if key in curve:
                curve[key] = sc(curve[key], e)
    if np.ndim(eb):
        info["scaling"] = {"exponent_a": ea, "exponent_b": [int(v) for v in eb], "max_abs_a": ctx.sa.amax,
                           "max_abs_b": ctx.sb.amax, "extra_passes": ctx.sa.extra_passes,
                           "note": f"solved 2^{-ea} A x'_j = 2^(-e_j) b_j with lam' = 2^{-ea} lam (exact powers of "
                                   "two; e_j = exponent_b[j], one per column of b, whose columns lie too far apart "
                                   f"for one power); x_j = 2^(e_j - {ea}) x'_j"}
        return info
    info["scaling"] = {"exponent_a": ea, "exponent_b": eb, "max_abs_a": ctx.sa.amax, "max_abs_b": ctx.sb.amax,
                       "extra_passes": ctx.sa.extra_passes,
                       "note": f"solved 2^{-ea} A x' = 2^{-eb} b with lam' = 2^{-ea} lam (exact powers of two); "
                               f"x = 2^{eb - ea} x'"}
    return info


__all__ = ["solve_least_squares"]
