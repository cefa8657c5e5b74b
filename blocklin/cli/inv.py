"""``blocklin inv A -o X``: out-of-core inverse with Newton-Schulz refinement."""

from __future__ import annotations

import argparse

from blocklin.cli import ui
from blocklin.config import format_size


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("inv", help="X = A^-1, out of core (Schur complements, Newton-Schulz refinement)",
                       description="Invert a square zarr matrix out of core: LU with partial pivoting (or, with "
                                   "--method schur, recursive Schur complements guarded by a random butterfly), "
                                   "refined by Newton-Schulz when the backward error exceeds the target.")
    p.add_argument("a", metavar="A", help="square zarr array (path)")
    p.add_argument("-o", "--out", required=True, metavar="X", help="output zarr array (path)")
    p.add_argument("--refine", type=ui.count_arg("--refine", minimum=0, auto=("auto",), example="2"), default="auto", metavar="N",
                   help="'auto' (default: refine while the backward error exceeds --tol) or exactly N "
                        "Newton-Schulz steps (0: none)")
    p.add_argument("--tol", type=ui.number_arg("--tol", positive=True, example="1e-10"), help="target backward error ||I - A X||_F / (||A||_F ||X||_F)")
    p.add_argument("--precision", choices=("mixed", "tf32", "float32", "float64", "fp16", "bf16"),
                   help="mixed: invert in float32, refine to float64; tf32: the same with TF32 GEMMs on a GPU; "
                        "fp16/bf16: A X = I by an LU with 16-bit GEMM inputs and GMRES-IR (see blocklin solve)")
    p.add_argument("--method", choices=("auto", "lu", "schur"), default="auto",
                   help="out-of-core route: auto (default: lu, or schur where two LU panels do not fit), lu "
                        "(pivoted LU, LAPACK's accuracy), schur (pivot-free recursion, all GEMMs)")
    ui.add_run_options(p, unit="tile tasks",
                       resume="continue an interrupted run (same input, output and options): finished steps are "
                              "skipped")
    ui.add_common(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> dict:
    from blocklin.linalg.inverse.inverse import inv

    refine = args.refine
    kwargs = dict(refine=refine, max_refine=refine if isinstance(refine, int) else 10, tol=args.tol,
                  precision=args.precision, method=args.method, **ui.run_settings(args))
    if args.explain:
        plan = inv(args.a, out=args.out, explain=True, **kwargs)
        summary = {"plan": plan.to_dict()}
        ui.emit(args, summary, plan.explain(device=ui.plan_device(args, plan)))
        return summary
    x = inv(args.a, out=args.out, **kwargs)
    r = x.report
    summary = {"output": x.path, "shape": list(x.shape), "dtype": x.dtype.name, "seconds": r["seconds"],
               "backward_error": r["backward_error"], "residual": r["residual"],
               "residual_method": r["residual_method"], "tol": r["tol"], "refine_steps": r["refine_steps"],
               "cond_estimate": r["cond_estimate"], "passes": r.get("passes", 0), "peak_memory": r["peak_memory"],
               "gemm_steps": r["gemm_steps"], "leaves": r["leaves"], "method": r.get("method"), "history": r["history"],
               "scheduler": r["scheduler"], "device": r["device"], "resumed": r["resumed"],
               "stages_skipped": r["stages_skipped"]}
    eq = r.get("equilibration")
    if eq is not None:
        summary["equilibration"] = eq
    human = (f"wrote {x.path} ({x.shape[0]} x {x.shape[1]} {x.dtype.name}) in {r['seconds']:.2f} s (method "
             f"{r.get('method')}): backward error "
             f"{r['backward_error']:.2e} ({r['residual_method']}, tol {r['tol']:.1e}) after {r['refine_steps']} "
             f"Newton-Schulz step(s); condition estimate {r['cond_estimate']:.1e}; peak memory "
             f"{format_size(r['peak_memory'])}"
             + (f"; resumed ({r['stages_skipped']} finished step(s) skipped)" if r["resumed"] else "")
             + (f"; equilibrated by powers of two (rows 2^{eq['row_exponents'][0]}..2^{eq['row_exponents'][1]}, "
                f"columns 2^{eq['column_exponents'][0]}..2^{eq['column_exponents'][1]}): the backward error and "
                "condition estimate are those of R A C" if eq and eq.get("applied") else ""))
    summary.update(ui.feed_summary(r))
    ui.emit(args, summary, ui.report_text(human, r))
    return summary
