"""The plans of ``svd``, ``pca`` and ``eigsh`` of a stored sparse matrix, without running them (what
``blocklin svd|pca|eigs --explain`` prints for a ``blocklin-csr`` group): the pure
:func:`blocklin.plan.sparse.plan_sparse_lowrank` fed with the matrix's metadata (one small read of
its attributes, row blocks and their offsets), the dense plan the run itself makes and the products'
memory as the run checks it (so a budget the run refuses is refused here with its message), and
whether the run holds the row blocks in memory between its products (one read of ``S``), and whether its
Krylov bases stay in memory or spill to the work folder (:mod:`blocklin.linalg.lowrank.basis_budget`).
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import numpy as np

from blocklin.config import resolve
from blocklin.errors import ParameterError, explain
from blocklin.plan.sparse import SparseOpPlan, plan_sparse_lowrank
from blocklin.operands import temp_root
from blocklin.runtime.sparse_pass import blocks_fit
from blocklin.sparse import SparseMatrix, as_sparse_matrix
from blocklin.validate import check_k

OPERATIONS = ("svd", "pca", "eigsh")


def sparse_lowrank_plan(a: Any, k: int, *, operation: str = "svd", method: str = "auto", oversample: int = 10,
                        power_iters: Any = "auto", n_iter: Any = None, tol: float | None = None,
                        max_passes: int | None = None, block_size: int | None = None, max_basis: int | None = None,
                        check_symmetric: bool = True, laplacian: str | None = None, out: Any = None,
                        memory: Any = None, storage_options: dict | None = None) -> SparseOpPlan:
    """The :class:`~blocklin.plan.sparse.SparseOpPlan` of ``operation`` (``"svd"``, ``"pca"``,
    ``"eigsh"``) of the stored sparse matrix ``a`` with these options (as :func:`blocklin.svd`,
    :func:`blocklin.pca`, :func:`blocklin.eigsh` take them; ``check_symmetric``, ``laplacian`` and
    ``out``: eigsh's, for its symmetry check's and degree pass's reads and the ``w``, ``V`` it writes).

    Raises
    ------
    ParameterError
        ``a`` is not a stored sparse matrix, or ``k`` is out of range.
    BudgetError
        Where the run refuses the budget: the same planner, the same message.
    """
    from blocklin.linalg.lowrank.operator_svd import sparse_svd_memory
    from blocklin.linalg.lowrank.sparse_eigsh import eigsh_bases, eigsh_defaults
    from blocklin.linalg.lowrank.svd import operator_options

    if operation not in OPERATIONS:
        raise ParameterError(explain("operation", f"must be one of {OPERATIONS}", repr(operation),
                                     "pass operation='svd'"))
    s = as_sparse_matrix(a, storage_options)
    if not isinstance(s, SparseMatrix):
        raise ParameterError(explain("a", "must be a stored sparse matrix (a blocklin-csr group) for a sparse plan",
                                     f"a {type(a).__name__}", "convert it: blocklin convert S.mtx S.zarr"))
    cfg = resolve(memory=memory)
    m, n = s.shape
    dt = np.dtype(s.aslinearoperator().dtype)  # the row-block operator's: float64 for integer values
    spilled = 0  # bytes of the Krylov bases spilled to the work folder (0: in memory)
    if operation == "eigsh":
        if m != n:
            raise ParameterError(explain("a", "must be square and symmetric (eigsh)", f"a sparse {m} x {n} matrix",
                                         "use blocklin.svd for rectangular matrices"))
        check_k(k, n, n, eig=True)
        # as sparse_eigsh: its bases in memory or spilled, its block (the budget may shrink a spilled one)
        block, basis = eigsh_defaults(k, n, block_size, max_basis)
        bp = eigsh_bases(s, n, k, block=block, max_basis=basis,
                         block_given=block_size is not None, check_symmetric=check_symmetric, laplacian=laplacian,
                         budget=cfg.memory, spill_ok=temp_root(cfg).is_local)
        limit = max_passes or 60
        svd_plan = SimpleNamespace(method="lanczos", block=bp.block, max_basis=bp.max_basis, power_iters=None,
                                   passes=None, formula="L", client_bytes=bp.reserved - (2 * n * 8 if laplacian else 0))
        spilled = bp.basis_bytes if bp.spilled else 0
    else:
        if operation == "pca" and (not isinstance(k, int) or isinstance(k, bool) or not 1 <= k < min(m, n)):
            raise ParameterError(explain(
                "n_components", f"must be an integer k with 1 <= k < min(m, n) = {min(m, n)} for a stored sparse "
                "matrix", repr(k), f"pass n_components={min(10, max(1, min(m, n) - 1))}"))
        k, method, q, _tol, limit, block_size, max_basis = operator_options(
            (m, n), dt, k, method=method, oversample=oversample, power_iters=power_iters, n_iter=n_iter, tol=tol,
            max_passes=max_passes, block_size=block_size, max_basis=max_basis)
        # as the run: the in-core work and every product planned at one budget (refused with a minimum at
        # which all of them plan), svd's block Lanczos bases spilled where they do not fit (pca's never)
        op = s.aslinearoperator()
        options = dict(method=method, oversample=oversample, q=q, limit=limit, block_size=block_size,
                       max_basis=max_basis)
        svd_plan, product, spill = sparse_svd_memory(op, op, k, options, cfg.memory,
                                                     spill_ok=operation == "svd" and temp_root(cfg).is_local)
        spilled = spill.basis_bytes if spill is not None else 0
    reserved = int(svd_plan.client_bytes) + (2 * n * 8 if operation == "eigsh" and laplacian is not None else 0)
    if not spilled or operation == "eigsh":
        product = _product_bytes(s, operation, svd_plan, int(k), dt, cfg.memory, check_symmetric, reserved)
    held = blocks_fit(s._store, dt, cfg.memory, reserved, product)  # as the run decides (hold_blocks)
    eig = {}
    if operation == "eigsh":  # the symmetry check's S^T X, the Laplacian's degree pass; w and V written to out
        eig = dict(extra_reads=int(bool(check_symmetric) and not held) + int(laplacian is not None),
                   also_held=(("degrees", 2 * n * 8),) if laplacian is not None else (),
                   bytes_written=n * (int(k) + 1) * 8 if out is not None else 0)
    return plan_sparse_lowrank(operation, shape=(m, n), dtype=s.dtype, nnz=s.nnz, index_dtype=s.index_dtype,
                               product_bytes=product, svd_plan=svd_plan, k=int(k), memory=cfg.memory,
                               max_passes=limit, held_blocks=held, basis_spilled=spilled, **eig)


def _product_bytes(s: SparseMatrix, operation: str, svd_plan: Any, k: int, dtype: np.dtype, budget: int,
                   check_symmetric: bool, reserved: int = 0) -> int:
    """What the largest product of the run holds (X, its result, one task), checked against the budget as
    the run checks it (:func:`blocklin.runtime.sparse_pass.check_products`, the run's own refusal): svd
    and pca every product :func:`~blocklin.linalg.lowrank.operator_svd.operator_products` lists, eigsh
    ``S X`` of one block (and ``S^T X`` for its symmetry check), with ``X`` in the operator's dtype
    (eigsh: float64)."""
    from blocklin.linalg.lowrank.operator_svd import operator_products
    from blocklin.runtime.sparse_pass import check_products

    if operation == "eigsh":
        block = int(svd_plan.block)
        products, item = [(block, False)] + ([(block, True)] if check_symmetric else []), 8
    else:
        products, item = operator_products(svd_plan, k, s.shape), dtype.itemsize
    return check_products(s._store, products, item, dtype, budget, reserved)


__all__ = ["OPERATIONS", "sparse_lowrank_plan"]
