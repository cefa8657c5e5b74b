"""Orthonormalizing tall blocks: in core when they fit, else out-of-core CholeskyQR2.

A tall block ``Y`` (``M x c``, ``c`` small) is orthonormalized through its R factor, ``Q = Y R^{-1}``:

* in core (the block fits the budget): Householder QR (LAPACK);
* out of core: CholeskyQR2 (Fukaya, Nakatsukasa, Yanagisawa, Yamamoto 2014). The Gram matrix
  ``G = Y^T Y`` is usually accumulated for free by the pass that produced ``Y``; ``R1 = chol(G)``,
  then one pass over ``Y`` forms ``G2 = (Y R1^{-1})^T (Y R1^{-1})`` and ``R = chol(G2) R1``. This is
  as accurate as Householder QR when ``cond(Y) < eps^{-1/2}``. When ``chol(G)`` breaks down (the block
  is more ill-conditioned), the shifted CholeskyQR3 of Fukaya, Kannan, Nakatsukasa, Yamamoto,
  Yanagisawa (SIAM J. Sci. Comput. 2020) adds a shift ``s = 11 (M c + c (c + 1)) u ||G||`` and one more
  refinement pass; if that fails too, a streaming TSQR pass (Householder per strip, Demmel et al. 2012)
  gives ``R`` unconditionally.

All out-of-core work runs as engine row passes (:func:`blocklin.runtime.passes.run_row_pass`) whose
products go through the device.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import scipy.linalg

from blocklin.errors import ShapeError, explain
from blocklin.linalg import _svd_kernels as K
from blocklin.plan.svd import plan_kernel_pass
from blocklin.runtime.passes import RowPassSpec, run_row_pass


# -- in-core helpers ---------------------------------------------------------------------------
def orth_incore(x: np.ndarray) -> np.ndarray:
    """Orthonormal basis of the columns of ``x`` (Householder QR, float64)."""
    q, _ = np.linalg.qr(np.asarray(x, dtype=np.float64))
    return q


def orth_against(v: np.ndarray | None, x: np.ndarray, *, seed: int = 0, counter: int = 0,
                 drop: float = 1e-10) -> np.ndarray:
    """Orthonormal basis of ``(I - V V^T) x`` (block Gram-Schmidt twice, then an SVD).

    Directions that are numerically in ``span(V)`` (relative norm below ``drop``) are replaced by
    random directions (counter-based: ``(seed, counter)``), so the result always has ``x``'s width.
    """
    x = np.asarray(x, dtype=np.float64)
    n, b = x.shape
    avail = n - (v.shape[1] if v is not None else 0)
    b = min(b, avail)
    if b <= 0:
        return np.zeros((n, 0))
    x = x[:, :b] if x.shape[1] > b else x
    scale = np.linalg.norm(x, axis=0).max() or 1.0

    def project(y: np.ndarray) -> np.ndarray:
        if v is None or v.shape[1] == 0:
            return y
        for _ in range(2):
            y = y - v @ (v.T @ y)
        return y

    y = project(x)
    u, s, _ = np.linalg.svd(y, full_matrices=False)
    good = s > drop * scale
    q = u[:, good]
    if q.shape[1] < b:  # breakdown: fill with random directions orthogonal to V and q
        fill = K.gaussian(seed, K.STREAM_FILL, counter * n, (counter + 1) * n, b - q.shape[1])
        basis = q if v is None else np.hstack([v, q])
        for _ in range(2):
            fill = fill - basis @ (basis.T @ fill)
        qf, _ = np.linalg.qr(fill)
        q = np.hstack([q, qf])
    q = project(q)  # one more pass against V after normalization (keeps V q at eps)
    q, _ = np.linalg.qr(q)
    return q


def cholesky_upper(g: np.ndarray) -> np.ndarray | None:
    """Upper Cholesky factor of a symmetric ``g`` (float64), or None when it is not positive definite."""
    try:
        r = scipy.linalg.cholesky((g + g.T) / 2, lower=False, check_finite=False)
    except np.linalg.LinAlgError:
        return None
    d = np.abs(np.diag(r))
    if not np.all(np.isfinite(r)) or d.min(initial=1.0) <= 1e-300 or d.max(initial=0.0) > 1e300:
        return None
    return r


def shift_for(g: np.ndarray, m: int) -> float:
    """Shift of shifted CholeskyQR: ``11 (m c + c (c + 1)) u ||G||_2`` (Fukaya et al. 2020)."""
    c = g.shape[0]
    u = np.finfo(np.float64).eps / 2
    return 11.0 * (m * c + c * (c + 1)) * u * float(np.linalg.norm(g, 2))


# -- pass helpers shared by svd, lanczos and the LinearOperator ------------------------------------
def run_pass(job: Any, kind: str, *, inputs: tuple[str, ...], kernel: Any, params: dict, M: int, N: int, c: int,
             dtype: Any, chunk_rows: int, memory: int, init: Any = None, transposed: tuple[bool, ...] | None = None,
             outputs: tuple[tuple[str, str], ...] = (), transposed_outputs: tuple[str, ...] = (), s: int = 0,
             source_itemsize: int | None = None, description: str = "pass", plan: Any = None,
             chunk_bytes: int | None = None, chunks_across: int = 1, device: str | None = None) -> tuple[list, Any]:
    """Plan and run one kernel row pass on ``device`` (default the job's); returns ``(states, plan)``."""
    if plan is None:
        plan = plan_kernel_pass(kind, M, N, c, dtype, chunk_rows=chunk_rows, memory=memory,
                                workers=job.workers(1), cores=job.cores(), s=s, source_itemsize=source_itemsize,
                                chunk_bytes=chunk_bytes, chunks_across=chunks_across)
    params = dict(params, strip=plan.strip, ends=tuple(g[1] for g in plan.groups))
    spec = RowPassSpec(inputs=tuple(inputs), names=tuple(f"a{i}" if i else "a" for i in range(len(inputs))),
                       kernel=kernel, params=params, plan=plan, device=device or job.device,
                       device_memory=job.device_memory() if (device or job.device) == "gpu" else None,
                       check_finite=job.check_finite, outputs=tuple(outputs),
                       init=init, blas_threads=job.task_blas_threads(plan.blas_threads), transposed=transposed,
                       transposed_outputs=tuple(transposed_outputs))
    states = run_row_pass(job, spec, description=description)
    return states, plan


def reduce_sum(states: list, name: str) -> np.ndarray:
    """Sum one accumulator over the groups, in row order (deterministic)."""
    total = None
    for st in states:
        x = np.asarray(st[name], dtype=np.float64)
        total = x.copy() if total is None else total + x
    return total


def collect_rows(states: list, n_rows: int, width: int) -> np.ndarray:
    """Assemble the row blocks that kernels collected (``state["blocks"]``) into ``n_rows x width``."""
    out = np.empty((n_rows, width))
    for st in states:
        for r0, blk in st["blocks"]:
            out[r0:r0 + blk.shape[0]] = blk
    return out


class TallBlock:
    """A stored tall block (``M x c`` zarr array written by a pass) and the passes over it."""

    def __init__(self, job: Any, path: str, M: int, c: int, dtype: Any, chunk_rows: int, memory: int,
                 counter: dict) -> None:
        self.job, self.path, self.M, self.c = job, path, M, c
        self.dtype = np.dtype(dtype)
        self.chunk_rows, self.memory, self.counter = chunk_rows, memory, counter

    def _plan(self, kind: str, c: int) -> Any:
        return plan_kernel_pass(kind, self.M, self.c, c, self.dtype, chunk_rows=self.chunk_rows, memory=self.memory,
                                workers=self.job.workers(1), cores=self.job.cores())

    def _pass(self, kind: str, kernel: Any, params: dict, init: Any = None, c: int | None = None,
              outputs: tuple = (), transposed_outputs: tuple = (), description: str = "",
              plan: Any = None) -> tuple[list, Any]:
        self.counter["intermediate"] = self.counter.get("intermediate", 0) + 1
        return run_pass(self.job, kind, inputs=(self.path,), kernel=kernel, init=init, params=params, M=self.M,
                        N=self.c, c=c or self.c, dtype=self.dtype, chunk_rows=self.chunk_rows, memory=self.memory,
                        outputs=outputs, transposed_outputs=transposed_outputs, description=description,
                        plan=plan or self._plan(kind, c or self.c))

    def gram_after(self, ws: list) -> np.ndarray:
        """``(Y W1 W2 ...)^T (Y W1 W2 ...)`` (one pass over Y)."""
        ws = [w.astype(self.dtype) for w in ws]
        states, _ = self._pass("apply", K.apply_kernel, {"W": ws, "gram": True}, init=K.apply_init,
                               c=sum(w.shape[1] for w in ws), description="orthonormalize: CholeskyQR refinement")
        return reduce_sum(states, "G")

    def tsqr(self) -> np.ndarray:
        """R of Y by streaming Householder QR (one pass)."""
        states, _ = self._pass("tsqr", K.tsqr_kernel, {}, description="orthonormalize: TSQR")
        rs = [s for s in states if s is not None]
        r = rs[0] if len(rs) == 1 else scipy.linalg.qr(np.vstack(rs), mode="r", check_finite=False)[0][: self.c]
        return _positive_diag(r)

    def apply_to(self, ws: list, out_path: str | None, *, transposed_out: bool = False,
                 description: str = "write factor", collect: bool = False) -> np.ndarray | None:
        """Write ``Y W1 W2 ...`` (applied in sequence) to ``out_path`` (transposed when asked), or return it."""
        from blocklin.storage import create_array

        ws = [w.astype(self.dtype) for w in ws]
        c = ws[-1].shape[1]
        plan = self._plan("apply", sum(w.shape[1] for w in ws))
        if out_path:
            shape, chunks = ((c, self.M), (c, plan.strip)) if transposed_out else ((self.M, c), (plan.strip, c))
            create_array(out_path, shape=shape, dtype=self.dtype, chunks=chunks, codec="none")
        params = {"W": ws, "write": "F" if out_path else None, "collect": collect}
        outs = (("F", out_path),) if out_path else ()
        states, _ = self._pass("apply", K.apply_kernel, params, init=K.apply_init, c=c, outputs=outs,
                               transposed_outputs=("F",) if transposed_out else (), description=description,
                               plan=plan)
        return collect_rows(states, self.M, c) if collect else None


def _positive_diag(r: np.ndarray) -> np.ndarray:
    d = np.sign(np.diag(r))
    d[d == 0] = 1
    return d[:, None] * r


def _inv_upper(r: np.ndarray) -> np.ndarray:
    return scipy.linalg.solve_triangular(r, np.eye(r.shape[0]), lower=False)


def cholqr_r(block: Any, g: np.ndarray) -> tuple[np.ndarray, list, dict]:
    """R factor of a stored tall block whose Gram matrix ``g`` is known.

    Returns ``(R, chain, info)``: ``Q = Y chain[0] chain[1] ...`` (applied in sequence) has orthonormal
    columns and ``Y = Q R``. CholeskyQR2 (one refinement pass); shifted CholeskyQR3 when ``chol(G)``
    breaks down (two refinement passes); TSQR then two CholeskyQR refinements as the last resort.
    """
    g = np.asarray(g, dtype=np.float64)
    info = {"method": "cholqr2", "shift": 0.0}
    refinements = 1
    r1 = cholesky_upper(g)
    if r1 is None:
        sh = shift_for(g, block.M)
        info.update(method="shifted-cholqr3", shift=sh)
        r1 = cholesky_upper(g + sh * np.eye(g.shape[0]))
        refinements = 2
    if r1 is None:
        info["method"] = "tsqr"
        r1 = block.tsqr()
        refinements = 2
    chain = [_inv_upper(r1)]
    r = r1
    for _ in range(refinements):
        gi = block.gram_after(chain)
        ri = cholesky_upper(gi)
        if ri is None:
            ri = cholesky_upper(gi + shift_for(gi, block.M) * np.eye(gi.shape[0]))
        if ri is None:
            break
        chain.append(_inv_upper(ri))
        r = ri @ r
    d = np.sign(np.diag(r))
    d[d == 0] = 1
    chain[-1] = chain[-1] * d
    return d[:, None] * r, chain, info


# -- public ------------------------------------------------------------------------------------------
def orthonormalize(y: Any, out: Any = None, *, memory: Any = None, device: str | None = None,
                   scheduler: Any = None, progress: Any = None, overwrite: bool = False) -> tuple[Any, np.ndarray]:
    """Orthonormalize the columns of a tall matrix: ``Y = Q R``.

    In core (Householder QR) when ``Y`` fits the budget, else out of core with CholeskyQR2, a shifted
    CholeskyQR3 when the Gram matrix is numerically singular, and streaming TSQR as the last resort
    (see the module docstring).

    Parameters
    ----------
    y : path, zarr array, Matrix, NumPy or Dask array
        A tall ``M x c`` matrix, ``M >= c``.
    out : path, optional
        Where to write ``Q`` (out-of-core case); a temporary store when omitted.
    memory, device, scheduler, progress
        As for every blocklin operation.

    Returns
    -------
    Q : ndarray or Matrix
        ``M x c`` with orthonormal columns (a Matrix when ``Y`` did not fit the budget).
    R : ndarray
        ``c x c`` upper triangular, positive diagonal, float64.
    """
    from blocklin.matrix import Matrix
    from blocklin.runtime.job import Job

    with Job("orth", memory=memory, device=device, scheduler=scheduler, progress=progress) as job:
        Y = job.operand(y, "y")
        M, c = Y.shape
        if M < c:
            raise ShapeError(explain("y", "must be tall (rows >= columns)", f"{M} x {c}",
                                     "orthonormalize the transpose"))
        counter: dict = {}
        blk = TallBlock(job, Y.path, M, c, Y.dtype, Y.chunks[0], job.cfg.memory, counter)
        if 3 * M * c * 8 <= job.cfg.memory:
            full = blk.apply_to([np.eye(c)], None, collect=True, description="orthonormalize: read")
            q, r = np.linalg.qr(full)
            d = np.sign(np.diag(r))
            d[d == 0] = 1
            return (q * d).astype(Y.dtype), d[:, None] * r
        g = blk.gram_after([np.eye(c)])
        r, chain, info = cholqr_r(blk, g)
        ao = job.output(out, inputs=[Y.path] if not Y.staged else [], overwrite=overwrite)
        blk.apply_to(chain, ao.array_path(), description="orthonormalize: write Q")
        report = job.report(orth=info, intermediate_passes=counter.get("intermediate", 0))
        path = ao.commit("orthonormalize", params={"method": info["method"]}, report=_brief(report))
        return Matrix(path, report=report, temporary=out is None), r


def _brief(report: dict) -> dict:
    keys = ("seconds", "bytes_read", "bytes_written", "peak_memory", "passes", "device", "scheduler", "orth")
    return {k: report[k] for k in keys if k in report}
