"""Plan of the tile Householder QR (:mod:`blocklin.linalg.factor.qr_tiles`): tile side within the budget."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np

from blocklin.config import format_size
from blocklin.errors import BudgetError, ParameterError, explain
from blocklin.plan.factor import MAX_TILE_UPDATES, TILE_SIDES, FactorPlan

#: Tile-sized buffers of one tile task: the running top tile, the tile below it, the reflectors
#: ``V`` and ``T`` of the step, LAPACK's copies of both outputs, and the stores' encode buffers.
TILE_QR_BUFFERS = 8
#: Inner block size of LAPACK's ``geqrt``/``tpqrt`` (rows of the stored ``T``): larger blocks mean
#: larger GEMMs inside ``tpmqrt`` but more extra flops (Buttari et al. 2009, Sec. 4); 128 ran
#: ``tpmqrt`` on 1024 tiles at 14 GFLOP/s against 8 for 32 (2 cores, OpenBLAS).
INNER_BLOCK = 128
#: Smallest tile side the planner picks by itself.
MIN_TILE = 32


@dataclasses.dataclass(frozen=True)
class TileQRPlan(FactorPlan):
    """A :class:`~blocklin.plan.factor.FactorPlan` of the tile QR (``operation`` ``"qr-tiles"``).

    ``tile``: the square tile side; ``tiles``: tile columns; ``row_tiles``: tile rows; ``q_width``:
    columns of ``Q`` formed per task (``mode="reduced"``).
    """

    row_tiles: int = 1
    inner_block: int = INNER_BLOCK
    q_width: int = 0

    @property
    def bytes_written(self) -> int:
        """Estimated bytes the tile tasks write: about two tiles per task (the updated tiles and the
        reflectors' ``V`` and ``T``), then ``R`` (``n^2``); ``Q`` adds ``m n``."""
        return (2 * tile_tasks(self.m, self.n, self.tile) * self.tile**2 + self.n**2) * np.dtype(self.dtype).itemsize

    def _summary(self) -> str:
        nt, mt = self.tiles, self.row_tiles
        tasks = sum((nt - k) * (mt - k) for k in range(nt))
        return (f"qr of a {self.m} x {self.n} {self.dtype} matrix: tile Householder QR on {mt} x {nt} tiles of "
                f"{self.tile} ({tasks} tile tasks: geqrt/gemqrt on the diagonal tile row, tpqrt/tpmqrt below, "
                f"one at a time); peak {format_size(self.peak_memory)} of a {format_size(self.memory)} budget; "
                f"{self.flops / 1e9:.1f} GFLOP for R (as much again for Q), {format_size(self.bytes_read)} read")


def tile_qr_bytes(m: int, n: int, t: int, itemsize: int) -> int:
    """Peak bytes of one tile task (:data:`TILE_QR_BUFFERS` tiles of ``t x t``)."""
    return TILE_QR_BUFFERS * t * t * itemsize


def q_strip_width(m: int, t: int, itemsize: int, memory: int) -> int:
    """Columns of ``Q`` per task: two copies of the ``m``-row strip beside four tiles, at most ``t``,
    and a divisor of ``t`` (the strips are ``Q``'s chunks, each written by one task)."""
    room = memory - 4 * t * t * itemsize
    width = max(1, min(t, room // max(1, 2 * m * itemsize)))
    return next(w for w in range(width, 0, -1) if t % w == 0)


def tile_tasks(m: int, n: int, t: int) -> int:
    """Tile tasks of the tile QR of an ``m x n`` matrix with tiles of ``t``: ``sum_k (nt - k)(mt - k)``."""
    nt, mt = max(1, math.ceil(n / t)), max(1, math.ceil(m / t))
    return sum((nt - k) * (mt - k) for k in range(nt))


def _refuse_tiny_tiles(m: int, n: int, tile: int, tasks: int, memory: int) -> None:
    """A tile so small that the plan exceeds :data:`~blocklin.plan.factor.MAX_TILE_UPDATES` tasks:
    refused with the smallest tile side that stays within it (the count falls as the tile grows)."""
    lo, hi = tile, max(n, 1)
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if tile_tasks(m, n, mid) <= MAX_TILE_UPDATES else (mid + 1, hi)
    raise ParameterError(explain(
        "tile", f"a tile QR plans at most {MAX_TILE_UPDATES} tile tasks (smaller tiles spend the time on per-tile "
        "reads)", f"tile {tile} on a {m} x {n} matrix: {tasks} tasks", f"pass tile >= {lo} (--tile {lo}), or omit "
        "it for the planned tile"))


def plan_tile_qr(m: int, n: int, dtype: Any, *, memory: int, chunks: tuple[int, int] | None = None,
                 tile: int | None = None) -> TileQRPlan:
    """Tile side of the tile QR of an ``m x n`` matrix (``m >= n``): the largest of
    :data:`~blocklin.plan.factor.TILE_SIDES` (or ``A``'s square chunk) whose task fits ``memory``.

    ``flops``: those of ``R`` by Householder (``2 m n^2 - 2 n^3 / 3``; the tile algorithm adds about
    ``ib / t`` of it in its ``T`` updates); ``bytes_read``: about four tiles per tile task.
    """
    dt = np.dtype(dtype)

    def fits(t: int) -> bool:
        return tile_qr_bytes(m, n, t, dt.itemsize) <= memory

    if tile is None:
        side = max(n, 1)
        if chunks is not None and chunks[0] == chunks[1] and chunks[0] >= MIN_TILE and fits(min(chunks[0], side)):
            tile = chunks[0]
        else:
            tile = next((t for t in TILE_SIDES if t >= MIN_TILE and fits(min(t, side))), None)
        if tile is None:
            need = tile_qr_bytes(m, n, MIN_TILE, dt.itemsize)
            raise BudgetError(explain("memory", f"must hold {TILE_QR_BUFFERS} tiles of {MIN_TILE} x {MIN_TILE} for "
                                      "the tile QR", format_size(memory), f"raise it to at least {format_size(need)}"))
    tile = max(1, min(int(tile), max(n, 1)))
    nt, mt = max(1, math.ceil(n / tile)), max(1, math.ceil(m / tile))
    tasks = tile_tasks(m, n, tile)
    if tasks > MAX_TILE_UPDATES:
        _refuse_tiny_tiles(m, n, tile, tasks, memory)
    width = q_strip_width(m, tile, dt.itemsize, memory)
    peak = max(tile_qr_bytes(m, n, tile, dt.itemsize), 2 * m * width * dt.itemsize + 4 * tile * tile * dt.itemsize)
    return TileQRPlan(operation="qr-tiles", m=m, n=n, dtype=dt.name, tile=tile, tiles=nt, workers=1,
                      peak_memory=peak, memory=memory,
                      flops=2 * m * n * n - 2 * n**3 // 3, bytes_read=4 * tasks * tile * tile * dt.itemsize,
                      row_tiles=mt, inner_block=min(INNER_BLOCK, tile), q_width=width)


__all__ = ["INNER_BLOCK", "TILE_QR_BUFFERS", "TileQRPlan", "plan_tile_qr", "q_strip_width", "tile_qr_bytes", "tile_tasks"]
