"""Truncated SVD benchmark: blocklin's defaults and methods vs scikit-learn and Dask, one zarr file per spectrum.

Each matrix is ``A = U diag(s) V^T`` (400000 x 1000 float64 by default, about 3.2 GB), written in
bounded memory: ``U`` is a Gaussian matrix made orthonormal by CholeskyQR (pass 1 accumulates
``G^T G`` strip by strip from seeded generators, pass 2 regenerates each strip and writes
``G_i R^{-1} diag(s) V^T``), so the exact singular values are known. Spectra (``--spectra``):
``exp25`` (``max(exp(-i/25), 1e-3)``, the default), ``slow`` (``(1 + i)^-1/2``), ``fast``
(``exp(-i/5)``), ``flat`` (decay to ``k``, then a flat tail) and ``lrnoise`` (a rank-``k`` signal
over a noise bulk). Every variant runs in its own subprocess (peak RSS is that process's high-water
mark) and reports seconds, passes over A, peak memory and the max relative error of the top ``k``
singular values. ``blocklin-defaults`` is ``svd(a, k)`` with no options, ``sklearn-defaults``
``randomized_svd(a, k)`` and ``dask-defaults`` ``svd_compressed(a, k)``; the ratios printed after
each table come from the same run. The files are deleted at the end (``--keep`` keeps them).

The generating spectrum is exact for ``U diag(s) V^T`` but the stored matrix is that product
rounded, so no method can get closer to it than rounding: ``--lapack`` also computes every singular
value of the stored matrix with ``numpy.linalg.svd`` (LAPACK ``gesdd``, in memory), prints that
reference's own distance to the spectrum (the floor of the comparison) and each variant's error
against it.

Usage::

    python benchmarks/svd.py                       # the full benchmark (about 3.2 GB of disk)
    python benchmarks/svd.py --rows 40000 --quick  # a small smoke run
    python benchmarks/svd.py --rows 100000 --cols 500 -k 20 --memory 96MiB --spectra slow,fast,flat,lrnoise \
        --only blocklin-defaults sklearn-defaults dask-defaults
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
        out.update(method=r["method"], passes=r["passes"], intermediate_passes=r["intermediate_passes"],
                   bytes_read=r["bytes_read"],
                   max_rel_residual=max(r["relative_residuals"]) if r.get("relative_residuals") else None,
                   power_iters=r.get("power_iters"), lanczos_steps=r.get("lanczos_steps"), orth=r.get("orth"))
        if getattr(res.U, "delete", None):
            import os.path
            res.U.delete()
    elif variant == "sklearn-defaults":
        import zarr
        from sklearn.utils.extmath import randomized_svd
        t0 = time.perf_counter()
        a = zarr.open_array(path, mode="r")[...]
        out["load_seconds"] = time.perf_counter() - t0
        t1 = time.perf_counter()
        u, s, vt = randomized_svd(a, k, random_state=0)  # n_oversamples=10, n_iter="auto" (7 or 4), LU normalizer
        out["seconds"] = time.perf_counter() - t1
        out["s"] = [float(x) for x in s]
        out["passes"] = "in memory"
    elif variant == "dask-defaults":
        import dask, dask.array as da
        t0 = time.perf_counter()
        x = da.from_zarr(path)
        u, s, v = da.linalg.svd_compressed(x, k, seed=0, compute=False)  # n_power_iter=0, n_oversamples=10
        u, s, v = dask.compute(u, s, v)
        out["seconds"] = time.perf_counter() - t0
        out["s"] = [float(x) for x in s]
        out["passes"] = "2 (+1 for U)"
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


SPECTRA = {
    # name: (description, s_i as a function of the column count n and k)
    "exp25": ("s_i = max(exp(-i/25), 1e-3)", lambda n, k: np.maximum(np.exp(-np.arange(n) / 25.0), 1e-3)),
    "slow": ("slow decay s_i = (1 + i)^-1/2", lambda n, k: 1.0 / np.sqrt(1.0 + np.arange(n))),
    "fast": ("fast decay s_i = exp(-i/5)", lambda n, k: np.exp(-np.arange(n) / 5.0)),
    "flat": ("flat tail: exp(-i/10) for i < k, then exp(-k/10) / 2",
             lambda n, k: np.where(np.arange(n) < k, np.exp(-np.arange(n) / 10.0), np.exp(-k / 10.0) / 2)),
    "lrnoise": ("low rank plus noise: 1 + 9 (1 - i/k) for i < k over a noise bulk 0.05 sqrt(1 - i/n)",
                lambda n, k: np.where(np.arange(n) < k, 1 + 9 * (1 - np.arange(n) / k), 0.0)
                + 0.05 * np.sqrt(1 - np.arange(n) / n)),
}


def spectrum(n: int, name: str = "exp25", k: int = 50) -> np.ndarray:
    return np.sort(SPECTRA[name][1](n, k))[::-1]


def generate(path: str, m: int, n: int, chunk_rows: int, seed: int = 7, name: str = "exp25", k: int = 50) -> None:
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
    w = scipy.linalg.solve_triangular(r, np.diag(spectrum(n, name, k)) @ v.T, lower=False)  # R^{-1} diag(s) V^T
    arr = zarr.create_array(store=path, shape=(m, n), chunks=(chunk_rows, n), dtype="float64", compressors=None,
                            zarr_format=3, fill_value=0.0)
    for i, (r0, r1) in enumerate(bounds):
        arr[r0:r1] = strip(i, r1 - r0) @ w


def lapack_values(path: str, k: int) -> np.ndarray:
    """The top ``k`` singular values of the stored matrix by ``numpy.linalg.svd``, in a subprocess (a
    process's peak RSS outlives ``exec``: this one's would show in every variant's peak)."""
    code = ("import json, sys, numpy as np, zarr; s = np.linalg.svd(zarr.open_array(sys.argv[1], mode='r')[...], "
            "compute_uv=False); print(json.dumps(s[:int(sys.argv[2])].tolist()))")
    out = subprocess.run([sys.executable, "-c", code, path, str(k)], capture_output=True, text=True, check=True)
    return np.array(json.loads(out.stdout.strip().splitlines()[-1]))


def run_variant(variant: str, path: str, k: int, memory: str, extra: dict) -> dict:
    proc = subprocess.run([sys.executable, "-c", CHILD, variant, path, str(k), memory, json.dumps(extra)],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        return {"variant": variant, "error": proc.stderr.strip().splitlines()[-1] if proc.stderr else "failed"}
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")][-1]
    return json.loads(line[len("RESULT "):])


VARIANTS = [
    ("blocklin-defaults", {}),                                              # svd(a, k): gram or lanczos, tol sqrt(10 sqrt(eps))
    ("blocklin-lanczos", {"method": "lanczos"}),                            # the default before the Gram route
    ("blocklin-rsvd", {"method": "rsvd"}),                                  # q = 4 (auto), l = k + 10
    ("blocklin-rsvd-q1-p60", {"method": "rsvd", "power_iters": 1, "oversample": 60}),
    ("blocklin-rsvd-q2-p25", {"method": "rsvd", "power_iters": 2, "oversample": 25}),
    ("blocklin-sketch", {"method": "sketch"}),
    ("blocklin-sketch-p50", {"method": "sketch", "oversample": 50}),
    ("blocklin-lanczos-tol1e-4", {"method": "lanczos", "tol": 1e-4}),
]
ANCHORS = ["sklearn-defaults", "dask-defaults", "sklearn", "dask"]


def run_spectrum(args: argparse.Namespace, name: str, path: str) -> dict:
    """Generate the matrix of one spectrum, run every variant on it, print the table and the ratios."""
    t0 = time.perf_counter()
    if not (args.data and os.path.exists(path)):
        generate(path, args.rows, args.cols, args.chunk_rows, name=name, k=args.k)
    gen = time.perf_counter() - t0
    size = args.rows * args.cols * 8
    print(f"# A: {args.rows} x {args.cols} float64 ({size / 1e9:.2f} GB), {SPECTRA[name][0]}, k = {args.k}, "
          f"budget {args.memory}; generated in {gen:.1f} s", flush=True)
    exact = spectrum(args.cols, name, args.k)[: args.k]
    lapack = None
    if args.lapack:
        lapack = lapack_values(path, args.k)
        print(f"# LAPACK (numpy.linalg.svd of the stored matrix): max rel error vs the spectrum "
              f"{np.max(np.abs(lapack - exact) / exact):.2e} (the floor)", flush=True)
    variants = VARIANTS + ([] if args.quick else [(a, {}) for a in ANCHORS])
    if args.only:
        variants = [v for v in variants if v[0] in args.only]
    results = []
    print(f"{'variant':30s} {'seconds':>8s} {'passes':>8s} {'peak MB':>8s} {'max rel err':>12s}  notes", flush=True)
    for variant, extra in variants:
        r = run_variant(variant, path, args.k, args.memory, extra)
        results.append(r)
        if "error" in r:
            print(f"{variant:30s} ERROR {r['error']}", flush=True)
            continue
        s = np.array(r["s"])
        r["max_rel_error"] = float(np.max(np.abs(s - exact) / exact))
        if lapack is not None:
            r["lapack_error"] = float(np.max(np.abs(s - lapack) / lapack))
        r["peak_mb"] = r["peak_rss"] / 1e6
        notes = ", ".join(f"{key}={r[key]:.2e}" if key == "lapack_error" else f"{key}={r[key]}"
                          for key in ("method", "lapack_error", "intermediate_passes", "power_iters", "lanczos_steps",
                                                         "max_rel_residual", "load_seconds") if r.get(key) is not None)
        passes = r["passes"] if isinstance(r["passes"], int) else "-"
        print(f"{variant:30s} {r['seconds']:8.1f} {passes!s:>8s} {r['peak_mb']:8.0f} {r['max_rel_error']:12.2e}  "
              f"{notes}", flush=True)
    by = {r["variant"]: r for r in results if "seconds" in r}
    for ref in ANCHORS:
        if ref in by and "blocklin-defaults" in by:
            me, other = by["blocklin-defaults"], by[ref]
            print(f"# blocklin-defaults / {ref}: time {me['seconds'] / other['seconds']:.2f}x, error "
                  f"{me['max_rel_error']:.1e} vs {other['max_rel_error']:.1e} ({me['passes']} passes vs "
                  f"{other['passes']}); load average {os.getloadavg()[0]:.1f}", flush=True)
    return {"spectrum": name, "generate_seconds": gen, "results": results}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=400_000)
    p.add_argument("--cols", type=int, default=1000)
    p.add_argument("-k", type=int, default=50)
    p.add_argument("--memory", default="1GiB", help="blocklin budget")
    p.add_argument("--chunk-rows", type=int, default=4096)
    p.add_argument("--dir", default=None, help="folder for the test matrix (default: temp dir)")
    p.add_argument("--keep", action="store_true", help="keep the generated matrix")
    p.add_argument("--data", help="reuse (or create and keep) the test matrix at this path; with several "
                   "spectra, a folder holding one A-<spectrum>.zarr each")
    p.add_argument("--quick", action="store_true", help="skip scikit-learn and Dask")
    p.add_argument("--only", nargs="*", help="run only these variants")
    p.add_argument("--spectra", default="exp25", help=f"comma-separated, of {', '.join(SPECTRA)} (default exp25)")
    p.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    p.add_argument("--lapack", action="store_true", help="also compare with numpy.linalg.svd of the stored matrix "
                   "(read into memory)")
    args = p.parse_args(argv)

    folder = tempfile.mkdtemp(prefix="blocklin-bench-svd-", dir=args.dir)
    everything = []
    try:
        names = args.spectra.split(",")
        for name in names:
            path = os.path.join(args.data or folder, f"A-{name}.zarr") if len(names) > 1 or not args.data else args.data
            everything.append(run_spectrum(args, name, path))
            if not (args.keep or args.data):
                shutil.rmtree(path, ignore_errors=True)
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"rows": args.rows, "cols": args.cols, "k": args.k, "memory": args.memory,
                           "spectra": everything}, f, indent=1)
    finally:
        if not args.keep:
            shutil.rmtree(folder, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
