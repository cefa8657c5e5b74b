"""``blocklin factor {cholesky,lu,qr} A -o F``: out-of-core factorizations of matrix files."""

from __future__ import annotations

import argparse
from typing import Any

from blocklin.cli import ui
from blocklin.config import format_size


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("factor", help="factor a zarr matrix out of core (cholesky, lu, qr)",
                       description="Factor a zarr matrix out of core, tile by tile or panel by panel.")
    kinds = p.add_subparsers(dest="kind", metavar="KIND")
    c = kinds.add_parser("cholesky", help="A = L L^T (or U^T U) of a symmetric positive definite matrix",
                         description="Tiled left-looking Cholesky (one Dask task per tile; resumable). Reads the "
                                     "lower triangle of A (the upper one with --upper).")
    c.add_argument("a", metavar="A", help="square symmetric positive definite zarr array (path)")
    c.add_argument("-o", "--out", required=True, metavar="L", help="output zarr array (path)")
    c.add_argument("--upper", action="store_true", help="write U = L^T (reading the upper triangle of A)")
    c.add_argument("--tile", type=ui.count_arg("--tile", example="256"), help="tile side (default: the input's square chunks, or planned)")
    ui.add_run_options(c, unit="tile tasks", resume="continue an interrupted run, keeping its finished tiles")
    ui.add_common(c)
    c.set_defaults(func=run_cholesky)
    u = kinds.add_parser("lu", help="P A = L U with partial pivoting, packed as LAPACK's getrf (pivots in the "
                                    "output's attributes)",
                         description="Left-looking LU with partial pivoting over whole column panels (resumable). "
                                     "Of an m x n A: L m x min(m, n) unit lower, U min(m, n) x n upper, "
                                     "packed m x n with min(m, n) pivots, as LAPACK's getrf.")
    u.add_argument("a", metavar="A", help="zarr array (path), m x n (square, tall or wide)")
    u.add_argument("-o", "--out", required=True, metavar="LU", help="output zarr array (path)")
    u.add_argument("--tile", type=ui.count_arg("--tile", example="256"), help="panel width (default: planned from the budget)")
    ui.add_run_options(u, unit=None, resume=_RESUME_PANELS)
    ui.add_common(u)
    u.set_defaults(func=run_lu)
    _register_qr(kinds)
    p.set_defaults(func=lambda args: p.error("choose what to factor: blocklin factor {cholesky,lu,qr} A -o F"))


_RESUME_PANELS = "continue an interrupted run, keeping its finished panels"


def _explain(args: argparse.Namespace, factor: Any, kwargs: dict) -> dict:
    """``--explain``: print the plan ``factor`` would run, run nothing."""
    plan = factor(args.a, out=args.out, explain=True, **kwargs)
    summary = {"plan": plan.to_dict()}
    ui.emit(args, summary, plan.explain(device=ui.plan_device(args, plan)))
    return summary


def _register_qr(kinds: argparse._SubParsersAction) -> None:
    r = kinds.add_parser("qr", help="A = Q R of a tall, square or wide matrix (R, and Q with --q)",
                         description="QR out of core: one streaming TSQR pass when R alone fits in memory, else "
                                     "blocked Householder over column panels (or, with --method tiles, the tile "
                                     "Householder QR on square tiles), both resumable. R has a "
                                     "non-negative diagonal.")
    r.add_argument("a", metavar="A", help="zarr array (path), m x n (wide: R is m x n, Q m x m)")
    r.add_argument("-o", "--out", required=True, metavar="R", help="output zarr array of R (path)")
    r.add_argument("--q", metavar="Q", help="also write the thin Q (m x n) to this zarr array (path)")
    r.add_argument("--method", choices=("auto", "tiled", "tiles", "tsqr"), default="auto",
                   help="auto (default): TSQR for R alone when it fits in memory, else tiled (column panels, "
                        "faster on a quiet machine); tiles: square tiles")
    r.add_argument("--tile", type=ui.count_arg("--tile", example="256"), help="panel width (tiled) or tile side (tiles) (default: planned from the "
                                            "budget)")
    ui.add_run_options(r, unit=None, resume=_RESUME_PANELS)
    ui.add_common(r)
    r.set_defaults(func=run_qr)


def run_qr(args: argparse.Namespace) -> dict:
    from blocklin.linalg.factor.qr import qr

    kwargs = dict(q=args.q, mode="reduced" if args.q else "r", method=args.method, tile=args.tile,
                  **ui.run_settings(args))
    if args.explain:
        return _explain(args, qr, kwargs)
    res = qr(args.a, out=args.out, **kwargs)
    q, f = res if isinstance(res, tuple) else (None, res)
    r = f.report
    summary = {"output": f.path, "q": q.path if q is not None else None, "shape": list(f.shape),
               "dtype": f.dtype.name, "method": r["method"], "method_reason": r["method_reason"],
               "seconds": r["seconds"], "flops": r["flops"], "gflops": r["gflops"], "diag_ratio": r["diag_ratio"],
               "tasks": r["tasks"], "skipped": r["skipped"], "peak_memory": r["peak_memory"],
               "scheduler": r["scheduler"], "device": r["device"]}
    also_q = f" and {q.path} (Q, {q.shape[0]} x {q.shape[1]})" if q is not None else ""
    human = (f"wrote {f.path} (R, {f.shape[0]} x {f.shape[1]} {f.dtype.name}){also_q}"
             f" in {r['seconds']:.2f} s ({r['gflops']:.1f} GFLOP/s), method {r['method']} ({r['method_reason']}); "
             f"min/max |R_ii| {r['diag_ratio']:.3g}; peak memory {format_size(r['peak_memory'])}")
    summary.update(ui.feed_summary(r))
    ui.emit(args, summary, ui.report_text(human, r))
    return summary


def run_lu(args: argparse.Namespace) -> dict:
    from blocklin.linalg.factor.lu import lu

    kwargs = dict(tile=args.tile, **ui.run_settings(args))
    if args.explain:
        return _explain(args, lu, kwargs)
    f = lu(args.a, out=args.out, **kwargs)
    r = f.report
    summary = {"output": f.path, "shape": list(f.shape), "dtype": f.dtype.name, "seconds": r["seconds"],
               "flops": r["flops"], "gflops": r["gflops"], "growth_factor": r["growth_factor"],
               "min_pivot": r["min_pivot"], "tasks": r["tasks"], "skipped": r["skipped"],
               "peak_memory": r["peak_memory"], "tile": r["plan"]["tile"], "scheduler": r["scheduler"],
               "device": r["device"]}
    human = (f"wrote {f.path} ({f.shape[0]} x {f.shape[1]} {f.dtype.name}, packed L\\U, pivots in its attributes) "
             f"in {r['seconds']:.2f} s ({r['gflops']:.1f} GFLOP/s); growth factor {r['growth_factor']:.3g}, "
             f"smallest pivot {r['min_pivot']:.3g}; peak memory {format_size(r['peak_memory'])}")
    summary.update(ui.feed_summary(r))
    ui.emit(args, summary, ui.report_text(human, r))
    return summary


def run_cholesky(args: argparse.Namespace) -> dict:
    from blocklin.linalg.factor.cholesky import cholesky

    kwargs = dict(lower=not args.upper, tile=args.tile, **ui.run_settings(args))
    if args.explain:
        return _explain(args, cholesky, kwargs)
    f = cholesky(args.a, out=args.out, **kwargs)
    r = f.report
    summary = {"output": f.path, "shape": list(f.shape), "dtype": f.dtype.name, "lower": not args.upper,
               "seconds": r["seconds"], "flops": r["flops"], "gflops": r["gflops"], "tasks": r["tasks"],
               "skipped": r["skipped"], "bytes_read": r["bytes_read"],
               "bytes_logical": r["bytes_logical"], "bytes_written": r["bytes_written"],
               "peak_memory": r["peak_memory"], "tile": r["plan"]["tile"], "scheduler": r["scheduler"],
               "device": r["device"]}
    human = (f"wrote {f.path} ({f.shape[0]} x {f.shape[1]} {f.dtype.name}, {'L' if not args.upper else 'U'}) in "
             f"{r['seconds']:.2f} s ({r['gflops']:.1f} GFLOP/s, {r['tasks']} tile tasks of {r['plan']['tile']}"
             f"{', ' + str(r['skipped']) + ' kept from the interrupted run' if r['skipped'] else ''}); peak memory "
             f"{format_size(r['peak_memory'])}")
    summary.update(ui.feed_summary(r))
    ui.emit(args, summary, ui.report_text(human, r))
    return summary
