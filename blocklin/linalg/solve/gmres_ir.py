"""GMRES-based iterative refinement (GMRES-IR) of a square solve from a low-precision factorization.

Carson and Higham (2017), "A new analysis of iterative refinement and its application to accurate
solution of ill-conditioned sparse linear systems", SISC 39(6); Carson and Higham (2018),
"Accelerating the solution of linear systems by iterative refinement in three precisions", SISC
40(2); Haidar, Tomov, Dongarra and Higham (2018), "Harnessing GPU tensor cores for fast FP16
arithmetic to speed up mixed-precision iterative refinement solvers", SC18. Each refinement step
solves the correction equation ``A d = r`` by GMRES in float64 on the left-preconditioned system
``M^-1 A d = M^-1 r``, ``M`` the low-precision factorization (applied in float32), instead of
``d = M^-1 r`` alone: plain refinement contracts the error by about ``cond(A) u_f`` per step and
stalls as that nears 1, GMRES-IR does not.

The out-of-core operations (products with ``A``, the triangular solves, the residual ``B - A X``)
run on stored ``n x k`` work stores; the Krylov vectors and iterates (``n x k`` float64 each) are held
in memory: ``(restart + 5) n k 8`` bytes for a block of ``k`` right-hand sides, planned within the
budget (:func:`krylov_plan`: blocks of columns refined one after another, as the inverse's ``A X = I``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np

from blocklin.errors import BudgetError, ConvergenceError, ParameterError, explain
from blocklin.linalg.blocks.scaling import backward_error, column_norms, fro_norm
from blocklin.runtime.blockops import Region
from blocklin.runtime.powers import ldexp, max_exponent
from blocklin.runtime.tiles import open_array
from blocklin.storage.zarr_store import write_block

#: Float32's unit roundoff: the preconditioner (the triangular solves) runs in float32.
U_PRECOND = 2.0 ** -24
#: GMRES stops a correction solve when the preconditioned residual fell by this factor (Carson and
#: Higham 2017 use 1e-4 to 1e-6; each refinement step then contracts the error by about as much).
GMRES_TOL = 1e-6
#: Most Krylov vectors before a restart, and most GMRES iterations per refinement step.
RESTART = 100
#: The shorter restart taken where it lets more right-hand sides be refined together.
SHORT = 20
MAX_ITER = 400
#: GMRES-IR's limit on ``cond(A) u_p`` (:func:`check_condition`).
LIMIT = 2.0 ** 6
#: Plain refinement is stalled when a step does not cut the backward error by this factor.
STALL = 0.5


@dataclasses.dataclass
class Operators:
    """The out-of-core pieces GMRES-IR works with, on ``n x k`` NumPy arrays (float64).

    ``solve(rhs, dst)`` applies the stored factorization ``F^-1`` between two regions; with a
    scaling (``row``, ``col``, ``mu``: ``F`` factors ``mu diag(row) A diag(col)``) the
    preconditioner is ``M^-1 = mu diag(col) F^-1 diag(row)``.
    """

    gemm: Callable[..., Any]
    solve: Callable[[Region, Region], None]
    a: Region
    b: Region
    #: Work stores (``n x k``, float64): ``v`` (an operand), ``w`` (a result), ``r`` (the residual).
    v: Region
    w: Region
    r: Region
    row: np.ndarray | None = None
    col: np.ndarray | None = None
    mu: float = 1.0
    matvecs: int = 0
    solves: int = 0

    def matvec(self, x: np.ndarray) -> np.ndarray:
        """``A x`` (one out-of-core product, one pass over ``A``)."""
        put(self.v, x)
        self.gemm(self.w, self.v, c=None)
        self.matvecs += 1
        return get(self.w)

    def residual(self, x: np.ndarray) -> np.ndarray:
        """``B - A x`` in float64 (also left in the store ``r``)."""
        put(self.v, x)
        self.gemm(self.r, self.v, c=self.b)
        self.matvecs += 1
        return get(self.r)

    def factor_solve(self, x: np.ndarray) -> np.ndarray:
        """``F^-1 x``: the stored factorization's solves, without the scaling."""
        return self._solve_in_range(x)

    def precond(self, x: np.ndarray) -> np.ndarray:
        """``M^-1 x``: the stored factorization's two triangular solves (in float32), scaled. Each column
        is brought near 1 before the row scaling and multiplied back after the column scaling (powers of
        two: exact), so that neither scaling overflows where ``M^-1 x`` is in range (``A`` near ``2^-1000``
        has row scales near ``2^1000``: ``b`` near ``2^664`` times them had overflowed, and the solves' Inf
        was named a singular ``A``)."""
        if self.row is None and self.col is None:
            return self._solve_in_range(x)
        e = _column_exponents(x)
        y = np.ldexp(x, -e)
        y = self._solve_in_range(y if self.row is None else y * self.row[:, None])
        with np.errstate(over="ignore", under="ignore"):
            y = np.ldexp(y, np.minimum(e, 0))  # the smaller of the two steps first: no needless overflow
            y = y if self.col is None else (self.mu * self.col)[:, None] * y
            return np.ldexp(y, np.maximum(e, 0))

    def _solve_in_range(self, x: np.ndarray) -> np.ndarray:
        """``F^-1 x`` with each column of ``x`` divided by a power of two near its largest magnitude for
        the float32 solves and multiplied back after (exact: the solves are linear, column by column).
        The corrections of a solution near ``2^-100`` sit near float32's underflow threshold: unscaled
        they lost their digits, and GMRES-IR stalled at a backward error of ``2.4e-13`` (``A`` near
        ``2^100``, ``b`` near 1)."""
        e = _column_exponents(x)
        put(self.v, np.ldexp(x, -e))
        self.solve(self.v, self.w)
        self.solves += 1
        with np.errstate(over="ignore", under="ignore"):
            return np.ldexp(get(self.w), e)


def _column_exponents(x: np.ndarray) -> np.ndarray:
    """``e`` (a row, ``1 x k``) with each column's largest magnitude ``f 2^e``, ``f`` in ``[0.5, 1)``; 0 for a
    column of zeros or one that is not finite."""
    top = np.max(np.abs(x), axis=0) if x.size else np.zeros(x.shape[1])
    return np.where((top > 0) & np.isfinite(top), np.frexp(top)[1], 0).astype(np.intc)[None, :]


def put(region: Region, x: np.ndarray) -> None:
    """Write ``x`` (the region's shape) into its store, on the store's chunks."""
    arr = open_array(region.path, mode="r+")
    r0, c0 = region.off
    write_block(arr, slice(r0, r0 + x.shape[0]), slice(c0, c0 + x.shape[1]), np.ascontiguousarray(x, dtype=arr.dtype))


def get(region: Region) -> np.ndarray:
    """The region's values in float64."""
    n, k = region.shape
    return np.array(region.read_stored(slice(0, n), slice(0, k), np.float64), dtype=np.float64, order="C")


def krylov_plan(n: int, k: int, memory: int, *, what: str, chunk: int | None = None) -> tuple[int, int]:
    """The restart length and the width of the blocks of right-hand sides refined together, so that the
    Krylov basis and the iterates of a block (``(restart + 5) n width 8`` bytes) fit half of ``memory``:
    all ``k`` columns with ``min(RESTART, n)`` vectors where they fit, else narrower blocks (multiples of
    ``chunk``, the stores' column chunk, default ``k``'s), else a shorter restart; refused below 5
    vectors of one column, naming the budget that holds it. The refinement's products plan within the
    other half."""
    half = memory // 2
    target = max(1, min(RESTART, n))
    col = 8 * max(n, 1)
    step = max(1, min(k, chunk or k))
    fit = half // ((target + 5) * col)  # columns whose vectors fit at the full restart length
    if fit < min(max(k, 1), step) and half // ((min(target, SHORT) + 5) * col) > fit:
        # many right-hand sides (an inverse): a shorter restart for more of them at a time (a whole chunk
        # where it fits). GMRES-IR's corrections take a few iterations each (about 9 a step at cond 1e2),
        # so a restart of 100 had left room for 2 of an inverse's 190 columns at 4x its least budget: 95
        # blocks, each iteration a pass over the factor, where a restart of 20 holds 11 (52 s -> 9 s; the
        # same steps and backward errors at cond 1e1..1e3, fp16 and bf16, in docs/benchmarks.md)
        target, fit = min(target, SHORT), half // ((min(target, SHORT) + 5) * col)
    if fit >= 1:
        # whole chunks of the stores; narrower than one chunk, a block's tile operations have one column
        # of tiles, so no two tasks write one chunk
        return target, min(max(k, 1), fit // step * step if fit >= step else fit)
    width = 1
    m = half // (col * width) - 5
    if m < 5:
        need = 2 * 10 * col * width
        raise BudgetError(explain(
            "memory", f"{what} holds its GMRES vectors in memory ((restart + 5) n k 8 bytes for a block of k "
            "right-hand sides, restart >= 5, within half the budget)",
            f"memory={memory} bytes for n={n}, a block of {width} right-hand side(s)",
            f"pass memory >= {need} bytes, or precision='mixed' with refinement='plain'"), minimum=need)
    return int(min(m, target)), width


def condition_estimate(ops: Operators, x0: np.ndarray, b: np.ndarray, norm_lower: float, *, steps: int) -> float:
    """A lower estimate of ``cond_2`` of the factored matrix ``A_f`` (``A`` itself, or ``A`` scaled:
    the scaling is exact, so it is ``A_f``'s condition that the float32 solves see): ``||A_f||_2 >=
    norm_lower`` times ``||F^-1 z|| / ||z|| (<= ||A_f^-1||_2`` while ``F`` is close to ``A_f``), the
    largest over the columns of the first solve ``x0 = M^-1 b`` (its ``F^-1 (diag(row) b)``) and
    ``steps`` power steps from it."""
    def ratio(y: np.ndarray, z: np.ndarray) -> float:
        # each divided by a power of two near its largest entry (exact): a norm beyond float64's range
        # (an x near 1e308) had made the estimate inf, refused by the condition rule
        ey, ez = max_exponent(y), max_exponent(z)
        nz = column_norms(ldexp(z, -ez))
        ok = nz > 0
        with np.errstate(over="ignore", under="ignore"):
            return float(np.ldexp(np.max(column_norms(ldexp(y, -ey))[ok] / nz[ok]), ey - ez)) if ok.any() else 0.0

    z = b if ops.row is None else b * ops.row[:, None]
    y = x0 if ops.col is None else x0 / (ops.mu * ops.col)[:, None]
    gamma = ratio(y, z)
    for _ in range(steps):
        ny = column_norms(y)
        if not (np.isfinite(ny).all() and (ny > 0).any()):
            break
        z = y / np.where(ny > 0, ny, 1.0)
        y = ops.factor_solve(z)
        gamma = max(gamma, ratio(y, z))
    return norm_lower * gamma


def check_condition(kappa: float, *, precision: str, kind: str) -> None:
    """Refuse before refining where GMRES-IR cannot converge: ``kappa u_p >= 2^6`` (``kappa >= 2^30``).

    The rule. GMRES-IR converges while the preconditioned operator ``M^-1 A`` is applied accurately
    enough for GMRES in float64 to reduce its residual (Carson and Higham 2017, §3: their analysis
    applies ``M^-1`` in the working precision; with the factorization's error it asks
    ``u kappa(M^-1 A)`` to be small, ``kappa(M^-1 A) <~ (1 + kappa(A) u_f)^2``). Here ``M^-1`` is
    applied in float32 (``u_p = 2^-24``, as the five-precision GMRES-IR of Amestoy, Buttari, Higham,
    L'Excellent, Mary and Vieublé 2024, SIMAX 45(1)): each application is the exact inverse of
    ``M + dM``, ``|dM| <= gamma_n u_p |L||U|`` (Higham 2002, Thm 8.5 and 9.4), which changes
    ``M^-1 A`` by a relative ``~ u_p kappa(A)`` times the rounding errors' growth; the term ``u_p
    kappa(A)`` of their convergence condition must stay small. Their bound is pessimistic (the
    triangular solves' errors are far below ``gamma_n``): randsvd matrices (order 128, geometric
    singular values) converged from a float32 LU up to ``kappa_2 = 1e10`` (``u_p kappa = 600``) and
    not at ``1e11``, and ``kappa`` here is a lower estimate (often ``kappa_2 / 10``), so the limit is
    ``u_p kappa < 2^6``. A matrix the estimate misses stops with a :class:`ConvergenceError`; the
    16-bit factorizations' estimates saturate near ``1 / u_f`` (``M`` itself is that far from ``A``),
    so for them it is the refinement that says so.
    """
    if kappa * U_PRECOND >= LIMIT:
        raise ParameterError(explain(
            "precision", f"'{precision}' refines a {kind} factorization by GMRES-IR with the preconditioner in "
            f"float32 (u_p = 2^-24), which converges while cond(A) u_p < {LIMIT:g}, i.e. cond(A) < {LIMIT / U_PRECOND:.3g}",
            f"cond_2(A) >= {kappa:.3g} (a lower estimate from the factorization)",
            "pass precision='double' (a float64 factorization)"))


def gmres(ops: Operators, r: np.ndarray, *, restart: int, tol: float = GMRES_TOL,
          max_iter: int = MAX_ITER) -> tuple[np.ndarray, int, bool]:
    """``d`` with ``M^-1 A d ~ M^-1 r`` by restarted GMRES(restart) (Saad and Schultz 1986), one
    independent GMRES per column run in lockstep (one product with ``A`` and one preconditioner
    application per iteration for all columns), modified Gram-Schmidt and Givens rotations in float64.

    Returns the correction, the iterations run and whether every column reached ``tol``."""
    n, k = r.shape
    d = np.zeros((n, k))
    z = ops.precond(r)
    # each column's own power of two: columns 2^1000 apart (b's columns near 2^500 and 2^-500) had the small
    # one's norm flushed to 0, read as converged, and that column left at the factorization's accuracy
    beta0 = column_norms(z, per_column=True)
    target = tol * beta0
    its = 0
    converged = bool(np.all(beta0 == 0.0))
    while its < max_iter:
        beta = column_norms(z, per_column=True)
        if np.all(beta <= target):
            break
        V = [z / np.where(beta > 0, beta, 1.0)]
        H = np.zeros((restart + 1, restart, k))
        cs, sn = np.zeros((restart, k)), np.zeros((restart, k))
        g = np.zeros((restart + 1, k))
        g[0] = beta
        j = 0
        while j < restart and its < max_iter:
            w = ops.precond(ops.matvec(V[j]))
            its += 1
            for i in range(j + 1):  # modified Gram-Schmidt, per column
                h = np.einsum("ij,ij->j", V[i], w)
                H[i, j] = h
                w -= V[i] * h
            hn = column_norms(w, per_column=True)
            H[j + 1, j] = hn
            V.append(w / np.where(hn > 0, hn, 1.0))
            for i in range(j):  # earlier rotations on the new column
                hi, hi1 = H[i, j].copy(), H[i + 1, j].copy()
                H[i, j], H[i + 1, j] = cs[i] * hi + sn[i] * hi1, -sn[i] * hi + cs[i] * hi1
            den = np.hypot(H[j, j], H[j + 1, j])
            safe = np.where(den > 0, den, 1.0)
            cs[j], sn[j] = np.where(den > 0, H[j, j] / safe, 1.0), np.where(den > 0, H[j + 1, j] / safe, 0.0)
            H[j, j], H[j + 1, j] = den, 0.0
            g[j + 1], g[j] = -sn[j] * g[j], cs[j] * g[j]
            j += 1
            if np.all(np.abs(g[j]) <= target):
                break
        for c in range(k):  # y from the rotated (upper triangular) Hessenberg matrix, per column
            if beta[c] == 0.0:
                continue
            y = np.linalg.lstsq(np.triu(H[:j, :j, c]), g[:j, c], rcond=None)[0]
            d[:, c] += sum(V[i][:, c] * y[i] for i in range(j))
        converged = bool(np.all(np.abs(g[j]) <= target))
        if converged or its >= max_iter:
            break
        z = ops.precond(r - ops.matvec(d))  # restart from the true preconditioned residual
    return d, its, converged


@dataclasses.dataclass
class Refined:
    """Outcome of :func:`refine_ir`."""

    x: np.ndarray
    residual: float
    eta: float
    steps: int
    history: list[dict]
    norm_x: float
    #: "gmres", "plain", or "plain, then gmres" (plain refinement stalled and GMRES-IR took over).
    kind: str
    #: The first GMRES-IR step's GMRES did not reach its tolerance within :data:`MAX_ITER` iterations.
    gmres_failed: bool = False
    #: GMRES's restart length (:func:`krylov_plan`), 0 where no GMRES step ran.
    restart: int = 0


def refine_ir(ops: Operators, x: np.ndarray, *, norm_a: float, norm_b: float, tol: float, max_steps: int,
              kind: str, restart: int, history: list[dict] | None = None, step0: int = 0) -> Refined:
    """Refine ``x`` while the normwise backward error exceeds ``tol``: ``kind="gmres"`` (GMRES-IR),
    ``"plain"`` (``x += M^-1 r``), ``"auto"`` (plain until a step does not cut the backward error by
    :data:`STALL`, then GMRES-IR). Residuals in float64; every step recorded in ``history`` (step,
    residual, backward error, refinement, GMRES iterations)."""
    history = [] if history is None else history
    mode = "gmres" if kind == "gmres" else "plain"
    ran = [mode] if not history else [history[-1].get("refinement", "plain")]
    steps = step0
    stalled_gmres = 0
    while True:
        r = ops.residual(x)
        res, nx = fro_norm(r), fro_norm(x)
        eta = backward_error(res, norm_a, nx, norm_b)
        prev = history[-1]["backward_error"] if history else None
        history.append({"step": steps, "residual": res, "backward_error": eta, "refinement": mode})
        if eta <= tol or not np.isfinite(eta) or steps - step0 >= max_steps:
            break
        # a stall is judged on the contraction of the current kind of step (not across a switch)
        if prev is not None and history[-2].get("refinement", "plain") == mode and not eta < STALL * prev:
            if mode == "plain" and kind == "auto":
                mode = "gmres"
                history[-1]["refinement"] = "gmres"
                history[-1]["switched"] = f"plain refinement stalled (contraction {eta / prev:.2g} > {STALL})"
            elif mode == "gmres" and stalled_gmres < 1:
                stalled_gmres += 1  # one more step: GMRES-IR may need two to settle
            else:
                break
        if mode == "plain":
            x = x + ops.precond(r)
        else:
            d, its, converged = gmres(ops, r, restart=restart)
            history[-1]["gmres_iterations"] = its
            x = x + d
            if not converged and not any(h.get("gmres_iterations") for h in history[:-1]):
                # a failed first step: GMRES could not solve the preconditioned correction equation, so
                # cond(M^-1 A) is beyond what the refinement recovers from; one more residual says where it got
                history[-1]["gmres_failed"] = True
                steps += 1
                r = ops.residual(x)
                res, nx = fro_norm(r), fro_norm(x)
                eta = backward_error(res, norm_a, nx, norm_b)
                history.append({"step": steps, "residual": res, "backward_error": eta, "refinement": mode})
                if eta > tol:
                    if mode not in ran:
                        ran.append(mode)
                    return Refined(x, res, eta, steps, history, nx, ", then ".join(ran), gmres_failed=True,
                                   restart=restart)
        if mode not in ran:
            ran.append(mode)
        steps += 1
    return Refined(x, res, eta, steps, history, nx, ", then ".join(ran), restart=restart if "gmres" in ran else 0)


def check_refined(ref: Refined, tol: float, precision: str) -> None:
    """A low-precision route that did not reach ``tol`` is refused, with the fix."""
    if ref.eta <= tol:
        return
    lower = ("pass precision='double'" if precision in ("mixed", "tf32") else
             "pass precision='mixed' (a float32 factorization) or 'double'")
    trail = ", ".join(f"{h['backward_error']:.1e}" for h in ref.history)
    its = [h.get("gmres_iterations") for h in ref.history if h.get("gmres_iterations")]
    full = min(RESTART, ref.x.shape[0])
    if 0 < ref.restart < full:
        # restarted GMRES with a short basis can stall where the full one converges (n = 128 at cond 1e6:
        # GMRES(20) stalled at a backward error near 1e-6, GMRES(100) refined to 1e-16 in 3 steps)
        lower += (f", or a larger memory= (GMRES restarted every {ref.restart} iterations, the most whose Krylov "
                  f"vectors fit half this budget; up to {full} with more)")
    if ref.gmres_failed:
        raise ConvergenceError(explain(
            "precision", f"'{precision}' refines by GMRES-IR, whose first step must solve the preconditioned "
            f"correction equation within {MAX_ITER} GMRES iterations (cond(A) u_f too large: the low-precision "
            "factorization no longer preconditions A)", f"GMRES stopped at a relative residual above {GMRES_TOL:g}; "
            f"backward error {ref.eta:.1e} > tol {tol:.1e} (history {trail})", lower))
    raise ConvergenceError(explain(
        "precision", f"'{precision}' must refine its factorization to the float64 backward error",
        f"backward error {ref.eta:.1e} > tol {tol:.1e} after {ref.steps} step(s) of {ref.kind} refinement "
        f"(history {trail}" + (f"; GMRES iterations {its}" if its else "") + ")",
        lower + (", or refinement='gmres'" if ref.kind == "plain" else "")))


__all__ = ["GMRES_TOL", "LIMIT", "MAX_ITER", "Operators", "RESTART", "Refined", "STALL", "U_PRECOND",
           "check_condition", "check_refined", "condition_estimate", "get", "gmres", "krylov_plan", "put", "refine_ir"]
