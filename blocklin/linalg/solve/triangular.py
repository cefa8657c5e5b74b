"""Out-of-core triangular solves and SPD solves through the tiled Cholesky factor."""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Unpack

import numpy as np

from blocklin.config import Settings
from blocklin.errors import ParameterError, SingularMatrixError, explain
from blocklin.linalg.blocks.scaling import refuse_nonfinite, triangle_max_abs
from blocklin.linalg.solve.report import solve_report
from blocklin.matrix import Matrix
from blocklin.operands import as_columns, decoded_chunks
from blocklin.plan.factor import plan_factor
from blocklin.plan.minimum import whole_call
from blocklin.runtime.blockops import ZERO_DIAGONAL, BlockOps, Region
from blocklin.runtime.job import Job
from blocklin.storage.zarr_store import create_array
from blocklin.validate import float_operand, result_dtype, same_rows, square

#: Most refinement steps of the SPD solve (each: one GEMM over A and two triangular solves).
MAX_REFINE = 3


@dataclasses.dataclass
class TriangularSetup:
    """What every solve with a stored triangular factor starts from: the factor and right-hand sides as
    operands (checked), the dtype, the tile plan, the claimed output ``x`` (``n x k``) and the block
    operations that run the tiles."""

    T: Any
    rhs: Region
    n: int
    k: int
    dtype: np.dtype
    plan: Any
    ao: Any
    ops: BlockOps

    @classmethod
    def of(cls, job: Job, t: Any, b: Any, name: str, operation: str, *, out: Any, overwrite: bool,
           tile: int | None, square_rule: tuple[str, str] | None = None) -> TriangularSetup:
        """``square_rule``: the ``(why, fix)`` of the error for a factor that is not square."""
        T, B = job.operand(t, name, integers="cast"), job.operand(as_columns(b), "b", integers="cast")
        what = "triangular factor" if name == "t" else "factor"
        n = square(T, *(square_rule or ("to be triangular" if name == "t" else "to be a factor",
                                        f"pass the n x n {what}")))
        same_rows(T, B)
        float_operand(T, operation, complex_ok=True), float_operand(B, operation, complex_ok=True)
        dt = result_dtype([T, B], None if T.dtype == B.dtype else np.result_type(T.dtype, B.dtype))
        plan = whole_call(lambda memory: plan_factor("solve_triangular", n, dt, memory=memory, workers=job.workers(1),
                                                     chunks=tuple(T.chunks), tile=tile, decoded=decoded_chunks(T)),
                          job.cfg.memory, operation)
        ao = job.claim(out, [T, B], overwrite=overwrite)
        k = B.shape[1]
        create_array(ao.array_path(), shape=(n, k), dtype=dt, chunks=(plan.tile, plan.tile), codec=job.cfg.codec)
        ops = BlockOps(job, plan.tile)
        ops.workers = plan.workers
        return cls(T, Region.of(B.path, B.shape), n, k, np.dtype(dt), plan, ao, ops)


def solve_triangular(t: Any, b: Any, out: Any = None, *, lower: bool = False, trans: Any = False,
                     overwrite: bool = False, tile: int | None = None, **settings: Unpack[Settings]) -> Matrix:
    """Solve ``op(T) X = B`` for triangular ``T`` larger than memory.

    Parameters
    ----------
    t : path, zarr array, Matrix, NumPy or Dask array
        ``n x n`` triangular matrix; only the triangle named by ``lower`` is read (as LAPACK's
        ``trsm``; the default ``lower=False`` matches :func:`scipy.linalg.solve_triangular`).
    b : operand
        ``n x k`` right-hand sides (a 1-D NumPy vector is one column). ``T`` and ``B`` may be real
        or complex; ``X`` has NumPy's promoted dtype of the two.
    out : path, optional
        Output store for ``X`` (atomic).
    lower : bool
        ``T`` is lower (else upper) triangular.
    trans : {0, 1, 2, 'N', 'T', 'C'} or bool
        As :func:`scipy.linalg.solve_triangular`: solve ``T X = B`` (0, ``'N'``, False), ``T^T X = B``
        (1, ``'T'``, True) or ``T^H X = B`` (2, ``'C'``: the conjugate transpose, ``T^T`` of real data).
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
    op = trans_code(trans)
    with Job("solve_triangular", **settings) as job:
        st = TriangularSetup.of(job, t, b, "t", "solve_triangular", out=out, overwrite=overwrite, tile=tile)
        T, n, k, dt, plan, ao, ops = st.T, st.n, st.k, st.dtype, st.plan, st.ao, st.ops
        q = substitute_in_range(ops, T, Region.of(T.path, T.shape), st.rhs, Region.of(ao.array_path(), (n, k)),
                                lower=lower, trans=op, dtype=dt, check=job.check_finite)
        report, recorded = solve_report(job, route="triangular", plan=plan.to_dict(), flops=n * n * k,
                                        method="tiled substitution",
                                        phases={"tile updates (GEMM), diagonal solves (TRSM)": job.device})
        if q:
            report["scaling"] = scaled_substitution(q)
        return job.finish(ao, out, report, operation="solve_triangular", plan=plan.to_dict(),
                          params={"lower": lower, "trans": op}, recorded=recorded)


def substitute_in_range(ops: BlockOps, T: Any, t: Region, b: Region, out: Region, *, lower: bool, trans: str,
                        dtype: Any, check: bool, description: str = "triangular solve", name: str = "t") -> int:
    """``out = op(T)^-1 B`` (:meth:`BlockOps.trsm`); where that overflowed, once more with ``T`` and ``B``
    multiplied by ``2^q`` as read (``x`` unchanged, exact), ``q`` bringing the largest entry of ``T``'s
    triangle near 1 (the other triangle is not read: its entries do not choose ``q``). Returns ``q``
    (0 where the first solve held).

    The substitution forms ``T_ik x_k`` before it cancels back to ``b``'s size: a nonsingular float32 ``T``
    with entries near ``1e30`` and an ``x`` near ``1e15`` (both in range) overflowed there, and was
    refused as singular; LAPACK's ``xLATRS`` scales for the same reason. A ``T`` singular to working
    precision still fails the second solve, and that error stands. ``name``: the caller's parameter for
    ``T`` in refusals.
    """
    try:
        ops.trsm(t, b, out, lower=lower, trans=trans, dtype=dtype, check=check, description=description, name=name)
        return 0
    except SingularMatrixError as err:
        if ZERO_DIAGONAL in str(err):
            raise
        amax = triangle_max_abs(T, lower=lower)
        # check_finite=False: a NaN or Inf in T had been named a singular or overflowing diagonal tile
        refuse_nonfinite(amax, "a triangular solve", name)
        if not (0.0 < amax < math.inf):
            raise
        q = -int(np.frexp(amax)[1])
        if q == 0:
            raise
    ops.trsm(t, b, out, lower=lower, trans=trans, dtype=dtype, check=check, t_exponent=q,
             description=f"{description}, scaled", name=name)
    return q


def scaled_substitution(q: int) -> dict:
    """The report's ``scaling`` of a substitution that :func:`substitute_in_range` made again scaled."""
    return {"t_exponent": q, "why": "the substitution's products T_ik x_k overflowed: T and its right-hand "
            f"sides were multiplied by 2^{q} as read (x unchanged)"}


#: SciPy's ``trans`` values and the BLAS letter each means.
TRANS = {0: "N", 1: "T", 2: "C", "N": "N", "T": "T", "C": "C"}


def trans_code(trans: Any) -> str:
    """``trans=`` of :func:`solve_triangular` as BLAS's letter (``'N'``, ``'T'`` or ``'C'``), as
    :func:`scipy.linalg.solve_triangular` takes it: 0/1/2, ``'N'``/``'T'``/``'C'`` or a bool."""
    key = trans.upper() if isinstance(trans, str) else \
        int(trans) if isinstance(trans, (bool, np.bool_, int, np.integer)) else None  # False/True: 0/1
    if key not in TRANS:
        raise ParameterError(explain("trans", "must be 0, 1, 2, 'N', 'T', 'C' or a bool (as "
                                     "scipy.linalg.solve_triangular)", repr(trans),
                                     "pass trans='N' (T X = B), 'T' (T^T X = B) or 'C' (T^H X = B)"))
    return TRANS[key]


def solve_spd(a: Any, b: Any, out: Any = None, *, overwrite: bool = False, tol: float | None = None,
              max_refine: int = MAX_REFINE, precision: str = "double", **settings: Unpack[Settings]) -> Matrix:
    """``A x = B`` for symmetric positive definite ``A`` of any size: out-of-core Cholesky, two
    triangular solves, and iterative refinement; used by ``solve(assume_a="pos")``.

    ``A`` is factored from its lower triangle; the residuals ``B - A X`` use all of ``A`` (store it
    in full). Refinement (Skeel 1980; Higham 2002, ch. 12) repeats ``R = B - A X``,
    ``X += (L L^T)^{-1} R`` while the normwise backward error
    ``||R||_F / (||A||_F ||X||_F + ||B||_F)`` (Rigal and Gaches 1967) exceeds ``tol`` (default
    ``sqrt(n) eps``), at most ``max_refine`` times, stopping when a step does not halve it.
    ``precision="mixed"`` factors in float32 (see :func:`blocklin.linalg.solve.square.solve_square`).
    """
    from blocklin.linalg.solve.square import solve_square

    return solve_square(a, b, out, assume_a="pos", precision=precision, overwrite=overwrite, tol=tol,
                        max_refine=max_refine if precision == "double" else None, **settings)


__all__ = ["TRANS", "solve_spd", "solve_triangular", "scaled_substitution", "substitute_in_range",
           "trans_code"]
