"""PCA of a matrix larger than the memory budget: top components by randomized SVD, out of core.

    python examples/pca_out_of_core.py [rows] [budget]

The data are 50 latent factors plus noise (zero-mean by construction), written to zarr in bounded
memory. The column means are checked with one streamed product (``X^T 1 / m`` through the
LinearOperator); data that are not centered should be centered on disk first (for example with
``blocklin.matmul`` or a Dask expression written back with ``blocklin.from_array``).
"""

import sys
import tempfile

import numpy as np

import blocklin as bl

m = int(sys.argv[1]) if len(sys.argv) > 1 else 200_000
budget = sys.argv[2] if len(sys.argv) > 2 else "64MiB"
n, r = 300, 50

with tempfile.TemporaryDirectory() as d:
    rng = np.random.default_rng(0)
    loadings = rng.standard_normal((r, n)) * np.exp(-np.arange(r) / 10)[:, None]
    import dask.array as da

    scores = da.random.default_rng(1).standard_normal((m, r), chunks=(16384, r))
    noise = 0.01 * da.random.default_rng(2).standard_normal((m, n), chunks=(16384, n))
    X = bl.from_array(scores @ loadings + noise, f"{d}/X.zarr", chunks=(2048, n))  # written chunk by chunk
    print(f"X: {X.shape}, {X.nbytes / 2**20:.0f} MiB on disk, budget {budget}")

    op = bl.aslinearoperator(X, memory=budget)
    mean = op.rmatvec(np.ones(m)) / m  # one pass
    print(f"column means: max |mean| = {np.abs(mean).max():.2e} (one pass)")

    U, s, Vt = res = bl.svd(X, 10, method="rsvd", power_iters=2, seed=0, memory=budget, progress=True)
    rep = res.report
    explained = s**2 / (m - 1)
    print(f"top-10 explained variances: {np.round(explained, 3)}")
    print(f"{rep['passes']} passes over X ({rep['passes_formula']}), {rep['seconds']:.1f} s, "
          f"peak RSS {rep['peak_memory'] / 2**20:.0f} MiB, max relative residual {max(rep['relative_residuals']):.1e}")
    # components vs. the population's top-10 principal axes (sign-free: principal angles)
    ref = np.linalg.eigh(loadings.T @ loadings)[1][:, -10:]
    cosines = np.linalg.svd(ref.T @ Vt.T, compute_uv=False)
    print(f"cosines of principal angles to the true top-10 loading space: min {cosines.min():.4f}")
    print("U is", type(U).__name__, U.shape)
