"""The normal-equations routes of a tall (or square) Tikhonov solve.

One pass gives ``A^T A``, ``A^T b`` and ``||b||^2``; a single ``lam`` is solved by
the Cholesky factor of ``A^T A + lam^2 I`` and refinement passes against the original problem, a
sequence or a rule by the eigen-decomposition of ``A^T A``; ``fit_intercept`` sums the rows less the
first row and corrects those sums by rank one. ``method="auto"`` switches to :func:`~blocklin.linalg.solve.qr_route.qr_route`
where ``A^T A + lam^2 I`` is ill-conditioned.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from blocklin.errors import SingularMatrixError, warn
from blocklin.errors import explain as _msg
from blocklin.device.syrk import symmetrize_lower
from blocklin.linalg.solve import lambda_select, loo
from blocklin.linalg.solve.kernels import gram_kernel, residual_kernel
from blocklin.linalg.solve.qr_route import qr_route
from blocklin.linalg.solve.spectrum import lambdas as spectrum_lambdas
from blocklin.linalg.solve.spectrum import coefficients, describe, finish_spectral, spectrum_from_gram, weigh_columns
from blocklin.linalg.solve.tikhonov import TikhonovRun, device_of_pass, dots, factor_regularized, norms, singular, write_x
from blocklin.plan.solve import small_bytes
from blocklin.runtime.passes import run_pass

#: ``auto`` keeps the normal equations while the regularized Gram matrix's reciprocal condition
#: estimate is above this (``cond(A)`` below about ``1e5``; refinement then recovers full accuracy).
AUTO_RCOND = 1e-10
#: ``refine="auto"`` runs a refinement pass when the reciprocal condition estimate of
#: ``A^T A + lam^2 I`` is below this (its error bound ``cond * eps`` then exceeds ``~1e-12``).
AUTO_REFINE_RCOND = 1e-4


def gram_sums(ctx: TikhonovRun) -> dict:
    """``A^T A``, ``A^T b``, ``||b||^2``, ``||A||_F^2`` of the run's problem: its Gram pass (recorded for
    resume; made now when the route made none) and, with an intercept, the column means it found."""
    gp = _gram_pass(ctx)
    if ctx.intercept and ctx.mu is None:
        _center_gram(ctx, gp)
    return gp


def _gram_pass(ctx: TikhonovRun) -> dict:
    """``A^T A``, ``A^T b``, ``||b||^2``, ``||A||_F^2`` (saved for resume)."""
    if ctx.gram is not None:  # the fold sums' totals (cv=): the Gram quantities without a pass
        gp = dict(ctx.gram)
    else:
        gp = ctx.saved.run("gram-pass", lambda: ctx.scaled_run(lambda sc: _run_gram_pass(ctx, sc)))
    ctx.adopt(gp)
    gp["aa"] = float(gp["aa"])
    return gp


def _run_gram_pass(ctx: TikhonovRun, scale: dict) -> dict:
    what = "Gram pass: A^T W A, A^T W b, A^T w (sample weights)" if ctx.weighted else "Gram pass: A^T A, A^T b"
    shift = ctx.shifts(scale) if ctx.intercept else None  # the sums of the shifted rows, and their column sums
    if shift is not None:
        what += " of the rows less the first row, and their column sums"
    states, _ = run_pass(ctx.job, gram_kernel, ctx.sources(), {"dtype": ctx.cdtype} | ({"shift": shift} if shift else {}),
                         reserve=small_bytes(ctx.n, ctx.k), description=what, scale=scale,
                         device=_pass_device(ctx, "gram pass", ctx.m * ctx.n * (ctx.n + 2 * ctx.k)))
    states = [s for s in states if s is not None]
    g = states[0]["g"]
    for s in states[1:]:
        g += s["g"]
    g = symmetrize_lower(g)
    c = sum(s["c"] for s in states)
    out = {"g": g, "c": c, "bb": sum(s["bb"] for s in states), "aa": float(np.trace(g).real)}
    if ctx.weighted:  # the weighted means' sums, from the same pass
        out.update(aw=sum(s["aw"] for s in states if "aw" in s), bw=sum(s["bw"] for s in states if "bw" in s))
    if shift is not None:
        out.update({"sa0": shift[0], "sb0": shift[1]})
        if not ctx.weighted:
            out.update({"as": sum(s["as"] for s in states if "as" in s), "bs": sum(s["bs"] for s in states if "bs" in s)})
    return out


def _pass_device(ctx: TikhonovRun, phase: str, flops: float) -> str:
    """The device of a pass over ``A`` and ``B``; a weighted pass scales its rows on the CPU."""
    if ctx.weighted:
        ctx.phases[phase] = "cpu"
        return "cpu"
    return device_of_pass(ctx, phase, flops)


def _residual_pass(ctx: TikhonovRun, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``A^T (b - A x)`` and ``||b - A x||^2`` (saved for resume under a token of ``x``)."""
    from dask.base import tokenize

    r = ctx.saved.run(f"residual-{tokenize(x)[:16]}", lambda: dict(zip(("atr", "rr"), _run_residual_pass(ctx, x))))
    return r["atr"], r["rr"]


def _run_residual_pass(ctx: TikhonovRun, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    shift = {"shift": (ctx.shift_a, ctx.shift_b)} if ctx.shift_a is not None else {}
    states, _ = run_pass(ctx.job, residual_kernel, ctx.sources(), {"dtype": ctx.cdtype, "x": x} | shift,
                         reserve=small_bytes(ctx.n, ctx.k), check_finite=False, scale=ctx.scale,
                         description="refinement pass: A^T W (b - A x)" if ctx.weighted else
                         "refinement pass: A^T (b - A x)",
                         device=_pass_device(ctx, "residual pass", 4 * ctx.m * ctx.n * ctx.k))
    states = [s for s in states if s is not None]
    atr, rr = sum(s["atr"] for s in states), sum(s["rr"] for s in states)
    if ctx.mu is not None:  # centered: A_c^T W r_c = A_s^T W r_s - S dmu d, ||r_c||_W^2 = ||r_s||_W^2 - S d^2, with
        # the shifted rows' r_s (the means as found where no shift was taken), d = mean(r_s), S = sum w (m unweighted)
        dmu, dbbar = (ctx.dmu, ctx.dbbar) if ctx.shift_a is not None else (ctx.mu, ctx.bbar)
        d = dbbar - dmu @ x
        S = ctx.total_weight
        atr, rr = atr - S * np.outer(dmu.conj(), d), rr - S * np.abs(d)**2
    return atr, rr


def _center_gram(ctx: TikhonovRun, gp: dict) -> dict:
    """fit_intercept: the means of ``A`` and ``b`` and the Gram quantities of the centered problem from the
    Gram pass's sums of the shifted rows ``A_s = A - 1 shift_a^T``, ``b_s = b - 1 shift_b^T``
    (:meth:`~blocklin.linalg.solve.tikhonov.TikhonovRun.shifts`) by rank-one corrections of their means
    ``d = A_s^T w / S``, ``e = b_s^T w / S`` (``S = sum w``; unweighted the column sums over ``m``):
    ``A_c^T W A_c = A_s^T W A_s - S d d^T``, ``A_c^T W b_c = A_s^T W b_s - S d e^T``, ``mu = shift_a + d``,
    ``bbar = shift_b + e``. Without an intercept the quantities as they are."""
    if not ctx.intercept:
        return gp
    S = ctx.total_weight
    if ctx.weighted:
        d, e = gp["aw"] / S, gp["bw"] / S
    else:
        d, e = gp["as"] / S, gp["bs"] / S
    ctx.shift_a, ctx.shift_b, ctx.dmu, ctx.dbbar = gp["sa0"], gp["sb0"], d, e
    ctx.mu, ctx.bbar = gp["sa0"] + d, gp["sb0"] + e  # complex data: A_c^H A_c = A_s^H A_s - S conj(d) d^T
    g = gp["g"] - S * np.outer(d.conj(), d)
    return {"g": (g + g.conj().T) / 2, "c": gp["c"] - S * np.outer(d.conj(), e),
            "bb": gp["bb"] - S * np.abs(e)**2, "aa": max(gp["aa"] - S * float(np.vdot(d, d).real), 0.0)}


def solve_tall(ctx: TikhonovRun, x_path: str) -> dict:
    """Tall or square ``A``: normal equations when well conditioned, else the streaming QR; writes ``x``.
    With ``cv=`` the fold pass chooses lambda first (:func:`blocklin.linalg.solve.kfold.solve_tall_cv`)."""
    if ctx.folds is not None:
        from blocklin.linalg.solve.kfold import solve_tall_cv

        return solve_tall_cv(ctx, x_path, solve_tall)
    if ctx.method == "qr":  # the router refuses it with sample weights and positive
        return qr_route(ctx, x_path, {}, "requested")
    if ctx.intercept or ctx.weighted or ctx.positive:
        return _solve_tall_centered(ctx, x_path)
    if ctx.method == "auto" and ctx.kind != "scalar":
        return _solve_tall_spectral(ctx, x_path)
    gp = _gram_pass(ctx)
    if ctx.kind != "scalar":  # method="normal" with several lambdas: eigen-decomposition of A^T A
        spec = spectrum_from_gram(gp["g"], gp["c"], gp["bb"], ctx.m, dual=False, n=ctx.n)
        info = {"method": "normal", "method_reason": "requested (eigen-decomposition of A^T A; prefer 'qr' for "
                "small lambda)"}
        _warn_unresolved(ctx, spec, "A^T A", "method='qr' resolves them")
        return finish_spectral(ctx, spec, info, x_path)
    lam = ctx.lams[0]
    cf, rcond = factor_regularized(gp["g"], lam)
    info = {"rcond_normal": rcond}
    if cf is None or rcond < AUTO_RCOND:
        if ctx.method == "auto":
            return qr_route(ctx, x_path, info, f"A^T A + lam^2 I is ill-conditioned (reciprocal condition "
                             f"{rcond:.1e} < {AUTO_RCOND:.0e}): switched to the streaming QR (one more pass)")
        refuse_or_warn(cf, rcond, lam, ctx)
    x, rr, steps, source = _solve_refined(ctx, gp, cf, rcond, lam)
    xx = dots(x, x)
    reason = "requested" if ctx.method == "normal" else \
        f"well conditioned (reciprocal condition of A^T A + lam^2 I {rcond:.1e})"
    info.update(residual_norm_source=source, method="normal", method_reason=reason, lam=lam,
                residual_norm=norms(rr), solution_norm=norms(xx), objective=norms(rr + lam**2 * xx),
                refine_steps=steps, cond_estimate=float(1.0 / math.sqrt(rcond)) if rcond > 0 else float("inf"),
                condition_estimate=cholesky_condition(rcond, steps), norm_a=math.sqrt(gp["aa"]))
    write_x(ctx, x_path, x)
    return info


def _solve_tall_spectral(ctx: TikhonovRun, x_path: str) -> dict:
    """``method="auto"`` with a sequence or a rule: the one-pass spectrum of ``A^T A`` where the
    conditioning allows it (:func:`blocklin.linalg.solve.lambda_select.spectrum_route`), else the streaming QR.

    A rule's choice is then solved and refined as a single ``lam`` would be.
    """
    gp = _gram_pass(ctx)
    spec = spectrum_from_gram(gp["g"], gp["c"], gp["bb"], ctx.m, dual=False, n=ctx.n)
    rule = ctx.kind if ctx.kind in ("gcv", "lcurve", "loo") else None
    if rule == "loo":  # the leave-one-out pass over A (one lambda, or one per right-hand side)
        lams, curve = loo.choose(ctx, spec)
    elif rule:
        lam, curve = lambda_select.choose_lambda(weigh_columns(ctx, spec), rule, quiet=True)
        lams = [lam]
    else:
        lams, curve = list(ctx.lams), None
    several = len(lams) > 1  # a sequence, or leave-one-out lambdas per right-hand side: no refinement
    ok, rc, reason = lambda_select.spectrum_route(spec.s, lams, None if several else rule, rcond_rule=AUTO_RCOND,
                                                  rcond_sequence=AUTO_REFINE_RCOND)
    cf, rcond = factor_regularized(gp["g"], lams[0]) if ok and rule and not several else (None, rc)
    if not ok or (rule and not several and (cf is None or rcond < AUTO_RCOND)):
        return qr_route(ctx, x_path, {"rcond_normal": rc}, reason)
    info = {"method": "normal", "method_reason": reason, "rcond_normal": rc}
    if rule is None or several:
        return finish_spectral(ctx, spec, info, x_path)
    if rule != "loo":
        lambda_select.warn_at_end(curve, rule)
    x, rr, steps, src = _solve_refined(ctx, gp, cf, rcond, lams[0])
    describe(info, spec, lams, curve, ctx)
    xx = dots(x, x)
    smin = float(spec.s.min()) if spec.s.size else 0.0
    info.update(residual_norm=norms(rr), solution_norm=norms(xx), objective=norms(rr + lams[0] ** 2 * xx),
                refine_steps=steps, residual_norm_source=src, norm_a=math.sqrt(gp["aa"]),
                condition_estimate=cholesky_condition(rcond, steps),
                cond_estimate=float(spec.s.max()) / smin if smin > 0 else float("inf"))
    write_x(ctx, x_path, x)
    return info


def _solve_tall_centered(ctx: TikhonovRun, x_path: str) -> dict:
    """fit_intercept, sample weights or ``positive`` on tall ``A``: the normal-equations route on the
    weighted (``sqrt(w)``-scaled rows) and centered (rank-one corrected) Gram quantities."""
    raw = _gram_pass(ctx)
    gp = _center_gram(ctx, raw)
    what = " and ".join(w for w, on in (("fit_intercept", ctx.intercept), ("sample_weight", ctx.weighted)) if on)
    gram = ("the weighted " if ctx.weighted else "the ") + ("centered (rank-one corrected) " if ctx.intercept else "") \
        + ("A^T W A" if ctx.weighted else "A^T A")
    if ctx.positive:
        from blocklin.linalg.solve.positive import solve_positive

        info = solve_positive(ctx, gp, x_path, f"positive=True{', ' + what if what else ''}: NNLS on the Cholesky "
                              f"factor of {gram} + lam^2 I")
        info["norm_a"] = math.sqrt(gp["aa"])
        return info
    lam = ctx.lams[0] if ctx.kind == "scalar" else 0.0
    cf, rcond = factor_regularized(gp["g"], lam) if ctx.kind == "scalar" else (None, 0.0)
    # lam > 0 whose square underflows in the scaled problem (lam 0.1 on entries near 1e200): lam^2 I added
    # nothing, and a zero centered Gram matrix (constant columns) failed its Cholesky, refused as "A^T A + lam^2 I
    # must be positive definite ... a larger lam"; the spectral filters form lam^2 / (s^2 + lam^2) scaled
    lam_lost = ctx.kind == "scalar" and 0 < lam and lam**2 < np.finfo(np.float64).tiny and \
        (cf is None or rcond < np.finfo(np.float64).eps)
    # (lam = 0 keeps the minimum-norm solution of the centered Gram matrix, _min_norm, which the QR refuses)
    if ctx.kind == "scalar" and lam > 0 and not lam_lost and (cf is None or rcond < AUTO_RCOND) and _qr_allowed(ctx):
        return qr_route(ctx, x_path, {"rcond_normal": rcond}, f"A^T A + lam^2 I of the centered A is ill-conditioned "
                        f"(reciprocal condition {rcond:.1e} < {AUTO_RCOND:.0e}): switched to the streaming QR")
    if ctx.kind != "scalar" or lam_lost:
        spec = spectrum_from_gram(gp["g"], gp["c"], gp["bb"], ctx.rows_in_problem, dual=False, n=ctx.n)
        if ctx.intercept:  # the rank-one correction rounds relative to the shifted rows' Gram matrix
            spec.ev_bound = ctx.n * np.finfo(np.float64).eps * float(raw["aa"])
        if not lam_lost:
            # the centered Gram spectrum resolves singular values down to about sqrt(n eps) s_1 only: at a lambda
            # below them (columns of scales 1 and 1e-9, lam 5.5e-13) its solution dropped a direction of A that
            # the QR resolves, x 100% off, with method='auto' and no warning
            lams = spectrum_lambdas(ctx, spec)[0]
            ok, rc, why = lambda_select.spectrum_route(spec.s, lams, None, rcond_rule=AUTO_RCOND,
                                                       rcond_sequence=AUTO_REFINE_RCOND)
            if not ok and _qr_allowed(ctx):
                return qr_route(ctx, x_path, {"rcond_normal": rc}, why + " (fit_intercept: [1 | A | b] streamed)")
            if not ok:
                _warn_unresolved(ctx, spec, gram, "method='qr' (fit_intercept without sample_weight) resolves them"
                                 if not ctx.weighted else "a larger lam avoids it", (lams, rc))
        info = {"method": "normal", "method_reason": f"{what}: eigen-decomposition of {gram}" + (
            " (lam^2 of the problem scaled by its largest entry is below float64's range: the Cholesky factor "
            "of the singular Gram matrix failed, the spectral filters keep lam)" if lam_lost else "")}
        xs = coefficients(ctx, spec, info, "column")
        if ctx.intercept:
            info["intercept"] = ctx.intercepts(xs, info)
        write_x(ctx, x_path, np.hstack(xs) if len(xs) > 1 else xs[0])
        return info
    if lam == 0 and not ctx.positive and (cf is None or rcond < np.finfo(np.float64).eps):
        return _min_norm(ctx, gp, x_path, what, gram)
    if cf is None or rcond < AUTO_RCOND:
        refuse_or_warn(cf, rcond, lam, ctx)
    x, rr, steps, source = _solve_refined(ctx, gp, cf, rcond, lam)
    xx = dots(x, x)
    info = {"rcond_normal": rcond, "residual_norm_source": source, "method": "normal",
            "method_reason": f"{what}: the normal equations of {gram}", "lam": lam,
            "residual_norm": norms(rr), "solution_norm": norms(xx), "objective": norms(rr + lam**2 * xx),
            "refine_steps": steps, "cond_estimate": float(1.0 / math.sqrt(rcond)) if rcond > 0 else float("inf"),
            "condition_estimate": cholesky_condition(rcond, steps), "norm_a": math.sqrt(gp["aa"])}
    if ctx.intercept:
        info["intercept"] = ctx.intercepts([x], info)
    write_x(ctx, x_path, x)
    return info


def cholesky_condition(rcond: float, steps: int) -> float:
    """``report["condition_estimate"]`` of a Cholesky solve of ``A^T A + lam^2 I``: the factor by which ``eps``
    is amplified in ``x``, ``cond_1(K)`` (LAPACK's ``pocon`` estimate) unrefined, and ``cond_1(K)^(1/2)``, that
    of the stacked ``[A; lam I]``, after refinement against ``A`` (a backward stable solution, Higham 2002,
    20.5). The route refuses ``rcond < eps`` and warns below ``AUTO_RCOND``."""
    if not rcond > 0:
        return float("inf")
    return float(1.0 / rcond) if not steps else float(1.0 / math.sqrt(rcond))


def _warn_unresolved(ctx: TikhonovRun, spec: Any, gram: str, fix: str, checked: tuple | None = None) -> None:
    """Warn where ``method="normal"`` solves a lambda from the Gram spectrum below what it resolves (the test
    ``method="auto"`` switches to the QR on): it had returned x 100% off (columns of scales 1 and 1e-9, lam
    5.5e-13) without a word."""
    if checked is None:
        lams = spectrum_lambdas(ctx, spec)[0]
        ok, rc, _ = lambda_select.spectrum_route(spec.s, lams, None, rcond_rule=AUTO_RCOND,
                                                 rcond_sequence=AUTO_REFINE_RCOND)
        if ok:
            return
    else:
        lams, rc = checked
    warn(f"solve: {gram} + lam^2 I has reciprocal condition {rc:.1e} at lambda = {min(lams):.3g} of the scaled "
         f"problem: the eigen-decomposition of {gram} does not resolve the directions of A below about "
         f"sqrt(n eps) ||A|| that this lambda leaves in x (accuracy lost); {fix}")


def _qr_allowed(ctx: TikhonovRun) -> bool:
    """``method="auto"`` may switch the centered problem to the streaming QR (``[1 | A | b]``): an intercept, without
    sample weights or ``positive`` (which the R factor does not take)."""
    return ctx.method == "auto" and ctx.intercept and not ctx.weighted and not ctx.positive


def _min_norm(ctx: TikhonovRun, gp: dict, x_path: str, what: str, gram: str) -> dict:
    """``lam = 0`` with a singular centered (or weighted) Gram matrix: the minimum-norm least-squares solution,
    ``Ridge(alpha=0)``'s, from the eigen-decomposition of that Gram matrix over its eigenvalues above
    ``n eps e_max`` (singular values of the centered ``A`` above about ``sqrt(n eps) s_1``: what the Gram
    matrix resolves). A warning gives the rank; ``blocklin.lstsq`` of the centered data resolves singular
    values down to ``eps s_1``."""
    g, c = gp["g"], gp["c"]
    ev, v = np.linalg.eigh(g)
    tol = float(ev.max()) * ctx.n * np.finfo(np.float64).eps if ev.size else 0.0
    keep = ev > tol
    rank = int(keep.sum())
    vk = v[:, keep]
    x = vk @ ((vk.conj().T @ c) / ev[keep, None])
    rr = gp["bb"] - 2 * dots(x, c) + dots(x, g @ x)
    xx = dots(x, x)
    warn(f"solve: lam = 0 and {gram} is singular (rank {rank} of {ctx.n}): the minimum-norm least-squares "
         f"solution over its eigenvalues above {tol:.1e} (Ridge(alpha=0)'s); for singular values resolved to eps "
         "use blocklin.lstsq on the centered data, or regularize with lam > 0")
    info = {"rcond_normal": 0.0, "residual_norm_source": "Gram quantities", "method": "normal",
            "method_reason": f"{what}, lam = 0: the minimum-norm solution from the eigen-decomposition of {gram} "
                             f"(rank {rank} of {ctx.n}, eigenvalues above {tol:.1e})", "lam": 0.0, "rank": rank,
            "residual_norm": norms(rr), "solution_norm": norms(xx), "objective": norms(rr), "refine_steps": 0,
            "cond_estimate": float("inf"), "norm_a": math.sqrt(gp["aa"]),
            # the minimum-norm solution is that of the Gram matrix on its kept eigenvalues: cond of that part
            "condition_estimate": float(ev.max() / ev[keep].min()) if rank else 0.0}
    if ctx.intercept:
        info["intercept"] = ctx.intercepts([x], info)
    write_x(ctx, x_path, x)
    return info


def refuse_or_warn(cf: Any, rcond: float, lam: float, ctx: TikhonovRun | None = None) -> None:
    """``method="normal"`` (or the centered, weighted or constrained normal equations, which have no QR route)
    on an ill-conditioned problem: refuse a singular one, warn otherwise. The advice names what works for the
    options given: ``method='qr'`` takes fit_intercept, but neither sample_weight nor positive."""
    extras = [n for n, on in (("sample_weight", ctx is not None and ctx.weighted),
                              ("positive", ctx is not None and ctx.positive)) if on]
    if extras:
        qr = (f"or, without {' and '.join(extras)}, method='qr' on the problem made by hand (for sample_weight: "
              "rows of A and b scaled by sqrt(w))")
    else:
        qr = "or method='qr' (the streaming QR: no squared condition number)"
    gram = "A^H A" if ctx is not None and ctx.cdtype == "complex128" else "A^T A"
    if ctx is not None and ctx.sa is not None and ctx.scaled_lams:  # lam as given, not the scaled problem's
        lam = float(np.ldexp(lam, ctx.sa.exponent))
    if cf is None or rcond < np.finfo(np.float64).eps:
        if lam == 0:
            raise singular(1.0 / max(rcond, 1e-300) ** 0.5, "column")
        raise SingularMatrixError(_msg("a", f"{gram} + lam^2 I must be positive definite" + (
            f" (the {' and '.join(extras)} normal equations)" if extras else ""),
            f"Cholesky failed (reciprocal condition {rcond:.1e}) at lam = {lam:.3g}",
            f"a larger lam (lam=('loo', grid) or lam='gcv' chooses one), {qr}"))
    refined = not (ctx is not None and ctx.positive)  # the NNLS of positive=True takes the factor as it is
    warn(f"solve: {gram} + lam^2 I has reciprocal condition {rcond:.1e}; the normal equations may lose "
         f"accuracy{' (refinement helps)' if refined else ''}; {'a larger lam, ' if extras else ''}"
         f"{qr.removeprefix('or ')} avoids squaring the condition number")


def _solve_refined(ctx: TikhonovRun, gp: dict, cf: Any, rcond: float, lam: float) -> tuple[np.ndarray, np.ndarray, int, str]:
    """``x`` from the normal equations and refinement passes; ``||b - A x||^2``, the steps, its source."""
    from scipy.linalg import cho_solve

    g, c = gp["g"], gp["c"]
    x = cho_solve(cf, c, check_finite=False)
    rr_gram = gp["bb"] - 2 * dots(x, c) + dots(x, g @ x)
    # "auto" refines when ill-conditioned, or when ||r||^2 from the Gram quantities suffers
    # cancellation (a residual far below ||b||: an accurate one needs the pass anyway)
    small_residual = bool(np.any(rr_gram < 1e-6 * gp["bb"]))
    n_refine = (1 if rcond < AUTO_REFINE_RCOND or small_residual else 0) if ctx.refine == "auto" else ctx.refine
    rr = None
    for _ in range(n_refine):
        atr, rr = _residual_pass(ctx, x)
        d = cho_solve(cf, atr - lam**2 * x, check_finite=False)
        # ||r - A d||^2 = ||r||^2 - 2 d^T A^T r + d^T G d (exact algebra; d is tiny)
        rr = rr - 2 * dots(d, atr) + dots(d, g @ d)
        x = x + d
    if rr is None:
        return x, rr_gram, 0, "Gram quantities"
    return x, rr, n_refine, "refinement pass"


__all__ = ["AUTO_RCOND", "AUTO_REFINE_RCOND", "cholesky_condition", "gram_sums", "solve_tall"]
