"""Truncated SVD of out-of-core matrices: randomized (HMT), single-pass sketch, block Lanczos.

Every method works on the tall orientation ``B`` of ``A`` (``B = A`` when ``m >= n``, else ``B = A^T``
streamed as column strips of ``A``): the ``N``-long factor lives in memory, the ``M``-long one is
written to zarr by a final pass. Passes over ``A`` are what a method costs on disk; each is counted
and reported, and the formulas are those of :mod:`blocklin.plan.svd`.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import scipy.linalg

from blocklin.config import format_size
from blocklin.errors import BudgetError, ConvergenceWarning, DTypeError, explain, warn
from blocklin.linalg import _svd_kernels as K
from blocklin.linalg.lanczos import block_lanczos, default_tol
from blocklin.linalg.orth import TallBlock, cholqr_r, collect_rows, orth_incore, reduce_sum, run_pass
from blocklin.matrix import Matrix
from blocklin.plan.svd import SvdPlan, plan_kernel_pass, plan_svd
from blocklin.runtime.job import Job
from blocklin.storage import create_array, create_group, write_array

METHODS = ("rsvd", "sketch", "lanczos")
#: Power iterations of ``power_iters="auto"`` without ``tol`` (as scikit-learn and Dask default to).
AUTO_POWER_ITERS = 4


class SVDResult(tuple):
    """``(U, s, Vt)`` with a ``report`` attribute (unpacks like a 3-tuple)."""

    def __new__(cls, U: Any, s: np.ndarray, Vt: Any, report: dict) -> SVDResult:
        obj = super().__new__(cls, (U, s, Vt))
        obj.report = report
        return obj

    @property
    def U(self) -> Any:
        return self[0]

    @property
    def s(self) -> np.ndarray:
        return self[1]

    @property
    def Vt(self) -> Any:
        return self[2]


# -- validation ------------------------------------------------------------------------------------
def _check_k(k: Any, m: int, n: int) -> None:
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)):
        raise TypeError(explain("k", "must be an integer", repr(k), "pass k=10"))
    if not 1 <= k < min(m, n):
        raise ValueError(explain("k", f"must satisfy 1 <= k < min(m, n) = {min(m, n)}", f"k={k} for a {m} x {n} "
                                 "matrix", f"pass 1 <= k <= {min(m, n) - 1} (use scipy.linalg.svd / eigh for a "
                                 "full decomposition)"))


def _resolve_seed(seed: Any) -> int:
    if seed is None:
        return int(np.random.SeedSequence().entropy % (2**63))
    if isinstance(seed, (int, np.integer)) and not isinstance(seed, bool) and seed >= 0:
        return int(seed)
    raise ValueError(explain("seed", "must be a non-negative integer or None", repr(seed), "pass seed=0"))


# -- sources: the tall orientation B in memory or streamed -------------------------------------------
class _ArrayBlock:
    """An in-memory tall block with the interface of :class:`~blocklin.linalg.orth.TallBlock`."""

    def __init__(self, y: np.ndarray) -> None:
        self.y = y
        self.M, self.c = y.shape

    def _chain(self, ws: list) -> np.ndarray:
        t = self.y
        for w in ws:
            t = t @ w.astype(self.y.dtype)
        return t

    def gram_after(self, ws: list) -> np.ndarray:
        t = self._chain(ws)
        return (t.T @ t).astype(np.float64)

    def tsqr(self) -> np.ndarray:
        r = np.linalg.qr(self.y.astype(np.float64), mode="r")
        d = np.sign(np.diag(r))
        d[d == 0] = 1
        return d[:, None] * r

    def apply_to(self, ws: list, out_path: str | None, *, transposed_out: bool = False,
                 description: str = "", collect: bool = False) -> np.ndarray:
        f = self._chain(ws)
        if out_path:
            write_array(out_path, np.ascontiguousarray(f.T if transposed_out else f))
        return f


class _InCore:
    """``B`` held in memory (read once)."""

    def __init__(self, b: np.ndarray) -> None:
        self.b = b
        self.M, self.N = b.shape
        self.dtype = b.dtype

    def normal(self, q: np.ndarray, *, keep_y: bool = False, gram: bool = False, description: str = "") -> tuple:
        y = self.b @ q.astype(self.dtype)
        z = (self.b.T @ y).astype(np.float64)
        g = (y.T @ y).astype(np.float64) if gram else None
        return z, g, (_ArrayBlock(y) if keep_y else None)

    def sketch(self, om: np.ndarray, ps: np.ndarray, seed: int) -> tuple:
        dt = self.dtype
        y = self.b @ om.astype(dt)
        t = self.b @ ps.astype(dt)
        ups = K.gaussian(seed, K.STREAM_UPSILON, 0, self.M, om.shape[1], dt)
        phi = K.gaussian(seed, K.STREAM_PHI, 0, self.M, ps.shape[1], dt)
        f = np.float64
        return ((self.b.T @ ups).astype(f), (phi.T @ t).astype(f), (phi.T @ y).astype(f), (y.T @ y).astype(f),
                _ArrayBlock(y))

    def apply_write(self, w: np.ndarray, dest: str | None, transposed_out: bool, description: str = "") -> Any:
        return _ArrayBlock(self.b).apply_to([w], dest, transposed_out=transposed_out)


class _Streamed:
    """``B`` streamed from storage: every method call is one counted pass over ``A``."""

    def __init__(self, job: Job, A: Any, plan: SvdPlan, counter: dict) -> None:
        self.job, self.A, self.plan, self.counter = job, A, plan, counter
        self.transposed = plan.transposed
        self.M, self.N = plan.M, plan.N
        self.dtype = A.dtype
        self.chunk_rows = A.chunks[1] if self.transposed else A.chunks[0]
        self.memory = plan.pass_memory
        self._n_tmp = 0

    def _plan(self, kind: str, c: int, s: int = 0) -> Any:
        try:
            return plan_kernel_pass(kind, self.M, self.N, c, self.dtype, chunk_rows=self.chunk_rows,
                                    memory=self.memory, workers=self.job.workers(1), cores=self.job.cores(), s=s,
                                    chunk_bytes=int(np.prod(self.A.chunks)) * self.dtype.itemsize,
                                    chunks_across=-(-self.N // self.A.chunks[0 if self.transposed else 1]))
        except BudgetError as exc:
            raise BudgetError(f"{exc} [this is what remains for streaming A of the budget of "
                              f"{format_size(self.plan.memory)} after {format_size(self.plan.client_bytes)} of in-core "
                              f"work ({self.plan.method}, N={self.N}, block={self.plan.block}); raise memory= or "
                              "lower k / oversample / block_size]") from None

    def _run(self, kind: str, kernel: Any, init: Any, params: dict, c: int, *, plan: Any = None, outputs: tuple = (),
             transposed_outputs: tuple = (), s: int = 0, description: str = "") -> list:
        self.counter["a"] += 1
        states, _ = run_pass(self.job, kind, inputs=(self.A.path,), kernel=kernel, init=init, params=params,
                             M=self.M, N=self.N, c=c, dtype=self.dtype, chunk_rows=self.chunk_rows,
                             memory=self.memory, transposed=(self.transposed,), outputs=outputs,
                             transposed_outputs=transposed_outputs, s=s, plan=plan,
                             description=f"{description} (pass {self.counter['a']} over A)")
        return states

    def _tmp_block(self, c: int, strip: int) -> TallBlock:
        self._n_tmp += 1
        path = self.job.temp_dir() / f"Y{self._n_tmp}.zarr"
        create_array(path, shape=(self.M, c), dtype=self.dtype, chunks=(strip, c), codec=self.job.cfg.codec)
        return TallBlock(self.job, path, self.M, c, self.dtype, strip, self.memory, self.counter)

    def normal(self, q: np.ndarray, *, keep_y: bool = False, gram: bool = False, description: str = "") -> tuple:
        c = q.shape[1]
        plan = self._plan("normal", c)
        blk = self._tmp_block(c, plan.strip) if keep_y else None
        params = {"Q": np.ascontiguousarray(q.astype(self.dtype)), "gram": gram, "write_y": keep_y}
        states = self._run("normal", K.normal_kernel, K.normal_init, params, c, plan=plan,
                           outputs=(("Y", blk.path),) if keep_y else (), description=description)
        return reduce_sum(states, "Z"), (reduce_sum(states, "G") if gram else None), blk

    def sketch(self, om: np.ndarray, ps: np.ndarray, seed: int) -> tuple:
        kp, s = om.shape[1], ps.shape[1]
        plan = self._plan("sketch", kp, s)
        blk = self._tmp_block(kp, plan.strip)
        params = {"Omega": om.astype(self.dtype), "Psi": ps.astype(self.dtype), "seed": seed}
        states = self._run("sketch", K.sketch_kernel, K.sketch_init, params, kp, plan=plan, s=s,
                           outputs=(("Y", blk.path),), description="sketch: single pass")
        return (reduce_sum(states, "Xt"), reduce_sum(states, "Z"), reduce_sum(states, "PY"), reduce_sum(states, "G"),
                blk)

    def apply_write(self, w: np.ndarray, dest: str | None, transposed_out: bool, description: str = "") -> Any:
        c = w.shape[1]
        plan = self._plan("apply", c)
        if dest:
            shape, chunks = ((c, self.M), (c, plan.strip)) if transposed_out else ((self.M, c), (plan.strip, c))
            create_array(dest, shape=shape, dtype=self.dtype, chunks=chunks, codec=self.job.cfg.codec)
        params = {"W": w.astype(self.dtype), "write": "F" if dest else None, "collect": dest is None}
        states = self._run("apply", K.apply_kernel, K.apply_init, params, c, plan=plan,
                           outputs=(("F", dest),) if dest else (),
                           transposed_outputs=("F",) if transposed_out else (), description=description)
        return None if dest else collect_rows(states, self.M, c)


def _load(job: Job, A: Any, transposed: bool, plan: SvdPlan) -> np.ndarray:
    """Read ``B`` (``A`` or ``A^T``) into memory in one counted pass."""
    M, N = plan.M, plan.N
    load_plan = plan_kernel_pass("load", M, N, 1, A.dtype, chunk_rows=A.chunks[1] if transposed else A.chunks[0],
                                 memory=max(plan.memory - M * N * A.dtype.itemsize, plan.memory // 4),
                                 workers=job.workers(1), cores=job.cores(),
                                 chunk_bytes=int(np.prod(A.chunks)) * A.dtype.itemsize,
                                 chunks_across=-(-N // A.chunks[0 if transposed else 1]))
    states, _ = run_pass(job, "load", inputs=(A.path,), kernel=K.load_kernel, params={}, M=M, N=N, c=1,
                         dtype=A.dtype, chunk_rows=A.chunks[1] if transposed else A.chunks[0], memory=plan.memory,
                         transposed=(transposed,), plan=load_plan, description="read A into memory (pass 1 over A)")
    b = np.empty((M, N), dtype=A.dtype)
    for st in states:
        for r0, blk in st or []:
            b[r0:r0 + blk.shape[0]] = blk
    return b


def _write_group(job: Job, out: Any, A: Any, arrays: dict, operation: str, plan: Any, report: dict,
                 overwrite: bool, ao: Any = None) -> Any:
    """Write small arrays into the output group and commit it (``ao`` may already hold a long factor)."""
    if ao is None:
        ao = job.output(out, inputs=[A.path] if not A.staged else [], overwrite=overwrite)
        create_group(ao.array_path())
    for name, x in arrays.items():
        write_array(ao.array_path(name), np.ascontiguousarray(x))
    return ao.commit(operation, plan=plan.to_dict(), params={"k": plan.k, "method": plan.method},
                     report=_json_report(report))


def _json_report(report: dict) -> dict:
    keep = ("method", "seconds", "passes", "passes_formula", "intermediate_passes", "bytes_read", "bytes_written",
            "peak_memory", "memory_budget", "residuals", "relative_residuals", "converged", "tol", "seed",
            "power_iters", "lanczos_steps", "restarts", "block", "oversample", "sketch_size", "orth", "in_core",
            "device", "scheduler", "which", "residual_note", "history", "sigma_max")
    return {k: report[k] for k in keep if k in report}


# -- methods -----------------------------------------------------------------------------------------
def _ritz_max_residual(q: np.ndarray, z: np.ndarray, k: int) -> float:
    """Max over the top ``k`` of ``||B^T B v - s^2 v|| / (s s_1)`` for the Ritz pairs of ``span(q)``."""
    h = q.T @ z
    theta, y = np.linalg.eigh((h + h.T) / 2)
    theta, y = theta[::-1][:k], y[:, ::-1][:, :k]
    sig = np.sqrt(np.maximum(theta, 0))
    r = np.linalg.norm(z @ y - (q @ y) * theta, axis=0)
    s1 = sig[0] if sig.size and sig[0] > 0 else 1.0
    return float(np.max(r / np.maximum(sig, 1e-300 * s1) / s1))


def _rsvd(src: Any, k: int, l: int, q: int | None, tol: float | None, seed: int, max_passes: int,
          dest: str | None, transposed_out: bool) -> dict:
    N = src.N
    Q = orth_incore(K.gaussian(seed, K.STREAM_OMEGA, 0, N, l))
    history = []
    used = 0
    if q is not None:
        for t in range(q):
            Z, _, _ = src.normal(Q, description=f"rsvd: power iteration {t + 1}/{q}")
            Q = orth_incore(Z)
            used += 1
        Zf, G, Y = src.normal(Q, keep_y=True, gram=True, description="rsvd: final projection")
    else:  # adaptive: stop when the Ritz residuals reach tol (or at the pass limit)
        while True:
            Zf, G, Y = src.normal(Q, keep_y=True, gram=True, description=f"rsvd: power iteration {used + 1}")
            est = _ritz_max_residual(Q, Zf, k)
            history.append(est)
            if est <= tol or used + 1 >= max_passes:
                break
            Q = orth_incore(Zf)
            used += 1
    R, chain, orth_info = cholqr_r(Y, G)
    Ur, S, Vrt = np.linalg.svd(R)
    sig = S[:k]
    Vr = Vrt.T[:, :k]
    V = Q @ Vr
    safe = np.where(sig > 0, sig, 1.0)
    # U = Q_Y Ur with Q_Y = Y chain (CholeskyQR2 applied in sequence: orthonormal to working precision)
    long = Y.apply_to(chain + [Ur[:, :k]], dest, transposed_out=transposed_out,
                      description="rsvd: write the long factor")
    resid = np.linalg.norm(Zf @ Vr / safe - V * sig, axis=0)  # B^T u - s v; B v - s u = 0 by construction
    return {"s": sig, "V": V, "long": long, "residuals": resid, "power_iters": used, "orth": orth_info,
            "history": history}


def _sketch(src: Any, k: int, kp: int, s: int, seed: int, dest: str | None, transposed_out: bool) -> dict:
    N = src.N
    om = K.gaussian(seed, K.STREAM_SKETCH_OMEGA, 0, N, kp)
    ps = K.gaussian(seed, K.STREAM_SKETCH_PSI, 0, N, s)
    Xt, Z, PY, G, Y = src.sketch(om, ps, seed)
    R, chain, orth_info = cholqr_r(Y, G)
    rinv = scipy.linalg.solve_triangular(R, np.eye(kp), lower=False)
    P = orth_incore(Xt)
    phiq = PY @ rinv
    psitp = ps.T @ P
    c1 = scipy.linalg.lstsq(phiq, Z)[0]               # (Phi Q)^+ Z
    C = scipy.linalg.lstsq(psitp, c1.T)[0].T          # ... ((Psi^T P)^+)^T
    Uc, Sc, Vct = np.linalg.svd(C)
    sig = Sc[:k]
    V = P @ Vct.T[:, :k]
    long = Y.apply_to(chain + [Uc[:, :k]], dest, transposed_out=transposed_out, description="sketch: write the long factor")
    return {"s": sig, "V": V, "long": long, "residuals": None, "orth": orth_info, "sketch_size": [kp, s]}


def _lanczos(src: Any, k: int, plan: SvdPlan, tol: float, seed: int, max_steps: int, dest: str | None,
             transposed_out: bool) -> dict:
    scale = {"s1": 0.0}

    def apply(x: np.ndarray, step: int) -> np.ndarray:
        return src.normal(x, description=f"lanczos: step {step}")[0]

    def threshold(theta: np.ndarray) -> np.ndarray:
        sig = np.sqrt(np.maximum(theta, 0))
        scale["s1"] = max(scale["s1"], float(sig.max(initial=0.0)))
        # triplet residual ||B^T u - s v|| = ||B^T B v - s^2 v|| / s <= tol * s_1
        return tol * scale["s1"] * sig

    res = block_lanczos(apply, src.N, k, which="LA", block=plan.block, max_basis=plan.max_basis,
                        max_steps=max_steps, threshold=threshold, seed=seed)
    sig = np.sqrt(np.maximum(res.values, 0))
    safe = np.where(sig > 0, sig, 1.0)
    V = res.vectors
    long = src.apply_write(V / safe, dest, transposed_out, description="lanczos: write the long factor")
    return {"s": sig, "V": V, "long": long, "residuals": res.residuals / safe, "converged": res.converged,
            "lanczos_steps": res.steps, "restarts": res.restarts, "history": res.history}


# -- public ----------------------------------------------------------------------------------------------
def svd(a: Any, k: int, *, method: str = "rsvd", oversample: int = 10, power_iters: int | str = "auto",
        tol: float | None = None, out: Any = None, seed: int | None = None, memory: Any = None,
        device: str | None = None, scheduler: Any = None, progress: Any = None, workers: int | None = None,
        max_passes: int | None = None, block_size: int | None = None, max_basis: int | None = None,
        check_finite: bool | None = None, overwrite: bool = False, temp_dir: Any = None,
        storage_options: dict | None = None) -> SVDResult:
    """Truncated SVD ``A ~ U diag(s) Vt`` of an out-of-core matrix, counting passes over ``A``.

    Parameters
    ----------
    a : path, zarr array, Matrix, NumPy or Dask array
        ``m x n``, float32 or float64; tall, wide or square (wide matrices are processed as ``A^T``
        read in column strips, never copied).
    k : int
        Number of singular triplets, ``1 <= k < min(m, n)``.
    method : {"rsvd", "sketch", "lanczos"}
        * ``rsvd``: randomized subspace iteration (Halko, Martinsson, Tropp 2011, Alg. 4.4) with
          ``l = k + oversample`` columns. Each power iteration is ONE fused pass ``Z = A^T (A Q)``
          strip by strip, re-orthonormalized in memory (Householder QR of the ``n x l`` block); the
          final pass stores ``Y = A Q`` and its Gram matrix, ``Y`` is orthonormalized out of core by
          CholeskyQR2 (shifted CholeskyQR3 / TSQR fallback, :mod:`blocklin.linalg.orth`), and the
          singular values are those of ``R``. Passes over ``A``: ``q + 1``.
        * ``sketch``: single-pass streaming sketch (Tropp, Yurtsever, Udell, Cevher 2019, SIAM J.
          Sci. Comput. 41(4)): range ``Y = A Omega``, co-range ``X = Upsilon A`` and core
          ``Z = Phi A Psi^T`` in one read of ``A``; ``sketch sizes k + oversample`` and
          ``2 (k + oversample) + 1``. Residuals are not available (they would need a second pass).
        * ``lanczos``: thick-restarted block Lanczos on the normal operator (block Golub-Kahan,
          Golub and Kahan 1965; reorthogonalized as in Larsen's PROPACK; thick restart of Baglama
          and Reichel 2005), one fused pass per step, converged to ``tol`` on the residual of every
          triplet; one more pass writes the long factor. Passes: ``L + 1``.
    oversample : int
        Extra columns of the random block (``rsvd``, ``sketch``) or of the wanted set (``lanczos``).
    power_iters : int or "auto"
        ``rsvd`` power iterations ``q``. ``"auto"``: adaptive when ``tol`` is given (stop when every
        triplet residual is ``<= tol * s_1``, at most ``max_passes`` passes), else 4.
    tol : float, optional
        Relative residual tolerance ``||A^T u - s v|| <= tol * s_1`` (``lanczos`` default
        ``10 sqrt(eps)``). A tolerance not reached within the pass limit gives a
        :class:`~blocklin.errors.ConvergenceWarning` that says what was reached.
    out : path, optional
        Write a zarr group with ``U``, ``S``, ``Vt`` and the report in its attributes.
    seed : int, optional
        Seed of the counter-based random test matrices: results are deterministic for a seed,
        whatever the budget, scheduler or workers. ``None`` draws one (recorded in the report).
    memory, device, scheduler, progress, workers, check_finite, overwrite
        As for every blocklin operation; ``progress`` shows one bar per pass.
    max_passes : int, optional
        Pass limit of the adaptive methods (default 20 for ``rsvd``, 60 for ``lanczos``).
    block_size, max_basis : int, optional
        ``lanczos`` block size (default about ``(k + oversample) / 2``) and restart basis size.
    temp_dir : path or URL, optional
        Where staged inputs and intermediates go (default: config / ``BLOCKLIN_TEMP_DIR``).
    storage_options : dict, optional
        fsspec options for URL operands, outputs and temp dir (see ``docs/cluster.md``).

    Returns
    -------
    SVDResult
        ``U, s, Vt = result``. The long factor (``U`` for tall, ``Vt`` for wide ``A``) is a
        :class:`~blocklin.Matrix` when ``A`` did not fit the budget or ``out`` is given, else a NumPy
        array; the other factor and ``s`` (descending) are NumPy arrays. ``result.report`` holds
        ``passes`` (over ``A``), ``intermediate_passes``, ``bytes_read``, ``seconds``,
        ``peak_memory`` and ``residuals``: per triplet ``sqrt(||A v - s u||^2 + ||A^T u - s v||^2)``
        (one of the two terms is zero by construction).

    Notes
    -----
    A matrix that fits the budget (twice its size plus the small factors) is read once and
    factored in memory with the same algorithm (``passes == 1``). The fused power iteration loses
    singular values below ``sqrt(eps) * s_1`` to rounding (as every method working on ``A^T A``);
    for such a dynamic range use float64.

    References
    ----------
    N. Halko, P.-G. Martinsson, J. A. Tropp, "Finding structure with randomness", SIAM Review 53(2), 2011.
    J. A. Tropp, A. Yurtsever, M. Udell, V. Cevher, "Streaming low-rank matrix approximation with an
    application to scientific simulation", SIAM J. Sci. Comput. 41(4), 2019.
    G. Golub, W. Kahan, "Calculating the singular values and pseudo-inverse of a matrix", 1965.
    J. Baglama, L. Reichel, "Augmented implicitly restarted Lanczos bidiagonalization methods", 2005.
    """
    if method not in METHODS:
        raise ValueError(explain("method", f"must be one of {METHODS}", repr(method), "pass method='rsvd'"))
    if isinstance(oversample, bool) or not isinstance(oversample, (int, np.integer)) or oversample < 0:
        raise ValueError(explain("oversample", "must be a non-negative integer", repr(oversample), "pass oversample=10"))
    if power_iters != "auto" and (isinstance(power_iters, bool) or not isinstance(power_iters, (int, np.integer))
                                  or power_iters < 0):
        raise ValueError(explain("power_iters", "must be 'auto' or a non-negative integer", repr(power_iters),
                                 "pass power_iters=2"))
    if tol is not None and not (isinstance(tol, (int, float)) and tol > 0 and np.isfinite(tol)):
        raise ValueError(explain("tol", "must be a positive number", repr(tol), "pass tol=1e-6"))
    with Job("svd", memory=memory, device=device, scheduler=scheduler, workers=workers, progress=progress,
             check_finite=check_finite, temp_dir=temp_dir, storage_options=storage_options) as job:
        A = job.operand(a, "a")
        m, n = A.shape
        if A.dtype not in (np.dtype(np.float32), np.dtype(np.float64)):
            raise DTypeError(explain("a", "dtype must be float32 or float64", A.dtype.name,
                                     "convert it (blocklin convert --dtype float64)"))
        _check_k(k, m, n)
        seed = _resolve_seed(seed)
        if method == "rsvd":
            q = (None if tol is not None else AUTO_POWER_ITERS) if power_iters == "auto" else int(power_iters)
            limit = max_passes or 20
        else:
            q = None
            limit = max_passes or 60
        if method == "lanczos" and tol is None:
            tol = default_tol(A.dtype)
        plan = plan_svd(m, n, k, A.dtype, method=method, oversample=oversample, power_iters=q,
                        memory=job.cfg.memory, max_passes=limit, block_size=block_size, max_basis=max_basis)
        counter = {"a": 0, "intermediate": 0}
        ao = None
        dest = None
        long_name = "Vt" if plan.transposed else "U"
        if out is not None or not plan.in_core:
            ao = job.output(out, inputs=[A.path] if not A.staged else [], overwrite=overwrite)
            create_group(ao.array_path())
            dest = ao.array_path(long_name)
        if plan.in_core:
            src: Any = _InCore(_load(job, A, plan.transposed, plan))
            counter["a"] = 1
            steps = max(limit, 500)
        else:
            src = _Streamed(job, A, plan, counter)
            steps = limit - 1
        if method == "rsvd":
            r = _rsvd(src, k, plan.block, q, tol, seed, limit if not plan.in_core else max(limit, 100), dest,
                      plan.transposed)
        elif method == "sketch":
            r = _sketch(src, k, *plan.sketch_size, seed, dest, plan.transposed)
        else:
            r = _lanczos(src, k, plan, tol, seed, steps, dest, plan.transposed)
        s = r["s"].astype(A.dtype)
        V = r["V"]
        resid = r["residuals"]
        s1 = float(s[0]) if s.size and s[0] > 0 else 1.0
        converged = True
        if tol is not None and resid is not None:
            converged = bool(np.all(resid <= tol * s1 * (1 + 1e-9)))
            if not converged:
                warn(f"svd ({method}): tol={tol:g} not reached within {counter['a']} passes over A; reached a "
                     f"relative residual of {float(np.max(resid)) / s1:.2e} (max over the {k} triplets, "
                     f"||A^T u - s v|| / s_1). Raise max_passes{' or power_iters' if method == 'rsvd' else ''}, "
                     "or loosen tol", ConvergenceWarning)
        report = job.report(
            method=method, passes=counter["a"], passes_formula=plan.formula, passes_total=job.stats.get("passes", 0),
            intermediate_passes=counter.get("intermediate", 0), residuals=None if resid is None else resid.tolist(),
            relative_residuals=None if resid is None else (resid / s1).tolist(), converged=converged, tol=tol,
            seed=seed, oversample=oversample, block=plan.block, in_core=plan.in_core, plan=plan.to_dict(),
            sigma_max=s1, **{key: r[key] for key in ("power_iters", "orth", "lanczos_steps", "restarts", "history",
                                                     "sketch_size") if key in r})
        if resid is None:
            report["residual_note"] = ("not computed: the single-pass sketch never reads A again; "
                                       "use method='rsvd' or 'lanczos' for residuals")
        short = V.astype(A.dtype)  # N x k: V for tall A, U for wide A
        if plan.transposed:
            U_out, Vt_out = short, (r["long"].T.astype(A.dtype) if r["long"] is not None else None)
        else:
            U_out, Vt_out = (r["long"].astype(A.dtype) if r["long"] is not None else None), short.T.copy()
        if ao is not None:
            small = {"S": s, ("U" if plan.transposed else "Vt"): U_out if plan.transposed else Vt_out}
            path = _write_group(job, out, A, small, "svd", plan, report, overwrite, ao=ao)
            report["output"] = str(path)
            stored = Matrix(path / long_name, report=report, temporary=out is None)
            if plan.transposed:
                Vt_out = stored
            else:
                U_out = stored
        return SVDResult(U_out, s, Vt_out, report)
