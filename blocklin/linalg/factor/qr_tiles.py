"""Tile Householder QR over stored matrices: square tiles, LAPACK ``geqrt``/``gemqrt``/``tpqrt``/``tpmqrt``.

The tile algorithm of Buttari, Langou, Kurzak and Dongarra ("A class of parallel tiled linear
algebra algorithms for multicore architectures", Parallel Computing 35, 2009), with the flat
reduction tree of its tall variant (Hadri, Ltaief, Agullo and Dongarra 2010; CAQR with a flat tree
in Demmel, Grigori, Hoemmen and Langou 2012). For each step ``k`` over the tile columns:

``geqrt(k)``
    Householder QR of tile ``(k, k)``: ``V_kk`` and ``R_kk``, ``T_kk`` in compact WY form.
``gemqrt(k, j)``
    ``Q_kk^T`` applied to tile ``(k, j)``, ``j > k``.
``tpqrt(k, i)``
    QR of ``[R_kk; A_ik]`` (a triangle on a square, LAPACK ``tpqrt`` with ``l = 0``), ``i > k``:
    ``R_kk`` updated, ``V_ik`` and ``T_ik`` stored.
``tpmqrt(k, i, j)``
    Those reflectors applied to ``[A_kj; A_ij]``.

Each ``(k, j)`` is a chain over ``i`` (the running top tile ``A_kj`` is carried from task to task);
the tiles below the top are independent of each other, so a wider machine runs the chains of a step
and the steps' fronts at once. Every task is one tile-sized unit of work that writes only places it
never reads, so it is idempotent and ``resume`` skips finished tasks:

* a step reads its tiles from one of two work stores and writes the next state to the other
  (step 0 reads ``A`` itself), so a rerun task finds its input unchanged;
* the running top tile of chain ``(k, j)`` after row ``i`` goes to slot ``(k mod 2, i mod 2)`` of a
  small slot store; step ``k + 2`` reuses the slots only after chain ``(k, j)`` has finished (an edge
  of the graph);
* the final tiles (``R`` on and above the diagonal tile row, ``V`` below) and ``T`` are written once,
  to a packed store laid out as LAPACK's (``R`` in the upper triangle, ``V`` below), which the
  ``R`` extraction of :mod:`blocklin.linalg.factor.householder` reads.

The thin ``Q`` (:func:`tile_qr_form_q`) is formed strip by strip of columns: the reflectors applied
in reverse order to ``[I; 0]`` (steps after the strip's tile column leave it unchanged), one
independent task per strip. The kernels run on the host's LAPACK on either device. Complex data
takes LAPACK's complex kernels, ``Q^H`` applied with ``trans='C'``, and the diagonal convention of
:func:`~blocklin.linalg.blocks.tsqr.diagonal_signs` (``R``'s diagonal real and non-negative).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Hashable
from typing import Any

import numpy as np

from blocklin.errors import InternalError
from blocklin.device.base import PANEL_GETRF_THREADS
from blocklin.linalg.blocks.tsqr import diagonal_signs, signed_columns
from blocklin.runtime.blockops import (BlockOps, Region, done_marker, holds_device, load_record, mark_finished,
                                       save_record, skip_done, tile_count)
from blocklin.runtime.tiles import open_array, with_task_settings
from blocklin.storage.zarr_store import create_array, read_block, write_block


@dataclasses.dataclass(frozen=True)
class TileQRSpec:
    """One tile QR as its tasks see it: stores, shape, tile side, resume folder."""

    tile: int
    inner: int
    dtype: str
    device: str
    device_memory: int | None
    blas_threads: int | None
    a: Region
    m: int
    n: int
    work: tuple[Any, Any]
    slots: Any
    packed: Any
    tstore: Any
    vdiag: Any
    done_dir: Any
    check: bool = False
    math: str | None = None


def tile_qr_stores(folder: Any, m: int, n: int, t: int, inner: int, dtype: Any, codec: Any) -> dict:
    """Create (or keep, on resume) the work stores of a tile QR in the resume folder ``folder`` (a
    :class:`~blocklin.storage.location.Location`); returns their paths.

    ``work0``/``work1`` (``m x n``, the alternating tile states), ``slots`` (four running top tiles
    per tile column), ``packed`` (the result: ``R`` above, ``V`` below the diagonal), ``tstore`` (the
    ``T`` of every reflector tile: ``inner`` rows per tile row) and ``vdiag`` (``geqrt``'s packed
    diagonal tiles, for ``gemqrt``).
    """
    mt = tile_count(m, t)
    shapes = {"work0": ((m, n), (t, t)), "work1": ((m, n), (t, t)), "slots": ((4 * t, n), (t, t)),
              "packed": ((m, n), (t, t)), "tstore": ((mt * inner, n), (inner, t)), "vdiag": ((t, n), (t, t))}
    paths = {}
    for name, (shape, chunks) in shapes.items():
        path = (folder / f"qr-tiles-{name}.zarr").with_pending(False)  # dropped with the markers at commit
        if not _exists(path):
            create_array(path, shape=shape, dtype=dtype, chunks=chunks, codec=codec)
        paths[name] = path
    return paths


def _exists(path: Any) -> bool:
    from blocklin.storage.backend import backend

    return backend(path).exists("zarr.json")


def tile_qr(ops: BlockOps, a: Region, stores: dict, *, dtype: Any, inner: int, done_dir: Any, check: bool = True,
            description: str = "QR tiles") -> list[dict]:
    """Tile Householder QR of region ``a`` (``m x n``, ``m >= n``) into ``stores["packed"]`` (see the
    module); returns the task results, those of each diagonal tile with ``col``, ``signs``, ``min_r``
    and ``max_r`` of its ``R`` diagonal."""
    m, n = a.shape
    t = ops.chunk
    job = ops.job
    dt = np.dtype(dtype)
    spec = TileQRSpec(tile=t, inner=inner, dtype=dt.name, device=job.device,
                      device_memory=job.device_memory() if job.device == "gpu" else None,
                      blas_threads=job.task_blas_threads(job.cores()), a=a, m=m, n=n,
                      work=(stores["work0"], stores["work1"]), slots=stores["slots"], packed=stores["packed"],
                      tstore=stores["tstore"], vdiag=stores["vdiag"], done_dir=done_dir, check=check,
                      math=ops.math if dt == np.float32 else None)
    graph = ops.graph("qr-tiles", spec)
    mt, nt = tile_count(m, t), tile_count(n, t)
    keys: dict[tuple, Hashable] = {}
    for k in range(nt):
        for j in range(k, nt):
            deps = []
            if k:
                deps.append(keys[("ts", k - 1, k, j)])  # A_kj as step k - 1 left it
            if j > k:
                deps.append(keys[("h", k, k)])  # V_kk, T_kk
            if k >= 2:
                deps.append(keys[_last(k - 2, j, mt)])  # step k - 2's slots are free again
            keys[("h", k, j)] = graph.add(("h", k, j), head_task, spec, k, j, mt == k + 1, deps)
            for i in range(k + 1, mt):
                deps = [keys[("h", k, j)] if i == k + 1 else keys[("ts", k, i - 1, j)]]
                if k:
                    deps.append(keys[("ts", k - 1, i, j)])  # A_ij as step k - 1 left it
                if j > k:
                    deps.append(keys[("ts", k, i, k)])  # V_ik, T_ik
                keys[("ts", k, i, j)] = graph.add(("ts", k, i, j), ts_task, spec, k, i, j, i == mt - 1, deps)
    ops.flops += 2 * m * n * n - 2 * n**3 // 3
    return ops.run(graph, description)


def _last(k: int, j: int, mt: int) -> tuple:
    return ("h", k, j) if mt == k + 1 else ("ts", k, mt - 1, j)


def tile_qr_form_q(ops: BlockOps, stores: dict, out: Any, m: int, n: int, *, dtype: Any, inner: int, width: int,
                   done_dir: Any, signs: np.ndarray, description: str = "Q factor") -> list[dict]:
    """The thin ``Q`` (``m x n``) of a finished tile QR into ``out`` (chunks of ``width`` columns),
    columns scaled by ``signs``: one independent task per strip of ``width`` columns within a tile
    column."""
    t = ops.chunk
    job = ops.job
    dt = np.dtype(dtype)
    spec = TileQRSpec(tile=t, inner=inner, dtype=dt.name, device=job.device,
                      device_memory=job.device_memory() if job.device == "gpu" else None,
                      blas_threads=job.task_blas_threads(job.cores()), a=Region.of(out, (m, n)), m=m, n=n,
                      work=(None, None), slots=None, packed=stores["packed"], tstore=stores["tstore"],
                      vdiag=stores["vdiag"], done_dir=done_dir, math=ops.math if dt == np.float32 else None)
    graph = ops.graph("qr-tiles-q", spec, signs.tobytes(), width)
    for c0 in range(0, n, width):
        c1 = min(n, c0 + width, (c0 // t + 1) * t)  # within one tile column
        graph.add((c0,), q_strip_task, spec, c0, c1, signs[c0:c1])
    ops.flops += 2 * m * n * n - 2 * n**3 // 3
    return ops.run(graph, description)


# -- kernels ---------------------------------------------------------------------------------------
def _lapack(name: str, x: np.ndarray) -> Any:
    from scipy.linalg import lapack

    return lapack.get_lapack_funcs(name, (x,))


def _check(info: int, name: str) -> None:
    if info < 0:
        raise InternalError(f"{name}: illegal argument {-info}")


def _one_thread() -> Any:
    """Every tile kernel on one BLAS thread, as the Cholesky and LU panels
    (:data:`~blocklin.device.base.PANEL_GETRF_THREADS`). Their inner loops are level-2 (``geqrt3``,
    ``tpqrt2``) or GEMMs of ``inner`` rows (``tprfb``, ``larfb``), which two OpenBLAS threads ran
    10 to 100 times slower than one on a shared 2-core machine (a 512 tile: ``tpqrt`` 2.1 s against
    0.03 s, ``tpmqrt`` 0.32 s against 0.010 s); a 2048 x 2048 ``R`` took 2.9 s on one thread against
    8.5 s with two (benchmarks in docs/factor.md)."""
    from blocklin._blas import blas_threads

    return blas_threads(PANEL_GETRF_THREADS)


def geqrt(tile: np.ndarray, inner: int) -> tuple[np.ndarray, np.ndarray]:
    """LAPACK ``geqrt`` of a tile with at least as many rows as columns: packed ``R``/``V`` and ``T``."""
    with _one_thread():
        packed, tk, info = _lapack("geqrt", tile)(min(inner, tile.shape[1]), tile)
    _check(info, "geqrt")
    return packed, tk


def _trans(x: np.ndarray) -> str:
    """LAPACK's adjoint flag: ``'T'`` for real data, ``'C'`` (conjugate transpose) for complex."""
    return "C" if x.dtype.kind == "c" else "T"


def gemqrt(v: np.ndarray, tk: np.ndarray, c: np.ndarray, *, trans: bool) -> np.ndarray:
    """``Q^T c`` (``trans``; ``Q^H c`` of complex data) or ``Q c`` for the ``geqrt`` reflectors ``v`` (packed;
    the strict lower part is read)."""
    with _one_thread():
        out, info = _lapack("gemqrt", c)(v, tk, c, trans=_trans(c) if trans else "N")
    _check(info, "gemqrt")
    return out


def tpqrt(r: np.ndarray, b: np.ndarray, inner: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """QR of ``[triu(r); b]`` (LAPACK ``tpqrt``, ``l = 0``): the new ``R`` (upper part), ``V`` (in place
    of ``b``) and ``T``."""
    with _one_thread():
        r2, v, tk, info = _lapack("tpqrt", b)(0, min(inner, b.shape[1]), np.triu(r), b)
    _check(info, "tpqrt")
    return r2, v, tk


def tpmqrt(v: np.ndarray, tk: np.ndarray, top: np.ndarray, b: np.ndarray, *,
           trans: bool) -> tuple[np.ndarray, np.ndarray]:
    """``[top; b]`` times the ``tpqrt`` reflectors' ``Q^T`` (``trans``; ``Q^H`` of complex data) or ``Q``
    (LAPACK ``tpmqrt``, ``l = 0``)."""
    with _one_thread():
        top2, b2, info = _lapack("tpmqrt", b)(0, v, tk, top, b, trans=_trans(b) if trans else "N")
    _check(info, "tpmqrt")
    return top2, b2


# -- tasks -----------------------------------------------------------------------------------------
def _span(i: int, t: int, size: int) -> slice:
    return slice(i * t, min(size, (i + 1) * t))


def _read(path: Any, rows: slice, cols: slice, dt: np.dtype) -> np.ndarray:
    return np.array(read_block(open_array(path), rows, cols), dtype=dt, order="F")


def _write(path: Any, rows: slice, cols: slice, block: np.ndarray) -> None:
    write_block(open_array(path, mode="r+"), rows, cols, np.ascontiguousarray(block))


def _source(spec: TileQRSpec, k: int, i: int, j: int, dt: np.dtype) -> np.ndarray:
    """Tile ``(i, j)`` as step ``k - 1`` left it: ``A`` itself for step 0, else a work store."""
    t = spec.tile
    rows, cols = _span(i, t, spec.m), _span(j, t, spec.n)
    if k == 0:
        block = spec.a.read_stored(rows, cols, check=spec.check)
        if spec.a.trans:
            block = block.T
        return np.array(block, dtype=dt, order="F")
    return _read(spec.work[k % 2], rows, cols, dt)


def _slot(spec: TileQRSpec, k: int, i: int, j: int, rows: int) -> tuple[slice, slice]:
    s = 2 * (k % 2) + i % 2
    t = spec.tile
    return slice(s * t, s * t + rows), _span(j, t, spec.n)


def _t_rows(spec: TileQRSpec, i: int, k: int) -> tuple[slice, slice]:
    w = _span(k, spec.tile, spec.n)
    ib = min(spec.inner, w.stop - w.start)
    return slice(i * spec.inner, i * spec.inner + ib), w


def _put_top(spec: TileQRSpec, k: int, i: int, j: int, top: np.ndarray, last: bool) -> None:
    if last:
        _write(spec.packed, _span(k, spec.tile, spec.m), _span(j, spec.tile, spec.n), top)
    else:
        _write(spec.slots, *_slot(spec, k, i, j, top.shape[0]), top)


def _diag_stats(spec: TileQRSpec, k: int, top: np.ndarray) -> dict:
    w = _span(k, spec.tile, spec.n)
    diag = np.diag(top[: w.stop - w.start])
    # R with a non-negative diagonal (Q's columns flipped alike); of complex data a real one
    signs = diagonal_signs(top[: w.stop - w.start]) if diag.dtype.kind == "c" else np.where(diag < 0, -1.0, 1.0)
    diag = np.abs(diag)
    return {"col": k, "signs": signs, "max_r": float(diag.max()) if diag.size else 0.0,
            "min_r": float(diag.min()) if diag.size else 0.0}


def _finish(spec: TileQRSpec, marker: Any, k: int, j: int, top: np.ndarray, last: bool, result: dict) -> dict:
    if last and j == k:  # the diagonal tile's R is final: its statistics, kept for a resumed run
        stats = _diag_stats(spec, k, top)
        save_record(spec, f"qrt-stats-{k}.npy", stats)
        result.update(stats)
    mark_finished(marker)
    return result


@with_task_settings
@holds_device(lambda spec, *_: 6.0)
def head_task(spec: TileQRSpec, k: int, j: int, last: bool, deps: list) -> dict:
    """``geqrt`` of tile ``(k, k)`` (``j == k``) or ``gemqrt`` of its reflectors on tile ``(k, j)``."""
    marker = done_marker(spec, f"qrt-h-{k}-{j}")
    if skip_done(marker):
        return {"skipped": 1, **(load_record(spec, f"qrt-stats-{k}.npy") if last and j == k else {})}
    t, dt = spec.tile, np.dtype(spec.dtype)
    rows, cols = _span(k, t, spec.m), _span(k, t, spec.n)
    tile = _source(spec, k, k, j, dt)
    nread = tile.nbytes
    if j == k:
        top, tk = geqrt(tile, spec.inner)
        _write(spec.vdiag, slice(0, rows.stop - rows.start), cols, top)
        _write(spec.tstore, *_t_rows(spec, k, k), tk)
        w = cols.stop - cols.start
        flops = 2 * w * w * (tile.shape[0] - w / 3)
    else:
        v = _read(spec.vdiag, slice(0, rows.stop - rows.start), cols, dt)
        tk = _read(spec.tstore, *_t_rows(spec, k, k), dt)
        top = gemqrt(v, tk, tile, trans=True)
        nread += v.nbytes + tk.nbytes
        flops = 4 * v.shape[0] * v.shape[1] * tile.shape[1]
    _put_top(spec, k, k, j, top, last)
    return _finish(spec, marker, k, j, top, last, {"bytes_read": nread, "bytes_written": top.nbytes, "flops": flops})


@with_task_settings
@holds_device(lambda spec, *_: 8.0)
def ts_task(spec: TileQRSpec, k: int, i: int, j: int, last: bool, deps: list) -> dict:
    """``tpqrt`` of ``[R_kk; A_ik]`` (``j == k``) or ``tpmqrt`` of its reflectors on ``[A_kj; A_ij]``."""
    marker = done_marker(spec, f"qrt-ts-{k}-{i}-{j}")
    if skip_done(marker):
        return {"skipped": 1, **(load_record(spec, f"qrt-stats-{k}.npy") if last and j == k else {})}
    t, dt = spec.tile, np.dtype(spec.dtype)
    kr = _span(k, t, spec.m)
    w = min(spec.n, (k + 1) * t) - k * t  # columns of tile column k: rows of R_kk
    top = _read(spec.slots, *_slot(spec, k, i - 1, j, kr.stop - kr.start), dt)
    below = _source(spec, k, i, j, dt)
    nread = top.nbytes + below.nbytes
    if j == k:
        r, v, tk = tpqrt(top[:w], below, spec.inner)
        top[:w] = np.triu(r) + np.tril(top[:w], -1)  # V_kk stays below the diagonal
        _write(spec.packed, _span(i, t, spec.m), _span(k, t, spec.n), v)
        _write(spec.tstore, *_t_rows(spec, i, k), tk)
        flops = 2 * below.shape[0] * w * w
        written = v.nbytes + tk.nbytes
    else:
        v = _read(spec.packed, _span(i, t, spec.m), _span(k, t, spec.n), dt)
        tk = _read(spec.tstore, *_t_rows(spec, i, k), dt)
        top[:w], below = tpmqrt(v, tk, top[:w], below, trans=True)
        _write(spec.work[(k + 1) % 2], _span(i, t, spec.m), _span(j, t, spec.n), below)
        nread += v.nbytes + tk.nbytes
        flops = 4 * below.shape[0] * w * below.shape[1]
        written = below.nbytes
    _put_top(spec, k, i, j, top, last)
    return _finish(spec, marker, k, j, top, last,
                   {"bytes_read": nread, "bytes_written": written + top.nbytes, "flops": flops})


@with_task_settings
@holds_device(lambda spec, *_: 4.0 + 2.0 * spec.m / spec.tile)
def q_strip_task(spec: TileQRSpec, c0: int, c1: int, signs: np.ndarray) -> dict:
    """Columns ``c0:c1`` of the thin ``Q``: the reflectors applied in reverse order to ``[I; 0]``."""
    marker = done_marker(spec, f"qrt-q-{c0}")
    if skip_done(marker):
        return {"skipped": 1}
    t, dt = spec.tile, np.dtype(spec.dtype)
    m, n = spec.m, spec.n
    mt = tile_count(m, t)
    x = np.zeros((m, c1 - c0), dtype=dt, order="F")
    x[c0:c1] = np.eye(c1 - c0, dtype=dt)
    nread = flops = 0
    for k in range(c0 // t, -1, -1):  # steps after the strip's tile column leave [I; 0] unchanged
        kr = _span(k, t, m)
        w = min(n, (k + 1) * t) - k * t
        top = np.asfortranarray(x[kr.start:kr.start + w])
        for i in range(mt - 1, k, -1):
            ir = _span(i, t, m)
            v = _read(spec.packed, ir, _span(k, t, n), dt)
            tk = _read(spec.tstore, *_t_rows(spec, i, k), dt)
            top, x[ir] = tpmqrt(v, tk, top, np.asfortranarray(x[ir]), trans=False)
            nread += v.nbytes + tk.nbytes
            flops += 4 * v.shape[0] * w * (c1 - c0)
        x[kr.start:kr.start + w] = top
        v = _read(spec.vdiag, slice(0, kr.stop - kr.start), _span(k, t, n), dt)
        tk = _read(spec.tstore, *_t_rows(spec, k, k), dt)
        x[kr] = gemqrt(v, tk, np.asfortranarray(x[kr]), trans=False)
        nread += v.nbytes + tk.nbytes
        flops += 4 * v.shape[0] * w * (c1 - c0)
    x = signed_columns(x, signs.astype(dt))
    _write(spec.a.path, slice(0, m), slice(c0, c1), x)
    mark_finished(marker)
    return {"bytes_read": nread, "bytes_written": x.nbytes, "flops": flops}


__all__ = ["TileQRSpec", "geqrt", "gemqrt", "tile_qr", "tile_qr_form_q", "tile_qr_stores", "tpmqrt", "tpqrt"]
