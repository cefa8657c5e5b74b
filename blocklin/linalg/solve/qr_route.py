"""The streaming-QR route of a Tikhonov solve: one TSQR pass, then the SVD of its R factor.

Accurate where the normal equations are not (tiny ``lam``, ill-conditioned ``A``: the condition
number is not squared); :func:`blocklin.solve` takes it for ``method="qr"`` and switches to it from
the normal equations when ``A^T A + lam^2 I`` is ill-conditioned.

``fit_intercept`` streams ``[1 | A - 1 a_1^T | b - b_1]`` (the rows less the first row, as the normal
route's passes sum them): the first Householder step of the ones column removes the column means, so the
trailing factor ``[[R22, c2], [0, T]]`` is that of the centered ``[A_c b_c]`` (``R22^H R22 = A_c^H A_c``
without the cancellation of ``A^H A - m mu mu^H``, and rounded relative to the shifted rows rather than
to the column means) and the first row ``[r11, r12, c1]`` gives the means ``mu = a_1 + r12 / r11``,
``bbar = b_1 + c1 / r11``. A wide ``A`` (``m < n``)
takes the dual form from the R factor of its tall orientation, ``A^T = Q R``: ``A A^H = R'^H R'`` with
``R' = conj(R)`` (``R`` itself of real data), whose SVD ``R' = U S V^H`` gives
``y = V diag(1/(s^2 + lam^2)) V^H b`` and ``x = A^H y`` (one more pass), ``A A^H`` never formed.
"""

from __future__ import annotations

import numpy as np

from blocklin.linalg.blocks.streaming_qr import tsqr_pass
from blocklin.linalg.solve.spectrum import Spectrum, coefficients, finish_spectral
from blocklin.linalg.solve.tikhonov import TikhonovRun, device_of_pass, write_x


def _spectrum_from_r(r: np.ndarray, qtb: np.ndarray, rho: np.ndarray, m: int) -> Spectrum:
    u, s, vt = np.linalg.svd(r, full_matrices=False)  # complex R = U S V^H: x = V S^-1 U^H Q^H b
    return Spectrum(s=s, basis=vt.conj().T, beta=u.conj().T @ qtb, rho0sq=rho**2, m=m, n=r.shape[1])


def qr_route(ctx: TikhonovRun, x_path: str, info: dict, reason: str) -> dict:
    """The spectrum of ``R`` from a recorded TSQR pass (``info`` gets the method and ``reason``); writes ``x``.

    With ``ctx.intercept`` the pass factors ``[1 | A | b]`` and ``info["intercept"]`` is
    ``bbar - mu^T x`` in the units of the scaled problem (the ones column is not scaled:
    ``mu``, ``bbar`` are the means of ``2^-ea A`` and ``2^-eb b``, as the normal route's are)."""
    ones = bool(ctx.intercept)

    def run(scale: dict) -> dict:
        shift = ctx.shifts(scale) if ones else None  # the rows less the first row (tikhonov.TikhonovRun.shifts)
        sr = tsqr_pass(ctx.job, ctx.A, ctx.B, ctx.cdtype, scale=scale, ones=ones, shift=shift,
                       device=device_of_pass(ctx, "tsqr pass", 2.0 * ctx.m * (ctx.n + ctx.k + ones) ** 2))
        out = {"r": sr.r, "qtb": sr.qtb, "rho": sr.rho, "norm_a": sr.norm_a}
        return out | ({"ones_row": sr.ones_row, "sa0": shift[0], "sb0": shift[1]} if ones else {})

    sr = ctx.saved.run("tsqr-pass-ones-shifted" if ones else "tsqr-pass", lambda: ctx.scaled_run(run))
    ctx.adopt(sr)
    spec = _spectrum_from_r(sr["r"], sr["qtb"], sr["rho"], ctx.m)
    if not ones:
        info.update(method="qr", method_reason=reason, norm_a=float(sr["norm_a"]))
        return finish_spectral(ctx, spec, info, x_path)
    cut_centering_noise(spec, float(sr["norm_a"]), ctx.m, ctx.n)
    row, n = np.asarray(sr["ones_row"]), ctx.n
    r11 = row[0]  # +-sqrt(m), real: the ones column's norm
    # the means of the shifted rows, plus the shift: the factor's rounding is relative to A - 1 a_1^T (about
    # the columns' spread), where [1 | A | b] itself had rounded relative to the column means (means 1e8
    # times the spread: x 7e-9 relative off and the intercept 2.6 off for 5e8, the normal route's 1e-7)
    ctx.mu = np.asarray(sr["sa0"]) + row[1:n + 1] / r11
    ctx.bbar = np.asarray(sr["sb0"]) + row[n + 1:] / r11
    # the centered A's ||.||_F, as the normal route reports it
    info.update(method="qr", method_reason=reason + " (fit_intercept: [1 | A | b] streamed, the R factor of the "
                "centered A from the ones column's Householder step)", norm_a=float(np.linalg.norm(sr["r"])))
    xs = coefficients(ctx, spec, info, "column")
    info["intercept"] = ctx.intercepts(xs, info)
    write_x(ctx, x_path, np.hstack(xs) if len(xs) > 1 else xs[0])
    return info


def cut_centering_noise(spec: Spectrum, norm_a: float, m: int, n: int, exclude: np.ndarray | None = None) -> None:
    """Directions of the centered ``R22`` whose singular value is at the rounding level of the ones column's
    Householder step, ``max(m, n) eps ||A||_F`` of the uncentered ``A``, are zero: that step's backward error
    is of that size column by column, so such a singular value is rounding (constant columns near ``1e200``,
    whose centered ``A`` is exactly 0, gave ``x`` near ``1e-156`` and an intercept of ``5.7e44`` for ``b`` of
    mean 0.13 at ``lam = 0.1``). Their part of ``b`` joins what no lambda fits, as for a zero ``s``."""
    tol = max(m, n + 1) * np.finfo(np.float64).eps * norm_a
    spec.sv_noise = max(spec.sv_noise, tol)  # every direction's resolution (spectrum.accuracy)
    cut = spec.s <= tol
    if not cut.any():
        return
    if exclude is None:
        spec.cut_b2 = (np.abs(spec.beta[cut]) ** 2).sum(axis=0)
    else:  # a dual spectrum: the intercept's direction (unit vector ``exclude``) is no unresolved part of A
        p = spec.basis[:, cut] @ spec.beta[cut]
        p = p - np.outer(exclude, exclude.conj() @ p)
        spec.cut_b2 = (np.abs(p) ** 2).sum(axis=0)
    spec.rho0sq = spec.rho0sq + (np.abs(spec.beta[cut]) ** 2).sum(axis=0)
    spec.beta = np.where(cut[:, None], 0.0, spec.beta)
    spec.s = np.where(cut, 0.0, spec.s)


def wide_qr_factor(ctx: TikhonovRun) -> tuple[np.ndarray, int, np.ndarray | None]:
    """``R'`` (``m x m``) with ``A' A'^H = R'^H R'`` for a wide ``A' = 2^-ea A`` (scaled as it is read): the
    TSQR of its tall orientation, ``A'^T = Q R``, ``R' = conj(R)`` (``R`` of real data); ``ea``; and, with an
    intercept, ``c = Q^H a_1'``: the factor is then that of the columns less their first entries,
    ``A_s'^T = Q R`` with ``A_s' = A' - 1 a_1'^T`` (``P A_s A_s^H P^H = P A A^H P^H``), whose rounding is
    relative to the columns' spread, not their means, and ``a_1^T A_s^H z = c^T (R' z)`` (the factor of ``A'`` itself had left the intercept ``37`` off for ``2.5e8`` at
    means ``1e8`` times the spread; the Gram route's shifted sums ``2.4e-7``)."""
    shift = bool(ctx.intercept)

    def run(scale: dict) -> dict:
        ctx.phases["tsqr pass"] = "cpu"
        sr = tsqr_pass(ctx.job, ctx.A, None, ctx.cdtype, scale=scale, transposed=True, device="cpu",
                       shift_first=shift)
        return {"r": sr.r} | ({"c": sr.first_qh} if shift else {})

    rec = ctx.saved.run("wide-tsqr-pass-shifted" if shift else "wide-tsqr-pass",
                        lambda: ctx.sa.run(ctx.job, run) | {"ea": ctx.sa.exponent})
    r = np.asarray(rec["r"])
    c = np.asarray(rec["c"]) if shift else None
    return (r.conj() if np.iscomplexobj(r) else r), int(rec["ea"]), c


def dual_spectrum(r: np.ndarray, bm: np.ndarray, m: int, n: int) -> Spectrum:
    """The dual spectrum of ``G = R^H R`` from the SVD ``R = U S V^H`` (``G = V S^2 V^H``): ``basis = V``,
    ``beta = V^H b``; every part of ``b`` is fitted (``rho0 = 0``), as :func:`spectrum_from_gram` has it."""
    u, s, vt = np.linalg.svd(r, full_matrices=False)
    v = vt.conj().T
    spec = Spectrum(s=s, basis=v, beta=v.conj().T @ bm, rho0sq=np.zeros(bm.shape[1]), m=m, n=n, dual=True)
    spec.left = u  # R y = U diag(s / (s^2 + lam^2)) beta: the intercept's mu^T x (wide.py)
    return spec


__all__ = ["cut_centering_noise", "dual_spectrum", "qr_route", "wide_qr_factor"]
