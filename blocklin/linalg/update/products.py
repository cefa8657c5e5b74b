"""A product ``A^T B`` (``matmul(a, b, trans_a=True)``) brought up to date after rows were appended
to both ``A`` and ``B``: ``C + alpha A_new^T B_new``, the GEMM tiles over the new rows alone with the
stored result as their ``beta C`` (``beta = 1``).

``A^T B`` is a sum over the shared rows, so the update is exact up to rounding: the stored result
(in the output dtype) is added once more, so an update adds one rounding of ``|C|`` to the product
bound ``gamma_m |A|^T |B|``. ``X^T X`` of one operand (matmul's Gram route) is the Gram's update
(:mod:`.gram`). Products whose result grows with the rows (``A B``) or that added a ``C`` are
refused with the recompute.
"""

from __future__ import annotations

from typing import Any

from blocklin.errors import ParameterError, explain
from blocklin.linalg.products.gemm import REPORT_KEYS, Gemm, check_output_range
from blocklin.linalg.update.gram import copied_before_claim, update_gram
from blocklin.operands import row_range
from blocklin.runtime.job import Job
from blocklin.storage.atomic import open_or_create_array
from blocklin.storage.identity import plan_settings, resume_token
from blocklin.storage.location import Location
from blocklin.storage.recorded_peaks import PeakTally, recordable, record as record_peaks
from blocklin.storage.versions import Growth
from blocklin.storage.zarr_store import open_zarr


def update_matmul(job: Job, out: Location, prov: dict, growth: list[Growth], *, resume: bool) -> Any:
    """``C + alpha A[m0:m1]^T B[m0:m1]`` written over ``out`` (atomically, resumable)."""
    params = prov.get("params") or {}
    recompute = "recompute it: rerun blocklin gemm (bl.matmul) with the same arguments and --overwrite"
    if params.get("route") == "gram":  # X^T X of one operand
        if params.get("trans_b"):
            raise ParameterError(explain("out", "must be an updatable result", f"{out.url}, a product X X^T: each "
                                         "new row of X adds a row and a column that need every row", recompute))
        gram_params = {"trans": False, "alpha": params.get("alpha", 1.0), "dtype": params.get("dtype")}
        return update_gram(job, out, {**prov, "params": gram_params}, growth[:1], resume=resume,
                           operation="matmul", params=params)
    if not params.get("trans_a") or params.get("trans_b") or params.get("beta"):
        raise ParameterError(explain(
            "out", "must be a product summed over the appended rows: matmul(a, b, trans_a=True), A^T B without c",
            f"{out.url}, a product with trans_a={params.get('trans_a')}, trans_b={params.get('trans_b')}, "
            f"beta={params.get('beta')}", recompute))
    if len(growth) != 2 or (growth[0].old_rows, growth[0].rows) != (growth[1].old_rows, growth[1].rows):
        raise ParameterError(explain("b", "must have grown by the rows A grew by (A^T B sums over their shared rows)",
                                     ", ".join(f"{g.url}: {g.old_rows} -> {g.rows} rows" for g in growth),
                                     "append the matching rows to both, then update"))
    ga, gb = growth
    if params.get("route") == "sparse":  # S^T B of a stored sparse matrix
        from blocklin.linalg.update.sparse_products import update_sparse_matmul

        return update_sparse_matmul(job, out, prov, ga, gb, resume=resume)
    A, B = row_range(job.operand(ga.url, "a"), 0, ga.rows), row_range(job.operand(gb.url, "b"), 0, gb.rows)
    old = open_zarr(out)
    before = copied_before_claim(job, out, old)
    op = Gemm.of(row_range(A, ga.old_rows, ga.rows), row_range(B, gb.old_rows, gb.rows), job.operand(before, "c"),
                 alpha=float(params.get("alpha", 1.0)), beta=1.0, trans_a=True, dtype=params.get("dtype"),
                 precision=params.get("precision"))
    plan = op.plan(job)
    # the job's settings: the codec of the array a resumed run writes into (see Gemm.token)
    token = resume_token("matmul-update", op.operands, ga.stamp, gb.stamp, out.url, plan.to_dict(),
                         plan_settings(job))
    ao = job.claim(out, [A, B], overwrite=True, resume=resume, token=token, reads_output=True,
                   size=(op.shape, op.dtype))
    open_or_create_array(ao, shape=op.shape, dtype=op.dtype, chunks=plan.out_chunks, codec=job.cfg.codec)
    # the tiles' peaks: the sums of the new rows' products and the stored result may leave the range
    # (an update had returned Inf where the same product computed afresh is refused)
    tally = PeakTally(op.shape) if recordable(op.dtype) and min(op.shape) > 0 else None
    op.run(job, plan, ao.array_path(), done_dir=ao.done, peaks=tally)
    # and the appended rows' product below the normal numbers, as matmul refuses it (an update had returned
    # it as subnormals of few digits where the stored result was zero)
    recompute = "recompute: rerun blocklin gemm (bl.matmul) on the scaled inputs with --overwrite"
    check_output_range(job, op, ao.array_path(), tally, fix=(
        f"the stored result is unchanged; scale a or b by a power of two (exact) and {recompute}"),
        below_normal=True, recompute=recompute)
    report = job.report(flops=plan.flops, plan=plan.to_dict(), output=str(ao.path))
    report["updated"] = {"input": ga.url, "rows_before": ga.old_rows, "rows": ga.rows,
                         "rows_read": ga.rows - ga.old_rows, "how": "exact: the new rows' product added to the "
                         "stored result (GEMM with beta C)"}
    history = list(prov.get("updates") or []) + [report["updated"]]
    result = job.finish(ao, out, report, operation="matmul", plan=plan.to_dict(), params=params,
                        keys=REPORT_KEYS + ("updated",), extra={"updates": history})
    if tally is not None:  # after the commit: the record's stamp is the committed output's
        record_peaks(ao.path, tally)
    return result


__all__ = ["update_matmul"]
