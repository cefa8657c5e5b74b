"""Data that grows: append a day of rows, bring a PCA, a ridge fit and a Gram matrix up to date.

    python examples/growing_data.py [rows] [days]

Measurements of 200 features arrive in daily batches: 300,000 rows at first (229 MiB float32) and
1% more each day for 5 days. The matrix is stored once; each day's rows are appended to it
(``blocklin.append``: atomic, readers see the old or the new matrix) and the results computed from it
are brought up to date from the new rows alone (``blocklin.update``): the Gram ``X^T X``, a 10-component
PCA and a ridge regression of a response with lambda by GCV (both kept with ``updatable=True``).
``BLOCKLIN_EXAMPLE_SIZE=small`` uses 30,000 rows (the test suite does). At the end each result is
checked against NumPy on every row: the PCA and the ridge fit against the exact centered Gram in
float64, the Gram against the rounding-error bound of a product. Everything is written under a
temporary folder that is removed at the end.
"""

import os
import sys
import tempfile
import time

import numpy as np

import blocklin as bl

small = os.environ.get("BLOCKLIN_EXAMPLE_SIZE") == "small"
m = int(sys.argv[1]) if len(sys.argv) > 1 else (30_000 if small else 300_000)
days = int(sys.argv[2]) if len(sys.argv) > 2 else 5
n, r, k = 200, 15, 10
mix = np.random.default_rng(0).standard_normal((r, n)) * np.exp(-np.arange(r) / 4)[:, None]
w = np.random.default_rng(1).standard_normal((n, 1))


def day(seed, rows):
    """A batch of rows: 15 latent factors plus noise around means of 2, and the response."""
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((rows, r)) @ mix + 0.1 * rng.standard_normal((rows, n)) + 2.0).astype(np.float32)
    return x, (x @ w + 0.5 * rng.standard_normal((rows, 1))).astype(np.float32)


with tempfile.TemporaryDirectory() as d, bl.config.set(temp_dir=d):
    x0, y0 = day(100, m)
    X = bl.from_array(x0, f"{d}/X.zarr", chunks=(8192, n))
    bl.from_array(y0, f"{d}/y.zarr", chunks=(8192, 1))
    del x0, y0
    t = time.perf_counter()
    bl.gram(X, f"{d}/G.zarr")
    bl.pca(X, k, out=f"{d}/P.zarr", updatable=True)
    bl.solve(X, f"{d}/y.zarr", lam="gcv", fit_intercept=True, out=f"{d}/beta.zarr", updatable=True)
    print(f"day 0: {m} x {n} float32; Gram, PCA and ridge (GCV) computed in {time.perf_counter() - t:.1f} s")

    for i in range(1, days + 1):
        x, y = day(i, m // 100)
        bl.append(X, x)  # X: the path's Matrix is read again by the updates below
        bl.append(f"{d}/y.zarr", y)
        t = time.perf_counter()
        g, p, beta = (bl.update(f"{d}/{name}") for name in ("G.zarr", "P.zarr", "beta.zarr"))
        print(f"day {i}: +{x.shape[0]} rows, updates in {time.perf_counter() - t:.2f} s "
              f"(read {sum(o.report['updated']['rows_read'] for o in (g, beta))} new rows for Gram and ridge; "
              f"PCA scores {p.report['updated']['scores']}), lambda {beta.report['lam']:.4g}")

    # Check against NumPy on every row: the exact centered Gram in float64 gives the PCA and the ridge fit.
    full = bl.open(f"{d}/X.zarr")
    rows = full.shape[0]
    xs = full.to_numpy().astype(np.float64)
    ys = bl.open(f"{d}/y.zarr").to_numpy().astype(np.float64)
    mu, ybar = xs.mean(axis=0), ys.mean(axis=0)
    c = (xs - mu).T @ (xs - mu)
    lam_e, v = np.linalg.eigh(c)
    s_ref, v_ref = np.sqrt(lam_e[::-1][:k]), v[:, ::-1][:, :k]
    q1, q2 = np.linalg.qr(np.asarray(p.components_, dtype=np.float64).T)[0], np.linalg.qr(v_ref)[0]
    sine = float(np.linalg.norm(q1 - q2 @ (q2.T @ q1), 2))
    s_err = float(np.max(np.abs(p.singular_values_ - s_ref) / s_ref))
    lam = beta.report["lam"]
    b_ref = np.linalg.solve(c + lam**2 * np.eye(n), (xs - mu).T @ (ys - ybar))
    b_err = float(np.linalg.norm(beta.to_numpy() - b_ref) / np.linalg.norm(b_ref))
    bound = 2 * rows * np.finfo(np.float32).eps * float(np.square(xs).sum())  # a product's rounding bound
    g_ratio = float(np.linalg.norm(g.to_numpy() - xs.T @ xs) / bound)
    print(f"check: {rows} rows; PCA singular values max relative error {s_err:.1e}, subspace sine {sine:.1e}; "
          f"ridge coefficients relative error {b_err:.1e}; Gram error {g_ratio:.1e} of its rounding bound")
    ok = s_err < 1e-5 and sine < 1e-4 and b_err < 1e-4 and g_ratio <= 1.0
    sys.exit(0 if ok else 1)
