"""The inverse's three routes into a stored ``X``, each returning one :class:`InverseResult`: the whole
matrix as one in-core leaf (:func:`invert_direct`), the out-of-core LU with partial pivoting
(:func:`invert_lu`), and the pivot-free randomized Schur recursion (:func:`invert_schur`: staging with
a random butterfly, the recursion down to in-core leaves, the butterfly undone)."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np

from blocklin.errors import ParameterError, SingularMatrixError, warn
from blocklin.errors import explain as _msg
from blocklin.linalg.blocks.result_range import lu_growth_error, magnitude, solution_range_error, wide_name
from blocklin.linalg.blocks.scaling import narrow_range_refusal, nonfinite_refusal, refuse_nonfinite
from blocklin.linalg.inverse import refine as _refine
from blocklin.linalg.inverse.kernels import (
    LURowsSpec,
    lu_inverse_rows_task,
    PROBES,
    Butterfly,
    LeafSpec,
    UnmixSpec,
    leaf_inverse_task,
    mix_kernel,
    transform_device,
    unmix_columns_task,
    wide,
)
from blocklin.operands import Operand, decoded_chunks
from blocklin.plan.inverse import InversePlan
from blocklin.runtime.blockops import BlockOps, Region, column_strips
from blocklin.runtime.job import Job
from blocklin.runtime.passes import plan_kernel_pass, run_pass, source
from blocklin.runtime.stages import Stages


@dataclasses.dataclass
class InverseResult:
    """What a route leaves beside the ``X`` it wrote: ``||M||_F`` (of the staged matrix on the Schur
    route), ``||X||_F``, the leaf results, the attempts, and the probed ``||I - M X||_F`` where the
    route measured it (``None``: not probed yet)."""

    norm_m: float
    norm_x: float
    leaves: list[dict]
    attempts: int
    residual: float | None = None


@dataclasses.dataclass
class InverseRun:
    """What every step of one inversion shares: block operations, recorded stages, the plan."""

    ops: BlockOps
    stages: Stages
    plan: InversePlan
    gemms: int = 0
    norm_m: float = 0.0
    #: The one-leaf route gathers LAPACK's equilibration scalings in its task (not of a matrix already equilibrated).
    equilibrate: bool = False

    @property
    def job(self) -> Job:
        return self.ops.job

    def store(self, name: str, rows: int, cols: int, dtype: Any) -> Any:
        return self.stages.store(name, (rows, cols), dtype, (self.plan.chunk,) * 2)

    def gemm(self, name: str, *args: Any, **kwargs: Any) -> None:
        """One region GEMM as a recorded stage (``BlockOps.gemm`` arguments)."""
        self.gemms += 1
        self.stages.run(name, lambda: self.ops.gemm(*args, **kwargs) and None)


def invert_as_planned(run: InverseRun, M: Any, x_path: Any, out_dtype: np.dtype, seed: int) -> InverseResult:
    """Invert ``M`` into ``x_path`` by the route the plan chose: one leaf, the LU, or the Schur recursion."""
    if run.plan.direct:
        return invert_direct(run, M, x_path, out_dtype, seed)
    if run.plan.method == "lu":
        return invert_lu(run, M, x_path, out_dtype, seed)
    return invert_schur(run, M, x_path, out_dtype, seed)


def invert_direct(run: InverseRun, M: Any, x_path: Any, out_dtype: np.dtype, seed: int) -> InverseResult:
    """The whole matrix as one leaf (:attr:`InversePlan.direct`): read once from the input, inverted by
    LAPACK with partial pivoting (backward stable: no butterfly needed), written once into ``x_path``,
    with ``||M||_F``, the NaN/Inf check and the probed residual from the same task.

    Returns ``||M||_F``, ``||X||_F``, the leaf result, the attempts (1) and the probed ``||I - M X||_F``
    (an :class:`InverseResult`).
    """
    res = _leaf(run, M.path, 0, x_path, 0, run.plan.n, np.dtype(out_dtype), probe_seed=seed, equilibrate=run.equilibrate)
    if res.get("equilibrate"):
        raise NeedsEquilibration(res["equilibration"])
    res = {**res, "off": 0}
    if "norm_sumsq" in res:
        run.norm_m = math.sqrt(res["norm_sumsq"])
    if res["info"] != 0 or not res["rcond"] > float(np.finfo(out_dtype).eps):
        raise _singular(res, True, "matrix")
    if not math.isfinite(res["sumsq"]) and math.isfinite(res["anorm"]) and \
            not math.isfinite(run.ops.norm(Region.of(x_path, (run.plan.n,) * 2))):
        # X holds Inf (its sum of squares alone also overflows for finite entries past 1e154 in float64)
        raise _beyond_range(res["rcond"], res["anorm"], out_dtype)
    return InverseResult(norm_m=run.norm_m, norm_x=math.sqrt(res["sumsq"]), leaves=[res], attempts=1,
                         residual=math.sqrt(res["probe_sumsq"] / PROBES))


def invert_lu(run: InverseRun, M: Any, x_path: Any, out_dtype: np.dtype, seed: int) -> InverseResult:
    """Method ``"lu"``: the out-of-core LU with partial pivoting of ``M`` (its panels left in a work
    store, :func:`~blocklin.linalg.factor.lu.factor_lu_into`), then ``X`` written strip of rows by strip of
    rows (:func:`~blocklin.linalg.inverse.kernels.lu_inverse_rows_task`, unit vectors made on the fly),
    each strip a recorded stage that also returns its rows of ``X P`` for the residual probe.

    Returns ``||M||_F``, ``||X||_F``, no leaves, the attempts (1) and the probed ``||I - M X||_F`` (an
    :class:`InverseResult`).
    """
    from blocklin.linalg.factor.lu import factor_lu_into
    from blocklin.plan.chunks import split as split_rows
    from blocklin.plan.factor import plan_lu

    plan, job, n = run.plan, run.job, run.plan.n
    wdt = np.dtype(plan.work_dtype)
    fplan = plan_lu(n, wdt, memory=job.cfg.memory, tile=plan.lu_tile, source_dtype=M.dtype, decoded=decoded_chunks(M))
    # what the steps before freed stays in other threads' allocator arenas, which the panel tasks do
    # not reuse: each panel returns the free pages first (n = 1024 at 2 MiB: 2.2-2.3 MiB above the
    # warmed baseline without, 1.5-1.7 MiB with; the LU alone measured no better with it)
    f = factor_lu_into(job, M, None, fplan, done_dir=run.stages.folder / "lu-markers", trim=True)
    refuse_nonfinite(f.max_a, "inv")  # check_finite=False: neither a zero pivot nor an overflow
    narrow = narrow_range_refusal(f.max_a, M.dtype, wdt, "invert without precision='mixed', or scale A by a "
                                  "power of two into float32's range")
    if not (np.isfinite(f.max_a) and np.isfinite(f.max_u)):
        if narrow is not None:  # the cast itself overflowed: its range named, not the factorization's growth
            raise narrow
        if wdt.itemsize >= np.dtype(M.dtype).itemsize and np.isfinite(f.max_a):  # A's own dtype: its growth
            raise lu_growth_error(f.max_a, f.max_u, wdt, range_fix(out_dtype, -int(np.frexp(f.max_a)[1])))
        raise ParameterError(_msg("precision", f"a {wdt.name} factorization needs A's entries within {wdt.name}'s "
                                  "range (the factorization overflowed)", f"max |A| {f.max_a:.3g}, max |U| {f.max_u:.3g}",
                                  "invert without precision='mixed', or scale A"))
    if not f.min_pivot > 0.0:  # a zero pivot, or NaN ones
        if narrow is not None:
            raise narrow
        err = SingularMatrixError(_msg("a", "must be nonsingular to be inverted", "LU with partial pivoting met an "
                                       "exact zero pivot (A is singular)",
                                       "regularize: blocklin.solve(a, b, lam=...) (lam='gcv' chooses lam)"))
        err.exact_zero_pivot = True  # NumPy's inversion fails here too (blocklin.cond returns inf, as NumPy's)
        raise err
    run.norm_m = math.sqrt(f.sumsq)
    spec = LURowsSpec(work=f.work, dst=x_path, n=n, tile=fplan.tile, dtype=out_dtype.name, work_dtype=wdt.name,
                      probe_seed=seed, blas_threads=job.task_blas_threads(job.cores()))
    pivots = np.asarray(f.pivots)

    def rows(s0: int, s1: int) -> dict:
        graph = run.ops.graph("lu-rows", spec, s0, s1, pivots.tobytes())
        graph.add((0,), lu_inverse_rows_task, spec, s0, s1, pivots)
        # one task at a time: in the calling thread (its allocator arena and BLAS buffers, not a pool thread's)
        (res,) = job.run(graph, workers=1, blas_threads=job.cores(), description=f"inverse rows {s0}:{s1}",
                         in_caller=True)
        return {"sumsq": res["sumsq"], "xp": res["xp"]}

    # each strip's rows of X P straight into one array (what lu_rows_memory counts): no list of
    # blocks beside their concatenation while the probe pass runs
    xp, ss = np.empty((n, PROBES), dtype=wide(wdt)), 0.0
    for s0, s1 in split_rows(n, plan.row_width):
        try:
            res = run.stages.run("lu-rows", lambda s0=s0, s1=s1: rows(s0, s1))
        except SingularMatrixError as err:  # rows that overflowed: a tiny pivot, or an inverse beyond the range
            refusal = _lu_range_refusal(f.min_pivot, f.max_u, f.max_a, n, np.dtype(out_dtype), wdt)
            if refusal is not None:
                raise refusal from err
            raise
        xp[s0:s1] = res["xp"]
        ss += res["sumsq"]
        del res
    Stages.drop(f.work)
    res = run.stages.run("probe", lambda: _refine.probe_estimate(job, M, xp, seed))
    return InverseResult(norm_m=run.norm_m, norm_x=math.sqrt(ss), leaves=[], attempts=1, residual=res)


def invert_schur(run: InverseRun, M: Any, x_path: Any, out_dtype: np.dtype, seed: int,
                 shift: bool = False) -> InverseResult:
    """Stage (``M`` or ``I - M`` when ``shift``) with a random butterfly, invert by recursion, undo the butterfly.

    Returns ``||staged||_F``, ``||X||_F``, the leaf results and the attempts (an :class:`InverseResult`,
    not probed).
    """
    plan, n = run.plan, run.plan.n
    wdt = np.dtype(plan.work_dtype)
    attempts = 0
    while True:
        attempts += 1
        # First a one-sided depth-2 butterfly W = M V (free: folded into the staging pass). If a
        # leading block still comes out singular (a one-sided sparse butterfly cannot mix every
        # permutation-like structure), the two-sided W = U^T M V of Parker (1995), at two more passes.
        bf = Butterfly(n, plan.depth, seed + 1000 * (attempts - 1))
        bf_u = Butterfly(n, plan.depth, seed + 1000 * (attempts - 1) + 1) if attempts > 1 else None
        w_path = _stage(run, M, bf, bf_u, wdt, shift, seed)
        y_path = run.store("y", n, n, wdt)
        leaves: list[dict] = []
        try:
            # the retry also balances the splits: a tiny leading block of a sparse-butterfly-mixed
            # permutation-like matrix can be structurally singular
            _invert(run, w_path, 0, y_path, 0, n, wdt, leaves, balanced=attempts > 1)
            break
        except _LeafSingular as bad:
            Stages.drop(w_path)
            Stages.drop(y_path)
            if bad.last or attempts >= 2 or plan.depth == 0:
                if not math.isfinite(bad.leaf.get("anorm", 0.0)) and math.isfinite(run.norm_m):
                    # the staged matrix was finite (its norm is): the recursion's products overflowed
                    raise _recursion_range(f"at rows {bad.leaf['off']}:{bad.leaf['off'] + bad.leaf['size']}",
                                           run.norm_m, wdt) from None
                raise _singular(bad.leaf, bad.last, work_dtype=wdt if wdt != np.dtype(out_dtype) else None) from None
            warn(f"inv: a leading block of the randomized matrix was numerically singular "
                 f"(rcond {bad.leaf['rcond']:.1e}); retrying with a two-sided random butterfly and balanced splits")
    Stages.drop(w_path)
    norm_m = run.norm_m
    norm_x = _unstage(run, y_path, x_path, bf, bf_u, out_dtype, seed)
    Stages.drop(y_path)
    if not math.isfinite(norm_x) and _range_not_rank(norm_m, wdt):
        # every leaf was finite, but the products combining them overflowed (an inverse near the top of the
        # range: float32 entries near 2^-126): it had been called a singular A, whose acceptance check read NaN
        raise _recursion_range("in X, combining the leaves' inverses", norm_m, wdt)
    return InverseResult(norm_m=norm_m, norm_x=norm_x, leaves=leaves, attempts=attempts)


class NeedsEquilibration(Exception):
    """The one-leaf task found that LAPACK's rule equilibrates the matrix (``eq``): it did not invert it."""

    def __init__(self, eq: Any) -> None:
        super().__init__("equilibrate")
        self.eq = eq


class _LeafSingular(Exception):
    def __init__(self, leaf: dict, last: bool) -> None:
        super().__init__("singular leaf")
        self.leaf = leaf
        self.last = last


def _singular(leaf: dict, last: bool, what: str | None = None, work_dtype: Any = None) -> Exception:
    """``work_dtype``: the lower precision the recursion ran in (``precision="mixed"``/``"tf32"``), where a
    block singular in float32 may be well within float64's range: the fix then names that first. A block
    whose norm is NaN or Inf (``check_finite=False``) is named for that, not as singular."""
    nonfinite = nonfinite_refusal(leaf.get("anorm"), "inv")
    if nonfinite is not None:
        return nonfinite
    rc = leaf["rcond"]
    what = what or ("Schur complement" if last else "block")
    cond = "infinite (an exact zero pivot)" if rc == 0 else f"at least about {1 / rc:.1e}"
    fix = ("regularize: blocklin.solve(a, b, lam=...) solves min ||A x - b||^2 + lam^2 ||x||^2 "
           "(lam='gcv' chooses lam), or use a pseudo-inverse")
    if work_dtype is not None:
        fix = (f"invert without precision= (in float64): a block that is singular in {np.dtype(work_dtype).name} "
               f"may not be in float64; if that fails too, {fix}")
        what = f"{np.dtype(work_dtype).name} {what}"
    err = SingularMatrixError(_msg(
        "a", "must be nonsingular to be inverted",
        f"a numerically singular {what} at rows "
        f"{leaf['off']}:{leaf['off'] + leaf['size']} (reciprocal condition {rc:.1e}); condition number estimate {cond}",
        fix))
    err.exact_zero_pivot = rc == 0 and work_dtype is None  # only there is NumPy's own inversion certain to fail
    return err


def _beyond_range(rcond: float, anorm: float, dtype: np.dtype) -> Exception:
    """A nonsingular matrix (``rcond`` above eps) whose inverse overflowed ``dtype`` (float32 data near
    ``1e-38``: its inverse near ``1e38`` or beyond), named for the range, not as singular:
    ``||A^-1||_inf`` is about ``1 / (rcond ||A||_inf)``, LAPACK's estimate, divided in two steps: of a subnormal
    ``A`` the product ``rcond ||A||_inf`` underflows to 0 (the message had raised ``ZeroDivisionError``)."""
    return solution_range_error("a", dtype, what="an inverse", actual=(
        f"||A^-1||_inf = {magnitude(1.0 / rcond / anorm)} by LAPACK's estimate 1 / (rcond ||A||_inf), with "
        f"||A||_inf = {anorm:.3g} and reciprocal condition {rcond:.1e} above eps (A is not singular): the inverse "
        "overflowed"), fix=range_fix(dtype, -int(np.frexp(anorm)[1])))


def range_fix(dtype: np.dtype, p: int) -> str:
    scale = f"scale a by 2.0**{p} (exact: inv(2^p A) = 2^-p inv(A))"
    wide = wide_name(dtype)
    if np.dtype(dtype) == np.dtype(wide):  # already double: its range is the widest
        return scale
    how = "inv(a, precision='float64')" if np.dtype(dtype).kind != "c" else f"cast a (a.astype('{wide}'))"
    return f"invert in {wide}: {how}, or {scale}"


def _lu_range_refusal(min_pivot: float, max_u: float, max_a: float, n: int, out_dtype: np.dtype,
                      wdt: np.dtype) -> Exception | None:
    """The rows of the LU route's inverse overflowed where no pivot is numerically zero (each above
    ``n eps max |U|``): their substitutions, which divide by the pivots, left the range (``||A^-1||`` is at
    least about ``1 / min |u_ii|``), named for the range (None: a tiny pivot, a singular ``A``, whose error
    stands)."""
    if not (0 < min_pivot < math.inf and max_a > 0 and min_pivot > n * float(np.finfo(wdt).eps) * max_u):
        return None
    return solution_range_error("a", wdt, what="an inverse", actual=(
        f"the rows of the inverse overflowed in their substitutions, with the LU's smallest pivot {min_pivot:.3g} "
        f"(above n eps max |U|: not singular to working precision; max |A| = {max_a:.3g}), whose reciprocal is "
        f"{magnitude(1.0 / min_pivot)}"), fix=range_fix(out_dtype, -int(np.frexp(max_a)[1])))


def _range_not_rank(norm_m: float, wdt: np.dtype) -> bool:
    """Whether an ``X`` that overflowed ``wdt`` from a finite, nonzero ``A`` says more of the range than of
    the rank: ``cond(A) >= ||A|| ||X||`` with ``||X||`` past the largest value reads as numerically singular
    only where ``||A||_F`` times that value reaches ``1 / eps``; below it (``A`` near the smallest normal) the
    inverse may well be a finite, accurate one the range could not hold, and the fixes (float64, or a power
    of two) say which. Only for a ``wdt`` narrower than float64, whose ``||X||_F`` (summed in float64) is
    infinite only where ``X`` is: a finite float64 ``X`` near ``1e300`` has an infinite sum of squares,
    which the acceptance check names."""
    fi = np.finfo(wdt)
    return (float(fi.max) < float(np.finfo(np.float64).max) and 0 < norm_m < math.inf
            and norm_m * float(fi.max) < 1 / float(fi.eps))


def _recursion_range(where: str, norm_m: float, wdt: np.dtype) -> Exception:
    """The Schur recursion made NaN or Inf from finite data (``||A||_F`` is finite), ``where`` (a leaf's rows,
    or ``X``): the products of blocks and their inverses overflowed ``wdt`` (entries near either end of its
    range), named for the range, not as NaN data or a singular ``A``."""
    p = -int(np.frexp(norm_m)[1]) if 0 < norm_m < math.inf else 0
    return ParameterError(_msg(
        "a", f"must keep the Schur recursion's blocks within {wdt.name}'s range (its products of blocks and of "
        "their inverses, about |A| and 1 / sigma_min(A): entries near either end of the range overflow them)",
        f"NaN or Inf made by the recursion {where} from finite data "
        f"(||A||_F = {norm_m:.3g})", range_fix(wdt, p).replace(f"scale a by 2.0**{p}", f"scale a by 2.0**{p} (||A||_F "
                                                                                  "near 1)", 1)
        + ", or method='lu' (the pivoted route)"))


def _stage(run: InverseRun, M: Any, bf: Butterfly, bf_u: Butterfly | None, wdt: np.dtype, shift: bool, seed: int) -> Any:
    """``W = M V`` (or ``U^T M V`` with ``bf_u``) into a new store; ``||M||_F`` kept in ``run.norm_m``."""
    n, job = run.plan.n, run.job
    w_path = run.store("w", n, n, wdt)
    if bf_u is None:
        run.norm_m = run.stages.run("stage", lambda: _mix(job, M, w_path, bf, wdt, run.plan, shift=shift))
        return w_path
    t_path = run.store("t", n, n, wdt)
    run.norm_m = run.stages.run("stage", lambda: _mix(job, M, t_path, bf, wdt, run.plan, shift=shift))
    run.stages.run("stage-left", lambda: _unmix(run.ops, t_path, w_path, bf_u, wdt, run.plan, transpose=True))
    Stages.drop(t_path)
    return w_path


def _unstage(run: InverseRun, y_path: Any, x_path: Any, bf: Butterfly, bf_u: Butterfly | None, out_dtype: np.dtype,
             seed: int) -> float:
    """``X = V Y`` (``V Y U^T`` with ``bf_u``) into ``x_path``; returns ``||X||_F``."""
    plan, ops = run.plan, run.ops
    if bf_u is None:
        return run.stages.run("unstage", lambda: _unmix(ops, y_path, x_path, bf, out_dtype, plan))
    n = plan.n  # a column pass, then a row pass
    z_path = run.store("z", n, n, out_dtype)
    norm_x = run.stages.run("unstage", lambda: _unmix(ops, y_path, z_path, bf, out_dtype, plan))
    zop = Operand(name="z", path=z_path, shape=(n, n), dtype=out_dtype, chunks=(plan.chunk,) * 2)
    run.stages.run("unstage-left", lambda: _mix(run.job, zop, x_path, bf_u, out_dtype, plan, transpose=True))
    Stages.drop(z_path)
    return norm_x


def _mix(job: Job, M: Any, w_path: str, bf: Butterfly, wdt: np.dtype, plan: InversePlan, shift: bool = False,
         transpose: bool = False) -> float:
    """Row pass ``W = M V`` (cast to the work dtype, NaN/Inf checked); returns ``||M||_F``."""
    n = plan.n
    # strips are planned on W's chunk rows: each strip of W = M V must own whole chunks of W; the reads
    # decode M's own chunks (1536 x 1536 zstd chunks counted as 256 x 9216, one per strip where a strip
    # decodes two: the staging at 64 MiB peaked at 78-81 MiB for a plan of 63)
    src = [source(M, name="a").aligned_to(plan.chunk)]
    params = {"butterfly": bf, "dtype": wdt.name, "shift": shift, "transpose": transpose}
    prp = plan_kernel_pass(job, mix_kernel, src, params, max_strip=4 * plan.chunk)
    if prp.strip % plan.chunk and prp.strip < n:
        # a strip must own whole chunk rows of W: one chunk per strip, one task at a time (the plan
        # checked that one such task fits the budget)
        prp = plan_kernel_pass(job, mix_kernel, src, params, max_strip=plan.chunk, workers=1, min_tasks=1)
    states, _ = run_pass(job, mix_kernel, src, params, plan=prp, outputs=(("w", w_path),),
                         description="stage and randomize", device=butterfly_device(job, plan))
    return math.sqrt(sum(s["sumsq"] for s in states))


def butterfly_device(job: Job, plan: InversePlan) -> str:
    """Where the butterfly passes run: as asked, or for ``auto`` where they win (about 6 flops per
    entry and level: read-bound, so the CPU)."""
    return transform_device(job.cfg.device, plan.n, 6.0 * max(1, plan.depth), job.device)


def _leaf(run: InverseRun, src: Any, s_off: int, dst: Any, d_off: int, size: int, wdt: np.dtype,
          probe_seed: int | None = None, equilibrate: bool = False) -> dict:
    """In-core pivoted LU inverse of ``src[s_off:, s_off:]`` (``size``) into ``dst[d_off:, d_off:]``: one stage
    (``probe_seed``: the one-leaf inverse straight from the input, see :class:`LeafSpec`)."""
    job = run.job
    from blocklin.device import pass_device

    # 2 n^3 flops over n^2 elements read: the GPU wins on large leaves ('auto'), or when asked for
    dev = pass_device(job.cfg.device, 2.0 * size**3, size * size * wdt.itemsize, job.device)
    spec = LeafSpec(src=src, dst=dst, off=s_off, dst_off=d_off, size=size, dtype=wdt.name,
                    blas_threads=job.task_blas_threads(job.cores()), device=dev,
                    device_memory=job.device_memory() if dev == "gpu" else None, probe_seed=probe_seed,
                    check_finite=job.check_finite, width=run.plan.chunk, equilibrate=equilibrate)

    def invert() -> dict:
        graph = run.ops.graph("leaf", spec)
        graph.add((0,), leaf_inverse_task, spec)
        (res,) = job.run(graph, workers=1, blas_threads=job.cores(), description=f"leaf {s_off}:{s_off + size}")
        return res

    return run.stages.run("leaf", invert)


def _invert(run: InverseRun, src: Any, s_off: int, dst: Any, d_off: int, size: int, wdt: np.dtype,
            leaves: list[dict], *, at: int = 0, last: bool = True, balanced: bool = False) -> None:
    """Invert the diagonal region ``[s_off, s_off+size)^2`` of store ``src`` into that at ``d_off`` of ``dst``
    (``at``: the region's first row in the staged matrix, for messages).

    No step writes a region it reads (``src`` is never written; the Schur complement and ``A^-1``
    get stores of their own), so each step can be run again after an interruption.
    """
    eps = float(np.finfo(wdt).eps)
    plan = run.plan
    if size <= plan.leaf:
        res = _leaf(run, src, s_off, dst, d_off, size, wdt)
        res = {**res, "off": at}
        leaves.append(res)
        if res["info"] != 0 or not res["rcond"] > (eps if last or plan.work_dtype != plan.dtype else plan.n * eps):
            raise _LeafSingular(res, last)
        return
    n1 = _split(plan, size, balanced)
    n2 = size - n1
    o, p = s_off, s_off + n1  # leading and trailing blocks of the source
    q, r = d_off, d_off + n1  # and of the destination
    a_inv = run.store("ainv", n1, n1, wdt)
    _invert(run, src, o, a_inv, 0, n1, wdt, leaves, at=at, last=False, balanced=balanced)
    e, f, s = run.store("e", n1, n2, wdt), run.store("f", n2, n1, wdt), run.store("s", n2, n2, wdt)
    g, z = run.gemm, (0, 0)
    g("E", e, z, n1, n2, n1, a_inv, z, src, (o, p), dtype=wdt, description="E = A^-1 B")
    g("F", f, z, n2, n1, n1, src, (p, o), a_inv, z, dtype=wdt, description="F = C A^-1")
    g("S", s, z, n2, n2, n1, src, (p, o), e, z, dtype=wdt, c=src, c_off=(p, p), alpha=-1.0, beta=1.0,
      description="S = D - C E")
    _invert(run, s, 0, dst, r, n2, wdt, leaves, at=at + n1, last=last, balanced=balanced)  # S^-1
    Stages.drop(s)
    g("X12", dst, (q, r), n1, n2, n2, e, z, dst, (r, r), dtype=wdt, alpha=-1.0, description="X12 = -E S^-1")
    g("X21", dst, (r, q), n2, n1, n2, dst, (r, r), f, z, dtype=wdt, alpha=-1.0, description="X21 = -S^-1 F")
    g("X11", dst, (q, q), n1, n1, n2, dst, (q, r), f, z, dtype=wdt, c=a_inv, c_off=z, alpha=-1.0, beta=1.0,
      description="X11 = A^-1 - X12 F")
    for store in (e, f, a_inv):
        Stages.drop(store)


def _split(plan: InversePlan, size: int, balanced: bool = False) -> int:
    from blocklin.plan.inverse import _split as split

    return split(size, plan.chunk, None if balanced else plan.leaf)


def _unmix(ops: BlockOps, w: str, x: str, bf: Butterfly, out_dtype: np.dtype, plan: InversePlan,
           transpose: bool = False) -> float:
    """``X = V Y`` column strip by column strip; returns ``||X||_F``."""
    job = ops.job
    dev = butterfly_device(job, plan)
    spec = UnmixSpec(src=w, dst=x, butterfly=bf, dtype=out_dtype.name, blas_threads=job.task_blas_threads(1),
                     transpose=transpose, device=dev, device_memory=job.device_memory() if dev == "gpu" else None)
    graph = ops.graph("unmix", spec)
    for s, (c0, c1) in enumerate(column_strips(plan.n, plan.column_width)):
        graph.add((s,), unmix_columns_task, spec, c0, c1)
    workers = max(1, min(job.workers(1), job.cfg.memory // max(1, plan.column_memory)))
    results = job.run(graph, workers=workers, description="undo the butterfly", count_pass="intermediate")
    return math.sqrt(sum(r["sumsq"] for r in results))


__all__ = ["InverseResult", "InverseRun", "NeedsEquilibration", "butterfly_device", "invert_as_planned", "invert_direct", "invert_lu", "range_fix",
           "invert_schur"]
