"""Eigenpairs of a stored sparse symmetric matrix (a graph's adjacency or Laplacian), out of core:
thick-restarted block Lanczos (:func:`blocklin.linalg.lowrank.lanczos.block_lanczos`, as
:func:`blocklin.eigsh` of a dense store) whose every step is one product ``S X`` streamed over the
row blocks (:class:`blocklin.sparse.SparseOperator`: one row block in memory), never a dense copy.

The first step also forms ``S^T X`` for its random block and refuses a matrix whose
``||S X - S^T X|| > sqrt(eps) ||S X||`` (a sampled check: a random block detects any asymmetry with
probability one), as the dense route does.

References
----------
G. H. Golub, R. Underwood, "The block Lanczos method for computing eigenvalues", Mathematical
Software III, 1977; K. Wu, H. Simon, "Thick-restart Lanczos method for large symmetric eigenvalue
problems", SIAM J. Matrix Anal. Appl. 22(2), 2000.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from blocklin.errors import ConvergenceWarning, NotSymmetricError, ParameterError, explain, warn
from blocklin.linalg.blocks.orth import orth_against
from blocklin.linalg.blocks.random import STREAM_LANCZOS, gaussian
from blocklin.linalg.lowrank.lanczos import block_lanczos
from blocklin.plan.svd import default_block
from blocklin.validate import check_k, start_vector


def sparse_eigsh(s: Any, k: int, *, which: str, tol: float, max_passes: int, block_size: int | None,
                 max_basis: int | None, seed: int, order: str, symmetry_rtol: float | None, v0: Any,
                 refused: dict) -> tuple[np.ndarray, np.ndarray, dict]:
    """``(w, V, report)``: ``k`` eigenpairs of the stored sparse symmetric ``s`` (see module notes);
    ``symmetry_rtol``: the relative asymmetry tolerated (None: not checked)."""
    asked = [name for name, on in refused.items() if on]
    if asked:
        raise ParameterError(explain(asked[0], "is not available for a sparse matrix (its eigenpairs come from "
                                     "products streamed over the row blocks, held in memory)", f"{asked[0]} given",
                                     "drop it (out=, resume=, center= need a dense store: blocklin convert --dense)"))
    m, n = s.shape
    if m != n:
        raise ParameterError(explain("a", "must be square and symmetric (eigsh)", f"a sparse {m} x {n} matrix",
                                     "use blocklin.svd for rectangular matrices"))
    check_k(k, n, n)
    v0 = start_vector(v0, n)
    block = block_size or default_block(k, 10, n)
    basis = max_basis or 3 * block
    op = s.aslinearoperator()
    t0 = time.perf_counter()
    passes = {"n": 0}

    def apply(x: np.ndarray, step: int) -> np.ndarray:
        passes["n"] += 1
        return np.asarray(op.matmat(x), dtype=np.float64)

    g = gaussian(seed, STREAM_LANCZOS, 0, n, block)
    if v0 is not None:
        g[:, 0] = v0
    x0 = orth_against(None, g, seed=seed)
    first = apply(x0, 0)
    if symmetry_rtol is not None:
        t = np.asarray(op.rmatmat(x0), dtype=np.float64)
        passes["n"] += 1
        gap = float(np.linalg.norm(first - t))
        if gap > symmetry_rtol * max(float(np.linalg.norm(first)), np.finfo(np.float64).tiny):
            raise NotSymmetricError(explain("a", "must be symmetric (eigsh)", f"||S X - S^T X|| = {gap:.3g} for a "
                                            "random block", "use blocklin.svd, or symmetrize: (S + S^T) / 2"))
    scale = {"v": 0.0}

    def threshold(theta: np.ndarray) -> np.ndarray:
        scale["v"] = max(scale["v"], float(np.max(np.abs(theta))) if theta.size else 0.0)
        return np.full(theta.shape, tol * max(scale["v"], np.finfo(np.float64).tiny))

    res = block_lanczos(apply, n, k, which=which, block=block, max_basis=basis, max_steps=max_passes,
                        threshold=threshold, seed=seed, x0=x0, first=first)
    if not res.converged:
        warn(f"eigsh: tol={tol:g} not reached within {passes['n']} passes over the sparse matrix; raise max_passes "
             "or loosen tol", ConvergenceWarning)
    idx = np.argsort(res.values)[::-1] if order == "descending" else np.argsort(res.values)
    w = res.values[idx].astype(s.dtype)
    V = np.ascontiguousarray(res.vectors[:, idx]).astype(s.dtype)
    report = {"method": "lanczos (sparse row blocks)", "passes": passes["n"], "seconds": time.perf_counter() - t0,
              "residuals": np.asarray(res.residuals)[idx].tolist(), "converged": bool(res.converged), "tol": tol,
              "which": which, "order": order, "block": block, "max_basis": basis, "steps": res.steps,
              "restarts": res.restarts, "nnz": s.nnz, "seed": seed}
    return w, V, report


__all__ = ["sparse_eigsh"]
