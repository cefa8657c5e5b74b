"""``blocklin demo``: multiply matrices larger than the memory budget, verify, report."""

from __future__ import annotations

import argparse

from blocklin.cli import ui
from blocklin.config import format_size
from blocklin.errors import BlocklinError


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("demo", help="out-of-core GEMM on matrices larger than the memory budget",
                       description="Create two random n x n matrices (each larger than --memory) as zarr files, "
                                   "multiply them out of core, verify sampled rows against NumPy, and report "
                                   "throughput and peak memory.")
    p.add_argument("--size", type=ui.count_arg("--size", example="2048"), default=6144, help="matrix order n (default 6144: 288 MiB per float64 matrix)")
    p.add_argument("--dtype", choices=("float32", "float64"), default="float64", help="dtype of the demo matrix")
    p.add_argument("--dir", help="folder for the matrices (default: a temporary folder)")
    p.add_argument("--keep", action="store_true", help="keep the matrices afterwards")
    p.add_argument("--seed", type=ui.count_arg("--seed", minimum=0, example="0"), default=0,
                   help="seed of the random matrix")
    ui.add_common(p, output=False)
    p.set_defaults(func=run, memory_default="256MiB")


def run(args: argparse.Namespace) -> dict:
    from blocklin.demo import run_demo

    memory = args.memory or "256MiB"
    if not args.json:
        print(f"blocklin demo: C = A @ B with A, B {args.size} x {args.size} {args.dtype} "
              f"under a {memory} host budget", flush=True)
    s = run_demo(n=args.size, memory=memory, dtype=args.dtype, folder=args.dir, keep=args.keep, device=args.device,
                 scheduler=args.scheduler, progress=ui.progress_arg(args), seed=args.seed)
    human = "\n".join([
        f"  matrices   {format_size(s['matrix_bytes'])} each, budget {format_size(s['memory_budget'])}",
        f"  gemm       {s['seconds']:.2f} s, {s['gflops']:.1f} GFLOP/s, read {format_size(s['bytes_read'])}, "
        f"wrote {format_size(s['bytes_written'])}",
        f"  memory     peak {format_size(s['peak_memory'])} during the GEMM: "
        + (f"{format_size(s['gemm_memory'])} above the {format_size(s['baseline_memory'])} resident before it"
           if s["gemm_memory"] is not None else "baseline not measurable on this system")
        + f" (plan {format_size(s['planned_peak_memory'])}, budget {format_size(s['memory_budget'])})",
        f"  verified   {'yes' if s['verified'] else 'NO'}: max row error {s['max_row_error']:.2e} "
        f"(bound {s['row_error_bound']:.1e}), Freivalds {s['freivalds_relative_error']:.1e}",
        f"  output     {s['output'] if s['kept'] else '(removed; use --keep --dir DIR to keep it)'}",
    ])
    ui.emit(args, s, human)
    if not s["verified"]:
        raise BlocklinError("verification failed: the out-of-core result differs from the reference "
                            "beyond the rounding bound")
    return s
