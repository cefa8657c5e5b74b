"""Ridge regression on a matrix stored on disk, with lambda chosen by generalized cross-validation.

Run: ``python examples/ridge_regression.py`` (a few seconds; everything under a temporary folder).
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import numpy as np

import blocklin as bl


def main() -> None:
    folder = Path(tempfile.mkdtemp(prefix="blocklin-ridge-"))
    try:
        run(folder)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def run(folder: Path) -> None:
    m, n = 50_000, 200
    rng = np.random.default_rng(0)
    # A design matrix with decaying column scales (an ill-posed regression), stored as zarr.
    a = bl.random(folder / "A.zarr", (m, n), seed=1, chunks=(4096, n))
    scales = np.logspace(0, -4, n)
    x_true = rng.standard_normal((n, 1))
    b = bl.matmul(a, scales[:, None] * x_true).to_numpy() + 0.5 * rng.standard_normal((m, 1))
    bl.from_array(b, folder / "b.zarr", chunks=(4096, 1))

    # One pass over A (streaming QR), every lambda from the SVD of R, GCV picks one.
    fit = bl.solve(folder / "A.zarr", folder / "b.zarr", lam="gcv", out=folder / "x.zarr", memory="256MiB")
    r = fit.report
    print(f"GCV chose lambda = {r['lam']:.3g} ({r['method']}, {r['passes']} pass, {r['seconds']:.2f} s)")
    print(f"residual norm {r['residual_norm']:.4g}, solution norm {r['solution_norm']:.4g}")

    # A few fixed values at once (still one pass), and the fast normal-equations route for one value.
    path = bl.solve(folder / "A.zarr", folder / "b.zarr", lam=[1e-2, 1e-1, 1.0, 10.0], memory="256MiB")
    print("lambda path residual norms:", [f"{v:.4g}" for v in path.report["residual_norm"]])
    one = bl.solve(folder / "A.zarr", folder / "b.zarr", lam=r["lam"], memory="256MiB")
    print(f"normal equations at the GCV lambda: {one.report['method']} ({one.report['method_reason']}), "
          f"max difference to the QR solution {np.abs(one.to_numpy() - fit.to_numpy()).max():.1e}")


if __name__ == "__main__":
    main()
