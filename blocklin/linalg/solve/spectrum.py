"""The small problem in spectral form, and the solutions of a tall or wide problem from its spectrum.

A :class:`Spectrum` (from the eigen-decomposition of a Gram matrix, :func:`spectrum_from_gram`, or the
SVD of the streaming R factor, :func:`blocklin.linalg.solve.qr_route.qr_route`) gives the solution,
the residual and solution norms and the GCV value of every lambda without another pass over ``A``.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np

from blocklin.errors import ParameterError
from blocklin.errors import explain as _msg
from blocklin.linalg.blocks.scaling import column_norms
from blocklin.linalg.solve import lambda_select
from blocklin.linalg.solve.tikhonov import TikhonovRun, norms, singular, write_x

#: Points of the lambda grid for GCV and the L-curve.
GRID = 300


@dataclasses.dataclass
class Spectrum:
    """``A = U diag(s) V^T`` reduced to what every lambda needs.

    ``beta = U^T b`` (``r x k``) and ``rho0sq`` (``k``: ``||b||^2 - ||U^T b||^2``, the part of ``b``
    no lambda can fit). For tall problems ``basis`` is ``V`` (``x = V diag(s/(s^2+lam^2)) beta``); for
    wide ones it is ``U`` and ``x = A^T U diag(1/(s^2+lam^2)) beta`` (the dual form).

    A tall spectrum from the Gram matrix also keeps ``vc = V^T A^T b`` (``n x k``), and its solutions
    at ``lam^2`` above the eigenvalues' rounding level ``ev_noise`` (``n eps s_max^2``) are
    ``V diag(1/(s^2+lam^2)) vc``: ``beta = vc / s`` is cut where ``s`` is at the rounding level of
    ``||A||``, and there ``vc`` is not zero but of the size ``eps^(1/2) ||A|| ||b||`` (the eigenvectors
    of ``A^T A``'s rounding-level eigenvalues mix in directions of ``A`` as large as that), which the
    regularized solution weighs by ``1/lam^2``: dropped, a lambda list on a matrix of condition
    ``1e12`` lost 8 digits of ``x`` at ``lam = ||A||`` (where the problem's condition is 1.4). With
    ``vc`` the solution is that of ``(A^T A + lam^2 I) x = A^T b`` solved with the computed ``A^T A``
    (Golub and Van Loan, 2013, 6.1.4): a relative error of order ``eps ||A||^2 / lam^2``. At
    ``lam^2`` below ``ev_noise`` those denominators are rounding noise, the bound says nothing, and
    the cut ``beta`` gives the minimum-norm limit of ``lam -> 0`` as before.
    """

    s: np.ndarray
    basis: np.ndarray
    beta: np.ndarray
    rho0sq: np.ndarray
    m: int
    n: int
    dual: bool = False
    vc: np.ndarray | None = None
    ev_noise: float = 0.0
    #: ``||b||^2`` per right-hand side (Gram spectra): the residuals of the ``vc`` solutions
    bb: np.ndarray | None = None
    #: a tall spectrum's solutions are given as ``2^-xe x`` (:func:`x_exponent`): ``x`` of the scaled problem
    #: may be beyond float64 (or its square beyond it) where the ``x`` of the problem given is not
    xe: int = 0
    #: the route's absolute rounding of ``s`` (0: ``max(m, n) eps s_max`` of an SVD, the eigenvalues' ``ev_noise``
    #: of a Gram spectrum): a route that centers or cuts raises it (:func:`accuracy`)
    sv_noise: float = 0.0
    #: ``|beta|^2`` per right-hand side of the directions cut as rounding (their ``s`` set to 0), for
    #: :func:`accuracy`: what the route could not resolve, though lam may not damp it
    cut_b2: np.ndarray | None = None
    #: a Gram spectrum's eigenvalue rounding for :func:`accuracy` where it exceeds ``ev_noise`` (the centering's
    #: rank-one correction rounds relative to the uncentered or shifted Gram matrix)
    ev_bound: float = 0.0
    #: the left singular vectors of a dual spectrum from an R factor (``R = U S V^H``, ``basis = V``)
    left: np.ndarray | None = None
    #: per right-hand side, ``e_j - max e`` where each column of ``b`` was divided by its own power ``2^e_j``
    #: (:attr:`~blocklin.linalg.blocks.scaling.Scaling.columns`; None: one power for all): the sums over the
    #: right-hand sides (:meth:`on_grid`, :meth:`gcv`) take column ``j``'s squares times ``2^(2 (e_j - max e))``,
    #: in the units of the largest column's power (:func:`weigh_columns`)
    col_shift: np.ndarray | None = None

    def column_weights(self, k: int) -> np.ndarray:
        """What column ``j``'s squares weigh in a sum over the right-hand sides: ``2^(2 col_shift_j)`` (1 each
        without :attr:`col_shift`). A column more than ``2^537`` below the largest weighs 0: its squares lie
        below ``2^-1074`` of the largest column's, beneath the sum's rounding (``eps`` of it) by far, which is
        what the sum of the squares in the units of ``b`` is (it is dominated by the large column)."""
        if self.col_shift is None:
            return np.ones(k)
        with np.errstate(under="ignore"):
            return np.ldexp(1.0, 2 * np.asarray(self.col_shift, dtype=np.int64))

    @property
    def floor(self) -> float:
        """The smallest lambda a rule's default grid takes: ``ev_noise^(1/2)`` for a spectrum from a Gram
        matrix, whose eigenvalues below ``ev_noise`` are rounding noise (a rule scored below it read the
        noise: leave-one-out chose 3e-13 on a matrix of condition 1e9, its error near 0 where the
        true one was 0.05); 0 for a spectrum from an SVD."""
        return float(np.sqrt(self.ev_noise))

    def resolved(self) -> np.ndarray:
        """Per direction: whether the spectrum resolves it from zero, ``s^2`` above ``ev_noise`` for a
        Gram spectrum, ``s`` above ``max(m, n) eps s_max`` for one from an SVD (NumPy's
        ``matrix_rank`` rule: the SVD's backward error is of that size)."""
        s = np.abs(np.asarray(self.s, dtype=np.float64))
        if self.ev_noise > 0:
            return s**2 > self.ev_noise
        return s > max(self.m, self.n) * np.finfo(np.float64).eps * s.max(initial=0.0)

    def interpolates(self, intercept: bool) -> bool:
        """Whether the fit reproduces every row as ``lam -> 0``: the resolved directions (and the
        intercept's column) span all ``m`` rows, so every hat diagonal tends to 1."""
        return int(self.resolved().sum()) + int(bool(intercept)) >= self.m

    def every_direction(self, lams: Any) -> np.ndarray:
        """Per lambda of ``lams``: whether its solution takes ``vc`` (see the class docstring), the one
        test that :meth:`coefficients`, the residuals, :meth:`on_grid` and leave-one-out's pass share."""
        lams = np.asarray(lams, dtype=np.float64)
        if self.vc is None:
            return np.zeros(lams.shape, dtype=bool)
        return lams**2 > self.ev_noise

    def _every_direction(self, lam: float) -> bool:
        return bool(self.every_direction(lam))

    def filt(self, lam: float) -> np.ndarray:
        """``1 / (s^2 + lam^2)`` per direction (0 where both are 0)."""
        return filters(self.s, lam)[3]

    def _xe(self) -> int:
        return 0 if self.dual else self.xe

    def coefficients(self, lam: float) -> np.ndarray:
        """``2^-xe x`` (tall) or the dual ``y`` with ``x = A^T y`` (wide). At ``lam^2`` up to the eigenvalues'
        rounding (:meth:`dual_every_direction`) the dual ``y`` leaves out the directions with ``s = 0`` (exact or
        unresolved zeros: ``A^H u = s v`` takes nothing from them), whose ``beta / lam^2`` had only multiplied
        ``A^H``'s rounding and the intercept's: rows ``2^600`` apart with ``lam`` 1e-82 of ``||A||`` gave an
        intercept of ``-1.5e147`` for ``0.448``. ``x`` is then the exact solution of ``A`` less its unresolved
        directions (as the tall form, whose filter ``s / (s^2 + lam^2)`` is 0 there). Above it ``y`` takes every
        direction: it is then ``(G + dG + lam^2 I)^-1 b`` of the computed ``G = A A^T`` (:func:`accuracy`). Left
        out there, the unresolved directions (rounding-level mixtures of ``A``'s small singular directions and,
        at ``sqrt(eps) ||A|| / s``, of the resolved ones above them) took up to ``sqrt(eps) ||A|| |beta| / lam^2``
        from ``x``: 1e-9 relative at ``lam = 8.73`` where ``cond([A; lam I]) = 1.0``, without a word."""
        if self._every_direction(lam):  # every direction (see the class docstring)
            f = filters(self.s, lam, self.xe)[3]
            return self.basis @ (np.where(self.s == 0, 0.0, f)[:, None] * self.vc if self.dual else f[:, None] * self.vc)
        if self.dual:
            f = self.filt(lam)
            return self.basis @ ((f if self.dual_every_direction(lam) else np.where(self.s == 0, 0.0, f))[:, None]
                                 * self.beta)
        return self.basis @ (filters(self.s, lam, self.xe)[0][:, None] * self.beta)

    def dual_every_direction(self, lam: float) -> bool:
        """Whether the dual ``y`` of a Gram spectrum takes every direction at ``lam``: ``lam^2`` above the
        eigenvalues' rounding (``ev_noise``, or the centering's ``ev_bound``), where a left-out direction's error,
        up to ``sqrt(ev_noise) |beta| / lam^2``, exceeds what keeping it costs, ``ev_noise |beta| / (2 lam^3)``
        (the tall form's :meth:`every_direction` test; a spectrum from an R factor, resolved to ``eps ||A||``,
        keeps its rule)."""
        return self.dual and self.ev_noise > 0 and float(lam) ** 2 > max(self.ev_noise, self.ev_bound)

    def _fitted(self, lam: float) -> tuple[np.ndarray, np.ndarray]:
        """``(rho0^2, |beta|^2)`` of the residual at ``lam``: where the solution takes ``vc``, the
        directions whose ``s^2`` is under ``ev_noise`` count as not fitted (at ``lam^2`` above it their
        filter ``s^2 / (s^2 + lam^2)`` is below a half and their ``beta = vc / s`` is noise: summed, it
        put ``||b - A x||`` 21% off on a matrix of condition 1e12); elsewhere ``beta`` as it is."""
        b2 = np.abs(self.beta) ** 2
        if not self._every_direction(lam) or self.bb is None:
            return self.rho0sq, b2
        b2 = np.where((self.s**2 > self.ev_noise)[:, None], b2, 0.0)
        return np.maximum(self.bb - b2.sum(axis=0), 0.0), b2

    def residual_sq(self, lam: float) -> np.ndarray:
        rho0sq, b2 = self._fitted(lam)
        g = filters(self.s, lam)[1]
        return rho0sq + np.einsum("i,ij->j", g**2, b2)

    def solution_sq(self, lam: float) -> np.ndarray:
        """``||2^-xe x||^2`` per right-hand side: that of the ``x`` :meth:`coefficients` gives."""
        if self._every_direction(lam):  # ||x||^2 of the x coefficients() gives
            return np.einsum("i,ij->j", filters(self.s, lam, self.xe)[3] ** 2, np.abs(self.vc) ** 2)
        g = filters(self.s, lam, self._xe())[0]
        return np.einsum("i,ij->j", g**2, np.abs(self.beta)**2)

    def dof(self, lam: float) -> float:
        return float(np.sum(filters(self.s, lam)[2]))

    def gcv(self, lam: float) -> float:
        """Golub-Heath-Wahba ``V(lam) = m ||r||^2 / (m - dof)^2`` (summed over right-hand sides, at the largest
        column's scale where they were scaled apart: :meth:`column_weights`)."""
        den = (self.m - self.dof(lam)) ** 2
        rr = self.residual_sq(lam)
        return float(self.m * (rr @ self.column_weights(rr.size)) / den) if den > 0 else float("inf")

    def on_grid(self, lams: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """:meth:`residual_sq` and :meth:`solution_sq` summed over the right-hand sides, and
        :meth:`gcv`, at every lambda of ``lams`` at once (a few hundred lambdas in a few
        milliseconds, where one call per lambda spends most of its time in NumPy's call overhead):
        the same sums, as matrix products over the lambdas, equal to the one-lambda methods to
        rounding."""
        lams = np.asarray(lams, dtype=np.float64)
        w = self.column_weights(self.rho0sq.size)  # columns scaled apart: summed at the largest one's scale
        b2 = (np.abs(self.beta) ** 2) @ w  # per singular value, over the right-hand sides
        c2 = None if self.vc is None else (np.abs(self.vc) ** 2) @ w
        s2 = self.s**2
        rho_all = float(self.rho0sq @ w)
        if c2 is not None and self.bb is not None:  # as residual_sq where the solutions take vc
            b2_sure = np.where(s2 > self.ev_noise, b2, 0.0)
            rho_sure = max(float(self.bb @ w) - float(b2_sure.sum()), 0.0)
        rr, xx, dof = (np.empty(lams.size) for _ in range(3))
        step = max(1, (1 << 20) // max(1, s2.size))  # lambdas per block: about 8 MiB of filter factors
        for i in range(0, lams.size, step):
            sf, l2f, s2f, f = filters(self.s, lams[i:i + step, None])
            every = self.every_direction(lams[i:i + step])
            rr[i:i + step] = (l2f ** 2) @ b2 + rho_all if c2 is None or self.bb is None else \
                np.where(every, (l2f ** 2) @ b2_sure + rho_sure, (l2f ** 2) @ b2 + rho_all)
            xx[i:i + step] = (sf ** 2) @ b2 if c2 is None else np.where(
                every, (f**2) @ c2, (sf ** 2) @ b2)  # as solution_sq
            dof[i:i + step] = s2f.sum(axis=1)
        den = (self.m - dof) ** 2
        with np.errstate(divide="ignore", invalid="ignore"):
            gcv = np.where(den > 0, self.m * rr / np.where(den > 0, den, 1.0), np.inf)
        return rr, xx, gcv

    def grid(self, points: int = GRID) -> np.ndarray:
        smax = float(self.s.max()) if self.s.size else 1.0
        smin = float(self.s[self.s > 0].min()) if np.any(self.s > 0) else smax
        lo = max(smin / 10, smax * 1e-16 ** 0.5 * 1e-4 / 10, self.floor)
        return np.logspace(math.log10(max(lo, 1e-300)), math.log10(max(smax, lo, 1e-300)), points)


def filters(s: np.ndarray, lam: Any, e: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``s / (s^2 + lam^2)``, ``lam^2 / (s^2 + lam^2)``, ``s^2 / (s^2 + lam^2)`` and ``1 / (s^2 + lam^2)`` per
    singular value ``s`` (and per lambda, ``lam`` broadcast against ``s``), 0 where ``s`` and ``lam`` are 0.

    The first three are formed from ``s`` and ``lam`` multiplied by the power of two ``2^t`` that brings the
    larger of the two into ``[1/2, 1)`` (exact), so that ``s^2 + lam^2`` neither underflows nor overflows;
    inside the range the bits are those of the plain formulas. A scaled problem whose ``s`` and ``lam`` were
    both near ``1e-189`` (columns ``2^600`` apart, the problem scaled by its largest entry) had squares that
    underflowed to 0, and that direction's part of ``x`` was dropped: ``x = [0, 1.5e-190]`` for ``[0.0238,
    -5.7e-183]``, silently. The last is the plain formula, 0 where ``s^2 + lam^2`` underflows: the dual
    form's ``y = U diag(1 / (s^2 + lam^2)) U^T b`` overflows along such directions, which ``x = A^T y``
    maps to ``s`` times as much, so they are left out of it as before.

    ``e``: the first and the last are multiplied by ``2^-e`` (the solution filters of ``2^-xe x``,
    :func:`x_exponent`), the first before it leaves the range (``s / lam`` near ``1e189 / 1e-189``)."""
    s = np.asarray(s, dtype=np.float64)
    lam = np.asarray(lam, dtype=np.float64)
    top = np.maximum(s, lam)
    t = np.where(top > 0, -np.frexp(top)[1], 0)
    st, lt = np.ldexp(s, t), np.ldexp(lam, t)
    den = st**2 + lt**2
    plain = s**2 + lam**2
    with np.errstate(divide="ignore", invalid="ignore", over="ignore", under="ignore"):
        ft = np.where(den > 0, 1.0 / np.where(den > 0, den, 1.0), 0.0)
        f = np.where(plain > 0, 1.0 / np.where(plain > 0, plain, 1.0), 0.0)
        return np.ldexp(st * ft, t - e), lt**2 * ft, st**2 * ft, np.ldexp(f, -e) if e else f


def s_interval(spec: Spectrum) -> tuple[np.ndarray, np.ndarray]:
    """Per direction, the singular values the route's rounding leaves possible: ``s +- sv_noise`` of an SVD
    (its backward error, ``max(m, n) eps s_max`` for a Householder QR and LAPACK's SVD, or the centering's),
    ``sqrt(s^2 +- ev_noise)`` of a Gram spectrum (eigenvalues of ``A^T A`` to ``n eps s_max^2``, Weyl)."""
    s = np.abs(np.asarray(spec.s, dtype=np.float64))
    smax = float(s.max(initial=0.0))
    sv = max(float(spec.sv_noise), max(spec.m, spec.n) * np.finfo(np.float64).eps * smax)
    ev = max(float(spec.ev_noise), float(spec.ev_bound))
    if ev > 0:
        with np.errstate(over="ignore", under="ignore"):
            e = s * s
            lo = np.sqrt(np.maximum(e - ev, 0.0))
            hi = np.sqrt(e + ev)
        return np.minimum(lo, np.maximum(s - sv, 0.0)), np.maximum(hi, s + sv)
    return np.maximum(s - sv, 0.0), s + sv


def accuracy(spec: Spectrum, lam: float) -> np.ndarray:
    """A first-order bound, per right-hand side, of the relative error of ``x`` at ``lam`` that the route's
    rounding of the singular values allows: ``x = sum_i v_i f(s_i) beta_i`` with ``f(s) = s / (s^2 + lam^2)``
    (the tall filter, and the dual form's ``A^T U diag(1 / (s^2 + lam^2)) U^T b`` alike), each ``s_i`` known
    to the interval :func:`s_interval` gives, so ``|f(t) - f(s_i)|`` over it bounds that direction's error
    (Hansen, *Rank-Deficient and Discrete Ill-Posed Problems*, 1998, 4.1: the filter's sensitivity).

    For resolved directions this is about ``(sv_noise / s) |1 - 2 s^2 / (s^2 + lam^2)|`` relative: the
    least-squares condition ``kappa eps`` at ``lam -> 0``, damped by ``lam``. A direction below the resolution
    (``s`` near 0, or cut as the centering's rounding) may be anything up to ``max f = 1 / (2 lam)`` (or
    ``f(tol)`` where ``tol < lam``) times its ``beta``: rows ``2^600`` apart with an intercept at ``lam = 1``
    leave the centered ``A``'s second singular value, near 1, below ``eps 2^600``; ``f`` is 1/2 there and ``x``
    had no correct digit. The spectrum is in hand: ``O(r k)`` flops."""
    s = np.abs(np.asarray(spec.s, dtype=np.float64))
    k = spec.beta.shape[1] if spec.beta.ndim == 2 else 1
    if not s.size:
        return np.zeros(k)
    lo, hi = s_interval(spec)
    if spec.vc is not None and spec._every_direction(lam):  # x = V diag(1 / (s^2 + lam^2)) vc: beta = vc / s
        b = np.abs(spec.vc) / np.maximum(s, np.maximum(hi - s, np.finfo(np.float64).tiny))[:, None]
    else:
        b = np.abs(spec.beta)
    lam = abs(float(lam))
    with np.errstate(over="ignore", under="ignore", invalid="ignore", divide="ignore"):
        f = filters(s, lam)[0] if lam > 0 else np.where(s > 0, 1.0 / np.where(s > 0, s, 1.0), 0.0)
        if lam > 0:
            peak = np.where((lo <= lam) & (lam <= hi), filters(lam, lam)[0], f)  # f's top, where reached
            flo, fhi = filters(lo, lam)[0], filters(hi, lam)[0]
        else:  # 1 / s: unbounded where the interval reaches 0
            peak = np.where(lo <= 0, np.inf, f)
            flo, fhi = np.where(lo > 0, 1.0 / np.where(lo > 0, lo, 1.0), np.inf), 1.0 / hi
        dev = np.maximum(np.maximum(np.abs(flo - f), np.abs(fhi - f)), np.abs(peak - f))
    kept = s > 0  # the solution keeps these (the dual y and the tall filter take nothing where s = 0)
    fx = np.where(kept, f, 0.0)
    unresolved = None
    if spec.dual_every_direction(lam):  # the dual y's unresolved directions: through dG, not an uncertain s
        unresolved = s**2 <= max(float(spec.ev_noise), float(spec.ev_bound))
        dev = np.where(unresolved, 0.0, dev)
    with np.errstate(invalid="ignore"):
        err_parts = [np.where(b > 0, dev[:, None] * b, 0.0)]
    if unresolved is not None and unresolved.any():
        err_parts.append(_dual_unresolved(spec, lam, lo, hi, unresolved))
    if spec.cut_b2 is not None:  # directions cut to s = 0: their part may be up to max f over [0, tol]
        tol = float(np.max(hi[~kept], initial=float(spec.sv_noise)))
        fmax = filters(min(tol, lam), lam)[0] if lam > 0 else np.inf
        cut = np.asarray(spec.cut_b2, dtype=np.float64).reshape(1, -1)
        # a part of b at its rounding level (the intercept's direction, which the centered b has not) is none
        floor = (max(spec.m, spec.n) * np.finfo(np.float64).eps) ** 2 * (cut + (np.abs(spec.beta) ** 2).sum(axis=0))
        with np.errstate(invalid="ignore", over="ignore"):
            err_parts.append(np.where(cut > floor, fmax * np.sqrt(cut), 0.0))
    err = np.concatenate(err_parts, axis=0)
    en, xn = column_norms(err, per_column=True), column_norms(fx[:, None] * b, per_column=True)
    with np.errstate(over="ignore", under="ignore", invalid="ignore", divide="ignore"):
        return np.where(xn > 0, en / np.where(xn > 0, xn, 1.0), np.where(en > 0, np.inf, 0.0))


def _dual_unresolved(spec: Spectrum, lam: float, lo: np.ndarray, hi: np.ndarray, unresolved: np.ndarray) -> np.ndarray:
    """:func:`accuracy`'s bound (``1 x k``) on what the dual ``y``'s unresolved directions add to the error of
    ``x = A^T y`` where ``y`` takes every direction (:meth:`Spectrum.dual_every_direction`). ``y`` is that of the
    computed ``G + dG``, ``||dG|| <= e`` (the eigenvalues' rounding, ``max(ev_noise, ev_bound)``), so their part
    ``y_u`` (``|beta| / (s^2 + lam^2)``, near ``|beta| / lam^2``) enters ``dx = -A^T (G + lam^2 I)^-1 dG y`` as at
    most ``e ||y_u|| max_i f(s_i)`` (``f(s) = s / (s^2 + lam^2)`` at its largest over each true ``s_i``'s
    interval, at most ``1 / (2 lam)``): the normal equations' ``eps ||A||^2 / lam^2`` (Golub and Van Loan, 2013,
    6.1.4) in the dual form. ``A^T`` itself is exact (a product with ``A``): such a direction adds ``f(s) beta``
    with its true ``s``, not up to ``f(sqrt(e)) beta`` as an uncertain ``s`` of the tall filter does (that had
    put the estimate at ``1e9`` where ``x`` was right to a few ``eps``)."""
    e = max(float(spec.ev_noise), float(spec.ev_bound))
    lam = abs(float(lam))
    beta = np.abs(spec.beta).reshape(spec.s.size, -1)[unresolved]
    with np.errstate(over="ignore", under="ignore", invalid="ignore", divide="ignore"):
        top = np.maximum(filters(lo, lam)[0], filters(hi, lam)[0])
        top = np.where((lo <= lam) & (lam <= hi), filters(lam, lam)[0], top)
        yn = column_norms(filters(spec.s[unresolved], lam)[3][:, None] * beta, per_column=True)
        return (float(np.max(top, initial=0.0)) * e * yn).reshape(1, -1)


def warn_inaccurate(info: dict, spec: Spectrum, lams: list[float], *, per_column: bool = False, centered: bool = False,
                    ea: int = 0, fix: str = "") -> None:
    """``info["condition_estimate"]``: the largest :func:`accuracy` bound over ``lams`` and the right-hand sides
    over float64's ``eps`` (the factor the route's rounding is amplified by in ``x``, as the square solve's
    ``cond_2(A)``), and an :class:`~blocklin.errors.IllConditionedWarning` where that bound is at least 1 (no
    correct digit). Well-posed problems are far below it."""
    from blocklin.errors import IllConditionedWarning, warn

    eps = float(np.finfo(np.float64).eps)
    if per_column:  # column j at its own lambda
        bounds = [float(accuracy(spec, lam)[j]) for j, lam in enumerate(lams)]
    else:
        bounds = [float(np.max(accuracy(spec, lam), initial=0.0)) for lam in lams]
    worst = max(bounds, default=0.0)
    info["condition_estimate"] = worst / eps
    if worst < 1:
        return
    lam = lams[int(np.argmax(bounds))]
    warn(f"solve: x may have no correct digit: at lam = {float(np.ldexp(lam, ea)):.3g} the route resolves the "
         f"singular values of {'the centered ' if centered else ''}A only to about "
         f"{float(np.ldexp(float(np.max(s_interval(spec)[1] - spec.s, initial=0.0)), ea)):.2e}, and directions "
         "below that are not damped by lam (relative error bound "
         f"{worst:.1e}; report['condition_estimate'] = {worst / eps:.3g} times eps). A larger lam (lam=('loo', grid) "
         "or lam='gcv' chooses one), " + (fix + ", " if fix else "") + "or a's rows and columns nearer each other "
         "in scale avoid it", IllConditionedWarning)


def x_exponent(spec: Spectrum, lams: list[float]) -> int:
    """``xe`` for the solutions of a tall spectrum at ``lams``: 0 where ``||x||^2`` of the scaled problem is
    well inside float64 (the bits as before), else the power of two of the largest ``|x|`` bound, so that
    ``2^-xe x`` and its square are near 1. The problem scaled by its largest entry (columns ``2^600``
    apart) has ``x`` near ``2^626`` where ``x`` of the problem given is ``0.0238``: its norm overflowed and
    the solve was refused."""
    if spec.dual or not spec.s.size:
        return 0
    top = -np.inf
    for lam in lams:
        s = np.asarray(spec.s, dtype=np.float64)
        lam_ = np.float64(lam)
        tp = np.maximum(s, lam_)
        t = np.where(tp > 0, -np.frexp(tp)[1], 0)
        st, lt = np.ldexp(s, t), np.ldexp(lam_, t)
        den = st**2 + lt**2
        with np.errstate(divide="ignore", invalid="ignore"):
            if spec._every_direction(lam):  # 1 / (s^2 + lam^2) = 2^(2t) / den, times |vc|
                lg = 2.0 * t - np.log2(np.where(den > 0, den, np.inf)) + np.log2(np.abs(spec.vc).max(axis=1))
            else:  # s / (s^2 + lam^2) = 2^t st / den, times |beta|
                lg = t + np.log2(np.where(den > 0, st / np.where(den > 0, den, 1.0), 0.0)) + \
                    np.log2(np.abs(spec.beta).max(axis=1))
        lg = lg[np.isfinite(lg)]
        if lg.size:
            top = max(top, float(lg.max()))
    if not np.isfinite(top) or abs(top) < 400:  # ||x||^2 (n terms) well inside float64
        return 0
    return int(math.floor(top))


def spectrum_from_gram(g: np.ndarray, c: np.ndarray, bb: np.ndarray, m: int, *, dual: bool,
                       n: int) -> Spectrum:
    ev, w = np.linalg.eigh(g)
    ev, w = ev[::-1], w[:, ::-1]
    s = np.sqrt(np.clip(ev, 0.0, None))
    if dual:  # g = A A^T, c = b: beta = U^T b
        beta = w.conj().T @ c
    else:  # g = A^T A, c = A^T b: beta = diag(1/s) V^T A^T b
        keep = s > s[0] * np.finfo(np.float64).eps * max(g.shape) if s.size else s > 0
        vc = w.conj().T @ c
        beta = np.zeros((s.size, c.shape[1]), dtype=np.result_type(w, c))
        beta[keep] = vc[keep] / s[keep, None]
    if dual:  # U spans R^m: every component of b is in beta (zero singular values fit nothing)
        rho0sq = np.zeros(beta.shape[1])
    else:
        rho0sq = np.clip(bb - np.einsum("ij,ij->j", beta.conj(), beta).real, 0.0, None)
    noise = max(g.shape) * np.finfo(np.float64).eps * float(ev[0]) if ev.size else 0.0
    return Spectrum(s=s, basis=w, beta=beta, rho0sq=rho0sq, m=m, n=n, dual=dual, vc=None if dual else vc,
                    ev_noise=max(noise, 0.0), bb=None if dual else np.asarray(bb, dtype=np.float64).reshape(-1))


def without_direction(spec: Spectrum, sw: np.ndarray) -> Spectrum:
    """The dual spectrum of a centered problem without the intercept's direction ``e = sqrt(w) / ||sqrt(w)||``,
    which the centered ``A A^T`` has in its null space; directions the result does not resolve have ``s = 0``.

    A Gram spectrum is restricted to ``e``'s complement exactly: ``G' = Q^H G Q`` for an orthonormal basis ``Q``
    of it, from the SVD of ``Q^H U diag(s)`` (``G = U diag(s^2) U^H``), ``beta' = (Q Z)^H U beta``. Taking ``e``
    out of the unresolved directions alone (:func:`blocklin.linalg.solve.loo.without_intercept`) had left it in
    the resolved ones: one whose ``s^2`` is a few times the eigenvalues' rounding ``e_n`` holds a part of ``e`` as
    large as ``e_n / s^2`` (Golub and Van Loan, 2013, 8.1.12), which the centering of ``y`` then cut from it; an
    ``A`` whose centered singular values reach ``6e-8`` gave ``x`` ``9e-11`` off at ``lam = 1`` (the problem's
    condition 1.4), now about ``1e-15``. A spectrum from an R factor resolves ``s`` to ``eps ||A||``, its
    resolved directions hold ``e`` only to rounding: the unresolved ones are replaced as before."""
    import dataclasses

    if not spec.ev_noise > 0:
        from blocklin.linalg.solve import loo

        u, beta, s2 = loo.without_intercept(spec, sw)
        return dataclasses.replace(spec, s=np.sqrt(np.maximum(s2, 0.0)), basis=u, beta=beta)
    u, beta = spec.basis, spec.beta
    unit = np.asarray(sw, dtype=np.float64) / np.linalg.norm(sw)
    q = np.linalg.qr(unit[:, None], mode="complete")[0][:, 1:]  # an orthonormal basis of unit's complement
    if not q.shape[1]:  # one row: nothing is left beside the intercept
        return dataclasses.replace(spec, s=np.zeros(0), basis=q.astype(u.dtype),
                                   beta=np.zeros((0, beta.shape[1]), beta.dtype))
    z, sv, _ = np.linalg.svd((q.T @ u) * np.abs(np.asarray(spec.s, dtype=np.float64))[None, :], full_matrices=False)
    basis = q @ z
    out = dataclasses.replace(spec, s=sv, basis=basis, beta=basis.conj().T @ (u @ beta))
    out.s = np.where(out.resolved(), sv, 0.0)
    return out


def weigh_columns(ctx: TikhonovRun, spec: Spectrum) -> Spectrum:
    """Set ``spec.col_shift`` from the run's per-column powers of ``b`` (where its columns lie too far apart for
    one power, :func:`~blocklin.linalg.blocks.scaling.column_exponents_for`): a rule's score over the columns is
    then summed in one unit, the largest column's, as the scores of ``b`` in the units given are (columns
    ``2^1200`` apart had been refused; each divided by its own power and summed as they were, the small column
    would have weighed as much as the large one). ``spec`` itself."""
    shift = None if ctx is None or ctx.sb is None else ctx.sb.column_shift
    if shift is not None and np.size(shift) == spec.rho0sq.size:
        spec.col_shift = shift
    return spec


def choose_lambda(spec: Spectrum, rule: str) -> tuple[float, dict]:
    """``"gcv"`` (Golub, Heath and Wahba, 1979) or ``"lcurve"`` (Hansen, 1998): lambda and the curve
    (:func:`blocklin.linalg.solve.lambda_select.choose_lambda`: grids extended where the choice sits at an end)."""
    return lambda_select.choose_lambda(spec, rule)


def finish_spectral(ctx: TikhonovRun, spec: Spectrum, info: dict, x_path: str) -> dict:
    """Pick lambda(s), evaluate the solution(s) of a tall problem from its spectrum, write ``x``."""
    xs = coefficients(ctx, spec, info, "column")
    write_x(ctx, x_path, np.hstack(xs) if len(xs) > 1 else xs[0])
    return info


def coefficients(ctx: TikhonovRun, spec: Spectrum, info: dict, rank: str) -> list[np.ndarray]:
    """The chosen lambda(s) and their coefficients; refuses ``lam = 0`` on a rank-deficient problem."""
    lams, curve = lambdas(ctx, spec)
    smax = float(spec.s.max()) if spec.s.size else 0.0
    smin = float(spec.s.min()) if spec.s.size else 0.0
    info["cond_estimate"] = smax / smin if smin > 0 else float("inf")
    if min(lams) == 0 and (smin <= smax * max(ctx.m, ctx.n) * np.finfo(np.float64).eps or smax == 0):
        raise singular(info["cond_estimate"], rank)
    if spec.dual:
        _check_dual_range(ctx, spec, lams)
    spec.xe = ctx.xe = x_exponent(spec, lams)
    if per_target(ctx, lams):  # column j at its own lambda
        xs = [np.column_stack([spec.coefficients(lam)[:, j] for j, lam in enumerate(lams)])]
    else:
        xs = [spec.coefficients(lam) for lam in lams]
    describe(info, spec, lams, curve, ctx)
    gram = info.get("method") == "normal"  # the Gram matrix resolves sqrt(eps) ||A||, the QR eps ||A||
    warn_inaccurate(info, spec, lams, per_column=per_target(ctx, lams), centered=bool(ctx.intercept),
                    ea=ctx.sa.exponent if ctx.sa is not None else 0,
                    fix="method='qr' (singular values resolved to eps ||A||, not sqrt(eps) ||A||)"
                    if gram and not ctx.weighted else "")
    return xs


def _check_dual_range(ctx: TikhonovRun, spec: Spectrum, lams: list[float]) -> None:
    """Refuse a lambda at which the dual form's ``1 / (s^2 + lam^2)`` leaves float64 along a direction of
    ``b``: ``filters`` sets it to 0 there, and ``x = A^T y`` lost that direction's part silently (rows
    ``2^600`` apart, ``lam`` 2.3e30: ``x`` near ``3e-191`` where the ridge solution has norm 0.077)."""
    tiny = np.finfo(np.float64).tiny
    if not spec.s.size or not spec.s.max() > 0:  # A (centered) is 0: x = A^T y = 0 whatever y is
        return
    b2 = (np.abs(spec.beta) ** 2).sum(axis=1) if spec.beta.size else np.zeros(spec.s.shape)
    # a part of b at the rounding level (the intercept's direction, where the centered b has none) is no loss
    noise = (max(spec.m, 1) * np.finfo(np.float64).eps) ** 2 * float(b2.sum())
    for lam in lams:
        with np.errstate(under="ignore", over="ignore"):
            den = spec.s ** 2 + float(lam) ** 2
        lost = (den < tiny) & (b2 > noise) & ((spec.s > 0) | (float(lam) > 0))
        if np.any(lost):
            ea = ctx.sa.exponent if ctx.sa is not None else 0
            raise ParameterError(_msg(
                "lam", "must keep s^2 + lam^2 within float64 for every direction of the dual form x = A^T (A A^T + "
                "lam^2 I)^-1 b of a wide a (the problem divided by 2^%d, its largest entry's power of two)" % ea,
                f"lam = {float(np.ldexp(lam, ea)):.3g} with {int(lost.sum())} direction(s) whose s^2 + lam^2 is "
                f"below {tiny:.3g} in that problem (rows of a far apart in magnitude)", "scale the rows of a (and b) nearer each other, or solve the tall form "
                "min ||[a; lam I] x - [b; 0]|| (blocklin.solve with method='qr' on the stacked matrix)"))


def per_target(ctx: TikhonovRun, lams: list[float]) -> bool:
    """Leave-one-out lambdas chosen per right-hand side (one per column of ``b``)."""
    return ctx.kind == "loo" and ctx.per_target and len(lams) > 1


def lambdas(ctx: TikhonovRun, spec: Spectrum) -> tuple[list[float], dict | None]:
    weigh_columns(ctx, spec)
    if ctx.kind in ("gcv", "lcurve"):
        lam, curve = choose_lambda(spec, ctx.kind)
        return [lam], curve
    if ctx.kind == "loo" and ctx.folds is not None:  # cv=: k-fold of a wide a, in memory
        from blocklin.linalg.solve.kfold import wide_choose

        return wide_choose(ctx, spec)
    if ctx.kind == "loo":
        from blocklin.linalg.solve import loo

        return loo.choose(ctx, spec)
    return list(ctx.lams), None


def describe(info: dict, spec: Spectrum, lams: list[float], curve: dict | None, ctx: TikhonovRun) -> None:
    # solution_sq is that of 2^-xe x: lam^2 ||x||^2 = (2^xe lam)^2 ||2^-xe x||^2 (at most ||b||^2); the
    # solution_norm is reported in the units of 2^-xe x (least_squares._unscale_info multiplies it back)
    xe = spec._xe()
    if per_target(ctx, lams):
        rr = np.array([spec.residual_sq(l)[j] for j, l in enumerate(lams)])
        xx = np.array([spec.solution_sq(l)[j] for j, l in enumerate(lams)])
        info.update(lam=list(lams), residual_norm=norms(rr), solution_norm=norms(xx),
                    objective=norms(rr + np.ldexp(np.asarray(lams), xe) ** 2 * xx), lam_rule="loo", curve=curve)
        return
    rr = [spec.residual_sq(l) for l in lams]
    xx = [spec.solution_sq(l) for l in lams]
    if len(lams) == 1 and ctx.kind != "sequence":
        info.update(lam=lams[0], residual_norm=norms(rr[0]), solution_norm=norms(xx[0]),
                    objective=norms(rr[0] + np.ldexp(lams[0], xe) ** 2 * xx[0]))
    else:
        info.update(lam=list(lams), residual_norm=[norms(r) for r in rr], solution_norm=[norms(x) for x in xx],
                    objective=[norms(r + np.ldexp(l, xe)**2 * x) for r, x, l in zip(rr, xx, lams)])
    if curve is not None:
        info["lam_rule"] = ctx.kind
        info["curve"] = curve
        if ctx.kind != "loo":
            info["gcv"] = spec.gcv(lams[0])


__all__ = ["GRID", "Spectrum", "accuracy", "choose_lambda", "coefficients", "describe", "filters", "finish_spectral",
           "lambdas", "per_target", "s_interval", "spectrum_from_gram", "warn_inaccurate", "weigh_columns",
           "without_direction", "x_exponent"]
