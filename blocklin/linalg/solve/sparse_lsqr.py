"""Least squares and ridge on a stored sparse matrix: LSQR on the row-block products, never a dense ``S``.

:func:`blocklin.solve` with a stored sparse ``a`` (a :class:`~blocklin.sparse.SparseMatrix`, or the
path or URL of its ``blocklin-csr`` group) solves ``min ||S x - b||^2 + lam^2 ||x||^2`` by LSQR (Paige
and Saunders 1982) with ``damp = lam``, for every right-hand side and every lambda of a sequence at
once. The Golub-Kahan bidiagonalization ``beta_1 u_1 = b``, ``alpha_1 v_1 = S^T u_1``, ... does not
depend on ``damp`` (only the plane rotations that follow it do), so the ``k`` right-hand sides share one
bidiagonalization for all ``L`` lambdas: each iteration is exactly one product ``S V`` and one
``S^T U`` of the ``k`` columns still iterating (:class:`~blocklin.sparse.SparseOperator`: each a pass
over the row blocks, one block in memory per task, run as tasks on the job's scheduler by
:mod:`blocklin.runtime.sparse_pass`), and the rotations, norm estimates and stopping tests are
per (rhs, lambda) column. A column that meets its tests freezes (its ``x`` and ``w`` stop changing);
an rhs whose every lambda froze leaves the products. In exact arithmetic each column is what a
separate LSQR run on it computes.

``fit_intercept`` works on ``S - 1 mu^T`` through :func:`~blocklin.sparse.centered_operator` (the means
from one pass, :func:`~blocklin.linalg.lowrank.sparse_pca.sparse_moments`) and ``b - 1 bbar``, and the
intercept is ``x0 = bbar - mu^T x``, as the dense route and scikit-learn's ``Ridge`` give it.

References
----------
C. C. Paige, M. A. Saunders, "LSQR: An algorithm for sparse linear equations and sparse least
squares", ACM Trans. Math. Softw. 8(1), 43-71, 1982 (and "Algorithm 583. LSQR", 8(2), 195-209).
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Callable

import numpy as np

from blocklin.errors import (ConvergenceWarning, DTypeError, FormatError, NonFiniteError, ParameterError, ShapeError,
                             StoreNotFoundError, explain, warn)
from blocklin.interrupt import check_cancelled
from blocklin.linalg.blocks.scaling import column_norms, exponent_for
from blocklin.linalg.solve.report import solve_report
from blocklin.linalg.solve.tikhonov import check_lam_max
from blocklin.operands import stored_input
from blocklin.plan.chunks import auto_chunks
from blocklin.plan.solve import SparseSolvePlan, plan_sparse_solve
from blocklin.runtime.job import Job
from blocklin.runtime.sparse_pass import row_groups, task_memory
from blocklin.sparse import SparseMatrix, centered_operator
from blocklin.storage.zarr_store import create_array, open_zarr, write_block

#: ``method=`` for a sparse ``a`` (``"auto"`` is LSQR).
SPARSE_METHODS = ("auto", "lsqr")
#: Default ``tol`` (LSQR's ``atol = btol``) by the stored values' dtype. The stopping tests make ``x``
#: the exact solution of a problem whose ``S`` and ``b`` are perturbed by about ``tol`` relative
#: (Paige and Saunders 1982, section 6), so a tolerance below the data's own rounding buys nothing:
#: float32 values carry ``6e-8``, and ``1e-6`` (SciPy's ``lsqr`` default) is within 20 of it. Float64
#: values would allow ``1e-15``, but every digit costs iterations (two passes over ``S`` each) and
#: without reorthogonalization the iterates stagnate near ``eps cond(S)`` anyway; ``1e-10`` is a
#: perturbation far below the accuracy of measured data, a few digits above where LSQR stagnates.
DEFAULT_TOL = {"float32": 1e-6, "float64": 1e-10}
#: Iteration limit by default: ``2 min(m, n)`` (in exact arithmetic LSQR ends within ``min(m, n)``;
#: rounding makes twice that enough in practice), at most this many (each iteration reads ``S`` twice).
MAX_ITER_CAP = 10_000
#: Why a column stopped (Paige and Saunders' ``istop``): 0-2, 4, 5 converged; 3, 6 ill-conditioned; 7 the limit.
STOP_REASONS = {0: "x = 0 is exact (b = 0 or S^T b = 0)", 1: "S x = b within tol (a compatible system)",
                2: "least squares: ||S^T r|| within tol", 3: "condition estimate over conlim",
                4: "S x = b to machine precision", 5: "least squares to machine precision",
                6: "condition estimate over 1/eps", 7: "iteration limit"}
CONVERGED = (0, 1, 2, 4, 5)


def default_tol(dtype: Any) -> float:
    """:data:`DEFAULT_TOL` of the stored values' dtype (integers are read as float64)."""
    return DEFAULT_TOL["float32" if np.dtype(dtype) == np.float32 else "float64"]


def default_max_iter(m: int, n: int) -> int:
    return max(1, min(2 * min(m, n), MAX_ITER_CAP))


@dataclasses.dataclass
class LsqrResult:
    """Every (rhs, lambda) column's solution and how its run ended; column ``l k + i`` is lambda ``l``, rhs ``i``."""

    x: np.ndarray
    iterations: np.ndarray
    istop: np.ndarray
    acond: np.ndarray
    anorm: np.ndarray
    products: list[int]  # columns of each product, in order (the passes and their flops)
    #: the powers of two the run was scaled by (:func:`scaling_report`): ``S`` by ``2^-es``, column ``j`` of ``b``
    #: by ``2^-eb[j]``, the vectors entering the products by ``2^-ein`` (subnormal ``S``), ``redone`` products
    scale: dict | None = None

    @property
    def converged(self) -> np.ndarray:
        return np.isin(self.istop, CONVERGED)


def lsqr_columns(matmat: Callable[[np.ndarray], np.ndarray], rmatmat: Callable[[np.ndarray], np.ndarray],
                 b: np.ndarray, damps: list[float], *, tol: float, conlim: float, max_iter: int) -> LsqrResult:
    """LSQR (Paige and Saunders 1982) of every column of ``b`` (``m x k``) and every ``damp`` at once.

    Parameters
    ----------
    matmat, rmatmat : callable
        ``V -> S V`` (``n x c`` to ``m x c``) and ``U -> S^T U``; each is called once per iteration
        with the ``c <= k`` right-hand sides still iterating.
    b : numpy.ndarray
        ``m x k`` float64.
    damps : list of float
        ``lam`` values (``L``): the problem ``min ||S x - b||^2 + damp^2 ||x||^2``.
    tol : float
        ``atol = btol`` of the stopping tests: stop when ``||r|| <= tol ||b|| + tol ||S|| ||x||`` (a
        compatible system) or ``||S^T r - damp^2 x|| <= tol ||[S; damp I]|| ||r||`` (least squares),
        with LSQR's estimates of these norms (``r`` the damped residual).
    conlim : float
        Stop a column whose estimate of ``cond([S; damp I])`` exceeds it (not converged).
    max_iter : int
        Iterations at most (each two products).

    Returns
    -------
    LsqrResult
        ``x`` (``n x L k``), per column the iteration it stopped at, its ``istop``
        (:data:`STOP_REASONS`), the condition and norm estimates of ``[S; damp I]``.
    """
    # Scaled by powers of two (exact): each column of ``b`` by its own, ``S`` by the one its first product
    # ``S^T u_1`` names (``u_1`` has norm 1, so that product is in range). Unscaled, data near 2^+-600
    # made LSQR's products of norms (``alpha beta``, ``||S|| ||x||``) underflow or overflow: x = 0 was
    # returned as "exact" with converged=True (until 2026-12-05; found by a randomized search).
    eb = _exponents(np.abs(b).max(axis=0, initial=0.0))
    b = np.ldexp(b, -eb[None, :])
    box: dict = {}

    # Where the first product is so small that its rounding lost digits near the subnormals (every entry of
    # S subnormal: x was 0.1% off with converged=True, found by a randomized search, 2026-12-06), the inputs
    # are multiplied by 2^-e first (at most 2^(maxexp - 32): unit vectors stay in range), the rest of the
    # power applied to the product, and that first product is made again.
    fi = np.finfo(np.float64)

    def through(product: Callable[[np.ndarray], np.ndarray], v: np.ndarray) -> np.ndarray:
        e, ein = box["e"], box["in"]
        if ein:
            return np.ldexp(np.asarray(product(np.ldexp(v, -ein)), np.float64), -(e - ein))
        return np.ldexp(np.asarray(product(v), np.float64), -e)

    def rscaled(u: np.ndarray) -> np.ndarray:
        if "e" not in box:
            y = np.asarray(rmatmat(u), np.float64)
            top = np.abs(y).max(initial=0.0) if np.isfinite(y).all() else 1.0
            box["e"] = int(_exponents(top))
            box["in"] = max(box["e"], -(fi.maxexp - 32)) if 0 < top < fi.tiny / fi.eps else 0
            if not box["in"]:
                return np.ldexp(y, -box["e"])
            box["redone"] = u.shape[1]
        return through(rmatmat, u)

    def scaled(v: np.ndarray) -> np.ndarray:
        return through(matmat, v)

    bd = _Bidiagonal.start(b, rscaled)
    if "redone" in box:  # the first product made twice: one more pass
        bd.products.insert(0, box["redone"])
    es = box["e"]
    check_lam_max(list(damps), es)
    cols = _Columns.start(bd, [float(np.ldexp(d, -es)) for d in damps])
    itn = 0
    while cols.live.any() and itn < max_iter:
        check_cancelled()
        itn += 1
        alpha_old = bd.alpha.copy()
        bd.step(np.unique(cols.rhs[cols.live]), scaled, rscaled, itn)  # the rhs with a lambda still iterating
        cols.update(bd, alpha_old, tol=tol, conlim=conlim, itn=itn)
    cols.istop[cols.live] = 7
    refuse_beyond_range(cols.x, eb[cols.rhs] - es)
    return LsqrResult(x=np.ldexp(cols.x, (eb[cols.rhs] - es)[None, :]), iterations=cols.iterations,
                      istop=cols.istop, acond=cols.acond, anorm=np.ldexp(cols.anorm, es), products=bd.products,
                      scale={"es": int(es), "eb": [int(v) for v in eb], "ein": int(box["in"]),
                             "redone": int("redone" in box)})


def scaling_report(scale: dict | None) -> dict | None:
    """``report["scaling"]`` of an LSQR run: None where nothing was scaled (the data within ``2^+-256``), else the
    powers of two, as the dense routes report theirs (an all-subnormal ``S`` had been scaled by ``2^1074`` and
    its first product made again, and the report said ``scaling: None``)."""
    if not scale or not (scale["es"] or scale["ein"] or any(scale["eb"])):
        return None
    es, eb = scale["es"], scale["eb"]
    return {"exponent_a": es, "exponent_b": eb[0] if len(eb) == 1 else eb, "exponent_products_input": scale["ein"],
            "extra_passes": scale["redone"],
            "note": (f"LSQR ran on 2^{-es} S and 2^{-eb[0]} b" if len(set(eb)) == 1 else
                     f"LSQR ran on 2^{-es} S and 2^-eb_j b_j (each column of b by its own power of two)")
                    + f" with lam' = 2^{-es} lam (exact powers of two); x_j = 2^(eb_j + {-es}) x'_j"
                    + (f"; the vectors entering the products of S were multiplied by 2^{-scale['ein']} first (S "
                       "near the subnormals: the first product made again)" if scale["ein"] else "")}


def refuse_beyond_range(x_scaled: np.ndarray, e: np.ndarray) -> None:
    """Refuse a solution whose columns ``x_scaled * 2^e`` (the scaled run's ``x``, each column's power of two)
    float64 cannot hold: ``||x||`` is about ``||b|| / sigma_min(S)``, so entries near ``1e-200`` with ``b``
    near ``1e200`` ask for ``x`` near ``1e400``. Scaled back, it had been Inf (and the residual pass NaN),
    returned with ``converged=True`` (until 2026-12-06; found by a randomized search)."""
    from blocklin.linalg.blocks.result_range import solution_range_error

    top = np.abs(x_scaled).max(axis=0, initial=0.0)
    exp = np.frexp(top)[1].astype(np.int64) + np.asarray(e, np.int64)  # largest |x_j| < 2^exp, for finite top
    over = np.flatnonzero(np.isfinite(top) & (top > 0) & (exp > np.finfo(np.float64).maxexp))
    if over.size:
        j = int(over[0])
        raise solution_range_error(
            "b", np.float64, what="a least-squares solution x", actual=f"column {j} of x near 2^{int(exp[j])} "
            "(beyond float64's range)", fix=f"solve for b scaled by 2.0**-{int(exp[j]) - 1000} (exact; x scales "
            "with b), or raise lam")


def _exponents(v: Any) -> np.ndarray:
    """:func:`~blocklin.linalg.blocks.scaling.exponent_for` of each magnitude in ``v`` (float64's safe range,
    ``2^+-256``: values within it are not scaled, the same bits as before scaling existed)."""
    v = np.asarray(v, np.float64)
    return np.array([exponent_for(float(x), np.float64) for x in v.ravel()], dtype=np.int64).reshape(v.shape)


@dataclasses.dataclass
class _Bidiagonal:
    """The Golub-Kahan bidiagonalization of ``S`` from each column of ``b``: ``u`` (``m x k``), ``v``
    (``n x k``), ``alpha`` and ``beta`` per right-hand side; the columns of each product made."""

    u: np.ndarray
    v: np.ndarray
    alpha: np.ndarray
    beta: np.ndarray
    bnorm: np.ndarray
    products: list[int]

    @classmethod
    def start(cls, b: np.ndarray, rmatmat: Callable) -> _Bidiagonal:
        """``beta_1 u_1 = b``, ``alpha_1 v_1 = S^T u_1`` (one product)."""
        u = np.array(b, np.float64)
        beta = np.linalg.norm(u, axis=0)
        u[:, beta > 0] /= beta[beta > 0]
        v = _finite(np.asarray(rmatmat(u), np.float64), 0)
        alpha = np.linalg.norm(v, axis=0)
        v[:, alpha > 0] /= alpha[alpha > 0]
        return cls(u=u, v=v, alpha=alpha, beta=beta, bnorm=beta.copy(), products=[u.shape[1]])

    def step(self, act: np.ndarray, matmat: Callable, rmatmat: Callable, itn: int) -> None:
        """``beta u = S v - alpha u``, ``alpha v = S^T u - beta v`` for the right-hand sides ``act``: one
        product each way. ``beta = 0`` (``S v`` in the span of ``u``: a compatible system, whose
        columns end now) skips the update of ``v`` and keeps ``alpha``, as LSQR does."""
        u, v, alpha, beta = self.u, self.v, self.alpha, self.beta
        su = _finite(np.asarray(matmat(v[:, act]), np.float64), itn)
        tmp = u[:, act]  # a copy (fancy indexing), scaled in place: S v and one more m x c at a time
        tmp *= alpha[act]
        su -= tmp
        del tmp
        u[:, act] = su
        del su
        beta[act] = np.linalg.norm(u[:, act], axis=0)
        grow = act[beta[act] > 0]
        u[:, grow] /= beta[grow]
        sv = _finite(np.asarray(rmatmat(u[:, act]), np.float64), itn)
        v[:, grow] = sv[:, np.searchsorted(act, grow)] - beta[grow] * v[:, grow]
        alpha[grow] = np.linalg.norm(v[:, grow], axis=0)
        nz = grow[alpha[grow] > 0]
        v[:, nz] /= alpha[nz]
        self.products += [act.size, act.size]


@dataclasses.dataclass
class _Columns:
    """Per (rhs, lambda) column ``l k + i``: ``x``, ``w`` and LSQR's scalars (Paige and Saunders 1982,
    sections 4 and 5: the two plane rotations, the estimates of ``||[S; damp I]||``, its condition,
    ``||x||`` and the residuals), which column is still iterating and how each one stopped."""

    damp: np.ndarray
    rhs: np.ndarray
    x: np.ndarray
    w: np.ndarray
    rhobar: np.ndarray
    phibar: np.ndarray
    live: np.ndarray
    s: dict  # anorm, acond, ddnorm, res2, xxnorm, z, cs2, sn2
    iterations: np.ndarray
    istop: np.ndarray

    @classmethod
    def start(cls, bd: _Bidiagonal, damps: list[float]) -> _Columns:
        n, k = bd.v.shape
        cols = len(damps) * k
        rhs = np.tile(np.arange(k), len(damps))
        zeros = {name: np.zeros(cols) for name in ("anorm", "acond", "ddnorm", "res2", "xxnorm", "z", "sn2")}
        return cls(damp=np.repeat(np.asarray(damps, np.float64), k), rhs=rhs, x=np.zeros((n, cols)),
                   w=bd.v[:, rhs].copy(), rhobar=bd.alpha[rhs].copy(), phibar=bd.beta[rhs].copy(),
                   live=(bd.alpha * bd.beta)[rhs] > 0,  # S^T b = 0: x = 0 is the solution (istop 0)
                   s=zeros | {"cs2": -np.ones(cols)}, iterations=np.zeros(cols, np.int64),
                   istop=np.zeros(cols, np.int64))

    @property
    def anorm(self) -> np.ndarray:
        return self.s["anorm"]

    @property
    def acond(self) -> np.ndarray:
        return self.s["acond"]

    def update(self, bd: _Bidiagonal, alpha_old: np.ndarray, *, tol: float, conlim: float, itn: int) -> None:
        """The rotations, the updates of ``x`` and ``w``, the norm estimates and the stopping tests of
        every live column, after the bidiagonalization's step ``itn``; stopped columns freeze."""
        lc = np.flatnonzero(self.live)
        ri, dm, s = self.rhs[lc], self.damp[lc], self.s
        al, be = bd.alpha[ri], bd.beta[ri]
        with np.errstate(divide="ignore", invalid="ignore"):
            s["anorm"][lc] = np.where(be > 0, np.sqrt(s["anorm"][lc] ** 2 + alpha_old[ri] ** 2 + be ** 2 + dm ** 2),
                                      s["anorm"][lc])
            # the rotation that eliminates the damping, then the one that eliminates beta
            rhobar1 = np.hypot(self.rhobar[lc], dm)
            psi, phib = dm / rhobar1 * self.phibar[lc], self.rhobar[lc] / rhobar1 * self.phibar[lc]
            rho = np.hypot(rhobar1, be)
            cs, sn = rhobar1 / rho, be / rho
            theta, phi = sn * al, cs * phib
            self.rhobar[lc], self.phibar[lc] = -cs * al, sn * phib
            wl = self.w[:, lc]
            s["ddnorm"][lc] += (np.linalg.norm(wl, axis=0) / rho) ** 2
            self.x[:, lc] += wl * (phi / rho)
            self.w[:, lc] = bd.v[:, ri] + wl * (-theta / rho)
            xnorm = self._xnorm(lc, rho, theta, phi)
            s["acond"][lc] = s["anorm"][lc] * np.sqrt(s["ddnorm"][lc])
            s["res2"][lc] += psi ** 2
            rnorm = np.sqrt(self.phibar[lc] ** 2 + s["res2"][lc])
            st = _stop_tests(rnorm=rnorm, arnorm=al * np.abs(sn * phi), anorm=s["anorm"][lc], acond=s["acond"][lc],
                             xnorm=xnorm, bnorm=bd.bnorm[ri], tol=tol, conlim=conlim)
        done = st > 0
        self.iterations[lc] = itn
        self.istop[lc[done]] = st[done]
        self.live[lc[done]] = False

    def _xnorm(self, lc: np.ndarray, rho: np.ndarray, theta: np.ndarray, phi: np.ndarray) -> np.ndarray:
        """``||x||`` by the second QR of the bidiagonal (Paige and Saunders 1982, section 5.2)."""
        s = self.s
        delta, gambar = s["sn2"][lc] * rho, -s["cs2"][lc] * rho
        zrhs = phi - delta * s["z"][lc]
        xnorm = np.sqrt(s["xxnorm"][lc] + (zrhs / gambar) ** 2)
        gamma = np.hypot(gambar, theta)
        s["cs2"][lc], s["sn2"][lc] = gambar / gamma, theta / gamma
        s["z"][lc] = zrhs / gamma
        s["xxnorm"][lc] += s["z"][lc] ** 2
        return xnorm


def _listed(v: np.ndarray) -> Any:
    """Norms as :func:`~blocklin.linalg.solve.tikhonov.norms` reports them: a float for one, else a list."""
    v = np.asarray(v, np.float64)
    return float(v[0]) if v.size == 1 else v.tolist()


def _stop_tests(*, rnorm: np.ndarray, arnorm: np.ndarray, anorm: np.ndarray, acond: np.ndarray, xnorm: np.ndarray,
                bnorm: np.ndarray, tol: float, conlim: float) -> np.ndarray:
    """Paige and Saunders' ``istop`` of each column (0: goes on), their tests in their order (a later
    one overrides): S1 ``||r|| <= btol ||b|| + atol ||A|| ||x||``, S2 ``||A^T r|| <= atol ||A|| ||r||``,
    S3 ``cond(A) >= conlim``, and the same at machine precision (4-6)."""
    tiny = np.finfo(np.float64).eps
    test1 = rnorm / bnorm
    # a ratio of the data's own scale: Paige and Saunders' arnorm / (anorm rnorm + eps) passed every
    # column at once for data near 1e-100 (the product under eps), x 78% off after one iteration
    with np.errstate(divide="ignore", invalid="ignore"):
        test2 = np.where((anorm > 0) & (rnorm > 0), arnorm / anorm / rnorm, np.where(arnorm > 0, np.inf, 0.0))
    test3 = 1.0 / (acond + tiny)
    t1 = test1 / (1 + anorm * xnorm / bnorm)
    rtol = tol + tol * anorm * xnorm / bnorm
    st = np.zeros(rnorm.size, np.int64)
    for code, hit in ((6, 1 + test3 <= 1), (5, 1 + test2 <= 1), (4, 1 + t1 <= 1), (3, test3 <= 1.0 / conlim),
                      (2, test2 <= tol), (1, test1 <= rtol)):
        st[hit] = code
    return st


def _finite(y: np.ndarray, itn: int) -> np.ndarray:
    """A product holding NaN or Inf: ``S`` holds them (``b`` was checked before)."""
    if not np.isfinite(y).all():
        raise NonFiniteError(explain("a", "must hold finite values (LSQR multiplies by every stored entry)",
                                     f"NaN or Inf in a product with S at iteration {itn}",
                                     "replace or drop the non-finite entries (blocklin convert ... --nan error "
                                     "names them)"))
    return y


def refuse_sparse_options(*, method: str, assume_a: str, precision: Any, resume: Any, updatable: Any, refine: Any,
                          kind: str) -> None:
    """Refuse by name what the sparse route does not do."""
    def no(name: str, rule: str, got: str, fix: str) -> None:
        raise ParameterError(explain(name, f"{rule} for a stored sparse a (LSQR on its row-block products)", got,
                                     fix))

    if method not in SPARSE_METHODS:
        no("method", "must be 'auto' or 'lsqr'", repr(method), "pass method='lsqr' (or convert S to a dense array, "
           "blocklin convert S.mtx D.zarr --dense, for 'normal'/'qr')")
    if assume_a != "gen":
        no("assume_a", "must be 'gen' (LSQR solves the least-squares problem; it factors nothing)", repr(assume_a),
           "drop assume_a (LSQR also solves a square nonsingular system)")
    if precision not in (None, "double"):
        no("precision", "must be 'double' (LSQR computes in float64 whatever the storage dtype)", repr(precision),
           "drop precision=")
    if resume:
        no("resume", "is not available (the iteration is held in memory)", "resume=True", "drop resume=")
    if updatable:
        no("updatable", "is not available (it keeps the normal equations' sums, which LSQR never forms)",
           "updatable=True", "drop updatable=, or solve again after an append")
    if refine != "auto":
        no("refine", "applies to the normal equations only", f"refine={refine!r}", "drop refine= (tol= sets "
           "LSQR's accuracy)")
    if kind in ("gcv", "lcurve"):
        no("lam", f"'{kind}' needs the singular values of S, which LSQR does not compute", repr(kind),
           "pass a sequence, e.g. lam=[1e-3, 1e-2, 1e-1, 1] (every value from the same passes), and compare the "
           "reported residual and solution norms")


def check_tol(tol: Any, dtype: Any) -> float:
    if tol is None:
        return default_tol(dtype)
    if isinstance(tol, bool) or not isinstance(tol, (int, float, np.integer, np.floating)) \
            or not (0 < float(tol) < 1):
        raise ParameterError(explain("tol", "must be a number with 0 < tol < 1 (LSQR's relative atol = btol)",
                                     repr(tol), f"pass tol={default_tol(dtype):g} (the default for "
                                     f"{np.dtype(dtype).name} values) or leave it out"))
    return float(tol)


def check_max_iter(max_iter: Any, m: int, n: int) -> int:
    if max_iter is None:
        return default_max_iter(m, n)
    if isinstance(max_iter, bool) or not isinstance(max_iter, (int, np.integer)) or max_iter < 1:
        raise ParameterError(explain("max_iter", "must be an integer >= 1 (LSQR iterations, two passes each)",
                                     repr(max_iter), f"pass max_iter={default_max_iter(m, n)} or leave it out"))
    return int(max_iter)


def _rhs(job: Job, b: Any, m: int) -> tuple[np.ndarray | None, Any, tuple[int, int], np.dtype]:
    """``b`` in memory when given as NumPy, else its stored operand (read after the plan fits): ``(array or
    None, operand or None, shape, dtype)``; a 1-D ``b`` is one column."""
    if isinstance(b, (str, os.PathLike)) and str(b).endswith(".npy") and "://" not in str(b):
        b = _load_npy(b)  # a memory map: nothing is read before the plan fits
    if isinstance(b, (np.ndarray, list, tuple)):
        arr = np.asarray(b)
        if arr.ndim == 1:
            arr = arr.reshape(-1, 1)
        if arr.ndim != 2:
            raise ShapeError(explain("b", "must be a vector or an m x k matrix", f"{arr.ndim} dimensions",
                                     "pass b with one row per row of a"))
        op, shape, dt = None, arr.shape, arr.dtype
    else:
        if hasattr(b, "ndim") and b.ndim == 1 and hasattr(b, "reshape") and not isinstance(b, (str,)):
            b = b.reshape(-1, 1)
        arr, op = None, job.operand(b, "b", integers="cast")
        shape, dt = tuple(op.shape), np.dtype(op.dtype)
    if shape[0] != m:
        raise ShapeError(explain("b", "must have one row per row of a (no broadcasting)",
                                 f"a sparse {m} x ... and b {' x '.join(map(str, shape))}", f"pass b with {m} rows"))
    if dt.kind not in "fbiu":
        raise DTypeError(explain("b", "must be real (float, or integers read as float64)", dt.name,
                                 "pass float32 or float64 right-hand sides"))
    return arr, op, (int(shape[0]), int(shape[1])), (dt if dt.kind == "f" else np.dtype(np.float64))


def _load_npy(path: Any) -> np.ndarray:
    """A local ``.npy`` file of right-hand sides, mapped (read whole once the plan holds it)."""
    if not os.path.isfile(path):
        raise StoreNotFoundError(explain("b", "must name an existing .npy file or a zarr array", repr(str(path)),
                                         "check the path"))
    try:
        return np.load(path, mmap_mode="r", allow_pickle=False)
    except ValueError as exc:
        raise FormatError(explain("b", "must be a NumPy .npy file of numbers", f"{str(path)!r} ({exc})",
                                  "save it with numpy.save, or convert it: blocklin convert FILE b.zarr")) from None


def sparse_plan(s: SparseMatrix, k: int, lams: int, *, max_iter: int, intercept: bool, memory: int) -> SparseSolvePlan:
    """The :class:`~blocklin.plan.solve.SparseSolvePlan` of ``s`` (one small read of its row offsets at
    the block boundaries), with the product tasks' memory as :mod:`blocklin.runtime.sparse_pass` counts it."""
    st = s._store
    groups = row_groups(st)
    ends = st.block_ends()
    dt = s.aslinearoperator().dtype
    task = max(task_memory(st, groups, k, True, dt), task_memory(st, groups, k * lams, False, dt))  # S x: L k columns
    entry = s.dtype.itemsize + s.index_dtype.itemsize
    chunk = 2 * int(st.indices.chunks[0]) * entry + 2 * int(st.indptr.chunks[0]) * 8  # zarr's decoded chunks
    m, n = s.shape
    return plan_sparse_solve(m, n, k, lams=lams, nnz=s.nnz, value_bytes=s.dtype.itemsize,
                             index_bytes=s.index_dtype.itemsize, row_blocks=s.n_blocks,
                             max_block_entries=int(np.diff(ends).max(initial=0)), task_bytes=task, chunk_bytes=chunk,
                             max_iter=max_iter, intercept=intercept, memory=memory)


def solve_sparse(s: SparseMatrix, b: Any, *, lam: Any, kind: str, lams: list[float], method: str, out: Any,
                 overwrite: bool, explain_only: bool, fit_intercept: bool, tol: Any, max_iter: Any,
                 settings: dict, own_open: bool = False) -> Any:
    """``x`` of ``min ||S x - b||^2 + lam^2 ||x||^2`` for a stored sparse ``S`` by LSQR, committed to
    ``out`` (a temporary store without it) with its report; the plan alone with ``explain_only``.

    The options were checked by :func:`refuse_sparse_options`; see :func:`blocklin.solve` for the
    parameters and the module notes for the algorithm.
    """
    m, n = s.shape
    storage = s.dtype if s.dtype.kind == "f" else np.dtype(np.float64)
    tol = check_tol(tol, storage)
    max_iter = check_max_iter(max_iter, m, n)
    check_lam_max(lams, 1023)  # the bound applies to lam / 2^e with S's scale 2^e (checked again once known)
    with Job("solve", **settings) as job:
        # as opened, before its first read (``own_open``: by the caller, from a path): refused if S changed since
        job.stamp_input(s.location, s.stamp, own_open=own_open)
        arr, B, (_, k), bdt = _rhs(job, b, m)
        plan = sparse_plan(s, k, len(lams), max_iter=max_iter, intercept=bool(fit_intercept), memory=job.cfg.memory)
        if explain_only:
            return plan
        out_dtype = np.result_type(storage, bdt)
        ao = job.output(out, inputs=[s.location] + ([] if B is None else [stored_input(B)]), overwrite=overwrite,
                        size=((n, len(lams) * k), out_dtype))
        if arr is None:  # the stored b, read whole: the plan counted it
            z = open_zarr(B.path)
            arr = np.asarray(z[B.first_row:B.first_row + m, :])
        bm = np.array(arr, np.float64)
        if job.check_finite and not np.isfinite(bm).all():
            raise NonFiniteError(explain("b", "must hold finite values", "NaN or Inf in b",
                                         "replace them, or pass check_finite=False to skip the check"))
        info = _run(s, bm, lams, tol=tol, max_iter=max_iter, intercept=bool(fit_intercept), kind=kind)
        x = info.pop("x")
        arr_out = create_array(ao.array_path(), shape=x.shape, dtype=out_dtype,
                               chunks=auto_chunks(x.shape, out_dtype, job.cfg.memory), codec=job.cfg.codec)
        write_block(arr_out, slice(0, n), slice(0, x.shape[1]), x.astype(out_dtype, copy=False))
        flops = info.pop("flops")
        report, recorded = solve_report(job, route="sparse least squares", flops=flops, **info)
        params = {"lam": lam.tolist() if isinstance(lam, np.ndarray) else lam, "method": method,
                  "fit_intercept": bool(fit_intercept), "tol": tol, "max_iter": max_iter}
        result = job.finish(ao, out, report, operation="solve", plan=plan.to_dict(), params=params, recorded=recorded)
        result.intercept = np.asarray(report["intercept"]) if fit_intercept else None
        return result


def _run(s: SparseMatrix, b: np.ndarray, lams: list[float], *, tol: float, max_iter: int, intercept: bool,
         kind: str) -> dict:
    """LSQR, the residual pass, and the report's entries (``x`` and ``flops`` among them)."""
    m, n = s.shape
    k = b.shape[1]
    passes = 0
    mu = bbar = None
    if intercept:
        from blocklin.linalg.lowrank.sparse_pca import sparse_moments

        mu, _, _ = sparse_moments(s)  # one pass
        passes += 1
        bbar = b.mean(axis=0)
        b = b - bbar
        op = centered_operator(s, mu, np.float64)
    else:
        op = s.aslinearoperator()
    # conlim: past cond 1 / (100 tol), data perturbed by tol no longer fixes x to 1%: numerically singular
    # at this tolerance (1e8 for float32's tol, SciPy's default; 1e12 for float64's)
    with np.errstate(over="ignore"):
        res = lsqr_columns(op.matmat, op.rmatmat, b, lams, tol=tol, conlim=1.0 / (100 * tol), max_iter=max_iter)
    x = res.x
    rhs = np.tile(np.arange(k), len(lams))
    r = b[:, rhs]  # the residual itself, one pass more
    r -= np.asarray(op.matmat(x), np.float64)
    passes += len(res.products) + 1
    L = len(lams)
    lam_col = np.repeat(np.asarray(lams, np.float64), k)
    # lam too: lam^2 of a lam near 2^990 (S near 2^990) is inf, and inf * 0 the NaN objective of an x that
    # underflowed to 0 (b near 2^-100 there), with NumPy's overflow warnings
    if _exponents(np.abs(r).max(initial=0.0)) == 0 and _exponents(np.abs(x).max(initial=0.0)) == 0 and \
            _exponents(lam_col.max(initial=0.0)) == 0:
        r2, x2 = np.einsum("ij,ij->j", r, r), np.einsum("ij,ij->j", x, x)  # in range: sums of squares, as ever
        rr, xx, oo = (np.sqrt(np.maximum(v, 0.0)) for v in (r2, x2, r2 + lam_col ** 2 * x2))
    else:  # near 2^+-600 the squares leave float64's range: norms scaled by each column's largest entry
        rr, xx = column_norms(r, per_column=True), column_norms(x, per_column=True)
        with np.errstate(over="ignore"):
            oo = np.hypot(rr, lam_col * xx)
    del r
    if kind == "scalar":
        lam_out: Any = lams[0]
        rn, sn, obj = _listed(rr), _listed(xx), _listed(oo)
    else:
        lam_out = list(lams)
        rn = [_listed(rr[l * k:(l + 1) * k]) for l in range(L)]
        sn = [_listed(xx[l * k:(l + 1) * k]) for l in range(L)]
        obj = [_listed(oo[l * k:(l + 1) * k]) for l in range(L)]
    converged = res.converged
    stops = [STOP_REASONS[int(c)] for c in res.istop]
    flops = 2 * s.nnz * (sum(res.products) + x.shape[1])
    info = {"x": x, "flops": float(flops), "lam": lam_out, "method": "lsqr",
            "method_reason": "a stored sparse a: LSQR (Paige-Saunders) on its row-block products, never densified, "
                             "every right-hand side and lambda at once",
            "residual_norm": rn, "solution_norm": sn, "objective": obj, "passes": passes,
            "iterations": int(res.iterations.max(initial=0)), "column_iterations": res.iterations.tolist(),
            "converged": bool(converged.all()), "column_converged": converged.tolist(), "stop_reasons": stops,
            "tol": tol, "max_iter": max_iter, "cond_estimate": float(res.acond.max(initial=0.0)),
            "norm_a_estimate": float(res.anorm.max(initial=0.0)), "residual_norm_source": "b - S x (one more pass)",
            "nnz": s.nnz, "orientation": "tall" if m >= n else "wide", "fit_intercept": intercept,
            "scaling": scaling_report(res.scale)}
    if intercept:
        x0 = bbar[rhs] - mu @ x
        info["intercept"] = x0.tolist() if kind == "scalar" else [x0[l * k:(l + 1) * k].tolist() for l in range(L)]
    if not converged.all():
        bad = np.flatnonzero(~converged)
        c = int(bad[0])
        warn(f"solve: LSQR stopped before tol={tol:g} for {bad.size} of {converged.size} (rhs, lambda) column(s) "
             f"(column {c}, lambda {lams[c // k]:g}: {stops[c]} after {int(res.iterations[c])} iterations); x is "
             "written and report['column_converged'] says which. Raise max_iter, loosen tol, or regularize "
             "(a larger lam converges faster)", ConvergenceWarning)
    return info


__all__ = ["CONVERGED", "DEFAULT_TOL", "MAX_ITER_CAP", "SPARSE_METHODS", "STOP_REASONS", "LsqrResult",
           "check_max_iter", "check_tol", "default_max_iter", "default_tol", "lsqr_columns", "refuse_beyond_range",
           "refuse_sparse_options", "scaling_report", "solve_sparse", "sparse_plan"]
