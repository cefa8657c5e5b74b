"""Block operations over stored matrices: region GEMMs, copies and scratch stores of one job.

Algorithms that work on sub-blocks of stored matrices (the inverse's Schur complements, Newton-Schulz
steps; Cholesky and LU panels next) express every step as one of these operations on regions
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
:meth:`BlockOps.potrf`
    In-core Cholesky of one diagonal block that fits the budget.
:meth:`BlockOps.cholesky`
    Tiled left-looking Cholesky: each lower tile is one task (GEMM/SYRK updates, then POTRF or TRSM)
    that writes its tile once, so tasks are idempotent and ``resume`` skips finished tiles.

Operands of these are :class:`Region` views (a rectangle of a store, possibly transposed); the tile
side is the :class:`BlockOps` chunk, so every task writes whole chunks of its output.
"""

from __future__ import annotations

import dataclasses
import math
import functools
import io
import os
from collections.abc import Callable, Hashable
from typing import Any

import numpy as np

from blocklin._memory import release_free_memory
from blocklin.plan.chunks import split
from blocklin.plan.gemm import plan_gemm
from blocklin.runtime.graph import TileGraph
from blocklin.device import get_device
from blocklin.device.base import PANEL_GETRF_THREADS
from blocklin.errors import NotPositiveDefiniteError, SingularMatrixError, explain
from blocklin.runtime.tiles import Epilogue, GemmSpec, check_finite, gemm_tile, open_array, with_task_settings
from blocklin.storage.atomic import is_done, mark_done
from blocklin.storage.backend import backend
from blocklin.storage.zarr_store import read_block, write_block


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
             epilogue: Epilogue | None = None, memory: int | None = None,
             description: str = "gemm") -> list[dict]:
        """``out[R] = alpha * A[Ra] @ B[Rb] + beta * C[Rc]`` over regions; returns the tile results.

        ``epilogue`` (an :class:`~blocklin.runtime.tiles.Epilogue` of the caller) sees every
        finished strip; what it returns is in the tile results. ``memory``: the budget of this
        GEMM's plan (default: the job's).
        """
        job = self.job
        dt = np.dtype(dtype)
        ch = (self.chunk, self.chunk)
        plan = plan_gemm(m, n, k, dt, a_chunks=ch, b_chunks=ch, memory=job.cfg.memory if memory is None else memory,
                         source_dtypes=(np.dtype(a_dtype or dt), np.dtype(b_dtype or dt)),
                         c_chunks=ch if c is not None and beta != 0.0 else None, workers=job.workers(1),
                         cores=job.cores(), device=job.device, device_memory=job.device_memory(), out_chunks=ch)
        dev_mem = job.device_memory()
        spec = GemmSpec(a=a, b=b, c=c, out=out, trans_a=False, trans_b=False, alpha=float(alpha), beta=float(beta),
                        dtype=dt.name, plan=plan, device=job.device, device_memory=dev_mem, check_finite=False,
                        done_dir=None, blas_threads=job.task_blas_threads(plan.blas_threads), a_off=tuple(a_off),
                        b_off=tuple(b_off), c_off=tuple(c_off), out_off=tuple(out_off), epilogue=epilogue,
                        precision=self.math if dt == np.float32 else None)
        graph = self.graph("gemm", spec)
        for i, j, rows, cols in plan.tiles():
            graph.add((i, j), gemm_tile, spec, i, j, rows, cols)
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
    def _spec(self, dtype: Any, **fields: Any) -> TileOpSpec:
        job = self.job
        dev = job.device
        dt = np.dtype(dtype)
        return TileOpSpec(tile=self.chunk, dtype=dt.name, device=dev,
                          device_memory=job.device_memory() if dev == "gpu" else None,
                          blas_threads=job.task_blas_threads(job.cores()),
                          math=self.math if dt == np.float32 else None, **fields)

    def _run(self, graph: TileGraph, description: str) -> list[dict]:
        """Run ``graph``; with one worker, in the calling thread on the local threaded scheduler
        (:meth:`~blocklin.runtime.job.Job.run`'s ``in_caller``: tasks run one at a time anyway)."""
        job = self.job
        workers = self.workers or job.workers(1)
        return job.run(graph, workers=workers, blas_threads=max(1, job.cores() // workers), description=description,
                       in_caller=workers == 1)

    def syrk(self, out: Region, a: Region, *, dtype: Any, alpha: float = 1.0, beta: float = 0.0,
             c: Region | None = None, full: bool = False, check: bool = False, shift: float = 0.0,
             done_dir: Any = None, rhs: Region | None = None, rhs_out: Region | None = None,
             description: str = "syrk") -> list[dict]:
        """``out = beta * C + alpha * A A^T + shift * I`` (``A`` an ``n x k`` region, transposed views allowed).

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
        """
        from blocklin.plan.gram import plan_syrk_blocks

        n, k = a.shape
        if out.shape != (n, n) or (c is not None and c.shape != (n, n)):
            raise ValueError(f"syrk: out {out.shape} and c {c and c.shape} must be {n} x {n}")
        if (rhs is None) != (rhs_out is None) or (rhs is not None and (rhs.shape[0] != k or
                                                                       rhs_out.shape != (n, rhs.shape[1]))):
            raise ValueError(f"syrk: rhs {rhs and rhs.shape} and rhs_out {rhs_out and rhs_out.shape} must be "
                             f"{k} x r and {n} x r")
        src = open_array(a.path)
        k_chunk = src.chunks[0] if a.trans else src.chunks[1]
        sb = plan_syrk_blocks(n, k, dtype, memory=self.job.cfg.memory, tile=self.chunk, source_dtype=src.dtype,
                              workers=self.workers or self.job.workers(1), k_chunk=k_chunk)
        spec = self._spec(dtype, a=a, out=out, c=c, b=rhs, lower=True, alpha=float(alpha), beta=float(beta),
                          full=full, check=check, shift=float(shift), done_dir=done_dir)
        spec = dataclasses.replace(spec, block=sb.block, rows=sb.rows, rhs_out=rhs_out)
        graph = self.graph("syrk", spec)
        for bi in range(sb.blocks):
            for bj in range(bi + 1):
                graph.add((bi, bj), syrk_tile_task, spec, bi, bj)
        self.flops += n * n * k
        job = self.job
        return job.run(graph, workers=sb.workers, blas_threads=max(1, job.cores() // sb.workers),
                       description=description)

    def trsm(self, t: Region, b: Region, out: Region, *, lower: bool, trans: bool = False, side: str = "left",
             alpha: float = 1.0, dtype: Any, check: bool = False, done_dir: Any = None, unit: bool = False,
             description: str = "trsm") -> list[dict]:
        """``out = alpha * op(T)^-1 B`` (``side="left"``) or ``alpha * B op(T)^-1`` (``"right"``).

        ``T`` is read only in its ``lower`` (or upper) triangle; ``op(T) = T^T`` when ``trans``;
        ``unit``: ``T`` has a unit diagonal, not read (the ``L`` of a packed LU).
        The right-side solve is the left-side solve of the transposed system
        (``op(T)^T X^T = B^T``), read and written through transposed views. Tile ``(i, c)`` of
        ``X`` is one task: ``B(i, c)`` minus the products with the already solved tiles of
        column ``c`` (in substitution order), then a triangular solve with the diagonal tile.
        """
        if side not in ("left", "right"):
            raise ValueError(f"trsm: side must be 'left' or 'right', got {side!r}")
        n = t.shape[0]
        if side == "right":
            t_l, b_l, x_l = t.T if not trans else t, b.T, out.T
        else:
            t_l, b_l, x_l = t.T if trans else t, b, out
        lower_eff = lower != (t_l.trans != t.trans)
        if t.shape != (n, n) or b_l.shape[0] != n or x_l.shape != b_l.shape:
            raise ValueError(f"trsm: shapes do not agree: t {t.shape}, b {b.shape}, out {out.shape}, side {side}")
        spec = self._spec(dtype, a=t_l, b=b_l, out=x_l, alpha=float(alpha), lower=lower_eff, check=check,
                          done_dir=done_dir, unit=unit)
        graph = self.graph("trsm", spec)
        nt, ct = _tiles(n, self.chunk), _tiles(b_l.shape[1], self.chunk)
        order = range(nt) if lower_eff else range(nt - 1, -1, -1)
        for c in range(ct):
            prev = None
            for i in order:
                prev = graph.add((i, c), trsm_tile_task, spec, i, c, [prev] if prev else [])
        self.flops += n * n * b_l.shape[1]
        return self._run(graph, description)

    def potrf(self, a: Region, out: Region, *, dtype: Any, description: str = "potrf") -> list[dict]:
        """Lower Cholesky factor of the diagonal block ``a`` (in core: it must fit the budget) into ``out``."""
        spec = self._spec(dtype, a=a, out=out, check=True)
        graph = self.graph("potrf", spec)
        graph.add((0,), potrf_task, spec)
        self.flops += a.shape[0] ** 3 // 3
        return self._run(graph, description)

    def cholesky(self, a: Region, out: Region, *, dtype: Any, check: bool = True, done_dir: Any = None,
                 description: str = "cholesky") -> list[dict]:
        """Tiled left-looking Cholesky ``A = L L^T`` of a stored region into ``out`` (lower tiles).

        Only the lower triangle of ``a`` is read (pass a transposed view to factor from the upper
        one; pass ``out.T`` to store ``L^T``). Tile ``(i, j)`` waits for ``(i, j-1)`` and, below the
        diagonal, for ``(j, j)``: these chains order the whole column ``j`` after column ``j - 1``.
        """
        n = a.shape[0]
        spec = self._spec(dtype, a=a, out=out, check=check, done_dir=done_dir)
        graph = self.graph("cholesky", spec)
        nt = _tiles(n, self.chunk)
        keys: dict[tuple[int, int], Hashable] = {}
        for j in range(nt):
            for i in range(j, nt):
                deps = [keys[(i, j - 1)]] if j else []
                if i > j:
                    deps.append(keys[(j, j)])
                keys[(i, j)] = graph.add((i, j), cholesky_tile_task, spec, i, j, deps)
        self.flops += n**3 // 3
        return self._run(graph, description)

    def axpby(self, out: Region, x: Region, y: Region, *, alpha: float = 1.0, beta: float = 1.0, dtype: Any,
              description: str = "axpby") -> list[dict]:
        """``out = alpha * X + beta * Y`` tile by tile (``out`` may be ``X`` or ``Y``: each task
        reads and writes its own tile). Returns per-tile ``sumsq`` of ``out`` (float64)."""
        spec = self._spec(dtype, a=x, b=y, out=out, alpha=float(alpha), beta=float(beta))
        graph = self.graph("axpby", spec)
        for i in range(_tiles(out.shape[0], self.chunk)):
            for j in range(_tiles(out.shape[1], self.chunk)):
                graph.add((i, j), axpby_tile_task, spec, i, j)
        return self._run(graph, description)

    def sumsq(self, a: Region, *, description: str = "norm") -> float:
        """``||A||_F^2`` of a region (float64, summed in tile order)."""
        spec = self._spec(np.float64, a=a, out=a)
        graph = self.graph("sumsq", spec)
        for i in range(_tiles(a.shape[0], self.chunk)):
            for j in range(_tiles(a.shape[1], self.chunk)):
                graph.add((i, j), sumsq_tile_task, spec, i, j)
        return float(sum(r["sumsq"] for r in self._run(graph, description)))

    def norm(self, a: Region, *, description: str = "norm") -> float:
        """``||A||_F`` of a region without overflow or underflow (each tile's sum of squares is taken of
        the tile divided by a power of two near its largest entry; the tiles combined by ``hypot``)."""
        spec = self._spec(np.float64, a=a, out=a)
        graph = self.graph("safenorm", spec)
        for i in range(_tiles(a.shape[0], self.chunk)):
            for j in range(_tiles(a.shape[1], self.chunk)):
                graph.add((i, j), sumsq_tile_task, spec, i, j, False, True)
        return float(math.hypot(*(r["norm"] for r in self._run(graph, description))))

    def col_sumsq(self, a: Region, *, description: str = "column norms") -> np.ndarray:
        """Sums of squares of the columns of a region (float64, summed in tile order)."""
        spec = self._spec(np.float64, a=a, out=a)
        graph = self.graph("colsumsq", spec)
        for i in range(_tiles(a.shape[0], self.chunk)):
            for j in range(_tiles(a.shape[1], self.chunk)):
                graph.add((i, j), sumsq_tile_task, spec, i, j, True)
        total = np.zeros(a.shape[1])
        for r in self._run(graph, description):  # in key order: deterministic sums
            c0, cols = r["columns"]
            total[c0:c0 + cols.size] += cols
        return total

    def lu_panels(self, a: Region, work: Any, *, dtype: Any, done_dir: Any, check: bool = True, out: Any = None,
                  rhs: Region | None = None, rhs_out: Region | None = None, trim: bool = False,
                  description: str = "LU panels") -> list[dict]:
        """Left-looking LU with partial pivoting over whole column panels (one task per panel).

        Panel ``j`` (columns ``J``, all rows) is read, the row swaps of the panels before it are
        applied, it is updated by every earlier panel (``U_kJ = L_kk^-1 P_kJ`` by TRSM,
        ``P_{>k,J} -= L_{>k,k} U_kJ`` by GEMM), and its trailing part is factored by LAPACK ``getrf``
        with partial pivoting over all its rows: the pivot choice of ``getrf`` on the whole matrix.
        The panel is written once to the store ``work`` (its ``L`` rows in the order of its own
        swaps; :meth:`lu_finish` applies the later swaps) and its swaps to ``done_dir``, so a rerun
        (``resume``) skips finished panels. Panels form one chain of tasks. With ``out`` (the packed
        result, finished by :meth:`lu_finish`), the rows no later swap moves (``U`` and the
        diagonal block) go straight there and only the ``L`` rows from the diagonal block down to
        ``work``.

        With ``rhs`` (``n x k``, ``k`` small: see :func:`~blocklin.plan.factor.lu_rhs_fits`) the
        forward substitution ``Y = L^-1 P B`` runs inside the panels, as Gaussian elimination on the
        augmented matrix ``[A | B]`` does: once panel ``j`` is factored, its swaps are applied to
        ``B`` (in the row order of the panels before it) and ``B`` is eliminated with panel ``j``'s
        ``L`` while the panel is still in memory, so no pass reads ``L`` back for the first solve.
        ``B`` goes from panel to panel through ``done_dir`` (``lu-rhs-J.npy``: a rerun continues from
        the last finished panel); the last panel writes ``Y`` to ``rhs_out``, which
        :meth:`lu_solve` with ``forward=False`` finishes by the back substitution.

        ``trim``: each panel task first returns the allocator's free pages to the OS
        (:func:`~blocklin._memory.release_free_memory`), for a caller whose earlier steps freed
        buffers in other threads' heap arenas, which the panel tasks would not reuse.
        """
        n = a.shape[0]
        if (rhs is None) != (rhs_out is None) or (rhs is not None and (done_dir is None or rhs.shape[0] != n
                                                                       or rhs_out.shape != rhs.shape)):
            raise ValueError(f"lu_panels: rhs {rhs and rhs.shape} and rhs_out {rhs_out and rhs_out.shape} must both be "
                             f"{n} x k, with a done_dir")
        spec = self._spec(dtype, a=a, out=Region.of(work, a.shape), check=check, done_dir=done_dir,
                          c=Region.of(out, a.shape) if out is not None else None, b=rhs)
        spec = dataclasses.replace(spec, rhs_out=rhs_out, trim=trim)
        graph = self.graph("lu", spec)
        prev = None
        for j in range(_tiles(n, self.chunk)):
            prev = graph.add((j,), lu_panel_task, spec, j, [prev] if prev else [])
        self.flops += 2 * n**3 // 3
        return self._run(graph, description)

    def permute_rows(self, src: Region, out: Region, perm: np.ndarray, *, dtype: Any,
                     description: str = "row permutation") -> list[dict]:
        """``out = src[perm, :]`` (``perm`` a permutation of the rows), one task per output tile; each
        task gathers its rows with one orthogonal selection of the stored ``src`` (not transposed)."""
        if src.trans or out.trans or src.shape != out.shape or len(perm) != src.shape[0]:
            raise ValueError(f"permute_rows: src {src.shape}, out {out.shape}, perm {len(perm)} (no transposed views)")
        spec = self._spec(dtype, a=src, out=out)
        graph = self.graph("permute", spec, np.asarray(perm).tobytes())
        for i in range(_tiles(out.shape[0], self.chunk)):
            for j in range(_tiles(out.shape[1], self.chunk)):
                graph.add((i, j), permute_rows_task, spec, i, j, perm)
        return self._run(graph, description)

    def lu_finish(self, work: Any, out: Any, n: int, pivots: np.ndarray, *, dtype: Any,
                  description: str = "LU row swaps") -> list[dict]:
        """``out``: the packed LU of ``work`` with every later row swap applied to each ``L`` panel
        (as LAPACK stores it); one task per column panel, reading the ``L`` rows below its diagonal
        block from ``work`` and writing them to ``out`` (idempotent; :meth:`lu_panels` with ``out``
        wrote the rest)."""
        spec = self._spec(dtype, a=Region.of(work, (n, n)), out=Region.of(out, (n, n)), c=None)
        graph = self.graph("lu-swaps", spec, pivots.tobytes())
        for j in range(_tiles(n, self.chunk)):
            graph.add((j,), lu_swap_task, spec, j, pivots)
        return self._run(graph, description)

    def lu_solve(self, work: Any, pivots: np.ndarray, b: Region, out: Region, *, dtype: Any, tile: int | None = None,
                 forward: bool = True, description: str = "LU solve") -> list[dict]:
        """``out = (P^T L U)^-1 B`` from the panels as :meth:`lu_panels` stored them in ``work``.

        One task holds ``B`` (``n x k``, ``k`` at most the panel width: the size of a panel) and
        streams each panel twice in row blocks: forward substitution with the unit lower ``L``
        (panel ``j``'s row swaps applied to ``B`` just before it, so its ``L`` is used in the row
        order it was stored in, without :meth:`lu_finish`), then back substitution with ``U``, as
        LAPACK's ``getrs`` with the swaps interleaved. ``n^2`` elements read, ``2 n^2 k`` flops.
        ``tile``: the panel width of the factorization (default: the chunk of this object).
        ``forward=False``: ``B`` is already ``L^-1 P B`` (:meth:`lu_panels` with ``rhs``): only the
        back substitution runs (``n^2 / 2`` elements read).
        """
        n = b.shape[0]
        if b.shape != out.shape or b.trans or out.trans:
            raise ValueError(f"lu_solve: b {b.shape} and out {out.shape} must agree (no transposed views)")
        spec = dataclasses.replace(self._spec(dtype, a=Region.of(work, (n, n)), b=b, out=out), tile=tile or self.chunk)
        graph = self.graph("lu-solve", spec, np.asarray(pivots).tobytes(), forward)
        graph.add((0,), lu_solve_task, spec, np.asarray(pivots), forward)
        self.flops += (2 if forward else 1) * n * n * b.shape[1]
        return self._run(graph, description)


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
    """The matrix ``X[r0:r0+rows, c0:c0+cols]`` of store ``path``, or its transpose when ``trans``.

    ``shape`` is the shape of the view (transposed when ``trans``). Tiles of side ``t`` of the view
    map onto whole chunks of the store when the offsets are multiples of the chunk side and ``t``
    is that side.
    """

    #: A local path, URL or :class:`~blocklin.storage.location.Location` (storage options kept).
    path: Any
    off: tuple[int, int]
    stored: tuple[int, int]
    trans: bool = False

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
        block = block.T if self.trans else block
        return np.ascontiguousarray(block, dtype=dtype)

    def read_stored(self, rows: slice, cols: slice, dtype: Any = None, check: bool = False,
                    name: str = "a") -> np.ndarray:
        """``view[rows, cols]`` as stored: its ``.T`` when the view is transposed (no copy for the
        transpose; cast to ``dtype`` when given)."""
        if self.trans:
            rows, cols = cols, rows
        rs = slice(self.off[0] + rows.start, self.off[0] + rows.stop)
        cs = slice(self.off[1] + cols.start, self.off[1] + cols.stop)
        block = read_block(open_array(self.path), rs, cs)
        if check:
            check_finite(block, name, rs, cs)
        return block if dtype is None else np.asarray(block, dtype=dtype)

    def read_rows(self, rows: slice, dtype: Any, check: bool = False, name: str = "a") -> np.ndarray:
        """Rows ``rows`` of the view, every column, C-contiguous, in ``dtype``."""
        block = self.read_stored(rows, slice(0, self.shape[1]), check=check, name=name)
        return np.ascontiguousarray(block.T if self.trans else block, dtype=dtype)

    def write(self, i: int, j: int, t: int, block: np.ndarray) -> None:
        rs, cs = self._stored_slices(i, j, t)
        write_block(open_array(self.path, mode="r+"), rs, cs, block.T if self.trans else block)


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
    #: ``"tf32"``: the task's float32 GEMMs use TF32 tensor cores on a GPU (``Device.math``).
    math: str | None = None
    #: SYRK: side of the output blocks, rows of ``k`` per slice, and where ``A @ rhs`` goes.
    block: int = 0
    rows: int = 0
    rhs_out: Region | None = None
    #: Return the allocator's free pages before the task (:func:`~blocklin._memory.release_free_memory`).
    trim: bool = False


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


def _tiles(n: int, t: int) -> int:
    return -(-n // t)


def _done(spec: TileOpSpec, unit: str) -> tuple[Any, str] | None:
    return (spec.done_dir, unit) if spec.done_dir is not None else None


def _skip(marker: tuple[Any, str] | None) -> bool:
    return marker is not None and is_done(*marker)


def _mark(marker: tuple[Any, str] | None) -> None:
    if marker is not None:
        mark_done(*marker)


def _save(spec: TileOpSpec, name: str, value: Any) -> None:
    """A small array or object next to the resume markers (pivots, statistics)."""
    buf = io.BytesIO()
    np.save(buf, np.asarray(value) if not isinstance(value, dict) else np.array(value, dtype=object),
            allow_pickle=isinstance(value, dict))
    backend(spec.done_dir).write_bytes(name, buf.getvalue())


def _load(spec: TileOpSpec, name: str) -> Any:
    x = np.load(io.BytesIO(backend(spec.done_dir).read_bytes(name)), allow_pickle=True)
    return x.item() if x.dtype == object else x


@with_task_settings
@holds_device(lambda spec, *_: (spec.block ** 2 + 2 * spec.block * spec.rows  # accumulator, two slices of A
                                  + (spec.block * spec.b.shape[1] if spec.b is not None else 0)) / spec.tile ** 2)
def syrk_tile_task(spec: TileOpSpec, bi: int, bj: int) -> dict:
    """Output block ``(bi, bj)`` (``bi >= bj``) of ``beta * C + alpha * A A^T + shift * I`` (see
    :meth:`BlockOps.syrk`): accumulated over the slices of ``k`` in order, its lower chunks written
    once (and mirrored with ``full``)."""
    marker = _done(spec, f"syrk-{bi}-{bj}")
    if _skip(marker):
        return {"skipped": 1}
    T, t, dt = spec.block, spec.tile, np.dtype(spec.dtype)
    n, k = spec.a.shape
    rI = slice(bi * T, min(n, (bi + 1) * T))
    rJ = slice(bj * T, min(n, (bj + 1) * T))
    diag = bi == bj
    dev = get_device(spec.device, device_memory=spec.device_memory)
    acc = dev.zeros((rI.stop - rI.start, rJ.stop - rJ.start), dt)
    racc = dev.zeros((rI.stop - rI.start, spec.b.shape[1]), dt) if diag and spec.b is not None else None
    nread = 0
    for k0 in range(0, k, spec.rows):  # fixed order over k: the same bits on every scheduler
        ks = slice(k0, min(k, k0 + spec.rows))
        # the view's block a[I, ks] is stored as A[ks, I] (a transposed view) or A[I, ks]
        si = dev.to_device(spec.a.read_stored(rI, ks, dt, spec.check, "a"))
        nread += si.nbytes
        ai = si.T if spec.a.trans else si  # a[I, ks]
        if diag:
            dev.syrk_lower_acc(acc, ai.T)
        else:
            sj = dev.to_device(spec.a.read_stored(rJ, ks, dt, spec.check, "a"))
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
                spec.out.write(cj, ci, t, np.ascontiguousarray(blk.T))
                nwritten += blk.nbytes
    if racc is not None:
        rh = np.asarray(dev.to_host(racc))
        if spec.alpha != 1.0:
            rh = rh * dt.type(spec.alpha)
        for ci in range(rI.start // t, -(-rI.stop // t)):
            r0 = ci * t - rI.start
            for cj in range(_tiles(rh.shape[1], t)):
                spec.rhs_out.write(ci, cj, t, np.ascontiguousarray(rh[r0:r0 + t, cj * t:(cj + 1) * t]))
        nwritten += rh.nbytes
    _mark(marker)
    return {"bytes_read": nread, "bytes_written": nwritten,
            "flops": host.shape[0] * host.shape[1] * k * (1 if diag else 2)}


@with_task_settings
@holds_device(lambda spec, *_: 5)  # the accumulator, two product tiles, the diagonal tile, the solve
def trsm_tile_task(spec: TileOpSpec, i: int, c: int, deps: list) -> dict:
    """Tile ``(i, c)`` of ``X = alpha * T^-1 B``: ``T(i,i)^-1 (alpha B(i,c) - sum_k T(i,k) X(k,c))``."""
    marker = _done(spec, f"trsm-{i}-{c}")
    if _skip(marker):
        return {"skipped": 1}
    t, dt = spec.tile, np.dtype(spec.dtype)
    dev = get_device(spec.device, device_memory=spec.device_memory)
    acc = dev.to_device(spec.b.read(i, c, t, dt, spec.check, "b"))
    if spec.alpha != 1.0:
        dev.axpby(acc, spec.alpha, None, 0.0)
    nt = _tiles(spec.a.shape[0], t)
    before = range(i) if spec.lower else range(i + 1, nt)
    nread = acc.nbytes
    for k in before:  # substitution order: identical sums on every scheduler
        tik = dev.to_device(spec.a.read(i, k, t, dt, spec.check, "t"))
        xkc = dev.to_device(spec.out.read(k, c, t, dt))
        dev.gemm_acc(acc, tik, xkc, -1.0)
        nread += tik.nbytes + xkc.nbytes
    tri = _triangle(spec.a.read(i, i, t, dt, spec.check, "t"), spec.lower)
    if spec.unit:
        np.fill_diagonal(tri, 1)
    tii = dev.to_device(tri)
    x = np.asarray(dev.to_host(dev.solve_triangular(tii, acc, lower=spec.lower)))
    if not np.isfinite(x).all():
        raise SingularMatrixError(explain(
            "t", "must be nonsingular (no zero on the diagonal)",
            f"a singular or overflowing diagonal tile at rows {i * t}:{i * t + tii.shape[0]}",
            "check the factor, or regularize the system (lam > 0)"))
    spec.out.write(i, c, t, x)
    _mark(marker)
    flops = x.shape[1] * tii.shape[0] * (2 * len(before) * t + tii.shape[0])
    return {"bytes_read": nread, "bytes_written": x.nbytes, "flops": flops}


def _triangle(block: np.ndarray, lower: bool) -> np.ndarray:
    """The ``lower`` (or upper) triangle of a square tile (the other one is never read)."""
    return np.tril(block) if lower else np.triu(block)


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
    """Tile ``L(i, j)`` of the left-looking Cholesky: ``A(i,j) - sum_k L(i,k) L(j,k)^T``, then POTRF
    (``i == j``) or TRSM with ``L(j,j)^T`` (``i > j``); written once, so rerunning it is harmless."""
    marker = _done(spec, f"chol-{i}-{j}")
    if _skip(marker):
        return {"skipped": 1}
    t, dt = spec.tile, np.dtype(spec.dtype)
    dev = get_device(spec.device, device_memory=spec.device_memory)
    host = spec.a.read(i, j, t, dt, spec.check)
    if i == j:  # only the lower triangle is read (as LAPACK's potrf with uplo='L')
        host = np.tril(host) + np.tril(host, -1).T
    # ||A||_F^2 from the lower tiles (an off-diagonal tile stands for two)
    sumsq = float(np.einsum("ij,ij->", host, host, dtype=np.float64)) * (1 if i == j else 2)
    acc = dev.to_device(host)
    nread = host.nbytes
    for k in range(j):  # fixed order over k: the same bits on every scheduler and worker count
        lik = dev.to_device(spec.out.read(i, k, t, dt))
        ljk = lik if i == j else dev.to_device(spec.out.read(j, k, t, dt))
        dev.gemm_acc(acc, lik, ljk.T, -1.0)
        nread += lik.nbytes * (1 if i == j else 2)
    if i == j:
        tile = _factor_diagonal(dev, acc, j * t, spec)
    else:
        ljj = dev.to_device(spec.out.read(j, j, t, dt))
        tile = np.asarray(dev.to_host(dev.solve_triangular(ljj, acc.T, lower=True))).T  # A(i,j) L(j,j)^-T
        nread += ljj.nbytes
    spec.out.write(i, j, t, tile)
    _mark(marker)
    rows, cols = tile.shape
    return {"bytes_read": nread, "bytes_written": tile.nbytes, "sumsq": sumsq,
            "flops": 2 * rows * cols * j * t + (cols**3 // 3 if i == j else rows * cols * cols)}


def _factor_diagonal(dev: Any, acc: Any, offset: int, spec: TileOpSpec) -> np.ndarray:
    """``chol(acc)`` (lower, host array); a failed pivot raises :class:`NotPositiveDefiniteError`
    naming its global index.

    On one BLAS thread, as the LU's panel ``getrf`` (:meth:`~blocklin.device.base.Device.lu_panel`):
    OpenBLAS's threaded ``potrf`` of a 1024 or 2048 tile took 2 to 10 times as long as one thread
    on this project's shared 2-core machine (0.19-0.87 s against 0.05-0.08 s at 1024).
    """
    from threadpoolctl import threadpool_limits

    try:
        with threadpool_limits(limits=PANEL_GETRF_THREADS, user_api="blas"):
            low = dev.cholesky(acc)
        out = np.asarray(dev.to_host(low))
        if np.isfinite(out).all():
            return np.tril(out)
    except SingularMatrixError:
        pass
    from scipy.linalg import lapack

    host = np.array(dev.to_host(acc), dtype=np.float64)
    info = lapack.dpotrf(host, lower=1, clean=1)[1] if np.isfinite(host).all() else 1
    local = max(int(info), 1) - 1
    size = host.shape[0]
    pivot = offset + local
    raise NotPositiveDefiniteError(explain(
        "a", "must be symmetric positive definite for a Cholesky factorization",
        f"a pivot <= 0 (or NaN) at row/column {pivot} (diagonal tile rows {offset}:{offset + size}, after the "
        f"updates from the columns before it)",
        "regularize with a ridge (blocklin.solve(a, b, lam=...) or add lam to the diagonal), or, for a "
        "symmetric indefinite or general matrix, solve with assume_a='gen'"), pivot=pivot)


@with_task_settings
def axpby_tile_task(spec: TileOpSpec, i: int, j: int) -> dict:
    """Tile ``(i, j)`` of ``alpha * X + beta * Y`` (host arithmetic: memory-bound)."""
    t, dt = spec.tile, np.dtype(spec.dtype)
    x = spec.a.read(i, j, t, dt)
    y = spec.b.read(i, j, t, dt)
    z = dt.type(spec.alpha) * x + dt.type(spec.beta) * y
    spec.out.write(i, j, t, z)
    return {"bytes_read": x.nbytes + y.nbytes, "bytes_written": z.nbytes,
            "sumsq": float(np.einsum("ij,ij->", z, z, dtype=np.float64))}


@with_task_settings
def sumsq_tile_task(spec: TileOpSpec, i: int, j: int, columns: bool = False, safe: bool = False) -> dict:
    """``sum(A(i,j)**2)`` in float64 (and per column, with the tile's first column, when ``columns``);
    ``safe``: the tile's Frobenius ``norm`` instead, of the tile divided by a power of two near its
    largest entry (exact), so that entries near 1e200 or 1e-200 neither overflow nor underflow."""
    x = spec.a.read(i, j, spec.tile, np.dtype(open_array(spec.a.path).dtype))
    if safe:
        top = float(np.max(np.abs(x))) if x.size else 0.0
        e = int(np.frexp(top)[1]) if 0 < top < np.inf else 0
        y = np.ldexp(x.astype(np.float64), -e)
        return {"bytes_read": x.nbytes, "norm": float(np.ldexp(np.sqrt(np.einsum("ij,ij->", y, y)), e))}
    out = {"bytes_read": x.nbytes, "sumsq": float(np.einsum("ij,ij->", x, x, dtype=np.float64))}
    if columns:
        out["columns"] = (j * spec.tile, np.einsum("ij,ij->j", x, x, dtype=np.float64))
    return out


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
    return _load(spec, f"lu-piv-{j}.npy")


def _read_panel(spec: TileOpSpec, c0: int, c1: int, dt: np.dtype, rows_per_block: int) -> tuple[np.ndarray, dict]:
    """Columns ``c0:c1`` of the input (all rows) as a C-ordered ``dt`` array, and their ``max |a|`` and
    float64 ``sum a^2`` (of the stored values, before a cast).

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
    panel = np.empty((n, c1 - c0), dtype=dt)
    if same and not raw:
        read_block(src, slice(off_r, off_r + n), cols, out=panel)
    src_buf = None if same else np.empty((min(rows_per_block, max(n, 1)), c1 - c0), dtype=src.dtype)
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
            max_a = max(max_a, float(block.max()), -float(block.min()))
            sumsq += float(np.einsum("ij,ij->", block, block, dtype=np.float64))
        if not same:
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
            out = max(out, float(block.max()), -float(block.min()))
    return out


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
    from threadpoolctl import threadpool_limits

    m, w = x.shape
    kk = min(m, w)
    piv = np.arange(kk, dtype=np.int64)
    if not kk:
        return piv
    getrf = lapack.get_lapack_funcs("getrf", (x,))
    buf = np.empty((2 * min(sub, kk), w), dtype=x.dtype) if sub < w else None
    cpu = get_device("cpu")
    with threadpool_limits(limits=PANEL_GETRF_THREADS, user_api="blas"):
        for s0 in range(0, kk, sub):
            s1 = min(kk, s0 + sub)
            lu, p, info = getrf(np.asfortranarray(x[s0:, s0:s1]), overwrite_a=True)
            if info < 0:
                raise ValueError(f"getrf: illegal argument {-info}")
            p = p[: s1 - s0].astype(np.int64) + s0
            if s0 or s1 < w:  # the columns outside this sub-panel (getrf swapped its own)
                _apply_swaps(cpu, x, p, s0, buf=buf)
            x[s0:, s0:s1] = lu
            del lu
            piv[s0:s1] = p
            if s1 < w:  # U12 = L11^-1 A12, then A22 -= L21 U12 in row blocks
                u12 = cpu.solve_triangular(x[s0:s1, s0:s1], x[s0:s1, s1:], lower=True, unit=True)
                x[s0:s1, s1:] = u12
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
    """Panel ``j`` of the left-looking LU (see :meth:`BlockOps.lu_panels`).

    The panel (columns ``J``, all rows) is read once and updated in place by each earlier panel
    ``k`` in order: first panel ``k``'s own row swaps, which bring the panel into the row order
    panel ``k`` was stored in (so its ``L`` is streamed as stored, never permuted), then
    ``U_kJ = L_kk^-1 P_kJ`` (TRSM, unit diagonal) and ``P_{>k,J} -= L_{>k,k} U_kJ`` as GEMMs over
    row blocks of ``L_{>k,k}`` (:func:`~blocklin.plan.factor.lu_stream_rows` rows each). LAPACK
    ``getrf`` then factors the trailing part with partial pivoting over all its rows.
    """
    from blocklin.plan.factor import lu_stream_rows

    marker = _done(spec, f"lu-{j}")
    if _skip(marker):
        return {"skipped": 1, **_load(spec, f"lu-stats-{j}.npy")}
    t, dt = spec.tile, np.dtype(spec.dtype)
    n = spec.a.shape[0]
    rb = lu_stream_rows(t, n)
    if spec.trim:
        release_free_memory()
    dev = get_device(spec.device, device_memory=spec.device_memory)
    c0, c1 = j * t, min(n, (j + 1) * t)
    host, stats = _read_panel(spec, c0, c1, dt, rb)
    panel = dev.to_device(host)
    nread = host.nbytes
    # the blocks of the earlier panels, in the order they are used: each panel's diagonal block
    # (TRSM), then its row blocks below (GEMMs); read one ahead on a loader thread
    blocks = [(k, r0, min(n, r0 + (t if r0 == k * t else rb))) for k in range(j)
              for r0 in [k * t, *range((k + 1) * t, n, rb)]]
    stream = _stream_blocks(dev, spec.out.path, blocks, t, rb, dt)
    ukj = None
    swap_buf = np.empty((2 * t, c1 - c0), dtype=dt) if j and isinstance(panel, np.ndarray) else None
    for i, (lblk,) in stream:  # in panel order: identical sums on every scheduler
        k, r0, r1 = blocks[i]
        if r0 == k * t:  # panel k's swaps (the row order it was stored in), then U_kJ = L_kk^-1 P_kJ
            _apply_swaps(dev, panel, _panel_pivots(spec, k), r0, buf=swap_buf)
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
    trailing = np.asarray(dev.to_host(panel[c0:]))  # a view of a host panel: factored in place
    local = factor_panel(trailing, c1 - c0, lu_subpanel(c1 - c0))
    if not isinstance(panel, np.ndarray):
        with dev.on_compute():
            panel[c0:] = dev.to_device(trailing)
    del trailing
    host = np.asarray(dev.to_host(panel))
    del panel
    pj = local[: c1 - c0] + c0
    _save(spec, f"lu-piv-{j}.npy", pj)
    diag = np.abs(np.diagonal(host[c0:c1]))
    stats.update(max_u=max(_max_abs(host[:c0], rb), float(np.abs(np.triu(host[c0:c1])).max()) if c1 > c0 else 0.0),
                 min_pivot=float(diag.min()) if diag.size else 0.0)
    if spec.c is None:
        write_block(open_array(spec.out.path, mode="r+"), slice(0, n), slice(c0, c1), host)
    else:  # U and the diagonal block are final; the L rows below wait for the later swaps
        write_block(open_array(spec.c.path, mode="r+"), slice(0, c1), slice(c0, c1), host[:c1])
        write_block(open_array(spec.out.path, mode="r+"), slice(c0, n), slice(c0, c1), host[c0:])
    w = c1 - c0
    flops = 2 * w * (n * c0 - c0 * c0 / 2) + w * w * (n - c0)
    if spec.b is not None:
        flops += _lu_forward_rhs(spec, j, host, pj)
    _save(spec, f"lu-stats-{j}.npy", stats)
    _mark(marker)
    if spec.b is not None and j:  # panel j is done: a rerun starts from its right-hand side
        backend(spec.done_dir).remove(f"lu-rhs-{j - 1}.npy")
    return {"bytes_read": nread, "bytes_written": host.nbytes, **stats, "flops": flops}


def _lu_forward_rhs(spec: TileOpSpec, j: int, host: np.ndarray, pj: np.ndarray) -> float:
    """Panel ``j``'s step of the forward substitution ``L y = P b`` (see :meth:`BlockOps.lu_panels`).

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
        y = np.ascontiguousarray(_load(spec, f"lu-rhs-{j - 1}.npy"), dtype=dt)
    _apply_swaps(cpu, y, pj, c0, buf=np.empty((2 * (c1 - c0), k), dtype=dt))
    yj = cpu.solve_triangular(host[c0:c1], y[c0:c1], lower=True, unit=True)
    y[c0:c1] = yj
    if c1 < n:
        cpu.gemm_acc(y[c1:], host[c1:], yj, -1.0)
    if c1 >= n:  # the last panel: y = L^-1 P b, for the back substitution
        spec.rhs_out.write(0, 0, max(n, k, 1), y)
    _save(spec, f"lu-rhs-{j}.npy", y)
    return 2.0 * (n - c0) * (c1 - c0) * k


@with_task_settings
def lu_swap_task(spec: TileOpSpec, j: int, pivots: np.ndarray) -> dict:
    """The ``L`` rows below panel ``j``'s diagonal block with the swaps of the later panels applied."""
    t = spec.tile
    n = spec.a.shape[0]
    c0, c1 = j * t, min(n, (j + 1) * t)
    if c1 >= n:
        return {"bytes_read": 0, "bytes_written": 0}
    block = read_block(open_array(spec.a.path), slice(c1, n), slice(c0, c1))
    dst, src = swap_moves(pivots[c1:], c1)
    if dst.size:  # a gather into a buffer, then a scatter (see _apply_swaps)
        block[dst - c1] = np.take(block, src - c1, axis=0, out=np.empty((dst.size, block.shape[1]), block.dtype),
                                  mode="clip")
    write_block(open_array(spec.out.path, mode="r+"), slice(c1, n), slice(c0, c1), block)
    return {"bytes_read": block.nbytes, "bytes_written": block.nbytes}


@with_task_settings
def lu_solve_task(spec: TileOpSpec, pivots: np.ndarray, forward: bool = True) -> dict:
    """``X = U^-1 L^-1 P B`` from the LU work store ``spec.a`` (see :meth:`BlockOps.lu_solve`); with
    ``forward=False``, ``X = U^-1 B`` (``B`` already forward-eliminated by the panels)."""
    from blocklin.plan.factor import lu_stream_rows

    t, dt = spec.tile, np.dtype(spec.dtype)
    n, k = spec.b.shape
    rb = lu_stream_rows(t, n)
    dev = get_device(spec.device, device_memory=spec.device_memory)
    work = open_array(spec.a.path)
    y = dev.to_device(spec.b.read(0, 0, max(n, k, 1), dt, spec.check, "b"))
    nread = y.nbytes
    nt = _tiles(n, t)
    for j in range(nt if forward else 0):  # forward substitution, L y = P b, panel by panel
        c0, c1 = j * t, min(n, (j + 1) * t)
        _apply_swaps(dev, y, pivots[c0:c1], c0)
        ljj = read_block(work, slice(c0, c1), slice(c0, c1))
        yj = dev.solve_triangular(dev.to_device(ljj), y[c0:c1], lower=True, unit=True)
        with dev.on_compute():
            y[c0:c1] = yj
        nread += ljj.nbytes
        for r0 in range(c1, n, rb):
            blk = read_block(work, slice(r0, min(n, r0 + rb)), slice(c0, c1))
            dev.gemm_acc(y[r0:r0 + blk.shape[0]], dev.to_device(blk), yj, -1.0)
            nread += blk.nbytes
    for j in reversed(range(nt)):  # back substitution, U x = y
        c0, c1 = j * t, min(n, (j + 1) * t)
        ujj = read_block(work, slice(c0, c1), slice(c0, c1))
        xj = dev.solve_triangular(dev.to_device(ujj), y[c0:c1], lower=False)
        if not np.isfinite(np.asarray(dev.to_host(xj))).all():
            raise SingularMatrixError(explain(
                "a", "must be nonsingular (no zero pivot)", f"a singular or overflowing diagonal block of U at rows "
                f"{c0}:{c1}", "regularize the system (lam > 0), or solve the least-squares problem with method='qr'"))
        with dev.on_compute():
            y[c0:c1] = xj
        nread += ujj.nbytes
        for r0 in range(0, c0, rb):
            blk = read_block(work, slice(r0, min(c0, r0 + rb)), slice(c0, c1))
            dev.gemm_acc(y[r0:r0 + blk.shape[0]], dev.to_device(blk), xj, -1.0)
            nread += blk.nbytes
    x = np.asarray(dev.to_host(y))
    spec.out.write(0, 0, max(n, k, 1), x)
    return {"bytes_read": nread, "bytes_written": x.nbytes, "flops": (2 if forward else 1) * n * n * k}


def swaps_to_permutation(pivots: np.ndarray) -> np.ndarray:
    """The row order ``perm`` with ``P A = A[perm]`` for LAPACK's (0-based) swaps ``i <-> pivots[i]``."""
    perm = np.arange(len(pivots), dtype=np.int64)
    for i, p in enumerate(np.asarray(pivots, dtype=np.int64)):
        if p != i:
            perm[[i, p]] = perm[[p, i]]
    return perm


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
