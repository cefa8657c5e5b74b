"""The SVD of a SciPy ``LinearOperator`` (what ``scipy.sparse.linalg.svds`` takes): randomized subspace
iteration or block Lanczos through its ``matmat`` and ``rmatmat``, one pair of products per step, the
same methods and Rayleigh-Ritz step as for a stored matrix (:mod:`blocklin.linalg.lowrank.methods`).

The operator's products are its own (in memory or not); the ``M x l`` blocks ``B Q`` are held in
memory, the long factor written to the result's group as for every SVD. A stored sparse matrix's
products (and those under pca's centered operator) run from its row blocks held in memory, read once,
where they fit the budget beside the method's work (:func:`blocklin.runtime.sparse_pass.hold_blocks`);
where its block Lanczos bases do not fit, they spill to the work folder (:func:`sparse_svd_memory`) and
the last Rayleigh-Ritz step runs from spilled blocks (:mod:`blocklin.linalg.lowrank.spilled_ritz`). A
:class:`~blocklin.linalg.operator.BlocklinOperator` (``blocklin.aslinearoperator``) is its stored
matrix and takes the streamed route instead.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from blocklin.errors import BudgetError, ParameterError, explain
from blocklin.linalg.blocks.scaling import ProductScaling
from blocklin.linalg.blocks.tallblock import ArrayBlock
from blocklin.linalg.blocks import random as rnd
from blocklin.linalg.lowrank.basis import STRIP_BYTES, spilled_bases
from blocklin.linalg.lowrank import basis_budget
from blocklin.linalg.lowrank.basis_budget import BasisPlan, plan_bases
from blocklin.linalg.lowrank.lanczos import basis_columns
from blocklin.linalg.lowrank.methods import Factorization, lanczos, rsvd, sketch
from blocklin.linalg.lowrank.run import scaled_back
from blocklin.linalg.lowrank.spilled_ritz import spilled_rayleigh_ritz
from blocklin.linalg.lowrank.triplets import enrich_width
from blocklin.plan.minimum import whole_call
from blocklin.plan.svd import plan_svd
from blocklin.operands import temp_root
from blocklin.runtime.checkpoints import Checkpoints
from blocklin.runtime.job import Job
from blocklin.runtime.sparse_pass import check_products, hold_blocks
from blocklin.sparse import SparseMatrix, SparseOperator, as_sparse_operator, refuse_nonfinite_entries

#: The methods an operator takes: those that only multiply by ``B`` and ``B^T`` in blocks.
OPERATOR_METHODS = ("rsvd", "lanczos", "sketch")


def is_operator(a: Any) -> bool:
    """``a`` is a SciPy ``LinearOperator`` not backed by a stored dense matrix of blocklin's, or a stored
    sparse matrix (:class:`~blocklin.sparse.SparseMatrix`, taken through its row-block operator)."""
    from scipy.sparse.linalg import LinearOperator

    return isinstance(a, LinearOperator) and not hasattr(a, "path") or isinstance(a, SparseMatrix)


class OperatorSource:
    """``B`` (``op`` for tall, ``op^T`` for wide) behind the :class:`~blocklin.linalg.lowrank.sources.Source`
    protocol: every product one ``matmat`` and one ``rmatmat`` (counted as a pass)."""

    shift = None
    noise_scale = 0.0
    signs = False
    peaks = None
    device = "cpu"

    def __init__(self, op: Any, transposed: bool, job: Job) -> None:
        self.op, self.transposed, self.job = op, transposed, job
        m, n = op.shape
        self.M, self.N = (n, m) if transposed else (m, n)
        self.dtype = np.dtype(op.dtype)
        self.products = 0
        # B is 2^-e times the operator, e learned from the first product (entries near the range's ends)
        self.scaling = ProductScaling(self.dtype)

    def _b(self, x: np.ndarray) -> np.ndarray:
        return self._product(x, not self.transposed)

    def _bt(self, y: np.ndarray) -> np.ndarray:
        return self._product(y, self.transposed)

    def _product(self, x: np.ndarray, matmat: bool) -> np.ndarray:
        first = not self.scaling.known
        y = self._scaled_product(x, matmat)
        if first and self.scaling.first_lost_digits:  # a first product near the subnormals: again, scaled
            y = self._scaled_product(x, matmat)
        return y

    def _scaled_product(self, x: np.ndarray, matmat: bool) -> np.ndarray:
        x = np.asarray(self.scaling.into(np.asarray(x, dtype=np.float64)), dtype=self.dtype)
        with np.errstate(over="ignore", under="ignore"):  # the first product: learn() refuses Inf, scales
            y = self.op.matmat(x) if matmat else self.op.rmatmat(x)
        if not self.scaling.known and not np.isfinite(y).all():  # a stored NaN or Inf: named where it is
            refuse_nonfinite_entries(self.op)
        return self.scaling.learn(np.asarray(y, dtype=np.float64))

    def normal(self, q: np.ndarray, *, keep_y: bool = False, gram: bool = False, description: str = "") -> tuple:
        # a stored sparse S held in memory: both products in one sweep over its row blocks (the same bits),
        # once the first product has shown that the operator needs no scaling
        fused = getattr(self.op, "normal_matmat", None) if not self.transposed and self.scaling.e == 0 else None
        both = fused(np.asarray(q, dtype=self.dtype)) if fused is not None else None
        if both is not None:
            y, z = (np.asarray(a, dtype=np.float64) for a in both)
        else:
            y = self._b(q)
            z = self._bt(y)
        self.products += 1
        return z, (y.T @ y if gram else None), (ArrayBlock(y.astype(self.dtype, copy=False)) if keep_y else None)

    def sketch(self, kp: int, s: int, seed: int, y_path: Any = None) -> tuple:
        """``(X^T, Phi^T [Y T], Y^T Y, Y)`` of the single-pass sketch with the test matrices of a stored
        matrix's (the same seed gives the same sketch): ``B [Omega | Psi]`` and ``B^T Upsilon^T``, one
        ``matmat`` and one ``rmatmat`` (an operator's products cannot share one read)."""
        yt = self._b(rnd.sketch_test_matrices(seed, self.N, kp, s))
        y = np.ascontiguousarray(yt[:, :kp])
        xt = self._bt(rnd.row_test_rows(seed, rnd.STREAM_UPSILON, kp).rows(0, self.M))
        phi = rnd.row_test_rows(seed, rnd.STREAM_PHI, s).rows(0, self.M)
        self.products += 1
        return xt, phi.T @ yt, y.T @ y, ArrayBlock(y.astype(self.dtype))


def operator_plan(shape: tuple[int, int], dtype: Any, k: int, *, method: str, oversample: int, q: int | None,
                  limit: int, block_size: int | None, max_basis: int | None, memory: int) -> Any:
    """The :class:`~blocklin.plan.svd.SvdPlan` of the operator route (never in core: the operator is not
    read into memory); raises the run's ``BudgetError`` when its in-core work leaves no room, and a
    ``ParameterError`` for a method other than rsvd and block Lanczos."""
    if method not in OPERATOR_METHODS:
        raise ParameterError(explain("method", f"must be one of {OPERATOR_METHODS} for a LinearOperator (the others "
                                     "read the matrix itself)", repr(method), "pass method='auto' (block Lanczos)"))
    m, n = shape
    plan = plan_svd(m, n, k, np.dtype(dtype), method=method, oversample=oversample,
                    power_iters=q if method == "rsvd" else None, memory=memory, max_passes=limit,
                    block_size=block_size, max_basis=max_basis)
    if plan.in_core:  # sized as if A fitted: the passes are still the products' (the out-of-core formulas)
        passes, formula = {"rsvd": (q + 1 if q is not None else None, "q + 1"), "sketch": (1, "1")}.get(
            method, (None, "L + 1"))
        plan = dataclasses.replace(plan, in_core=False, passes=passes, formula=formula)
    return plan


def operator_svd_plan(shape: tuple[int, int], dtype: Any, k: int, *, memory: int, **options: Any) -> Any:
    """:func:`operator_plan` at ``memory``, or where that budget cannot hold the in-core work, the plan at
    the least budget that does (the block sizes do not depend on the budget): what a stored sparse
    matrix's run checks beside its products, so that it names the whole call's minimum."""
    try:
        return operator_plan(shape, dtype, k, memory=memory, **options)
    except BudgetError as exc:
        return operator_plan(shape, dtype, k, memory=max(int(exc.minimum), memory), **options)


def operator_products(plan: Any, k: int, shape: tuple[int, int]) -> list[tuple[int, bool]]:
    """Every product the operator route makes, as ``(columns of X, transposed)`` (``S^T X`` where
    ``transposed``): rsvd ``B Q`` and ``B^T Y`` of one block; block Lanczos those, and its last
    Rayleigh-Ritz pass over the ``k`` Ritz vectors and up to ``k`` residual directions
    (:func:`~blocklin.linalg.lowrank.triplets.enrich_width`), wider than the block when ``k`` is; the
    sketch ``B [Omega | Psi]`` and ``B^T Upsilon^T``. ``B`` is ``A``, or ``A^T`` for a transposed plan."""
    m, n = shape
    b, bt = bool(plan.transposed), not plan.transposed  # B X is S^T X when B = A^T
    if plan.method == "sketch":
        kp, s = plan.sketch_size
        return [(kp + s, b), (kp, bt)]
    widths = {int(plan.block)}
    if plan.method != "rsvd":
        widths.add(k + enrich_width(k, int(plan.block), m if plan.transposed else n))
    return [(w, t) for w in sorted(widths) for t in (b, bt)]


def operator_svd(job: Job, op: Any, k: int, *, method: str, oversample: int, q: int | None, tol: float,
                 seed: int, limit: int, block_size: int | None, max_basis: int | None,
                 dest: str | None, short_dest: str | None = None) -> tuple[Factorization, Any]:
    """The factorization of ``op`` by ``method`` (rsvd, lanczos or the sketch) and its plan; the long
    factor goes to ``dest`` (``None``: not computed).

    A stored sparse matrix whose block Lanczos does not fit the budget with its bases in memory spills
    them to the work folder (:func:`svd_bases`), its block shrunk to what the budget holds, and ends
    with the spilled Rayleigh-Ritz step (:mod:`~blocklin.linalg.lowrank.spilled_ritz`), which writes the
    short factor to ``short_dest`` as well (the factorization's ``V`` then names it)."""
    op = as_sparse_operator(op)  # a SparseMatrix: its row blocks streamed by each product
    options = dict(method=method, oversample=oversample, q=q, limit=limit, block_size=block_size, max_basis=max_basis)
    sparse = op if isinstance(op, SparseOperator) else getattr(op, "sparse_operator", None)  # pca's centered one
    held, spill = 0, None
    if sparse is not None:  # the bases and factors, and beside them every product, refused up front
        plan, need, spill = sparse_svd_memory(op, sparse, k, options, job.cfg.memory,
                                              spill_ok=short_dest is not None and temp_root(job.cfg).is_local)
        # the row blocks read once and held between the products where they fit beside that
        held = hold_blocks(job, sparse.matrix._store, sparse.dtype, need, int(plan.client_bytes))
    if spill is None:
        plan = operator_plan(op.shape, op.dtype, k, memory=job.cfg.memory, **options)
        job.client_reserved = int(plan.client_bytes) + held  # what the products (a sparse matrix's tasks) may not take
        if sparse is op and method == "lanczos":  # the bases in memory: said as a spilled run says it
            cap = basis_columns(plan.N, k, int(plan.block), int(plan.max_basis))
            job.stats.update(basis_spilled=False, basis_bytes=2 * plan.N * cap * 8)
    else:
        job.client_reserved = spill.reserved + held
        job.stats.update(basis_spilled=True, basis_bytes=spill.basis_bytes)
    src = OperatorSource(op, plan.transposed, job)
    ckpt = Checkpoints(None)
    if method == "rsvd":
        f = rsvd(src, k, plan.block, q, tol, seed, limit, dest, plan.transposed, ckpt)
    elif method == "sketch":
        f = sketch(src, k, *plan.sketch_size, seed, dest, plan.transposed)
    elif spill is not None:
        def scratch(n: int, cols: int, names: tuple, strips: Any) -> tuple:
            return spilled_bases(job, n, cols, np.float64, names, strips)

        f = lanczos(src, k, plan, tol, seed, limit - 1, dest, plan.transposed, ckpt,
                    bases=lambda n, cap, wd: spilled_bases(job, n, cap, wd),
                    spilled_finish=lambda Q: spilled_rayleigh_ritz(src, Q, k, plan.block, bases=scratch, dest=dest,
                                                                   short=short_dest, transposed_out=plan.transposed))
    else:
        f = lanczos(src, k, plan, tol, seed, limit - 1, dest, plan.transposed, ckpt)
    f = scaled_back(f, src.scaling, None, center=False, scale=False)  # s and residuals of the operator itself
    where = ("this process, from the row blocks held in memory (one read of S)" if held else
             "the job's tasks (row blocks)" if sparse is not None else "caller")
    phases = {"products with the operator": where}
    if spill is not None:
        phases["Krylov bases"] = (f"spilled to the work folder ({spill.basis_bytes} bytes on disk, block {spill.block}); "
                                  "the final Rayleigh-Ritz step over the k Ritz vectors alone (their residual "
                                  "directions would be another N x k block in memory)")
    return dataclasses.replace(f, phases=phases), plan, src.products


def sparse_svd_memory(op: Any, sparse: Any, k: int, options: dict, budget: int, *,
                      spill_ok: bool) -> tuple[Any, int, BasisPlan | None]:
    """``(plan, need, spill)`` of the operator route on a stored sparse matrix (``sparse``: its row-block
    operator, or that under pca's centered ``op``): the plan, its largest product's need, and where its
    in-memory plan does not fit, block Lanczos with spilled bases (:func:`svd_bases`: ``spill``, its plan's
    block, basis and in-core work replaced). What the run and its ``--explain`` plan
    (:mod:`~blocklin.linalg.lowrank.sparse_plan`) take.

    Refused with the minimum of the step that failed where every step plans there, else with the least
    budget at which all of them plan (:func:`~blocklin.plan.minimum.whole_call`): the products are
    checked beside the plan's in-core state, which is not the same at every budget (a sketch's, planned
    at its in-core minimum below it, holds less than at the products' minimum, which was then refused
    again)."""
    def plans(memory: int) -> tuple[Any, int, BasisPlan | None]:
        return _sparse_svd_memory(op, sparse, k, options, memory, spill_ok=spill_ok)

    try:
        return plans(budget)
    except BudgetError as exc:
        try:
            plans(max(budget + 1, int(exc.minimum or 0)))
        except BudgetError:  # that minimum is refused again: name the one every step plans at
            return whole_call(plans, budget, "the SVD of a stored sparse matrix (its in-core work and its products)")
        raise


def _sparse_svd_memory(op: Any, sparse: Any, k: int, options: dict, budget: int, *,
                       spill_ok: bool) -> tuple[Any, int, BasisPlan | None]:
    """:func:`sparse_svd_memory` at ``budget``, refused with the smaller of the two minimums where
    neither the in-memory plan nor the spilled one fits."""
    store = sparse.matrix._store
    plan = operator_svd_plan(op.shape, op.dtype, k, memory=budget, **options)
    try:
        need = check_products(store, operator_products(plan, k, op.shape), np.dtype(op.dtype).itemsize,
                              sparse.dtype, budget, int(plan.client_bytes))
        operator_plan(op.shape, op.dtype, k, memory=budget, **options)  # its own refusal
        return plan, need, None
    except BudgetError as exc:
        if not (options["method"] == "lanczos" and sparse is op and spill_ok and basis_budget.SPILL):
            raise
        try:
            spill = svd_bases(op, k, plan, budget)
        except BudgetError as spilled:  # the whole call's minimum: the smaller of the two
            raise (exc if (exc.minimum or 0) <= (spilled.minimum or 0) else spilled) from None
    plan = dataclasses.replace(plan, block=spill.block, max_basis=spill.max_basis, client_bytes=spill.reserved,
                               memory=budget)
    return plan, spill.need, spill


def svd_bases(op: Any, k: int, plan: Any, budget: int) -> BasisPlan:
    """The spilled :class:`~blocklin.linalg.lowrank.basis_budget.BasisPlan` of a stored sparse matrix's
    block Lanczos SVD (its in-memory plan refused): each step's products ``B x`` and ``B^T y`` of one
    block, with ``x`` held beside the second (one ``n x block`` block, within the two the step's QR work
    takes between the products, :func:`~blocklin.plan.svd.lanczos_bytes`: the two never at once); the
    final step's two scratch bases (``Y``, ``Z``: their strip buffers) and small factors. The block shrinks
    from the plan's to what the budget holds; refused below
    :data:`~blocklin.linalg.lowrank.basis_budget.MIN_SPILLED_BLOCK` with that minimum."""
    t = bool(plan.transposed)
    N = op.shape[0] if t else op.shape[1]

    def extra(b: int, cap: int, spilled: bool) -> int:
        return 4 * STRIP_BYTES + 8 * k * k * 8

    return plan_bases(N, k, block=int(plan.block), max_basis=int(plan.max_basis), block_given=False,
                      store=op.matrix._store, products=lambda b: [(b, t), (b, not t)],
                      item=np.dtype(op.dtype).itemsize, dtype=op.dtype, budget=budget, extra=extra, spill_ok=True,
                      try_memory=False)
