"""GEMM benchmark: blocklin out of core vs NumPy in memory vs dask.array, on the same zarr inputs.

Usage::

    python benchmarks/gemm.py [--n 8192] [--memory 1GiB] [--dir bench-data] [--codecs none,zstd] [--repeat 3]

Each variant runs in its own subprocess (so peak RSS is its own): NumPy loads A and B, multiplies,
stores C (end to end) and also reports the matmul alone; dask.array runs ``(A @ B).to_zarr``;
blocklin runs ``matmul`` with the given host budget. Printed: seconds, GFLOP/s, peak RSS, max error
against NumPy's result, and the ratios blocklin/NumPy and blocklin/Dask (higher is better). Each
blocklin run follows a run of NumPy's in-memory ``A @ B`` alone in its own subprocess, so that both
see the same load; with ``--repeat N`` the median of the N ratios is printed.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import textwrap
import time

CHILD = textwrap.dedent(r"""
import json, resource, sys, time
import numpy as np
variant, a_path, b_path, out, memory, ref = sys.argv[1:7]
import zarr
import dask.array as da  # imports happen before the clock starts, for every variant
import blocklin as bl
def peak():
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
res = {}
t0 = time.perf_counter()
if variant == "blas":  # NumPy's in-memory A @ B alone, run next to each blocklin run
    a = zarr.open_array(a_path, mode="r")[...]
    b = zarr.open_array(b_path, mode="r")[...]
    t0 = time.perf_counter()
    c = a @ b
    res["matmul_seconds"] = time.perf_counter() - t0
elif variant == "numpy":
    a = zarr.open_array(a_path, mode="r")[...]
    b = zarr.open_array(b_path, mode="r")[...]
    t1 = time.perf_counter()
    c = a @ b
    t2 = time.perf_counter()
    z = zarr.create_array(store=out, shape=c.shape, chunks=zarr.open_array(a_path).chunks, dtype=c.dtype,
                          compressors=zarr.open_array(a_path).compressors or None, overwrite=True)
    z[...] = c
    res["matmul_seconds"] = t2 - t1
elif variant == "dask":
    a = da.from_zarr(a_path)
    b = da.from_zarr(b_path)
    (a @ b).to_zarr(out, overwrite=True)
elif variant == "blocklin":
    c = bl.matmul(a_path, b_path, out, memory=memory, overwrite=True)
    res["plan"] = {k: c.report["plan"][k] for k in ("tm", "tn", "tk", "n_tasks", "peak_memory", "workers")}
    res["load_seconds"] = c.report["load_seconds"]
    res["wait_seconds"] = c.report["wait_seconds"]
res["seconds"] = time.perf_counter() - t0
res["peak"] = peak()
if ref != "-":
    got = zarr.open_array(out, mode="r")
    want = zarr.open_array(ref, mode="r")
    err = 0.0
    step = got.chunks[0]
    for r0 in range(0, got.shape[0], step):
        err = max(err, float(np.abs(got[r0:r0 + step] - want[r0:r0 + step]).max()))
    res["max_error"] = err
print(json.dumps(res))
""")


def run(variant, a, b, out, memory, ref="-"):
    proc = subprocess.run([sys.executable, "-c", CHILD, variant, a, b, out, memory, ref], capture_output=True,
                          text=True)
    if proc.returncode != 0:
        raise SystemExit(f"{variant} failed:\n{proc.stderr}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--n", type=int, default=8192)
    p.add_argument("--memory", default="1GiB")
    p.add_argument("--dir", default="bench-data")
    p.add_argument("--codecs", default="none,zstd")
    p.add_argument("--chunks", type=int, default=1024)
    p.add_argument("--keep", action="store_true")
    p.add_argument("--repeat", type=int, default=1,
                   help="blocklin runs, each right after a run of A @ B alone; the median ratio is printed")
    args = p.parse_args()
    import blocklin as bl

    os.makedirs(args.dir, exist_ok=True)
    n = args.n
    flops = 2.0 * n**3
    rows = []
    try:
        for codec in args.codecs.split(","):
            d = os.path.join(args.dir, f"gemm-{n}-{codec}")
            a = os.path.join(d, "A.zarr")
            b = os.path.join(d, "B.zarr")
            if not os.path.exists(b):
                os.makedirs(d, exist_ok=True)
                t = time.perf_counter()
                bl.random(a, (n, n), seed=1, chunks=(args.chunks, args.chunks), codec=codec, overwrite=True)
                bl.random(b, (n, n), seed=2, chunks=(args.chunks, args.chunks), codec=codec, overwrite=True)
                print(f"[{codec}] generated inputs in {time.perf_counter() - t:.1f} s", flush=True)
            ref = os.path.join(d, "C_numpy.zarr")
            results = {"numpy": run("numpy", a, b, ref, args.memory)}
            results["dask"] = run("dask", a, b, os.path.join(d, "C_dask.zarr"), args.memory, ref)
            pairs = []  # (BLAS alone, blocklin) in adjacent subprocesses: same load for both
            for _ in range(max(1, args.repeat)):
                alone = run("blas", a, b, "-", args.memory)
                got = run("blocklin", a, b, os.path.join(d, "C_blocklin.zarr"), args.memory, ref)
                pairs.append((flops / alone["matmul_seconds"] / 1e9, got, os.getloadavg()[0]))
            pairs.sort(key=lambda p: flops / p[1]["seconds"] / 1e9 / p[0])
            blas_rate, results["blocklin"], _ = pairs[len(pairs) // 2]  # the median ratio's pair
            for name, r in results.items():
                r["gflops"] = flops / r["seconds"] / 1e9
                rows.append((codec, name, r))
            bl_rate = results["blocklin"]["gflops"]
            print(f"\n[{codec}] n={n} float64, budget {args.memory} for blocklin")
            print(f"{'variant':10s} {'seconds':>8s} {'GFLOP/s':>8s} {'peak MiB':>9s} {'max err':>9s}")
            for name, r in results.items():
                print(f"{name:10s} {r['seconds']:8.2f} {r['gflops']:8.1f} {r['peak'] / 2**20:9.0f} "
                      f"{r.get('max_error', 0.0):9.1e}")
            np_mm = flops / results["numpy"]["matmul_seconds"] / 1e9
            print(f"numpy matmul alone: {np_mm:.1f} GFLOP/s (in the numpy run)")
            for alone, got, load in pairs:
                rate = flops / got["seconds"] / 1e9
                print(f"pair: A @ B alone {alone:.1f} GFLOP/s, blocklin {rate:.1f} GFLOP/s, ratio {rate / alone:.2f}x"
                      f" (load average {load:.2f})")
            print(f"ratio blocklin/numpy end-to-end: {bl_rate / results['numpy']['gflops']:.2f}x  "
                  f"blocklin/dask: {bl_rate / results['dask']['gflops']:.2f}x  "
                  f"blocklin/matmul-alone (median of {len(pairs)} adjacent pairs): {bl_rate / blas_rate:.2f}x")
            print(f"blocklin plan: {results['blocklin']['plan']}, prefetch wait "
                  f"{results['blocklin']['wait_seconds']:.2f} s of {results['blocklin']['load_seconds']:.2f} s loading",
                  flush=True)
            for name in ("C_numpy.zarr", "C_dask.zarr", "C_blocklin.zarr"):
                shutil.rmtree(os.path.join(d, name), ignore_errors=True)
        print(json.dumps([{"codec": c, "variant": v, **r} for c, v, r in rows], default=str))
    finally:
        if not args.keep:
            shutil.rmtree(args.dir, ignore_errors=True)


if __name__ == "__main__":
    main()
