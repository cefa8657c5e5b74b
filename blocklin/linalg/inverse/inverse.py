"""Out-of-core matrix inverse: pivoted LU (default) or recursive Schur complements with a random butterfly guard; Newton-Schulz.

The public face (:func:`inv`, :func:`inv_plan`: validation, plan, refinement and report); the routes
themselves are in :mod:`blocklin.linalg.inverse.routes`."""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Unpack

import numpy as np

from blocklin.config import Settings
from blocklin.errors import BudgetError, ParameterError
from blocklin.errors import explain as _msg
from blocklin.linalg.blocks import equilibrate as _equilibrate
from blocklin.linalg.inverse import refine as _refine
from blocklin.linalg.inverse.refine import Iterate, NewtonSchulz, Steps
from blocklin.linalg.blocks.scaling import safe_norm
from blocklin.linalg.inverse.kernels import MEMORY
from blocklin.linalg.inverse.routes import (InverseRun, NeedsEquilibration, butterfly_device, invert_as_planned,
                                            invert_schur)
from blocklin.matrix import Matrix
from blocklin.operands import decoded_chunks
from blocklin.plan.inverse import MIN_CHUNK, InversePlan, plan_inverse
from blocklin.plan.minimum import whole_call
from blocklin.runtime.blockops import BlockOps, Region
from blocklin.runtime.job import Job
from blocklin.storage.identity import plan_settings, resume_token
from blocklin.runtime.stages import Stages
from blocklin.storage.zarr_store import create_array
from blocklin.validate import MAX_REFINE, count, float_operand, not_empty, positive, square
from blocklin.validate import precision as check_precision

PRECISIONS = (None, "mixed", "tf32", "float32", "float64", "fp16", "bf16")
#: The routes that factor with 16-bit GEMM inputs and refine by GMRES-IR (:func:`_inv_half`).
HALF = ("fp16", "bf16")
METHODS = ("auto", "lu", "schur")


def _precision(value: Any) -> str | None:
    """``precision=`` of :func:`inv` (``None`` for the input's dtype), with the shared validator's message."""
    v = check_precision(value, ("default", "mixed", "tf32", "float32", "float64", "fp16", "bf16"), operation="inv",
                        fix="pass precision='mixed' or leave it None")
    return None if v == "default" else v


def inv(a: Any, *, out: Any = None, refine: Any = "auto", max_refine: int = 10, tol: float | None = None,
        precision: str | None = None, overwrite: bool = False, resume: bool = False, seed: int = 0,
        explain: bool = False, method: str = "auto", **settings: Unpack[Settings]) -> Matrix | InversePlan:
    """Inverse of a square matrix larger than memory, with a verified backward error.

    By default (``method="auto"``) out of core: LU with partial pivoting (see ``method``). With
    ``method="schur"``: the matrix ``M`` is staged once as ``W = M V`` with ``V`` a random butterfly of Givens
    rotations (orthogonal, depth 2), and ``W`` is inverted (out of place) by the block elimination

    .. math::

        M = \\begin{bmatrix} A & B \\\\ C & D \\end{bmatrix},\\quad S = D - C A^{-1} B,\\quad
        M^{-1} = \\begin{bmatrix} A^{-1} + E S^{-1} F & -E S^{-1} \\\\ -S^{-1} F & S^{-1} \\end{bmatrix},
        \\quad E = A^{-1} B,\\ F = C A^{-1},

    recursing on ``A`` and ``S`` down to leaves that fit the budget, which are inverted in core and in
    place by LU with partial pivoting (LAPACK ``getrf``, then ``getri``). Each of the six products per level
    is an out-of-core blocked GEMM over sub-blocks of the stored matrices. Finally ``X = V W^{-1}`` is
    written column strip by column strip, and the residual is probed. A matrix that fits the budget
    is one task instead: read once from the input, inverted in place by LAPACK, written once, its
    residual probed in the same task (no staging, butterfly or probe pass).

    Parameters
    ----------
    a : path, zarr array, Matrix, NumPy or Dask array
        Square matrix (float32, float64, complex64 or complex128). Never modified. Complex data takes
        every route with LAPACK's conventions (``xgetrf``/``xgetri`` leaves, the pivoted LU, complex GEMMs
        and residuals ``I - A X`` in the refinement; the butterfly stays a real orthogonal one, which is
        unitary), in its own dtype (``precision`` must then be None).
    out : path, optional
        Output store (atomic: written under a temporary name and renamed when complete).
    refine : {"auto", True, False} or int
        ``"auto"``: run Newton-Schulz steps only while the backward error (probed, then exact)
        exceeds ``tol``, at most ``max_refine``. ``True``: at least one step. ``False``/``0``: none
        (the probed residual is still reported). An integer ``N``: exactly ``N`` steps whatever
        ``tol`` says (only a diverging step is undone, with a warning).
    max_refine : int
        Largest number of Newton-Schulz steps of ``"auto"`` and ``True``.
    tol : float, optional
        Target backward error ``||I - M X||_F / (||M||_F ||X||_F)``. Default: the accuracy of
        ``numpy.linalg.inv``. In core (one pivoted LU leaf, LAPACK's inverse itself) ``n * eps`` of
        the output dtype; out of core the unit roundoff ``eps / 2``, which one Newton-Schulz step
        reaches, because the block recursion's backward (and forward) error is 10-1000 times
        LAPACK's (see :func:`blocklin.linalg.inverse.refine.default_tol`).
    precision : {None, "mixed", "tf32", "float32", "float64", "fp16", "bf16"}
        ``"mixed"``: invert in float32 (full float32, on a GPU too) and refine in float64 (the output is
        float64); ``"tf32"``: the same with the float32 GEMMs on TF32 tensor cores on a GPU (10-bit
        mantissas: for well-conditioned matrices; the float64 refinement restores the accuracy, or
        fails with the usual error); ``"float32"``/``"float64"``: compute in that dtype; ``None``: the
        input's dtype (the only choice for complex data: the others name real working dtypes). Where the matrix fits one in-core inversion, ``"mixed"`` and ``"tf32"`` run it
        in float64 instead (faster and more accurate there: the refinement alone costs twice the
        inversion), and ``report["precision_reason"]`` says so; they pay out of core, where float32
        halves the bytes each recursion step moves. ``"fp16"``/``"bf16"``: the columns of ``I`` solved
        as one block, ``A X = I``, by the square solve's 16-bit route (``A`` scaled into the format's
        range, an LU whose GEMM updates take 16-bit inputs, GMRES-IR to the float64 backward error:
        :func:`blocklin.linalg.solve.square.solve_square`); its Krylov vectors (``n x n`` each) are
        held in memory, so the budget must hold about ``2 (restart + 5) n^2 8`` bytes (refused
        otherwise, naming the minimum); ``report["method"]`` is ``"lu"`` and
        ``report["backward_error"]`` is ``||I - A X||_F / (||A||_F ||X||_F + sqrt(n))``.
    overwrite : bool
        Replace an existing ``out``.
    resume : bool
        Continue a run of the same inversion (same input, ``out``, parameters and settings) that was
        interrupted (SIGKILL, Ctrl-C, a lost machine): its finished steps, recorded in a work folder
        under the temp dir, are skipped, and the result is bit for bit that of an uninterrupted run.
        Needs ``out``. With ``resume=True`` the work folder and the partial output are kept after an
        error or Ctrl-C; without it they are removed.
    seed : int
        Seed of the random butterfly and the probe vectors (results are reproducible).
    explain : bool
        Return the :class:`~blocklin.plan.inverse.InversePlan` without running (kept for
        compatibility: :func:`inv_plan` returns it and always one type).
    method : {"auto", "lu", "schur"}
        Out-of-core route (a matrix that fits the budget is always one in-core task). ``"lu"``: the
        out-of-core LU with partial pivoting (:func:`blocklin.linalg.factor.lu.factor_lu_into`), then the
        rows of ``A^-1`` as ``A^-T e_i`` from its panels, unit vectors made in the task (LAPACK's
        backward error: no refinement by default); ``"schur"``: the randomized Schur-complement
        recursion described below (pivot-free, all GEMMs); ``"auto"``: ``"lu"``, or ``"schur"`` where two
        LU panels of ``n`` rows do not fit the budget. ``report["method"]`` says which ran.
    **settings
        As for every operation: :class:`~blocklin.config.Settings`.

    Returns
    -------
    Matrix
        ``X ~ M^{-1}`` with ``.report``: ``equilibration`` (``applied``, ``rowcnd``, ``colcnd`` and, where
        applied, the exponent ranges of ``R`` and ``C``: then ``residual``, ``backward_error``,
        ``cond_estimate`` and ``history`` are those of the equilibrated ``R M C``), ``residual`` (``||I - M X||_F``) and ``residual_method``
        (``"probed"`` or ``"exact"``), ``backward_error``, ``cond_estimate`` (``||M||_F ||X||_F``),
        ``refine_steps``, ``history`` (backward error after each stage), ``min_leaf_rcond``,
        ``attempts``, ``passes``, ``seconds``, ``peak_memory``, ``plan``, ``resumed`` and
        ``stages_skipped`` (steps a resumed run took from the interrupted one).

    Raises
    ------
    ShapeError
        ``a`` is not square.
    SingularMatrixError
        ``M`` is singular or numerically singular (message: condition estimate, and the pointer to
        Tikhonov regularization, ``blocklin.solve(a, b, lam=...)``).
    NonFiniteError
        ``a`` holds NaN or Inf.

    Notes
    -----
    *Cost.* ``2 n^3`` flops (as LU-based inversion), nearly all in GEMM; per recursion level the
    stored matrix is read a few times by the GEMM tiles. One Newton-Schulz step costs ``4 n^3``.

    *Stability.* Block elimination without pivoting is unstable when a leading block is
    ill-conditioned, even when ``M`` is not (Demmel, Higham and Schreiber, 1995); a random
    butterfly transformation makes leading blocks well conditioned with high probability
    (Parker, 1995; Baboulin, Dongarra, Herrmann and Tomov, 2013). Leaves are factored with partial
    pivoting and their reciprocal condition checked; a numerically singular leading leaf triggers one
    retry with a fresh butterfly, and a singular final Schur complement means ``M`` is singular.

    *Refinement.* Newton-Schulz (Schulz, 1933; Pan and Schreiber, 1991) squares ``R = I - M X``;
    the decision to refine comes from a probed estimate (one pass over ``M``), because a step costs
    twice the inversion. ``precision="mixed"`` follows Haidar, Tomov, Dongarra and Higham (SC18):
    the ``O(n^3)`` factorization work in float32, refinement to float64 accuracy; for an inverse the
    refinement is itself ``O(n^3)`` (4 n^3 float64 flops a step, twice the inversion), so in core it
    never pays (an H200, whose float32 and float64 peaks are equal, measured 5.6 s mixed against
    1.6 s float64 at n = 8192) and the one-task float64 inverse runs instead; out of core the float32
    recursion halves the bytes moved.

    *Equilibration.* A graded ``M`` (rows or columns scaled over many binades, ``D B`` or ``B D``) has an
    accurate inverse that every normwise check (a leaf's ``rcond``, ``||I - M X||_F``) would read as
    numerically singular. One pass out of core (the leaf task in core) gathers LAPACK's ``xGEEQUB`` scalings by powers of two (``R`` brings each
    row's largest magnitude into ``[0.5, 1)``, ``C`` each column's of ``R M``) and ``xLAQGE``'s rule
    decides (rows where ``ROWCND < 0.1``, columns where ``COLCND < 0.1``); where it applies, ``R M C`` is
    staged (exactly), inverted and refined by the route above, and ``X = C (R M C)^{-1} R`` written.
    Other matrices keep their route and bits.

    Examples
    --------
    >>> import numpy as np
    >>> import blocklin as bl
    >>> a = np.array([[4.0, 1.0], [2.0, 3.0]])
    >>> x = bl.inv(a)
    >>> np.round(x.to_numpy(), 12)
    array([[ 0.3, -0.1],
           [-0.2,  0.4]])
    """
    precision = _precision(precision)
    method = _method(method)
    steps = _refine_steps(refine, max_refine)
    tol = positive("tol", tol, optional=True, fix="leave it None for the default")
    if precision in HALF:
        if refine != "auto":  # GMRES-IR steps, not Newton-Schulz's: run while above tol, at most max_refine
            _half_refusal(precision, f"refine={refine!r}", "it refines while the backward error exceeds tol "
                          "(refine='auto'), at most max_refine steps")
        return _inv_half(a, out=out, precision=precision, method=method, tol=tol, max_refine=max_refine,
                         overwrite=overwrite, resume=resume, explain=explain, settings=settings)
    if explain:  # the plan alone: inv_plan
        return inv_plan(a, precision=precision, method=method, **settings)
    if resume and out is None:
        raise ParameterError(_msg("resume", "needs the output path of the run to continue", "out=None",
                                  "pass the same out= as the interrupted run (CLI: -o X.zarr --resume)"))
    with Job("inv", **settings) as job:
        M, out_dtype, plan = _operand_and_plan(job, a, precision, out, method=method)
        tol = _refine.default_tol(plan.n, out_dtype, in_core=not plan.nodes) if tol is None else tol
        params = {"precision": precision, "tol": tol, "seed": seed, "refine": str(refine), "max_refine": max_refine}
        token = _token(job, M, plan, out, params)
        # LAPACK's equilibration rule from one pass of row and column maxima (deterministic: not a
        # recorded stage, a resumed run makes it again on the input its stamps checked); a matrix that
        # fits one leaf has them gathered by the leaf task, which reads it anyway
        eq = _equilibrate.scan(job, M) if plan.n and not plan.direct else None
        # the work stores: the staged matrix, the Schur complements and A^-1 out of place, about 3.5 n^2;
        # equilibrated, R A C and its inverse beside them
        extra = 2 * plan.n if eq is not None and eq.applied else 0
        ao = job.claim(out, [M], overwrite=overwrite, resume=resume, token=token,
                       size=((plan.n, plan.n), out_dtype),
                       temp_size=((plan.n, 7 * plan.n // 2 + extra), plan.work_dtype))
        x_path = ao.array_path()
        work = job.work_dir("inv", token, output=ao, resume=resume)
        stages = Stages(work, ao.done, resume=resume and ao.resumed,
                        codec=job.cfg.codec, start=lambda: create_array(
                            x_path, shape=(plan.n,) * 2, dtype=out_dtype, chunks=(plan.chunk,) * 2,
                            codec=job.cfg.codec, overwrite=True))
        ops = BlockOps(job, plan.chunk)
        ran = "float64" if plan.precision_note else precision  # see _operand_and_plan
        ops.math = "tf32" if ran == "tf32" else None
        run = InverseRun(ops, stages, plan, equilibrate=True)
        if eq is not None and eq.applied:
            ref = _invert_equilibrated(run, M, eq, x_path, out_dtype, seed=seed, tol=tol, steps=steps, precision=ran)
        elif plan.n:
            try:
                ref = _invert_and_refine(run, M, x_path, out_dtype, seed=seed, tol=tol, steps=steps, precision=ran)
                if plan.direct:
                    eq = ref.leaves[0].get("equilibration")
            except NeedsEquilibration as found:  # the one leaf's task gathered the maxima and did not invert
                eq = found.eq
                ref = _invert_equilibrated(run, M, eq, x_path, out_dtype, seed=seed, tol=tol, steps=steps,
                                           precision=ran)
        else:
            ref = None
        report = _report(job, ref, plan, stages, precision=ran or out_dtype.name, output=ao.path)
        if eq is not None:
            report["equilibration"] = eq.report()
        if plan.precision_note:
            report["precision_reason"] = plan.precision_note
        return job.finish(ao, out, report, operation="inv", plan=plan.to_dict(), params=params, keys=REPORT_KEYS)


def _token(job: Job, M: Any, plan: InversePlan, out: Any, params: dict) -> str:
    """Deterministic in what decides the result's bits: the input (path, shape, dtype, chunks; its
    content is checked by the output, :mod:`blocklin.storage.stamps`), the plan, the parameters, the
    output and the settings the tile and pass plans depend on (workers, cores, device)."""
    return resume_token("inv", [M], plan.to_dict(), params, str(out), plan_settings(job))


def _invert_and_refine(run: InverseRun, M: Any, x_path: Any, out_dtype: np.dtype, *, seed: int, tol: float, steps: Steps,
                       precision: str | None) -> NewtonSchulz:
    """Invert into ``x_path``, probe, refine and accept (only a verified inverse is left there)."""
    first = invert_as_planned(run, M, x_path, out_dtype, seed)
    leaves = first.leaves

    # Entries beyond about 2^+-500 take ||M||_F and ||X||_F out of their sums of squares' range: read
    # them again by tiles scaled by powers of two (exact), so the backward error is measured, not 0 or NaN.
    n = run.plan.n
    norm_m = safe_norm(run.ops, Region.of(M.path, (n, n)), first.norm_m * first.norm_m)
    norm_x = safe_norm(run.ops, Region.of(x_path, (n, n)), first.norm_x * first.norm_x)

    def invert(operand: Any, out: Any, s: int) -> None:  # the preconditioned restart's (M X)^-1
        leaves.extend(invert_schur(run, operand, out, out_dtype, s, shift=True).leaves)

    ref = NewtonSchulz(run.ops, run.stages, M, n=run.plan.n, chunk=run.plan.chunk, dtype=out_dtype, seed=seed, tol=tol,
                     steps=steps, norm_m=norm_m, x=Iterate(x_path, np.nan, np.nan, "none", norm_x), invert=invert)
    if run.plan.method == "lu":
        # a residual >= sqrt(n) after a pivoted LU means M is singular to working precision: no
        # preconditioned restart (that is for the unpivoted recursion), accept() decides
        ref.restarts = 1
    ref.x = Iterate(x_path, first.residual, _refine.backward_error(first.residual, norm_m, norm_x), "probed", norm_x) \
        if run.plan.method in ("direct", "lu") else ref.probed(x_path, seed, norm_x)
    ref.history[0] = {**ref.history[0], "residual": ref.x.res, "backward_error": ref.x.eta, "method": "probed"}
    ref.run()
    ref.accept(precision)
    if ref.x.path != x_path:
        final = ref.x.path
        run.stages.run("copy", lambda: run.ops.copy(final, x_path, run.plan.n))
    ref.leaves, ref.attempts, ref.recursion_gemms = leaves, first.attempts, run.gemms
    return ref


def _invert_equilibrated(run: InverseRun, M: Any, eq: _equilibrate.Equilibration, x_path: Any,
                         out_dtype: np.dtype, *, seed: int, tol: float, steps: Steps, precision: str | None) -> NewtonSchulz:
    """``X = C Y R`` with ``Y`` the verified inverse of the equilibrated ``R A C`` (staged in a work store,
    exactly: powers of two), inverted and refined by the planned route; ``Y`` scaled into ``x_path`` in
    the last stage, which refuses an inverse beyond the output dtype's range."""
    from blocklin.operands import Operand
    from blocklin.linalg.blocks.result_range import magnitude, solution_range_error

    n, chunk = run.plan.n, run.plan.chunk
    run.equilibrate = False  # R A C is not equilibrated again
    # R A C in the output's dtype where it is wider (precision="float64" of float32 data): no entry rounded
    e_dtype = np.result_type(M.dtype, out_dtype)
    e_path = run.store("equilibrated", n, n, e_dtype)
    run.stages.run("equilibrate", lambda: _equilibrate.scale_into(
        run.job, M, e_path, eq.row, eq.col, e_dtype, chunk, description="equilibrate (R A C)", over="a"))
    E = Operand(name="a", path=e_path, shape=(n, n), dtype=e_dtype, chunks=(chunk, chunk))
    y_path = run.store("equilibrated-inverse", n, n, out_dtype)
    ref = _invert_and_refine(run, E, y_path, out_dtype, seed=seed, tol=tol, steps=steps, precision=precision)
    overflow, peak = run.stages.run("unequilibrate", lambda: _equilibrate.scale_into(
        run.job, Operand(name="y", path=y_path, shape=(n, n), dtype=out_dtype, chunks=(chunk, chunk)), x_path,
        eq.col, eq.row, out_dtype, chunk, description="undo the equilibration (C Y R)", over="intermediate",
        check=True))
    if overflow:
        from blocklin.linalg.inverse.routes import range_fix

        raise solution_range_error("a", out_dtype, what="an inverse", actual=(
            f"{overflow} entries of X = C Y R (Y the inverse of the equilibrated R A C, R and C powers of two) "
            f"beyond the range, the largest near 2^{peak}: {magnitude(_equilibrate.power_of_two(peak))}"),
            fix=range_fix(out_dtype, peak - np.finfo(out_dtype).maxexp + 1))
    Stages.drop(e_path)
    Stages.drop(y_path)
    ref.x = dataclasses.replace(ref.x, path=x_path)
    return ref


def inv_plan(a: Any, *, precision: str | None = None, method: str = "auto",
             **settings: Unpack[Settings]) -> InversePlan:
    """The :class:`~blocklin.plan.inverse.InversePlan` that :func:`inv` would run, without running it
    (what ``blocklin inv --explain`` prints); same parameters as :func:`inv`."""
    precision = _precision(precision)
    method = _method(method)
    if precision in HALF:
        _half_refusal(precision, "explain", "inv_plan (the 16-bit route is a square solve, A X = I: no inverse plan)")
    with Job("inv", **settings) as job:
        return _operand_and_plan(job, a, precision, space=False, method=method)[2]


def _half_refusal(precision: str, what: str, rule: str) -> None:
    raise ParameterError(_msg("precision", f"'{precision}' inverts by the square solve's LU and GMRES-IR, so "
                              f"{rule}", what, "pass precision='mixed' for the inverse's own routes, or drop "
                              f"{what.split('=')[0]}"))


def _method(value: Any) -> str:
    if value not in METHODS:
        raise ParameterError(_msg("method", "must be one of " + ", ".join(repr(m) for m in METHODS), repr(value),
                                  "pass method='auto' (the pivoted LU out of core) or method='schur'"))
    return value


def _operand_and_plan(job: Job, a: Any, precision: str | None, out: Any = None,
                      space: bool = True, method: str = "auto") -> tuple[Any, np.dtype, InversePlan]:
    """The validated square operand, the output dtype for ``precision`` and the plan (disk space
    checked first: a budget suggestion must not lead to a run the disk cannot hold)."""
    M = job.operand(a, "a", integers="cast")
    n = square(M, "to be inverted", "for a least-squares or regularized solution use blocklin.solve(a, b, lam=...)")
    not_empty(M, "to be inverted", "the inverse of a 0 x 0 matrix is 0 x 0: nothing to compute")
    if method == "auto" and job.device == "gpu" and precision not in ("mixed", "tf32"):
        # the LU route's panel factorization and row solves run on the host; in float32 work the
        # unpivoted recursion's leading blocks are too often ill-conditioned (a Gaussian block of a
        # few thousand rows has rcond ~1e-6, near float32's eps), so mixed precision keeps the LU route
        method = "schur"
    if float_operand(M, "inv", complex_ok=True).kind == "c" and precision is not None:
        raise ParameterError(_msg("precision", "must be None for complex data (the inverse is computed and refined "
                                  "in a's own complex dtype; 'mixed', 'tf32', 'float32' and 'float64' name real "
                                  "working dtypes)", f"precision={precision!r} with a: {M.dtype.name}",
                                  "pass precision=None (or cast a to complex128 first for a complex128 result)"))
    out_dtype = np.dtype(np.float64) if precision in ("mixed", "tf32", "float64") else \
        np.dtype(np.float32) if precision == "float32" else M.dtype
    if space:  # the run's output and work stores (not for a plan alone)
        job.check_space(out, size=((n, n), out_dtype), temp_size=((n, 7 * n // 2), np.float64))
    kw = dict(memory=job.cfg.memory, kernels=MEMORY, source_dtype=M.dtype, method=method,
              source_chunk_bytes=math.prod(M.chunks) * M.dtype.itemsize if n else 0, source_chunks=tuple(M.chunks),
              source_decoded=decoded_chunks(M))

    def inversion(memory: int, chunk: int | None = None) -> InversePlan:
        kwm = kw | {"memory": memory, "chunk": chunk}
        if precision in ("mixed", "tf32") and n:
            full = plan_inverse(n, out_dtype, precision=None, **kwm)
            if full.direct:
                # One LAPACK inversion in float64 costs 2 n^3 flops; float32 work must be refined by
                # Newton-Schulz steps of 4 n^3 float64 flops each, so where the matrix fits one task,
                # mixed precision is slower and less accurate on every device (an H200 measured 1.6 s
                # against 5.6 s at n = 8192). It pays only out of core, where it halves the bytes moved.
                return dataclasses.replace(full, precision_note=(
                    f"precision={precision!r} ran in float64: the matrix fits one in-core inversion, which is "
                    "faster and more accurate than float32 work refined to float64"))
        return plan_inverse(n, out_dtype, precision="mixed" if precision in ("mixed", "tf32") else None, **kwm)

    def plans(memory: int) -> InversePlan:
        plan = inversion(memory)
        if not n:
            return plan
        # the refinement's products, which a run may take, on the plan's chunks (``--explain`` shows the plan
        # the run takes): where they do not fit, smaller chunks (those a smaller budget takes), so that a
        # larger budget never refuses what a smaller one ran
        try:
            _refine.plan_products(job, M, n, plan.chunk, out_dtype, memory)
            return plan
        except BudgetError as exc:
            chunk = plan.chunk // 2
            while chunk >= MIN_CHUNK:
                try:
                    smaller = inversion(memory, chunk)
                    _refine.plan_products(job, M, n, smaller.chunk, out_dtype, memory)
                    return smaller
                except BudgetError:
                    chunk //= 2
            raise exc

    # a refusal names the budget at which every step plans (the leaf, the staging strip, the LU panels)
    return M, out_dtype, whole_call(plans, job.cfg.memory, "inv")


#: Report entries recorded in the output's attributes.
#: What an output's attributes record of the report; ``equilibration`` among them, since with it applied
#: the residual, backward error and condition estimate are those of the equilibrated ``R A C``.
REPORT_KEYS = ("seconds", "residual", "residual_method", "backward_error", "refine_steps", "cond_estimate",
               "peak_memory", "equilibration")


def _refine_steps(refine: Any, max_refine: int) -> Steps:
    """The Newton-Schulz :class:`~blocklin.linalg.inverse.refine.Steps` that ``refine`` asks for (see :func:`inv`)."""
    if not isinstance(refine, bool) and isinstance(refine, (int, np.integer)):
        refine = count("refine", refine, maximum=MAX_REFINE, fix="pass refine='auto' or refine=2")
    max_refine = count("max_refine", max_refine, maximum=MAX_REFINE, fix="pass max_refine=10")
    if isinstance(refine, bool):
        return Steps(1, max(1, int(max_refine))) if refine else Steps(0, 0)
    if refine == "auto" or refine is None:
        return Steps(0, int(max_refine))
    if isinstance(refine, (int, np.integer)) and refine >= 0:
        return Steps(int(refine), int(refine), exact=True)
    raise ParameterError(_msg("refine", "must be 'auto', True, False or a number of steps >= 0", repr(refine),
                              "pass refine='auto'"))


def _inv_half(a: Any, *, out: Any, precision: str, method: str, tol: float | None, max_refine: int,
              overwrite: bool, resume: bool, explain: bool, settings: dict) -> Matrix:
    """``X = A^-1`` as the solve ``A X = I`` in ``precision`` ``"fp16"``/``"bf16"`` (column-block GMRES-IR)."""
    from blocklin.linalg.solve.square import operand_dtype, operand_shape, solve_square

    if method == "schur":
        _half_refusal(precision, "method='schur'", "method must be 'auto' or 'lu'")
    if explain:
        _half_refusal(precision, "explain=True", "there is no inverse plan to explain")
    opts = settings.get("storage_options")
    shape = operand_shape(a, opts)
    if shape is None or shape[0] != shape[1]:  # the solve's own checks name what is wrong
        return solve_square(a, np.ones((shape[0] if shape else 1, 1)), out, precision=precision, overwrite=overwrite,
                            resume=resume, **settings)
    n = shape[0]
    # I in A's dtype: the solve refuses a float32 or complex A by the precision's rule, not by a dtype mix
    x = solve_square(a, np.eye(n, dtype=operand_dtype(a, opts) or np.float64), out, precision=precision, tol=tol, max_refine=max_refine, overwrite=overwrite,
                     resume=resume, reason=f"inv(precision={precision!r}): A X = I solved as one block of {n} "
                     "right-hand sides (LU with 16-bit GEMM inputs, GMRES-IR)", **settings)
    r = x.report  # the entries every inverse reports, from the solve's
    r.update(operation="inv", residual=r.get("residual_norm_fro"), cond_estimate=r.get("condition_estimate"),
             residual_method=f"||I - A X||_F of the GMRES-IR refinement ({r.get('refinement')}), float64, out of core",
             gemm_steps=r.get("products_with_a", 0), leaves=0)
    return x


def _report(job: Job, ref: NewtonSchulz | None, plan: InversePlan, stages: Stages, *, precision: str,
            output: Any) -> dict:
    if ref is None:  # n = 0
        return job.report(plan=plan.to_dict(), output=str(output), refine_steps=0, history=[], resumed=False,
                          stages_skipped=0)
    x = ref.x
    rcs = [lf["rcond"] for lf in ref.leaves]
    return job.report(
        flops=plan.flops + ref.ops.flops, plan=plan.to_dict(), output=str(output), residual=x.res, residual_method=x.method, backward_error=x.eta,
        backward_error_definition="||I - A X||_F / (||A||_F ||X||_F)", tol=ref.tol, refine_steps=ref.steps,
        history=ref.history, cond_estimate=ref.norm_m * x.norm_x, norm_a=ref.norm_m, norm_x=x.norm_x,
        attempts=ref.attempts, min_leaf_rcond=min(rcs) if rcs else None, leaves=len(ref.leaves),
        method=plan.method, method_reason=_method_reason(plan, job.device),
        butterfly_depth=plan.depth, precision=precision, work_dtype=plan.work_dtype,
        gemm_steps=ref.recursion_gemms + ref.gemms,
        resumed=stages.resumed, stages_skipped=stages.skipped,
        phases=_phases(job, plan, ref))


def _method_reason(plan: InversePlan, device: str) -> str:
    if plan.method == "direct":
        return "the matrix fits the budget: one in-core LAPACK inverse"
    if plan.method == "lu":
        return "out of core: LU with partial pivoting has LAPACK's backward error without refinement"
    if device == "gpu":
        return "on a GPU: the pivot-free randomized recursion, all in GEMMs on the device"
    return "asked for (method='schur'): the pivot-free randomized recursion, all in GEMMs"


def _phases(job: Job, plan: InversePlan, ref: NewtonSchulz) -> dict:
    """Where each phase of the route that ran was computed."""
    if plan.method == "lu":
        return {"LU panel updates (TRSM, GEMM)": job.device, "LU panel factorization (getrf)": "cpu",
                "rows of the inverse and residual probes": "cpu",
                "Newton-Schulz steps": job.device if ref.steps else None}
    return {"GEMMs (recursion, Newton-Schulz)": job.device,
            "leaf inverses": "/".join(sorted({lf.get("device", "cpu") for lf in ref.leaves})) or None,
            "butterfly transforms": butterfly_device(job, plan),
            "residual probes": _refine.probe_device(job, plan.n)}



__all__ = ["inv"]
