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
from blocklin.errors import BudgetError
from blocklin.plan.chunks import auto_chunks
from blocklin.plan.factor import TILE_BUFFERS, plan_factor
from blocklin.plan.passes import PassMemory, plan_pass

#: Strips shorter than this make the SYRK call overhead dominate: the pass route is refused below it.
MIN_GRAM_ROWS = 64
#: Streamed bytes per strip beyond which larger strips only cost memory.
MAX_GRAM_STRIP_BYTES = 64 * 2**20


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

    def explain(self) -> str:
        how = (f"one row pass over {'the columns of ' if self.trans else ''}A, {self.workers} task(s) each "
               f"accumulating the {self.s} x {self.s} SYRK sum" if self.route == "pass" else
               f"region SYRK in {self.tile} x {self.tile} tiles (the result exceeds the budget), "
               f"A read about {self.reads:.0f} times")
        return (f"gram {self.product}: {self.s} x {self.s} {self.dtype} from {self.k} {'columns' if self.trans else 'rows'}"
                f"; {how}; read {format_size(self.bytes_read)}, write {format_size(self.bytes_written)}, "
                f"{self.flops / 1e9:.3g} GFLOP, peak {format_size(self.peak_memory)} of {format_size(self.memory)}")


def gram_pass_memory(s: int, dtype: Any, *, cast: bool, gpu: bool) -> PassMemory:
    """One task of the Gram pass: the ``s x s`` accumulator (and its device copy on a GPU) and, when the
    strip is cast or transposed, a copy of each strip row."""
    isz = np.dtype(dtype).itemsize
    return PassMemory(fixed=s * s * isz * (2 if gpu else 1), per_row=s * isz if cast else 0, chunk_temporaries=True,
                      max_strip_bytes=MAX_GRAM_STRIP_BYTES, min_rows=MIN_GRAM_ROWS)


def gram_out_chunks(s: int, dtype: Any) -> tuple[int, int]:
    """Square chunks for the result (what a solve or an eigensolver reads next)."""
    c = min(auto_chunks((s, s), dtype))
    return (c, c)


def plan_gram(shape: tuple[int, int], dtype: Any, *, chunks: tuple[int, int], memory: int, trans: bool = False,
              source_dtype: Any = None, workers: int = 1, cores: int = 1, gpu: bool = False) -> GramPlan:
    """The pass route when ``workers`` (or fewer) accumulators and the float64 reduction fit ``memory``,
    else the tiled route (:func:`~blocklin.plan.factor.plan_factor` tiles)."""
    m, n = (int(x) for x in shape)
    dt, src = np.dtype(dtype), np.dtype(source_dtype or dtype)
    s, k = (m, n) if trans else (n, m)
    common = dict(s=s, k=k, trans=bool(trans), dtype=dt.name, bytes_written=s * s * dt.itemsize, flops=s * s * k,
                  memory=int(memory))
    nbytes = m * n * src.itemsize
    try:
        return _plan_pass(common, s, k, dt, src, chunks, memory, trans, workers, cores, gpu, nbytes)
    except BudgetError:
        pass
    try:
        fp = plan_factor("syrk", s, dt, memory=memory, workers=workers)
    except BudgetError:  # fewer concurrent tiles before refusing (the error then names one task's minimum)
        fp = plan_factor("syrk", s, dt, memory=memory, workers=1)
    return GramPlan(**common, route="tiles", out_chunks=(fp.tile, fp.tile), reads=fp.tiles + 1.0,
                    bytes_read=int(nbytes * (fp.tiles + 1)),
                    peak_memory=fp.workers * TILE_BUFFERS * fp.tile**2 * dt.itemsize, tile=fp.tile, workers=fp.workers)


def _plan_pass(common: dict, s: int, k: int, dt: np.dtype, src: np.dtype, chunks: tuple[int, int], memory: int,
               trans: bool, workers: int, cores: int, gpu: bool, nbytes: int) -> GramPlan:
    oc = gram_out_chunks(s, dt)
    reduce_bytes = s * s * 8 + oc[0] * s * (8 + dt.itemsize)  # the float64 sum and one row strip being written
    mem = gram_pass_memory(s, dt, cast=src != dt or trans, gpu=gpu)
    chunk_rows, chunk_w = (chunks[1], chunks[0]) if trans else chunks
    for w in range(max(1, workers), 0, -1):
        try:
            pp = plan_pass(mem, k, s * src.itemsize, chunk_rows=chunk_rows, memory=memory, reserve=reduce_bytes,
                           workers=w, cores=cores, chunk_bytes=chunks[0] * chunks[1] * src.itemsize,
                           chunks_across=math.ceil(s / max(1, chunk_w)), min_tasks=w)
            break
        except BudgetError:
            if w == 1:
                raise
    return GramPlan(**common, route="pass", out_chunks=oc, reads=1.0, bytes_read=nbytes,
                    peak_memory=pp.peak_memory + reduce_bytes, pass_plan=pp.to_dict(), workers=pp.workers)


__all__ = ["GramPlan", "gram_out_chunks", "gram_pass_memory", "plan_gram"]
