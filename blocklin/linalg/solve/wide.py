"""The wide route of a Tikhonov solve (``m < n``): the dual form ``x = A^T (A A^T + lam^2 I)^{-1} b``.

``A A^T`` (``m x m``, in memory) from one SYRK pass over column strips of ``A`` or an out-of-core
GEMM, its eigen-decomposition for every lambda, and ``x = A^T y`` by another GEMM (with ``fit_intercept``
a pass of the columns less their first entries, :func:`_shifted_product`); ``fit_intercept``
centers ``A A^T`` on both sides (by the weighted means with ``sample_weight``, whose ``sqrt(w)`` then
scales it on both sides), and ``lam="loo"`` chooses from the same eigen-decomposition in memory
(:mod:`blocklin.linalg.solve.loo`). ``method="qr"`` takes ``A A^H = R^H R`` from the TSQR of ``A^T`` instead, and
``method="auto"`` switches to it where the dual form's error bound is far above its own
(:mod:`blocklin.linalg.solve.wide_auto`).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from blocklin.errors import BudgetError, NonFiniteError, SingularMatrixError
from blocklin.errors import explain as _msg
from blocklin.linalg.blocks.result_range import ColumnRange, check_columns, refuse_flushed_rhs, scaled_columns
from blocklin.linalg.blocks.scaling import column_exponents_for, incore_exponent, refuse_nonfinite
from blocklin.linalg.products.gemm import Gemm
from blocklin.linalg.solve.spectrum import coefficients, spectrum_from_gram, without_direction
from blocklin.linalg.solve.tikhonov import TikhonovRun, dots, unscaled_x, warn_intercept
from blocklin.linalg.solve.wide_auto import may_switch_to_qr
from blocklin.runtime.powers import ldexp
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
    # an intercept: A_s A_s^H of A_s = A - 1 a_1^T (the columns less their first entries), which the centering
    # P A_s A_s^H P^H = P A A^H P^H does not tell apart, and v = conj(A_s) a_1 for the intercept
    shift = bool(ctx.intercept)
    params = {"dtype": ctx.cdtype, "gpu": job.device == "gpu"} | ({"shift_first": True} if shift else {})

    def run(sc: dict) -> dict:
        states = run_pass(job, gram_pass_kernel, [src], params, scale=sc, min_tasks=1, workers=1,
                          description="Gram matrix A A^T (SYRK)" + (" of the columns less their first entries"
                                                                     if shift else "")).states
        states = [st for st in states if st is not None]
        v = sum(st["v"] for st in states) if shift else None
        return {"g": sum_gram_states(states)} | ({"v": v} if shift else {})

    try:
        out = ctx.sa.run(job, run)
        g = out["g"]
        # complex data: the pass's X^H X of X = A^T is conj(A A^H)
        return {"g": g.conj() if np.iscomplexobj(g) else g, "ea": ctx.sa.exponent} | \
            ({"v": out["v"]} if "v" in out else {})
    except BudgetError as err:
        if ctx.cdtype != "float64":
            raise _complex_gemm_refusal(ctx) from None
        over = err
    rec = _wide_gram_gemm(ctx) | {"ea": 0}
    _check_unscaled_gram(ctx, rec["g"], over)
    return rec


def _check_unscaled_gram(ctx: TikhonovRun, g: np.ndarray, over: BudgetError) -> None:
    """Refuse the GEMM fallback's ``A A^T``, formed of ``A`` as read (the SYRK pass over the budget scales it by
    a power of two, the GEMM does not), where ``A`` is beyond the range squared without loss: ``max |a|`` below
    ``2^-485`` (squares ``eps`` below its square subnormal) or its squares' ``n``-sums beyond float64, where it is
    known (the writer's recorded peaks), else the largest row's square norm (``max diag A A^T``, within ``[max |a|^2, n max |a|^2]``) below ``2^-970``,
    where the squares ``eps`` below it are subnormal, or not finite. Data near ``2^-600`` had made the Gram
    0 and ``x = 0`` without a word (a randomized search)."""
    amax = ctx.job.amax.get(ctx.sa.path)
    # NaN or Inf in A (check_finite=False) named as such, not as a budget: an amax of NaN or Inf, or a NaN
    # diagonal (sums of squares: NaN only from a NaN entry; an Inf one may be finite data's overflow)
    refuse_nonfinite(amax, "a least-squares or ridge solve", "a")
    if g.size and np.isnan(np.diagonal(g)).any():
        refuse_nonfinite(float("nan"), "a least-squares or ridge solve", "a")
    if amax is not None and math.isfinite(amax):  # its squares eps below max |a|^2 normal, their n-sums finite
        bad = amax > 0 and not 2.0 ** -485 <= amax < 2.0 ** 511 / math.sqrt(max(ctx.n, 1))
        what = f"max |a| = {amax:.3g}, outside 2^-485..2^511 / sqrt(n)"
    else:
        d = float(np.max(np.diagonal(g))) if g.size else 0.0
        bad = not (d >= 2.0 ** -970 and math.isfinite(d))
        what = f"the largest row's square norm {d:.3g}, below 2^-970 or beyond the range"
    if bad:
        raise BudgetError(_msg(
            "memory", "must hold the m x m sums of A A^T's SYRK pass for data beyond the range squared without "
            "loss (that pass scales A by a power of two; the out-of-core GEMM that stands in for it over the budget "
            "does not, and its squares underflow or overflow)", what,
            f"raise memory= (the SYRK pass: {over}), or scale a by a power of two near 1 / max |a| (exact) and "
            "lam with it"), minimum=over.minimum)


def _complex_gemm_refusal(ctx: TikhonovRun) -> Exception:
    """The wide route's ``m x m`` SYRK sums of complex data over the budget: its out-of-core GEMM fallback
    forms ``A A^T``, not ``A A^H``."""
    from blocklin.config import format_size
    from blocklin.errors import BudgetError

    need = 2 * 16 * ctx.m * ctx.m
    return BudgetError(_msg("memory", "must hold the m x m complex128 sums of A A^H (the SYRK pass of a wide "
                            "complex a; its out-of-core GEMM fallback is for real data)",
                            f"{ctx.m} x {ctx.m} over memory={format_size(ctx.job.cfg.memory)}",
                            f"raise memory= to at least {format_size(2 * need)}"), minimum=2 * need)


def _wide_gram_gemm(ctx: TikhonovRun) -> dict:
    """``{"g": A A^T}`` (``m x m``, in memory) by an out-of-core GEMM into a scratch store; with an intercept
    ``{"g": A_s A_s^T, "v": A_s a_1}`` of ``A_s = A - 1 a_1^T``, as the SYRK pass sums them.

    The intercept's GEMM reads its panels less the k-range of ``a_1`` (row 0 of ``A``, copied to a scratch
    row; :attr:`~blocklin.runtime.tiles.GemmSpec.shift`), op(B)'s column 0 excepted: that column is then
    ``A_s a_1`` and ``A_s A_s^T``'s own is zero (``A_s``'s row 0 is). The uncentered ``A A^T`` had rounded
    relative to the column means: ``c^2 eps`` lost for means ``c`` times the spread (``c = 1e6``: ``x`` 1e-3
    off, warned); no copy of ``A`` is written."""
    import dataclasses

    from blocklin.linalg.solve.shifted_gram import row_store

    job = ctx.job
    gram = Gemm.of(ctx.A, ctx.A, trans_b=True, dtype="float64")
    if ctx.intercept:
        gram = dataclasses.replace(gram, shift=row_store(ctx, 0))
    plan = gram.plan(job, read_reserve=True)  # measured over budget at 16 MiB without it
    g_path = job.scratch("gram", gram.shape, np.float64, plan.out_chunks)
    gram.run(job, plan, g_path, description="Gram matrix A A^T" + (" of the columns less their first entries"
                                                                    if ctx.intercept else ""), count_pass="a")
    g = open_zarr(g_path)[...]
    if not ctx.intercept:
        return {"g": g}
    v = g[:, 0].copy()
    g[:, 0] = 0.0
    return {"g": g, "v": v}


def solve_wide(ctx: TikhonovRun, x_path: str, qr_reason: str | None = None) -> dict:
    """Dual form: ``A A^T`` by an out-of-core GEMM, eigen-decomposition, ``x = A^T y`` by another.

    Both GEMMs run in the solve's own job (each counted as a pass over ``A``). ``method="qr"``, or ``qr_reason``
    (why ``method="auto"`` switched, :mod:`~blocklin.linalg.solve.wide_auto`): ``A A^H = R^H R`` from the TSQR of
    ``A^T`` instead.
    """
    job = ctx.job
    ctx.phases["solution GEMM"] = job.device
    r = None
    if ctx.method == "qr" or qr_reason:  # A A^H = R^H R from the TSQR of A^T (qr_route.wide_qr_factor), never formed
        from blocklin.linalg.solve.qr_route import cut_centering_noise, dual_spectrum, wide_qr_factor

        r, ea, c_first = wide_qr_factor(ctx)  # with an intercept: the columns less their first entries
        g = v_shift = None
    else:
        ctx.phases["gram GEMM"] = job.device
        rec = ctx.saved.run("wide-gram", lambda: _wide_gram(ctx))
        g, ea = rec["g"], int(rec.get("ea", 0))
        v_shift = rec.get("v")  # conj(A_s) a_1 where the pass summed the shifted columns (None: A A^T itself)
    bm = Matrix(ctx.B.path)[...].astype(ctx.cdtype)  # m x k, small (m is the short side)
    if ctx.weighted:
        ctx.wvec = Matrix(ctx.W.path)[...].astype(np.float64)[:, 0]
    if job.check_finite and not np.all(np.isfinite(bm)):
        raise NonFiniteError(_msg("b", "must be finite (check_finite is on)", "NaN or Inf",
                                  "clean the input, or pass check_finite=False"))
    if not job.check_finite:  # a NaN or Inf of the data in A A^T (R) or b, refused by name as the tall route's
        # sums are (TikhonovRun.adopt): it had reached NumPy's eigensolver or SVD ("Eigenvalues did not converge")
        for value, name in ((g, "a"), (v_shift, "a"), (r, "a"), (bm, "b")):
            if value is not None and np.size(value):
                refuse_nonfinite(float(np.max(np.abs(value))), "a least-squares or ridge solve", name)
    # the scaled problem: A' = 2^-ea A, b' = 2^-eb b, lam' = 2^-ea lam; y' = (A' A'^T + lam'^2 I)^-1 b'
    # and x = 2^(eb - 2 ea) A^T y': the GEMM takes A^T (2^(eb - ea) y') (sums of the size of b) times 2^-ea
    eb, amax_b = incore_exponent(bm.view(np.float64) if np.iscomplexobj(bm) else bm)  # complex: both parts
    ctx.sa.e, ctx.sb.e, ctx.sb.amax = ea, eb, amax_b
    peaks = _column_peaks(bm)
    if ctx.sb.per_column:  # each column of x its own problem: columns far apart each by their own power
        ctx.sb.columns = column_exponents_for(peaks, eb, bm.dtype)
    if ctx.sb.columns is None:
        refuse_flushed_rhs(peaks, eb, bm.dtype)
    eb = ctx.sb.column_exponents  # one power, or one per column (Scaling.per_column)
    bm = ldexp(bm, -eb)
    ctx.adopt({})
    g_raw = g
    # sample weights w (S = sum w; w = 1, S = m without): the problem of D P_w A and D P_w b with
    # D = diag(sqrt(w)) and, with an intercept, P_w = I - 1 w^T / S (the weighted centering)
    w = ctx.wvec if ctx.weighted else np.ones(ctx.m)
    S = ctx.total_weight
    if ctx.folds is not None:  # cv=: the folds' fits from A A^T (kfold.wide_choose)
        ctx.dual_sums = (g, bm.copy(), w)
    if ctx.intercept:  # P_w (A A^T) P_w^T and P_w b: no means of A needed
        bbar = w @ bm / S
        bm = bm - bbar
    if ctx.intercept and r is not None:  # P_w R^H R P_w^H = (R P_w^H)^H (R P_w^H), R P_w^H = R - (R 1) w^T / S
        rc = r - np.outer(r.sum(axis=1), w) / S
    elif ctx.intercept:
        g = g - (w @ g)[None, :] / S
        g = g - (g @ w)[:, None] / S
        g = (g + g.conj().T) / 2
    if ctx.weighted:
        sw = np.sqrt(w)
        g = sw[:, None] * g * sw[None, :]
        bm = sw[:, None] * bm
    if r is not None:  # y = V diag(1/(s^2 + lam^2)) V^H b of R = U S V^H
        spec = dual_spectrum(rc if ctx.intercept else r, bm, ctx.rows_in_problem, ctx.n)
        if ctx.intercept:  # the kernel of the rows less row 0, R'^H R' (rounds relative to its rows): loo._dual
            ctx.dual_kernel = (r.conj().T @ r, bm)
        if ctx.intercept:  # the centering's rounding, relative to the uncentered R (qr_route: constant columns)
            cut_centering_noise(spec, float(np.linalg.norm(r)), ctx.m, ctx.n, exclude=np.sqrt(w) / math.sqrt(S))
        info = {"method": "qr", "method_reason": (qr_reason or "requested") + " (wide a: the SVD of the streaming R factor of A^T"
                + (" centered on the right" if ctx.intercept else "") + ", A A^H = R^H R never formed; x = A^H y)",
                "norm_a": float(np.linalg.norm(spec.s))}
    else:
        spec = spectrum_from_gram(g, bm, dots(bm, bm), ctx.rows_in_problem, dual=True, n=ctx.n)
        # rows far apart: leave-one-out's solves again from them (loo._dual); with an intercept the kernel of the
        # rows less a row, unweighted (the bordered system, bordered_kernel), and the weighted centered b
        ctx.dual_kernel = (g_raw, bm) if ctx.intercept else (g, bm)
        if ctx.intercept:  # the centering rounds relative to the shifted (or uncentered) A A^T (spectrum.accuracy)
            wmax = float(w.max()) if ctx.weighted else 1.0
            spec.ev_bound = ctx.m * np.finfo(np.float64).eps * wmax * float(np.abs(np.trace(g_raw)))
        info = {"method": "normal", "method_reason": "wide a: dual form x = A^T (A A^T + lam^2 I)^-1 b"
                if ctx.cdtype == "float64" else "wide a: dual form x = A^H (A A^H + lam^2 I)^-1 b",
                "norm_a": math.sqrt(max(float(np.trace(g).real), 0.0))}
    factor_spec = spec  # the R factor's own spectrum (the intercept's R y, below)
    out_dtype = np.result_type(ctx.A.dtype, ctx.B.dtype)
    held: list = []  # the spectrum's warnings, where the bordered solves may take every solution again
    bordered = ctx.intercept and r is None and ctx.cdtype == "float64"
    switchable = r is None and may_switch_to_qr(ctx)  # method="auto": the QR route may be worth its pass (wide_auto)
    if bordered or switchable:  # held: said later, or not at all where the QR route gives x
        import warnings

        try:
            with warnings.catch_warnings(record=True) as held:
                warnings.simplefilter("always")
                spec = _without_intercept_direction(ctx, spec, np.sqrt(w)) if ctx.intercept else spec
                ys = coefficients(ctx, spec, info, "row")
        except SingularMatrixError:  # lam = 0 beyond A A^T's resolution: the R factor may resolve it
            reason = _singular_switch(ctx, info) if switchable else None
            if not reason:
                _replay(held, superseded=False)
                raise
            ctx.dual_kernel = ctx.loo_choice = None
            return solve_wide(ctx, x_path, qr_reason=reason)
        except BaseException:  # what was said before a refusal or an interrupt is said still
            _replay(held, superseded=False)
            raise
        reason = _auto_switch(ctx, spec, info, (g, g_raw)) if switchable else None
        if reason:
            ctx.dual_kernel = ctx.loo_choice = None  # the dual spectrum's, which the QR route does not take
            return solve_wide(ctx, x_path, qr_reason=reason)
        if not bordered:
            _replay(held, superseded=False)
            held = []
    else:
        spec = _without_intercept_direction(ctx, spec, np.sqrt(w)) if ctx.intercept else spec
        ys = coefficients(ctx, spec, info, "row")
    if ctx.dual_kernel is not None and not ctx.intercept:  # rows far apart: the solves again from the row-scaled
        # kernel; with an intercept dual_kernel is the kernel of the rows less a row (the bordered system's,
        # _bordered_solves), which these solves must not take
        ys = _rows_apart_solves(ctx, spec, info, ys)
    if ctx.weighted:  # x = (D P_w A)^T y = A^T P_w^T (D y)
        ys = [sw[:, None] * y for y in ys]
    if ctx.intercept:
        # x = A^T (P_w^T y); the intercept bbar - mu^T x with mu^T x = w^T (A A^T) (P_w^T y) / S, or from the
        # shifted sums (x = A_s^H y', 1^T y' = 0; mu = a_1 + A_s^T w / S) a_1^T x + w^T (A_s A_s^H) y' / S, with
        # a_1^T x = (conj(A_s) a_1)^T y' = v^T y' (real data: no conjugates)
        ys = [y - np.outer(w, y.sum(axis=0)) / S for y in ys]
        shift = 0  # the row x = A_s^H y is summed less (the kernel's; row 0 unless _bordered_solves moved it)
        if r is None:
            icpt = [bbar - (w @ g_raw) @ y / S - (v_shift @ y if v_shift is not None else 0.0) for y in ys]
            redone, shift = _bordered_solves(ctx, spec, info, ys, icpt, (g, g_raw, v_shift), bm, w, bbar)
            # its terms, each a part of mu^T x, take y's relative error (that of x): rows 2^600 apart gave x right
            # to 1e-16 and an intercept 7e10 times off, without a word (the row-scaled solves: their own bound)
            wg = np.abs(w @ g_raw) / S + (np.abs(v_shift) if v_shift is not None else 0.0)
            _replay(held, superseded=redone)
            if not redone:
                warn_intercept(float(info.get("condition_estimate", 0.0)) * np.finfo(np.float64).eps,
                               np.hstack([wg @ np.abs(y) for y in ys]), np.hstack(icpt), "")
        else:
            # mu^T x = a_1^T x + (A_s^T w)^T x / S (A_s^T = Q R, x = A_s^H y' = conj(Q) R' y'): a_1^T x =
            # c^T (R' y') with c = Q^H a_1 and (A_s^T w)^T x = (R' w)^H (R' y'), R' y' = R_c y of the centered factor
            icpt = [bbar - ((r @ w).conj() / S + c_first) @ ry for ry in _factor_times_y(factor_spec, info["lam"], len(ys))]
            # |mu^T x| <= (||A_s^T w|| / S + ||c||) ||x|| (||A_s^T w|| = ||R' w||, ||R' y'|| = ||x||)
            xn = np.asarray(info.get("solution_norm", 0.0), dtype=np.float64)
            mu_norm = float(np.linalg.norm(r @ w)) / S + float(np.linalg.norm(c_first))
            warn_intercept(float(info.get("condition_estimate", 0.0)) * np.finfo(np.float64).eps,
                           mu_norm * np.broadcast_to(xn.reshape(-1), (np.size(np.hstack(icpt)),)),
                           np.hstack(icpt), "method='auto' (the Gram route) may do better")
        info["intercept"] = [i.tolist() for i in icpt] if len(icpt) > 1 else icpt[0].tolist()
    t, alpha = dual_exponents(np.hstack(ys), np.tile(eb, len(ys)) if np.ndim(eb) else eb, ea, out_dtype)
    # x = A^T y in float64 (complex128) whatever the data's dtype, rounded to it once: with an intercept the
    # uncentered A^T meets the centered y, whose sum 1^T y = 0 rounds to eps ||y||; times column means c times
    # the spread that is c eps relative, and float32's (means 1e8, spread 1: x 3.3 relative off, for 0 in the
    # constant columns) had left no digit, float64's about 1e-8 (docs/solve.md, Intercepts)
    work = np.result_type(out_dtype, np.float64)
    y = unscaled_x(np.hstack(ys), t, out_dtype).astype(work)
    if ctx.intercept:  # x = (A - 1 a_1^T)^H y (1^T y = 0): sums rounded relative to the spread, not the means
        # (less row t where the kernel was summed less it: row 0 far off)
        norm_as_sq, ax = _shifted_product(ctx, y, alpha, ea, out_dtype, x_path, shift)
        if shift:  # the intercept bbar + x0 - a_t^T x, a_t^T x of the scaled problem 2^(alpha - eb) a_t^T A_t^T y
            at_x = ldexp(np.asarray(ax, dtype=work), alpha - (np.tile(eb, len(ys)) if np.ndim(eb) else eb))
            icpt = [c - at_x[i * c.size:(i + 1) * c.size] for i, c in enumerate(icpt)]
            info["intercept"] = [i.tolist() for i in icpt] if len(icpt) > 1 else icpt[0].tolist()
        _product_rounding(ctx, info, np.hstack(ys), norm_as_sq)
        if job.check_finite:
            _check_finite_x(x_path, alpha)
        return info
    cplx = out_dtype.kind == "c"  # x = A^H y = conj(A^T conj(y)): the GEMM's A^T, conjugated on both sides
    Y = job.operand(y.conj() if cplx else y, "y")
    # 2^alpha is applied in the GEMM only where it is 1; else once, on the copy of the sums into x, where a column
    # flushed to 0 or beyond the range is refused (2^alpha itself had underflowed to 0 or overflowed)
    staged = cplx or work != out_dtype or bool(np.any(alpha != 0))
    product = Gemm.of(ctx.A, Y, trans_a=True, dtype=work, alpha=1.0)
    plan = product.plan(job, read_reserve=True)  # measured over budget at 16 MiB without it
    dst = job.scratch("wide x", product.shape, work, plan.out_chunks) if staged else x_path
    create_array(x_path, shape=product.shape, dtype=out_dtype, chunks=plan.out_chunks, codec=job.cfg.codec)
    product.run(job, plan, dst, description="x = A^H y" if cplx else "x = A^T y", count_pass="a")
    if staged:
        cols = _copy_into(dst, x_path, plan.out_chunks[0], conj=cplx, alpha=alpha)
        check_columns(cols, alpha, out_dtype, detail=f"x = 2^{_powers(alpha)} A^H y")
    if job.check_finite:  # inputs checked finite: a non-finite x is an overflow of the GEMM's sums
        _check_finite_x(x_path, alpha)
    return info


def _shifted_product(ctx: TikhonovRun, y: np.ndarray, alpha: int, ea: int, out_dtype: Any, x_path: str,
                     row: int = 0) -> tuple[float, np.ndarray]:
    """``x = 2^alpha (A - 1 a_t^T)^H y`` (``1^T y = 0``: the intercept's ``y = P_w^H y'``; ``t = row``, the row the
    kernel was summed less) written to ``x_path`` in ``out_dtype``, by one pass over column strips of ``A`` that
    subtracts each strip's column ``t`` (row ``t`` of ``A``) in a float64 (complex128) copy
    (:func:`~blocklin.linalg.solve.kernels.shifted_product_kernel`); returns ``||2^-ea A_s||_F^2`` of the shifted
    ``A_s`` from the same pass (:func:`_product_rounding`) and ``a_t^T (A_s^H y)`` per column of ``y`` (float64
    sums, before ``2^alpha``)."""
    from blocklin.linalg.solve.kernels import shifted_product_kernel
    from blocklin.runtime.passes import plan_kernel_pass

    job = ctx.job
    src = source(ctx.A, transposed=True)
    params = {"y": np.ascontiguousarray(y), "alpha": np.asarray(alpha, dtype=np.int64), "unit": float(np.ldexp(1.0, -ea)),
              "out": np.dtype(out_dtype).name, "row": int(row)}
    memory = job.cfg.memory
    if job.device == "gpu":  # as run_pass plans: the strips and the product live on the GPU too
        memory = min(memory, job.device_memory() or memory)
    plan = plan_kernel_pass(job, shifted_product_kernel, [src], params, memory=memory)
    create_array(x_path, shape=(ctx.n, y.shape[1]), dtype=out_dtype, chunks=(plan.strip, y.shape[1]),
                 codec=job.cfg.codec)
    states = run_pass(job, shifted_product_kernel, [src], params, plan=plan, outputs=(("x", x_path),), peaks=False,
                      description="x = A^H y of the columns less their " + (f"entry {row}" if row else
                                                                             "first entries")).states
    states = [st for st in states if st is not None]
    cols = ColumnRange(y.shape[1])
    for st in states:
        if "cols" in st:
            cols.merge(st["cols"])
    check_columns(cols, alpha, out_dtype, detail=f"x = 2^{_powers(alpha)} A_s^H y")
    return float(sum(st["aa"] for st in states)), sum((st["ax"] for st in states), np.zeros(y.shape[1], y.dtype))


def _product_rounding(ctx: TikhonovRun, info: dict, z: np.ndarray, norm_as_sq: float) -> None:
    """``report["condition_estimate"]`` with the rounding of ``x = A_s^H z`` (``z = P_w^H y``, ``1^T z = 0``,
    ``A_s = A - 1 a_1^T``; :func:`_shifted_product`): at most ``gamma_(m+1) |A_s|^T |z|`` (Higham 2002, 3.5; the
    shift's own rounding one more ``eps`` per entry), ``(m + 1) eps ||A_s||_F ||z||`` against ``||x||``. ``A_s^H z``
    equals ``A^H z`` for ``z`` exact and takes ``z``'s rounding (``1^T z`` of about ``eps ||z||``) times ``A_s``, not
    times the column means: the product of the uncentered ``A`` had been about ``c eps`` relative for column means
    ``c`` times their spread (means ``1e6``, spread ``1e-9``: ``x`` 15-30% off; scikit-learn, which centers ``A``
    itself, 1e-15), now about ``m eps`` for a typical first row. Where the sum reaches 1 an
    :class:`~blocklin.errors.IllConditionedWarning` says so. ``norm_as_sq`` is ``||A_s'||_F^2`` of the scaled
    ``A_s' = 2^-ea A_s``, ``||x||`` ``info["solution_norm"]`` (the spectrum's, of the scaled problem)."""
    from blocklin.errors import IllConditionedWarning, warn

    eps = float(np.finfo(np.float64).eps)
    xn = np.ravel(np.asarray(info.get("solution_norm", []), dtype=np.float64))
    zn = np.linalg.norm(z, axis=0)
    if xn.size != zn.size or not np.isfinite(norm_as_sq):
        return
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        amp = np.where(zn > 0, (ctx.m + 1) * math.sqrt(max(norm_as_sq, 0.0)) * zn / xn, 0.0)
    worst = float(np.max(amp, initial=0.0))
    before = float(info.get("condition_estimate", 0.0))
    info["condition_estimate"] = before + worst
    if (before + worst) * eps >= 1 > before * eps:
        warn(f"solve: x may have no correct digit: x = (A - 1 a_1^T)^T y, whose rounding (m eps ||A - 1 a_1^T||_F "
             f"||y|| = {worst * eps:.1e} of ||x||; report['condition_estimate'] = {before + worst:.3g} times eps) "
             "is larger than x: a's rows differ from its first row by far more than x's size accounts for "
             "(rescale a's columns, or lower lam)", IllConditionedWarning)


def _factor_times_y(spec: Any, lam: Any, count: int) -> list[np.ndarray]:
    """``R_c y`` of the centered R factor ``R_c = U S V^H`` (no weights: ``method="qr"`` takes none), per
    solution of :func:`coefficients` (``lam`` as ``info["lam"]``: a number, one per solution, or one per
    right-hand side), as ``U diag(s / (s^2 + lam^2)) beta`` over the resolved directions: ``R @ y`` multiplied
    the rounding of ``y = V diag(1 / (s^2 + lam^2)) beta``, of size ``eps ||R|| ||b|| / s_min^2``, by ``||R||``,
    and the intercept ``bbar - (R 1)^H (R y) / m`` had been ``5824`` for ``4.67`` (columns ``2^30`` apart,
    ``lam = 0``); this way its error is that of ``x``, about ``eps kappa``."""
    from blocklin.linalg.solve.spectrum import filters

    keep = spec.resolved() & (spec.s > 0)
    u, s, beta = spec.left[:, keep], spec.s[keep], spec.beta[keep]
    lams = lam if isinstance(lam, list) else [lam]
    if count == 1 and len(lams) > 1:  # one lambda per right-hand side (leave-one-out per target)
        return [np.column_stack([u @ (filters(s, l)[0] * beta[:, j]) for j, l in enumerate(lams)])]
    return [u @ (filters(s, l)[0][:, None] * beta) for l in lams]


def _auto_switch(ctx: TikhonovRun, spec: Any, info: dict, kernels: tuple) -> str | None:
    """Why ``method="auto"`` takes the QR route for this wide solve, or None (the dual form's ``x``): where the dual
    form's first-order error bound at the lambdas solved (``info["lam"]``, chosen or given) is
    :data:`~blocklin.linalg.solve.wide_auto.AUTO_DUAL_MARGIN` times the QR route's or more
    (:func:`~blocklin.linalg.solve.wide_auto.qr_gain`), and the TSQR pass fits the budget; where it does not, the
    dual form is kept and an :class:`~blocklin.errors.IllConditionedWarning` gives the bound. ``kernels``: the
    (centered) ``A A^T`` and, with an intercept, that of the rows less the first (the row-scaled solves')."""
    from blocklin.config import format_size
    from blocklin.errors import IllConditionedWarning, warn
    from blocklin.linalg.solve.least_squares_budget import wide_qr_refusal
    from blocklin.linalg.solve.spectrum import per_target
    from blocklin.linalg.solve.wide_auto import AUTO_DUAL_MARGIN, qr_gain

    lams = [float(v) for v in np.atleast_1d(np.asarray(info.get("lam", ctx.lams), dtype=np.float64))]
    # the row-scaled solves' kernels where the route makes them (the bordered ones of real data only)
    rescaled = ctx.cdtype == "float64" or not ctx.intercept
    gain, lam = qr_gain(spec, lams, per_target(ctx, lams), kernels if rescaled else None, bool(ctx.intercept))
    if not gain >= AUTO_DUAL_MARGIN:
        return None
    ea = ctx.sa.exponent if ctx.sa is not None else 0
    at = f"lam = {float(np.ldexp(lam, ea)):.3g}" + (" (the choice on A A^T's spectrum; the R factor's spectrum chooses "
                                                  "again)" if ctx.kind in ("gcv", "lcurve", "loo") else "")
    refusal = wide_qr_refusal(ctx.job, ctx.A, intercept=bool(ctx.intercept), cplx=ctx.cdtype != "float64")
    if refusal is not None:
        need = f"raise memory= to at least {format_size(refusal.minimum)}" if refusal.minimum else "raise memory="
        warn(f"solve: wide a at {at}: the dual form's first-order error bound is {gain:.3g} times the QR route's "
             f"(report['condition_estimate'] = {float(info.get('condition_estimate', 0.0)):.3g} times eps), but "
             f"the TSQR pass of A^T that route needs does not fit memory={format_size(ctx.job.cfg.memory)}: kept the "
             f"dual form; {need}, or pass a larger lam", IllConditionedWarning)
        return None
    return (f"switched to the QR route at {at}: the dual form's first-order error bound (eps ||A||^2 / lam^2 at "
            f"worst) is {gain:.3g} times that of the R factor of A^T, backward stable for [A; lam I] "
            f"(>= {AUTO_DUAL_MARGIN:.0e}); one more pass")


def _singular_switch(ctx: TikhonovRun, info: dict) -> str | None:
    """Why ``method="auto"`` takes the QR route where the dual form refused ``lam = 0`` as rank-deficient,
    or None where the TSQR pass does not fit (the refusal stands). ``A A^T`` resolves singular values to about
    ``sqrt(eps) ||A||``, the R factor of ``A^T`` to ``eps ||A||``: singular values ``||A||`` to ``1e-10 ||A||``
    (9 x 16) were refused, the QR route's minimum-norm ``x`` is ``5e-7`` from it (its bound ``3 d kappa(A)``).
    Where the R factor does not resolve them either, that route refuses as the dual form did. The refusal to keep
    the dual form at a ``lam`` whose ``s^2 + lam^2`` leaves float64 (``_check_dual_range``) is not taken: the R
    factor's dual spectrum meets the same range (tests/solve/test_solve.py)."""
    from blocklin.linalg.solve.least_squares_budget import wide_qr_refusal

    if wide_qr_refusal(ctx.job, ctx.A, intercept=bool(ctx.intercept), cplx=ctx.cdtype != "float64") is not None:
        return None
    return ("switched to the QR route at lam = 0: A A^T's spectrum does not resolve a's smallest singular values "
            f"(condition estimate {float(info.get('cond_estimate', float('inf'))):.3g}); the R factor of A^T "
            "resolves them to eps ||A||; one more pass")


def _rows_apart_solves(ctx: TikhonovRun, spec: Any, info: dict, ys: list[np.ndarray]) -> list[np.ndarray]:
    """The dual ``y = (K + lam^2 I)^-1 b`` (no intercept; ``K`` and ``b`` weighted by ``sqrt(w)``) taken again
    from the row-scaled kernel ``D^-1 (K + lam^2 I) D^-1`` by Cholesky where the eigen-decomposition's solve is
    norm-wise and the rows far apart (:func:`~blocklin.linalg.solve.scaled_kernel.refit`, the test the k-fold and
    leave-one-out routes make from the spectrum and ``diag(K)`` they hold: no pass, no work for well-scaled rows).
    ``K = A A^T`` rounds relative to its rows; rows ``1e5`` and ``5e-4`` apart gave ``x`` ``9e-7`` off at
    ``lam^2 = 1e-8`` and ``1e-2`` without a word (the row-scaled condition about 1e3), now about ``1e-14``.
    ``ys`` per solution of :func:`coefficients`; ``info["lam"]`` the lambdas of the scaled problem (one per
    right-hand side where each column has its own). Kept where the scaled matrix is not numerically positive
    definite (a direction the data do not determine)."""
    from blocklin.linalg.solve import scaled_kernel

    kernel, rhs = ctx.dual_kernel
    lam = info.get("lam")
    lams = np.atleast_1d(np.asarray(lam, dtype=np.float64))
    ev = np.clip(np.asarray(spec.s, dtype=np.float64) ** 2, 0.0, None)
    noise = kernel.shape[0] * np.finfo(np.float64).eps * float(ev.max(initial=0.0))
    cut = np.any(ev[:, None] + lams[None, :] ** 2 <= noise, axis=0)  # directions under the eigensolver's rounding
    redo = scaled_kernel.refit(kernel, ev, lams, cut)
    if not redo.any():
        return ys
    per_column = len(ys) == 1 and lams.size > 1  # column j at its own lambda
    out = [y.copy() for y in ys]
    for l in np.flatnonzero(redo):
        factor = scaled_kernel.scaled_factor(kernel, float(lams[l]) ** 2)
        if factor is None:
            continue
        if per_column:
            out[0][:, l] = scaled_kernel.scaled_solve(factor, rhs[:, l:l + 1])[:, 0]
        else:
            out[l] = scaled_kernel.scaled_solve(factor, rhs)
    return out


def _bordered_solves(ctx: TikhonovRun, spec: Any, info: dict, ys: list[np.ndarray], icpt: list[np.ndarray],
                     kernels: tuple, bc: np.ndarray, w: np.ndarray, bbar: np.ndarray) -> tuple[bool, int]:
    """With an intercept, rows far apart: ``z`` (``x = A^T z``, ``1^T z = 0``) and the intercept taken again, in
    place in ``ys`` and ``icpt``, from the bordered dual problem ``[[K + lam^2 I, u], [u^T, 0]] [y; x0] = [D b_c; 0]``
    (``K = D A_t A_t^T D`` of the rows less a row ``t``, ``u = sqrt(w)``, ``D = diag(u)``, ``z = D y``) on the
    row-scaled kernel (:func:`~blocklin.linalg.solve.bordered_kernel.bordered_fit`, as the k-fold fits and the
    leave-one-out), where the k-fold's test (:func:`~blocklin.linalg.solve.scaled_kernel.refit` of the centered
    kernel and the spectrum in memory) asks, or where row 0 lies far from the others
    (:func:`~blocklin.linalg.solve.shifted_gram.less_typical_row`: the kernel summed again less a typical row ``t``,
    one more pass, or the one the lambda's choice took). The intercept of the rows given is
    ``bbar + x0 - a_t^T x``: for ``t = 0`` ``a_1^T x = v^T z`` (``v = A_s a_1`` of the pass), else from the
    product's pass less the same row (the caller). Rows ``1e5`` and ``5e-4`` apart: the large row in the middle,
    ``x`` ``1e-5`` off and the intercept ``1e-2``; first, ``5e-4`` and ``1.5`` (warned): now about ``1e-13``.
    Returns whether every solution was taken again, and ``t`` (0 unless every one was, of the kernel less ``t``)."""
    from blocklin.linalg.solve import bordered_kernel, scaled_kernel
    from blocklin.linalg.solve.shifted_gram import less_typical_row

    kc, raw, v = kernels
    if ctx.cdtype != "float64":
        return False, 0
    lams = np.atleast_1d(np.asarray(info.get("lam"), dtype=np.float64))
    t, kt = less_typical_row(ctx, raw, w, lams**2) if np.all(lams > 0) else (0, raw)
    ev = np.clip(np.asarray(spec.s, dtype=np.float64) ** 2, 0.0, None)
    noise = kc.shape[0] * np.finfo(np.float64).eps * float(ev.max(initial=0.0))
    cut = np.any(ev[:, None] + lams[None, :] ** 2 <= noise, axis=0)
    redo = scaled_kernel.refit(kc, ev, lams, cut) | ((t != 0) & (lams > 0))
    if not redo.any():
        return False, 0
    u = np.sqrt(w)
    ks = u[:, None] * kt * u[None, :]
    ks = (ks + ks.T) / 2
    per_column = len(ys) == 1 and lams.size > 1  # column j at its own lambda
    fits, bounds = {}, []
    for l in np.flatnonzero(redo):
        lam2 = float(lams[l]) ** 2
        factor = bordered_kernel.bordered_factor(ks, u, lam2)
        if factor is not None:
            fits[l] = bordered_kernel.bordered_fit(factor, ks, u, lam2, bc[:, l:l + 1] if per_column else bc)
            bounds.append(_bordered_condition(ks, lam2, factor, fits[l][0], ctx.n))
    if t and len(fits) < lams.size:  # the product less row t must serve every solution: none taken again
        return False, 0
    if len(fits) == lams.size:  # every solution's rounding is the bordered system's, not the spectrum's
        _report_bordered(info, max(bounds))
    for l, (y, x0) in fits.items():
        cols = slice(l, l + 1) if per_column else slice(None)
        z = u[:, None] * y
        i = 0 if per_column else l
        ys[i][:, cols] = z
        icpt[i][cols] = bbar[cols] + x0 - (v @ z if v is not None and not t else 0.0)
    return len(fits) == lams.size, t


def _bordered_condition(ks: np.ndarray, lam2: float, factor: tuple, y: np.ndarray, n: int) -> float:
    """The factor the bordered solve (:func:`_bordered_solves`) amplifies ``eps`` by in ``x = A_t^T D y``:
    ``(m + n) cond(F) ||D y||`` (``D y``'s forward error, :mod:`~blocklin.linalg.solve.bordered_kernel`) through
    ``||A_t^T D^-1||_2 = ||D^-1 K D^-1||_2^(1/2)`` (``D = diag(sqrt(K_ii + lam^2))``), over
    ``||x|| = (y^T K y)^(1/2)``; per column, the largest (the product's own rounding is added by
    :func:`_product_rounding`)."""
    d, cond = factor[1], float(factor[3])
    m = ks.shape[0]
    scale = math.sqrt(float(np.linalg.norm(ks / np.outer(d, d), 2)))
    xn = np.sqrt(np.maximum(np.einsum("ik,ij,jk->k", y, ks, y), 0.0))
    dyn = np.linalg.norm(d[:, None] * y, axis=0)
    with np.errstate(divide="ignore", invalid="ignore"):
        amp = np.where(xn > 0, (m + n) * cond * scale * dyn / xn, 0.0)
    return float(np.max(amp, initial=0.0))


def _report_bordered(info: dict, amp: float) -> None:
    """``report["condition_estimate"]`` where the bordered solves took every solution again: the smaller of the
    spectrum's norm-wise estimate and the bordered system's (:func:`_bordered_condition`; the solves are taken
    again where :func:`~blocklin.linalg.solve.scaled_kernel.refit` judges them at least as accurate, and each
    estimate is a worst case: with well-scaled rows the spectrum's is the tighter), and an
    :class:`~blocklin.errors.IllConditionedWarning` where that reaches ``1 / eps`` (the spectrum's own warning,
    held, is dropped: :func:`_replay`). Rows ``1e5`` and ``5e-4`` apart with weights and the large row first at
    ``lam^2 = 1e-8``: the spectrum of the kernel less row 0 had said no correct digit where ``x`` is ``4e-12``
    off (the bordered estimate ``5e-9``)."""
    from blocklin.errors import IllConditionedWarning, warn

    amp = min(amp, float(info.get("condition_estimate", amp)))
    info["condition_estimate"] = amp
    if amp * np.finfo(np.float64).eps >= 1:
        warn(f"solve: x may have no correct digit: the bordered system of the intercept on the row-scaled kernel "
             f"amplifies the rounding by {amp:.3g} (report['condition_estimate']); a larger lam, or a's rows nearer "
             "each other in scale, avoid it", IllConditionedWarning)


def _replay(held: list, *, superseded: bool) -> None:
    """Emit the warnings held while the spectrum gave the solutions, less its norm-wise ``no correct digit``
    (:func:`~blocklin.linalg.solve.spectrum.warn_inaccurate`) where the bordered solves took every solution again
    (``superseded``: their own estimate and warning, :func:`_report_bordered`)."""
    import warnings

    from blocklin.errors import IllConditionedWarning

    for w in held:
        if superseded and issubclass(w.category, IllConditionedWarning) and \
                str(w.message).startswith("solve: x may have no correct digit: at lam"):
            continue
        warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)


def _without_intercept_direction(ctx: TikhonovRun, spec: Any, sw: np.ndarray) -> Any:
    """The dual spectrum of the centered problem with the intercept's direction ``sqrt(w)`` taken out
    (:func:`blocklin.linalg.solve.spectrum.without_direction`): the centered ``A A^T`` has it in its null space, so
    its weight ``1 / (s^2 + lam^2)`` is about ``1 / lam^2`` times a rounding-level part of ``b``; at a small
    ``lam`` that part of ``y`` dwarfed the rest, and the centering ``P^T y`` cancelled it with the rest (rows
    ``2^600`` apart, ``lam`` 1e-82 of ``||A||``: ``x`` 100% off and the intercept that of ``x = 0``). The
    leave-one-out choice, which takes the direction out itself, is made on the spectrum as it was."""
    from blocklin.linalg.solve import loo

    if ctx.kind == "loo" and ctx.folds is None:
        loo.choose(ctx, spec)
    out = without_direction(spec, sw)
    if ctx.loo_choice is not None and ctx.loo_choice[0] is spec:
        ctx.loo_choice = (out, *ctx.loo_choice[1:])
    return out


def _column_peaks(bm: np.ndarray) -> np.ndarray:
    """Each column's largest magnitude of ``b`` in memory (of a complex column, its parts': ``|b|`` of an entry
    near the top is Inf, not below the range)."""
    if not bm.shape[0]:
        return np.zeros(bm.shape[1])
    if np.iscomplexobj(bm):
        return np.maximum(np.abs(bm.real).max(axis=0), np.abs(bm.imag).max(axis=0)).astype(np.float64)
    return np.abs(bm).max(axis=0).astype(np.float64)


def dual_exponents(y: np.ndarray, eb: Any, ea: int, dtype: Any) -> tuple[np.ndarray, np.ndarray]:
    """``(t, s)`` of ``x = 2^s A^T (2^t y')`` with ``t + s = eb - 2 ea`` (``y'`` of the scaled problem):
    ``2^t y'`` the true ``y = (A A^T + lam^2 I)^-1 b`` where it is within the output dtype's range with a
    margin, so that the GEMM's sums ``A^T y`` are of the size of ``x``; else the nearest exponent that is.

    ``A^T (2^(eb - ea) y')``, the earlier split, sums products of ``|A| |b| kappa^2 / |A'|^2``: beyond
    float32's range for a 4 x 40 ``A`` of ``1e30`` and condition ``1e6`` whose ``x`` is ``1e6`` (every
    entry Inf, found by a randomized search). Per column (arrays of ``k``): one ``t`` for all, the largest
    column's, took a column ``2^444`` below it (``A`` near ``2^1008``) to 0 and one ``2^106`` below among the
    subnormals (``x`` 0.8% off), without a word. ``eb``: one power, or one per column of ``y`` where ``b``'s
    columns were scaled each by their own (:attr:`~blocklin.linalg.blocks.scaling.Scaling.columns`)."""
    total = eb - 2 * ea
    k = y.shape[1] if y.ndim == 2 else 1
    with np.errstate(over="ignore"):
        top = np.abs(y).reshape(y.shape[0], k).max(axis=0).astype(np.float64) if y.size else np.zeros(k)
    info = np.finfo(np.dtype(dtype))
    ey = np.frexp(np.where((top > 0) & np.isfinite(top), top, 1.0))[1].astype(np.int64)  # 2^(ey-1) <= top < 2^ey
    hi = info.maxexp - 8 - int(math.ceil(math.log2(max(2, y.shape[0]))))  # room for the GEMM's sums
    lo = info.minexp + info.nmant + 8  # the small entries of y stay normal
    with np.errstate(over="ignore"):  # y's smallest entry kept normal too (rows 2^600 apart: y spans 2^545)
        low = np.where(y != 0, np.abs(y), np.inf).reshape(y.shape[0], k).min(axis=0) if y.size else np.full(k, np.inf)
    floor = np.where(np.isfinite(low), info.minexp + 1 - np.frexp(np.where(np.isfinite(low), low, 1.0))[1], lo - ey)
    t = np.where((top > 0) & np.isfinite(top), np.minimum(np.maximum(total, np.maximum(lo - ey, floor)), hi - ey), total)
    return t.astype(np.int64), (total - t).astype(np.int64)


def _powers(e: Any) -> str:
    """A power of two for a message: one exponent, or the range of the columns' own."""
    e = np.atleast_1d(np.asarray(e))
    return str(int(e[0])) if np.all(e == e[0]) else f"({int(e.min())}..{int(e.max())}, per column)"


def _check_finite_x(x_path: str, alpha: Any) -> None:
    """Raise where the GEMM's ``x`` holds Inf or NaN although ``A``, ``b`` and ``y`` were finite: its sums
    overflowed (never an Inf returned as a solution)."""
    from blocklin.storage.zarr_store import row_bands

    for _, block in row_bands(x_path):
        if not np.isfinite(block).all():
            raise NonFiniteError(_msg("a", "must give x = A^T y within the range of its dtype",
                                      f"x = 2^{_powers(alpha)} A^T y overflowed ({block.dtype.name})",
                                      "solve in float64 (a.astype('float64')), or use blocklin.lstsq, whose SVD "
                                      "route never forms y"))


def _copy_into(src: Any, dst: Any, rows: int, *, conj: bool, alpha: Any = 0) -> ColumnRange:
    """``dst = 2^alpha conj(src)`` (or ``2^alpha src``), rounded once to ``dst``'s dtype, band of chunk rows by band
    (``n x k``): the GEMM's ``A^T conj(y)`` made ``A^H y``, and its float64 sums scaled and rounded once to the
    output's dtype; one band of ``rows x k`` in memory, no pass over ``A``. Returns what each column kept
    (:func:`~blocklin.linalg.blocks.result_range.check_columns` judges it)."""
    from blocklin.runtime.tiles import open_array
    from blocklin.storage.zarr_store import read_block, write_block

    s, d = open_array(src), open_array(dst, mode="r+")
    n, k = s.shape
    cols = ColumnRange(k)
    for r0 in range(0, n, max(1, rows)):
        r = slice(r0, min(n, r0 + rows))
        block = read_block(s, r, slice(0, k))
        out, part = scaled_columns(np.conj(block) if conj else block, alpha, d.dtype)
        cols.merge(part)
        write_block(d, r, slice(0, k), out)
    return cols


__all__ = ["solve_wide"]
