"""Row-pass kernel of :func:`blocklin.gram`: ``G += S^T S`` for each row strip ``S`` (BLAS SYRK).

On the CPU the update is ``dsyrk``/``ssyrk`` into the lower triangle (row-major view) of a
C-contiguous accumulator, half the flops of a GEMM; on a GPU it is the device's SYRK on its compute
stream and the accumulator comes to the host at the end of each task's group of strips.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from blocklin.device.syrk import syrk_acc, symmetrize_lower
from blocklin.plan.gram import gram_pass_memory
from blocklin.plan.passes import PassMemory
from blocklin.runtime.passes import row_kernel

def gram_memory(params: Any, sources: tuple) -> PassMemory:
    """See :func:`blocklin.plan.gram.gram_pass_memory` (shared with the planner of the route)."""
    src = sources[0]
    dt = np.dtype(params["dtype"])
    return gram_pass_memory(src.width, dt, cast=src.dtype != dt or src.transposed, gpu=bool(params.get("gpu")))


@row_kernel(memory=gram_memory, device="any")
def gram_pass_kernel(device: Any, arrays: tuple, rows: slice, params: Any, state: dict | None) -> tuple[dict, None]:
    """Accumulate the lower triangle of ``S^T S`` over the strips of one task (``S`` the strip).

    ``params["shift_first"]`` (the wide solve's intercept, whose strips are columns of ``A``): each strip
    row less its first entry, ``S_s = S - S[:, :1] 1^T``, so the sum is ``A_s A_s^T`` (``conj(A_s A_s^H)``
    of complex data) with ``A_s = A - 1 a_1^T`` (rounded relative to the spread of ``A``'s columns, not
    their means), and ``v = conj(S_s)^T S[:, 0]`` summed beside it (``conj(A_s) a_1``, what the intercept
    needs of the shift)."""
    dt = np.dtype(params["dtype"])
    shift = bool(params.get("shift_first"))
    if not device.host_resident:
        a = device.cast(arrays[0], dt)
        if state is None:
            state = {"g": device.zeros((a.shape[1], a.shape[1]), dt)}
            if shift:
                state["v"] = device.zeros((a.shape[1],), dt)
        if shift:  # element-wise work on the compute stream, ordered with the SYRK
            with device.on_compute():
                first = a[:, 0].copy()
                a = a - first[:, None]
                state["v"] += (a.conj().T if a.dtype.kind == "c" else a.T) @ first
        device.syrk_acc(state["g"], a)
        if rows.stop in params["ends"]:
            state = {name: device.to_host(v) for name, v in state.items()}
        return state, None
    # Entries beyond 2^256 overflow these sums only in the pass that learns max|a|, which is made again
    # scaled (linalg.blocks.scaling): NumPy's warnings would only alarm.
    if shift:  # the cast copy holds the shifted strip
        first = np.asarray(arrays[0][:, 0], dtype=dt)
        with np.errstate(over="ignore", invalid="ignore"):
            a = np.subtract(arrays[0], first[:, None], dtype=dt)
    else:
        a = arrays[0]  # cast (where its dtype is not the sum's) block by block inside syrk_acc
    if state is None:
        state = {"g": np.zeros((a.shape[1], a.shape[1]), dt)}
        if shift:
            state["v"] = np.zeros(a.shape[1], dt)
    if shift:
        with np.errstate(over="ignore", invalid="ignore"):
            state["v"] += (a.conj().T if a.dtype.kind == "c" else a.T) @ first
    syrk_acc(state["g"], a)
    return state, None


def sum_gram_states(states: list) -> np.ndarray:
    """The full symmetric float64 Gram (Hermitian complex128 of complex data) from the pass's task states: their lower triangles summed in row
    order (deterministic on every scheduler), each released as it is added (the first one is the
    total when it is float64 and writable: a state from a cluster may be a read-only buffer), then
    mirrored."""
    total = None
    while states:
        g = states.pop(0)["g"]
        g = np.asarray(g, dtype=np.complex128 if np.asarray(g).dtype.kind == "c" else np.float64)
        if total is None:
            total = g if g.flags.writeable else g.copy()
        else:
            np.add(total, g, out=total)
    return symmetrize_lower(total)
