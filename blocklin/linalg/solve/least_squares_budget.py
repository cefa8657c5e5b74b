"""Every step of a least-squares ``solve`` planned at one budget, before anything is written.

The routes of a non-square or regularized dense ``solve`` plan their passes one at a time, each within
the one ``memory=`` budget: a refusal of the first step named what that step needs, at which a later
step of the same call (the refinement pass, the streaming QR that ``method="auto"`` may switch to, the
leave-one-out pass, the product ``x = A^T y`` of the wide route, the stored Gram matrix's products)
refused again. :func:`plan_least_squares` plans all of them at a budget with the planners the run calls
(:func:`~blocklin.runtime.passes.plan_kernel_pass` for the row passes, the GEMM and SYRK planners for
the products, the stored-Gram route's tiles), nothing read but the operands' metadata, and
:func:`~blocklin.plan.minimum.whole_call` turns a refusal into the least budget at which every step
plans: the route a budget takes is part of the plan (a Gram matrix over the budget goes to the stored,
out-of-core route), so the named minimum is one at which the whole call runs.

Steps that depend on the data (``method="auto"`` switching to the QR, ``refine="auto"``'s pass, the
length of the default leave-one-out grid) are planned for the case that needs the most memory.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from blocklin.config import format_size, size_hint
from blocklin.errors import BudgetError
from blocklin.errors import explain as _msg
from blocklin.plan.chunks import auto_chunks
from blocklin.plan.minimum import whole_call
from blocklin.plan.solve import plan_solve, small_bytes
from blocklin.runtime.passes import plan_kernel_pass, source

F64 = np.dtype(np.float64)


class _JobAt:
    """A job as its planners see it at another ``memory`` budget (its settings read, nothing run)."""

    def __init__(self, job: Any, memory: int) -> None:
        self._job = job
        self.cfg = job.cfg.replace(memory=int(memory))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._job, name)


def _staged_at(op: Any, memory: int) -> Any:
    """``op`` as a call at ``memory`` has it: an in-memory input is staged in chunks the budget picks."""
    if op is None or not getattr(op, "staged", False):
        return op
    return dataclasses.replace(op, chunks=auto_chunks(tuple(op.shape), op.dtype, memory))


def _stand_in(name: str, shape: tuple[int, int], chunks: tuple[int, int], dtype: Any = F64) -> Any:
    """An operand the call writes before it reads it: its shape, dtype and chunks (no store yet)."""
    from blocklin.operands import Operand

    return Operand(name=name, path="", shape=tuple(shape), dtype=np.dtype(dtype), chunks=tuple(chunks))


def plan_least_squares(job: Any, A: Any, B: Any, W: Any = None, *, kind: str, lams: list[float], method: str,
                       refine: Any, intercept: bool, positive: bool = False, store_cv: bool = False,
                       updatable: bool = False, scoring: Any = None, folds: Any = None) -> None:
    """Refuse, before anything is written, a budget at which some step of the call does not plan: a
    :class:`~blocklin.errors.BudgetError` naming (and carrying as ``minimum``) the least budget at which
    every step plans (:func:`~blocklin.plan.minimum.whole_call`). Parameters as
    :func:`~blocklin.linalg.solve.least_squares.solve_least_squares` has them; ``W`` the
    ``sample_weight`` operand."""
    whole_call(lambda memory: plan_steps(job, A, B, W, kind=kind, lams=lams, method=method, refine=refine,
                                         intercept=intercept, positive=positive, store_cv=store_cv,
                                         updatable=updatable, memory=memory, scoring=scoring, folds=folds),
               job.cfg.memory, "the least-squares solve")


def plan_steps(job: Any, A: Any, B: Any, W: Any, *, kind: str, lams: list[float], method: str, refine: Any,
               intercept: bool, positive: bool, store_cv: bool, updatable: bool, memory: int, scoring: Any = None,
               folds: Any = None) -> None:
    """Every step of the route a call at ``memory`` takes, planned at ``memory``; raises the first
    step's :class:`~blocklin.errors.BudgetError`."""
    view = _JobAt(job, memory)
    A, B, W = (_staged_at(op, memory) for op in (A, B, W))
    (m, n), k = A.shape, B.shape[1]
    small = small_bytes(min(m, n), k)
    cplx = "c" in (A.dtype.kind, B.dtype.kind)
    if small > memory and kind == "scalar" and method != "qr":  # the router's stored-Gram route
        extra = next((name for name, on in (("fit_intercept", intercept), ("sample_weight", W is not None),
                                            ("positive", positive), ("updatable", updatable)) if on), None)
        if extra:
            raise BudgetError(_msg("memory", f"must hold the in-memory {min(m, n)} x {min(m, n)} Gram matrix that "
                                   f"{extra} needs (the stored, out-of-core Gram route has none of it)",
                                   format_size(memory), f"raise it to at least {format_size(small)} "
                                   f"(memory='{size_hint(small)}')"), minimum=small)
        _stored_gram_steps(view, A, B)
        return
    plan_solve(m, n, k, method=method, memory=memory, lam_kind=kind, refine=1 if refine == "auto" else refine,
               weighted=W is not None, positive=positive, fit_intercept=bool(intercept))
    if W is not None:
        from blocklin.linalg.solve.kernels import weight_check_kernel

        _row_pass(view, weight_check_kernel, [source(W)], {}, reserve=0)
    if m < n:
        _wide_steps(view, A, B, kind=kind, lams=lams, cplx=cplx, method=method, intercept=bool(intercept))
    else:
        _tall_steps(view, A, B, W, kind=kind, lams=lams, method=method, refine=refine, intercept=intercept,
                    positive=positive, store_cv=store_cv, updatable=updatable, scoring=scoring, folds=folds)


def _row_pass(job: Any, kernel: Any, sources: list, params: dict, *, reserve: int, device: str | None = None,
              **planning: Any) -> Any:
    """The plan :func:`~blocklin.runtime.passes.run_pass` makes for this pass at ``job``'s budget."""
    if kernel.device != "any":
        device = kernel.device
    device = device or job.device
    memory = job.cfg.memory
    if device == "gpu":  # as run_pass: the strips and states live on the GPU too
        memory = min(memory, job.device_memory() or memory)
    return plan_kernel_pass(job, kernel, sources, params, memory=memory, reserve=reserve, device=device, **planning)


def _tall_steps(job: Any, A: Any, B: Any, W: Any, *, kind: str, lams: list[float], method: str, refine: Any,
                intercept: bool, positive: bool, store_cv: bool, updatable: bool, scoring: Any = None,
                folds: Any = None) -> None:
    """The passes of :func:`~blocklin.linalg.solve.normal.solve_tall` and what follows it (with ``cv=``: the
    fold pass, whose ``folds + 1`` sets of Gram sums the budget holds, then the route at one lambda)."""
    from blocklin.device import pass_device
    from blocklin.linalg.blocks.tsqr import tsqr_kernel
    from blocklin.linalg.solve.kernels import gram_kernel, loo_kernel, residual_kernel

    (m, n), k = A.shape, B.shape[1]
    sources = [source(A), source(B)] + ([source(W)] if W is not None else [])
    reserve = small_bytes(n, k)
    read = m * (n * A.dtype.itemsize + k * B.dtype.itemsize)
    cdt = "complex128" if "c" in (A.dtype.kind, B.dtype.kind) else "float64"  # the passes' compute dtype

    def device(flops: float) -> str:  # a weighted pass scales its rows on the CPU, complex data runs there
        return "cpu" if W is not None or cdt != "float64" else pass_device(job.cfg.device, flops, read, job.device)

    centered = intercept or W is not None or positive
    rule = kind in ("gcv", "lcurve", "loo")
    qr_ones = method == "qr" and intercept  # [1 | A | b] streamed: no Gram pass, no means passes
    shifted = {"shift": (None, None)} if intercept else {}  # an intercept's passes sum the shifted rows' copies
    if centered and not qr_ones or method != "qr" or updatable:  # the Gram pass (updatable keeps its sums)
        _row_pass(job, gram_kernel, sources, {"dtype": cdt} | shifted, reserve=reserve,
                  device=device(m * n * (n + 2 * k)))
    if not centered and method in ("qr", "auto") or qr_ones:  # asked for, or where "auto" finds A^T A ill-conditioned
        _row_pass(job, tsqr_kernel, sources[:2], {"dtype": cdt} | ({"ones": True} if qr_ones else {}),
                  reserve=small_bytes(n + int(qr_ones), k), device=device(2.0 * m * (n + k + qr_ones) ** 2))
    refines = (1 if refine == "auto" else int(refine)) and (
        kind == "scalar" and method != "qr" or rule and method == "auto" and not centered or folds is not None)
    if refines:  # the refinement passes (a rule's choice too, on the spectral route of "auto")
        _row_pass(job, residual_kernel, sources, {"dtype": cdt} | (shifted if not qr_ones else {}), reserve=reserve,
                  device=device(4.0 * m * n * k))
    if kind == "loo" and folds is not None:  # the fold pass; the Gram pass above stands for the route's
        from blocklin.linalg.solve.kernels import fold_kernel
        from blocklin.linalg.solve.kfold import sums_bytes

        sums = sums_bytes(folds.count, n, k, W is not None, cplx=cdt != "float64")
        fold_sources = sources + ([source(_stand_in("cv_folds", (m, 1), (min(m, A.chunks[0]), 1)))]
                                  if folds.labels is not None else [])
        _row_pass(job, fold_kernel, fold_sources, {"folds": folds.count, "bounds": folds.bounds,
                                                   "weighted": W is not None} | shifted, reserve=reserve + sums,
                  device="cpu")
    elif kind == "loo":
        from blocklin.linalg.solve.loo import max_grid, pass_reserve

        grid = len(lams) or max_grid()
        errors = callable(scoring)
        _row_pass(job, loo_kernel, sources, {"lams": range(grid), "store": bool(store_cv),
                                             "stats": scoring is not None, "errors": errors},
                  reserve=pass_reserve(m, n, k, grid, store_cv, job.cfg.memory, errors), device="cpu")


def _wide_steps(job: Any, A: Any, B: Any, *, kind: str, lams: list[float], cplx: bool = False,
                method: str = "auto", intercept: bool = False) -> None:
    """:func:`~blocklin.linalg.solve.wide.solve_wide`: ``A A^T`` (its SYRK pass, or the GEMM it falls
    back to; ``method="qr"``: the TSQR pass over ``A^T``, of the shifted columns and the first entries with an
    intercept), then ``x = A^T y`` of every lambda solved."""
    if method == "qr":
        _wide_qr_steps(job, A, cplx, intercept)
    else:
        _wide_gram_steps(job, A, cplx)
    _wide_solution_steps(job, A, B, kind=kind, lams=lams, intercept=intercept)


def _wide_qr_steps(job: Any, A: Any, cplx: bool, intercept: bool) -> None:
    """The TSQR pass over ``A^T`` (:func:`~blocklin.linalg.solve.qr_route.wide_qr_factor`)."""
    from blocklin.linalg.blocks.tsqr import tsqr_kernel

    m = A.shape[0]
    _row_pass(job, tsqr_kernel, [source(A, transposed=True)], {"dtype": "complex128" if cplx else "float64"}
              | ({"shift_first": True} if intercept else {}), reserve=small_bytes(m + intercept, 0), device="cpu")


def wide_qr_refusal(job: Any, A: Any, *, intercept: bool, cplx: bool) -> BudgetError | None:
    """The refusal of the TSQR pass over a wide ``A^T`` at ``job``'s budget, or None where it plans: the pass
    ``method="auto"`` may add after the dual form's (:mod:`~blocklin.linalg.solve.wide_auto`), which the call's
    plan does not require (the dual form is kept where it does not fit)."""
    try:
        _wide_qr_steps(job, A, cplx, intercept)
    except BudgetError as err:
        return err
    return None


def _wide_gram_steps(job: Any, A: Any, cplx: bool) -> None:
    """The SYRK pass of ``A A^T``, or the out-of-core GEMM it falls back to (real data)."""
    from blocklin.linalg.products.gemm import Gemm
    from blocklin.linalg.products.gram_kernels import gram_pass_kernel

    try:
        _row_pass(job, gram_pass_kernel, [source(A, transposed=True)],
                  {"dtype": "complex128" if cplx else "float64", "gpu": job.device == "gpu"}, reserve=0,
                  min_tasks=1, workers=1)
    except BudgetError:
        if cplx:  # no GEMM fallback for complex data (it forms A A^T): the SYRK pass must fit
            raise
        Gemm.of(A, A, trans_b=True, dtype="float64").plan(job, read_reserve=True)


def _wide_solution_steps(job: Any, A: Any, B: Any, *, kind: str, lams: list[float], intercept: bool = False) -> None:
    """``x = A^T y`` of every lambda solved (one GEMM over ``A``; with an intercept the pass of
    :func:`~blocklin.linalg.solve.kernels.shifted_product_kernel`)."""
    from blocklin.linalg.products.gemm import Gemm

    m, k = A.shape[0], B.shape[1]
    cols = k * (len(lams) if kind == "sequence" else 1)
    work = np.result_type(A.dtype, B.dtype, np.float64)  # wide.solve_wide sums x = A^T y in float64
    if intercept:
        from blocklin.linalg.solve.kernels import shifted_product_kernel

        out = np.result_type(A.dtype, B.dtype)
        _row_pass(job, shifted_product_kernel, [source(A, transposed=True)],
                  {"y": np.empty((m, cols), work), "alpha": 1.0, "unit": 1.0, "out": out.name}, reserve=0)
        return
    Y = _stand_in("y", (m, cols), auto_chunks((m, cols), work, job.cfg.memory), work)
    Gemm.of(A, Y, trans_a=True, dtype=work).plan(job, read_reserve=True, reads=(_a_reads(A), "direct"))


def _a_reads(A: Any) -> str:
    from blocklin.storage.zarr_store import read_kind

    return read_kind(A.path)


def _stored_gram_steps(job: Any, A: Any, B: Any) -> None:
    """:func:`~blocklin.linalg.solve.stored_gram.solve_gram_out_of_core`: the tiles of the Gram matrix and its
    factor, the SYRK that forms it, and the products of the solve and its refinement over ``A``."""
    from blocklin.linalg.products.gemm import Gemm
    from blocklin.linalg.solve.stored_gram import _tile_plan, compute_dtype
    from blocklin.operands import temp_store_reads
    from blocklin.plan.gram import plan_syrk_blocks

    (m, n), k = A.shape, B.shape[1]
    wide = m < n
    s = min(m, n)
    dt = compute_dtype(A, B)  # complex128 for complex data
    plan = _tile_plan(job, A, s, k, wide, dt)
    t = plan.tile
    plan_syrk_blocks(s, n if wide else m, dt, memory=job.cfg.memory, tile=t, source_dtype=A.dtype,
                     workers=plan.workers or job.workers(1), k_chunk=A.chunks[1] if wide else A.chunks[0])
    stores, reads_a = temp_store_reads(job.cfg), _a_reads(A)

    def store(name: str, rows: int) -> Any:
        return _stand_in(name, (rows, k), (t, min(t, max(1, k))), dt)

    def product(a_store: Any, trans_a: bool, c: Any = None, alpha: float = 1.0, beta: float = 0.0) -> None:
        op = Gemm.of(A, a_store, c, trans_a=trans_a, alpha=alpha, beta=beta, dtype=dt.name)
        op.plan(job, out_chunks=(min(t, op.shape[0]), min(t, op.shape[1])), read_reserve=True,
                reads=(reads_a, stores))

    if wide:  # x = A^T y, r = b - A x (the dual residual and the final residual)
        product(store("z", m), True)
        product(store("x", n), False, B, -1.0, 1.0)
    else:  # r = b - A x (and the final residual), A^T r - lam^2 x
        product(store("z", n), False, B, -1.0, 1.0)
        product(store("r", m), True, store("z", n), 1.0, -1.0)


__all__ = ["plan_least_squares", "plan_steps", "wide_qr_refusal"]
