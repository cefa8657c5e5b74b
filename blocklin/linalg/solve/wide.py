"""The wide route of a Tikhonov solve (``m < n``): the dual form ``x = A^T (A A^T + lam^2 I)^{-1} b``.

``A A^T`` (``m x m``, in memory) from one SYRK pass over column strips of ``A`` or an out-of-core
GEMM, its eigen-decomposition for every lambda, and ``x = A^T y`` by another GEMM; ``fit_intercept``
centers ``A A^T`` on both sides (by the weighted means with ``sample_weight``, whose ``sqrt(w)`` then
scales it on both sides), and ``lam="loo"`` chooses from the same eigen-decomposition in memory
(:mod:`blocklin.linalg.solve.loo`).
"""

from __future__ import annotations

import math

import numpy as np

from blocklin.errors import NonFiniteError
from blocklin.errors import explain as _msg
from blocklin.linalg.blocks.scaling import incore_exponent
from blocklin.linalg.products.gemm import Gemm
from blocklin.linalg.solve.spectrum import coefficients, spectrum_from_gram
from blocklin.linalg.solve.tikhonov import TikhonovRun, unscaled_x
from blocklin.matrix import Matrix
from blocklin.runtime.passes import run_pass, source
from blocklin.storage.zarr_store import create_array, open_zarr


def _wide_gram(ctx: TikhonovRun) -> dict:
    """``A' A'^T`` (``m x m``, in memory) of ``A' = 2^-ea A``: one SYRK pass over column strips of ``A``
    that divides them by the power of two their largest entry asks for (:mod:`blocklin.linalg.blocks.scaling`),
    or, where that pass's ``m x m`` sums do not fit the budget, an out-of-core GEMM (unscaled)."""
    from blocklin.errors import BudgetError
    from blocklin.linalg.products.gram_kernels import gram_pass_kernel, sum_gram_states

    job = ctx.job
    src = source(ctx.A, transposed=True)
    params = {"dtype": "float64", "gpu": job.device == "gpu"}
    try:
        g = ctx.sa.run(job, lambda sc: sum_gram_states(run_pass(
            job, gram_pass_kernel, [src], params, scale=sc, min_tasks=1, workers=1,
            description="Gram matrix A A^T (SYRK)").states))
        return {"g": g, "ea": ctx.sa.exponent}
    except BudgetError:
        pass
    return {"g": _wide_gram_gemm(ctx), "ea": 0}


def _wide_gram_gemm(ctx: TikhonovRun) -> np.ndarray:
    """``A A^T`` (``m x m``, in memory) by an out-of-core GEMM into a scratch store."""
    job = ctx.job
    gram = Gemm.of(ctx.A, ctx.A, trans_b=True, dtype="float64")
    plan = gram.plan(job, read_reserve=True)  # measured over budget at 16 MiB without it
    g_path = job.scratch("gram", gram.shape, np.float64, plan.out_chunks)
    gram.run(job, plan, g_path, description="Gram matrix A A^T", count_pass="a")
    return open_zarr(g_path)[...]


def solve_wide(ctx: TikhonovRun, x_path: str) -> dict:
    """Dual form: ``A A^T`` by an out-of-core GEMM, eigen-decomposition, ``x = A^T y`` by another.

    Both GEMMs run in the solve's own job (each counted as a pass over ``A``).
    """
    job = ctx.job
    ctx.phases.update({"gram GEMM": job.device, "solution GEMM": job.device})
    rec = ctx.saved.run("wide-gram", lambda: _wide_gram(ctx))
    g, ea = rec["g"], int(rec.get("ea", 0))
    bm = Matrix(ctx.B.path)[...].astype(np.float64)  # m x k, small (m is the short side)
    if ctx.weighted:
        ctx.wvec = Matrix(ctx.W.path)[...].astype(np.float64)[:, 0]
    if job.check_finite and not np.all(np.isfinite(bm)):
        raise NonFiniteError(_msg("b", "must be finite (check_finite is on)", "NaN or Inf",
                                  "clean the input, or pass check_finite=False"))
    # the scaled problem: A' = 2^-ea A, b' = 2^-eb b, lam' = 2^-ea lam; y' = (A' A'^T + lam'^2 I)^-1 b'
    # and x = 2^(eb - 2 ea) A^T y': the GEMM takes A^T (2^(eb - ea) y') (sums of the size of b) times 2^-ea
    eb, amax_b = incore_exponent(bm)
    ctx.sa.e, ctx.sb.e, ctx.sb.amax = ea, eb, amax_b
    bm = np.ldexp(bm, -eb)
    ctx.adopt({})
    g_raw = g
    # sample weights w (S = sum w; w = 1, S = m without): the problem of D P_w A and D P_w b with
    # D = diag(sqrt(w)) and, with an intercept, P_w = I - 1 w^T / S (the weighted centering)
    w = ctx.wvec if ctx.weighted else np.ones(ctx.m)
    S = ctx.total_weight
    if ctx.intercept:  # P_w (A A^T) P_w^T and P_w b: no means of A needed
        bbar = w @ bm / S
        bm = bm - bbar
        g = g - (w @ g)[None, :] / S
        g = g - (g @ w)[:, None] / S
        g = (g + g.T) / 2
    if ctx.weighted:
        sw = np.sqrt(w)
        g = sw[:, None] * g * sw[None, :]
        bm = sw[:, None] * bm
    spec = spectrum_from_gram(g, bm, np.einsum("ij,ij->j", bm, bm), ctx.rows_in_problem, dual=True, n=ctx.n)
    info = {"method": "normal", "method_reason": "wide a: dual form x = A^T (A A^T + lam^2 I)^-1 b",
            "norm_a": math.sqrt(max(float(np.trace(g)), 0.0))}
    out_dtype = np.result_type(ctx.A.dtype, ctx.B.dtype)
    ys = coefficients(ctx, spec, info, "row")
    if ctx.weighted:  # x = (D P_w A)^T y = A^T P_w^T (D y)
        ys = [sw[:, None] * y for y in ys]
    if ctx.intercept:
        # x = A^T (P_w^T y); the intercept bbar - mu^T x with mu^T x = w^T (A A^T) (P_w^T y) / S
        ys = [y - np.outer(w, y.sum(axis=0)) / S for y in ys]
        icpt = [bbar - (w @ g_raw) @ y / S for y in ys]
        info["intercept"] = [i.tolist() for i in icpt] if len(icpt) > 1 else icpt[0].tolist()
    Y = job.operand(unscaled_x(np.hstack(ys), eb - ea, out_dtype).astype(out_dtype), "y")
    product = Gemm.of(ctx.A, Y, trans_a=True, dtype=out_dtype, alpha=float(np.ldexp(1.0, -ea)))
    plan = product.plan(job, read_reserve=True)  # measured over budget at 16 MiB without it
    create_array(x_path, shape=product.shape, dtype=out_dtype, chunks=plan.out_chunks, codec=job.cfg.codec)
    product.run(job, plan, x_path, description="x = A^T y", count_pass="a")
    return info


__all__ = ["solve_wide"]
