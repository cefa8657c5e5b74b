"""Products of a stored sparse matrix with a dense one, out of core: ``S B``, ``S^T B`` and ``S^T S``.

``S`` is a ``blocklin-csr`` group (:mod:`blocklin.storage.sparse`, ``docs/sparse.md``): CSR row
blocks whose rows are contiguous ranges of its ``indices`` and ``data`` arrays. Every task reads
``S`` in pieces of at most ``plan.entries`` stored entries (a piece may cut a row: both products are
sums over the entries, so a row's entries may be split between pieces), the rows of ``B`` it needs
and its output tile, and writes whole output chunks:

* ``S B`` (``m x p``): one task per output tile (``rows`` rows of ``S`` x ``cols`` columns of
  ``B``), ``B`` read in panels of ``inner`` rows; each tile sums its panels in order.
* ``S^T B`` (``n x p``): one task per output tile (``inner`` columns of ``S`` x ``cols`` columns of
  ``B``), streaming every row strip of ``S`` (``rows`` rows) with the same rows of ``B``, summed
  in row order.
* ``S^T S`` (``n x n``, :func:`sparse_gram`): one task, one pass over the rows in strips of whole
  rows, ``S_b^T S_b`` accumulated in float64.

Sums run in float64 and are stored in the result dtype (a ``dtype=`` narrower than an operand rounds the sum
only: the operands enter it at their own precision). The plan depends on the shapes and the
budget only, so the result is the same, bit for bit, on every scheduler and worker count.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np

from blocklin.config import format_size
from blocklin.errors import BudgetError, DTypeError, ParameterError, ShapeError, explain
from blocklin.operands import Operand, stored_input
from blocklin.runtime.graph import TileGraph
from blocklin.runtime.job import Job
from blocklin.runtime.tiles import open_array, with_task_settings
from blocklin.sparse import SparseMatrix
from blocklin.storage.atomic import is_done, mark_done, open_or_create_array
from blocklin.storage.identity import plan_settings, resume_token
from blocklin.storage.location import Location
from blocklin.storage.sparse import SparseStore
from blocklin.storage.zarr_store import read_block, write_block
from blocklin.validate import result_dtype

#: Entries of ``S`` one task reads at once, at most and fewest (the plan halves from the most).
MAX_ENTRIES = 1 << 18
MIN_ENTRIES = 256
#: Rows of ``S`` (and of the output for ``S B``) per strip at most.
MAX_ROWS = 4096
#: Copies of one chunk of a 1-D array of ``S`` zarr may hold while it reads a range.
_CHUNK_COPIES = 2


@dataclasses.dataclass(frozen=True)
class SparseOperand(Operand):
    """A stored sparse matrix as an operation's operand (what names it in a resume identity): an
    :class:`~blocklin.operands.Operand` whose ``chunks`` are its largest row block by its width,
    with its entry count and the chunking of its 1-D arrays."""

    nnz: int = 0
    index_dtype: np.dtype = np.dtype(np.int64)
    entry_chunk: int = 1
    row_chunk: int = 1
    #: the group's stamp at the handle's open (:attr:`~blocklin.sparse.SparseMatrix.stamp`), which the run takes
    stamp: dict | None = dataclasses.field(default=None, compare=False, repr=False)
    #: the handle was opened by the operation itself, from a path (its run takes ``stamp`` unchecked)
    own_open: bool = dataclasses.field(default=False, compare=False, repr=False)

    @classmethod
    def of(cls, s: SparseMatrix, name: str = "a", *, own_open: bool = False) -> SparseOperand:
        from blocklin.sparse import refuse_complex

        refuse_complex(s, name)
        st = s._store
        return cls(name=name, path=s.location, shape=tuple(s.shape), dtype=np.dtype(s.dtype),
                   chunks=(max(1, int(np.diff(st.row_blocks).max(initial=1))), s.shape[1]), nnz=int(s.nnz),
                   index_dtype=np.dtype(s.index_dtype), entry_chunk=int(st.indices.chunks[0]),
                   row_chunk=int(st.indptr.chunks[0]), stamp=s.stamp, own_open=own_open)


@dataclasses.dataclass(frozen=True)
class SparsePlan:
    """Tiles of a sparse product and what one task holds.

    ``rows``: rows of ``S`` per strip (``S B``: the output tile's rows); ``cols``: columns of ``B``
    (and of the output) per tile; ``inner``: ``S B``: rows of ``B`` per panel, ``S^T B``: columns
    of ``S`` (output rows) per tile, ``S^T S``: ``n``; ``entries``: entries of ``S`` read at once.
    """

    op: str  # "SB", "STB" or "STS"
    m: int
    n: int
    p: int
    rows: int
    cols: int
    inner: int
    entries: int
    task_memory: int
    memory: int
    nnz: int
    flops: int

    @property
    def out_shape(self) -> tuple[int, int]:
        return (self.m, self.p) if self.op == "SB" else (self.n, self.p)

    @property
    def out_chunks(self) -> tuple[int, int]:
        if self.op == "SB":
            return (max(1, self.rows), max(1, self.cols))
        return (max(1, self.inner), max(1, self.cols))

    @property
    def grid(self) -> tuple[int, int]:
        r, c = self.out_chunks
        return math.ceil(self.out_shape[0] / r), math.ceil(self.out_shape[1] / c)

    @property
    def n_tasks(self) -> int:
        return 1 if self.op == "STS" else self.grid[0] * self.grid[1]

    def to_dict(self, workers: int = 1) -> dict:
        """The plan's fields, its tiles and ``peak_memory``: the bytes of ``workers`` tasks at once."""
        d = dataclasses.asdict(self)
        d.update(out_chunks=list(self.out_chunks), grid=list(self.grid), n_tasks=self.n_tasks,
                 peak_memory=self.task_memory * max(1, workers))
        return d


def _task_memory(op: str, rows: int, cols: int, inner: int, entries: int, s: SparseOperand, b_item: int,
                 b_chunk_bytes: int, out_item: int) -> int:
    """Bytes one task holds (every buffer named):

    * ``S``'s piece: values and indices as read, a cast copy and a column slice (3 copies), the
      strip's row offsets as read, clipped and as SciPy's index dtype (3 copies), and zarr's
      temporaries of one chunk of each 1-D array (:data:`_CHUNK_COPIES`);
    * ``S B``: ``B``'s panel (``inner x cols``, read and cast) and one chunk of ``B`` zarr may decode,
      the float64 sum and the piece's product (``rows x cols``), the output tile and its write copy;
    * ``S^T B``: ``B``'s strip (``rows x cols``, read and cast) and one chunk of it, the float64 sum
      and the product (``inner x cols``), the output tile and its write copy;
    * ``S^T S``: the strip dense (``rows x n`` float64), the float64 sum and the product (``n x n``),
      the output and its write copy.
    """
    per_entry = s.dtype.itemsize + s.index_dtype.itemsize + 2 * (8 + s.index_dtype.itemsize)
    fixed = entries * per_entry + 3 * (rows + 1) * 8
    fixed += _CHUNK_COPIES * (s.entry_chunk * (s.dtype.itemsize + s.index_dtype.itemsize) + s.row_chunk * 8)
    if op == "SB":
        return fixed + inner * cols * (b_item + 8) + b_chunk_bytes + rows * cols * (16 + 2 * out_item)
    if op == "STB":
        return fixed + rows * cols * (b_item + 8) + b_chunk_bytes + inner * cols * (16 + 2 * out_item)
    n = inner
    return fixed + rows * n * 8 + n * n * (16 + 2 * out_item)


def plan_sparse(op: str, s: SparseOperand, p: int, *, memory: int, b_item: int = 8, b_chunks: tuple = (1, 1),
                out_item: int = 8) -> SparsePlan:
    """The tiles of ``op`` (``"SB"``, ``"STB"``, ``"STS"``) that fit ``memory`` (the budget alone:
    no worker count, so the bits are the scheduler's own). Halves the largest term first: the
    panel or strip of ``B``, the output tile, the piece of ``S``; refuses with the minimum."""
    m, n = s.shape
    b_chunk_bytes = int(np.prod(b_chunks)) * b_item
    if op == "STS":
        p = n
    rows = max(1, min(m, MAX_ROWS))
    cols = max(1, p) if op != "STS" else n
    inner = max(1, n)
    entries = max(1, min(MAX_ENTRIES, max(s.nnz, MIN_ENTRIES)))

    def mem(r: int, c: int, i: int, e: int) -> int:
        return _task_memory(op, r, c, i, e, s, b_item, b_chunk_bytes, out_item)

    minimum = mem(1, 1 if op != "STS" else n, 1 if op != "STS" else n, min(entries, MIN_ENTRIES))
    if minimum > memory:
        what = {"SB": "S B", "STB": "S^T B", "STS": "S^T S"}[op]
        why = ("the n x n Gram matrix and its float64 sum are held whole" if op == "STS" else
               "a task holds one piece of S (at least 256 entries), the chunks zarr reads of S's arrays, one "
               "row of B and of the output")
        raise BudgetError(explain("memory", f"must hold one task of the sparse product {what} ({why})",
                                  f"{format_size(memory)} for S {m} x {n} ({s.nnz} entries, entry chunks of "
                                  f"{s.entry_chunk}), p = {p}",
                                  f"pass memory='{format_size(_round_up(minimum))}' or more"),
                          minimum=_round_up(minimum))  # the figure named: the raw one can fall short (B's
        # staged chunks grow with the budget, and with them a task's memory)
    best = None
    for r in _halvings(rows):
        for c in (_halvings(cols) if op != "STS" else [n]):
            for i in (_halvings(inner) if op != "STS" else [n]):
                for e in _halvings(entries, MIN_ENTRIES):
                    if mem(r, c, i, e) <= memory:
                        cost = _cost(op, m, n, p, r, c, i, e, s, b_item)
                        if best is None or cost < best[0]:
                            best = (cost, r, c, i, e)
                        break  # fewer entries only cost more pieces
    _, rows, cols, inner, entries = best
    flops = 2 * s.nnz * (p if op != "STS" else 1)
    if op == "STS":  # each row's entries pair with each other: sum of nnz_r^2 (at most nnz * max row)
        flops = 2 * s.nnz * n
    return SparsePlan(op=op, m=m, n=n, p=p, rows=rows, cols=cols, inner=inner, entries=entries,
                      task_memory=mem(rows, cols, inner, entries), memory=memory, nnz=s.nnz, flops=flops)


#: What one task and one read of a piece or panel cost, in bytes read at about 1 GB/s (scheduling
#: and Python overhead measured at about a millisecond a task, a tenth of that a loop step).
TASK_COST = 1 << 20
STEP_COST = 100 << 10


def _halvings(top: int, bottom: int = 1) -> list[int]:
    """``top``, then halvings (rounded up) down to ``bottom``."""
    out, v = [max(1, top)], max(1, top)
    while v > bottom:
        v = max(bottom, (v + 1) // 2)
        out.append(v)
        if v == bottom:
            break
    return out


def _cost(op: str, m: int, n: int, p: int, rows: int, cols: int, inner: int, entries: int, s: SparseOperand,
          b_item: int) -> float:
    """Bytes read plus the tasks' and loop steps' overhead of a tiling (what the plan minimizes)."""
    s_bytes = s.nnz * (s.dtype.itemsize + s.index_dtype.itemsize) + (m + 1) * 8
    pieces = max(1, math.ceil(s.nnz / entries))
    if op == "SB":
        tasks = math.ceil(m / rows) * math.ceil(p / cols)
        panels = math.ceil(n / inner)
        reads = s_bytes * math.ceil(p / cols) * panels + n * p * b_item * math.ceil(m / rows)
        steps = tasks * panels + pieces * panels * math.ceil(p / cols)
    elif op == "STB":
        tasks = math.ceil(n / inner) * math.ceil(p / cols)
        strips = math.ceil(m / rows)
        reads = s_bytes * tasks + m * p * b_item * math.ceil(n / inner)
        steps = tasks * (strips + pieces)
    else:
        tasks, reads, steps = 1, s_bytes, math.ceil(m / rows) + pieces
    return reads + tasks * TASK_COST + steps * STEP_COST


def _round_up(nbytes: int) -> int:
    """A budget figure above ``nbytes``: the next multiple of 64 KiB, with an eighth to spare."""
    step = 64 << 10
    return -(-(nbytes * 9 // 8) // step) * step


# -- tasks ---------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class SparseSpec:
    """What a sparse product's task reads and writes (locations, never arrays)."""

    s: Location
    b: Location | None
    out: Location
    plan: SparsePlan
    dtype: str
    b_first_row: int = 0
    done_dir: Location | None = None
    blas_threads: int | None = None
    check_finite: bool = True
    #: ``B`` is the transpose of the stored dense operand, and the stored result the transpose of
    #: the product: a dense left operand, ``X S = (S^T X^T)^T`` (:func:`sparse_matmul`'s ``left``).
    b_transposed: bool = False
    out_transposed: bool = False
    #: The first row of ``S`` the plan's ``m`` rows start at (an update reads the appended rows alone), and
    #: the stored result added to the float64 sums before their one rounding (an update's ``C``).
    s_first_row: int = 0
    add: Location | None = None


class _Pieces:
    """Rows ``r0:r1`` of a stored ``S``, read in pieces of at most ``entries`` entries as CSR matrices
    of shape ``(r1 - r0, n)`` (each holding a contiguous range of the rows' entries)."""

    def __init__(self, store: SparseStore, dtype: np.dtype, check_finite: bool = False) -> None:
        self.store, self.dtype, self.bytes, self.check = store, dtype, 0, check_finite

    def __call__(self, r0: int, r1: int, entries: int, *, whole_rows: bool = False) -> Any:
        import scipy.sparse

        st = self.store
        ptr = np.asarray(st.indptr[r0:r1 + 1], np.int64)
        self.bytes += ptr.nbytes
        p0, p1 = int(ptr[0]), int(ptr[-1])
        shape = (r1 - r0, st.shape[1])
        starts = _piece_starts(ptr, entries) if whole_rows else list(range(p0, p1, max(1, entries)))
        for k, a in enumerate(starts):
            b = starts[k + 1] if k + 1 < len(starts) else p1
            idx = np.asarray(st.indices[a:b])
            val = np.asarray(st.data[a:b])
            self.bytes += idx.nbytes + val.nbytes
            if self.check:
                _check_finite(val, "a")
            local = np.clip(ptr, a, b) - a
            piece = scipy.sparse.csr_matrix((val.astype(self.dtype, copy=False), idx, local), shape=shape)
            piece.has_sorted_indices = True
            yield piece


def _piece_starts(ptr: np.ndarray, entries: int) -> list[int]:
    """Entry offsets where pieces of whole rows start (a row longer than ``entries`` is a piece alone)."""
    starts, p0 = [], int(ptr[0])
    end = int(ptr[-1])
    a = p0
    while a < end:
        starts.append(a)
        # the last row boundary at or before a + entries, past a
        j = int(np.searchsorted(ptr, a + entries, side="right")) - 1
        nxt = int(ptr[j])
        if nxt <= a:  # one row holds more than entries: it alone
            nxt = int(ptr[np.searchsorted(ptr, a, side="right")])
        a = nxt
    return starts


def _check_finite(block: np.ndarray, what: str) -> None:
    if not np.isfinite(block).all():
        from blocklin.errors import NonFiniteError

        raise NonFiniteError(explain(what, "must hold finite values (NaN/Inf found)", "a NaN or Inf in the block "
                                     "read", "remove or replace them, or pass check_finite=False"))


@with_task_settings
def sparse_tile(spec: SparseSpec, i: int, j: int) -> dict:
    """One output tile of ``S B`` or ``S^T B`` (see the module docstring)."""
    unit = f"{i}.{j}"
    if is_done(spec.done_dir, unit):
        return {"skipped": 1}
    plan, dt = spec.plan, np.dtype(spec.dtype)
    store = SparseStore(spec.s)
    barr = open_array(spec.b)
    # the operands enter the float64 sum at their own precision where dtype= is narrower, and only the sum is
    # rounded to it: float64 entries cast to float32 first had become 0 or Inf (a product of entries near 1e-300,
    # or 1e50 times 1e-50, returned zeros or was refused as NaN in b)
    pieces = _Pieces(store, np.promote_types(dt, store.dtype), spec.check_finite)
    b_dt = np.promote_types(dt, barr.dtype)
    r_out, c_out = plan.out_chunks
    o0, o1 = i * r_out, min(plan.out_shape[0], (i + 1) * r_out)
    c0, c1 = j * plan.cols, min(plan.p, (j + 1) * plan.cols)
    acc = np.zeros((o1 - o0, c1 - c0), np.float64)
    b_bytes = 0
    if plan.op == "SB":  # rows o0:o1 of S times B[:, c0:c1], B in panels of plan.inner rows
        for k0 in range(0, plan.n, plan.inner):
            k1 = min(plan.n, k0 + plan.inner)
            bp = _b_block(spec, barr, k0, k1, c0, c1, b_dt)
            b_bytes += bp.nbytes
            for piece in pieces(spec.s_first_row + o0, spec.s_first_row + o1, plan.entries):
                part = piece if (k0, k1) == (0, plan.n) else piece[:, k0:k1]
                acc += part @ bp
    else:  # S^T B: columns o0:o1 of S against every row strip of S and B, in row order
        for r0 in range(0, plan.m, plan.rows):
            r1 = min(plan.m, r0 + plan.rows)
            bs = _b_block(spec, barr, r0, r1, c0, c1, b_dt)
            b_bytes += bs.nbytes
            for piece in pieces(spec.s_first_row + r0, spec.s_first_row + r1, plan.entries):
                part = piece if (o0, o1) == (0, plan.n) else piece[:, o0:o1]
                acc += part.T @ bs
    if spec.add is not None:  # an update: the stored tile joins the float64 sum (in the product's place)
        acc += read_block(open_array(spec.add), slice(o0, o1), slice(c0, c1))
    out = open_array(spec.out, mode="r+")
    tile = acc.astype(out.dtype)
    if spec.check_finite and not np.isfinite(tile).all():
        raise _overflow_refusal(tile, dt, (o0, o1), (c0, c1), spec.out_transposed)
    if spec.out_transposed:  # the product of a dense left operand, (S^T X^T)^T: the tile written across
        write_block(out, slice(c0, c1), slice(o0, o1), tile.T)
    else:
        write_block(out, slice(o0, o1), slice(c0, c1), tile)
    if spec.done_dir is not None:
        mark_done(spec.done_dir, unit)
    done = {"flops": 0, "bytes_read": pieces.bytes + b_bytes, "bytes_physical": pieces.bytes,
            "bytes_written": acc.size * out.dtype.itemsize}
    if spec.check_finite:  # the tile's largest entry, for the refusal of a product below the normal numbers
        done["top"] = float(np.max(np.abs(tile))) if tile.size else 0.0
    return done


def _overflow_refusal(tile: np.ndarray, dt: np.dtype, rows: tuple[int, int], cols: tuple[int, int],
                      across: bool) -> ParameterError:
    """The refusal of a tile of finite operands (both checked as read) whose sums left ``dt``'s range:
    entries near 1e200 had given Inf in the output, silently, where the dense product refuses. ``across``:
    the tile is written transposed (a dense left operand), its first bad entry named where it lands."""
    i, j = (int(v) for v in np.argwhere(~np.isfinite(tile))[0])
    at = (cols[0] + j, rows[0] + i) if across else (rows[0] + i, cols[0] + j)
    return ParameterError(explain(
        "a", f"must give a product within {dt.name}'s range (largest {float(np.finfo(dt).max):.3g}): its operands "
        "are finite (checked as read), its sums are not", f"{tile[i, j]} at row {at[0]}, column {at[1]} of the "
        "output", "scale the sparse matrix or the dense operand by a power of two (exact) and the result back, "
        "or pass check_finite=False to keep the Inf"))


def _b_block(spec: SparseSpec, barr: Any, r0: int, r1: int, c0: int, c1: int, dt: np.dtype) -> np.ndarray:
    """Rows ``r0:r1`` and columns ``c0:c1`` of ``B`` (the stored dense operand, or its transpose when the
    product's dense operand is on the left), cast to ``dt`` and checked for NaN/Inf."""
    if spec.b_transposed:
        blk = read_block(barr, slice(c0, c1), slice(r0, r1)).T.astype(dt)
    else:
        blk = read_block(barr, slice(spec.b_first_row + r0, spec.b_first_row + r1), slice(c0, c1)).astype(dt)
    if spec.check_finite:
        _check_finite(blk, "b")
    return blk


@with_task_settings
def sparse_gram_task(spec: SparseSpec) -> dict:
    """``S^T S`` in one pass: strips of whole rows, each ``S_b^T S_b`` (against the strip dense)
    added to a float64 sum in row order; the output written in row bands of its chunks."""
    if is_done(spec.done_dir, "gram"):
        return {"skipped": 1}
    plan, dt = spec.plan, np.dtype(spec.dtype)
    store = SparseStore(spec.s)
    pieces = _Pieces(store, np.dtype(np.float64), spec.check_finite)
    n = plan.n
    acc = np.zeros((n, n), np.float64)
    amax = 0.0  # the largest entry read, for the range refusal's message
    for r0 in range(spec.s_first_row, spec.s_first_row + plan.m, plan.rows):
        r1 = min(spec.s_first_row + plan.m, r0 + plan.rows)
        for piece in pieces(r0, r1, plan.entries, whole_rows=True):
            if piece.nnz:
                amax = max(amax, float(np.max(np.abs(piece.data))))
            acc += piece.T @ piece.toarray()
    out = open_array(spec.out, mode="r+")
    band = max(1, out.chunks[0])
    if spec.add is not None:  # an update: the stored Gram joins the float64 sum, by bands (the product's place)
        old = open_array(spec.add)
        for a in range(0, n, band):
            acc[a:a + band] += read_block(old, slice(a, min(n, a + band)), slice(0, n))
    _check_gram_range(acc, dt, amax)
    for a in range(0, n, band):
        write_block(out, slice(a, min(n, a + band)), slice(0, n), acc[a:a + band].astype(dt))
    if spec.done_dir is not None:
        mark_done(spec.done_dir, "gram")
    return {"flops": 0, "bytes_read": pieces.bytes, "bytes_physical": pieces.bytes,
            "bytes_written": n * n * dt.itemsize}



def _check_gram_range(g: np.ndarray, dt: np.dtype, amax: float) -> None:
    """Refuse, as the dense route refuses it, a Gram whose largest entry leaves ``dt``'s range or is
    subnormal, every entry below the normal numbers (entries near ``1e200`` had given a Gram of ``inf``, near
    ``1e-200`` one of ``0``, silently). Its diagonal holds the largest squares, so a Gram in range is summed
    in float64 without overflow; a product or a rounding to ``dt`` that underflows adds at most
    ``u 2^minexp`` (:mod:`~blocklin.linalg.products.below_normal`), within the norm-wise bound of a largest
    entry that is normal: nothing to scale. (The ``2^(minexp + nmant)`` margin had refused data near
    ``2^-500``, a Gram near ``2^-997``, that the dense ``gram`` returns.)"""
    big = float(np.max(np.abs(g))) if g.size else 0.0
    # NaN or Inf data read with check_finite=False propagates, as in the products
    if amax == 0 or not np.isfinite(amax):
        return
    # finite data whose sums overflowed: Inf, and NaN where Infs of both signs met (entries near 1e160 of
    # mixed signs had returned a Gram of NaN and Inf, silently)
    big = np.inf if np.isnan(big) else big
    fi = np.finfo(dt)
    # the largest entry is below 2^top; a sum that overflowed the float64 accumulator is above float64's range
    # whatever 2 log2(max |a|) says (entries below 2^512 whose squares sum past 2^1024 had returned Inf)
    top = int(np.frexp(big)[1]) if 0 < big < np.inf else \
        max(2 * int(np.frexp(amax)[1]), fi.maxexp + 1) if big == np.inf else 2 * int(np.frexp(amax)[1])
    if top > fi.maxexp or top <= fi.minexp:  # the largest entry below 2^top: overflowing, or subnormal
        k = (fi.maxexp // 2 - top) // 2
        raise ParameterError(explain(
            "a", f"must have a Gram matrix within the range of {dt.name} (largest entry a normal number, between "
            f"2^{fi.minexp} and 2^{fi.maxexp})", f"a Gram whose largest entry is about 2^{top - 1} "
            f"(max |a| = {amax:.3g})", f"compute it in a scaled form: the Gram of the sparse matrix times "
            # ldexp, not x * 2.0**k: 2^k may lie outside float64's range, or (cast to float32 data's dtype)
            # float32's, where the product had given Inf entries
            f"2.0**{k} (exact: x.data = numpy.ldexp(x.data, {k}), then blocklin.from_sparse(x, ...)) is "
            f"2^{2 * k} times this one"))


# -- drivers -------------------------------------------------------------------------------------------


def sparse_operand(a: Any, name: str = "a", storage_options: dict | None = None) -> SparseOperand | None:
    """``a`` as a :class:`SparseOperand` when it is a :class:`~blocklin.sparse.SparseMatrix` or names a
    stored sparse matrix, else None."""
    from blocklin.sparse import as_sparse_matrix

    s = as_sparse_matrix(a, storage_options)
    return SparseOperand.of(s, name, own_open=s is not a) if isinstance(s, SparseMatrix) else None


#: Report entries recorded in the output's attributes.
REPORT_KEYS = ("seconds", "flops", "gflops", "bytes_read", "bytes_written", "peak_memory", "device", "scheduler",
               "tasks", "nnz")


def refuse_options(operation: str = "matmul(S, B, out, trans_a=..., dtype=...) only (S B or S^T B)",
                   **given: Any) -> None:
    """Refuse, by name, the options ``given`` as true that the sparse route of ``operation`` lacks."""
    asked = [name for name, on in given.items() if on]
    if asked:
        raise ParameterError(explain(
            "a", f"a stored sparse matrix takes {operation}",
            f"a sparse matrix with {', '.join(asked)}",
            "drop those options, or convert S to a dense array (blocklin convert S.mtx D.zarr --dense) for them"))


def sparse_matmul(s: SparseOperand, b: Any, out: Any = None, *, trans_a: bool = False, dtype: Any = None,
                  overwrite: bool = False, resume: bool = False, dense_left: bool = False, trans_dense: bool = False,
                  settings: dict, below_normal_ok: bool = False) -> Any:
    """``S B`` or ``S^T B`` (``trans_a``) of a stored sparse ``S`` and a dense ``B``, written to ``out``;
    with ``dense_left``, ``op(X) S`` or ``op(X) S^T`` of a dense left operand ``X = b``.

    Parameters
    ----------
    s : SparseOperand
        The stored sparse matrix (``m x n``).
    b : path, zarr array, Matrix, NumPy or Dask array
        ``n x p`` (``S B``) or ``m x p`` (``S^T B``), dense; with ``dense_left``, ``X``: ``q x m``
        (``X S``) or ``q x n`` (``X S^T``), or its transpose with ``trans_dense``.
    out : path, optional
        The dense result, ``m x p`` or ``n x p`` (``q x n`` or ``q x m`` with ``dense_left``; a new
        store under the temp dir when omitted).
    trans_a : bool
        ``S^T`` in the product: each output tile sums the row strips of ``S`` in row order.
    dtype : {None, "float32", "float64"}
        Result dtype (default: the operands' common dtype; mixed dtypes are refused).
    dense_left, trans_dense : bool
        The dense operand on the left, ``op(X) op(S)`` with ``op(X) = X^T`` for ``trans_dense``:
        computed as ``(op(S)^T op(X)^T)^T``, the same tiles with ``op(X)^T`` read as column strips of
        the stored ``X`` (or its row strips for ``trans_dense``) and each output tile written across.
    below_normal_ok : bool
        Keep a product whose every entry the operands put below the normal numbers (refused by
        :func:`blocklin.matmul`, as the dense product's, :mod:`~blocklin.linalg.products.below_normal`).

    Returns
    -------
    Matrix
        With ``.report``: ``seconds``, ``bytes_read``, ``nnz``, ``flops`` (``2 nnz p``), ``plan``.

    Notes
    -----
    Sparse times dense by rows of CSR (Gustavson, "Two fast algorithms for sparse matrices:
    multiplication and permuted transposition", ACM TOMS 4(3), 1978), blocked for the budget: a task
    holds one piece of ``S`` (``plan.entries`` entries), one panel or strip of ``B`` and its output
    tile; ``S`` is read ``ceil(p / cols)`` times (times the panels of ``B``), ``B`` ``ceil(m / rows)``
    times for ``S B`` and ``ceil(n / inner)`` for ``S^T B``.
    """
    with Job("matmul", **settings) as job:
        # as opened, before the plan's reads: refused if S changed since
        job.stamp_input(s.path, s.stamp, own_open=s.own_open)
        B = job.operand(b, "b" if not dense_left else "a")
        inner_trans, b_transposed = (not trans_a, not trans_dense) if dense_left else (trans_a, False)
        if dense_left:
            _check_left(s, B, trans_a=trans_a, trans_dense=trans_dense)
        plan, dt = _product_plan(job, s, B, trans_a=inner_trans, dtype=dtype, b_transposed=b_transposed)
        product = _product_name(trans_a, dense_left, trans_dense)
        params = {"trans_a": bool(trans_a), "dtype": dt.name, "route": "sparse"}
        if dense_left:
            params.update(dense_left=True, trans_dense=bool(trans_dense))
        # check_finite too: tiles an unchecked run marked done were never checked for sums out of range;
        # the job's settings: the codec of the array a resumed run writes into
        token = resume_token("matmul-sparse", [s, B], params, plan.to_dict(), job.check_finite, plan_settings(job))
        out_shape, out_chunks = plan.out_shape, plan.out_chunks
        if dense_left:
            out_shape, out_chunks = out_shape[::-1], out_chunks[::-1]
        # each with the rows the tiles read (an append may commit between the opening and the claim)
        ao = job.output(out, inputs=[s.path, stored_input(B)], overwrite=overwrite, resume=resume,
                        token=token, size=(out_shape, dt), covered=[(s.path, int(s.shape[0]))] + (
                            [] if B.staged else [(B.path, int(B.first_row) + int(B.shape[0]))]))
        open_or_create_array(ao, shape=out_shape, dtype=dt, chunks=out_chunks, codec=job.cfg.codec)
        workers, results = run_product_tiles(job, s, B, plan, dt, ao, token, product=product,
                                             b_transposed=b_transposed, out_transposed=dense_left)
        if job.check_finite and not below_normal_ok:
            check_normal_range(s, B, plan, dt, results, ao.array_path())
        report = job.report(flops=plan.flops, nnz=s.nnz, plan=plan.to_dict(workers), output=str(ao.path),
                            route="sparse", workers=workers, product=product,
                            phases={"sparse tiles (CSR pieces times B)": "cpu", "reads and writes": "cpu"})
        return job.finish(ao, out, report, operation="matmul", plan=plan.to_dict(), params=params, keys=REPORT_KEYS)


def run_product_tiles(job: Job, s: SparseOperand, B: Any, plan: SparsePlan, dt: np.dtype, ao: Any, token: str | None,
                      *, product: str, b_transposed: bool = False, out_transposed: bool = False, first_row: int = 0,
                      add: Location | None = None) -> tuple[int, list]:
    """Run the tiles of ``S B`` or ``S^T B`` into ``ao``'s array: ``(workers, the tasks' results)``.
    ``first_row``: the plan's ``m`` rows of ``S`` start there (``B`` from its own ``first_row``); ``add``: a
    stored result of the output's shape and dtype added to each tile's float64 sum (an update)."""
    spec = SparseSpec(s=s.path, b=B.path, out=ao.array_path(), plan=plan, dtype=dt.name,
                      b_first_row=int(getattr(B, "first_row", 0)), done_dir=ao.done,
                      blas_threads=job.task_blas_threads(1), check_finite=job.check_finite,
                      b_transposed=b_transposed, out_transposed=out_transposed, s_first_row=first_row, add=add)
    graph = TileGraph.named("matmul-sparse", token)
    gi, gj = plan.grid
    for i in range(gi):
        for j in range(gj):
            graph.add((i, j), sparse_tile, spec, i, j)
    workers = _workers(job, plan)
    return workers, job.run(graph, workers=workers, description=f"sparse {product} tiles", count_pass="a")


def run_gram_task(job: Job, s: SparseOperand, plan: SparsePlan, dt: np.dtype, ao: Any, token: str | None, *,
                  first_row: int = 0, add: Location | None = None) -> None:
    """Run ``S^T S``'s one task into ``ao``'s array (:func:`sparse_gram_task`); ``first_row``, ``add``: as
    for :func:`run_product_tiles`."""
    spec = SparseSpec(s=s.path, b=None, out=ao.array_path(), plan=plan, dtype=dt.name, done_dir=ao.done,
                      blas_threads=job.task_blas_threads(1), check_finite=job.check_finite, s_first_row=first_row,
                      add=add)
    graph = TileGraph.named("gram-sparse", token)
    graph.add((0,), sparse_gram_task, spec)
    job.run(graph, workers=1, description="sparse S^T S", count_pass="a")


def check_normal_range(s: SparseOperand, B: Any, plan: SparsePlan, dt: np.dtype, results: list, out: Any, *,
                       first_row: int = 0, stored: Any = None, fix: str | None = None) -> None:
    """Refuse a product whose every entry ``S`` and ``B`` put below ``dt``'s normal numbers:
    ``c max |s| max |b|`` below ``2^minexp``, ``c`` the most stored entries of a row of ``S`` (``S B``) or of
    a column (``S^T B``), the terms an output entry sums (:mod:`~blocklin.linalg.products.below_normal`:
    entries near ``2^-600`` had given a zero product, silently; the bound had been ``k max |s| max |b|``, ``k``
    the inner dimension, which let a product of rows of 2 entries out of ``k = 4096`` return subnormals of few
    digits, silently: near ``2^-1034`` ``1e-12`` off, up to ``8e-11``; float32 near ``2^-138`` ``5e-4``, up to
    ``1.5e-2``). The tiles' largest entries say whether to look (the output is
    read where a resumed run skipped tiles); then one read of ``S``'s values with its row offsets (``m + 1``)
    or column indices (``nnz``), and a pass over ``B`` whose peaks are not recorded, on that path only.

    An update's (``first_row``: the plan's rows of ``S`` start there; ``stored``: the stored result added, an
    operand) bounds ``c max |s_new| max |b_new| + max |C|`` over the appended rows, and its refusal's ``fix``
    is the caller's (the update's appended rows had given subnormals where the old ones gave zeros)."""
    from blocklin.linalg.blocks.scaling import max_abs
    from blocklin.linalg.products.below_normal import refusal, shortfall, split_power

    if min(plan.out_shape) == 0:
        return
    tops = [r.get("top") if isinstance(r, dict) else None for r in results]
    if len(tops) == plan.n_tasks and None not in tops:
        top = max(tops)
    else:
        from blocklin.storage.zarr_store import row_bands

        # the tiles refused NaN and Inf where check_finite is on (this check's only case): no NaN reaches max()
        top = max((float(np.max(np.abs(block))) for _, block in row_bands(out) if block.size), default=0.0)
    if not top < float(np.finfo(dt).tiny):
        return
    k = plan.n if plan.op == "SB" else plan.m
    side = "row" if plan.op == "SB" else "column"
    peak, count = _sparse_peak_and_count(s, columns=plan.op != "SB", rows=(first_row, first_row + plan.m))
    terms = [(lambda: float(count), lambda: peak, lambda: max_abs(B))]
    if stored is not None:
        terms.append((lambda: max_abs(stored),))
    found = shortfall(terms, dt)
    if found is None:
        return
    e, p = found
    pa, pb = split_power(p)
    bound = "c max |s| max |b|" + (" + max |c| (the stored result)" if stored is not None else "")
    raise refusal("a", dt, e, p, f"{bound} below 2^{e}, c = {count} entries at most in a {side} of s "
                  f"(k = {k})", fix or
                  f"scale the sparse matrix by 2^{pa} (x.data = numpy.ldexp(x.data, {pa}), then "
                  f"blocklin.from_sparse(x, ...)) and the dense operand by 2^{pb} (numpy.ldexp: exact): the product "
                  f"is then 2^{p} times this one, within range")


def _sparse_peak_and_count(s: SparseOperand, *, columns: bool, rows: tuple[int, int] | None = None
                           ) -> tuple[float, int]:
    """``max |s_ij|`` of a stored sparse matrix and the most stored entries of one of its rows (of its columns
    with ``columns``): its ``nnz`` values read in pieces of a million, with its row offsets (``m + 1``) or,
    for ``columns``, its column indices beside them (``nnz``, counted into ``n`` totals). ``rows``: of those
    rows alone (default: every row the attributes count)."""
    from blocklin.storage.zarr_store import read_vector

    st = SparseStore(s.path)
    step, top = 1 << 20, 0.0
    m, n = st.shape
    r0, r1 = rows if rows is not None else (0, m)
    # the attributes' nnz: an unfinished append may leave more stored
    e0, e1 = (0, st.nnz) if rows is None else (int(st.indptr[r0]), int(st.indptr[r1]))
    counts = np.zeros(n, np.int64) if columns else None
    for a in range(e0, e1, step):
        b = min(e1, a + step)
        v = read_vector(st.data, a, b)
        if v.size:
            top = max(top, float(np.max(np.abs(v))))
        if counts is not None:
            counts += np.bincount(read_vector(st.indices, a, b).astype(np.int64, copy=False), minlength=n)
    if counts is not None:
        return top, int(counts.max(initial=0))
    most = 0
    for r in range(r0, r1, step):
        ptr = read_vector(st.indptr, r, min(r1, r + step) + 1).astype(np.int64, copy=False)
        most = max(most, int(np.diff(ptr).max(initial=0)))
    return top, most


def _product_name(trans_a: bool, dense_left: bool, trans_dense: bool) -> str:
    s = "S^T" if trans_a else "S"
    return f"{'X^T' if trans_dense else 'X'} {s}" if dense_left else f"{s} B"


def _check_left(s: SparseOperand, X: Any, *, trans_a: bool, trans_dense: bool) -> None:
    """``op(X) op(S)``: the inner dimensions agree (no broadcasting)."""
    m, n = s.shape
    want = n if trans_a else m
    shape = tuple(X.shape)
    inner = shape[0] if trans_dense else shape[-1]
    if len(shape) != 2 or inner != want:
        raise ShapeError(explain(
            "a", f"the {'rows' if trans_dense else 'columns'} of the dense a must equal the "
            f"{'columns' if trans_a else 'rows'} of the sparse b ({_product_name(trans_a, True, trans_dense)}; "
            "no broadcasting)", f"a {' x '.join(map(str, shape))} and b {m} x {n} (sparse)",
            f"pass a with {want} {'rows' if trans_dense else 'columns'}"))


def _product_plan(job: Job, s: SparseOperand, B: Any, *, trans_a: bool, dtype: Any,
                  b_transposed: bool = False) -> tuple[SparsePlan, np.dtype]:
    """The tiles of ``S B`` / ``S^T B`` and the result dtype, the shapes checked (no broadcasting);
    ``b_transposed``: ``B`` is the transpose of the stored operand."""
    m, n = s.shape
    want = m if trans_a else n
    shape = tuple(B.shape)[::-1] if b_transposed else tuple(B.shape)
    if len(shape) != 2 or shape[0] != want:
        raise ShapeError(explain(
            "b", f"rows of b must equal the {'rows' if trans_a else 'columns'} of the sparse a "
            f"({'S^T B' if trans_a else 'S B'}; no broadcasting)",
            f"a {m} x {n} (sparse){' transposed' if trans_a else ''} and b {' x '.join(map(str, B.shape))}",
            f"pass b with {want} rows{'' if trans_a else ', or trans_a=True for S^T B'}"))
    if b_transposed and getattr(B, "first_row", 0):
        raise ParameterError(explain("a", "a dense left operand is read whole", "a row range of a stored matrix",
                                     "pass the stored matrix itself"))
    dt = _real_dtype([s, B], dtype, "matmul")
    chunks = tuple(B.chunks)[::-1] if b_transposed else tuple(B.chunks)
    plan = plan_sparse("STB" if trans_a else "SB", s, int(shape[1]), memory=job.cfg.memory,
                       b_item=B.dtype.itemsize, b_chunks=chunks, out_item=dt.itemsize)
    return plan, dt


def _real_dtype(operands: list, dtype: Any, operation: str) -> np.dtype:
    """The product's dtype (:func:`~blocklin.validate.result_dtype`), float32 or float64: complex data
    (a dense operand, or ``dtype``) is refused with a fix that works for a sparse product. The dense
    routes' own message would have listed ``matmul`` and ``gram`` among the operations that take complex
    data, which they do for dense stores only."""
    rule = f"a {operation} with a stored sparse matrix is computed in float32 or float64 (its row blocks are real)"
    cplx = [op for op in operands if np.dtype(op.dtype).kind == "c"]
    if cplx:
        raise DTypeError(explain(
            cplx[0].name, rule, f"{cplx[0].name}: {np.dtype(cplx[0].dtype).name}",
            "multiply by the real and imaginary parts of the dense operand separately and add them as "
            "re + 1j * im (two exact real products), or write the sparse matrix densely into a zarr array, whose "
            "products take complex data"))
    if dtype is not None and np.dtype(dtype).kind == "c":
        raise DTypeError(explain("dtype", rule, f"dtype={np.dtype(dtype).name}",
                                 "pass dtype='float64', 'float32' or none: the operands are real, and so is the "
                                 "result"))
    return result_dtype(operands, dtype, allowed=(np.dtype(np.float32), np.dtype(np.float64)), operation=operation)


def _workers(job: Job, plan: SparsePlan) -> int:
    """Tasks at once: the job's workers, as many as the budget holds, at most the tasks."""
    return max(1, min(job.workers(job.cores()), job.cfg.memory // max(1, plan.task_memory), plan.n_tasks))


def sparse_product_plan(s: SparseOperand, b: Any = None, *, trans_a: bool = False, dtype: Any = None,
                        gram: bool = False, dense_left: bool = False, trans_dense: bool = False,
                        settings: dict) -> Any:
    """The :class:`~blocklin.plan.sparse.SparseOpPlan` of ``S B``, ``S^T B`` (``trans_a``), ``op(X) op(S)``
    (``dense_left``, as :func:`sparse_matmul`) or ``S^T S`` (``gram``) without running it (``matmul(..., explain=True)``, ``gram(..., explain=True)``, the
    CLI's ``--explain``): the tiles the run takes, counted in nonzeros; a budget the run refuses is
    refused with its message (:func:`plan_sparse`)."""
    from blocklin.plan.sparse import plan_sparse_product

    with Job("gram" if gram else "matmul", **settings) as job:
        if gram:
            dt = _real_dtype([s], dtype, "gram")
            plan = plan_sparse("STS", s, s.shape[1], memory=job.cfg.memory, out_item=dt.itemsize)
            workers, b_item = 1, 0
        else:
            B = job.operand(b, "b" if not dense_left else "a")
            if dense_left:
                _check_left(s, B, trans_a=trans_a, trans_dense=trans_dense)
            plan, dt = _product_plan(job, s, B, trans_a=not trans_a if dense_left else trans_a, dtype=dtype,
                                     b_transposed=dense_left and not trans_dense)
            workers, b_item = _workers(job, plan), B.dtype.itemsize
        return plan_sparse_product(plan.op, shape=s.shape, dtype=s.dtype, nnz=s.nnz, index_dtype=s.index_dtype,
                                   p=plan.p, rows=plan.rows, cols=plan.cols, inner=plan.inner, entries=plan.entries,
                                   task_memory=plan.task_memory, workers=workers, memory=job.cfg.memory,
                                   flops=plan.flops, b_itemsize=b_item, out_itemsize=dt.itemsize)


def sparse_gram(s: SparseOperand, out: Any = None, *, dtype: Any = None, overwrite: bool = False,
                resume: bool = False, settings: dict) -> Any:
    """``S^T S`` (``n x n`` dense) of a stored sparse ``S`` in one pass over its rows, when the Gram
    matrix fits the budget (refused with the minimum otherwise).

    The rows are read in strips of whole rows (at most ``plan.entries`` entries, a longer row alone);
    each strip's ``S_b^T S_b`` is added to a float64 sum in row order, then stored in the result
    dtype. Memory: the ``n x n`` sum and one product (``16 n^2`` bytes), a strip dense
    (``8 rows n``), the output's write copies.
    """
    with Job("gram", **settings) as job:
        # as opened, before the plan's reads: refused if S changed since
        job.stamp_input(s.path, s.stamp, own_open=s.own_open)
        m, n = s.shape
        dt = _real_dtype([s], dtype, "gram")
        plan = plan_sparse("STS", s, n, memory=job.cfg.memory, out_item=dt.itemsize)
        params = {"trans": False, "dtype": dt.name, "route": "sparse"}
        # the job's settings: the codec of the array a resumed run writes into
        token = resume_token("gram-sparse", [s], params, plan.to_dict(), plan_settings(job))
        ao = job.output(out, inputs=[s.path], overwrite=overwrite, resume=resume, token=token, size=((n, n), dt),
                        covered=[(s.path, m)])  # the rows the task reads (an append may commit meanwhile)
        band = max(1, min(n, (1 << 20) // max(1, n * dt.itemsize) or 1))
        open_or_create_array(ao, shape=(n, n), dtype=dt, chunks=(band, max(1, n)), codec=job.cfg.codec)
        run_gram_task(job, s, plan, dt, ao, token)
        report = job.report(flops=plan.flops, nnz=s.nnz, plan=plan.to_dict(), output=str(ao.path), route="sparse",
                            passes=job.passes("a"), product="S^T S")
        return job.finish(ao, out, report, operation="gram", plan=plan.to_dict(), params=params, keys=REPORT_KEYS)


__all__ = ["SparseOperand", "SparsePlan", "check_normal_range", "plan_sparse", "run_gram_task", "run_product_tiles",
           "sparse_gram", "sparse_matmul", "sparse_operand", "sparse_product_plan"]
