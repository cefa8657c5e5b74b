"""Planning regularized least-squares solves (pure: shapes and budgets in, plans out)."""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from blocklin.config import format_size
from blocklin.errors import BudgetError, explain
from blocklin.plan.passes import RowPassPlan, plan_row_pass

#: Largest strip a pass reads at once (bigger strips do not make BLAS faster, only memory larger).
MAX_STRIP_BYTES = 96 * 2**20


def small_bytes(n: int, k: int) -> int:
    """In-core work of the small problem: Gram or R (``n x n``), its factor, SVD/eigen workspace."""
    return 5 * (n + k) ** 2 * 8


def plan_tall_pass(m: int, n: int, k: int, dtype, method: str, *, memory: int, chunk_rows: int,
                   src_itemsize: int | None = None, workers: int = 1, cores: int = 1) -> RowPassPlan:
    """Row-pass plan for the Gram (``method="normal"``), residual or streaming-QR (``"qr"``) pass.

    Per task the fixed memory is the state (``n x n`` Gram or the ``(n+k)^2`` triangular factor and
    its stacked update); per strip row, the stored ``[A B]`` row (twice: read-ahead), a cast copy, and
    for QR the stacked copy handed to LAPACK.
    """
    isz = np.dtype(dtype).itemsize
    src = src_itemsize or isz
    w = n + k
    if method == "qr":
        fixed = 3 * w * w * isz + 2 * small_bytes(0, 0)
        extra = 2 * w * isz
    elif method == "residual":
        fixed = 2 * n * k * isz
        extra = (w + 2 * k) * isz
    else:
        fixed = (n * n + n * k) * isz
        extra = w * isz
    budget_for_pass = memory - small_bytes(n, k)
    if budget_for_pass < workers * (fixed + (2 * w * src + extra) * min(m, 64)):
        need = small_bytes(n, k) + workers * (fixed + (2 * w * src + extra) * min(m, 64))
        raise BudgetError(explain("memory", f"must hold the in-core {n} x {n} problem and a strip of [A b]",
                                  format_size(memory), f"raise it to at least {format_size(need)} "
                                  f"(memory='{math.ceil(need / 2**20)}MiB'), or reduce the number of columns"))
    max_strip = max(chunk_rows, MAX_STRIP_BYTES // max(1, w * src))
    if method == "qr":  # QR of [R; strip]: strips of a few n rows amortize re-factoring R
        max_strip = max(max_strip, 4 * w)
    return plan_row_pass(m, w * src, chunk_rows=chunk_rows, memory=budget_for_pass, fixed_bytes=fixed,
                         strip_extra_row_bytes=extra, workers=workers, cores=cores, max_strip=max_strip)


@dataclasses.dataclass(frozen=True)
class SolvePlan:
    """What :func:`blocklin.solve` will do.

    Attributes
    ----------
    m, n, k : int
        Rows and columns of ``A``, right-hand sides.
    orientation : {"tall", "wide"}
        ``tall`` (``m >= n``): primal problem, Gram or streaming QR of ``A``; ``wide``: dual form
        ``x = A^T (A A^T + lam^2 I)^{-1} b`` with the ``m x m`` Gram ``A A^T`` from an out-of-core GEMM.
    method : {"normal", "qr", "auto"}
        As requested (``auto`` is resolved after the first pass).
    passes : int
        Passes over ``A`` planned (``auto`` may add one: it is reported).
    small_memory : int
        Bytes of the in-core small problem.
    """

    m: int
    n: int
    k: int
    orientation: str
    method: str
    passes: int
    small_memory: int
    memory: int

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def plan_solve(m: int, n: int, k: int, *, method: str, memory: int, lam_kind: str = "scalar",
               refine: int = 1) -> SolvePlan:
    """Orientation, method and pass count of a solve (validation of the in-core size included)."""
    orientation = "tall" if m >= n else "wide"
    small = small_bytes(min(m, n), k)
    if small > memory:
        side = min(m, n)
        raise BudgetError(explain("memory", f"must hold the in-core {side} x {side} problem (Gram/R factor, "
                                  "its factorization and SVD)", format_size(memory),
                                  f"raise it to at least {format_size(small)} "
                                  f"(memory='{math.ceil(small / 2**20)}MiB'); "
                                  "for very wide or very tall-and-wide problems use an iterative method"))
    if orientation == "wide":
        passes = 2 + (lam_kind == "scalar")
    elif method == "qr" or lam_kind != "scalar" and method == "auto":
        passes = 1
    else:
        passes = 1 + refine
    return SolvePlan(m=m, n=n, k=k, orientation=orientation, method=method, passes=passes, small_memory=small,
                     memory=memory)
