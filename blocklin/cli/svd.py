"""``blocklin svd A -k 50 -o factors.zarr``: truncated SVD of an out-of-core matrix."""

from __future__ import annotations

import argparse
from typing import Any

from blocklin.cli import plot_file, ui
from blocklin.config import format_size
from blocklin.errors import ParameterError, explain


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("svd", help="truncated SVD (randomized, single-pass sketch, or Lanczos), out of core",
                       description="Truncated SVD A ~ U diag(S) Vt of a zarr matrix. Writes a zarr group with U, S, "
                                   "Vt and the report (passes over A, bytes read, seconds, residuals) in its "
                                   "attributes.")
    p.add_argument("a", metavar="A", help="zarr array (path)")
    p.add_argument("-k", type=ui.count_arg("-k", example="10", auto=("all",)), required=True,
                   help="number of singular triplets (1 <= k <= min(m, n)), or 'all' (every triplet: --method full)")
    p.add_argument("--which", choices=("LM", "SM"), default="LM",
                   help="LM (default): the k largest singular values; SM: the k smallest (--method full)")
    p.add_argument("-o", "--out", required=True, metavar="OUT", help="output zarr group (path)")
    add_method_options(p, rsvd="q + 1 passes", sketch="one pass")
    p.add_argument("--max-passes", type=ui.count_arg("--max-passes", example="60"), help="pass limit of the adaptive methods")
    p.add_argument("--seed", type=ui.count_arg("--seed", minimum=0, example="0"), help="seed of the random test matrices (deterministic results)")
    p.add_argument("--center", action="store_true",
                   help="factor A - 1 mu^T (column means subtracted inside the passes, no copy; one more pass)")
    p.add_argument("--scale", action="store_true",
                   help="divide the columns by their standard deviations (with --center: standardized PCA)")
    p.add_argument("--updatable", action="store_true",
                   help="keep A's co-moments (n x n, one pass more; --method sketch: the sketch's own state, no "
                        "pass more) so that 'blocklin update OUT' brings the result up to date from rows appended "
                        "later without reading the old ones")
    p.add_argument("--plot", metavar="PNG", type=ui.plot_arg, help="draw the singular value spectrum and residuals (needs matplotlib)")
    ui.add_run_options(p, unit="strip tasks", resume=ui.RESUME_PASSES, explain=False)
    add_sparse_explain(p)
    ui.add_common(p)
    p.set_defaults(func=run)


def add_sparse_explain(p: argparse.ArgumentParser) -> None:
    """``--explain`` of svd, pca and eigs: the plan of a stored sparse matrix, counted in nonzeros."""
    p.add_argument("--explain", action="store_true", help="print the plan and exit (a sparse blocklin-csr A: nnz, "
                   "bytes per pass, passes, memory held)")


def explain_sparse(args: argparse.Namespace, operation: str, k: Any, **options: Any) -> dict:
    """Print the plan of ``operation`` of the sparse ``args.a`` (:mod:`blocklin.linalg.lowrank.sparse_plan`);
    a dense ``A`` is refused (its plan is in the run's report)."""
    from blocklin.linalg.lowrank.sparse_plan import sparse_lowrank_plan
    from blocklin.sparse import SparseMatrix, as_sparse_matrix

    if not isinstance(as_sparse_matrix(args.a), SparseMatrix):
        raise ParameterError(explain("--explain", f"{operation} --explain plans a stored sparse matrix (a "
                                     "blocklin-csr group)", f"{args.a!r}, not a sparse group",
                                     "drop --explain: the run's report holds its plan and passes"))
    plan = sparse_lowrank_plan(args.a, k, operation=operation, memory=args.memory, **options)
    summary = {"plan": plan.to_dict(), "route": plan.route, "nnz": plan.nnz, "pass_bytes": plan.pass_bytes,
               "passes": plan.passes, "passes_bound": plan.passes_bound, "bytes_read": plan.bytes_read,
               "bytes_written": plan.bytes_written, "flops": plan.flops, "peak_memory": plan.peak_memory,
               "fits": plan.fits}
    ui.emit(args, summary, plan.explain(device=ui.plan_device(args, plan)))
    return summary


def _power_iters(value: str) -> Any:
    if value == "auto":
        return value
    try:
        return int(value)
    except ValueError:
        raise ParameterError(explain("--power-iters", "must be an integer or 'auto'", repr(value),
                                     "pass --power-iters 2")) from None


def run(args: argparse.Namespace) -> dict:
    from blocklin.linalg.lowrank.svd import svd

    if args.explain:
        return explain_sparse(args, "svd", None if args.k == "all" else args.k, method=args.method,
                              oversample=args.oversample, power_iters=_power_iters(args.power_iters), tol=args.tol,
                              max_passes=args.max_passes)
    res = svd(args.a, None if args.k == "all" else args.k, which=args.which, method=args.method,
              oversample=args.oversample, power_iters=_power_iters(args.power_iters),
              tol=args.tol, out=args.out, seed=args.seed, max_passes=args.max_passes,
              center=args.center, scale=args.scale, updatable=args.updatable, **ui.run_settings(args))
    r = res.report
    summary = summary_of(r, "svd", len(res.s))
    summary["s"] = [float(x) for x in res.s]
    if args.plot:
        plot_spectrum(args.plot, res.s, r.get("relative_residuals"),
                      title=f"blocklin svd ({r['method']}), k={len(res.s)}",
                      label="singular value", overwrite=args.overwrite)
        summary["plot"] = args.plot
    worst = worst_line(r)
    stored = "U, S, Vt" + (", mean" if args.center else "") + (", scale" if args.scale else "")
    human = (f"wrote {r['output']} ({stored}; k={len(res.s)}{', smallest' if args.which == 'SM' else ''}, "
             f"{r['method']}) in {r['seconds']:.2f} s: "
             f"{r['passes']} pass(es) over A ({r['passes_formula']}), read {format_size(r['bytes_read'])}, "
             f"peak memory {format_size(r['peak_memory'])}{worst}")
    summary.update(ui.feed_summary(r))
    ui.emit(args, summary, ui.report_text(human, r))
    return summary


def add_method_options(p: argparse.ArgumentParser, *, rsvd: str, sketch: str) -> None:
    """``--method``, ``--power-iters``, ``--oversample`` and ``--tol`` (svd and pca; ``rsvd`` and
    ``sketch`` say what those methods cost)."""
    p.add_argument("--method", choices=("auto", "rsvd", "sketch", "lanczos", "gram", "full"), default="auto",
                   help="auto (default): full for every triplet or the smallest, gram for narrow matrices (at most "
                        "24 (k + oversample) columns, or rows when wide) and lanczos otherwise, both to --tol, or "
                        f"rsvd when --power-iters is a number; rsvd: randomized, {rsvd}; sketch: {sketch}; lanczos: "
                        "converged to --tol; gram: one pass for A^T A and one Rayleigh-Ritz pass, then lanczos where "
                        "--tol is missed; full: every triplet from the QR of A and LAPACK's SVD of its R (one pass, "
                        "N x N factors in memory)")
    p.add_argument("--power-iters", default="auto", type=ui.count_arg("--power-iters", minimum=0, auto=("auto",), example="2"), help="rsvd power iterations (integer or 'auto')")
    p.add_argument("--oversample", type=ui.count_arg("--oversample", minimum=0, example="10"), default=10, help="extra random columns (default 10)")
    p.add_argument("--tol", type=ui.number_arg("--tol", positive=True, example="1e-6"), help="accuracy target: every triplet's ||A^T u - s v|| <= tol * s "
                   "(its own singular value); default sqrt(10 sqrt(eps)) for lanczos, gram and auto, which "
                   "gives singular values to about 10 sqrt(eps)")


def worst_line(r: dict) -> str:
    """The headline's residual part: the worst triplet by its residual relative to its own singular value."""
    w = r.get("worst_triplet")
    if not w:
        return " (residuals not computed by the sketch)"
    bad = sum(1 for c in r.get("converged_triplets") or [] if not c)
    state = f"; {bad} triplet(s) NOT converged to tol {r['tol']:.1e}" if bad else ""
    return (f", worst triplet {w['index']} (s = {w['s']:.4g}): relative residual {w['relative_residual']:.1e}"
            f"{state}")


def summary_of(r: dict, operation: str, k: int) -> dict:
    keys = ("output", "method", "seconds", "passes", "passes_formula", "intermediate_passes", "bytes_read",
            "bytes_logical", "read_notes", "peak_memory", "memory_budget", "residuals", "relative_residuals",
            "converged", "converged_triplets", "worst_triplet", "tol", "seed",
            "device", "scheduler", "in_core", "which", "center", "scale", "scaling", "fallback")
    out = {key: r[key] for key in keys if key in r}
    out.update(operation=operation, k=k)
    return out


def plot_spectrum(path: str, values: Any, residuals: Any, *, title: str, label: str, overwrite: bool) -> None:
    """Values (log scale) by index, with relative residuals on a second axis (``overwrite``: the run's
    ``--overwrite``, which may replace a plot blocklin wrote)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ImportError("--plot needs matplotlib; got none installed. Fix: pip install 'blocklin[plot]'") from None
    vals = [abs(float(v)) for v in values]
    idx = list(range(1, len(vals) + 1))
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.semilogy(idx, vals, "o-", ms=3, label=label)
    ax.set_xlabel("index")
    ax.set_ylabel(label)
    ax.set_title(title)
    if residuals:
        ax2 = ax.twinx()
        ax2.semilogy(idx, [max(float(x), 1e-300) for x in residuals], "x", color="tab:red", ms=4,
                     label="relative residual")
        ax2.set_ylabel("relative residual", color="tab:red")
    fig.tight_layout()
    plot_file.save(fig, path, overwrite=overwrite, dpi=100)
    plt.close(fig)
