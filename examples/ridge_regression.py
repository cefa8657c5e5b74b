"""Ridge regression on a matrix stored on disk, with lambda chosen by generalized cross-validation.

    python examples/ridge_regression.py [rows] [budget]

By default the design matrix is 100,000 x 200 float64 (153 MiB on disk) and every step runs within a
budget of a third of it (51 MiB), so A is streamed, never held. ``BLOCKLIN_EXAMPLE_SIZE=small`` uses 20,000 rows (the test suite does). Everything,
the engine's intermediates included, is written under a temporary folder removed at the end.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np

import blocklin as bl


def main() -> None:
    small = os.environ.get("BLOCKLIN_EXAMPLE_SIZE") == "small"
    m = int(sys.argv[1]) if len(sys.argv) > 1 else (20_000 if small else 100_000)
    n = 200
    # a third of A: every step streams A (the solver's passes, the checks' products)
    budget = bl.config.parse_size(sys.argv[2]) if len(sys.argv) > 2 else m * n * 8 // 3
    folder = Path(tempfile.mkdtemp(prefix="blocklin-ridge-"))
    try:
        with bl.config.set(temp_dir=str(folder), memory=budget):
            run(folder, m, n, bl.config.format_size(budget))
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def run(folder: Path, m: int, n: int, budget: str) -> None:
    rng = np.random.default_rng(0)
    # 1. Data in: a design matrix stored as zarr, and a response whose coefficients decay (an
    #    ill-posed regression: most of x_true is below the noise).
    # chunks of whole rows, at most a twentieth of A: the streaming QR that method="auto" may switch to
    # (an ill-conditioned A^T A) holds a strip of at least one chunk row band per task
    rows = min(4096, max(256, m // 20))
    a = bl.random(folder / "A.zarr", (m, n), seed=1, chunks=(rows, n))
    scales = np.logspace(0, -4, n)
    x_true = rng.standard_normal((n, 1))
    b = bl.matmul(a, scales[:, None] * x_true).to_numpy() + 0.5 * rng.standard_normal((m, 1))
    bl.from_array(b, folder / "b.zarr", chunks=(rows, 1))
    print(f"A: {m} x {n} float64, {a.nbytes / 2**20:.0f} MiB on disk, budget {budget}")

    # 2. One pass over A (its Gram matrix, or the streaming QR where A^T A is ill-conditioned), every
    #    lambda from the spectrum, GCV picks one.
    fit = bl.solve(folder / "A.zarr", folder / "b.zarr", lam="gcv", out=folder / "x.zarr")
    r = fit.report
    print(f"GCV chose lambda = {r['lam']:.3g} ({r['method']}, {r['passes']} pass, {r['seconds']:.2f} s)")
    print(f"residual norm {r['residual_norm']:.4g}, solution norm {r['solution_norm']:.4g}")

    # 3. A few fixed values at once (still one pass), and the fast normal-equations route for one value.
    path = bl.solve(folder / "A.zarr", folder / "b.zarr", lam=[1e-2, 1e-1, 1.0, 10.0])
    print("lambda path residual norms:", [f"{v:.4g}" for v in np.ravel(path.report["residual_norm"])])
    one = bl.solve(folder / "A.zarr", folder / "b.zarr", lam=r["lam"])
    x = fit.to_numpy()
    print(f"normal equations at the GCV lambda: {one.report['method']} ({one.report['method_reason']}), "
          f"max difference to the QR solution {np.abs(one.to_numpy() - x).max():.1e}")

    # 4. Check, independently of the solver: the optimality condition A^T (b - A x) = lam^2 x, with
    #    two streamed products (A x, then A^T r) and a Dask reduction for ||A||_F^2. A backward-stable
    #    solve leaves a scaled residual of order eps; 100 * n * eps allows for the n-term sums.
    lam = r["lam"]
    resid = b - bl.matmul(a, x).to_numpy()
    grad = bl.matmul(a, resid, trans_a=True).to_numpy() - lam**2 * x
    fro2 = float((a.to_dask() ** 2).sum().compute())
    scaled = np.linalg.norm(grad) / (fro2 * np.linalg.norm(x))
    print(f"check: optimality residual ||A^T (b - A x) - lam^2 x|| / (||A||_F^2 ||x||) = {scaled:.1e}")
    if scaled > 100 * n * np.finfo(np.float64).eps:
        sys.exit("check failed: the solution does not satisfy the normal equations")

    # 5. What it cost.
    print(f"cost: QR fit {r['seconds']:.2f} s in {r['passes']} pass, process peak RSS "
          f"{r['peak_memory'] / 2**20:.0f} MiB (interpreter and libraries included)")


if __name__ == "__main__":
    main()
