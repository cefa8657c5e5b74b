"""Choosing the Tikhonov parameter from a spectrum, and which spectrum is safe to choose it from.

The rules work on a :class:`~blocklin.linalg.solve.spectrum.Spectrum` (singular values ``s``, the
projections ``beta`` of ``b`` and the unfittable ``rho0^2``): every ``lam`` costs ``O(n k)`` there, so
a dense grid and a bounded refinement are cheap.

* :func:`choose_lambda`: generalized cross-validation (Golub, Heath and Wahba, 1979), or the corner
  of the L-curve, the point of maximum curvature of ``(log ||r||, log ||x||)`` (Hansen and O'Leary,
  1993). A minimum or corner at an end of the grid is not a choice: the grid is extended by
  :data:`EXTEND_DECADES` on that side (up to :data:`MAX_EXTENSIONS` times), and if the end is still
  the answer the result carries ``at_grid_end`` and a warning says so.
* :func:`spectrum_route`: the one-pass normal-equation spectrum (eigen-decomposition of ``A^T A``)
  is as accurate as the QR spectrum wherever ``A^T A + lam^2 I`` is well conditioned, the test
  ``method="auto"`` applies to a single ``lam`` (reciprocal condition above ``AUTO_RCOND``). For a
  rule, the test is made at the chosen ``lam`` (whose solution is then refined as a single ``lam``
  would be); for a sequence, at its smallest value, with the stricter bound ``AUTO_REFINE_RCOND``
  under which no refinement is needed. Otherwise the streaming QR (one more pass) is the safe route.

References
----------
G. H. Golub, M. Heath, G. Wahba, "Generalized cross-validation as a method for choosing a good ridge
parameter", Technometrics 21(2), 1979. P. C. Hansen, D. P. O'Leary, "The use of the L-curve in the
regularization of discrete ill-posed problems", SIAM J. Sci. Comput. 14(6), 1993.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from blocklin.errors import warn

#: Points of the lambda grid.
GRID = 300
#: Decades added on the side where the GCV minimum or the L-curve corner sits at the grid's end.
EXTEND_DECADES = 4
#: Extensions tried on each side before the end is reported as the answer.
MAX_EXTENSIONS = 2


def base_grid(s: np.ndarray, points: int = GRID, floor: float = 0.0) -> np.ndarray:
    """Log-spaced lambdas from a tenth of the smallest resolvable singular value to the largest, none
    below ``floor`` (:attr:`~blocklin.linalg.solve.spectrum.Spectrum.floor`: the resolution of a
    spectrum from the Gram matrix)."""
    smax = float(s.max()) if s.size else 1.0
    smin = float(s[s > 0].min()) if np.any(s > 0) else smax
    lo = max(max(smin, smax * 1e-8 * 1e-4) / 10, floor)
    return np.logspace(math.log10(max(lo, 1e-300)), math.log10(max(smax, lo, 1e-300)), points)


def _extend(lams: np.ndarray, side: str) -> np.ndarray:
    per_decade = (len(lams) - 1) / max(math.log10(lams[-1] / lams[0]), 1e-12)
    extra = max(2, int(round(EXTEND_DECADES * per_decade)))
    if side == "low":
        new = np.logspace(math.log10(lams[0]) - EXTEND_DECADES, math.log10(lams[0]), extra + 1)[:-1]
        return np.concatenate([new, lams])
    new = np.logspace(math.log10(lams[-1]), math.log10(lams[-1]) + EXTEND_DECADES, extra + 1)[1:]
    return np.concatenate([lams, new])


def _corner_index(rr: np.ndarray, xx: np.ndarray, lams: np.ndarray) -> tuple[int, np.ndarray]:
    """Index of maximum curvature of the L-curve (log-log), ends excluded (one-sided differences)."""
    t = np.log(lams)
    x, y = 0.5 * np.log(np.maximum(rr, 1e-300)), 0.5 * np.log(np.maximum(xx, 1e-300))
    dx, dy = np.gradient(x, t), np.gradient(y, t)
    ddx, ddy = np.gradient(dx, t), np.gradient(dy, t)
    with np.errstate(invalid="ignore", divide="ignore"):
        kappa = (dx * ddy - ddx * dy) / (dx**2 + dy**2) ** 1.5
    kappa[~np.isfinite(kappa)] = -np.inf
    kappa[[0, -1]] = -np.inf
    return int(np.argmax(kappa)), kappa


def _index(spec: Any, rule: str, lams: np.ndarray) -> tuple[int, dict]:
    rr, xx, g = spec.on_grid(lams)
    curve = {"lam": lams.tolist(), "residual_norm": np.sqrt(rr).tolist(), "solution_norm": np.sqrt(xx).tolist()}
    if rule == "gcv":
        curve["gcv"] = g.tolist()
        return int(np.nanargmin(g)), curve
    i, kappa = _corner_index(rr, xx, lams)
    curve["curvature"] = np.where(np.isfinite(kappa), kappa, np.nan).tolist()
    return i, curve


def _at_end(i: int, n: int, rule: str) -> str | None:
    edge = 0 if rule == "gcv" else 1  # the L-curve's curvature is undefined at the end points
    return "low" if i <= edge else "high" if i >= n - 1 - edge else None


def _refine_gcv(spec: Any, lams: np.ndarray, i: int, g_i: float) -> float:
    """Bounded minimization of GCV between the grid neighbours of its grid minimum."""
    from scipy.optimize import minimize_scalar

    lo, hi = lams[max(0, i - 1)], lams[min(len(lams) - 1, i + 1)]
    if hi <= lo:
        return float(lams[i])
    res = minimize_scalar(lambda t: spec.gcv(10.0**t), bounds=(math.log10(lo), math.log10(hi)), method="bounded",
                          options={"xatol": 1e-4})
    return float(10.0**res.x) if res.success and spec.gcv(10.0**res.x) <= g_i else float(lams[i])


def choose_lambda(spec: Any, rule: str, *, points: int = GRID, quiet: bool = False) -> tuple[float, dict]:
    """``lam`` by ``rule`` (``"gcv"`` or ``"lcurve"``) and the curve it was read from.

    The curve dict has ``lam``, ``residual_norm``, ``solution_norm`` and ``gcv`` or ``curvature``
    per grid point, ``chosen`` (the lambda) and ``at_grid_end`` (``"low"``, ``"high"`` or None: the
    minimum or corner stayed at an end after :data:`MAX_EXTENSIONS` extensions, with a warning unless
    ``quiet``: :func:`warn_at_end` gives it later).
    """
    floor = float(spec.floor)
    lams = base_grid(spec.s, points, floor)
    extended = {"low": 0, "high": 0}
    while True:
        i, curve = _index(spec, rule, lams)
        end = _at_end(i, len(lams), rule)
        if end is None or extended[end] >= MAX_EXTENSIONS or (end == "low" and lams[0] <= max(floor, 1e-290)):
            break
        extended[end] += 1
        lams = _extend(lams, end)
        if floor:  # not below the spectrum's resolution
            lams = np.unique(np.concatenate([[floor], lams[lams > floor]])) if lams[0] < floor else lams
    best = _refine_gcv(spec, lams, i, curve["gcv"][i]) if rule == "gcv" else float(lams[i])
    curve.update(chosen=best, at_grid_end=end, extended_decades={k: v * EXTEND_DECADES for k, v in extended.items()})
    if floor:
        curve["floor"] = floor
    if not quiet:
        warn_at_end(curve, rule)
    return best, curve


def warn_at_end(curve: dict, rule: str) -> None:
    """Warn when the curve's minimum or corner stayed at an end of its (extended) grid."""
    end = curve.get("at_grid_end")
    if end is None:
        return
    what = "GCV minimum" if rule == "gcv" else "L-curve corner"
    lams = curve["lam"]
    floor = curve.get("floor", 0.0)
    why = (f"; below {floor:.3g} the eigen-decomposition of A^T A cannot tell lambdas apart (rounding), "
           "method='qr' can" if end == "low" and floor and lams[0] <= floor * (1 + 1e-9) else "")
    warn(f"solve: the {what} sits at the {end} end of lambda in [{lams[0]:.3g}, {lams[-1]:.3g}] even after "
         f"extending it by {curve['extended_decades'][end]} decades; lambda = {curve['chosen']:.3g} is a bound, "
         f"not a {'minimum' if rule == 'gcv' else 'corner'} (pass a lambda or a sequence to compare){why}")


def rcond_at(s: np.ndarray, lam: float) -> float:
    """Reciprocal 2-norm condition of ``A^T A + lam^2 I`` from the singular values of ``A``."""
    if not s.size:
        return 1.0
    s2 = np.asarray(s, dtype=np.float64) ** 2
    top = float(s2.max()) + lam**2
    return (float(s2.min()) + lam**2) / top if top > 0 else 0.0


def spectrum_route(s: np.ndarray, lams: list[float], rule: str | None, *, rcond_rule: float,
                   rcond_sequence: float) -> tuple[bool, float, str]:
    """Whether the normal-equation spectrum is safe for these lambdas: ``(ok, rcond, reason)``.

    ``s`` are the singular values from the eigen-decomposition of ``A^T A``; ``lams`` the chosen
    lambda (a rule) or the sequence. The test is the one ``method="auto"`` makes for one ``lam``.
    """
    lam = min(lams)
    rc = rcond_at(s, lam)
    bound = rcond_rule if rule else rcond_sequence
    what = f"the {rule} choice lambda = {lam:.3g}" if rule else f"the smallest lambda of the sequence ({lam:.3g})"
    if rc >= bound:
        return True, rc, (f"one pass: eigen-decomposition of A^T A (at {what}, A^T A + lam^2 I has reciprocal "
                          f"condition {rc:.1e} >= {bound:.0e})")
    return False, rc, (f"at {what}, A^T A + lam^2 I has reciprocal condition {rc:.1e} < {bound:.0e}: switched to "
                       "the streaming QR (one more pass)")


__all__ = ["base_grid", "choose_lambda", "rcond_at", "spectrum_route", "warn_at_end"]
