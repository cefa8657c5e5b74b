"""Out-of-core triangular solves and SPD solves through the tiled Cholesky factor."""

from __future__ import annotations

import math
from typing import Any, Unpack

import numpy as np

from blocklin.config import Settings
from blocklin.errors import ConvergenceWarning, warn
from blocklin.linalg.cholesky import factor_into
from blocklin.matrix import Matrix
from blocklin.plan.factor import plan_factor
from blocklin.runtime.blockops import BlockOps, Region
from blocklin.runtime.job import Job
from blocklin.storage.zarr_store import create_array
from blocklin.validate import float_operand, result_dtype, same_dtype, same_rows, square

#: Most refinement steps of the SPD solve (each: one GEMM over A and two triangular solves).
MAX_REFINE = 3


def _rhs(b: Any) -> Any:
    return b.reshape(-1, 1) if isinstance(b, np.ndarray) and b.ndim == 1 else b


def solve_triangular(t: Any, b: Any, out: Any = None, *, lower: bool = False, trans: bool = False,
                     overwrite: bool = False, tile: int | None = None, **settings: Unpack[Settings]) -> Matrix:
    """Solve ``op(T) X = B`` for triangular ``T`` larger than memory.

    Parameters
    ----------
    t : path, zarr array, Matrix, NumPy or Dask array
        ``n x n`` triangular matrix; only the triangle named by ``lower`` is read (as LAPACK's
        ``trsm``; the default ``lower=False`` matches :func:`scipy.linalg.solve_triangular`).
    b : operand
        ``n x k`` right-hand sides (a 1-D NumPy vector is one column).
    out : path, optional
        Output store for ``X`` (atomic).
    lower : bool
        ``T`` is lower (else upper) triangular.
    trans : bool
        Solve ``T^T X = B``.
    overwrite : bool
        Replace an existing ``out``.
    tile : int, optional
        Tile side (default: planned from the budget, as for :func:`blocklin.cholesky`).
    **settings
        As for every operation: :class:`~blocklin.config.Settings`.

    Returns
    -------
    Matrix
        ``X`` (``n x k``) with ``.report``.

    Raises
    ------
    SingularMatrixError
        A diagonal tile of ``T`` is singular (a zero on the diagonal) or the solution overflows.

    Notes
    -----
    Block forward (or backward) substitution: tile ``(i, c)`` of ``X`` is one task,
    ``X_ic = T_ii^{-1} (B_ic - sum_k T_ik X_kc)`` over the tiles already solved in substitution order,
    so each column of tiles is a chain of tasks and columns run in parallel. Backward stable as the
    in-core solve: ``(op(T) + E) x = b`` with ``|E| <= c n u |T|`` (Higham 2002, Thm. 8.5).
    ``n^2 k`` flops; ``T`` is read once per tile column of ``B``.
    """
    with Job("solve_triangular", **settings) as job:
        T, B = job.operand(t, "t"), job.operand(_rhs(b), "b")
        n = square(T, "to be triangular", "pass the n x n triangular factor")
        same_rows(T, B)
        float_operand(T), float_operand(B)
        dt = result_dtype([T, B], None if T.dtype == B.dtype else np.result_type(T.dtype, B.dtype))
        plan = plan_factor("solve_triangular", n, dt, memory=job.cfg.memory, workers=job.workers(1),
                           chunks=tuple(T.chunks), tile=tile)
        ao = job.output(out, inputs=[o.path for o in (T, B) if not o.staged], overwrite=overwrite)
        k = B.shape[1]
        create_array(ao.array_path(), shape=(n, k), dtype=dt, chunks=(plan.tile, plan.tile), codec=job.cfg.codec)
        ops = BlockOps(job, plan.tile)
        ops.workers = plan.workers
        ops.trsm(Region.of(T.path, T.shape), Region.of(B.path, B.shape), Region.of(ao.array_path(), (n, k)),
                 lower=lower, trans=trans, dtype=dt, check=job.check_finite, description="triangular solve")
        report = job.report(plan=plan.to_dict(), flops=n * n * k, method="tiled substitution")
        path = ao.commit("solve_triangular", plan=plan.to_dict(), params={"lower": lower, "trans": trans},
                         report=job.brief(report, ("seconds", "peak_memory", "tasks")))
        return Matrix(path, report=report, temporary=out is None)


def solve_spd(a: Any, b: Any, out: Any = None, *, overwrite: bool = False, tol: float | None = None,
              max_refine: int = MAX_REFINE, **settings: Unpack[Settings]) -> Matrix:
    """``A x = B`` for symmetric positive definite ``A`` of any size: out-of-core Cholesky, two
    triangular solves, and fixed-precision iterative refinement; used by ``solve(assume_a="pos")``.

    ``A`` is factored from its lower triangle; the residuals ``B - A X`` use all of ``A`` (store it
    in full). Refinement (Skeel 1980; Higham 2002, ch. 12) repeats ``R = B - A X``,
    ``X += (L L^T)^{-1} R`` while the normwise backward error
    ``||R||_F / (||A||_F ||X||_F + ||B||_F)`` (Rigal and Gaches 1967) exceeds ``tol`` (default
    ``sqrt(n) eps``), at most ``max_refine`` times, stopping when a step does not halve it.
    """
    with Job("solve", **settings) as job:
        A, B = _spd_operands(job, a, b)
        n, dt, k = A.shape[0], A.dtype, B.shape[1]
        eps = float(np.finfo(dt).eps)
        tol = math.sqrt(max(n, 1)) * eps if tol is None else float(tol)
        plan = plan_factor("cholesky", n, dt, memory=job.cfg.memory, workers=job.workers(1), chunks=tuple(A.chunks))
        ao = job.output(out, inputs=[o.path for o in (A, B) if not o.staged], overwrite=overwrite)
        t = plan.tile
        l_path = job.scratch("l", (n, n), dt, (t, t))
        results = factor_into(job, A, l_path, plan)
        norm_a = math.sqrt(sum(r.get("sumsq", 0.0) for r in results if isinstance(r, dict)))
        ops = BlockOps(job, t)
        ops.workers = plan.workers
        x_path = ao.array_path()
        create_array(x_path, shape=(n, k), dtype=dt, chunks=(t, t), codec=job.cfg.codec)
        res, eta, steps, history, norm_x = _cho_solve_refined(job, ops, A, B, l_path, x_path, norm_a, tol, max_refine)
        if eta > tol:
            warn(f"solve: backward error {eta:.1e} above tol {tol:.1e} after {steps} refinement step(s) "
                 f"(condition estimate too large for {dt.name}?)", ConvergenceWarning)
        report = job.report(method="cholesky", method_reason="assume_a='pos': out-of-core tiled Cholesky of A "
                            "(any size), two triangular solves, iterative refinement", residual_norm=res,
                            backward_error=eta, backward_error_definition="||b - A x||_F / (||A||_F ||x||_F + "
                            "||b||_F)", tol=tol, refine_steps=steps, history=history, norm_a=norm_a,
                            solution_norm=norm_x, plan=plan.to_dict(), orientation="square", lam=0.0)
        report["flops"] = plan.flops + (2 * steps + 2) * n * n * k + 2 * (steps + 1) * n * n * k
        path = ao.commit("solve", plan=plan.to_dict(), params={"assume_a": "pos"},
                         report=job.brief(report, ("method", "method_reason", "residual_norm", "backward_error",
                                                   "refine_steps", "seconds")))
        return Matrix(path, report=report, temporary=out is None)


def _spd_operands(job: Job, a: Any, b: Any) -> tuple[Any, Any]:
    """``A`` (square) and ``B`` (same rows, same float dtype), checked."""
    A, B = job.operand(a, "a"), job.operand(_rhs(b), "b")
    square(A, "for assume_a='pos' (a symmetric positive definite system)", "for least squares leave assume_a='gen'")
    same_rows(A, B)
    float_operand(A), float_operand(B)
    same_dtype(A, B)
    return A, B


def _cho_solve_refined(job: Job, ops: BlockOps, A: Any, B: Any, l_path: str, x_path: str, norm_a: float, tol: float,
                       max_refine: int) -> tuple[float, float, int, list[dict], float]:
    """``X = (L L^T)^-1 B`` into ``x_path``, refined while the backward error exceeds ``tol`` and halves.

    Returns the last residual norm, backward error, refinement steps, history and ``||X||_F``.
    """
    (n, k), dt, t = B.shape, A.dtype, ops.chunk
    lreg, breg, xreg = Region.of(l_path, (n, n)), Region.of(B.path, (n, k)), Region.of(x_path, (n, k))
    yreg = Region.of(job.scratch("y", (n, k), dt, (t, t)), (n, k))

    def cho_solve(rhs: Region, dst: Region) -> None:
        ops.trsm(lreg, rhs, yreg, lower=True, dtype=dt, description="forward substitution L y = b")
        ops.trsm(lreg, yreg, dst, lower=True, trans=True, dtype=dt, description="back substitution L^T x = y")

    cho_solve(breg, xreg)
    norm_b = math.sqrt(ops.sumsq(breg))
    norm_x = math.sqrt(ops.sumsq(xreg))
    r_path, d_path = job.scratch("r", (n, k), dt, (t, t)), job.scratch("d", (n, k), dt, (t, t))
    history: list[dict] = []
    steps = 0
    while True:
        ops.gemm(r_path, (0, 0), n, k, n, A.path, (0, 0), x_path, (0, 0), dtype=dt, c=B.path, alpha=-1.0,
                 beta=1.0, description="residual b - A x")
        res = math.sqrt(ops.sumsq(Region.of(r_path, (n, k))))
        denom = norm_a * norm_x + norm_b
        eta = res / denom if denom > 0 else 0.0
        history.append({"step": steps, "residual": res, "backward_error": eta})
        if eta <= tol or steps >= max_refine or (steps and not eta < 0.5 * history[-2]["backward_error"]):
            return res, eta, steps, history, norm_x
        cho_solve(Region.of(r_path, (n, k)), Region.of(d_path, (n, k)))
        out_tiles = ops.axpby(xreg, xreg, Region.of(d_path, (n, k)), dtype=dt, description="x += d")
        norm_x = math.sqrt(sum(r["sumsq"] for r in out_tiles))
        steps += 1


__all__ = ["solve_spd", "solve_triangular"]
