"""One run of a planned SVD: the source of ``B`` (held in memory, or streamed after the means pass of a
centered or scaled ``A``), the planned method on it, the streaming QR route where ``B^T B`` cannot hold
``B``, and the factors of ``A`` from those of its scaled copy (:mod:`blocklin.linalg.blocks.scaling`).
"""

from __future__ import annotations

import contextvars
import dataclasses
from typing import Any

import numpy as np

from blocklin.errors import ParameterError, explain
from blocklin.linalg.blocks.center import Moments, Shift, moments_incore
from blocklin.linalg.blocks.scaling import ProductScaling, Scaling, check_scaled_back_range, incore_exponent, refuse_nonfinite, unscale
from blocklin.linalg.lowrank.centering import fused_start, means_pass, moments_gram
from blocklin.linalg.lowrank.methods import (Factorization, gram, lanczos, rsvd, sketch, squares_lost, tsqr_svd,
                                             whole_space)
from blocklin.linalg.lowrank.sources import GRAM_BLOCK_BYTES, InCore, Source, Streamed, load_incore
from blocklin.plan.svd import SvdPlan
from blocklin.runtime.checkpoints import Checkpoints
from blocklin.runtime.job import Job
from blocklin.runtime.passes import source
from blocklin.runtime.powers import ldexp

#: What an SVD's refusal of NaN or Inf names: the operations that reach it (:func:`refuse_nonfinite`).
SVD_USERS = "an SVD (svd, pca, the spectral norms 2, -2 and 'nuc', cond, lstsq)"


def run_planned(job: Job, A: Any, plan: SvdPlan, *, k: int, q: int | None, tol: float | None, seed: int,
                limit: int, dest: str | None, center: bool = False, scale: bool = False,
                ckpt: Checkpoints | None = None, which: str = "LM", signs: bool = False,
                v0: np.ndarray | None = None, keep: dict | None = None, sketch_y: Any = None) -> Factorization:
    """Run the planned method on ``B`` in memory (read once) or streamed; the long factor goes to ``dest``
    (``None``: not wanted, not computed). ``which``: the largest (``"LM"``) or, for ``method="full"``, the
    smallest (``"SM"``) ``k`` triplets. ``signs``: tall ``A``'s triplets signed by the components' rule
    as the long factor is written (:func:`~blocklin.linalg.lowrank.methods.component_signs`; a wide
    real ``A``'s components are its long factor, signed by :func:`blocklin.svd` once written; complex
    ``A``'s phases are always those of the short factor, ``V`` of ``B``).

    With ``center``/``scale`` the factored matrix is ``B_c`` (:mod:`blocklin.linalg.blocks.center`): centered
    in memory when ``B`` is held there, by the rank-one correction inside each pass otherwise. ``keep``:
    filled with the co-moments where the means pass makes them (an updatable result keeps them,
    :mod:`blocklin.linalg.lowrank.updatable`), or with the single-pass sketch's state, whose ``Y`` is
    then stored at ``sketch_y`` (:mod:`blocklin.linalg.update.sketch`)."""
    # no SVD of NaN or Inf: refused once the first pass has seen max |a| (the check_finite=False case)
    scaling = Scaling.of(source(A, transposed=plan.transposed), A.dtype, finite_for=SVD_USERS)
    job.column_peaks.add(scaling.path)  # the first pass records each column's peak: squares_lost reads them
    saved = ckpt.load("scaling") if ckpt is not None and not plan.in_core else None
    if saved is not None:  # resume: the power of two the checkpointed passes were made with
        scaling.e, scaling.amax = int(saved["e"]), float(saved["amax"])
    gram_start, means_fused = None, False
    if plan.in_core:
        src, moments, phases = _in_memory(job, A, plan, scaling, center=center, scale=scale)
    else:
        src, moments, gram_start, means_fused = _streamed(job, A, plan, ckpt, scaling, seed=seed, q=q, center=center,
                                                          scale=scale, v0=v0, keep=keep)
        phases = {"passes over A": src.device or job.device}
    check_unscaled_constants(moments, scaling, center=center, scale=scale)
    check_standardizable(moments, scaling, scale=scale)
    ckpt = ckpt if ckpt is not None and not plan.in_core else Checkpoints(None)  # in memory: nothing to skip
    # complex data: the phase rule on the short factor, B's V (svd's convention, whatever is returned)
    src.signs = signs and (not plan.transposed or np.dtype(A.dtype).kind == "c")
    f = _method(src, plan, k=k, q=q, tol=tol, seed=seed, limit=limit, dest=dest, ckpt=ckpt, gram_start=gram_start,
                which=which, v0=v0, keep=keep if sketch_y is not None else None, sketch_y=sketch_y)
    why = (squares_lost(src, plan.method) if plan.method in ("rsvd", "lanczos", "full") and not (center or scale)
           else None)
    if why:  # B^T B could not hold B: the answer again, without squares (2 more passes over A)
        if dest is not None:  # the long factor the method wrote in this run's own partial output
            from blocklin.storage.backend import remove
            from blocklin.storage.location import as_location

            remove(as_location(dest))
        f = dataclasses.replace(tsqr_svd(src, k, dest, plan.transposed, which, seed=seed), fallback=why)
    f = dataclasses.replace(f, phases=phases, means_fused=means_fused)
    return scaled_back(f, scaling, moments, center=center, scale=scale)


def _in_memory(job: Job, A: Any, plan: SvdPlan, scaling: Scaling, *, center: bool,
               scale: bool) -> tuple[InCore, Moments | None, dict]:
    """``B`` read into memory, scaled by its power of two and centered and/or scaled in place; on a GPU
    also kept on the device. Returns the source, the column moments and where the phases ran."""
    moments = None
    b = load_incore(job, A, plan)
    scaling.e, scaling.amax = incore_exponent(real_parts(b))
    refuse_nonfinite(scaling.amax, SVD_USERS)
    if scaling.e:  # held in memory: scaled in place (a power of two: exact)
        ldexp(b, -scaling.e, out=b)
    if center or scale:
        moments = moments_incore(b, plan.transposed)
        Shift.of(moments, center=center, scale=scale, transposed=plan.transposed).apply_incore(b)
    dev = None
    # B stays on the GPU for the job, beside the products' blocks (and the Gram route's N x N sum, its
    # SYRK output and a float64 row block): held from the device's shared budget
    held = int(1.5 * b.nbytes) + (2 * plan.N * plan.N * 8 + GRAM_BLOCK_BYTES if plan.method == "gram" else 0)
    if job.device == "gpu" and held <= (job.device_memory() or 0):
        from blocklin.device import get_device

        dev = get_device("gpu", device_memory=job.device_memory())
        job.stack.enter_context(dev.reserve(held))
    src = InCore(b, dev, peaks=job.peaks.get(scaling.path))  # the peaks recorded by the pass that read B
    return src, moments, {"read A": "cpu", "products with A": "gpu" if dev is not None else "cpu"}


def real_parts(b: np.ndarray) -> np.ndarray:
    """A real view of ``b``: itself, or the real and imaginary parts of complex data side by side (their
    largest magnitude is what the scaling of the passes reads, :func:`blocklin.runtime.powers.ldexp`)."""
    if b.dtype.kind != "c":
        return b
    return b.view(b.real.dtype) if b.flags.c_contiguous else np.stack((b.real, b.imag))


def _streamed(job: Job, A: Any, plan: SvdPlan, ckpt: Checkpoints | None, scaling: Scaling, *, seed: int,
              q: int | None, center: bool, scale: bool, v0: np.ndarray | None = None,
              keep: dict | None = None) -> tuple[Streamed, Moments | None, np.ndarray | None, bool]:
    """``B`` streamed, after the means pass of a centered or scaled ``A``. Returns the source, the column
    moments, the Gram route's subspace when the means pass made it, and whether the means pass was
    fused with the method's first pass."""
    moments = shift = fused = gram_start = first = None
    if plan.method == "gram" and (center or scale):  # the means pass makes the centered Gram too
        moments, gram_start = moments_gram(job, A, plan, ckpt, center=center, scale=scale, scaling=scaling,
                                           keep=keep)
    else:
        fused = fused_start(job, A, plan, seed, q, v0) if center and not scale else None
        if center or scale:
            moments, first = means_pass(job, A, plan, ckpt, fused, scaling=scaling)
    if moments is not None:
        shift = Shift.of(moments, center=center, scale=scale, transposed=plan.transposed)
    src = Streamed(job, A, plan, shift, scaling)
    if fused is not None and first is not None:
        src.first = (fused, first)
    if moments is not None and center:  # the products are rounded at ||A||, before the means are removed
        sq = moments.count * (moments.var + np.abs(moments.mean) ** 2) / (moments.std ** 2 if scale else 1.0)
        src.noise_scale = float(np.sqrt(sq.sum()))
    return src, moments, gram_start, fused is not None or gram_start is not None


def _method(src: Source, plan: SvdPlan, *, k: int, q: int | None, tol: float | None, seed: int, limit: int,
            dest: str | None, ckpt: Checkpoints, gram_start: np.ndarray | None, which: str = "LM",
            v0: np.ndarray | None = None, keep: dict | None = None, sketch_y: Any = None) -> Factorization:
    """The planned method on ``src`` (in memory the iterative ones may take more steps: nothing is read again)."""
    if plan.method == "full":
        return whole_space(src, k, which, dest, plan.transposed, seed)
    if plan.method == "rsvd":
        return rsvd(src, k, plan.block, q, tol, seed, limit if not plan.in_core else max(limit, 100), dest,
                    plan.transposed, ckpt, v0)
    if plan.method == "gram":
        return gram(src, k, plan, tol, seed, max(limit, 500) if plan.in_core else limit - 2, dest, plan.transposed,
                    ckpt, start=gram_start, which=which)
    if plan.method == "sketch":
        return sketch(src, k, *plan.sketch_size, seed, dest, plan.transposed, keep=keep, y_path=sketch_y)
    return lanczos(src, k, plan, tol, seed, max(limit, 500) if plan.in_core else limit - 1, dest, plan.transposed,
                   ckpt, v0=v0)


def _all_unscaled(moments: Moments | None, *, center: bool, scale: bool) -> bool:
    """``scale`` without ``center`` where every column is constant: each is left unscaled, so ``B_c`` is
    ``2^-e A`` itself."""
    return scale and not center and moments is not None and bool(np.all(moments.constant))


def check_unscaled_constants(moments: Moments | None, scaling: Scaling | ProductScaling, *, center: bool,
                             scale: bool) -> None:
    """Refuse ``scale`` without ``center`` on data scaled by ``2^-e`` (beyond the range squared safely)
    whose constant nonzero columns sit beside standardized ones: those are left unscaled (scikit-learn's
    rule), so ``B_c`` mixes columns of ``A``'s magnitude with columns of 1, which no power of two brings
    into range together (they came out ``2^e`` off, found by a randomized search)."""
    if not (scale and not center and moments is not None and scaling.exponent) or \
            _all_unscaled(moments, center=center, scale=scale):
        return
    fixed = np.flatnonzero(moments.constant & (moments.mean != 0))
    if fixed.size:
        raise ParameterError(explain(
            "scale", "leaves a constant column unscaled, which on data this far from 1 cannot be factored beside "
            "the standardized ones", f"{fixed.size} constant nonzero column(s) (column {fixed[0] + 1} first) in "
            f"data scaled by 2^{-scaling.exponent} to be read", "pass center=True as well (a constant column "
            "becomes zero), or drop the constant columns, or bring the data nearer 1 first"))


def check_standardizable(moments: Moments | None, scaling: Scaling | ProductScaling | None, *, scale: bool) -> None:
    """Refuse ``scale`` where a column's squares left float64's range in the data as the moments pass read it
    (``2^-e A``): entries ``2^-485`` and more below the largest (one power of two scales them all). Its
    variance, below ``2^-970`` (the smallest normal number over ``eps``: squares within 52 bits of the
    underflow threshold, some subnormal), is then 0 or has lost digits, so the column was taken as constant (centered to
    zero) or divided by a wrong standard deviation, while standardizing makes it a column like the others:
    the singular values had come out finite and wrong (one column 2^-660 times the others, a randomized
    search). A column whose mean is 0 as well (entries ``2^-600`` that sum to 0) is told from a zero column
    by the pass's count of its nonzero entries (``Moments.nonzero``): a zero column stays zero, as it
    should."""
    if not scale or moments is None:
        return
    e = scaling.exponent if scaling is not None else 0  # None: moments of the data as stored
    info = np.finfo(np.float64)
    floor = float(info.tiny / info.eps)
    var, mean = np.asarray(moments.var, dtype=np.float64), np.abs(np.asarray(moments.mean))
    nonzero = (var != 0) | (mean != 0)
    if moments.nonzero is not None:
        nonzero |= np.asarray(moments.nonzero, dtype=bool)
    lost = np.flatnonzero((var < floor) & (mean < np.sqrt(floor)) & nonzero)
    if lost.size:
        j = int(lost[0])
        raise ParameterError(explain(
            "scale", "needs each column's variance within float64's range in the data as read (its squares "
            f"{'scaled by 2^' + str(-e) + ' ' if e else ''}above 2^-970), to "
            "standardize it", f"{lost.size} column(s) (column {j + 1} first: mean {float(mean[j]):.3g}, variance "
            f"{float(var[j]):.3g}) far below the largest entry", "multiply those columns by a power of two near "
            "1 / their largest magnitude first (exact, and standardizing is unchanged by it), or drop them"))


#: Set by :func:`blocklin.linalg.lowrank.svd.scaled_values` (for :func:`blocklin.cond` and
#: :func:`blocklin.lstsq`): ``s`` and the residuals stay those of ``2^-e B``, not multiplied back by
#: ``2^e`` (``e`` in the report's ``scaling``), so that the ratios of the singular values of data near
#: the ends of the range are those computed, not of values rounded to subnormal numbers or 0 (or refused
#: beyond float64's range) on their way back.
SCALED_VALUES: contextvars.ContextVar[bool] = contextvars.ContextVar("svd_scaled_values", default=False)


def scaled_back(f: Factorization, scaling: Scaling | ProductScaling, moments: Moments | None, *, center: bool,
                scale: bool) -> Factorization:
    """The factors of ``B`` from those of ``2^-e B`` the method made, with the scaling's report and the
    column moments (of ``A``, and of ``2^-e A`` when scaled), means and standard deviations (``s`` of
    ``2^-e B`` within :data:`SCALED_VALUES`)."""
    e = scaling.exponent
    if e and SCALED_VALUES.get() and (not scale or _all_unscaled(moments, center=center, scale=scale)):
        f = dataclasses.replace(f, values_exponent=e)  # s kept of 2^-e B; the report says them multiplied back
    elif e and (not scale or _all_unscaled(moments, center=center, scale=scale)):
        # the factors of 2^-e B: s and residuals scale back by 2^e, vectors are unchanged
        # (a standardized B is the same for 2^-e A: nothing to scale back)
        check_scaled_back_range("a", f.s, e, "singular values")
        residuals = None if f.residuals is None else unscale(np.asarray(f.residuals, dtype=np.float64), e)
        f = dataclasses.replace(f, s=unscale(f.s, e), residuals=residuals)
    if e:
        if moments is not None:
            f = dataclasses.replace(f, scaled_moments=(moments, e))
            # from the scaled variances (finite where var overflows); a constant column keeps its 1
            std = np.where(moments.constant, 1.0, unscale(moments.std, e))
            with np.errstate(over="ignore", under="ignore"):  # variances beyond float64: pca says so
                moments = Moments(unscale(moments.mean, e), unscale(moments.var, 2 * e), moments.count)
    f = dataclasses.replace(f, scaling=scaling.report())
    if moments is not None:
        f = dataclasses.replace(f, moments=moments, mean=moments.mean if center else None,
                                scale=(std if e else moments.std) if scale else None)
    return f
