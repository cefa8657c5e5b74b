"""The Gram ``S^T S`` and the product ``S^T B`` of a stored sparse matrix brought up to date after rows were
appended to it (and to ``B``): ``G + S_new^T S_new`` and ``C + S_new^T B_new``, from the appended rows alone.

The sparse routes' own tasks (:mod:`blocklin.linalg.products.sparse_gemm`) run over the appended rows
(read as CSR strips from their first row on; ``B``'s from the same row) with the stored result added to
their float64 sums (of pieces multiplied in float64 for the Gram, in the data's precision for ``S^T B``, as
the fresh run does), which are then rounded once to the result's dtype, as the dense updates' pass route
does (:mod:`.gram`, :mod:`.products`). So a float64 update equals a recompute up to the order of the
float64 sums, within the bound ``gamma_m |S|^T |B|`` (the Gram's ``gamma_m |S|^T |S|``), not bit for bit;
a float32 result adds one float32 rounding of the stored result per update. The range checks are the
sparse routes': a sum past the dtype's range, a Gram below its normal range, and a product ``S^T B`` whose
every entry lies below the normal numbers (``c max |s_new| max |b_new| + max |C| < 2^minexp``, ``c`` the
most stored entries of a column of the appended rows) are refused with the stored result unchanged.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from blocklin.errors import ParameterError, explain
from blocklin.linalg.products.sparse_gemm import (REPORT_KEYS, SparseOperand, check_normal_range, plan_sparse,
                                                  run_gram_task, run_product_tiles)
from blocklin.linalg.update.gram import copied_before_claim
from blocklin.operands import row_range
from blocklin.runtime.job import Job
from blocklin.sparse import as_sparse_matrix
from blocklin.storage.atomic import open_or_create_array
from blocklin.storage.identity import plan_settings, resume_token
from blocklin.storage.location import Location
from blocklin.storage.sparse import SparseStore
from blocklin.storage.versions import Growth
from blocklin.storage.zarr_store import open_zarr

#: Appended to a range refusal raised by the tasks of an update.
_UNCHANGED = "(the update of {url} refused: the stored result is unchanged; scale the sparse matrix{b} as said and " \
             "recompute with --overwrite)"


def appended_rows(job: Job, g: Growth, name: str = "a") -> tuple[SparseOperand, SparseOperand]:
    """``(S, S_new)``: the stored sparse matrix of ``g`` as an operand of its ``g.rows`` rows, and the
    operand of its appended rows ``g.old_rows:g.rows`` (their entry count; what plans and resume tokens see)."""
    s = SparseOperand.of(as_sparse_matrix(g.url, job.cfg.storage_options), name)  # the update's own open: its
    # listing is the run's stamp of S, before the reads below and the output's claim (no second listing)
    job.stamp_input(s.path, s.stamp, own_open=True)
    st = SparseStore(s.path)
    nnz = int(st.indptr[g.rows]) - int(st.indptr[g.old_rows])
    whole = dataclasses.replace(s, shape=(g.rows, s.shape[1]), nnz=int(st.indptr[g.rows]))
    return whole, dataclasses.replace(s, shape=(g.rows - g.old_rows, s.shape[1]), nnz=nnz)


def _stored(out: Location, shape: tuple[int, int], dtype: np.dtype, what: str) -> Any:
    old = open_zarr(out)
    if tuple(old.shape) != shape or np.dtype(old.dtype) != dtype:
        raise ParameterError(explain("out", f"must be the {shape[0]} x {shape[1]} {dtype.name} {what} of its inputs",
                                     f"shape {tuple(old.shape)}, {np.dtype(old.dtype).name}",
                                     "recompute it with --overwrite"))
    return old


def _run(url: str, b: str, run: Any) -> Any:
    try:
        return run()
    except ParameterError as exc:
        if type(exc) is not ParameterError:
            raise
        raise ParameterError(f"{exc} {_UNCHANGED.format(url=url, b=b)}") from exc


def update_sparse_gram(job: Job, out: Location, prov: dict, g: Growth, *, resume: bool) -> Any:
    """``G + S_new^T S_new`` written over ``out`` (atomically, resumable); returns the Matrix."""
    params = prov.get("params") or {}
    s, new = appended_rows(job, g)
    n = int(s.shape[1])
    dt = np.dtype(params.get("dtype") or s.dtype)
    old = _stored(out, (n, n), dt, "Gram")
    plan = plan_sparse("STS", new, n, memory=job.cfg.memory, out_item=dt.itemsize)
    add = copied_before_claim(job, out, old)
    token = resume_token("gram-sparse-update", [new], g.url, g.old_rows, g.rows, g.stamp, out.url, params,
                         plan.to_dict(), plan_settings(job))
    ao = job.output(out, inputs=[s.path], covered=[(s.path, g.rows)], overwrite=True, resume=resume,
                    token=token, reads_output=True, size=((n, n), dt))
    open_or_create_array(ao, shape=(n, n), dtype=dt, chunks=tuple(old.chunks), codec=job.cfg.codec)
    _run(out.url, "", lambda: run_gram_task(job, new, plan, dt, ao, token, first_row=g.old_rows, add=add))
    report = job.report(flops=plan.flops, nnz=new.nnz, plan=plan.to_dict(), output=str(ao.path), route="sparse",
                        passes=job.passes("a"), product="S^T S")
    report["updated"] = _updated(g, "exact: the new rows' S^T S added to the stored result (float64 sums, one "
                                    "rounding)")
    history = list(prov.get("updates") or []) + [report["updated"]]
    return job.finish(ao, out, report, operation="gram", plan=plan.to_dict(), params=params,
                      keys=REPORT_KEYS + ("updated",), extra={"updates": history})


def update_sparse_matmul(job: Job, out: Location, prov: dict, ga: Growth, gb: Growth, *, resume: bool) -> Any:
    """``C + S_new^T B_new`` of ``matmul(S, B, trans_a=True)`` written over ``out`` (atomically, resumable)."""
    params = prov.get("params") or {}
    if params.get("dense_left") or not params.get("trans_a"):
        raise ParameterError(explain(
            "out", "must be a product summed over the rows appended to the sparse matrix: matmul(S, B, trans_a=True)",
            f"{out.url}, the sparse product {(prov.get('report') or {}).get('product') or 'S B'}",
            "recompute it: rerun blocklin gemm (bl.matmul) with the same arguments and --overwrite"))
    s, new = appended_rows(job, ga)
    B = row_range(job.operand(gb.url, "b"), 0, gb.rows)
    B_new = row_range(B, gb.old_rows, gb.rows)
    dt = np.dtype(params["dtype"])
    shape = (int(s.shape[1]), int(B.shape[1]))
    old = _stored(out, shape, dt, "product S^T B")
    plan = plan_sparse("STB", new, shape[1], memory=job.cfg.memory, b_item=B.dtype.itemsize,
                       b_chunks=tuple(B.chunks), out_item=dt.itemsize)
    before = copied_before_claim(job, out, old)
    token = resume_token("matmul-sparse-update", [new, B_new], ga.url, ga.old_rows, ga.rows, ga.stamp, gb.stamp,
                         out.url, params, plan.to_dict(), job.check_finite, plan_settings(job))
    ao = job.output(out, inputs=[s.path, B.path], covered=[(s.path, ga.rows), (B.path, gb.rows)], overwrite=True,
                    resume=resume, token=token, reads_output=True, size=(shape, dt))
    open_or_create_array(ao, shape=shape, dtype=dt, chunks=plan.out_chunks, codec=job.cfg.codec)
    workers, results = _run(out.url, " or b", lambda: run_product_tiles(
        job, new, B_new, plan, dt, ao, token, product="S^T B", first_row=ga.old_rows, add=before))
    if job.check_finite:  # the appended rows' product below the normal numbers, as matmul refuses it
        check_normal_range(new, B_new, plan, dt, results, ao.array_path(), first_row=ga.old_rows,
                           stored=job.operand(before, "c"), fix=(
                               "the stored result is unchanged; scale the sparse matrix and b by powers of two "
                               "(exact) and recompute: rerun blocklin gemm (bl.matmul) on the scaled inputs with "
                               "--overwrite"))
    report = job.report(flops=plan.flops, nnz=new.nnz, plan=plan.to_dict(workers), output=str(ao.path),
                        route="sparse", workers=workers, product="S^T B")
    report["updated"] = _updated(ga, "exact: the new rows' S^T B added to the stored result (float64 sums, one "
                                     "rounding)")
    history = list(prov.get("updates") or []) + [report["updated"]]
    return job.finish(ao, out, report, operation="matmul", plan=plan.to_dict(), params=params,
                      keys=REPORT_KEYS + ("updated",), extra={"updates": history})


def _updated(g: Growth, how: str) -> dict:
    return {"input": g.url, "rows_before": g.old_rows, "rows": g.rows, "rows_read": g.rows - g.old_rows, "how": how}


__all__ = ["appended_rows", "update_sparse_gram", "update_sparse_matmul"]
