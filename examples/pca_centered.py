"""Centered PCA of data with large column means, out of core, without a centered copy.

    python examples/pca_centered.py [rows] [budget]

The data are 20 latent factors plus noise on top of column means around 3 (as real measurements
have), 200,000 x 300 float32 (229 MiB) written to zarr in bounded memory, then analysed within a
quarter of its size (57 MiB; the planner's minimum instead, should that not hold its plan).
``BLOCKLIN_EXAMPLE_SIZE=small`` uses 20,000 rows (23 MiB) (the test suite does).
``blocklin.pca`` subtracts the column means inside every pass (a rank-one correction of the products
with ``X``; one more pass computes the means): nothing centered is ever written. The result is
checked against the exact covariance eigenvectors, accumulated here block by block with NumPy. An
uncentered SVD is shown for contrast: its first "component" is the mean direction. Everything is
written under a temporary folder that is removed at the end.
"""

import os
import sys
import tempfile

import dask.array as da
import numpy as np

import blocklin as bl

small = os.environ.get("BLOCKLIN_EXAMPLE_SIZE") == "small"
m = int(sys.argv[1]) if len(sys.argv) > 1 else (20_000 if small else 200_000)
n, r, k = 300, 20, 10
rows = 4096


def within_budget(run, budget):
    """``run(budget)``, or ``run`` at the budget the planner names when ``budget`` cannot hold its plan
    (``BudgetError.minimum``, refused before the step reads anything; a step planned later may name
    more, so each retry grows the budget by at least a quarter, as blocklin's own budget searches do)."""
    for _ in range(5):
        try:
            return run(budget), budget
        except bl.errors.BudgetError as exc:
            if not exc.minimum:
                raise
            print(f"{bl.config.format_size(budget)} is below what the plan needs; the planner names "
                  f"{bl.config.format_size(exc.minimum)}")
            budget = max(exc.minimum, budget + budget // 4)
    return run(budget), budget

with tempfile.TemporaryDirectory() as d, bl.config.set(temp_dir=d):
    # 1. Data in: means around 3, 20 factors with decaying loadings, noise; written by Dask in row blocks.
    rng = np.random.default_rng(0)
    means = 3.0 + 0.5 * rng.standard_normal(n)
    loadings = rng.standard_normal((r, n)) * np.exp(-np.arange(r) / 6)[:, None]
    scores = da.random.default_rng(1).standard_normal((m, r), chunks=(rows, r))
    noise = 0.05 * da.random.default_rng(2).standard_normal((m, n), chunks=(rows, n))
    X = bl.from_array((scores @ loadings + noise + means).astype(np.float32), f"{d}/X.zarr", chunks=(rows, n))
    budget = bl.config.parse_size(sys.argv[2]) if len(sys.argv) > 2 else X.nbytes // 4  # X never fits
    print(f"X: {X.shape} float32, {X.nbytes / 2**20:.0f} MiB on disk, budget {bl.config.format_size(budget)}")

    # 2. PCA: the top components of the centered data, k = 10, in a few passes over X.
    p, budget = within_budget(lambda mem: bl.pca(X, k, power_iters=2, seed=0, memory=mem), budget)
    rep = p.report
    print(f"explained variance ratio: {np.round(p.explained_variance_ratio_, 4)} "
          f"(sum {p.explained_variance_ratio_.sum():.4f})")

    # 3. Reference: the exact covariance, accumulated in float64 from row blocks (two reads of X).
    z = X.zarr
    mu = sum(z[i:i + rows].astype(np.float64).sum(axis=0) for i in range(0, m, rows)) / m
    cov = np.zeros((n, n))
    for i in range(0, m, rows):
        c = z[i:i + rows].astype(np.float64) - mu
        cov += c.T @ c
    cov /= m - 1
    evals, evecs = np.linalg.eigh(cov)
    evals, evecs = evals[::-1][:k], evecs[:, ::-1][:, :k]

    # 4. Check: sign-free agreement of every component (|cosine| with the exact eigenvector) and of
    #    the explained variances. float32 data: a few 1e-5 of relative error is its rounding level.
    cos = np.abs(np.sum(p.components_.astype(np.float64) * evecs.T, axis=1))
    var_err = float(np.max(np.abs(p.explained_variance_ - evals) / evals))
    mean_err = float(np.max(np.abs(p.mean_ - mu)))
    print(f"check: |cosine| to the exact covariance eigenvectors: min {cos.min():.6f}; explained variance "
          f"max relative error {var_err:.1e}; means max error {mean_err:.1e}")
    if cos.min() < 0.999 or var_err > 1e-3 or mean_err > 1e-4:
        sys.exit("check failed: the components miss the covariance eigenvectors")

    # 5. For contrast, the uncentered SVD: its first right singular vector is the mean direction.
    plain = bl.svd(X, 1, power_iters=2, seed=0, memory=budget)
    mean_cos = abs(float(plain.Vt[0] @ means / np.linalg.norm(means)))
    print(f"uncentered svd: first component has |cosine| {mean_cos:.4f} with the column means")
    plain.delete()  # its temporary group: U and the arrays beside it

    # 6. What it cost: the SVD's passes plus one for the means, no centered copy written.
    print(f"cost: {rep['passes']} passes over X ({rep['passes_formula']}), {rep['seconds']:.1f} s, "
          f"wrote {rep['bytes_written'] / 2**20:.1f} MiB (X is {X.nbytes / 2**20:.0f} MiB), "
          f"process peak RSS {rep['peak_memory'] / 2**20:.0f} MiB (interpreter and libraries included)")
