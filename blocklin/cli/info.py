"""``blocklin info PATH``: what a matrix file holds and what operating on it would cost."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:
    from blocklin.cli import ui

    p = sub.add_parser("info", help="shape, dtype, chunks, codec, sizes, provenance and cost estimates",
                       description="Describe a matrix file (any format blocklin converts) without reading its data: "
                                   "shape, dtype, order, chunks, codec, bytes on disk and in memory, compression "
                                   "ratio, blocklin provenance, and the memory and time the main operations would "
                                   "need with the current budget.")
    p.add_argument("path", metavar="PATH", help="file or zarr store (FILE.npz:NAME, FILE.h5:/DATASET)")
    p.add_argument("--from", dest="from_format", metavar="FMT", help="format (default from the extension)")
    p.add_argument("--shape", metavar="R,C", type=ui.pair_arg("--shape", example="20000,10000"), help="raw files: shape")
    p.add_argument("--dtype", metavar="DTYPE", help="raw files: dtype; CSV: parse dtype")
    p.add_argument("--order", choices=("C", "F"), type=str.upper, help="raw files: order")
    p.add_argument("--offset", type=ui.count_arg("--offset", minimum=0, example="0"), default=0, help="raw files: header bytes")
    p.add_argument("--delimiter", metavar="CHAR", help="CSV delimiter")
    p.add_argument("--skip-rows", type=ui.count_arg("--skip-rows", minimum=0, example="1"), metavar="N", help="CSV lines to skip")
    ui.add_common(p, device=False, scheduler=False, output=False)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> dict:
    from blocklin.cli import ui
    from blocklin.storage.inspect import format_info, inspect

    opts = {}
    for key in ("shape", "dtype", "order", "delimiter", "skip_rows"):
        if getattr(args, key, None) is not None:
            opts[key] = getattr(args, key)
    if args.offset:
        opts["offset"] = args.offset
    info = inspect(args.path, format=args.from_format, memory=args.memory, **opts)
    if (info.get("provenance") or {}).get("covers"):  # a result: is it up to date with its inputs?
        from blocklin.linalg.update.update import status

        info["current"] = status(args.path)
    ui.emit(args, info, format_info(info).replace("blocklin update PATH", f"blocklin update {args.path}"))
    return info
