"""Planning a pass over the rows of one or more tall operands."""

from __future__ import annotations

import dataclasses
import math


from blocklin.config import format_size, size_hint
from blocklin.errors import BudgetError, explain
from blocklin.plan.chunks import round_down_multiple, split


@dataclasses.dataclass(frozen=True)
class RowPassPlan:
    """Row strips of ``strip`` rows, grouped into ``len(groups)`` tasks of consecutive strips."""

    m: int
    strip: int
    groups: tuple[tuple[int, int], ...]
    workers: int
    blas_threads: int
    prefetch: int
    row_bytes: int
    fixed_bytes: int
    peak_memory: int
    memory: int
    bytes_read: int

    def strips(self, group: int) -> list[tuple[int, int]]:
        r0, r1 = self.groups[group]
        return [(r0 + a, r0 + b) for a, b in split(r1 - r0, self.strip)]

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def explain(self) -> str:
        return (f"row pass: {self.m} rows in strips of {self.strip} ({len(self.groups)} task(s), "
                f"{self.workers} concurrent), read {format_size(self.bytes_read)}, "
                f"peak {format_size(self.peak_memory)} of {format_size(self.memory)}")


def plan_row_pass(m: int, row_bytes: int, *, chunk_rows: int, memory: int, fixed_bytes: int = 0,
                  strip_extra_row_bytes: int = 0, workers: int = 1, cores: int = 1, prefetch: int = 1,
                  max_strip: int | None = None, min_tasks: int | None = None) -> RowPassPlan:
    """Choose strip height so that every concurrent task fits ``memory``.

    Parameters
    ----------
    m : int
        Rows of the operands.
    row_bytes : int
        Bytes of one row of all streamed operands together (stored dtypes).
    chunk_rows : int
        Chunk height of the operands; strips are multiples of it where the budget allows.
    memory : int
        Host budget for all tasks.
    fixed_bytes : int
        Per-task memory independent of the strip (accumulators, broadcast parameters).
    strip_extra_row_bytes : int
        Per-row memory of a strip's temporaries (products, outputs being written).
    workers, cores, prefetch : int
        Concurrency, cores to share, strips read ahead.
    max_strip : int, optional
        Upper bound on strip height (smaller strips overlap better).
    min_tasks : int, optional
        Split the rows into at least this many tasks (default ``workers``).
    """
    workers = max(1, workers)
    per_task = memory // workers - fixed_bytes
    per_row = row_bytes * (prefetch + 1) + strip_extra_row_bytes
    if per_task < per_row:
        need = (fixed_bytes + per_row) * workers
        raise BudgetError(explain("memory", "must hold each task's fixed buffers and one strip row",
                                  format_size(memory), f"raise it to at least {format_size(need)} "
                                  f"(memory='{size_hint(need)}') or use fewer workers"))
    strip = min(max(1, m), per_task // per_row)
    if max_strip:
        strip = min(strip, max_strip)
    if strip >= chunk_rows:
        strip = round_down_multiple(strip, chunk_rows)
    strip = max(1, strip)
    n_strips = math.ceil(m / strip) if m else 0
    tasks = max(1, min(n_strips, min_tasks or workers))
    per_group = math.ceil(n_strips / tasks) if n_strips else 1
    groups = tuple((s * strip * per_group, min(m, (s + 1) * strip * per_group)) for s in range(tasks)
                   if s * strip * per_group < m) or ((0, m),)
    peak = workers * (fixed_bytes + per_row * strip)
    return RowPassPlan(m=m, strip=strip, groups=groups, workers=workers, blas_threads=max(1, cores // workers),
                       prefetch=prefetch, row_bytes=row_bytes, fixed_bytes=fixed_bytes, peak_memory=peak,
                       memory=memory, bytes_read=m * row_bytes)
