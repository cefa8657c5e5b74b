"""Factor a kernel matrix larger than the memory budget and solve kernel ridge regression with it.

    python examples/factor_kernel_matrix.py [n] [budget]

By default the RBF kernel matrix of 8,192 points (512 MiB float64) is built tile by tile, factored
by the out-of-core Cholesky and used for a solve, all within a fifth of its size (102 MiB; the
Cholesky planner's minimum instead, should that not hold its tiles). ``BLOCKLIN_EXAMPLE_SIZE=small``
uses 1,500 points (the test suite does). Everything is
written under a temporary folder removed at the end.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np
import zarr

import blocklin as bl


def rbf_kernel_to_zarr(path: Path, x: np.ndarray, width: float, ridge: float, chunk: int) -> None:
    """``K = exp(-|x_i - x_j|^2 / (2 width^2)) + ridge I``, one chunk at a time (never whole in memory)."""
    n = x.shape[0]
    k = zarr.create_array(str(path), shape=(n, n), dtype="float64", chunks=(chunk, chunk), compressors=None)
    sq = np.einsum("ij,ij->i", x, x)
    for i in range(0, n, chunk):
        for j in range(0, n, chunk):
            xi, xj = x[i:i + chunk], x[j:j + chunk]
            d2 = np.maximum(sq[i:i + chunk, None] + sq[None, j:j + chunk] - 2 * xi @ xj.T, 0.0)
            blk = np.exp(-d2 / (2 * width**2))
            if i == j:
                blk[np.diag_indices_from(blk)] += ridge
            k[i:i + chunk, j:j + chunk] = blk


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


def main() -> None:
    small = os.environ.get("BLOCKLIN_EXAMPLE_SIZE") == "small"
    n = int(sys.argv[1]) if len(sys.argv) > 1 else (1500 if small else 8192)
    budget = bl.config.parse_size(sys.argv[2]) if len(sys.argv) > 2 else n * n * 8 // 5  # K never fits
    folder = Path(tempfile.mkdtemp(prefix="blocklin-kernel-"))
    try:
        with bl.config.set(temp_dir=str(folder)):
            run(folder, n, budget)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def run(folder: Path, n: int, budget: int) -> None:
    rng = np.random.default_rng(0)
    # 1. Data: noisy samples of a smooth function of 3 variables; the kernel matrix with a ridge
    #    (the ridge makes K well conditioned: cond(K) <= 1 + ||K_rbf|| / ridge).
    x = rng.uniform(-1, 1, (n, 3))
    y = np.sin(3 * x[:, :1]) * np.cos(2 * x[:, 1:2]) + x[:, 2:] ** 2 + 0.05 * rng.standard_normal((n, 1))
    ridge = 1e-3 * n
    rbf_kernel_to_zarr(folder / "K.zarr", x, width=0.5, ridge=ridge, chunk=256)
    bl.from_array(y, folder / "y.zarr", chunks=(256, 1))
    _, budget = within_budget(lambda mem: bl.cholesky(folder / "K.zarr", explain=True, memory=mem), budget)
    print(f"K: {n} x {n} float64, {n * n * 8 / 2**20:.0f} MiB on disk, budget {bl.config.format_size(budget)}")
    with bl.config.set(memory=budget):  # every step below, within the budget the plan accepted
        factor_and_solve(folder, n, y, ridge)


def factor_and_solve(folder: Path, n: int, y: np.ndarray, ridge: float) -> None:
    # 2. The factor K = L L^T, out of core, tile by tile.
    chol = bl.cholesky(folder / "K.zarr", folder / "L.zarr")
    r = chol.report
    print(f"Cholesky: {r['tasks']} tile tasks of {r['plan']['tile']} in {r['seconds']:.2f} s "
          f"({r['gflops']:.1f} GFLOP/s), peak RSS {r['peak_memory'] / 2**20:.0f} MiB")

    # 3. Kernel ridge regression weights: K alpha = y, via the factor (two triangular solves) ...
    z = bl.solve_triangular(chol, folder / "y.zarr", lower=True)
    alpha_l = bl.solve_triangular(chol, z, lower=True, trans=True).to_numpy()
    # ... and in one call, which also refines the solution to float64 backward error.
    fit = bl.solve(folder / "K.zarr", folder / "y.zarr", assume_a="pos", out=folder / "alpha.zarr")
    f = fit.report
    alpha = fit.to_numpy()
    print(f"solve(assume_a='pos'): {f['method']}, {f['refine_steps']} refinement step(s), backward error "
          f"{f['backward_error']:.1e} in {f['seconds']:.2f} s")
    print(f"the two solutions differ by {np.abs(alpha - alpha_l).max() / np.abs(alpha).max():.1e} (relative)")

    # 4. Check, independently of the solver: the residual of K alpha = y from an out-of-core GEMM,
    #    as a normwise backward error; a backward-stable solve leaves order eps (allow sqrt(n) eps).
    resid = y - bl.matmul(folder / "K.zarr", alpha).to_numpy()
    norm_k = float(np.sqrt((bl.open(folder / "K.zarr").to_dask() ** 2).sum().compute()))
    eta = np.linalg.norm(resid) / (norm_k * np.linalg.norm(alpha) + np.linalg.norm(y))
    print(f"check: backward error ||y - K alpha|| / (||K||_F ||alpha|| + ||y||) = {eta:.1e}")
    if eta > np.sqrt(n) * np.finfo(np.float64).eps:
        sys.exit("check failed: the solution does not solve K alpha = y to float64 accuracy")
    fitted = bl.matmul(folder / "K.zarr", alpha).to_numpy() - ridge * alpha  # predictions of the kernel model
    print(f"training RMSE {np.sqrt(np.mean((fitted - y) ** 2)):.3f} (noise level 0.05)")


if __name__ == "__main__":
    main()
