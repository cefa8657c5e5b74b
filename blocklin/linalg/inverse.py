"""Out-of-core matrix inverse: recursive Schur complements, a random butterfly guard, Newton-Schulz."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from blocklin.errors import (
    ConvergenceWarning,
    DTypeError,
    ShapeError,
    SingularMatrixError,
    warn,
)
from blocklin.errors import explain as _msg
from blocklin.linalg import refine as _refine
from blocklin.linalg._inv_kernels import (
    Butterfly,
    LeafSpec,
    Params,
    UnmixSpec,
    column_strips,
    leaf_inverse_task,
    mix_init,
    mix_kernel,
    unmix_columns_task,
)
from blocklin.matrix import Matrix
from blocklin.operands import Operand
from blocklin.plan.inverse import InversePlan, plan_inverse
from blocklin.plan.passes import plan_row_pass
from blocklin.runtime.job import Job
from blocklin.runtime.passes import RowPassSpec, run_row_pass
from blocklin.storage.zarr_store import create_array

PRECISIONS = (None, "mixed", "float32", "float64")


class _LeafSingular(Exception):
    def __init__(self, leaf: dict, last: bool) -> None:
        super().__init__("singular leaf")
        self.leaf = leaf
        self.last = last


def inv(a: Any, *, out: Any = None, refine: Any = "auto", max_refine: int = 10, tol: float | None = None,
        precision: str | None = None, memory: Any = None, device: str | None = None, scheduler: Any = None,
        progress: Any = None, workers: int | None = None, check_finite: bool | None = None,
        overwrite: bool = False, seed: int = 0, explain: bool = False, temp_dir: Any = None,
        storage_options: dict | None = None) -> Matrix | InversePlan:
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
    precision : {None, "mixed", "float32", "float64"}
        ``"mixed"``: invert in float32 (TF32 allowed on a GPU) and refine in float64 (the output is
        float64); ``"float32"``/``"float64"``: compute in that dtype; ``None``: the input's dtype.
    memory, device, scheduler, progress, workers, check_finite
        As for :func:`blocklin.matmul`.
    overwrite : bool
        Replace an existing ``out``.
    seed : int
        Seed of the random butterfly and the probe vectors (results are reproducible).
    explain : bool
        Return the :class:`~blocklin.plan.inverse.InversePlan` without running.
    temp_dir : path or URL, optional
        Where staged inputs and intermediates go (default: config / ``BLOCKLIN_TEMP_DIR``).
    storage_options : dict, optional
        fsspec options for URL operands, outputs and temp dir (see ``docs/cluster.md``).

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
    """
    if precision not in PRECISIONS:
        raise ValueError(_msg("precision", f"must be one of {PRECISIONS}", repr(precision),
                                 "pass precision='mixed' or leave it None"))
    if isinstance(refine, bool):
        min_steps, max_steps = (1, max(1, int(max_refine))) if refine else (0, 0)
    elif refine == "auto" or refine is None:
        min_steps, max_steps = 0, int(max_refine)
    elif isinstance(refine, (int, np.integer)) and refine >= 0:
        min_steps, max_steps = 0, int(refine)
    else:
        raise ValueError(_msg("refine", "must be 'auto', True, False or a number of steps >= 0", repr(refine),
                                 "pass refine='auto'"))
    with Job("inv", memory=memory, device=device, scheduler=scheduler, workers=workers, progress=progress,
             check_finite=check_finite, temp_dir=temp_dir, storage_options=storage_options) as job:
        M = job.operand(a, "a")
        if M.shape[0] != M.shape[1]:
            raise ShapeError(_msg("a", "must be square to be inverted", f"shape {M.shape[0]} x {M.shape[1]}",
                                     "for a least-squares or regularized solution use blocklin.solve(a, b, lam=...)"))
        if M.dtype not in (np.dtype(np.float32), np.dtype(np.float64)):
            raise DTypeError(_msg("a", "dtype must be float32 or float64", M.dtype.name,
                                     "convert it (blocklin convert --dtype float64)"))
        n = M.shape[0]
        out_dtype = np.dtype(np.float64) if precision in ("mixed", "float64") else \
            np.dtype(np.float32) if precision == "float32" else M.dtype
        plan = plan_inverse(n, out_dtype, memory=job.cfg.memory, precision="mixed" if precision == "mixed" else None)
        if explain:
            return plan
        tol = _refine.default_tol(n, out_dtype) if tol is None else float(tol)
        if not tol > 0:
            raise ValueError(_msg("tol", "must be positive", repr(tol), "leave it None for the default"))
        ao = job.output(out, inputs=[M.path] if not M.staged else [], overwrite=overwrite)
        ops = _refine.BlockOps(job, plan.chunk)
        x_path = ao.array_path()
        create_array(x_path, shape=(n, n), dtype=out_dtype, chunks=(plan.chunk, plan.chunk), codec=job.cfg.codec)
        if n == 0:
            path = ao.commit("inv", plan=plan.to_dict(), params={})
            return Matrix(path, report=job.report(plan=plan.to_dict()), temporary=out is None)
        norm_m, norm_x, xp, leaves, attempts = _invert_stored(ops, M, x_path, plan, out_dtype, seed)
        history: list[dict] = []
        res = _refine.probe_estimate(job, M, xp, seed)
        eta = _refine.backward_error(res, norm_m, norm_x)
        method = "probed"
        history.append({"stage": "inverse", "residual": res, "backward_error": eta, "method": method})
        steps = restarts = 0
        exact_prev_restart = None
        cur = x_path
        spare: str | None = None
        while steps < max_steps and (eta > tol or steps < min_steps or not _refine.is_inverse(res, method)) \
                and np.isfinite(eta):
            r_path = ops.store("r", n, n, out_dtype)
            exact = _refine.ns_residual(ops, M, cur, r_path, n, out_dtype)
            eta_exact = _refine.backward_error(exact, norm_m, norm_x)
            history.append({"stage": f"residual {steps}", "residual": exact, "backward_error": eta_exact,
                            "method": "exact"})
            res, eta, method = exact, eta_exact, "exact"
            if eta <= tol and steps >= min_steps and _refine.is_inverse(res, method):
                break
            if exact >= math.sqrt(n):
                # ||R||_2 >= ||R||_F / sqrt(n) >= 1: Newton-Schulz would not converge. The block
                # recursion lost too much to ill-conditioning; M X is far better conditioned than M,
                # so invert it the same way and take X (M X)^-1 (a preconditioned restart, 3x the work).
                if restarts >= 1 or exact_prev_restart is not None:
                    break
                restarts += 1
                z_path = ops.store("z", n, n, out_dtype)
                pm = Operand(name="I - R", path=r_path, shape=(n, n), dtype=out_dtype, chunks=(plan.chunk,) * 2)
                _, _, _, more, _ = _invert_stored(ops, pm, z_path, plan, out_dtype, seed + 17, shift=True)
                leaves += more
                if spare is None:
                    spare = ops.store("x", n, n, out_dtype)
                norm_new, xp = _refine.ns_product(ops, cur, z_path, spare, n, out_dtype, seed + 31)
                _drop(z_path)
                _drop(r_path)
                res_new = _refine.probe_estimate(job, M, xp, seed + 31)
                eta_new = _refine.backward_error(res_new, norm_m, norm_new)
                history.append({"stage": "preconditioned restart X (M X)^-1", "residual": res_new,
                                "backward_error": eta_new, "method": "probed"})
                exact_prev_restart = exact
                if eta_new < eta:
                    spare, cur = cur, spare
                    res, eta, method, norm_x = res_new, eta_new, "probed", norm_new
                continue
            if spare is None:
                spare = ops.store("x", n, n, out_dtype)
            nxt = spare
            pseed = seed + steps + 1
            prev = (res, eta, method, norm_x)
            norm_x, xp = _refine.ns_update(ops, cur, r_path, nxt, n, out_dtype, pseed)
            _drop(r_path)
            spare, cur = cur, nxt
            steps += 1
            res = _refine.probe_estimate(job, M, xp, pseed)
            eta, method = _refine.backward_error(res, norm_m, norm_x), "probed"
            history.append({"stage": f"step {steps}", "residual": res, "backward_error": eta, "method": method})
            if not eta < prev[1]:  # diverging (||R||_2 >= 1) or at the rounding floor: keep the better X
                spare, cur = cur, spare
                res, eta, method, norm_x = prev
                history.append({"stage": "kept the previous iterate", "residual": res, "backward_error": eta,
                                "method": method})
                break
            if eta > 0.5 * prev[1] and eta > tol:
                break  # stagnation at the rounding floor
        if np.isfinite(eta) and method == "probed" and not _refine.is_inverse(res, method):
            # the probes cannot vouch for X: decide on the exact residual (one GEMM), at every budget
            r_path = ops.store("r", n, n, out_dtype)
            res, method = _refine.ns_residual(ops, M, cur, r_path, n, out_dtype), "exact"
            _drop(r_path)
            eta = _refine.backward_error(res, norm_m, norm_x)
            history.append({"stage": "acceptance", "residual": res, "backward_error": eta, "method": method})
        cond_est = norm_m * norm_x
        eps = float(np.finfo(out_dtype).eps)
        if not np.isfinite(eta) or not _refine.is_inverse(res, method):
            raise SingularMatrixError(_msg(
                "a", "must be numerically nonsingular to be inverted in " + out_dtype.name,
                f"||I - A X||_F = {res:.1e} >= 1 after {steps} Newton-Schulz step(s), so X carries no correct "
                f"digit of the inverse; condition number estimate ||A||_F ||X||_F = {cond_est:.1e} "
                f"(1/eps = {1 / eps:.1e})",
                "regularize: blocklin.solve(a, b, lam=...) (lam='gcv' chooses lam)"
                + ("" if precision != "mixed" else ", or invert without precision='mixed'")))
        if eta > tol and max_steps > 0:
            warn(f"inv: backward error {eta:.2e} ({method}) above tol {tol:.1e} after {steps} Newton-Schulz step(s) "
                 f"(condition estimate {cond_est:.1e}); the result is returned", ConvergenceWarning)
        if cur != x_path:
            ops.copy(cur, x_path, n)
        rcs = [lf["rcond"] for lf in leaves]
        report = job.report(
            plan=plan.to_dict(), output=str(ao.path), residual=res, residual_method=method, backward_error=eta,
            backward_error_definition="||I - A X||_F / (||A||_F ||X||_F)", tol=tol, refine_steps=steps,
            history=history, cond_estimate=cond_est, norm_a=norm_m, norm_x=norm_x, attempts=attempts,
            min_leaf_rcond=min(rcs) if rcs else None, leaves=len(leaves), butterfly_depth=plan.depth,
            precision=precision or out_dtype.name, work_dtype=plan.work_dtype, gemm_steps=ops.gemms)
        report["flops"] = plan.flops + ops.flops
        path = ao.commit("inv", plan=plan.to_dict(), params={"precision": precision, "tol": tol, "seed": seed,
                                                              "refine": str(refine)},
                         report={k: report[k] for k in ("seconds", "residual", "residual_method", "backward_error",
                                                        "refine_steps", "cond_estimate", "peak_memory")})
        return Matrix(path, report=report, temporary=out is None)


# -- steps ------------------------------------------------------------------------------------------------


def _invert_stored(ops: _refine.BlockOps, M: Any, x_path: str, plan: InversePlan, out_dtype: np.dtype, seed: int,
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
    prp = plan_row_pass(n, n * M.dtype.itemsize, chunk_rows=plan.chunk, memory=job.cfg.memory,
                        strip_extra_row_bytes=n * (8 * 3 + wdt.itemsize), workers=job.workers(1), cores=job.cores(),
                        max_strip=max(plan.chunk, 4 * plan.chunk))
    if prp.strip % plan.chunk and prp.strip < n:  # a strip must own whole chunk rows of W
        prp = plan_row_pass(n, n * M.dtype.itemsize, chunk_rows=plan.chunk, memory=10 * plan.strip_memory,
                            workers=1, cores=job.cores(), max_strip=plan.chunk)
    spec = RowPassSpec(inputs=(M.path,), names=("a",), kernel=mix_kernel, init=mix_init,
                       params=Params(butterfly=bf, dtype=wdt.name, shift=shift, transpose=transpose,
                                     probe_seed=probe_seed, probe_k=_refine.PROBES), plan=prp, device="cpu", device_memory=None,
                       check_finite=job.check_finite, outputs=(("w", w_path),),
                       blas_threads=job.task_blas_threads(prp.blas_threads))
    states = run_row_pass(job, spec, description="stage and randomize")
    norm = math.sqrt(sum(s["sumsq"] for s in states))
    if with_probe:
        return norm, sum(s["xp"] for s in states if "xp" in s)
    return norm


def _leaf(ops: _refine.BlockOps, src: str, dst: str, off: int, size: int, wdt: np.dtype) -> dict:
    job = ops.job
    spec = LeafSpec(src=src, dst=dst, off=off, size=size, dtype=wdt.name, blas_threads=job.task_blas_threads(job.cores()))
    graph = ops._graph("leaf", spec)
    graph.add((0,), leaf_inverse_task, spec)
    (res,) = job.run(graph, workers=1, blas_threads=job.cores(), description=f"leaf {off}:{off + size}")
    return res


def _invert(ops: _refine.BlockOps, plan: InversePlan, w: str, off: int, size: int, wdt: np.dtype,
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


def _unmix(ops: _refine.BlockOps, w: str, x: str, bf: Butterfly, out_dtype: np.dtype, plan: InversePlan,
           seed: int, transpose: bool = False) -> tuple[float, np.ndarray]:
    """``X = V Y`` column strip by column strip; returns ``||X||_F`` and ``X P``."""
    job = ops.job
    spec = UnmixSpec(src=w, dst=x, butterfly=bf, dtype=out_dtype.name, probe_seed=seed, probe_k=_refine.PROBES,
                     blas_threads=job.task_blas_threads(1), transpose=transpose)
    graph = ops._graph("unmix", spec)
    for s, (c0, c1) in enumerate(column_strips(plan.n, plan.column_width)):
        graph.add((s,), unmix_columns_task, spec, c0, c1)
    workers = max(1, min(job.workers(1), job.cfg.memory // max(1, plan.column_memory)))
    results = job.run(graph, workers=workers, description="undo the butterfly")
    job.stats["passes"] = job.stats.get("passes", 0) + 1
    xp = np.zeros((plan.n, _refine.PROBES))
    total = 0.0
    for r in results:
        xp += r["probe"]
        total += r["sumsq"]
    return math.sqrt(total), xp


__all__ = ["inv"]
