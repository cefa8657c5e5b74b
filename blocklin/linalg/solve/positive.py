"""``positive=True``: ridge coefficients constrained to ``x >= 0``, as ``sklearn.linear_model.Ridge(positive=True)``.

The Gram quantities are in memory (``n x n``, the normal-equations route): with
``A^T A + lam^2 I = R^T R`` (Cholesky),
``||A x - b||^2 + lam^2 ||x||^2 = ||R x - R^{-T} A^T b||^2 + ||b||^2 - ||R^{-T} A^T b||^2``, so the
constrained problem is the nonnegative least squares ``min_{x >= 0} ||R x - R^{-T} A^T b||`` of order
``n``, solved exactly by Lawson and Hanson's active-set method (*Solving Least Squares Problems*, 1974,
ch. 23; :func:`scipy.optimize.nnls`) per right-hand side and lambda. scikit-learn minimizes the same
objective by L-BFGS-B to a tolerance; with ``fit_intercept`` it centers ``A`` and ``b`` (by the
weighted means with ``sample_weight``) and sets ``x0 = bbar - mu^T x``, as this route does. The
residual norm comes from the Gram quantities, ``||b||^2 - 2 x^T A^T b + x^T A^T A x``.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from blocklin.errors import ConvergenceError, SingularMatrixError
from blocklin.errors import explain as _msg
from blocklin.linalg.solve.normal import AUTO_RCOND, refuse_or_warn, cholesky_condition
from blocklin.linalg.solve.tikhonov import TikhonovRun, factor_regularized, norms, singular, write_x

#: Active-set iterations of one NNLS at most, per unknown (Lawson-Hanson rarely needs more than ``n``).
ITERATIONS_PER_UNKNOWN = 30


def nonnegative(r: np.ndarray, d: np.ndarray) -> np.ndarray:
    """``argmin_{x >= 0} ||R x - d_j||`` for every column ``d_j`` of ``d``."""
    from scipy.optimize import nnls

    n = r.shape[1]
    x = np.zeros((n, d.shape[1]))
    for j in range(d.shape[1]):
        try:
            x[:, j] = nnls(r, d[:, j], maxiter=max(100, ITERATIONS_PER_UNKNOWN * n))[0]
        except RuntimeError as err:  # scipy: "Maximum number of iterations reached"
            raise ConvergenceError(_msg("positive", "needs the NNLS active-set method to converge",
                                        f"{err} (right-hand side {j}, {n} unknowns)",
                                        "raise lam (a better conditioned problem), or drop positive=True")) from None
    return x


def solve_positive(ctx: TikhonovRun, gp: dict, x_path: str, reason: str) -> dict:
    """The constrained solution of every lambda (a number or a sequence) from the Gram quantities ``gp``
    (weighted and centered as the run asks); writes ``x`` and returns the route's report entries."""
    from scipy.linalg import solve_triangular

    g, c, bb = gp["g"], gp["c"], gp["bb"]
    xs, rr_all, xx_all, conds, active = [], [], [], [], []
    for lam in ctx.lams:
        cf, rcond = factor_regularized(g, lam)
        if cf is None or rcond < np.finfo(np.float64).eps:
            if lam == 0:
                raise singular(1.0 / max(rcond, 1e-300) ** 0.5, "column")
            raise SingularMatrixError(_msg("a", "A^T A + lam^2 I must be positive definite (positive=True)",
                                           f"Cholesky failed (reciprocal condition {rcond:.1e})",
                                           "pass a larger lam"))
        if rcond < AUTO_RCOND:  # as the normal equations warn (no refinement here: x carries cond(K) eps)
            refuse_or_warn(cf, rcond, lam, ctx)
        r = np.triu(cf[0])  # cho_factor leaves the other triangle unspecified
        x = nonnegative(r, solve_triangular(r, c, trans="T", check_finite=False))
        rr = np.maximum(bb - 2 * np.einsum("ij,ij->j", x, c) + np.einsum("ij,ij->j", x, g @ x), 0.0)
        xs.append(x)
        rr_all.append(rr)
        xx_all.append(np.einsum("ij,ij->j", x, x))
        conds.append(rcond)
        active.append(np.count_nonzero(x, axis=0).tolist())
    single = ctx.kind == "scalar"
    # the NNLS takes R and R^-T A^T b as they are (no refinement): cond_1(K) is the factor eps is amplified by
    info: dict[str, Any] = {"method": "normal", "method_reason": reason, "residual_norm_source": "Gram quantities",
                            "condition_estimate": max(cholesky_condition(rc, 0) for rc in conds)}
    conds = [float(1.0 / math.sqrt(rc)) if rc > 0 else float("inf") for rc in conds]
    if single:
        lam = ctx.lams[0]
        info.update(lam=lam, residual_norm=norms(rr_all[0]), solution_norm=norms(xx_all[0]),
                    objective=norms(rr_all[0] + lam**2 * xx_all[0]), cond_estimate=conds[0],
                    nonzero=active[0])
    else:
        info.update(lam=list(ctx.lams), residual_norm=[norms(r) for r in rr_all],
                    solution_norm=[norms(x) for x in xx_all],
                    objective=[norms(r + lam**2 * x) for r, x, lam in zip(rr_all, xx_all, ctx.lams)],
                    cond_estimate=max(conds), nonzero=active)
    if ctx.intercept:
        info["intercept"] = ctx.offset(xs[0]).tolist() if single else [ctx.offset(x).tolist() for x in xs]
    write_x(ctx, x_path, xs[0] if single else np.hstack(xs))
    return info


__all__ = ["ITERATIONS_PER_UNKNOWN", "nonnegative", "solve_positive"]
