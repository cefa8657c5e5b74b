"""The svd's methods on a stored float32 matrix against the feed of that matrix (issue 24's float32 goal).

For each shape, a float32 matrix is written by ``blocklin.random`` (uncompressed zarr, its peaks
recorded) and, in one process, alternated round by round:

* ``feed``: a job's first row pass of a null kernel over it (``benchmarks/feed.py``'s reader, with
  each column's peak taken from the record as an SVD's first pass does), and a later pass;
* ``svd(path, k, method=m, memory=...)`` for each method (default ``sketch``, ``gram``, ``lanczos``),
  with its report's passes over ``A``, bytes read and written.

Printed per method: the median seconds, its ratio to the feed time of the matrix (the goal: 1.25x for
the sketch and the Gram route), and to the feed time of every byte the method reads at the later
pass's rate (how far it is from being bound by its reads). ``--gil`` adds each method run with every
host BLAS call through SciPy's wrappers, which hold the GIL (``blocklin.device.host_blas`` off), in
the same rounds. A JSON line ends the output. Usage::

    python -P benchmarks/svd_feed.py                                  # 4194304 x 64 and 524288 x 512 (1 GiB each)
    python -P benchmarks/svd_feed.py --shapes 1048576x64 --rounds 5 --gil
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import blocklin as bl
from blocklin.config import parse_size
from blocklin.device import host_blas


def _feed_module() -> Any:
    spec = importlib.util.spec_from_file_location("feed_benchmark", Path(__file__).with_name("feed.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _shape(s: str) -> tuple[int, int]:
    m, n = s.lower().split("x")
    return int(m), int(n)


def run_method(path: str, k: int, method: str, memory: str, gil: bool) -> dict:
    """One ``svd`` run: seconds and the report's passes and bytes; ``gil``: host BLAS through SciPy's wrappers."""
    kept = host_blas._STATE.get("lib")
    if gil:
        host_blas._STATE["lib"] = None  # every call through the wrappers (read at each call)
    try:
        t0 = time.perf_counter()
        res = bl.svd(path, k, method=method, memory=memory, seed=0)
        seconds = time.perf_counter() - t0
    finally:
        host_blas._STATE["lib"] = kept
    rep = res.report
    out = rep.get("output")
    if isinstance(out, str) and os.path.basename(out).startswith("blocklin-svd-"):
        shutil.rmtree(out, ignore_errors=True)
    return {"seconds": seconds, "passes": rep.get("passes"), "bytes_read": rep.get("bytes_read"),
            "bytes_written": rep.get("bytes_written"), "bound": rep.get("bound"), "converged": rep.get("converged")}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shapes", default="4194304x64,524288x512", help="comma-separated MxN (default: 1 GiB each)")
    p.add_argument("--memory", default="128MiB", help="blocklin's budget (default 128MiB)")
    p.add_argument("-k", type=int, default=10)
    p.add_argument("--methods", default="sketch,gram,lanczos")
    p.add_argument("--rounds", type=int, default=3, help="alternated rounds; medians count (default 3)")
    p.add_argument("--gil", action="store_true", help="also run each method with SciPy's BLAS wrappers (GIL held)")
    p.add_argument("--dir", default=None, help="where to store the matrices (default: a temp dir)")
    p.add_argument("--quick", action="store_true", help="a seconds-long run at small sizes (checks the script)")
    args = p.parse_args(argv)
    if args.quick:
        args.shapes, args.memory, args.rounds, args.k = "16384x32", "1MiB", 1, 3
    feed = _feed_module()
    methods = [m for m in args.methods.split(",") if m]
    variants = [(m, False) for m in methods] + ([(m, True) for m in methods] if args.gil else [])
    memory = parse_size(args.memory)
    work = tempfile.mkdtemp(prefix="blocklin-svd-feed-", dir=args.dir)
    summary: dict[str, Any] = {"memory": args.memory, "k": args.k, "rounds": args.rounds, "cores": os.cpu_count(),
                               "load_average": list(os.getloadavg()),
                               "host_blas": host_blas.library() is not None, "shapes": {}}
    try:
        for spec in args.shapes.split(","):
            m, n = _shape(spec)
            path = os.path.join(work, f"a{m}x{n}.zarr")
            bl.random(path, (m, n), dtype="float32", seed=1, memory=args.memory)
            nbytes = m * n * 4
            times: dict[str, list[float]] = {}
            runs: dict[str, dict] = {}
            run_method(path, args.k, methods[0], args.memory, False)  # warm-up: imports, page cache
            for _ in range(args.rounds):
                t0 = time.perf_counter()
                first = feed.blocklin_feed(path, memory, "cpu", columns=True)
                times.setdefault("feed", []).append(time.perf_counter() - t0)
                later = feed.blocklin_feed(path, memory, "cpu", later=True)
                times.setdefault("feed_later", []).append(later["seconds"])
                for method, gil in variants:
                    name = method + (" (GIL held)" if gil else "")
                    r = run_method(path, args.k, method, args.memory, gil)
                    times.setdefault(name, []).append(r["seconds"])
                    runs[name] = r
            med = {name: statistics.median(v) for name, v in times.items()}
            later_rate = nbytes / med["feed_later"]
            entry = {"bytes": nbytes, "recorded": first["recorded"], "feed_seconds": med["feed"],
                     "feed_later_seconds": med["feed_later"], "methods": {}}
            print(f"-- {m} x {n} float32 ({nbytes / 2**30:.2f} GiB), memory {args.memory}, k = {args.k}, "
                  f"medians of {args.rounds} rounds")
            print(f"feed: a job's first pass {med['feed']:.3f} s ({nbytes / med['feed'] / 1e9:.2f} GB/s"
                  f"{', peaks recorded' if first['recorded'] else ''}), a later pass {med['feed_later']:.3f} s")
            for name, r in runs.items():
                s = med[name]
                reads = (r["bytes_read"] or 0) / later_rate
                entry["methods"][name] = {**r, "seconds": s, "all": times[name], "of_feed": s / med["feed"],
                                          "of_reads": s / reads if reads else None}
                print(f"{name:22s} {s:7.3f} s  {s / med['feed']:6.1f}x the feed   "
                      f"{s / reads if reads else float('nan'):5.1f}x its reads' feed ({r['passes']} passes over A, "
                      f"{(r['bytes_read'] or 0) / 2**30:.2f} GiB read, {(r['bytes_written'] or 0) / 2**30:.2f} GiB "
                      f"written, bound: {r['bound']})")
            summary["shapes"][f"{m}x{n}"] = entry
            shutil.rmtree(path)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
