"""The streaming-QR route of a tall Tikhonov solve: one TSQR pass, then the SVD of its R factor.

Accurate where the normal equations are not (tiny ``lam``, ill-conditioned ``A``: the condition
number is not squared); :func:`blocklin.solve` takes it for ``method="qr"`` and switches to it from
the normal equations when ``A^T A + lam^2 I`` is ill-conditioned.
"""

from __future__ import annotations

import numpy as np

from blocklin.linalg.blocks.streaming_qr import tsqr_pass
from blocklin.linalg.solve.spectrum import Spectrum, finish_spectral
from blocklin.linalg.solve.tikhonov import TikhonovRun, device_of_pass


def _spectrum_from_r(r: np.ndarray, qtb: np.ndarray, rho: np.ndarray, m: int) -> Spectrum:
    u, s, vt = np.linalg.svd(r, full_matrices=False)  # complex R = U S V^H: x = V S^-1 U^H Q^H b
    return Spectrum(s=s, basis=vt.conj().T, beta=u.conj().T @ qtb, rho0sq=rho**2, m=m, n=r.shape[1])


def qr_route(ctx: TikhonovRun, x_path: str, info: dict, reason: str) -> dict:
    """The spectrum of ``R`` from a recorded TSQR pass (``info`` gets the method and ``reason``); writes ``x``."""
    def run(scale: dict) -> dict:
        sr = tsqr_pass(ctx.job, ctx.A, ctx.B, ctx.cdtype, scale=scale,
                       device=device_of_pass(ctx, "tsqr pass", 2.0 * ctx.m * (ctx.n + ctx.k) ** 2))
        return {"r": sr.r, "qtb": sr.qtb, "rho": sr.rho, "norm_a": sr.norm_a}

    sr = ctx.saved.run("tsqr-pass", lambda: ctx.scaled_run(run))
    ctx.adopt(sr)
    spec = _spectrum_from_r(sr["r"], sr["qtb"], sr["rho"], ctx.m)
    info.update(method="qr", method_reason=reason, norm_a=float(sr["norm_a"]))
    return finish_spectral(ctx, spec, info, x_path)


__all__ = ["qr_route"]
