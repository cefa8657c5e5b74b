"""Truncated SVD of out-of-core matrices: randomized (HMT), single-pass sketch, block Lanczos, Gram.

Every method works on the tall orientation ``B`` of ``A`` (``B = A`` when ``m >= n``, else ``B = A^T``
streamed as column strips of ``A``): the ``N``-long factor lives in memory, the ``M``-long one is
written to zarr by a final pass. Passes over ``A`` are what a method costs on disk; each is counted
and reported, and the formulas are those of :mod:`blocklin.plan.svd`.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Unpack

import numpy as np
import scipy.linalg

from blocklin.config import Settings, format_size, parse_size, size_hint
from blocklin.errors import BudgetError, ConvergenceWarning, ParameterError, explain, warn
from blocklin.linalg.blocks import tall_kernels as K
from blocklin.linalg.products.gram_kernels import gram_pass_kernel, sum_gram_states
from blocklin.linalg.blocks.syrk import syrk_acc, symmetrize_lower
from blocklin.linalg.blocks import random as rnd
from blocklin.linalg.blocks.center import (Moments, Shift, column_moments, moments_and_gram, moments_and_normal,
                                    moments_and_normal_fits, moments_incore, plan_column_moments,
                                    plan_moments_gram)
from blocklin.runtime.checkpoints import Checkpoints
from blocklin.linalg.lowrank.lanczos import block_lanczos, small_blas, start_block
from blocklin.linalg.blocks.orth import cholqr_r, orth_against, orth_incore
from blocklin.linalg.blocks.results import open_group, write_group
from blocklin.linalg.blocks.scaling import Scaling, check_finite_result, incore_exponent, squares_lose_columns, unscale
from blocklin.linalg.blocks.tsqr import r_factor, reduce_r, tsqr_kernel
from blocklin.linalg.blocks.tallblock import ArrayBlock, DeviceBlock, TallBlock, load_tall
from blocklin.matrix import Matrix
from blocklin.plan.svd import (SvdPlan, gram_route_fits, plan_svd, sketch_blas_threads, sketch_tasks,
                               tsqr_reserve_bytes)
from blocklin.runtime.job import Job
from blocklin.storage.identity import resume_token
from blocklin.runtime.passes import collect_rows, plan_kernel_pass, reduce_sum, run_pass, source, stored
from blocklin.operands import temp_root
from blocklin.storage import create_array
from blocklin.storage.space import check_space
from blocklin.validate import check_k, choice, count, float_operand, positive, resolve_seed, size

METHODS = ("auto", "rsvd", "sketch", "lanczos", "gram")
#: Power iterations of ``power_iters="auto"`` without ``tol`` (as scikit-learn and Dask default to).
AUTO_POWER_ITERS = 4
#: Bytes of the float64 copy of one block of rows while the Gram of an in-memory ``B`` is summed.
GRAM_BLOCK_BYTES = 8 << 20
#: The Gram route's pass: one task with every BLAS thread. SYRK into an ``N x N`` sum from tall strips
#: is compute-bound and threads well (100000 x 500 float64: 0.40-0.41 s against 0.51-0.53 s for two
#: one-thread tasks, which row passes of thin products prefer), and a task's sum is held until the
#: pass ends, so one task holds one (a constant, as every task split: the bits never depend on the
#: scheduler).
GRAM_PASS = {"min_tasks": 1, "workers": 1}


def default_tol(dtype: Any) -> float:
    """Default residual tolerance of the Lanczos SVD: ``sqrt(10 sqrt(eps))`` (3.9e-4 in float64, 5.9e-2 in float32).

    It targets the singular values, not the residuals: the error of a Ritz value is about the square of
    its relative residual (Kato-Temple: ``|s_i^2 - theta_i| <= r_i^2 / gap_i``), so a residual of
    ``sqrt(10 sqrt(eps))`` gives singular values to about ``10 sqrt(eps)`` relative (better where the
    gap ``gap_i`` is wide), and the final Rayleigh-Ritz step over the Ritz vectors and their residuals
    (:func:`_lanczos`) squares the error once more. Pass ``tol=10 * sqrt(eps)`` for residuals (and
    singular vectors) at that level.
    """
    return math.sqrt(10.0 * math.sqrt(float(np.finfo(np.dtype(dtype)).eps)))


def default_lanczos_block(k: int, oversample: int) -> int:
    """Block of the Lanczos SVD: ``k + oversample``, the wanted set in one block; the basis restarts
    at twice that (the in-memory work is then the same as with the half-width block and the
    ``3 (k + oversample)`` basis of :func:`blocklin.plan.svd.default_block`, which ``eigsh`` keeps).

    A pass costs about the same read whatever the block (bound by reading ``A`` for ``N`` in the
    hundreds), and a wider block takes fewer steps: on the slowly decaying ``(1 + i)^-1/2`` with
    ``k = 20`` (``N = 500``) 7 where the half-width block takes 8, on the fast decay 3 instead of 4.
    """
    return k + oversample


def enrich_width(k: int, block: int, N: int) -> int:
    """Columns the final Rayleigh-Ritz step of the Lanczos SVD adds to the ``k`` Ritz vectors: their
    residual directions, at most ``k`` (and at most the block, and what ``N`` leaves)."""
    return max(0, min(k, block, N - k))


class SVDResult(tuple):
    """``(U, s, Vt)`` with a ``report`` attribute (unpacks like a 3-tuple).

    The long factor is a :class:`~blocklin.Matrix`, the short one and ``s`` NumPy arrays.
    """

    def __new__(cls, U: Any, s: np.ndarray, Vt: Any, report: dict, mean: np.ndarray | None = None,
                scale: np.ndarray | None = None, moments: Moments | None = None,
                scaled: tuple[Moments, int] | None = None) -> SVDResult:
        obj = super().__new__(cls, (U, s, Vt))
        obj.report = report
        obj.mean = mean  # column means subtracted (center=True), else None
        obj.scale = scale  # column standard deviations divided by (scale=True), else None
        obj.moments = moments  # the column means and variances when centered or scaled
        #: ``(moments of 2^-e A, e)`` when the data was scaled (blocklin.linalg.blocks.scaling): variances beyond
        #: float64's range (entries beyond 2^512) are inf or 0 in ``moments``, finite here
        obj.scaled_moments = scaled
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


# -- sources: the tall orientation B in memory or streamed -------------------------------------------
class _InCore:
    """``B`` held in memory (read once); on a GPU also kept on the device for the products with it."""

    def __init__(self, b: np.ndarray, device: Any = None) -> None:
        self.b = b
        self.M, self.N = b.shape
        self.dtype = b.dtype
        self.dev = device
        self.bd = device.to_device(b) if device is not None else None

    def _normal_on_device(self, q: np.ndarray, keep_y: bool, gram: bool) -> tuple:
        d, l = self.dev, q.shape[1]
        y = d.zeros((self.M, l), self.dtype)
        d.gemm_acc(y, self.bd, d.to_device(q.astype(self.dtype)))
        z = d.zeros((self.N, l), self.dtype)
        d.gemm_acc(z, self.bd.T, y)
        g = None
        if gram:
            g = d.zeros((l, l), self.dtype)
            d.gemm_acc(g, y.T, y)
            g = d.to_host(g).astype(np.float64)
        return d.to_host(z).astype(np.float64), g, (DeviceBlock(d, y) if keep_y else None)

    def normal(self, q: np.ndarray, *, keep_y: bool = False, gram: bool = False, description: str = "") -> tuple:
        if self.dev is not None:
            return self._normal_on_device(q, keep_y, gram)
        y = self.b @ q.astype(self.dtype)
        z = (self.b.T @ y).astype(np.float64)
        g = (y.T @ y).astype(np.float64) if gram else None
        return z, g, (ArrayBlock(y) if keep_y else None)

    def gram(self, description: str = "") -> np.ndarray:
        """``B^T B`` in float64: SYRK by blocks of rows (float64 copies of one block at a time), on the
        device that holds ``B`` for the products."""
        step = max(1, GRAM_BLOCK_BYTES // (8 * self.N))
        if self.dev is not None:
            d = self.dev
            acc = d.zeros((self.N, self.N), np.float64)
            for r0 in range(0, self.M, step):
                d.syrk_acc(acc, d.cast(self.bd[r0:r0 + step], np.float64))
            return symmetrize_lower(np.asarray(d.to_host(acc), dtype=np.float64))
        g = np.zeros((self.N, self.N))
        for r0 in range(0, self.M, step):
            syrk_acc(g, np.asarray(self.b[r0:r0 + step], dtype=np.float64))
        return symmetrize_lower(g)

    def r_factor(self, k: int = 0, description: str = "") -> np.ndarray:
        """``R`` of ``B = Q R`` (Householder, float64): no squares (the Gram route's fallback)."""
        return r_factor(np.array(self.b, dtype=np.float64))

    def _mm(self, a: Any, b: np.ndarray) -> Any:
        """``a @ b`` on the device (``b`` a host matrix)."""
        out = self.dev.zeros((a.shape[0], b.shape[1]), self.dtype)
        self.dev.gemm_acc(out, a, self.dev.to_device(b.astype(self.dtype)))
        return out

    def _sketch_on_device(self, op: np.ndarray, kp: int, seed: int) -> tuple:
        d, dt, mm = self.dev, self.dtype, self._mm
        y, t = mm(self.bd, op[:, :kp]), mm(self.bd, op[:, kp:])
        ups = rnd.GaussianRows(seed, rnd.STREAM_UPSILON, kp).rows(0, self.M).astype(dt)
        phi = d.to_device(rnd.GaussianRows(seed, rnd.STREAM_PHI, op.shape[1] - kp).rows(0, self.M).astype(dt))
        small = []
        for a, b in ((phi.T, y), (phi.T, t), (y.T, y)):
            g = d.zeros((a.shape[0], b.shape[1]), dt)
            d.gemm_acc(g, a, b)
            small.append(np.asarray(d.to_host(g), dtype=np.float64))
        xt = np.asarray(d.to_host(mm(self.bd.T, ups)), dtype=np.float64)
        return xt, np.hstack(small[:2]), small[2], DeviceBlock(d, y)

    def sketch(self, kp: int, s: int, seed: int) -> tuple:
        """``(X^T, Phi [Y T], Y^T Y, Y)`` of the single-pass sketch (as :func:`K.sketch_kernel` makes them)."""
        op = rnd.sketch_test_matrices(seed, self.N, kp, s, self.dtype)
        if self.dev is not None:
            return self._sketch_on_device(op, kp, seed)
        f = np.float64
        yt = self.b @ op
        y = np.ascontiguousarray(yt[:, :kp])
        ups = rnd.GaussianRows(seed, rnd.STREAM_UPSILON, kp).rows(0, self.M).astype(self.dtype)
        phi = rnd.GaussianRows(seed, rnd.STREAM_PHI, s).rows(0, self.M).astype(self.dtype)
        return (self.b.T @ ups).astype(f), (phi.T @ yt).astype(f), (y.T @ y).astype(f), ArrayBlock(y)

    def apply_write(self, w: np.ndarray, dest: str | None, transposed_out: bool, description: str = "") -> Any:
        blk = DeviceBlock(self.dev, self.bd) if self.dev is not None else ArrayBlock(self.b)
        return blk.apply_to([w], dest, transposed_out=transposed_out)


def _pass_device(job: Job, plan: SvdPlan, dtype: Any) -> str:
    """Where the passes over ``A`` run: as asked, or for ``auto`` the GPU only where it wins (a pass does
    about ``4 x block`` flops per entry read: compute-bound on a CPU only for wide blocks)."""
    from blocklin.device import pass_device

    return pass_device(job.cfg.device, 4.0 * plan.M * plan.N * max(1, plan.block),
                       plan.M * plan.N * np.dtype(dtype).itemsize, resolved=job.device)


class _Shape:
    """Shape and dtype of a pass parameter, all a kernel's memory declaration reads."""

    def __init__(self, shape: tuple[int, int], dtype: np.dtype) -> None:
        self.shape, self.dtype = shape, dtype
        self.nbytes = shape[0] * shape[1] * dtype.itemsize


class _Streamed:
    """``B`` streamed from storage: every method call is one pass over ``A``, counted by the job."""

    def __init__(self, job: Job, A: Any, plan: SvdPlan, shift: Shift | None = None,
                 scaling: Scaling | None = None) -> None:
        self.job, self.A, self.plan, self.shift = job, A, plan, shift
        self.M, self.N = plan.M, plan.N
        self.dtype = A.dtype
        self.source = source(A, transposed=plan.transposed)
        #: the power of two the strips are divided by (learned from the first pass: blocklin.linalg.blocks.scaling)
        self.scaling = scaling if scaling is not None else Scaling(str(self.source.path), A.dtype)
        # a standardized wide A scales the rows of B = A^T, an operation only the CPU device has
        self.device = "cpu" if shift is not None and shift.r is not None else _pass_device(job, plan, A.dtype)
        self.memory = plan.pass_memory
        self.shift = shift
        #: ``(Q, B_c^T B_c Q)`` of a pass already made (the means pass fused with the first product)
        self.first: tuple[np.ndarray, np.ndarray] | None = None

    def _plan(self, kernel: Any, params: dict, reserve: int | None = None, **kw: Any) -> Any:
        # the whole budget with the in-core work reserved: a refusal names the total that suffices
        return plan_kernel_pass(self.job, kernel, [self.source], params, memory=self.plan.memory,
                                reserve=self.plan.client_bytes if reserve is None else reserve,
                                device=self.device, **kw)

    def _plan_r_factor(self, k: int) -> Any:
        # the method's bases are gone by the fallback's QR pass: only N x k blocks are held beside it
        return self._plan(tsqr_kernel, {"dtype": "float64"}, reserve=tsqr_reserve_bytes(self.N, k))

    def preflight(self, k: int, *, means_gram: bool = False) -> None:
        """Plan every pass over ``A`` the method may run (shapes only, nothing read), so that a budget
        too small for any of them is refused before the first pass, with the minimum that fits: the
        means pass of a centered or scaled ``A`` (made with a :class:`Shift` of the run's shapes,
        :func:`_placeholder_shift`; ``means_gram``: the Gram route's Gram comes from the means pass),
        and the method's own passes with their centering terms and over the stored ``Y``. (The TSQR
        route a float64 run falls back to, :func:`_tsqr_svd`, is planned when the first pass shows it.)"""
        p, N = self.plan, self.N
        shifted = self.shift is not None
        if shifted and not means_gram:  # the fused means pass is taken only where it fits: this one must
            plan_column_moments(self.job, self.A, memory=p.memory, reserve=p.client_bytes)
        if p.method == "sketch":
            self._plan_sketch(self._sketch_params(0))
        else:  # the widest product: a step's block, or the final Rayleigh-Ritz over Ritz vectors and residuals
            width = p.block if p.method == "rsvd" else max(p.block, k + enrich_width(k, p.block, N))
            product = self._plan(K.normal_kernel, self._shifted({"gram": True, "write_y": True}, Q=np.zeros((N, width))))
            self._plan_intermediate(width, product.strip, k)
        if p.method == "gram" and means_gram:
            plan_moments_gram(self.job, self.A, memory=p.memory, reserve=p.client_bytes, **GRAM_PASS)
        elif p.method == "gram":
            self._plan(gram_pass_kernel, self._gram_params(), **GRAM_PASS)
        if p.method in ("lanczos", "gram"):
            self._plan(K.apply_kernel, self._shifted({"write": "F", "collect": False}, W=np.zeros((N, k))))

    def _plan_intermediate(self, c: int, chunk_rows: int, k: int) -> None:
        """Plan the passes over the stored ``M x c`` block ``Y`` (chunks of ``chunk_rows`` rows, as
        :meth:`_tmp_block` writes it) that orthonormalize it and write the long factor
        (:class:`TallBlock`: the budget less the in-core work): the chain of up to three ``c x c``
        triangular factors and the ``c x k`` Ritz vectors, and its TSQR."""
        dt = np.dtype(self.dtype)
        y = dataclasses.replace(stored("(Y)", (self.M, c), dt, (chunk_rows, c)), reads="direct")
        chain = [_Shape((c, c), dt)] * 3 + [_Shape((c, k), dt)]
        for kernel, params in ((K.apply_kernel, {"W": chain, "write": "F", "collect": False}),
                               (tsqr_kernel, {"dtype": "float64"})):
            plan_kernel_pass(self.job, kernel, [y], params, memory=self.plan.memory, reserve=self.plan.client_bytes)

    @property
    def peaks(self) -> np.ndarray | None:
        """Each column's ``max |B|``, recorded by the first pass over ``A`` (``None`` before it)."""
        return self.job.peaks.get(str(self.source.path))

    def _gram_params(self) -> dict:
        # float64 sums whatever the dtype: the subspace of a float32 A then comes from its exact Gram
        return {"dtype": "float64", "gpu": self.device == "gpu"}

    def gram(self, description: str = "") -> np.ndarray:
        """``B^T B`` (full, float64) from one SYRK pass (:func:`blocklin.linalg.products.gram`'s kernel)."""
        params = self._gram_params()
        return sum_gram_states(self._run(gram_pass_kernel, params, self._plan(gram_pass_kernel, params, **GRAM_PASS),
                                         description))

    def r_factor(self, k: int, description: str = "") -> np.ndarray:
        """``R`` of ``B = Q R`` from one streaming TSQR pass (float64): no squares."""
        return reduce_r(self._run(tsqr_kernel, {"dtype": "float64"}, self._plan_r_factor(k), description), self.N)

    def _run(self, kernel: Any, params: dict, plan: Any, description: str, **kw: Any) -> list:
        def one(scale: dict) -> list:
            what = f"{description} (pass {self.job.passes('a') + 1} over A)"
            return run_pass(self.job, kernel, [self.source], params, plan=plan, description=what,
                            device=self.device, scale=scale, **kw).states

        return self.scaling.run(self.job, one)

    def _tmp_block(self, c: int, strip: int) -> TallBlock:
        path = self.job.scratch("Y", (self.M, c), self.dtype, (strip, c))
        return TallBlock(self.job, path, self.M, c, self.dtype, strip, self.memory)

    def _shifted(self, params: dict, **operands: np.ndarray) -> dict:
        """Parameters of a centered pass: each operand premultiplied by ``c`` and its offset ``beta``."""
        for name, x in operands.items():
            xc, beta = self.shift.premultiply(x) if self.shift else (x, None)
            params[name] = np.ascontiguousarray(xc.astype(self.dtype))
            if beta is not None:
                params["beta" if name in ("Q", "W") else f"beta_{name.lower()[:2]}"] = beta.astype(self.dtype)
        return params | (self.shift.params(self.dtype) if self.shift else {})

    def normal(self, q: np.ndarray, *, keep_y: bool = False, gram: bool = False, description: str = "") -> tuple:
        if self.first is not None and not (keep_y or gram) and np.array_equal(q, self.first[0]):
            z, self.first = self.first[1], None
            return z, None, None
        params = self._shifted({"gram": gram, "write_y": keep_y}, Q=q)
        plan = self._plan(K.normal_kernel, params)
        blk = self._tmp_block(q.shape[1], plan.strip) if keep_y else None
        states = self._run(K.normal_kernel, params, plan, description,
                           outputs=(("Y", blk.path),) if keep_y else ())
        z = reduce_sum(states, "Z")
        if self.shift:
            z = self.shift.finish(z, reduce_sum(states, "T") if params.get("shifted") else None)
        return z, (reduce_sum(states, "G") if gram else None), blk

    def _sketch_params(self, seed: int) -> dict:
        """The sketch pass's parameters: sizes and seed (its tasks generate ``[Omega | Psi]``), and
        centered, the column scale ``c`` and offsets ``b`` the tasks premultiply it with."""
        kp, s = self.plan.sketch_size
        params = {"seed": seed, "N": self.N, "kp": kp, "s": s, "dtype": np.dtype(self.dtype).str,
                  "y_buffer": min(SKETCH_Y_BUFFER, self.plan.memory // 64, self.M * kp * np.dtype(self.dtype).itemsize),
                  "y_temporaries": self.job.cfg.codec != "none" or temp_root(self.job.cfg).scheme != "local"}
        if self.shift:
            params |= {"shift_c": self.shift.c, "shift_b": self.shift.b} | self.shift.params(self.dtype)
        return params

    def _plan_sketch(self, params: dict) -> Any:
        """The sketch's pass within the budget, split as :func:`blocklin.plan.svd.sketch_tasks` says."""
        p = self.plan
        tasks = sketch_tasks(p.M, p.N, p.sketch_size, np.dtype(self.dtype).itemsize, p.memory)
        plan = plan_kernel_pass(self.job, K.sketch_kernel, [self.source], params, memory=p.memory,
                                reserve=p.client_bytes, min_tasks=tasks, device=self.device)
        threads = sketch_blas_threads(plan.blas_threads, plan.strip, p.N, p.sketch_size)
        return plan if threads == plan.blas_threads else dataclasses.replace(plan, blas_threads=threads)

    def sketch(self, kp: int, s: int, seed: int) -> tuple:
        params = self._sketch_params(seed)
        plan = self._plan_sketch(params)
        params["y_chunk"] = _y_chunk(plan, params["y_buffer"] // (kp * np.dtype(self.dtype).itemsize))
        blk = self._tmp_block(kp, params["y_chunk"])
        states = self._run(K.sketch_kernel, params, plan, "sketch: single pass", outputs=(("Y", blk.path),))
        xt = reduce_sum(states, "Xt")
        if self.shift:
            xt = self.shift.finish(xt, reduce_sum(states, "TX") if params.get("shifted") else None)
        return xt, reduce_sum(states, "PZ"), reduce_sum(states, "G"), blk

    def apply_write(self, w: np.ndarray, dest: str | None, transposed_out: bool, description: str = "") -> Any:
        c = w.shape[1]
        params = self._shifted({"write": "F" if dest else None, "collect": dest is None}, W=w)
        plan = self._plan(K.apply_kernel, params)
        if dest:
            shape, chunks = ((c, self.M), (c, plan.strip)) if transposed_out else ((self.M, c), (plan.strip, c))
            create_array(dest, shape=shape, dtype=self.dtype, chunks=chunks, codec=self.job.cfg.codec)
        states = self._run(K.apply_kernel, params, plan, description, outputs=(("F", dest),) if dest else (),
                           transposed_outputs=("F",) if transposed_out else ())
        return None if dest else collect_rows(states, self.M, c)


#: Most bytes of the buffer that gathers the sketch's short strips of ``Y`` into taller chunks: each
#: chunk is a file (and a folder of its row) to write, read twice and remove; strips of a few dozen
#: rows (small budgets) made hundreds of them, and removing their folders alone took 0.3-0.5 s.
SKETCH_Y_BUFFER = 256 << 10


def _y_chunk(plan: Any, rows: int) -> int:
    """Chunk height of the sketch's ``Y``: the strip times the most strips (at most ``rows`` rows in
    all) that divide every task's share, so that no chunk is written by two tasks."""
    strip = plan.strip
    j_max = max(1, rows // strip)
    if len(plan.groups) > 1:
        per_group = (plan.groups[0][1] - plan.groups[0][0]) // strip
        j = max(d for d in range(1, min(j_max, per_group) + 1) if per_group % d == 0)
    else:
        j = min(j_max, -(-plan.m // strip))
    return strip * j


def load_incore(job: Job, A: Any, plan: SvdPlan) -> np.ndarray:
    """Read ``B`` (``A`` or ``A^T``) into memory in one pass, leaving room for the in-core work."""
    memory = max(plan.memory - plan.M * plan.N * A.dtype.itemsize, plan.memory // 4)
    return load_tall(job, A, transposed=plan.transposed, memory=memory,
                     description="read A into memory (pass 1 over A)")


# -- methods -----------------------------------------------------------------------------------------
def resolution_floor(dtype: Any) -> float:
    """Relative size ``sqrt(eps)`` below which a singular value is judged against ``s_1`` instead of itself.

    Singular values under ``sqrt(eps) s_1`` are at the rounding level of the normal operator
    ``B^T B`` the iterations apply; their residuals are bounded by ``tol * sqrt(eps) * s_1``.
    """
    return math.sqrt(float(np.finfo(np.dtype(dtype)).eps))


def rounding_level(dtype: Any, M: int) -> float:
    """Relative size of the rounding in a product with ``M``-long columns: ``eps sqrt(M)``."""
    return float(np.finfo(np.dtype(dtype)).eps) * math.sqrt(max(M, 1))


def triplet_scale(sig: np.ndarray, dtype: Any) -> np.ndarray:
    """What each triplet's residual is relative to: its own ``s_i``, floored at ``sqrt(eps) s_1``."""
    s1 = float(sig.max(initial=0.0))
    floor = resolution_floor(dtype) * s1
    return np.maximum(sig, floor if floor > 0 else np.finfo(np.float64).tiny)


def _ritz_relative_residuals(q: np.ndarray, z: np.ndarray, k: int, dtype: Any) -> np.ndarray:
    """Per triplet ``||B^T B v - s^2 v|| / (s max(s, sqrt(eps) s_1))`` for the top ``k`` Ritz pairs of ``span(q)``."""
    h = q.T @ z
    theta, y = np.linalg.eigh((h + h.T) / 2)
    theta, y = theta[::-1][:k], y[:, ::-1][:, :k]
    sig = np.sqrt(np.maximum(theta, 0))
    r = np.linalg.norm(z @ y - (q @ y) * theta, axis=0)
    scale = triplet_scale(sig, dtype)
    return r / scale / scale


def _rayleigh_ritz(src: Any, Q: np.ndarray, k: int, dest: str | None, transposed_out: bool, label: str) -> dict:
    """The final pass shared by every method but the sketch: ``Y = B Q`` (stored, with ``Y^T Y`` and
    ``Z = B^T Y``), ``Y = Q_Y R`` by CholeskyQR2, ``R = U_R S W^T``; writes ``U = Q_Y U_R``, returns
    ``s``, ``V = Q W`` and the exact residuals ``||B^T u - s v||`` (``B v - s u = 0`` by construction).

    The singular values come from ``R`` (a factor of ``B Q``), not from the eigenvalues of ``B^T B``,
    so they are accurate to ``eps s_1`` down to zero (a rank-deficient ``A`` gives zeros)."""
    Zf, G, Y = src.normal(Q, keep_y=True, gram=True, description=f"{label}: final projection")
    return _write_long(_project(src, Q, k, Zf, G, Y), dest, transposed_out, label)


def _project(src: Any, Q: np.ndarray, k: int, Zf: np.ndarray, G: np.ndarray, Y: Any) -> dict:
    """The Rayleigh-Ritz step of :func:`_rayleigh_ritz` from its pass's ``Z = B^T B Q``, ``Y^T Y`` and ``Y``."""
    R, chain, orth_info = cholqr_r(Y, G, rank_revealing=True)
    with small_blas(R.shape[0], R.shape[1]):
        Ur, S, Vrt = np.linalg.svd(R)
    # singular values at the rounding level of B Q are zeros of A (rank < k): exactly 0, with a zero U column
    # (relative to ||A|| itself when a streamed pass centers A after its products: see blocklin.linalg.blocks.center)
    ref = max(float(S[0]) if S.size else 0.0, getattr(src, "noise_scale", 0.0))
    zero = S[:k] <= rounding_level(src.dtype, src.M) * ref
    sig = np.where(zero, 0.0, S[:k])
    Ur = Ur[:, :k] * ~zero
    Vr = Vrt.T[:, :k]
    V = Q @ Vr
    safe = np.where(sig > 0, sig, 1.0)
    resid = np.where(zero, 0.0, np.linalg.norm(Zf @ Vr / safe - V * sig, axis=0))  # u = 0: B^T u - 0 v = 0
    return {"s": sig, "V": V, "residuals": resid, "orth": orth_info, "Y": Y, "chain": chain + [Ur]}


def _write_long(p: dict, dest: str | None, transposed_out: bool, label: str) -> dict:
    """Write the long factor ``U = Q_Y U_R`` of a Rayleigh-Ritz step (``Q_Y = Y chain``: CholeskyQR2
    applied in sequence, orthonormal to working precision)."""
    Y, chain = p.pop("Y"), p.pop("chain")
    long = Y.apply_to(chain, dest, transposed_out=transposed_out, description=f"{label}: write the long factor")
    return p | {"long": long}


def _rsvd_start(n: int, l: int, seed: int) -> np.ndarray:
    """The orthonormal random block randomized subspace iteration starts from."""
    return orth_incore(rnd.gaussian(seed, rnd.STREAM_OMEGA, 0, n, l))


def _rsvd(src: Any, k: int, l: int, q: int | None, tol: float | None, seed: int, max_passes: int,
          dest: str | None, transposed_out: bool, ckpt: Checkpoints) -> dict:
    saved = ckpt.load("rsvd")
    if saved is None:
        Q = _rsvd_start(src.N, l, seed)
        used, history, done = 0, [], False
    else:  # resume: the block after the last completed power iteration, bit for bit
        Q, used, done = saved["Q"], int(saved["used"]), bool(saved["done"])
        history = [float(h) for h in np.atleast_1d(saved["history"])]
    total = q if q is not None else max_passes - 1
    while not done and used < total:
        Z, _, _ = src.normal(Q, description=f"rsvd: power iteration {used + 1}" + (f"/{q}" if q is not None else ""))
        if q is None:  # adaptive: stop when every Ritz triplet's own relative residual reaches tol
            history.append(float(_ritz_relative_residuals(Q, Z, k, src.dtype).max(initial=0.0)))
            done = history[-1] <= tol
        Q = orth_incore(Z)
        used += 1
        ckpt.save("rsvd", Q=Q, used=used, history=np.array(history, dtype=np.float64), done=done)
    r = _rayleigh_ritz(src, Q, k, dest, transposed_out, "rsvd")
    return r | {"power_iters": used, "history": history}


def _psi_t(seed: int, s: int, P: np.ndarray) -> np.ndarray:
    """``Psi^T P``, generating ``Psi`` a block of rows at a time (the numbers of the sketch's pass)."""
    gen = rnd.GaussianRows(seed, rnd.STREAM_SKETCH_PSI, s)
    out = np.zeros((s, P.shape[1]))
    for r0 in range(0, P.shape[0], gen.block):
        r1 = min(P.shape[0], r0 + gen.block)
        out += gen.rows(r0, r1).T @ P[r0:r1]
    return out


def _sketch(src: Any, k: int, kp: int, s: int, seed: int, dest: str | None, transposed_out: bool) -> dict:
    """The single-pass sketch of Tropp, Yurtsever, Udell and Cevher (2019), "Streaming low-rank matrix
    approximation with an application to scientific simulation", SIAM J. Sci. Comput. 41(4): range
    sketch ``Y = B Omega``, co-range sketch ``X = Upsilon B`` and core sketch ``Z = Phi B Psi^T``
    from one pass; the test matrices are generated from the seed where they are used."""
    Xt, PZ, G, Y = src.sketch(kp, s, seed)
    PY, Z = PZ[:, :kp], PZ[:, kp:]
    R, chain, orth_info = cholqr_r(Y, G, rank_revealing=True)
    rinv = np.linalg.pinv(R)  # R is singular when A has rank < k + oversample (zero rows of R: zero columns of Q)
    P = orth_incore(Xt)
    del Xt
    phiq = PY @ rinv
    psitp = _psi_t(seed, s, P)
    c1 = scipy.linalg.lstsq(phiq, Z)[0]               # (Phi Q)^+ Z
    C = scipy.linalg.lstsq(psitp, c1.T)[0].T          # ... ((Psi^T P)^+)^T
    Uc, Sc, Vct = np.linalg.svd(C)
    sig = Sc[:k]
    V = P @ Vct.T[:, :k]
    del P
    long = Y.apply_to(chain + [Uc[:, :k]], dest, transposed_out=transposed_out, description="sketch: write the long factor")
    return {"s": sig, "V": V, "long": long, "residuals": None, "orth": orth_info, "sketch_size": [kp, s]}


def _lanczos(src: Any, k: int, plan: SvdPlan, tol: float, seed: int, max_steps: int, dest: str | None,
             transposed_out: bool, ckpt: Checkpoints, x0: np.ndarray | None = None,
             first: np.ndarray | None = None) -> dict:
    floor = resolution_floor(src.dtype)

    def apply(x: np.ndarray, step: int) -> np.ndarray:
        return src.normal(x, description=f"lanczos: step {step}")[0]

    def threshold(theta: np.ndarray) -> np.ndarray:
        sig = np.sqrt(np.maximum(theta, 0))
        s1 = float(sig.max(initial=0.0))
        scale = np.maximum(sig, floor * s1)
        # triplet residual ||B^T u - s v|| = ||B^T B v - s^2 v|| / s <= tol * s (own singular value), but
        # never below the rounding of B^T B x, about eps s_1^2 (the null vectors of a rank-deficient A stop
        # there; a bound with sqrt(M) stopped float32 triplets below 0.4 s_1 far above their attainable accuracy)
        return np.maximum(tol * scale * scale, 10 * rounding_level(src.dtype, 1) * s1 * s1)

    res = block_lanczos(apply, src.N, k, which="LA", block=plan.block, max_basis=plan.max_basis,
                        max_steps=max_steps, threshold=threshold, seed=seed, x0=x0, first=first,
                        state=ckpt.load("lanczos"),
                        checkpoint=(lambda state: ckpt.save("lanczos", **state)) if ckpt.enabled else None)
    # The final pass takes the Rayleigh-Ritz step over the Ritz vectors and their residual directions
    # (one block Krylov step from them, at no extra pass: the pass is made anyway to write the long
    # factor). span [X, R] holds span(X), so its Ritz values can only get closer to the exact ones; in
    # practice their error drops by orders of magnitude (on the four spectra of benchmarks/svd.py from
    # 1e-13 - 1e-7 to 1e-15 - 1e-9), which is what lets the default tolerance target the singular values.
    Q = res.vectors
    e = enrich_width(k, plan.block, src.N)
    if e and res.residual_vectors is not None:
        with small_blas(src.N, 2 * k):
            Q = np.hstack([Q, orth_against(Q, res.residual_vectors, seed=seed, counter=res.steps + 1)[:, :e]])
    r = _rayleigh_ritz(src, Q, k, dest, transposed_out, "lanczos")
    return r | {"lanczos_steps": res.steps, "restarts": res.restarts, "history": res.history,
                "rayleigh_ritz_width": int(Q.shape[1])}


def gram_subspace(g: np.ndarray, width: int) -> np.ndarray:
    """The eigenvectors of the ``width`` largest eigenvalues of the symmetric ``g``, descending."""
    n = g.shape[0]
    width = max(1, min(width, n))
    _, v = scipy.linalg.eigh(g, subset_by_index=(n - width, n - 1), overwrite_a=True, check_finite=False)
    return np.ascontiguousarray(v[:, ::-1])


def _gram(src: Any, k: int, plan: SvdPlan, tol: float, seed: int, max_steps: int, dest: str | None,
          transposed_out: bool, ckpt: Checkpoints, start: np.ndarray | None = None) -> dict:
    """Rayleigh-Ritz over the top ``block`` eigenvectors of ``B^T B``, continued by block Lanczos from
    that subspace (and its product, no pass repeated) only where a triplet misses ``tol``.

    The Gram's eigenvectors are the wanted singular vectors up to its rounding, ``eps ||B||^2`` over
    the gap ``s_i^2 - s_{block+1}^2``; the Rayleigh-Ritz pass takes the singular values from ``B Q``
    (accurate to ``eps s_1``, as every method's) and measures every triplet's residual exactly, so
    the spectra where the Gram's rounding matters (singular values near ``sqrt(eps) s_1``) continue
    instead of returning inaccurate triplets. ``start``: the subspace when the Gram came from the
    means pass (centered or scaled ``A``)."""
    saved = ckpt.load("gram")
    if saved is not None:  # resume: the subspace (and, when the Rayleigh-Ritz step missed tol, its product)
        Q, Z = saved["Q"], saved.get("Z")
    else:
        if start is None:
            g = src.gram(description="gram: B^T B by SYRK")
            why = _squares_lost(src, "gram")
            if why:  # the squares left float64's range for some columns: a route without squares
                del g  # not held through the fallback's passes (planned without it)
                return _tsqr_svd(src, k, dest, transposed_out) | {"lanczos_steps": 0, "fallback": why}
        Q = start if start is not None else gram_subspace(g, plan.block)
        Z = None
        ckpt.save("gram", Q=Q)
    if Z is None:
        Z, G, Y = src.normal(Q, keep_y=True, gram=True, description="gram: Rayleigh-Ritz over the Gram's eigenvectors")
        p = _project(src, Q, k, Z, G, Y)
        if all(triplet_report(p["s"], p["residuals"], tol, src.dtype)["converged_triplets"]):
            return _write_long(p, dest, transposed_out, "gram") | {"lanczos_steps": 0}
        del p, G, Y
        ckpt.save("gram", Q=Q, Z=Z)
    return _lanczos(src, k, plan, tol, seed, max_steps, dest, transposed_out, ckpt, x0=Q, first=Z)


def _squares_lost(src: Any, method: str) -> str | None:
    """Why ``method`` (which works with ``B^T B``) cannot hold ``B``: the reason for the report's
    ``fallback``, or ``None``. Only an unshifted ``B`` falls back (the QR has no centering)."""
    if getattr(src, "shift", None) is not None:
        return None
    lost = squares_lose_columns(src.peaks)
    if not lost:
        return None
    return (f"{method} -> tsqr: {lost} nonzero column(s) of B have entries below 2^-511 times the largest, so "
            "their squares are out of float64's range in B^T B; the singular values come from the R factor of a "
            "streaming Householder QR instead (no squares)")


def _tsqr_svd(src: Any, k: int, dest: str | None, transposed_out: bool) -> dict:
    """The SVD from ``B = Q R`` without squaring anything: ``R = U_R S V^T`` in memory, the long factor
    ``U = B (R^-1 U_R)`` from one pass that also gives ``B^T U`` (so every triplet's residual
    ``||B^T u - s v||`` is measured on ``B`` itself), then written. Householder QR keeps each column's
    rounding relative to that column's norm, so a matrix whose columns differ in scale by more than
    float64's range survives where ``B^T B`` does not (LAPACK's ``xGESDD`` starts with the same QR)."""
    R = src.r_factor(k, description="tsqr: R factor of B (no squares)")
    with small_blas(R.shape[0], R.shape[1]):
        # xGESVD (QR iteration on the bidiagonal) keeps the small singular values of a graded R to their
        # own rounding; xGESDD's divide and conquer with vectors returned them at eps ||R|| (measured)
        Ur, S, Vrt = scipy.linalg.svd(R, lapack_driver="gesvd", check_finite=False)
    kk = int(np.count_nonzero(S[:k] > 0))
    W = np.zeros((src.N, k))
    if kk:
        W[:, :kk] = scipy.linalg.solve_triangular(R, Ur[:, :kk], check_finite=False)  # Q^T u = U_R: u = B R^-1 U_R
    sig, V = np.where(np.arange(k) < kk, S[:k], 0.0), Vrt.T[:, :k].copy()
    del R, Ur, Vrt  # the N x N factors are not held through the last pass (planned without them)
    Z, _, Y = src.normal(W, keep_y=True, description="tsqr: the long factor and B^T U")
    resid = np.linalg.norm(Z - V * sig, axis=0)
    return _write_long({"s": sig, "V": V, "residuals": resid, "orth": "tsqr", "Y": Y, "chain": [np.eye(k)]},
                       dest, transposed_out, "tsqr")


# -- public ----------------------------------------------------------------------------------------------
#: Most power iterations ``power_iters=`` asks for: ``(s_{k+1} / s_k)^(2q)`` has long stopped
#: improving the basis (and a huge count would run for hours on an in-core matrix).
MAX_POWER_ITERS = 100


def svd(a: Any, k: int, *, method: str = "auto", oversample: int = 10, power_iters: int | str = "auto",
        tol: float | None = None, out: Any = None, seed: int | None = None,
        max_passes: int | None = None, block_size: int | None = None, max_basis: int | None = None,
        overwrite: bool = False, center: bool = False, scale: bool = False, resume: bool = False,
        **settings: Unpack[Settings]) -> SVDResult:
    """Truncated SVD ``A ~ U diag(s) Vt`` of an out-of-core matrix, counting passes over ``A``.

    Parameters
    ----------
    a : path, zarr array, Matrix, NumPy or Dask array
        ``m x n``, float32 or float64; tall, wide or square (wide matrices are processed as ``A^T``
        read in column strips, never copied).
    k : int
        Number of singular triplets, ``1 <= k < min(m, n)``.
    method : {"auto", "rsvd", "sketch", "lanczos", "gram"}
        * ``auto`` (default): ``gram`` for narrow matrices (short side ``N <= 24 (k + oversample)``,
          long side at least ``8 N``, the Gram within the budget; a centered or scaled one only when
          tall), else ``lanczos``, both to ``tol`` (default ``sqrt(10 sqrt(eps))``); ``rsvd`` when
          ``power_iters`` is an integer (a fixed cost). The shape alone decides, never the machine.
          On slowly and fast decaying spectra, flat tails and low rank plus noise the default reaches
          the rounding of the data, where scikit-learn's ``randomized_svd`` and Dask's
          ``svd_compressed`` with their defaults stop at up to 2.4e-4 and 0.5 (docs/svd.md has the
          figures).
        * ``rsvd``: randomized subspace iteration (Halko, Martinsson, Tropp 2011, Alg. 4.4) with
          ``l = k + oversample`` columns. Each power iteration is ONE fused pass ``Z = A^T (A Q)``
          strip by strip, re-orthonormalized in memory (Householder QR of the ``n x l`` block); the
          final pass stores ``Y = A Q`` and its Gram matrix, ``Y`` is orthonormalized out of core by
          CholeskyQR2 (shifted CholeskyQR3 / TSQR fallback, :mod:`blocklin.linalg.blocks.orth`), and the
          singular values are those of ``R``. Passes over ``A``: ``q + 1``.
        * ``sketch``: single-pass streaming sketch (Tropp, Yurtsever, Udell, Cevher 2019, SIAM J.
          Sci. Comput. 41(4)): range ``Y = A Omega``, co-range ``X = Upsilon A`` and core
          ``Z = Phi A Psi^T`` in one read of ``A``; ``sketch sizes k + oversample`` and
          ``2 (k + oversample) + 1``. Residuals are not available (they would need a second pass).
        * ``lanczos``: thick-restarted block Lanczos on the normal operator (block Golub-Kahan,
          Golub and Kahan 1965; reorthogonalized as in Larsen's PROPACK; thick restart of Baglama
          and Reichel 2005), one fused pass per step, converged to ``tol`` on the residual of every
          triplet; one more pass writes the long factor. Passes: ``L + 1``.
        * ``gram``: one SYRK pass forms ``B^T B`` (float64 sums), its top ``k + oversample``
          eigenvectors are the subspace of one Rayleigh-Ritz pass (the final step of ``rsvd`` and
          ``lanczos``: singular values from ``B Q``, exact residuals); triplets that still miss
          ``tol`` (singular values near ``sqrt(eps) s_1``, where the Gram's rounding shows) continue
          by block Lanczos from that subspace. Passes: 2 (``2 + L``). Holds ``3 N^2`` float64 in
          memory; with ``center``/``scale`` the means pass makes the centered Gram (tall ``A`` only).
    oversample : int
        Extra columns of the random block (``rsvd``, ``sketch``) or of the wanted set (``lanczos``).
    power_iters : int or "auto"
        ``rsvd`` power iterations ``q``. ``"auto"``: adaptive when ``tol`` is given (stop when every
        triplet's relative residual is ``<= tol``, at most ``max_passes`` passes), else 4. An integer
        with ``method="auto"`` selects ``rsvd``.
    tol : float, optional
        Accuracy target: every triplet's residual relative to its own singular value,
        ``||A^T u_i - s_i v_i|| <= tol * max(s_i, sqrt(eps) s_1)`` (the floor: singular values at the
        rounding level of ``s_1``, such as the zeros of a rank-deficient matrix). ``lanczos`` (and
        ``auto``) default ``sqrt(10 sqrt(eps))`` (3.9e-4 in float64): it targets the singular values,
        whose error is about the square of the residual, to ``10 sqrt(eps)`` relative (measured:
        1e-9 on a slowly decaying spectrum, a few ``eps`` on fast decay, flat tails and low rank plus
        noise; docs/svd.md). ``tol=10 * sqrt(eps)`` gives residuals (vectors) at that level and the
        singular values to a few ``eps``. The passes follow from it. A tolerance not reached within the pass limit gives a
        :class:`~blocklin.errors.ConvergenceWarning` naming the triplets and the worst one.
    out : path, optional
        Write a zarr group with ``U``, ``S``, ``Vt`` and the report in its attributes.
    seed : int, optional
        Seed of the counter-based random test matrices: results are deterministic for a seed,
        whatever the budget, scheduler or workers. ``None`` draws one (recorded in the report).
    overwrite : bool
        Replace an existing ``out``.
    resume : bool
        Continue the run that was writing ``out`` when it was interrupted (SIGKILL, Ctrl-C, a crash)
        with the same input, parameters and budget: the passes it completed are skipped (their
        results are checkpointed in the unfinished output, :mod:`blocklin.runtime.checkpoints`) and the
        result is identical, bit for bit, to an uninterrupted run. Without an unfinished run it
        starts afresh. Needs ``out``.
    center : bool
        Factor ``A - 1 mu^T`` with ``mu`` the column means (principal component analysis), without
        writing a centered copy: the rank-one correction is applied inside every pass
        (:mod:`blocklin.linalg.blocks.center`). Costs one more pass over ``A`` for the means, none when
        ``A`` fits the budget (it is then centered in memory).
    scale : bool
        Also divide each column by its standard deviation (``ddof=0``, as scikit-learn's
        ``StandardScaler``; a constant column is left unscaled): standardized PCA. Alone (without
        ``center``) it scales by the same standard deviations without subtracting the means.
    max_passes : int, optional
        Pass limit of the adaptive methods (default 20 for ``rsvd``, 60 for ``lanczos`` and ``gram``).
    block_size, max_basis : int, optional
        ``lanczos`` block size and restart basis size (``gram``: the Rayleigh-Ritz width and those of
        its continuation; default ``k + oversample`` and twice that;
        with only one of them given, the other follows :func:`blocklin.plan.svd.plan_svd`).
    **settings
        As for every operation: :class:`~blocklin.config.Settings` (``progress``: one bar per pass).

    Returns
    -------
    SVDResult
        ``U, s, Vt = result``. The long factor (``U`` for tall, ``Vt`` for wide ``A``) is always a
        :class:`~blocklin.Matrix` (stored in ``out``, or in a temporary group you own), whether ``A``
        fitted the budget or not; the other factor and ``s`` (descending) are NumPy arrays. ``result.report`` holds
        ``passes`` (over ``A``), ``intermediate_passes``, ``bytes_read``, ``seconds``,
        ``peak_memory``, ``center``, ``scale``, ``residuals``: per triplet ``||A^T u - s v||`` (``A v - s u``
        is zero by construction), ``relative_residuals`` (each divided by its own ``s_i``, floored at
        ``sqrt(eps) s_1``), ``converged_triplets`` and ``worst_triplet`` (1-based ``index``, ``s``,
        ``relative_residual``, ``converged``). A matrix of rank ``r < k`` gives ``s_i = 0`` (to
        rounding) for ``i > r`` with zero columns in the long factor (``A = U diag(s) Vt`` still holds).
        With ``center`` or ``scale``, the factors are
        those of the centered (scaled) matrix, ``result.mean`` and ``result.scale`` hold the column
        means and standard deviations used (``None`` when not), ``result.moments`` the column means
        and variances, and ``out`` also stores them as ``mean`` and ``scale``.

    Notes
    -----
    A matrix that fits the budget (twice its size plus the small factors) is read once and
    factored in memory with the same algorithm (``passes == 1``). The subspace comes from ``A^T A``, so the
    singular *vectors* of singular values below ``sqrt(eps) * s_1`` are not resolved (as for every
    method working on ``A^T A``; use float64 for such a dynamic range); the singular values come
    from the final Rayleigh-Ritz step on ``A Q`` and are accurate to ``eps * s_1``.

    References
    ----------
    N. Halko, P.-G. Martinsson, J. A. Tropp, "Finding structure with randomness", SIAM Review 53(2), 2011.
    J. A. Tropp, A. Yurtsever, M. Udell, V. Cevher, "Streaming low-rank matrix approximation with an
    application to scientific simulation", SIAM J. Sci. Comput. 41(4), 2019.
    G. Golub, W. Kahan, "Calculating the singular values and pseudo-inverse of a matrix", 1965.
    J. Baglama, L. Reichel, "Augmented implicitly restarted Lanczos bidiagonalization methods", 2005.
    T. F. Chan, G. H. Golub, R. J. LeVeque, "Algorithms for computing the sample variance: analysis and
    recommendations", The American Statistician 37(3), 1983 (the centered Gram's pairwise merge).

    Examples
    --------
    >>> import numpy as np
    >>> import blocklin as bl
    >>> x = np.random.default_rng(0).standard_normal((500, 40)) * np.logspace(0, -3, 40)
    >>> U, s, Vt = res = bl.svd(x, 3, seed=0)
    >>> U.shape, s.shape, Vt.shape
    ((500, 3), (3,), (3, 40))
    >>> np.allclose(s, np.linalg.svd(x, compute_uv=False)[:3])
    True
    """
    return factorize(a, k, method=method, oversample=oversample, power_iters=power_iters, tol=tol, out=out, seed=seed,
                     max_passes=max_passes, block_size=block_size, max_basis=max_basis, overwrite=overwrite,
                     center=center, scale=scale, resume=resume, **settings)


def factorize(a: Any, k: int, *, method: str = "auto", oversample: int = 10, power_iters: int | str = "auto",
              tol: float | None = None, out: Any = None, seed: int | None = None, max_passes: int | None = None,
              block_size: int | None = None, max_basis: int | None = None, overwrite: bool = False,
              center: bool = False, scale: bool = False, resume: bool = False,
              lanczos_tol: Any = default_tol, **settings: Unpack[Settings]) -> SVDResult:
    """:func:`svd` with the default Lanczos tolerance a function of the dtype (``lanczos_tol``):
    ``eigsh(center=True)`` keeps its residual tolerance ``10 sqrt(eps)`` through it."""
    method = choice("method", method, METHODS, fix="pass method='auto'")
    oversample = count("oversample", oversample, fix="pass oversample=10")
    power_iters = count("power_iters", power_iters, auto=("auto",), maximum=MAX_POWER_ITERS,
                        why="each costs two passes over A, and past a few dozen they no longer sharpen the basis",
                        fix="pass power_iters=2, or method='lanczos' (converged to tol) for a slowly decaying spectrum")
    tol = positive("tol", tol, optional=True, fix="pass tol=1e-6")
    max_passes = size("max_passes", max_passes, fix="pass max_passes=60, or None for the default")
    block_size = size("block_size", block_size, fix="pass block_size=8, or None for the planned one")
    max_basis = size("max_basis", max_basis, fix="pass max_basis=32, or None for the planned one")
    requested = method
    with Job("svd", **settings) as job:
        A = job.operand(a, "a")
        float_operand(A, "svd")
        m, n = A.shape
        check_k(k, m, n)
        method = resolve_method(method, power_iters, shape=(m, n), k=k, oversample=oversample,
                                shifted=bool(center or scale))
        if method == "gram" and (center or scale) and m < n:
            raise ParameterError(explain(
                "method", "'gram' centers or scales a tall matrix only (its means pass makes the Gram)",
                f"'gram' with center={center}, scale={scale} on a {m} x {n} matrix",
                "pass method='auto' (block Lanczos here) or method='lanczos'"))
        q = (None if tol is not None else AUTO_POWER_ITERS) if power_iters == "auto" else power_iters
        limit = max_passes or (20 if method == "rsvd" else 60)
        if method in ("lanczos", "gram") and block_size is None and max_basis is None:
            block_size, max_basis = default_lanczos_block(k, oversample), 2 * default_lanczos_block(k, oversample)
        tol = lanczos_tol(A.dtype) if method in ("lanczos", "gram") and tol is None else tol
        kw = dict(method=method, oversample=oversample, power_iters=q if method == "rsvd" else None,
                  max_passes=limit, block_size=block_size, max_basis=max_basis)
        shift = (bool(center), bool(scale))
        plan, means_gram = None, method == "gram" and any(shift)
        if method == "gram" and requested == "auto":
            try:  # the Gram route where its N x N Gram fits the budget, else block Lanczos
                plan = _try_plan(job, A, k, job.cfg.memory, kw, means_gram=means_gram, shift=shift)
            except BudgetError:
                method = kw["method"] = "lanczos"
                means_gram = False
        if plan is None:
            # method='auto' where the Gram route did not fit: the minimum named is block Lanczos's (at that
            # budget the Gram route may fit and be taken: either plans every pass there)
            plan = fitting_plan(job, A, k, kw, means_gram=means_gram, shift=shift,
                                note=" (method='auto': the Gram route does not fit this budget)"
                                if requested == "auto" and method == "lanczos" else "")
        _check_space(job, out, plan, m, n, k, A.dtype)
        token = low_rank_token(A, op="svd", k=k, method=method, oversample=oversample, q=q, tol=tol, limit=limit,
                             block=plan.block, basis=plan.max_basis, center=bool(center), scale=bool(scale),
                             memory=job.cfg.memory, seed=seed)
        ao = open_group(job, out, A, overwrite, resume=resume, token=token)
        ckpt = Checkpoints(ao, enabled=out is not None)
        seed = checkpointed_seed(ckpt, seed)
        r = _factorize(job, A, plan, k=k, q=q, tol=tol, seed=seed, limit=limit, ckpt=ckpt,
                       dest=ao.array_path("Vt" if plan.transposed else "U"), center=bool(center), scale=bool(scale))
        report = _report(job, plan, r, tol=tol, seed=seed, oversample=oversample)
        report.update(center=bool(center), scale=bool(scale), method_requested=requested, resumed=ao.resumed,
                      restored_checkpoints=[name for name in ckpt.restored if name != "seed"])
        ckpt.clear()
        if r.get("means_fused"):
            report["passes_formula"] = f"{report['passes_formula']} (the column means from the first pass)"
        elif (center or scale) and not plan.in_core:
            report["passes_formula"] = f"{report['passes_formula']} + 1 (column means)"
        return _result(job, out, A, plan, r, report, ao, overwrite)


def _placeholder_shift(A: Any, plan: SvdPlan, shift: tuple[bool, bool]) -> Shift | None:
    """A :class:`Shift` of the shapes a centered (``shift[0]``) and/or scaled (``shift[1]``) run uses, for
    planning its passes before the means are known (their memory depends on the shapes only)."""
    if not any(shift):
        return None
    m, n = A.shape
    return Shift.of(Moments(np.zeros(n), np.ones(n), m), center=shift[0], scale=shift[1], transposed=plan.transposed)


def _try_plan(job: Job, A: Any, k: int, memory: int, kw: dict, *, means_gram: bool = False,
              shift: tuple[bool, bool] = (False, False)) -> SvdPlan:
    plan = plan_svd(A.shape[0], A.shape[1], k, A.dtype, memory=memory, **kw)
    if not plan.in_core:
        _Streamed(job, A, plan, _placeholder_shift(A, plan, shift)).preflight(k, means_gram=means_gram)
    return plan


def fitting_plan(job: Job, A: Any, k: int, kw: dict, *, means_gram: bool = False,
                 shift: tuple[bool, bool] = (False, False),
                 note: str = "") -> SvdPlan:
    """:func:`plan_svd` at the job's budget with every streamed pass planned too; a budget too small
    for any of them is refused naming a budget that was checked to suffice (and that a retry gets)."""
    try:
        return _try_plan(job, A, k, job.cfg.memory, kw, means_gram=means_gram, shift=shift)
    except BudgetError as exc:
        need = _sufficient_budget(job, A, k, kw, exc, means_gram=means_gram, shift=shift)
        raise BudgetError(explain(
            "memory", f"must hold the in-core work of svd ({kw['method']}){note} and one strip of each pass over A",
            format_size(job.cfg.memory), f"raise it to at least {format_size(need)} (memory='{size_hint(need)}'), "
            f"or lower k, oversample or the block size (the step that failed: {exc})"), minimum=need) from None


#: Steps of the search for a sufficient budget (each grows it by at least a quarter).
_BUDGET_SEARCH_STEPS = 60


def _sufficient_budget(job: Job, A: Any, k: int, kw: dict, exc: BudgetError, *, means_gram: bool = False,
                       shift: tuple[bool, bool] = (False, False)) -> int:
    """The smallest budget of the form :func:`size_hint` prints, from ``exc``'s minimum up, that plans."""
    need = max(job.cfg.memory + 1, exc.minimum or 0)
    for _ in range(_BUDGET_SEARCH_STEPS):
        hint = parse_size(size_hint(need))
        try:
            _try_plan(job, A, k, hint, kw, means_gram=means_gram, shift=shift)
            return hint
        except BudgetError as again:
            need = max(hint + 1, again.minimum or hint + hint // 4)
    return need


def _check_space(job: Job, out: Any, plan: SvdPlan, m: int, n: int, k: int, dtype: Any) -> None:
    """Up front: the long factor fits the output's disk, and a streamed run's basis ``Y`` the temp dir's."""
    long_side, itemsize = max(m, n), np.dtype(dtype).itemsize
    if out is not None:
        check_space(out, long_side * k * itemsize, "out", f"the long factor, {long_side} x {k} {np.dtype(dtype).name}")
    if not plan.in_core:
        cols = plan.block if plan.method != "sketch" else max(plan.sketch_size)
        check_space(temp_root(job.cfg) / "blocklin-svd", long_side * (k + cols) * itemsize, "temp data",
                    f"{long_side} x {k + cols} {np.dtype(dtype).name}")


def _factorize(job: Job, A: Any, plan: SvdPlan, *, k: int, q: int | None, tol: float | None, seed: int,
               limit: int, dest: str, center: bool = False, scale: bool = False,
               ckpt: Checkpoints | None = None) -> dict:
    """Run the planned method on ``B`` in memory (read once) or streamed; the long factor goes to ``dest``.

    With ``center``/``scale`` the factored matrix is ``B_c`` (:mod:`blocklin.linalg.blocks.center`): centered
    in memory when ``B`` is held there, by the rank-one correction inside each pass otherwise."""
    moments = shift = fused = gram_start = None
    scaling = Scaling(str(source(A, transposed=plan.transposed).path), A.dtype)
    saved = ckpt.load("scaling") if ckpt is not None and not plan.in_core else None
    if saved is not None:  # resume: the power of two the checkpointed passes were made with
        scaling.e, scaling.amax = int(saved["e"]), float(saved["amax"])
    if plan.in_core:
        b = load_incore(job, A, plan)
        scaling.e, scaling.amax = incore_exponent(b)
        if scaling.e:  # held in memory: scaled in place (a power of two: exact)
            np.ldexp(b, -scaling.e, out=b)
        if center or scale:
            moments = moments_incore(b, plan.transposed)
            Shift.of(moments, center=center, scale=scale, transposed=plan.transposed).apply_incore(b)
        dev = None
        # B stays on the GPU for the job, beside the products' blocks (and the Gram route's N x N sum, its
        # SYRK output and a float64 row block): held from the device's shared budget
        held = int(1.5 * b.nbytes) + (2 * plan.N * plan.N * 8 + GRAM_BLOCK_BYTES if plan.method == "gram" else 0)
        if job.device == "gpu" and held <= (job.device_memory() or 0):
            from blocklin.device import get_device

            dev = get_device("gpu", device_memory=job.device_memory())
            job.stack.enter_context(dev.reserve(held))
        src: Any = _InCore(b, dev)
        src.peaks = job.peaks.get(scaling.path)  # recorded by the pass that read B
        phases = {"read A": "cpu", "products with A": "gpu" if dev is not None else "cpu"}
    else:
        if plan.method == "gram" and (center or scale):  # the means pass makes the centered Gram too
            moments, gram_start = _moments_gram(job, A, plan, ckpt, center=center, scale=scale, scaling=scaling)
        else:
            fused = _fused_start(job, A, plan, seed, q) if center and not scale else None
            if center or scale:
                moments, first = _moments(job, A, plan, ckpt, fused, scaling=scaling)
        if moments is not None:
            shift = Shift.of(moments, center=center, scale=scale, transposed=plan.transposed)
        src = _Streamed(job, A, plan, shift, scaling)
        if fused is not None and first is not None:
            src.first = (fused, first)
        if moments is not None and center:  # the products are rounded at ||A||, before the means are removed
            sq = moments.count * (moments.var + moments.mean ** 2) / (moments.std ** 2 if scale else 1.0)
            src.noise_scale = float(np.sqrt(sq.sum()))
        phases = {"passes over A": src.device or job.device}
    ckpt = ckpt if ckpt is not None and not plan.in_core else Checkpoints(None)  # in memory: nothing to skip
    if plan.method == "rsvd":
        r = _rsvd(src, k, plan.block, q, tol, seed, limit if not plan.in_core else max(limit, 100), dest,
                  plan.transposed, ckpt)
    elif plan.method == "gram":
        r = _gram(src, k, plan, tol, seed, max(limit, 500) if plan.in_core else limit - 2, dest, plan.transposed,
                  ckpt, start=gram_start)
    elif plan.method == "sketch":
        r = _sketch(src, k, *plan.sketch_size, seed, dest, plan.transposed)
    else:
        r = _lanczos(src, k, plan, tol, seed, max(limit, 500) if plan.in_core else limit - 1, dest, plan.transposed,
                     ckpt)
    why = _squares_lost(src, plan.method) if plan.method in ("rsvd", "lanczos") and not (center or scale) else None
    if why:  # B^T B could not hold B: the answer again, without squares (2 more passes over A)
        if dest is not None:  # the long factor the method wrote in this run's own partial output
            from blocklin.storage.backend import remove
            from blocklin.storage.location import as_location

            remove(as_location(dest))
        r = _tsqr_svd(src, k, dest, plan.transposed) | {"fallback": why}
    r["phases"] = phases
    r["means_fused"] = not plan.in_core and (fused is not None or gram_start is not None)
    e = scaling.exponent
    if e and not scale:  # the factors of 2^-e B: s and residuals scale back by 2^e, vectors are unchanged
        r["s"] = unscale(r["s"], e)  # (a standardized B is the same for 2^-e A: nothing to scale back)
        if r.get("residuals") is not None:
            r["residuals"] = unscale(np.asarray(r["residuals"], dtype=np.float64), e)
    if e:
        if moments is not None:
            r["scaled_moments"] = (moments, e)
            # from the scaled variances (finite where var overflows); a constant column keeps its 1
            std = np.where(moments.var > 0, unscale(moments.std, e), 1.0)
            moments = Moments(unscale(moments.mean, e), unscale(moments.var, 2 * e), moments.count)
    r["scaling"] = scaling.report()
    if moments is not None:
        r["moments"] = moments
        r["mean"] = moments.mean if center else None
        r["scale"] = (std if e else moments.std) if scale else None
    return r


def _fused_start(job: Job, A: Any, plan: SvdPlan, seed: int, q: int | None) -> np.ndarray | None:
    """The block the first product of a centered streamed run is taken with, when the means pass can
    make that product too (tall ``A``, a pass on the CPU, a method that starts with ``B_c^T B_c Q``, a
    budget that holds the fused pass)."""
    if plan.transposed or _pass_device(job, plan, A.dtype) != "cpu":
        return None
    start = None
    if plan.method == "lanczos":
        start = start_block(plan.N, plan.block, seed)
    elif plan.method == "rsvd" and q != 0:
        start = _rsvd_start(plan.N, plan.block, seed)
    return start if start is not None and moments_and_normal_fits(job, A, start, memory=plan.memory,
                                                                       reserve=plan.client_bytes) else None


def _moments_gram(job: Job, A: Any, plan: SvdPlan, ckpt: Checkpoints | None, *, center: bool,
                  scale: bool, scaling: Scaling) -> tuple[Moments, np.ndarray | None]:
    """The column moments and the Gram route's subspace (the top eigenvectors of the centered and/or
    scaled Gram) from one pass over a tall ``A`` (:func:`moments_and_gram`), or from the checkpoints of
    an interrupted run (then ``None``: the subspace is in the ``gram`` checkpoint)."""
    saved = ckpt.load("moments") if ckpt is not None else None
    if saved is not None and ckpt.load("gram") is not None:
        return Moments(saved["mean"], saved["var"], int(saved["count"])), None
    moments, g = scaling.run(job, lambda sc: moments_and_gram(job, A, memory=plan.memory, reserve=plan.client_bytes,
                                                               scale=sc, **GRAM_PASS))
    _save_scaling(ckpt, scaling)
    if not center:  # scaled only: the uncentered Gram, A^T A = A_c^T A_c + m mu mu^T (a sum, no cancellation)
        g += moments.count * np.outer(moments.mean, moments.mean)
    if scale:
        inv = 1.0 / moments.std
        g *= inv[:, None]
        g *= inv[None, :]
    q = gram_subspace(g, plan.block)
    del g
    if ckpt is not None:
        ckpt.save("moments", mean=moments.mean, var=moments.var, count=moments.count)
    return moments, q


def _save_scaling(ckpt: Checkpoints | None, scaling: Scaling) -> None:
    """Checkpoint the power of two once known (a resumed run makes its passes with the same)."""
    if ckpt is not None and scaling.exponent and ckpt.load("scaling") is None:  # e = 0: nothing to keep
        ckpt.save("scaling", e=scaling.exponent, amax=float(scaling.amax or 0.0))


def _moments(job: Job, A: Any, plan: SvdPlan, ckpt: Checkpoints | None,
             start: np.ndarray | None = None, *, scaling: Scaling) -> tuple[Moments, np.ndarray | None]:
    """The column moments from one pass (with ``start``: and ``B_c^T B_c start`` from the same pass), or
    from the checkpoint of an interrupted run."""
    saved = ckpt.load("moments") if ckpt is not None else None
    if saved is not None:
        return Moments(saved["mean"], saved["var"], int(saved["count"])), saved.get("first")
    first = None
    if start is not None:
        moments, first = scaling.run(job, lambda sc: moments_and_normal(job, A, start, memory=plan.memory,
                                                                        reserve=plan.client_bytes, scale=sc))
    else:
        moments = scaling.run(job, lambda sc: column_moments(job, A, memory=plan.memory,
                                                             reserve=plan.client_bytes, scale=sc))
    _save_scaling(ckpt, scaling)
    if ckpt is not None:
        ckpt.save("moments", mean=moments.mean, var=moments.var, count=moments.count,
                  **({"first": first} if first is not None else {}))
    return moments, first


def low_rank_token(A: Any, **params: Any) -> str:
    """Identity of a factorization for ``resume=True``: the input and every parameter that changes the
    passes or their bits (the budget included: it fixes the strips)."""
    return resume_token("low-rank", [A], sorted(params.items()))


def checkpointed_seed(ckpt: Checkpoints, seed: int | None) -> int:
    """The seed: given, or the one an interrupted run drew (so that resuming draws the same numbers)."""
    saved = ckpt.load("seed")
    if saved is not None:
        return int(saved["seed"])
    seed = resolve_seed(seed)
    ckpt.save("seed", seed=seed)
    return seed


def resolve_method(method: str, power_iters: int | str, *, shape: tuple[int, int], k: int, oversample: int,
                   shifted: bool = False) -> str:
    """``"auto"``: ``rsvd`` when the power iterations are fixed (a fixed cost); else the Gram route for
    narrow tall orientations (:func:`blocklin.plan.svd.gram_route_fits`; a centered or scaled one only
    for tall ``A``, whose means pass makes the Gram), block Lanczos to ``tol`` otherwise."""
    if method != "auto":
        return method
    if power_iters != "auto":
        return "rsvd"
    m, n = shape
    M, N = max(m, n), min(m, n)
    return "gram" if gram_route_fits(M, N, k, oversample) and not (shifted and m < n) else "lanczos"


def triplet_report(s: np.ndarray, resid: np.ndarray | None, tol: float | None, dtype: Any) -> dict:
    """Per-triplet residuals relative to each triplet's own singular value, converged flags, the worst one.

    ``relative_residuals[i] = ||A^T u_i - s_i v_i|| / max(s_i, sqrt(eps) s_1)``: a triplet is judged
    against its own ``s_i`` (the floor keeps triplets at the rounding level of ``s_1``, such as the
    zero singular values of a rank-deficient matrix, from reading as unconverged)."""
    if resid is None:
        return {"residuals": None, "relative_residuals": None, "converged_triplets": None, "worst_triplet": None}
    rel = resid / triplet_scale(s, dtype)
    # a NaN residual (or singular value) was not checked: never converged
    conv = np.isfinite(rel) & np.isfinite(s) & ((rel <= tol * (1 + 1e-9)) if tol is not None else True)
    worst = int(np.argmax(rel)) if rel.size else 0
    return {"residuals": resid.tolist(), "relative_residuals": rel.tolist(), "converged_triplets": conv.tolist(),
            "worst_triplet": {"index": worst + 1, "s": float(s[worst]), "relative_residual": float(rel[worst]),
                              "converged": bool(conv[worst])} if rel.size else None}


def _report(job: Job, plan: SvdPlan, r: dict, *, tol: float | None, seed: int, oversample: int) -> dict:
    """The report, with per-triplet residuals; warns when ``tol`` was not reached."""
    s = r["s"]
    check_finite_result("s", s, f"the singular values of svd ({plan.method})")
    s1 = float(s[0]) if s.size and s[0] > 0 else 1.0
    triplets = triplet_report(s, r["residuals"], tol, plan.dtype)
    # converged only for residuals actually measured: the single-pass sketch has none (None, with its note)
    converged = None if r["residuals"] is None else all(triplets["converged_triplets"] or [True])
    if converged is False:
        bad = [i + 1 for i, c in enumerate(triplets["converged_triplets"]) if not c]
        w = triplets["worst_triplet"]
        warn(f"svd ({plan.method}): tol={tol:g} not reached within {job.passes('a')} passes over A for triplet(s) "
             f"{bad[:10]}{' ...' if len(bad) > 10 else ''}; worst: triplet {w['index']} (s = {w['s']:.4g}), "
             f"relative residual ||A^T u - s v|| / s = {w['relative_residual']:.2e}. Raise max_passes"
             f"{' or power_iters' if plan.method == 'rsvd' else ''}, or loosen tol", ConvergenceWarning)
    report = job.report(
        method=plan.method, passes=job.passes("a"), passes_formula=plan.formula, passes_total=job.passes(),
        intermediate_passes=job.passes("intermediate"), **triplets, converged=converged, tol=tol,
        seed=seed, oversample=oversample, block=plan.block, in_core=plan.in_core, plan=plan.to_dict(),
        sigma_max=s1, **{key: r[key] for key in ("power_iters", "orth", "lanczos_steps", "restarts", "history",
                                                 "rayleigh_ritz_width", "sketch_size", "phases", "scaling", "fallback")
                                                 if key in r})
    if r["residuals"] is None:
        report["residual_note"] = ("not computed: the single-pass sketch never reads A again; "
                                   "use method='rsvd' or 'lanczos' for residuals")
    return report


def _result(job: Job, out: Any, A: Any, plan: SvdPlan, r: dict, report: dict, ao: Any, overwrite: bool) -> SVDResult:
    """Commit the group (the long factor is already in it) and return ``(U, s, Vt)``.

    The long factor (``U`` for tall, ``Vt`` for wide ``A``) is always the stored :class:`Matrix`, the
    other factor and ``s`` NumPy arrays, whether ``A`` was factored in memory or streamed.
    """
    s = r["s"].astype(A.dtype)
    short = r["V"].astype(A.dtype)  # N x k: V for tall A, U for wide A
    small = {"S": s, "U": short} if plan.transposed else {"S": s, "Vt": short.T.copy()}
    for name in ("mean", "scale"):
        if r.get(name) is not None:
            small[name] = r[name]
    path = write_group(job, out, A, small, "svd", plan, report, overwrite, ao=ao)
    report["output"] = str(path)
    stored = Matrix(path / ("Vt" if plan.transposed else "U"), report=report, temporary=out is None)
    extra = {"mean": r.get("mean"), "scale": r.get("scale"), "moments": r.get("moments"),
             "scaled": r.get("scaled_moments")}
    if plan.transposed:
        return SVDResult(small["U"], s, stored, report, **extra)
    return SVDResult(stored, s, small["Vt"], report, **extra)
