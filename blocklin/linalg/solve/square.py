"""Square systems ``A x = B`` of any size: out-of-core Cholesky or LU, triangular solves, refinement.

What :func:`blocklin.solve` runs for ``assume_a="pos"`` and ``"sym"``, and for ``assume_a="gen"``
with a square ``A``, ``lam=0`` and ``method="auto"`` (:func:`square_route` decides), in the working
precision or in mixed precision (``precision="mixed"``: the factorization in float32, the residuals
and the solution in float64).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Unpack

import numpy as np

from blocklin.config import Settings, format_size, size_hint
from blocklin.errors import (BlocklinWarning, BudgetError, ConvergenceError, ConvergenceWarning,
                             IllConditionedWarning, NotPositiveDefiniteError, NotSymmetricError, ParameterError,
                             SingularMatrixError, explain, warn)
from blocklin.linalg.factor.cholesky import factor_into
from blocklin.linalg.factor.lu import factor_lu_into
from blocklin.linalg.blocks import equilibrate as _equilibrate
from blocklin.linalg.blocks.result_range import (ColumnRange, lu_growth_error, magnitude, refuse_columns,
                                                 solution_range_error, stored_columns, subnormal_note, wide_name)
from blocklin.linalg.blocks.scaling import (backward_error, flushed_line, fro_norm, max_abs, narrow_range,
                                             narrow_range_refusal, nonfinite_refusal, range_refusal, refuse_nonfinite,
                                             safe_norm, sumsq_in_range)
from blocklin.linalg.solve.gmres_ir import (GMRES_TOL, RESTART, SHORT, STALL, Operators, Refined, check_condition,
                                            check_refined, condition_estimate, get, krylov_plan, put, refine_ir)
from blocklin.device.half import FORMATS
from blocklin.linalg.solve.half_scaling import HalfScaling, squeeze
from blocklin.linalg.solve.report import solve_report
from blocklin.matrix import Matrix
from blocklin.operands import Operand, as_columns, decoded_chunks, temp_store_reads
from blocklin.plan.factor import FactorPlan, lu_rhs_fits, plan_factor, plan_lu
from blocklin.plan.minimum import sufficient_budget, whole_call
from blocklin.linalg.factor.lu_panels import lu_solve, rhs_exponents, swaps_to_permutation
from blocklin.runtime.blockops import BlockOps, Region, gemm_chunks, plan_block_gemm
from blocklin.runtime.job import Job
from blocklin.runtime.passes import plan_kernel_pass, source
from blocklin.storage.identity import plan_settings, resume_token
from blocklin.runtime.stages import Stages
from blocklin.runtime.tiles import open_array
from blocklin.storage.zarr_store import create_array, read_kind
from blocklin.validate import choice, float_operand, same_dtype, same_rows, square

ASSUME = ("gen", "pos", "sym")
PRECISIONS = ("double", "mixed", "tf32", "fp16", "bf16")
#: The routes whose factorization's GEMMs take 16-bit inputs (scaled first, refined by GMRES-IR).
HALF = ("fp16", "bf16")
#: ``refinement=``: "auto" (GMRES-IR for fp16/bf16; plain refinement switching to GMRES-IR where it
#: stalls for mixed/tf32; plain in the working precision), "plain", "gmres".
REFINEMENTS = ("auto", "plain", "gmres")
#: Most refinement steps: in the working precision each step gains little once the backward error
#: is at ``sqrt(n) eps``; in mixed precision each step gains about ``cond(A) u_32`` (TF32: ``cond(A) 2^-11``);
#: a GMRES-IR step gains about the GMRES tolerance.
MAX_REFINE = {"double": 3, "mixed": 10, "tf32": 20, "fp16": 10, "bf16": 10}
#: Bytes of the budget the residual GEMM leaves to what runs beside its planned buffers (at most a
#: quarter of the budget).
RUNTIME_RESERVE = 512 * 2**10


def solve_precision(value: Any) -> str:
    """``precision=`` of the solvers: ``"double"`` (the working dtype; also ``None``/``"default"``),
    ``"mixed"`` or ``"tf32"``, with the shared validator's message for anything else."""
    from blocklin.validate import precision

    v = precision(value, ("default", "mixed", "tf32", "fp16", "bf16"), operation="solve",
                  why="the solution is in a's dtype, refined to its backward error: 'mixed' and 'tf32' factor in "
                      "float32 (TF32 GEMMs on a GPU), 'fp16' and 'bf16' with 16-bit GEMM inputs, and refine in "
                      "float64",
                  fix="pass precision='mixed' (or 'tf32', 'fp16', 'bf16', or None for a's dtype)")
    return "double" if v == "default" else v


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


def operand_shape(x: Any, storage_options: dict | None = None) -> tuple[int, int] | None:
    """The 2-D shape of an operand without staging it (``None`` when it cannot be told cheaply)."""
    meta = _peek(x, storage_options)
    return tuple(meta.shape) if meta is not None and len(meta.shape) == 2 else None


def operand_dtype(x: Any, storage_options: dict | None = None) -> np.dtype | None:
    """The dtype of an operand without staging it (``None`` when it cannot be told cheaply)."""
    meta = _peek(x, storage_options)
    return np.dtype(meta.dtype) if meta is not None else None


def dtypes_known_equal(a: Any, b: Any, storage_options: dict | None = None) -> bool:
    """Whether two operands are known, without staging them, to share their dtype."""
    ma, mb = _peek(a, storage_options), _peek(b, storage_options)
    return ma is not None and mb is not None and np.dtype(ma.dtype) == np.dtype(mb.dtype)


def dtypes_known_square(a: Any, b: Any, storage_options: dict | None = None) -> bool:
    """Whether the operands' dtypes, known without staging them, let a square system take the square
    routes: equal, or either complex (a real and a complex one of one precision are promoted as NumPy
    does; :func:`_operands` refuses any other mix with its reason), so that complex data never falls
    to the least-squares routes, which refuse it."""
    ma, mb = _peek(a, storage_options), _peek(b, storage_options)
    if ma is None or mb is None:
        return False
    da, db = np.dtype(ma.dtype), np.dtype(mb.dtype)
    return da == db or "c" in (da.kind, db.kind)


def _peek(x: Any, storage_options: dict | None = None) -> Any:
    """An object with the operand's ``shape`` and ``dtype`` (an array, or the opened store), or None.

    ``storage_options`` are the call's: a URL opened without them (an S3 key given to the call) was
    not known square, and a square system went to the least-squares routes (``cond(A)^2``)."""
    if getattr(x, "shape", None) is not None and getattr(x, "dtype", None) is not None:
        return x
    try:
        from blocklin.create import open as open_matrix

        return open_matrix(x, storage_options=storage_options)
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
    #: LU: the smallest pivot ``min |u_ii|`` and ``max |A|`` (what a substitution's overflow is judged by)
    min_pivot: float | None = None
    max_a: float | None = None
    #: LU: the pivots, when ``path`` is the panels' work store (solved by ``lu_panels.lu_solve``).
    pivots: np.ndarray | None = None
    #: LU: ``L^-1 P B`` when the panels ran the forward substitution of ``B`` (the first solve is then
    #: the back substitution alone).
    forward: Any = None


def solve_square(a: Any, b: Any, out: Any = None, *, assume_a: str = "gen", precision: str = "double",
                 reason: str | None = None, overwrite: bool = False, tol: float | None = None,
                 max_refine: int | None = None, resume: bool = False, refinement: str = "auto",
                 **settings: Unpack[Settings]) -> Matrix:
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
    precision : {"double", "mixed", "tf32", "fp16", "bf16"}
        ``"double"`` (or ``None``): everything in ``A``'s dtype. ``"mixed"`` (float64 ``A``): factor in
        float32 (half the memory and traffic, twice the BLAS speed), residuals and ``x`` in float64;
        the refinement reaches the float64 backward error while ``cond(A) u_32 < 1`` (about
        ``cond(A) < 10^7``), and :class:`~blocklin.errors.ConvergenceError` is raised when it does
        not (then use ``"double"``). ``"tf32"``: the same with the factorization's GEMM updates on
        TF32 tensor cores on a GPU (10-bit mantissas: for ``cond(A)`` up to about ``10^3``; plain
        float32 on a CPU). ``"fp16"``/``"bf16"``: ``A`` scaled into the format's range (Higham, Pranesh
        and Zounon 2019: :mod:`~blocklin.linalg.solve.half_scaling`), factored in float32 with the
        GEMM updates' inputs rounded to float16/bfloat16 (float32 accumulation, as a tensor-core
        GEMM; an emulation on the CPU and, today, on the GPU: :mod:`blocklin.device.half`), refined
        by GMRES-IR to the float64 backward error (:mod:`~blocklin.linalg.solve.gmres_ir`); refused
        up front where the condition estimate breaks GMRES-IR's rule ``cond(A) u_p < 1``.
    refinement : {"auto", "plain", "gmres"}
        ``"auto"``: GMRES-IR for ``"fp16"``/``"bf16"``; for ``"mixed"``/``"tf32"`` plain refinement,
        switching to GMRES-IR where a step does not halve the backward error (the report's
        ``refinement`` says ``"plain, then gmres"``); plain in the working precision. ``"plain"``:
        ``x += M^-1 r`` only. ``"gmres"``: GMRES-IR from the first step (not in the working precision).
    reason : str, optional
        The ``method_reason`` to report (what :func:`blocklin.solve` decided).
    overwrite : bool
        Replace an existing ``out``.
    tol : float, optional
        Target normwise backward error ``||B - A X||_F / (||A||_F ||X||_F + ||B||_F)`` (Rigal and
        Gaches 1967); default ``sqrt(n) eps`` of the output dtype.
    max_refine : int, optional
        Most refinement steps (default 3 in ``"double"``, 10 in ``"mixed"``).
    resume : bool
        Continue an interrupted run writing the same ``out`` (stored inputs): the factorization's
        finished tiles (LU panels) and the finished steps (triangular solves, residuals, updates) are
        not run again, and ``x`` has the bits of an uninterrupted run. The work stores live in a
        deterministic work folder under the temp dir, kept after an error or Ctrl-C for the rerun
        (``blocklin clean`` removes it once its run is gone).
    **settings
        As for every operation: :class:`~blocklin.config.Settings`.

    Returns
    -------
    Matrix
        ``x`` with ``.report``: ``method`` (``"cholesky"`` or ``"lu"``), ``method_reason``,
        ``precision``, ``factor_dtype``, ``residual_norm``, ``backward_error``, ``tol``,
        ``refine_steps``, ``history``, ``growth_factor`` (LU), ``norm_a``, ``solution_norm``, ``plan``,
        ``resumed`` and ``stages_skipped`` (steps a resumed run did not run again); ``refinement``
        (``"plain"``, ``"gmres"`` or ``"plain, then gmres"``), ``history`` with each step's
        ``gmres_iterations``; ``condition_estimate``, a lower estimate of ``cond_2(A)`` (GMRES-IR's, or
        from one more pair of triangular solves with a Gaussian right-hand side: ``inf`` where they
        overflow), with an :class:`~blocklin.errors.IllConditionedWarning` where it is at least ``1 / eps``
        (as ``scipy.linalg.solve`` warns); for ``"fp16"``/``"bf16"`` also ``scaling`` and ``half_gemm``
        (how the 16-bit GEMMs ran); for ``assume_a="gen"`` ``equilibration`` (``applied``, ``rowcnd``,
        ``colcnd`` and, where it applied, the exponent ranges of ``R`` and ``C``: the residuals, backward
        error, history and condition estimate are then those of ``(R A C) y = R b``).

    Notes
    -----
    Refinement (Wilkinson 1963; Skeel 1980; Higham 2002, ch. 12): ``R = B - A X`` by an out-of-core
    GEMM in the output dtype, ``X += F^{-1} R`` with the stored factors, while the backward error
    exceeds ``tol``, at most ``max_refine`` times, stopping when a step does not halve it. Mixed
    precision is the scheme of Langou et al. (2006) and Carson and Higham (2018): a float32 LU
    with float64 residuals converges to float64 backward error when ``cond(A) u_32`` is below 1.

    Equilibration (``assume_a="gen"``), as LAPACK's expert driver ``xGESVX`` with ``FACT = 'E'`` (Anderson et
    al., LAPACK Users' Guide, 1999, sec. 4.4.1): one pass gathers ``A``'s row maxima and the column maxima of
    ``R A`` (:mod:`~blocklin.linalg.blocks.equilibrate`, ``xGEEQUB``'s powers of two ``R`` and ``C``); where
    ``xLAQGE``'s rule applies them (``ROWCND`` or ``COLCND`` below 0.1, as ``blocklin.inv``), ``R A C`` and
    ``R B`` are staged (exact: powers of two) and every route above solves ``(R A C) y = R B``; ``x = C y``.
    A graded ``A = D B`` with ``B`` well conditioned then has ``x`` to ``n eps cond(B)``, not ``cond(A)``.
    """
    assume_a = choice("assume_a", assume_a, ASSUME, fix="pass assume_a='gen', 'pos' or 'sym'")
    precision = solve_precision(precision)
    refinement = choice("refinement", refinement, REFINEMENTS, fix="pass refinement='auto', 'plain' or 'gmres'")
    if precision == "double" and refinement == "gmres":
        raise ParameterError(explain("refinement", "'gmres' refines a low-precision factorization, so it needs "
                                     "precision='mixed', 'tf32', 'fp16' or 'bf16'", "precision='double'",
                                     "pass refinement='auto', or a lower precision"))
    if resume and out is None:
        raise ParameterError(explain("resume", "needs the output path of the run to continue", "out=None",
                                     "pass the same out= as the interrupted run (CLI: -o X.zarr --resume)"))
    with Job("solve", **settings) as job:
        job.math = precision if precision in ("tf32",) + HALF else None  # the float32 factorization's GEMMs
        A, B, dt = _operands(job, a, b, assume_a)
        n, k = A.shape[0], B.shape[1]
        fdt = _factor_dtype(dt, precision, A.dtype)
        # before anything is written: a refusal names the budget at which every step plans
        krylov = f"precision='{precision}'" if precision in HALF or refinement == "gmres" else None
        whole_call(lambda memory: _plan_steps(job, A, B, fdt, assume_a, memory, krylov=krylov), job.cfg.memory,
                   "the square solve")
        tol = math.sqrt(max(n, 1)) * float(np.finfo(dt).eps) if tol is None else float(tol)
        steps_max = MAX_REFINE[precision] if max_refine is None else int(max_refine)
        half = precision in HALF
        if half or refinement == "gmres":  # before anything is read: a refusal names the budget of one column
            krylov_plan(n, k, _gemm_memory(job.cfg.memory), what=f"precision='{precision}'", chunk=1)
        token = _token(job, A, B, out, assume_a=assume_a, precision=precision, tol=tol, max_refine=steps_max,
                       **({"refinement": refinement} if refinement != "auto" else {}))
        # LAPACK's equilibration rule from one pass of row and column maxima (not a recorded stage: a resumed
        # run makes it again on the input its stamps checked)
        eq = _equilibrate.scan(job, A) if n and assume_a == "gen" else None
        staged = _equilibrated_columns(A, B, fdt) if eq is not None and eq.applied else 0
        ao = job.claim(out, [A, B], overwrite=overwrite, resume=resume, token=token, size=((n, k), dt),
                       temp_size=((n, (2 * n if half else n) + staged), fdt))  # the factor (A scaled, R A C) in the temp dir
        rows = _staging_rows(job, A) if staged else 0
        # the powers of two 2^s of the equilibrated R b 2^s and its columns' exponents, from B and R alone (not
        # a recorded stage: a resumed run finds the same); the LU panels eliminate R b 2^s, whose range they judge
        shift, eliminated = _equilibrate.rhs_exponents(job, B, eq, B.dtype) if staged else (None, None)
        run = _SquareRun.start(job, A, B, ao, fdt, assume_a, resume=resume, token=token, dtype=dt, half=half,
                               equilibrated=rows, rider=not (half or refinement == "gmres"), eliminated=eliminated)
        given = B
        if staged:  # the solve runs on (R A C) y = R b 2^s, x = C y 2^-s
            A, B = _equilibrate_system(job, run, A, B, eq, rows, shift)
        if run.rider is not None:
            run.stages.run("condition rhs", lambda: _stage_rider(B, run.rider, run.tiles["lu"], dt))
        if half:
            factor, why, scaling = _factor_half(job, A, fdt, assume_a, run, precision)
        else:
            scaling = None
            factor, why = run.stages.run("factor", lambda: _factor(job, A, fdt, assume_a, run.factor_stores))
        ops = BlockOps(job, run.tiles[factor.kind])
        ops.workers = factor.plan.workers
        if half:
            ops.math = None  # the preconditioner's triangular solves in float32
            factor.norm_a = None  # the factorization summed A scaled: ||A||_F is read from A
        norm_a = run.stages.run("norm a", lambda: _norm_a(job, ops, A, factor, precision))
        solver = _solver(ops, factor, n, k, run.solve_stores(factor), solve_dtype(fdt, dt))
        extra: dict = {}
        if half or refinement == "gmres":
            # blocks of right-hand sides on whole chunks of the n x k stores (their tile operations own chunks)
            krylov = krylov_plan(n, k, _gemm_memory(job.cfg.memory), what=f"precision='{precision}'",
                                 chunk=min(run.tiles[factor.kind], max(k, 1)))
            ref, extra = _refine_low(job, ops, A, B, solver, run, factor, scaling, norm_a, tol, steps_max, krylov,
                                     precision=precision, refinement=refinement)
        else:
            try:
                ref = refine(job, ops, A, B, solver, run, norm_a, tol, steps_max, dtype=dt)
            except SingularMatrixError as err:  # a substitution overflowed: singular, or x beyond the range
                refusal = _range_refusal(A, B, solver, precision)
                if refusal is not None:
                    raise refusal from err
                raise
            extra["refinement"] = "plain"
            if ref.eta > tol and precision != "double" and refinement == "auto" and ref.steps < steps_max:
                # plain refinement of a float32 factorization stalled: GMRES-IR from its iterate, where the
                # budget holds it (pure planning); else refused naming the budget that would
                switch_need = _switch_need(job, A, B, fdt, assume_a, precision)
                if switch_need is not None:
                    _refuse_not_hermitian(ops, A, factor, ref, tol, norm_a, assume_a)
                    _check_converged(ref, tol, precision, dt, switch_need=switch_need)
                ref, extra = _switch_to_gmres(job, ops, A, B, solver, run, factor, ref, norm_a, tol, steps_max,
                                              precision=precision)
            elif ref.eta > tol and precision != "double":
                _refuse_residual_range(job, ref, fdt)
        _refuse_not_hermitian(ops, A, factor, ref, tol, norm_a, assume_a)
        note = _below_range(B, ref.x_path, dt, norm_a) if ref.eta > tol and precision == "double" else None
        _check_converged(ref, tol, precision, dt, note=note)
        if staged:
            run.stages.run("write x", lambda: _write_unequilibrated(job, ref.x_path, ao.array_path(), eq, shift, (n, k),
                                                                    dt, run.chunk))
            _check_rescaled_x(given, ao.array_path(), shift, dt)
        else:
            run.stages.run("write x", lambda: _write_x(job, ref.x_path, ao.array_path(), (n, k), dt, run.chunk))
        col_res, col_x = (_col_norms(ops, Region.of(p, (n, k))) for p in (ref.r_path, ref.x_path))
        if "condition_estimate" not in extra:  # GMRES-IR's own estimate where it ran
            extra["condition_estimate"] = run.stages.run("condition", lambda: _condition_lower(
                ops, solver, ref, norm_a, n))
        _warn_ill_conditioned(extra["condition_estimate"], ref.eta, dt, equilibrated=bool(staged))
        if eq is not None:
            extra["equilibration"] = eq.report(note=EQUILIBRATED)
            if shift is not None and shift.any():
                extra["equilibration"]["b_exponents"] = shift.tolist()
                extra["equilibration"]["note"] = EQUILIBRATED_SHIFTED
        report, recorded = solve_report(
            job, route="square", flops=factor.plan.flops + (ref.steps + 1) * 2 * n * n * k * 2,
            method=factor.kind, method_reason=reason or why, precision=precision,
            factor_dtype=np.dtype(fdt).name, residual_norm=col_res, solution_norm=col_x,
            residual_norm_fro=ref.residual, backward_error=ref.eta, passes=ref.steps + 2,
            backward_error_definition="||b - A x||_F / (||A||_F ||x||_F + ||b||_F)", tol=tol,
            refine_steps=ref.steps, history=ref.history, norm_a=norm_a,
            growth_factor=factor.growth, plan=factor.plan.to_dict(), orientation="square", lam=0.0,
            phases=_phases(job, factor.kind), resumed=run.stages.resumed, stages_skipped=run.stages.skipped,
            **extra)
        x = job.finish(ao, out, report, operation="solve", plan=factor.plan.to_dict(),
                       params={"assume_a": assume_a, "precision": precision}, recorded=recorded)
        x.intercept = None  # as every route's x: a square system has no intercept
        return x


#: The report's note on an equilibrated system.
EQUILIBRATED = ("x = C y with y the solution of (R A C) y = R b (R, C powers of two): residual_norm, backward_error, "
                "history and condition_estimate are those of the equilibrated system")
#: The note where columns of ``R b`` were scaled into the normal range (:func:`_equilibrate.rhs_exponents`).
EQUILIBRATED_SHIFTED = ("x = C y 2^-s with y the solution of (R A C) y = R b 2^s (R, C powers of two, s = b_exponents, "
                        "per column): residual_norm, backward_error, history and condition_estimate are those of the "
                        "equilibrated system")


def _equilibrated_columns(A: Any, B: Any, fdt: np.dtype) -> int:
    """The temp dir's columns (``n`` rows of ``fdt``) that ``R A C`` and ``R B`` take."""
    n, k = B.shape
    return -(-(n * np.dtype(A.dtype).itemsize + k * np.dtype(B.dtype).itemsize) // np.dtype(fdt).itemsize)


def _staging_rows(job: Job, A: Any) -> int:
    """The rows of ``R A C``'s chunks: the largest divisor of ``A``'s chunk rows within the strip the staging
    pass plans at the budget (a strip writes whole chunk rows: ``A``'s own, 256 rows of 1024 float64 columns,
    had held 2 MiB each, three times a 2 MiB budget)."""
    n = A.shape[0]
    params = {"left": np.zeros(n, dtype=np.int32), "right": np.zeros(n, dtype=np.int32), "dtype": np.dtype(A.dtype).name,
              "check": False}
    c = int(A.chunks[0])
    strip = plan_kernel_pass(job, _equilibrate.scale_kernel, [source(A, name="a")], params, max_strip=c).strip
    return max(d for d in range(1, max(1, min(strip, c)) + 1) if c % d == 0)


def _equilibrate_system(job: Job, run: _SquareRun, A: Any, B: Any, eq: _equilibrate.Equilibration,
                        rows: int, shift: np.ndarray) -> tuple[Any, Any]:
    """``R A C`` and ``R B 2^s`` staged in the run's work stores (exact: powers of two, but for entries below
    the range's bottom, negligible next to their row's largest), in ``A``'s and ``B``'s dtypes, ``R A C`` in
    chunks of ``rows`` (:func:`_staging_rows`) by ``A``'s columns: the factorization, the refinement and the
    condition estimate then see the equilibrated system, and the tiles planned for ``A`` hold (same shape and
    dtype, chunks no larger). ``shift``: ``s`` (per column, 0 but where ``R b`` would leave the normal range,
    :func:`~blocklin.linalg.blocks.equilibrate.rhs_exponents`), undone on ``x``."""
    n, k = B.shape
    e_a, e_b = run.equilibrated
    run.stages.run("equilibrate", lambda: _equilibrate.scale_into(
        job, A, e_a, eq.row, eq.col, A.dtype, rows, description="equilibrate (R A C)", over="a"))
    run.stages.run("equilibrate b", lambda: _equilibrate.scale_into(
        job, B, e_b, eq.row, shift, B.dtype, B.chunks[0], description="equilibrate (R b)", over="b"))
    return (Operand(name="a", path=e_a, shape=(n, n), dtype=np.dtype(A.dtype), chunks=(rows, A.chunks[1])),
            Operand(name="b", path=e_b, shape=(n, k), dtype=np.dtype(B.dtype), chunks=tuple(B.chunks)))


def _write_unequilibrated(job: Job, src: Any, dst: Any, eq: _equilibrate.Equilibration, shift: np.ndarray,
                          shape: tuple[int, int], dt: np.dtype, chunk: int) -> None:
    """``x = C y 2^-s`` from the equilibrated system's solution ``y`` into the output (one rounding, where it
    leaves the normal range), refused where an entry leaves the dtype's range (``y`` is of the equilibrated
    system, ``x`` beyond it)."""
    n, k = shape
    y = Operand(name="y", path=src, shape=shape, dtype=np.dtype(dt), chunks=(chunk, min(chunk, max(k, 1))))
    overflow, peak = _equilibrate.scale_into(job, y, dst, eq.col, -shift, dt, chunk,
                                             description="undo the equilibration (x = C y)", over="intermediate",
                                             check=True)
    if overflow:
        raise solution_range_error("a", dt, what="a solution x", actual=(
            f"{overflow} entries of x = C y (y the solution of the equilibrated (R A C) y = R b, R and C powers of "
            f"two) beyond the range, the largest near 2^{peak}: {magnitude(_equilibrate.power_of_two(peak))}"),
            fix=f"scale b by 2.0**{np.finfo(dt).maxexp - 1 - peak} (exact: x is then scaled by it)")


#: The seed of the random right-hand side of :func:`_condition_lower` (fixed: a rerun gives the same estimate).
CONDITION_SEED = 0x636F6E64


def _condition_rhs(n: int, t: int):
    """The Gaussian ``z`` of :func:`_condition_lower`, tile by tile of ``t`` rows: ``(i, block)``."""
    for i in range(-(-n // t)):
        yield i, np.random.default_rng([CONDITION_SEED, i]).standard_normal((min(t, n - i * t), 1))


def _stage_rider(B: Any, dst: Any, t: int, dt: np.dtype) -> None:
    """``[B | z]`` into ``dst`` (``n x (k + 1)``, ``x``'s dtype), ``z`` that of :func:`_condition_rhs`, tile by tile
    (``B`` is ``n x k``, ``k`` at most a panel's width): the LU panels eliminate it whole."""
    n, k = B.shape
    src, out, z = Region.of(B.path, (n, k)), Region.of(dst, (n, k)), Region.of(dst, (n, 1), (0, k))
    for i, block in _condition_rhs(n, t):
        for j in range(-(-k // t)):
            out.write(i, j, t, src.read(i, j, t, dt))
        z.write(i, 0, t, block)


def _condition_lower(ops: BlockOps, solver: _Solver, ref: SolveRefinement, norm_a: float, n: int) -> float:
    """A lower estimate of ``cond_2(A)``: ``||A||_F / sqrt(n) <= ||A||_2`` times ``||F^-1 z|| / ||z||``
    for a Gaussian ``z`` (about ``||A^-1||_F / sqrt(n)``, at most ``||A^-1||_2`` while the factorization
    ``F`` is close to ``A``; Dixon, SIAM J. Numer. Anal. 20(4), 1983: a random vector finds the norm of
    ``A^-1`` to within a small factor with high probability), from one more pair of triangular solves on
    stores the refinement no longer reads. ``x``'s own ratio ``||x|| / ||b||`` does not serve: a ``b``
    graded as ``A``'s rows are (rows ``2^600`` and ``2^-600`` apart) gives ``x`` near 1 and hides an
    ``A^-1`` near ``2^600``. Inf where ``F^-1 z`` leaves the range."""
    if n == 0:
        return 0.0
    t, sumsq = ops.chunk, 0.0
    if solver.rides():  # F^-1 z came with the first solve, as the last column
        y = Region.of(solver.stores["xz"], (n, 1), (0, solver.k))
        sumsq = sum(float(np.sum(block * block)) for _, block in _condition_rhs(n, t))
    else:
        one = solver.window(0, 1)
        z, y = one.region("d"), one.region("x1" if ref.x_path == solver.region("x0").path else "x0")
        for i, block in _condition_rhs(n, t):  # tile by tile: within the budget whatever n is
            sumsq += float(np.sum(block * block))
            z.write(i, 0, t, block)  # in the store's dtype
        try:
            one(z, y)
        except SingularMatrixError:  # the substitutions overflowed where b's did not: A^-1 beyond the range
            return math.inf
    with np.errstate(over="ignore", invalid="ignore"):
        ratio = safe_norm(ops, y, ops.sumsq(y)) / math.sqrt(sumsq)
    return float(_norm_a_lower(norm_a, n) * ratio) if np.isfinite(ratio) else math.inf


def _warn_ill_conditioned(kappa: float, eta: float, dtype: np.dtype, *, equilibrated: bool = False) -> None:
    """Warn, as ``scipy.linalg.solve`` does, where ``cond(A) eps >= 1``: the backward error is small and
    ``x`` may still have no correct digit (its relative error is bounded by about ``cond(A)`` times it).
    ``equilibrated``: ``kappa`` and ``eta`` are those of ``R A C`` (LAPACK's ``xGESVX`` judges the same)."""
    eps = float(np.finfo(dtype).eps)
    if not kappa * eps < 1:
        at = f">= {kappa:.3g}" if math.isfinite(kappa) else "beyond float64's range (A^-1 z overflowed)"
        what = "cond_2(R A C), of A equilibrated by powers of two," if equilibrated else "cond_2(A)"
        fix = "" if equilibrated else ("Where a's rows or columns differ in scale by many powers of two, "
                                       "scale them nearer each other (with b's rows), exactly by powers of two; "
                                       "otherwise regularize")
        warn(f"solve: A is ill-conditioned: {what} {at} (report['condition_estimate'], a lower "
             f"estimate), at or above 1/eps = {1 / eps:.3g} of {np.dtype(dtype).name}; x has backward error "
             f"{eta:.1e} but may have no correct digit (its error is bounded by about cond(A) times that). "
             + (f"{fix}: " if fix else "Regularize: ") + "blocklin.solve(a, b, lam=...)",
             IllConditionedWarning)


def _token(job: Job, A: Any, B: Any, out: Any, **params: Any) -> str:
    """Deterministic in what decides the result's bits: the inputs (path, shape, dtype, chunks; their
    content is checked by the output, :mod:`blocklin.storage.stamps`), the parameters, the output, and
    the settings the plans depend on (budget, workers, cores, device, codec)."""
    return resume_token("solve-square", [A, B], sorted(params.items()), str(out), plan_settings(job))


@dataclasses.dataclass
class _SquareRun:
    """The recorded steps of one square solve and their stores, in a work folder a rerun continues.

    Every store is created here, before any step, in a fixed order (their names number them): the factor
    (both for ``sym``, which may fall back from Cholesky to LU), the triangular solves' work, the
    residual, the correction and two iterates of ``x``, so that no step writes a store it reads."""

    stages: Stages
    work: Any
    chunk: int
    factor_stores: dict
    stores: dict
    #: Per kind of factor, the square tiles of the solve's tile operations and stores.
    tiles: dict
    #: ``precision="fp16"``/``"bf16"``: the store of A scaled into the format's range (float32, A's chunks).
    scaled: Any = None
    #: An equilibrated system: the stores of ``R A C`` and ``R B`` (A's and B's dtypes and chunks).
    equilibrated: tuple | None = None
    #: Where the condition estimate's ``z`` rides the first solve: the store of ``[B | z]`` the LU panels
    #: eliminate (:func:`_stage_rider`).
    rider: Any = None

    @classmethod
    def start(cls, job: Job, A: Any, B: Any, ao: Any, fdt: np.dtype, assume_a: str, *, resume: bool,
              token: str, dtype: np.dtype, half: bool = False, equilibrated: int = 0,
              rider: bool = False, eliminated: np.ndarray | None = None) -> _SquareRun:
        (n, k), dt, sdt = B.shape, dtype, solve_dtype(fdt, dtype)
        plans = {kind: _plan(job, A, fdt, kind) for kind in _kinds(assume_a)}
        tiles = {kind: _tile(job, A, p, dt) for kind, p in plans.items()}
        chunk = tiles[_kinds(assume_a)[0]]  # x's chunks: those of the first route tried
        # the n x k stores are chunked (tile, min(tile, k)): a chunk as wide as a tile would be padded to it on
        # disk (a tile-wide chunk of one column: 1024 x 1024 written and read for 1024 values)
        kc = min(chunk, max(k, 1))
        x_path = ao.array_path()
        work = job.work_dir("solve", token, output=ao, resume=resume)
        stages = Stages(work, ao.done, resume=resume and ao.resumed, codec=job.cfg.codec, start=lambda: create_array(
            x_path, shape=(n, k), dtype=dt, chunks=(chunk, kc), codec=job.cfg.codec, overwrite=True))
        scaled = stages.store("scaled", (n, n), np.float32, tuple(A.chunks)) if half else None
        eq = (stages.store("equilibrated", (n, n), A.dtype, (equilibrated, A.chunks[1])),
              stages.store("equilibrated-b", (n, k), B.dtype, tuple(B.chunks))) if equilibrated else None
        # up to a panel's width of right-hand sides an LU is solved on its panels as stored (no LAPACK-layout store)
        factor_stores = {kind: (None if kind == "lu" and k <= p.tile else stages.store(kind, (n, n), fdt, (p.tile, p.tile)),
                                p, work / f"{kind}-markers") for kind, p in plans.items()}
        stores = {}
        for kind in plans:
            t = tiles[kind]
            stores[kind] = {name: stages.store(name, (n, k), ndt, (t, min(t, max(k, 1)))) for name, ndt in
                            (("y", sdt), ("pb", sdt), ("r", dt), ("d", dt), ("x0", dt), ("x1", dt))}
        if "lu" in plans:  # B's forward substitution inside the panels, into the store y, where it fits beside them
            p = plans["lu"]
            # (not for a complex B with a real A: the panels eliminate B in the factor's dtype)
            fused = (factor_stores["lu"][0] is None and sdt == fdt and not half  # (B is scaled first there)
                     and lu_rhs_fits(n, p.tile, k, fdt.itemsize, dt.itemsize) and _rhs_in_range(B, fdt, eliminated))
            b_path = B.path if eq is None else eq[1]  # the panels eliminate R B beside R A C
            # the condition estimate's z as one more column, where the panels hold it: its pair of triangular
            # solves (a read of L and of U) then rides the panels' elimination and the first back substitution
            # (solved by calls of its own on the same reads of L and U: x keeps its bits, lu_panels.rhs_parts)
            ride = (rider and fused and k + 1 <= p.tile
                    and lu_rhs_fits(n, p.tile, k + 1, fdt.itemsize, dt.itemsize))
            if ride:
                t = tiles["lu"]
                bz, yz, stores["lu"]["xz"] = (stages.store(name, (n, k + 1), ndt, (t, min(t, k + 1))) for name, ndt in
                                              (("rider-b", dt), ("rider-y", sdt), ("rider-x", dt)))
                rider = bz
                factor_stores["lu"] += ((Region.of(bz, (n, k + 1)), Region.of(yz, (n, k + 1)), k),)
            else:
                rider = None
                factor_stores["lu"] += ((Region.of(b_path, (n, k)), Region.of(stores["lu"]["y"], (n, k))) if fused
                                        else None,)
        else:
            rider = None
        return cls(stages, work, chunk, factor_stores, stores, tiles, scaled, eq, rider)

    def solve_stores(self, f: _Factor) -> dict:
        return self.stores[f.kind]


def _rhs_in_range(B: Any, fdt: np.dtype, eliminated: np.ndarray | None = None) -> bool:
    """Whether every column of ``B`` casts to the factor's dtype ``fdt`` within its normal range (always, where
    ``fdt`` is not narrower): the LU panels' forward elimination casts ``B`` as it is, the solve's own tasks
    scale a column beyond the range by a power of two first (:func:`~blocklin.linalg.factor.lu_panels.rhs_exponents`).
    ``eliminated``: an equilibrated system's panels eliminate ``R B 2^s``, not ``B``: its columns' exponents
    (:func:`~blocklin.linalg.blocks.equilibrate.rhs_exponents`) are judged (``B`` near 1 with rows of ``A`` near
    ``2^-250`` is ``R B`` near ``2^250``: its cast had overflowed, leaking NumPy's warning, and the solve was
    refused as beyond float32's range)."""
    from blocklin.storage.zarr_store import row_bands

    if not (B.dtype.kind == fdt.kind == "f" and B.dtype.itemsize > fdt.itemsize) or not B.shape[1]:
        return True
    if eliminated is not None:
        return _equilibrate.rhs_within(eliminated, fdt)
    top = np.zeros(B.shape[1])
    for _, block in row_bands(B.path):
        with np.errstate(invalid="ignore"):
            np.fmax(top, np.max(np.abs(block.reshape(block.shape[0], -1)), axis=0, initial=0.0), out=top)
    return rhs_exponents(top, fdt) is None


def _kinds(assume_a: str) -> tuple[str, ...]:
    return {"gen": ("lu",), "pos": ("cholesky",), "sym": ("cholesky", "lu")}[assume_a]


def _plan(job: Job, A: Any, fdt: np.dtype, kind: str, memory: int | None = None) -> FactorPlan:
    memory = job.cfg.memory if memory is None else memory
    if kind == "lu":
        return plan_lu(A.shape[0], fdt, memory=memory, chunks=tuple(A.chunks), source_dtype=A.dtype,
                       decoded=decoded_chunks(A))
    return plan_factor("cholesky", A.shape[0], fdt, memory=memory, workers=job.workers(1),
                       chunks=tuple(A.chunks), widen=True, decoded=decoded_chunks(A))


def _tile(job: Job, A: Any, plan: FactorPlan, dtype: np.dtype, memory: int | None = None) -> int:
    """The square tile of the solve's tile operations and stores with factorization ``plan``: the
    Cholesky's own; the LU panels are wider (and streamed by ``lu_panels.lu_solve`` at their own width),
    so its stores get Cholesky-sized tiles of ``x``'s ``dtype``."""
    if plan.operation == "cholesky":
        return plan.tile
    return plan_factor("cholesky", A.shape[0], dtype, memory=job.cfg.memory if memory is None else memory,
                       workers=job.workers(1), chunks=tuple(A.chunks)).tile


def _gemm_memory(memory: int) -> int:
    """The residual GEMM's budget: the whole less what its run holds beside the plan's buffers (the
    scheduler's thread, chunk metadata: about 0.45 MiB measured at a 2 MiB budget, where the plan
    alone peaked 1.15x the budget)."""
    return memory - min(memory // 4, RUNTIME_RESERVE)


def _product_chunks(A: Any, B: Any, tile: int) -> dict:
    """The chunks of the refinement's products ``B - A X`` and ``A V``: ``A`` and ``B`` as stored, the
    iterates and residuals as the work stores are, ``(tile, min(tile, k))``."""
    w = (tile, min(tile, max(B.shape[1], 1)))
    return gemm_chunks(tile, a=tuple(A.chunks), b=w, c=tuple(B.chunks), out=w)


def _product_plan(job: Job, A: Any, B: Any, tile: int, width: int, dtype: Any, memory: int) -> None:
    """A refinement product ``B - A X`` of ``width`` columns planned as :meth:`BlockOps.gemm` will plan
    it once the work stores exist (their chunks, and how each operand will be read)."""
    plan_block_gemm(job, tile, A.shape[0], width, A.shape[0], dtype=dtype, a_dtype=A.dtype, with_c=True,
                    memory=memory, chunks=_product_chunks(A, B, tile),
                    reads=(read_kind(A.path), temp_store_reads(job.cfg), read_kind(B.path)))


def _tiles(job: Job, A: Any, B: Any, fdt: np.dtype, assume_a: str, memory: int) -> list[int]:
    """The square tile of each factorization the solve may take at ``memory`` (:func:`_tile`)."""
    dt = np.result_type(A.dtype, B.dtype)
    return [_tile(job, A, _plan(job, A, fdt, kind, memory), dt, memory) for kind in _kinds(assume_a)]


def _plan_steps(job: Job, A: Any, B: Any, fdt: np.dtype, assume_a: str, memory: int, *,
                krylov: str | None = None, tiles: list[int] | None = None) -> None:
    """Every step of the square solve planned at ``memory`` (nothing read): each factorization it may
    take, the tiles of its stores and the residual GEMM of the refinement within its share; with
    ``krylov`` (what asks for GMRES-IR) also GMRES's products of a block of right-hand sides, within the
    half its vectors leave (:func:`_operators`). Unplanned, a ``precision='fp16'`` solve was refused after
    its factorization, naming the minimum of that half alone, below the budget given."""
    n, k, dt = A.shape[0], B.shape[1], np.result_type(A.dtype, B.dtype)
    for t in _tiles(job, A, B, fdt, assume_a, memory) if tiles is None else tiles:
        _product_plan(job, A, B, t, k, dt, _gemm_memory(memory))
        if krylov is not None:
            _, width = krylov_plan(n, k, _gemm_memory(memory), what=krylov, chunk=min(t, max(k, 1)))
            _product_plan(job, A, B, t, width, np.float64, _gemm_memory(memory) // 2)


def _switch_plans(job: Job, A: Any, B: Any, memory: int, what: str, tiles: list[int]) -> None:
    """The switch to GMRES-IR (:func:`_switch_to_gmres`) planned at ``memory`` with the factorizations'
    ``tiles``: the Krylov vectors of all ``k`` right-hand sides in one block, and their products within the
    half of the budget they leave."""
    n, k = B.shape
    gm = _gemm_memory(memory)
    _, width = krylov_plan(n, k, gm, what=what, chunk=max(k, 1))
    if width < k:
        need = 2 * (min(SHORT, RESTART, n) + 5) * 8 * max(n, 1) * k
        raise BudgetError(explain("memory", f"{what} holds the GMRES vectors of its {k} right-hand sides in one "
                                  "block, (restart + 5) n k 8 bytes within half the budget", format_size(memory),
                                  f"raise it to at least {format_size(need)}"), minimum=need)
    for t in tiles:
        _product_plan(job, A, B, t, k, np.float64, gm // 2)


def _switch_need(job: Job, A: Any, B: Any, fdt: np.dtype, assume_a: str, precision: str) -> int | None:
    """``None`` where the switch to GMRES-IR plans at the job's budget; else the least budget at which it
    and every other step plan (named where the plain refinement stalls, not refused up front: most systems
    never switch, and with many right-hand sides the switch's one block needs far more than the
    factorization)."""
    what = f"precision='{precision}' switching to GMRES-IR"
    try:
        _switch_plans(job, A, B, job.cfg.memory, what, _tiles(job, A, B, fdt, assume_a, job.cfg.memory))
        return None
    except BudgetError as exc:
        def both(memory: int) -> None:
            tiles = _tiles(job, A, B, fdt, assume_a, memory)
            _plan_steps(job, A, B, fdt, assume_a, memory, tiles=tiles)
            _switch_plans(job, A, B, memory, what, tiles)
        return sufficient_budget(both, max(job.cfg.memory + 1, int(exc.minimum or 0)))


def _norm_a(job: Job, ops: BlockOps, A: Any, factor: _Factor, precision: str) -> float:
    """``||A||_F``: from the factorization's reads of ``A`` (the LU panels sum A's stored values, also on
    a resumed run; the Cholesky tiles the values cast to the factor's dtype, when every tile ran in this
    run), else by one read of ``A``."""
    if factor.norm_a is not None and (precision == "double" or factor.kind == "lu") and factor.norm_a > 0 \
            and sumsq_in_range(factor.norm_a ** 2):
        return factor.norm_a
    return safe_norm(ops, Region.of(A.path, A.shape), ops.sumsq(Region.of(A.path, A.shape), description="||A||_F"))


def _write_x(job: Job, src: Any, dst: Any, shape: tuple[int, int], dt: np.dtype, chunk: int) -> None:
    """Copy the final iterate into the output (tile by tile on the output's chunks)."""
    ops = BlockOps(job, chunk)
    reg = Region.of(src, shape)
    ops.axpby(Region.of(dst, shape), reg, reg, alpha=1.0, beta=0.0, dtype=dt, description="write x")


def _phases(job: Job, kind: str) -> dict:
    """Where each phase ran: tile work on the job's device; LU's panel ``getrf`` on the host."""
    phases = {"factorization tiles, triangular solves, residual GEMMs": job.device}
    if kind == "lu":
        phases["panel factorization (getrf)"] = "cpu"
    return phases


def _col_norms(ops: BlockOps, region: Region) -> float | list[float]:
    """Per right-hand side norms (:func:`_norms`), each column read again scaled where its sum of
    squares left float64's range."""
    ss = ops.col_sumsq(region)
    if all(sumsq_in_range(float(v)) and v != 0.0 for v in ss):
        return _norms(ss)
    v = [ops.norm(Region.of(region.path, (region.shape[0], 1), (region.off[0], region.off[1] + j)))
         for j in range(region.shape[1])]
    return v[0] if len(v) == 1 else v


def _norms(sumsq: np.ndarray) -> float | list[float]:
    """Per right-hand side norms: a float for one column, a list otherwise (as the other solve routes)."""
    v = np.sqrt(np.maximum(sumsq, 0.0))
    return float(v[0]) if v.size == 1 else v.tolist()


def _operands(job: Job, a: Any, b: Any, assume_a: str) -> tuple[Any, Any, np.dtype]:
    """``A`` (square) and ``B`` (same rows, same float dtype, or a real and a complex one of one precision:
    NumPy's promotion), checked, and the dtype of ``x``."""
    A, B = job.operand(a, "a", integers="cast"), job.operand(as_columns(b), "b", integers="cast")
    square(A, f"for assume_a='{assume_a}' (a square system)", "for least squares pass assume_a='gen' with a "
           "non-square a, or method='normal'/'qr'")
    same_rows(A, B)
    float_operand(A, "solve", complex_ok=True), float_operand(B, "solve", complex_ok=True)
    dt = same_dtype(A, B, complex_promotion=True)
    if job.check_finite:  # here, not as a zero pivot: the substitutions never check b (n x k, read once)
        _check_finite_rhs(B)
    if assume_a == "sym" and dt.kind == "c":  # SciPy's 'sym' of complex data is complex symmetric, not Hermitian
        raise ParameterError(explain("assume_a", "must be 'gen' or 'pos' for complex data (SciPy's 'sym' means "
                                     "complex symmetric, A = A^T, which blocklin does not factor; 'pos' is Hermitian "
                                     "positive definite)", f"assume_a='sym' with {A.name}: {A.dtype.name}, "
                                     f"{B.name}: {B.dtype.name}", "pass assume_a='gen' (LU with partial pivoting), "
                                     "or 'pos' for a Hermitian positive definite a"))
    return A, B, dt


def _check_finite_rhs(B: Any) -> None:
    """Raise :class:`~blocklin.errors.NonFiniteError` naming where ``b`` holds NaN or Inf (a NaN in ``b``
    had come out of the substitutions as "a singular or overflowing diagonal block of U")."""
    from blocklin.runtime.tiles import check_finite
    from blocklin.storage.zarr_store import row_bands

    for rows, block in row_bands(B.path):
        check_finite(block, "b", rows, slice(0, block.shape[1]))


def solve_dtype(fdt: np.dtype, dt: np.dtype) -> np.dtype:
    """The dtype of the triangular solves with a factor of dtype ``fdt`` for an ``x`` of dtype ``dt``: the
    factor's, made complex for a complex ``x`` (a real ``A`` with a complex ``B`` is factored in its real
    dtype, at a quarter of the complex flops, and solved in complex)."""
    return np.result_type(fdt, np.complex64) if dt.kind == "c" else np.dtype(fdt)


def _factor_dtype(dt: np.dtype, precision: str, a_dtype: np.dtype | None = None) -> np.dtype:
    """The factor's dtype for ``x`` of dtype ``dt``: ``A``'s own in the working precision (``a_dtype``:
    real for a real ``A`` with a complex ``B``), float32 for ``"mixed"``/``"tf32"`` (float64 only)."""
    if precision == "double":
        return np.dtype(a_dtype if a_dtype is not None else dt)
    if dt != np.float64:
        what = f"a is {dt.name}" if a_dtype is None or np.dtype(a_dtype) == dt else \
            f"a is {np.dtype(a_dtype).name}, x would be {dt.name}"
        low = "with 16-bit GEMM inputs " if precision in HALF else ""
        raise ParameterError(explain("precision", f"'{precision}' factors in float32 {low}and refines in float64, "
                                     "so a and b must be float64 (not complex)", what, "pass precision='double'"))
    return np.dtype(np.float32)


def _factor(job: Job, A: Any, fdt: np.dtype, assume_a: str, stores: dict) -> tuple[_Factor, str]:
    """The stored factorization for ``assume_a`` and why it was chosen (``stores``: per kind of factor, its
    store, plan and folder of tile markers). A narrower ``fdt`` (``precision="mixed"``) that meets a zero
    pivot or an indefinite ``A`` is refused by name where ``A``'s range is beyond it (a pass for ``max |A|``,
    on that failure only), and a Cholesky's nonpositive pivot where the cast flushed one row and column of
    ``A`` (:func:`_flushed_line_refusal`, as the LU's zero pivot)."""
    try:
        return _factor_as(job, A, fdt, assume_a, stores)
    except (SingularMatrixError, NotPositiveDefiniteError) as err:
        if np.dtype(fdt).itemsize < np.dtype(A.dtype).itemsize:
            # a NaN kept: passed over, the pivot it made had been named float32's (precision='double' the fix)
            amax = max_abs(A, keep_nan=True)
            refusal = nonfinite_refusal(amax, "a square solve") or narrow_range_refusal(
                amax, A.dtype, fdt, "pass precision='double', or scale a by a power of two into float32's range")
            if refusal is None and isinstance(err, NotPositiveDefiniteError) and \
                    getattr(job, "math", None) not in HALF:
                refusal = _flushed_line_refusal(A, fdt, symmetric=True)
            if refusal is not None:
                raise refusal from err
            if getattr(job, "math", None) not in HALF:
                raise _narrow_pivot_refusal(err, fdt, job.math or "mixed") from err
        raise


def _narrow_pivot_refusal(err: SingularMatrixError, fdt: np.dtype, precision: str) -> SingularMatrixError:
    """``err`` (the LU's zero pivot, the Cholesky's pivot <= 0) of a float32 factorization of a float64
    ``A`` whose range is not the cause: ``A`` rounded to float32 is singular or indefinite, as ``A`` is, or
    only as float32 sees it (``cond(A)`` beyond about ``1 / eps_32``: ``[[1, 1], [1, 1 + 2^-30]]`` rounds
    to a singular matrix). Named so, ``precision='double'`` first in the fix, of the same class: the
    ridge or lstsq ``err`` suggests changes the problem, which the factorization in float64 may solve."""
    rule, _, fix = str(err).rpartition(". Fix: ")
    definite = "positive definite" if isinstance(err, NotPositiveDefiniteError) else "nonsingular"
    e32 = float(np.finfo(fdt).eps)
    message = (f"{rule}, in the {fdt.name} factorization precision='{precision}' makes of A rounded to {fdt.name}. Fix: pass precision='double' "
               f"where A is {definite} but too ill-conditioned for {fdt.name} (cond(A) above about 1 / eps = "
               f"{1 / e32:.1e}, where its rounding need not be {definite}); where it is not: {fix}")
    if isinstance(err, NotPositiveDefiniteError):
        return NotPositiveDefiniteError(message, pivot=err.pivot)
    return SingularMatrixError(message)


def _range_refusal(A: Any, B: Any, solver: _Solver, precision: str) -> Exception | None:
    """Why the substitutions of a factorization without a zero pivot overflowed, when it is the range:
    float32 data near ``1e-38`` has pivots whose reciprocals, and an ``x`` (about ``||b|| / sigma_min(A)``),
    near ``1e38`` or beyond; that had been named a singular ``A``. Decided from the factorization's own
    pivots (the LU's ``|u_ii|``, the Cholesky's ``L_ii^2``), none numerically zero (each above ``n eps``
    times the largest), without another pass over ``A``; in mixed precision first ``A``'s cast to float32.
    None otherwise (a singular ``A``: its error stands)."""
    f, sdt = solver.f, solver.dtype
    # check_finite=False: a NaN or Inf of b (max |b| / min pivot is NaN or Inf) had been named a's range
    nonfinite = nonfinite_refusal(max_abs(B, keep_nan=True), "a square solve", "b")
    if nonfinite is not None:
        return nonfinite
    if precision != "double":
        narrow = narrow_range_refusal(max_abs(A), A.dtype, f.plan.dtype, "pass precision='double', or scale a by "
                                      "a power of two into float32's range")
        if narrow is not None:
            return narrow
    n = B.shape[0]
    if f.kind == "cholesky":  # the pivots of A = L L^H are L_ii^2, read from the factor's diagonal tiles
        d = _diagonal(f.path, n, f.plan.tile)
        min_pivot, top = (float(d.min()) ** 2, float(d.max()) ** 2) if d.size else (0.0, 0.0)
        what, pivots = "min L_ii^2", "Cholesky's smallest pivot"
    else:
        min_pivot, top = f.min_pivot or 0.0, (f.growth or 1.0) * (f.max_a or 0.0)
        what, pivots = "min |u_ii|", "LU's smallest pivot"
    if not (0 < min_pivot < math.inf and top > 0):
        return None
    if not min_pivot > n * float(np.finfo(sdt).eps) * top:  # a pivot numerically zero: singular
        return None
    with np.errstate(over="ignore"):
        xest = max_abs(B) / min_pivot
    actual = (f"max |x| about max |b| / {what} = {magnitude(xest)}, with the {pivots} {min_pivot:.3g} (above n eps "
              f"times the largest: not singular to working precision), whose reciprocal {magnitude(1.0 / min_pivot)} "
              "the substitutions take: they overflowed")
    if precision != "double":
        return solution_range_error("precision", sdt, what=f"an x whose precision='{precision}' float32 solves",
                                    actual=actual, fix="pass precision='double' (the solves then run in float64), "
                                    "or refinement='gmres' (GMRES-IR scales each right-hand side of the float32 "
                                    "solves into their range)")
    p = -int(np.frexp(top)[1])
    if p < 0 and xest < float(np.finfo(sdt).max) and 1.0 / min_pivot < float(np.finfo(sdt).max):
        # neither x's estimate nor a pivot's reciprocal is near the overflow: the products u_ij x_j of
        # entries this large are (float32 A near 2^100 with x near 2^47: they reach 2^148 before they
        # cancel back to b's size); A and b scaled together keep x and bring them into range
        return ParameterError(explain(
            "a", f"must keep the substitutions' products u_ij x_j within {sdt.name}'s range (they are formed "
            "before they cancel back to b's size)", f"max |x| at least max |b| / {what} = {magnitude(xest)}, with "
            f"factor entries up to {top:.3g}: the substitutions overflowed",
            f"scale a and b by the same power of two, 2.0**{p} (exact: x is unchanged)"))
    scale = f"scale a by 2.0**{p} (exact: the solution is then 2.0**{-p} times x)"
    wide = wide_name(sdt)
    return solution_range_error("a", sdt, what="a solution x", actual=actual, fix=scale if sdt == np.dtype(wide) else (
        f"solve in {wide}: cast a and b (a.astype('{wide}'); CLI: blocklin convert --dtype {wide}), or {scale}"))


def _diagonal(path: Any, n: int, t: int) -> np.ndarray:
    """``|F_ii|`` of a stored square factor, read one diagonal tile at a time."""
    reg = Region.of(path, (n, n))
    return np.concatenate([np.abs(np.diagonal(reg.read_stored(slice(r, min(n, r + t)), slice(r, min(n, r + t)))))
                           for r in range(0, n, t)]) if n else np.zeros(0)


def _factor_as(job: Job, A: Any, fdt: np.dtype, assume_a: str, stores: dict) -> tuple[_Factor, str]:
    if assume_a == "gen":
        return _lu(job, A, *stores["lu"]), "assume_a='gen': out-of-core LU with partial pivoting"
    if assume_a == "pos":
        return _cholesky(job, A, *stores["cholesky"]), ("assume_a='pos': out-of-core tiled Cholesky of A (any "
                                                        "size), two triangular solves, iterative refinement")
    bad = _first_nonpositive_diagonal(job, A, stores["cholesky"][1].tile)
    if bad is not None:
        return _lu(job, A, *stores["lu"]), (f"assume_a='sym': a[{bad}, {bad}] <= 0, so A is not positive definite: "
                                            "LU with partial pivoting (symmetric indefinite)")
    try:
        return _cholesky(job, A, *stores["cholesky"]), "assume_a='sym': Cholesky succeeded (A is positive definite)"
    except NotPositiveDefiniteError as e:
        return _lu(job, A, *stores["lu"]), (f"assume_a='sym': the Cholesky pivot at row {e.pivot} was <= 0 (A is "
                                            "indefinite): LU with partial pivoting")


def _first_nonpositive_diagonal(job: Job, A: Any, t: int) -> int | None:
    """Index of the first diagonal entry ``<= 0`` (read tile by tile), or None."""
    reg = Region.of(A.path, A.shape)
    for i in range(-(-A.shape[0] // t)):
        d = np.diag(reg.read(i, i, t, A.dtype))
        bad = np.flatnonzero(~(d > 0))
        if bad.size:
            return i * t + int(bad[0])
    return None


def _cholesky(job: Job, A: Any, l_path: Any, plan: FactorPlan, markers: Any) -> _Factor:
    results = [r for r in factor_into(job, A, l_path, plan, done_dir=markers) if isinstance(r, dict)]
    # ||A||_F from the tiles' sums, unless a resumed run skipped some (then _norm_a reads A)
    whole = not any(r.get("skipped") for r in results)
    return _Factor("cholesky", l_path, plan, norm_a=math.sqrt(sum(r.get("sumsq", 0.0) for r in results))
                   if whole else None)


def _lu(job: Job, A: Any, lu_path: Any, plan: FactorPlan, markers: Any, fused: tuple | None = None) -> _Factor:
    """The LU into ``lu_path`` (LAPACK's layout), or with ``lu_path=None`` left in the panels' work store
    for :func:`~blocklin.linalg.factor.lu_panels.lu_solve`; with ``fused`` (regions ``B`` and ``Y``) the panels also write
    ``Y = L^-1 P B`` (Gaussian elimination on ``[A | B]``: the first solve reads no ``L``)."""
    n = A.shape[0]
    fdt = np.dtype(plan.dtype)
    rhs, rhs_out, *split = fused or (None, None)  # split: the condition estimate's z rides from that column
    f = factor_lu_into(job, A, lu_path, plan, done_dir=markers, rhs=rhs, rhs_out=rhs_out,
                       split=split[0] if split else 0)
    refuse_nonfinite(f.max_a, "a square solve")  # check_finite=False: neither a zero pivot nor an overflow
    if not (np.isfinite(f.max_a) and np.isfinite(f.max_u)):
        half = getattr(job, "math", None) in HALF
        refusal = None if half else narrow_range_refusal(f.max_a, A.dtype, fdt, "pass precision='double', or scale "
                                                         "a by a power of two into float32's range")
        if refusal is not None:  # the cast itself overflowed: its range named, not the factorization's growth
            raise refusal
        if not half and fdt.itemsize >= np.dtype(A.dtype).itemsize and np.isfinite(f.max_a):
            raise _growth_refusal(f.max_a, f.max_u, fdt)
        raise ParameterError(explain("precision", f"a float32 factorization needs A's entries within {fdt.name}'s "
                                     "range (the factorization overflowed)" if not half else
                                     f"a factorization with {job.math} GEMM inputs needs its factors within "
                                     f"{job.math}'s range (A is scaled to 2^12 there; the LU's growth overflowed it)",
                                     f"max |A| {f.max_a:.3g}, max |U| {f.max_u:.3g}",
                                     "pass precision='double', or scale A" if not half else
                                     "pass precision='bf16' (float32's range) or 'mixed'"))
    if n and not f.min_pivot > 0.0:  # a zero pivot, or NaN ones (a cast that overflowed): _factor names which
        refusal = _flushed_line_refusal(A, fdt) if fdt.itemsize < np.dtype(A.dtype).itemsize and \
            getattr(job, "math", None) not in HALF else None
        if refusal is not None:
            raise refusal
        raise SingularMatrixError(explain("a", "must be nonsingular for a square solve", "LU with partial pivoting "
                                          "met an exact zero pivot (A is singular)", "blocklin.lstsq(a, b) for the "
                                          "minimum-norm least-squares solution, or regularize (lam > 0)"))
    growth = f.max_u / f.max_a if f.max_a > 0 else 1.0
    if lu_path is None:
        return _Factor("lu", f.work, plan, norm_a=math.sqrt(f.sumsq), growth=growth, pivots=f.pivots, forward=rhs_out,
                       min_pivot=f.min_pivot, max_a=f.max_a)
    return _Factor("lu", lu_path, plan, norm_a=math.sqrt(f.sumsq), perm=swaps_to_permutation(f.pivots),
                   growth=growth, min_pivot=f.min_pivot, max_a=f.max_a)


def _flushed_line_refusal(A: Any, fdt: np.dtype, *, symmetric: bool = False) -> Exception | None:
    """A float32 factorization of float64 ``A`` met a zero pivot (the LU's), or a nonpositive one (the
    Cholesky's, ``symmetric``): where the cast flushed a whole row or column below float32's range (a row
    ``2^-660`` times the others), that is the cause, named with the fix, not a singular or indefinite ``A``
    (the factorization in float64 solves it). None otherwise. A symmetric ``A``'s fix scales the row and
    its column together, so that it stays symmetric, by the power of two that brings the row's largest
    entry near 1: its diagonal entry, scaled twice, cannot then fall below the range (``a_ij^2 <= a_ii a_jj``
    of a positive definite ``A``); where it leaves the range above, the factorization says so."""
    if narrow_range_refusal(max_abs(A), A.dtype, fdt, "") is not None:
        return None  # the whole of A is beyond the range: _factor names that, for every line
    line = flushed_line(A, fdt)
    if line is None:
        return None
    kind, i, top = line
    if symmetric and not float(Region.of(A.path, A.shape).read_stored(slice(i, i + 1), slice(i, i + 1))[0, 0]) > 0:
        return None  # a_ii <= 0 as given (one that underflowed to 0): not positive definite, as the Cholesky says
    low, p = narrow_range(fdt)[0], -int(np.frexp(top)[1])
    if symmetric:
        kind, scale = "row and column", (f"scale row and column {i + 1} of a and entry {i + 1} of b by 2.0**{p} "
                                         f"(exact, and a stays symmetric: entry {i + 1} of x is then scaled by its "
                                         "inverse)")
    elif kind == "row":
        scale = f"scale row {i + 1} of a and entry {i + 1} of b by 2.0**{p} (exact: x is unchanged)"
    else:
        scale = f"scale column {i + 1} of a by 2.0**{p} (exact: entry {i + 1} of x is then scaled by its inverse)"
    fails = "Cholesky meet a pivot <= 0 where A is positive definite" if symmetric else \
        "factorization singular where A is not"
    return ParameterError(explain("precision", f"a {fdt.name} factorization needs every row and column of A within "
                                  f"{fdt.name}'s range (above {low:.3g}): a {kind} its cast flushes makes the "
                                  f"{fails}", f"{kind} {i + 1} of A: max |a| = {top:.3g}",
                                  f"pass precision='double', or {scale}"))


def _growth_refusal(max_a: float, max_u: float, fdt: np.dtype) -> Exception:
    """The LU of ``A`` in its own dtype overflowed; ``A`` and ``b`` scaled by one power of two have the same ``x``."""
    e = int(np.frexp(max_a)[1])
    return lu_growth_error(max_a, max_u, fdt, f"scale a and b by the same power of two, 2.0**-{e} (exact: x is "
                           f"unchanged), or solve in {wide_name(fdt)} (cast a and b)")


def _solver(ops: BlockOps, f: _Factor, n: int, k: int, stores: dict, dtype: np.dtype) -> _Solver:
    """``dst = F^{-1} rhs`` by two out-of-core triangular solves (and the row permutation of an LU),
    computed in ``dtype`` (:func:`solve_dtype`: the factor's, complex for a complex ``x``), with the stores
    of ``stores`` (``y``, ``pb``, ``r``, ``d``, ``x0``, ``x1``)."""
    return _Solver(ops, f, n, k, stores, np.dtype(dtype))


@dataclasses.dataclass
class _Solver:
    ops: BlockOps
    f: _Factor
    n: int
    k: int
    stores: dict
    dtype: np.dtype
    #: The first column of the window of right-hand sides this solver works on (:meth:`window`).
    col0: int = 0

    def region(self, name: str) -> Region:
        return Region.of(self.stores[name], (self.n, self.k), (0, self.col0))

    def window(self, c0: int, c1: int) -> _Solver:
        """The solver of the right-hand sides ``c0:c1`` (sub-regions of the same stores)."""
        return dataclasses.replace(self, k=c1 - c0, col0=self.col0 + c0)

    def first(self, b: Region, dst: Region) -> None:
        """``dst = F^{-1} B`` for the right-hand sides ``b`` themselves: when the LU panels already ran
        their forward substitution (``L^-1 P B`` in the store ``y``), the back substitution alone."""
        f = self.f
        if f.forward is None:
            self(b, dst)
            return
        if not self.rides():
            lu_solve(self.ops, f.path, f.pivots, f.forward, dst, dtype=self.dtype, tile=f.plan.tile,
                     forward=False, description="LU back substitution U x = y")
            return
        n, k = self.n, self.k
        xz = Region.of(self.stores["xz"], (n, k + 1))
        # z's column, inf where its substitution overflowed (A^-1 beyond the range), read by the estimate
        lu_solve(self.ops, f.path, f.pivots, f.forward, xz, dtype=self.dtype, tile=f.plan.tile, forward=False,
                 split=k, description="LU back substitution U x = y (and the condition estimate's z)")
        t, src = self.ops.chunk, Region.of(xz.path, (n, k))
        for i in range(-(-n // t)):  # x's columns into dst, as they are (the same dtype)
            for j in range(-(-k // t)):
                dst.write(i, j, t, src.read(i, j, t, None))

    def rides(self) -> bool:
        """Whether the condition estimate's ``z`` rode the LU panels as column ``k`` (:func:`_stage_rider`)."""
        f = self.f
        return "xz" in self.stores and f.forward is not None and f.forward.shape[1] == self.k + 1

    def __call__(self, rhs: Region, dst: Region) -> None:
        ops, f, fdt = self.ops, self.f, self.dtype
        if f.pivots is not None:  # read and written in the solves' dtype (cast on the way, lu_panels scaling)
            lu_solve(ops, f.path, f.pivots, rhs, dst, dtype=fdt, tile=f.plan.tile,
                     description="LU solve (forward and back)")
            return
        e = self._exponents(rhs)
        if e is None:
            self._substitutions(rhs, dst)
            return
        # the solves on rhs 2^-e (cast into the store they read first), x into pb, then x 2^e (exact both ways)
        y, pb, wide = self.region("y"), self.region("pb"), np.dtype(open_array(rhs.path).dtype)
        first = y if f.kind == "lu" else pb
        ops.scale_columns(rhs, first, -e, dtype=wide, description="b's columns into the factor's range")
        self._substitutions(first, pb)
        ops.scale_columns(pb, dst, e, dtype=wide, description="x's columns back from the factor's range")

    def _substitutions(self, rhs: Region, dst: Region) -> None:
        """``dst = F^{-1} rhs`` by the triangular solves through the stores ``y`` (and an LU's row swaps into
        ``pb``); ``rhs`` may be the store read first (``pb`` of a Cholesky, ``y`` of an LU), ``dst`` ``pb``."""
        ops, f, fdt = self.ops, self.f, self.dtype
        freg, yreg = Region.of(f.path, (self.n, self.n)), self.region("y")
        if f.kind == "cholesky":
            ops.trsm(freg, rhs, yreg, lower=True, dtype=fdt, description="forward substitution L y = b")
            ops.trsm(freg, yreg, dst, lower=True, trans="C", dtype=fdt, description="back substitution L^H x = y")
            return
        preg = self.region("pb")
        ops.permute_rows(rhs, preg, f.perm, dtype=fdt, description="row swaps P b")
        ops.trsm(freg, preg, yreg, lower=True, unit=True, dtype=fdt, description="forward substitution L y = P b")
        ops.trsm(freg, yreg, dst, lower=False, dtype=fdt, description="back substitution U x = y")

    def _exponents(self, rhs: Region) -> np.ndarray | None:
        """Per column of ``rhs``, the power of two :func:`~blocklin.linalg.factor.lu_panels.rhs_exponents`
        divides it by before the cast to a narrower factor's dtype (the triangular solves cast as they read:
        ``b`` near ``2^500`` had overflowed to inf, leaking NumPy's warning; one near ``2^-500``, or a residual
        below float32's range, flushed to 0, and its ``x`` came back as zeros); None where the dtype is not
        narrower or every column is within its range."""
        wide = np.dtype(open_array(rhs.path).dtype)
        if wide.itemsize <= self.dtype.itemsize or not rhs.shape[1]:
            return None
        return rhs_exponents(self.ops.col_max(rhs, description="b's column maxima"), self.dtype)


@dataclasses.dataclass
class SolveRefinement:
    """Outcome of :func:`refine`."""

    residual: float
    eta: float
    steps: int
    history: list[dict]
    norm_x: float
    #: Store of the last residual ``B - A X``.
    r_path: Any = None
    #: Store of the final ``X``.
    x_path: Any = None


def refine(job: Job, ops: BlockOps, A: Any, B: Any, solve: _Solver, run: _SquareRun, norm_a: float, tol: float,
           max_refine: int, *, dtype: Any = None) -> SolveRefinement:
    """``X = F^{-1} B``, refined while the backward error exceeds ``tol`` and halves; every step recorded.

    Residuals ``B - A X`` and the update ``X_{s+1} = X_s + D`` are computed in ``X``'s dtype ``dtype``
    (that of ``A``, or complex for a complex ``B``; complex residuals for complex data), the iterates
    alternating between two stores so that no step writes what it reads (a step interrupted and run
    again finds its inputs unchanged)."""
    (n, k), dt, st = B.shape, np.dtype(dtype if dtype is not None else A.dtype), run.stages
    breg = Region.of(B.path, (n, k))
    xs = [solve.region("x0"), solve.region("x1")]
    rreg, dreg = solve.region("r"), solve.region("d")
    st.run("solve", lambda: solve.first(breg, xs[0]))
    norm_b = st.run("norm b", lambda: safe_norm(ops, breg, ops.sumsq(breg)))
    norm_x = st.run("norm x", lambda: safe_norm(ops, xs[0], ops.sumsq(xs[0])))
    history: list[dict] = []
    steps = 0

    gemm_memory = _gemm_memory(job.cfg.memory)  # within the budget less what its run holds beside it

    def residual(x: Region) -> float:
        ops.gemm(rreg.path, (0, 0), n, k, n, A.path, (0, 0), x.path, (0, 0), dtype=dt, a_dtype=A.dtype, c=B.path,
                 alpha=-1.0, beta=1.0, memory=gemm_memory, chunks=_product_chunks(A, B, ops.chunk),
                 description="residual b - A x")
        return safe_norm(ops, rreg, ops.sumsq(rreg))

    def update(x: Region, nxt: Region) -> float:
        return safe_norm(ops, nxt, sum(r["sumsq"] for r in ops.axpby(nxt, x, dreg, dtype=dt, description="x += d")))

    while True:
        x = xs[steps % 2]
        res = st.run("residual", lambda: residual(x))
        eta = backward_error(res, norm_a, norm_x, norm_b)
        history.append({"step": steps, "residual": res, "backward_error": eta})
        if eta <= tol or steps >= max_refine or (steps and not eta < 0.5 * history[-2]["backward_error"]):
            return SolveRefinement(res, eta, steps, history, norm_x, rreg.path, x.path)
        st.run("correction", lambda: solve(rreg, dreg))
        norm_x = st.run("update", lambda: update(x, xs[(steps + 1) % 2]))
        steps += 1


#: Most retries of a shifted low-precision Cholesky (the shift doubling from ``2 u_f``).
SHIFT_TRIES = 8


def _factor_half(job: Job, A: Any, fdt: np.dtype, assume_a: str, run: _SquareRun,
                 precision: str) -> tuple[_Factor, str, HalfScaling]:
    """``A`` squeezed into the format's range (:func:`~blocklin.linalg.solve.half_scaling.squeeze`) and
    factored from the scaled copy. A Cholesky (``assume_a="pos"``) that breaks down in the low
    precision (``cond(A) u_f`` near 1 makes the rounded matrix indefinite) is retried on
    ``A_s + c u_f mu I``, ``c = 2, 4, 8, ...`` (Higham and Pranesh 2021, SISC 43(2), Alg. 3.1's shift
    of the scaled matrix): the preconditioner is then of a nearby matrix, and GMRES-IR's residuals,
    of ``A`` itself, correct the difference."""
    sops = BlockOps(job, max(A.chunks))
    u = FORMATS[precision]["u"]
    stores = run.factor_stores
    for attempt in range(SHIFT_TRIES):
        shift = 0.0 if attempt == 0 else 2.0 ** attempt * u
        scaling = run.stages.run("scale", lambda: squeeze(
            sops, Region.of(A.path, A.shape), Region.of(run.scaled, A.shape), tuple(A.chunks), precision,
            symmetric=assume_a != "gen", positive=assume_a == "pos", shift=shift))
        Af = job.operand(run.scaled, "a (scaled)")
        try:
            factor, why = run.stages.run("factor", lambda: _factor(job, Af, fdt, assume_a, stores))
        except NotPositiveDefiniteError:
            if assume_a != "pos" or attempt == SHIFT_TRIES - 1:
                raise
            # fresh markers: no tile of the failed attempt is kept
            stores = {kind: (v[0], v[1], run.work / f"{kind}-markers-shift{attempt + 1}") + tuple(v[3:])
                      for kind, v in run.factor_stores.items()}
            continue
        if shift:
            why += f"; the {precision} Cholesky broke down, so A_s + {shift:.3g} mu I was factored (shifted Cholesky)"
        return factor, why, scaling
    raise AssertionError("unreachable")


def _operators(job: Job, ops: BlockOps, A: Any, B: Any, solver: _Solver, scaling: HalfScaling | None) -> Operators:
    """The refinement's out-of-core pieces on the solve's work stores (``x0``: operands, ``d``: results,
    ``r``: residuals); their products plan within the half of the budget the Krylov vectors leave
    (:func:`~blocklin.linalg.solve.gmres_ir.krylov_plan`)."""
    n = B.shape[0]
    memory = _gemm_memory(job.cfg.memory) // 2

    def gemm(out: Region, x: Region, c: Region | None) -> None:
        ops.gemm(out.path, out.off, n, out.shape[1], n, A.path, (0, 0), x.path, x.off, dtype=np.float64,
                 a_dtype=A.dtype, c=None if c is None else c.path, c_off=(0, 0) if c is None else c.off,
                 alpha=-1.0 if c is not None else 1.0,
                 beta=1.0 if c is not None else 0.0, memory=memory, chunks=_product_chunks(A, B, ops.chunk),
                 description="residual b - A x" if c is not None else "GMRES product A v")

    return Operators(gemm=gemm, solve=solver, a=Region.of(A.path, A.shape),
                     b=Region.of(B.path, (n, solver.k), (0, solver.col0)),
                     v=solver.region("x0"), w=solver.region("d"), r=solver.region("r"),
                     row=None if scaling is None else scaling.row, col=None if scaling is None else scaling.col,
                     mu=1.0 if scaling is None else scaling.mu)


def _norm_a_lower(norm_a: float, n: int) -> float:
    """A lower bound of ``||A||_2``: ``||A||_F / sqrt(n)``."""
    return norm_a / math.sqrt(max(n, 1))


def _half_gemm(job: Job, precision: str) -> str:
    fmt = {"fp16": "float16", "bf16": "bfloat16"}[precision]
    if job.device == "gpu":
        return (f"the GEMM inputs rounded to {fmt} on the GPU, products by float32 cuBLAS GEMMs (the arithmetic of "
                "a tensor-core GEMM with float32 accumulation, not its speed)")
    return f"emulated on the CPU: the GEMM inputs rounded to {fmt}, products by float32 BLAS (slower than float32)"


def _refine_low(job: Job, ops: BlockOps, A: Any, B: Any, solver: _Solver, run: _SquareRun, factor: _Factor,
                scaling: HalfScaling | None, norm_a: float, tol: float, steps_max: int, krylov: tuple[int, int], *,
                precision: str, refinement: str) -> tuple[SolveRefinement, dict]:
    """GMRES-IR (or plain refinement, ``refinement="plain"``) with the low-precision factorization as
    the preconditioner, from ``x0 = M^-1 B``, on blocks of right-hand sides whose Krylov vectors fit
    the budget (``krylov``: restart length and block width, :func:`~blocklin.linalg.solve.gmres_ir.krylov_plan`);
    refused up front where the condition estimate breaks
    :func:`~blocklin.linalg.solve.gmres_ir.check_condition`'s rule."""
    n, k = B.shape
    restart, width = krylov
    kind = "gmres" if refinement in ("auto", "gmres") else "plain"
    blocks, kappa, matvecs, solves = [], 0.0, 0, 0
    for c0 in range(0, max(k, 1), width):
        c1 = min(k, c0 + width)
        win = solver.window(c0, c1)
        ir = _operators(job, ops, A, B, win, scaling)
        b = get(ir.b)
        x = ir.precond(b)
        _refuse_solution_range(x, b)
        if c0 == 0:  # the estimate from the first block; the rule holds for every column
            kappa = condition_estimate(ir, x, b, scaling.norm_lower if scaling else _norm_a_lower(norm_a, n),
                                       steps=2 if c1 - c0 <= 8 else 0)
            check_condition(kappa, precision=precision, kind=f"{precision} ({factor.kind})")
        done = refine_ir(ir, x, norm_a=norm_a, norm_b=fro_norm(b), tol=tol, max_steps=steps_max,
                         kind=kind, restart=restart)
        check_refined(done, tol, precision)
        put(win.region("x1"), done.x)
        blocks.append(done)
        matvecs, solves = matvecs + ir.matvecs, solves + ir.solves
    extra = {"refinement": blocks[0].kind if blocks else kind, "condition_estimate": kappa, "gmres_restart": restart,
             "gmres_tol": GMRES_TOL, "products_with_a": matvecs, "preconditioner_solves": solves}
    if len(blocks) > 1:
        extra.update(rhs_blocks=len(blocks), rhs_block_width=width,
                     block_histories=[d.history for d in blocks])
    if scaling is not None:
        extra.update(scaling=scaling.to_dict(), half_gemm=_half_gemm(job, precision))
    return _whole(ops, B, solver, blocks, norm_a), extra


def _refuse_solution_range(x: np.ndarray, b: np.ndarray) -> None:
    """Refuse where the first solve ``x_0 = M^-1 b`` (whose columns the preconditioner scales into
    float32's range and back, :meth:`~blocklin.linalg.solve.gmres_ir.Operators.precond`) left float64's
    range: ``x`` overflowed, or all of it lies below float64's smallest normal number (``A``
    near ``2^1000`` with ``b`` near ``2^-664``: ``x`` near ``2^-1664`` is 0). The refinement cannot bring
    such an ``x`` to the backward error, and had been refused as not converging, as a singular ``A``,
    or by a condition estimate of ``inf``."""
    bmax = float(np.max(np.abs(b))) if b.size else 0.0
    top = float(np.max(np.abs(x))) if x.size else 0.0
    # below the smallest normal number the largest entry's spacing 2^-1074 exceeds eps times it: x loses its
    # normwise precision (above it, subnormal small entries cost less than eps ||x||)
    fi = np.finfo(np.float64)
    low, high = float(fi.tiny), float(fi.max)
    finite = bool(np.isfinite(x).all())
    # the backward error needs ||x||_F: entries below 1.8e308 whose norm is beyond it are refused too
    wide = finite and not np.isfinite(fro_norm(x))
    if bmax == 0 or (finite and top >= low and not wide):
        return
    if wide:
        actual, way = (f"||x_0||_F beyond {high:.3g} (max |x_0| = {top:.3g}; the backward error needs ||x||) from "
                       f"max |b| = {bmax:.3g}"), "down"
    elif finite:
        actual, way = f"max |x_0| = {top:.3g} from max |b| = {bmax:.3g}, below {low:.3g}", "up"
    else:
        actual, way = f"x_0 overflowed float64 (beyond {high:.3g}) from max |b| = {bmax:.3g}", "down"
    raise ParameterError(explain(
        "b", f"must give a solution x = A^-1 b within float64's range, the precision x is returned in (largest "
        f"magnitude from the smallest normal number {low:.3g} to {high:.3g}), judged from the first solve x_0 = M^-1 b",
        actual, f"scale b {way} by a power of two (exact: x is scaled by it), or a the other way"))


def _whole(ops: BlockOps, B: Any, solver: _Solver, blocks: list[Refined], norm_a: float) -> SolveRefinement:
    """The refinement of all right-hand sides from its blocks: ``x`` in the store ``x1``, the last residuals
    in ``r``; one block's history (the first), the backward error of the whole."""
    n, k = B.shape
    rreg, xreg, breg = solver.region("r"), solver.region("x1"), Region.of(B.path, (n, k))
    res = safe_norm(ops, rreg, ops.sumsq(rreg))
    norm_x = safe_norm(ops, xreg, ops.sumsq(xreg))
    norm_b = safe_norm(ops, breg, ops.sumsq(breg))
    first = blocks[0] if blocks else None
    return SolveRefinement(res, backward_error(res, norm_a, norm_x, norm_b), max((d.steps for d in blocks), default=0),
                           first.history if first else [], norm_x, rreg.path, xreg.path)


def _switch_to_gmres(job: Job, ops: BlockOps, A: Any, B: Any, solver: _Solver, run: _SquareRun, factor: _Factor,
                     ref: SolveRefinement, norm_a: float, tol: float, steps_max: int, *,
                     precision: str) -> tuple[SolveRefinement, dict]:
    """Plain refinement of a float32 factorization stalled above ``tol``: GMRES-IR from its last iterate."""
    n, k = B.shape
    # all right-hand sides in one block: _switch_need planned it at this budget before the call
    restart, _ = krylov_plan(n, k, _gemm_memory(job.cfg.memory), what=f"GMRES-IR after precision='{precision}'")
    ir = _operators(job, ops, A, B, solver, None)
    b, x = get(ir.b), get(Region.of(ref.x_path, (n, k)))
    kappa = condition_estimate(ir, ir.precond(b), b, _norm_a_lower(norm_a, n), steps=2 if k <= 8 else 0)
    check_condition(kappa, precision=precision, kind=f"float32 ({factor.kind})")
    history = [dict(h, refinement="plain") for h in ref.history]
    last = history.pop()  # GMRES-IR starts from the stalled iterate: its residual is recomputed
    done = refine_ir(ir, x, norm_a=norm_a, norm_b=fro_norm(b), tol=tol,
                     max_steps=steps_max - ref.steps, kind="gmres", restart=restart, history=history, step0=last["step"])
    done.history[len(ref.history) - 1]["switched"] = (
        f"plain refinement stalled (backward error {last['backward_error']:.1e} after step {last['step']}, not below "
        f"{STALL} x the step before)")
    done.kind = "plain, then gmres"
    check_refined(done, tol, precision)
    return _stored(ir, done, solver), {"refinement": done.kind, "condition_estimate": kappa, "gmres_restart": restart,
                                       "gmres_tol": GMRES_TOL}


def _stored(ir: Operators, done: Refined, solver: _Solver) -> SolveRefinement:
    """The refined ``x`` written to the work store ``x1`` (its last residual is in ``r``)."""
    xreg = solver.region("x1")
    put(xreg, done.x)
    return SolveRefinement(done.residual, done.eta, done.steps, done.history, done.norm_x, ir.r.path, xreg.path)


def _refuse_residual_range(job: Job, ref: SolveRefinement, fdt: np.dtype) -> None:
    """Plain refinement of a float32 factorization that stopped above ``tol`` where its last residual
    ``b - A x`` lies below float32's range: the solves' cast flushed it (``b`` near ``1e-200``: ``x_0 = 0``
    and every correction zero), so the refinement could not move, whatever ``cond(A)``; named, with the
    refinement that scales each correction into the range (it had been called too ill-conditioned)."""
    top = max_abs(job.operand(ref.r_path, "b - A x"))
    refusal = range_refusal(top, fdt, f"plain refinement's {np.dtype(fdt).name} triangular solves need the residual "
                            "b - A x", "b - A x", "pass refinement='gmres' or 'auto' (GMRES-IR scales each "
                            "correction into the range), or precision='double'") if top > 0 else None
    if refusal is not None:
        raise refusal


def _refuse_not_hermitian(ops: BlockOps, A: Any, factor: _Factor, ref: SolveRefinement, tol: float, norm_a: float,
                          assume_a: str) -> None:
    """A Cholesky's refinement that stopped above ``tol`` on an ``A`` that is not Hermitian (symmetric, of
    real data) is refused by name: the Cholesky reads one triangle and takes the other as its conjugate
    transpose, so it factored another matrix (a complex *symmetric* ``A = A^T`` is one), and the
    refinement against the true ``A`` stalls; the stall had been reported as a condition number too
    large. Checked only on a stall (one more read of ``A``): a refinement that reached ``tol`` solved the
    true ``A`` to its backward error whatever the factor. The tolerance is ``eigsh``'s, ``sqrt(eps)``."""
    if factor.kind != "cholesky" or not ref.eta > tol:
        return
    region = Region.of(A.path, A.shape)
    gap = ops.asymmetry(region)
    size = norm_a if norm_a > 0 else 1.0
    rtol = math.sqrt(float(np.finfo(A.dtype).eps))
    if gap > rtol * size:
        h = "H" if np.dtype(A.dtype).kind == "c" else "T"
        what = "Hermitian" if h == "H" else "symmetric"
        raise NotSymmetricError(explain(
            "a", f"must be {what} positive definite for assume_a='{assume_a}' (the Cholesky reads one triangle and "
            f"takes the other as its {'conjugate ' if h == 'H' else ''}transpose; ||A - A^{h}||_F <= {rtol:.1e} "
            f"||A||_F)", f"relative asymmetry {gap / size:.2e} (the refinement against A stalled at backward error "
            f"{ref.eta:.1e} > tol {tol:.1e})",
            f"pass assume_a='gen' (LU), or symmetrize A ((A + A^{h})/2) if that is the system meant"))


def _below_range(B: Any, x_path: Any, dt: np.dtype, norm_a: float) -> str | None:
    """Why refinement stalled when it is ``x``'s size, not the condition: a column of ``x`` that is 0 where
    ``b``'s is not (``x`` below the dtype's range, about ``||b|| / ||A||`` or less) is refused; a column
    whose largest entry is subnormal is answered, and the warning says so (its absolute resolution is the
    smallest subnormal). ``A`` near ``1e200`` and ``b`` near ``1e-200`` had given ``x = 0`` with a warning
    of a backward error 1.0 and "condition too large for float64?". The rule of every route's ``x``
    (:func:`~blocklin.linalg.blocks.result_range.refuse_columns`), on the stored ``x``."""
    cols = _stored_x_columns(x_path, B, dt)
    bmax = max_abs(B)
    # as a power of ten: the quotient itself underflows
    est = f"about 1e{math.log10(bmax) - math.log10(norm_a):.0f}" if norm_a > 0 and bmax > 0 else "below it"
    refuse_columns(cols, 0, dt, rule="x = A^-1 b", detail=f"||x|| >= max |b| / ||A||_F, {est}, below the range",
                   fix="scale b up (or a down) by a power of two, 2^e, and scale x back by 2^-e yourself",
                   error=ConvergenceError)
    return subnormal_note(cols, 0, dt)


def _check_rescaled_x(given: Any, x_path: Any, shift: np.ndarray, dt: np.dtype) -> None:
    """Where ``R b`` was scaled up into the normal range (``shift > 0``), ``x = C y 2^-s`` may lie below it:
    a column of ``x`` flushed to 0 whose ``b`` is not 0 is refused, as :func:`_below_range` refuses ``x = 0``
    (rows ``2^600`` above the others and ``b`` near ``2^-1000`` there: ``x`` near ``2^-1600``; that had been
    solved as ``R b = 0`` and returned ``x = 0`` without a word), and a subnormal one is answered with a
    warning (its entries are resolved to the smallest subnormal)."""
    if not np.any(shift > 0):
        return
    cols = _stored_x_columns(x_path, given, dt, judged=np.asarray(shift) > 0)
    refuse_columns(cols, 0, dt, rule="x = A^-1 b", error=ConvergenceError, detail=(
        f"x = C y 2^-s (y of the equilibrated system (R A C) y = R b 2^s, s up to {int(shift.max())}; R, C powers of "
        "two: A's rows are far above b's entries) lies below the range"),
        fix="scale b up (or a down) by a power of two, 2^e, and scale x back by 2^-e yourself")
    note = subnormal_note(cols, 0, dt)
    if note:
        warn(f"solve: {note}", BlocklinWarning)


def _stored_x_columns(x_path: Any, B: Any, dt: np.dtype, judged: np.ndarray | None = None) -> ColumnRange:
    """The columns of the stored ``x`` against ``b``'s (from its first row in the stored operand)."""
    n = B.shape[0]
    return stored_columns(x_path, B.path, dt, b_first=int(getattr(B, "first_row", 0)), b_rows=n, judged=judged)


def _check_converged(ref: SolveRefinement, tol: float, precision: str, dt: np.dtype, *,
                     switch_need: int | None = None, note: str | None = None) -> None:
    """Mixed precision that did not reach ``tol`` is refused; the working precision warns. ``switch_need``:
    the plain refinement stalled where the budget does not hold the switch to GMRES-IR, which it names."""
    if ref.eta <= tol:
        return
    trail = ", ".join(f"{h['backward_error']:.1e}" for h in ref.history)
    if precision != "double":
        fix = "pass precision='double'"
        if switch_need is not None:
            fix = (f"pass memory='{size_hint(switch_need)}' (at least {format_size(switch_need)}: GMRES-IR then refines "
                   "the float32 factorization where plain refinement stalls), or precision='double'")
        raise ConvergenceError(explain(
            "precision", f"'{precision}' must refine the float32 factorization to the float64 backward error",
            f"backward error {ref.eta:.1e} > tol {tol:.1e} after {ref.steps} step(s) (history {trail}): A is too "
            "ill-conditioned for a float32 factorization with plain refinement (cond(A) u_32 near or above 1)"
            + (f"; GMRES-IR, which refines further, did not run: its vectors and products need memory >= "
               f"{format_size(switch_need)}" if switch_need is not None else ""), fix))
    warn(f"solve: backward error {ref.eta:.1e} above tol {tol:.1e} after {ref.steps} refinement step(s) "
         f"(history {trail}; {note or f'condition too large for {dt.name}?'})", ConvergenceWarning)


__all__ = ["ASSUME", "PRECISIONS", "SolveRefinement", "operand_dtype", "operand_shape", "refine", "dtypes_known_equal",
           "dtypes_known_square", "solve_dtype", "solve_precision", "solve_square", "square_route"]
