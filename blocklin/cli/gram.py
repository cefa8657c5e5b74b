"""``blocklin gram A -o G [--trans]``: the Gram matrix ``A^T A`` (or ``A A^T``) by SYRK, in one read of ``A``."""

from __future__ import annotations

import argparse

from blocklin.cli import ui
from blocklin.config import format_size


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("gram", help="G = A^T A (or A A^T) by SYRK, one read of A",
                       description="The Gram matrix of a zarr matrix out of core: G = A^T A, or A A^T with --trans. "
                                   "Half the flops of 'gemm A A --trans-a' and one read of A when the result fits "
                                   "the budget (else stored tiles; --explain says which).")
    p.add_argument("a", metavar="A", help="zarr array (path or URL)")
    p.add_argument("-o", "--out", required=True, metavar="G", help="output zarr array (path or URL)")
    p.add_argument("--trans", action="store_true", help="A A^T (the Gram matrix of the rows) instead of A^T A")
    p.add_argument("--dtype", choices=("float32", "float64", "complex64", "complex128"),
                   help="compute and output dtype (default: A's; a complex A takes a complex one)")
    ui.add_run_options(p, resume="continue an interrupted run (identical result)")
    ui.add_common(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> dict:
    from blocklin.linalg.products.gram import gram

    kwargs = dict(trans=args.trans, dtype=args.dtype, **ui.run_settings(args))
    if args.explain:
        plan = gram(args.a, args.out, explain=True, **kwargs)
        summary = {"plan": plan.to_dict(), "route": plan.route, "flops": plan.flops, "bytes_read": plan.bytes_read,
                   "bytes_written": plan.bytes_written, "peak_memory": plan.peak_memory}
        ui.emit(args, summary, plan.explain(device=ui.plan_device(args, plan)))
        return summary
    result = gram(args.a, args.out, **kwargs)
    r = result.report
    summary = {"output": result.path, "shape": list(result.shape), "dtype": result.dtype.name, "product": r["product"],
               "route": r["route"], "passes": r["passes"], "seconds": r["seconds"], "flops": r["flops"],
               "gflops": r["gflops"], "bytes_read": r["bytes_read"], "bytes_written": r["bytes_written"],
               "peak_memory": r["peak_memory"], "planned_peak_memory": r["plan"]["peak_memory"], "tasks": r["tasks"],
               "skipped": r["skipped"], "device": r["device"], "scheduler": r["scheduler"]}
    reads = {"pass": "one read of A", "sparse": "one read of the sparse A"}.get(
        r["route"], f"A read {r['passes']} times (stored tiles)")
    human = (f"wrote {result.path} ({r['product']}, {result.shape[0]} x {result.shape[1]} {result.dtype.name}) in "
             f"{r['seconds']:.2f} s: {reads}, {r['gflops']:.1f} GFLOP/s, read {format_size(r['bytes_read'])}, "
             f"wrote {format_size(r['bytes_written'])}, peak memory {format_size(r['peak_memory'])} "
             f"(plan {format_size(r['plan']['peak_memory'])})")
    summary.update(ui.feed_summary(r))
    ui.emit(args, summary, ui.report_text(human, r))
    return summary
