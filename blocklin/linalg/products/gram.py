"""Gram matrices ``A^T A`` and ``A A^T`` by symmetric rank-k updates (SYRK), in one read of ``A``
(``A^H A`` and ``A A^H`` of complex data, by Hermitian ones: HERK).

:func:`gram` is the public operation; :class:`Gram` is the same product inside a job that another
operation already runs (:func:`blocklin.matmul` hands ``X^T X`` and ``X X^T`` on one stored operand
to it). Two routes, chosen by :func:`plan_gram`:

``"pass"``
    When the ``s x s`` result (``s`` the number of columns of ``A``, or of rows with ``trans``) fits
    the budget with one accumulator per concurrent task: one row pass over ``A`` (column strips for
    ``A A^T``), each task accumulating ``S^T S`` of its strips with BLAS SYRK (half the flops of a
    GEMM), the task sums reduced in row order in float64 (deterministic on every scheduler), the
    lower triangle mirrored and the full symmetric result written. ``A`` is read exactly once.
``"tiles"``
    When the result exceeds the budget: the region SYRK of :class:`~blocklin.runtime.blockops.BlockOps`
    accumulates square output blocks as large as the budget allows and writes each lower chunk and
    its mirror (one task per block, resumable block by block); ``A`` is then read about
    ``s / block`` times, which the plan states.

References
----------
J. J. Dongarra, J. Du Croz, S. Hammarling, I. S. Duff, "A set of level 3 basic linear algebra
subprograms", ACM TOMS 16(1), 1990 (SYRK).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Unpack

import numpy as np

from blocklin.config import Settings
from blocklin.errors import ParameterError
from blocklin.errors import explain as explain_msg
from blocklin.linalg.labels import is_dataarray, label_gram, labels_of
from blocklin.linalg.products.gram_kernels import gram_pass_kernel, sum_gram_states
from blocklin.linalg.blocks.scaling import Scaling
from blocklin.matrix import Matrix
from blocklin.operands import decoded_chunks
from blocklin.plan.chunks import split
from blocklin.plan.gram import GramPlan, gram_tasks, plan_gram
from blocklin.plan.passes import RowPassPlan
from blocklin.runtime.blockops import BlockOps, Region
from blocklin.runtime.job import Job
from blocklin.storage.identity import plan_settings, resume_token
from blocklin.runtime.passes import run_pass, source
from blocklin.storage.atomic import open_or_create_array
from blocklin.storage.recorded_peaks import PeakTally, recordable, record as record_peaks
from blocklin.storage.zarr_store import open_zarr, write_block
from blocklin.runtime.powers import ldexp
from blocklin.validate import COMPLEX_DTYPES, FLOAT_DTYPES, result_dtype

#: Report entries recorded in the output's attributes.
REPORT_KEYS = ("seconds", "flops", "gflops", "bytes_read", "bytes_written", "peak_memory", "device", "scheduler",
               "tasks", "route", "passes")


@dataclasses.dataclass(frozen=True)
class Gram:
    """``alpha * A^T A`` (or ``alpha * A A^T`` with ``trans``) of a resolved operand, inside a job."""

    A: Any
    trans: bool
    dtype: np.dtype
    alpha: float = 1.0
    #: The caller's name of ``alpha``, which a range refusal's fix names: ``gram``'s ``scale``, or ``"alpha"``
    #: for the ``X^T X`` that :func:`blocklin.matmul` hands over (which has no ``scale``).
    scale_name: str = "scale"

    @classmethod
    def of(cls, A: Any, *, trans: bool = False, dtype: Any = None, alpha: float = 1.0,
           scale_name: str = "scale") -> Gram:
        return cls(A=A, trans=bool(trans), dtype=result_dtype([A], dtype, FLOAT_DTYPES + COMPLEX_DTYPES,
                                                               operation="gram"), alpha=float(alpha),
                   scale_name=scale_name)

    @property
    def shape(self) -> tuple[int, int]:
        s = self.A.shape[0] if self.trans else self.A.shape[1]
        return (s, s)

    def source(self) -> Any:
        return source(self.A, transposed=self.trans, name="a")

    def plan(self, job: Job) -> GramPlan:
        """The pass route when its accumulators fit the budget, else the tiled route (:func:`plan_gram`)."""
        gpu = job.device == "gpu"
        # the split and the tasks at once by the shape and budget, as a row pass plans them on every scheduler
        # (plan.passes.pass_workers: a cluster's threads per worker do not change the bits); workers= sets the
        # tasks at once
        tasks = gram_tasks(self.shape[0], self.dtype, job.cfg.memory, gpu=gpu)
        return plan_gram(self.A.shape, self.dtype, chunks=self.A.chunks, memory=job.cfg.memory, trans=self.trans,
                         decoded=decoded_chunks(self.A),
                         source_dtype=self.A.dtype, workers=job.cfg.workers or tasks, cores=job.cores(), gpu=gpu,
                         tasks=tasks)

    def token(self, plan: GramPlan, settings: tuple = ()) -> str:
        """Deterministic in the input, parameters, plan and the job's ``settings``
        (:func:`~blocklin.storage.identity.plan_settings`; what resuming an output checks). The plan names
        no device, and the tiled route runs each SYRK tile on the job's: tiles kept from a CPU run are not
        what a resume on the GPU would write (cuBLAS rounds otherwise)."""
        return resume_token("gram", [self.A], self.trans, self.alpha, self.dtype.name, plan.to_dict(),
                            *((settings,) if settings else ()))

    def run(self, job: Job, plan: GramPlan, out_path: Any, *, done_dir: Any = None, add: Any = None,
            peaks: PeakTally | None = None) -> dict | None:
        """Write the full symmetric result into the array at ``out_path`` (created with ``plan.out_chunks``);
        returns the pass route's ``report["scaling"]`` (:mod:`blocklin.linalg.blocks.scaling`).

        ``add``: a stored ``s x s`` matrix added to the result (the Gram of the rows before an
        append, :mod:`blocklin.linalg.update`); the pass route adds it to the float64 task sums
        before rounding to the result's dtype. ``peaks``: a tally of the output, into which the pass
        route adds the peaks of each band it writes (the tiled route's stay untallied: the tally is then
        marked incomplete, and nothing is recorded)."""
        if plan.route == "tiles":
            if peaks is not None:
                peaks.skipped()
            ops = BlockOps(job, plan.tile)
            ops.workers = plan.workers
            a = Region.of(self.A.path, self.A.shape, off=(getattr(self.A, "first_row", 0), 0))
            ops.syrk(Region.of(out_path, (plan.s, plan.s)), a if self.trans else a.H, dtype=self.dtype,
                     alpha=self.alpha, full=True, check=job.check_finite, done_dir=done_dir,
                     c=None if add is None else Region.of(add, (plan.s, plan.s)), beta=0.0 if add is None else 1.0,
                     description=f"Gram tiles {plan.product}", decoded=decoded_chunks(self.A))
            # alpha = 0 (matmul's): a zero result is right whatever A holds
            self._check_tiles(plan, out_path, lambda: self.alpha == 0 or
                              ops.norm(a, description="norm of a (a zero Gram)") == 0)
            return None
        return self._run_pass(job, plan, out_path, add, peaks)

    def _check_tiles(self, plan: GramPlan, out_path: Any, a_is_zero: Any) -> None:
        """The tiled route sums unscaled squares: refused where they left the range (:func:`check_diagonal`);
        an all-zero diagonal only where ``a_is_zero()`` says ``A`` is not zero (its squares underflowed
        whole: float32 data near 1e-30 had returned a zero matrix)."""
        # a factor other than 1 scales the result: it may be what left the range (entries near 1 times 1e48)
        factor = (f", or pass {self.scale_name}= nearer 1 (the result is {self.scale_name}={self.alpha:.3g} "
                  "times the Gram)") if self.alpha not in (1.0, 0.0) else ""
        check_diagonal(out_path, plan.s, plan.out_chunks[0], self.dtype, "the tiled route, for a result over the "
                       "budget, sums unscaled squares", "or raise memory= so the pass route (which scales by "
                       f"itself) holds the result{factor}", zero_ok=a_is_zero)

    def _unscaled(self, g: np.ndarray, scaling: Scaling, *, check: bool = True) -> np.ndarray:
        """``alpha 2^(2e) G'`` from the Gram ``G'`` of ``2^-e A`` (exact for a power-of-two ``alpha``);
        a result beyond the output dtype's range raises, naming the ``scale`` that makes it fit (with
        ``check=False`` the caller checks the sum it adds this to)."""
        m, p = np.frexp(self.alpha)
        e2 = 2 * scaling.exponent + int(p)
        big = float(np.max(np.abs(g))) if g.size else 0.0
        # alpha = 0 (matmul's): zeros, whatever range the unscaled Gram 2^(2e) G' has (data near 1e-156 or 1e200
        # had been refused as a Gram out of range)
        if check and big > 0 and self.alpha != 0:
            self._check_range(int(np.frexp(big * abs(float(m)))[1]) + e2, scaling.amax)
        with np.errstate(under="ignore", over="ignore"):
            return ldexp(g * float(m), e2) if e2 or m != 1 else g

    def _check_range(self, top: int, amax: float) -> None:
        """Refuse a result whose largest entry is below ``2^top`` and not below ``2^(top - 1)`` where it
        leaves the output dtype's range."""
        _, p = np.frexp(self.alpha)
        fi = np.finfo(self.dtype)
        # The pass route forms the sums in a scaled form and shifts them by a power of two: the result
        # holds what its dtype holds. Its norm-wise error (Higham 2002, eq. 3.13: gamma_k |A^T||A|) grows
        # by at most half the smallest subnormal an entry (an entry below the smallest normal rounded), under
        # u times a largest entry that is normal: only a subnormal (or overflowing) largest entry is refused.
        # (The 2^(minexp + nmant) margin had refused data near 2^-490, Gram near 2^-980, that float64 holds.)
        if top > fi.maxexp or top <= fi.minexp:
            # the largest entry overflows, or is subnormal (a few significant bits): the power of two that
            # puts it near 2^(maxexp / 2) instead
            k = fi.maxexp // 2 - top + int(p)
            if fi.minexp < k < fi.maxexp - 1:
                h = "H" if self.dtype.kind == "c" else "T"
                call = "gram(a, scale=" if self.scale_name == "scale" else f"matmul(..., {self.scale_name}="
                fix = (f"compute it in a scaled form: {call}2.0**{k}) returns {self.scale_name} * "
                       f"{f'A A^{h}' if self.trans else f'A^{h} A'} (exact)")
            else:  # the factor itself is out of range: scale the data (by a power of two: exact), by ldexp:
                # a * 2.0**j overflows where 2^j is beyond float64's range, or float32's for float32 data
                fix = (f"compute it in a scaled form: the Gram of numpy.ldexp(a, {k // 2}) (exact) is "
                       f"2^{2 * (k // 2)} times this one")
            raise ParameterError(explain_msg(
                "a", f"must have a Gram matrix within the range of {self.dtype.name} (largest entry between "
                f"2^{fi.minexp}, the smallest normal number, and 2^{fi.maxexp})",
                f"a Gram whose largest entry is about 2^{top - 1} (max |a| = {amax:.3g})", fix))

    def _run_pass(self, job: Job, plan: GramPlan, out_path: Any, add: Any = None,
                  peaks: PeakTally | None = None) -> dict | None:
        if plan.pass_plan is None:  # an empty A (no rows or no columns): the Gram is zero, nothing to read
            return self._write_zero(job, plan, out_path, add, peaks)
        rp = RowPassPlan.from_dict(plan.pass_plan)
        src = self.source()
        scaling = Scaling.of(src, self.dtype)  # the squares are formed in the result's dtype
        g = scaling.run(job, lambda sc: sum_gram_states(run_pass(
            job, gram_pass_kernel, [src], {"dtype": self.dtype.name, "gpu": job.device == "gpu"}, plan=rp,
            scale=sc, description=f"Gram {plan.product} (SYRK)").states))
        if self.trans and g.dtype.kind == "c":  # the strips are S = A[:, cols]^T: S^H S is conj(A A^H)
            np.conjugate(g, out=g)
            g.imag[np.diag_indices_from(g)] = 0  # +0, not conj's -0
        # an update adds the new rows' Gram to the stored one: the sum's range is what counts (the new rows'
        # alone may underflow beside it: rows near 1e-200 had refused the update of a Gram of entries near 1)
        top_new = int(np.frexp(float(np.max(np.abs(g))) if g.size else 0.0)[1])
        g = self._unscaled(g, scaling, check=add is None)
        arr = open_zarr(out_path, mode="r+")
        old = None if add is None else open_zarr(add)
        big = 0.0
        for r0, r1 in split(plan.s, plan.out_chunks[0]):
            band = g[r0:r1] if old is None else g[r0:r1] + np.asarray(old[r0:r1], dtype=g.dtype)
            with np.errstate(over="ignore"):
                stored = band.astype(self.dtype)
            big = max(big, float(np.max(np.abs(stored))) if stored.size else 0.0)
            write_block(arr, slice(r0, r1), slice(0, plan.s), stored)
            if peaks is not None:  # of the bits stored
                peaks.add(stored, r0, 0)
        if old is not None and big > 0:  # inf: the new rows' own top, which overflowed
            m, p = np.frexp(self.alpha)
            self._check_range(int(np.frexp(big)[1]) if np.isfinite(big) else
                              max(top_new + 2 * scaling.exponent + int(p), np.finfo(self.dtype).maxexp + 1),
                              scaling.amax)
        job.stats["bytes_written"] += plan.bytes_written
        job.stats["flops"] += plan.flops
        return scaling.report()


    def _write_zero(self, job: Job, plan: GramPlan, out_path: Any, add: Any, peaks: PeakTally | None) -> None:
        """The ``s x s`` Gram of an ``A`` with nothing to sum (``k = 0``), plus ``add``: written band by
        band (a 0 x 0 result, ``s = 0``, has no band)."""
        arr = open_zarr(out_path, mode="r+")
        old = None if add is None else open_zarr(add)
        for r0, r1 in split(plan.s, plan.out_chunks[0]):
            band = np.zeros((r1 - r0, plan.s), self.dtype) if old is None else np.asarray(old[r0:r1], dtype=self.dtype)
            write_block(arr, slice(r0, r1), slice(0, plan.s), band)
            if peaks is not None:
                peaks.add(band, r0, 0)
        job.stats["bytes_written"] += plan.bytes_written
        return None


def check_diagonal(path: Any, s: int, chunk: int, dtype: Any, why: str, fix: str, *, zero_ok: Any = True,
                   operands: str = "a") -> None:
    """Refuse a stored Gram matrix whose diagonal (each column's sum of squares, its largest entries)
    overflowed, or fell where float64 keeps only a few bits: computed from unscaled squares, it would
    be Inf or lost digits (``zero_ok=False``: an all-zero diagonal too, squares that underflowed whole;
    a callable is asked only for an all-zero diagonal, whether it is right). Reads the ``s / chunk``
    diagonal blocks of this run's own output; returns the diagonal."""
    diag = stored_diagonal(path, s, chunk)
    fi = np.finfo(np.dtype(dtype))
    top = float(np.max(np.abs(diag))) if diag.size else 0.0
    if not np.isfinite(top) or 0 < top < 2.0 ** (fi.minexp + fi.nmant) or \
            (top == 0 and not (zero_ok() if callable(zero_ok) else zero_ok)):
        raise ParameterError(explain_msg(
            "a", f"must have a Gram matrix within the range of {np.dtype(dtype).name} ({why})",
            f"a diagonal entry of {top:.3g}" if top else "an all-zero diagonal (squares that underflowed to 0)",
            f"scale {operands} by a power of two so that the entries sit near 1 "
            f"(exact) and scale the result back, {fix}"))
    return diag


def stored_diagonal(path: Any, s: int, chunk: int) -> np.ndarray:
    """The real part of the diagonal of a stored ``s x s`` matrix (a Gram matrix, its Cholesky factor:
    real where they are Hermitian) in float64, from its ``s / chunk`` diagonal blocks."""
    arr = open_zarr(path, mode="r+")
    return np.concatenate([np.diag(np.asarray(arr[r0:r1, r0:r1]).real.astype(np.float64))
                           for r0, r1 in split(s, chunk)])


def gram(a: Any, out: Any = None, *, trans: bool = False, dtype: Any = None, overwrite: bool = False,
         resume: bool = False, explain: bool = False, scale: float = 1.0,
         **settings: Unpack[Settings]) -> Matrix | GramPlan:
    """The Gram matrix ``A^T A`` (or ``A A^T`` with ``trans=True``) by SYRK, in one read of ``A``.

    Half the flops of ``matmul(a, a, trans_a=True)`` and half its reads: each strip ``S`` of ``A``
    is read once and its ``S^T S`` accumulated (BLAS SYRK, lower triangle); the result is written
    full and exactly symmetric.

    Parameters
    ----------
    a : path, zarr array, Matrix, NumPy or Dask array
        ``m x n`` matrix (a 1-D array is a column).
    out : path, optional
        Output zarr store; a new store under the temp dir when omitted. Written under a temporary
        name and renamed when complete.
    trans : bool
        ``False``: ``A^T A`` (``n x n``, the Gram matrix of the columns); ``True``: ``A A^T``
        (``m x m``, of the rows, streamed as column strips of ``A``).
    dtype : {None, "float32", "float64", "complex64", "complex128"}
        Compute and output dtype (default: ``A``'s). Task sums are added in float64 (complex128).
        A real dtype for complex ``A`` is refused (the cast would drop the imaginary parts).
    overwrite, resume : bool
        Replace an existing ``out``; continue an interrupted run (same input and plan: identical bits).
    explain : bool
        Return the :class:`GramPlan` without running.
    scale : float
        Return ``scale * A^T A`` (exact for a power of two): for a Gram whose entries overflow the
        dtype (``A`` with entries near ``1e160`` in float64), which is refused otherwise. The
        pass route scales ``A`` by a power of two as it reads it whenever its entries would overflow
        or underflow when squared (:mod:`blocklin.linalg.blocks.scaling`; ``report["scaling"]``).
    **settings
        As for every operation: :class:`~blocklin.config.Settings`.

    Returns
    -------
    Matrix
        The result, with ``.report`` (route, passes, seconds, flops, bytes read/written, peak memory).

    Notes
    -----
    Complex ``A``: ``A^H A`` (``A A^H`` with ``trans``), NumPy's ``a.conj().T @ a``, by HERK
    (``zherk``/``cherk``): written full, exactly Hermitian, its diagonal real (HERK's convention).

    When the ``s x s`` result and one accumulator per concurrent task fit the budget, ``A`` is read
    once; otherwise the result is built in stored blocks by the region SYRK, reading ``A`` about
    ``s / block`` times (``explain=True`` shows which). Flops: ``s^2 k`` (SYRK), against ``2 s^2 k``
    for the general product.

    Examples
    --------
    >>> import numpy as np
    >>> import blocklin as bl
    >>> x = np.arange(12.0).reshape(4, 3)
    >>> g = bl.gram(x, "G.zarr", memory="64MiB")
    >>> bool(np.array_equal(g.to_numpy(), x.T @ x)), g.report["route"], g.report["passes"]
    (True, 'pass', 1)
    """
    if not isinstance(trans, (bool, np.bool_)):
        raise ParameterError(explain_msg("trans", "must be True (A A^T) or False (A^T A)", repr(trans),
                                         "pass trans=True or trans=False"))
    from blocklin.validate import positive

    scale = positive("scale", scale, fix="pass scale=1.0")
    from blocklin.linalg.products.sparse_gemm import refuse_options, sparse_gram, sparse_operand, sparse_product_plan

    sparse = sparse_operand(a, "a", settings.get("storage_options"))
    if sparse is not None:  # a stored sparse S: S^T S in one pass over its rows
        refuse_options(operation="gram(S, out, dtype=...) only (S^T S)", trans=bool(trans), scale=scale != 1.0)
        if explain:  # the plan alone, counted in nonzeros
            return sparse_product_plan(sparse, gram=True, dtype=dtype, settings=settings)
        return sparse_gram(sparse, out, dtype=dtype, overwrite=overwrite, resume=resume, settings=settings)
    if is_dataarray(a) and not explain:  # labelled: over A's columns (rows for trans) twice
        g = gram(a.data, out, trans=trans, dtype=dtype, overwrite=overwrite, resume=resume, scale=scale, **settings)
        return label_gram(g, labels_of(a), trans)
    with Job("gram", **settings) as job:
        op = Gram.of(job.operand(a, "a"), trans=trans, dtype=dtype, alpha=scale)
        plan = op.plan(job)
        if explain:
            return plan
        return write_gram(job, op, plan, out, overwrite=overwrite, resume=resume)


def write_gram(job: Job, op: Gram, plan: GramPlan, out: Any, *, overwrite: bool, resume: bool,
               operation: str = "gram", operands: list | None = None, params: dict | None = None) -> Matrix:
    """Run ``op`` into the atomic output ``out`` and commit it with its report (``operands`` and
    ``params`` as the calling operation records them: matmul's own for ``X^T X``)."""
    ao = job.claim(out, [op.A] if operands is None else operands, overwrite=overwrite, resume=resume,
                   token=op.token(plan, plan_settings(job)), size=(op.shape, op.dtype))
    open_or_create_array(ao, shape=op.shape, dtype=op.dtype, chunks=plan.out_chunks, codec=job.cfg.codec)
    # the pass route's peaks of the bands as written, recorded with the output: an eigsh or SVD of it need not scan
    tally = PeakTally(op.shape) if recordable(op.dtype) and min(op.shape) > 0 else None
    scaling = op.run(job, plan, ao.array_path(), done_dir=ao.done, peaks=tally)
    nbytes = int(np.prod(op.A.shape)) * op.A.dtype.itemsize
    report = job.report(flops=plan.flops, plan=plan.to_dict(), output=str(ao.path), route=plan.route,
                        product=plan.product)
    report["scaling"] = scaling
    # how often A was read: exactly one pass on the pass route; measured from the bytes on the tiled one
    report["passes"] = job.passes("a") if plan.route == "pass" else round(report["bytes_read"] / max(1, nbytes), 2)
    params = {"trans": op.trans, "alpha": op.alpha, "dtype": op.dtype.name} if params is None else params
    result = job.finish(ao, out, report, operation=operation, plan=plan.to_dict(), params=params, keys=REPORT_KEYS)
    if tally is not None:  # after the commit: the record's stamp is the committed output's
        report["output_peaks_recorded"] = record_peaks(ao.path, tally)
    return result


__all__ = ["Gram", "GramPlan", "gram", "write_gram"]
