"""Eigenpairs of a stored sparse symmetric matrix (a graph's adjacency or Laplacian), out of core:
thick-restarted block Lanczos (:func:`blocklin.linalg.lowrank.lanczos.block_lanczos`, as
:func:`blocklin.eigsh` of a dense store) whose every step is one product ``S X`` streamed over the
row blocks (:class:`blocklin.sparse.SparseOperator`: one row block in memory), never a dense copy;
where the row blocks fit the budget beside the bases, they are read once and every step multiplies
the blocks held in memory (:func:`blocklin.runtime.sparse_pass.hold_blocks`, the same bits). Where the
Lanczos bases themselves do not fit beside the products, they are spilled to the job's work folder
(:mod:`blocklin.linalg.lowrank.basis_budget`; the same bits), the block shrunk to what the budget holds,
and the Ritz vectors written to the output strip by strip (a :class:`~blocklin.Matrix` on a temporary
group without ``out=``).

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
from blocklin.linalg.blocks.results import GROUP_REPORT_KEYS
from blocklin.linalg.blocks.scaling import ProductScaling, check_result_range, unscale, unscale_float
from blocklin.linalg.lowrank.basis import Columns, spilled_bases
from blocklin.linalg.lowrank.basis_budget import BasisPlan, plan_bases
from blocklin.linalg.lowrank.lanczos import (block_lanczos, check_basis_reaches_k, default_tol, repeated_beyond_block,
                                             start_block)
from blocklin.linalg.lowrank.laplacian import laplacian_operator
from blocklin.matrix import Matrix
from blocklin.operands import temp_root
from blocklin.plan.svd import default_basis, sparse_basis, sparse_block
from blocklin.runtime.job import Job
from blocklin.runtime.sparse_pass import hold_blocks
from blocklin.sparse import refuse_nonfinite_entries
from blocklin.storage.zarr_store import create_array, create_group, write_array, write_block
from blocklin.validate import check_k, start_vector


def sparse_eigsh(s: Any, k: int, *, which: str, tol: float | None, max_passes: int, block_size: int | None,
                 max_basis: int | None, seed: int, order: str, check_symmetric: bool, v0: Any, laplacian: str | None,
                 out: Any, overwrite: bool, refused: dict, settings: dict,
                 own_open: bool = False) -> tuple[np.ndarray, Any, dict, Any]:
    """``(w, V, report, output)``: ``k`` eigenpairs of the stored sparse symmetric ``s``, or of the Laplacian
    (``laplacian``) of the graph whose adjacency it is (see module notes); ``out``: a zarr group with
    ``w``, ``V`` and the report, as the dense route writes (``output``: its Location, None without);
    ``own_open``: ``s`` was opened by the caller from a path, for this run (its stamp taken unchecked)."""
    asked = [name for name, on in refused.items() if on]
    if asked:
        raise ParameterError(explain(asked[0], "is not available for a sparse matrix (its eigenpairs come from "
                                     "products streamed over the row blocks, held in memory)", f"{asked[0]} given",
                                     "drop it (resume= and center= need a dense store: blocklin convert --dense)"))
    m, n = s.shape
    if m != n:
        raise ParameterError(explain("a", "must be square and symmetric (eigsh)", f"a sparse {m} x {n} matrix",
                                     "use blocklin.svd for rectangular matrices"))
    check_k(k, n, n, eig=True)
    v0 = start_vector(v0, n)
    block, max_basis = eigsh_defaults(k, n, block_size, max_basis)
    with Job("eigsh", **settings) as job:
        # as opened, before its first read (``own_open``: opened by eigsh from a path): refused if S changed since
        job.stamp_input(s.location, s.stamp, own_open=own_open)
        ao = None
        if out is not None:
            ao = job.output(out, inputs=[s.path], overwrite=overwrite, size=((n, k), s.dtype),
                            covered=[(s.path, n)])  # the rows read (an append may commit after S was opened)
            create_group(ao.array_path())
        op = s.aslinearoperator()
        dt = np.dtype(np.float64) if laplacian else op.dtype  # integer values and Laplacians: float64
        # the Lanczos bases (in memory, or spilled to the work folder where they do not fit) and the step's
        # work beside every product: the whole call's need refused up front, the products' tasks take the rest
        bp = eigsh_bases(s, n, k, block=block, max_basis=max_basis, block_given=block_size is not None,
                         check_symmetric=check_symmetric, laplacian=laplacian, budget=job.cfg.memory,
                         spill_ok=temp_root(job.cfg).is_local)
        check_basis_reaches_k(k, bp.block, max_passes, n)
        # the row blocks read once and held between the steps where they fit beside that (sparse_pass)
        job.client_reserved = bp.reserved + hold_blocks(job, s._store, op.dtype, bp.need, bp.reserved,
                                                         offdiagonal=bool(laplacian))
        tol = default_tol(dt) if tol is None else tol
        found: dict = {}
        if laplacian:
            op, found = laplacian_operator(op, laplacian)
            job.stats["sparse_reads"] = job.stats.get("sparse_reads", 0) + 1  # the degree pass
        passes = {"n": 1 if laplacian else 0}
        # Lanczos runs on 2^-e S, e learned from the first product (entries near the range's ends)
        scaling = ProductScaling(dt)

        def product(x: np.ndarray, transposed: bool = False) -> np.ndarray:
            x = scaling.into(x)
            with np.errstate(over="ignore", under="ignore"):  # the first product: learn() refuses Inf, scales
                return np.asarray(op.rmatmat(x) if transposed else op.matmat(x), dtype=np.float64)

        def apply(x: np.ndarray, step: int) -> np.ndarray:
            passes["n"] += 1
            first = not scaling.known
            y = product(x)
            if first and not np.isfinite(y).all():  # a stored NaN or Inf: named where it is
                refuse_nonfinite_entries(s)
            z = scaling.learn(y)
            if first and scaling.first_lost_digits:  # a first product near the subnormals: again, scaled
                passes["n"] += 1
                z = scaling.learn(product(x))
            if step == 1 and check_symmetric:  # the first block's S^T X: a sampled symmetry check
                passes["n"] += 1
                gap = float(np.linalg.norm(z - scaling.learn(product(x, transposed=True))))  # both of 2^-e S
                if gap > symmetry_rtol(s.dtype) * max(float(np.linalg.norm(z)), np.finfo(np.float64).tiny):
                    gap = unscale_float(gap, scaling.exponent)
                    raise NotSymmetricError(explain("a", "must be symmetric (eigsh)", f"||S X - S^T X|| = {gap:.3g} "
                                                    "for a random block", "use blocklin.svd, or symmetrize: "
                                                    "(S + S^T) / 2"))
            return z

        largest = {"v": 0.0}

        def threshold(theta: np.ndarray) -> np.ndarray:
            largest["v"] = max(largest["v"], float(np.max(np.abs(theta))) if theta.size else 0.0)
            return np.full(theta.shape, tol * max(largest["v"], np.finfo(np.float64).tiny))

        # the starting block made in the call: nothing here keeps it (or the first image) past its step
        res = block_lanczos(apply, n, k, which=which, block=bp.block, max_basis=bp.max_basis, max_steps=max_passes,
                            threshold=threshold, seed=seed, x0=_start(n, bp.block, seed, v0),
                            bases=(lambda n_, cap, wd: spilled_bases(job, n_, cap, wd)) if bp.spilled else None)
        check_basis_reaches_k(k, bp.block, max_passes, n, found=len(res.values))
        if res.note:
            warn(f"eigsh: {res.note}", ConvergenceWarning)
        if not res.residuals_converged:  # said beside a note too: the note is about the pairs that converged
            warn(f"eigsh: tol={tol:g} not reached within {passes['n']} passes over the sparse matrix; raise "
                 "max_passes or loosen tol", ConvergenceWarning)
        idx = eigen_order(res.values, order, which)
        w = unscale(res.values[idx], scaling.exponent)
        check_result_range("a", w, dt, "eigenvalues")
        w = w.astype(dt)
        vectors, res.residual_vectors = res.vectors, None  # the residual vectors are not wanted here
        residuals = unscale(np.asarray(res.residuals, dtype=np.float64)[idx], scaling.exponent)
        report = job.report(method="lanczos (sparse row blocks)", passes=passes["n"], scaling=scaling.report(),
                            residuals=residuals.tolist(), converged=bool(res.converged), tol=tol,
                            which=which, order=order, block=bp.block, max_basis=bp.max_basis, steps=res.steps,
                            lanczos_steps=res.steps, restarts=res.restarts, nnz=s.nnz, seed=seed, **bp.report(),
                            **found, **(repeated_beyond_block(res.repeated) if res.repeated else {}))
        if isinstance(vectors, Columns):  # spilled: V goes from the bases' file to a store, strip by strip
            if ao is None:  # a temporary group the caller owns, as the dense routes return large factors
                ao = job.output(None, inputs=[s.path], size=((n, k), s.dtype))
                create_group(ao.array_path())
            write_columns(vectors, idx, dt, ao.array_path("V"))
            write_array(ao.array_path("w"), w)
            V = None
        else:
            V = np.ascontiguousarray(vectors[:, idx]).astype(dt, copy=False)
            if ao is not None:
                for name, x in (("w", w), ("V", V)):
                    write_array(ao.array_path(name), x)
        del vectors, res
        path = None
        if ao is not None:
            params = {"k": k, "method": "lanczos", "which": which, "order": order, "laplacian": laplacian}
            path = ao.commit("eigsh", params=params, report=job.brief(
                report, GROUP_REPORT_KEYS + ("nnz", "laplacian", "isolated_nodes", "basis_spilled", "basis_bytes")))
            report["output"] = str(path)
            if V is None:  # spilled: the stored V, a temporary group's where out was not given
                V = Matrix(path / "V", report=report, temporary=out is None)
    return w, V, report, path


def _start(n: int, block: int, seed: int, v0: np.ndarray | None) -> np.ndarray:
    """The orthonormal starting block (``v0`` its first column): the dense route's
    (:func:`~blocklin.linalg.lowrank.lanczos.start_block`, its SVD on one BLAS thread where small)."""
    return start_block(n, block, seed, v0)


def eigsh_defaults(k: int, n: int, block_size: int | None, max_basis: int | None) -> tuple[int, int]:
    """``(block, max_basis)`` of a sparse eigsh: the sparse route's (:func:`~blocklin.plan.svd.sparse_block`,
    :func:`~blocklin.plan.svd.sparse_basis`: a product costs about the same per column whatever the block)
    where neither is given; a given block takes the dense route's basis for it
    (:func:`~blocklin.plan.svd.default_basis`) unless ``max_basis`` is given too."""
    block = max(1, min(n, block_size or sparse_block(k, 10, n)))
    if max_basis is None:
        max_basis = max(k + block, min(n, default_basis(k, 10, block) if block_size else sparse_basis(k, 10, block, n)))
    return block, max_basis


def eigsh_bases(s: Any, n: int, k: int, *, block: int, max_basis: int | None, block_given: bool,
                check_symmetric: bool, laplacian: str | None, budget: int, spill_ok: bool) -> BasisPlan:
    """Where :func:`sparse_eigsh`'s bases live and its block (:func:`~blocklin.linalg.lowrank.basis_budget.plan_bases`):
    its products ``S X`` of one block (and ``S^T X`` for the symmetry check), float64 ``X``; a Laplacian's
    degrees held besides. What the run and its plan (:mod:`~blocklin.linalg.lowrank.sparse_plan`) take."""
    op_dtype = s.aslinearoperator().dtype
    degrees = 2 * n * 8 if laplacian else 0
    return plan_bases(n, k, block=block, max_basis=max_basis, block_given=block_given, store=s._store,
                      products=lambda b: [(b, False)] + ([(b, True)] if check_symmetric else []), item=8,
                      dtype=op_dtype, budget=budget, extra=lambda b, cap, spilled: degrees, spill_ok=spill_ok)


def write_columns(cols: Columns, idx: np.ndarray, dtype: Any, dest: Any) -> None:
    """The columns ``idx`` of ``cols`` (a spilled basis's) written to the array ``dest`` in ``dtype``, one
    chunk of rows per strip of the basis: never all of them in memory."""
    n, _ = cols.shape
    arr = create_array(dest, shape=(n, len(idx)), dtype=dtype, chunks=(cols.rows_per_strip(), max(1, len(idx))))
    for r0, r1, block in cols.strips():
        write_block(arr, slice(r0, r1), slice(0, len(idx)), np.ascontiguousarray(block[:, idx]).astype(dtype,
                                                                                                      copy=False))


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


__all__ = ["eigen_order", "eigsh_bases", "eigsh_defaults", "sparse_eigsh", "symmetry_rtol", "write_columns"]
