"""PCA of a matrix larger than the memory budget: top components by randomized SVD, out of core.

    python examples/pca_out_of_core.py [rows] [budget]

The data are 50 latent factors plus noise (zero-mean by construction), 200,000 x 300 float64
(458 MiB) written to zarr in bounded memory, then analysed within an eighth of its size (57 MiB; the
planner's minimum instead, should that not hold its plan).
``BLOCKLIN_EXAMPLE_SIZE=small`` uses 20,000 rows (the test suite does). The column means are checked
with one streamed product (``X^T 1 / m`` through the LinearOperator); for data that are not centered,
``blocklin.pca`` (or ``svd(center=True)``) centers inside the passes without a copy (see
``examples/pca_centered.py``). Everything is written under a temporary folder that is removed at
the end.
"""

import os
import sys
import tempfile

import dask.array as da
import numpy as np

import blocklin as bl

small = os.environ.get("BLOCKLIN_EXAMPLE_SIZE") == "small"
m = int(sys.argv[1]) if len(sys.argv) > 1 else (20_000 if small else 200_000)
n, r = 300, 50


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
    # 1. Data in: scores @ loadings + noise, computed and written 2048 rows at a time by Dask.
    rng = np.random.default_rng(0)
    loadings = rng.standard_normal((r, n)) * np.exp(-np.arange(r) / 10)[:, None]
    scores = da.random.default_rng(1).standard_normal((m, r), chunks=(2048, r))
    noise = 0.01 * da.random.default_rng(2).standard_normal((m, n), chunks=(2048, n))
    X = bl.from_array(scores @ loadings + noise, f"{d}/X.zarr", chunks=(2048, n))
    budget = bl.config.parse_size(sys.argv[2]) if len(sys.argv) > 2 else X.nbytes // 8  # X never fits
    print(f"X: {X.shape}, {X.nbytes / 2**20:.0f} MiB on disk, budget {bl.config.format_size(budget)}")

    # 2. One streamed pass: the column means (zero by construction, up to sampling noise).
    op = bl.aslinearoperator(X, memory=budget)
    mean = op.rmatvec(np.ones(m)) / m
    print(f"column means: max |mean| = {np.abs(mean).max():.2e} (one pass)")

    # 3. The top 10 components: randomized SVD with 2 power iterations (a few passes over X).
    res, budget = within_budget(lambda mem: bl.svd(X, 10, method="rsvd", power_iters=2, seed=0, memory=mem), budget)
    U, s, Vt = res
    rep = res.report
    print(f"top-10 explained variances: {np.round(s**2 / (m - 1), 3)}")

    # 4. Check: the components span the population's top-10 principal axes (sign-free: the cosines
    #    of the principal angles between the two subspaces are all close to 1).
    ref = np.linalg.eigh(loadings.T @ loadings)[1][:, -10:]
    cosines = np.linalg.svd(ref.T @ Vt.T, compute_uv=False)
    print(f"check: cosines of principal angles to the true top-10 loading space: min {cosines.min():.4f}, "
          f"max relative residual {max(rep['relative_residuals']):.1e}")
    if cosines.min() < 0.99:
        sys.exit("check failed: the components miss the true principal axes")

    # 5. What it cost, and what came back (U is stored: m x 10 is as tall as X).
    print(f"cost: {rep['passes']} passes over X ({rep['passes_formula']}), {rep['seconds']:.1f} s, "
          f"process peak RSS {rep['peak_memory'] / 2**20:.0f} MiB (interpreter and libraries included)")
    print("U is", type(U).__name__, U.shape)
