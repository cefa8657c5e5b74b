"""``blocklin pca A.zarr -k 20 [-o out.zarr] --json``: principal components of the rows of a matrix."""

from __future__ import annotations

import argparse
import math

from blocklin.cli import ui
from blocklin.cli.svd import _power_iters, add_method_options, add_sparse_explain, explain_sparse, summary_of, worst_line
from blocklin.config import format_size


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("pca", help="principal components (centered truncated SVD, no centered copy), out of core",
                       description="PCA of the rows (samples) of a zarr matrix: the columns are centered inside "
                                   "the passes (one more pass for the means). Prints the explained variance and "
                                   "its ratio; with -o keeps U, S, Vt (the components), mean (and scale).")
    p.add_argument("a", metavar="A", help="zarr array (path): samples x features")
    how = p.add_mutually_exclusive_group(required=True)
    how.add_argument("-k", type=ui.count_arg("-k", example="10", auto=("all", "mle"), minimum=0),
                     help="number of components (0 <= k <= min(m, n); 0: the isotropic model from the column "
                          "moments), 'all', or 'mle' (Minka's choice)")
    how.add_argument("--variance", type=_fraction, metavar="FRACTION",
                     help="the fewest components whose explained variance ratios sum past FRACTION, in (0, 1)")
    p.add_argument("-o", "--out", metavar="OUT", help="output zarr group (path) for the factors")
    p.add_argument("--scale", action="store_true", help="standardize the columns (PCA of the correlation matrix)")
    p.add_argument("--updatable", action="store_true",
                   help="keep the co-moments in OUT (n x n, one pass more) so that 'blocklin update OUT' brings the "
                        "PCA up to date from rows appended later without reading the old ones")
    add_method_options(p, rsvd="q + 2 passes", sketch="two passes")
    p.add_argument("--seed", type=ui.count_arg("--seed", minimum=0, example="0"), help="seed of the random test matrices (deterministic results)")
    ui.add_run_options(p, unit="strip tasks", resume=ui.RESUME_PASSES, explain=False)
    add_sparse_explain(p)
    ui.add_common(p)
    p.set_defaults(func=run)


def _fraction(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0.0 < value < 1.0:
        raise argparse.ArgumentTypeError(f"must be a fraction of the variance in (0, 1); got {text!r}. "
                                         "Fix: pass --variance 0.95")
    return value


def run(args: argparse.Namespace) -> dict:
    from blocklin.linalg.lowrank.pca import pca

    n_components = args.variance if args.variance is not None else None if args.k == "all" else args.k
    if args.explain:
        return explain_sparse(args, "pca", n_components, method=args.method, oversample=args.oversample,
                              power_iters=_power_iters(args.power_iters), tol=args.tol)
    res = pca(args.a, n_components, scale=args.scale, method=args.method, oversample=args.oversample,
              power_iters=_power_iters(args.power_iters), tol=args.tol, out=args.out, seed=args.seed,
              updatable=args.updatable, **ui.run_settings(args))
    r = res.report
    summary = summary_of(r, "pca", res.n_components_)
    if not args.out:
        summary.pop("output", None)
    summary.update(explained_variance=res.explained_variance_, explained_variance_ratio=res.explained_variance_ratio_,
                   singular_values=res.singular_values_, total_variance=res.total_variance_,
                   n_samples=res.n_samples_, n_features=res.n_features_in_, scale=bool(args.scale),
                   noise_variance=res.noise_variance_)
    ratio = float(res.explained_variance_ratio_.sum())
    first = (f" (first: {100 * float(res.explained_variance_ratio_[0]):.2f}%)" if res.n_components_ else
             f" (noise variance {res.noise_variance_:.4g})")
    where = f"wrote {r['output']} (U, S, Vt, mean{', scale' if args.scale else ''}); " if args.out else ""
    explained = (f"explain {100 * ratio:.2f}% of the variance{first}" if not math.isnan(ratio) else
                 "of data with no variance (every column constant: the ratios are nan, 0 / 0)")
    human = (f"{where}{res.n_components_} components of {res.n_samples_} x {res.n_features_in_} {explained} "
             f"in {r['seconds']:.2f} s: "
             f"{r['passes']} pass(es) over A ({r['passes_formula']}), read {format_size(r['bytes_read'])}, "
             f"peak memory {format_size(r['peak_memory'])}{worst_line(r)}")
    summary.update(ui.feed_summary(r))
    ui.emit(args, summary, ui.report_text(human, r))
    return summary
