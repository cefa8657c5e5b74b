"""Row-pass kernels over tall blocks: ``B Q``, ``B^T (B Q)``, ``X W``, ``X^T Y``, sketches, loads.

They serve the SVD, Lanczos/eigsh, the orthonormalization of tall blocks and the LinearOperator.
Every kernel has the row-pass signature ``kernel(device, arrays, rows, params, state) -> (state,
writes)`` (see :mod:`blocklin.runtime.passes`) and declares, with :func:`~blocklin.runtime.passes.row_kernel`,
the memory one task allocates; products go through the device (``gemm_acc``) so the same kernels
run on a GPU. Broadcast operands in ``params`` are uploaded once per task by the matching
``init``; when a task reaches the last strip of its group (``rows.stop in params["ends"]``) its
accumulators are brought back to host memory, so partial states are plain NumPy arrays whatever
the device and scheduler.

Memory declarations count, per task, the broadcast operands and their device copies and the
accumulators (``fixed``), and per strip row the products and blocks being written (``per_row``);
zarr's chunk temporaries are counted by the planner (``chunk_temporaries``).

Complex data: the products with ``B^H`` accumulate ``B^T conj(X)`` (a conjugated copy of the narrow
block, never of the strip) and are conjugated once at the end of a group (:func:`_finish_conj`),
Gram matrices ``Y^H Y`` go through the device's HERK (``syrk_acc``), and the sketch's co-range test
matrix is the conjugate of the generated rows.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from blocklin.errors import InternalError
from blocklin.linalg.blocks.random import (SKETCH_RNG_BLOCK, STREAM_PHI, STREAM_UPSILON, block_bytes, row_test_bytes,
                                           row_test_rows, sketch_test_matrices)
from blocklin.plan.passes import PassMemory
from blocklin.runtime.passes import row_kernel

#: Host bytes of a float64 temporary element.
F64 = 8


# -- device helpers ------------------------------------------------------------------------------
def upload(device: Any, x: np.ndarray) -> Any:
    """``x`` on the device (the host array itself on a CPU)."""
    x = np.ascontiguousarray(x)
    if device.host_resident:
        return x
    d = device.zeros(x.shape, x.dtype)
    device.axpby(d, 0.0, x, 1.0)
    return d


def to_host(device: Any, x: Any) -> np.ndarray:
    """A host NumPy copy of a device array (``x`` itself on a CPU)."""
    if x is None or isinstance(x, np.ndarray):
        return x
    return np.array(device.download(x, slice(0, x.shape[0])))


def _zero(device: Any, buf: Any) -> None:
    if device.host_resident:
        buf[...] = 0
    else:
        device.axpby(buf, 0.0, None, 0.0)


def _accumulator(device: Any, shape: tuple[int, int], dtype: Any) -> Any:
    """A zeroed ``Z += B_i^T X_i`` accumulator: column-major on the host, where that product is a
    plain GEMM into BLAS's own layout (one thread, 2048 x 500 strip, 30 columns: 45-47 GFLOP/s
    against 29-31 into a row-major ``Z``)."""
    if device.host_resident:
        return np.zeros(shape, dtype=dtype, order="F")
    return device.zeros(shape, dtype)


def _strip_rows(buf: Any, r: int, c: int) -> Any:
    """The first ``r`` rows of a strip buffer: a row slice of a 2-D buffer, or of a flat host buffer
    the ``r x c`` column-major block at its start."""
    if buf.ndim == 2:
        return buf[:r]
    return buf[: r * c].reshape(c, r).T


def _product(device: Any, out: Any, a: Any, b: Any) -> None:
    """``out = a @ b`` into a reused strip buffer: on the host one BLAS call with ``beta = 0`` (the
    same bits as accumulating into zeros, without the zeroing pass over the buffer)."""
    if device.host_resident:
        device.gemm_into(out, a, b)
    else:
        _zero(device, out)
        device.gemm_acc(out, a, b)


def _finish(device: Any, rows: slice, params: dict, state: dict, keep: tuple[str, ...]) -> dict:
    """At the end of a group: keep only the accumulators, on the host."""
    if rows.stop in params["ends"]:
        return {name: to_host(device, state[name]) for name in keep if state.get(name) is not None} | (
            {"blocks": state["blocks"]} if "blocks" in state else {})
    return state


def _complex(dtype: Any) -> bool:
    return np.dtype(dtype).kind == "c"


def _conj_into(device: Any, out: Any, x: Any) -> Any:
    """``out = conj(x)`` (``out`` a buffer of ``x``'s shape), where the device computes."""
    if device.host_resident:
        return np.conjugate(x, out=out)
    with device.on_compute():  # ordered with the product that made x (a narrow temporary)
        out[...] = x.conj()
    return out


def _gram_acc(device: Any, g: Any, y: Any) -> None:
    """``G += Y^T Y``, or ``Y^H Y`` (HERK) of complex data."""
    if _complex(y.dtype):
        device.syrk_acc(g, y)
    else:
        device.gemm_acc(g, y.T, y)


def _finish_conj(done: dict, rows: slice, params: dict, names: tuple[str, ...]) -> dict:
    """At the end of a group, the conjugates of the accumulated ``B^T conj(X)``: ``B^H X`` (host arrays)."""
    if rows.stop in params["ends"]:
        for name in names:
            if isinstance(done.get(name), np.ndarray) and _complex(done[name].dtype):
                np.conjugate(done[name], out=done[name])
    return done


# -- centering: B_c = diag(r) (B - a b^T) diag(c) as a rank-one correction (blocklin.linalg.blocks.center) --
def shift_init(device: Any, params: dict, st: dict, dtype: Any) -> dict:
    """Upload the per-row vectors of the correction once per task: ``a`` (or a strip of ones) and ``r``."""
    if params.get("shifted"):
        a = params.get("shift_a")
        st["sa"] = upload(device, a) if a is not None else upload(device, np.ones((params["strip"], 1), dtype))
        st["sa_rows"] = a is not None
    if params.get("shift_r") is not None:
        st["sr"] = upload(device, params["shift_r"])
    return st


def shift_memory(params: Any, w: int, c: int) -> tuple[int, int]:
    """``(fixed, per_row)`` bytes of the correction's vectors (host and device copies) and buffers."""
    fixed = per_row = 0
    for key in ("shift_a", "shift_r"):
        if params.get(key) is not None:
            fixed += 2 * params[key].nbytes
    if params.get("shifted") and params.get("shift_a") is None:
        per_row += 2 * w  # the strip of ones
    if params.get("shift_r") is not None:
        per_row += c * w  # the row-scaled copy of the product
    return fixed, per_row


def _a_rows(state: dict, rows: slice) -> Any:
    return state["sa"][rows] if state["sa_rows"] else state["sa"][: rows.stop - rows.start]


def correct(device: Any, y: Any, rows: slice, state: dict, beta: Any) -> None:
    """``y = r_rows * (y - a_rows beta)`` in place: ``y = B_i diag(c) Q`` becomes ``(B_c Q)_i``."""
    if beta is not None:
        device.gemm_acc(y, _a_rows(state, rows), beta, alpha=-1.0)  # inner dimension 1: the rank-one term
    if "sr" in state:
        _host_only(device)
        y *= state["sr"][rows]  # row scale (B = A^T standardized)


def _host_only(device: Any) -> None:
    # a row scale has no device operation (a GEMM with diag(r) would cost strip^2 columns): the
    # caller runs such passes on the CPU (blocklin.linalg.lowrank.sources.Streamed)
    if not device.host_resident:
        raise InternalError("a row-scaled (standardized wide) pass must run on the CPU device")


def _row_scaled(device: Any, y: Any, rows: slice, state: dict) -> Any:
    """``r_rows * y`` (``y`` itself without a row scale), in the task's buffer."""
    if "sr" not in state:
        return y
    _host_only(device)
    w = state["Wbuf"][: y.shape[0]]
    _zero(device, w)
    w += y
    w *= state["sr"][rows]
    return w


# -- normal pass: Z = B^T (B Q), optionally writing Y = B Q and accumulating G = Y^T Y -------------
def normal_init(device: Any, params: dict) -> dict:
    q = params["Q"]
    l = q.shape[1]
    dt = q.dtype
    st = {"Q": upload(device, q), "G": device.zeros((l, l), dt) if params.get("gram") else None}
    if device.host_resident and not params.get("write_y"):
        # Column-major Y_i and Z on the host: B_i Q and B_i^T Y_i are then the GEMMs OpenBLAS runs
        # fastest (tall by narrow, no transposed output). Measured on one thread (2048 x 500 strip,
        # Q 500 x 30, loaded 2-core machine): 29-33 GFLOP/s against 14-22 for row-major Y_i and Z.
        st["Ybuf"] = np.empty(params["strip"] * l, dtype=dt)
    elif device.host_resident:
        # Y_i written: row-major, the chunks' own layout. A column-major Y_i is gathered into rows for
        # each chunk it writes, which cost more than its faster products: one thread, per GiB of a 64-column
        # float32 B (Q 64 x 20), 0.38 s row-major against 0.48 s column-major plus 0.28 s gathering; 0.16-0.20 s
        # either way at 500 columns (float64, Q 500 x 30) (Z stays column-major)
        st["Ybuf"] = np.empty((params["strip"], l), dtype=dt)
    else:
        st["Ybuf"] = device.zeros((params["strip"], l), dt)
    if _complex(dt):  # conj(B Q) for B^T conj(Y): the conjugate of B^H Y
        st["Cbuf"] = device.zeros((params["strip"], l), dt)
    st["Z"] = _accumulator(device, (q.shape[0], l), dt)
    if params.get("shifted"):
        st["beta"] = upload(device, params["beta"])
        st["T"] = device.zeros((1, l), dt)
    if params.get("shift_r") is not None:
        st["Wbuf"] = device.zeros((params["strip"], l), dt)
    return shift_init(device, params, st, dt)


def _normal_memory(params: Any, sources: tuple) -> PassMemory:
    n, c = params["Q"].shape
    w = params["Q"].dtype.itemsize
    sf, sp = shift_memory(params, w, c)
    sp += c * w if _complex(params["Q"].dtype) else 0  # the conjugated product
    return PassMemory(fixed=2 * n * c * w + c * c * w + sf + 4 * c * w, per_row=2 * c * w + sp, chunk_temporaries=True,
                      write_row_bytes=c * w if params.get("write_y") else 0)


@row_kernel(memory=_normal_memory, init=normal_init, read_only=True)
def normal_kernel(device: Any, arrays: tuple, rows: slice, params: dict, state: dict) -> tuple[dict, dict | None]:
    """``Y_i = B_i Q``; ``Z += B_i^T Y_i``; ``G += Y_i^T Y_i`` (gram); write ``Y_i`` (write_y).

    Centered (``shifted``): ``Y_i = r_i (B_i Q - a_i beta)`` and ``Z += B_i^T (r_i Y_i)``,
    ``T += a_i^T (r_i Y_i)``, from which the caller forms ``B_c^T Y`` (:meth:`Shift.finish`).
    Complex: ``Z = B^H Y``, ``G = Y^H Y`` (and ``T = a^H (r Y)``)."""
    b = arrays[0]
    r = rows.stop - rows.start
    y = _strip_rows(state["Ybuf"], r, state["Q"].shape[1])
    _product(device, y, b, state["Q"])
    correct(device, y, rows, state, state.get("beta"))
    w = _row_scaled(device, y, rows, state)
    if "Cbuf" in state:
        w = _conj_into(device, state["Cbuf"][:r], w)
    device.gemm_acc(state["Z"], b.T, w)
    if "T" in state:
        device.gemm_acc(state["T"], _a_rows(state, rows).T, w)
    if state["G"] is not None:
        _gram_acc(device, state["G"], y)
    writes = {"Y": device.download(y, slice(0, r))} if params.get("write_y") else None
    return _finish_conj(_finish(device, rows, params, state, ("Z", "G", "T")), rows, params, ("Z", "T")), writes


# -- apply pass: Y = X W1 W2 ... (X = B or a stored tall block), written, collected, or reduced to Y^T Y --
def _chain(params: dict) -> list:
    ws = params["W"]
    return list(ws) if isinstance(ws, (list, tuple)) else [ws]


def apply_init(device: Any, params: dict) -> dict:
    ws = _chain(params)
    dt = ws[0].dtype
    c = ws[-1].shape[1]
    st = {"W": [upload(device, w) for w in ws],
          "bufs": [device.zeros((params["strip"], w.shape[1]), dt) for w in ws],
          "G": device.zeros((c, c), dt) if params.get("gram") else None}
    if params.get("collect"):
        st["blocks"] = []
    if params.get("shifted"):
        st["beta"] = upload(device, params["beta"])
    return shift_init(device, params, st, dt)


def _apply_memory(params: Any, sources: tuple) -> PassMemory:
    ws = _chain(params)
    c = sum(w.shape[1] for w in ws)
    w = ws[0].dtype.itemsize
    sf, sp = shift_memory(params, w, 0)
    return PassMemory(fixed=sources[0].width * c * w + c * c * w + sf + 2 * c * w, per_row=3 * c * w + sp,
                      chunk_temporaries=True, write_row_bytes=c * w if params.get("write") else 0)


@row_kernel(memory=_apply_memory, init=apply_init, read_only=True)
def apply_kernel(device: Any, arrays: tuple, rows: slice, params: dict, state: dict) -> tuple[dict, dict | None]:
    """``Y_i = X_i W1 W2 ...`` (applied in sequence: CholeskyQR2 needs ``(Y R1^-1) R2^-1``, not
    ``Y (R1^-1 R2^-1)``); write it as ``params["write"]``, collect it, and/or accumulate ``G += Y_i^T Y_i``
    (``Y_i^H Y_i`` of complex data)."""
    x = arrays[0]
    r = rows.stop - rows.start
    for i, (w, buf) in enumerate(zip(state["W"], state["bufs"])):
        y = buf[:r]
        _product(device, y, x, w)
        if i == 0 and (params.get("shifted") or params.get("shift_r") is not None):
            correct(device, y, rows, state, state.get("beta"))  # the centered B_c W1 (W1 premultiplied by c)
        x = y
    if state["G"] is not None:
        _gram_acc(device, state["G"], y)
    writes = None
    if params.get("write") or params.get("collect"):
        host = device.download(y, slice(0, r))
        if params.get("collect"):
            state["blocks"].append((rows.start, np.array(host)))
        if params.get("write"):
            writes = {params["write"]: host}
    return _finish(device, rows, params, state, ("G",)), writes


# -- transposed apply: Z = X^T Y for a broadcast tall Y (operator rmatmat, eigsh) ------------------
def rmat_init(device: Any, params: dict) -> dict:
    y = params["Y"]
    st = {"Yd": upload(device, y), "Z": _accumulator(device, (params["n"], y.shape[1]), y.dtype)}
    if params.get("check"):
        st["blocks"] = []
        st["Cbuf"] = device.zeros((params["strip"], y.shape[1]), y.dtype)
    return st


def _rmat_memory(params: Any, sources: tuple) -> PassMemory:
    m, c = params["Y"].shape
    w = params["Y"].dtype.itemsize
    # the broadcast Y and its upload, and the accumulator
    return PassMemory(fixed=2 * m * c * w + sources[0].width * c * w, per_row=2 * c * w, chunk_temporaries=True,
                      write_row_bytes=0)


@row_kernel(memory=_rmat_memory, init=rmat_init, read_only=True)
def rmat_kernel(device: Any, arrays: tuple, rows: slice, params: dict, state: dict) -> tuple[dict, None]:
    """``Z += X_i^T Y[rows]``; with ``check`` (square X) also collect ``(X Y)[rows] = X_i Y``."""
    x = arrays[0]
    device.gemm_acc(state["Z"], x.T, state["Yd"][rows])
    if params.get("check"):
        r = rows.stop - rows.start
        c = state["Cbuf"][:r]
        _product(device, c, x, state["Yd"])
        state["blocks"].append((rows.start, np.array(device.download(c, slice(0, r)))))
    return _finish(device, rows, params, state, ("Z",)), None


# -- single-pass sketch (Tropp, Yurtsever, Udell, Cevher 2019) -------------------------------------
def sketch_init(device: Any, params: dict) -> dict:
    """Generate the task's ``[Omega | Psi]`` from the seed (centered: scaled by ``c``, with the offsets
    ``b^T diag(c) [Omega | Psi]``), its accumulators, strip buffers and row generators (``generator``:
    the version of the test matrices the sketch draws, :func:`~blocklin.linalg.blocks.random.row_test_rows`)."""
    n, kp, s = params["N"], params["kp"], params["s"]
    dt = np.dtype(params["dtype"])
    st = params["strip"]
    gen = params.get("generator")  # None: the current one
    op = sketch_test_matrices(params["seed"], n, kp, s, dt, generator=gen)
    if params.get("shift_c") is not None:
        op *= params["shift_c"].astype(dt)[:, None]
    state = {"OP": upload(device, op), "Xt": _accumulator(device, (n, kp), dt), "PZ": device.zeros((s, kp + s), dt),
             "G": device.zeros((kp, kp), dt), "YT": device.zeros((st, kp + s), dt),
             "Ub": np.empty((st, kp), dt), "Pb": np.empty((st, s), dt),
             "ups": row_test_rows(params["seed"], STREAM_UPSILON, kp, complex=_complex(dt), generator=gen),
             "phi": row_test_rows(params["seed"], STREAM_PHI, s, complex=_complex(dt), generator=gen)}
    if device.host_resident:  # Y's rows copied out of [Y T] once: contiguous for its Gram and its write
        state["Yc"] = np.empty((st, kp), dt)
    if params.get("y_chunk", 0) > st:  # Y's rows gathered into whole chunks of Y (see sketch_kernel)
        state["Yw"], state["w0"], state["wn"] = np.empty((params["y_chunk"], kp), dt), 0, 0
    if params.get("shifted"):
        # b^T diag(c) [Omega | Psi] in float64 (complex128), a block of rows at a time
        acc = np.complex128 if _complex(dt) or np.iscomplexobj(params["shift_b"]) else np.float64
        beta = np.zeros((1, kp + s), acc)
        for r0 in range(0, n, SKETCH_RNG_BLOCK):
            beta += params["shift_b"][None, r0:r0 + SKETCH_RNG_BLOCK] @ op[r0:r0 + SKETCH_RNG_BLOCK].astype(acc)
        state["beta"] = upload(device, beta.astype(dt))
        state["TX"] = device.zeros((1, kp), dt)
    del op
    return shift_init(device, params, state, dt)


def _sketch_memory(params: Any, sources: tuple) -> PassMemory:
    n, c, s = params["N"], params["kp"], params["s"]
    w = np.dtype(params["dtype"]).itemsize
    sf, sp = shift_memory(params, w, 0)
    # [Omega | Psi] (generated on the host, then moved to the device's own memory), X^T, Phi [Y T],
    # Y^T Y; the two row generators' blocks (float64; and the generation of [Omega | Psi], one block at a
    # time, before them) and, centered, b and c and the offsets
    fixed = (n * (c + s) + n * c + s * (c + s) + c * c + 4 * (c + s)) * w
    cplx = _complex(np.dtype(params["dtype"]))
    acc = 2 * F64 if cplx else F64  # complex128 offsets of complex data
    gen = params.get("generator")
    fixed += max(block_bytes(c, cplx, gen) + block_bytes(s, cplx, gen),  # [Omega | Psi]'s generation
                 row_test_bytes(c, cplx, gen) + row_test_bytes(s, cplx, gen))
    fixed += (n * (F64 + acc) if params.get("shifted") else 0) + sf
    # the buffer gathering Y's rows into chunks, and zarr's three copies of one where writes are not direct
    fixed += params.get("y_buffer", 0) * (4 if params.get("y_temporaries") else 1)
    # per row: [Y T] (and its device copy of the written Y, or on the host Y's contiguous copy), the
    # Upsilon and Phi rows and their device copies
    return PassMemory(fixed=fixed, per_row=(2 * (c + s) + c) * w + sp, chunk_temporaries=True,
                      write_row_bytes=c * w)  # Y


@row_kernel(memory=_sketch_memory, init=sketch_init)
def sketch_kernel(device: Any, arrays: tuple, rows: slice, params: dict, state: dict) -> tuple[dict, dict]:
    """One strip of the three sketches: ``Y = B Omega`` (written), ``X^T = B^T Upsilon^T``,
    ``Phi [Y T]`` with ``T = B Psi`` (the core sketch ``Z = Phi T``, and ``Phi Y``), ``Y^T Y``.

    One product ``B_i [Omega | Psi]`` makes ``Y_i`` and ``T_i``; the rows of ``Upsilon^T`` and
    ``Phi^T`` come from the task's row generators, which make each block of rows once whatever
    the strip height. Complex: ``X^H = B^H conj(Ups^T)`` (accumulated as ``B^T Ups^T`` and conjugated at
    the end of the group) and ``G = Y^H Y``."""
    b = arrays[0]
    r0, r1 = rows.start, rows.stop
    r, kp = r1 - r0, params["kp"]
    yt = state["YT"][:r]
    _product(device, yt, b, state["OP"])
    correct(device, yt, rows, state, state.get("beta"))
    # Upsilon and Phi are indexed by the stored row (``row0``: where a pass over appended rows starts), so
    # the sketch of new rows alone adds exactly the terms a sketch of the grown matrix has for them
    g0 = params.get("row0", 0)
    ups_h = state["ups"].rows(g0 + r0, g0 + r1, out=state["Ub"][:r])
    if params.get("shift_r") is not None:  # B_c^T Ups = diag(c) (B^T (r Ups) - b (a^T r Ups))
        ups_h *= params["shift_r"][rows]
    ups = upload(device, ups_h)
    phi = upload(device, state["phi"].rows(g0 + r0, g0 + r1, out=state["Pb"][:r]))
    device.gemm_acc(state["Xt"], b.T, ups)
    if "TX" in state:
        device.gemm_acc(state["TX"], _a_rows(state, rows).T, ups)
    device.gemm_acc(state["PZ"], phi.T, yt)
    y = yt[:, :kp]
    if "Yc" in state:  # one copy: BLAS takes no strided operand (the Gram copied y twice) nor writev strided rows
        y = state["Yc"][:r]
        np.copyto(y, yt[:, :kp])
    _gram_acc(device, state["G"], y)
    out = y if "Yc" in state else device.download(yt, slice(0, r))[:, :kp]
    if "Yw" in state:  # strips shorter than Y's chunks: gather them, write each chunk once, whole
        if state["wn"] == 0:
            state["w0"] = r0
        state["Yw"][state["wn"]:state["wn"] + r] = out
        state["wn"] += r
        if state["wn"] < state["Yw"].shape[0] and r1 not in params["ends"]:
            return state, None
        out, state["wn"] = (state["w0"], state["Yw"][:state["wn"]]), 0
    done = _finish(device, rows, params, state, ("Xt", "PZ", "G", "TX"))
    return _finish_conj(done, rows, params, ("Xt", "TX")), {"Y": out}


# -- whole-matrix load (the in-core path: a matrix that fits the budget is read once) -------------
def _load_memory(params: Any, sources: tuple) -> PassMemory:
    return PassMemory(fixed=0, per_row=sources[0].row_bytes, chunk_temporaries=True)  # the kept copy of each strip


@row_kernel(memory=_load_memory, device="cpu")  # a read: through a GPU it would go there and straight back
def load_kernel(device: Any, arrays: tuple, rows: slice, params: dict, state: Any) -> tuple[Any, None]:
    """Keep every strip: the per-group states are ``[(first row, block), ...]``."""
    blocks = state or []
    blk = arrays[0] if device.host_resident else device.download(arrays[0], slice(0, rows.stop - rows.start))
    blocks.append((rows.start, np.ascontiguousarray(blk).copy() if not blk.flags.c_contiguous else np.array(blk)))
    return blocks, None
