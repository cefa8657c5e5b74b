"""``blocklin update OUT``: a result brought up to date after rows were appended to its inputs."""

from __future__ import annotations

import argparse

from blocklin.cli import ui
from blocklin.config import format_size


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("update", help="bring a result up to date with rows appended to its inputs",
                       description="Update OUT (a result blocklin wrote) by reading only the rows appended to its "
                                   "inputs since it was computed ('blocklin append'); rewritten atomically. A "
                                   "result that cannot be updated is refused with the command that recomputes it.")
    p.add_argument("out", metavar="OUT", help="result to update (path or URL)")
    ui.add_run_options(p, resume="continue an interrupted update (identical result)", explain=False)
    ui.add_common(p, output=False)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> dict:
    from blocklin.linalg.update import update

    result = update(args.out, **ui.run_settings(args))
    r = result.report
    done = r.get("updated")
    summary = {"output": args.out, "updated": done, "current": r.get("current", False)}
    if hasattr(result, "shape"):
        summary["shape"] = list(result.shape)
    else:  # a factorization: (U, s, Vt), or a PCA (its factors .svd, its variances)
        fit = getattr(result, "svd", None)
        summary["s"] = [float(x) for x in (fit if fit is not None else result).s]
        if fit is not None:
            summary.update(explained_variance=[float(x) for x in result.explained_variance_],
                           explained_variance_ratio=[float(x) for x in result.explained_variance_ratio_],
                           noise_variance=float(result.noise_variance_), n_samples=int(result.n_samples_))
        for key in ("relative_residuals", "u_errors", "converged"):
            if key in r:
                summary[key] = r[key]
    if done is None:
        ui.emit(args, summary, f"{args.out} is up to date: nothing to read")
        return summary
    summary.update({k: r[k] for k in ("seconds", "bytes_read", "bytes_written", "peak_memory", "passes") if k in r})
    human = (f"updated {args.out} from rows {done['rows_before']}:{done['rows']} of {done['input']} "
             f"({done['how']}) in {r['seconds']:.2f} s: read {format_size(r['bytes_read'])}, "
             f"peak memory {format_size(r['peak_memory'])}")
    ui.emit(args, summary, human)
    return summary
