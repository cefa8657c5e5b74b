"""The ``R`` of a QR (``qr(a, mode="r")``) brought up to date after rows were appended to ``A``.

``A = Q R`` and the grown ``[A; P] = diag(Q, I) [R; P]``, so the new ``R`` is the ``R`` of the
``2n x n`` stack ``[R; R_P]``, with ``R_P`` the streaming TSQR of the appended rows alone
(:func:`blocklin.linalg.blocks.streaming_qr.tsqr_pass`; Demmel, Grigori, Hoemmen and Langou 2012):
one read of the new rows, one small Householder QR in memory, and the non-negative diagonal every
blocklin ``R`` has. Backward stable as the TSQR itself is (each step is a Householder QR of a stack;
Higham 2002, Thm. 19.4), so the update equals a recompute up to rounding, for any number of updates.
Complex data: the stack's QR in complex128, ``R``'s diagonal real and non-negative (LAPACK's
``zgeqrf`` followed by the unit phases of :func:`~blocklin.linalg.blocks.tsqr.positive_diagonal`).
``mode="reduced"`` (a stored ``Q``, which needs every row) and wide ``A`` are refused.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from blocklin.config import format_size
from blocklin.errors import BudgetError, ParameterError, explain
from blocklin.linalg.blocks.streaming_qr import tsqr_pass
from blocklin.linalg.blocks.tsqr import positive_diagonal
from blocklin.linalg.factor.qr import REPORT_KEYS, tsqr_bytes
from blocklin.operands import row_range
from blocklin.runtime.job import Job
from blocklin.storage.identity import resume_token
from blocklin.storage.location import Location
from blocklin.storage.versions import Growth
from blocklin.storage.zarr_store import create_array, open_zarr, write_block


def update_qr(job: Job, out: Location, prov: dict, growth: list[Growth], *, resume: bool) -> Any:
    """``R`` of ``[R; R_new]`` written over ``out`` (atomically)."""
    params = prov.get("params") or {}
    (g,) = growth
    A = row_range(job.operand(g.url, "a"), 0, g.rows)
    m, n = A.shape
    old = open_zarr(out)
    if params.get("mode") != "r" or old.shape != (n, n):
        raise ParameterError(explain("out", "must be the R of a tall A alone (qr(a, mode='r')): a stored Q, or "
                                     "the R of a wide A, needs every row", f"{out.url} (mode={params.get('mode')!r}, "
                                     f"R {old.shape[0]} x {old.shape[1]})", "recompute it: rerun blocklin factor qr "
                                     "with the same arguments and --overwrite"))
    wide_bytes = 16 if A.dtype.kind == "c" else 8
    need = tsqr_bytes(n, A.dtype.itemsize) + 3 * n * n * wide_bytes  # the pass, the stack [R; R_new] and its QR
    if need > job.cfg.memory:
        raise BudgetError(explain("memory", "must hold the streaming QR of the new rows and the 2n x n stack of "
                                  "the two R factors", format_size(job.cfg.memory), f"pass memory='"
                                  f"{format_size(need)}' or more"), minimum=need)
    wide = np.complex128 if A.dtype.kind == "c" else np.float64  # the stack's QR in float64 or complex128
    r_old = np.asarray(old, dtype=wide)
    result = tsqr_pass(job, row_range(A, g.old_rows, g.rows), None, A.dtype)
    r = positive_diagonal(np.linalg.qr(np.vstack([r_old, np.asarray(result.r, dtype=wide)]), mode="r"))
    token = resume_token("qr-update", [row_range(A, g.old_rows, g.rows)], g.stamp, out.url)
    ao = job.claim(out, [A], overwrite=True, resume=resume, token=token, reads_output=True, size=((n, n), A.dtype))
    arr = create_array(ao.array_path(), shape=(n, n), dtype=A.dtype, chunks=tuple(old.chunks), codec=job.cfg.codec)
    write_block(arr, slice(0, n), slice(0, n), r.astype(A.dtype))
    p = g.rows - g.old_rows
    diag = np.abs(np.diag(r))
    report = job.report(flops=2 * p * n * n + 4 * n ** 3, method="tsqr", diag_ratio=float(diag.min() / diag.max())
                        if diag.size and diag.max() > 0 else 0.0, norm_a=float(np.linalg.norm(r)),
                        method_reason="update: the R of [R; the new rows' streaming R]", plan=result.report["plan"])
    report["updated"] = {"input": g.url, "rows_before": g.old_rows, "rows": g.rows, "rows_read": p,
                         "how": "exact: the R of the old R stacked on the new rows' R (TSQR)"}
    history = list(prov.get("updates") or []) + [report["updated"]]
    return job.finish(ao, out, report, operation="qr", plan=prov.get("plan"), params=params,
                      keys=REPORT_KEYS + ("updated",), extra={"updates": history})


__all__ = ["update_qr"]
