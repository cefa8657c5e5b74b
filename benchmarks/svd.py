"""Truncated SVD benchmark: blocklin rsvd / sketch / lanczos vs scikit-learn and Dask, one zarr file.

The matrix is ``A = U diag(s) V^T`` (400000 x 1000 float64 by default, about 3.2 GB) with
``s_i = max(exp(-i/25), 1e-3)``, written in bounded memory: ``U`` is a Gaussian matrix made
orthonormal by CholeskyQR (pass 1 accumulates ``G^T G`` strip by strip from seeded generators,
pass 2 regenerates each strip and writes ``G_i R^{-1} diag(s) V^T``), so the exact singular values
are known. Every variant runs in its own subprocess (peak RSS is that process's high-water mark) and
reports seconds, passes over A, peak memory and the max relative error of the top ``k`` singular
values. The file is deleted at the end (``--keep`` keeps it).

Usage::

    python benchmarks/svd.py                       # the full benchmark (about 3.2 GB of disk)
    python benchmarks/svd.py --rows 40000 --quick  # a small smoke run
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time

import numpy as np

CHILD = textwrap.dedent(r"""
    import json, resource, sys, time
    import numpy as np
    variant, path, k, memory, extra = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], json.loads(sys.argv[5])
    out = {"variant": variant}
    if variant.startswith("blocklin"):
        import blocklin as bl
        t0 = time.perf_counter()
        res = bl.svd(path, k, memory=memory, seed=0, **extra)
        out["seconds"] = time.perf_counter() - t0
        out["s"] = [float(x) for x in res.s]
        r = res.report
        out.update(passes=r["passes"], intermediate_passes=r["intermediate_passes"], bytes_read=r["bytes_read"],
                   max_rel_residual=max(r["relative_residuals"]) if r.get("relative_residuals") else None,
                   power_iters=r.get("power_iters"), lanczos_steps=r.get("lanczos_steps"), orth=r.get("orth"))
        if getattr(res.U, "delete", None):
            import os.path
            res.U.delete()
    elif variant == "sklearn":
        import zarr
        from sklearn.utils.extmath import randomized_svd
        t0 = time.perf_counter()
        a = zarr.open_array(path, mode="r")[...]
        out["load_seconds"] = time.perf_counter() - t0
        t1 = time.perf_counter()
        u, s, vt = randomized_svd(a, k, n_oversamples=10, n_iter=4, random_state=0)
        out["seconds"] = time.perf_counter() - t1
        out["s"] = [float(x) for x in s]
        out["passes"] = "in memory (1 read + 2*4+2 products)"
    elif variant == "dask":
        import dask, dask.array as da
        t0 = time.perf_counter()
        x = da.from_zarr(path)
        u, s, v = da.linalg.svd_compressed(x, k, n_power_iter=4, n_oversamples=10, seed=0, compute=False)
        u, s, v = dask.compute(u, s, v)
        out["seconds"] = time.perf_counter() - t0
        out["s"] = [float(x) for x in s]
        out["passes"] = "2*4+2 = 10 (+1 for U)"
    out["peak_rss"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print("RESULT " + json.dumps(out))
""")


def spectrum(n: int) -> np.ndarray:
    return np.maximum(np.exp(-np.arange(n) / 25.0), 1e-3)


def generate(path: str, m: int, n: int, chunk_rows: int, seed: int = 7) -> None:
    """Write ``U diag(s) V^T`` to a zarr array in bounded memory (two passes of seeded strips)."""
    import scipy.linalg
    import zarr

    def strip(i: int, r: int) -> np.ndarray:
        return np.random.default_rng([seed, i]).standard_normal((r, n))

    bounds = [(r0, min(m, r0 + chunk_rows)) for r0 in range(0, m, chunk_rows)]
    gram = np.zeros((n, n))
    for i, (r0, r1) in enumerate(bounds):
        g = strip(i, r1 - r0)
        gram += g.T @ g
    r = scipy.linalg.cholesky(gram, lower=False)
    v, _ = np.linalg.qr(np.random.default_rng([seed, -1 % 2**32]).standard_normal((n, n)))
    w = scipy.linalg.solve_triangular(r, np.diag(spectrum(n)) @ v.T, lower=False)  # R^{-1} diag(s) V^T
    arr = zarr.create_array(store=path, shape=(m, n), chunks=(chunk_rows, n), dtype="float64", compressors=None,
                            zarr_format=3, fill_value=0.0)
    for i, (r0, r1) in enumerate(bounds):
        arr[r0:r1] = strip(i, r1 - r0) @ w


def run_variant(variant: str, path: str, k: int, memory: str, extra: dict) -> dict:
    proc = subprocess.run([sys.executable, "-c", CHILD, variant, path, str(k), memory, json.dumps(extra)],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        return {"variant": variant, "error": proc.stderr.strip().splitlines()[-1] if proc.stderr else "failed"}
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")][-1]
    return json.loads(line[len("RESULT "):])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=400_000)
    p.add_argument("--cols", type=int, default=1000)
    p.add_argument("-k", type=int, default=50)
    p.add_argument("--memory", default="1GiB", help="blocklin budget")
    p.add_argument("--chunk-rows", type=int, default=4096)
    p.add_argument("--dir", default=None, help="folder for the test matrix (default: temp dir)")
    p.add_argument("--keep", action="store_true", help="keep the generated matrix")
    p.add_argument("--data", help="reuse (or create and keep) the test matrix at this path")
    p.add_argument("--quick", action="store_true", help="skip scikit-learn and Dask")
    p.add_argument("--only", nargs="*", help="run only these variants")
    p.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    args = p.parse_args(argv)

    folder = tempfile.mkdtemp(prefix="blocklin-bench-svd-", dir=args.dir)
    path = args.data or os.path.join(folder, "A.zarr")
    try:
        t0 = time.perf_counter()
        if not (args.data and os.path.exists(path)):
            generate(path, args.rows, args.cols, args.chunk_rows)
        gen = time.perf_counter() - t0
        size = args.rows * args.cols * 8
        print(f"# A: {args.rows} x {args.cols} float64 ({size / 1e9:.2f} GB), s_i = max(exp(-i/25), 1e-3), "
              f"k = {args.k}; generated in {gen:.1f} s", flush=True)
        exact = spectrum(args.cols)[: args.k]
        variants = [
            ("blocklin-rsvd", {"method": "rsvd"}),                                  # q = 4 (auto), l = k + 10
            ("blocklin-rsvd-q1-p60", {"method": "rsvd", "power_iters": 1, "oversample": 60}),
            ("blocklin-rsvd-q2-p25", {"method": "rsvd", "power_iters": 2, "oversample": 25}),
            ("blocklin-rsvd-q2-p30", {"method": "rsvd", "power_iters": 2, "oversample": 30}),
            ("blocklin-sketch", {"method": "sketch"}),
            ("blocklin-sketch-p50", {"method": "sketch", "oversample": 50}),
            ("blocklin-lanczos", {"method": "lanczos", "tol": 1e-4}),
            ("blocklin-lanczos-default-tol", {"method": "lanczos"}),
        ]
        if not args.quick:
            variants += [("sklearn", {}), ("dask", {})]
        if args.only:
            variants = [v for v in variants if v[0] in args.only]
        results = []
        print(f"{'variant':30s} {'seconds':>8s} {'passes':>8s} {'peak MB':>8s} {'max rel err':>12s}  notes", flush=True)
        for name, extra in variants:
            r = run_variant(name, path, args.k, args.memory, extra)
            if "error" in r:
                print(f"{name:30s} ERROR {r['error']}", flush=True)
                results.append(r)
                continue
            s = np.array(r["s"])
            r["max_rel_error"] = float(np.max(np.abs(s - exact) / exact))
            r["peak_mb"] = r["peak_rss"] / 1e6
            notes = ", ".join(f"{key}={r[key]}" for key in ("intermediate_passes", "power_iters", "lanczos_steps",
                                                             "max_rel_residual", "load_seconds") if r.get(key) is not None)
            passes = r["passes"] if isinstance(r["passes"], int) else "-"
            print(f"{name:30s} {r['seconds']:8.1f} {passes!s:>8s} {r['peak_mb']:8.0f} {r['max_rel_error']:12.2e}  "
                  f"{notes}", flush=True)
            results.append(r)
        by = {r["variant"]: r for r in results if "seconds" in r}
        for ref in ("dask", "sklearn"):
            if ref in by:
                for name, r in by.items():
                    if name.startswith("blocklin"):
                        print(f"# {name}: {r['seconds'] / by[ref]['seconds']:.2f}x {ref}'s time", flush=True)
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"rows": args.rows, "cols": args.cols, "k": args.k, "memory": args.memory,
                           "generate_seconds": gen, "results": results}, f, indent=1)
    finally:
        if not args.keep:
            shutil.rmtree(folder, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
