"""The resume identity of an operation: one token per run that decides its result's bits.

A resumed run continues only the partial output whose token it computes again, so the token must
change with everything that changes the bits: the operation, each operand's name (location, shape,
dtype, chunks, whether it was staged), the parameters and the plan, and for operations whose tile
and pass plans are made inside the run, the settings those depend on (:func:`plan_settings`). The
operands' content (values rewritten in place keep every name) is checked by the output itself:
:class:`~blocklin.storage.atomic.AtomicOutput` records each input's content stamp
(:mod:`blocklin.storage.stamps`) and starts over when one changed. Built here and nowhere else.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from dask.base import tokenize

#: Characters of the token kept in partial-output and work-folder names.
TOKEN_CHARS = 16


def operand_identity(operand: Any) -> tuple:
    """What names an operand: location (URL and storage options), shape, dtype, chunks, staged, and the
    first stored row of a range of rows. A staged copy of a stored array (integers cast, a vector as a
    column) is named by that array's location: the copy's own is new each run."""
    staged = bool(getattr(operand, "staged", False))
    where = getattr(operand, "source", None) if staged else None
    ident = (where if where is not None else operand.path, tuple(operand.shape), operand.dtype.str,
             tuple(operand.chunks), staged)
    first = int(getattr(operand, "first_row", 0))
    return ident + (first,) if first else ident


def plan_settings(job: Any) -> tuple:
    """The job's settings that plans made during a run depend on: budget, workers, parallelism,
    cores, device and codec."""
    return (job.cfg.memory, job.workers(1), job.parallelism(), job.cores(), job.device, job.cfg.codec)


def resume_token(operation: str, operands: Sequence[Any], *parts: Any) -> str:
    """The resume identity of ``operation`` on ``operands`` with ``parts`` (parameters, plan, output,
    :func:`plan_settings`): a deterministic token of :data:`TOKEN_CHARS` characters."""
    return tokenize(operation, [operand_identity(o) for o in operands], *parts)[:TOKEN_CHARS]
