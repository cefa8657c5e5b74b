"""Householder QR over stored matrices: left-looking column panels in compact WY form.

The region operations of :func:`blocklin.qr`'s tiled path, beside the triangular and LU panel
operations of :mod:`blocklin.runtime.blockops` (same :class:`~blocklin.runtime.blockops.TileOpSpec`,
resume markers and device interface):

:func:`qr_panels`
    ``A = Q R`` of an ``m x n`` region (``m >= n``), one task per column panel of width ``t``, in a
    chain. Panel ``j`` is read, the block reflectors of the panels before it are applied
    (``P <- (I - V_k T_k V_k^T)^T P``, two GEMMs each), and its trailing ``(m - j t) x t`` part is
    factored by LAPACK ``geqrt`` (Householder, with the compact WY ``T`` of Schreiber and Van Loan
    1989). The panel (``R`` rows above and on its diagonal, the Householder vectors ``V`` below) is
    written once to a work store and ``T`` beside the resume markers, so a rerun skips finished panels.
:func:`qr_extract_r`
    The upper triangle of the packed work store: ``R`` (``n x n``), one task per column panel.
:func:`qr_form_q`
    The thin ``Q`` (``m x n``): panel ``c`` of ``Q`` is ``H_0 ... H_c [I; 0]_c``, the block reflectors
    applied in reverse order (those after ``c`` leave it unchanged); tasks are independent.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from blocklin.errors import InternalError
from blocklin.device import get_device
from blocklin.runtime.blockops import (BlockOps, Region, TileOpSpec, done_marker, holds_device, load_record,
                                       mark_finished, save_record, skip_done, tile_count)
from blocklin.linalg.blocks.tsqr import diagonal_signs, signed_columns
from blocklin.linalg.blocks.tsqr import sumsq as sumsq_of
from blocklin.runtime.tiles import check_finite, open_array, with_task_settings
from blocklin.storage.zarr_store import read_block, write_block


def qr_panels(ops: BlockOps, a: Region, work: Any, *, dtype: Any, done_dir: Any, check: bool = True,
              description: str = "QR panels") -> list[dict]:
    """Left-looking blocked Householder QR of region ``a`` into the store ``work`` (see the module)."""
    m, n = a.shape
    spec = ops.spec(dtype, a=a, out=Region.of(work, (m, n)), check=check, done_dir=done_dir)
    graph = ops.graph("qr", spec)
    prev = None
    for j in range(tile_count(n, ops.chunk)):
        prev = graph.add((j,), qr_panel_task, spec, j, [prev] if prev else [])
    ops.flops += 2 * m * n * n - 2 * n**3 // 3
    return ops.run(graph, description)


def qr_extract_r(ops: BlockOps, work: Any, out: Any, m: int, n: int, *, dtype: Any, signs: np.ndarray,
                 description: str = "R factor") -> list[dict]:
    """``out = diag(signs) triu(work[:n, :n])`` (``R``, rows scaled by ``signs`` = +-1), one task per
    column panel (idempotent)."""
    spec = ops.spec(dtype, a=Region.of(work, (m, n)), out=Region.of(out, (n, n)))
    graph = ops.graph("qr-r", spec, signs.tobytes())
    for j in range(tile_count(n, ops.chunk)):
        graph.add((j,), r_panel_task, spec, j, signs)
    return ops.run(graph, description)


def qr_form_q(ops: BlockOps, work: Any, out: Any, m: int, n: int, *, dtype: Any, done_dir: Any, signs: np.ndarray,
              description: str = "Q factor") -> list[dict]:
    """The thin ``Q`` (``m x n``) of the packed factors in ``work`` into ``out``, columns scaled by
    ``signs`` (one task per panel)."""
    spec = ops.spec(dtype, a=Region.of(work, (m, n)), out=Region.of(out, (m, n)), done_dir=done_dir)
    graph = ops.graph("qr-q", spec, signs.tobytes())
    for c in range(tile_count(n, ops.chunk)):
        graph.add((c,), q_panel_task, spec, c, signs)
    ops.flops += 2 * m * n * n - 2 * n**3 // 3
    return ops.run(graph, description)


def _reflectors(spec: TileOpSpec, work: Region, k: int, dt: np.dtype) -> tuple[np.ndarray, np.ndarray, int]:
    """``V_k`` (rows ``k0:m``, unit lower trapezoid), ``T_k`` and ``k0`` of finished panel ``k`` of ``work``."""
    t = spec.tile
    m, n = work.shape
    k0, k1 = k * t, min(n, (k + 1) * t)
    v = np.array(read_block(open_array(work.path), slice(k0, m), slice(k0, k1)), dtype=dt)
    w = k1 - k0
    v[:w] = np.tril(v[:w], -1) + np.eye(w, dtype=dt)
    return v, np.asarray(load_record(spec, f"qr-t-{k}.npy"), dtype=dt), k0


def _apply_block(dev: Any, v: np.ndarray, tk: np.ndarray, x: np.ndarray, *, transpose: bool) -> None:
    """``x <- (I - V T V^H) x``, or with ``T^H`` (``Q_k^H``) when ``transpose``; ``x`` on the host, in
    place (``^H`` the transpose of real data; complex reflectors as LAPACK's ``zgeqrt``/``zgemqrt``)."""
    dx = dev.to_device(x)
    w = dev.zeros((v.shape[1], x.shape[1]), x.dtype)
    if v.dtype.kind == "c":  # V^H X from conj(V), uploaded conjugated and released before V itself
        dvc = dev.to_device(np.conj(v))
        dev.gemm_acc(w, dvc.T, dx, 1.0)
        del dvc
        dv = dev.to_device(v)
    else:
        dv = dev.to_device(v)
        dev.gemm_acc(w, dv.T, dx, 1.0)  # W = V^T X
    tw = dev.zeros(w.shape, x.dtype)
    dt = dev.to_device(np.ascontiguousarray(tk.conj().T if transpose else tk))
    dev.gemm_acc(tw, dt, w, 1.0)
    dev.gemm_acc(dx, dv, tw, -1.0)  # X -= V (T W)
    x[...] = dev.to_host(dx)


def _geqrt(panel: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """LAPACK ``geqrt`` of a tall host panel: packed ``R``/``V`` and the ``w x w`` compact WY ``T``."""
    from scipy.linalg import lapack

    w = panel.shape[1]
    if w == 0 or panel.shape[0] == 0:
        return panel, np.zeros((w, w), panel.dtype)
    geqrt = lapack.get_lapack_funcs("geqrt", (panel,))
    packed, tk, info = geqrt(w, panel)
    if info < 0:
        raise InternalError(f"geqrt: illegal argument {-info}")
    return packed, tk


@with_task_settings
@holds_device(lambda spec, *_: 2 * spec.a.shape[0] / spec.tile + 3)  # V, X and three w x w blocks
def qr_panel_task(spec: TileOpSpec, j: int, deps: list) -> dict:
    """Panel ``j`` of the left-looking Householder QR (see :func:`qr_panels`)."""
    marker = done_marker(spec, f"qr-{j}")
    if skip_done(marker):
        return {"skipped": 1, **load_record(spec, f"qr-stats-{j}.npy")}
    t, dt = spec.tile, np.dtype(spec.dtype)
    m, n = spec.a.shape
    dev = get_device(spec.device, device_memory=spec.device_memory)
    c0, c1 = j * t, min(n, (j + 1) * t)
    rows, cols = slice(spec.a.off[0], spec.a.off[0] + m), slice(spec.a.off[1] + c0, spec.a.off[1] + c1)
    panel = read_block(open_array(spec.a.path), rows, cols)
    if spec.check:
        check_finite(panel, "a", rows, cols)
    panel = np.array(panel, dtype=dt, order="C")
    sumsq = sumsq_of(panel)
    nread = panel.nbytes
    for k in range(j):  # left-looking: Q_k^T, in panel order (the same bits on every scheduler)
        v, tk, k0 = _reflectors(spec, spec.out, k, dt)
        _apply_block(dev, v, tk, panel[k0:], transpose=True)
        nread += v.nbytes
    packed, tk = _geqrt(np.asfortranarray(panel[c0:]))
    panel[c0:] = packed
    save_record(spec, f"qr-t-{j}.npy", tk)
    diag = np.diag(packed[: c1 - c0])
    # R with a non-negative diagonal (Q's columns flipped alike); of complex data a real one,
    # diag(conj(r_ii) / |r_ii|) R and Q diag(r_ii / |r_ii|)
    signs = diagonal_signs(packed[: c1 - c0]) if dt.kind == "c" else np.where(diag < 0, -1.0, 1.0)
    diag = np.abs(diag)
    stats = {"sumsq": sumsq, "max_r": float(diag.max()) if diag.size else 0.0,
             "min_r": float(diag.min()) if diag.size else 0.0, "signs": signs}
    write_block(open_array(spec.out.path, mode="r+"), slice(0, m), slice(c0, c1), panel)
    save_record(spec, f"qr-stats-{j}.npy", stats)
    mark_finished(marker)
    w = c1 - c0
    return {"bytes_read": nread, "bytes_written": panel.nbytes, **stats,
            "flops": 4 * w * sum(m - k * t for k in range(j)) * t + 2 * w * w * (m - c0)}


@with_task_settings
def r_panel_task(spec: TileOpSpec, j: int, signs: np.ndarray) -> dict:
    """Column panel ``j`` of ``R``: rows ``0:n`` of the packed store, zero below the diagonal, rows
    scaled by ``signs``."""
    t, n = spec.tile, spec.out.shape[0]
    c0, c1 = j * t, min(n, (j + 1) * t)
    block = np.array(read_block(open_array(spec.a.path), slice(0, n), slice(c0, c1)))
    block[c0:] = np.triu(block[c0:])
    block[c1:] = 0
    moduli = np.abs(np.diag(block[c0:c1]))
    block *= signs[:, None].astype(block.dtype)
    if block.dtype.kind == "c":  # the diagonal real, exactly: its moduli
        block[np.arange(c0, c1), np.arange(c1 - c0)] = moduli
    write_block(open_array(spec.out.path, mode="r+"), slice(0, n), slice(c0, c1), block)
    return {"bytes_read": block.nbytes, "bytes_written": block.nbytes}


@with_task_settings
@holds_device(lambda spec, *_: 2 * spec.a.shape[0] / spec.tile + 3)  # V, X and three w x w blocks
def q_panel_task(spec: TileOpSpec, c: int, signs: np.ndarray) -> dict:
    """Column panel ``c`` of the thin ``Q``: ``H_0 ... H_c`` applied to columns ``c0:c1`` of ``[I; 0]``."""
    marker = done_marker(spec, f"qrq-{c}")
    if skip_done(marker):
        return {"skipped": 1}
    t, dt = spec.tile, np.dtype(spec.dtype)
    m, n = spec.out.shape
    dev = get_device(spec.device, device_memory=spec.device_memory)
    c0, c1 = c * t, min(n, (c + 1) * t)
    x = np.zeros((m, c1 - c0), dtype=dt)
    x[c0:c1] = np.eye(c1 - c0, dtype=dt)
    nread = 0
    for k in range(c, -1, -1):  # Q = H_0 H_1 ...: the last block reflector acts first
        v, tk, k0 = _reflectors(spec, spec.a, k, dt)
        _apply_block(dev, v, tk, x[k0:], transpose=False)
        nread += v.nbytes
    x = signed_columns(x, signs[c0:c1].astype(dt))
    write_block(open_array(spec.out.path, mode="r+"), slice(0, m), slice(c0, c1), x)
    mark_finished(marker)
    return {"bytes_read": nread, "bytes_written": x.nbytes,
            "flops": 4 * (c1 - c0) * sum(m - k * t for k in range(c + 1)) * t}
