"""Eigenpairs of a stored sparse symmetric matrix (a graph's adjacency or Laplacian), out of core:
thick-restarted block Lanczos (:func:`blocklin.linalg.lowrank.lanczos.block_lanczos`, as
:func:`blocklin.eigsh` of a dense store) whose every step is one product ``S X`` streamed over the
row blocks (:class:`blocklin.sparse.SparseOperator`: one row block in memory), never a dense copy;
where the row blocks fit the budget beside the bases, they are read once and every step multiplies
the blocks held in memory (:func:`blocklin.runtime.sparse_pass.hold_blocks`, the same bits).

The first step also forms ``S^T X`` for its random block and refuses a matrix whose
``||S X - S^T X|| > sqrt(eps) ||S X||`` (a sampled check: a random block detects any asymmetry with
probability one), as the dense route does. ``laplacian=`` takes ``S`` as a graph's adjacency and
finds the eigenpairs of its Laplacian (:mod:`blocklin.linalg.lowrank.laplacian`: one degree pass
more, the Laplacian never formed).

References
----------
G. H. Golub, R. Underwood, "The block Lanczos method for computing eigenvalues", Mathematical
Software III, 1977; K. Wu, H. Simon, "Thick-restart Lanczos method for large symmetric eigenvalue
problems", SIAM J. Matrix Anal. Appl. 22(2), 2000.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from blocklin.errors import ConvergenceWarning, NotSymmetricError, ParameterError, explain, warn
from blocklin.linalg.blocks.orth import orth_against
from blocklin.linalg.blocks.random import STREAM_LANCZOS, gaussian
from blocklin.linalg.blocks.results import GROUP_REPORT_KEYS
from blocklin.linalg.lowrank.lanczos import block_lanczos, default_tol
from blocklin.linalg.lowrank.laplacian import laplacian_operator
from blocklin.plan.svd import client_bytes, default_basis, default_block
from blocklin.runtime.job import Job
from blocklin.runtime.sparse_pass import check_products, hold_blocks
from blocklin.storage.zarr_store import create_group, write_array
from blocklin.validate import check_k, start_vector


def sparse_eigsh(s: Any, k: int, *, which: str, tol: float | None, max_passes: int, block_size: int | None,
                 max_basis: int | None, seed: int, order: str, check_symmetric: bool, v0: Any, laplacian: str | None,
                 out: Any, overwrite: bool, refused: dict, settings: dict) -> tuple[np.ndarray, np.ndarray, dict]:
    """``(w, V, report)``: ``k`` eigenpairs of the stored sparse symmetric ``s``, or of the Laplacian
    (``laplacian``) of the graph whose adjacency it is (see module notes); ``out``: a zarr group with
    ``w``, ``V`` and the report, as the dense route writes."""
    asked = [name for name, on in refused.items() if on]
    if asked:
        raise ParameterError(explain(asked[0], "is not available for a sparse matrix (its eigenpairs come from "
                                     "products streamed over the row blocks, held in memory)", f"{asked[0]} given",
                                     "drop it (resume= and center= need a dense store: blocklin convert --dense)"))
    m, n = s.shape
    if m != n:
        raise ParameterError(explain("a", "must be square and symmetric (eigsh)", f"a sparse {m} x {n} matrix",
                                     "use blocklin.svd for rectangular matrices"))
    check_k(k, n, n)
    v0 = start_vector(v0, n)
    block = block_size or default_block(k, 10, n)
    basis = max_basis or max(k + block, min(default_basis(k, 10, block), n))  # as plan_svd
    with Job("eigsh", **settings) as job:
        ao = None
        if out is not None:
            ao = job.output(out, inputs=[s.path], overwrite=overwrite, size=((n, k), s.dtype))
            create_group(ao.array_path())
        op = s.aslinearoperator()
        dt = np.dtype(np.float64) if laplacian else op.dtype  # integer values and Laplacians: float64
        # the Lanczos bases and Ritz vectors (and a Laplacian's degrees) stay in memory beside every
        # product: the whole call's need refused up front, and the products' tasks take what is left
        reserved = client_bytes("eigsh", n, k, block, basis, None) + (2 * n * 8 if laplacian else 0)
        need = check_products(s._store, [(block, False)] + ([(block, True)] if check_symmetric else []), 8,
                              op.dtype, job.cfg.memory, reserved)
        # the row blocks read once and held between the steps where they fit beside that (sparse_pass)
        job.client_reserved = reserved + hold_blocks(job, s._store, op.dtype, need, reserved)
        tol = default_tol(dt) if tol is None else tol
        found: dict = {}
        if laplacian:
            op, found = laplacian_operator(op, laplacian)
            job.stats["sparse_reads"] = job.stats.get("sparse_reads", 0) + 1  # the degree pass
        passes = {"n": 1 if laplacian else 0}

        def apply(x: np.ndarray, step: int) -> np.ndarray:
            passes["n"] += 1
            return np.asarray(op.matmat(x), dtype=np.float64)

        g = gaussian(seed, STREAM_LANCZOS, 0, n, block)
        if v0 is not None:
            g[:, 0] = v0
        x0 = orth_against(None, g, seed=seed)
        first = apply(x0, 0)
        if check_symmetric:
            t = np.asarray(op.rmatmat(x0), dtype=np.float64)
            passes["n"] += 1
            gap = float(np.linalg.norm(first - t))
            if gap > symmetry_rtol(s.dtype) * max(float(np.linalg.norm(first)), np.finfo(np.float64).tiny):
                raise NotSymmetricError(explain("a", "must be symmetric (eigsh)", f"||S X - S^T X|| = {gap:.3g} for "
                                                "a random block", "use blocklin.svd, or symmetrize: (S + S^T) / 2"))
        scale = {"v": 0.0}

        def threshold(theta: np.ndarray) -> np.ndarray:
            scale["v"] = max(scale["v"], float(np.max(np.abs(theta))) if theta.size else 0.0)
            return np.full(theta.shape, tol * max(scale["v"], np.finfo(np.float64).tiny))

        res = block_lanczos(apply, n, k, which=which, block=block, max_basis=basis, max_steps=max_passes,
                            threshold=threshold, seed=seed, x0=x0, first=first)
        if not res.converged:
            warn(f"eigsh: tol={tol:g} not reached within {passes['n']} passes over the sparse matrix; raise "
                 "max_passes or loosen tol", ConvergenceWarning)
        idx = eigen_order(res.values, order, which)
        w = res.values[idx].astype(dt)
        V = np.ascontiguousarray(res.vectors[:, idx]).astype(dt)
        report = job.report(method="lanczos (sparse row blocks)", passes=passes["n"],
                            residuals=np.asarray(res.residuals)[idx].tolist(), converged=bool(res.converged), tol=tol,
                            which=which, order=order, block=block, max_basis=basis, steps=res.steps,
                            lanczos_steps=res.steps, restarts=res.restarts, nnz=s.nnz, seed=seed, **found)
        if ao is not None:
            for name, x in (("w", w), ("V", V)):
                write_array(ao.array_path(name), x)
            params = {"k": k, "method": "lanczos", "which": which, "order": order, "laplacian": laplacian}
            report["output"] = str(ao.commit("eigsh", params=params, report=job.brief(
                report, GROUP_REPORT_KEYS + ("nnz", "laplacian", "isolated_nodes"))))
    return w, V, report


def eigen_order(values: np.ndarray, order: str, which: str) -> np.ndarray:
    """The indices putting eigenvalues in ``order``; descending ``"LM"`` puts the largest magnitude first."""
    key = values if order == "ascending" else -values
    if order == "descending" and which == "LM":
        key = -np.abs(values)
    return np.argsort(key, kind="stable")


def symmetry_rtol(dtype: Any) -> float:
    """Relative asymmetry ``||A X - A^T X|| / ||A X||`` tolerated by :func:`blocklin.eigsh`: ``sqrt(eps)``
    of the dtype (float64 for integer values; of complex data, its parts' and ``A^H X``)."""
    dt = np.dtype(dtype)
    return math.sqrt(float(np.finfo(dt if dt.kind in "fc" else np.float64).eps))


__all__ = ["eigen_order", "sparse_eigsh", "symmetry_rtol"]
