"""Tall blocks: a stored ``M x c`` block and the passes over it, or the same interface in memory.

The randomized SVD and the sketch write ``Y = B Q`` (``M x c``, ``c`` small) and orthonormalize it
through its R factor (:func:`blocklin.linalg.blocks.orth.cholqr_r`); every step is one pass over ``Y``:
its Gram matrix after applying triangular factors, its R factor by TSQR, or ``Y W1 W2 ...`` written
to an output. :class:`TallBlock` runs these passes over a stored block, :class:`ArrayBlock` computes
them on an in-memory block (a matrix that fits the budget), :class:`DeviceBlock` on a block kept on
a GPU (the in-core SVD with ``device="gpu"``), so the algorithms are written once. Complex blocks
give ``Y^H Y`` and a complex128 ``R`` (LAPACK's conventions).
:func:`load_tall` reads a whole operand into memory in one pass.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from blocklin.linalg.blocks.tall_kernels import apply_kernel, load_kernel
from blocklin.linalg.blocks.tsqr import positive_diagonal, reduce_r, tsqr_kernel
from blocklin.runtime.passes import collect_rows, plan_kernel_pass, reduce_sum, run_pass, source, stored
from blocklin.storage import create_array, write_array


class TallBlock:
    """A stored tall block (``M x c`` zarr array, chunks of ``chunk_rows`` rows) and the passes over it.

    Every pass is counted by the job as a pass over an intermediate and planned within ``memory``.
    """

    def __init__(self, job: Any, path: str, M: int, c: int, dtype: Any, chunk_rows: int, memory: int) -> None:
        self.job, self.path, self.M, self.c = job, path, M, c
        self.dtype = np.dtype(dtype)
        self.memory = memory
        self.source = stored(path, (M, c), self.dtype, (chunk_rows, c))

    def _run(self, kernel: Any, params: dict, description: str, **kw: Any) -> list:
        states, _ = run_pass(self.job, kernel, [self.source], params, memory=self.memory, over="intermediate",
                             description=description, **kw)
        return states

    def gram_after(self, ws: list) -> np.ndarray:
        """``(Y W1 W2 ...)^H (Y W1 W2 ...)`` (one pass over Y)."""
        ws = [w.astype(self.dtype) for w in ws]
        states = self._run(apply_kernel, {"W": ws, "gram": True}, "orthonormalize: CholeskyQR refinement")
        return reduce_sum(states, "G")

    def tsqr(self) -> np.ndarray:
        """R of Y by streaming Householder QR in float64 or complex128 (one pass), with a non-negative diagonal."""
        states = self._run(tsqr_kernel, {"dtype": _work(self.dtype).name}, "orthonormalize: TSQR")
        return positive_diagonal(reduce_r(states, self.c)[: self.c])

    def settled(self, w: np.ndarray) -> tuple["TallBlock", np.ndarray]:
        """``Y W`` written to a scratch store, and its Gram matrix from the same bits (one pass): the block
        later passes read in place of recomputing ``Y W`` (:func:`blocklin.linalg.blocks.orth.cholqr_r`)."""
        ws = [w.astype(self.dtype)]
        c = w.shape[1]
        params = {"W": ws, "write": "F", "gram": True}
        # strips (the copy's chunks) no taller than Y's chunks: the passes over the copy then need no more
        # memory than those over Y that the budget was planned for
        plan = plan_kernel_pass(self.job, apply_kernel, [self.source], params, memory=self.memory,
                                max_strip=self.source.chunk_rows)
        path = self.job.scratch("Q", (self.M, c), self.dtype, (plan.strip, c))
        states = self._run(apply_kernel, params, "orthonormalize: CholeskyQR, Y R^-1 written", plan=plan,
                           outputs=(("F", path),))
        return TallBlock(self.job, path, self.M, c, self.dtype, plan.strip, self.memory), reduce_sum(states, "G")

    def apply_to(self, ws: list, out_path: str | None, *, transposed_out: bool = False,
                 description: str = "write factor", collect: bool = False) -> np.ndarray | None:
        """Write ``Y W1 W2 ...`` (applied in sequence) to ``out_path`` (transposed when asked), or return it."""
        ws = [w.astype(self.dtype) for w in ws]
        c = ws[-1].shape[1]
        params = {"W": ws, "write": "F" if out_path else None, "collect": collect}
        plan = plan_kernel_pass(self.job, apply_kernel, [self.source], params, memory=self.memory)
        if out_path:
            shape, chunks = ((c, self.M), (c, plan.strip)) if transposed_out else ((self.M, c), (plan.strip, c))
            create_array(out_path, shape=shape, dtype=self.dtype, chunks=chunks, codec="none")
        states = self._run(apply_kernel, params, description, plan=plan, outputs=(("F", out_path),) if out_path else (),
                           transposed_outputs=("F",) if transposed_out else ())
        return collect_rows(states, self.M, c) if collect else None


class ArrayBlock:
    """An in-memory tall block with the interface of :class:`TallBlock`."""

    def __init__(self, y: np.ndarray) -> None:
        self.y = y
        self.M, self.c = y.shape
        self.dtype = y.dtype

    def _chain(self, ws: list) -> np.ndarray:
        t = self.y
        for w in ws:
            t = t @ w.astype(self.y.dtype)
        return t

    def gram_after(self, ws: list) -> np.ndarray:
        t = self._chain(ws)
        return (t.conj().T @ t).astype(_work(t.dtype))

    def tsqr(self) -> np.ndarray:
        return positive_diagonal(np.linalg.qr(self.y.astype(_work(self.dtype)), mode="r"))

    def apply_to(self, ws: list, out_path: str | None, *, transposed_out: bool = False,
                 description: str = "", collect: bool = False) -> np.ndarray:
        f = self._chain(ws)
        if out_path:
            write_array(out_path, np.ascontiguousarray(f.T if transposed_out else f))
        return f


class DeviceBlock:
    """A tall block kept where a device computes (in-core SVD on a GPU): :class:`ArrayBlock`'s interface,
    its products (GEMM), Gram matrices (SYRK) and R factor (cuSOLVER QR) computed by the device; only
    the small ``c x c`` results and the written factor come to the host."""

    def __init__(self, device: Any, y: Any) -> None:
        self.dev, self.y = device, y
        self.M, self.c = y.shape
        self.dtype = np.dtype(y.dtype)

    def _chain(self, ws: list) -> Any:
        d, t = self.dev, self.y
        for w in ws:
            out = d.zeros((t.shape[0], w.shape[1]), t.dtype)
            d.gemm_acc(out, t, d.to_device(np.asarray(w, dtype=t.dtype)))
            t = out
        return t

    def gram_after(self, ws: list) -> np.ndarray:
        t = self._chain(ws)
        g = self.dev.zeros((t.shape[1], t.shape[1]), t.dtype)
        self.dev.syrk_acc(g, t)
        return np.asarray(self.dev.to_host(g), dtype=_work(t.dtype))

    def tsqr(self) -> np.ndarray:
        d = self.dev
        return positive_diagonal(np.asarray(d.to_host(d.qr_r(d.cast(self.y, _work(self.dtype))))))

    def apply_to(self, ws: list, out_path: str | None, *, transposed_out: bool = False,
                 description: str = "", collect: bool = False) -> np.ndarray:
        f = np.asarray(self.dev.to_host(self._chain(ws)))
        if out_path:
            write_array(out_path, np.ascontiguousarray(f.T if transposed_out else f))
        return f


def _work(dtype: Any) -> np.dtype:
    """float64, or complex128 for complex data: the precision of the small results."""
    return np.dtype(np.complex128 if np.dtype(dtype).kind == "c" else np.float64)


def load_tall(job: Any, A: Any, *, transposed: bool, memory: int, description: str) -> np.ndarray:
    """Read ``A`` (or ``A^T``, streamed as column strips) into memory in one pass over ``A``."""
    src = source(A, transposed=transposed)
    states, _ = run_pass(job, load_kernel, [src], {}, memory=memory, description=description)
    b = np.empty((src.rows, src.width), dtype=A.dtype)
    for st in states:
        for r0, blk in st or []:
            b[r0:r0 + blk.shape[0]] = blk
    return b
