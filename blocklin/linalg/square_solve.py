"""Square systems ``A x = B`` of any size: out-of-core Cholesky or LU, triangular solves, refinement.

What :func:`blocklin.solve` runs for ``assume_a="pos"`` and ``"sym"``, and for ``assume_a="gen"``
with a square ``A``, ``lam=0`` and ``method="auto"`` (:func:`square_route` decides), in the working
precision or in mixed precision (``precision="mixed"``: the factorization in float32, the residuals
and the solution in float64).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any, Unpack

import numpy as np

from blocklin.config import Settings
from blocklin.errors import (ConvergenceError, ConvergenceWarning, NotPositiveDefiniteError, ParameterError,
                             SingularMatrixError, explain, warn)
from blocklin.linalg.cholesky import factor_into
from blocklin.linalg.lu import factor_lu_into
from blocklin.matrix import Matrix
from blocklin.plan.factor import FactorPlan, plan_factor, plan_lu
from blocklin.runtime.blockops import BlockOps, Region, swaps_to_permutation
from blocklin.runtime.job import Job
from blocklin.storage.zarr_store import create_array
from blocklin.validate import choice, float_operand, same_dtype, same_rows, square

ASSUME = ("gen", "pos", "sym")
PRECISIONS = ("double", "mixed")
#: Most refinement steps: in the working precision each step gains little once the backward error
#: is at ``sqrt(n) eps``; in mixed precision each step gains about ``cond(A) u_32``.
MAX_REFINE = {"double": 3, "mixed": 10}

REPORT_KEYS = ("method", "method_reason", "precision", "residual_norm", "backward_error", "refine_steps", "seconds",
               "growth_factor")


def square_route(shape: tuple[int, int], *, assume_a: str, lam_kind: str, lams: list[float], method: str,
                 fit_intercept: bool, same_dtypes: bool = True) -> str | None:
    """Why ``solve`` takes the square route for a ``gen`` problem (``None``: it stays least squares).

    A square ``A`` with ``lam = 0`` and ``method="auto"`` (and ``b`` of its dtype: the square
    routes do not cast) is a linear system: LU with partial
    pivoting costs ``2 n^3 / 3`` flops against ``n^3`` for the Gram matrix ``A^T A`` and
    ``2 n^3`` for a QR, does not square the condition number as the normal equations do, and runs
    for any ``n`` (the Gram route holds ``n x n`` in core). The least-squares routes stay for
    ``lam > 0`` (Tikhonov), a requested ``method="normal"``/``"qr"`` (a singular or rank-deficient
    square ``A``, where the least-squares routes report the condition), and ``fit_intercept``.
    """
    m, n = shape
    if (assume_a != "gen" or m != n or lam_kind != "scalar" or lams[0] != 0.0 or method != "auto" or fit_intercept
            or not same_dtypes):
        return None
    return (f"square a ({n} x {n}), lam=0, method='auto': a linear system; out-of-core LU with partial pivoting "
            "(2n^3/3 flops, cond(A) not squared as in the normal equations, any n), two triangular solves, "
            "iterative refinement")


def operand_shape(x: Any) -> tuple[int, int] | None:
    """The 2-D shape of an operand without staging it (``None`` when it cannot be told cheaply)."""
    meta = _peek(x)
    return tuple(meta.shape) if meta is not None and len(meta.shape) == 2 else None


def dtypes_known_equal(a: Any, b: Any) -> bool:
    """Whether two operands are known, without staging them, to share their dtype."""
    ma, mb = _peek(a), _peek(b)
    return ma is not None and mb is not None and np.dtype(ma.dtype) == np.dtype(mb.dtype)


def _peek(x: Any) -> Any:
    """An object with the operand's ``shape`` and ``dtype`` (an array, or the opened store), or None."""
    if getattr(x, "shape", None) is not None and getattr(x, "dtype", None) is not None:
        return x
    try:
        from blocklin.create import open as open_matrix

        return open_matrix(x)
    except Exception:  # not a stored matrix: the solver's own checks report it
        return None


@dataclasses.dataclass
class _Factor:
    """A stored factorization and how to solve with it."""

    kind: str  # "cholesky" or "lu"
    path: Any
    plan: FactorPlan
    norm_a: float | None = None
    perm: np.ndarray | None = None
    growth: float | None = None
    #: LU: the pivots, when ``path`` is the panels' work store (solved by ``BlockOps.lu_solve``).
    pivots: np.ndarray | None = None


def solve_square(a: Any, b: Any, out: Any = None, *, assume_a: str = "gen", precision: str = "double",
                 reason: str | None = None, overwrite: bool = False, tol: float | None = None,
                 max_refine: int | None = None, **settings: Unpack[Settings]) -> Matrix:
    """``A x = B`` for square ``A`` of any size, refined to the backward error of the working precision.

    Parameters
    ----------
    a : path, zarr array, Matrix, NumPy or Dask array
        ``n x n``, stored in full (the residuals use all of it). Never modified.
    b : operand
        ``n x k`` (a 1-D NumPy vector is one column), the dtype of ``a``.
    out : path, optional
        Output store for ``x`` (atomic, ``a``'s dtype).
    assume_a : {"gen", "pos", "sym"}
        ``"pos"``: symmetric positive definite, out-of-core Cholesky (the lower triangle is
        factored). ``"sym"``: symmetric; Cholesky when every diagonal entry is positive, falling back
        to LU with partial pivoting when a pivot fails (symmetric indefinite: LU does not use the
        symmetry, costs ``2 n^3 / 3`` instead of ``n^3 / 3`` flops, and is as stable as for any
        matrix). ``"gen"``: LU with partial pivoting over whole columns (:func:`blocklin.lu`).
    precision : {"double", "mixed"}
        ``"double"``: everything in ``A``'s dtype. ``"mixed"`` (float64 ``A``): factor in float32
        (half the memory and traffic, twice the BLAS speed), residuals and ``x`` in float64; the
        refinement reaches the float64 backward error while ``cond(A) u_32 < 1`` (about
        ``cond(A) < 10^7``), and :class:`~blocklin.errors.ConvergenceError` is raised when it does
        not (then use ``"double"``).
    reason : str, optional
        The ``method_reason`` to report (what :func:`blocklin.solve` decided).
    overwrite : bool
        Replace an existing ``out``.
    tol : float, optional
        Target normwise backward error ``||B - A X||_F / (||A||_F ||X||_F + ||B||_F)`` (Rigal and
        Gaches 1967); default ``sqrt(n) eps`` of the output dtype.
    max_refine : int, optional
        Most refinement steps (default 3 in ``"double"``, 10 in ``"mixed"``).
    **settings
        As for every operation: :class:`~blocklin.config.Settings`.

    Returns
    -------
    Matrix
        ``x`` with ``.report``: ``method`` (``"cholesky"`` or ``"lu"``), ``method_reason``,
        ``precision``, ``factor_dtype``, ``residual_norm``, ``backward_error``, ``tol``,
        ``refine_steps``, ``history``, ``growth_factor`` (LU), ``norm_a``, ``solution_norm``, ``plan``.

    Notes
    -----
    Refinement (Wilkinson 1963; Skeel 1980; Higham 2002, ch. 12): ``R = B - A X`` by an out-of-core
    GEMM in the output dtype, ``X += F^{-1} R`` with the stored factors, while the backward error
    exceeds ``tol``, at most ``max_refine`` times, stopping when a step does not halve it. Mixed
    precision is the scheme of Langou et al. (2006) and Carson and Higham (2018): a float32 LU
    with float64 residuals converges to float64 backward error when ``cond(A) u_32`` is below 1.
    """
    assume_a = choice("assume_a", assume_a, ASSUME, fix="pass assume_a='gen', 'pos' or 'sym'")
    precision = choice("precision", precision, PRECISIONS, fix="pass precision='double' or 'mixed'")
    with Job("solve", **settings) as job:
        A, B = _operands(job, a, b, assume_a)
        n, dt, k = A.shape[0], A.dtype, B.shape[1]
        fdt = _factor_dtype(dt, precision)
        tol = math.sqrt(max(n, 1)) * float(np.finfo(dt).eps) if tol is None else float(tol)
        steps_max = MAX_REFINE[precision] if max_refine is None else int(max_refine)
        ao = job.output(out, inputs=[o.path for o in (A, B) if not o.staged], overwrite=overwrite,
                        size=((n, k), dt), temp_size=((n, n), fdt))  # the factor in the temp dir
        factor, why = _factor(job, A, fdt, assume_a, k)
        # the tile operations of the solve work on square tiles; the LU panels are wider (and
        # streamed by BlockOps.lu_solve at their own width), so its stores get the Cholesky's tiles
        chunk = factor.plan.tile if factor.pivots is None else plan_factor(
            "cholesky", n, dt, memory=job.cfg.memory, workers=job.workers(1), chunks=tuple(A.chunks)).tile
        ops = BlockOps(job, chunk)
        ops.workers = factor.plan.workers
        x_path = ao.array_path()
        create_array(x_path, shape=(n, k), dtype=dt, chunks=(ops.chunk, ops.chunk), codec=job.cfg.codec)
        # the LU panels sum A's stored values; the Cholesky tiles the values cast to the factor's dtype
        exact_norm = factor.norm_a is not None and (precision == "double" or factor.kind == "lu")
        norm_a = factor.norm_a if exact_norm else math.sqrt(ops.sumsq(Region.of(A.path, A.shape), description="||A||_F"))
        ref = refine(job, ops, A, B, _solver(job, ops, factor, n, k), x_path, norm_a, tol, steps_max)
        _check_converged(ref, tol, precision, dt)
        col_res, col_x = (_norms(ops.col_sumsq(Region.of(p, (n, k)))) for p in (ref.r_path, x_path))
        report = job.report(method=factor.kind, method_reason=reason or why, precision=precision,
                            factor_dtype=np.dtype(fdt).name, residual_norm=col_res, solution_norm=col_x,
                            residual_norm_fro=ref.residual, backward_error=ref.eta, passes=ref.steps + 2,
                            backward_error_definition="||b - A x||_F / (||A||_F ||x||_F + ||b||_F)", tol=tol,
                            refine_steps=ref.steps, history=ref.history, norm_a=norm_a,
                            growth_factor=factor.growth, plan=factor.plan.to_dict(), orientation="square", lam=0.0,
                            phases=_phases(job, factor.kind))
        report["flops"] = factor.plan.flops + (ref.steps + 1) * 2 * n * n * k * 2
        path = ao.commit("solve", plan=factor.plan.to_dict(), params={"assume_a": assume_a, "precision": precision},
                         report=job.brief(report, REPORT_KEYS))
        return Matrix(path, report=report, temporary=out is None)


def _phases(job: Job, kind: str) -> dict:
    """Where each phase ran: tile work on the job's device; LU's panel ``getrf`` on the host."""
    phases = {"factorization tiles, triangular solves, residual GEMMs": job.device}
    if kind == "lu":
        phases["panel factorization (getrf)"] = "cpu"
    return phases


def _norms(sumsq: np.ndarray) -> float | list[float]:
    """Per right-hand side norms: a float for one column, a list otherwise (as the other solve routes)."""
    v = np.sqrt(np.maximum(sumsq, 0.0))
    return float(v[0]) if v.size == 1 else v.tolist()


def _rhs(b: Any) -> Any:
    return b.reshape(-1, 1) if isinstance(b, np.ndarray) and b.ndim == 1 else b


def _operands(job: Job, a: Any, b: Any, assume_a: str) -> tuple[Any, Any]:
    """``A`` (square) and ``B`` (same rows, same float dtype), checked."""
    A, B = job.operand(a, "a"), job.operand(_rhs(b), "b")
    square(A, f"for assume_a='{assume_a}' (a square system)", "for least squares pass assume_a='gen' with a "
           "non-square a, or method='normal'/'qr'")
    same_rows(A, B)
    float_operand(A), float_operand(B)
    same_dtype(A, B)
    return A, B


def _factor_dtype(dt: np.dtype, precision: str) -> np.dtype:
    if precision == "double":
        return dt
    if dt != np.float64:
        raise ParameterError(explain("precision", "'mixed' factors in float32 and refines in float64, so a must "
                                     "be float64", f"a is {dt.name}", "pass precision='double'"))
    return np.dtype(np.float32)


def _factor(job: Job, A: Any, fdt: np.dtype, assume_a: str, k: int) -> tuple[_Factor, str]:
    """The stored factorization for ``assume_a`` and why it was chosen."""
    n = A.shape[0]
    if assume_a == "gen":
        return _lu(job, A, fdt, k), "assume_a='gen': out-of-core LU with partial pivoting"
    if assume_a == "pos":
        return _cholesky(job, A, fdt), ("assume_a='pos': out-of-core tiled Cholesky of A (any size), two triangular "
                                        "solves, iterative refinement")
    plan = plan_factor("cholesky", n, fdt, memory=job.cfg.memory, workers=job.workers(1), chunks=tuple(A.chunks))
    bad = _first_nonpositive_diagonal(job, A, plan.tile)
    if bad is not None:
        return _lu(job, A, fdt, k), (f"assume_a='sym': a[{bad}, {bad}] <= 0, so A is not positive definite: LU with "
                                  "partial pivoting (symmetric indefinite)")
    try:
        return _cholesky(job, A, fdt), "assume_a='sym': Cholesky succeeded (A is positive definite)"
    except NotPositiveDefiniteError as e:
        return _lu(job, A, fdt, k), (f"assume_a='sym': the Cholesky pivot at row {e.pivot} was <= 0 (A is indefinite): "
                                  "LU with partial pivoting")


def _first_nonpositive_diagonal(job: Job, A: Any, t: int) -> int | None:
    """Index of the first diagonal entry ``<= 0`` (read tile by tile), or None."""
    reg = Region.of(A.path, A.shape)
    for i in range(-(-A.shape[0] // t)):
        d = np.diag(reg.read(i, i, t, A.dtype))
        bad = np.flatnonzero(~(d > 0))
        if bad.size:
            return i * t + int(bad[0])
    return None


def _cholesky(job: Job, A: Any, fdt: np.dtype) -> _Factor:
    n = A.shape[0]
    plan = plan_factor("cholesky", n, fdt, memory=job.cfg.memory, workers=job.workers(1), chunks=tuple(A.chunks),
                       widen=True)
    l_path = job.scratch("l", (n, n), fdt, (plan.tile, plan.tile))
    results = factor_into(job, A, l_path, plan)
    return _Factor("cholesky", l_path, plan, norm_a=math.sqrt(sum(r.get("sumsq", 0.0) for r in results
                                                                   if isinstance(r, dict))))


def _lu(job: Job, A: Any, fdt: np.dtype, k: int) -> _Factor:
    n = A.shape[0]
    plan = plan_lu(n, fdt, memory=job.cfg.memory, chunks=tuple(A.chunks), source_dtype=A.dtype)
    # up to a panel's width of right-hand sides: solve on the panels as stored (BlockOps.lu_solve),
    # without the pass that rewrites them in LAPACK's layout
    streamed = k <= plan.tile
    lu_path = None if streamed else job.scratch("lu", (n, n), fdt, (plan.tile, plan.tile))
    f = factor_lu_into(job, A, lu_path, plan, done_dir=job.temp_dir() / "lu-panels")
    if not (np.isfinite(f.max_a) and np.isfinite(f.max_u)):
        raise ParameterError(explain("precision", f"'mixed' needs A's entries within {np.dtype(fdt).name}'s range "
                                     "(the factorization overflowed)", f"max |A| {f.max_a:.3g}, max |U| {f.max_u:.3g}",
                                     "pass precision='double', or scale A"))
    if n and f.min_pivot == 0.0:
        raise SingularMatrixError(explain("a", "must be nonsingular for a square solve", "LU with partial pivoting "
                                          "met an exact zero pivot (A is singular)", "regularize (lam > 0), or solve "
                                          "the least-squares problem with method='qr'"))
    growth = f.max_u / f.max_a if f.max_a > 0 else 1.0
    if streamed:
        return _Factor("lu", f.work, plan, norm_a=math.sqrt(f.sumsq), growth=growth, pivots=f.pivots)
    return _Factor("lu", lu_path, plan, norm_a=math.sqrt(f.sumsq), perm=swaps_to_permutation(f.pivots),
                   growth=growth)


def _solver(job: Job, ops: BlockOps, f: _Factor, n: int, k: int) -> Callable[[Region, Region], None]:
    """``solve(rhs, dst)``: ``dst = F^{-1} rhs`` by two out-of-core triangular solves (and the row
    permutation of an LU), computed in the factor's dtype."""
    fdt, t = np.dtype(f.plan.dtype), ops.chunk
    freg = Region.of(f.path, (n, n))
    yreg = Region.of(job.scratch("y", (n, k), fdt, (t, t)), (n, k))
    if f.kind == "cholesky":
        def solve(rhs: Region, dst: Region) -> None:
            ops.trsm(freg, rhs, yreg, lower=True, dtype=fdt, description="forward substitution L y = b")
            ops.trsm(freg, yreg, dst, lower=True, trans=True, dtype=fdt, description="back substitution L^T x = y")
        return solve
    if f.pivots is not None:
        def solve_panels(rhs: Region, dst: Region) -> None:  # read and written in fdt (cast on the way)
            ops.lu_solve(f.path, f.pivots, rhs, dst, dtype=fdt, tile=f.plan.tile,
                         description="LU solve (forward and back)")
        return solve_panels
    preg = Region.of(job.scratch("pb", (n, k), fdt, (t, t)), (n, k))

    def solve_lu(rhs: Region, dst: Region) -> None:
        ops.permute_rows(rhs, preg, f.perm, dtype=fdt, description="row swaps P b")
        ops.trsm(freg, preg, yreg, lower=True, unit=True, dtype=fdt, description="forward substitution L y = P b")
        ops.trsm(freg, yreg, dst, lower=False, dtype=fdt, description="back substitution U x = y")
    return solve_lu


@dataclasses.dataclass
class Refinement:
    """Outcome of :func:`refine`."""

    residual: float
    eta: float
    steps: int
    history: list[dict]
    norm_x: float
    #: Store of the last residual ``B - A X``.
    r_path: Any = None


def refine(job: Job, ops: BlockOps, A: Any, B: Any, solve: Callable[[Region, Region], None], x_path: Any,
           norm_a: float, tol: float, max_refine: int) -> Refinement:
    """``X = F^{-1} B`` into ``x_path``, refined while the backward error exceeds ``tol`` and halves.

    Residuals ``B - A X`` and the update ``X += D`` are computed in ``X``'s dtype (that of ``A``).
    """
    (n, k), dt, t = B.shape, A.dtype, ops.chunk
    breg, xreg = Region.of(B.path, (n, k)), Region.of(x_path, (n, k))
    solve(breg, xreg)
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
            return Refinement(res, eta, steps, history, norm_x, r_path)
        solve(Region.of(r_path, (n, k)), Region.of(d_path, (n, k)))
        out_tiles = ops.axpby(xreg, xreg, Region.of(d_path, (n, k)), dtype=dt, description="x += d")
        norm_x = math.sqrt(sum(r["sumsq"] for r in out_tiles))
        steps += 1


def _check_converged(ref: Refinement, tol: float, precision: str, dt: np.dtype) -> None:
    """Mixed precision that did not reach ``tol`` is refused; the working precision warns."""
    if ref.eta <= tol:
        return
    trail = ", ".join(f"{h['backward_error']:.1e}" for h in ref.history)
    if precision == "mixed":
        raise ConvergenceError(explain(
            "precision", "'mixed' must refine the float32 factorization to the float64 backward error",
            f"backward error {ref.eta:.1e} > tol {tol:.1e} after {ref.steps} step(s) (history {trail}): A is too "
            "ill-conditioned for a float32 factorization (cond(A) u_32 near or above 1)",
            "pass precision='double'"))
    warn(f"solve: backward error {ref.eta:.1e} above tol {tol:.1e} after {ref.steps} refinement step(s) "
         f"(history {trail}; condition too large for {dt.name}?)", ConvergenceWarning)


__all__ = ["ASSUME", "PRECISIONS", "Refinement", "operand_shape", "refine", "dtypes_known_equal", "solve_square",
           "square_route"]
