"""``blocklin append A NEW``: rows appended to a stored matrix, atomically (``--rollback`` undoes an interrupted one)."""

from __future__ import annotations

import argparse

from blocklin.cli import ui
from blocklin.config import format_size
from blocklin.errors import ParameterError, explain

_EPILOG = """examples:
  blocklin append A.zarr day2.npy                 # any format convert reads: .npy, .zarr, .h5:/X, .csv, ...
  blocklin append A.zarr new.csv --skip-rows 1
  blocklin append S.zarr day2.mtx                 # a sparse matrix (blocklin-csr): .mtx, .npz, .h5:/GROUP, S2.zarr
  blocklin update G.zarr                          # then bring results of A up to date from the new rows
  blocklin append --rollback A.zarr               # undo an append that was interrupted"""


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("append", help="append rows to a stored matrix (atomically, in bounded memory)",
                       description="Append the rows of NEW (any format blocklin converts) to the zarr matrix A. "
                                   "Readers see the old or the new matrix, never a mix; A records each version, "
                                   "so 'blocklin update' can bring results up to date by reading the new rows only.",
                       epilog=_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("a", metavar="A", help="zarr matrix blocklin wrote (path or URL)")
    p.add_argument("rows", metavar="NEW", nargs="?", help="rows to append (FILE.npz:NAME, FILE.h5:/DATASET for members)")
    p.add_argument("--rollback", action="store_true", help="remove what an interrupted append of A wrote instead")
    p.add_argument("--from", dest="from_format", metavar="FMT", help="format of NEW (default from the extension)")
    p.add_argument("--shape", metavar="R,C", type=ui.pair_arg("--shape", example="1000,500"), help="raw NEW: shape")
    p.add_argument("--dtype", metavar="DTYPE", help="raw NEW: dtype; CSV: parse dtype")
    p.add_argument("--order", choices=("C", "F"), type=str.upper, help="raw NEW: order")
    p.add_argument("--offset", type=ui.count_arg("--offset", minimum=0, example="0"), default=0,
                   help="raw NEW: header bytes to skip")
    p.add_argument("--delimiter", metavar="CHAR", help="CSV delimiter")
    p.add_argument("--skip-rows", type=ui.count_arg("--skip-rows", minimum=0, example="1"), metavar="N",
                   help="CSV lines to skip")
    p.add_argument("--nan", choices=("allow", "error"), default="allow", help="NaN values: store (default) or fail")
    ui.add_common(p, device=False, scheduler=False, output=False)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> dict:
    from blocklin.storage.append import append, rollback

    if args.rollback:
        if args.rows:
            raise ParameterError(explain("--rollback", "takes only A (it undoes the interrupted append of A)",
                                         f"NEW {args.rows!r} too", f"blocklin append --rollback {args.a}"))
        r = rollback(args.a)
        summary = {"matrix": args.a, **r}
        human = (f"rolled back the interrupted append of {args.a}: removed {r['removed']} chunk files; "
                 f"{r['rows']} rows" if r["interrupted"] else f"{args.a}: no interrupted append, nothing to roll back")
        ui.emit(args, summary, human)
        return summary
    if not args.rows:
        raise ParameterError(explain("NEW", "is required: the rows to append", "none",
                                     f"blocklin append {args.a} NEW (or --rollback to undo an interrupted append)"))
    opts = {k: getattr(args, k) for k in ("shape", "dtype", "order", "delimiter", "skip_rows")
            if getattr(args, k, None) is not None}
    if args.offset:
        opts["offset"] = args.offset
    m = append(args.a, args.rows, memory=args.memory, progress=ui.progress_arg(args), nan=args.nan,
               from_format=args.from_format, **opts)
    r = m.report
    summary = {"matrix": str(m.path), "shape": list(m.shape), **{k: r[k] for k in ("rows_before", "rows_added",
                                                                                    "version", "bytes_written",
                                                                                    "seconds")}}
    human = (f"appended {r['rows_added']} rows to {m.path}: {r['rows_before']} -> {m.shape[0]} x {m.shape[1]} "
             f"(version {r['version']}), wrote {format_size(r['bytes_written'])} in {r['seconds']:.2f} s")
    ui.emit(args, summary, human)
    return summary
