"""``blocklin convert IN OUT``: matrix files to chunked zarr and back, in bounded memory."""

from __future__ import annotations

import argparse

from blocklin.cli import ui
from blocklin.config import format_size

_EPILOG = """formats (by extension, or --from/--to): .npy, FILE.npz:NAME (read), .mtx, FILE.h5:/DATASET,
FILE.h5:/GROUP (read: a CSR/CSC group of anndata, 10x Genomics or h5sparse, written sparse), raw binary (.bin/.raw, with --shape --dtype --order --offset), .csv/.tsv/.txt, zarr v2/v3 folders.

examples:
  blocklin convert A.npy A.zarr --memory 512MiB
  blocklin convert A.zarr B.zarr --chunks 4096,4096 --codec zstd --checksum
  blocklin convert data.bin A.zarr --shape 20000,10000 --dtype f8 --order F --offset 0
  blocklin convert table.csv A.zarr --skip-rows 1 --delimiter ';'
  blocklin convert A.zarr A.mtx
  blocklin convert sparse.mtx S.zarr --memory 256MiB   # coordinate file: a sparse blocklin-csr group
  blocklin convert sparse.mtx D.zarr --dense            # ... or densified into a zarr array
  blocklin convert S.zarr S.mtx                          # a sparse group back to coordinate (or .npz)
  blocklin convert data.h5ad:/X S.zarr --memory 256MiB   # an HDF5 CSR/CSC group: a sparse group
  blocklin convert m.h5:/M S.zarr --sparse-format csc    # ... whose attributes do not say CSR or CSC
  blocklin convert A.zarr results.h5:/A --overwrite   # replaces dataset /A only (a file blocklin created)"""


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("convert", help="convert, rechunk or export matrix files in bounded memory",
                       description="Convert a matrix file into chunked zarr (or back out), rechunk or re-encode "
                                   "a zarr array, within the memory budget. The output appears only when complete.",
                       epilog=_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("input", metavar="IN", help="input file (FILE.npz:NAME, FILE.h5:/DATASET for members)")
    p.add_argument("output", metavar="OUT", help="output path (.zarr, .npy, .mtx, .h5, .bin, .csv, .tsv)")
    p.add_argument("--from", dest="from_format", metavar="FMT", help="input format (npy, npz, mtx, hdf5, raw, csv, "
                                                                       "tsv, zarr); default from the extension")
    p.add_argument("--to", dest="to_format", metavar="FMT", help="output format; default from the extension")
    p.add_argument("--chunks", default="auto", type=ui.pair_arg("--chunks", auto=("auto",), example="4096,4096"), metavar="R,C|auto", help="output chunks (default: auto, sized for "
                                                                        "the engine's tiles and the budget)")
    p.add_argument("--dtype", metavar="DTYPE", help="output dtype (default: the input's); for raw input also the "
                                                    "file's dtype; for CSV the parse dtype")
    p.add_argument("--in-dtype", metavar="DTYPE", help="raw/CSV input dtype when it differs from --dtype")
    p.add_argument("--codec", metavar="NAME", help="zarr compression: none, zstd, blosc-lz4, blosc-zstd, gzip "
                                                   "(default: config, none)")
    p.add_argument("--checksum", action="store_true", help="crc32c checksum on every zarr chunk, verified on read")
    p.add_argument("--resume", action="store_true", help="continue an interrupted conversion (zarr output)")
    p.add_argument("--shape", metavar="R,C", type=ui.pair_arg("--shape", example="20000,10000"), help="raw input shape")
    p.add_argument("--order", choices=("C", "F"), type=str.upper, help="raw input order (default C)")
    p.add_argument("--out-order", choices=("C", "F"), type=str.upper, help=".npy/raw output order "
                                                                           "(default: the input's)")
    p.add_argument("--offset", type=ui.count_arg("--offset", minimum=0, example="0"), default=0, metavar="N", help="raw input header bytes to skip")
    p.add_argument("--delimiter", metavar="CHAR", help="CSV delimiter (default by extension; 'tab', 'whitespace')")
    p.add_argument("--skip-rows", type=ui.count_arg("--skip-rows", minimum=0, example="1"), metavar="N", help="CSV lines to skip before the data")
    hdr = p.add_mutually_exclusive_group()
    hdr.add_argument("--header", dest="header", action="store_const", const=True, default="auto",
                     help="the first CSV line is a header (default: detected)")
    hdr.add_argument("--no-header", dest="header", action="store_const", const=False,
                     help="the first CSV line is data")
    p.add_argument("--nan", choices=("allow", "error"), default="allow", help="NaN values: copy (default) or fail")
    lay = p.add_mutually_exclusive_group()
    lay.add_argument("--dense", dest="layout", action="store_const", const="dense", default="auto",
                     help="write a coordinate .mtx densely into a zarr array (default: a sparse group)")
    lay.add_argument("--sparse", dest="layout", action="store_const", const="sparse",
                     help="insist on a sparse output (refused for dense sources)")
    p.add_argument("--sparse-format", choices=("csr", "csc"), help="an HDF5 sparse group (FILE.h5:/GROUP with "
                   "data, indices, indptr) compresses rows (csr) or columns (csc); for groups whose attributes "
                   "do not say")
    ui.add_common(p, device=False, scheduler=False)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> dict:
    from blocklin.storage.convert import convert

    r = convert(args.input, args.output, chunks=args.chunks, dtype=args.dtype, in_dtype=args.in_dtype,
                codec=args.codec, checksum=args.checksum, memory=args.memory, overwrite=args.overwrite,
                resume=args.resume, from_format=args.from_format, to_format=args.to_format, shape=args.shape,
                order=args.order, out_order=args.out_order, offset=args.offset, delimiter=args.delimiter,
                skip_rows=args.skip_rows, header=args.header, nan=args.nan, progress=ui.progress_arg(args),
                layout=args.layout, sparse_format=args.sparse_format)
    if r.get("layout") == "sparse":
        return _sparse_summary(args, r)
    summary = {k: v for k, v in r.items() if k != "plan"}
    summary["plan"] = {k: r["plan"][k] for k in ("order", "block", "n_blocks", "peak_memory", "concurrency")}
    shape = " x ".join(str(s) for s in r["shape"])
    chunks = f", chunks {r['chunks'][0]} x {r['chunks'][1]}" if r.get("chunks") else ""
    resumed = f", {r['blocks_skipped']} of {r['blocks']} blocks already done" if r["blocks_skipped"] else ""
    human = (f"wrote {r['output']} ({shape} {r['dtype']}{chunks}, codec {r['codec']}) in {r['seconds']:.2f} s: "
             f"read {format_size(r['bytes_read'])}, wrote {format_size(r['bytes_written'])}, "
             f"peak memory {format_size(r['peak_memory'])} (plan {format_size(r['planned_memory'])} of "
             f"{format_size(r['memory'])}){resumed}")
    ui.emit(args, summary, human)
    return summary


def _sparse_summary(args: argparse.Namespace, r: dict) -> dict:
    """The report of a sparse conversion or export."""
    summary = {k: v for k, v in r.items() if k != "plan"}
    shape = " x ".join(str(s) for s in r["shape"])
    blocks = (f", {r['row_blocks']} row block{'s' * (r['row_blocks'] != 1)} from {r['runs']} "
              f"run{'s' * (r['runs'] != 1)}") if "row_blocks" in r else ""
    if "row_blocks" in r and not r["runs"] and r.get("from") == "hdf5":  # CSR: streamed, no sort
        blocks = f", {r['row_blocks']} row block{'s' * (r['row_blocks'] != 1)} streamed from CSR"
    planned = f" (plan {format_size(r['planned_memory'])} of {format_size(r['memory'])})" \
        if r.get("planned_memory") else ""
    human = (f"wrote {r['output']} ({shape} sparse {r['dtype']}, {r['nnz']} entries{blocks}) in "
             f"{r['seconds']:.2f} s: wrote {format_size(r['bytes_written'])}, peak memory "
             f"{format_size(r['peak_memory'])}{planned}")
    ui.emit(args, summary, human)
    return summary
