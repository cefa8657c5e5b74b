"""Thin products: ``alpha A op(B) + beta C`` with ``op(B)`` narrow enough to hold, as one row pass.

A tile plan (:mod:`blocklin.plan.gemm`) gives a product with a few columns one tile task per row band,
one at a time, each reading its panel, making a few flops per element and writing a small output
tile: on the CPU the tasks' set-up, writes and single loader, not the reads, bound it (a thin product
of a 1 GiB matrix read 0.13x of the raw limit). Holding ``op(B)`` and streaming ``A`` through the
row-pass engine instead reads ``A`` once, in strips, on every core, with the engine's loaders.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from blocklin.linalg.blocks.tallblock import load_tall
from blocklin.errors import BudgetError
from blocklin.plan.passes import PassMemory, RowPassPlan, output_chunk_rows
from blocklin.peaks import block_peaks
from blocklin.plan.thin import ThinPlan
from blocklin.runtime.passes import plan_kernel_pass, row_kernel, run_pass, source
from blocklin.storage.recorded_peaks import PeakTally

#: Widest ``op(B)`` (its columns, the output's) that :func:`thin_plan` holds.
THIN_MAX_COLUMNS = 64
#: ``op(B)`` is held only where it is at most this share of the budget.
HELD_SHARE = 8


def _thin_memory(params: Any, sources: tuple) -> PassMemory:
    b = params["B"]
    row = b.shape[1] * b.dtype.itemsize
    # op(B) (shared by a process's tasks, counted per task); the products gathered into whole output
    # chunks (a strip's, or up to "gather" bytes of them) and zarr's temporaries for writing one
    return PassMemory(fixed=b.nbytes + 4 * params["gather"], per_row=row, chunk_temporaries=True,
                      write_row_bytes=row)


def _thin_init(device: Any, params: Any) -> dict:
    b = params["B"]
    return {"buf": device.empty((max(params["strip"], params["chunk"]), b.shape[1]), b.dtype), "rows": 0, "n": 0,
            "peaks": []}


@row_kernel(memory=_thin_memory, init=_thin_init, device="cpu", read_only=True)
def thin_kernel(device: Any, arrays: tuple, rows: slice, params: Any, state: dict) -> tuple[Any, dict | None]:
    """``F_i = alpha X_i B + beta C_i`` of a strip ``X_i`` of ``A`` (and ``C_i`` of ``C``), computed into
    the task's buffer of whole output chunks (``params["chunk"]`` rows, a whole number of strips) and
    written when one is full or the task's rows end; ``alpha`` and ``beta C`` applied after the product,
    as a GEMM tile applies them (:meth:`~blocklin.device.base.Device.axpby`). With ``params["peaks"]``
    (``"columns"`` or ``"rows"``: the side a :class:`~blocklin.storage.recorded_peaks.PeakTally` of the
    output tallies) the peaks of each block written are kept. A group's final state is its row count and
    those peaks, ``(first row, peaks)`` per block."""
    r = rows.stop - rows.start
    if state["n"] == 0:
        state["r0"] = rows.start
    y = state["buf"][state["n"]:state["n"] + r]
    device.gemm_into(y, arrays[0], params["B"])
    device.axpby(y, params["alpha"], arrays[1] if len(arrays) > 1 else None, params["beta"])
    state["n"] += r
    state["rows"] += r
    end = rows.stop in params["ends"]
    if state["n"] < params["chunk"] and not end:
        return state, None
    done = state["buf"][:state["n"]]
    if params["peaks"]:
        state["peaks"].append((state["r0"], block_peaks(done, rows=params["peaks"] == "rows")))
    writes, state["n"] = {"F": (state["r0"], done)}, 0
    return ({"rows": state["rows"], "peaks": state["peaks"]} if end else state), writes


def held_b(job: Any, op: Any) -> np.ndarray:
    """``op(B)`` read into memory (C-ordered) in one pass over ``B`` (column strips where ``trans_b``),
    checked for NaN/Inf as every pass checks; the pass holds the strips it read and the whole, within
    the budget that the held ``op(B)`` leaves (at most ``1 /`` :data:`HELD_SHARE` of it each)."""
    nbytes = op.B.shape[0] * op.B.shape[1] * np.dtype(op.B.dtype).itemsize
    return load_tall(job, op.B, transposed=op.trans_b, memory=job.cfg.memory - 2 * nbytes,
                     description=f"read op(B) ({op.shape[1]} column(s)) into memory")


def _sources(op: Any) -> list:
    srcs = [source(op.A, name="a")]
    if op.C is not None:
        srcs.append(source(op.C, name="c"))
    return srcs


#: Bytes of output rows a task gathers into one chunk: a chunk is a file to create (and a folder per
#: chunk row); strips' worth of a thin product's rows (64 KiB for 2048 x 4 float64) made the files'
#: creation a third of a task's time.
OUTPUT_CHUNK_BYTES = 1 << 20


def _params(b: np.ndarray, op: Any, memory: int) -> dict:
    return {"B": b, "alpha": op.alpha, "beta": op.beta, "gather": min(OUTPUT_CHUNK_BYTES, memory // 64), "chunk": 0,
            "peaks": None}


def thin_plan(job: Any, op: Any, out_chunks: Any = None) -> ThinPlan | None:
    """The row-pass plan of ``op`` (a :class:`~blocklin.linalg.products.gemm.Gemm`), or ``None`` where the
    route does not apply: a GPU (its tiles keep operands on the device), an output chunking asked for,
    ``trans_a`` (``A^T B`` sums over ``A``'s rows: the tiles' k-panels stream them), a compute or output
    dtype other than the operands', ``op(B)`` wider than :data:`THIN_MAX_COLUMNS` or over
    ``1 /`` :data:`HELD_SHARE` of the budget, strips that would read compressed chunks more than once,
    or a budget the pass does not fit (the tiles then say what fits)."""
    m, n = op.shape
    k = op.A.shape[1]
    dt = np.dtype(op.dtype)
    dtypes = {np.dtype(x.dtype) for x in op.operands}
    if (job.device != "cpu" or out_chunks is not None or op.trans_a or np.dtype(op.compute) != dt
            or dtypes != {dt} or not 0 < n <= THIN_MAX_COLUMNS or not m or not k
            or k * n * dt.itemsize * HELD_SHARE > job.cfg.memory):
        return None
    params = _params(np.empty((k, n), dt), op, job.cfg.memory)
    try:
        pp = plan_kernel_pass(job, thin_kernel, _sources(op), params, reserve=k * n * dt.itemsize)
    except BudgetError:
        return None
    if pp.rereads > 1 and not pp.cached:  # strips narrower than compressed chunks: the tiles read them once
        return None
    isz = dt.itemsize
    chunk = output_chunk_rows(pp, params["gather"] // (n * isz))
    return ThinPlan(m=m, n=n, k=k, dtype=dt.name, with_c=op.C is not None, out_chunks=(chunk, n), workers=pp.workers,
                    flops=2 * m * n * k,
                    bytes_read=m * k * isz + k * n * isz + (m * n * isz if op.C is not None else 0),
                    bytes_written=m * n * isz, peak_memory=pp.peak_memory + k * n * isz, memory=job.cfg.memory,
                    pass_plan=pp.to_dict())


def run_thin(job: Any, op: Any, plan: ThinPlan, out_path: Any, peaks: PeakTally | None = None) -> None:
    """Write ``alpha A op(B) + beta C`` into the array at ``out_path`` (created with ``plan.out_chunks``);
    ``peaks``: a tally of the output, into which the peaks of every block written are merged (the pass
    runs whole on a resume, so the tally is complete)."""
    rp = RowPassPlan.from_dict(plan.pass_plan)
    params = {**_params(held_b(job, op), op, plan.memory), "chunk": plan.out_chunks[0],
              "peaks": None if peaks is None else "rows" if peaks.transposed else "columns"}
    # a product has no scaling: the pass records no column peaks of its inputs (where the job checks for
    # NaN/Inf, the loaders check each strip; in the kernel, after each piece's product, it measured slower)
    states, _ = run_pass(job, thin_kernel, _sources(op), params, plan=rp, outputs=(("F", out_path),), peaks=False,
                         description=f"thin product ({plan.n} column(s))")
    if peaks is not None:
        for st in states:
            for r0, p in st["peaks"]:
                peaks.merge(np.asarray(p, dtype=np.float64), r0, 0)
