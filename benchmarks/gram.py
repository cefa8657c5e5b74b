"""Gram matrices and lambda selection: SYRK in one read against the general product, and GCV on the
one-pass normal-equation spectrum against the streaming QR.

Usage::

    python benchmarks/gram.py [--m 200000] [--n 1000] [--dtype float32] [--memory 512MiB]
                              [--solve-m 100000] [--solve-n 400]

Part 1 writes an ``m x n`` random matrix ``X`` and computes ``X^T X`` twice within the budget:
``blocklin.gram`` (SYRK, the pass route) and the general out-of-core GEMM (``matmul`` with explicit
output chunks, which keeps it from handing the product to ``gram``). Part 2 solves a ridge problem
with a column condition number of about 150 by ``lam="gcv"`` on the default route (``auto``: the
Gram spectrum when well conditioned) and with ``method="qr"``. Printed: seconds, bytes read, passes,
peak memory (this process), and the largest difference between the two results.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time

import numpy as np

import blocklin as bl


def _peak() -> int:
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM"):
            return int(line.split()[1]) * 1024
    return 0


def _reset_peak() -> None:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


def _timed(fn):
    _reset_peak()
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0, _peak()


def gram_vs_gemm(tmp: str, m: int, n: int, dtype: str, memory: str) -> dict:
    x = bl.random(os.path.join(tmp, "X.zarr"), (m, n), dtype=dtype, seed=0)
    g, tg, pg = _timed(lambda: bl.gram(x.path, os.path.join(tmp, "G.zarr"), memory=memory))
    oc = g.report["plan"]["out_chunks"]
    c, tc, pc = _timed(lambda: bl.matmul(x.path, x.path, os.path.join(tmp, "C.zarr"), trans_a=True, memory=memory,
                                         out_chunks=tuple(oc)))
    diff = float(np.abs(g.to_numpy().astype(np.float64) - c.to_numpy()).max() / np.abs(c.to_numpy()).max())
    return {"shape": [m, n], "dtype": dtype, "memory": memory,
            "gram": {"seconds": round(tg, 2), "bytes_read": g.report["bytes_read"], "passes": g.report["passes"],
                     "flops": g.report["flops"], "peak_rss": pg, "route": g.report["route"]},
            "gemm": {"seconds": round(tc, 2), "bytes_read": c.report["bytes_read"], "flops": c.report["flops"],
                     "peak_rss": pc},
            "time_ratio_gemm_over_gram": round(tc / tg, 2), "max_rel_diff": diff}


def gcv_routes(tmp: str, m: int, n: int, memory: str) -> dict:
    rng = np.random.default_rng(1)
    s = np.logspace(0, -np.log10(150.0), n)
    q, _ = np.linalg.qr(rng.standard_normal((n, n)))
    a = bl.from_array((rng.standard_normal((m, n)) * s) @ q.T, os.path.join(tmp, "A.zarr"))
    b = bl.from_array(a.to_numpy() @ rng.standard_normal(n) + 0.3 * rng.standard_normal(m), os.path.join(tmp, "b.zarr"))
    out = {}
    for name, method in (("auto", "auto"), ("qr", "qr")):
        x, t, p = _timed(lambda: bl.solve(a.path, b.path, lam="gcv", method=method, memory=memory))
        out[name] = {"seconds": round(t, 2), "method": x.report["method"], "passes": x.report["passes"],
                     "lam": x.report["lam"], "peak_rss": p, "x": x.to_numpy()[:, 0]}
    out["lam_rel_diff"] = abs(out["auto"]["lam"] - out["qr"]["lam"]) / out["qr"]["lam"]
    out["x_rel_diff"] = float(np.linalg.norm(out["auto"].pop("x") - out["qr"]["x"]) / np.linalg.norm(out["qr"].pop("x")))
    out["time_ratio_qr_over_auto"] = round(out["qr"]["seconds"] / out["auto"]["seconds"], 2)
    return {"shape": [m, n], "memory": memory, **out}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--m", type=int, default=200000)
    p.add_argument("--n", type=int, default=1000)
    p.add_argument("--dtype", default="float32")
    p.add_argument("--memory", default="512MiB")
    p.add_argument("--solve-m", type=int, default=100000)
    p.add_argument("--solve-n", type=int, default=400)
    args = p.parse_args()
    tmp = tempfile.mkdtemp(prefix="blocklin-bench-gram-")
    try:
        print(json.dumps({"gram_vs_gemm": gram_vs_gemm(tmp, args.m, args.n, args.dtype, args.memory)}, indent=1))
        print(json.dumps({"gcv_routes": gcv_routes(tmp, args.solve_m, args.solve_n, args.memory)}, indent=1))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
