"""Planning the low-rank factorizations: sizes, pass counts, memory (pure functions, no I/O).

All methods work on the *tall orientation* ``B`` (``M x N``, ``M >= N``): ``B = A`` for tall or
square ``A`` and ``B = A^T`` for wide ``A`` (streamed as column strips of ``A``, never copied).
Small factors (``N x l`` blocks, Krylov bases) stay in memory; the ``M``-long factor is written to a
zarr array. On disk the cost is passes over ``A``; these are the documented formulas:

================  =========================  =============================================
method            passes over A              passes over stored intermediates (M x l)
================  =========================  =============================================
any, A in budget  1 (A is read once)         0
rsvd              q + 1                      2 (CholeskyQR2 refinement, writing U)
sketch            1                          2 (CholeskyQR2 refinement, writing U)
lanczos           L + 1                      2 (CholeskyQR2 refinement, writing U)
gram              2 (+ L)                    2 (CholeskyQR2 refinement, writing U)
full              1                          3 (CholeskyQR3 refinements, writing U)
eigsh             L                          0
================  =========================  =============================================

``q`` is the number of power iterations (each one fused pass ``Z = B^T (B Q)``), ``L`` the number of
block Lanczos steps (one fused pass each; adaptive, at most ``max_passes - 1``). ``gram`` reads ``A``
once for ``B^T B`` (SYRK) and once for the Rayleigh-Ritz step over its top eigenvectors; Lanczos
steps follow (``L``) only where that step's residuals miss the tolerance. ``full`` (every singular
triplet, or the smallest) is the Rayleigh-Ritz step over the whole space: ``Y = B`` itself is
orthonormalized and the SVD of its ``N x N`` triangular factor taken in memory. A shifted
CholeskyQR (ill-conditioned sketch) adds one pass over the intermediate, the TSQR fallback one more.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from blocklin.config import format_size, size_hint
from blocklin.errors import BudgetError, ParameterError, explain
from blocklin.plan.passes import canonical_tasks
from blocklin.plan.rates import Rates, expected_line

#: Host bytes per element of in-core float64 work arrays.
F64 = 8


@dataclasses.dataclass(frozen=True)
class SvdPlan:
    """Sizes and pass counts of one factorization."""

    method: str
    m: int
    n: int
    k: int
    transposed: bool
    M: int
    N: int
    dtype: str
    block: int
    power_iters: int | None
    max_passes: int
    max_basis: int
    sketch_size: tuple[int, int] | None
    in_core: bool
    memory: int
    client_bytes: int
    pass_memory: int
    passes: int | None
    intermediate_passes: int
    formula: str

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @property
    def passes_bound(self) -> int:
        """Passes over ``A``: :attr:`passes` where the plan knows them, else at most ``max_passes``."""
        return self.passes if self.passes is not None else self.max_passes

    @property
    def bytes_read(self) -> int:
        """Estimated bytes read (properties, not fields: plans and their tokens stay as they were):
        ``A`` once per pass (:attr:`passes_bound`), the ``M x block`` intermediate once per
        intermediate pass."""
        isz = np.dtype(self.dtype).itemsize
        return (self.passes_bound * self.M * self.N + self.intermediate_passes * self.M * self.block) * isz

    @property
    def bytes_written(self) -> int:
        """Estimated bytes written: the ``M x block`` intermediate and ``U`` (``M x k`` in core)."""
        isz = np.dtype(self.dtype).itemsize
        return (2 * self.M * self.block if self.intermediate_passes else self.M * self.k) * isz

    @property
    def flops(self) -> int:
        """Estimated flops: two products of ``A`` with a ``block``-wide factor per pass (``4 M N block``,
        the normal pass ``B^T (B Q)``), and a CholeskyQR of the intermediate per intermediate pass."""
        return (4 * self.passes_bound * self.M * self.N * self.block
                + 2 * self.intermediate_passes * self.M * self.block**2)

    def explain(self, rates: Rates | None = None, device: str = "cpu") -> str:
        """The plan, and the expected split of its time on ``device`` (at ``max_passes`` where the
        passes are adaptive; ``rates``: default :func:`~blocklin.plan.rates.load_rates`)."""
        where = "in memory (read once)" if self.in_core else "out of core"
        p = self.passes if self.passes is not None else f"<= {self.max_passes}"
        label = "expected" if self.passes is not None else f"expected at {self.max_passes} passes (the most)"
        return (f"{self.method}: {self.m} x {self.n} {self.dtype}, k={self.k}, block {self.block}, {where}; "
                f"passes over A: {p} ({self.formula}); in-core work {format_size(self.client_bytes)} of "
                f"{format_size(self.memory)}\n  "
                + expected_line(self.bytes_read, self.bytes_written, self.flops, device, rates, dtype=self.dtype,
                                label=label))


def svd_passes(method: str, *, in_core: bool, power_iters: int = 0, lanczos_steps: int = 0) -> int:
    """Passes over ``A`` (the formulas of the module docstring)."""
    if in_core:
        return 1
    if method == "rsvd":
        return power_iters + 1
    if method == "sketch":
        return 1
    if method == "lanczos":
        return lanczos_steps + 1
    if method == "gram":
        return lanczos_steps + 2
    if method == "full":
        return 1
    if method == "eigsh":
        return lanczos_steps
    raise ParameterError(explain("method", "must be one of ('rsvd', 'sketch', 'lanczos', 'gram', 'full', 'eigsh')",
                                 repr(method), "pass method='rsvd'"))


def default_block(k: int, oversample: int, N: int) -> int:
    """Lanczos block size: about half of ``k + oversample`` (at least 8), at most ``N``."""
    return max(1, min(N, k + oversample, max(8, math.ceil((k + oversample) / 2))))


def default_basis(k: int, oversample: int, block: int) -> int:
    """Lanczos basis that triggers a thick restart: ``3 (k + oversample)``, at least two blocks past
    ``k + oversample``. A restart keeps ``k + block`` Ritz vectors, so this leaves room for a few steps
    between restarts; a basis of three blocks (``3 block``, restarting after every step) took 114 steps
    for ``k = 20`` on a 10^5-node power-law graph where this one takes 41 (eigsh, tol 1e-7)."""
    return max(3 * (k + oversample), k + oversample + 2 * block)


def sparse_block(k: int, oversample: int, N: int) -> int:
    """Lanczos block of a stored sparse matrix or a ``LinearOperator`` (svd and eigsh): about an eighth of
    ``k + oversample`` (at least 4), at most ``N``.

    A product with a sparse matrix costs about the same per column whatever the block (bound by its
    random reads of ``X``'s rows: 5-6 ms a column of ``S X`` plus ``S^T Y`` at 2x10^6 entries for 4 to 30
    columns), unlike a dense pass, which reads ``A`` once whatever the block; so a smaller block, whose
    Krylov space reaches ``tol`` with fewer columns, costs fewer products, and each step's in-memory
    work (projections against the basis, its QR) shrinks with it. On the 10^5-node power-law graph of
    ``benchmarks/sparse_matrices.py`` (``tol = 1e-7``, one process, medians of 3-4 rounds alternated):
    svd ``k = 20`` took 124 columns in 30 steps at block 4 against 168 in 21 at block 8 (1.6 and 1.9 s;
    540 in 18 at block 30), ``k = 40`` 3.1 s at block 4 (43 steps), 3.5 s at 8, 4.7 s at 13, ``k = 10``
    0.88 s at 4 against 0.95 s at 5; eigsh ``k = 20`` 2.0 s at block 4 against 2.6 s at 8. The eighth
    rather than a fixed 4 keeps the steps within the default pass limit (60) for a large ``k``: at
    ``k = 100`` block 4 stopped unconverged at the limit, block 8 took 54 steps and block 14 (this rule)
    39, in 14.6 s against 17.2 s at block 28.
    """
    return max(1, min(N, max(4, math.ceil((k + oversample) / 8))))


def sparse_basis(k: int, oversample: int, block: int, N: int) -> int:
    """Lanczos basis that triggers a thick restart with :func:`sparse_block`: ``2 (k + oversample) + 2 block``
    (at least ``k + block``, at most ``N``). A restart keeps ``max(k + block, basis / 2)`` Ritz vectors,
    so several steps run between restarts; measured on the graph of :func:`sparse_block` at block 8:
    basis 64, 80 and 96 took 2.9, 3.3 and 3.3 s of CPU time for svd and 4.6, 4.0 and 3.9 s for eigsh
    (55, 43 and 40 steps), the default block's 30 with basis 60 (a restart every step) 8-9 s for svd; at
    block 4 (``k = 20``) basis 60, 68 and 76 took the same 1.5 s for svd, and 68, 84 and 100 2.0-2.1 s for
    eigsh."""
    return max(k + block, min(N, 2 * (k + oversample) + 2 * block))


def sketch_state_bytes(N: int, sketch: tuple[int, int]) -> int:
    """Bytes of one task's partial state in the sketch's pass: the co-range sketch ``X^T`` (``N x kp``),
    ``Phi [Y T]`` (``s x (kp + s)``), ``Y^T Y`` and the centering term (float64 at most)."""
    kp, s = sketch
    return (N * kp + s * (kp + s) + kp * kp + kp) * F64


def sketch_tasks(M: int, N: int, sketch: tuple[int, int], itemsize: int, memory: int) -> int:
    """Tasks of the sketch's pass: the canonical split of a row pass, fewer where their partial states
    (every one holds an ``N x kp`` co-range sketch, all kept until the pass ends) would take more than
    an eighth of the budget. A function of the data and the budget only, never of the scheduler, so
    the sums are the same bits on every scheduler."""
    return max(1, min(canonical_tasks(M, N * itemsize), (memory // 8) // sketch_state_bytes(N, sketch)))


#: Multiply-adds of one strip's product ``B_i [Omega | Psi]`` under which the sketch's pass runs BLAS
#: on one thread: splitting a product this small gains little (a 32 x 4096 by 4096 x 61 product took
#: 0.33 ms on two threads, 0.43 ms on one, on a shared 2-core machine), while each product waits for
#: every thread to be scheduled, which stalled it when the machine was busier (in other minutes of
#: the same load average of about 9: 180 ms on two threads against 0.46 ms on one; 12-16 ms against
#: 1.6-3.2 ms at 128-256 rows; no difference at 1024 rows).
SMALL_PRODUCT = 1 << 26


def sketch_blas_threads(threads: int, strip: int, N: int, sketch: tuple[int, int]) -> int:
    """BLAS threads of the sketch's pass: ``threads``, or one for strips whose product is small."""
    return 1 if strip * N * sum(sketch) < SMALL_PRODUCT else threads


def client_bytes(method: str, N: int, k: int, block: int, max_basis: int, sketch: tuple[int, int] | None,
                 *, M: int = 0, itemsize: int = F64, memory: int = 0) -> int:
    """In-memory work outside the passes (float64 small factors, Krylov bases, sketches).

    Sized from the traced allocations (``tracemalloc``) between the passes of a 4096 x 4096 float64
    run with ``k = 10`` (``block`` 20 for rsvd, 10 for lanczos and eigsh): rsvd's traced memory between
    passes rose from 5 to 11 MiB over its passes; ``10 N block`` elements left its 8 MiB run of the
    budget sweep at 9.8 MiB (1.22x), so ``14 N block`` (``Q``, ``Z``, the per-task states of the pass
    just made, the copies of ``orth_incore``); lanczos up to 15.5 MiB and eigsh 19.1 MiB (about ``600 N`` elements:
    ``V`` and ``W`` while ``hstack`` and the thick restart copy them, the Ritz and residual blocks,
    and the per-task states of the pass just made).
    """
    if method in ("rsvd", "full"):  # full: rsvd's one pass with the N x N identity as its block
        return 14 * N * block * F64 + 8 * block * block * F64
    if method == "sketch":
        # The test matrices Omega and Psi are generated inside the pass's tasks, from the seed, and
        # Psi again block by block after it: none of them is held here. Held while a pass runs: the
        # tasks' partial states (the sketch's pass), then X^T (the passes orthonormalizing Y) or
        # V = P W (the pass writing U), with the small sketches. The steps between the passes (X^T's
        # QR: X^T, P and LAPACK's copy, about 4 N kp) have the whole budget, which the passes' fixed
        # buffers (N (2 kp + s) >= 3 N kp) and this reserve (>= N kp) already exceed.
        kp, s = sketch
        states = sketch_tasks(M, N, sketch, itemsize, memory) * sketch_state_bytes(N, sketch)
        return max(states, (kp + k) * N * F64) + 4 * (s * (kp + s) + kp * kp) * F64
    # lanczos / eigsh: V and W bases and the copies hstack and the thick restart make of them (three
    # of each alive at a restart), Ritz vectors and residual block, eigh of the projected matrix.
    lanczos = (6 * max_basis + 2 * (k + block) + 2 * block) * N * F64 + 3 * max_basis * max_basis * F64
    if method == "gram" and block >= N:  # the whole space, as full's, after the N x N Gram's eigh
        return max(client_bytes("full", N, k, N, N, None), gram_client_bytes(N))
    if method == "gram":  # the Lanczos steps that may follow, or the N x N Gram with eigh's copy and vectors
        return max(lanczos, gram_client_bytes(N))
    return lanczos


#: Strip buffers of a spilled basis pair (read and write, ``V`` and ``W``; see
#: :mod:`blocklin.linalg.lowrank.basis`) and the strip products formed from them at once.
SPILL_STRIPS = 6


def lanczos_bytes(n: int, k: int, block: int, cap: int, *, spilled: bool, strip_bytes: int = 0,
                  itemsize: int = F64) -> int:
    """What block Lanczos (:func:`blocklin.linalg.lowrank.lanczos.block_lanczos`) holds in memory beside
    its products' ``X`` and ``Op X`` (which the products count), from the code as it runs:

    - the bases ``V`` and ``W`` (``n x cap`` each) in memory, or spilled: :data:`SPILL_STRIPS` strips of
      ``strip_bytes`` (their buffers and a strip's products) and no ``n``-long basis;
    - the step's QR work beyond a product's two blocks: two more ``n x block`` blocks (``tall_qr``'s ``Q``
      and its refinement beside ``y``; ``next_block``'s ``Q1`` and ``Q1 U_T`` with their QR);
    - in memory, at a residual check, the Ritz vectors and their residual vectors (``2 n x k``) beside
      ``Q1`` (spilled, they are formed strip by strip and stay in the bases' file);
    - the projected matrix ``H``, its eigenvectors and ``eigh``'s work (``4 cap^2``).

    Checked with ``tracemalloc`` on a sparse eigsh of a 2x10^5-node graph (``k = 5``, ``sync``): in memory
    (block 8, 53 columns) a traced peak of 226-233 MiB against 186 MiB here plus its product's 24 MiB,
    the task and 15 MiB of held row blocks; spilled, 55.5 MiB at block 7 against 33 MiB here plus its
    product's 21 MiB and the task, and 40 MiB at block 4 against 24 + 12 MiB and the task. The peak
    resident set of spilled runs in a child process: ``tests/lowrank/test_sparse_spilled_basis.py``.
    """
    step = 2 * n * block
    if spilled:
        held = SPILL_STRIPS * strip_bytes + step * itemsize
    else:
        held = (2 * n * cap + max(step, 2 * n * k - n * block)) * itemsize
    return int(held + 4 * cap * cap * itemsize)


def gram_client_bytes(N: int) -> int:
    """In-memory work of the Gram route after its pass: the task's ``N x N`` float64 sum, the total
    it is copied into (which ``eigh`` then overwrites), its eigenvectors and workspace."""
    return 3 * N * N * F64


def tsqr_reserve_bytes(N: int, k: int) -> int:
    """In-memory work held beside the TSQR route's QR pass: the ``N x k`` blocks of the method's result."""
    return 4 * N * k * F64


#: ``method="auto"`` takes the Gram route when ``N <= GRAM_BLOCKS * (k + oversample)``. Its SYRK pass
#: does ``M N^2`` flops against ``4 M N (k + oversample)`` for a Lanczos step, and runs about twice as
#: fast per flop (2048 x 500 float64 strips in memory: 0.28-0.33 s for the Gram of 100000 x 500 against
#: 0.15 s for ``B^T (B Q)`` with 30 columns on both cores, 0.45 s against 0.25 s on one), so it costs
#: about ``N / (8 (k + oversample))`` steps: at most 3 here, while Lanczos took 2-7 steps on the
#: spectra of ``benchmarks/svd.py``.
GRAM_BLOCKS = 24
#: ... and when ``M >= GRAM_ASPECT * N``: the ``O(N^3)`` eigendecomposition of the Gram then costs
#: less than its pass (``M N^2``), which it would not for square matrices.
GRAM_ASPECT = 8
#: ... and at most this ``N`` (a 256 MiB Gram; its eigendecomposition takes seconds).
GRAM_MAX_N = 8192


def gram_route_fits(M: int, N: int, k: int, oversample: int) -> bool:
    """Whether ``method="auto"`` takes the Gram route for a tall orientation ``M x N`` (the shapes
    alone decide it, never the machine: see :data:`GRAM_BLOCKS`)."""
    return N <= min(GRAM_MAX_N, GRAM_BLOCKS * (k + oversample)) and M >= GRAM_ASPECT * N


def plan_svd(m: int, n: int, k: int, dtype: np.dtype, *, method: str, oversample: int, power_iters: int | None,
             memory: int, max_passes: int, block_size: int | None = None, max_basis: int | None = None,
             square: bool = False) -> SvdPlan:
    """Plan one factorization (``method`` in rsvd, sketch, lanczos, gram, full, eigsh).

    Raises
    ------
    BudgetError
        When the in-core part (``N x block`` factors, the Krylov basis) leaves nothing for the passes.
    """
    dt = np.dtype(dtype)
    transposed = m < n and not square
    M, N = (n, m) if transposed else (m, n)
    sketch = None
    if method == "rsvd":
        block = min(N, k + oversample)
        basis = block
    elif method == "full" or (method == "gram" and (k == N or block_size is None and k + oversample >= N)):
        block = basis = N  # the whole space: the N x N identity (gram: the Gram's eigenvectors) is the block
    elif method == "sketch":
        kp = min(N, k + oversample)
        s = min(N, 2 * kp + 1)
        sketch = (kp, s)
        block = kp
        basis = kp
    else:
        block = block_size or default_block(k, oversample, N)
        block = max(1, min(block, N))
        basis = max_basis or default_basis(k, oversample, block)
        basis = max(k + block, min(basis, N))
    work = 2 if dt.kind == "c" else 1  # complex data's in-memory work is complex128: twice float64's bytes
    cb = work * client_bytes(method, N, k, block, basis, sketch, M=M, itemsize=dt.itemsize, memory=memory)
    a_bytes = M * N * dt.itemsize
    in_core_need = 2 * a_bytes + cb + 4 * M * block * F64 * work
    in_core = in_core_need <= memory
    pass_memory = memory - cb
    if not in_core and pass_memory < memory // 8:
        need = -(-8 * cb // 7) + 8  # the in-core work and an eighth of the budget for the passes
        raise BudgetError(explain(
            "memory", f"must hold the in-core part of {method} (N x block factors, bases) with room to stream A",
            f"{format_size(memory)} for {format_size(cb)} of in-core work (N={N}, block={block}, basis={basis})",
            f"raise it to at least {format_size(need)} (memory='{size_hint(need)}')"
            + (" (the whole space holds N x N factors)" if method == "full" else
               ", or lower k, oversample or the block size")), minimum=need)
    if method == "rsvd":
        passes = svd_passes("rsvd", in_core=in_core, power_iters=power_iters) if power_iters is not None else None
        formula = "1 (in core)" if in_core else "q + 1"
        inter = 0 if in_core else 2
    elif method == "sketch":
        passes, formula, inter = 1, "1 (single pass)", 0 if in_core else 2
    elif method == "lanczos":
        passes, formula, inter = (1 if in_core else None), "1 (in core)" if in_core else "L + 1", 0 if in_core else 2
    elif method == "gram" and block >= N:  # the Gram's pass, then the Rayleigh-Ritz step over the whole space
        passes, formula, inter = (1 if in_core else 2), "1 (in core)" if in_core else "2 (the whole space)", 0 if in_core else 3
    elif method == "gram":
        passes, formula, inter = (1 if in_core else None), "1 (in core)" if in_core else "2 + L", 0 if in_core else 2
    elif method == "full":
        passes, formula, inter = 1, "1 (in core)" if in_core else "1 (the whole space)", 0 if in_core else 3
    else:
        passes, formula, inter = (1 if in_core else None), "1 (in core)" if in_core else "L", 0
    return SvdPlan(method=method, m=m, n=n, k=k, transposed=transposed, M=M, N=N, dtype=dt.name, block=block,
                   power_iters=power_iters, max_passes=max_passes, max_basis=basis, sketch_size=sketch,
                   in_core=in_core, memory=memory, client_bytes=cb, pass_memory=max(pass_memory, 0), passes=passes,
                   intermediate_passes=inter, formula=formula)
