"""Centered PCA benchmark: blocklin.pca vs scikit-learn's randomized PCA and Dask's svd_compressed.

The data are float32 ``rows x cols`` samples: a rank-``r`` signal with decaying loadings, noise, and
column means around 3 (the case where an uncentered SVD finds the mean direction), written to zarr
in bounded memory by Dask. Variants, each in its own subprocess (peak RSS is that process's
high-water mark):

* ``blocklin``: ``blocklin.pca(path, k, memory=budget)`` with its defaults: centering inside the
  passes; for narrow data (``cols <= 24 (k + 10)``, as the default size) the Gram route (the means
  pass also makes the centered Gram, then one Rayleigh-Ritz pass), else block Lanczos with the
  means from its first pass, both to the default ``tol``;
* ``blocklin-rsvd``: the same with ``power_iters=4`` (randomized SVD, ``4 + 1`` passes);
* ``sklearn``: the array read into memory, then ``PCA(k, svd_solver="randomized")`` (its
  ``iterated_power="auto"``: 7 power iterations when ``k < 0.1 min(m, n)``, else 4);
* ``dask``: ``svd_compressed`` (4 power iterations, oversampling 10) on the centered Dask array
  ``x - x.mean(axis=0)`` read from the same zarr store; ``dask-qr`` the same with ``iterator="QR"``
  (re-orthonormalized after every product: the default power iterator overflows float32 when
  ``s_1^9`` exceeds its range, as at the issue's size).

Accuracy is measured against the exact covariance eigenvectors (accumulated in float64 from row
blocks, then ``numpy.linalg.eigh``): the largest ``1 - |cos|`` between a component and its exact
eigenvector and the largest relative error of the explained variances. The file is deleted at the
end.

Usage::

    python benchmarks/pca.py                           # 100000 x 500 float32 (191 MiB), k=20, 48 MiB
    python benchmarks/pca.py --rows 300000 --cols 2000 --memory 512MiB   # the issue's size (2.4 GB)
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

import numpy as np

CHILD = textwrap.dedent(r"""
    import json, resource, sys, time
    import numpy as np
    variant, path, k, memory, comps_out = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], sys.argv[5]
    out = {"variant": variant}
    if variant.startswith("blocklin"):
        import blocklin as bl
        t0 = time.perf_counter()
        # "blocklin": the defaults (block Lanczos to 10 sqrt(eps)); "blocklin-rsvd": 4 power iterations
        p = bl.pca(path, k, memory=memory, seed=0, **({"power_iters": 4} if variant == "blocklin-rsvd" else {}))
        out["seconds"] = time.perf_counter() - t0
        comps, ev = p.components_, p.explained_variance_
        out.update(passes=p.report["passes"], passes_formula=p.report["passes_formula"],
                   bytes_written=p.report["bytes_written"])
    elif variant == "sklearn":
        import zarr
        from sklearn.decomposition import PCA
        t0 = time.perf_counter()
        a = zarr.open_array(path, mode="r")[...]
        out["load_seconds"] = time.perf_counter() - t0
        t1 = time.perf_counter()
        p = PCA(n_components=k, svd_solver="randomized", random_state=0).fit(a)
        out["fit_seconds"] = time.perf_counter() - t1
        out["seconds"] = time.perf_counter() - t0
        comps, ev = p.components_, p.explained_variance_
        out["passes"] = "in memory"
    elif variant.startswith("dask"):
        import dask, dask.array as da
        t0 = time.perf_counter()
        x = da.from_zarr(path)
        m = x.shape[0]
        xc = x - x.mean(axis=0)
        # "dask": its default power iterator (no re-orthonormalization: float32 overflows once s_1^(2q+1)
        # exceeds 3.4e38); "dask-qr": iterator="QR", a QR after every product
        u, s, v = da.linalg.svd_compressed(xc, k, n_power_iter=4, n_oversamples=10, seed=0, compute=False,
                                           iterator="QR" if variant == "dask-qr" else "power")
        s, v = dask.compute(s, v)
        out["seconds"] = time.perf_counter() - t0
        comps, ev = v, s.astype(np.float64) ** 2 / (m - 1)
        out["passes"] = "2*4+2 products (+ the means)"
    np.save(comps_out, np.asarray(comps, dtype=np.float64))
    out["explained_variance"] = [float(e) for e in ev]
    out["peak_rss"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print("RESULT " + json.dumps(out))
""")


def generate(path: str, m: int, n: int, r: int, chunk_rows: int) -> np.ndarray:
    """Write the data with Dask in row blocks; returns the population column means."""
    import dask.array as da

    import blocklin as bl

    rng = np.random.default_rng(0)
    means = 3.0 + 0.5 * rng.standard_normal(n)
    loadings = rng.standard_normal((r, n)) * np.exp(-np.arange(r) / 6)[:, None]
    scores = da.random.default_rng(1).standard_normal((m, r), chunks=(chunk_rows, r))
    noise = 0.1 * da.random.default_rng(2).standard_normal((m, n), chunks=(chunk_rows, n))
    bl.from_array((scores @ loadings + noise + means).astype(np.float32), path, chunks=(chunk_rows, n))
    return means


def exact(path: str, k: int, rows: int) -> tuple[np.ndarray, np.ndarray]:
    """Top-k eigenpairs of the sample covariance, accumulated in float64 from row blocks."""
    import zarr

    z = zarr.open_array(path, mode="r")
    m, n = z.shape
    mu = sum(z[i:i + rows].astype(np.float64).sum(axis=0) for i in range(0, m, rows)) / m
    cov = np.zeros((n, n))
    for i in range(0, m, rows):
        c = z[i:i + rows].astype(np.float64) - mu
        cov += c.T @ c
    w, v = np.linalg.eigh(cov / (m - 1))
    return w[::-1][:k], v[:, ::-1][:, :k]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=100_000)
    ap.add_argument("--cols", type=int, default=500)
    ap.add_argument("--rank", type=int, default=20)
    ap.add_argument("-k", type=int, default=20)
    ap.add_argument("--memory", default="48MiB", help="blocklin's budget")
    ap.add_argument("--variants", default="blocklin,blocklin-rsvd,sklearn,dask")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    folder = tempfile.mkdtemp(prefix="blocklin-bench-pca-")
    try:
        path = os.path.join(folder, "X.zarr")
        chunk_rows = max(1, (4 << 20) // (4 * args.cols))
        generate(path, args.rows, args.cols, args.rank, chunk_rows)
        evals, evecs = exact(path, args.k, chunk_rows)
        size = args.rows * args.cols * 4
        results = []
        for variant in args.variants.split(","):
            comps = os.path.join(folder, f"{variant}.npy")
            env = {**os.environ, "BLOCKLIN_TEMP_DIR": folder}
            proc = subprocess.run([sys.executable, "-c", CHILD, variant, path, str(args.k), args.memory, comps],
                                  capture_output=True, text=True, env=env)
            line = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
            if proc.returncode or not line:
                print(f"{variant} failed:\n{proc.stderr[-2000:]}", file=sys.stderr)
                continue
            res = json.loads(line[0][7:])
            c = np.load(comps)
            gap = 1 - np.abs(np.sum(c * evecs.T, axis=1))
            res["max_one_minus_cos"] = float(np.max(gap))
            res["components_within_1e-4"] = int(np.sum(gap < 1e-4))
            res["max_rel_var_error"] = float(np.max(np.abs(np.array(res.pop("explained_variance")) - evals) / evals))
            results.append(res)
        if args.json:
            print(json.dumps({"rows": args.rows, "cols": args.cols, "k": args.k, "memory": args.memory,
                              "bytes": size, "results": results}))
            return
        print(f"{args.rows} x {args.cols} float32 ({size / 2**20:.0f} MiB), column means about 3, rank {args.rank} "
              f"signal + noise, k={args.k}, blocklin budget {args.memory}")
        print(f"{'variant':<14} {'seconds':>8} {'peak RSS':>10} {'1-|cos| max':>12} {'1-|cos|<1e-4':>12} "
              f"{'var rel err':>12}  passes")
        for r in results:
            print(f"{r['variant']:<14} {r['seconds']:>8.2f} {r['peak_rss'] / 2**20:>7.0f} MiB "
                  f"{r['max_one_minus_cos']:>12.1e} {r['components_within_1e-4']:>9}/{args.k:<2} "
                  f"{r['max_rel_var_error']:>12.1e}  "
                  f"{r.get('passes_formula', r.get('passes'))}")
    finally:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
