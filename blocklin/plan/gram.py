"""Planning a Gram matrix ``A^T A`` (or ``A A^T``): one row pass when the result fits, else stored tiles.

Pure arithmetic on shapes, dtypes, chunks and the budget (no I/O); :func:`blocklin.gram` runs the
plan and ``blocklin info`` uses it for its estimate of the product a user computes from a matrix.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np

from blocklin.config import format_size
from blocklin.errors import BudgetError, explain
from blocklin.plan.chunks import auto_chunks, chunk_io
from blocklin.plan.factor import TILE_SIDES, plan_factor
from blocklin.plan.passes import PassMemory, plan_pass
from blocklin.plan.rates import Rates, expected_line

#: Strips shorter than this make the SYRK call overhead dominate: the pass route is refused below it.
MIN_GRAM_ROWS = 64
#: Streamed bytes per strip beyond which larger strips only cost memory.
MAX_GRAM_STRIP_BYTES = 64 * 2**20
#: Largest share of the budget that :data:`~blocklin.plan.passes.PASS_WORKERS` tasks' Gram sums may take
#: for a Gram pass to split into that many tasks (:func:`gram_tasks`).
GRAM_SPLIT_SHARE = 1 / 8


@dataclasses.dataclass(frozen=True)
class GramPlan:
    """How an ``s x s`` Gram matrix is computed from ``A`` (``k`` the summed dimension).

    ``route`` is ``"pass"`` (one row pass, in-core accumulators) or ``"tiles"`` (region SYRK over
    stored tiles); ``pass_plan`` or ``tile`` describe it; ``reads`` is how often ``A`` is read.
    """

    s: int
    k: int
    trans: bool
    dtype: str
    route: str
    out_chunks: tuple[int, int]
    reads: float
    bytes_read: int
    bytes_written: int
    flops: int
    peak_memory: int
    memory: int
    pass_plan: dict | None = None
    tile: int | None = None
    workers: int = 1

    @property
    def product(self) -> str:
        return "A A^T" if self.trans else "A^T A"

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def explain(self, rates: Rates | None = None, device: str = "cpu") -> str:
        """One line of the route, read, written and flops, and one of the expected split of its time on
        ``device`` (``rates``: default :func:`~blocklin.plan.rates.load_rates`)."""
        how = (f"one row pass over {'the columns of ' if self.trans else ''}A, {self.workers} task(s) each "
               f"accumulating the {self.s} x {self.s} SYRK sum" if self.route == "pass" else
               f"region SYRK in square blocks of {self.tile} x {self.tile} tiles (the result exceeds the "
               "budget), "
               f"A read about {self.reads:.0f} times")
        return (f"gram {self.product}: {self.s} x {self.s} {self.dtype} from {self.k} {'columns' if self.trans else 'rows'}"
                f"; {how}; read {format_size(self.bytes_read)}, write {format_size(self.bytes_written)}, "
                f"{self.flops / 1e9:.3g} GFLOP, peak {format_size(self.peak_memory)} of {format_size(self.memory)}"
                "\n  " + expected_line(self.bytes_read, self.bytes_written, self.flops, device, rates, dtype=self.dtype))


@dataclasses.dataclass(frozen=True)
class SyrkBlocks:
    """How the region SYRK covers an ``s x s`` result: square output blocks of ``block`` (a multiple of
    the store's chunk ``tile``), each accumulated in core over ``rows``-row slices of the summed
    dimension ``k``; ``A`` is read about ``reads`` times, ``tasks`` blocks run ``workers`` at a time."""

    block: int
    rows: int
    tile: int
    blocks: int
    tasks: int
    workers: int
    reads: float
    peak_memory: int


def syrk_block_memory(block: int, rows: int, tile: int, dtype: Any, source_dtype: Any = None) -> int:
    """One block task: the ``block^2`` accumulator, two ``rows x block`` slices of ``A`` (as stored and, when
    cast, in the compute dtype), and three ``tile^2`` chunks being written (symmetrized, mirrored)."""
    d, s = np.dtype(dtype).itemsize, np.dtype(source_dtype or dtype).itemsize
    per_slice = rows * block * (s + (d if np.dtype(source_dtype or dtype) != np.dtype(dtype) else 0))
    return block * block * d + 2 * per_slice + 3 * tile * tile * d


def plan_syrk_blocks(s: int, k: int, dtype: Any, *, memory: int, tile: int, source_dtype: Any = None,
                     workers: int = 1, k_chunk: int | None = None, decoded: tuple[int, int, int] | None = None,
                     trans: bool = False) -> SyrkBlocks:
    """The largest output block (a multiple of ``tile``) whose task fits ``memory``, and the slices
    streamed into it (a quarter of the block's side, at least 64 rows; whole chunks of ``A`` along
    ``k`` when they are ``k_chunk`` long and a slice holds one).

    The block does not depend on ``workers`` (the sums, hence the bits, stay the same on every
    scheduler); only as many blocks run at once as fit the budget side by side. ``A`` is read
    ``blocks`` times for the ``blocks (blocks + 1) / 2`` lower blocks (a diagonal block reads its
    slices once, an off-diagonal one two slices): larger blocks, fewer reads (Dongarra et al. 1990
    for SYRK; the blocking is the usual out-of-core one, each output block read and written once).
    ``decoded``: the chunks of ``A`` (as stored: ``k x s``, or ``s x k`` with ``trans``) that zarr decodes
    whole; the temporaries of the chunks a slice read touches are counted (:func:`~blocklin.plan.chunks.chunk_io`:
    whole-column zstd chunks of 8 MiB had peaked at 88 MiB at a 48 MiB budget, planned 36).
    """
    tile = max(1, min(int(tile), max(s, 1)))
    n_tiles = max(1, math.ceil(s / tile))
    shape = (s, k) if trans else (k, s)
    src_isz = np.dtype(source_dtype or dtype).itemsize

    def task_memory(block: int, rows: int) -> int:
        read = (block, rows) if trans else (rows, block)  # one slice as stored
        return (syrk_block_memory(block, rows, tile, dtype, source_dtype)
                + chunk_io(*read, decoded, shape, kept=2 * rows * block * src_isz))

    best = None
    for mult in range(n_tiles, 0, -1):
        block = min(mult * tile, s) if mult < n_tiles else s
        rows = max(1, min(k, max(64, block // 4)))
        if k_chunk and rows >= k_chunk and rows < k:
            rows -= rows % k_chunk
        # chunks decoded whole: slices of whole chunks along k first, each chunk decoded once a read
        # (4096-row chunks read by 64-row slices had been decoded 64 times each)
        tries = ([min(k, k_chunk)] if decoded and k_chunk and k_chunk > rows else []) + [rows]
        fit = next(((r, need) for r in tries if (need := task_memory(block, r)) <= memory), None)
        if fit is not None:
            best = (block, *fit)
            break
    if best is None:
        block = min(tile, s)
        for rows in (max(1, min(k, r)) for r in (64, 32, 16, 8, 1)):
            need = task_memory(block, rows)
            if need <= memory:
                best = (block, rows, need)
                break
    if best is None:
        need = min(task_memory(min(tile, s), max(1, min(k, r))) for r in (64, 1))
        raise BudgetError(explain("memory", f"must hold one SYRK block of {min(tile, s)} x {min(tile, s)}"
                                  + (" and the temporaries of A's chunks, decoded whole" if decoded else ""),
                                  format_size(memory), f"raise it to at least {format_size(need)}"
                                  + (", or rechunk A smaller (blocklin convert --chunks)" if decoded else "")),
                          minimum=need)
    block, rows, need = best
    nb = max(1, math.ceil(s / block))
    tasks = nb * (nb + 1) // 2
    w = max(1, min(int(workers), tasks, memory // max(1, need)))
    return SyrkBlocks(block=block, rows=rows, tile=tile, blocks=nb, tasks=tasks, workers=w, reads=float(nb),
                      peak_memory=w * need)


def gram_pass_memory(s: int, dtype: Any, *, cast: bool, gpu: bool) -> PassMemory:
    """One task of the Gram pass: the ``s x s`` accumulator (and its device copy on a GPU) and, when the
    strip is cast or transposed, a copy of each strip row."""
    isz = np.dtype(dtype).itemsize
    return PassMemory(fixed=s * s * isz * (2 if gpu else 1), per_row=s * isz if cast else 0, chunk_temporaries=True,
                      max_strip_bytes=MAX_GRAM_STRIP_BYTES, min_rows=MIN_GRAM_ROWS, write_row_bytes=0)


def gram_tasks(s: int, dtype: Any, memory: int, *, gpu: bool) -> int:
    """Tasks at once of a Gram pass into an ``s x s`` sum when the caller sets none: on the CPU
    :data:`~blocklin.plan.passes.PASS_WORKERS`, each summing its rows on one core, where their float64
    (complex128) sums take at most :data:`GRAM_SPLIT_SHARE` of the budget; else one, with every core.

    A SYRK into a narrow sum hardly threads: 1 GiB of 64-column float32 rows took 0.61 s on one BLAS
    thread, 0.62 s on two, 0.32 s as two one-thread tasks, and at 512 columns 2.92, 1.79 and 1.54 s
    (here, the products without the GIL: :mod:`blocklin.device.host_blas`). A GPU pass keeps one task.
    A function of the shape and the budget only (the task split fixes the sums' order)."""
    from blocklin.plan.passes import PASS_WORKERS

    wide = 16 if np.dtype(dtype).kind == "c" else 8
    return PASS_WORKERS if not gpu and PASS_WORKERS * s * s * wide <= memory * GRAM_SPLIT_SHARE else 1


def gram_out_chunks(s: int, dtype: Any) -> tuple[int, int]:
    """Square chunks for the result (what a solve or an eigensolver reads next)."""
    c = min(auto_chunks((s, s), dtype))
    return (c, c)


def plan_gram(shape: tuple[int, int], dtype: Any, *, chunks: tuple[int, int], memory: int, trans: bool = False,
              source_dtype: Any = None, workers: int = 1, cores: int = 1, gpu: bool = False,
              tasks: int | None = None, decoded: tuple[int, int, int] | None = None) -> GramPlan:
    """The pass route when ``workers`` (or fewer) accumulators and the float64 reduction fit ``memory``,
    else the tiled route (:func:`~blocklin.plan.factor.plan_factor` tiles).

    ``tasks``: the pass's task split (:func:`gram_tasks`), fixed whatever ``workers`` runs at once (the
    sums of finished tasks are held beside the running ones, and counted), or one task where that does
    not fit; ``None``: as many tasks as run at once."""
    m, n = (int(x) for x in shape)
    dt, src = np.dtype(dtype), np.dtype(source_dtype or dtype)
    s, k = (m, n) if trans else (n, m)
    common = dict(s=s, k=k, trans=bool(trans), dtype=dt.name, bytes_written=s * s * dt.itemsize, flops=s * s * k,
                  memory=int(memory))
    nbytes = m * n * src.itemsize
    if s == 0 or k == 0:  # an empty A: a 0 x 0 result, or s x s zeros written without reading A
        return GramPlan(**common, route="pass", out_chunks=gram_out_chunks(max(s, 1), dt), reads=0.0, bytes_read=0,
                        peak_memory=min(s, gram_out_chunks(max(s, 1), dt)[0]) * s * dt.itemsize)
    for split in ([tasks, 1] if tasks and tasks > 1 else [tasks]):
        try:
            return _plan_pass(common, s, k, dt, src, chunks, memory, trans, workers, cores, gpu, nbytes, split,
                              decoded)
        except BudgetError:
            pass
    try:
        fp = plan_factor("syrk", s, dt, memory=memory, workers=workers)
    except BudgetError:  # fewer concurrent tiles before refusing (the error then names one task's minimum)
        fp = plan_factor("syrk", s, dt, memory=memory, workers=1)
    # smaller tiles where A's chunks, decoded whole, leave the factor's tile no room (fewer chunks a slice touches)
    for tile in [fp.tile] + [t for t in TILE_SIDES if t < fp.tile]:
        try:
            sb = plan_syrk_blocks(s, k, dt, memory=memory, tile=tile, source_dtype=src, workers=workers,
                                  k_chunk=chunks[1] if trans else chunks[0], decoded=decoded, trans=trans)
            break
        except BudgetError as err:
            refusal = err
    else:
        raise refusal
    return GramPlan(**common, route="tiles", out_chunks=(tile, tile), reads=sb.reads,
                    bytes_read=int(nbytes * sb.reads), peak_memory=sb.peak_memory, tile=tile, workers=sb.workers)


def _plan_pass(common: dict, s: int, k: int, dt: np.dtype, src: np.dtype, chunks: tuple[int, int], memory: int,
               trans: bool, workers: int, cores: int, gpu: bool, nbytes: int, tasks: int | None,
               decoded: tuple[int, int, int] | None = None) -> GramPlan:
    oc = gram_out_chunks(s, dt)
    # A's chunks decoded whole, in the streamed orientation: their temporaries counted as the row passes
    # count them (plan_pass), the plan the pass then runs
    streamed = (decoded[1], decoded[0], decoded[2]) if decoded is not None and trans else decoded
    wide = 16 if dt.kind == "c" else 8  # the reduction's float64 (complex128 for complex data) entries
    reduce_bytes = s * s * wide + oc[0] * s * (wide + dt.itemsize)  # the sum and one row strip being written
    mem = gram_pass_memory(s, dt, cast=src != dt or trans, gpu=gpu)
    chunk_rows, chunk_w = (chunks[1], chunks[0]) if trans else chunks
    most = max(1, min(workers, tasks) if tasks else workers)
    for w in range(most, 0, -1):
        t = tasks or w
        held = (t - w) * s * s * wide  # the sums of tasks finished while others still run
        try:
            pp = plan_pass(mem, k, s * src.itemsize, chunk_rows=chunk_rows, memory=memory, reserve=reduce_bytes + held,
                           workers=w, cores=cores, chunk_bytes=chunks[0] * chunks[1] * src.itemsize,
                           chunks_across=math.ceil(s / max(1, chunk_w)), min_tasks=t, decoded=streamed,
                           decoded_width=s)
            break
        except BudgetError:
            if w == 1:
                raise
    return GramPlan(**common, route="pass", out_chunks=oc, reads=1.0, bytes_read=nbytes,
                    peak_memory=pp.peak_memory + reduce_bytes + held, pass_plan=pp.to_dict(), workers=pp.workers)


__all__ = ["GramPlan", "SyrkBlocks", "gram_out_chunks", "gram_pass_memory", "gram_tasks", "plan_gram", "plan_syrk_blocks",
           "syrk_block_memory"]
