"""Tikhonov-regularized least squares, out of core: ``min ||A x - b||^2 + lam^2 ||x||^2``."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any, Unpack

import numpy as np

from blocklin.config import Settings, format_size
from blocklin.errors import NonFiniteError, ParameterError, SingularMatrixError, warn
from blocklin.errors import explain as _msg
from blocklin.linalg.solve import lambda_select
from blocklin.linalg.blocks.center import column_moments
from blocklin.runtime.stages import StepRecords
from blocklin.linalg.products.gemm import Gemm
from blocklin.linalg.blocks.syrk import symmetrize_lower
from blocklin.linalg.solve.kernels import gram_kernel, residual_kernel
from blocklin.linalg.blocks.streaming_qr import tsqr_pass
from blocklin.linalg.blocks.scaling import Scaling, check_finite_result, incore_exponent
from blocklin.matrix import Matrix
from blocklin.plan.chunks import auto_chunks
from blocklin.plan.solve import SolvePlan, plan_solve, small_bytes
from blocklin.runtime.job import Job
from blocklin.storage.identity import plan_settings, resume_token
from blocklin.runtime.passes import run_pass, source
from blocklin.storage.zarr_store import create_array, open_zarr, write_block
from blocklin.validate import MAX_REFINE, choice, count, float_operand, same_dtype, same_rows

METHODS = ("auto", "normal", "qr")
#: What ``solve`` may assume of ``a``: nothing (least squares; LU for a square system), symmetric
#: positive definite, or symmetric (:mod:`blocklin.linalg.solve.square`).
ASSUME = ("gen", "pos", "sym")
#: ``auto`` keeps the normal equations while the regularized Gram matrix's reciprocal condition
#: estimate is above this (``cond(A)`` below about ``1e5``; refinement then recovers full accuracy).
AUTO_RCOND = 1e-10
#: ``refine="auto"`` runs a refinement pass when the reciprocal condition estimate of
#: ``A^T A + lam^2 I`` is below this (its error bound ``cond * eps`` then exceeds ``~1e-12``).
AUTO_REFINE_RCOND = 1e-4
#: Points of the lambda grid for GCV and the L-curve.
GRID = 300


# -- the small problem in spectral form -----------------------------------------------------------------


@dataclasses.dataclass
class Spectrum:
    """``A = U diag(s) V^T`` reduced to what every lambda needs.

    ``beta = U^T b`` (``r x k``) and ``rho0sq`` (``k``: ``||b||^2 - ||U^T b||^2``, the part of ``b``
    no lambda can fit). For tall problems ``basis`` is ``V`` (``x = V diag(s/(s^2+lam^2)) beta``); for
    wide ones it is ``U`` and ``x = A^T U diag(1/(s^2+lam^2)) beta`` (the dual form).
    """

    s: np.ndarray
    basis: np.ndarray
    beta: np.ndarray
    rho0sq: np.ndarray
    m: int
    n: int
    dual: bool = False

    def filt(self, lam: float) -> np.ndarray:
        s2 = self.s**2
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(s2 + lam**2 > 0, 1.0 / (s2 + lam**2), 0.0)

    def coefficients(self, lam: float) -> np.ndarray:
        """``x`` (tall) or the dual ``y`` with ``x = A^T y`` (wide)."""
        f = self.filt(lam)
        w = (f if self.dual else self.s * f)[:, None] * self.beta
        return self.basis @ w

    def residual_sq(self, lam: float) -> np.ndarray:
        g = lam**2 * self.filt(lam)
        return self.rho0sq + np.einsum("i,ij->j", g**2, self.beta**2)

    def solution_sq(self, lam: float) -> np.ndarray:
        g = self.s * self.filt(lam)
        return np.einsum("i,ij->j", g**2, self.beta**2)

    def dof(self, lam: float) -> float:
        return float(np.sum(self.s**2 * self.filt(lam)))

    def gcv(self, lam: float) -> float:
        """Golub-Heath-Wahba ``V(lam) = m ||r||^2 / (m - dof)^2`` (summed over right-hand sides)."""
        den = (self.m - self.dof(lam)) ** 2
        return float(self.m * self.residual_sq(lam).sum() / den) if den > 0 else float("inf")

    def grid(self, points: int = GRID) -> np.ndarray:
        smax = float(self.s.max()) if self.s.size else 1.0
        smin = float(self.s[self.s > 0].min()) if np.any(self.s > 0) else smax
        lo = max(smin, smax * 1e-16 ** 0.5 * 1e-4) / 10
        return np.logspace(math.log10(max(lo, 1e-300)), math.log10(max(smax, 1e-300)), points)


def _spectrum_from_r(r: np.ndarray, qtb: np.ndarray, rho: np.ndarray, m: int) -> Spectrum:
    u, s, vt = np.linalg.svd(r, full_matrices=False)
    return Spectrum(s=s, basis=vt.T, beta=u.T @ qtb, rho0sq=rho**2, m=m, n=r.shape[1])


def _spectrum_from_gram(g: np.ndarray, c: np.ndarray, bb: np.ndarray, m: int, *, dual: bool,
                        n: int) -> Spectrum:
    ev, w = np.linalg.eigh(g)
    ev, w = ev[::-1], w[:, ::-1]
    s = np.sqrt(np.clip(ev, 0.0, None))
    if dual:  # g = A A^T, c = b: beta = U^T b
        beta = w.T @ c
    else:  # g = A^T A, c = A^T b: beta = diag(1/s) V^T A^T b
        keep = s > s[0] * np.finfo(np.float64).eps * max(g.shape) if s.size else s > 0
        beta = np.zeros((s.size, c.shape[1]))
        beta[keep] = (w[:, keep].T @ c) / s[keep, None]
    if dual:  # U spans R^m: every component of b is in beta (zero singular values fit nothing)
        rho0sq = np.zeros(beta.shape[1])
    else:
        rho0sq = np.clip(bb - np.einsum("ij,ij->j", beta, beta), 0.0, None)
    return Spectrum(s=s, basis=w, beta=beta, rho0sq=rho0sq, m=m, n=n, dual=dual)


def choose_lambda(spec: Spectrum, rule: str) -> tuple[float, dict]:
    """``"gcv"`` (Golub, Heath and Wahba, 1979) or ``"lcurve"`` (Hansen, 1998): lambda and the curve
    (:func:`blocklin.linalg.solve.lambda_select.choose_lambda`: grids extended where the choice sits at an end)."""
    return lambda_select.choose_lambda(spec, rule)


# -- the solver -------------------------------------------------------------------------------------------------


#: Largest ``lam``: ``lam^2`` plus the entries of ``A^T A`` must stay finite in float64 (1e300
#: overflowed with ``OverflowError``); beyond it the solution is zero to every digit anyway.
LAM_MAX = 1e150


def _parse_lam(lam: Any) -> tuple[str, list[float]]:
    if isinstance(lam, str):
        rule = lam.strip().lower()
        if rule in ("gcv", "lcurve", "l-curve"):
            return ("gcv" if rule == "gcv" else "lcurve"), []
        raise ParameterError(_msg("lam", "must be a number >= 0, a sequence of them, 'gcv' or 'lcurve'", repr(lam),
                                 "pass lam=1e-3, lam=[1e-4, 1e-3, 1e-2] or lam='gcv'"))
    if isinstance(lam, (Sequence, np.ndarray)) and not isinstance(lam, str):
        vals = [float(v) for v in np.asarray(lam, dtype=float).ravel()]
        kind = "sequence"
        if not vals:
            raise ParameterError(_msg("lam", "sequence must not be empty", "[]", "pass at least one value"))
    else:
        try:
            vals = [float(lam)]
        except (TypeError, ValueError):
            raise ParameterError(_msg("lam", "must be a number >= 0, a sequence of them, 'gcv' or 'lcurve'",
                                     repr(lam), "pass lam=1e-3")) from None
        kind = "scalar"
    for v in vals:
        if not math.isfinite(v) or v < 0:
            raise ParameterError(_msg("lam", "must be finite and >= 0 (it multiplies ||x|| in "
                                     "min ||A x - b||^2 + lam^2 ||x||^2)", repr(v), "pass lam=0.0 or a positive value"))
    return kind, vals


def _check_lam_max(vals: list[float], e: int = 0) -> None:
    """``lam <= LAM_MAX`` for the problem whose ``A`` is divided by ``2^e`` (:mod:`blocklin.linalg.blocks.scaling`:
    a tall ``A`` with huge entries takes a lambda of their size)."""
    for v in vals:
        if np.ldexp(v, -e) > LAM_MAX:
            bound = f"{LAM_MAX:g}" if not e else f"{LAM_MAX:g} * 2^{e} (the scale of A)"
            raise ParameterError(_msg("lam", f"must be <= {bound} (lam^2 is added to A^T A in float64, where "
                                     "a larger square overflows)", repr(v), "pass a smaller lam; scale A and b "
                                     "instead (x is about A^T b / lam^2 at such a lam)"))


def solve(a: Any, b: Any, *, lam: Any = 0.0, method: str = "auto", assume_a: str = "gen", out: Any = None,
          refine: Any = "auto", overwrite: bool = False, explain: bool = False, fit_intercept: bool = False,
          precision: str = "double", resume: bool = False, **settings: Unpack[Settings]) -> Matrix | SolvePlan:
    """Solve ``min ||A x - b||^2 + lam^2 ||x||^2`` out of core, for tall, square or wide ``A``.

    Parameters
    ----------
    a : path, zarr array, Matrix, NumPy or Dask array
        ``m x n``. Never modified.
    b : operand
        ``m x k`` right-hand sides (a 1-D NumPy vector is taken as one column).
    lam : float, sequence of floats, "gcv" or "lcurve"
        Regularization ``lam >= 0``. A sequence solves every value from one pass (via the SVD of the
        streaming R factor); ``"gcv"`` minimizes generalized cross-validation (Golub, Heath and
        Wahba, 1979) and ``"lcurve"`` takes the corner of the L-curve (Hansen, 1998); both report the
        chosen value and the curve. ``lam=0`` is ordinary least squares (full column rank needed for
        tall ``A``; the minimum-norm solution for wide ``A``).
    method : {"auto", "normal", "qr"}
        For tall/square ``A``. ``"normal"``: ``A^T A`` and ``A^T b`` in one pass, Cholesky of
        ``A^T A + lam^2 I``, then (``refine``) passes of iterative refinement against the original
        problem (``r = b - A x``, ``x += K^{-1} (A^T r - lam^2 x)``). ``"qr"``: the R factor and ``Q^T b``
        of a one-pass streaming QR (TSQR, Demmel, Grigori, Hoemmen and Langou, 2012), then the SVD of
        ``R``: accurate when ``lam`` is tiny or ``A`` ill-conditioned (no squaring of the condition
        number). ``"auto"``: the normal equations when the reciprocal condition estimate of
        ``A^T A + lam^2 I`` exceeds ``1e-10``, otherwise QR (one more pass); sequences, GCV and the
        L-curve use QR. The report says which was used and why. Wide ``A`` (``m < n``) uses the dual
        form ``x = A^T (A A^T + lam^2 I)^{-1} b`` with ``A A^T`` from an out-of-core GEMM
        (``method="qr"`` is refused there).
    assume_a : {"gen", "pos", "sym"}
        ``"gen"`` (default): the regularized least-squares problem above; a **square** ``A`` with
        ``lam=0`` and ``method="auto"`` is a linear system, solved for any ``n`` by the out-of-core
        LU with partial pivoting (:func:`blocklin.lu`), two out-of-core triangular solves and
        iterative refinement (report ``method="lu"``; ``method="normal"``/``"qr"`` keep the
        least-squares routes, e.g. for a singular ``A``). ``"pos"``: ``A`` square, symmetric positive
        definite, stored in full: the out-of-core tiled Cholesky (:func:`blocklin.cholesky`) instead.
        ``"sym"``: symmetric: Cholesky when it succeeds, else LU (symmetric indefinite). These
        square routes need ``lam=0`` and refine to the dtype's backward error (``out`` keeps ``A``'s
        dtype); see :func:`blocklin.linalg.solve.square.solve_square`.
    precision : {"double", "mixed", "tf32"}
        Square routes only. ``"double"`` (or ``None``): ``A``'s dtype. ``"mixed"``: factor a float64
        ``A`` in float32 and refine in float64 to the float64 backward error (while
        ``cond(A) < ~10^7``; else :class:`~blocklin.errors.ConvergenceError`); the report gives the
        steps and backward error. ``"tf32"``: the same with the factorization's GEMMs on TF32 tensor
        cores on a GPU (for ``cond(A)`` up to about ``10^3``; plain float32 on a CPU).
    out : path, optional
        Output store for ``x`` (``n x k``; for a sequence of ``L`` values ``n x (L k)``, block ``l`` in
        columns ``l k : (l+1) k``). Atomic.
    refine : "auto" or int
        Refinement passes of the normal-equations route. ``"auto"`` (default): one pass when the
        condition estimate of ``A^T A + lam^2 I`` exceeds ``1e4`` (where the normal equations' error
        bound ``cond * eps`` passes ``~1e-12``) or the residual is below ``1e-3 ||b||`` (where
        the Gram formula for it cancels), none otherwise (the residual norm then comes from the
        Gram quantities, ``||b||^2 - 2 x^T A^T b + x^T A^T A x``).
    overwrite : bool
        Replace an existing ``out``.
    explain : bool
        Return the :class:`~blocklin.plan.solve.SolvePlan` without running (kept for compatibility:
        :func:`solve_plan` returns it and always one type).
    resume : bool
        Continue an interrupted run (SIGKILL, Ctrl-C) with the same inputs and parameters: the
        results of its finished passes are loaded instead of recomputed (bit-identical ``x``). The
        square routes (LU, Cholesky) and the stored-Gram route (a Gram matrix over the budget) skip the
        finished tiles of their factorization and their finished steps, kept in a deterministic work
        folder under the temp dir (removed by ``blocklin clean`` once its run is gone).
    fit_intercept : bool
        Fit ``A x + 1 x0 ~ b`` with an unpenalized intercept ``x0`` (per right-hand side), as
        ``sklearn.linear_model.Ridge(alpha=lam**2, fit_intercept=True)``: ``x`` solves the problem
        on the centered ``A - 1 mu^T`` and ``b - 1 bbar``, and ``x0 = bbar - mu^T x``. Nothing is
        copied: tall ``A`` takes one more pass for the column means and the Gram quantities and
        refinement residuals get rank-one corrections (``A_c^T A_c = A^T A - m mu mu^T``); wide ``A``
        centers the in-memory ``A A^T`` on both sides. Uses the normal equations (``method="qr"`` is
        refused: the streaming R factor is not centered); lambda sequences and rules then use the
        eigen-decomposition of the centered Gram matrix.
    **settings
        As for every operation: :class:`~blocklin.config.Settings`. The passes of this solver run on the CPU.

    Returns
    -------
    Matrix
        ``x`` with ``.report``: ``lam``, ``method`` and ``method_reason``, ``residual_norm``
        (``||A x - b||_2`` per right-hand side), ``solution_norm``, ``objective``, ``passes``,
        ``seconds``, ``peak_memory``, ``cond_estimate`` (of ``A``, or of the regularized problem), and
        ``curve`` for GCV/L-curve. With ``fit_intercept``: ``x.intercept`` (NumPy, ``k`` values, or
        ``L x k`` for a sequence of ``L`` lambdas) and ``report["intercept"]`` (the same as lists).

    Raises
    ------
    ShapeError
        ``b`` does not have one row per row of ``A``.
    ValueError
        ``lam`` negative, NaN, or an unknown rule; unknown ``method``.
    SingularMatrixError
        ``lam = 0`` and ``A`` rank-deficient (numerically): the message gives the condition estimate
        and suggests ``lam > 0`` or ``lam="gcv"``.
    NonFiniteError
        NaN or Inf in ``A`` or ``b``.

    Notes
    -----
    ``cond(A^T A + lam^2 I) <= 1 + (sigma_1 / lam)^2``. Residual and solution norms of the QR and
    sequence routes come from the SVD of ``R`` (``||r||^2 = rho_0^2 + sum (lam^2 beta_i / (s_i^2 + lam^2))^2``);
    the normal route reports ``||b - A x||`` from its refinement pass, updated for the last correction.
    Memory: the in-core problem is ``O((n + k)^2)`` (``O(m^2)`` for wide ``A``); ``A`` streams in row
    strips within the budget. When that in-core problem exceeds the budget (one scalar ``lam``,
    ``method`` "auto" or "normal"), the regularized Gram matrix is stored instead and factored by the
    out-of-core tiled Cholesky (:func:`blocklin.linalg.solve.stored_gram.solve_gram_out_of_core`; the report's
    ``method_reason`` says so), at the accuracy of the normal equations with one refinement step.

    Examples
    --------
    >>> import numpy as np
    >>> import blocklin as bl
    >>> a = np.random.default_rng(0).standard_normal((200, 5))
    >>> x = bl.solve(a, a @ np.arange(5.0)[:, None], lam=0.0)   # ordinary least squares
    >>> np.allclose(x.to_numpy().ravel(), [0, 1, 2, 3, 4]), x.report["method"]
    (True, 'normal')
    """
    method = choice("method", method, METHODS, fix="pass method='auto'")
    assume_a = choice("assume_a", assume_a, ASSUME, fix="pass assume_a='gen' (least squares; LU when square), "
                      "'pos' (SPD) or 'sym' (symmetric)")
    kind, lams = _parse_lam(lam)
    from blocklin.linalg.solve.square import solve_precision

    precision = solve_precision(precision)
    if fit_intercept and assume_a != "gen":
        raise ParameterError(_msg("fit_intercept", "needs the least-squares problem (assume_a='gen')",
                                  f"fit_intercept=True with assume_a={assume_a!r}", "drop fit_intercept, or leave "
                                  "assume_a='gen'"))
    reason = _square_reason(a, b, assume_a=assume_a, kind=kind, lams=lams, method=method,
                            fit_intercept=fit_intercept, precision=precision)
    if assume_a != "gen" or reason is not None:
        return _solve_square(a, b, assume_a=assume_a, kind=kind, lams=lams, method=method, out=out,
                             overwrite=overwrite, explain=explain, precision=precision, reason=reason, resume=resume,
                             settings=settings)
    refine = count("refine", refine, minimum=0, auto=("auto",), maximum=MAX_REFINE, fix="pass refine=1")
    if explain:  # the plan alone: solve_plan
        return solve_plan(a, b, lam=lam, method=method, refine=refine, **settings)
    with Job("solve", **settings) as job:
        A, B = _operands(job, a, b)
        (m, n), k = A.shape, B.shape[1]
        if _gram_exceeds_budget(job, A, B, kind, method):  # the stored-Gram route does not scale A: lam as given
            _check_lam_max(lams)
        if _gram_exceeds_budget(job, A, B, kind, method):
            if fit_intercept:
                raise ParameterError(_msg("fit_intercept", "needs the Gram matrix of the centered problem in "
                                          "memory (the stored, out-of-core Gram route does not center)",
                                          f"min(m, n) = {min(m, n)} needs {format_size(small_bytes(min(m, n), k))}, "
                                          f"over the budget of {format_size(job.cfg.memory)}", "raise memory=, or "
                                          "center A and b "
                                          "yourself and solve without fit_intercept"))
            return _solve_gram_stored(job, A, B, lams[0], out=out, overwrite=overwrite, explain=False,
                                      refine=refine, params={"lam": lam, "method": method}, resume=resume)
        plan = plan_solve(m, n, k, method=method, memory=job.cfg.memory, lam_kind=kind,
                          refine=1 if refine == "auto" else refine)
        if plan.orientation == "wide" and method == "qr":
            raise ParameterError(_msg("method", "'qr' needs a tall or square a (rows >= columns)",
                                      f"a {m} x {n}", "pass method='normal' (the dual form "
                                      "x = A^T (A A^T + lam^2 I)^-1 b, used by 'auto'), or solve the transposed "
                                      "problem"))
        if fit_intercept and method == "qr":
            raise ParameterError(_msg("method", "'qr' cannot fit an intercept (the streaming R factor is of the "
                                      "uncentered A)", "method='qr' with fit_intercept=True",
                                      "pass method='auto' or 'normal' (the centered normal equations), or center "
                                      "A and b yourself"))
        ao = job.output(out, inputs=[o.path for o in (A, B) if not o.staged], overwrite=overwrite,
                        resume=resume, token=_token(A, B, lam, method, refine, fit_intercept, plan))
        ctx = _Ctx(job=job, A=A, B=B, m=m, n=n, k=k, kind=kind, lams=lams, refine=refine, method=method,
                   intercept=bool(fit_intercept), saved=StepRecords(ao.done if out is not None else None))
        ctx.sa = Scaling(str(source(A).path), A.dtype)
        ctx.sb = Scaling(str(source(B).path), B.dtype)
        solve_route = _solve_wide if plan.orientation == "wide" else _solve_tall
        info = _unscale_info(ctx, solve_route(ctx, ao.array_path()))
        _check_finite_info(info)
        info.setdefault("phases", ctx.phases)
        info["fit_intercept"] = bool(fit_intercept)
        info["resumed_passes"] = list(ctx.saved.loaded)
        report = job.report(orientation=plan.orientation, **info)
        params = {"lam": lam.tolist() if isinstance(lam, np.ndarray) else lam, "method": method,
                  "fit_intercept": bool(fit_intercept)}
        path = ao.commit("solve", plan=plan.to_dict(), params=params, report=job.brief(report, REPORT_KEYS))
        x = Matrix(path, report=report, temporary=out is None)
        x.intercept = np.asarray(report["intercept"]) if fit_intercept else None
        return x


def solve_plan(a: Any, b: Any, *, lam: Any = 0.0, method: str = "auto", refine: Any = "auto",
               **settings: Unpack[Settings]) -> Any:
    """The plan that :func:`solve` would run, without running it (what ``blocklin solve --explain``
    prints): a :class:`~blocklin.plan.solve.SolvePlan`, or the out-of-core Cholesky plan when the
    regularized Gram matrix exceeds the budget, or the out-of-core LU's plan for a square system
    (square ``a``, ``lam=0``, ``method="auto"``); same parameters as :func:`solve`."""
    method = choice("method", method, METHODS, fix="pass method='auto'")
    kind, lams = _parse_lam(lam)
    refine = count("refine", refine, minimum=0, auto=("auto",), maximum=MAX_REFINE, fix="pass refine=1")
    if _square_reason(a, b, assume_a="gen", kind=kind, lams=lams, method=method, fit_intercept=False,
                      precision="double"):  # a square system: the LU's plan
        from blocklin.linalg.factor.lu import lu

        return lu(a, explain=True, **settings)
    with Job("solve", **settings) as job:
        A, B = _operands(job, a, b)
        if _gram_exceeds_budget(job, A, B, kind, method):
            return _solve_gram_stored(job, A, B, lams[0], out=None, overwrite=False, explain=True, refine=refine,
                                      params={})
        return plan_solve(A.shape[0], A.shape[1], B.shape[1], method=method, memory=job.cfg.memory, lam_kind=kind,
                          refine=1 if refine == "auto" else refine)


def _token(A: Any, B: Any, lam: Any, method: str, refine: Any, fit_intercept: bool, plan: SolvePlan) -> str:
    """Deterministic in the inputs, parameters and plan: what resuming an output checks."""
    lam = lam.tolist() if isinstance(lam, np.ndarray) else lam
    return resume_token("solve", [A, B], lam, method, refine, bool(fit_intercept), plan.to_dict())


def _operands(job: Job, a: Any, b: Any) -> tuple[Any, Any]:
    """``A`` and ``B`` (a 1-D ``b`` as one column), checked."""
    if isinstance(b, np.ndarray) and b.ndim == 1:
        b = b.reshape(-1, 1)
    A, B = job.operand(a, "a"), job.operand(b, "b")
    same_rows(A, B)
    float_operand(A, "solve"), float_operand(B, "solve")
    same_dtype(A, B)
    return A, B


def _gram_exceeds_budget(job: Job, A: Any, B: Any, kind: str, method: str) -> bool:
    """A single-lambda solve whose in-core Gram problem does not fit: the stored-Gram Cholesky route."""
    return small_bytes(min(A.shape), B.shape[1]) > job.cfg.memory and kind == "scalar" and method != "qr"


def _solve_gram_stored(job: Job, A: Any, B: Any, lam: float, *, out: Any, overwrite: bool, explain: bool,
                       refine: Any, params: dict, resume: bool = False) -> Any:
    """The regularized Gram matrix exceeds the budget: store it and factor it out of core."""
    from blocklin.linalg.solve.stored_gram import solve_gram_out_of_core
    from blocklin.plan.factor import plan_factor

    (m, n), side = A.shape, min(A.shape)
    if explain:
        return plan_factor("cholesky", side, np.float64, memory=job.cfg.memory, workers=job.workers(1))
    token = _stored_gram_token(job, A, B, lam, refine, out)
    ao = job.output(out, inputs=[o.path for o in (A, B) if not o.staged], overwrite=overwrite, resume=resume,
                    token=token)
    info = solve_gram_out_of_core(job, A, B, lam, ao, refine=refine, resume=resume, token=token)
    report = job.report(orientation="wide" if m < n else "tall", **info)
    path = ao.commit("solve", plan=info.get("plan", {}), params=params, report=job.brief(report, REPORT_KEYS))
    return Matrix(path, report=report, temporary=out is None)


def _stored_gram_token(job: Job, A: Any, B: Any, lam: float, refine: Any, out: Any) -> str:
    """Deterministic in what decides the stored-Gram route's bits: inputs, ``lam``, ``refine``, output and the
    settings its tile plans depend on."""
    return resume_token("solve-gram", [A, B], lam, refine, str(out), plan_settings(job))


def _square_reason(a: Any, b: Any, *, assume_a: str, kind: str, lams: list[float], method: str, fit_intercept: bool,
                   precision: str) -> str | None:
    """Why a ``gen`` problem is solved as a square system (None: least squares); ``precision="mixed"``
    is refused where no square route runs."""
    from blocklin.linalg.solve.square import dtypes_known_equal, operand_shape, square_route

    shape = operand_shape(a) if assume_a == "gen" else None
    reason = square_route(shape, assume_a=assume_a, lam_kind=kind, lams=lams, method=method,
                          fit_intercept=fit_intercept, same_dtypes=dtypes_known_equal(a, b)) if shape is not None else None
    if assume_a == "gen" and reason is None and precision != "double":
        raise ParameterError(_msg("precision", f"'{precision}' applies to square systems (square a, lam=0, method='auto', "
                                  "or assume_a='pos'/'sym')", f"precision={precision!r} for a least-squares problem "
                                  f"(a {shape}, lam {lams or kind}, method {method!r})", "drop precision="))
    return reason


def _solve_square(a: Any, b: Any, *, assume_a: str, kind: str, lams: list[float], method: str, out: Any,
                  overwrite: bool, explain: bool, precision: str, reason: str | None, resume: bool, settings: dict) -> Any:
    """The square routes: Cholesky (``pos``, ``sym``) or LU (``gen``, ``sym``) of ``A`` itself, any size."""
    if kind != "scalar" or lams[0] != 0.0:
        raise ParameterError(_msg("lam", f"must be 0 with assume_a='{assume_a}' (A itself is factored)",
                                  repr(lams or kind), "drop lam, or leave assume_a='gen' for the regularized "
                                  "least-squares problem"))
    if method != "auto":
        raise ParameterError(_msg("method", f"must be 'auto' with assume_a='{assume_a}' (the method is "
                                  f"{'Cholesky' if assume_a == 'pos' else 'Cholesky or LU'})", repr(method),
                                  "drop method="))
    if explain:
        from blocklin.linalg.factor.cholesky import cholesky
        from blocklin.linalg.factor.lu import lu

        return (cholesky if assume_a == "pos" else lu)(a, explain=True, **settings)
    from blocklin.linalg.solve.square import solve_square

    return solve_square(a, b, out, assume_a=assume_a, precision=precision, reason=reason, overwrite=overwrite,
                        resume=resume, **settings)


#: Report entries recorded in the output's attributes.
REPORT_KEYS = ("lam", "method", "method_reason", "residual_norm", "solution_norm", "passes", "seconds", "intercept",
               "resumed_passes", "scaling")


@dataclasses.dataclass
class _Ctx:
    job: Job
    A: Any
    B: Any
    m: int
    n: int
    k: int
    kind: str
    lams: list[float]
    refine: Any
    method: str
    phases: dict = dataclasses.field(default_factory=dict)  # pass -> device it ran on, for the report
    intercept: bool = False
    #: fit_intercept on tall A: column means of A (float64) and of b, from one pass over each
    mu: np.ndarray | None = None
    bbar: np.ndarray | None = None
    #: results of finished passes, kept for resume=True (runtime/stages.py)
    saved: StepRecords = dataclasses.field(default_factory=lambda: StepRecords(None))
    #: the powers of two A and B are divided by as they are read (blocklin.linalg.blocks.scaling); the problem
    #: solved is then 2^-ea A x' = 2^-eb b with lam' = 2^-ea lam, and x = 2^(eb - ea) x'
    sa: Scaling | None = None
    sb: Scaling | None = None
    #: whether ``lams`` are already those of the scaled problem
    scaled_lams: bool = False

    def scaled_run(self, run: Any) -> dict:
        """``run(scale)`` a pass over ``A`` and ``B`` (made again scaled when its first reading finds
        data outside the safe range); its result records the exponents (a resumed run reads them)."""
        out = self.sa.run(self.job, run, others=(self.sb,))
        return out | {"ea": self.sa.exponent, "eb": self.sb.exponent}

    def adopt(self, rec: dict) -> None:
        """The exponents of a pass's record (fresh or resumed); ``lams`` of the scaled problem."""
        if "ea" in rec and not self.sa.known:
            self.sa.e, self.sb.e = int(rec["ea"]), int(rec["eb"])
        if not self.scaled_lams:
            _check_lam_max(self.lams, self.sa.exponent)
            self.lams = [float(np.ldexp(lam, -self.sa.exponent)) for lam in self.lams]
            self.scaled_lams = True

    @property
    def scale(self) -> dict:
        return self.sa.params() | self.sb.params()

    def offset(self, x: np.ndarray) -> np.ndarray:
        """The intercept ``bbar - mu^T x`` of a solution of the centered problem."""
        return self.bbar - self.mu @ x


def _check_finite_info(info: dict) -> None:
    """A NaN residual or solution norm is never reported (it would read as a finished solve)."""
    for key in ("residual_norm", "solution_norm"):
        if key in info:
            check_finite_result(key, np.asarray(info[key], dtype=np.float64),
                                f"the solve's {key.replace('_', ' ')} (method {info.get('method')})")


def _norms(values: np.ndarray) -> Any:
    v = np.sqrt(np.maximum(np.asarray(values, dtype=float), 0.0))
    return float(v[0]) if v.size == 1 else v.tolist()


def _singular(cond: float, what: str) -> SingularMatrixError:
    return SingularMatrixError(_msg(
        "a", f"must have full {what} rank for lam = 0 (ordinary least squares)",
        f"a numerically rank-deficient matrix (condition estimate {cond:.1e})",
        "regularize with lam > 0, e.g. blocklin.solve(a, b, lam=1e-3 * ||A||), or let lam='gcv' choose it"))


def _pass_device(ctx: _Ctx, phase: str, flops: float) -> str:
    """Device of a pass over A and B (``auto``: the GPU only where it wins), recorded for the report."""
    from blocklin.device import pass_device

    read = ctx.m * (ctx.n * ctx.A.dtype.itemsize + ctx.k * ctx.B.dtype.itemsize)
    dev = pass_device(ctx.job.cfg.device, flops, read, ctx.job.device)
    ctx.phases[phase] = dev
    return dev


def _gram_pass(ctx: _Ctx) -> dict:
    """``A^T A``, ``A^T b``, ``||b||^2``, ``||A||_F^2`` (saved for resume)."""
    gp = ctx.saved.run("gram-pass", lambda: ctx.scaled_run(lambda sc: _run_gram_pass(ctx, sc)))
    ctx.adopt(gp)
    gp["aa"] = float(gp["aa"])
    return gp


def _run_gram_pass(ctx: _Ctx, scale: dict) -> dict:
    states, _ = run_pass(ctx.job, gram_kernel, [source(ctx.A), source(ctx.B)], {"dtype": "float64"},
                         reserve=small_bytes(ctx.n, ctx.k), description="Gram pass: A^T A, A^T b", scale=scale,
                         device=_pass_device(ctx, "gram pass", ctx.m * ctx.n * (ctx.n + 2 * ctx.k)))
    states = [s for s in states if s is not None]
    g = states[0]["g"]
    for s in states[1:]:
        g += s["g"]
    g = symmetrize_lower(g)
    c = sum(s["c"] for s in states)
    return {"g": g, "c": c, "bb": sum(s["bb"] for s in states), "aa": float(np.trace(g))}


def _residual_pass(ctx: _Ctx, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``A^T (b - A x)`` and ``||b - A x||^2`` (saved for resume under a token of ``x``)."""
    from dask.base import tokenize

    r = ctx.saved.run(f"residual-{tokenize(x)[:16]}", lambda: dict(zip(("atr", "rr"), _run_residual_pass(ctx, x))))
    return r["atr"], r["rr"]


def _run_residual_pass(ctx: _Ctx, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    states, _ = run_pass(ctx.job, residual_kernel, [source(ctx.A), source(ctx.B)], {"dtype": "float64", "x": x},
                         reserve=small_bytes(ctx.n, ctx.k), check_finite=False, scale=ctx.scale,
                         description="refinement pass: A^T (b - A x)",
                         device=_pass_device(ctx, "residual pass", 4 * ctx.m * ctx.n * ctx.k))
    states = [s for s in states if s is not None]
    atr, rr = sum(s["atr"] for s in states), sum(s["rr"] for s in states)
    if ctx.mu is not None:  # centered: A_c^T r_c = A^T r - m mu d, ||r_c||^2 = ||r||^2 - m d^2, d = bbar - mu^T x
        d = ctx.offset(x)
        atr, rr = atr - ctx.m * np.outer(ctx.mu, d), rr - ctx.m * d**2
    return atr, rr


def _center_gram(ctx: _Ctx, gp: dict) -> dict:
    """fit_intercept: the means of ``A`` and ``b`` (one pass each) and the Gram quantities of the centered
    problem by rank-one corrections, ``A_c^T A_c = A^T A - m mu mu^T``, ``A_c^T b_c = A^T b - m mu bbar^T``."""
    means = ctx.saved.run("means", lambda: {"mu": column_moments(ctx.job, ctx.A, scale=ctx.sa.params()).mean,
                                         "bbar": column_moments(ctx.job, ctx.B, over="b", scale=ctx.sb.params()).mean})
    ctx.mu, ctx.bbar = means["mu"], means["bbar"]
    m, mu, bbar = ctx.m, ctx.mu, ctx.bbar
    g = gp["g"] - m * np.outer(mu, mu)
    return {"g": (g + g.T) / 2, "c": gp["c"] - m * np.outer(mu, bbar), "bb": gp["bb"] - m * bbar**2,
            "aa": max(gp["aa"] - m * float(mu @ mu), 0.0)}


def _solve_tall(ctx: _Ctx, x_path: str) -> dict:
    """Tall or square ``A``: normal equations when well conditioned, else the streaming QR; writes ``x``."""
    if ctx.intercept:
        return _solve_tall_centered(ctx, x_path)
    if ctx.method == "qr":
        return _qr_route(ctx, x_path, {}, "requested")
    if ctx.method == "auto" and ctx.kind != "scalar":
        return _solve_tall_spectral(ctx, x_path)
    gp = _gram_pass(ctx)
    if ctx.kind != "scalar":  # method="normal" with several lambdas: eigen-decomposition of A^T A
        spec = _spectrum_from_gram(gp["g"], gp["c"], gp["bb"], ctx.m, dual=False, n=ctx.n)
        info = {"method": "normal", "method_reason": "requested (eigen-decomposition of A^T A; prefer 'qr' for "
                "small lambda)"}
        return _finish_spectral(ctx, spec, info, x_path)
    lam = ctx.lams[0]
    cf, rcond = _factor_regularized(gp["g"], lam)
    info = {"rcond_normal": rcond}
    if cf is None or rcond < AUTO_RCOND:
        if ctx.method == "auto":
            return _qr_route(ctx, x_path, info, f"A^T A + lam^2 I is ill-conditioned (reciprocal condition "
                             f"{rcond:.1e} < {AUTO_RCOND:.0e}): switched to the streaming QR (one more pass)")
        _refuse_or_warn(cf, rcond, lam)
    x, rr, steps, source = _solve_refined(ctx, gp, cf, rcond, lam)
    xx = np.einsum("ij,ij->j", x, x)
    reason = "requested" if ctx.method == "normal" else \
        f"well conditioned (reciprocal condition of A^T A + lam^2 I {rcond:.1e})"
    info.update(residual_norm_source=source, method="normal", method_reason=reason, lam=lam,
                residual_norm=_norms(rr), solution_norm=_norms(xx), objective=_norms(rr + lam**2 * xx),
                refine_steps=steps, cond_estimate=float(1.0 / math.sqrt(rcond)) if rcond > 0 else float("inf"),
                norm_a=math.sqrt(gp["aa"]))
    _write_x(ctx, x_path, x)
    return info


def _solve_tall_spectral(ctx: _Ctx, x_path: str) -> dict:
    """``method="auto"`` with a sequence or a rule: the one-pass spectrum of ``A^T A`` where the
    conditioning allows it (:func:`blocklin.linalg.solve.lambda_select.spectrum_route`), else the streaming QR.

    A rule's choice is then solved and refined as a single ``lam`` would be.
    """
    gp = _gram_pass(ctx)
    spec = _spectrum_from_gram(gp["g"], gp["c"], gp["bb"], ctx.m, dual=False, n=ctx.n)
    rule = ctx.kind if ctx.kind in ("gcv", "lcurve") else None
    if rule:
        lam, curve = lambda_select.choose_lambda(spec, rule, quiet=True)
        lams = [lam]
    else:
        lams, curve = list(ctx.lams), None
    ok, rc, reason = lambda_select.spectrum_route(spec.s, lams, rule, rcond_rule=AUTO_RCOND,
                                                  rcond_sequence=AUTO_REFINE_RCOND)
    cf, rcond = _factor_regularized(gp["g"], lams[0]) if ok and rule else (None, rc)
    if not ok or (rule and (cf is None or rcond < AUTO_RCOND)):
        return _qr_route(ctx, x_path, {"rcond_normal": rc}, reason)
    info = {"method": "normal", "method_reason": reason, "rcond_normal": rc}
    if rule is None:
        return _finish_spectral(ctx, spec, info, x_path)
    lambda_select.warn_at_end(curve, rule)
    x, rr, steps, src = _solve_refined(ctx, gp, cf, rcond, lams[0])
    _describe(info, spec, lams, curve, ctx)
    xx = np.einsum("ij,ij->j", x, x)
    smin = float(spec.s.min()) if spec.s.size else 0.0
    info.update(residual_norm=_norms(rr), solution_norm=_norms(xx), objective=_norms(rr + lams[0] ** 2 * xx),
                refine_steps=steps, residual_norm_source=src, norm_a=math.sqrt(gp["aa"]),
                cond_estimate=float(spec.s.max()) / smin if smin > 0 else float("inf"))
    _write_x(ctx, x_path, x)
    return info


def _solve_tall_centered(ctx: _Ctx, x_path: str) -> dict:
    """fit_intercept on tall ``A``: the normal-equations route on the rank-one corrected Gram quantities."""
    gp = _center_gram(ctx, _gram_pass(ctx))
    if ctx.kind != "scalar":
        spec = _spectrum_from_gram(gp["g"], gp["c"], gp["bb"], ctx.m, dual=False, n=ctx.n)
        info = {"method": "normal", "method_reason": "fit_intercept: eigen-decomposition of the centered "
                "A^T A (rank-one corrected)"}
        xs = _coefficients(ctx, spec, info, "column")
        info["intercept"] = [ctx.offset(x).tolist() for x in xs] if len(xs) > 1 else ctx.offset(xs[0]).tolist()
        _write_x(ctx, x_path, np.hstack(xs) if len(xs) > 1 else xs[0])
        return info
    lam = ctx.lams[0]
    cf, rcond = _factor_regularized(gp["g"], lam)
    if cf is None or rcond < AUTO_RCOND:
        _refuse_or_warn(cf, rcond, lam)
    x, rr, steps, source = _solve_refined(ctx, gp, cf, rcond, lam)
    xx = np.einsum("ij,ij->j", x, x)
    info = {"rcond_normal": rcond, "residual_norm_source": source, "method": "normal",
            "method_reason": "fit_intercept: the centered normal equations (rank-one corrected A^T A)", "lam": lam,
            "residual_norm": _norms(rr), "solution_norm": _norms(xx), "objective": _norms(rr + lam**2 * xx),
            "refine_steps": steps, "cond_estimate": float(1.0 / math.sqrt(rcond)) if rcond > 0 else float("inf"),
            "norm_a": math.sqrt(gp["aa"]), "intercept": ctx.offset(x).tolist()}
    _write_x(ctx, x_path, x)
    return info


def _factor_regularized(g: np.ndarray, lam: float) -> tuple[Any, float]:
    """Cholesky factor of ``A^T A + lam^2 I`` and its reciprocal condition estimate (None, 0 when it fails)."""
    from scipy.linalg import cho_factor, lapack

    from blocklin.device.cpu import potrf_threads

    kmat = g.copy()
    kmat[np.diag_indices_from(kmat)] += lam**2
    anorm = float(np.abs(kmat).sum(axis=0).max()) if kmat.size else 0.0
    try:
        with potrf_threads(kmat.shape[0]):
            cf = cho_factor(kmat, lower=False, check_finite=False)
        return cf, float(lapack.dpocon(cf[0], anorm, uplo="U")[0]) if g.shape[0] else 1.0
    except np.linalg.LinAlgError:
        return None, 0.0


def _refuse_or_warn(cf: Any, rcond: float, lam: float) -> None:
    """``method="normal"`` on an ill-conditioned problem: refuse a singular one, warn otherwise."""
    if cf is None or rcond < np.finfo(np.float64).eps:
        if lam == 0:
            raise _singular(1.0 / max(rcond, 1e-300) ** 0.5, "column")
        raise SingularMatrixError(_msg("a", "A^T A + lam^2 I must be positive definite",
                                       f"Cholesky failed (reciprocal condition {rcond:.1e})",
                                       "use method='qr' or a larger lam"))
    warn(f"solve: A^T A + lam^2 I has reciprocal condition {rcond:.1e}; the normal equations may lose "
         "accuracy (refinement helps); method='qr' avoids squaring the condition number")


def _solve_refined(ctx: _Ctx, gp: dict, cf: Any, rcond: float, lam: float) -> tuple[np.ndarray, np.ndarray, int, str]:
    """``x`` from the normal equations and refinement passes; ``||b - A x||^2``, the steps, its source."""
    from scipy.linalg import cho_solve

    g, c = gp["g"], gp["c"]
    x = cho_solve(cf, c, check_finite=False)
    rr_gram = gp["bb"] - 2 * np.einsum("ij,ij->j", x, c) + np.einsum("ij,ij->j", x, g @ x)
    # "auto" refines when ill-conditioned, or when ||r||^2 from the Gram quantities suffers
    # cancellation (a residual far below ||b||: an accurate one needs the pass anyway)
    small_residual = bool(np.any(rr_gram < 1e-6 * gp["bb"]))
    n_refine = (1 if rcond < AUTO_REFINE_RCOND or small_residual else 0) if ctx.refine == "auto" else ctx.refine
    rr = None
    for _ in range(n_refine):
        atr, rr = _residual_pass(ctx, x)
        d = cho_solve(cf, atr - lam**2 * x, check_finite=False)
        # ||r - A d||^2 = ||r||^2 - 2 d^T A^T r + d^T G d (exact algebra; d is tiny)
        rr = rr - 2 * np.einsum("ij,ij->j", d, atr) + np.einsum("ij,ij->j", d, g @ d)
        x = x + d
    if rr is None:
        return x, rr_gram, 0, "Gram quantities"
    return x, rr, n_refine, "refinement pass"


def _qr_route(ctx: _Ctx, x_path: str, info: dict, reason: str) -> dict:
    def run(scale: dict) -> dict:
        sr = tsqr_pass(ctx.job, ctx.A, ctx.B, np.float64, scale=scale,
                       device=_pass_device(ctx, "tsqr pass", 2.0 * ctx.m * (ctx.n + ctx.k) ** 2))
        return {"r": sr.r, "qtb": sr.qtb, "rho": sr.rho, "norm_a": sr.norm_a}

    sr = ctx.saved.run("tsqr-pass", lambda: ctx.scaled_run(run))
    ctx.adopt(sr)
    spec = _spectrum_from_r(sr["r"], sr["qtb"], sr["rho"], ctx.m)
    info.update(method="qr", method_reason=reason, norm_a=float(sr["norm_a"]))
    return _finish_spectral(ctx, spec, info, x_path)


def _write_x(ctx: _Ctx, x_path: str, x: np.ndarray) -> None:
    out_dtype = np.result_type(ctx.A.dtype, ctx.B.dtype)
    if ctx.sa is not None and ctx.sa.known:  # x of the scaled problem: x = 2^(eb - ea) x'
        x = _unscaled_x(x, ctx.sb.exponent - ctx.sa.exponent, out_dtype)
    chunks = auto_chunks(x.shape, out_dtype, ctx.job.cfg.memory)
    arr = create_array(x_path, shape=x.shape, dtype=out_dtype, chunks=chunks, codec=ctx.job.cfg.codec)
    write_block(arr, slice(0, x.shape[0]), slice(0, x.shape[1]), x.astype(out_dtype, copy=False))


def _unscaled_x(x: np.ndarray, e: int, dtype: Any) -> np.ndarray:
    """``2^e x``; a solution beyond the output dtype's range raises (never an Inf written silently)."""
    if not e:
        return x
    with np.errstate(over="ignore", under="ignore"):
        out = np.ldexp(x, e)
    if not np.isfinite(out.astype(dtype, copy=False)).all():
        raise ParameterError(_msg("b", f"must give a solution within the range of {np.dtype(dtype).name}",
                                  f"a solution x of norm about 2^{int(np.frexp(np.linalg.norm(x))[1]) + e}",
                                  "scale b down (or a up) by a power of two and scale x back yourself"))
    return out


def _unscale_info(ctx: _Ctx, info: dict) -> dict:
    """The report of the scaled problem in the units of the problem given: ``lam``, norms of ``A``,
    residuals (``2^eb``), solutions (``2^(eb - ea)``), the intercept and the lambda curve."""
    if ctx.sa is None or not (ctx.sa.exponent or ctx.sb.exponent):
        return info
    ea, eb = ctx.sa.exponent, ctx.sb.exponent

    def sc(v: Any, e: int) -> Any:
        if v is None or isinstance(v, str):
            return v
        if isinstance(v, (list, tuple)):
            return [sc(x, e) for x in v]
        with np.errstate(over="ignore", under="ignore"):
            return float(np.ldexp(float(v), e))

    for key, e in (("lam", ea), ("norm_a", ea), ("residual_norm", eb), ("objective", eb),
                   ("solution_norm", eb - ea), ("intercept", eb)):
        if key in info:
            info[key] = sc(info[key], e)
    if "gcv" in info:  # m ||r||^2 / (m - dof)^2
        info["gcv"] = sc(info["gcv"], 2 * eb)
    curve = info.get("curve")
    if isinstance(curve, dict):
        for key, e in (("lam", ea), ("chosen", ea), ("residual_norm", eb), ("solution_norm", eb - ea),
                       ("gcv", 2 * eb)):
            if key in curve:
                curve[key] = sc(curve[key], e)
    info["scaling"] = {"exponent_a": ea, "exponent_b": eb, "max_abs_a": ctx.sa.amax, "max_abs_b": ctx.sb.amax,
                       "extra_passes": ctx.sa.extra_passes,
                       "note": f"solved 2^{-ea} A x' = 2^{-eb} b with lam' = 2^{-ea} lam (exact powers of two); "
                               f"x = 2^{eb - ea} x'"}
    return info


def _finish_spectral(ctx: _Ctx, spec: Spectrum, info: dict, x_path: str) -> dict:
    """Pick lambda(s), evaluate the solution(s) of a tall problem from its spectrum, write ``x``."""
    xs = _coefficients(ctx, spec, info, "column")
    _write_x(ctx, x_path, np.hstack(xs) if len(xs) > 1 else xs[0])
    return info


def _coefficients(ctx: _Ctx, spec: Spectrum, info: dict, rank: str) -> list[np.ndarray]:
    """The chosen lambda(s) and their coefficients; refuses ``lam = 0`` on a rank-deficient problem."""
    lams, curve = _lambdas(ctx, spec)
    smax = float(spec.s.max()) if spec.s.size else 0.0
    smin = float(spec.s.min()) if spec.s.size else 0.0
    info["cond_estimate"] = smax / smin if smin > 0 else float("inf")
    if min(lams) == 0 and (smin <= smax * max(ctx.m, ctx.n) * np.finfo(np.float64).eps or smax == 0):
        raise _singular(info["cond_estimate"], rank)
    xs = [spec.coefficients(lam) for lam in lams]
    _describe(info, spec, lams, curve, ctx)
    return xs


def _lambdas(ctx: _Ctx, spec: Spectrum) -> tuple[list[float], dict | None]:
    if ctx.kind in ("gcv", "lcurve"):
        lam, curve = choose_lambda(spec, ctx.kind)
        return [lam], curve
    return list(ctx.lams), None


def _describe(info: dict, spec: Spectrum, lams: list[float], curve: dict | None, ctx: _Ctx) -> None:
    rr = [spec.residual_sq(l) for l in lams]
    xx = [spec.solution_sq(l) for l in lams]
    if len(lams) == 1 and ctx.kind != "sequence":
        info.update(lam=lams[0], residual_norm=_norms(rr[0]), solution_norm=_norms(xx[0]),
                    objective=_norms(rr[0] + lams[0] ** 2 * xx[0]))
    else:
        info.update(lam=list(lams), residual_norm=[_norms(r) for r in rr], solution_norm=[_norms(x) for x in xx],
                    objective=[_norms(r + l**2 * x) for r, x, l in zip(rr, xx, lams)])
    if curve is not None:
        info["lam_rule"] = ctx.kind
        info["curve"] = curve
        info["gcv"] = spec.gcv(lams[0])


def _wide_gram(ctx: _Ctx) -> dict:
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


def _wide_gram_gemm(ctx: _Ctx) -> np.ndarray:
    """``A A^T`` (``m x m``, in memory) by an out-of-core GEMM into a scratch store."""
    job = ctx.job
    gram = Gemm.of(ctx.A, ctx.A, trans_b=True, dtype="float64")
    plan = gram.plan(job, read_reserve=True)  # measured over budget at 16 MiB without it
    g_path = job.scratch("gram", gram.shape, np.float64, plan.out_chunks)
    gram.run(job, plan, g_path, description="Gram matrix A A^T", count_pass="a")
    return open_zarr(g_path)[...]


def _solve_wide(ctx: _Ctx, x_path: str) -> dict:
    """Dual form: ``A A^T`` by an out-of-core GEMM, eigen-decomposition, ``x = A^T y`` by another.

    Both GEMMs run in the solve's own job (each counted as a pass over ``A``).
    """
    job = ctx.job
    ctx.phases.update({"gram GEMM": job.device, "solution GEMM": job.device})
    rec = ctx.saved.run("wide-gram", lambda: _wide_gram(ctx))
    g, ea = rec["g"], int(rec.get("ea", 0))
    bm = Matrix(ctx.B.path)[...].astype(np.float64)  # m x k, small (m is the short side)
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
    if ctx.intercept:  # A_c A_c^T = P (A A^T) P and b_c = P b with P = I - 1 1^T / m: no means of A needed
        bbar = bm.mean(axis=0)
        bm = bm - bbar
        g = g - g.mean(axis=0)
        g = g - g.mean(axis=1)[:, None]
        g = (g + g.T) / 2
    spec = _spectrum_from_gram(g, bm, np.einsum("ij,ij->j", bm, bm), ctx.m, dual=True, n=ctx.n)
    info = {"method": "normal", "method_reason": "wide a: dual form x = A^T (A A^T + lam^2 I)^-1 b",
            "norm_a": math.sqrt(max(float(np.trace(g)), 0.0))}
    out_dtype = np.result_type(ctx.A.dtype, ctx.B.dtype)
    ys = _coefficients(ctx, spec, info, "row")
    if ctx.intercept:
        # x = A_c^T y = A^T (P y); the intercept bbar - mu^T x with mu^T x = 1^T (A A^T) (P y) / m
        ys = [y - y.mean(axis=0) for y in ys]
        icpt = [bbar - g_raw.mean(axis=0) @ y for y in ys]
        info["intercept"] = [i.tolist() for i in icpt] if len(icpt) > 1 else icpt[0].tolist()
    Y = job.operand(_unscaled_x(np.hstack(ys), eb - ea, out_dtype).astype(out_dtype), "y")
    product = Gemm.of(ctx.A, Y, trans_a=True, dtype=out_dtype, alpha=float(np.ldexp(1.0, -ea)))
    plan = product.plan(job, read_reserve=True)  # measured over budget at 16 MiB without it
    create_array(x_path, shape=product.shape, dtype=out_dtype, chunks=plan.out_chunks, codec=job.cfg.codec)
    product.run(job, plan, x_path, description="x = A^T y", count_pass="a")
    return info


__all__ = ["Spectrum", "choose_lambda", "solve"]
