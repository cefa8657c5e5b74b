"""Planning the out-of-core Schur-complement inverse (pure: sizes and budgets in, a frozen plan out).

The matrix is staged into a working store with square ``chunk x chunk`` chunks (the random
butterfly applied on the way), then inverted in place by recursive 2 x 2 block elimination whose
split points are multiples of the chunk (so every GEMM tile owns whole chunks), down to diagonal
leaves small enough to invert in core with LAPACK.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from blocklin._memory import IO_CONCURRENCY
from blocklin.config import format_size
from blocklin.errors import BudgetError, explain

#: zarr chunk temporaries the planner counts: one per chunk in flight, reading and writing
#: (zarr moves up to ``IO_CONCURRENCY`` chunks at once, see ``blocklin._memory``).
IO_CHUNKS = 2 * IO_CONCURRENCY
#: Bytes per element of a row strip of the staging pass: the stored strip and a read-ahead slot,
#: a float64 copy, the butterfly's gathered halves, and the cast written back.
STRIP_BYTES_PER_ELEM = 48
#: Smallest and largest working chunk side.
MIN_CHUNK, MAX_CHUNK = 16, 1024


@dataclasses.dataclass(frozen=True)
class InversePlan:
    """How :func:`blocklin.inv` inverts an ``n x n`` matrix within ``memory`` bytes.

    Attributes
    ----------
    n : int
    dtype, work_dtype : str
        Output dtype and the dtype of the recursion (``float32`` for ``precision="mixed"``).
    chunk : int
        Side of the working stores' square chunks; every split point is a multiple of it.
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

    @property
    def gemm_steps(self) -> int:
        return 6 * len(self.nodes)

    @property
    def levels(self) -> int:
        return _levels(self.n, self.leaf, self.chunk)

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["gemm_steps"] = self.gemm_steps
        d["levels"] = self.levels
        d["nodes"] = [list(x) for x in self.nodes]
        d["leaves"] = [list(x) for x in self.leaves]
        return d

    def explain(self) -> str:
        lines = [
            f"inverse plan: {self.n} x {self.n} {self.dtype} (recursion in {self.work_dtype}) on a "
            f"{format_size(self.memory)} budget",
            f"  working chunks {self.chunk} x {self.chunk}; leaves up to {self.leaf} ({len(self.leaves)} leaf/leaves,"
            f" {len(self.nodes)} Schur node(s), {self.gemm_steps} out-of-core GEMM step(s))",
            f"  stability guard: {'random butterfly of depth ' + str(self.depth) if self.depth else 'none needed (one pivoted LU leaf)'}",
            f"  work {self.flops / 1e9:.1f} GFLOP (+{self.refine_flops / 1e9:.1f} GFLOP per Newton-Schulz step)",
            f"  memory peak {format_size(self.peak_memory)} (leaf {format_size(self.leaf_memory)}, strip pass "
            f"{format_size(self.strip_memory)}, column pass {format_size(self.column_memory)})",
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


def leaf_bytes(s: int, itemsize: int, chunk_bytes: int) -> int:
    """Memory of an in-core leaf: the block twice over (LAPACK workspace, write temporaries) + I/O."""
    return 2 * s * s * itemsize + IO_CHUNKS * chunk_bytes


def plan_inverse(n: int, dtype, *, memory: int, precision: str | None = None, leaf: int | None = None,
                 chunk: int | None = None, depth: int | None = None) -> InversePlan:
    """Plan the inversion of an ``n x n`` matrix of ``dtype`` within ``memory`` bytes.

    Parameters
    ----------
    n : int
    dtype : dtype
        Output dtype (``float32`` or ``float64``).
    memory : int
        Host budget in bytes.
    precision : {None, "mixed"}
        ``"mixed"`` runs the recursion in float32.
    leaf, chunk, depth : int, optional
        Override the leaf size, the working chunk side and the butterfly depth (tests, tuning).

    Raises
    ------
    BudgetError
        When the budget cannot hold the smallest chunks.
    """
    dt = np.dtype(dtype)
    wdt = np.dtype(np.float32) if precision == "mixed" else dt
    wsz = wdt.itemsize
    n = int(n)
    if chunk is None:
        side = math.sqrt(memory / (64 * wsz))
        side = min(side, memory / max(1, n * STRIP_BYTES_PER_ELEM))
        chunk = 2 ** int(math.floor(math.log2(max(1.0, side))))
        chunk = max(MIN_CHUNK, min(MAX_CHUNK, chunk))
        chunk = min(chunk, max(1, n))
    chunk_bytes = chunk * chunk * max(wsz, dt.itemsize)
    if leaf is None:
        avail = memory - IO_CHUNKS * chunk_bytes
        leaf = int(math.isqrt(max(0, avail // (2 * wsz))))
    if leaf < min(n, 2 * chunk):
        need = leaf_bytes(min(n, 2 * chunk), wsz, chunk_bytes)
        raise BudgetError(explain("memory", f"must hold an in-core leaf of at least two {chunk} x {chunk} chunks",
                                  format_size(memory), f"raise it to at least {format_size(need)} "
                                  f"(memory='{math.ceil(need / 2**20)}MiB')"))
    leaf = max(leaf, 1)
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
    if depth is None:
        depth = 2 if nodes else 0
    width = chunk
    lm = leaf_bytes(max(size for _, size in leaves), wsz, chunk_bytes)
    strip = n * chunk * STRIP_BYTES_PER_ELEM
    column = n * width * (wsz + 2 * 8) + IO_CHUNKS * chunk_bytes
    return InversePlan(n=n, dtype=dt.name, work_dtype=wdt.name, chunk=chunk, leaf=leaf, depth=depth,
                       nodes=tuple(nodes), leaves=tuple(leaves), flops=flops[0], refine_flops=4 * n**3,
                       column_width=width, leaf_memory=lm, strip_memory=strip, column_memory=column,
                       peak_memory=max(lm, strip, column), memory=memory)
