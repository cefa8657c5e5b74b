"""Inverse benchmark: blocklin.inv out of core against numpy.linalg.inv and dask.array.linalg.inv.

Usage::

    python benchmarks/inverse.py [--n 8192] [--memory 1GiB] [--dir bench-data] [--keep] [--skip-dask]

The matrix (standard normal, float64) is written to zarr in bounded memory. Each variant runs in its
own subprocess (peak resident memory ``VmHWM`` is its own) and is timed from the stored matrix to the
stored or in-memory inverse:

* ``blocklin``: ``blocklin.inv(A, out, memory=--memory)`` with the defaults (out of core the default
  tolerance is the unit roundoff: one Newton-Schulz step, for the forward accuracy of NumPy's inverse);
* ``blocklin-norefine``: the same with ``refine=False`` (the inversion alone, residual still probed);
* ``blocklin-schur``, ``blocklin-schur-norefine``: the same with ``method="schur"`` (the randomized
  Schur-complement recursion instead of the default out-of-core pivoted LU);
* ``numpy``: ``np.linalg.inv`` on the matrix loaded into memory (load time reported separately);
* ``dask``: ``dask.array.linalg.inv`` on ``da.from_zarr`` (threaded scheduler), result computed.

Every inverse is then checked the same way: the exact backward error
``||I - A X||_F / (||A||_F ||X||_F)`` (X in memory, A streamed in row strips). ``blocklin`` runs with
``tol=--tol`` when given, else with its default.
Printed: seconds, peak MB, backward error, and the ratios to NumPy and Dask.
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
variant, src, out, memory, tol = sys.argv[1:6]
import numpy as np
def peak():
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
import zarr, blocklin
extra = {}
if variant == "baseline":
    import dask.array  # noqa: F401
    print(json.dumps({"seconds": 0.0, "peak": peak()})); sys.exit()
if variant.startswith("blocklin"):
    t0 = time.perf_counter()
    x = blocklin.inv(src, out=out, memory=memory, refine=False if variant.endswith("-norefine") else "auto",
                     tol=float(tol) if tol != "default" else None,
                     method="schur" if "-schur" in variant else "auto")
    secs = time.perf_counter() - t0
    r = x.report
    extra = {"reported_backward_error": r["backward_error"], "residual_method": r["residual_method"],
             "refine_steps": r["refine_steps"], "leaves": r["leaves"], "gemm_steps": r["gemm_steps"],
             "plan_peak": r["plan"]["peak_memory"], "history": r["history"], "method": r["method"]}
elif variant == "numpy":
    t0 = time.perf_counter()
    a = zarr.open_array(src, mode="r")[...]
    load = time.perf_counter() - t0
    t0 = time.perf_counter()
    x = np.linalg.inv(a)
    secs = time.perf_counter() - t0
    extra = {"load_seconds": load}
    del a
    blocklin.from_array(x, out, chunks=(1024, 1024))
else:
    import dask, dask.array as da
    a = da.from_zarr(src)
    t0 = time.perf_counter()
    x = da.linalg.inv(a)
    with dask.config.set(scheduler="threads"):
        xs = x.compute()
    secs = time.perf_counter() - t0
    blocklin.from_array(xs, out, chunks=(1024, 1024))
print(json.dumps({"seconds": secs, "peak": peak(), **extra}))
""")

CHECK = textwrap.dedent(r"""
import json, sys
import numpy as np, zarr
src, x_path = sys.argv[1:3]
x = zarr.open_array(x_path, mode="r")[...]
a = zarr.open_array(src, mode="r")
n, step = a.shape[0], 1024
res = na = 0.0
for r0 in range(0, n, step):  # exact ||I - A X||_F, A streamed in row strips
    ab = a[r0:r0 + step]
    na += float((ab * ab).sum())
    r = ab @ x
    r[np.arange(r.shape[0]), r0 + np.arange(r.shape[0])] -= 1.0
    res += float((r * r).sum())
print(json.dumps({"backward_error": res ** 0.5 / (na * float((x * x).sum())) ** 0.5}))
""")



def run(args: list[str], timeout: int = 3600) -> dict:
    proc = subprocess.run([sys.executable, "-c", *args], capture_output=True, text=True, timeout=timeout)
    if proc.returncode != 0:
        return {"error": proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else f"exit {proc.returncode}"}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=8192)
    ap.add_argument("--memory", default="1GiB")
    ap.add_argument("--dir", default=None)
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--skip-dask", action="store_true")
    ap.add_argument("--tol", type=float, default=None, help="blocklin's backward-error target (default: its own)")
    ap.add_argument("--variants", default="blocklin,blocklin-norefine,numpy,dask",
                    help="comma-separated subset of blocklin, blocklin-norefine, blocklin-schur, "
                         "blocklin-schur-norefine, numpy, dask")
    ap.add_argument("--json", action="store_true")
    opts = ap.parse_args()
    import blocklin

    base = Path(opts.dir or tempfile.mkdtemp(prefix="blocklin-bench-inv-"))
    base.mkdir(parents=True, exist_ok=True)
    try:
        src = base / "a.zarr"
        if not src.exists():
            blocklin.random(src, (opts.n, opts.n), seed=7, memory=opts.memory, chunks=(1024, 1024))
        results = {"baseline": run([CHILD, "baseline", str(src), "", opts.memory, "0"])}
        chosen = [v for v in opts.variants.split(",") if v and not (opts.skip_dask and v == "dask")]
        for variant in chosen:
            out = base / f"x-{variant}.zarr"
            shutil.rmtree(out, ignore_errors=True)
            r = run([CHILD, variant, str(src), str(out), opts.memory, "default" if opts.tol is None else str(opts.tol)])
            if "error" not in r:
                r.update(run([CHECK, str(src), str(out)]))
            shutil.rmtree(out, ignore_errors=True)
            results[variant] = r
            print(f"{variant:9s} {json.dumps(r)}", file=sys.stderr)
        summary = {"n": opts.n, "memory": opts.memory, "matrix_bytes": opts.n * opts.n * 8, "results": results}
        for mine in ("blocklin", "blocklin-norefine", "blocklin-schur", "blocklin-schur-norefine"):
            for other in ("numpy", "dask"):
                b, o = results.get(mine, {}), results.get(other, {})
                if "seconds" in b and "seconds" in o:
                    summary[f"time_ratio_{mine}_vs_{other}"] = b["seconds"] / o["seconds"]
        if opts.json:
            print(json.dumps(summary, indent=1))
        else:
            print(f"inverse n={opts.n} float64, budget {opts.memory} (matrix {opts.n**2 * 8 / 2**30:.2f} GiB)")
            print(f"{'variant':10s} {'seconds':>9s} {'peak MB':>9s} {'backward error':>15s}")
            for name in ("blocklin", "blocklin-norefine", "numpy", "dask"):
                r = results.get(name)
                if r is None:
                    continue
                if "error" in r:
                    print(f"{name:10s} failed: {r['error']}")
                    continue
                print(f"{name:10s} {r['seconds']:9.2f} {r['peak'] / 1e6:9.0f} {r['backward_error']:15.2e}")
            for mine in ("blocklin", "blocklin-norefine", "blocklin-schur", "blocklin-schur-norefine"):
                for other in ("numpy", "dask"):
                    key = f"time_ratio_{mine}_vs_{other}"
                    if key in summary:
                        print(f"{mine} / {other} time: {summary[key]:.2f}x")
    finally:
        if not opts.keep:
            shutil.rmtree(base, ignore_errors=True)


if __name__ == "__main__":
    main()
