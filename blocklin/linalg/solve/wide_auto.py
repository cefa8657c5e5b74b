"""``method="auto"`` of a wide Tikhonov solve: the dual form, or the R factor of ``A^T`` where that is worth a pass.

The dual form ``x = A^T (G + lam^2 I)^-1 b`` solves with the computed ``G = A A^T``, ``G + dG`` with
``||dG|| <= e`` (``e`` about ``m eps ||A||^2``, the eigenvalues' rounding the spectrum records): to first order
``||dx|| <= ||A^T (G + lam^2 I)^-1|| e ||y||`` with ``||A^T (G + lam^2 I)^-1|| = phi = max_i s_i / (s_i^2 + lam^2)
<= 1 / (2 lam)`` (Golub and Van Loan, 2013, 6.1.4, in the dual form; docs/solve.md, "The dual form's accuracy").
The QR route (the SVD of the streaming R factor of ``A^T``, :func:`~blocklin.linalg.solve.qr_route.wide_qr_factor`)
is backward stable for the stacked least-squares problem ``min ||[A; lam I] x - [b; 0]||`` with ``K = [A; lam I]``,
so to first order (Wedin; Higham, *Accuracy and Stability of Numerical Algorithms*, 2002, Theorem 20.1)
``||dx|| / ||x|| <= d kappa (2 + (kappa + 1) ||r_K|| / (||K|| ||x||))`` for a relative backward error ``d``, with
``||K|| = (s_max^2 + lam^2)^(1/2)``, ``kappa = ||K|| / lam`` (a wide ``A`` leaves ``n - m`` singular values of
``K`` at ``lam``) and ``||r_K||^2 = ||b - A x||^2 + lam^2 ||x||^2``; at ``lam = 0`` (the minimum-norm solution of
the QR of ``A^T``) ``3 d kappa(A)``. Both passes sum products over ``A``'s columns, so their backward errors are of
one order (``e = d s_max^2``): the ratio of the two bounds,

``rho = s_max^2 phi ||y|| / (||x|| kappa (2 + (kappa + 1) ||r_K|| / (||K|| ||x||)))``,

is free of that constant and of the dimensions. It is at most about ``||A|| / lam`` (``b`` along ``A``'s small
singular directions: the dual form's ``eps ||A||^2 / lam^2`` against the stacked problem's ``eps ||A|| / lam``)
and near 1 or below where ``b`` lies along the large ones (there the dual form is as accurate, and its one pass
cheaper). ``method="auto"`` takes the QR route where ``rho`` reaches :data:`AUTO_DUAL_MARGIN` for some lambda and
right-hand side solved: the two bounds are worst cases whose constants differ by small factors, so a margin of
two decades is a real gain, paid by one more pass (the TSQR of ``A^T``; the product ``x = A^T y`` is made once).
Every quantity comes from the spectrum in hand (``O(r k)`` per lambda). Where ``A``'s rows lie far apart the dual
route solves again from the row-scaled kernel (:mod:`~blocklin.linalg.solve.scaled_kernel`), whose error is the
row-scaled system's condition times ``d``: that, where smaller, is the dual form's amplification
(:func:`row_scaled_condition`; one ``O(m^3)`` factorization per lambda, as that route makes).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from blocklin.linalg.solve.spectrum import Spectrum, filters, s_interval

#: ``method="auto"`` of a wide ``A`` takes the QR route where the dual form's first-order error bound is at least
#: this many times the QR route's (two decades: beyond the bounds' constants, and worth the TSQR pass).
AUTO_DUAL_MARGIN = 1e2


def amplifications(spec: Spectrum, lam: float) -> tuple[np.ndarray, np.ndarray]:
    """Per right-hand side at ``lam`` (of the problem the spectrum is of): what the dual form's and the QR route's
    first-order bounds multiply one relative backward error ``d`` by in ``||dx|| / ||x||`` (module docstring):
    ``s_max^2 phi ||y|| / ||x||`` and ``kappa (2 + (kappa + 1) ||r_K|| / (||K|| ||x||))``; both 0 where ``x`` is."""
    s = np.abs(np.asarray(spec.s, dtype=np.float64))
    k = spec.beta.shape[1] if spec.beta.ndim == 2 else 1
    smax = float(s.max(initial=0.0))
    if not smax > 0:
        return np.zeros(k), np.zeros(k)
    lam = abs(float(lam))
    lo, hi = s_interval(spec)  # phi over the values each s may take (the Gram spectrum's s are known to sqrt(e))
    beta = np.abs(spec.beta).reshape(s.size, -1)
    with np.errstate(over="ignore", under="ignore", divide="ignore", invalid="ignore"):
        xn = np.sqrt(np.maximum(spec.solution_sq(lam), 0.0))
        if lam > 0:
            phi = float(np.max(np.maximum(filters(lo, lam)[0], filters(hi, lam)[0]), initial=0.0))
            if np.any((lo <= lam) & (lam <= hi)):
                phi = max(phi, 0.5 / lam)
            f = filters(s, lam)[3]  # y = U diag(f) beta as Spectrum.coefficients forms it
            f = f if spec.dual_every_direction(lam) else np.where(s > 0, f, 0.0)
            norm_k = float(np.hypot(smax, lam))
            kappa = norm_k / lam
            rk = np.sqrt(np.maximum(spec.residual_sq(lam), 0.0) + lam**2 * xn**2)
            qr = kappa * (2.0 + (kappa + 1.0) * rk / (norm_k * xn))
        else:  # the minimum-norm solution: phi = 1 / s_min over the values s may take, the QR's 3 kappa(A)
            # (of A's computed s: the R factor resolves them to eps ||A||); an s whose interval reaches 0 leaves
            # the dual form's bound infinite, the QR's finite: a switch
            low = float(np.min(lo[s > 0], initial=np.inf))
            phi = 1.0 / low if low > 0 else np.inf
            f = np.where(s > 0, filters(s, 0.0)[3], 0.0)
            qr = np.full(k, 3.0 * smax / float(np.min(s[s > 0])))
        dual = smax**2 * phi * np.linalg.norm(f[:, None] * beta, axis=0) / xn
    live = (xn > 0) & np.isfinite(xn)
    return np.where(live, dual, 0.0), np.where(live, qr, 0.0)


def row_scaled_condition(kernel: np.ndarray, lam2: float, intercept: bool) -> float:
    """The condition of the row-scaled system the dual route solves again from where ``A``'s rows lie far apart
    (:func:`~blocklin.linalg.solve.scaled_kernel.scaled_factor`; with an intercept the bordered system,
    :func:`~blocklin.linalg.solve.bordered_kernel.bordered_factor`): its solve is off by about ``d`` times that,
    rows apart or not, where the dual form's norm-wise bound says far more (rows ``1e5`` and ``5e-4`` apart:
    ``cond`` near 1 at ``lam^2 = 1e-2``, the norm-wise ratio ``1e6``). ``inf`` where it is not positive definite."""
    from blocklin.linalg.solve import bordered_kernel, scaled_kernel

    if intercept:  # the kernel of the rows less a typical row, as the route sums it again where row 0 is far off
        ones = np.ones(kernel.shape[0])
        t = bordered_kernel.shift_loss(kernel, ones, np.array([lam2]))[0]
        factor = bordered_kernel.bordered_factor(bordered_kernel.shifted_by(kernel, t), ones, lam2)
        return float("inf") if factor is None else float(factor[3])
    factor = scaled_kernel.scaled_factor(kernel, lam2)
    if factor is None:
        return float("inf")
    low, d = factor
    h = kernel / np.outer(d, d) + np.diag(lam2 / d**2)
    return scaled_kernel.condition((h + h.conj().T) / 2, low)


def qr_gain(spec: Spectrum, lams: list[float], per_column: bool, kernels: tuple | None = None,
            intercept: bool = False) -> tuple[float, float]:
    """The largest ratio of the dual form's bound to the QR route's over ``lams`` (``per_column``: column ``j`` at
    ``lams[j]``), and its lambda. ``kernels``: ``(K, K_s)``, the kernel the row-scaled solves test (centered with
    an intercept) and the one they factor (of the rows less the first with an intercept): where they take a lambda
    again (:func:`~blocklin.linalg.solve.scaled_kernel.refit`), the dual form's amplification is the smaller of
    its norm-wise one and :func:`row_scaled_condition`."""
    from blocklin.linalg.solve import scaled_kernel

    worst, at = 0.0, float(lams[0]) if lams else 0.0
    for j, lam in enumerate(lams):
        dual, qr = amplifications(spec, lam)
        if per_column:
            dual, qr = dual[j:j + 1], qr[j:j + 1]
        if kernels is not None and lam > 0:
            ev = np.clip(np.asarray(spec.s, dtype=np.float64) ** 2, 0.0, None)
            if scaled_kernel.refit(kernels[0], ev, np.array([lam]), np.array([False]))[0]:
                dual = np.minimum(dual, row_scaled_condition(kernels[1], float(lam) ** 2, intercept))
        with np.errstate(divide="ignore", invalid="ignore"):
            ratio = np.where(qr > 0, dual / np.where(qr > 0, qr, 1.0), 0.0)
        top = float(np.max(np.nan_to_num(ratio, nan=0.0, posinf=np.inf), initial=0.0))
        if top > worst:
            worst, at = top, float(lam)
    return worst, at


def may_switch_to_qr(ctx: Any) -> bool:
    """Whether ``method="auto"`` may switch this wide solve to the QR route: the R factor is of the unweighted
    ``A`` (sample weights stay with the dual form, as ``method="qr"`` refuses them) and ``cv=``'s folds are fitted
    from ``A A^T`` (:mod:`blocklin.linalg.solve.kfold`)."""
    return ctx.method == "auto" and not ctx.weighted and ctx.folds is None


__all__ = ["AUTO_DUAL_MARGIN", "amplifications", "qr_gain", "row_scaled_condition", "may_switch_to_qr"]
