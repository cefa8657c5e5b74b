"""Out-of-core LU factorization with partial pivoting over whole columns (left-looking panels), of a
matrix of any shape."""

from __future__ import annotations

import dataclasses
import io
import math
from typing import Any, Unpack

import numpy as np

from blocklin.config import Settings
from blocklin.errors import warn
from blocklin.matrix import Matrix
from blocklin.operands import decoded_chunks
from blocklin.plan.factor import FactorPlan, plan_lu
from blocklin.linalg.blocks.result_range import lu_growth_error, wide_name
from blocklin.linalg.factor.lu_panels import lu_finish, lu_panels
from blocklin.runtime.blockops import BlockOps, Region
from blocklin.runtime.job import Job
from blocklin.storage.identity import plan_settings, resume_token
from blocklin.storage.backend import backend
from blocklin.storage.space import named_as_output
from blocklin.storage.zarr_store import create_array, open_zarr
from blocklin.validate import float_operand, square

REPORT_KEYS = ("seconds", "flops", "gflops", "bytes_read", "bytes_logical", "peak_memory", "growth_factor", "min_pivot", "tasks", "skipped")


def lu(a: Any, out: Any = None, *, overwrite: bool = False, resume: bool = False, explain: bool = False,
       tile: int | None = None, **settings: Unpack[Settings]) -> Matrix | FactorPlan:
    """LU factorization ``P A = L U`` with partial pivoting, of an ``m x n`` matrix larger than memory.

    The result is packed as LAPACK's ``getrf`` leaves it (and :func:`scipy.linalg.lu_factor`
    returns it), ``m x n`` like ``A``: unit lower ``L`` below the diagonal, ``U`` on and above it; the
    ``k = min(m, n)`` row swaps are ``report["pivots"]`` and the output's attribute
    ``blocklin.pivots`` (0-based: row ``i`` was swapped with row ``pivots[i]``, in order). For a
    tall ``A`` (``m > n``) ``L`` is ``m x n`` unit lower trapezoidal and ``U`` ``n x n`` upper
    triangular; for a wide one (``m < n``) ``L`` is ``m x m`` unit lower triangular and ``U``
    ``m x n`` upper trapezoidal: ``scipy.linalg.lu(A)``'s ``(p, l, u)`` are
    ``np.tril(F, -1)[:, :k] + np.eye(m, k)``, ``np.triu(F)[:k]`` and the permutation of the pivots
    (``p[perm, arange(m)] = 1`` for the row order ``perm`` they give).

    Parameters
    ----------
    a : path, zarr array, Matrix, NumPy or Dask array
        ``m x n`` (any shape), float32, float64, complex64 or complex128. Never modified.
    out : path, optional
        Output store (atomic).
    overwrite, resume : bool
        Replace an existing ``out``; continue an interrupted run (finished panels are kept).
    explain : bool
        Return the :class:`~blocklin.plan.factor.FactorPlan` without running.
    tile : int, optional
        Panel width (default: the widest multiple of the input's chunk side for which
        :func:`~blocklin.plan.factor.lu_panel_bytes` fits the budget: about two panels of ``n`` rows).
    **settings
        As for every operation: :class:`~blocklin.config.Settings`.

    Returns
    -------
    Matrix
        The packed factors, with ``.report``: ``pivots``, ``growth_factor``
        (``max |U| / max |A|``), ``min_pivot`` (smallest ``|U_ii|``), ``seconds``, ``flops``,
        ``peak_memory``, ``plan``.

    Notes
    -----
    *Pivoting.* Each column panel (all ``m`` rows, ``t`` columns) is factored by LAPACK ``getrf``
    after the updates from the panels before it (left-looking: Du Croz, Mayes and Radicati, and
    the out-of-core ScaLAPACK of D'Azevedo and Dongarra, 2000). The pivot of every column is
    chosen among all its remaining rows, exactly as in Gaussian elimination with partial pivoting
    on the whole matrix (of complex data by LAPACK's rule, the largest ``|Re| + |Im|``: reference
    BLAS ``izamax``, which ``zgetrf`` uses, so the pivots are ``scipy.linalg.lu_factor``'s), so the
    usual bound holds (growth factor ``<= 2^(n-1)``, in practice
    ``O(n^(2/3))``; Trefethen and Schreiber 1990) and the measured growth factor is reported. A
    singular leading block does not break it, unlike pivoting inside diagonal blocks (as in
    ``dask.array.linalg.lu``). A zero pivot (``A`` singular, or a rectangular ``A`` of rank below
    ``min(m, n)``) is kept, as LAPACK does, with a warning. Factors beyond the dtype's range (entries
    near its largest, which the elimination's growth passed: ``U`` would hold Inf or NaN) are refused
    with a ``ParameterError`` that names the power of two after which ``A`` factors. Of a rectangle, the panels are those of
    the same elimination stopped after ``min(m, n)`` columns: a tall ``A``'s pivots range over all
    ``m`` rows, and a wide ``A``'s panels right of column ``m`` are only updated (they are rows of
    ``U``), so the factors are ``getrf``'s on the whole matrix up to rounding.

    *Cost.* ``2 m n k - (m + n) k^2 + 2 k^3 / 3`` flops (``2 n^3 / 3`` square); panel ``j`` reads
    the earlier panels (``n^3 / (2 t)`` elements in all, square); the panels run one after another
    (each needs the previous pivots), with BLAS on every core; a last pass applies the later swaps to
    each ``L`` panel.
    """
    return _factor(a, out, overwrite, resume, explain, tile, None, settings)


def square_lu(a: Any, why: str, fix: str, **settings: Unpack[Settings]) -> Matrix:
    """:func:`lu` of an ``a`` that must be square (a ``ShapeError`` with ``why`` and ``fix`` otherwise,
    before anything is read): the determinant's factorization."""
    return _factor(a, None, False, False, False, None, (why, fix), settings)


def _factor(a: Any, out: Any, overwrite: bool, resume: bool, explain: bool, tile: int | None,
            require_square: tuple[str, str] | None, settings: dict) -> Matrix | FactorPlan:
    with Job("lu", **settings) as job:
        A = job.operand(a, "a", integers="cast")
        m, n = A.shape
        if require_square is not None:
            square(A, *require_square)
        dt = float_operand(A, "lu", complex_ok=True)
        plan = plan_lu(n, dt, m=m, memory=job.cfg.memory, chunks=tuple(A.chunks), tile=tile, decoded=decoded_chunks(A))
        if explain:
            return plan
        # the job's settings: the plan names no device, and the panels' updates run on the job's
        token = resume_token("lu", [A], plan.to_dict(), plan_settings(job))
        ao = job.claim(out, [A], overwrite=overwrite, resume=resume, token=token,
                       size=((m, 2 * n), dt))  # the factor and its work store beside it
        # a full disk names the output the user can move, not the work store inside its partial folder
        with named_as_output(ao.partial, f"lu's work store ({m} x {n} {dt.name}) beside the factor"):
            if ao.resumed and ao.has_array():
                open_zarr(ao.array_path(), mode="r+")
            else:
                create_array(ao.array_path(), shape=(m, n), dtype=dt, chunks=(plan.tile, plan.tile),
                             codec=job.cfg.codec)
            f = factor_lu_into(job, A, ao.array_path(), plan, done_dir=ao.done)
        pivots, max_a, max_u, min_pivot = f.pivots, f.max_a, f.max_u, f.min_pivot
        if not math.isfinite(max_a):  # check_finite=False: NaN or Inf data, which had been called a zero pivot
            warn(f"lu: A holds {'NaN' if math.isnan(max_a) else 'Inf'} (check_finite=False skipped the check): the "
                 "factors hold NaN or Inf where LAPACK's getrf puts them; pass check_finite=True to find the entry")
        elif not math.isfinite(max_u):  # finite A: the growth passed the dtype's range, U holds Inf or NaN
            e = int(np.frexp(max_a)[1])
            raise lu_growth_error(max_a, max_u, dt, f"scale a by 2.0**-{e} (exact: U is scaled by it, L and the "
                                  f"pivots are unchanged, a determinant by 2.0**(-{e} n)), or factor it in "
                                  f"{wide_name(dt)} (cast a)")
        elif min(m, n) and min_pivot == 0.0:
            warn("lu: an exact zero pivot: A is singular (U has a zero on its diagonal); the factors are "
                 "returned as LAPACK's getrf does" if m == n else
                 f"lu: an exact zero pivot: the {m} x {n} A has rank below {min(m, n)} (U has a zero on its "
                 "diagonal); the factors are returned as LAPACK's getrf does")
        report = job.report(flops=plan.flops, plan=plan.to_dict(), output=str(ao.path), method="left-looking LU, partial pivoting",
                            phases={"panel updates (TRSM, GEMM)": job.device, "panel factorization (getrf)": "cpu"},
                            pivots=pivots, growth_factor=max_u / max_a if max_a > 0 else 1.0, min_pivot=min_pivot)
        return job.finish(ao, out, report, operation="lu", plan=plan.to_dict(), params={}, keys=REPORT_KEYS,
                          extra={"pivots": pivots.tolist()})


@dataclasses.dataclass(frozen=True)
class LUFactors:
    """What :func:`factor_lu_into` leaves: the pivots, statistics, and where the panels are."""

    #: LAPACK's 0-based row swaps, ``min(m, n)`` of them.
    pivots: np.ndarray
    max_a: float
    max_u: float
    #: Smallest ``|U_ii|``.
    min_pivot: float
    #: ``||A||_F^2`` (float64, of the stored values: the panels read all of ``A``).
    sumsq: float
    #: The panels as factored (``L`` rows of panel ``j`` in the order of its own swaps), for
    #: :func:`~blocklin.linalg.factor.lu_panels.lu_solve`.
    work: Any


def factor_lu_into(job: Job, A: Any, path: Any, plan: FactorPlan, *, done_dir: Any, rhs: Any = None,
                   rhs_out: Any = None, trim: bool = False, split: int = 0) -> LUFactors:
    """The packed LU of operand ``A`` (``m x n``, computed in ``plan.dtype``) into the existing store ``path``.

    ``done_dir`` (a folder) keeps the panels' pivots, statistics and resume markers, and the work
    store of the panels (``lu-work.zarr``). With ``path=None`` the last pass (the later swaps applied
    to each ``L`` panel, LAPACK's layout) is skipped: a solve uses the work store as it is.
    With ``rhs`` (a :class:`~blocklin.runtime.blockops.Region`, ``n x k``) the panels also run the
    forward substitution, writing ``L^-1 P rhs`` to the region ``rhs_out`` (see
    :func:`~blocklin.linalg.factor.lu_panels.lu_panels`; ``split``: its columns from there on by calls of
    their own). ``trim``: each panel task first returns
    the allocator's free pages (see :func:`~blocklin.linalg.factor.lu_panels.lu_panels`).
    """
    (m, n), dt, t = A.shape, np.dtype(plan.dtype), plan.tile
    work = (done_dir / "lu-work.zarr").with_pending(False)
    if not backend(work).exists("zarr.json"):
        create_array(work, shape=(m, n), dtype=dt, chunks=(t, t), codec=job.cfg.codec)
    ops = BlockOps(job, t)
    ops.workers = 1
    results = lu_panels(ops, Region.of(A.path, A.shape), work, dtype=dt, done_dir=done_dir, check=job.check_finite,
                        out=path, rhs=rhs, rhs_out=rhs_out, trim=trim, split=split)
    pivots = np.concatenate([np.load(io.BytesIO(backend(done_dir).read_bytes(f"lu-piv-{j}.npy")))
                             for j in range(plan.tiles)]) if min(m, n) else np.zeros(0, dtype=np.int64)
    if path is not None:
        lu_finish(ops, work, path, (m, n), pivots, dtype=dt)
    # NumPy's max and min: a NaN of the data (check_finite=False) is kept, which Python's max drops
    min_pivot = float(np.min([r["min_pivot"] for r in results])) if results else 0.0  # inf: no pivots
    return LUFactors(pivots=pivots, max_a=float(np.max([r["max_a"] for r in results])) if results else 0.0,
                     max_u=float(np.max([r["max_u"] for r in results])) if results else 0.0,
                     min_pivot=min_pivot if not math.isinf(min_pivot) else 0.0,
                     sumsq=sum(r["sumsq"] for r in results), work=work)  # in panel order: deterministic


__all__ = ["LUFactors", "factor_lu_into", "lu", "square_lu"]
