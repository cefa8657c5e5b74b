"""Residual estimates and Newton-Schulz refinement of an approximate inverse, out of core.

Definitions used in every report
--------------------------------
``residual``
    ``||I - M X||_F``, either *exact* (computed tile by tile during a Newton-Schulz step) or
    *probed*: ``||P - M (X P)||_F / sqrt(k)`` with ``k = 32`` standard normal probe vectors ``P``, an
    unbiased estimate of ``||I - M X||_F^2`` in square (relative spread about ``sqrt(2/k) = 0.25``) that costs
    one pass over ``M`` (``X P`` comes free with the pass that writes ``X``).
``backward_error``
    ``||I - M X||_F / (||M||_F ||X||_F)``, the normwise residual of an inverse (Du Croz and Higham,
    1992); a backward stable inversion makes it a small multiple of the unit roundoff whatever the
    condition number, whereas ``||I - M X||`` itself grows like ``cond(M) * eps``.

Newton-Schulz (Schulz 1933; Pan and Schreiber 1991): ``X <- X (2I - M X) = X + X R`` with
``R = I - M X`` converges quadratically (``R <- R^2``) whenever ``||R|| < 1``. One step is two
out-of-core GEMMs (``4 n^3`` flops, twice a whole inversion), so :func:`blocklin.inv` only steps
when the cheap probed estimate says the tolerance is not met.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from blocklin.linalg._inv_kernels import InverseEpilogue, probe_kernel, transform_device
from blocklin.linalg.random import probes
from blocklin.runtime.blockops import BlockOps
from blocklin.runtime.passes import run_pass, source

#: Probe vectors of the residual estimate.
PROBES = 32


def default_tol(n: int, dtype: Any) -> float:
    """Default backward-error target: ``n * eps`` of ``dtype`` (at least ``16 eps``).

    ``n eps`` is the classical bound (``gamma_n``) on the backward error of a stable inversion;
    LAPACK's pivoted inverse usually does much better (``~sqrt(n) eps``), and so does one
    Newton-Schulz step (pass a smaller ``tol`` to ask for it).
    """
    eps = float(np.finfo(np.dtype(dtype)).eps)
    return max(16, n) * eps


#: A probed residual below this vouches for ``||I - M X||_F < 1``. With Gaussian probes the squared
#: estimate is ``||R||_F^2 chi2_k / k`` at worst (a rank-one ``R``), so a true ``||R||_F >= 1``
#: reads below 0.1 with probability ``P(chi2_32 < 0.32)``, under 1e-25.
PROBED_SAFE_RESIDUAL = 0.1


def is_inverse(residual: float, method: str) -> bool:
    """Whether ``X`` is verified to be an inverse of ``M``: ``||I - M X||_F < 1``.

    ``||R||_2 <= ||R||_F < 1`` makes ``M X`` nonsingular and bounds the relative forward error,
    ``||X - M^-1|| <= ||M^-1|| ||R||``; a singular ``M`` has ``||I - M X||_2 >= 1`` for every ``X``
    (the left null vector ``y`` gives ``y^T R = y^T``), whatever the normalised backward error says.
    An exact residual decides; a probed one vouches only when far below 1 (:data:`PROBED_SAFE_RESIDUAL`).
    """
    bound = 1.0 if method == "exact" else PROBED_SAFE_RESIDUAL
    return bool(np.isfinite(residual)) and residual < bound


def backward_error(residual: float, norm_m: float, norm_x: float) -> float:
    """``residual / (||M||_F ||X||_F)`` (``inf`` when a norm is zero or not finite)."""
    den = norm_m * norm_x
    if not (np.isfinite(residual) and np.isfinite(den)) or den == 0.0:
        return float("inf")
    return residual / den


def probe_estimate(job: Any, m: Any, w: np.ndarray, seed: int, *, description: str = "residual probe") -> float:
    """``||P - M W||_F / sqrt(k)`` for ``W = X P``: one row pass over ``M``; estimates ``||I - M X||_F``."""
    n, k = w.shape
    states, _ = run_pass(job, probe_kernel, [source(m, name="a")], {"w": w, "seed": seed, "n": n},
                         check_finite=False, description=description, device=probe_device(job, n))
    return math.sqrt(sum(s["sumsq"] for s in states) / k)


def probe_device(job: Any, n: int) -> str:
    """Where the probe passes run: as asked, or for ``auto`` where they win (``2 k`` flops per entry
    read with ``k`` = :data:`PROBES`: read-bound, so the CPU)."""
    return transform_device(job.cfg.device, n, 2.0 * PROBES, job.device)


def reduce_probe(results: list[dict], n: int, k: int, row_offset: int = 0) -> np.ndarray:
    """Sum the per-tile probe products ``tile @ P[cols]`` into ``X P`` (in key order: deterministic)."""
    w = np.zeros((n, k))
    for r in results:
        if "probe" in r:
            r0, block = r["probe"]
            w[row_offset + r0:row_offset + r0 + block.shape[0]] += block
    return w


def ns_residual(ops: BlockOps, m: Any, x: str, r: str, n: int, dtype: Any) -> float:
    """``R = I - M X`` into store ``r``; returns the exact ``||R||_F``."""
    res = ops.gemm(r, (0, 0), n, n, n, m.path, (0, 0), x, (0, 0), dtype=dtype, a_dtype=m.dtype, alpha=-1.0,
                   epilogue=InverseEpilogue(identity=True), description="Newton-Schulz: R = I - M X")
    return math.sqrt(sum(t["sumsq"] for t in res))


def ns_update(ops: BlockOps, x: str, r: str, x_new: str, n: int, dtype: Any, seed: int) -> tuple[float, np.ndarray]:
    """``X_new = X + X R`` (the Newton-Schulz step); returns ``||X_new||_F`` and ``X_new P``."""
    res = ops.gemm(x_new, (0, 0), n, n, n, x, (0, 0), r, (0, 0), dtype=dtype, c=x, beta=1.0,
                   epilogue=InverseEpilogue(probe=(seed, PROBES, n)), description="Newton-Schulz: X + X R")
    return math.sqrt(sum(t["sumsq"] for t in res)), reduce_probe(res, n, PROBES)


def ns_product(ops: BlockOps, x: str, z: str, out: str, n: int, dtype: Any, seed: int) -> tuple[float, np.ndarray]:
    """``out = X Z`` (the preconditioned restart ``X (M X)^-1``); returns ``||out||_F`` and ``out P``."""
    res = ops.gemm(out, (0, 0), n, n, n, x, (0, 0), z, (0, 0), dtype=dtype,
                   epilogue=InverseEpilogue(probe=(seed, PROBES, n)), description="restart: X (M X)^-1")
    return math.sqrt(sum(t["sumsq"] for t in res)), reduce_probe(res, n, PROBES)


__all__ = ["PROBED_SAFE_RESIDUAL", "PROBES", "backward_error", "default_tol", "is_inverse", "ns_product",
           "ns_residual", "ns_update", "probe_estimate",
           "probes", "reduce_probe"]
