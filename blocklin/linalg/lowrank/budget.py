"""What a run of the SVD needs before its first pass: a plan whose every pass fits the memory budget
(refused with the smallest budget of the form ``size_hint`` prints that was checked to suffice), and the
disk for its long factor and its stored basis.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from blocklin.config import format_size, parse_size, size_hint
from blocklin.errors import BudgetError, explain
from blocklin.linalg.blocks.center import Moments, Shift
from blocklin.linalg.lowrank.sources import Streamed
from blocklin.operands import staged_at, temp_root
from blocklin.plan.svd import SvdPlan, plan_svd
from blocklin.runtime.job import Job
from blocklin.storage.space import check_space


def choose_plan(job: Job, A: Any, k: int, kw: dict, *, requested: str, shift: tuple[bool, bool]) -> SvdPlan:
    """The run's plan (:func:`fitting_plan`); for the Gram route of ``method='auto'`` the Gram where its
    ``N x N`` Gram fits the budget, else block Lanczos (``plan.method`` says which).

    ``kw``: the arguments of :func:`plan_svd` but the shape and budget; ``shift``: ``(center, scale)``."""
    method = kw["method"]
    plan, means_gram = None, method == "gram" and any(shift)
    if method == "gram" and requested == "auto":
        try:  # the Gram route where its N x N Gram fits the budget, else block Lanczos
            plan = _try_plan(job, A, k, job.cfg.memory, kw, means_gram=means_gram, shift=shift)
        except BudgetError:
            method, kw = "lanczos", kw | {"method": "lanczos"}
            means_gram = False
    if plan is None:
        # method='auto' where the Gram route did not fit: the minimum named is block Lanczos's (at that
        # budget the Gram route may fit and be taken: either plans every pass there)
        plan = fitting_plan(job, A, k, kw, means_gram=means_gram, shift=shift,
                            note=" (method='auto': the Gram route does not fit this budget)"
                            if requested == "auto" and method == "lanczos" else "")
    return plan


def _placeholder_shift(A: Any, plan: SvdPlan, shift: tuple[bool, bool]) -> Shift | None:
    """A :class:`Shift` of the shapes a centered (``shift[0]``) and/or scaled (``shift[1]``) run uses, for
    planning its passes before the means are known (their memory depends on the shapes only)."""
    if not any(shift):
        return None
    m, n = A.shape
    return Shift.of(Moments(np.zeros(n), np.ones(n), m), center=shift[0], scale=shift[1], transposed=plan.transposed)


def _try_plan(job: Job, A: Any, k: int, memory: int, kw: dict, *, means_gram: bool = False,
              shift: tuple[bool, bool] = (False, False)) -> SvdPlan:
    A = staged_at(A, memory)  # in-memory data: a rerun at this budget stages it in chunks of this budget
    plan = plan_svd(A.shape[0], A.shape[1], k, A.dtype, memory=memory, **kw)
    if not plan.in_core:
        Streamed(job, A, plan, _placeholder_shift(A, plan, shift)).preflight(k, means_gram=means_gram)
    return plan


def fitting_plan(job: Job, A: Any, k: int, kw: dict, *, means_gram: bool = False,
                 shift: tuple[bool, bool] = (False, False),
                 note: str = "") -> SvdPlan:
    """:func:`plan_svd` at the job's budget with every streamed pass planned too; a budget too small
    for any of them is refused naming a budget that was checked to suffice (and that a retry gets)."""
    try:
        return _try_plan(job, A, k, job.cfg.memory, kw, means_gram=means_gram, shift=shift)
    except BudgetError as exc:
        need = _sufficient_budget(job, A, k, kw, exc, means_gram=means_gram, shift=shift)
        lower = (" (the whole space holds N x N factors)" if kw["method"] == "full" else
                 ", or lower k, oversample or the block size")
        raise BudgetError(explain(
            "memory", f"must hold the in-core work of svd ({kw['method']}){note} and one strip of each pass over A",
            format_size(job.cfg.memory), f"raise it to at least {format_size(need)} (memory='{size_hint(need)}')"
            f"{lower} (the step that failed: {exc})"), minimum=need) from None


#: Steps of the search for a sufficient budget (each grows it by at least a quarter).
_BUDGET_SEARCH_STEPS = 60


def _sufficient_budget(job: Job, A: Any, k: int, kw: dict, exc: BudgetError, *, means_gram: bool = False,
                       shift: tuple[bool, bool] = (False, False)) -> int:
    """The smallest budget of the form :func:`size_hint` prints, from ``exc``'s minimum up, that plans."""
    need = max(job.cfg.memory + 1, exc.minimum or 0)
    for _ in range(_BUDGET_SEARCH_STEPS):
        hint = parse_size(size_hint(need))
        try:
            _try_plan(job, A, k, hint, kw, means_gram=means_gram, shift=shift)
            return hint
        except BudgetError as again:
            need = max(hint + 1, again.minimum or hint + hint // 4)
    return need


def check_disk_space(job: Job, out: Any, plan: SvdPlan, m: int, n: int, k: int, dtype: Any) -> None:
    """Up front: the long factor fits the output's disk, and a streamed run's basis ``Y`` the temp dir's,
    with the copy of ``Y R1^-1`` CholeskyQR writes where ``Y`` is ill-conditioned (``orth._settle``)."""
    long_side, itemsize = max(m, n), np.dtype(dtype).itemsize
    if out is not None:
        check_space(out, long_side * k * itemsize, "out", f"the long factor, {long_side} x {k} {np.dtype(dtype).name}")
    if not plan.in_core:
        cols = plan.block if plan.method != "sketch" else max(plan.sketch_size)
        check_space(temp_root(job.cfg) / "blocklin-svd", long_side * (k + 2 * cols) * itemsize, "temp data",
                    f"{long_side} x {k + 2 * cols} {np.dtype(dtype).name}")
