"""One-pass streaming QR of a tall matrix: the R factor and ``Q^T B`` (TSQR without storing Q)."""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Unpack

import numpy as np

from blocklin.config import Settings
from blocklin.errors import ShapeError, explain
from blocklin.linalg.blocks.scaling import column_norms, fro_norm, sumsq_in_range
from blocklin.linalg.blocks.tsqr import reduce_r, tsqr_kernel
from blocklin.plan.solve import small_bytes
from blocklin.runtime.job import Job
from blocklin.runtime.passes import run_pass, source


@dataclasses.dataclass
class StreamingR:
    """Result of :func:`streaming_r`.

    Attributes
    ----------
    r : ndarray, ``n x n``
        Upper-triangular factor with ``A = Q R`` (``R^T R = A^T A``; signs as LAPACK leaves them).
    qtb : ndarray, ``n x k`` or None
        ``Q^T B``.
    rho : ndarray, ``k`` or None
        ``min_x ||A x - b_j||_2`` for each right-hand side (the norm of the part of ``b_j`` outside the
        range of ``A``; exact when ``A`` has full column rank).
    norm_a : float
        ``||A||_F``.
    norm_b : ndarray, ``k`` or None
        ``||b_j||_2``.
    m : int
        Rows of ``A``.
    report : dict
        Seconds, bytes read, passes (1), plan.
    ones_row : ndarray, ``1 + n + k`` or None
        With ``ones=True`` (``[1 | A | B]`` factored): the first row ``[r11, r12, c1]`` of its factor, with
        ``r11 = +-sqrt(m)``, ``r12 / r11`` the column means of ``A`` and ``c1 / r11`` those of ``B``; ``r``,
        ``qtb`` and ``rho`` are then those of the centered ``A`` and ``B``.
    first_qh : ndarray, ``n`` or None
        With ``shift_first`` (``(A - 1 a_1^T)^T = Q R`` of a wide ``A`` factored): ``Q^H a_1``.
    """

    r: np.ndarray
    qtb: np.ndarray | None
    rho: np.ndarray | None
    norm_a: float
    norm_b: np.ndarray | None
    m: int
    report: dict
    ones_row: np.ndarray | None = None
    first_qh: np.ndarray | None = None


def tsqr_pass(job: Job, A: Any, B: Any | None, dtype: Any, device: str | None = None,
              scale: dict | None = None, ones: bool = False, transposed: bool = False,
              shift: tuple | None = None, shift_first: bool = False) -> StreamingR:
    """The streaming QR pass inside an existing :class:`~blocklin.runtime.job.Job` (operands resolved).

    ``device``: where it runs (default: for ``auto``, the GPU only where it wins, :func:`pass_device`);
    ``scale``: the powers of two the strips are divided by (:mod:`blocklin.linalg.blocks.scaling`);
    ``ones``: factor ``[1 | A | B]`` (an intercept; :attr:`StreamingR.ones_row`); ``transposed``: factor
    ``A^T`` (column strips of a wide ``A``, read as the row strips of its tall orientation; no ``B``);
    ``shift``: with ``ones``, the rows ``(a_1, b_1)`` (scaled as the strips are) subtracted from every row
    (the factor is that of ``[1 | A - 1 a_1^T | B - 1 b_1^T]``; its ``ones_row`` holds the shifted means);
    ``shift_first``: with ``transposed``, factor ``(A - 1 a_1^T)^T`` (the columns less their first entries;
    :attr:`StreamingR.first_qh`).
    """
    from blocklin.device import pass_device

    m, n = A.shape[::-1] if transposed else A.shape
    k = B.shape[1] if B is not None else 0
    sources = [source(A, transposed=transposed)] + ([source(B)] if B is not None else [])
    # Householder QR of each stacked [R; strip]: about 2 rows (n+k)^2 flops per row of A and B read
    dev = device or pass_device(job.cfg.device, 2.0 * m * (n + k) ** 2,
                                m * (n * A.dtype.itemsize + k * (B.dtype.itemsize if B is not None else 0)),
                                job.device)
    params = {"dtype": np.dtype(dtype).name} | ({"ones": True} if ones else {}) \
        | ({"shift": shift} if ones and shift is not None else {}) \
        | ({"shift_first": True} if shift_first and transposed and not ones and B is None else {})
    first = "shift_first" in params  # the first entries factored beside the shifted columns
    states, plan = run_pass(job, tsqr_kernel, sources, params, reserve=small_bytes(n + int(ones) + first, k),
                            description="streaming QR of [1 | A B]" if ones else "streaming QR", device=dev,
                            scale=scale)
    states = [s for s in states if s is not None]
    full = reduce_r(states, n + k + int(ones) + first)
    ones_row = np.array(full[0]) if ones else None
    r = full[int(ones):, int(ones):]  # the centered [A B]'s factor (R22, Q2^T b_c, T)
    aa = sum(s["aa"] for s in states)
    bb = sum(s["bb"] for s in states) if k else None
    rn = np.array(r[:n, :n])
    qtb = np.array(r[:n, n:]) if k else None
    rho = column_norms(r[n:, n:]) if k else None
    # [1 | A | B] = Q R: the columns of A and B have the norms of theirs in R, taken where the pass's sums of
    # squares left float64's range (unscaled strips near 1e200 or 1e-200: inf or 0 had been reported)
    cols = full[:, int(ones):]
    norm_a = math.sqrt(aa) if aa and sumsq_in_range(aa) else fro_norm(cols[:, :n])
    norm_b = None
    if k:
        norm_b = np.sqrt(bb)
        out = np.array([not (v and sumsq_in_range(float(v))) for v in bb])
        norm_b[out] = column_norms(cols[:, n:])[out]
    return StreamingR(r=rn, qtb=qtb, rho=rho, norm_a=norm_a, norm_b=norm_b, m=m,
                      report={"plan": plan.to_dict(), "passes": 1}, ones_row=ones_row,
                      first_qh=np.array(full[:n, n]) if first else None)


def streaming_r(a: Any, b: Any = None, *, dtype: Any = None, **settings: Unpack[Settings]) -> StreamingR:
    """R factor of a tall matrix ``A`` (``m x n``, ``m >= n``) and ``Q^T B``, in one pass over ``A``.

    Row strips of ``[A B]`` stream through Householder QR, each folding into the running
    triangular factor: ``R <- qr_r([R; A_strip])`` (a flat TSQR tree per task, and a final
    reduction of the tasks' factors in row order, so the result does not depend on the scheduler).
    ``Q`` is never formed. This is the communication-avoiding TSQR of Demmel, Grigori, Hoemmen and
    Langou (2012), used as a one-pass out-of-core least-squares and SVD engine: the SVD of ``R`` gives
    the singular values and right singular vectors of ``A``.

    Parameters
    ----------
    a : path, zarr array, Matrix, NumPy or Dask array
        Tall matrix, ``m >= n``; ``n`` columns must fit in memory (``(n + k)^2`` floats, a few times).
    b : operand, optional
        Right-hand sides (``m x k``); returned as ``Q^T B`` and the residual norms of ``min ||A x - b_j||``.
    dtype : dtype, optional
        Compute dtype (default: A's).
    **settings
        As for every operation: :class:`~blocklin.config.Settings`. The pass runs on the CPU.

    Returns
    -------
    StreamingR
        ``r``, ``qtb``, ``rho``, ``norm_a``, ``norm_b``, ``m``, ``report``.

    Notes
    -----
    Cost: one pass over ``A`` (and ``B``), about ``2 m n^2`` flops (twice the Gram matrix's ``m n^2``,
    which loses accuracy for ill-conditioned ``A`` since ``cond(A^T A) = cond(A)^2``).
    """
    with Job("qr", **settings) as job:
        A = job.operand(a, "a")
        B = job.operand(b, "b") if b is not None else None
        m, n = A.shape
        if m < n:
            raise ShapeError(explain("a", "must be tall (rows >= columns) for a streaming R factor",
                                     f"{m} x {n}", "pass the transpose, or use blocklin.solve for wide problems"))
        if B is not None and B.shape[0] != m:
            raise ShapeError(explain("b", "must have as many rows as a (no broadcasting)",
                                     f"a {m} x {n}, b {B.shape[0]} x {B.shape[1]}", "pass b with one row per row of a"))
        result = tsqr_pass(job, A, B, dtype or A.dtype)
        result.report.update(job.report())
        return result


__all__ = ["StreamingR", "streaming_r", "tsqr_pass"]
