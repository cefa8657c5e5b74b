"""One-command GPU check: correctness, out-of-core throughput vs in-core CuPy, overlap efficiency.

    python benchmarks/gpu_check.py                 # on a CUDA machine, under ~4 minutes
    python benchmarks/gpu_check.py --n 32768 --device-memory 8GiB
    python benchmarks/gpu_check.py --device cpu --n 2048   # smoke run of the same code on a CPU

Steps:
1. float32 and float64 GEMM through blocklin on the device versus NumPy (small sizes, several
   tile shapes, transposes, alpha/beta), with per-dtype tolerances.
2. Out-of-core throughput: float64 n x n operands larger than a set device budget, from zarr files
   on local disk (page cache warm), versus in-core ``cupy.matmul`` on the same sizes (operands
   uploaded first; synchronized before reading the clock).
3. Overlap efficiency: wall time versus the sum of transfer and compute time (``load_seconds`` +
   compute), as reported by the tile streams.
Exits 1 when a correctness check fails; prints one JSON line at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time

import numpy as np


def correctness(device: str, tmp: str) -> list[dict]:
    import blocklin as bl

    rng = np.random.default_rng(0)
    out = []
    for dtype, tol in (("float32", 5e-4), ("float64", 1e-11)):
        for (m, n, k), ta, tb in [((1000, 700, 900), False, False), ((513, 1025, 257), True, False),
                                  ((300, 200, 1500), False, True), ((1, 999, 333), True, True)]:
            a = rng.standard_normal((k, m) if ta else (m, k)).astype(dtype)
            b = rng.standard_normal((n, k) if tb else (k, n)).astype(dtype)
            c0 = rng.standard_normal((m, n)).astype(dtype)
            res = bl.matmul(a, b, os.path.join(tmp, f"c-{dtype}-{m}-{ta}{tb}.zarr"), c=c0, alpha=0.5, beta=-1.0,
                            trans_a=ta, trans_b=tb, device=device, memory="8MiB", device_memory="4MiB")
            ref = 0.5 * ((a.T if ta else a).astype(np.float64) @ (b.T if tb else b).astype(np.float64)) - c0
            err = float(np.abs(res.to_numpy() - ref).max() / max(1.0, np.abs(ref).max()))
            out.append({"dtype": dtype, "shape": [m, n, k], "trans": [ta, tb], "rel_error": err, "ok": err < tol,
                        "tasks": res.report["tasks"]})
    return out


def throughput(device: str, n: int, memory: str, device_memory: str, tmp: str) -> dict:
    import blocklin as bl

    a = bl.random(os.path.join(tmp, "A.zarr"), (n, n), seed=1, chunks=(2048, 2048))
    b = bl.random(os.path.join(tmp, "B.zarr"), (n, n), seed=2, chunks=(2048, 2048))
    flops = 2.0 * n**3
    plan = bl.matmul(a, b, memory=memory, device=device, device_memory=device_memory, explain=True)
    c = bl.matmul(a, b, os.path.join(tmp, "C.zarr"), memory=memory, device=device, device_memory=device_memory)
    ooc = flops / c.report["seconds"] / 1e9
    result = {"n": n, "out_of_core_seconds": c.report["seconds"], "out_of_core_gflops": ooc,
              "load_seconds": c.report["load_seconds"], "wait_seconds": c.report["wait_seconds"],
              "plan": plan.to_dict()}
    # Compute time is the wall time not spent waiting for data. Without overlap the wall time would be
    # load + compute; "hidden" is the fraction of load (disk read + host-to-device copy) time that ran
    # behind compute.
    wall = c.report["seconds"]
    load = c.report["load_seconds"]
    compute = max(1e-9, wall - c.report["wait_seconds"])
    result["wall_over_serial"] = wall / (load + compute)
    result["overlap_hidden_fraction"] = 1.0 - c.report["wait_seconds"] / load if load > 0 else 1.0
    if device == "gpu":
        import cupy as cp

        A = cp.asarray(a.to_numpy())
        B = cp.asarray(b.to_numpy())
        cp.matmul(A[:1024, :1024], B[:1024, :1024])
        cp.cuda.Device().synchronize()
        t = time.perf_counter()
        C = cp.matmul(A, B)
        cp.cuda.Device().synchronize()
        incore = flops / (time.perf_counter() - t) / 1e9
        del A, B, C
        cp.get_default_memory_pool().free_all_blocks()
    else:
        x, y = a.to_numpy(), b.to_numpy()
        t = time.perf_counter()
        x @ y
        incore = flops / (time.perf_counter() - t) / 1e9
    result["in_core_gflops"] = incore
    result["ratio_vs_in_core"] = ooc / incore
    return result


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="gpu", choices=("gpu", "cpu"))
    p.add_argument("--n", type=int, default=32768)
    p.add_argument("--memory", default="24GiB", help="host budget")
    p.add_argument("--device-memory", default="8GiB", help="device budget (smaller than the operands)")
    p.add_argument("--dir", default=None)
    args = p.parse_args()
    from blocklin.device.base import gpu_available

    if args.device == "gpu" and not gpu_available():
        print("gpu_check: no CUDA device visible to CuPy (pip install 'blocklin[gpu]' on a GPU machine)",
              file=sys.stderr)
        return 2
    tmp = tempfile.mkdtemp(prefix="blocklin-gpucheck-", dir=args.dir)
    try:
        t0 = time.perf_counter()
        checks = correctness(args.device, tmp)
        for c in checks:
            print(f"{c['dtype']:8s} {str(c['shape']):20s} trans={c['trans']} rel.err {c['rel_error']:.1e} "
                  f"{'ok' if c['ok'] else 'FAIL'}", flush=True)
        tp = throughput(args.device, args.n, args.memory, args.device_memory, tmp)
        print(f"out of core n={args.n}: {tp['out_of_core_gflops']:.0f} GFLOP/s vs in core "
              f"{tp['in_core_gflops']:.0f} GFLOP/s = {tp['ratio_vs_in_core']:.2f}x; waited for data "
              f"{tp['wait_seconds']:.1f} s of {tp['out_of_core_seconds']:.1f} s; reads+copies {tp['load_seconds']:.1f} s, "
              f"{100 * tp['overlap_hidden_fraction']:.0f}% hidden behind compute "
              f"(wall / serial = {tp['wall_over_serial']:.2f})")
        ok = all(c["ok"] for c in checks)
        print(json.dumps({"device": args.device, "correct": ok, "checks": checks, "throughput": tp,
                          "seconds": time.perf_counter() - t0}, default=str))
        return 0 if ok else 1
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
