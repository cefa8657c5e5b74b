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
"""

from __future__ import annotations

from typing import Any

import numpy as np

from blocklin.plan.chunks import split
from blocklin.plan.gemm import plan_gemm
from blocklin.runtime.graph import TileGraph
from blocklin.runtime.tiles import Epilogue, GemmSpec, gemm_tile, open_array
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
        #: ``"tf32"``: the float32 GEMMs use TF32 tensor cores on a GPU (``inv(precision="tf32")``).
        self.math: str | None = None

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
             epilogue: Epilogue | None = None, description: str = "gemm") -> list[dict]:
        """``out[R] = alpha * A[Ra] @ B[Rb] + beta * C[Rc]`` over regions; returns the tile results.

        ``epilogue`` (an :class:`~blocklin.runtime.tiles.Epilogue` of the caller) sees every
        finished strip; what it returns is in the tile results.
        """
        job = self.job
        dt = np.dtype(dtype)
        ch = (self.chunk, self.chunk)
        plan = plan_gemm(m, n, k, dt, a_chunks=ch, b_chunks=ch, memory=job.cfg.memory,
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
