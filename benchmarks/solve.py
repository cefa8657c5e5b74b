"""Ridge benchmark: blocklin.solve out of core against scikit-learn Ridge and Dask normal equations.

Usage::

    python benchmarks/solve.py [--m 400000] [--n 1000] [--lam 1.0] [--memory 1GiB] [--dir bench-data] [--keep]

The problem ``min ||A x - b||^2 + lam^2 ||x||^2`` (A standard normal float64, ``b = A x_true + noise``)
is written to zarr in bounded memory. Each variant runs in its own subprocess (its own peak RSS):

* ``blocklin``: ``blocklin.solve(A, b, lam=lam, memory=--memory)`` (auto: Gram pass, Cholesky, one
  refinement pass);
* ``blocklin-qr``: ``method="qr"`` (one streaming-TSQR pass; the accuracy reference);
* ``sklearn``: ``Ridge(alpha=lam**2, solver="cholesky", fit_intercept=False)`` on A loaded into memory
  (timed: load + fit; the fit alone is reported too);
* ``dask``: ``da.from_zarr``; ``G = A.T @ A``, ``c = A.T @ b`` computed together, then
  ``np.linalg.solve(G + lam^2 I, c)`` (threaded scheduler).

Accuracy: ``||x - x_qr|| / ||x_qr||`` and the optimality residual
``||A^T (b - A x) - lam^2 x|| / (||A||_F^2 ||x||)`` computed for every solution in one extra pass.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

CHILD = textwrap.dedent(r"""
import json, sys, time
variant, a_path, b_path, out, memory, lam = sys.argv[1:7]
lam = float(lam)
import numpy as np
def peak():
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
import zarr, blocklin
extra = {}
if variant == "baseline":
    import dask.array, sklearn.linear_model  # noqa: F401
    print(json.dumps({"seconds": 0.0, "peak": peak()})); sys.exit()
t0 = time.perf_counter()
if variant.startswith("blocklin"):
    x = blocklin.solve(a_path, b_path, lam=lam, memory=memory, method="qr" if variant == "blocklin-qr" else "auto")
    secs = time.perf_counter() - t0
    r = x.report
    extra = {"method": r["method"], "passes": r["passes"], "residual_norm": r["residual_norm"]}
    xs = x.to_numpy()
elif variant == "sklearn":
    from sklearn.linear_model import Ridge
    a = zarr.open_array(a_path, mode="r")[...]
    b = zarr.open_array(b_path, mode="r")[...]
    t1 = time.perf_counter()
    model = Ridge(alpha=lam**2, solver="cholesky", fit_intercept=False).fit(a, b)
    secs = time.perf_counter() - t0
    extra = {"fit_seconds": time.perf_counter() - t1}
    xs = model.coef_.T.reshape(-1, b.shape[1])
else:
    import dask, dask.array as da
    a, b = da.from_zarr(a_path), da.from_zarr(b_path)
    with dask.config.set(scheduler="threads"):
        g, c = dask.compute(a.T @ a, a.T @ b)
    xs = np.linalg.solve(g + lam**2 * np.eye(g.shape[0]), c)
    secs = time.perf_counter() - t0
np.save(out, xs)
print(json.dumps({"seconds": secs, "peak": peak(), **extra}))
""")

CHECK = textwrap.dedent(r"""
import json, sys
import numpy as np, zarr
a_path, b_path, lam, *xs = sys.argv[1:]
lam = float(lam)
a, b = zarr.open_array(a_path, mode="r"), zarr.open_array(b_path, mode="r")
X = [np.load(p) for p in xs]
g = [np.zeros_like(x) for x in X]; na = 0.0
for r0 in range(0, a.shape[0], 16384):
    ab, bb = a[r0:r0 + 16384], b[r0:r0 + 16384]
    na += float((ab * ab).sum())
    for x, gi in zip(X, g):
        gi += ab.T @ (bb - ab @ x)
print(json.dumps([float(np.linalg.norm(gi - lam**2 * x) / (na * np.linalg.norm(x))) for x, gi in zip(X, g)]))
""")


def run(args: list[str], timeout: int = 3600) -> dict | list:
    proc = subprocess.run([sys.executable, "-c", *args], capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        return {"error": proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else f"exit {proc.returncode}"}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--m", type=int, default=400_000)
    ap.add_argument("--n", type=int, default=1000)
    ap.add_argument("--lam", type=float, default=1.0)
    ap.add_argument("--memory", default="1GiB")
    ap.add_argument("--dir", default=None)
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--json", action="store_true")
    opts = ap.parse_args()
    import numpy as np

    import blocklin

    base = Path(opts.dir or tempfile.mkdtemp(prefix="blocklin-bench-solve-"))
    base.mkdir(parents=True, exist_ok=True)
    try:
        a_path, b_path = base / "a.zarr", base / "b.zarr"
        if not a_path.exists():
            a = blocklin.random(a_path, (opts.m, opts.n), seed=11, memory=opts.memory, chunks=(8192, opts.n))
            xt = np.random.default_rng(5).standard_normal((opts.n, 1))
            ax = blocklin.matmul(a, xt, memory=opts.memory).to_numpy()
            blocklin.from_array(ax + 0.1 * np.random.default_rng(6).standard_normal(ax.shape), b_path,
                                chunks=(8192, 1))
        results: dict = {"baseline": run([CHILD, "baseline", str(a_path), str(b_path), "", opts.memory, "0"])}
        outs = {}
        for variant in ("blocklin", "blocklin-qr", "dask", "sklearn"):
            out = base / f"x-{variant}.npy"
            r = run([CHILD, variant, str(a_path), str(b_path), str(out), opts.memory, str(opts.lam)])
            results[variant] = r
            if "error" not in r:
                outs[variant] = out
            print(f"{variant:12s} {json.dumps(r)}", file=sys.stderr)
        names = list(outs)
        opt = run([CHECK, str(a_path), str(b_path), str(opts.lam), *[str(outs[v]) for v in names]])
        ref = np.load(outs["blocklin-qr"]) if "blocklin-qr" in outs else None
        for v, o in zip(names, opt if isinstance(opt, list) else [None] * len(names)):
            results[v]["optimality_residual"] = o
            if ref is not None:
                x = np.load(outs[v])
                results[v]["diff_vs_qr"] = float(np.linalg.norm(x - ref) / np.linalg.norm(ref))
        b = results["blocklin"]
        summary = {"m": opts.m, "n": opts.n, "lam": opts.lam, "memory": opts.memory,
                   "matrix_bytes": opts.m * opts.n * 8, "results": results}
        for other in ("dask", "sklearn"):
            if "seconds" in results.get(other, {}) and "seconds" in b:
                summary[f"time_ratio_vs_{other}"] = b["seconds"] / results[other]["seconds"]
        if opts.json:
            print(json.dumps(summary, indent=1))
        else:
            print(f"ridge {opts.m} x {opts.n} float64, lam {opts.lam}, budget {opts.memory}")
            for name in ("blocklin", "blocklin-qr", "dask", "sklearn"):
                r = results[name]
                if "error" in r:
                    print(f"{name:12s} failed: {r['error']}")
                    continue
                print(f"{name:12s} {r['seconds']:8.2f} s {r['peak'] / 1e6:8.0f} MB  optimality "
                      f"{r.get('optimality_residual', float('nan')):.1e}  vs qr {r.get('diff_vs_qr', float('nan')):.1e}")
            for other in ("dask", "sklearn"):
                if f"time_ratio_vs_{other}" in summary:
                    print(f"blocklin / {other} time: {summary[f'time_ratio_vs_{other}']:.2f}x")
    finally:
        if not opts.keep:
            shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
