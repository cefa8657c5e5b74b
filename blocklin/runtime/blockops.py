"""Block operations over stored matrices: region GEMMs, copies and scratch stores of one job.

Algorithms that work on sub-blocks of stored matrices (the inverse's Schur complements, Newton-Schulz
steps, the factorizations' tiles and panels) express every step as one of these operations on regions
``[r0:r0+rows, c0:c0+cols]`` of zarr stores whose offsets are multiples of the chunk side, so
that every task still owns whole output chunks. Each operation is one tile graph run through the
job; none builds a Dask graph or a tile spec in the algorithm.

Operations
----------
:meth:`BlockOps.gemm`
    ``out[R] = alpha * A[Ra] @ B[Rb] + beta * C[Rc]`` (``C`` may be the output region itself) on
    the engine's GEMM tile task, planned within the job's budget.
:meth:`BlockOps.copy`
    A whole store into another of the same shape and chunks (column strips).
:meth:`BlockOps.store`
    A new scratch store under the job's temp dir (:meth:`~blocklin.runtime.job.Job.scratch`:
    deterministic names), removed with the job.
:meth:`BlockOps.syrk`
    ``C[R] = beta * C[R] + alpha * op(A) op(A)^T`` on the lower-triangle tiles (or both triangles).
:meth:`BlockOps.trsm`
    ``X = alpha * op(T)^-1 B`` (left) or ``alpha * B op(T)^-1`` (right) for triangular ``T``: one
    chain of tile tasks per tile column of ``X`` (row tiles in substitution order).
:meth:`BlockOps.axpby`, :meth:`BlockOps.sumsq`, :meth:`BlockOps.norm`, :meth:`BlockOps.col_sumsq`
    Tile-wise ``alpha X + beta Y`` and (safe) Frobenius and column norms.
:meth:`BlockOps.permute_rows`
    ``out = src[perm, :]``, one gather per output tile.
:meth:`BlockOps.col_max`, :meth:`BlockOps.scale_columns`
    Column maxima, and each column times a power of two (exact): a cast to a narrower dtype kept in range.

Algorithms with tile tasks of their own (the Cholesky tiles and LU panels of
:mod:`blocklin.linalg.factor`, the Householder panels and the tile QR) build them on the same
pieces: :meth:`BlockOps.graph`, :meth:`BlockOps.spec` and :meth:`BlockOps.run`, :class:`Region`
views, :class:`TileOpSpec`, :func:`holds_device` and the resume markers (:func:`done_marker`,
:func:`skip_done`, :func:`mark_finished`, :func:`save_record`, :func:`load_record`). The numerics
stay with the algorithm; this module holds no factorization.

Operands of these are :class:`Region` views (a rectangle of a store, possibly transposed); the tile
side is the :class:`BlockOps` chunk, so every task writes whole chunks of its output.
"""

from __future__ import annotations

import dataclasses
import math
import functools
import io
import os
from collections.abc import Callable
from typing import Any

import numpy as np

from blocklin.plan.chunks import split
from blocklin.plan.gemm import plan_gemm
from blocklin.runtime.graph import TileGraph
from blocklin.runtime.powers import ldexp, max_exponent
from blocklin.device import get_device
from blocklin.errors import ParameterError, ShapeError, SingularMatrixError, explain
from blocklin.runtime.tiles import Epilogue, GemmSpec, check_finite, gemm_runs, gemm_tiles, open_array, with_task_settings
from blocklin.storage.atomic import is_done, mark_done
from blocklin.storage.backend import backend
from blocklin.storage.zarr_store import read_block, read_kind, write_block


class BlockOps:
    """Region GEMMs, copies and scratch stores of one job.

    Parameters
    ----------
    job : Job
    chunk : int
        Side of the square chunks of every store created here (offsets are multiples of it).
    """

    def __init__(self, job: Any, chunk: int) -> None:
        self.job = job
        self.chunk = chunk
        self.steps = 0
        self.gemms = 0
        self.flops = 0
        #: ``"tf32"``: the float32 GEMMs use TF32 tensor cores on a GPU (``precision="tf32"``; default:
        #: the job's :attr:`~blocklin.runtime.job.Job.math`).
        self.math: str | None = getattr(job, "math", None)
        #: Concurrent tasks of the triangular/symmetric operations (default: the job's workers).
        self.workers: int | None = None

    def graph(self, what: str, *identity: Any) -> TileGraph:
        """A new tile graph for one operation of this job, named by the operation, its step and ``identity``."""
        self.steps += 1
        return TileGraph.named(f"{self.job.operation}-{what}", self.steps, *identity)

    def store(self, name: str, n_rows: int, n_cols: int, dtype: Any) -> str:
        """A new scratch store of square chunks (the job's, deterministically named, removed with it)."""
        return self.job.scratch(name, (n_rows, n_cols), dtype, (self.chunk, self.chunk))

    def gemm(self, out: str, out_off: tuple[int, int], m: int, n: int, k: int, a: str, a_off: tuple[int, int],
             b: str, b_off: tuple[int, int], *, dtype: Any, a_dtype: Any = None, b_dtype: Any = None,
             c: str | None = None, c_off: tuple[int, int] = (0, 0), alpha: float = 1.0, beta: float = 0.0,
             epilogue: Epilogue | None = None, memory: int | None = None, chunks: dict | None = None,
             description: str = "gemm", check_finite: bool = False,
             names: tuple[str, str, str] = ("a", "b", "c"), peaks: bool | None = None) -> list[dict]:
        """``out[R] = alpha * A[Ra] @ B[Rb] + beta * C[Rc]`` over regions; returns the tile results.

        ``check_finite``: refuse NaN/Inf in the operands read (each part checked once, named by ``names``
        with its position in its store) for a caller whose operand reaches the product unchecked.

        ``epilogue`` (an :class:`~blocklin.runtime.tiles.Epilogue` of the caller) sees every
        finished strip; what it returns is in the tile results. ``memory``: the budget of this
        GEMM's plan (default: the job's). ``chunks``: the stores' chunks by operand (``"a"``, ``"b"``,
        ``"c"``, ``"out"``), each default the ops' square tile; see :func:`gemm_chunks`. Planned for
        the reads the tiles will make (:func:`~blocklin.storage.zarr_store.read_kind`). ``peaks``: each
        tile's result holds the peaks of the strips it wrote (:attr:`~blocklin.runtime.tiles.GemmSpec.peaks`,
        NaN kept): a finite check of the product on the strips in memory, not another pass.
        """
        job = self.job
        dt = np.dtype(dtype)
        with_c = c is not None and beta != 0.0
        plan = plan_block_gemm(job, self.chunk, m, n, k, dtype=dt, a_dtype=a_dtype, b_dtype=b_dtype, with_c=with_c,
                               memory=memory, chunks=chunks,
                               reads=(read_kind(a), read_kind(b)) + ((read_kind(c),) if with_c else ()))
        dev_mem = job.device_memory()
        spec = GemmSpec(a=a, b=b, c=c, out=out, trans_a=False, trans_b=False, alpha=float(alpha), beta=float(beta),
                        dtype=dt.name, plan=plan, device=job.device, device_memory=dev_mem, check_finite=check_finite,
                        done_dir=None, blas_threads=job.task_blas_threads(plan.blas_threads), names=tuple(names),
                        a_off=tuple(a_off),
                        b_off=tuple(b_off), c_off=tuple(c_off), out_off=tuple(out_off), epilogue=epilogue,
                        precision=self.math if dt == np.float32 else None, peaks=peaks)
        graph = self.graph("gemm", spec)
        graph.expect(plan.n_tasks, gemm_tiles)  # before the tiles are listed
        for run in gemm_runs(list(plan.tiles()), plan.workers, job.scheduler.kind):
            graph.add(run[0][:2], gemm_tiles, spec, run, units=len(run))
        results = job.run(graph, workers=plan.workers, blas_threads=plan.blas_threads, description=description)
        self.gemms += 1
        self.flops += plan.flops
        return results

    def copy(self, src: str, dst: str, n: int) -> None:
        """Copy an ``n x n`` store (same chunks) column strip by column strip (one pass over ``src``)."""
        graph = self.graph("copy", src, dst)
        for s, (c0, c1) in enumerate(column_strips(n, self.chunk)):
            graph.add((s,), copy_columns_task, src, dst, c0, c1)
        self.job.run(graph, workers=self.job.workers(1), description="copy", count_pass="intermediate")

    # -- triangular and symmetric tile operations ---------------------------------------------
    def spec(self, dtype: Any, **fields: Any) -> TileOpSpec:
        """A :class:`TileOpSpec` of this job's tile side, device, budget and math mode with ``fields``."""
        job = self.job
        dev = job.device
        dt = np.dtype(dtype)
        return TileOpSpec(tile=self.chunk, dtype=dt.name, device=dev,
                          device_memory=job.device_memory() if dev == "gpu" else None,
                          blas_threads=job.task_blas_threads(job.cores()),
                          math=self.math if dt == np.float32 else None, **fields)

    def run(self, graph: TileGraph, description: str) -> list[dict]:
        """Run ``graph``; with one worker, in the calling thread on the local threaded scheduler
        (:meth:`~blocklin.runtime.job.Job.run`'s ``in_caller``: tasks run one at a time anyway)."""
        job = self.job
        workers = self.workers or job.workers(1)
        return job.run(graph, workers=workers, blas_threads=max(1, job.cores() // workers), description=description,
                       in_caller=workers == 1)

    def syrk(self, out: Region, a: Region, *, dtype: Any, alpha: float = 1.0, beta: float = 0.0,
             c: Region | None = None, full: bool = False, check: bool = False, shift: float = 0.0,
             done_dir: Any = None, rhs: Region | None = None, rhs_out: Region | None = None,
             description: str = "syrk", decoded: tuple[int, int, int] | None = None) -> list[dict]:
        """``out = beta * C + alpha * A A^T + shift * I`` (``A`` an ``n x k`` region, transposed views allowed;
        ``A A^H`` of complex data, HERK: Hermitian, its diagonal real). ``decoded``: ``A``'s chunks where zarr
        decodes them whole, whose temporaries the blocks are planned with (as the caller planned them).

        The lower triangle is covered by square output blocks as large as the budget allows
        (:func:`~blocklin.plan.gram.plan_syrk_blocks`, a multiple of the chunk side): one task per
        block ``(I, J)``, ``I >= J``, accumulating in core over slices of ``A``'s ``k`` columns in
        order (read as stored, transposes passed to BLAS as flags; SYRK on the diagonal blocks),
        then writing each of its lower chunks once; so ``A`` is read about ``n / block`` times, not
        once per tile. With ``full`` the mirrored upper chunks are written too. ``check`` tests the
        slices of ``A`` for NaN/Inf; ``shift`` is added to the diagonal (a ridge); with
        ``done_dir`` (an atomic output's markers) finished blocks are skipped on resume. With
        ``rhs`` (``k x r``) the diagonal blocks, which read every slice of their rows of ``A``,
        also write ``rhs_out = alpha * A @ rhs`` (``n x r``; ``A^T b`` beside ``A^T A``) in the
        same read.

        An ``alpha`` of magnitude ``2^(2q)`` or more (or ``2^-(2q)`` or less) goes into ``A``: its slices are
        multiplied by ``2^q`` as read (exact) and the products by ``alpha / 4^q``, so that a Gram whose
        unscaled squares underflow or overflow while ``alpha A A^T`` does not (``gram(a, scale=...)``) is
        formed in range; the same bits as ``alpha`` applied after wherever neither did.
        """
        from blocklin.plan.gram import plan_syrk_blocks

        n, k = a.shape
        if out.shape != (n, n) or (c is not None and c.shape != (n, n)):
            raise ShapeError(f"syrk: out {out.shape} and c {c and c.shape} must be {n} x {n}")
        if (rhs is None) != (rhs_out is None) or (rhs is not None and (rhs.shape[0] != k or
                                                                       rhs_out.shape != (n, rhs.shape[1]))):
            raise ShapeError(f"syrk: rhs {rhs and rhs.shape} and rhs_out {rhs_out and rhs_out.shape} must be "
                             f"{k} x r and {n} x r")
        src = open_array(a.path)
        k_chunk = src.chunks[0] if a.trans else src.chunks[1]
        sb = plan_syrk_blocks(n, k, dtype, memory=self.job.cfg.memory, tile=self.chunk, source_dtype=src.dtype,
                              workers=self.workers or self.job.workers(1), k_chunk=k_chunk, decoded=decoded,
                              trans=not a.trans)
        q = (int(np.frexp(alpha)[1]) - 1) // 2 if np.isfinite(alpha) and alpha != 0 else 0
        spec = self.spec(dtype, a=a, out=out, c=c, b=rhs, lower=True, alpha=float(np.ldexp(alpha, -2 * q)),
                         beta=float(beta), full=full, check=check, shift=float(shift), done_dir=done_dir)
        spec = dataclasses.replace(spec, block=sb.block, rows=sb.rows, rhs_out=rhs_out, a_exponent=q)
        graph = self.graph("syrk", spec)
        for bi in range(sb.blocks):
            for bj in range(bi + 1):
                graph.add((bi, bj), syrk_tile_task, spec, bi, bj)
        self.flops += n * n * k
        job = self.job
        return job.run(graph, workers=sb.workers, blas_threads=max(1, job.cores() // sb.workers),
                       description=description)

    def trsm(self, t: Region, b: Region, out: Region, *, lower: bool, trans: bool | str = False, side: str = "left",
             alpha: float = 1.0, dtype: Any, check: bool = False, done_dir: Any = None, unit: bool = False,
             t_exponent: int = 0, description: str = "trsm", name: str = "t") -> list[dict]:
        """``out = alpha * op(T)^-1 B`` (``side="left"``) or ``alpha * B op(T)^-1`` (``"right"``).

        ``T`` is read only in its ``lower`` (or upper) triangle; ``op(T)`` is ``T`` (``trans`` False
        or ``"N"``), ``T^T`` (True or ``"T"``) or ``T^H`` (``"C"``, BLAS's conjugate transpose; ``T^T``
        of real data); ``unit``: ``T`` has a unit diagonal, not read (the ``L`` of a packed LU).
        The right-side solve is the left-side solve of the transposed system
        (``op(T)^T X^T = B^T``), read and written through transposed views. Tile ``(i, c)`` of
        ``X`` is one task: ``B(i, c)`` minus the products with the already solved tiles of
        column ``c`` (in substitution order), then a triangular solve with the diagonal tile.
        ``t_exponent`` ``q``: ``T`` and ``B`` are multiplied by ``2^q`` as read, which leaves ``X``
        unchanged (exact) and keeps the products ``T_ik X_kc`` in range where ``T``'s entries are large.
        ``name``: the caller's parameter for ``T``, which its refusals (NaN/Inf, a singular tile) name.
        """
        if t_exponent and unit:
            raise ParameterError("trsm: a unit diagonal is not scaled (t_exponent must be 0 with unit=True)")
        if side not in ("left", "right"):
            raise ParameterError(f"trsm: side must be 'left' or 'right', got {side!r}")
        op = {False: "N", True: "T"}.get(trans, trans) if isinstance(trans, bool) else trans
        if op not in ("N", "T", "C"):
            raise ParameterError(f"trsm: trans must be 'N', 'T', 'C' or a bool, got {trans!r}")
        n = t.shape[0]
        if side == "right":  # X op(T) = B is op(T)^T X^T = B^T: op(T)^T is T^T, T, or conj(T)
            t_l = {"N": t.T, "T": t, "C": dataclasses.replace(t, conj=not t.conj)}[op]
            b_l, x_l = b.T, out.T
        else:
            t_l, b_l, x_l = {"N": t, "T": t.T, "C": t.H}[op], b, out
        lower_eff = lower != (t_l.trans != t.trans)
        if t.shape != (n, n) or b_l.shape[0] != n or x_l.shape != b_l.shape:
            raise ShapeError(f"trsm: shapes do not agree: t {t.shape}, b {b.shape}, out {out.shape}, side {side}")
        spec = self.spec(dtype, a=t_l, b=b_l, out=x_l, alpha=float(alpha), lower=lower_eff, check=check,
                          done_dir=done_dir, unit=unit, a_exponent=int(t_exponent), a_name=name)
        graph = self.graph("trsm", spec)
        nt, ct = tile_count(n, self.chunk), tile_count(b_l.shape[1], self.chunk)
        order = range(nt) if lower_eff else range(nt - 1, -1, -1)
        for c in range(ct):
            prev = None
            for i in order:
                prev = graph.add((i, c), trsm_tile_task, spec, i, c, [prev] if prev else [])
        self.flops += n * n * b_l.shape[1]
        return self.run(graph, description)

    def axpby(self, out: Region, x: Region, y: Region, *, alpha: float = 1.0, beta: float = 1.0, dtype: Any,
              description: str = "axpby") -> list[dict]:
        """``out = alpha * X + beta * Y`` tile by tile (``out`` may be ``X`` or ``Y``: each task
        reads and writes its own tile). Returns per-tile ``sumsq`` of ``out`` (float64)."""
        spec = self.spec(dtype, a=x, b=y, out=out, alpha=float(alpha), beta=float(beta))
        graph = self.graph("axpby", spec)
        for i in range(tile_count(out.shape[0], self.chunk)):
            for j in range(tile_count(out.shape[1], self.chunk)):
                graph.add((i, j), axpby_tile_task, spec, i, j)
        return self.run(graph, description)

    def sumsq(self, a: Region, *, description: str = "norm") -> float:
        """``||A||_F^2`` of a region (float64, summed in tile order)."""
        spec = self.spec(np.float64, a=a, out=a)
        graph = self.graph("sumsq", spec)
        for i in range(tile_count(a.shape[0], self.chunk)):
            for j in range(tile_count(a.shape[1], self.chunk)):
                graph.add((i, j), sumsq_tile_task, spec, i, j)
        return float(sum(r["sumsq"] for r in self.run(graph, description)))

    def norm(self, a: Region, *, description: str = "norm") -> float:
        """``||A||_F`` of a region without overflow or underflow (each tile's sum of squares is taken of
        the tile divided by a power of two near its largest entry; the tiles combined by ``hypot``)."""
        spec = self.spec(np.float64, a=a, out=a)
        graph = self.graph("safenorm", spec)
        for i in range(tile_count(a.shape[0], self.chunk)):
            for j in range(tile_count(a.shape[1], self.chunk)):
                graph.add((i, j), sumsq_tile_task, spec, i, j, False, True)
        return float(math.hypot(*(r["norm"] for r in self.run(graph, description))))

    def asymmetry(self, a: Region, *, description: str = "||A - A^H||_F") -> float:
        """``||A - A^H||_F`` of a square region (``A - A^T`` of real data) without overflow or underflow:
        each tile of ``A`` against the conjugate transpose of its mirror tile, scaled as :meth:`norm`."""
        spec = self.spec(np.float64, a=a, b=a.H, out=a)
        graph = self.graph("asymmetry", spec)
        for i in range(tile_count(a.shape[0], self.chunk)):
            for j in range(tile_count(a.shape[1], self.chunk)):
                graph.add((i, j), asymmetry_tile_task, spec, i, j)
        return float(math.hypot(*(r["norm"] for r in self.run(graph, description))))

    def col_sumsq(self, a: Region, *, description: str = "column norms") -> np.ndarray:
        """Sums of squares of the columns of a region (float64, summed in tile order)."""
        spec = self.spec(np.float64, a=a, out=a)
        graph = self.graph("colsumsq", spec)
        for i in range(tile_count(a.shape[0], self.chunk)):
            for j in range(tile_count(a.shape[1], self.chunk)):
                graph.add((i, j), sumsq_tile_task, spec, i, j, True)
        total = np.zeros(a.shape[1])
        for r in self.run(graph, description):  # in key order: deterministic sums
            c0, cols = r["columns"]
            total[c0:c0 + cols.size] += cols
        return total

    def col_max(self, a: Region, *, description: str = "column maxima") -> np.ndarray:
        """The largest magnitude of each column of a region (float64; of the real and imaginary parts of
        complex data: what a cast to a narrower dtype overflows or flushes). NaN is passed over."""
        spec = self.spec(np.float64, a=a, out=a)
        graph = self.graph("colmax", spec)
        for i in range(tile_count(a.shape[0], self.chunk)):
            for j in range(tile_count(a.shape[1], self.chunk)):
                graph.add((i, j), col_max_tile_task, spec, i, j)
        top = np.zeros(a.shape[1])
        for r in self.run(graph, description):
            c0, cols = r["columns"]
            np.fmax(top[c0:c0 + cols.size], cols, out=top[c0:c0 + cols.size])
        return top

    def scale_columns(self, src: Region, out: Region, exponents: np.ndarray, *, dtype: Any,
                      description: str = "columns times powers of two") -> list[dict]:
        """``out = src diag(2^e)``: each column multiplied by its power of two in ``dtype`` (exact where the
        product is within its range), tile by tile, and written in ``out``'s stored dtype (cast there)."""
        e = np.asarray(exponents, dtype=np.intc)
        if src.shape != out.shape or e.shape != (src.shape[1],):
            raise ShapeError(f"scale_columns: src {src.shape}, out {out.shape}, exponents {e.shape}")
        spec = self.spec(dtype, a=src, out=out)
        graph = self.graph("scalecols", spec, e.tobytes())
        for i in range(tile_count(out.shape[0], self.chunk)):
            for j in range(tile_count(out.shape[1], self.chunk)):
                graph.add((i, j), scale_columns_task, spec, i, j, e)
        return self.run(graph, description)

    def permute_rows(self, src: Region, out: Region, perm: np.ndarray, *, dtype: Any,
                     description: str = "row permutation") -> list[dict]:
        """``out = src[perm, :]`` (``perm`` a permutation of the rows), one task per output tile; each
        task gathers its rows with one orthogonal selection of the stored ``src`` (not transposed)."""
        if src.trans or out.trans or src.shape != out.shape or len(perm) != src.shape[0]:
            raise ShapeError(f"permute_rows: src {src.shape}, out {out.shape}, perm {len(perm)} (no transposed views)")
        spec = self.spec(dtype, a=src, out=out)
        graph = self.graph("permute", spec, np.asarray(perm).tobytes())
        for i in range(tile_count(out.shape[0], self.chunk)):
            for j in range(tile_count(out.shape[1], self.chunk)):
                graph.add((i, j), permute_rows_task, spec, i, j, perm)
        return self.run(graph, description)


def gemm_chunks(tile: int, *, a: tuple | None = None, b: tuple | None = None, c: tuple | None = None,
                out: tuple | None = None) -> dict:
    """The chunks :meth:`BlockOps.gemm` plans its operands on: each store's own where the caller names
    it, else the square ``tile`` (the ops' stores). Planned on a tile's square chunks, a product read a
    user's input at other chunks, so its least budget grew with the tile: a solve refused at twice a
    budget that ran (a 73 x 73 ``A`` in (50, 20) chunks: 109 KiB ran, 218 KiB was refused)."""
    sq = (tile, tile)
    return {"a": tuple(a or sq), "b": tuple(b or sq), "c": tuple(c or sq), "out": tuple(out or sq)}


def plan_block_gemm(job: Any, tile: int, m: int, n: int, k: int, *, dtype: Any, a_dtype: Any = None,
                    b_dtype: Any = None, with_c: bool = False, memory: int | None = None, chunks: dict | None = None,
                    reads: tuple[str, ...]) -> Any:
    """The plan :meth:`BlockOps.gemm` runs, for a caller that plans its products before their stores
    exist (``reads`` then as :func:`~blocklin.operands.temp_store_reads` predicts them): the same
    chunks (:func:`gemm_chunks`), budget, workers and device."""
    dt = np.dtype(dtype)
    ch = gemm_chunks(tile, **(chunks or {}))
    return plan_gemm(m, n, k, dt, a_chunks=ch["a"], b_chunks=ch["b"], memory=job.cfg.memory if memory is None else memory,
                     source_dtypes=(np.dtype(a_dtype or dt), np.dtype(b_dtype or dt)),
                     c_chunks=ch["c"] if with_c else None, workers=job.workers(1), cores=job.cores(),
                     device=job.device, device_memory=job.device_memory(), out_chunks=ch["out"], reads=reads)


def copy_columns_task(src_path: str, dst_path: str, c0: int, c1: int) -> dict:
    """Copy the column strip ``[:, c0:c1]`` (whole chunks) from one store to another."""
    src, dst = open_array(src_path), open_array(dst_path, mode="r+")
    n = src.shape[0]
    block = read_block(src, slice(0, n), slice(c0, c1))
    write_block(dst, slice(0, n), slice(c0, c1), block)
    return {"bytes_read": block.nbytes, "bytes_written": block.nbytes}


def column_strips(n: int, width: int) -> list[tuple[int, int]]:
    """Column strips of ``width`` (a multiple of the chunk width) covering ``range(n)``."""
    return split(n, width)


# -- region views and the triangular/symmetric tile tasks ----------------------------------------------


@dataclasses.dataclass(frozen=True)
class Region:
    """The matrix ``X[r0:r0+rows, c0:c0+cols]`` of store ``path``, or its transpose when ``trans``,
    its complex conjugate when ``conj`` (``.H``: the conjugate transpose; a no-op on real data).

    ``shape`` is the shape of the view (transposed when ``trans``). Tiles of side ``t`` of the view
    map onto whole chunks of the store when the offsets are multiples of the chunk side and ``t``
    is that side. A conjugated view is conjugated as it is read and as it is written.
    """

    #: A local path, URL or :class:`~blocklin.storage.location.Location` (storage options kept).
    path: Any
    off: tuple[int, int]
    stored: tuple[int, int]
    trans: bool = False
    conj: bool = False

    @classmethod
    def of(cls, path: Any, shape: tuple[int, int], off: tuple[int, int] = (0, 0)) -> Region:
        if isinstance(path, os.PathLike) and not hasattr(path, "url"):  # a pathlib path; Locations stay
            path = os.fspath(path)
        return cls(path, (int(off[0]), int(off[1])), (int(shape[0]), int(shape[1])))

    @property
    def shape(self) -> tuple[int, int]:
        return (self.stored[1], self.stored[0]) if self.trans else self.stored

    @property
    def T(self) -> Region:  # noqa: N802
        return dataclasses.replace(self, trans=not self.trans)

    @property
    def H(self) -> Region:  # noqa: N802
        """The conjugate transpose (LAPACK's ``'C'``; the transpose of real data)."""
        return dataclasses.replace(self, trans=not self.trans, conj=not self.conj)

    def _conj(self, block: np.ndarray) -> np.ndarray:
        return np.conj(block) if self.conj and block.dtype.kind == "c" else block

    def _stored_slices(self, i: int, j: int, t: int) -> tuple[slice, slice]:
        rows, cols = self.shape
        rs = slice(i * t, min(rows, (i + 1) * t))
        cs = slice(j * t, min(cols, (j + 1) * t))
        if self.trans:
            rs, cs = cs, rs
        return (slice(self.off[0] + rs.start, self.off[0] + rs.stop),
                slice(self.off[1] + cs.start, self.off[1] + cs.stop))

    def read(self, i: int, j: int, t: int, dtype: Any, check: bool = False, name: str = "a") -> np.ndarray:
        """Tile ``(i, j)`` of the view, C-contiguous, in ``dtype``."""
        rs, cs = self._stored_slices(i, j, t)
        block = read_block(open_array(self.path), rs, cs)
        if check:
            check_finite(block, name, rs, cs)
        block = self._conj(block.T if self.trans else block)
        return np.ascontiguousarray(block, dtype=dtype)

    def read_stored(self, rows: slice, cols: slice, dtype: Any = None, check: bool = False,
                    name: str = "a") -> np.ndarray:
        """``view[rows, cols]`` as stored: its ``.T`` when the view is transposed (no copy for the
        transpose; cast to ``dtype`` when given; conjugated when the view is)."""
        if self.trans:
            rows, cols = cols, rows
        rs = slice(self.off[0] + rows.start, self.off[0] + rows.stop)
        cs = slice(self.off[1] + cols.start, self.off[1] + cols.stop)
        block = read_block(open_array(self.path), rs, cs)
        if check:
            check_finite(block, name, rs, cs)
        block = self._conj(block)
        return block if dtype is None else np.asarray(block, dtype=dtype)

    def read_rows(self, rows: slice, dtype: Any, check: bool = False, name: str = "a") -> np.ndarray:
        """Rows ``rows`` of the view, every column, C-contiguous, in ``dtype``."""
        block = self.read_stored(rows, slice(0, self.shape[1]), check=check, name=name)
        return np.ascontiguousarray(block.T if self.trans else block, dtype=dtype)

    def write_rows(self, rows: slice, block: np.ndarray) -> None:
        """Rows ``rows`` of the view, every column, from ``block`` (as :meth:`read_rows` reads them)."""
        rs = slice(self.off[0] + rows.start, self.off[0] + rows.stop)
        cs = slice(self.off[1], self.off[1] + self.shape[1])
        if self.trans:
            rs, cs = slice(self.off[0], self.off[0] + self.shape[1]), slice(self.off[1] + rows.start,
                                                                            self.off[1] + rows.stop)
        write_block(open_array(self.path, mode="r+"), rs, cs, self._conj(block.T if self.trans else block))

    def write(self, i: int, j: int, t: int, block: np.ndarray) -> None:
        rs, cs = self._stored_slices(i, j, t)
        write_block(open_array(self.path, mode="r+"), rs, cs, self._conj(block.T if self.trans else block))


@dataclasses.dataclass(frozen=True)
class TileOpSpec:
    """One triangular/symmetric tile operation as its tasks see it (regions, flags, device)."""

    tile: int
    dtype: str
    device: str
    device_memory: int | None
    blas_threads: int | None
    a: Region
    out: Region
    b: Region | None = None
    c: Region | None = None
    alpha: float = 1.0
    beta: float = 0.0
    lower: bool = True
    full: bool = False
    check: bool = False
    #: Folder of the resume markers (a Location of the atomic output), or None.
    done_dir: Any = None
    shift: float = 0.0
    #: A triangular operand with a unit diagonal (not read).
    unit: bool = False
    #: The parameter the caller knows the triangular operand by, in refusals (``"c"`` of ``cho_solve``).
    a_name: str = "t"
    #: ``"tf32"``: the task's float32 GEMMs use TF32 tensor cores on a GPU (``Device.math``).
    math: str | None = None
    #: SYRK: side of the output blocks, rows of ``k`` per slice, and where ``A @ rhs`` goes.
    block: int = 0
    rows: int = 0
    rhs_out: Region | None = None
    #: SYRK: the power of two ``A``'s slices are multiplied by as read (part of ``alpha``, :meth:`BlockOps.syrk`);
    #: TRSM: that of ``T`` and ``B`` (``X`` unchanged, :meth:`BlockOps.trsm`).
    a_exponent: int = 0
    #: Return the allocator's free pages before the task (:func:`~blocklin._memory.release_free_memory`).
    trim: bool = False
    #: LU right-hand sides: the columns from ``split`` on are solved by BLAS calls of their own, on the same
    #: reads of the factor (:func:`~blocklin.linalg.factor.lu_panels.rhs_parts`); 0: all in one.
    split: int = 0


def holds_device(tiles: Callable[..., float]) -> Callable:
    """Run a tile task holding ``tiles(spec, *args)`` square tiles (``spec.tile`` wide, ``spec.dtype``)
    from the device budget that every task on its GPU shares, in the spec's math mode.

    Tasks of one process that share a GPU (several threads of a worker) then wait for each other
    rather than exceed ``device_memory`` together, as the GEMM tile and row-pass tasks do; a no-op
    on the CPU, whose tasks the host budget bounds.
    """

    def wrap(task: Callable) -> Callable:
        @functools.wraps(task)
        def run(spec: TileOpSpec, *args: Any) -> Any:
            dev = get_device(spec.device, device_memory=spec.device_memory)
            nbytes = int(tiles(spec, *args) * spec.tile * spec.tile * np.dtype(spec.dtype).itemsize)
            with dev.reserve(nbytes), dev.math(spec.math):
                return task(spec, *args)
        return run
    return wrap


def tile_count(n: int, t: int) -> int:
    """Tiles of side ``t`` covering ``n`` rows or columns."""
    return -(-n // t)


def done_marker(spec: TileOpSpec, unit: str) -> tuple[Any, str] | None:
    """The resume marker of ``unit`` (``None`` when the operation keeps none)."""
    return (spec.done_dir, unit) if spec.done_dir is not None else None


def skip_done(marker: tuple[Any, str] | None) -> bool:
    """Whether a rerun skips this unit: its marker exists."""
    return marker is not None and is_done(*marker)


def mark_finished(marker: tuple[Any, str] | None) -> None:
    """Mark a unit finished, after its chunks are written."""
    if marker is not None:
        mark_done(*marker)


def save_record(spec: TileOpSpec, name: str, value: Any) -> None:
    """A small array or object next to the resume markers (pivots, statistics)."""
    buf = io.BytesIO()
    np.save(buf, np.asarray(value) if not isinstance(value, dict) else np.array(value, dtype=object),
            allow_pickle=isinstance(value, dict))
    backend(spec.done_dir).write_bytes(name, buf.getvalue())


def load_record(spec: TileOpSpec, name: str) -> Any:
    """What :func:`save_record` kept under ``name``."""
    x = np.load(io.BytesIO(backend(spec.done_dir).read_bytes(name)), allow_pickle=True)
    return x.item() if x.dtype == object else x


def _scaled(x: np.ndarray, e: int) -> np.ndarray:
    """``x * 2^e`` (exact where it fits); ``x`` for ``e = 0``. A block read into an array of its own
    (:func:`~blocklin.storage.zarr_store.read_block` allocates one; nothing caches blocks) is scaled where
    it lies, so the slice costs no second copy beside the two the plan counts
    (:func:`~blocklin.plan.gram.syrk_block_memory`); a view is copied."""
    if not e:
        return x
    x = np.asarray(x)
    return ldexp(x, e, out=x) if x.flags.owndata and x.flags.writeable else ldexp(x, e)


@with_task_settings
@holds_device(lambda spec, *_: (spec.block ** 2 + 2 * spec.block * spec.rows  # accumulator, two slices of A
                                  + (spec.block * spec.b.shape[1] if spec.b is not None else 0)) / spec.tile ** 2)
def syrk_tile_task(spec: TileOpSpec, bi: int, bj: int) -> dict:
    """Output block ``(bi, bj)`` (``bi >= bj``) of ``beta * C + alpha * A A^T + shift * I`` (see
    :meth:`BlockOps.syrk`): accumulated over the slices of ``k`` in order, its lower chunks written
    once (and mirrored with ``full``)."""
    marker = done_marker(spec, f"syrk-{bi}-{bj}")
    if skip_done(marker):
        return {"skipped": 1}
    T, t, dt = spec.block, spec.tile, np.dtype(spec.dtype)
    n, k = spec.a.shape
    rI = slice(bi * T, min(n, (bi + 1) * T))
    rJ = slice(bj * T, min(n, (bj + 1) * T))
    diag = bi == bj
    cplx = dt.kind == "c"  # A A^H (HERK): the conjugate of the right factor, a Hermitian result
    dev = get_device(spec.device, device_memory=spec.device_memory)
    acc = dev.zeros((rI.stop - rI.start, rJ.stop - rJ.start), dt)
    racc = dev.zeros((rI.stop - rI.start, spec.b.shape[1]), dt) if diag and spec.b is not None else None
    nread = 0
    for k0 in range(0, k, spec.rows):  # fixed order over k: the same bits on every scheduler
        ks = slice(k0, min(k, k0 + spec.rows))
        # the view's block a[I, ks] is stored as A[ks, I] (a transposed view) or A[I, ks]
        si = _scaled(spec.a.read_stored(rI, ks, dt, spec.check, "a"), spec.a_exponent)
        nread += si.nbytes
        si = dev.to_device(si)
        ai = si.T if spec.a.trans else si  # a[I, ks]
        if diag:  # lower(a_I a_I^H): the device's SYRK of b = conj(a_I)^T, b^H b (HERK of complex data)
            if cplx:
                with dev.on_compute():  # conjugated where the device computes (ordered with the upload)
                    b = ai.T.conj()
                dev.syrk_lower_acc(acc, b)
                del b
            else:
                dev.syrk_lower_acc(acc, ai.T)
        else:  # a_I a_J^H: a_J conjugated on the host as it is read
            sj = _scaled(spec.a.read_stored(rJ, ks, dt, spec.check, "a"), spec.a_exponent)
            sj = dev.to_device(np.conj(sj) if cplx else sj)
            nread += sj.nbytes
            dev.gemm_acc(acc, ai, sj if spec.a.trans else sj.T)
            del sj
        if racc is not None:
            bk = dev.to_device(spec.b.read_rows(ks, dt, spec.check, "b"))
            dev.gemm_acc(racc, ai, bk)
            nread += bk.nbytes
        del si, ai
    host = np.asarray(dev.to_host(acc))
    del acc
    nwritten = 0
    for ci in range(rI.start // t, -(-rI.stop // t)):
        for cj in range(rJ.start // t, min(ci + 1, -(-rJ.stop // t)) if diag else -(-rJ.stop // t)):
            r0, c0 = ci * t - rI.start, cj * t - rJ.start
            blk = host[r0:r0 + t, c0:c0 + t]
            if diag and ci == cj:  # symmetric from its lower triangle (the upper one is undefined after SYRK)
                blk = np.tril(blk)
                if cplx:  # Hermitian, the diagonal real (HERK's convention)
                    blk += np.tril(blk, -1).T.conj()
                    blk.imag[np.diag_indices_from(blk)] = 0
                else:
                    blk += np.tril(blk, -1).T
            else:
                blk = np.array(blk)
            if spec.alpha != 1.0:
                blk *= dt.type(spec.alpha)
            if spec.c is not None and spec.beta != 0.0:
                blk += dt.type(spec.beta) * spec.c.read(ci, cj, t, dt)
            if spec.shift and ci == cj:
                blk[np.diag_indices_from(blk)] += dt.type(spec.shift)
            spec.out.write(ci, cj, t, blk)
            nwritten += blk.nbytes
            if spec.full and ci != cj:
                spec.out.write(cj, ci, t, np.ascontiguousarray(blk.T.conj() if cplx else blk.T))
                nwritten += blk.nbytes
    if racc is not None:
        rh = np.asarray(dev.to_host(racc))
        if spec.a_exponent:  # alpha A rhs = (alpha / 4^q) 2^q (2^q A) rhs
            rh = _scaled(rh, spec.a_exponent)
        if spec.alpha != 1.0:
            rh = rh * dt.type(spec.alpha)
        for ci in range(rI.start // t, -(-rI.stop // t)):
            r0 = ci * t - rI.start
            for cj in range(tile_count(rh.shape[1], t)):
                spec.rhs_out.write(ci, cj, t, np.ascontiguousarray(rh[r0:r0 + t, cj * t:(cj + 1) * t]))
        nwritten += rh.nbytes
    mark_finished(marker)
    return {"bytes_read": nread, "bytes_written": nwritten,
            "flops": host.shape[0] * host.shape[1] * k * (1 if diag else 2)}


@with_task_settings
@holds_device(lambda spec, *_: 5)  # the accumulator, two product tiles, the diagonal tile, the solve
def trsm_tile_task(spec: TileOpSpec, i: int, c: int, deps: list) -> dict:
    """Tile ``(i, c)`` of ``X = alpha * T^-1 B``: ``T(i,i)^-1 (alpha B(i,c) - sum_k T(i,k) X(k,c))``."""
    marker = done_marker(spec, f"trsm-{i}-{c}")
    if skip_done(marker):
        return {"skipped": 1}
    t, dt = spec.tile, np.dtype(spec.dtype)
    dev = get_device(spec.device, device_memory=spec.device_memory)
    q = spec.a_exponent
    acc = dev.to_device(_scaled(spec.b.read(i, c, t, dt, spec.check, "b"), q))
    if spec.alpha != 1.0:
        dev.axpby(acc, spec.alpha, None, 0.0)
    nt = tile_count(spec.a.shape[0], t)
    before = range(i) if spec.lower else range(i + 1, nt)
    nread = acc.nbytes
    for k in before:  # substitution order: identical sums on every scheduler
        tik = dev.to_device(_scaled(spec.a.read(i, k, t, dt, spec.check, spec.a_name), q))
        xkc = dev.to_device(spec.out.read(k, c, t, dt))
        dev.gemm_acc(acc, tik, xkc, -1.0)
        nread += tik.nbytes + xkc.nbytes
    tri = _triangle(_scaled(spec.a.read(i, i, t, dt, spec.check, spec.a_name), q), spec.lower)
    if spec.unit:
        np.fill_diagonal(tri, 1)
    tii = dev.to_device(tri)
    try:
        x = np.asarray(dev.to_host(dev.solve_triangular(tii, acc, lower=spec.lower)))
    except np.linalg.LinAlgError:  # SciPy's TRSV refuses an exact zero on the diagonal; cuBLAS returns inf
        x = None
    # unchecked, an Inf on T's diagonal gives a finite x (x_i = (b_i - ...) / Inf = 0): refused as a NaN is
    if x is None or not np.isfinite(x).all() or not (spec.check or np.isfinite(np.diagonal(tri)).all()):
        zero = np.flatnonzero(np.diagonal(tri) == 0)
        where = f"{ZERO_DIAGONAL} {i * t + int(zero[0])}" if zero.size else \
            f"a singular or overflowing diagonal tile at rows {i * t}:{i * t + tii.shape[0]}" + (
                "" if spec.check else ", or a NaN or Inf in the right-hand side (check_finite=False skipped the "
                "check that names it)")
        raise SingularMatrixError(explain(spec.a_name, "must be nonsingular (no zero on the diagonal)", where,
                                          "check the factor, or regularize the system (lam > 0)"))
    spec.out.write(i, c, t, x)
    mark_finished(marker)
    flops = x.shape[1] * tii.shape[0] * (2 * len(before) * t + tii.shape[0])
    return {"bytes_read": nread, "bytes_written": x.nbytes, "flops": flops}


#: How a triangular solve's refusal of an exact zero on the diagonal begins (no scaling makes it solvable).
ZERO_DIAGONAL = "a zero on the diagonal at row"


def _triangle(block: np.ndarray, lower: bool) -> np.ndarray:
    """The ``lower`` (or upper) triangle of a square tile (the other one is never read)."""
    return np.tril(block) if lower else np.triu(block)


@with_task_settings
def axpby_tile_task(spec: TileOpSpec, i: int, j: int) -> dict:
    """Tile ``(i, j)`` of ``alpha * X + beta * Y`` (host arithmetic: memory-bound)."""
    t, dt = spec.tile, np.dtype(spec.dtype)
    x = spec.a.read(i, j, t, dt)
    y = spec.b.read(i, j, t, dt)
    z = dt.type(spec.alpha) * x + dt.type(spec.beta) * y
    spec.out.write(i, j, t, z)
    return {"bytes_read": x.nbytes + y.nbytes, "bytes_written": z.nbytes, "sumsq": sum_squares(z)}


def real_parts(x: np.ndarray) -> np.ndarray:
    """A real array whose squares sum to ``sum |x_ij|^2``: ``x`` itself, or for complex ``x`` its real
    and imaginary parts interleaved along the last axis (a view of a C-contiguous ``x``, ``m x 2n``)."""
    return np.ascontiguousarray(x).view(x.real.dtype) if x.dtype.kind == "c" else x


def sum_squares(x: np.ndarray) -> float:
    """``sum |x_ij|^2`` of a 2-D block in float64 (``||x||_F^2``; ``x^H x`` summed for complex)."""
    r = real_parts(x)
    return float(np.einsum("ij,ij->", r, r, dtype=np.float64))


@with_task_settings
def sumsq_tile_task(spec: TileOpSpec, i: int, j: int, columns: bool = False, safe: bool = False) -> dict:
    """``sum |A(i,j)|^2`` in float64 (and per column, with the tile's first column, when ``columns``);
    ``safe``: the tile's Frobenius ``norm`` instead, of the tile divided by a power of two near its
    largest entry (exact), so that entries near 1e200 or 1e-200 neither overflow nor underflow."""
    x = spec.a.read(i, j, spec.tile, np.dtype(open_array(spec.a.path).dtype))
    nbytes, cplx = x.nbytes, x.dtype.kind == "c"
    x = real_parts(x)  # |z|^2 = Re^2 + Im^2: the squares of both parts (interleaved columns)
    if safe:
        e = max_exponent(x)
        y = np.ldexp(x.astype(np.float64), -e)
        return {"bytes_read": nbytes, "norm": float(np.ldexp(np.sqrt(np.einsum("ij,ij->", y, y)), e))}
    out = {"bytes_read": nbytes, "sumsq": float(np.einsum("ij,ij->", x, x, dtype=np.float64))}
    if columns:
        per = np.einsum("ij,ij->j", x, x, dtype=np.float64)
        out["columns"] = (j * spec.tile, per[0::2] + per[1::2] if cplx else per)
    return out


@with_task_settings
def asymmetry_tile_task(spec: TileOpSpec, i: int, j: int) -> dict:
    """``||A(i,j) - A^H(i,j)||_F`` of one tile (``spec.b`` the view ``A^H``), of the difference divided by
    a power of two near its largest entry (exact), so that entries near 1e200 or 1e-200 stay in range."""
    wide = np.complex128 if np.dtype(open_array(spec.a.path).dtype).kind == "c" else np.float64
    x = spec.a.read(i, j, spec.tile, wide)
    y = spec.b.read(i, j, spec.tile, wide)
    e = max(max_exponent(real_parts(x)), max_exponent(real_parts(y)))
    d = real_parts(ldexp(x, -e) - ldexp(y, -e))
    return {"bytes_read": x.nbytes, "norm": float(np.ldexp(np.sqrt(np.einsum("ij,ij->", d, d)), e))}


@with_task_settings
def permute_rows_task(spec: TileOpSpec, i: int, j: int, perm: np.ndarray) -> dict:
    """Tile ``(i, j)`` of ``src[perm, :]``: the rows ``perm[i t:(i+1) t]`` gathered from the store."""
    t, dt = spec.tile, np.dtype(spec.dtype)
    rows = np.asarray(perm[i * t:(i + 1) * t], dtype=np.int64) + spec.a.off[0]
    c0 = spec.a.off[1] + j * t
    cols = slice(c0, min(spec.a.off[1] + spec.a.shape[1], c0 + t))
    block = np.ascontiguousarray(open_array(spec.a.path).get_orthogonal_selection((rows, cols)), dtype=dt)
    spec.out.write(i, j, t, block)
    return {"bytes_read": block.nbytes, "bytes_written": block.nbytes}


@with_task_settings
def col_max_tile_task(spec: TileOpSpec, i: int, j: int) -> dict:
    """The column maxima of tile ``(i, j)`` (of the real and imaginary parts), with the tile's first column."""
    x = real_parts(spec.a.read(i, j, spec.tile, np.dtype(open_array(spec.a.path).dtype)))
    with np.errstate(invalid="ignore"):
        top = np.fmax.reduce(np.abs(x), axis=0, initial=0.0).astype(np.float64)
    if np.dtype(open_array(spec.a.path).dtype).kind == "c":  # interleaved real and imaginary columns
        top = np.fmax(top[0::2], top[1::2])
    return {"bytes_read": x.nbytes, "columns": (j * spec.tile, top)}


@with_task_settings
def scale_columns_task(spec: TileOpSpec, i: int, j: int, exponents: np.ndarray) -> dict:
    """Tile ``(i, j)`` of ``src diag(2^e)`` (see :meth:`BlockOps.scale_columns`)."""
    t = spec.tile
    x = spec.a.read(i, j, t, np.dtype(spec.dtype))
    e = exponents[None, j * t:j * t + x.shape[1]]
    with np.errstate(over="ignore", under="ignore"):  # exact within the range; the caller judges the result
        y = ldexp(x, e, out=x)
    spec.out.write(i, j, t, y)
    return {"bytes_read": x.nbytes, "bytes_written": y.nbytes}
