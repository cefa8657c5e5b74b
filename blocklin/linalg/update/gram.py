"""The Gram matrix ``A^T A`` brought up to date: ``G + A_new^T A_new`` from the appended rows alone.

``A^T A`` is a sum over rows, so the rows ``m0:m1`` appended since the stored result add
``A[m0:m1]^T A[m0:m1]``, computed by the Gram pass over those rows only (the SYRK tiles when the
result exceeds the budget, with the old result as their ``C``). On the pass route the old result,
read in float64, is added to the new rows' float64 task sums and the total rounded once to the
result's dtype. So a float64 update equals a recompute up to the order of the float64 sums (the
recompute groups the rows differently): within the Gram's rounding bound
``|dG_ij| <= gamma_m sum_k |a_ki| |a_kj|``, not bit for bit. A float32 result adds one float32
rounding of the old result per update: ``|dG_ij| <= (u_32 + gamma_m) sum_k |a_ki| |a_kj|`` per update.
"""

from __future__ import annotations

from typing import Any

from blocklin.errors import ParameterError, explain
from blocklin.linalg.products.gram import REPORT_KEYS, Gram
from blocklin.linalg.update.bands import copy_rows
from blocklin.operands import row_range
from blocklin.runtime.blockops import BlockOps
from blocklin.runtime.job import Job
from blocklin.storage.atomic import open_or_create_array
from blocklin.storage.identity import plan_settings, resume_token
from blocklin.storage.location import Location
from blocklin.storage.versions import Growth
from blocklin.storage.zarr_store import open_zarr


def copied_before_claim(job: Job, out: Location, old: Any) -> Location:
    """Where the stored result is read from while its update is written: ``out`` itself locally (the
    update's partial is a sibling, swapped in at the commit), else a scratch copy (an object store's
    output is removed when the overwriting run starts)."""
    if out.is_local:
        return out
    copy = job.scratch("before-update", old.shape, old.dtype, tuple(old.chunks))
    if old.shape[0] == old.shape[1] and old.chunks[0] == old.chunks[1]:
        BlockOps(job, int(old.chunks[0])).copy(out, copy, old.shape[0])
    else:
        copy_rows(job, out, copy)
    return copy


def update_gram(job: Job, out: Location, prov: dict, growth: list[Growth], *, resume: bool,
                operation: str = "gram", params: dict | None = None) -> Any:
    """Write ``G + A[m0:m1]^T A[m0:m1]`` over ``out`` (atomically, resumable); returns the Matrix.
    ``operation``, ``params``: as the result records them (matmul's ``X^T X`` is a Gram)."""
    recorded = params
    params = prov.get("params") or {}
    if params.get("trans"):
        raise ParameterError(explain(
            "out", "must be an updatable result", f"{out.url}, a Gram A A^T: each new row of A adds a row and a "
            "column whose entries need every row of A", "recompute it: blocklin gram A OUT --trans --overwrite "
            "(bl.gram(a, out, trans=True, overwrite=True))"))
    (g,) = growth
    if params.get("route") == "sparse":  # S^T S of a stored sparse matrix (imported here: it reuses this module)
        from blocklin.linalg.update.sparse_products import update_sparse_gram

        return update_sparse_gram(job, out, prov, g, resume=resume)
    a = row_range(job.operand(g.url, "a"), 0, g.rows)
    new = row_range(a, g.old_rows, g.rows)
    op = Gram.of(new, dtype=params.get("dtype"), alpha=float(params.get("alpha", 1.0)))
    plan = op.plan(job)
    old = open_zarr(out)
    if old.shape != op.shape:
        raise ParameterError(explain("out", f"must be the {op.shape[0]} x {op.shape[1]} Gram of its input",
                                     f"shape {old.shape}", "recompute it with --overwrite"))
    add = copied_before_claim(job, out, old)
    # the job's settings: the plan names no device, and the tiles run on the job's (see Gram.token)
    token = resume_token("gram-update", [new], g.stamp, out.url, plan.to_dict(), op.alpha, op.dtype.name,
                         plan_settings(job))
    ao = job.claim(out, [a], overwrite=True, resume=resume, token=token, reads_output=True, size=(op.shape, op.dtype))
    open_or_create_array(ao, shape=op.shape, dtype=op.dtype, chunks=plan.out_chunks, codec=job.cfg.codec)
    scaling = op.run(job, plan, ao.array_path(), done_dir=ao.done, add=add)
    report = job.report(flops=plan.flops, plan=plan.to_dict(), output=str(ao.path), route=plan.route,
                        product=plan.product)
    report["scaling"] = scaling
    report["passes"] = job.passes("a")
    report["updated"] = _updated(g)
    history = list(prov.get("updates") or []) + [report["updated"]]
    return job.finish(ao, out, report, operation=operation, plan=plan.to_dict(),
                      params=params if recorded is None else recorded, keys=REPORT_KEYS + ("updated",),
                      extra={"updates": history})


def _updated(g: Growth) -> dict:
    return {"input": g.url, "rows_before": g.old_rows, "rows": g.rows, "rows_read": g.rows - g.old_rows,
            "how": "exact: the new rows' sum added to the stored result"}


__all__ = ["copied_before_claim", "update_gram"]
