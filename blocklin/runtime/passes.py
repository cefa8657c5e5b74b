"""Row passes: stream row strips of tall operands through the device, reduce small partials.

Many algorithms read a tall matrix ``A`` (``m x n`` with ``n`` modest) strip by strip: Gram
matrices ``A^T A``, sketches ``A^T (A Q)``, the R factor of a streaming QR. A row pass cuts the
rows into groups (one task each); a task streams its strips with a :class:`TileStream` and calls
a kernel per strip that updates a small state and may return row blocks to write to tall outputs.
Partial states come back through the scheduler (they are small) and are reduced in group order,
so results do not depend on the scheduler or the number of workers.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from blocklin.device import TileStream, get_device
from blocklin.plan.passes import RowPassPlan
from blocklin.runtime.graph import TileGraph
from blocklin.runtime.tiles import check_finite, open_array, region, with_task_settings
from blocklin.storage.zarr_store import read_block, write_block

#: ``kernel(device, arrays, rows, params, state) -> (state, writes)``; ``arrays`` are the strip's
#: operand blocks (on the device), ``writes`` maps output names to host blocks for ``rows``.
Kernel = Callable[[Any, tuple[Any, ...], slice, Any, Any], tuple[Any, dict[str, np.ndarray] | None]]


@dataclasses.dataclass(frozen=True)
class RowPassSpec:
    """One pass: inputs (paths, column ranges), kernel, broadcast params, outputs (paths)."""

    inputs: tuple[str, ...]
    names: tuple[str, ...]
    kernel: Kernel
    params: Any
    plan: RowPassPlan
    device: str
    device_memory: int | None
    check_finite: bool
    outputs: tuple[tuple[str, str], ...] = ()
    init: Callable[[Any, Any], Any] | None = None
    blas_threads: int | None = None
    columns: tuple[tuple[int, int] | None, ...] | None = None
    #: Per input: stream the stored array's transpose (row strips of ``X.T`` = column strips of ``X``);
    #: ``columns`` then selects stored rows.
    transposed: tuple[bool, ...] | None = None
    #: Outputs written transposed: a block for ``rows`` goes to ``out[:, rows] = block.T``.
    transposed_outputs: tuple[str, ...] = ()


@with_task_settings
def row_pass_task(spec: RowPassSpec, group: int) -> dict:
    """Stream the strips of ``group`` and return ``{"state": ..., stats}``."""
    t0 = time.perf_counter()
    arrays = [open_array(p) for p in spec.inputs]
    trans = spec.transposed or (False,) * len(arrays)
    cols = spec.columns or (None,) * len(arrays)
    col_slices = [slice(0, a.shape[0 if t else 1]) if c is None else slice(*c) for a, c, t in zip(arrays, cols, trans)]
    outs = {name: open_array(path, mode="r+") for name, path in spec.outputs}
    device = get_device(spec.device, device_memory=spec.device_memory)
    strips = spec.plan.strips(group)
    shapes = [(cs.stop - cs.start, spec.plan.strip) if t else (spec.plan.strip, cs.stop - cs.start)
              for cs, t in zip(col_slices, trans)]
    nbytes = [0]

    def load(i: int, bufs: tuple[np.ndarray, ...]) -> tuple[np.ndarray, ...]:
        r0, r1 = strips[i]
        rs = slice(r0, r1)
        views = []
        for arr, buf, name, cs, t in zip(arrays, bufs, spec.names, col_slices, trans):
            if t:  # column strip of the stored array, handed out as a transposed view
                v = read_block(arr, cs, rs, out=region(buf, (cs.stop - cs.start, r1 - r0)))
                if spec.check_finite:
                    check_finite(v, name, cs, rs)
                v = v.T
            else:
                v = read_block(arr, rs, cs, out=region(buf, (r1 - r0, cs.stop - cs.start)))
                if spec.check_finite:
                    check_finite(v, name, rs, cs)
            nbytes[0] += v.nbytes
            views.append(v)
        return tuple(views)

    state = spec.init(device, spec.params) if spec.init else None
    stream = TileStream(device, len(strips), load, shapes, [a.dtype for a in arrays], depth=spec.plan.prefetch)
    written = 0
    for i, dev_arrays in stream:
        r0, r1 = strips[i]
        state, writes = spec.kernel(device, dev_arrays, slice(r0, r1), spec.params, state)
        for name, block in (writes or {}).items():
            if name in spec.transposed_outputs:
                write_block(outs[name], slice(0, block.shape[1]), slice(r0, r1), block.T)
            else:
                write_block(outs[name], slice(r0, r1), slice(0, block.shape[1]), block)
            written += block.nbytes
    return {"state": state, "bytes_read": nbytes[0], "bytes_written": written, "seconds": time.perf_counter() - t0,
            "load_seconds": stream.load_seconds, "wait_seconds": stream.wait_seconds}


def run_row_pass(job: Any, spec: RowPassSpec, *, description: str = "pass") -> list[Any]:
    """Run a row pass through ``job``; return the per-group states in row order."""
    graph = TileGraph.named("rowpass", spec.inputs, spec.kernel.__module__, spec.kernel.__qualname__,
                            spec.plan.to_dict(), _params_token(spec.params), spec.outputs, spec.columns,
                            spec.transposed, spec.transposed_outputs)
    for g in range(len(spec.plan.groups)):
        graph.add((g,), row_pass_task, spec, g)
    results = job.run(graph, workers=spec.plan.workers, blas_threads=spec.plan.blas_threads,
                      description=description)
    job.stats["passes"] = job.stats.get("passes", 0) + 1
    return [r["state"] for r in results]


def _params_token(params: Any) -> Any:
    from dask.base import tokenize

    return tokenize(params)
