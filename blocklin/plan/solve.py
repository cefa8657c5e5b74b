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
    steps : tuple of str
        What the run does beyond the route's first pass (the leave-one-out pass, the check of the
        sample weights, the means of an intercept), as ``--explain`` prints it.
    """

    m: int
    n: int
    k: int
    orientation: str
    method: str
    passes: int
    small_memory: int
    memory: int
    steps: tuple[str, ...] = ()

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def explain(self, device: str = "cpu") -> str:
        """What ``blocklin solve --explain`` prints."""
        text = (f"solve {self.m} x {self.n}, {self.k} right-hand side(s): {self.orientation}, method {self.method}, "
                f"{self.passes} pass(es) over A, in-core problem {format_size(self.small_memory)} of "
                f"{format_size(self.memory)}")
        return text + "".join(f"\n  {s}" for s in self.steps)


def plan_solve(m: int, n: int, k: int, *, method: str, memory: int, lam_kind: str = "scalar",
               refine: int = 1, weighted: bool = False, positive: bool = False,
               fit_intercept: bool = False) -> SolvePlan:
    """Orientation, method and pass count of a solve (validation of the in-core size included)."""
    orientation = "tall" if m >= n else "wide"
    small = small_bytes(min(m, n), k)
    if small > memory:
        side = min(m, n)
        raise BudgetError(explain("memory", f"must hold the in-core {side} x {side} problem (Gram/R factor, "
                                  "its factorization and SVD)", format_size(memory),
                                  f"raise it to at least {format_size(small)} "
                                  f"(memory='{math.ceil(small / 2**20)}MiB'); "
                                  "for very wide or very tall-and-wide problems use an iterative method"), minimum=small)
    steps = []
    if orientation == "wide":
        passes = 2 + (lam_kind == "scalar")
    elif positive:
        passes = 1  # the Gram pass; NNLS in memory
    elif method == "qr" or lam_kind != "scalar" and method == "auto" and not (weighted or fit_intercept):
        passes = 1
    elif lam_kind != "scalar":
        passes = 1  # the (weighted, centered) Gram pass and its eigen-decomposition
    else:
        passes = 1 + refine
    if orientation == "wide" and method == "auto" and not weighted:
        steps.append("method 'auto': one more pass (the TSQR of A^T, the QR route) where the dual form's error bound "
                     "is 100 times the QR route's or more (a small lam against ||A||; solve/wide_auto.py)")
    if weighted:
        steps.append("sample_weight: one pass over the m weights checks them (finite, >= 0, not all zero); "
                     + ("A's rows scaled by sqrt(w) as they are read (normal equations, on the CPU)"
                        if orientation == "tall" else "A A^T scaled by sqrt(w) on both sides, in memory"))
    if fit_intercept and orientation == "tall" and method == "qr":
        steps.append("fit_intercept: a ones column streamed before A (the R factor of [1 | A | b] holds the centered "
                     "problem's; no pass for the means)")
    elif fit_intercept and orientation == "tall":
        steps.append("fit_intercept: the Gram pass sums the rows less the first row (one row read) and their "
                     + ("weighted " if weighted else "") + "column sums: the means and the centered Gram quantities "
                     "from its sums (no extra pass)")
    if lam_kind == "loo" and orientation == "tall":
        passes += 1
        steps.append("leave-one-out: one more pass over A and b for the hat diagonals h_ii and residuals of every "
                     "grid lambda at once (e_i / (1 - h_ii)); one more still if method 'auto' switches to the QR")
    elif lam_kind == "loo":
        steps.append("leave-one-out: from the eigen-decomposition of A A^T in memory (no extra pass)")
    if positive:
        steps.append("positive: nonnegative least squares (Lawson-Hanson) on the Cholesky factor of the "
                     "n x n Gram matrix plus lam^2 I, in memory")
    return SolvePlan(m=m, n=n, k=k, orientation=orientation, method=method, passes=passes, small_memory=small,
                     memory=memory, steps=tuple(steps))


#: float64 vectors of the sparse LSQR per right-hand side, over ``m`` rows (``u``, ``S v``, the scaled
#: copy of ``u``) and over ``n`` rows (``v``, ``S^T u``, the copies the update of ``v`` makes); per
#: (rhs, lambda) column over ``m`` rows (``b`` repeated and ``S x`` of the residual pass at the end)
#: and over ``n`` rows (``x``, ``w``, the copies of the live columns and the updates' temporaries);
#: ``b`` itself besides (``m`` per rhs).
LSQR_RHS_VECTORS = (3, 4)
LSQR_COLUMN_VECTORS = (2, 6)


@dataclasses.dataclass(frozen=True)
class SparseSolvePlan:
    """What :func:`blocklin.solve` does with a stored sparse ``a``: LSQR (Paige and Saunders 1982) on the
    row-block products, every right-hand side and lambda at once.

    Attributes
    ----------
    m, n, k : int
        Rows and columns of ``S``, right-hand sides.
    lams : int
        Lambda values solved together (``L``; the output is ``n x (L k)``).
    nnz : int
        Stored entries of ``S``.
    bytes_per_pass : int
        Bytes one pass reads: ``nnz (value + index bytes) + 8 (m + 1)`` (the row offsets).
    setup_passes : int
        Passes outside the iterations: ``S^T b``, the residual ``b - S x`` at the end, and the means
        with ``fit_intercept``.
    max_iter : int
        Iteration limit; each iteration is two passes (``S v`` and ``S^T u``).
    max_passes : int
        ``setup_passes + 2 max_iter``.
    vector_memory, block_memory, peak_memory : int
        Bytes of the float64 vectors (``b``, the LSQR vectors of ``k`` and of ``L k`` columns), of one
        product task (:func:`blocklin.runtime.sparse_pass.task_memory`: its largest row block's CSR
        arrays as read and cast, its result or partial; and the zarr chunks decoded around the
        block), and their sum.
    memory : int
        The budget.
    """

    m: int
    n: int
    k: int
    lams: int
    nnz: int
    row_blocks: int
    max_block_entries: int
    bytes_per_pass: int
    setup_passes: int
    max_iter: int
    max_passes: int
    vector_memory: int
    block_memory: int
    peak_memory: int
    memory: int
    method: str = "lsqr"

    @property
    def flops_per_iteration(self) -> int:
        """``S v`` and ``S^T u`` of ``k`` columns: ``4 nnz k``."""
        return 4 * self.nnz * self.k

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def explain(self, device: str = "cpu") -> str:
        """What ``blocklin solve --explain`` prints for a sparse ``a``."""
        return (f"solve sparse {self.m} x {self.n} ({self.nnz} entries, {self.row_blocks} row block(s)), "
                f"{self.k} right-hand side(s) x {self.lams} lambda(s): LSQR (Paige-Saunders), each iteration one "
                f"pass S v and one pass S^T u over the row blocks ({format_size(self.bytes_per_pass)} read per pass, "
                f"{self.flops_per_iteration / 1e9:.3g} GFLOP per iteration); at most {self.max_iter} iterations = "
                f"{self.max_passes} passes ({self.setup_passes} outside the iterations); peak "
                f"{format_size(self.peak_memory)} of {format_size(self.memory)} (vectors "
                f"{format_size(self.vector_memory)}, one row block {format_size(self.block_memory)}); {device}")

    __str__ = explain


def plan_sparse_solve(m: int, n: int, k: int, *, lams: int, nnz: int, value_bytes: int, index_bytes: int,
                      row_blocks: int, max_block_entries: int, task_bytes: int, chunk_bytes: int,
                      max_iter: int, intercept: bool, memory: int) -> SparseSolvePlan:
    """The sparse LSQR solve's passes and memory; a :class:`~blocklin.errors.BudgetError` naming the
    budget that suffices when the vectors and one product task do not fit ``memory``.

    ``task_bytes``: what one product task allocates (the largest of ``S^T U``'s with ``k`` columns and
    the residual's ``S x`` with ``L k``); ``chunk_bytes``: what zarr decodes around one block's read (a chunk of each 1-D
    array at either end of the range).
    """
    cols = k * lams
    (rm, rn), (cm, cn) = LSQR_RHS_VECTORS, LSQR_COLUMN_VECTORS
    vectors = 8 * (m * k + rm * m * k + rn * n * k + cm * m * cols + cn * n * cols)
    block = task_bytes + chunk_bytes
    peak = vectors + block
    setup = 2 + int(intercept)
    if peak > memory:
        raise BudgetError(explain(
            "memory", "must hold the sparse LSQR solve's float64 vectors (b and about 4 (m + n) numbers per "
            "right-hand side and lambda) and one product task (a row block of S and its product)", f"{format_size(memory)} for vectors of "
            f"{format_size(vectors)} and a row block of {format_size(block)} ({m} x {n}, {k} right-hand side(s), "
            f"{lams} lambda(s))", f"raise it to at least {format_size(peak)} (memory='{math.ceil(peak / 2**20)}MiB'), "
            "or solve fewer right-hand sides or lambdas at a time (or convert S again with a smaller --memory: "
            "smaller row blocks)"), minimum=peak)
    return SparseSolvePlan(m=m, n=n, k=k, lams=lams, nnz=nnz, row_blocks=row_blocks,
                           max_block_entries=max_block_entries, bytes_per_pass=nnz * (value_bytes + index_bytes)
                           + 8 * (m + 1), setup_passes=setup, max_iter=max_iter, max_passes=setup + 2 * max_iter,
                           vector_memory=vectors, block_memory=block, peak_memory=peak, memory=memory)
