"""Out-of-core matrix inverse: recursive Schur complements, a random butterfly guard, Newton-Schulz."""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Unpack

import numpy as np

from blocklin.config import Settings
from blocklin.errors import ConvergenceWarning, ParameterError, SingularMatrixError, warn
from blocklin.errors import explain as _msg
from blocklin.linalg import refine as _refine
from blocklin.linalg._inv_kernels import (
    Butterfly,
    LeafSpec,
    UnmixSpec,
    leaf_inverse_task,
    mix_kernel,
    transform_device,
    unmix_columns_task,
)
from blocklin.matrix import Matrix
from blocklin.operands import Operand
from blocklin.plan.inverse import InversePlan, plan_inverse
from blocklin.runtime.blockops import BlockOps, column_strips
from blocklin.runtime.job import Job
from blocklin.runtime.passes import plan_kernel_pass, run_pass, source
from blocklin.storage.zarr_store import create_array
from blocklin.validate import choice, float_operand, positive, square

PRECISIONS = (None, "mixed", "tf32", "float32", "float64")


class _LeafSingular(Exception):
    def __init__(self, leaf: dict, last: bool) -> None:
        super().__init__("singular leaf")
        self.leaf = leaf
        self.last = last


def inv(a: Any, *, out: Any = None, refine: Any = "auto", max_refine: int = 10, tol: float | None = None,
        precision: str | None = None, overwrite: bool = False, seed: int = 0, explain: bool = False,
        **settings: Unpack[Settings]) -> Matrix | InversePlan:
    """Inverse of a square matrix larger than memory, with a verified backward error.

    The matrix ``M`` is staged once as ``W = M V`` with ``V`` a random butterfly of Givens
    rotations (orthogonal, depth 2), and ``W`` is inverted in place by the block elimination

    .. math::

        M = \\begin{bmatrix} A & B \\\\ C & D \\end{bmatrix},\\quad S = D - C A^{-1} B,\\quad
        M^{-1} = \\begin{bmatrix} A^{-1} + E S^{-1} F & -E S^{-1} \\\\ -S^{-1} F & S^{-1} \\end{bmatrix},
        \\quad E = A^{-1} B,\\ F = C A^{-1},

    recursing on ``A`` and ``S`` down to leaves that fit half the budget, which are inverted in core by
    LU with partial pivoting (LAPACK ``getrf``/``getri``). Each of the six products per level is an
    out-of-core blocked GEMM over sub-blocks of the stored matrices. Finally ``X = V W^{-1}`` is
    written column strip by column strip, and the residual is probed.

    Parameters
    ----------
    a : path, zarr array, Matrix, NumPy or Dask array
        Square matrix (float32 or float64). Never modified.
    out : path, optional
        Output store (atomic: written under a temporary name and renamed when complete).
    refine : {"auto", True, False} or int
        ``"auto"``: run Newton-Schulz steps only while the backward error (probed, then exact)
        exceeds ``tol``, at most ``max_refine``. ``True``: at least one step. ``False``/``0``: none
        (the probed residual is still reported). An integer ``N``: like ``"auto"`` with at most
        ``N`` steps.
    max_refine : int
        Largest number of Newton-Schulz steps.
    tol : float, optional
        Target backward error ``||I - M X||_F / (||M||_F ||X||_F)``; default ``n * eps`` of the output
        dtype (the classical bound for a backward stable inversion).
    precision : {None, "mixed", "tf32", "float32", "float64"}
        ``"mixed"``: invert in float32 (full float32, on a GPU too) and refine in float64 (the output is
        float64); ``"tf32"``: the same with the float32 GEMMs on TF32 tensor cores on a GPU (10-bit
        mantissas: for well-conditioned matrices; the float64 refinement restores the accuracy, or
        fails with the usual error); ``"float32"``/``"float64"``: compute in that dtype; ``None``: the
        input's dtype.
    overwrite : bool
        Replace an existing ``out``.
    seed : int
        Seed of the random butterfly and the probe vectors (results are reproducible).
    explain : bool
        Return the :class:`~blocklin.plan.inverse.InversePlan` without running (kept for
        compatibility: :func:`inv_plan` returns it and always one type).
    **settings
        As for every operation: :class:`~blocklin.config.Settings`.

    Returns
    -------
    Matrix
        ``X ~ M^{-1}`` with ``.report``: ``residual`` (``||I - M X||_F``) and ``residual_method``
        (``"probed"`` or ``"exact"``), ``backward_error``, ``cond_estimate`` (``||M||_F ||X||_F``),
        ``refine_steps``, ``history`` (backward error after each stage), ``min_leaf_rcond``,
        ``attempts``, ``passes``, ``seconds``, ``peak_memory``, ``plan``.

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
    refinement is itself ``O(n^3)`` (two float64 steps), so the gain is on GPUs with fast float32/TF32.

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
    precision = choice("precision", precision, PRECISIONS, fix="pass precision='mixed' or leave it None")
    min_steps, max_steps = _refine_steps(refine, max_refine)
    tol = positive("tol", tol, optional=True, fix="leave it None for the default")
    if explain:  # the plan alone: inv_plan
        return inv_plan(a, precision=precision, **settings)
    with Job("inv", **settings) as job:
        M, out_dtype, plan = _operand_and_plan(job, a, precision)
        n = plan.n
        tol = _refine.default_tol(n, out_dtype) if tol is None else tol
        ao = job.output(out, inputs=[M.path] if not M.staged else [], overwrite=overwrite)
        x_path = ao.array_path()
        create_array(x_path, shape=(n, n), dtype=out_dtype, chunks=(plan.chunk, plan.chunk), codec=job.cfg.codec)
        if n == 0:
            path = ao.commit("inv", plan=plan.to_dict(), params={})
            return Matrix(path, report=job.report(plan=plan.to_dict()), temporary=out is None)
        ops = BlockOps(job, plan.chunk)
        ops.math = "tf32" if precision == "tf32" else None
        norm_m, norm_x, xp, leaves, attempts = _invert_stored(ops, M, x_path, plan, out_dtype, seed)
        res = _refine.probe_estimate(job, M, xp, seed)
        x = _Iterate(x_path, res, _refine.backward_error(res, norm_m, norm_x), "probed", norm_x)
        ref = _Refinement(ops, M, plan, out_dtype, seed=seed, tol=tol, min_steps=min_steps, max_steps=max_steps,
                          norm_m=norm_m, x=x, leaves=leaves)
        ref.run()
        ref.accept(precision)
        if ref.x.path != x_path:
            ops.copy(ref.x.path, x_path, n)
        report = _report(job, ref, plan, attempts, precision=precision or out_dtype.name, output=ao.path)
        path = ao.commit("inv", plan=plan.to_dict(), params={"precision": precision, "tol": tol, "seed": seed,
                                                              "refine": str(refine)},
                         report=job.brief(report, REPORT_KEYS))
        return Matrix(path, report=report, temporary=out is None)


def inv_plan(a: Any, *, precision: str | None = None, **settings: Unpack[Settings]) -> InversePlan:
    """The :class:`~blocklin.plan.inverse.InversePlan` that :func:`inv` would run, without running it
    (what ``blocklin inv --explain`` prints); same parameters as :func:`inv`."""
    precision = choice("precision", precision, PRECISIONS, fix="pass precision='mixed' or leave it None")
    with Job("inv", **settings) as job:
        return _operand_and_plan(job, a, precision)[2]


def _operand_and_plan(job: Job, a: Any, precision: str | None) -> tuple[Any, np.dtype, InversePlan]:
    """The validated square operand, the output dtype for ``precision`` and the plan."""
    M = job.operand(a, "a")
    n = square(M, "to be inverted", "for a least-squares or regularized solution use blocklin.solve(a, b, lam=...)")
    float_operand(M)
    out_dtype = np.dtype(np.float64) if precision in ("mixed", "tf32", "float64") else \
        np.dtype(np.float32) if precision == "float32" else M.dtype
    plan = plan_inverse(n, out_dtype, memory=job.cfg.memory,
                        precision="mixed" if precision in ("mixed", "tf32") else None)
    return M, out_dtype, plan


#: Report entries recorded in the output's attributes.
REPORT_KEYS = ("seconds", "residual", "residual_method", "backward_error", "refine_steps", "cond_estimate",
               "peak_memory")


def _refine_steps(refine: Any, max_refine: int) -> tuple[int, int]:
    """``(min_steps, max_steps)`` of Newton-Schulz for ``refine`` (see :func:`inv`)."""
    if isinstance(refine, bool):
        return (1, max(1, int(max_refine))) if refine else (0, 0)
    if refine == "auto" or refine is None:
        return 0, int(max_refine)
    if isinstance(refine, (int, np.integer)) and refine >= 0:
        return 0, int(refine)
    raise ParameterError(_msg("refine", "must be 'auto', True, False or a number of steps >= 0", repr(refine),
                              "pass refine='auto'"))


def _report(job: Job, ref: _Refinement, plan: InversePlan, attempts: int, *, precision: str, output: Any) -> dict:
    x = ref.x
    rcs = [lf["rcond"] for lf in ref.leaves]
    report = job.report(
        plan=plan.to_dict(), output=str(output), residual=x.res, residual_method=x.method, backward_error=x.eta,
        backward_error_definition="||I - A X||_F / (||A||_F ||X||_F)", tol=ref.tol, refine_steps=ref.steps,
        history=ref.history, cond_estimate=ref.norm_m * x.norm_x, norm_a=ref.norm_m, norm_x=x.norm_x,
        attempts=attempts, min_leaf_rcond=min(rcs) if rcs else None, leaves=len(ref.leaves),
        butterfly_depth=plan.depth, precision=precision, work_dtype=plan.work_dtype, gemm_steps=ref.ops.gemms,
        phases={"GEMMs (recursion, Newton-Schulz)": job.device,
                "leaf inverses": "/".join(sorted({lf.get("device", "cpu") for lf in ref.leaves})) or None,
                "butterfly transforms": _transforms_device(job, plan),
                "residual probes": _refine.probe_device(job, plan.n)})
    report["flops"] = plan.flops + ref.ops.flops
    return report


# -- refinement -------------------------------------------------------------------------------------------


@dataclasses.dataclass
class _Iterate:
    """An approximate inverse in store ``path``: its residual ``||I - M X||_F`` (probed or exact),
    backward error and ``||X||_F``."""

    path: str
    res: float
    eta: float
    method: str
    norm_x: float


class _Refinement:
    """Newton-Schulz steps on a stored inverse while the backward error exceeds ``tol``.

    Each pass of the loop forms the exact ``R = I - M X`` (one GEMM); a converging iterate takes a
    step ``X + X R`` (probed afterwards); a residual ``>= sqrt(n)`` (Newton-Schulz cannot converge)
    takes one preconditioned restart ``X (M X)^-1`` instead; divergence or stagnation stops. The
    iterates alternate between the output and one spare store.
    """

    def __init__(self, ops: BlockOps, M: Any, plan: InversePlan, out_dtype: np.dtype, *, seed: int, tol: float,
                 min_steps: int, max_steps: int, norm_m: float, x: _Iterate, leaves: list[dict]) -> None:
        self.ops, self.M, self.plan, self.dtype, self.seed = ops, M, plan, out_dtype, seed
        self.n = plan.n
        self.tol, self.min_steps, self.max_steps, self.norm_m = tol, min_steps, max_steps, norm_m
        self.x, self.leaves = x, leaves
        self.history: list[dict] = []
        self.steps = self.restarts = 0
        self.restarted = False
        self.spare: str | None = None
        self.log("inverse")

    def log(self, stage: str, x: _Iterate | None = None) -> None:
        x = x or self.x
        self.history.append({"stage": stage, "residual": x.res, "backward_error": x.eta, "method": x.method})

    def probed(self, path: str, xp: np.ndarray, seed: int, norm_x: float) -> _Iterate:
        res = _refine.probe_estimate(self.ops.job, self.M, xp, seed)
        return _Iterate(path, res, _refine.backward_error(res, self.norm_m, norm_x), "probed", norm_x)

    def exact(self) -> str:
        """``R = I - M X`` into a new store (returned); the iterate's residual becomes exact."""
        r_path = self.ops.store("r", self.n, self.n, self.dtype)
        res = _refine.ns_residual(self.ops, self.M, self.x.path, r_path, self.n, self.dtype)
        self.x = _Iterate(self.x.path, res, _refine.backward_error(res, self.norm_m, self.x.norm_x), "exact",
                          self.x.norm_x)
        return r_path

    def wanted(self) -> bool:
        x = self.x
        return self.steps < self.max_steps and np.isfinite(x.eta) and (
            x.eta > self.tol or self.steps < self.min_steps or not _refine.is_inverse(x.res, x.method))

    def run(self) -> None:
        while self.wanted():
            r_path = self.exact()
            self.log(f"residual {self.steps}")
            x = self.x
            if x.eta <= self.tol and self.steps >= self.min_steps and _refine.is_inverse(x.res, x.method):
                break
            if x.res >= math.sqrt(self.n):
                # ||R||_2 >= ||R||_F / sqrt(n) >= 1: Newton-Schulz would not converge. The block
                # recursion lost too much to ill-conditioning; M X is far better conditioned than M,
                # so invert it the same way and take X (M X)^-1 (a preconditioned restart, 3x the work).
                if self.restarts >= 1 or self.restarted:
                    break
                self.restart(r_path)
                continue
            if not self.step(r_path):
                break

    def spare_store(self) -> str:
        if self.spare is None:
            self.spare = self.ops.store("x", self.n, self.n, self.dtype)
        return self.spare

    def restart(self, r_path: str) -> None:
        """``X (M X)^-1``, with ``(M X)^-1 = (I - R)^-1`` inverted the same way; kept when better."""
        self.restarts += 1
        ops, n, dt = self.ops, self.n, self.dtype
        z_path = ops.store("z", n, n, dt)
        pm = Operand(name="I - R", path=r_path, shape=(n, n), dtype=dt, chunks=(self.plan.chunk,) * 2)
        _, _, _, more, _ = _invert_stored(ops, pm, z_path, self.plan, dt, self.seed + 17, shift=True)
        self.leaves += more
        spare = self.spare_store()
        norm_new, xp = _refine.ns_product(ops, self.x.path, z_path, spare, n, dt, self.seed + 31)
        _drop(z_path)
        _drop(r_path)
        new = self.probed(spare, xp, self.seed + 31, norm_new)
        self.log("preconditioned restart X (M X)^-1", new)
        self.restarted = True
        if new.eta < self.x.eta:
            self.spare, self.x = self.x.path, new

    def step(self, r_path: str) -> bool:
        """``X + X R`` into the spare store; returns whether to go on (no divergence, no stagnation)."""
        prev = self.x
        nxt = self.spare_store()
        pseed = self.seed + self.steps + 1
        norm_x, xp = _refine.ns_update(self.ops, prev.path, r_path, nxt, self.n, self.dtype, pseed)
        _drop(r_path)
        self.spare = prev.path
        self.steps += 1
        self.x = self.probed(nxt, xp, pseed, norm_x)
        self.log(f"step {self.steps}")
        if not self.x.eta < prev.eta:  # diverging (||R||_2 >= 1) or at the rounding floor: keep the better X
            self.spare, self.x = nxt, prev
            self.log("kept the previous iterate")
            return False
        return not (self.x.eta > 0.5 * prev.eta and self.x.eta > self.tol)  # stagnation at the rounding floor

    def accept(self, precision: str | None) -> None:
        """Return only a verified inverse (``||I - M X||_F < 1``): refuse a singular ``M``, warn below ``tol``."""
        if np.isfinite(self.x.eta) and self.x.method == "probed" and not _refine.is_inverse(self.x.res, "probed"):
            # the probes cannot vouch for X: decide on the exact residual (one GEMM), at every budget
            _drop(self.exact())
            self.log("acceptance")
        x = self.x
        cond_est = self.norm_m * x.norm_x
        eps = float(np.finfo(self.dtype).eps)
        if not np.isfinite(x.eta) or not _refine.is_inverse(x.res, x.method):
            raise SingularMatrixError(_msg(
                "a", "must be numerically nonsingular to be inverted in " + self.dtype.name,
                f"||I - A X||_F = {x.res:.1e} >= 1 after {self.steps} Newton-Schulz step(s), so X carries no "
                f"correct digit of the inverse; condition number estimate ||A||_F ||X||_F = {cond_est:.1e} "
                f"(1/eps = {1 / eps:.1e})",
                "regularize: blocklin.solve(a, b, lam=...) (lam='gcv' chooses lam)"
                + ("" if precision not in ("mixed", "tf32") else f", or invert without precision='{precision}'")))
        if x.eta > self.tol and self.max_steps > 0:
            warn(f"inv: backward error {x.eta:.2e} ({x.method}) above tol {self.tol:.1e} after {self.steps} "
                 f"Newton-Schulz step(s) (condition estimate {cond_est:.1e}); the result is returned",
                 ConvergenceWarning)


# -- steps ------------------------------------------------------------------------------------------------


def _invert_stored(ops: BlockOps, M: Any, x_path: str, plan: InversePlan, out_dtype: np.dtype, seed: int,
                   shift: bool = False) -> tuple[float, float, np.ndarray, list[dict], int]:
    """Stage (``M`` or ``I - M`` when ``shift``) with a random butterfly, invert by recursion, undo the butterfly.

    Returns ``||staged||_F``, ``||X||_F``, ``X P`` (probe products), the leaf results and the attempts.
    """
    job, n = ops.job, plan.n
    wdt = np.dtype(plan.work_dtype)
    attempts = 0
    while True:
        attempts += 1
        # First a one-sided depth-2 butterfly W = M V (free: folded into the staging pass). If a
        # leading block still comes out singular (a one-sided sparse butterfly cannot mix every
        # permutation-like structure), the two-sided W = U^T M V of Parker (1995), at two more passes.
        bf = Butterfly(n, plan.depth, seed + 1000 * (attempts - 1))
        bf_u = Butterfly(n, plan.depth, seed + 1000 * (attempts - 1) + 1) if attempts > 1 else None
        w_path = ops.store("w", n, n, wdt)
        if bf_u is None:
            norm_m = _mix(job, M, w_path, bf, wdt, plan, shift=shift)
        else:
            t_path = ops.store("t", n, n, wdt)
            norm_m = _mix(job, M, t_path, bf, wdt, plan, shift=shift)
            _unmix(ops, t_path, w_path, bf_u, wdt, plan, seed, transpose=True)
            _drop(t_path)
        leaves: list[dict] = []
        try:
            # the retry also balances the splits: a tiny leading block of a sparse-butterfly-mixed
            # permutation-like matrix can be structurally singular
            _invert(ops, plan, w_path, 0, n, wdt, leaves, top=True, balanced=attempts > 1)
            break
        except _LeafSingular as bad:
            _drop(w_path)
            if bad.last or attempts >= 2 or plan.depth == 0:
                rc = bad.leaf["rcond"]
                cond = "infinite (an exact zero pivot)" if rc == 0 else f"at least about {1 / rc:.1e}"
                raise SingularMatrixError(_msg(
                    "a", "must be nonsingular to be inverted",
                    f"a numerically singular {'Schur complement' if bad.last else 'block'} at rows "
                    f"{bad.leaf['off']}:{bad.leaf['off'] + bad.leaf['size']} (reciprocal condition "
                    f"{rc:.1e}); condition number estimate {cond}",
                    "regularize: blocklin.solve(a, b, lam=...) solves min ||A x - b||^2 + lam^2 ||x||^2 "
                    "(lam='gcv' chooses lam), or use a pseudo-inverse")) from None
            warn(f"inv: a leading block of the randomized matrix was numerically singular "
                 f"(rcond {bad.leaf['rcond']:.1e}); retrying with a two-sided random butterfly and balanced splits")
    if bf_u is None:
        norm_x, xp = _unmix(ops, w_path, x_path, bf, out_dtype, plan, seed)
    else:  # X = V W^-1 U^T: a column pass, then a row pass (which also forms X P)
        z_path = ops.store("z", n, n, out_dtype)
        norm_x, _ = _unmix(ops, w_path, z_path, bf, out_dtype, plan, seed)
        zop = Operand(name="z", path=z_path, shape=(n, n), dtype=out_dtype, chunks=(plan.chunk,) * 2)
        _, xp = _mix(job, zop, x_path, bf_u, out_dtype, plan, transpose=True, probe_seed=seed, with_probe=True)
        _drop(z_path)
    _drop(w_path)
    return norm_m, norm_x, xp, leaves, attempts



def _drop(path: str) -> None:
    import shutil

    shutil.rmtree(path, ignore_errors=True)


def _mix(job: Job, M: Any, w_path: str, bf: Butterfly, wdt: np.dtype, plan: InversePlan, shift: bool = False,
         transpose: bool = False, probe_seed: int | None = None, with_probe: bool = False) -> Any:
    """Row pass ``W = M V`` (cast to the work dtype, NaN/Inf checked); returns ``||M||_F``."""
    n = plan.n
    # strips are planned on W's chunk rows: each strip of W = M V must own whole chunks of W
    src = [dataclasses.replace(source(M, name="a"), chunk_rows=plan.chunk)]
    params = {"butterfly": bf, "dtype": wdt.name, "shift": shift, "transpose": transpose, "probe_seed": probe_seed,
              "probe_k": _refine.PROBES}
    prp = plan_kernel_pass(job, mix_kernel, src, params, max_strip=4 * plan.chunk)
    if prp.strip % plan.chunk and prp.strip < n:  # a strip must own whole chunk rows of W: one chunk, one task
        prp = plan_kernel_pass(job, mix_kernel, src, params, memory=10 * plan.strip_memory, max_strip=plan.chunk,
                               workers=1)
    states, _ = run_pass(job, mix_kernel, src, params, plan=prp, outputs=(("w", w_path),),
                         description="stage and randomize", device=_transforms_device(job, plan))
    norm = math.sqrt(sum(s["sumsq"] for s in states))
    if with_probe:
        return norm, sum(s["xp"] for s in states if "xp" in s)
    return norm


def _transforms_device(job: Job, plan: InversePlan) -> str:
    """Where the butterfly passes run: as asked, or for ``auto`` where they win (about 6 flops per
    entry and level: read-bound, so the CPU)."""
    return transform_device(job.cfg.device, plan.n, 6.0 * max(1, plan.depth), job.device)


def _leaf(ops: BlockOps, src: str, dst: str, off: int, size: int, wdt: np.dtype) -> dict:
    job = ops.job
    from blocklin.device import pass_device

    # 2 n^3 flops over n^2 elements read: the GPU wins on large leaves ('auto'), or when asked for
    dev = pass_device(job.cfg.device, 2.0 * size**3, size * size * wdt.itemsize, job.device)
    spec = LeafSpec(src=src, dst=dst, off=off, size=size, dtype=wdt.name, blas_threads=job.task_blas_threads(job.cores()),
                    device=dev, device_memory=job.device_memory() if dev == "gpu" else None)
    graph = ops.graph("leaf", spec)
    graph.add((0,), leaf_inverse_task, spec)
    (res,) = job.run(graph, workers=1, blas_threads=job.cores(), description=f"leaf {off}:{off + size}")
    return res


def _invert(ops: BlockOps, plan: InversePlan, w: str, off: int, size: int, wdt: np.dtype,
            leaves: list[dict], *, top: bool = False, last: bool = True, balanced: bool = False) -> None:
    """Invert the diagonal region ``[off, off+size)^2`` of store ``w`` in place."""
    eps = float(np.finfo(wdt).eps)
    if size <= plan.leaf:
        res = _leaf(ops, w, w, off, size, wdt)
        leaves.append(res)
        if res["info"] != 0 or not res["rcond"] > (eps if last else plan.n * eps):
            raise _LeafSingular(res, last)
        return
    n1 = _split(plan, size, balanced)
    n2 = size - n1
    o, p = off, off + n1  # offsets of the leading and trailing blocks
    _invert(ops, plan, w, o, n1, wdt, leaves, last=False, balanced=balanced)  # A^-1 in place
    e = ops.store("e", n1, n2, wdt)
    f = ops.store("f", n2, n1, wdt)
    g = ops.gemm
    g(e, (0, 0), n1, n2, n1, w, (o, o), w, (o, p), dtype=wdt, description="E = A^-1 B")
    g(f, (0, 0), n2, n1, n1, w, (p, o), w, (o, o), dtype=wdt, description="F = C A^-1")
    g(w, (p, p), n2, n2, n1, w, (p, o), e, (0, 0), dtype=wdt, c=w, c_off=(p, p), alpha=-1.0, beta=1.0,
      description="S = D - C E")
    _invert(ops, plan, w, p, n2, wdt, leaves, last=last, balanced=balanced)  # S^-1 in place
    g(w, (o, p), n1, n2, n2, e, (0, 0), w, (p, p), dtype=wdt, alpha=-1.0, description="X12 = -E S^-1")
    g(w, (p, o), n2, n1, n2, w, (p, p), f, (0, 0), dtype=wdt, alpha=-1.0, description="X21 = -S^-1 F")
    g(w, (o, o), n1, n1, n2, w, (o, p), f, (0, 0), dtype=wdt, c=w, c_off=(o, o), alpha=-1.0, beta=1.0,
      description="X11 = A^-1 - X12 F")
    _drop(e)
    _drop(f)


def _split(plan: InversePlan, size: int, balanced: bool = False) -> int:
    from blocklin.plan.inverse import _split as split

    return split(size, plan.chunk, None if balanced else plan.leaf)


def _unmix(ops: BlockOps, w: str, x: str, bf: Butterfly, out_dtype: np.dtype, plan: InversePlan,
           seed: int, transpose: bool = False) -> tuple[float, np.ndarray]:
    """``X = V Y`` column strip by column strip; returns ``||X||_F`` and ``X P``."""
    job = ops.job
    dev = _transforms_device(job, plan)
    spec = UnmixSpec(src=w, dst=x, butterfly=bf, dtype=out_dtype.name, probe_seed=seed, probe_k=_refine.PROBES,
                     blas_threads=job.task_blas_threads(1), transpose=transpose, device=dev,
                     device_memory=job.device_memory() if dev == "gpu" else None)
    graph = ops.graph("unmix", spec)
    for s, (c0, c1) in enumerate(column_strips(plan.n, plan.column_width)):
        graph.add((s,), unmix_columns_task, spec, c0, c1)
    workers = max(1, min(job.workers(1), job.cfg.memory // max(1, plan.column_memory)))
    results = job.run(graph, workers=workers, description="undo the butterfly", count_pass="intermediate")
    xp = np.zeros((plan.n, _refine.PROBES))
    total = 0.0
    for r in results:
        xp += r["probe"]
        total += r["sumsq"]
    return math.sqrt(total), xp


__all__ = ["inv"]
