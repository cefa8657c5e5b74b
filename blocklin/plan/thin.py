"""The plan of a thin product: ``alpha A op(B) + beta C`` with ``op(B)`` held, as one row pass."""

from __future__ import annotations

import dataclasses

import numpy as np

from blocklin.config import format_size
from blocklin.plan.rates import Rates, expected_line


@dataclasses.dataclass(frozen=True)
class ThinPlan:
    """How :func:`blocklin.matmul` computes a product whose ``op(B)`` is thin (``k x n``, ``n`` small):
    ``op(B)`` held in memory, ``A`` streamed by rows in one row pass (``pass_plan``, a
    :class:`~blocklin.plan.passes.RowPassPlan` as a dict), each strip's product (and ``beta C``'s
    strip, streamed beside it) written as the output's rows. ``A`` is read once, ``op(B)`` once.

    ``route`` is ``"rows"``; ``flops``, ``bytes_read``, ``bytes_written``, ``peak_memory`` and
    :meth:`explain` are those of a :class:`~blocklin.plan.GemmPlan`.
    """

    m: int
    n: int
    k: int
    dtype: str
    with_c: bool
    out_chunks: tuple[int, int]
    workers: int
    flops: int
    bytes_read: int
    bytes_written: int
    peak_memory: int
    memory: int
    pass_plan: dict
    route: str = "rows"
    device: str = "cpu"

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def explain(self, rates: Rates | None = None, device: str | None = None) -> str:
        """The route, its strips, reads, writes and flops, and the expected split of its time on ``device``
        (``rates``: default :func:`~blocklin.plan.rates.load_rates`)."""
        pp = self.pass_plan
        return "\n".join([
            f"thin product: C[{self.m} x {self.n}] = A[{self.m} x {self.k}] @ op(B)[{self.k} x {self.n}] "
            f"({self.dtype}{', + beta*C0' if self.with_c else ''}) on {self.device}",
            f"  route     one row pass: op(B) held ({format_size(self.k * self.n * np.dtype(self.dtype).itemsize)}), "
            f"A streamed in strips of {pp['strip']} rows "
            f"({len(pp['groups'])} task(s), {self.workers} concurrent), each strip's product written",
            f"  output    chunks {self.out_chunks[0]} x {self.out_chunks[1]}",
            f"  work      {self.flops / 1e9:.1f} GFLOP, read {format_size(self.bytes_read)},"
            f" write {format_size(self.bytes_written)}",
            f"  memory    peak {format_size(self.peak_memory)} of {format_size(self.memory)} host budget",
            "  " + expected_line(self.bytes_read, self.bytes_written, self.flops, device or self.device, rates,
                                 dtype=self.dtype),
        ])

