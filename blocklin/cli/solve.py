"""``blocklin solve A B -o X``: Tikhonov-regularized least squares, out of core (LSQR for a sparse ``A``)."""

from __future__ import annotations

import argparse
import math
from typing import Any

import numpy as np

from blocklin.cli import plot_file, ui
from blocklin.config import format_size
from blocklin.errors import ParameterError, explain


def _lam(value: str) -> object:
    v = value.strip().lower()
    if v in ("gcv", "lcurve", "l-curve", "loo"):
        return v
    try:
        if v.startswith("loo:"):  # the leave-one-out grid: loo:0.1,1,10
            parsed: object = ("loo", [float(t) for t in v[4:].split(",") if t])
            values = parsed[1]  # type: ignore[index]
        elif "," in v:
            parsed = values = [float(t) for t in v.split(",") if t]
        else:
            parsed = float(v)
            values = [parsed]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--lambda must be a number, a comma-separated list, 'gcv', 'lcurve', 'loo' or 'loo:L1,L2,...', "
            f"got {value!r}") from None
    # checked here, as the other options' values are: the solver's own refusal named lam= and exited 1
    if not all(math.isfinite(x) and x >= 0 for x in values):
        raise argparse.ArgumentTypeError(f"must be finite and >= 0 (it multiplies ||x|| in min ||A x - b||^2 + "
                                         f"lam^2 ||x||^2); got {value!r}. Fix: pass --lambda 0 or a positive value")
    return parsed


def _weights(path: str | None) -> object:
    """``--sample-weight``: a zarr array (path or URL), or a ``.npy`` file (memory-mapped, staged by the solve)."""
    if path is None or not path.lower().endswith(".npy"):
        return path
    from blocklin.errors import BlocklinError
    from blocklin.storage.formats.base import require_file
    from blocklin.storage.formats.npy import NpyReader

    require_file(path, "--sample-weight")  # a missing file had been named as an output folder to create
    try:  # the header, dtype and size checked as convert checks them (NumPy's own errors named no option)
        NpyReader(path)
    except BlocklinError as exc:
        raise type(exc)(f"--sample-weight {path!r}: {exc}") from None
    return np.load(path, mmap_mode="r")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("solve", help="x = argmin ||A x - b||^2 + lam^2 ||x||^2, out of core",
                       description="Solve a (regularized) least-squares problem with zarr A and B: normal equations "
                                   "with refinement, or a one-pass streaming QR; lambda fixed, a list, or chosen "
                                   "by GCV or the L-curve.")
    p.add_argument("a", metavar="A", help="zarr array (path), m x n; or a sparse group (blocklin convert A.mtx "
                                          "S.zarr), solved by LSQR on its row blocks")
    p.add_argument("b", metavar="B", help="zarr array (path), m x k right-hand sides")
    p.add_argument("-o", "--out", required=True, metavar="X", help="output zarr array (path)")
    p.add_argument("--lambda", dest="lam", type=_lam, default=0.0, metavar="LAM",
                   help="regularization: a number >= 0 (default 0), a comma list, 'gcv', 'lcurve', or 'loo' "
                        "(leave-one-out as scikit-learn's RidgeCV, one more pass; 'loo:0.1,1,10' gives the grid of "
                        "lambdas = sqrt(alphas))")
    p.add_argument("--loo-per-target", dest="lam_per_target", action="store_true",
                   help="with --lambda loo: one lambda per column of B (RidgeCV's alpha_per_target)")
    p.add_argument("--cv", type=ui.count_arg("--cv", minimum=2, example="5"), default=None, metavar="K",
                   help="with --lambda loo[:grid]: choose lambda by K-fold cross-validation (RidgeCV's cv=K: "
                        "KFold(K) without shuffling, one pass over a tall A) instead of leave-one-out")
    p.add_argument("--scoring", default=None, metavar="NAME",
                   help="the score lambda is chosen by, as RidgeCV's scoring=: neg_mean_squared_error, "
                        "neg_root_mean_squared_error, neg_mean_absolute_error, r2 or explained_variance "
                        "(default: minus the mean squared error for leave-one-out, r2 with --cv)")
    p.add_argument("--sample-weight", dest="sample_weight", metavar="W",
                   help="row weights >= 0 (a zarr vector or m x 1 array, or a .npy file): weighted least squares as "
                        "scikit-learn's Ridge.fit(X, y, sample_weight=w)")
    p.add_argument("--positive", action="store_true",
                   help="constrain x >= 0 (as Ridge(positive=True)): nonnegative least squares on the Cholesky factor "
                        "of the in-memory Gram matrix; tall A, lambda a number or a list")
    p.add_argument("--method", choices=("auto", "normal", "qr", "lsqr"), default="auto",
                   help="dense A: normal or qr (auto chooses); sparse A: lsqr (auto is lsqr)")
    p.add_argument("--tol", type=ui.number_arg("--tol", positive=True, example="1e-10"), default=None,
                   help="sparse A: LSQR's relative tolerance (default 1e-10 for float64 values, 1e-6 for float32)")
    p.add_argument("--max-iter", dest="max_iter", type=ui.count_arg("--max-iter", minimum=1, example="200"),
                   default=None, help="sparse A: LSQR iterations at most, two passes each (default 2 min(m, n), "
                                      "at most 10000)")
    p.add_argument("--assume-a", dest="assume_a", choices=("gen", "pos", "sym"), default="gen",
                   help="gen (default): least squares, and for square A with lambda 0 the out-of-core LU with "
                        "partial pivoting; pos: symmetric positive definite A of any size (out-of-core Cholesky); "
                        "sym: symmetric A (Cholesky, else LU); square routes refine to the dtype's backward error")
    p.add_argument("--precision", choices=("double", "mixed", "tf32", "fp16", "bf16"), default="double",
                   help="square systems: mixed factors a float64 A in float32 and refines in float64 to float64 "
                        "backward error (refused when A is too ill-conditioned), switching to GMRES-IR where plain "
                        "refinement stalls; tf32: the same with the factorization's GEMMs on TF32 tensor cores on a "
                        "GPU; fp16/bf16: A scaled into the format's range, the factorization's GEMM updates with "
                        "16-bit inputs (emulated on a CPU), refined by GMRES-IR")
    p.add_argument("--refine", type=ui.count_arg("--refine", minimum=0, auto=("auto",), example="1"), default="auto",
                   help="refinement passes of the normal equations: 'auto' (default: when ill-conditioned) or N")
    p.add_argument("--fit-intercept", action="store_true",
                   help="fit an unpenalized intercept (as scikit-learn's Ridge): the columns of A and b are centered "
                        "by rank-one corrections, no copy; the intercept is printed and kept in the report")
    p.add_argument("--updatable", action="store_true",
                   help="keep the sums of the normal equations in OUT ((n + k)^2 float64) so that 'blocklin update "
                        "OUT' solves again after rows are appended to A and b, reading only those rows")
    p.add_argument("--plot", metavar="PNG", type=ui.plot_arg, help="plot the L-curve / GCV curve (with --lambda gcv or lcurve)")
    p.add_argument("--factored", choices=("cholesky", "lu"),
                   help="A is a stored factor (blocklin factor cholesky / lu wrote it): solve with it, no new "
                        "factorization (scipy's cho_solve / lu_solve; the LU's recorded pivots are used)")
    ui.add_run_options(p, resume="continue an interrupted run: finished passes are not run again (identical result)")
    ui.add_common(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> dict:
    from blocklin.linalg.solve.router import solve

    if args.factored:
        return _run_factored(args)
    if args.plot and (not isinstance(args.lam, str) or args.lam == "loo"):
        raise ParameterError(explain("--plot", "needs --lambda gcv or --lambda lcurve (the curve is computed to "
                                     "choose lambda)", f"--lambda {args.lam}", "pass --lambda gcv"))
    if args.explain:
        return _explain(args)
    x = solve(args.a, args.b, lam=args.lam, method=args.method, assume_a=args.assume_a, out=args.out,
              refine=args.refine, precision=args.precision, fit_intercept=args.fit_intercept,
              updatable=args.updatable, **_sparse_options(args), **_ridge_options(args), **ui.run_settings(args))
    r = x.report
    summary = {"output": x.path, "shape": list(x.shape), "lam": r["lam"], "method": r["method"],
               "method_reason": r["method_reason"], "residual_norm": r["residual_norm"],
               "solution_norm": r["solution_norm"], "passes": r.get("passes", 0), "seconds": r["seconds"],
               "peak_memory": r["peak_memory"], "cond_estimate": r.get("cond_estimate")}
    if "backward_error" in r:  # the square routes (Cholesky, LU)
        summary.update(backward_error=r["backward_error"], refine_steps=r["refine_steps"],
                       precision=r["precision"], growth_factor=r.get("growth_factor"))
    if "curve" in r:
        summary["curve"] = r["curve"]
    if r.get("scaling"):  # the data was scaled by powers of two (docs/solve.md, Scaled data)
        summary["scaling"] = r["scaling"]
    if args.fit_intercept:
        summary["intercept"] = r["intercept"]
    for key in ("alpha_", "best_score_", "positive", "sample_weight", "lam_per_target", "cv", "scoring"):
        if key in r:
            summary[key] = r[key]
    if r.get("method") == "lsqr":  # a sparse A
        summary.update(iterations=r["iterations"], converged=r["converged"], tol=r["tol"], nnz=r["nnz"])
    if args.plot:
        summary["plot"] = _plot(r, args.plot, overwrite=args.overwrite)
    lam = r["lam"]
    lam_s = f"{lam:.3g}" if isinstance(lam, float) else ", ".join(f"{v:.3g}" for v in lam)
    if "best_score_" in r and r.get("lam_rule") == "cv":  # the k-fold choice, in RidgeCV's terms
        lam_s += f" (alpha_ = lambda^2, {r.get('scoring') or 'r2'} {_score(r['best_score_'])}, {r['cv']})"
    elif "best_score_" in r and r.get("scoring"):
        lam_s += f" (alpha_ = lambda^2, leave-one-out {r['scoring']} {_score(r['best_score_'])})"
    elif "best_score_" in r:  # the leave-one-out choice, in RidgeCV's terms
        lam_s += f" (alpha_ = lambda^2, mean squared leave-one-out error {_neg(r['best_score_'])})"
    res = r["residual_norm"]
    res_s = f"{res:.3e}" if isinstance(res, float) else str(res)
    human = (f"wrote {x.path} ({x.shape[0]} x {x.shape[1]}) in {r['seconds']:.2f} s: lambda {lam_s}"
             f"{' (' + r['lam_rule'] + ')' if 'lam_rule' in r else ''}, method {r['method']} ({r['method_reason']}), "
             f"residual norm {res_s}, {r.get('passes', 0)} pass(es)"
             + (f" ({r['iterations']} LSQR iterations{'' if r['converged'] else ', NOT converged'})"
                if r.get("method") == "lsqr" else "")
             + f", peak memory {format_size(r['peak_memory'])}"
             + (f"; intercept {r['intercept']}" if args.fit_intercept else ""))
    summary.update(ui.feed_summary(r))
    ui.emit(args, summary, ui.report_text(human, r))
    return summary


def _score(score: object) -> str:
    return ", ".join(f"{v:.4g}" for v in score) if isinstance(score, list) else f"{score:.4g}"


def _neg(score: object) -> str:
    return ", ".join(f"{-v:.4g}" for v in score) if isinstance(score, list) else f"{-score:.4g}"


def _ridge_options(args: argparse.Namespace) -> dict:
    """``--sample-weight``, ``--positive``, ``--loo-per-target`` where given."""
    opts = {"sample_weight": _weights(args.sample_weight), "positive": args.positive,
            "lam_per_target": args.lam_per_target, "cv": args.cv, "scoring": args.scoring}
    return {k: v for k, v in opts.items() if v is not None and v is not False}


def _sparse_options(args: argparse.Namespace) -> dict:
    """``--tol`` and ``--max-iter`` where given (the sparse route's; a dense A refuses them by name)."""
    return {name: getattr(args, name) for name in ("tol", "max_iter") if getattr(args, name) is not None}


def _explain(args: argparse.Namespace) -> dict:
    """``--explain``: the plan :func:`blocklin.solve_plan` returns, printed; nothing is run or written."""
    from blocklin.linalg.solve.router import solve_plan

    settings = ui.run_settings(args)
    settings.pop("resume", None)
    settings.pop("overwrite", None)
    ridge = _ridge_options(args)
    for key in ("lam_per_target", "cv", "scoring"):  # the plan of the passes does not depend on them
        ridge.pop(key, None)
    plan = solve_plan(args.a, args.b, lam=args.lam, method=args.method, refine=args.refine,
                      fit_intercept=args.fit_intercept, **ridge, **_sparse_options(args), **settings)
    summary = {"plan": plan.to_dict() if hasattr(plan, "to_dict") else str(plan)}
    text = plan.explain(device=ui.plan_device(args, plan)) if hasattr(plan, "explain") else str(plan)
    ui.emit(args, summary, text)
    return summary


def _plot(report: dict, path: str, *, overwrite: bool) -> str:
    """The L-curve (both branches, the chosen point marked) and the rule's curve against lambda (GCV, or the
    L-curve's curvature) with the chosen lambda marked; log axes label decades only, so labels never overlap."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    c, lam = report["curve"], report["lam"]
    lams = np.asarray(c["lam"])
    at = int(np.argmin(np.abs(np.log(lams) - np.log(lam))))  # the grid point nearest the chosen lambda
    fig, ax = plt.subplots(1, 2, figsize=(11, 4.2), squeeze=False)
    left, right = ax[0, 0], ax[0, 1]
    left.loglog(c["residual_norm"], c["solution_norm"], "-", color="C0")
    left.loglog([c["residual_norm"][at]], [c["solution_norm"][at]], "o", color="C3", label=f"lambda = {lam:.3g}")
    left.set_xlabel("residual norm ||A x - b||")
    left.set_ylabel("solution norm ||x||")
    left.set_title("L-curve")
    left.legend(loc="best")
    y, name = (c["gcv"], "GCV") if "gcv" in c else (c["curvature"], "L-curve curvature")
    if "gcv" in c:
        right.loglog(lams, y, "-", color="C0")
    else:
        right.semilogx(lams, y, "-", color="C0")
    right.axvline(lam, color="C3", ls="--", label=f"chosen lambda = {lam:.3g}")
    right.set_xlabel("lambda")
    right.set_ylabel(name)
    right.set_title(f"{name} ({report.get('lam_rule', '')} choice)")
    right.legend(loc="best")
    for a in (left, right):
        _decade_ticks(a)
    fig.tight_layout()
    plot_file.save(fig, path, overwrite=overwrite, dpi=100)
    plt.close(fig)
    return path


def _decade_ticks(ax: Any) -> None:
    """At most 6 labelled decades per log axis and unlabelled minor ticks (labels cannot overlap)."""
    from matplotlib.ticker import LogLocator, NullFormatter

    for axis, scale in ((ax.xaxis, ax.get_xscale()), (ax.yaxis, ax.get_yscale())):
        if scale == "log":
            axis.set_major_locator(LogLocator(base=10, numticks=6))
            axis.set_minor_formatter(NullFormatter())


def _run_factored(args: argparse.Namespace) -> dict:
    """``--factored``: the two triangular solves with a stored factor (the other solve options do not apply)."""
    from blocklin.linalg.solve.factored import cho_solve, lu_solve

    if args.lam != 0.0 or args.fit_intercept or args.plot or args.method != "auto" or _ridge_options(args):
        raise ParameterError(explain("--factored", "solves with the given factor only (no lambda, intercept, "
                                     "method or plot)", "with --lambda/--fit-intercept/--method/--plot",
                                     "drop those options, or drop --factored to factor A"))
    run = cho_solve if args.factored == "cholesky" else lu_solve
    settings = ui.run_settings(args)
    settings.pop("resume", None)  # two triangular solves: nothing to resume, a rerun redoes them
    x = run(args.a, args.b, args.out, **settings)
    r = x.report
    summary = {"output": x.path, "shape": list(x.shape), "method": r["method"], "factored": args.factored,
               "seconds": r["seconds"], "peak_memory": r["peak_memory"]}
    human = (f"wrote {x.path} ({x.shape[0]} x {x.shape[1]}) in {r['seconds']:.2f} s with the stored {args.factored} "
             f"factor {args.a} ({r['method']}), peak memory {format_size(r['peak_memory'])}")
    ui.emit(args, summary, ui.report_text(human, r))
    return summary
