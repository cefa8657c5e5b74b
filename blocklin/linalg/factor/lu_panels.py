"""LU with partial pivoting over whole column panels of a stored matrix: the panel tasks, the row
swaps and the triangular solves with the packed factors.

Left-looking: panel ``j`` is read once, brought up to date by every earlier panel (their row swaps,
a TRSM and GEMMs streamed in row blocks) and its trailing part factored by a blocked ``getrf``
whose pivots range over all remaining rows (:func:`factor_panel`; Anderson and Dongarra, "Evaluating
block algorithm variants in LAPACK", 1990), so the pivot order is that of ``getrf`` on the whole
matrix. Each panel is one task of a :class:`~blocklin.runtime.blockops.BlockOps` graph, its swaps
and statistics recorded beside the resume markers. The drivers are
:mod:`blocklin.linalg.factor.lu`, the inverse and the square solve.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np

from blocklin._memory import release_free_memory
from blocklin.device import get_device, pool
from blocklin.device.base import PANEL_GETRF_THREADS, getrf_in_range
from blocklin.errors import InternalError, ShapeError, SingularMatrixError, explain
from blocklin.runtime.blockops import (BlockOps, Region, TileOpSpec, done_marker, holds_device, load_record,
                                       mark_finished, save_record, skip_done, sum_squares, tile_count)
from blocklin.runtime.tiles import check_finite, open_array, with_task_settings
from blocklin.storage.backend import backend
from blocklin.storage.zarr_store import read_block, write_block


def lu_panels(ops: BlockOps, a: Region, work: Any, *, dtype: Any, done_dir: Any, check: bool = True, out: Any = None,
              rhs: Region | None = None, rhs_out: Region | None = None, trim: bool = False, split: int = 0,
              description: str = "LU panels") -> list[dict]:
    """Left-looking LU with partial pivoting over whole column panels (one task per panel).

    ``a`` is ``m x n``, of any shape: panel ``j`` (columns ``J``, all ``m`` rows) is read, the row swaps of the panels before it are
    applied, it is updated by every earlier panel (``U_kJ = L_kk^-1 P_kJ`` by TRSM,
    ``P_{>k,J} -= L_{>k,k} U_kJ`` by GEMM), and its trailing part is factored by LAPACK ``getrf``
    with partial pivoting over all its rows: the pivot choice of ``getrf`` on the whole matrix.
    Panels (of a wide ``a``) right of column ``m`` have no rows left to pivot: the updates make
    them rows of ``U``. The pivots are ``min(m, n)`` in all (``lu-piv-J.npy``, empty for such panels).
    The panel is written once to the store ``work`` (its ``L`` rows in the order of its own
    swaps; :func:`lu_finish` applies the later swaps) and its swaps to ``done_dir``, so a rerun
    (``resume``) skips finished panels. Panels form one chain of tasks. With ``out`` (the packed
    result, finished by :func:`lu_finish`), the rows no later swap moves (``U`` and the
    diagonal block) go straight there and only the ``L`` rows from the diagonal block down to
    ``work``.

    With ``rhs`` (``n x k``, ``k`` small: see :func:`~blocklin.plan.factor.lu_rhs_fits`) the
    forward substitution ``Y = L^-1 P B`` runs inside the panels, as Gaussian elimination on the
    augmented matrix ``[A | B]`` does: once panel ``j`` is factored, its swaps are applied to
    ``B`` (in the row order of the panels before it) and ``B`` is eliminated with panel ``j``'s
    ``L`` while the panel is still in memory, so no pass reads ``L`` back for the first solve.
    ``B`` goes from panel to panel through ``done_dir`` (``lu-rhs-J.npy``: a rerun continues from
    the last finished panel); the last panel writes ``Y`` to ``rhs_out``, which
    :func:`lu_solve` with ``forward=False`` finishes by the back substitution. ``split``: the columns
    of ``B`` from there on are eliminated by calls of their own (:func:`rhs_parts`).

    ``trim``: each panel task first returns the allocator's free pages to the OS
    (:func:`~blocklin._memory.release_free_memory`), for a caller whose earlier steps freed
    buffers in other threads' heap arenas, which the panel tasks would not reuse.
    """
    m, n = a.shape
    if (rhs is None) != (rhs_out is None) or (rhs is not None and (done_dir is None or rhs.shape[0] != n or m != n
                                                                   or rhs_out.shape != rhs.shape)):
        raise ShapeError(f"lu_panels: rhs {rhs and rhs.shape} and rhs_out {rhs_out and rhs_out.shape} must both be "
                         f"{n} x k, with a done_dir and a square a (not {m} x {n})")
    spec = ops.spec(dtype, a=a, out=Region.of(work, a.shape), check=check, done_dir=done_dir,
                      c=Region.of(out, a.shape) if out is not None else None, b=rhs)
    spec = dataclasses.replace(spec, rhs_out=rhs_out, trim=trim, split=split)
    graph = ops.graph("lu", spec)
    prev = None
    for j in range(tile_count(n, ops.chunk)):
        prev = graph.add((j,), lu_panel_task, spec, j, [prev] if prev else [])
    from blocklin.plan.factor import lu_flops

    ops.flops += lu_flops(m, n)
    return ops.run(graph, description)


def lu_finish(ops: BlockOps, work: Any, out: Any, shape: tuple[int, int], pivots: np.ndarray, *, dtype: Any,
              description: str = "LU row swaps") -> list[dict]:
    """``out``: the packed LU (``shape``, ``m x n``) of ``work`` with every later row swap applied to
    each ``L`` panel (as LAPACK stores it); one task per column panel, reading the ``L`` rows below
    its diagonal block from ``work`` and writing them to ``out`` (idempotent; :func:`lu_panels` with
    ``out`` wrote the rest)."""
    spec = ops.spec(dtype, a=Region.of(work, tuple(shape)), out=Region.of(out, tuple(shape)), c=None)
    graph = ops.graph("lu-swaps", spec, pivots.tobytes())
    for j in range(tile_count(shape[1], ops.chunk)):
        graph.add((j,), lu_swap_task, spec, j, pivots)
    return ops.run(graph, description)


def lu_solve(ops: BlockOps, work: Any, pivots: np.ndarray, b: Region, out: Region, *, dtype: Any, tile: int | None = None,
             forward: bool = True, split: int = 0, description: str = "LU solve") -> list[dict]:
    """``out = (P^T L U)^-1 B`` from the panels as :func:`lu_panels` stored them in ``work``.

    One task holds ``B`` (``n x k``, ``k`` at most the panel width: the size of a panel) and
    streams each panel twice in row blocks: forward substitution with the unit lower ``L``
    (panel ``j``'s row swaps applied to ``B`` just before it, so its ``L`` is used in the row
    order it was stored in, without :func:`lu_finish`), then back substitution with ``U``, as
    LAPACK's ``getrs`` with the swaps interleaved. ``n^2`` elements read, ``2 n^2 k`` flops.
    ``tile``: the panel width of the factorization (default: the chunk of this object).
    ``forward=False``: ``B`` is already ``L^-1 P B`` (:func:`lu_panels` with ``rhs``): only the
    back substitution runs (``n^2 / 2`` elements read). ``split``: the columns from there on are solved by
    calls of their own on the same reads of the factor (:func:`rhs_parts`), and where their substitution
    overflows they are returned as inf (only the first ``split`` columns' is refused as singular).
    """
    n = b.shape[0]
    if b.shape != out.shape or b.trans or out.trans:
        raise ShapeError(f"lu_solve: b {b.shape} and out {out.shape} must agree (no transposed views)")
    spec = dataclasses.replace(ops.spec(dtype, a=Region.of(work, (n, n)), b=b, out=out), tile=tile or ops.chunk,
                               split=split)
    graph = ops.graph("lu-solve", spec, np.asarray(pivots).tobytes(), forward)
    graph.add((0,), lu_solve_task, spec, np.asarray(pivots), forward)
    ops.flops += (2 if forward else 1) * n * n * b.shape[1]
    return ops.run(graph, description)


def rhs_parts(y: np.ndarray, split: int) -> list[np.ndarray]:
    """The right-hand sides ``y`` as the arrays the substitutions work on: ``[y]``, or with ``split`` the
    columns before it and those from it on, each C-contiguous. A column solved beside others by one BLAS call
    may take other bits than alone (OpenBLAS's kernels block the columns by their unroll width: a float64 ``x``
    of 4 columns changed where a fifth was added), so a column riding a solve (the condition estimate's ``z``)
    is solved by calls of its own, on the same reads of the factor, and the first ``split`` keep their bits."""
    if not split:
        return [y]
    return [np.ascontiguousarray(y[:, :split]), np.ascontiguousarray(y[:, split:])]


def rhs_exponents(top: np.ndarray, dtype: Any) -> np.ndarray | None:
    """Per column of right-hand sides with largest magnitudes ``top``, ``e`` with ``top = f 2^e`` (``f`` in
    ``[0.5, 1)``) where the cast to the solves' ``dtype`` would leave its normal range (overflow to inf above
    it, flush towards 0 below it), else 0; None where every column is within it (no column scaled). Dividing
    such a column by ``2^e`` before the cast and multiplying the solution back after (in the wider dtype) is
    exact: the substitutions are linear, column by column (as GMRES-IR's float32 solves are scaled)."""
    fi = np.finfo(dtype)
    top = np.asarray(top, dtype=np.float64)
    out = (top > float(fi.max)) & np.isfinite(top) | (top > 0) & (top < float(fi.tiny))
    if not out.any():
        return None
    return np.where(out, np.frexp(np.where(out, top, 1.0))[1], 0).astype(np.intc)


def _read_rhs(b: Region, size: int, dt: np.dtype, check: bool, rows: int) -> tuple[np.ndarray, np.ndarray | None]:
    """``B`` in the solves' dtype ``dt``, and the exponents of :func:`rhs_exponents` (None: none scaled):
    a float64 ``B`` cast to a float32 factor's dtype has each column beyond float32's range divided by a
    power of two first (cast unscaled, ``b`` near ``2^500`` became inf, with NumPy's overflow warning, and
    one near ``2^-500`` zeros: a silently wrong ``x``); every other column is cast as it is (its bits kept).

    Read by blocks of ``rows`` rows, each cast into the ``dt`` array as its column maxima are taken, so that
    besides that array the task holds one row block of ``B``'s wider dtype (the input rows read before a cast
    of :func:`~blocklin.plan.factor.lu_panel_bytes`), not all of ``B``; only where a column is out of range are
    its rows read a second time, scaled and cast again."""
    src = np.dtype(open_array(b.path).dtype)
    if not (src.kind == dt.kind == "f" and src.itemsize > dt.itemsize):
        return b.read(0, 0, size, dt, check, "b"), None
    n, k = b.shape
    y, top = np.empty((n, k), dtype=dt), np.zeros(k)
    blocks = [slice(r0, min(n, r0 + rows)) for r0 in range(0, n, max(1, rows))]
    for rs in blocks:
        blk = b.read_rows(rs, None, check, "b")
        with np.errstate(over="ignore", invalid="ignore"):  # a column beyond the range: cast again below
            np.fmax(top, np.max(np.abs(blk), axis=0, initial=0.0), out=top)
            y[rs] = blk
    e = rhs_exponents(top, dt)
    if e is None:
        return y, None
    cols = np.flatnonzero(e)
    for rs in blocks:
        y[rs, cols] = np.ldexp(b.read_rows(rs, None, False, "b")[:, cols], -e[None, cols])
    return y, e


def swap_moves(piv: np.ndarray, start: int) -> tuple[np.ndarray, np.ndarray]:
    """The LAPACK row swaps ``i <-> piv[i - start]`` (in order) as one gather: ``x[dst] = x[src]``.

    Only the rows the swaps move are listed (at most ``2 len(piv)``), so applying a panel's swaps
    costs a gather of those rows instead of one fancy-indexed exchange per swap.
    """
    pos: dict[int, int] = {}
    for i, p in enumerate(np.asarray(piv, dtype=np.int64).tolist(), start):
        if p != i:
            pos[i], pos[p] = pos.get(p, p), pos.get(i, i)
    moved = [(d, s) for d, s in pos.items() if d != s]
    dst = np.fromiter((d for d, _ in moved), dtype=np.int64, count=len(moved))
    src = np.fromiter((s for _, s in moved), dtype=np.int64, count=len(moved))
    return dst, src


def _apply_swaps(dev: Any, x: Any, piv: np.ndarray, start: int, offset: int = 0,
                 buf: np.ndarray | None = None) -> None:
    """Apply the swaps ``i <-> piv[i - start]`` to rows ``i - offset`` of ``x`` (a host or device array).

    ``buf`` (host arrays): a buffer of at least ``2 len(piv)`` rows like ``x``'s for the gathered
    rows, reused from call to call (a fresh array of that size faults its pages in every time).
    """
    dst, src = swap_moves(piv, start)
    if not dst.size:
        return
    if isinstance(x, np.ndarray) and buf is not None:
        rows = buf[: dst.size]
        # mode="clip" (the indices are in range): with the default "raise" NumPy buffers ``out``, an
        # extra copy that made this gather 8x slower (2048 rows of 1024: 15 ms against 2 ms)
        np.take(x, src - offset, axis=0, out=rows, mode="clip")
        x[dst - offset] = rows
        return
    with dev.on_compute():
        x[dev.to_device(dst - offset)] = x[dev.to_device(src - offset)]


def _panel_pivots(spec: TileOpSpec, j: int) -> np.ndarray:
    return load_record(spec, f"lu-piv-{j}.npy")


def pivot_rows(j: int, t: int, m: int, n: int) -> int:
    """Pivot columns of column panel ``j`` (``t`` wide) of an ``m x n`` LU: its columns left of
    ``min(m, n)`` (all of them but in the panel of a wide matrix that holds column ``m``, and
    the panels right of it)."""
    return max(0, min(m, n, (j + 1) * t) - j * t)


def _read_panel(spec: TileOpSpec, c0: int, c1: int, dt: np.dtype, rows_per_block: int) -> tuple[np.ndarray, dict]:
    """Columns ``c0:c1`` of the input (all rows) as a C-ordered ``dt`` array, and their ``max |a|`` and
    float64 ``sum |a|^2`` (of the stored values, before a cast).

    Uncompressed inputs are read in row blocks of :func:`panel_read_rows` rows: a panel narrower
    than the input's chunks maps the chunks' whole rows from their files (or fetches them, from an
    object store), pages that count in the resident memory while they last, so each read takes no
    more than one block of the panel holds. Other inputs go through zarr, which decodes every chunk
    it touches whole: the panel is read in one call (in blocks of ``rows_per_block`` before a cast),
    each chunk decoded once.
    """
    from blocklin.storage.zarr_store import read_kind

    n = spec.a.shape[0]
    src = open_array(spec.a.path)
    off_r, off_c = spec.a.off
    cols = slice(off_c + c0, off_c + c1)
    same = np.dtype(src.dtype) == dt
    raw = read_kind(spec.a.path) != "chunks"
    step = panel_read_rows(rows_per_block, c1 - c0, src.chunks[1], np.dtype(src.dtype).itemsize, dt.itemsize)
    panel = pool.aligned_empty((n, c1 - c0), dt)  # chunk reads' destinations: page-aligned (device.pool)
    if same and not raw:
        read_block(src, slice(off_r, off_r + n), cols, out=panel)
    src_buf = None if same else pool.aligned_empty((min(rows_per_block, max(n, 1)), c1 - c0), src.dtype)
    max_a, sumsq = 0.0, 0.0
    for r0 in range(0, n, rows_per_block):  # row blocks: statistics (and the cast) without a panel-sized temporary
        r1 = min(n, r0 + rows_per_block)
        block = panel[r0:r1] if same else src_buf[: r1 - r0]
        if raw or not same:
            for q0 in range(r0, r1, step if raw else rows_per_block):
                q1 = min(r1, q0 + (step if raw else rows_per_block))
                read_block(src, slice(off_r + q0, off_r + q1), cols, out=block[q0 - r0:q1 - r0])
        if spec.check:
            check_finite(block, "a", slice(off_r + r0, off_r + r1), cols)
        if block.size:
            max_a = float(np.maximum(max_a, _block_max_abs(block)))  # NaN kept (Python's max drops it)
            sumsq += sum_squares(block)
        if not same:
            # a stored value beyond dt's range (float64 data factored in float32) becomes Inf, as NumPy's
            # cast makes it: max_a, of the stored values, names it, and the callers that factor in a narrower
            # dtype (the square solve's and the inverse's LU) refuse a non-finite max |U| by that range
            with np.errstate(over="ignore"):
                panel[r0:r1] = block
    return panel, {"max_a": max_a, "sumsq": sumsq}


def panel_read_rows(rows_per_block: int, width: int, chunk_cols: int, source_itemsize: int, itemsize: int) -> int:
    """Rows read at a time into a panel of ``width`` columns (``itemsize`` bytes each) from an
    uncompressed input of ``chunk_cols``-wide chunks (``source_itemsize``).

    A read of part of a chunk's width maps (or fetches) whole chunk rows
    (:mod:`blocklin.storage.rawchunks`); the rows are chosen so that these stay within the bytes
    of one block of ``rows_per_block`` panel rows: a 32-column float64 panel of 512-column chunks
    reads 32 rows at a time of a 512-row block (128 KiB mapped; the whole panel in one read mapped
    1 MiB at a time beside its 0.5 MiB, at n = 2048).
    """
    per_row = max(1, chunk_cols if width < chunk_cols else width) * source_itemsize
    return max(1, min(rows_per_block, rows_per_block * width * itemsize // per_row))


def _stream_blocks(dev: Any, path: Any, blocks: list[tuple[int, int, int]], t: int, rb: int, dt: np.dtype) -> Any:
    """A :class:`~blocklin.device.stream.TileStream` over the blocks ``(k, r0, r1)`` of a work store:
    rows ``r0:r1`` of column panel ``k`` (``t`` wide, at most ``rb`` rows), one read ahead."""
    from blocklin.device.stream import TileStream

    work = open_array(path)

    def load(i: int, buffers: tuple[np.ndarray, ...]) -> tuple[np.ndarray, ...]:
        k, r0, r1 = blocks[i]
        return (read_block(work, slice(r0, r1), slice(k * t, (k + 1) * t), out=buffers[0][: r1 - r0]),)

    return TileStream(dev, len(blocks), load, [(rb, t)], dt, depth=1)


def _max_abs(x: np.ndarray, rows_per_block: int) -> float:
    """``max |x|`` in row blocks (no temporary of ``x``'s size)."""
    out = 0.0
    for r0 in range(0, x.shape[0], rows_per_block):
        block = x[r0:r0 + rows_per_block]
        if block.size:
            out = float(np.maximum(out, _block_max_abs(block)))
    return out


def _block_max_abs(block: np.ndarray) -> float:
    """``max |x|`` of a block: from its largest and smallest entries (real), or the moduli (complex).

    A finite complex entry's modulus can exceed the dtype's range (up to ``sqrt(2)`` times its largest
    part): that block gives ``sqrt(2) max(|Re|, |Im|)`` (at most the float64 maximum), an upper bound within
    ``sqrt(2)``, not ``inf``, which had been taken for an Inf in ``A`` (``inv`` refused finite data as
    non-finite, ``lu`` warned of an Inf)."""
    if block.dtype.kind == "c":
        with np.errstate(over="ignore"):
            top = float(np.abs(block).max())
        if top == math.inf:
            parts = max(float(np.abs(block.real).max()), float(np.abs(block.imag).max()))
            if math.isfinite(parts):
                return min(math.sqrt(2.0) * parts, float(np.finfo(np.float64).max))
        return top
    return max(float(block.max()), -float(block.min()))


def factor_panel(x: np.ndarray, rows: int, sub: int) -> np.ndarray:
    """LU with partial pivoting of the C-ordered host panel ``x`` (``m x w``, ``m >= w``) in place;
    returns LAPACK's 0-based row swaps (row ``i`` with ``piv[i]``, in order).

    Right-looking over sub-panels of ``sub`` columns (the blocked ``getrf`` of LAPACK; Anderson and
    Dongarra 1990): LAPACK ``getrf`` factors a column-major copy of each sub-panel, its swaps are
    applied to the panel's other columns (one gather of the rows they move), and the columns to its
    right are updated by a TRSM and GEMMs over row blocks of ``rows`` (temporaries of ``rows x w``).
    The pivot of each column is chosen among all its remaining rows, as in ``getrf`` on the whole
    panel; only a copy of ``m x sub`` is held besides ``x`` (``getrf`` of the panel copies all of it).
    All of it runs on :data:`~blocklin.device.base.PANEL_GETRF_THREADS` BLAS threads, as the panel
    ``getrf`` did (see :meth:`~blocklin.device.base.Device.lu_panel`): on this project's shared
    2-core machine (load 16), two threads made this step 2x slower than one, and one thread took
    0.86-1.56x the time of ``getrf`` on the whole 8192 x 1024 panel.
    """
    from scipy.linalg import lapack
    from blocklin._blas import blas_threads

    m, w = x.shape
    kk = min(m, w)
    piv = np.arange(kk, dtype=np.int64)
    if not kk:
        return piv
    getrf = lapack.get_lapack_funcs("getrf", (x,))
    buf = np.empty((2 * min(sub, kk), w), dtype=x.dtype) if sub < w else None
    cpu = get_device("cpu")
    with blas_threads(PANEL_GETRF_THREADS):
        for s0 in range(0, kk, sub):
            s1 = min(kk, s0 + sub)
            lu, p, info = getrf_in_range(getrf, np.asfortranarray(x[s0:, s0:s1]), overwrite_a=True)
            if info < 0:
                raise InternalError(f"getrf: illegal argument {-info}")
            p = p[: s1 - s0].astype(np.int64) + s0
            if s0 or s1 < w:  # the columns outside this sub-panel (getrf swapped its own)
                _apply_swaps(cpu, x, p, s0, buf=buf)
            x[s0:, s0:s1] = lu
            del lu
            piv[s0:s1] = p
            if s1 < w:  # U12 = L11^-1 A12, then A22 -= L21 U12 in row blocks
                u12 = cpu.solve_triangular(x[s0:s1, s0:s1], x[s0:s1, s1:], lower=True, unit=True)
                x[s0:s1, s1:] = u12
                # a growth beyond the range gives Inf and NaN here, as in getrf: read by lu_panel_task's
                # max |U| (NaN kept), which every caller of the LU refuses
                with np.errstate(over="ignore", invalid="ignore"):
                    for r0 in range(s1, m, rows):
                        r1 = min(m, r0 + rows)
                        x[r0:r1, s1:] -= x[r0:r1, s0:s1] @ u12
                del u12
    return piv


def lu_subpanel(width: int) -> int:
    """Columns of the sub-panels :func:`factor_panel` factors with ``getrf`` (see
    :func:`~blocklin.plan.factor.lu_subpanel`)."""
    from blocklin.plan.factor import lu_subpanel as plan_subpanel

    return plan_subpanel(width)


@with_task_settings
@holds_device(lambda spec, *_: 2 * spec.a.shape[0] / spec.tile + 4)  # the trailing panel and L block, 4 tiles
def lu_panel_task(spec: TileOpSpec, j: int, deps: list) -> dict:
    """Panel ``j`` of the left-looking LU (see :func:`lu_panels`).

    The panel (columns ``J``, all rows) is read once and updated in place by each earlier panel
    ``k`` in order: first panel ``k``'s own row swaps, which bring the panel into the row order
    panel ``k`` was stored in (so its ``L`` is streamed as stored, never permuted), then
    ``U_kJ = L_kk^-1 P_kJ`` (TRSM, unit diagonal) and ``P_{>k,J} -= L_{>k,k} U_kJ`` as GEMMs over
    row blocks of ``L_{>k,k}`` (:func:`~blocklin.plan.factor.lu_stream_rows` rows each). LAPACK
    ``getrf`` then factors the trailing part with partial pivoting over all its rows. Of an ``m x n``
    matrix: the earlier panels are those with pivots (:func:`pivot_rows`; the diagonal block of a
    wide matrix's panel that holds column ``m`` is its first ``m - k t`` columns), and a panel right
    of column ``m`` has no trailing part.
    """
    from blocklin.plan.factor import lu_stream_rows

    marker = done_marker(spec, f"lu-{j}")
    if skip_done(marker):
        return {"skipped": 1, **load_record(spec, f"lu-stats-{j}.npy")}
    t, dt = spec.tile, np.dtype(spec.dtype)
    m, n = spec.a.shape
    rb = lu_stream_rows(t, m)
    if spec.trim:
        release_free_memory()
    dev = get_device(spec.device, device_memory=spec.device_memory)
    c0, c1 = j * t, min(n, (j + 1) * t)
    host, stats = _read_panel(spec, c0, c1, dt, rb)
    panel = dev.to_device(host)
    nread = host.nbytes
    # the blocks of the earlier panels, in the order they are used: each panel's diagonal block
    # (TRSM), then its row blocks below (GEMMs); read one ahead on a loader thread
    blocks = [(k, r0, min(m, r0 + (pivot_rows(k, t, m, n) if r0 == k * t else rb)))
              for k in range(j) if pivot_rows(k, t, m, n)
              for r0 in [k * t, *range(k * t + pivot_rows(k, t, m, n), m, rb)]]
    stream = _stream_blocks(dev, spec.out.path, blocks, t, rb, dt)
    ukj = None
    swap_buf = np.empty((2 * t, c1 - c0), dtype=dt) if j and isinstance(panel, np.ndarray) else None
    for i, (lblk,) in stream:  # in panel order: identical sums on every scheduler
        k, r0, r1 = blocks[i]
        if r0 == k * t:  # panel k's swaps (the row order it was stored in), then U_kJ = L_kk^-1 P_kJ
            _apply_swaps(dev, panel, _panel_pivots(spec, k), r0, buf=swap_buf)
            if r1 - r0 < lblk.shape[1]:  # a wide matrix's panel holding column m: L_kk is its left part
                lblk = lblk[:, : r1 - r0]
            if isinstance(panel, np.ndarray):  # in place: the rows of a C-ordered panel are one block
                from blocklin.device.cpu import trsm_inplace

                ukj = trsm_inplace(lblk, panel[r0:r1], lower=True, unit=True)
            else:
                ukj = dev.solve_triangular(lblk, panel[r0:r1], lower=True, unit=True)
                with dev.on_compute():
                    panel[r0:r1] = ukj
        else:
            dev.gemm_acc(panel[r0:r1], lblk, ukj, -1.0)
        nread += (r1 - r0) * t * dt.itemsize
    del ukj, swap_buf, stream
    d = pivot_rows(j, t, m, n)
    local = np.zeros(0, dtype=np.int64)
    if d:  # the trailing part (none right of column m)
        trailing = np.asarray(dev.to_host(panel[c0:]))  # a view of a host panel: factored in place
        local = factor_panel(trailing, c1 - c0, lu_subpanel(c1 - c0))
        if not isinstance(panel, np.ndarray):
            with dev.on_compute():
                panel[c0:] = dev.to_device(trailing)
        del trailing
    host = np.asarray(dev.to_host(panel))
    del panel
    pj = local[:d] + c0
    save_record(spec, f"lu-piv-{j}.npy", pj)
    diag = np.abs(np.diagonal(host[c0:c1]))
    # NaN kept (Python's max drops a NaN second argument: an overflowed first panel had read as max |U| = 0
    # with a NaN pivot, named a zero pivot of a singular A); a finite complex entry whose modulus is beyond
    # the range gives a finite bound (_block_max_abs), not the Inf every caller refuses as an overflow
    stats.update(max_u=float(np.maximum(_max_abs(host[:c0], rb), _block_max_abs(np.triu(host[c0:c1]))
                                        if diag.size else 0.0)),
                 min_pivot=float(diag.min()) if diag.size else math.inf)  # inf: no pivot in this panel
    if spec.c is None:
        write_block(open_array(spec.out.path, mode="r+"), slice(0, m), slice(c0, c1), host)
    else:  # U and the diagonal block are final; the L rows below wait for the later swaps
        write_block(open_array(spec.c.path, mode="r+"), slice(0, min(c1, m)), slice(c0, c1), host[:c1])
        if d:
            write_block(open_array(spec.out.path, mode="r+"), slice(c0, m), slice(c0, c1), host[c0:])
    w, p = c1 - c0, min(c0, m, n)
    flops = 2 * w * (m * p - p * p / 2) + w * d * (m - c0)
    if spec.b is not None:
        flops += _lu_forward_rhs(spec, j, host, pj)
    save_record(spec, f"lu-stats-{j}.npy", stats)
    mark_finished(marker)
    if spec.b is not None and j:  # panel j is done: a rerun starts from its right-hand side
        backend(spec.done_dir).remove(f"lu-rhs-{j - 1}.npy")
    return {"bytes_read": nread, "bytes_written": host.nbytes, **stats, "flops": flops}


def _lu_forward_rhs(spec: TileOpSpec, j: int, host: np.ndarray, pj: np.ndarray) -> float:
    """Panel ``j``'s step of the forward substitution ``L y = P b`` (see :func:`lu_panels`).

    ``host`` is the factored panel (rows ``c0:`` in the order of its own swaps ``pj``, as stored);
    ``B`` as left by panel ``j - 1`` (the input ``spec.b`` for the first panel) gets ``pj``, then
    ``y_J = L_JJ^-1 B_J`` and ``B_{>J} -= L_{>J,J} y_J``: the steps of :func:`lu_solve_task`'s forward
    sweep on the panel in memory (host BLAS: ``2 n w k`` flops, small beside the panel's).
    Returns the flops.
    """
    t, dt = spec.tile, np.dtype(spec.dtype)
    n, k = spec.b.shape
    c0, c1 = j * t, min(n, (j + 1) * t)
    cpu = get_device("cpu")
    if j == 0:
        y = spec.b.read(0, 0, max(n, k, 1), dt)
    else:
        y = np.ascontiguousarray(load_record(spec, f"lu-rhs-{j - 1}.npy"), dtype=dt)
    parts = rhs_parts(y, spec.split)
    for part in parts:
        _apply_swaps(cpu, part, pj, c0, buf=np.empty((2 * (c1 - c0), part.shape[1]), dtype=dt))
        yj = cpu.solve_triangular(host[c0:c1], part[c0:c1], lower=True, unit=True)
        part[c0:c1] = yj
        if c1 < n:
            cpu.gemm_acc(part[c1:], host[c1:], yj, -1.0)
    y = parts[0] if len(parts) == 1 else np.hstack(parts)
    if c1 >= n:  # the last panel: y = L^-1 P b, for the back substitution
        spec.rhs_out.write(0, 0, max(n, k, 1), y)
    save_record(spec, f"lu-rhs-{j}.npy", y)
    return 2.0 * (n - c0) * (c1 - c0) * k


@with_task_settings
def lu_swap_task(spec: TileOpSpec, j: int, pivots: np.ndarray) -> dict:
    """The ``L`` rows below panel ``j``'s diagonal block with the swaps of the later panels applied."""
    t = spec.tile
    m, n = spec.a.shape
    c0, c1 = j * t, min(n, (j + 1) * t)
    if c1 >= m:  # no rows below the diagonal block
        return {"bytes_read": 0, "bytes_written": 0}
    block = read_block(open_array(spec.a.path), slice(c1, m), slice(c0, c1))
    dst, src = swap_moves(pivots[c1:], c1)
    if dst.size:  # a gather into a buffer, then a scatter (see _apply_swaps)
        block[dst - c1] = np.take(block, src - c1, axis=0, out=np.empty((dst.size, block.shape[1]), block.dtype),
                                  mode="clip")
    write_block(open_array(spec.out.path, mode="r+"), slice(c1, m), slice(c0, c1), block)
    return {"bytes_read": block.nbytes, "bytes_written": block.nbytes}


@with_task_settings
def lu_solve_task(spec: TileOpSpec, pivots: np.ndarray, forward: bool = True) -> dict:
    """``X = U^-1 L^-1 P B`` from the LU work store ``spec.a`` (see :func:`lu_solve`); with
    ``forward=False``, ``X = U^-1 B`` (``B`` already forward-eliminated by the panels). Computed in
    ``spec.dtype``: the factor's blocks are cast as read (a real factor with complex ``B``)."""
    from blocklin.plan.factor import lu_stream_rows

    t, dt = spec.tile, np.dtype(spec.dtype)
    n, k = spec.b.shape
    rb = lu_stream_rows(t, n)
    dev = get_device(spec.device, device_memory=spec.device_memory)
    work = open_array(spec.a.path)
    y0, scaled = _read_rhs(spec.b, max(n, k, 1), dt, spec.check, rb)
    ys = [dev.to_device(p) for p in rhs_parts(y0, spec.split)]
    del y0
    nread = sum(y.nbytes for y in ys)
    nt = tile_count(n, t)
    for j in range(nt if forward else 0):  # forward substitution, L y = P b, panel by panel
        c0, c1 = j * t, min(n, (j + 1) * t)
        ljj = np.asarray(read_block(work, slice(c0, c1), slice(c0, c1)), dtype=dt)
        ljd = dev.to_device(ljj)
        yjs = []
        for y in ys:
            _apply_swaps(dev, y, pivots[c0:c1], c0)
            yj = dev.solve_triangular(ljd, y[c0:c1], lower=True, unit=True)
            with dev.on_compute():
                y[c0:c1] = yj
            yjs.append(yj)
        nread += ljj.nbytes
        for r0 in range(c1, n, rb):
            blk = np.asarray(read_block(work, slice(r0, min(n, r0 + rb)), slice(c0, c1)), dtype=dt)
            bd = dev.to_device(blk)
            for y, yj in zip(ys, yjs):
                dev.gemm_acc(y[r0:r0 + blk.shape[0]], bd, yj, -1.0)
            nread += blk.nbytes
    live = [True] * len(ys)  # a riding part whose substitution overflowed is dropped (returned as inf)
    for j in reversed(range(nt)):  # back substitution, U x = y
        c0, c1 = j * t, min(n, (j + 1) * t)
        ujj = np.asarray(read_block(work, slice(c0, c1), slice(c0, c1)), dtype=dt)
        ujd = dev.to_device(ujj)
        xjs = []
        for p, y in enumerate(ys):
            xj = dev.solve_triangular(ujd, y[c0:c1], lower=False) if live[p] else None
            if xj is not None and not np.isfinite(np.asarray(dev.to_host(xj))).all():
                if p == 0:
                    raise SingularMatrixError(explain(
                        "a", "must be nonsingular (no zero pivot)", f"a singular or overflowing diagonal block of U "
                        f"at rows {c0}:{c1}", "regularize the system (lam > 0), or solve the least-squares problem "
                        "with method='qr'"))
                live[p], xj = False, None
            if xj is not None:
                with dev.on_compute():
                    y[c0:c1] = xj
            xjs.append(xj)
        nread += ujj.nbytes
        for r0 in range(0, c0, rb):
            blk = np.asarray(read_block(work, slice(r0, min(c0, r0 + rb)), slice(c0, c1)), dtype=dt)
            bd = dev.to_device(blk)
            for y, xj in zip(ys, xjs):
                if xj is not None:
                    dev.gemm_acc(y[r0:r0 + blk.shape[0]], bd, xj, -1.0)
            nread += blk.nbytes
    parts = [np.asarray(dev.to_host(y)) if ok else np.full(y.shape, np.inf, dtype=dt) for y, ok in zip(ys, live)]
    x = parts[0] if len(parts) == 1 else np.hstack(parts)
    # written by row blocks: a store of a wider dtype (float64 x of float32 solves) casts what it is given, so a
    # write of all of x had held its n x k copy in that dtype; the scaled columns' solutions are multiplied back
    # in B's wider dtype, block by block
    wide, written = open_array(spec.b.path).dtype, 0
    for r0 in range(0, n, rb):
        blk = x[r0:r0 + rb]
        if scaled is not None:
            with np.errstate(over="ignore", under="ignore"):
                blk = np.ldexp(blk.astype(wide), scaled[None, :])
        spec.out.write_rows(slice(r0, r0 + blk.shape[0]), blk)
        written += blk.nbytes
    return {"bytes_read": nread, "bytes_written": written, "flops": (2 if forward else 1) * n * n * k}


def swaps_to_permutation(pivots: np.ndarray) -> np.ndarray:
    """The row order ``perm`` with ``P A = A[perm]`` for LAPACK's (0-based) swaps ``i <-> pivots[i]``."""
    perm = np.arange(len(pivots), dtype=np.int64)
    for i, p in enumerate(np.asarray(pivots, dtype=np.int64)):
        if p != i:
            perm[[i, p]] = perm[[p, i]]
    return perm
