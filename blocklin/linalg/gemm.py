"""Blocked out-of-core GEMM: ``alpha * op(A) @ op(B) + beta * C``."""

from __future__ import annotations

from typing import Any

from dask.base import tokenize

from blocklin.errors import ShapeError, warn
from blocklin.errors import explain as _msg
from blocklin.matrix import Matrix
from blocklin.operands import result_dtype
from blocklin.plan.gemm import GemmPlan, plan_gemm
from blocklin.runtime.graph import TileGraph
from blocklin.runtime.job import Job
from blocklin.runtime.tiles import GemmSpec, gemm_tile
from blocklin.storage.zarr_store import create_array, open_zarr


def _op_shape(shape: tuple[int, int], trans: bool) -> tuple[int, int]:
    return (shape[1], shape[0]) if trans else shape


def matmul(a: Any, b: Any, out: Any = None, *, c: Any = None, alpha: float = 1.0, beta: float = 0.0,
           trans_a: bool = False, trans_b: bool = False, dtype: Any = None, memory: Any = None,
           device: str | None = None, device_memory: Any = None, scheduler: Any = None,
           workers: int | None = None, progress: Any = None, check_finite: bool | None = None,
           overwrite: bool = False, resume: bool = False, explain: bool = False,
           out_chunks: tuple[int, int] | None = None, temp_dir: Any = None,
           storage_options: dict | None = None) -> Matrix | GemmPlan:
    """Out-of-core ``alpha * op(A) @ op(B) + beta * C``, written to a zarr store.

    Each output tile is one task that streams its k-loop through the device (NumPy/BLAS with a
    prefetch thread, or CuPy streams) and writes whole output chunks. The summation order over k is
    fixed by the plan, so results are identical across schedulers and worker counts.

    Parameters
    ----------
    a, b : path, zarr array, Matrix, NumPy or Dask array
        Operands (2-D). Shapes must agree exactly: no broadcasting.
    out : path, optional
        Output zarr store; a new store under the temp dir when omitted. Written under a temporary
        name and renamed when complete.
    c : operand, optional
        ``C`` of ``beta * C`` (shape ``m x n``).
    alpha, beta : float
        Scalars.
    trans_a, trans_b : bool
        Use ``A.T`` / ``B.T`` (read transposed tile by tile, never copied whole).
    dtype : {None, "float32", "float64", ...}
        Compute and output dtype; by default the operands' common dtype (mixed dtypes are an error).
    memory, device_memory : size, optional
        Host and device budgets (``"1GiB"``); default from :mod:`blocklin.config`.
    device : {"auto", "cpu", "gpu"}, optional
    scheduler : str or distributed.Client, optional
    workers : int, optional
        Concurrent tile tasks (local schedulers).
    progress : bool or progress object, optional
    check_finite : bool, optional
        Raise :class:`~blocklin.errors.NonFiniteError` on NaN/Inf, checked while streaming.
    overwrite, resume : bool
        Replace an existing ``out``; continue an interrupted run (same inputs and plan).
    explain : bool
        Return the :class:`~blocklin.plan.GemmPlan` without running.
    out_chunks : (int, int), optional
        Output chunks (must divide the tiles); chosen by the planner by default.
    temp_dir : path or URL, optional
        Where staged inputs and intermediates go (default: config / ``BLOCKLIN_TEMP_DIR``).
    storage_options : dict, optional
        fsspec options for URL operands, outputs and temp dir (credentials, endpoint).

    Returns
    -------
    Matrix
        The result, with ``.report`` (seconds, flops, bytes, peak memory, plan).

    Notes
    -----
    The blocking follows the classical out-of-core GEMM analysis (the I/O lower bound of Hong and
    Kung, 1981): with ``tm x tn`` output tiles, ``op(A)`` is read ``ceil(n/tn)`` times and ``op(B)``
    ``ceil(m/tm)`` times; the planner maximizes the tiles that fit the budget.
    """
    with Job("matmul", memory=memory, device=device, device_memory=device_memory, scheduler=scheduler,
             workers=workers, progress=progress, check_finite=check_finite, temp_dir=temp_dir,
             storage_options=storage_options) as job:
        A = job.operand(a, "a")
        B = job.operand(b, "b")
        C = job.operand(c, "c") if c is not None else None
        m, ka = _op_shape(A.shape, trans_a)
        kb, n = _op_shape(B.shape, trans_b)
        if ka != kb:
            raise ShapeError(_msg(
                "b", "rows of op(B) must equal columns of op(A) (no broadcasting)",
                f"op(A) {m} x {ka}{' (A transposed)' if trans_a else ''} and op(B) {kb} x {n}"
                f"{' (B transposed)' if trans_b else ''}",
                "pass operands with matching inner dimensions, or set trans_a/trans_b"))
        if C is not None and C.shape != (m, n):
            raise ShapeError(_msg("c", "must have the shape of the result (no broadcasting)",
                                     f"{C.shape[0]} x {C.shape[1]}, result {m} x {n}", f"pass a {m} x {n} matrix"))
        if C is not None and beta == 0.0:
            warn("c is ignored because beta=0; pass beta=1.0 to add it")
            C = None
        if C is None and beta != 0.0:
            raise ShapeError(_msg("c", "is required when beta != 0", "c=None", "pass c=... or beta=0.0"))
        ops = [A, B] + ([C] if C is not None else [])
        dt = result_dtype(ops, dtype)
        a_chunks = _op_shape(A.chunks, trans_a)
        b_chunks = _op_shape(B.chunks, trans_b)
        dev_mem = job.device_memory()
        plan = plan_gemm(m, n, ka, dt, a_chunks=a_chunks, b_chunks=b_chunks, memory=job.cfg.memory,
                         source_dtypes=(A.dtype, B.dtype), c_chunks=C.chunks if C is not None else None,
                         workers=job.workers(1), cores=job.cores(), device=job.device, device_memory=dev_mem,
                         out_chunks=out_chunks)
        if explain:
            return plan
        params = {"alpha": alpha, "beta": beta, "trans_a": trans_a, "trans_b": trans_b, "dtype": dt.name}
        token = tokenize("matmul", [(o.path, o.shape, o.dtype.str, o.chunks) for o in ops], params, plan.to_dict())[:16]
        ao = job.output(out, inputs=[o.path for o in ops if not o.staged], overwrite=overwrite, resume=resume,
                        token=token)
        if ao.resumed:
            open_zarr(ao.array_path(), mode="r+")
        else:
            create_array(ao.array_path(), shape=(m, n), dtype=dt, chunks=plan.out_chunks, codec=job.cfg.codec)
        spec = GemmSpec(a=A.path, b=B.path, c=C.path if C is not None else None, out=ao.array_path(),
                        trans_a=trans_a, trans_b=trans_b, alpha=float(alpha), beta=float(beta), dtype=dt.name,
                        plan=plan, device=job.device, device_memory=dev_mem, check_finite=job.check_finite,
                        done_dir=ao.done,
                        blas_threads=job.task_blas_threads(plan.blas_threads))
        graph = TileGraph.named("gemm", token)
        for i, j, rows, cols in plan.tiles():
            graph.add((i, j), gemm_tile, spec, i, j, rows, cols)
        job.run(graph, workers=plan.workers, blas_threads=plan.blas_threads, description="gemm tiles")
        report = job.report(plan=plan.to_dict(), output=str(ao.path))
        report["flops"] = plan.flops
        report["gflops"] = plan.flops / report["seconds"] / 1e9 if report["seconds"] > 0 else 0.0
        path = ao.commit("matmul", plan=plan.to_dict(), params=params, report=_brief(report))
        return Matrix(path, report=report, temporary=out is None)


def _brief(report: dict) -> dict:
    keys = ("seconds", "flops", "gflops", "bytes_read", "bytes_written", "peak_memory", "device", "scheduler", "tasks")
    return {k: report[k] for k in keys if k in report}
