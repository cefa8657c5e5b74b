"""``blocklin calibrate``: measure this machine's feed, write and GEMM rates and cache them.

The rates are what ``--explain`` turns a plan's bytes and flops into expected seconds with
(:mod:`blocklin.plan.rates`); without a measurement plans use conservative defaults.
"""

from __future__ import annotations

import argparse
from typing import Any

_EPILOG = """Writes a store of SIZE under the temp dir (--temp-dir, BLOCKLIN_TEMP_DIR) with blocklin's
writer, drops its pages from the page cache where the OS allows, reads it back twice with blocklin's
reader (from storage, then from the page cache), removes it, and times one GEMM per dtype on the CPU
(and the GPU where there is one). The rates are cached in $XDG_CACHE_HOME/blocklin/rates.json
(~/.cache/blocklin/rates.json), keyed by hostname, core count and device.

examples:
  blocklin calibrate
  blocklin calibrate --size 64MiB --temp-dir /scratch/tmp
  blocklin calibrate --show"""


def _size_arg(text: str) -> int:
    from blocklin.cli.ui import _without_name
    from blocklin.config import parse_size
    from blocklin.errors import ConfigError, explain

    try:
        value = parse_size(text, "--size")
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(_without_name(str(exc), "--size")) from None
    if value < 2**20:
        raise argparse.ArgumentTypeError(_without_name(explain(
            "--size", "must be at least 1MiB (smaller stores time the file system's latency, not its rate)",
            text, "pass --size 256MiB (the default) or --size 16MiB for a quick look"), "--size"))
    return value


_size_arg.__name__ = "size"


def register(sub: argparse._SubParsersAction) -> None:
    from blocklin.cli import ui

    p = sub.add_parser("calibrate", help="measure and cache this machine's feed, write and GEMM rates",
                       description="Measure how fast blocklin reads and writes a store here and how fast the "
                                   "devices multiply, print the rates and cache them for --explain.",
                       epilog=_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--size", metavar="SIZE", type=_size_arg, default=256 * 2**20,
                   help="bytes of the store written and read back (default 256MiB)")
    p.add_argument("--gemm-size", metavar="N", dest="gemm_size",
                   type=ui.count_arg("--gemm-size", example="2048", maximum=65536),
                   help="side of the timed GEMM (default 2048 on the CPU, 8192 on a GPU)")
    p.add_argument("--show", action="store_true", help="print the cached rates and measure nothing")
    ui.add_common(p, memory=False, device=True, scheduler=False, output=False)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> dict:
    return _show(args) if args.show else _measure(args)


def _measure(args: argparse.Namespace) -> dict:
    import os
    import uuid
    from datetime import datetime, timezone

    import numpy as np

    from blocklin.cli import ui
    from blocklin.config import format_size, resolve
    from blocklin.device import get_device
    from blocklin.device.calibrate import DEFAULT_SIDE, gpu_name, measure_gemm_rates, measure_gflops
    from blocklin.device.select import resolved_kind
    from blocklin.operands import temp_root
    from blocklin.plan.rates import Rates, machine_key, save_rates
    from blocklin.storage.ownership import end_work_folder, start_work_folder
    from blocklin.storage.probe import measure_storage

    cfg = resolve(device=args.device)
    kind = resolved_kind(cfg.device)
    gpu = get_device("gpu") if kind == "gpu" else None  # a missing GPU fails here, before any write
    folder = temp_root(cfg) / f"blocklin-calibrate-{uuid.uuid4().hex[:12]}"
    try:  # started inside: an interrupt while the folder is being made still removes it
        start_work_folder(folder, operation="calibrate")  # a killed run's folder is swept like a job's
        io = measure_storage(folder, args.size, threads=min(2, os.cpu_count() or 1), codec="none")
    finally:
        end_work_folder(folder)
    cpu = get_device("cpu")
    side = args.gemm_size
    flops = {f"cpu_gflops{s}": measure_gflops(cpu, dt, side or DEFAULT_SIDE["cpu"])
             for s, dt in (("", np.float64), ("32", np.float32))}
    device = "cpu"
    if gpu is not None:
        device = f"gpu {gpu_name()}"
        got = measure_gemm_rates(gpu, side or DEFAULT_SIDE["gpu"])  # the roofline's rates too (TF32)
        flops.update(gpu_gflops=got["float64"], gpu_gflops32=got["float32"], gpu_gflops_tf32=got["tf32"])
    rates = Rates(feed_gbps=io.read_gbps, write_gbps=io.write_gbps, cached_feed_gbps=io.cached_read_gbps,
                  measured=datetime.now(timezone.utc).isoformat(timespec="seconds"), key=machine_key(device), **flops)
    path = save_rates(rates)
    summary = {"path": str(path), "key": rates.key, "rates": rates.to_dict(),
               "storage": {"location": folder.url, "bytes": io.nbytes, "pages_dropped": io.evicted,
                           "threads": io.threads}}
    where = "from storage (pages dropped first)" if io.evicted else "(the OS kept its pages: not dropped)"
    lines = [f"measured on {rates.key}, {format_size(io.nbytes)} under {temp_root(cfg).url}:",
             f"  feed   {io.read_gbps:.2f} GB/s {where}, {io.cached_read_gbps:.2f} GB/s from the page cache "
             f"({io.threads} loader thread(s))",
             f"  write  {io.write_gbps:.2f} GB/s",
             _gflops_line("cpu", rates.cpu_gflops, rates.cpu_gflops32, side or DEFAULT_SIDE["cpu"])]
    if gpu is not None:
        lines.append(_gflops_line("gpu", rates.gpu_gflops, rates.gpu_gflops32, side or DEFAULT_SIDE["gpu"])
                     + f", {rates.gpu_gflops_tf32:.1f} TF32")
    lines.append(f"cached in {path}")
    ui.emit(args, summary, "\n".join(lines))
    return summary


def _gflops_line(device: str, f64: float | None, f32: float | None, side: int | None = None) -> str:
    if not f64:
        return f"  {device:<6} not measured"
    return (f"  {device:<6} {f64:.1f} GFLOP/s float64, {f32:.1f} float32"
            + (f" ({side} x {side} GEMM)" if side else ""))


def _show(args: argparse.Namespace) -> dict:
    from blocklin.cli import ui
    from blocklin.plan.rates import Rates, cache_path, load_rates, machine_key, read_cache

    path = cache_path()
    entries = read_cache(path)  # a broken file is an error here (plans fall back to the defaults)
    current = load_rates()
    summary: dict[str, Any] = {"path": str(path), "machines": entries, "current": current.to_dict(),
                               "source": current.source}
    lines = [f"rates cached in {path}:" if entries else f"no rates cached in {path}"]
    for key, entry in sorted(entries.items()):
        try:
            r = Rates.from_dict(entry)
        except Exception as exc:  # noqa: BLE001 - an entry a newer or older blocklin wrote
            lines.append(f"  {key}: unreadable ({exc})")
            continue
        lines.append(f"  {key} (measured {r.measured}): feed {r.feed_gbps:.2f} GB/s, write {r.write_gbps:.2f} GB/s")
        lines.append(_gflops_line("cpu", r.cpu_gflops, r.cpu_gflops32))
        if r.gpu_gflops:
            lines.append(_gflops_line("gpu", r.gpu_gflops, r.gpu_gflops32)
                         + (f", {r.gpu_gflops_tf32:.1f} TF32" if r.gpu_gflops_tf32 else ""))
        if r.raw_feed_gbps:
            lines.append(f"  raw feed limit {r.raw_feed_gbps:.2f} GB/s (benchmarks/gpu_check.py: the roofline's)")
    lines.append(f"plans on {machine_key('')[:-1]} use the {current.source}: feed {current.feed_gbps:.2f} GB/s, "
                 f"write {current.write_gbps:.2f} GB/s, cpu {current.cpu_gflops:.1f} GFLOP/s float64"
                 + ("" if current.measured else " (run `blocklin calibrate` to measure them)"))
    ui.emit(args, summary, "\n".join(lines))
    return summary
