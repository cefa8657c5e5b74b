"""Row-pass kernels of the normal equations: the Gram pass and the refinement (residual) pass.

Each kernel is ``kernel(device, arrays, rows, params, state) -> (state, writes)`` (see
:mod:`blocklin.runtime.passes`): ``arrays`` are the strip's blocks of ``A`` and ``B``, the state
is a small dict of host arrays that the caller reduces in row order. On the CPU they use NumPy and
BLAS (the Gram update is a BLAS ``syrk``, half the flops of a GEMM); on a GPU the states stay on the
device (cuBLAS SYRK/GEMM through the device's operations, on its compute stream) and come to the
host at the end of each task's group of strips (``params["ends"]``). The caller chooses the device
(:func:`blocklin.device.pass_device`). The streaming QR pass is :mod:`blocklin.linalg.blocks.tsqr`.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from blocklin.linalg.blocks.syrk import syrk_acc
from blocklin.linalg.blocks.tsqr import MAX_STRIP_BYTES, MIN_STRIP_ROWS
from blocklin.plan.passes import PassMemory
from blocklin.runtime.passes import row_kernel


def _gram_memory(params: Any, sources: tuple) -> PassMemory:
    isz = np.dtype(params["dtype"]).itemsize
    n, k = sources[0].width, sum(s.width for s in sources[1:])
    # the Gram and A^T B accumulators; per row a cast copy of [A B]
    return PassMemory(fixed=(n * n + n * k) * isz, per_row=(n + k) * isz, max_strip_bytes=MAX_STRIP_BYTES,
                      min_rows=MIN_STRIP_ROWS)


def _group_end(device: Any, rows: slice, params: Any, state: dict) -> dict:
    """On a GPU, the task's last strip brings the state to the host for the reduction."""
    if rows.stop in params["ends"]:
        return {name: device.to_host(v) for name, v in state.items() if name != "xd"}
    return state


@row_kernel(memory=_gram_memory, device="any")
def gram_kernel(device: Any, arrays: tuple, rows: slice, params: Any, state: dict | None) -> tuple[dict, None]:
    """Accumulate ``A^T A`` (lower triangle; both on a GPU), ``A^T B`` and ``||B_j||^2``."""
    if not device.host_resident:
        dt = np.dtype(params["dtype"])
        a = device.cast(arrays[0], dt)
        b = device.cast(arrays[1], dt) if len(arrays) > 1 else None
        if state is None:
            n, k = a.shape[1], (b.shape[1] if b is not None else 0)
            state = {"g": device.zeros((n, n), dt), "c": device.zeros((n, k), dt), "bb": device.zeros((k,), np.float64)}
        device.syrk_acc(state["g"], a)
        if b is not None:
            device.gemm_acc(state["c"], a.T, b)
            device.sumsq_cols_acc(state["bb"], b)
        return _group_end(device, rows, params, state), None
    a = np.asarray(arrays[0], dtype=params["dtype"])
    b = np.asarray(arrays[1], dtype=params["dtype"]) if len(arrays) > 1 else None
    if state is None:
        n = a.shape[1]
        k = b.shape[1] if b is not None else 0
        state = {"g": np.zeros((n, n), params["dtype"]), "c": np.zeros((n, k), params["dtype"]),
                 "bb": np.zeros(k)}
    syrk_acc(state["g"], a)
    if b is not None:
        # Entries beyond 2^256 overflow here only in the pass that learns max|a| and |b|, which the
        # solve repeats scaled (linalg.scaling); an overflow that stayed would reach x as Inf/NaN,
        # which the solve refuses, so NumPy's warning would only alarm.
        with np.errstate(over="ignore", invalid="ignore"):
            state["c"] += a.T @ b
        state["bb"] += np.einsum("ij,ij->j", b, b, dtype=np.float64)
    return state, None  # ||A||_F^2 is the trace of the Gram matrix: no extra sweep


def _residual_memory(params: Any, sources: tuple) -> PassMemory:
    isz = np.dtype(params["dtype"]).itemsize
    n, k = sources[0].width, sum(s.width for s in sources[1:])
    # the broadcast x and the A^T r accumulator; per row cast copies of [A B] and r, A x
    return PassMemory(fixed=2 * n * k * isz, per_row=(n + 3 * k) * isz, max_strip_bytes=MAX_STRIP_BYTES,
                      min_rows=MIN_STRIP_ROWS)


@row_kernel(memory=_residual_memory, device="any")
def residual_kernel(device: Any, arrays: tuple, rows: slice, params: Any, state: dict | None) -> tuple[dict, None]:
    """``r = B - A X`` per strip: accumulate ``A^T r`` and ``||r_j||^2`` (refinement against the data)."""
    if not device.host_resident:
        dt = np.dtype(params["dtype"])
        a = device.cast(arrays[0], dt)
        if state is None:
            x = params["x"]
            state = {"atr": device.zeros(x.shape, dt), "rr": device.zeros((x.shape[1],), np.float64),
                     "xd": device.to_device(x.astype(dt, copy=False))}
        r = device.copy(device.cast(arrays[1], dt))
        device.gemm_acc(r, a, state["xd"], alpha=-1.0)
        device.gemm_acc(state["atr"], a.T, r)
        device.sumsq_cols_acc(state["rr"], r)
        return _group_end(device, rows, params, state), None
    a = np.asarray(arrays[0], dtype=params["dtype"])
    b = np.asarray(arrays[1], dtype=params["dtype"])
    x = params["x"]
    r = b - a @ x
    if state is None:
        state = {"atr": np.zeros(x.shape, params["dtype"]), "rr": np.zeros(x.shape[1])}
    state["atr"] += a.T @ r
    state["rr"] += np.einsum("ij,ij->j", r, r, dtype=np.float64)
    return state, None
