"""Plans of operations on a stored sparse matrix (``blocklin-csr``), counted in nonzeros (pure, no I/O).

On a sparse matrix the cost of a pass is its stored arrays, not ``m n``: one read of ``S`` is its
row offsets, column indices and values, ``8 (m + 1) + nnz (value bytes + index bytes)``
(:func:`sparse_pass_bytes`). A :class:`SparseOpPlan` says how many such reads an operation makes
(as the dense plan estimates its passes: ``q + 1`` for rsvd, at most ``max_passes`` for the adaptive
block Lanczos), what it holds at once (a row block or a task's piece of ``S``, the dense blocks,
``U``), and that against the budget; ``explain()`` is what ``--explain`` prints.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from blocklin.config import format_size, size_hint
from blocklin.errors import BudgetError, explain
from blocklin.plan.rates import Rates, expected_line

#: Bytes a float64 element of the in-memory blocks takes.
F64 = 8


def sparse_pass_bytes(m: int, nnz: int, dtype: Any, index_dtype: Any) -> int:
    """Bytes of one read of a stored sparse ``m``-row matrix: ``indptr`` (int64, ``m + 1``), then
    ``indices`` and ``data`` (``nnz`` each)."""
    return 8 * (int(m) + 1) + int(nnz) * (np.dtype(dtype).itemsize + np.dtype(index_dtype).itemsize)


@dataclasses.dataclass(frozen=True)
class SparseOpPlan:
    """One operation on a stored sparse matrix, counted in nonzeros.

    Attributes
    ----------
    operation : str
        ``"svd"``, ``"pca"``, ``"eigsh"``, ``"S B"``, ``"S^T B"`` or ``"S^T S"``.
    method : str
        ``"lanczos"``, ``"rsvd"`` or ``"tiles"``/``"one pass"`` for the products.
    shape, dtype, nnz, index_dtype :
        The sparse matrix.
    pass_bytes : int
        One read of ``S`` (:func:`sparse_pass_bytes`).
    passes : int or None
        Passes as the run's report counts them (None: adaptive, at most :attr:`max_passes`).
    reads_per_pass : int
        Reads of ``S`` in one pass (an SVD pass is ``S Q`` then ``S^T Y``: 2).
    extra_reads : int
        Reads of ``S`` besides the passes (PCA's column means, eigsh's symmetry check: 1).
    formula : str
        How the passes are counted.
    held : tuple of (str, int)
        What the run holds at once, by name (row block, dense blocks, ``U``, tasks).
    memory : int
        The budget.
    flops, bytes_written, other_bytes_read : int
        Floating-point operations, bytes written, and bytes of dense operands read (``B``).
    held_blocks : int
        Bytes of ``S``'s row blocks held in memory between the products (0: every product reads
        them): ``S`` is then read once for all the passes (:attr:`reads`).
    basis_spilled : int
        Bytes of the Krylov bases ``V`` and ``W`` spilled to a scratch file in the work folder (0: held
        in memory; :mod:`blocklin.linalg.lowrank.basis`): read and written strip by strip every step.
    details : dict
        The operation's own sizes (block, basis, tiles).
    """

    operation: str
    method: str
    shape: tuple[int, int]
    dtype: str
    nnz: int
    index_dtype: str
    pass_bytes: int
    passes: int | None
    max_passes: int
    reads_per_pass: int
    extra_reads: int
    formula: str
    held: tuple[tuple[str, int], ...]
    memory: int
    flops: int
    bytes_written: int
    other_bytes_read: int = 0
    held_blocks: int = 0
    basis_spilled: int = 0
    details: dict = dataclasses.field(default_factory=dict)

    route = "sparse"

    @property
    def passes_bound(self) -> int:
        """:attr:`passes` where the plan knows them, else at most :attr:`max_passes`."""
        return self.passes if self.passes is not None else self.max_passes

    @property
    def reads(self) -> int:
        """Reads of ``S`` (at the bound where the passes are adaptive; one for all of them where the row
        blocks are held)."""
        return (1 if self.held_blocks else self.passes_bound * self.reads_per_pass) + self.extra_reads

    @property
    def bytes_read(self) -> int:
        """``S`` read :attr:`reads` times, and the dense operands."""
        return self.reads * self.pass_bytes + self.other_bytes_read

    @property
    def peak_memory(self) -> int:
        return int(sum(b for _, b in self.held))

    @property
    def fits(self) -> bool:
        return self.peak_memory <= self.memory

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d.update(held=dict(self.held), route=self.route, reads=self.reads, bytes_read=self.bytes_read,
                 peak_memory=self.peak_memory, fits=self.fits, passes_bound=self.passes_bound)
        return d

    def explain(self, rates: Rates | None = None, device: str = "cpu") -> str:
        """The plan in a few lines: the matrix by its nonzeros, the passes and bytes each reads, what is
        held against the budget, and the expected split of the time (at the most passes when adaptive)."""
        m, n = self.shape
        p = self.passes if self.passes is not None else f"<= {self.max_passes}"
        what = "products with S" if self.held_blocks else "reads of S"
        per = f"{self.reads_per_pass} {what} each, " if self.reads_per_pass != 1 else ""
        if self.held_blocks:
            per = f"{per}from the row blocks held in memory, S read once; "
        extra = f" + {self.extra_reads} read{'s' * (self.extra_reads != 1)}" if self.extra_reads else ""
        lines = [f"{self.operation} ({self.method}) of a sparse {m} x {n} {self.dtype}: nnz {self.nnz} "
                 f"(density {self.nnz / max(1, m * n):.3g}), one read of S {format_size(self.pass_bytes)} "
                 f"(indptr {format_size(8 * (m + 1))} + indices and values {self.index_dtype}/{self.dtype})",
                 f"  passes {p} ({per}{self.formula}){extra}: read {format_size(self.bytes_read)}"
                 + (f" (of which dense operands {format_size(self.other_bytes_read)})" if self.other_bytes_read else "")
                 + f", write {format_size(self.bytes_written)}, {self.flops / 1e9:.3g} GFLOP",
                 f"  holds {format_size(self.peak_memory)} of {format_size(self.memory)}: "
                 + ", ".join(f"{name} {format_size(b)}" for name, b in self.held)
                 + ("" if self.fits else " (over the budget)")]
        if self.basis_spilled:
            lines.append(f"  Krylov bases spilled to the work folder: {format_size(self.basis_spilled)} on disk, read and "
                         "written strip by strip each step (they do not fit the budget beside the products)")
        label = "expected" if self.passes is not None else f"expected at {self.max_passes} passes (the most)"
        lines.append("  " + expected_line(self.bytes_read, self.bytes_written, self.flops, device, rates,
                                          dtype=self.dtype, label=label))
        return "\n".join(lines)

    def check(self) -> None:
        """Refuse a plan whose holdings exceed the budget, naming a budget that holds them."""
        if self.fits:
            return
        need = self.peak_memory * 9 // 8
        biggest = max(self.held, key=lambda h: h[1])
        raise BudgetError(explain("memory", f"must hold what {self.operation} of a sparse matrix keeps in memory at "
                                  "once (" + ", ".join(name for name, _ in self.held) + ")",
                                  f"{format_size(self.peak_memory)} (the largest: {biggest[0]}, "
                                  f"{format_size(biggest[1])}) for memory={format_size(self.memory)}",
                                  f"raise it to at least {size_hint(need)} (memory='{size_hint(need)}'), or "
                                  "lower k"), minimum=need)


def plan_sparse_lowrank(operation: str, *, shape: tuple[int, int], dtype: Any, nnz: int, index_dtype: Any,
                        product_bytes: int, svd_plan: Any, k: int, memory: int, max_passes: int,
                        extra_reads: int | None = None, also_held: tuple = (),
                        bytes_written: int | None = None, held_blocks: int = 0,
                        basis_spilled: int = 0) -> SparseOpPlan:
    """The plan of ``svd``, ``pca`` or ``eigsh`` of a stored sparse matrix through its row-block operator.

    ``svd_plan`` is the dense plan the run makes (:func:`blocklin.plan.svd.plan_svd`: its passes,
    block, basis and in-core work); ``product_bytes`` what the larger of its products holds
    (:func:`blocklin.runtime.sparse_pass.product_memory`: ``X``, the result, one task's row block
    and partial). Held besides: the method's in-core work and, for svd and pca, the long factor
    ``U`` (``M x k``, float64) with the ``M x block`` blocks the Rayleigh-Ritz step keeps.
    ``extra_reads`` (reads of ``S`` besides the passes: default 1 for pca's means and eigsh's symmetry
    check), ``also_held`` (more ``(name, bytes)``) and ``bytes_written`` override the defaults.
    ``held_blocks``: the bytes of the row blocks held between the products
    (:func:`blocklin.runtime.sparse_pass.blocks_fit`), read once for all the passes; ``basis_spilled``:
    the bytes of the Krylov bases spilled to the work folder (0: in memory).
    """
    m, n = (int(s) for s in shape)
    dt, idt = np.dtype(dtype), np.dtype(index_dtype)
    l = int(svd_plan.block)
    M = max(m, n)
    held = [("a product (X, its result, one task's row block and partial)", int(product_bytes))]
    if operation == "eigsh":
        held.append(("Krylov basis strip buffers and the step's blocks" if basis_spilled else
                     "Krylov basis and Ritz vectors", int(svd_plan.client_bytes)))
        reads_per_pass, extra = 1, 1  # each step one S X; the first also S^T X (the symmetry check)
        formula = "L Lanczos steps, one S X each"
    elif basis_spilled:  # U, V and the last step's blocks go to disk strip by strip too
        held.append(("Krylov basis strip buffers and the step's blocks", int(svd_plan.client_bytes)))
        reads_per_pass, extra = 2, 0
        formula = f"{svd_plan.formula}, each S Q then S^T Y"
    else:
        held.append(("in-core work (factors, Krylov basis)", int(svd_plan.client_bytes)))
        held.append((f"U ({M} x {k}) and the long blocks", M * (k + l) * F64))
        reads_per_pass, extra = 2, (1 if operation == "pca" else 0)  # pca: the column means' pass
        formula = f"{svd_plan.formula}, each S Q then S^T Y"
        if operation == "pca":
            held.append(("column means and variances", 3 * n * F64))
    extra = extra if extra_reads is None else int(extra_reads)
    if held_blocks:
        held.append(("the row blocks of S, held between the products (read once)", int(held_blocks)))
    held.extend(also_held)
    passes = svd_plan.passes
    flops = 2 * nnz * l * reads_per_pass * (passes if passes is not None else max_passes)
    return SparseOpPlan(operation=operation, method=svd_plan.method, shape=(m, n), dtype=dt.name, nnz=int(nnz),
                        index_dtype=idt.name, pass_bytes=sparse_pass_bytes(m, nnz, dt, idt), passes=passes,
                        max_passes=int(max_passes), reads_per_pass=reads_per_pass, extra_reads=extra,
                        formula=formula, held=tuple(held), memory=int(memory), flops=int(flops),
                        bytes_written=(M * k * dt.itemsize if operation != "eigsh" else 0) if bytes_written is None
                        else int(bytes_written), held_blocks=int(held_blocks), basis_spilled=int(basis_spilled),
                        details={"k": k, "block": l, "max_basis": int(svd_plan.max_basis),
                                 "power_iters": svd_plan.power_iters})


def plan_sparse_product(op: str, *, shape: tuple[int, int], dtype: Any, nnz: int, index_dtype: Any, p: int,
                        rows: int, cols: int, inner: int, entries: int, task_memory: int, workers: int,
                        memory: int, flops: int, b_itemsize: int, out_itemsize: int) -> SparseOpPlan:
    """The plan of a sparse product (``op`` ``"SB"``, ``"STB"``, ``"STS"``) from its tiles
    (:func:`blocklin.linalg.products.sparse_gemm.plan_sparse`): how often ``S`` and ``B`` are read,
    and the ``workers`` tasks held at once."""
    import math

    m, n = (int(s) for s in shape)
    dt, idt = np.dtype(dtype), np.dtype(index_dtype)
    if op == "SB":
        reads, b_bytes = math.ceil(p / cols) * math.ceil(n / inner), n * p * b_itemsize * math.ceil(m / rows)
        name, out_rows, how = "S B", m, f"tiles of {rows} x {cols}, B in panels of {inner} rows"
        formula = "every tile reads its rows of S once per panel of B"
    elif op == "STB":
        reads, b_bytes = math.ceil(n / inner) * math.ceil(p / cols), m * p * b_itemsize * math.ceil(n / inner)
        name, out_rows, how = "S^T B", n, f"tiles of {inner} x {cols}, S in strips of {rows} rows"
        formula = "every tile reads all of S"
    else:
        reads, b_bytes, name, out_rows, how = 1, 0, "S^T S", n, f"one task, strips of {rows} rows"
        formula = "one pass over the rows"
    tasks = 1 if op == "STS" else math.ceil(out_rows / (rows if op == "SB" else inner)) * math.ceil(p / cols)
    return SparseOpPlan(operation=name, method="one pass" if op == "STS" else "tiles", shape=(m, n),
                        dtype=dt.name, nnz=int(nnz), index_dtype=idt.name,
                        pass_bytes=sparse_pass_bytes(m, nnz, dt, idt), passes=reads, max_passes=reads,
                        reads_per_pass=1, extra_reads=0, formula=formula,
                        held=((f"{workers} task{'s' * (workers != 1)} at once (each a piece of {entries} entries "
                               f"of S, {how})", workers * task_memory),),
                        memory=int(memory), flops=int(flops), bytes_written=out_rows * p * out_itemsize,
                        other_bytes_read=int(b_bytes),
                        details={"rows": rows, "cols": cols, "inner": inner, "entries": entries, "tasks": tasks,
                                 "workers": workers, "task_memory": task_memory, "p": p})


__all__ = ["SparseOpPlan", "plan_sparse_lowrank", "plan_sparse_product", "sparse_pass_bytes"]
