"""``blocklin gemm A B -o C``: out-of-core matrix multiply."""

from __future__ import annotations

import argparse

from blocklin.cli import ui
from blocklin.config import format_size


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("gemm", help="C = alpha * op(A) @ op(B) + beta * C0, out of core",
                       description="Multiply two zarr matrices out of core: C = alpha * op(A) @ op(B) + beta * C0.")
    p.add_argument("a", metavar="A", help="zarr array (path)")
    p.add_argument("b", metavar="B", help="zarr array (path)")
    p.add_argument("-o", "--out", required=True, metavar="C", help="output zarr array (path)")
    p.add_argument("--c", dest="c", metavar="C0", help="matrix added as beta * C0")
    p.add_argument("--alpha", type=ui.number_arg("--alpha", example="1.0"), default=1.0, help="scale of op(A) @ op(B)")
    p.add_argument("--beta", type=ui.number_arg("--beta", example="1.0"), default=None, help="default 1.0 with --c, else 0.0")
    p.add_argument("--trans-a", action="store_true", help="use A transposed")
    p.add_argument("--trans-b", action="store_true", help="use B transposed")
    p.add_argument("--dtype", choices=("float32", "float64", "complex64", "complex128"),
                   help="compute dtype (casts while streaming; default: the inputs' common dtype)")
    p.add_argument("--precision", choices=("float64", "float32", "tf32"),
                   help="compute the tiles in this precision, store the result in the dtype: float32 (float32 "
                        "BLAS/cuBLAS, error about k 2^-24 |A||B|), tf32 (float32 with TF32 tensor cores on a GPU)")
    ui.add_run_options(p, unit="tile tasks", resume="continue an interrupted run")
    ui.add_common(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> dict:
    from blocklin.linalg.products.gemm import matmul, read_advice
    from blocklin.create import open as open_matrix

    beta = args.beta if args.beta is not None else (1.0 if args.c else 0.0)
    kwargs = dict(c=args.c, alpha=args.alpha, beta=beta, trans_a=args.trans_a, trans_b=args.trans_b,
                  dtype=args.dtype, precision=args.precision, **ui.run_settings(args))
    if args.explain:
        plan = matmul(args.a, args.b, args.out, explain=True, **kwargs)
        # a sparse S, or a thin product's single row pass (which notes its own re-reads): no rechunk advice
        advice = [] if getattr(plan, "route", None) in ("sparse", "rows") else read_advice(
            open_matrix(args.a), open_matrix(args.b), plan, trans_a=args.trans_a, trans_b=args.trans_b)
        summary = {"plan": plan.to_dict(), "flops": plan.flops, "bytes_read": plan.bytes_read,
                   "bytes_written": plan.bytes_written, "peak_memory": plan.peak_memory, "read_notes": advice}
        ui.emit(args, summary, "\n".join([plan.explain(device=ui.plan_device(args, plan))] + [f"  rechunk   {note}" for note in advice]))
        return summary
    result = matmul(args.a, args.b, args.out, **kwargs)
    r = result.report
    summary = {"output": result.path, "shape": list(result.shape), "dtype": result.dtype.name,
               "seconds": r["seconds"], "flops": r["flops"], "gflops": r["gflops"], "bytes_read": r["bytes_read"],
               "bytes_logical": r["bytes_logical"], "read_notes": r.get("read_notes", []),
               "bytes_written": r["bytes_written"], "peak_memory": r["peak_memory"],
               "planned_peak_memory": r["plan"]["peak_memory"], "tasks": r["tasks"], "skipped": r["skipped"],
               "device": r["device"], "scheduler": r["scheduler"]}
    human = (f"wrote {result.path} ({result.shape[0]} x {result.shape[1]} {result.dtype.name}) in {r['seconds']:.2f} s: "
             f"{r['gflops']:.1f} GFLOP/s, read {format_size(r['bytes_read'])}, wrote {format_size(r['bytes_written'])}, "
             f"peak memory {format_size(r['peak_memory'])} (plan {format_size(r['plan']['peak_memory'])})")
    summary.update(ui.feed_summary(r))
    ui.emit(args, summary, ui.report_text(human, r))
    return summary
