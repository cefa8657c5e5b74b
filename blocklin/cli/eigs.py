"""``blocklin eigs A -k 10 -o eig.zarr``: eigenpairs of a symmetric out-of-core matrix (Lanczos)."""

from __future__ import annotations

import argparse

from blocklin.cli import ui
from blocklin.cli.svd import add_sparse_explain, explain_sparse, plot_spectrum, summary_of
from blocklin.config import format_size


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("eigs", help="k eigenpairs of a symmetric matrix by block Lanczos, out of core",
                       description="Eigenpairs of a symmetric zarr matrix (thick-restarted block Lanczos, one pass "
                                   "per step). Writes a zarr group with w, V and the report in its attributes: the wanted "
                                   "end first, as svd orders S (LA, LM: largest first; SA: smallest first), the "
                                   "eigenvectors as the columns of V (n x k, oriented as svd's U).")
    p.add_argument("a", metavar="A", help="zarr array (path), symmetric (with --center: any data matrix)")
    p.add_argument("-k", type=ui.count_arg("-k", example="10"), required=True, help="number of eigenpairs (1 <= k < n)")
    p.add_argument("-o", "--out", required=True, metavar="OUT", help="output zarr group (path)")
    p.add_argument("--which", choices=("LA", "SA", "LM"), default="LA",
                   help="largest algebraic (default), smallest algebraic, largest magnitude")
    p.add_argument("--tol", type=ui.number_arg("--tol", positive=True, example="1e-6"), help="relative residual tolerance ||A x - w x|| <= tol * max|w|")
    p.add_argument("--max-passes", type=ui.count_arg("--max-passes", example="60"), default=60, help="pass limit (default 60)")
    p.add_argument("--seed", type=ui.count_arg("--seed", minimum=0, example="0"), help="seed of the starting block")
    p.add_argument("--center", action="store_true",
                   help="A is a data matrix (samples x features): eigenpairs of its covariance, by the centered "
                        "SVD (no covariance or centered copy formed)")
    p.add_argument("--laplacian", choices=("combinatorial", "normalized"),
                   help="A is a sparse graph's adjacency (a blocklin-csr group): eigenpairs of its Laplacian D - W or "
                        "I - D^-1/2 W D^-1/2, never formed (with --which SA: the smallest, for spectral clustering)")
    p.add_argument("--plot", metavar="PNG", type=ui.plot_arg, help="draw the eigenvalues and residuals (needs matplotlib)")
    ui.add_run_options(p, unit="strip tasks", resume=ui.RESUME_PASSES, explain=False)
    add_sparse_explain(p)
    ui.add_common(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> dict:
    from blocklin.linalg.lowrank.eigsh import eigsh

    if args.explain:
        return explain_sparse(args, "eigsh", args.k, max_passes=args.max_passes, laplacian=args.laplacian,
                              out=args.out)
    res = eigsh(args.a, args.k, which=args.which, tol=args.tol, max_passes=args.max_passes, seed=args.seed,
                out=args.out, order="ascending" if args.which == "SA" else "descending", center=args.center,
                laplacian=args.laplacian, **ui.run_settings(args))
    r = res.report
    r["output"] = args.out
    summary = summary_of(r, "eigs", args.k)
    summary["w"] = [float(x) for x in res.w]
    scale = max(abs(float(x)) for x in res.w) or 1.0
    rel = [float(x) / scale for x in r["residuals"]]
    summary["relative_residuals"] = rel
    if args.plot:
        plot_spectrum(args.plot, res.w, rel, title=f"blocklin eigs ({args.which}), k={args.k}", label="|eigenvalue|",
                      overwrite=args.overwrite)
        summary["plot"] = args.plot
    stored = "U, S, Vt, mean: the centered SVD, w = S^2 / (m - 1), V = Vt^T" if args.center else "w, V"
    human = (f"wrote {args.out} ({stored}; k={args.k}, {args.which}) in {r['seconds']:.2f} s: {r['passes']} pass(es) "
             f"over A, read {format_size(r['bytes_read'])}, peak memory {format_size(r['peak_memory'])}, max relative "
             f"residual {max(rel):.1e}")
    summary.update(ui.feed_summary(r))
    ui.emit(args, summary, ui.report_text(human, r))
    return summary
