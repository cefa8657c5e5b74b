"""The report of every solve: one builder, and per route the entries an output records.

Every route of :func:`blocklin.solve` (the in-memory least squares, the stored Gram matrix, the square
systems) and :func:`blocklin.solve_triangular` builds its report with :func:`solve_report`: a field
that every solve report carries is added there, one a route carries at that route's call.
"""

from __future__ import annotations

from typing import Any

from blocklin.runtime.job import Job

_LEAST_SQUARES = ("lam", "method", "method_reason", "residual_norm", "solution_norm", "passes", "seconds", "intercept",
                  "resumed_passes", "scaling", "lam_rule", "alpha_", "best_score_", "sample_weight", "positive",
                  "lam_per_target", "scoring", "cv", "rank")  # cv_results_ (m x k x L) stays in memory: x.cv_results_
#: Report entries recorded in the output's attributes, per route.
RECORDED = {
    "least squares": _LEAST_SQUARES,  # the Gram matrix or R factor in memory (tall, wide)
    "stored gram": _LEAST_SQUARES,  # the regularized Gram matrix stored and factored out of core
    # LSQR on a stored sparse matrix's row-block products (sparse_lsqr)
    "sparse least squares": ("lam", "method", "method_reason", "residual_norm", "solution_norm", "passes", "seconds",
                             "intercept", "iterations", "converged", "column_converged", "tol", "max_iter", "nnz",
                             "flops", "scaling"),
    "square": ("method", "method_reason", "precision", "residual_norm", "backward_error", "refine_steps", "seconds",
               "growth_factor", "resumed"),
    "triangular": ("seconds", "peak_memory", "tasks"),
    "factored": ("method", "seconds", "peak_memory", "tasks"),  # cho_solve, lu_solve with a stored factor
}


def solve_report(job: Job, *, route: str, flops: float | None = None, **fields: Any) -> tuple[dict, dict]:
    """The report of a solve on ``route`` and what its output records.

    Parameters
    ----------
    job : Job
        The solve's job: its statistics, time, peak memory and device open the report
        (:meth:`~blocklin.runtime.job.Job.report`, which takes ``flops``).
    route : {"least squares", "stored gram", "sparse least squares", "square", "triangular", "factored"}
        Which entries of the report the output's attributes record (:data:`RECORDED`).
    **fields
        The route's entries, in the order they are reported.

    Returns
    -------
    tuple of dict
        The report, and its entries that the output records.
    """
    report = job.report(flops=flops, **fields)
    return report, job.brief(report, RECORDED[route])


__all__ = ["RECORDED", "solve_report"]
