"""Out-of-core Cholesky factorization: tiled, left-looking, one Dask task per tile."""

from __future__ import annotations

from typing import Any, Unpack


from blocklin.config import Settings
from blocklin.matrix import Matrix
from blocklin.operands import decoded_chunks
from blocklin.plan.factor import FactorPlan, plan_factor
from blocklin.linalg.blocks.scaling import safe_norm
from blocklin.linalg.factor.cholesky_tiles import tiled_cholesky
from blocklin.runtime.blockops import BlockOps, Region
from blocklin.runtime.job import Job
from blocklin.storage.identity import plan_settings, resume_token
from blocklin.storage.zarr_store import create_array, open_zarr
from blocklin.validate import float_operand, square

#: Report entries recorded in the output's attributes.
REPORT_KEYS = ("seconds", "flops", "gflops", "bytes_read", "bytes_logical", "bytes_written", "peak_memory", "tasks", "skipped")


def cholesky(a: Any, out: Any = None, *, lower: bool = True, overwrite: bool = False, resume: bool = False,
             explain: bool = False, tile: int | None = None, **settings: Unpack[Settings]) -> Matrix | FactorPlan:
    """Cholesky factor of a symmetric (Hermitian) positive definite matrix larger than memory.

    ``A = L L^H`` (``lower=True``, ``L`` written) or ``A = U^H U`` (``lower=False``, ``U = L^H``
    written); ``^H`` is the conjugate transpose, ``^T`` of real data (LAPACK's ``potrf`` and
    ``scipy.linalg.cholesky``). Like LAPACK's ``potrf``, only the triangle named by ``lower`` is
    read (the other one is taken to be its conjugate transpose, never checked); the other triangle
    of the output is zero.

    The matrix is cut into square tiles of side ``t`` (the output's chunk side). Tile ``(i, j)``,
    ``i >= j``, of ``L`` is one task of a Dask graph (left-looking, "Crout" order):

    .. math::

        S = A_{ij} - \\sum_{k<j} L_{ik} L_{jk}^H,\\qquad
        L_{jj} = \\operatorname{chol}(S)\\ (i = j),\\qquad L_{ij} = S L_{jj}^{-H}\\ (i > j).

    Each task reads its input tile and ``2 j`` finished factor tiles, and writes its tile once.

    Parameters
    ----------
    a : path, zarr array, Matrix, NumPy or Dask array
        Square, symmetric positive definite, float32 or float64, or Hermitian positive definite,
        complex64 or complex128. Never modified.
    out : path, optional
        Output store (atomic: written under a temporary name and renamed when complete); a new
        store under the temp dir when omitted.
    lower : bool
        Return ``L`` (reading the lower triangle of ``A``) or ``U = L^H`` (reading the upper one).
    overwrite : bool
        Replace an existing ``out``.
    resume : bool
        Continue an interrupted run with the same input, parameters and plan: finished tiles are
        kept and skipped.
    explain : bool
        Return the :class:`~blocklin.plan.factor.FactorPlan` without running.
    tile : int, optional
        Tile side (default: the input's square chunk side when it fits the budget, else the largest
        power of two that does).
    **settings
        As for every operation: :class:`~blocklin.config.Settings`.

    Returns
    -------
    Matrix
        The factor, with ``.report``: ``seconds``, ``flops``, ``gflops``, ``bytes_read``,
        ``bytes_written``, ``peak_memory``, ``tasks``, ``skipped`` (tiles kept from an interrupted
        run), ``norm_a`` (``||A||_F``), ``plan``.

    Raises
    ------
    NotPositiveDefiniteError
        A pivot ``<= 0``: the message names its row/column and suggests a ridge (``lam=``) or
        ``assume_a="gen"``. Of complex data also a diagonal entry of ``A`` that is not real (beyond
        rounding: ``|Im a_jj| > sqrt(eps) |a_jj|``; a Hermitian matrix has a real diagonal, and a
        smaller imaginary part is dropped, as ``zpotrf`` reads only the real part of each pivot).
    ShapeError, DTypeError, NonFiniteError
        ``a`` not square, not of the four dtypes, or holding NaN/Inf.

    Notes
    -----
    The tile algorithm follows Buttari, Langou, Kurzak and Dongarra (2009), "A class of parallel
    tiled linear algebra algorithms for multicore architectures", in its left-looking form: every
    task writes only its own tile, once, so a task can be rerun (after a lost worker, or with
    ``resume=True``) without corrupting the factor, and the summation order over ``k`` is fixed, so
    the bits do not depend on the scheduler or the number of workers. Cost: ``n^3/3`` flops;
    ``n^3 / (3 t)`` elements read (``t`` the tile side); memory: ``6`` tiles per concurrent task.
    Backward stability is that of the blocked Cholesky (Higham, *Accuracy and Stability of
    Numerical Algorithms*, 2002, Thm. 10.3): ``L L^H = A + E`` with ``|E| <= c n u |L| |L^H|``
    (complex arithmetic: a larger constant, Higham §3.6). Complex data costs four times the real
    flops (``flops`` counts ``n^3 / 3`` operations of the dtype, as for real data).
    """
    with Job("cholesky", **settings) as job:
        A = job.operand(a, "a", integers="cast")
        n = square(A, "for a Cholesky factorization", "factor a square symmetric matrix (for least squares use "
                   "blocklin.solve(a, b))")
        dt = float_operand(A, "cholesky", complex_ok=True)
        plan = plan_factor("cholesky", n, dt, memory=job.cfg.memory, workers=job.workers(1),
                           chunks=tuple(A.chunks), tile=tile, widen=True, decoded=decoded_chunks(A))
        if explain:
            return plan
        # the job's settings: the plan names no device, and the tiles are updated on the job's
        token = resume_token("cholesky", [A], lower, plan.to_dict(), plan_settings(job))
        ao = job.claim(out, [A], overwrite=overwrite, resume=resume, token=token, size=((n, n), dt))
        path = ao.array_path()
        if ao.resumed and ao.has_array():
            open_zarr(path, mode="r+")
        else:
            create_array(path, shape=(n, n), dtype=dt, chunks=(plan.tile, plan.tile), codec=job.cfg.codec)
        results = factor_into(job, A, path, plan, lower=lower, done_dir=ao.done)
        report = _report(job, plan, results, output=ao.path, a=A)
        params = {"lower": lower}
        return job.finish(ao, out, report, operation="cholesky", plan=plan.to_dict(), params=params,
                          keys=REPORT_KEYS)


def factor_into(job: Job, A: Any, path: Any, plan: FactorPlan, *, lower: bool = True,
                done_dir: Any = None) -> list[dict]:
    """Run the tiled Cholesky of operand ``A`` into the store at ``path`` (``L``, or ``L^T``)."""
    ops = BlockOps(job, plan.tile)
    ops.workers = plan.workers
    src = Region.of(A.path, A.shape)
    dst = Region.of(path, A.shape)
    # an upper factor: read A's upper triangle as the lower one of A^H, write L^H (A^T, L^T of real data)
    return tiled_cholesky(ops, src if lower else src.H, dst if lower else dst.H, dtype=plan.dtype,
                          check=job.check_finite, done_dir=done_dir, description="Cholesky tiles")


def _report(job: Job, plan: FactorPlan, results: list[dict], *, output: Any, a: Any) -> dict:
    sumsq = sum(r.get("sumsq", 0.0) for r in results if isinstance(r, dict))
    # a sum of squares out of float64's range (entries near 1e200 or 1e-200: inf or 0 had been reported)
    # is replaced by A's norm read again by tiles scaled by powers of two
    norm_a = None if job.stats["skipped"] else safe_norm(BlockOps(job, plan.tile), Region.of(a.path, a.shape), sumsq)
    return job.report(flops=plan.flops, plan=plan.to_dict(), output=str(output), method="tiled left-looking Cholesky",
                      phases={"tile updates (GEMM), POTRF, TRSM": job.device}, norm_a=norm_a)


__all__ = ["cholesky"]
