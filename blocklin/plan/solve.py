"""Planning regularized least-squares solves (pure: shapes and budgets in, plans out)."""

from __future__ import annotations

import dataclasses
import math


from blocklin.config import format_size
from blocklin.errors import BudgetError, explain

def small_bytes(n: int, k: int) -> int:
    """In-core work of the small problem: Gram or R (``n x n``), its factor, SVD/eigen workspace."""
    return 5 * (n + k) ** 2 * 8


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
