"""Planning the out-of-core Schur-complement inverse (pure: sizes and budgets in, a frozen plan out).

The matrix is staged into a working store with square ``chunk x chunk`` chunks (the random
butterfly applied on the way), then inverted in place by recursive 2 x 2 block elimination whose
split points are multiples of the chunk (so every GEMM tile owns whole chunks), down to diagonal
leaves small enough to invert in core with LAPACK.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable

import numpy as np

from blocklin.config import format_size
from blocklin.errors import BudgetError, InternalError, explain
from blocklin.plan.rates import Rates, expected_line
from blocklin.plan.passes import PassMemory, plan_pass

#: Smallest and largest working chunk side.
MIN_CHUNK, MAX_CHUNK = 16, 1024


@dataclasses.dataclass(frozen=True)
class KernelMemory:
    """The memory the inverse's tasks declare next to their code (``linalg._inv_kernels.MEMORY``).

    The planner reads these declarations and computes no task memory itself.

    Attributes
    ----------
    leaf : callable
        ``leaf(size, work_dtype, chunk_bytes, probed=False) -> bytes`` of the in-core leaf inversion
        task (``probed``: the one-leaf inverse that also probes its residual).
    staging : callable
        ``staging(n, work_dtype, source_dtype) -> PassMemory`` of one task of the staging row pass (``W = M V``).
    column : callable
        ``column(n, width, work_dtype, out_dtype, chunk_bytes) -> bytes`` of one task of the column
        pass that undoes the butterfly.
    """

    leaf: Callable[..., int]
    staging: Callable[[int, np.dtype, np.dtype], PassMemory]
    column: Callable[[int, int, np.dtype, np.dtype, int], int]
    #: ``rows(n, width, tile, work_dtype, out_dtype) -> bytes`` of the task that solves ``width`` rows
    #: of the inverse from the stored LU panels of width ``tile`` (method ``"lu"``).
    rows: Callable[[int, int, int, np.dtype, np.dtype], int] | None = None


@dataclasses.dataclass(frozen=True)
class InversePlan:
    """How :func:`blocklin.inv` inverts an ``n x n`` matrix within ``memory`` bytes.

    Attributes
    ----------
    n : int
    dtype, work_dtype : str
        Output dtype and the dtype of the recursion (``float32`` for ``precision="mixed"``).
    chunk : int
        Side of the working stores' square chunks; every split point is a multiple of it. Method
        ``"lu"``: the output's chunk side, which divides :attr:`row_width`.
    leaf : int
        Largest diagonal block inverted in core (LU with partial pivoting).
    depth : int
        Depth of the random butterfly (0 when the whole matrix is a leaf: no recursion, no RBT).
    nodes : tuple of (offset, size, split)
        Internal nodes of the recursion, in execution order.
    leaves : tuple of (offset, size)
        Diagonal blocks inverted in core, in execution order.
    flops : int
        Floating-point operations of the inversion (``~2 n^3``), without refinement.
    refine_flops : int
        Flops of one Newton-Schulz step (``4 n^3``: two GEMMs).
    column_width : int
        Width of the column strips of the pass that undoes the butterfly.
    peak_memory : int
        Largest planned host memory of any step (leaf, strip pass, column pass); GEMM steps are
        planned separately within ``memory``.
    method : {"direct", "lu", "schur"}
        ``"direct"``: one in-core leaf (:attr:`direct`); ``"lu"``: the out-of-core LU with partial
        pivoting (:func:`blocklin.linalg.factor.lu.factor_lu_into`), then the rows of the inverse solved
        from its panels; ``"schur"``: the randomized Schur-complement recursion.
    lu_tile, row_width, lu_memory, rows_memory : int
        Method ``"lu"``: the panel width of the factorization, the rows of the inverse one task
        solves (a multiple of ``chunk``), the factorization's and that task's memory.
    direct : bool
        The whole matrix is one leaf read straight from the input (chunk temporaries of the input's
        chunks included): one read, LAPACK's pivoted inverse in place, one write, and the residual
        probed inside the same task (no staging, butterfly or probe pass).
    """

    n: int
    dtype: str
    work_dtype: str
    chunk: int
    leaf: int
    depth: int
    nodes: tuple[tuple[int, int, int], ...]
    leaves: tuple[tuple[int, int], ...]
    flops: int
    refine_flops: int
    column_width: int
    leaf_memory: int
    strip_memory: int
    column_memory: int
    peak_memory: int
    memory: int
    direct: bool = False
    #: Why a ``precision=`` request runs in another precision (empty when it runs as asked).
    precision_note: str = ""
    method: str = "schur"
    lu_tile: int = 0
    row_width: int = 0
    lu_memory: int = 0
    rows_memory: int = 0

    @property
    def gemm_steps(self) -> int:
        return 6 * len(self.nodes)

    @property
    def levels(self) -> int:
        return _levels(self.n, self.leaf, self.chunk) if self.method != "lu" else 0

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["gemm_steps"] = self.gemm_steps
        d["levels"] = self.levels
        d["nodes"] = [list(x) for x in self.nodes]
        d["leaves"] = [list(x) for x in self.leaves]
        return d

    @property
    def bytes_read(self) -> int:
        """Estimated bytes read without refinement (a property: plans and tokens unchanged). Direct:
        ``n^2``. LU: the factorization's panel reads (``n^3 / (2 lu_tile) + 2 n^2``), then every
        row task streams the ``n^2`` panels. Schur: staging ``n^2``, each node's six GEMM steps
        their operand blocks once (``3 size^2``), each leaf its block, the butterfly's undo ``n^2``."""
        isz, n = np.dtype(self.work_dtype).itemsize, self.n
        if self.method == "direct":
            return n * n * isz
        if self.method == "lu":
            lu = n**3 / (2 * max(1, self.lu_tile)) + 2 * n * n
            return int((lu + math.ceil(n / max(1, self.row_width)) * n * n) * isz)
        return (2 * n * n + sum(3 * size**2 for _, size, _ in self.nodes) + sum(s * s for _, s in self.leaves)) * isz

    @property
    def bytes_written(self) -> int:
        """Estimated bytes written without refinement: direct ``n^2``; LU its panels and factor
        (``2 n^2``) and the inverse (``n^2``); Schur the staged copy and the undone result (``2 n^2``),
        each node's GEMM results (``6 split (size - split)``) and each leaf's inverse."""
        isz, n = np.dtype(self.work_dtype).itemsize, self.n
        if self.method == "direct":
            return n * n * isz
        if self.method == "lu":
            return 3 * n * n * isz
        return (2 * n * n + sum(6 * sp * (size - sp) for _, size, sp in self.nodes)
                + sum(s * s for _, s in self.leaves)) * isz

    def explain(self, rates: Rates | None = None, device: str = "cpu") -> str:
        """The plan, and the expected split of its time on ``device`` without refinement (``rates``:
        default :func:`~blocklin.plan.rates.load_rates`)."""
        expected = "  " + expected_line(self.bytes_read, self.bytes_written, self.flops, device, rates,
                                        dtype=self.work_dtype, label="expected without refinement")
        return f"{self._summary()}\n{expected}"

    def _summary(self) -> str:
        if self.method == "lu":
            return "\n".join([
                f"inverse plan: {self.n} x {self.n} {self.dtype} (LU in {self.work_dtype}) on a "
                f"{format_size(self.memory)} budget",
                f"  method lu: out-of-core LU with partial pivoting, panels of {self.lu_tile} columns; then "
                f"A^-T e_i for the unit vectors, {self.row_width} rows of the inverse per task",
                "  stability guard: partial pivoting (LAPACK's backward error, no refinement expected)",
                f"  work {self.flops / 1e9:.1f} GFLOP (+{self.refine_flops / 1e9:.1f} GFLOP per Newton-Schulz step)",
                f"  memory peak {format_size(self.peak_memory)} (LU panels {format_size(self.lu_memory)}, rows "
                f"{format_size(self.rows_memory)})",
            ])
        lines = [
            f"inverse plan: {self.n} x {self.n} {self.dtype} (recursion in {self.work_dtype}) on a "
            f"{format_size(self.memory)} budget",
            f"  working chunks {self.chunk} x {self.chunk}; leaves up to {self.leaf} ({len(self.leaves)} leaf/leaves,"
            f" {len(self.nodes)} Schur node(s), {self.gemm_steps} out-of-core GEMM step(s))",
            *(["  one task: the matrix read once, factored in place by LAPACK (getrf/getri), written once, "
                "residual probed in the same task"] if self.direct else []),
            f"  stability guard: {'random butterfly of depth ' + str(self.depth) if self.depth else 'none needed (one pivoted LU leaf)'}",
            f"  work {self.flops / 1e9:.1f} GFLOP (+{self.refine_flops / 1e9:.1f} GFLOP per Newton-Schulz step)",
            f"  memory peak {format_size(self.peak_memory)} (leaf {format_size(self.leaf_memory)}, strip pass "
            f"{format_size(self.strip_memory)}, column pass {format_size(self.column_memory)})",
            *([f"  {self.precision_note}"] if self.precision_note else []),
        ]
        return "\n".join(lines)


def _levels(n: int, leaf: int, chunk: int) -> int:
    depth, size = 0, n
    while size > leaf:
        size = size - _split(size, chunk, leaf)
        depth += 1
    return depth


def _split(size: int, chunk: int, leaf: int | None = None) -> int:
    """Size of the leading block ``A`` (a multiple of ``chunk``, at least one chunk).

    When the trailing block can be a leaf with ``A`` the smaller part, ``A`` is as small as that
    allows: the Schur complement is then inverted in core with partial pivoting (LAPACK, no I/O), and
    the unpivoted elimination only involves a small, well-conditioned ``A`` (the error of block
    elimination grows with ``cond(A)``, which for a randomized block grows with its size). Otherwise
    the split is balanced near ``size / 2``.
    """
    if leaf is not None and size - leaf <= size // 2:
        n1 = -(-(size - leaf) // chunk) * chunk
    else:
        n1 = int(round(size / 2 / chunk)) * chunk
    return min(max(chunk, n1), size - 1)


def plan_inverse(n: int, dtype, *, memory: int, kernels: KernelMemory, precision: str | None = None,
                 source_dtype=None, source_chunk_bytes: int = 0, leaf: int | None = None,
                 chunk: int | None = None, depth: int | None = None, method: str = "auto",
                 source_chunks: tuple[int, int] | None = None,
                 source_decoded: tuple[int, int, int] | None = None) -> InversePlan:
    """Plan the inversion of an ``n x n`` matrix of ``dtype`` within ``memory`` bytes.

    Parameters
    ----------
    n : int
    dtype : dtype
        Output dtype (``float32`` or ``float64``).
    memory : int
        Host budget in bytes.
    kernels : KernelMemory
        The memory declarations of the inverse's tasks (``blocklin.linalg.inverse.kernels.MEMORY``).
    precision : {None, "mixed"}
        ``"mixed"`` runs the recursion in float32.
    source_dtype : dtype, optional
        Stored dtype of the matrix (default ``dtype``): the rows the staging pass streams.
    source_chunk_bytes : int
        Bytes of one stored chunk of the matrix: the chunk temporaries of a leaf that reads the
        whole matrix straight from the input (:attr:`InversePlan.direct`).
    leaf, chunk, depth : int, optional
        Override the leaf size, the working chunk side and the butterfly depth (tests, tuning).
    method : {"auto", "lu", "schur"}
        Out-of-core route; ``"auto"``: the one-task inverse when the matrix fits, else ``"lu"``, else
        (two LU panels of ``n`` rows beyond the budget) ``"schur"``.
    source_chunks : tuple, optional
        The stored chunks of the matrix (the LU panels are multiples of a square chunk side).

    Raises
    ------
    BudgetError
        When the budget cannot hold the smallest chunks.
    """
    dt = np.dtype(dtype)
    wdt = np.dtype(np.float32) if precision == "mixed" else dt
    src_dt = np.dtype(source_dtype or dt)
    n = int(n)
    given = chunk
    chunk = _chunk(n, wdt, dt, src_dt, memory, kernels) if chunk is None else chunk
    chunk_bytes = chunk * chunk * max(wdt.itemsize, dt.itemsize)
    # the one-task inverse exactly where the recursion's plan below makes it (no node: one leaf of n)
    if n > 0 and wdt == dt and (leaf if leaf is not None else _largest_leaf(n, wdt, chunk_bytes, memory, kernels)) >= n \
            and kernels.leaf(n, wdt, max(chunk_bytes, int(source_chunk_bytes)), True) <= memory:
        method = "direct"
    if method in ("auto", "lu") and n > 0:
        try:
            return _plan_lu(n, dt, wdt, src_dt, chunk, memory, kernels, source_chunks, source_decoded)
        except BudgetError:
            if method == "lu":
                raise
            # "auto": two LU panels of n rows do not fit; the recursion's square blocks may
    # the recursion stages W = M V by a pass over M: its strips decode M's stored chunks (a one-leaf inverse
    # read straight from M does not stage)
    staged = source_decoded if method != "direct" else None
    if staged is not None and given is None:
        chunk = _chunk(n, wdt, dt, src_dt, memory, kernels, staged)
        chunk_bytes = chunk * chunk * max(wdt.itemsize, dt.itemsize)
    if leaf is None:
        leaf = _largest_leaf(n, wdt, chunk_bytes, memory, kernels)
    if leaf < min(n, 2 * chunk):
        need = kernels.leaf(min(n, 2 * chunk), wdt, chunk_bytes)
        raise BudgetError(explain("memory", f"must hold an in-core leaf of at least two {chunk} x {chunk} chunks",
                                  format_size(memory), f"raise it to at least {format_size(need)} "
                                  f"(memory='{math.ceil(need / 2**20)}MiB')"), minimum=need)
    leaf = max(leaf, 1)
    nodes, leaves, flops = _recursion(n, leaf, chunk)
    if depth is None:
        depth = 2 if nodes else 0
    lm = kernels.leaf(max(size for _, size in leaves), wdt, chunk_bytes)
    strip = _staging_peak(n, chunk, wdt, src_dt, memory, kernels, staged)
    if strip is None:
        need = _staging_peak(n, chunk, wdt, src_dt, 2**62, kernels, staged)
        raise BudgetError(explain("memory", f"must hold one staging strip of {min(n, chunk)} rows of the matrix",
                                  format_size(memory), f"raise it to at least {format_size(need)} "
                                  f"(memory='{math.ceil(need / 2**20)}MiB')"), minimum=need)
    column = kernels.column(n, chunk, wdt, dt, chunk_bytes)
    # one leaf read straight from the input: its chunks, not the working ones, are zarr's temporaries
    direct = not nodes and n > 0 and wdt == dt and \
        kernels.leaf(n, wdt, max(chunk_bytes, int(source_chunk_bytes)), True) <= memory
    if direct:
        lm = kernels.leaf(n, wdt, max(chunk_bytes, int(source_chunk_bytes)), True)
    return InversePlan(direct=direct, method="direct" if direct else "schur", n=n, dtype=dt.name, work_dtype=wdt.name, chunk=chunk, leaf=leaf, depth=depth,
                       nodes=nodes, leaves=leaves, flops=flops, refine_flops=4 * n**3,
                       column_width=chunk, leaf_memory=lm, strip_memory=strip, column_memory=column,
                       peak_memory=lm if direct else max(lm, strip, column), memory=memory)


def _plan_lu(n: int, dt: np.dtype, wdt: np.dtype, src_dt: np.dtype, chunk: int, memory: int,
             kernels: KernelMemory, source_chunks: tuple[int, int] | None,
             decoded: tuple[int, int, int] | None = None) -> InversePlan:
    """Method ``"lu"``: the LU panels' plan (with the temporaries of the input's chunks where zarr decodes
    them whole, ``decoded``: :func:`~blocklin.plan.chunks.chunk_io`), and the widest row strip (a multiple of
    ``chunk``, the output's chunk side) whose task fits the budget beside nothing else (tasks run one at a
    time)."""
    from blocklin.plan.factor import plan_lu

    from blocklin.plan.factor import TILE_SIDES

    if kernels.rows is None:
        raise InternalError("plan_inverse: method 'lu' needs the rows task's memory declaration")
    lu = plan_lu(n, wdt, memory=memory, chunks=source_chunks, source_dtype=src_dt, decoded=decoded)
    # the widest panels leave no room for the rows task's chunk temporaries of the panels' store:
    # narrower panels (fewer bytes per chunk) until one chunk-wide strip of rows fits too
    for t in (t for t in TILE_SIDES if t < lu.tile):
        if kernels.rows(n, min(n, chunk), lu.tile, wdt, dt) <= memory:
            break
        lu = plan_lu(n, wdt, memory=memory, tile=t, source_dtype=src_dt, decoded=decoded)
    width = 0
    for w in range(chunk, max(n, chunk) + chunk, chunk):
        if kernels.rows(n, min(w, n), lu.tile, wdt, dt) > memory:
            break
        width = min(w, n)
        if width >= n:
            break
    if width == 0:
        # narrower strips than a chunk would rewrite the output's chunks: the smallest chunk then
        need = kernels.rows(n, min(n, chunk), lu.tile, wdt, dt)
        raise BudgetError(explain("memory", f"must hold {min(n, chunk)} rows of the inverse being solved "
                                  f"(an {n} x {min(n, chunk)} block and a streamed LU panel)", format_size(memory),
                                  f"raise it to at least {format_size(need)} (memory='{math.ceil(need / 2**20)}MiB')"),
                          minimum=need)
    rows_mem = kernels.rows(n, width, lu.tile, wdt, dt)
    # The output's chunks: the largest power of two dividing the strip width (strips own whole chunk
    # rows) whose chunk row of X takes at most a quarter of the budget (a refinement's row passes).
    # The recursion's working chunk is sized for square tiles and gives tiny chunks at small budgets
    # (16 x 16 at 2 MiB: 16 Ki chunk files for n = 2048, which the commit's chunk census lists).
    while width % (2 * chunk) == 0 and 2 * chunk <= MAX_CHUNK and 2 * chunk * n * dt.itemsize <= memory // 4:
        chunk *= 2
    return InversePlan(n=n, dtype=dt.name, work_dtype=wdt.name, chunk=chunk, leaf=0, depth=0, nodes=(), leaves=(),
                       flops=2 * n**3, refine_flops=4 * n**3, column_width=chunk, leaf_memory=0, strip_memory=0,
                       column_memory=0, peak_memory=max(lu.peak_memory, rows_mem), memory=memory, direct=False,
                       method="lu", lu_tile=lu.tile, row_width=width, lu_memory=lu.peak_memory, rows_memory=rows_mem)


def _recursion(n: int, leaf: int, chunk: int) -> tuple[tuple, tuple, int]:
    """Internal nodes ``(offset, size, split)`` and leaves ``(offset, size)`` in execution order, and the flops."""
    nodes: list[tuple[int, int, int]] = []
    leaves: list[tuple[int, int]] = []
    flops = [0]

    def walk(off: int, size: int) -> None:
        if size <= leaf:
            leaves.append((off, size))
            flops[0] += 2 * size**3
            return
        n1 = _split(size, chunk, leaf)
        n2 = size - n1
        walk(off, n1)
        nodes.append((off, size, n1))
        flops[0] += 2 * (3 * n1 * n1 * n2 + 3 * n1 * n2 * n2)
        walk(off + n1, n2)

    walk(0, n)
    return tuple(nodes), tuple(leaves), flops[0]


def _staging_peak(n: int, chunk: int, wdt: np.dtype, src_dt: np.dtype, memory: int,
                  kernels: KernelMemory, decoded: tuple[int, int, int] | None = None) -> int | None:
    """Peak of one staging task whose strip is one working chunk of rows (``None``: it does not fit).

    Every strip of ``W = M V`` must own whole chunk rows of ``W``, so one such strip must fit. ``decoded``:
    the stored chunks of ``M`` where zarr decodes them whole, whose temporaries the pass counts as it
    runs (:func:`~blocklin.plan.passes.plan_pass`; the staging pass had been refused at the plan's own
    minimum).
    """
    rows = min(n, chunk)
    try:
        p = plan_pass(kernels.staging(n, wdt, src_dt), n, n * src_dt.itemsize, chunk_rows=rows, memory=memory, workers=1,
                      chunk_bytes=rows * rows * src_dt.itemsize, chunks_across=-(-n // max(1, rows)),
                      max_strip=rows, min_tasks=1, decoded=decoded, decoded_width=n)
    except BudgetError:
        return None
    return p.peak_memory if p.strip >= rows else None


def _chunk(n: int, wdt: np.dtype, dt: np.dtype, src_dt: np.dtype, memory: int, kernels: KernelMemory,
           decoded: tuple[int, int, int] | None = None) -> int:
    """The working chunk side: a power of two, about ``sqrt(memory / 64)`` elements, whose staging strip
    (over ``decoded`` stored chunks, :func:`_staging_peak`) and undo column pass fit the budget (per their
    declarations)."""
    side = math.sqrt(memory / (64 * wdt.itemsize))
    chunk = 2 ** int(math.floor(math.log2(max(1.0, side))))
    chunk = min(max(MIN_CHUNK, min(MAX_CHUNK, chunk)), max(1, n))
    while chunk > MIN_CHUNK:
        cb = chunk * chunk * max(wdt.itemsize, dt.itemsize)
        if _staging_peak(n, chunk, wdt, src_dt, memory, kernels, decoded) is not None and \
                kernels.column(n, chunk, wdt, dt, cb) <= memory:
            break
        chunk //= 2
    return chunk


def _largest_leaf(n: int, wdt: np.dtype, chunk_bytes: int, memory: int, kernels: KernelMemory) -> int:
    """The largest leaf side (at most ``n``) whose declared memory fits the budget (bisection)."""
    lo, hi = 0, max(1, n)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if kernels.leaf(mid, wdt, chunk_bytes) <= memory:
            lo = mid
        else:
            hi = mid - 1
    return lo
