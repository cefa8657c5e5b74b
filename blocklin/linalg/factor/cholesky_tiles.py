"""Tiled Cholesky numerics over stored regions: the diagonal POTRF and the left-looking tile tasks.

Each lower tile ``L(i, j)`` is one task of a :class:`~blocklin.runtime.blockops.BlockOps` graph
(the GEMM/SYRK updates from the tiles to its left, then POTRF on the diagonal or a TRSM below it),
written once so that a rerun skips finished tiles (Buttari, Langou, Kurzak and Dongarra, "A class
of parallel tiled linear algebra algorithms for multicore architectures", Parallel Computing 35,
2009). The drivers are :mod:`blocklin.linalg.factor.cholesky` and the SPD and stored-Gram solves.
"""

from __future__ import annotations

import math
from collections.abc import Hashable
from typing import Any

import numpy as np

from blocklin.device import get_device
from blocklin.device.base import PANEL_GETRF_THREADS
from blocklin.errors import NotPositiveDefiniteError, SingularMatrixError, explain
from blocklin.linalg.blocks.scaling import nonfinite_refusal
from blocklin.runtime.blockops import (BlockOps, Region, TileOpSpec, done_marker, holds_device, mark_finished,
                                       skip_done, sum_squares, tile_count)
from blocklin.runtime.tiles import with_task_settings


def potrf(ops: BlockOps, a: Region, out: Region, *, dtype: Any, description: str = "potrf") -> list[dict]:
    """Lower Cholesky factor of the diagonal block ``a`` (in core: it must fit the budget) into ``out``."""
    spec = ops.spec(dtype, a=a, out=out, check=True)
    graph = ops.graph("potrf", spec)
    graph.add((0,), potrf_task, spec)
    ops.flops += a.shape[0] ** 3 // 3
    return ops.run(graph, description)


def tiled_cholesky(ops: BlockOps, a: Region, out: Region, *, dtype: Any, check: bool = True, done_dir: Any = None,
             description: str = "cholesky") -> list[dict]:
    """Tiled left-looking Cholesky ``A = L L^H`` of a stored region into ``out`` (lower tiles; ``L L^T``
    of real data).

    Only the lower triangle of ``a`` is read (pass a conjugate-transposed view ``a.H`` to factor from
    the upper one; pass ``out.H`` to store ``L^H``). Tile ``(i, j)`` waits for ``(i, j-1)`` and, below the
    diagonal, for ``(j, j)``: these chains order the whole column ``j`` after column ``j - 1``.
    """
    n = a.shape[0]
    spec = ops.spec(dtype, a=a, out=out, check=check, done_dir=done_dir)
    graph = ops.graph("cholesky", spec)
    nt = tile_count(n, ops.chunk)
    keys: dict[tuple[int, int], Hashable] = {}
    for j in range(nt):
        for i in range(j, nt):
            deps = [keys[(i, j - 1)]] if j else []
            if i > j:
                deps.append(keys[(j, j)])
            keys[(i, j)] = graph.add((i, j), cholesky_tile_task, spec, i, j, deps)
    ops.flops += n**3 // 3
    return ops.run(graph, description)


@with_task_settings
@holds_device(lambda spec: 3 * (spec.a.shape[0] / spec.tile) ** 2)  # the block, its factor, cuSOLVER's work
def potrf_task(spec: TileOpSpec) -> dict:
    """In-core Cholesky of the diagonal block ``spec.a`` written to ``spec.out`` (whole chunks)."""
    dt = np.dtype(spec.dtype)
    n = spec.a.shape[0]
    dev = get_device(spec.device, device_memory=spec.device_memory)
    block = spec.a.read(0, 0, n, dt, spec.check)
    low = _factor_diagonal(dev, dev.to_device(block), 0, spec)
    spec.out.write(0, 0, n, low)
    return {"bytes_read": block.nbytes, "bytes_written": low.nbytes, "flops": n**3 // 3}


@with_task_settings
@holds_device(lambda spec, *_: 5)  # the accumulator, two factor tiles, L(j,j), the solve
def cholesky_tile_task(spec: TileOpSpec, i: int, j: int, deps: list) -> dict:
    """Tile ``L(i, j)`` of the left-looking Cholesky: ``A(i,j) - sum_k L(i,k) L(j,k)^H``, then POTRF
    (``i == j``) or TRSM with ``L(j,j)^H`` (``i > j``); written once, so rerunning it is harmless.
    ``^H`` is the conjugate transpose (LAPACK's ``zherk``/``ztrsm`` with ``'C'``), ``^T`` of real data."""
    marker = done_marker(spec, f"chol-{i}-{j}")
    if skip_done(marker):
        return {"skipped": 1}
    t, dt = spec.tile, np.dtype(spec.dtype)
    dev = get_device(spec.device, device_memory=spec.device_memory)
    host = spec.a.read(i, j, t, dt, spec.check)
    if i == j:  # only the lower triangle is read (as LAPACK's potrf with uplo='L')
        if dt.kind == "c":
            host = _hermitian_diagonal_tile(host, j * t)
        else:
            host = np.tril(host) + np.tril(host, -1).T
    # ||A||_F^2 from the lower tiles (an off-diagonal tile stands for two)
    sumsq = sum_squares(host) * (1 if i == j else 2)
    acc = dev.to_device(host)
    nread = host.nbytes
    for k in range(j):  # fixed order over k: the same bits on every scheduler and worker count
        lik = dev.to_device(spec.out.read(i, k, t, dt))
        ljk = lik if i == j else dev.to_device(spec.out.read(j, k, t, dt))
        dev.gemm_acc(acc, lik, _ct(dev, ljk), -1.0)  # L(i,k) L(j,k)^H (^T of real data)
        nread += lik.nbytes * (1 if i == j else 2)
    if i == j:
        tile = _factor_diagonal(dev, acc, j * t, spec)
    else:
        ljj = dev.to_device(spec.out.read(j, j, t, dt))
        # A(i,j) L(j,j)^-H = (L(j,j)^-1 A(i,j)^H)^H
        tile = _ct(dev, np.asarray(dev.to_host(dev.solve_triangular(ljj, _ct(dev, acc), lower=True))))
        nread += ljj.nbytes
    spec.out.write(i, j, t, tile)
    mark_finished(marker)
    rows, cols = tile.shape
    return {"bytes_read": nread, "bytes_written": tile.nbytes, "sumsq": sumsq,
            "flops": 2 * rows * cols * j * t + (cols**3 // 3 if i == j else rows * cols * cols)}


def _ct(dev: Any, x: Any) -> Any:
    """The conjugate transpose of a host or device tile (its transpose, a view, for real data; a
    device tile is conjugated on the device's compute stream)."""
    if x.dtype.kind != "c":
        return x.T
    with dev.on_compute():
        return x.T.conj()


def hermitian_rtol(dtype: Any) -> float:
    """Largest ``|Im a_jj| / |a_jj|`` a complex Cholesky takes as rounding (``sqrt(eps)``, the relative
    asymmetry :func:`blocklin.eigsh` tolerates): a Hermitian matrix formed in floating point, such as
    ``B @ B.conj().T``, can carry imaginary parts of about ``n eps |a_jj|`` on its diagonal."""
    return math.sqrt(float(np.finfo(np.dtype(dtype)).eps))


def _hermitian_diagonal_tile(host: np.ndarray, offset: int) -> np.ndarray:
    """A complex diagonal tile from its lower triangle, Hermitian: ``tril(A) + tril(A, -1)^H`` with a real
    diagonal. The diagonal of a Hermitian matrix is real: an imaginary part beyond :func:`hermitian_rtol`
    is refused as not Hermitian positive definite, a smaller one dropped (LAPACK's ``zpotrf`` reads
    only the real part of each pivot)."""
    d = np.diagonal(host)
    bad = np.flatnonzero(np.abs(d.imag) > hermitian_rtol(host.dtype) * np.abs(d))
    if bad.size:
        pivot = offset + int(bad[0])
        raise NotPositiveDefiniteError(explain(
            "a", "must be Hermitian positive definite for a Cholesky factorization (a Hermitian matrix has a "
            f"real diagonal; imaginary parts up to {hermitian_rtol(host.dtype):.1e} |a_jj| are taken as rounding)",
            f"a[{pivot}, {pivot}] = {complex(d[bad[0]]):.6g}, not real", "pass a Hermitian matrix (for example "
            "(A + A^H) / 2), or, for a general or complex symmetric matrix, solve with assume_a='gen'"), pivot=pivot)
    low = np.tril(host)
    out = low + np.tril(host, -1).T.conj()
    np.fill_diagonal(out, d.real)
    return out


def _factor_diagonal(dev: Any, acc: Any, offset: int, spec: TileOpSpec) -> np.ndarray:
    """``chol(acc)`` (lower, host array); a failed pivot raises :class:`NotPositiveDefiniteError`
    naming its global index.

    On one BLAS thread, as the LU's panel ``getrf`` (:meth:`~blocklin.device.base.Device.lu_panel`):
    OpenBLAS's threaded ``potrf`` of a 1024 or 2048 tile took 2 to 10 times as long as one thread
    on this project's shared 2-core machine (0.19-0.87 s against 0.05-0.08 s at 1024).
    """
    from blocklin._blas import blas_threads

    try:
        with blas_threads(PANEL_GETRF_THREADS):
            low = dev.cholesky(acc)
        out = np.asarray(dev.to_host(low))
        if np.isfinite(out).all():
            return np.tril(out)
    except SingularMatrixError:
        pass
    from scipy.linalg import lapack

    host = np.array(dev.to_host(acc))
    potrf = lapack.get_lapack_funcs("potrf", (host,))
    size = host.shape[0]
    bad = np.flatnonzero(~np.isfinite(np.tril(host)).all(axis=1))  # rows a NaN or Inf reached
    if not bad.size:  # where the tile's own factorization fails: LAPACK's info, or the rows it overflowed in
        low, info = potrf(host, lower=1, clean=1)
        bad = np.flatnonzero(~np.isfinite(low).all(axis=1)) if info == 0 else np.zeros(0, dtype=int)
    info = int(bad[0]) + 1 if bad.size else max(int(info), 1)
    if bad.size:  # NaN or Inf: of the data, or an overflow of finite data
        if not spec.check:  # one look at the data, on this failure only
            refusal = nonfinite_refusal(_leading_max_abs(spec, (offset + size - 1) // spec.tile),
                                        "a Cholesky factorization")
            if refusal is not None:
                raise refusal
        got = (f"a pivot that overflowed to NaN or Inf at row/column {offset + info - 1} (diagonal tile rows "
               f"{offset}:{offset + size}, in the updates from the columns before it or its own), A's entries "
               "being finite: those of a positive definite A stay within max a_jj")
    else:
        got = (f"a pivot <= 0 at row/column {offset + info - 1} (diagonal tile rows {offset}:{offset + size}, after "
               "the updates from the columns before it)")
    pivot = offset + info - 1
    raise NotPositiveDefiniteError(explain(
        "a", f"must be {'Hermitian' if acc.dtype.kind == 'c' else 'symmetric'} positive definite for a Cholesky "
        "factorization", got,
        "regularize with a ridge (blocklin.solve(a, b, lam=...) or add lam to the diagonal), or, for a "
        "symmetric indefinite or general matrix, solve with assume_a='gen'"), pivot=pivot)


def _leading_max_abs(spec: TileOpSpec, last: int) -> float:
    """``max |a_ij|`` of the lower tiles ``(r, c)``, ``c <= r <= last``, of the data as stored (not cast to the
    factorization's dtype, whose overflow is not the data's), NaN where one holds a NaN: every tile whose
    values reach the diagonal tile ``last``. For a failed pivot of a factorization that ran without the
    finite check: its NaN comes from the data, or from an overflow of finite data."""
    top = 0.0
    for r in range(last + 1):
        for c in range(r + 1):
            block = spec.a.read(r, c, spec.tile, None)
            block = np.tril(block) if r == c else block
            if block.size:
                top = float(np.maximum(top, np.abs(block).max()))  # NaN kept (Python's max drops it)
    return top
