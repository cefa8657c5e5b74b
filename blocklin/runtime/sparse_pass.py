"""Products ``S X`` and ``S^T Y`` of a stored sparse matrix with a dense block in memory, run as tasks
on the job's scheduler: every iterative method on a sparse matrix (Lanczos, rsvd, LSQR, a Laplacian's
eigenpairs) takes its products from here, so its passes run on the job's workers (threads,
processes, a cluster), next to the data, rather than in the client.

The row blocks of ``S`` (fixed when it was stored, sized by the conversion's budget) are cut into
groups of whole blocks of about :data:`GROUP_ENTRIES` entries, one task each. A task reads its
blocks one at a time and returns its rows of ``S X``, or its partial ``S_g^T Y_g`` (``n x k``, summed
over its blocks in row order); the partials are added in group order. The groups depend on the
matrix alone, never on the scheduler, the workers or the budget, and the in-process product
(:func:`product_in_process`, what a :class:`~blocklin.sparse.SparseOperator` outside a job does) runs
the same groups in the same order, so a result has the same bits wherever it ran.

Where the row blocks fit the budget beside what the calling method holds (:func:`hold_blocks`, decided
once per operation by svd, pca and eigsh), the first product reads them into this process as the
CSR blocks the tasks would build (:class:`HeldBlocks`) and every product of the operation is computed
from them here, group by group with the same blocks, groups and order: one read of ``S`` for the
whole operation, the same bits as the streamed products. On a ``distributed`` cluster the products
stay tasks that read their blocks (the workers, not the client, hold the budget there).
"""

from __future__ import annotations

import dataclasses
import threading
import uuid
import weakref
from typing import Any

import numpy as np

from blocklin.config import format_size
from blocklin.errors import BudgetError, DTypeError, explain
from blocklin.runtime.graph import TileGraph, start_order
from blocklin.runtime.pools import compute_pool
from blocklin.runtime.tiles import with_task_settings
from blocklin.storage.sparse import SparseStore

#: Entries per task's group of row blocks (a group holds at least one block). A constant: the groups
#: fix the order of the partial sums of ``S^T Y``.
GROUP_ENTRIES = 1 << 22
#: Hold the row blocks in memory between an operation's products where the budget allows
#: (:func:`hold_blocks`); off, every product reads them (the tests compare the two bit for bit).
HOLD_BLOCKS = True


def row_groups(store: SparseStore) -> list[tuple[int, int]]:
    """``(first block, stop block)`` of each group of consecutive row blocks holding about
    :data:`GROUP_ENTRIES` entries (one small read of ``indptr`` at the block boundaries)."""
    bounds = store.row_blocks
    ends = store.block_ends()
    groups, first, start = [], 0, int(ends[0])
    for b in range(1, len(bounds)):
        if int(ends[b]) - start >= GROUP_ENTRIES or b == len(bounds) - 1:
            groups.append((first, b))
            first, start = b, int(ends[b])
    return groups or [(0, 0)]


#: Entries whose diagonal test one step of :func:`diagonal_positions` forms at once: its transients
#: (about 17 bytes an entry) stay near 1 MiB whatever a row block holds.
DIAGONAL_PIECE = 1 << 16


def diagonal_positions(ptr: np.ndarray, idx: np.ndarray, row0: int, piece: int = DIAGONAL_PIECE) -> np.ndarray:
    """Positions in ``idx`` of the entries on the diagonal (column ``row0 + i`` in row ``i``) of the CSR
    rows with offsets ``ptr`` (from 0). Tested over pieces of whole rows of at most ``piece`` entries (a
    longer row alone, against its own column): a test of the whole block at once held each entry's row
    number and a flag, 5 to 9 bytes an entry beyond what the plans count."""
    ptr = np.asarray(ptr, dtype=np.int64)
    idx = np.asarray(idx)
    rows, found, r = len(ptr) - 1, [], 0
    while r < rows:
        r1 = min(rows, max(r + 1, int(np.searchsorted(ptr, ptr[r] + piece, side="right")) - 1))
        p0, p1 = int(ptr[r]), int(ptr[r1])
        if r1 == r + 1:  # one row: its own column, no per-entry row numbers
            hit = np.flatnonzero(idx[p0:p1] == row0 + r)
        else:
            hit = np.flatnonzero(idx[p0:p1] == np.repeat(np.arange(row0 + r, row0 + r1, dtype=np.int64),
                                                          np.diff(ptr[r:r1 + 1])))
        if hit.size:
            found.append(hit + p0)
        r = r1
    return np.concatenate(found) if found else np.zeros(0, dtype=np.int64)


def read_block(store: SparseStore, s0: int, s1: int, dtype: Any, offdiagonal: bool = False) -> Any:
    """Rows ``s0:s1`` (one row block) as the ``scipy.sparse.csr_matrix`` a product multiplies, its values
    in ``dtype``: what a task builds and what :class:`HeldBlocks` keeps. ``offdiagonal``: the diagonal's
    entries made explicit zeros, so that a product is ``(S - diag(S)) X`` exactly (a graph Laplacian's
    ``W X``: ``S X - diag(S) X`` lost ``W X`` to cancellation beside a large self-loop)."""
    import scipy.sparse

    ptr, idx, val = store.read_rows(s0, s1)
    if offdiagonal:
        on = diagonal_positions(ptr, idx, s0)
        if on.size:
            if not val.flags.writeable:  # the values read are this block's own: zeroed in place otherwise
                val = np.array(val, copy=True)
            val[on] = 0
    if val.dtype.kind == "c" and np.dtype(dtype).kind != "c":  # never a silent real part (sparse.refuse_complex)
        raise DTypeError(explain("a", "must be a real sparse matrix for a product in a real dtype",
                                 f"{val.dtype.name} values read as {np.dtype(dtype).name}",
                                 "write it densely into a complex zarr array (blocklin.sparse.refuse_complex)"))
    return scipy.sparse.csr_matrix((val.astype(np.dtype(dtype), copy=False), idx, ptr), shape=(s1 - s0, store.shape[1]))


def group_product(store: SparseStore, b0: int, b1: int, x: np.ndarray, transposed: bool, dtype: Any,
                  blocks: list | None = None, pool: Any = None, offdiagonal: bool = False) -> np.ndarray:
    """Rows ``row_blocks[b0]:row_blocks[b1]`` of ``S X`` (``transposed=False``), or the partial
    ``S_g^T Y_g`` of those rows (``Y = x``), with the blocks in ``dtype``: read, or taken from
    ``blocks`` (every row block held, :class:`HeldBlocks`; the same matrices, so the same bits).
    ``pool``: threads that split a block's rows of ``S X`` between them (:func:`_put_product`)."""
    bounds, dt = store.row_blocks, np.dtype(dtype)
    r0, r1 = int(bounds[b0]), int(bounds[b1])
    k = x.shape[1]
    out = np.zeros((store.shape[1], k) if transposed else (r1 - r0, k), np.result_type(dt, x.dtype))
    for b in range(b0, b1):
        s0, s1 = int(bounds[b]), int(bounds[b + 1])
        blk = blocks[b] if blocks is not None else read_block(store, s0, s1, dt, offdiagonal)
        if transposed:
            _add_transposed_product(out, blk, x[s0:s1])
        else:
            _put_product(out[s0 - r0:s1 - r0], blk, x, pool)
    return out


def _put_product(out: np.ndarray, blk: Any, x: np.ndarray, pool: Any = None) -> None:
    """``out = blk x`` for a zeroed ``out`` (a block's rows of a group's result): SciPy's CSR kernel adding
    into it, the kernel and zeros ``blk @ x`` itself takes (the same bits), without the temporary and copy.

    ``pool`` (a thread pool; SciPy's kernels release the GIL): the block's rows cut into ranges of about
    equal entries, one call of the kernel each on the pool's threads. Each row of ``S X`` is the same
    dot product in the same order whichever call computes it, so the bits do not depend on the split
    (unlike ``S^T Y``, whose rows sum over every row of ``S``: that product stays on one thread)."""
    if (blk.data.dtype == x.dtype == out.dtype and out.flags.c_contiguous and blk.indptr.dtype == blk.indices.dtype
            and _csr_matvecs is not None):
        m, n = blk.shape
        k = x.shape[1]
        # a block's product temporary, counted by task_memory and no longer made, holds the slabs' copies
        width = slab_width(k, n + m, m * k)
        if width == k:
            _csr_rows(out, blk, np.ascontiguousarray(x), pool)
            return
        part, xs = np.empty(m * width, out.dtype), np.empty(n * width, x.dtype)  # reused by every slab
        for c0 in range(0, k, width):
            w = min(k, c0 + width) - c0
            p, xw = part[:m * w].reshape(m, w), xs[:n * w].reshape(n, w)
            p.fill(0)
            np.copyto(xw, x[:, c0:c0 + w])
            _csr_rows(p, blk, xw, pool)
            out[:, c0:c0 + w] = p
        return
    out[...] = blk @ x


def _csr_rows(out: np.ndarray, blk: Any, x: np.ndarray, pool: Any) -> None:
    """``out += blk x`` by SciPy's CSR kernel (C-contiguous ``out`` and ``x``), its rows split over ``pool``."""
    m, n = blk.shape
    xr, k = x.ravel(), x.shape[1]
    cuts = _row_cuts(blk.indptr, pool._max_workers if pool is not None else 1)
    if len(cuts) <= 2:
        _csr_matvecs(m, n, k, blk.indptr, blk.indices, blk.data, xr, out.ravel())
        return

    def rows(i: int) -> None:
        a, b = cuts[i], cuts[i + 1]
        _csr_matvecs(b - a, n, k, blk.indptr[a:b + 1], blk.indices, blk.data, xr, out[a:b].ravel())

    list(pool.map(rows, range(len(cuts) - 1)))


#: Entries of a row block per piece of :func:`normal_sweep` (1.5 MB of float64 values and int32 indices):
#: 7.0 ms a sweep of 2 million entries at ``k = 4`` against 7.3 ms at ``2^18`` and 9.3 at ``2^19``, the
#: Krylov bases streamed through the cache between sweeps (two products: 9.5-10 ms).
SWEEP_ENTRIES = 1 << 17


def fusable(blk: Any, x: np.ndarray) -> bool:
    """Whether :func:`normal_sweep` takes ``blk`` and ``X``: SciPy's kernels apply (one dtype, one index
    dtype) and ``X`` is no wider than a slab."""
    return (_csr_matvecs is not None and _csc_matvecs is not None and blk.data.dtype == x.dtype
            and blk.indptr.dtype == blk.indices.dtype and x.shape[1] <= SLAB_COLUMNS)


def normal_sweep(blk: Any, x: np.ndarray, y: np.ndarray, z: np.ndarray, pool: Any = None) -> None:
    """``y = blk x`` (``y`` zeroed, C-contiguous) and ``z += blk^T y`` in one sweep over a CSR row block, in
    pieces of about :data:`SWEEP_ENTRIES` entries: two products read the block from memory twice, and
    the Krylov bases a Lanczos step streams between them evict it from the cache.

    ``z`` takes its terms piece by piece in the block's row order on the calling thread. ``pool`` (one
    thread) forms the pieces' rows of ``y`` from the first on while the calling thread adds the terms of
    those ready and, while it would wait, forms rows from the last piece backwards: the rows (the
    slower product, 1.5 times the terms here) are shared by both threads and the terms overlap them.

    The bits are those of :func:`_put_product` then :func:`_add_transposed_product`: each row of ``y``
    is the same dot product whichever thread forms it, and ``z`` takes the terms row after row in the
    block's order either way."""
    m, n = blk.shape
    k = x.shape[1]
    if not fusable(blk, x) or not (y.flags.c_contiguous and z.flags.c_contiguous):
        _put_product(y, blk, x)
        _add_transposed_product(z, blk, y)
        return
    xr, ptr = x.ravel(), blk.indptr
    nnz = int(ptr[-1])
    inner = np.searchsorted(ptr, np.arange(SWEEP_ENTRIES, nnz, SWEEP_ENTRIES)).tolist()
    cuts = sorted({0, m, *(min(m, max(0, int(c))) for c in inner)})
    pieces = len(cuts) - 1

    def rows(i: int) -> None:
        a, b = cuts[i], cuts[i + 1]
        _csr_matvecs(b - a, n, k, ptr[a:b + 1], blk.indices, blk.data, xr, y[a:b].ravel())

    def terms(i: int) -> None:
        a, b = cuts[i], cuts[i + 1]
        _csc_matvecs(n, b - a, k, ptr[a:b + 1], blk.indices, blk.data, y[a:b].ravel(), z.ravel())

    if pool is None or pieces < 4:
        for i in range(pieces):
            rows(i)
            terms(i)
        return
    lock = threading.Lock()
    ready = [threading.Event() for _ in range(pieces)]
    span = [0, pieces]  # pieces [span[0], span[1]) not yet claimed: the pool takes the front, this thread the back
    failed: list = []

    def claim(front: bool) -> int | None:
        with lock:
            if span[0] >= span[1]:
                return None
            if front:
                span[0] += 1
                return span[0] - 1
            span[1] -= 1
            return span[1]

    def forward() -> None:
        try:
            while (i := claim(True)) is not None:
                rows(i)
                ready[i].set()
        except BaseException:
            failed.append(True)
            for e in ready:  # nobody waits for a piece that will not come
                e.set()
            raise

    helper = pool.submit(forward)
    try:
        for i in range(pieces):
            while not ready[i].is_set():
                j = claim(False)
                if j is None:
                    ready[i].wait()
                    break
                rows(j)
                ready[j].set()
            if failed:
                break
            terms(i)
    finally:
        helper.result()  # the pool's piece ends before the arrays may go (and its error, if any, is raised)


#: Columns of ``X`` one call of SciPy's sparse kernels takes at most. A row of ``X`` and of the result
#: is touched at random, once per entry: up to 8-12 columns the rows stay in cache, past 16 they do
#: not. At ``10^5`` rows and 2 million entries, per column: 1.1 ms at 8 columns, 2.2 ms at 16, 2.7 ms at
#: 24 (``S^T Y``; ``S X`` 1.9, 1.9 and 2.8 ms). Every column's sums run in the same order whatever the
#: slab, so slabs keep the bits.
SLAB_COLUMNS = 8


def slab_width(k: int, temp_rows: int, spare: int) -> int:
    """Columns of ``X`` per kernel call: :data:`SLAB_COLUMNS` where ``k`` is wider and the slabs' copies
    (``temp_rows`` rows) fit the ``spare`` elements the product's plan counted, else ``k`` (one call)."""
    if k <= SLAB_COLUMNS or temp_rows * SLAB_COLUMNS > spare:
        return k
    return SLAB_COLUMNS


#: Entries of a row block's ``S X`` below which it runs as one call of SciPy's kernel: the threads'
#: start and join would cost more than they save.
SPLIT_ENTRIES = 1 << 18


def _row_cuts(indptr: np.ndarray, parts: int) -> list[int]:
    """Row boundaries cutting a CSR block into at most ``parts`` ranges of about equal entries (one range
    where the block has fewer than :data:`SPLIT_ENTRIES` entries per part)."""
    m, nnz = len(indptr) - 1, int(indptr[-1])
    parts = max(1, min(parts, m, nnz // SPLIT_ENTRIES))
    if parts <= 1:
        return [0, m]
    inner = np.searchsorted(indptr, np.arange(1, parts) * (nnz / parts)).tolist()
    return sorted({0, m, *(min(m, max(0, int(c))) for c in inner)})


def _add_transposed_product(out: np.ndarray, blk: Any, y: np.ndarray) -> None:
    """``out += blk^T y`` in place (``blk`` a CSR row block): SciPy's own kernel for a CSC matrix times a
    block of vectors (``blk^T`` is ``blk``'s arrays read as CSC), which adds into its output, so no
    ``n x k`` temporary is made per row block (``blk.T @ y`` made one: 32 MB a block at ``n = 10^6``,
    ``k = 4``, beside the task's own ``out``). Other layouts or dtypes: the product, then the sum."""
    if (blk.data.dtype == y.dtype == out.dtype and out.flags.c_contiguous and blk.indptr.dtype == blk.indices.dtype
            and _csc_matvecs is not None):
        m, n = blk.shape
        k = y.shape[1]
        width = slab_width(k, n + m, n * k)  # in the n x k product temporary task_memory counts
        if width == k:
            _csc_matvecs(n, m, k, blk.indptr, blk.indices, blk.data, np.ascontiguousarray(y).ravel(), out.ravel())
            return
        part, ys = np.empty(n * width, out.dtype), np.empty(m * width, y.dtype)  # reused by every slab
        for c0 in range(0, k, width):
            w = min(k, c0 + width) - c0
            p, yw = part[:n * w].reshape(n, w), ys[:m * w].reshape(m, w)
            np.copyto(p, out[:, c0:c0 + w])  # the sums so far: each adds on in entry order
            np.copyto(yw, y[:, c0:c0 + w])
            _csc_matvecs(n, m, w, blk.indptr, blk.indices, blk.data, yw.ravel(), p.ravel())
            out[:, c0:c0 + w] = p
        return
    out += blk.T @ y


def _sparsetools_kernel(name: str) -> Any:
    """SciPy's compiled kernel behind ``csr_matrix @ block`` (``csr_matvecs``) or ``csc_matrix @ block``
    (``csc_matvecs``): private, present since SciPy 0.x; ``None`` where missing (the product, then a copy
    or sum)."""
    try:
        from scipy.sparse import _sparsetools
    except ImportError:  # pragma: no cover
        return None
    return getattr(_sparsetools, name, None)


_csc_matvecs = _sparsetools_kernel("csc_matvecs")
_csr_matvecs = _sparsetools_kernel("csr_matvecs")


def product_in_process(store: SparseStore, x: np.ndarray, transposed: bool, dtype: Any,
                       offdiagonal: bool = False) -> np.ndarray:
    """``S X`` or ``S^T X`` in this process, group by group as the tasks would compute it (``offdiagonal``:
    of ``S`` without its diagonal, :func:`read_block`)."""
    groups = row_groups(store)
    if transposed and len(groups) > 1:
        return _sum_in_order(groups, (store.shape[1], x.shape[1]), np.result_type(np.dtype(dtype), x.dtype),
                             lambda g: group_product(store, *g, x, transposed, dtype, offdiagonal=offdiagonal))
    return _combine(store, [(g, group_product(store, *g, x, transposed, dtype, offdiagonal=offdiagonal))
                            for g in groups], x, transposed, dtype)


class OrderedSum:
    """The partials ``S_g^T Y_g`` of one product added into its ``n x k`` result as their groups finish,
    in group order (``0 + p_0 + p_1 + ...``, :func:`_combine`'s sums, so its bits), shared by the tasks
    of one process (threads, ``sync``). Holding every group's partial until the last finished took
    ``groups x n x k`` beside the result where the plans count one partial per running task
    (:func:`task_memory`): 5 partials of 32 MB in a sparse svd's final step at ``10^6`` columns.

    A task that finishes before an earlier group waits for its turn with its partial (still a running
    task's memory), where every earlier group has started: those finish without waiting (the lowest
    one never waits), so the wait ends. Where one has not (a scheduler that starts groups out of
    order), its partial is parked instead. A task that fails calls :meth:`abandon`: no one waits for it.
    """

    def __init__(self, groups: list[tuple[int, int]], shape: tuple[int, int], dtype: Any) -> None:
        self.order = {g: i for i, g in enumerate(groups)}
        self.total = np.zeros(shape, dtype)
        self.waiting: dict[int, np.ndarray] = {}
        self.started = [False] * len(groups)
        self.next = 0
        self.failed = False
        self.cond = threading.Condition()

    def begin(self, group: tuple[int, int]) -> None:
        with self.cond:
            self.started[self.order[group]] = True

    def add(self, group: tuple[int, int], part: np.ndarray) -> None:
        i = self.order[group]
        with self.cond:
            while self.next < i and not self.failed and all(self.started[:i]):
                self.cond.wait()
            if self.failed:
                return
            self.waiting[i] = part
            while self.next in self.waiting:
                self.total += self.waiting.pop(self.next)
                self.next += 1
            self.cond.notify_all()

    def abandon(self) -> None:
        """A task failed: the product fails; wake the tasks waiting for their turn."""
        with self.cond:
            self.failed = True
            self.waiting.clear()
            self.cond.notify_all()

    def run(self, group: tuple[int, int], compute: Any) -> None:
        """``compute()``'s partial of ``group`` added in its turn (:meth:`abandon` where it raises)."""
        self.begin(group)
        try:
            part = compute()
        except BaseException:
            self.abandon()
            raise
        self.add(group, part)

    def result(self) -> np.ndarray:
        if self.failed or self.next != len(self.order):
            from blocklin.errors import InternalError

            raise InternalError(f"OrderedSum: {self.next} of {len(self.order)} partials added")
        return self.total


def _sum_in_order(groups: list[tuple[int, int]], shape: tuple[int, int], dtype: Any, partial: Any,
                  threads: int = 1) -> np.ndarray:
    """``S^T Y`` from ``partial(g)`` of every group, computed in this process on up to ``threads`` threads
    of a first-in, first-out pool (the groups start in order) and added in order as they finish
    (:class:`OrderedSum`)."""
    total = OrderedSum(groups, shape, dtype)
    if threads > 1:
        pool = compute_pool(min(threads, len(groups)))
        list(pool.map(lambda g: total.run(g, lambda: partial(g)), groups))
    else:
        for g in groups:
            total.run(g, lambda g=g: partial(g))
    return total.result()


@dataclasses.dataclass(frozen=True)
class ProductSpec:
    """What a product task needs: where ``S`` is, the product, the blocks' dtype, BLAS threads."""

    s: Any
    transposed: bool
    dtype: str
    blas_threads: int | None
    offdiagonal: bool = False


class Operand:
    """``X`` shared by one product's tasks, tokenized by a fresh id: a product's graph is named afresh
    anyway (``X`` differs on every call), and hashing ``X``'s bytes once per task took a fifth of a
    product's time (a ``10^5 x 30`` block, five groups). ``into``: where the tasks of an ``S^T X`` in
    this process add their partials (:class:`OrderedSum`), instead of returning them."""

    def __init__(self, x: np.ndarray, into: OrderedSum | None = None) -> None:
        self.x, self.into, self.token = x, into, uuid.uuid4().hex

    def __dask_tokenize__(self) -> str:
        return self.token


@with_task_settings
def product_task(spec: ProductSpec, b0: int, b1: int, x: Operand | np.ndarray) -> dict:
    """One group's rows of ``S X`` or its partial ``S^T Y`` (see the module docstring)."""
    into = x.into if isinstance(x, Operand) else None
    x = x.x if isinstance(x, Operand) else x
    store = SparseStore(spec.s)
    if into is not None:
        into.run((b0, b1), lambda: group_product(store, b0, b1, x, spec.transposed, spec.dtype,
                                                 offdiagonal=spec.offdiagonal))
        out = None
    else:
        out = group_product(store, b0, b1, x, spec.transposed, spec.dtype, offdiagonal=spec.offdiagonal)
    r0, r1 = int(store.row_blocks[b0]), int(store.row_blocks[b1])
    entries = int(store.indptr[r1]) - int(store.indptr[r0]) if r1 > r0 else 0
    return {"group": (b0, b1), "result": out, "flops": 2 * entries * x.shape[1],
            "bytes_read": entries * (store.dtype.itemsize + store.index_dtype.itemsize) + (r1 - r0 + 1) * 8}


def task_memory(store: SparseStore, groups: list[tuple[int, int]], k: int, transposed: bool, dtype: Any) -> int:
    """Bytes one task allocates beside the shared ``X``: its largest block's CSR arrays as read and
    cast, and its result (a group's rows of ``S X``, or an ``n x k`` partial and a block's product)."""
    bounds = store.row_blocks
    ends = store.block_ends()
    block_entries = int(np.diff(ends).max(initial=0))
    block_rows = int(np.diff(bounds).max(initial=0))
    entry = store.dtype.itemsize + store.index_dtype.itemsize
    csr = block_entries * (entry + np.dtype(dtype).itemsize + 8) + 2 * (block_rows + 1) * 8
    if transposed:
        return csr + 2 * store.shape[1] * k * 8
    rows = max(int(bounds[b1]) - int(bounds[b0]) for b0, b1 in groups)
    return csr + (rows + block_rows) * k * 8


def product_memory(store: SparseStore, groups: list[tuple[int, int]], k: int, x_nbytes: int, transposed: bool,
                   dtype: Any, budget: int, reserved: int = 0) -> tuple[int, int]:
    """``(held, per_task)``: the bytes a product holds in the caller (``X`` of ``x_nbytes`` and the
    ``k``-column result) and per task (:func:`task_memory`); refused with the minimum budget when one
    task and the caller's operands do not fit ``budget`` beside the ``reserved`` bytes the calling
    method holds (also what ``--explain`` plans with)."""
    m, n = store.shape
    held = x_nbytes + (n if transposed else m) * k * 8  # X and the result, in the caller
    per_task = task_memory(store, groups, k, transposed, dtype)
    if reserved + held + per_task > budget:
        need = reserved + held + per_task
        besides = f", beside {format_size(reserved)} the method holds" if reserved else ""
        raise BudgetError(explain("memory", f"a product {'S^T X' if transposed else 'S X'} holds X, the result and "
                                  f"one task's row block and partial{besides}", f"{format_size(need)} needed, the "
                                  f"budget is {format_size(budget)} ({m} x {n} sparse, {store.nnz} entries, X with "
                                  f"{k} columns)", f"raise the budget (memory='{format_size(need * 5 // 4 + 1)}'), or "
                                  "convert S again with a smaller --memory (smaller row blocks)"), minimum=need)
    return held, per_task


def check_products(store: SparseStore, products: list[tuple[int, bool]], item: int, dtype: Any, budget: int,
                   reserved: int = 0) -> int:
    """The most any of a method's ``products`` holds (each ``(width, transposed)``: ``X`` of ``width``
    columns of ``item`` bytes, ``S^T X`` where ``transposed``; the result, one task), checked as the run
    checks it (:func:`product_memory`, beside the ``reserved`` bytes of the method): a method refuses up
    front, naming the whole call's minimum, the budget its largest product would refuse."""
    m, n = store.shape
    groups = row_groups(store)
    needs = []
    for width, transposed in products:  # every product's need first: a refusal names the largest
        held, per_task = product_memory(store, groups, width, (m if transposed else n) * width * item, transposed,
                                        dtype, 1 << 62)
        needs.append((held + per_task, width, transposed))
    need, width, transposed = max(needs)
    product_memory(store, groups, width, (m if transposed else n) * width * item, transposed, dtype, budget, reserved)
    return need


def sparse_product(job: Any, matrix: Any, x: np.ndarray, transposed: bool, dtype: Any,
                   offdiagonal: bool = False) -> np.ndarray:
    """``S X`` (``transposed=False``) or ``S^T X`` of the stored sparse ``matrix``, its groups run as
    tasks of ``job`` (one pass over ``S``, counted), or from the row blocks ``job`` holds
    (:func:`hold_blocks`: no read); refused with the minimum budget when one task and the product's
    operands do not fit ``job``'s memory budget. ``offdiagonal``: of ``S`` without its diagonal
    (:func:`read_block`)."""
    store = matrix._store
    # the stamp of S's open, before its first read: refused if S changed since, before the run's end
    job.stamp_input(store.location, matrix.stamp)
    groups = row_groups(store)
    budget, reserved = job.cfg.memory, job.client_reserved
    held, per_task = product_memory(store, groups, x.shape[1], x.nbytes, transposed, dtype, budget, reserved)
    workers = max(1, min(job.workers(job.cores()), (budget - reserved - held) // max(1, per_task), len(groups)))
    kept = _HELD.get(job, {}).get(_held_key(store, dtype, offdiagonal))
    if kept is not None:
        return kept.product(job, groups, x, transposed, workers)
    spec = ProductSpec(s=store.location, transposed=transposed, dtype=np.dtype(dtype).name,
                       blas_threads=job.task_blas_threads(1), offdiagonal=offdiagonal)
    # Tasks in this process add their partials of S^T X as they finish; elsewhere they return them
    in_process = job.scheduler.kind in ("threads", "sync")
    into = OrderedSum(groups, (store.shape[1], x.shape[1]), np.result_type(np.dtype(dtype), x.dtype)) \
        if transposed and len(groups) > 1 and in_process else None
    operand = Operand(x, into)
    what = f"sparse {'S^T X' if transposed else 'S X'}"
    if transposed and len(groups) > 1 and not in_process:
        total = _returned_partials(job, store, groups, spec, operand, x, dtype, workers, budget - reserved - held)
        job.stats["sparse_reads"] = job.stats.get("sparse_reads", 0) + 1
        return total
    graph = TileGraph.named("sparse-product", uuid.uuid4().hex)  # X differs on every call: a fresh name
    # where partials are added as they finish, the graph starts the groups in their order (start_order)
    keys = start_order(len(groups)) if into is not None and job.scheduler.kind == "threads" else None
    for i, g in enumerate(groups):
        graph.add((keys[i],) if keys else g, product_task, spec, *g, operand)
    results = job.run(graph, workers=workers, description=what, count_pass="a")
    job.stats["sparse_reads"] = job.stats.get("sparse_reads", 0) + 1
    if into is not None:
        return into.result()
    parts = {r["group"]: r["result"] for r in results}
    return _combine(store, [(g, parts[g]) for g in groups], x, transposed, dtype)


def _returned_partials(job: Any, store: SparseStore, groups: list[tuple[int, int]], spec: ProductSpec,
                       operand: Any, x: np.ndarray, dtype: Any, workers: int, room: int) -> np.ndarray:
    """``S^T X`` where the tasks return their partials (``processes``, a cluster): the groups run a batch
    at a time, at most as many as run at once and as the caller's ``room`` (the budget beside the
    product's operands and result) holds of partials, each batch's partials added in group order as it
    returns (the sums of :func:`_combine`, so its bits). One graph of every group returned every
    partial before any was added: ``groups x n x k`` in the caller, which its plan never counted."""
    n, k = store.shape[1], x.shape[1]
    rt = np.result_type(np.dtype(dtype), x.dtype)
    total = np.zeros((n, k), rt)
    batch = max(1, min(workers, room // max(1, n * k * rt.itemsize)))
    for i0 in range(0, len(groups), batch):
        graph = TileGraph.named("sparse-product", uuid.uuid4().hex)
        for g in groups[i0:i0 + batch]:
            graph.add(g, product_task, spec, *g, operand)
        results = job.run(graph, workers=min(workers, batch), description="sparse S^T X",
                          count_pass="a" if i0 == 0 else None)  # one pass over S, in batches
        parts = {r["group"]: r["result"] for r in results}
        del results
        for g in groups[i0:i0 + batch]:
            total += parts.pop(g)
    return total


def sparse_normal(job: Any, matrix: Any, x: np.ndarray, dtype: Any) -> tuple[np.ndarray, np.ndarray] | None:
    """``(S X, S^T S X)`` in one sweep over the row blocks ``job`` holds (:meth:`HeldBlocks.normal`: the bits
    of :func:`sparse_product` twice), a slab of columns at a time where ``X`` is wider than one; ``None``
    where the blocks are not held or the slabs' copies do not fit what the two products' plans count
    (the caller then makes the two products)."""
    store = matrix._store
    kept = _HELD.get(job, {}).get(_held_key(store, dtype))
    if kept is None or np.dtype(dtype) != np.result_type(np.dtype(dtype), x.dtype):
        return None
    m, n = store.shape
    k = x.shape[1]
    # a slab's copies of X, S X and S^T S X in what S^T Y's plan counts per task and one sweep does not
    # make: its partial and a block's product (n x k each)
    if k > SLAB_COLUMNS and slab_width(k, 2 * n + m, 2 * n * k) == k:
        return None
    return kept.normal(job, row_groups(store), x)


# -- row blocks held in memory between products ---------------------------------------------------------

#: The row blocks each running job holds, by store and dtype (released when the job ends).
_HELD: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _held_key(store: SparseStore, dtype: Any, offdiagonal: bool = False) -> tuple[str, str, bool]:
    return store.location.url, np.dtype(dtype).name, bool(offdiagonal)


def held_bytes(store: SparseStore, dtype: Any) -> int:
    """Bytes the row blocks of ``S`` take held in memory as products use them: values in ``dtype``,
    column indices as stored, each block's row offsets (at most int64; SciPy may keep them in int32)."""
    blocks = len(store.row_blocks) - 1
    return store.nnz * (np.dtype(dtype).itemsize + store.index_dtype.itemsize) + 8 * (store.shape[0] + blocks)


def blocks_fit(store: SparseStore, dtype: Any, budget: int, reserved: int, need: int) -> int:
    """:func:`held_bytes` when the held blocks fit ``budget`` beside the ``reserved`` bytes of the method
    and the ``need`` of its largest product (:func:`check_products`, whose task's block is counted
    though a held product reads none), else 0: the rule :func:`hold_blocks` and the plans share."""
    nbytes = held_bytes(store, dtype)
    return nbytes if reserved + nbytes + need <= budget else 0


def hold_blocks(job: Any, store: SparseStore, dtype: Any, need: int, reserved: int, offdiagonal: bool = False) -> int:
    """Hold the row blocks of ``S`` (values in ``dtype``) in this process for ``job``'s products when
    they fit its budget (:func:`blocks_fit`) and its products run here (not on a ``distributed``
    cluster); the bytes held, to add to ``job.client_reserved`` (0: the products stream). The blocks
    are read by the first product and released when ``job`` ends (``offdiagonal``: without the diagonal,
    for the products of :func:`sparse_product` that ask for it)."""
    if not HOLD_BLOCKS or job.scheduler.kind == "distributed":
        return 0
    nbytes = blocks_fit(store, dtype, job.cfg.memory, reserved, need)
    if nbytes:
        kept = _HELD.setdefault(job, {})
        key = _held_key(store, dtype, offdiagonal)
        if key not in kept:
            kept[key] = HeldBlocks(store, dtype, offdiagonal)
            job.stack.callback(kept.pop, key, None)
    return nbytes


class HeldBlocks:
    """The row blocks of ``S`` held in memory between the products of one operation: read by the
    first, as :func:`read_block` builds them for a task, then multiplied by every product in this
    process, group by group in the groups' order (the streamed products' sums, so their bits)."""

    def __init__(self, store: SparseStore, dtype: Any, offdiagonal: bool = False) -> None:
        self.store, self.dtype, self.blocks, self.offdiagonal = store, np.dtype(dtype), None, offdiagonal

    def _load(self, job: Any) -> list:
        if self.blocks is None:
            bounds = self.store.row_blocks
            self.blocks = [read_block(self.store, int(bounds[b]), int(bounds[b + 1]), self.dtype, self.offdiagonal)
                           for b in range(len(bounds) - 1)]  # the reads count in the job's bytes_read
            job.stats["sparse_reads"] = job.stats.get("sparse_reads", 0) + 1
            job.stats["sparse_held_bytes"] = sum(b.data.nbytes + b.indices.nbytes + b.indptr.nbytes
                                                 for b in self.blocks)
        return self.blocks

    def product(self, job: Any, groups: list[tuple[int, int]], x: np.ndarray, transposed: bool,
                workers: int) -> np.ndarray:
        """``S X`` or ``S^T X`` from the held blocks; up to ``workers`` groups at once on threads (SciPy's
        sparse products release the GIL; the groups' results are combined in order whatever ran first)."""
        blocks = self._load(job)

        def one(g: tuple[int, int], pool: Any = None) -> np.ndarray:
            return group_product(self.store, *g, x, transposed, self.dtype, blocks, pool)

        threads = workers if job.scheduler.kind != "sync" else 1
        # a split of rows needs no memory of its own (the threads write into one result): the job's workers
        split = max(1, job.workers(job.cores())) if job.scheduler.kind != "sync" else 1
        if transposed and len(groups) > 1:  # partials added as they finish, not all held
            total = _sum_in_order(groups, (self.store.shape[1], x.shape[1]), np.result_type(self.dtype, x.dtype),
                                  one, threads)
            self._count(job, groups, x)
            return total
        if threads > 1 and len(groups) > 1:
            parts = list(compute_pool(min(threads, len(groups))).map(one, groups))
        elif split > 1 and not transposed:  # one group: its rows of S X split between the threads
            parts = [one(g, compute_pool(split)) for g in groups]
        else:
            parts = [one(g) for g in groups]
        self._count(job, groups, x)
        return _combine(self.store, list(zip(groups, parts)), x, transposed, self.dtype)

    def normal(self, job: Any, groups: list[tuple[int, int]], x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(Y, Z) = (S X, S^T Y)`` from the held blocks in one sweep over them, with the bits of
        :meth:`product` then :meth:`product` transposed (:func:`normal_sweep`): counted as those two. ``X``
        wider than :data:`SLAB_COLUMNS`: a sweep per slab of its columns (each column's sums are the same
        whatever the slab)."""
        k = x.shape[1]
        if k <= SLAB_COLUMNS:
            y, z = self._sweep(job, groups, np.ascontiguousarray(x))
        else:
            dt = np.result_type(self.dtype, x.dtype)
            m, n = self.store.shape
            y, z = np.empty((m, k), dt), np.empty((n, k), dt)
            for c0 in range(0, k, SLAB_COLUMNS):
                c1 = min(k, c0 + SLAB_COLUMNS)
                y[:, c0:c1], z[:, c0:c1] = self._sweep(job, groups, np.ascontiguousarray(x[:, c0:c1]))
        self._count(job, groups, x)
        self._count(job, groups, y)
        return y, z

    def _sweep(self, job: Any, groups: list[tuple[int, int]], x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        blocks = self._load(job)
        dt = np.result_type(self.dtype, x.dtype)
        m, n = self.store.shape
        y = np.zeros((m, x.shape[1]), dt)
        pool = compute_pool(1) if job.scheduler.kind != "sync" and job.workers(job.cores()) > 1 else None
        bounds = self.store.row_blocks

        def partial(g: tuple[int, int]) -> np.ndarray:
            z = np.zeros((n, x.shape[1]), dt)
            for b in range(*g):
                s0, s1 = int(bounds[b]), int(bounds[b + 1])
                normal_sweep(blocks[b], x, y[s0:s1], z, pool)
            return z

        z = _sum_in_order(groups, (n, x.shape[1]), dt, partial) if len(groups) > 1 else partial(groups[0])
        return y, z

    def _count(self, job: Any, groups: list[tuple[int, int]], x: np.ndarray) -> None:
        for b0, b1 in groups:  # a unit of work each, as a task would count it (no reads)
            entries = sum(int(self.blocks[b].nnz) for b in range(b0, b1))
            job.add_stats({"flops": 2 * entries * x.shape[1], "bytes_read": 0})


def _combine(store: SparseStore, parts: list[tuple[tuple[int, int], np.ndarray]], x: np.ndarray, transposed: bool,
             dtype: Any) -> np.ndarray:
    """The groups' results in order: rows placed, or partials added in group order. One group's result is
    returned as it is (its rows are all of ``S X``; its partial, summed from zeros, is ``0 + p``, the same
    bits): copying it took a tenth of a sparse svd's time at ``10^5`` nodes."""
    m, n = store.shape
    rt = np.result_type(np.dtype(dtype), x.dtype)
    if len(parts) == 1:
        p = parts[0][1]
        if p.dtype == rt and p.flags.writeable and p.shape == ((n if transposed else m), x.shape[1]):
            return p
    if transposed:
        out = np.zeros((n, x.shape[1]), rt)
        for _g, p in parts:
            out += p
        return out
    out = np.empty((m, x.shape[1]), rt)
    bounds = store.row_blocks
    for (b0, b1), p in parts:
        out[int(bounds[b0]):int(bounds[b1])] = p
    return out


__all__ = ["DIAGONAL_PIECE", "GROUP_ENTRIES", "HOLD_BLOCKS", "HeldBlocks", "Operand", "OrderedSum", "ProductSpec", "SPLIT_ENTRIES", "blocks_fit",
           "check_products", "diagonal_positions", "group_product", "held_bytes", "hold_blocks", "product_in_process", "product_memory", "product_task",
           "read_block", "row_groups", "sparse_product", "task_memory"]
