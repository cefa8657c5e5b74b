"""Planning tiled factorizations and triangular solves (pure: shapes and budgets in, plans out)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import numpy as np

from blocklin.config import format_size
from blocklin.errors import BudgetError, ParameterError, explain
from blocklin.plan.chunks import chunk_io
from blocklin.plan.rates import Rates, expected_line
from blocklin.validate import size

#: Tile-sized buffers one factorization task holds: the accumulator, the two update operands, the
#: tile as read (before the cast), and zarr's chunk temporaries when the input chunks differ.
TILE_BUFFERS = 6
#: Tiles per side below which a tiled factorization does not widen its tiles past the chunk side.
MIN_TILES = 4
#: Tile sides tried, largest first (a tile task's BLAS calls are efficient from a few hundred up).
TILE_SIDES = (2048, 1024, 512, 256, 128, 64, 32)
#: Most tile updates one factorization may plan, the limit of one graph
#: (:data:`blocklin.runtime.graph.MAX_GRAPH_TASKS`). A tiled Cholesky or LU with ``t`` tiles per side
#: does about ``t^3 / 6`` tile updates, each reading whole tiles from storage, so tiny tiles (``--tile
#: 1`` on a 300 x 300 matrix: 4.5 million updates) would run for hours on per-chunk overheads.
MAX_TILE_UPDATES = 200_000


def _refuse_budget(memory: int, n: int, need: Callable[[int], int], io: Callable[[int], int],
                   holds: Callable[[int], str], side: str = "tile side", alternative: str = "") -> BudgetError:
    """The refusal of a ``memory`` that no tile side of :data:`TILE_SIDES` (at most ``n``) holds: it names
    the least budget of any side (``need``), what that side's task holds (``holds``) and, where the
    temporaries of decoding the input's chunks (``io``) count in it, those, with rechunking the input as a
    fix beside the larger budget (and ``alternative``)."""
    t = min((min(t, max(n, 1)) for t in TILE_SIDES), key=lambda t: (need(t), t))
    least, temporaries = need(t), io(t) > 0
    rule = (f"must hold {holds(t)}" + (" and the temporaries of the input's chunks, decoded whole" if temporaries
                                       else "") + f" (at the {side} that needs the least)")
    fixes = ([f"raise it to at least {format_size(least)}"]
             + (["rechunk the input smaller (blocklin convert --chunks)"] if temporaries else [])
             + ([alternative] if alternative else []))
    fix = fixes[0] if len(fixes) == 1 else ", ".join(fixes[:-1]) + ", or " + fixes[-1]
    return BudgetError(explain("memory", rule, format_size(memory), fix), minimum=least)


def tile_updates(tiles: int) -> int:
    """Tile updates of a tiled factorization with ``tiles`` tiles (or panels) per side: ``tiles^3 / 6``."""
    return tiles**3 // 6


def min_tile(n: int) -> int:
    """The smallest tile side whose factorization of an ``n x n`` matrix stays within :data:`MAX_TILE_UPDATES`."""
    t = max(1, int((6 * MAX_TILE_UPDATES) ** (1 / 3)))
    while tile_updates(t + 1) <= MAX_TILE_UPDATES:
        t += 1
    while t > 1 and tile_updates(t) > MAX_TILE_UPDATES:
        t -= 1
    return max(1, math.ceil(n / t))


def _check_tile(tile: Any, n: int) -> int | None:
    """An explicit ``tile=`` is a positive integer (one larger than the matrix means one tile)."""
    return size("tile", tile, fix="pass a positive tile side such as tile=256 (--tile 256), or omit it for the "
                "planned one")


def rect_updates(m: int, n: int, tile: int) -> int:
    """Tile updates of the LU of an ``m x n`` matrix with ``tile``-wide panels: ``tiles^3 / 6`` with the
    three sides' tile counts (the pivot columns ``min(m, n)``, the columns, the rows) for ``tiles^3``;
    :func:`tile_updates` for a square one."""
    k = min(m, n)
    return max(1, math.ceil(k / tile)) * max(1, math.ceil(n / tile)) * max(1, math.ceil(m / tile)) // 6


def min_rect_tile(m: int, n: int) -> int:
    """The smallest panel width whose LU of an ``m x n`` matrix stays within :data:`MAX_TILE_UPDATES`."""
    lo, hi = 1, max(1, m, n)
    while lo < hi:  # rect_updates falls as the tile grows
        mid = (lo + hi) // 2
        lo, hi = (mid + 1, hi) if rect_updates(m, n, mid) > MAX_TILE_UPDATES else (lo, mid)
    return lo


def _check_updates(operation: str, n: int, tile: int, planned: bool, memory: int, m: int | None = None) -> None:
    """Refuse a plan whose tiles are so small that it would do more than :data:`MAX_TILE_UPDATES` updates
    (``m``: the rows of a rectangular LU)."""
    nt = max(1, math.ceil(n / tile))
    rect = m is not None and m != n
    updates = rect_updates(m, n, tile) if rect else tile_updates(nt)
    if operation not in ("cholesky", "lu", "qr") or updates <= MAX_TILE_UPDATES:
        return
    least = min_rect_tile(m, n) if rect else min_tile(n)
    rule = (f"a {operation} plans at most {MAX_TILE_UPDATES} tile updates (tiles^3 / 6 for tiles per side; "
            "smaller tiles spend the time on per-tile reads)")
    actual = (f"tile {tile} on a {m} x {n} matrix: {updates} updates" if rect
              else f"tile {tile} on a {n} x {n} matrix: {nt} tiles per side, {tile_updates(nt)} updates")
    if planned:
        raise BudgetError(explain("memory", rule, actual + f" (the largest tile a {format_size(memory)} budget "
                                  "holds)", f"raise the memory budget (--memory / memory=) so that tiles of at least "
                                  f"{least} fit"))
    raise ParameterError(explain("tile", rule, actual, f"pass tile >= {least} (--tile {least}), or omit it for the "
                                 "planned tile"))


@dataclasses.dataclass(frozen=True)
class FactorPlan:
    """What a tiled factorization will do.

    Attributes
    ----------
    n : int
        Side of the matrix.
    tile : int
        Tile side (= the output's chunk side): each task reads and writes ``tile x tile`` blocks.
    tiles : int
        Tiles per side; the lower triangle holds ``tiles (tiles + 1) / 2`` tasks.
    workers : int
        Concurrent tile tasks.
    peak_memory : int
        Bytes the concurrent tasks hold at most.
    flops : int
        ``n^3 / 3`` for Cholesky.
    bytes_read : int
        Tile reads: each task reads its input tile and ``2 j`` factor tiles (``n^3 / (3 tile)`` elements in all).
    """

    operation: str
    n: int
    dtype: str
    tile: int
    tiles: int
    workers: int
    peak_memory: int
    memory: int
    flops: int
    bytes_read: int
    #: Rows, for the QR or the LU of an ``m x n`` matrix (``n`` is then its columns); None for square
    #: operations and a square LU.
    m: int | None = None

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @property
    def bytes_written(self) -> int:
        """Estimated bytes the tasks write (a property, not a field: plans and their resume tokens
        stay as they were): Cholesky and SYRK the lower triangle's tiles (``n (n + tile) / 2``
        elements); LU the panels into its work store, then the factor (``2 n^2``); the panel QR its
        work store and ``R`` (``m n + n^2``; ``Q`` adds ``m n``); the TSQR ``R`` (``n^2``)."""
        isz = np.dtype(self.dtype).itemsize
        m, n, t = self.m or self.n, self.n, min(self.tile or self.n, self.n)
        if self.operation == "lu":
            return 2 * m * n * isz
        if self.operation == "qr":
            return (m * n + n * n) * isz
        if self.operation == "tsqr":
            return n * n * isz
        if self.operation == "qr-wide":  # R (m x n) and Q (m x m)
            return (m * n + m * m) * isz
        return n * (n + t) // 2 * isz

    def expected(self, rates: Rates | None = None, device: str = "cpu") -> str:
        """The expected split of the run's time (:func:`~blocklin.plan.rates.expected_line`; ``rates``
        default :func:`~blocklin.plan.rates.load_rates`)."""
        return expected_line(self.bytes_read, self.bytes_written, self.flops, device, rates, dtype=self.dtype)

    def explain(self, rates: Rates | None = None, device: str = "cpu") -> str:
        """Two lines: the plan, and the expected split of its time on ``device`` (:meth:`expected`)."""
        return f"{self._summary()}\n  {self.expected(rates, device)}"

    def _summary(self) -> str:
        if self.operation == "tsqr":
            return (f"qr of a {self.m} x {self.n} {self.dtype} matrix: R alone fits in core "
                    f"({format_size(self.peak_memory)} of a {format_size(self.memory)} budget): one streaming TSQR "
                    f"pass over A ({format_size(self.bytes_read)} read), {self.flops / 1e9:.1f} GFLOP")
        if self.operation == "qr-wide":
            return (f"qr of a wide {self.m} x {self.n} {self.dtype} matrix: Householder QR of its leading "
                    f"{self.m} x {self.m} block in memory ({format_size(self.peak_memory)} of a "
                    f"{format_size(self.memory)} budget), then R_2 = Q^T A_2 by one GEMM pass; "
                    f"{self.flops / 1e9:.1f} GFLOP, {format_size(self.bytes_read)} read")
        if self.operation == "qr":
            return (f"qr of a {self.m} x {self.n} {self.dtype} matrix: {self.tiles} column panels of {self.tile} "
                    f"(one after another, Householder with compact WY block reflectors); peak "
                    f"{format_size(self.peak_memory)} of a {format_size(self.memory)} budget; "
                    f"{self.flops / 1e9:.1f} GFLOP for R (as much again for Q), {format_size(self.bytes_read)} read")
        if self.operation == "lu":
            m, n = self.m or self.n, self.n
            k = min(m, n)
            shape = ("" if m == n else f" (tall: L {m} x {n} unit lower trapezoidal, U {n} x {n})" if m > n
                     else f" (wide: L {m} x {m}, U {m} x {n} upper trapezoidal)")
            return (f"lu of a {m} x {n} {self.dtype} matrix{shape}: {self.tiles} column panels of {self.tile} "
                    f"(one after another, partial pivoting over all rows"
                    + (f"; the {self.tiles - math.ceil(k / self.tile)} right of column {k} updated only"
                       if math.ceil(k / self.tile) < self.tiles else "")
                    + f"); peak {format_size(self.peak_memory)} "
                    f"of a {format_size(self.memory)} budget; {self.flops / 1e9:.1f} GFLOP, "
                    f"{format_size(self.bytes_read)} read")
        return (f"{self.operation} of a {self.n} x {self.n} {self.dtype} matrix: {self.tiles} x {self.tiles} tiles "
                f"of {self.tile} ({self.tiles * (self.tiles + 1) // 2} tile tasks), {self.workers} at a time; "
                f"peak {format_size(self.peak_memory)} of a {format_size(self.memory)} budget; "
                f"{self.flops / 1e9:.1f} GFLOP, {format_size(self.bytes_read)} read")


def plan_factor(operation: str, n: int, dtype: Any, *, memory: int, workers: int = 1,
                chunks: tuple[int, int] | None = None, tile: int | None = None, widen: bool = False,
                decoded: tuple[int, int, int] | None = None) -> FactorPlan:
    """Tile side and concurrency of a tiled factorization of an ``n x n`` matrix within ``memory``.

    The input's square chunk side is kept when it fits (tiles then read whole chunks); with
    ``widen``, the largest multiple of it that fits the budget, up to the largest of
    :data:`TILE_SIDES`, while at least :data:`MIN_TILES` tiles remain per side (larger tiles mean
    fewer reads, ``n^3 / (3 tile)`` elements, and larger GEMMs: at n = 4096 with 512-chunks and a
    64 MiB budget, tiles of 1024 ran the Cholesky in 9-13 s against 18-19 s with 512). Otherwise the
    largest of :data:`TILE_SIDES` that fits ``workers`` tasks of :data:`TILE_BUFFERS` tiles and, for an
    input whose chunks are decoded whole (``decoded``), the temporaries of a tile read (:func:`~blocklin.plan.chunks.chunk_io`).
    """
    dt = np.dtype(dtype)
    per_tile = dt.itemsize
    planned = _check_tile(tile, n) is None

    def io(t: int) -> int:  # the temporaries of the input's chunks a tile read decodes, beyond its buffers
        return chunk_io(t, t, decoded, (n, n), 2 * t * t * per_tile)

    def task(t: int) -> int:
        return TILE_BUFFERS * t * t * per_tile + io(t)

    def fits(t: int, w: int) -> bool:
        return w * task(t) <= memory

    if tile is None:
        if chunks is not None and chunks[0] == chunks[1] and 32 <= chunks[0] and fits(min(chunks[0], n), workers):
            c = chunks[0]
            tile = c
            while widen and tile + c <= TILE_SIDES[0] and n >= MIN_TILES * (tile + c) and fits(tile + c, workers):
                tile += c
        else:
            tile = next((t for t in TILE_SIDES if fits(min(t, max(n, 1)), workers)), None)
        if tile is None:
            raise _refuse_budget(memory, n, lambda t: workers * task(t), io,
                                 lambda t: f"{workers} task(s) of {TILE_BUFFERS} tiles of {t} x {t}")
    tile = max(1, min(int(tile), max(n, 1)))
    _check_updates(operation, n, tile, planned, memory)
    # as many of the asked workers as the budget holds (a division: workers may be huge)
    workers = max(1, min(int(workers), memory // max(1, task(tile))))
    nt = max(1, math.ceil(n / tile))
    reads = (n**3 / (3 * tile) + n * n / 2) * dt.itemsize
    return FactorPlan(operation=operation, n=n, dtype=dt.name, tile=tile, tiles=nt, workers=workers,
                      peak_memory=workers * task(tile), memory=memory,
                      flops=n**3 // 3, bytes_read=int(reads))


#: Rows of the blocks in which an LU panel task streams the earlier panels (at least the panel width).
LU_STREAM_ROWS = 512
#: Widest sub-panel of an LU panel's own factorization (:func:`~blocklin.linalg.factor.lu_panels.factor_panel`).
LU_SUBPANEL = 256


def lu_subpanel(width: int) -> int:
    """Columns of the sub-panels in which an LU panel of ``width`` columns is factored: a quarter of
    the panel (at least 32, at most :data:`LU_SUBPANEL`); the sub-panel's column-major copy is the only
    panel-high buffer besides the panel."""
    width = max(1, int(width))
    return min(width, max(32, min(LU_SUBPANEL, width // 4)))


def lu_stream_rows(width: int, n: int) -> int:
    """Rows of one streamed block of an earlier panel of an ``n``-row LU: a multiple of the panel
    width (whole chunks of the work store), about :data:`LU_STREAM_ROWS` so that each update GEMM
    is large, and no more than the panel's rows."""
    width = max(1, int(width))
    return width * max(1, min(LU_STREAM_ROWS // width, -(-int(n) // width)))


def lu_panel_bytes(n: int, width: int, itemsize: int, source_itemsize: int | None = None) -> int:
    """Bytes one LU panel task holds: the ``n x width`` panel and the buffers of its two phases.

    Updates by the earlier panels: two streamed blocks of an earlier panel (one in use, one read
    ahead), the ``U`` block and the rows a panel's swaps move (``2 width``), and, when the input has
    another dtype (``source_itemsize``: mixed precision), a row block of it read before the cast.
    The panel's own factorization (:func:`~blocklin.linalg.factor.lu_panels.factor_panel`): the
    column-major copy of one sub-panel (``n x lu_subpanel(width)``) and, with several sub-panels,
    the rows its swaps move and the temporary of one row block (``width`` rows) of the update GEMM.
    Reading the panel (before the updates) maps at most one streamed block's bytes of the input's
    chunk rows at a time (:func:`~blocklin.linalg.factor.lu_panels.panel_read_rows`), within the updates'
    allowance.
    """
    n = max(n, 1)
    rows = lu_stream_rows(width, n)
    sub = lu_subpanel(width)
    cast = rows * width * source_itemsize if source_itemsize not in (None, itemsize) else 0
    updates = (2 * rows * width + 3 * width * width) * itemsize + cast
    own = (n * sub + (2 * sub * width + width * width if sub < width else 0)) * itemsize
    # the sum, not the larger of the two phases: the sweep (benchmarks/budgets.py) measured up to
    # 2 MiB more than the larger phase's buffers at 8 MiB (chunk reads, allocator pages), which the
    # other phase's allowance covers
    return n * width * itemsize + updates + own


def lu_rhs_fits(n: int, width: int, k: int, itemsize: int, source_itemsize: int | None = None) -> bool:
    """Whether an LU panel task of :func:`lu_panel_bytes` can also run the forward substitution of
    ``k`` right-hand sides (:func:`~blocklin.linalg.factor.lu_panels.lu_panels` with ``rhs``).

    That step runs after the panel is factored, when the buffers of the updates and of the panel's own
    factorization are free: it holds the ``n x k`` right-hand sides three times over at most (the
    array, and the bytes it is saved from or loaded from for the next panel, with their copy), and,
    for the first panel, their rows as read before a cast (``source_itemsize``), the rows the panel's
    swaps move (``2 width``) and the triangular solve's copy of ``width`` rows; these must fit in
    the freed buffers.
    """
    n, width = max(n, 1), max(1, min(int(width), max(n, 1)))
    src = source_itemsize if source_itemsize not in (None, itemsize) else 0
    need = n * k * (3 * itemsize + src) + 3 * width * k * itemsize
    return need <= lu_panel_bytes(n, width, itemsize, source_itemsize) - n * width * itemsize


def lu_flops(m: int, n: int) -> int:
    """Flops of the LU of an ``m x n`` matrix: ``2 m n k - (m + n) k^2 + 2 k^3 / 3`` with ``k = min(m, n)``
    (each pivot column ``i`` scales ``m - i`` entries and updates ``(m - i) (n - i)``; ``2 n^3 / 3``
    when square, LAPACK's ``m n^2 - n^3 / 3`` for ``m >= n``)."""
    k = min(m, n)
    return (6 * m * n * k - 3 * (m + n) * k * k + 2 * k**3) // 3


def plan_lu(n: int, dtype: Any, *, memory: int, chunks: tuple[int, int] | None = None,
            tile: int | None = None, source_dtype: Any = None, m: int | None = None,
            decoded: tuple[int, int, int] | None = None) -> FactorPlan:
    """Panel width of the left-looking LU of an ``m x n`` matrix (``m``: the rows, default ``n``): as
    wide as :func:`lu_panel_bytes` of ``m`` rows allows in the budget (``source_dtype``: the input's,
    when the factorization computes in another ``dtype``).

    Wide panels mean fewer passes over the earlier panels (``m k^2 / (2 width) + m k (n - k) / width``
    elements read, ``k = min(m, n)``; ``n^3 / (2 width)`` square) and larger update GEMMs; the width is
    a multiple of the input's square chunk side when that fits (panels read whole chunks), else the
    largest of :data:`TILE_SIDES` that fits. Panels run one after another (each needs the previous
    one's pivots), BLAS on every core. A wide matrix's panels right of column ``m`` have no pivots:
    the earlier panels update them, and that is all; its planned panels are no wider than ``m``
    rounded up to the chunk side (or to 32), since a panel's own factorization runs on one BLAS
    thread and the columns right of ``m`` are better left to the later panels' updates (``640 x
    6144`` in 128-chunks with 256 MiB, loaded 2-core machine: 1.01 s in panels of 2176, 0.30-0.44 s
    in panels of 640; the earlier panels a later one reads are ``m x m`` in all).
    """
    dt = np.dtype(dtype)
    src = np.dtype(source_dtype or dt).itemsize
    rows = n if m is None else m
    planned = _check_tile(tile, n) is None

    def io(t: int) -> int:  # the temporaries of the input's chunks read by blocks, beyond the blocks
        t = min(t, max(n, 1))
        return chunk_io(lu_stream_rows(t, rows), t, decoded, (rows, n), 2 * lu_stream_rows(t, rows) * t * src)

    def task(t: int) -> int:  # the panel's buffers, and those temporaries
        return lu_panel_bytes(rows, min(t, max(n, 1)), dt.itemsize, src) + io(t)

    def fits(t: int) -> bool:
        return task(t) <= memory

    if tile is None:
        if chunks is not None and chunks[0] == chunks[1] and chunks[0] >= 32 and fits(chunks[0]):
            c = chunks[0]
            tile = c
            while tile < min(n, rows) and fits(tile + c):
                tile += c
        else:
            tile = next((t for t in TILE_SIDES if fits(t)), None)
            if tile is not None and rows < n:  # a wide matrix: panels no wider than m (see above)
                tile = min(tile, max(32, -(-rows // 32) * 32))
        if tile is None:
            raise _refuse_budget(memory, n, task, io, lambda t: f"a column panel of {rows} x {t} and its buffers "
                                 "for the LU", side="panel width")
    tile = max(1, min(int(tile), max(n, 1)))
    _check_updates("lu", n, tile, planned, memory, m=rows)
    nt = max(1, math.ceil(n / tile))
    if rows == n:
        reads = (n**3 / (2 * tile) + 2 * n * n) * dt.itemsize
    else:  # every earlier panel with pivots read whole (m rows) by each later panel, then A and the L rows
        k = min(rows, n)
        reads = (rows * (k * k / 2 + k * (n - k)) / tile + 2 * rows * n) * dt.itemsize
    return FactorPlan(operation="lu", n=n, dtype=dt.name, tile=tile, tiles=nt, workers=1,
                      peak_memory=task(tile), memory=memory,
                      flops=lu_flops(rows, n), bytes_read=int(reads), m=None if rows == n else rows)


#: Panel-sized buffers of one Householder QR panel task: the panel, an earlier panel as read and as
#: ``V``, the update ``V (T W)``, and LAPACK's copy of the trailing panel.
QR_PANEL_BUFFERS = 6


def plan_qr(m: int, n: int, dtype: Any, *, memory: int, chunks: tuple[int, int] | None = None,
            tile: int | None = None, decoded: tuple[int, int, int] | None = None) -> FactorPlan:
    """Panel width of the left-looking Householder QR of an ``m x n`` matrix (``m >= n``):
    :data:`QR_PANEL_BUFFERS` panels of ``m x width`` in the budget. ``flops``: those of ``R``
    (``2 m n^2 - 2 n^3 / 3``); forming ``Q`` costs as much again."""
    dt = np.dtype(dtype)
    planned = _check_tile(tile, n) is None

    def io(t: int) -> int:  # the temporaries of the input's chunks a panel read decodes, beyond the panels
        return chunk_io(max(m, 1), t, decoded, (m, n), 2 * max(m, 1) * t * dt.itemsize)

    def task(t: int) -> int:  # the panels, and those temporaries
        return QR_PANEL_BUFFERS * max(m, 1) * t * dt.itemsize + io(t)

    def fits(t: int) -> bool:
        return task(t) <= memory

    if tile is None:
        if chunks is not None and chunks[0] == chunks[1] and chunks[0] >= 32 and fits(min(chunks[0], max(n, 1))):
            tile = chunks[0]
        else:
            tile = next((t for t in TILE_SIDES if fits(min(t, max(n, 1)))), None)
        if tile is None:
            raise _refuse_budget(memory, n, task, io, lambda t: f"{QR_PANEL_BUFFERS} column panels of {m} x {t} for "
                                 "the tiled QR", side="panel width",
                                 alternative="for R alone of a tall matrix, use method='tsqr'")
    tile = max(1, min(int(tile), max(n, 1)))
    _check_updates("qr", n, tile, planned, memory)
    nt = max(1, math.ceil(n / tile))
    return FactorPlan(operation="qr", m=m, n=n, dtype=dt.name, tile=tile, tiles=nt, workers=1,
                      peak_memory=task(tile), memory=memory,
                      flops=2 * m * n * n - 2 * n**3 // 3, bytes_read=int((m * n * n / (2 * tile) + 2 * m * n)
                                                                          * dt.itemsize))
