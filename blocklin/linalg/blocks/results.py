"""Result groups: small factors and a long factor written as one zarr group with provenance."""

from __future__ import annotations

from typing import Any

import numpy as np

from blocklin.errors import ParameterError, explain
from blocklin.storage import create_group, write_array

#: Report entries recorded in a factorization's attributes (the rest stays in ``result.report``).
GROUP_REPORT_KEYS = (
    "method", "seconds", "passes", "passes_formula", "intermediate_passes", "bytes_read", "bytes_logical", "read_notes", "bytes_written",
    "peak_memory", "memory_budget", "residuals", "relative_residuals", "converged", "tol", "seed", "power_iters",
    "lanczos_steps", "restarts", "block", "oversample", "sketch_size", "sketch_generator", "orth", "in_core", "device",
    "scheduler", "which", "residual_note", "history", "sigma_max")


def open_group(job: Any, out: Any, A: Any, overwrite: bool, *, resume: bool = False, token: str | None = None) -> Any:
    """An atomic output group for a factorization of ``A`` (``out=None``: a temporary one); ``token``
    names its unfinished partial, which ``resume=True`` continues."""
    if resume and out is None:
        raise ParameterError(explain("resume", "needs out= (an interrupted run is continued from its unfinished "
                                     "output)", "out=None", "pass out='factors.zarr' to both runs"))
    ao = job.claim(out, [A], overwrite=overwrite, resume=resume, token=token)
    create_group(ao.array_path())
    return ao


def write_group(job: Any, out: Any, A: Any, arrays: dict, operation: str, plan: Any, report: dict,
                overwrite: bool, ao: Any = None, params: dict | None = None) -> Any:
    """Write small arrays into the output group and commit it (``ao`` may already hold a long factor);
    ``params``: recorded beside ``k`` and ``method``."""
    if ao is None:
        ao = open_group(job, out, A, overwrite)
    for name, x in arrays.items():
        write_array(ao.array_path(name), np.ascontiguousarray(x))
    return ao.commit(operation, plan=plan.to_dict(), params={"k": plan.k, "method": plan.method, **(params or {})},
                     report=job.brief(report, GROUP_REPORT_KEYS))


def delete_output(result: Any) -> None:
    """Remove the group a factorization ``result`` was written to (``report["output"]``: its stored
    factor and every array beside it), where ``Matrix.delete`` on the stored factor removes that
    array alone and leaves the group. The group is found from the result's ``output`` or its stored
    factor's location (their storage options with them: an S3 group whose credentials came with the
    call is not reachable by its URL alone), else from the report; NumPy arrays the result holds stay
    usable."""
    from blocklin.matrix import Matrix
    from blocklin.storage.backend import remove
    from blocklin.storage.location import as_location

    stored = [x for x in result if isinstance(x, Matrix)]
    if getattr(result, "output", None) is not None:
        remove(result.output)
    elif stored:
        remove(stored[0].location.parent)
    elif result.report.get("output"):
        remove(as_location(result.report["output"]))

