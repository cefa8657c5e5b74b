"""The two sources of the tall orientation ``B`` the SVD's methods work on: held in memory or streamed.

``B = A`` when ``m >= n``, else ``B = A^T`` streamed as column strips of ``A``. Both sources offer the
operations of :class:`Source`; on :class:`Streamed` each is one pass over ``A``, counted by the job.

Complex ``B``: every product with ``B^T`` below is with ``B^H`` (``Z = B^H (B q)``, ``G = Y^H Y``), and
the small results are complex128 where real data's are float64 (LAPACK's conventions).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Protocol

import numpy as np

from blocklin.errors import BudgetError
from blocklin.linalg.blocks import random as rnd
from blocklin.linalg.blocks import tall_kernels as K
from blocklin.linalg.blocks.center import Shift, plan_column_moments, plan_moments_gram, plan_moments_row_gram
from blocklin.linalg.blocks.complete import plan_completion
from blocklin.linalg.blocks.orth import work_dtype
from blocklin.linalg.blocks.scaling import Scaling
from blocklin.device.syrk import symmetrize_lower, syrk_acc
from blocklin.linalg.blocks.tallblock import ArrayBlock, DeviceBlock, TallBlock, load_tall
from blocklin.linalg.blocks.tsqr import r_factor, reduce_r, tsqr_kernel
from blocklin.linalg.lowrank.triplets import enrich_width
from blocklin.linalg.products.gram_kernels import gram_pass_kernel, sum_gram_states
from blocklin.operands import temp_root
from blocklin.plan.gram import gram_tasks
from blocklin.plan.svd import SvdPlan, sketch_blas_threads, sketch_tasks, tsqr_reserve_bytes
from blocklin.plan.passes import output_chunk_rows
from blocklin.runtime.job import Job
from blocklin.runtime.passes import collect_rows, plan_kernel_pass, reduce_sum, run_pass, source, stored
from blocklin.storage import create_array, write_array

#: Bytes of the float64 copy of one block of rows while the Gram of an in-memory ``B`` is summed.
GRAM_BLOCK_BYTES = 8 << 20
#: One task with every BLAS thread: the Gram passes where two sums are not small beside the budget, or
#: where two tasks' plan does not fit (:func:`gram_pass_split`, :func:`moments_gram_split`). A task's sum
#: is held until the pass ends, so one task holds one (a constant, as every task split: the bits never
#: depend on the scheduler).
GRAM_PASS = {"min_tasks": 1, "workers": 1}


def gram_pass_split(n: int, dtype: Any, memory: int, device: str) -> dict:
    """The task split of the Gram route's SYRK pass over ``N = n`` columns: :func:`blocklin.plan.gram.gram_tasks`
    tasks at once, each with its own sum (where that plan fits: :meth:`Streamed._plan_gram`), else
    :data:`GRAM_PASS`."""
    tasks = gram_tasks(n, work_dtype(dtype), memory, gpu=device == "gpu")
    return {"min_tasks": tasks, "workers": tasks} if tasks > 1 else GRAM_PASS


def moments_gram_split(job: Job, A: Any, memory: int, reserve: int, *, row_gram: dict | None = None) -> dict:
    """The task split of the means pass that forms the Gram of a centered or scaled ``A`` (a CPU pass):
    as :func:`gram_pass_split` where that plan fits the budget, else :data:`GRAM_PASS`.

    Tall ``A`` (``row_gram`` None): the centered Gram ``A_c^T A_c``
    (:func:`~blocklin.linalg.blocks.center.moments_and_gram`; its tasks' co-moments merged in row order).
    Wide ``A`` (``row_gram``: its ``center`` and ``standardize``): the ``m x m`` Gram of its columns
    centered or scaled as they are read (:func:`~blocklin.linalg.blocks.center.moments_and_row_gram`; its
    tasks' sums added in row order). Two tasks took 1.17-1.32 s against 1.67-1.97 s for one on a 1 GiB
    ``64 x 4194304`` float32 ``A`` at 128-512 MiB (the 2-core machine, medians of 3)."""
    if row_gram is None:
        plan = functools.partial(plan_moments_gram, job, A, memory=memory, reserve=reserve)
    else:
        plan = functools.partial(plan_moments_row_gram, job, A, memory=memory, reserve=reserve, **row_gram)
    split = gram_pass_split(A.shape[1 if row_gram is None else 0], A.dtype, memory, "cpu")
    if split is not GRAM_PASS:
        try:
            plan(**split)
            return split
        except BudgetError:
            pass
    return GRAM_PASS


#: Most bytes of the buffer that gathers the sketch's short strips of ``Y`` into taller chunks: each
#: chunk is a file (and a folder of its row) to write, read twice and remove; strips of a few dozen
#: rows (small budgets) made hundreds of them, and removing their folders alone took 0.3-0.5 s.
SKETCH_Y_BUFFER = 256 << 10


class Source(Protocol):
    """What the methods (:mod:`blocklin.linalg.lowrank.methods`) ask of ``B``: its shape, dtype and column
    peaks, and the products with it. In memory each product is a BLAS call; streamed, one pass over ``A``."""

    M: int  # rows of B: the long side
    N: int  # columns of B: the short side
    dtype: np.dtype
    #: the centering applied inside the passes (streamed ``B_c``); ``None`` when ``B`` itself is what is factored
    shift: Shift | None
    #: what the products are rounded at when above ``||B_c||``: ``||B||`` of a streamed ``B`` centered after them
    noise_scale: float

    @property
    def peaks(self) -> np.ndarray | None:
        """Each column's ``max |B|``, recorded by the read of ``A`` (``None`` before it)."""

    def normal(self, q: np.ndarray, *, keep_y: bool = False, gram: bool = False, description: str = "") -> tuple:
        """``(Z, G, Y)``: ``Z = B^T (B q)`` in float64, ``G = Y^T Y`` in float64 (``gram``, else ``None``) and the
        block ``Y = B q`` (``keep_y``, else ``None``)."""

    def gram(self, description: str = "") -> np.ndarray:
        """``B^T B`` in float64."""

    def r_factor(self, k: int, description: str = "") -> np.ndarray:
        """``R`` of ``B = Q R`` in float64: no squares (the methods' fallback)."""

    def sketch(self, kp: int, s: int, seed: int, y_path: Any = None) -> tuple:
        """``(X^T, Phi [Y T], Y^T Y, Y)`` of the single-pass sketch; ``y_path``: where ``Y`` is stored
        (an updatable result keeps it), else a scratch store (streamed) or memory."""


class InCore:
    """``B`` held in memory (read once); on a GPU also kept on the device for the products with it."""

    shift = None  # centered or scaled in memory: B itself is B_c
    noise_scale = 0.0
    signs = False  # the long factor written with the components' signs (methods.component_signs)

    def __init__(self, b: np.ndarray, device: Any = None, peaks: np.ndarray | None = None) -> None:
        self.b = b
        self.peaks = peaks  # recorded by the pass that read B
        self.M, self.N = b.shape
        self.dtype = b.dtype
        self.dev = device
        self.bd = device.to_device(b) if device is not None else None

    def _normal_on_device(self, q: np.ndarray, keep_y: bool, gram: bool) -> tuple:
        d, l, wd = self.dev, q.shape[1], work_dtype(self.dtype)
        y = d.zeros((self.M, l), self.dtype)
        d.gemm_acc(y, self.bd, d.to_device(q.astype(self.dtype)))
        z = d.zeros((self.N, l), self.dtype)
        if wd.kind == "c":  # B^H Y as conj(B^T conj(Y)): the narrow block conjugated, never B
            with d.on_compute():
                yc = y.conj()
            d.gemm_acc(z, self.bd.T, yc)
            del yc
        else:
            d.gemm_acc(z, self.bd.T, y)
        g = None
        if gram:
            g = d.zeros((l, l), self.dtype)
            d.syrk_acc(g, y) if wd.kind == "c" else d.gemm_acc(g, y.T, y)
            g = d.to_host(g).astype(wd)
        z = d.to_host(z).astype(wd)
        return (np.conj(z) if wd.kind == "c" else z), g, (DeviceBlock(d, y) if keep_y else None)

    def normal(self, q: np.ndarray, *, keep_y: bool = False, gram: bool = False, description: str = "") -> tuple:
        if self.dev is not None:
            return self._normal_on_device(q, keep_y, gram)
        wd = work_dtype(self.dtype)
        y = self.b @ q.astype(self.dtype)
        # complex: B^H Y = conj(B^T conj(Y)), no conjugated copy of B
        z = (np.conj(self.b.T @ np.conj(y)) if wd.kind == "c" else self.b.T @ y).astype(wd)
        g = (y.conj().T @ y).astype(wd) if gram else None
        return z, g, (ArrayBlock(y) if keep_y else None)

    def gram(self, description: str = "") -> np.ndarray:
        """``B^T B`` in float64 (``B^H B`` in complex128): SYRK (HERK) by blocks of rows (float64 copies of
        one block at a time), on the device that holds ``B`` for the products."""
        wd = work_dtype(self.dtype)
        step = max(1, GRAM_BLOCK_BYTES // (wd.itemsize * self.N))
        if self.dev is not None:
            d = self.dev
            acc = d.zeros((self.N, self.N), wd)
            for r0 in range(0, self.M, step):
                d.syrk_acc(acc, d.cast(self.bd[r0:r0 + step], wd))
            return symmetrize_lower(np.asarray(d.to_host(acc), dtype=wd))
        g = np.zeros((self.N, self.N), dtype=wd)
        for r0 in range(0, self.M, step):
            syrk_acc(g, np.asarray(self.b[r0:r0 + step], dtype=wd))
        return symmetrize_lower(g)

    def r_factor(self, k: int = 0, description: str = "") -> np.ndarray:
        """``R`` of ``B = Q R`` (Householder, float64 or complex128): no squares (the Gram route's fallback)."""
        return r_factor(np.array(self.b, dtype=work_dtype(self.dtype)))

    def _mm(self, a: Any, b: np.ndarray) -> Any:
        """``a @ b`` on the device (``b`` a host matrix)."""
        out = self.dev.zeros((a.shape[0], b.shape[1]), self.dtype)
        self.dev.gemm_acc(out, a, self.dev.to_device(b.astype(self.dtype)))
        return out

    def _sketch_on_device(self, op: np.ndarray, kp: int, seed: int) -> tuple:
        d, dt, mm, wd = self.dev, self.dtype, self._mm, work_dtype(self.dtype)
        cplx = wd.kind == "c"
        y, t = mm(self.bd, op[:, :kp]), mm(self.bd, op[:, kp:])
        ups = rnd.row_test_rows(seed, rnd.STREAM_UPSILON, kp, complex=cplx).rows(0, self.M).astype(dt)
        phi = d.to_device(rnd.row_test_rows(seed, rnd.STREAM_PHI, op.shape[1] - kp, complex=cplx)
                          .rows(0, self.M).astype(dt))
        small = []
        for a, b in ((phi.T, y), (phi.T, t)):
            g = d.zeros((a.shape[0], b.shape[1]), dt)
            d.gemm_acc(g, a, b)
            small.append(np.asarray(d.to_host(g), dtype=wd))
        g = d.zeros((kp, kp), dt)
        d.syrk_acc(g, y) if cplx else d.gemm_acc(g, y.T, y)
        small.append(np.asarray(d.to_host(g), dtype=wd))
        xt = np.asarray(d.to_host(mm(self.bd.T, ups)), dtype=wd)
        return (np.conj(xt) if cplx else xt), np.hstack(small[:2]), small[2], DeviceBlock(d, y)

    def sketch(self, kp: int, s: int, seed: int, y_path: Any = None) -> tuple:
        """``(X^T, Phi [Y T], Y^T Y, Y)`` of the single-pass sketch (as :func:`K.sketch_kernel` makes them);
        ``Y`` also written to ``y_path`` when given."""
        op = rnd.sketch_test_matrices(seed, self.N, kp, s, self.dtype)
        if self.dev is not None:
            out = self._sketch_on_device(op, kp, seed)
        else:
            f = work_dtype(self.dtype)
            cplx = f.kind == "c"
            yt = self.b @ op
            y = np.ascontiguousarray(yt[:, :kp])
            ups = rnd.row_test_rows(seed, rnd.STREAM_UPSILON, kp, complex=cplx).rows(0, self.M).astype(self.dtype)
            phi = rnd.row_test_rows(seed, rnd.STREAM_PHI, s, complex=cplx).rows(0, self.M).astype(self.dtype)
            xt = np.conj(self.b.T @ ups) if cplx else self.b.T @ ups  # X^H = B^H conj(Ups^T), as the pass
            out = xt.astype(f), (phi.T @ yt).astype(f), (y.conj().T @ y).astype(f), ArrayBlock(y)
        if y_path is not None:
            y = out[3].y if isinstance(out[3], ArrayBlock) else out[3].dev.to_host(out[3].y)
            write_array(y_path, np.ascontiguousarray(y), chunks=(stored_y_rows(self.M, kp, self.dtype), kp))
        return out

    def apply_write(self, w: np.ndarray, dest: str | None, transposed_out: bool, description: str = "") -> Any:
        blk = DeviceBlock(self.dev, self.bd) if self.dev is not None else ArrayBlock(self.b)
        return blk.apply_to([w], dest, transposed_out=transposed_out)


def passes_device(job: Job, plan: SvdPlan, dtype: Any) -> str:
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


class Streamed:
    """``B`` streamed from storage: every method call is one pass over ``A``, counted by the job."""

    noise_scale = 0.0  # set for a centered B: the products are rounded at ||B||, before the means are removed
    signs = False  # the long factor written with the components' signs (methods.component_signs)

    def __init__(self, job: Job, A: Any, plan: SvdPlan, shift: Shift | None = None,
                 scaling: Scaling | None = None) -> None:
        self.job, self.A, self.plan, self.shift = job, A, plan, shift
        self.M, self.N = plan.M, plan.N
        self.dtype = A.dtype
        self.source = source(A, transposed=plan.transposed)
        #: the power of two the strips are divided by (learned from the first pass: blocklin.linalg.blocks.scaling)
        self.scaling = scaling if scaling is not None else Scaling.of(self.source, A.dtype)
        # a standardized wide A scales the rows of B = A^T, an operation only the CPU device has
        self.device = "cpu" if shift is not None and shift.r is not None else passes_device(job, plan, A.dtype)
        self.memory = plan.pass_memory
        #: ``(Q, B_c^T B_c Q)`` of a pass already made (the means pass fused with the first product)
        self.first: tuple[np.ndarray, np.ndarray] | None = None

    def _plan(self, kernel: Any, params: dict, reserve: int | None = None, **kw: Any) -> Any:
        # the whole budget with the in-core work reserved: a refusal names the total that suffices
        return plan_kernel_pass(self.job, kernel, [self.source], params, memory=self.plan.memory,
                                reserve=self.plan.client_bytes if reserve is None else reserve,
                                device=self.device, **kw)

    def _plan_r_factor(self, k: int) -> Any:
        # the method's bases are gone by the fallback's QR pass: only N x k blocks are held beside it
        return self._plan(tsqr_kernel, {"dtype": work_dtype(self.dtype).name}, reserve=tsqr_reserve_bytes(self.N, k))

    def preflight(self, k: int, *, means_gram: bool = False) -> None:
        """Plan every pass over ``A`` the method may run (shapes only, nothing read), so that a budget
        too small for any of them is refused before the first pass, with the minimum that fits: the
        means pass of a centered or scaled ``A`` (made with a :class:`Shift` of the run's shapes,
        :func:`blocklin.linalg.lowrank.budget._placeholder_shift`; ``means_gram``: the Gram route's Gram
        comes from the means pass, of a wide ``A`` from its columns centered as they are read), and the method's own passes with their centering terms and over the
        stored ``Y``. (The TSQR route a float64 run falls back to,
        :func:`blocklin.linalg.lowrank.methods.tsqr_svd`, is planned when the first pass shows it.)"""
        p, N = self.plan, self.N
        shifted = self.shift is not None
        if shifted and not means_gram:  # the fused means pass is taken only where it fits: this one must
            plan_column_moments(self.job, self.A, memory=p.memory, reserve=p.client_bytes)
        if p.method == "sketch":
            self.plan_over_y(p.sketch_size[0], self.sketch_y_chunk(0), k)  # the sketch's pass planned with it
        else:  # the widest product: a step's block, or the final Rayleigh-Ritz over Ritz vectors and residuals
            width = p.block if p.method == "rsvd" else max(p.block, k + enrich_width(k, p.block, N))
            product = self._plan(K.normal_kernel, self._shifted({"gram": True, "write_y": True}, Q=np.zeros((N, width))))
            self.plan_over_y(width, product.strip, k)
        if p.method == "gram" and means_gram and p.transposed:  # the columns of a wide A centered as read
            row_gram = {"center": self.shift.b is not None, "standardize": self.shift.r is not None}
            plan_moments_row_gram(self.job, self.A, memory=p.memory, reserve=p.client_bytes, **row_gram,
                                  **moments_gram_split(self.job, self.A, p.memory, p.client_bytes, row_gram=row_gram))
        elif p.method == "gram" and means_gram:
            plan_moments_gram(self.job, self.A, memory=p.memory, reserve=p.client_bytes,
                              **moments_gram_split(self.job, self.A, p.memory, p.client_bytes))
        elif p.method == "gram":
            self._plan_gram(self._gram_params())
        if p.method in ("lanczos", "gram"):
            self._plan(K.apply_kernel, self._shifted({"write": "F", "collect": False}, W=np.zeros((N, k))))

    def plan_over_y(self, c: int, chunk_rows: int, k: int) -> None:
        """Plan the passes over the stored ``M x c`` block ``Y`` (chunks of ``chunk_rows`` rows, as
        :meth:`_tmp_block` or the sketch's pass writes it) that orthonormalize it and write the long factor
        (:class:`TallBlock`: the budget less the in-core work): the chain of up to three ``c x c``
        triangular factors and the ``c x k`` Ritz vectors, and its TSQR. A strip of ``Y`` is no shorter
        than its chunk, so these can need more than the pass that wrote ``Y``: the sketch's had been
        refused at the minimum its pass over ``A`` named (3000 x 100 float32, ``k = 80``: 1.2x short)."""
        dt = np.dtype(self.dtype)
        y = dataclasses.replace(stored("(Y)", (self.M, c), dt, (chunk_rows, c)), reads="direct")
        chain = [_Shape((c, c), dt)] * 3 + [_Shape((c, k), dt)]
        for kernel, params in ((K.apply_kernel, {"W": chain, "write": "F", "collect": False}),
                               (tsqr_kernel, {"dtype": work_dtype(dt).name})):
            plan_kernel_pass(self.job, kernel, [y], params, memory=self.plan.memory, reserve=self.plan.client_bytes)
        # the long factor's columns of zero singular values completed (every one, at worst) as it is written
        plan_completion(self.job, y, chain[:-1], k, memory=self.plan.memory, reserve=self.plan.client_bytes)

    @property
    def peaks(self) -> np.ndarray | None:
        """Each column's ``max |B|``, recorded by the first pass over ``A`` (``None`` before it)."""
        return self.job.peaks.get(str(self.source.path))

    def _gram_params(self) -> dict:
        # float64 sums whatever the dtype: the subspace of a float32 A then comes from its exact Gram
        return {"dtype": work_dtype(self.dtype).name, "gpu": self.device == "gpu"}

    def _plan_gram(self, params: dict) -> Any:
        """The Gram route's SYRK pass: split as :func:`gram_pass_split` says where that plan fits, else one task."""
        split = gram_pass_split(self.N, self.dtype, self.plan.memory, self.device)
        if split is not GRAM_PASS:
            try:
                return self._plan(gram_pass_kernel, params, **split)
            except BudgetError:
                pass
        return self._plan(gram_pass_kernel, params, **GRAM_PASS)

    def gram(self, description: str = "") -> np.ndarray:
        """``B^T B`` (full, float64) from one SYRK pass (:func:`blocklin.linalg.products.gram`'s kernel)."""
        params = self._gram_params()
        return sum_gram_states(self._run(gram_pass_kernel, params, self._plan_gram(params),
                                         description))

    def r_factor(self, k: int, description: str = "") -> np.ndarray:
        """``R`` of ``B = Q R`` from one streaming TSQR pass (float64): no squares."""
        return reduce_r(self._run(tsqr_kernel, {"dtype": work_dtype(self.dtype).name}, self._plan_r_factor(k),
                                  description), self.N)

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

    def _sketch_params(self, seed: int, generator: int | None = None) -> dict:
        """The sketch pass's parameters: sizes, seed and generator (its tasks generate ``[Omega | Psi]``),
        and centered, the column scale ``c`` and offsets ``b`` the tasks premultiply it with."""
        kp, s = self.plan.sketch_size
        params = {"seed": seed, "generator": rnd.check_generator(generator), "N": self.N, "kp": kp, "s": s,
                  "dtype": np.dtype(self.dtype).str,
                  "y_buffer": min(SKETCH_Y_BUFFER, self.plan.memory // 64, self.M * kp * np.dtype(self.dtype).itemsize),
                  "y_temporaries": self.job.cfg.codec != "none" or temp_root(self.job.cfg).scheme != "local"}
        if self.shift:
            params |= {"shift_c": self.shift.c, "shift_b": self.shift.b} | self.shift.params(self.dtype)
        if self.source.first_row:  # a pass over appended rows: the test matrices' rows where they are stored
            params["row0"] = self.source.first_row
        return params

    def plan_sketch_pass(self, seed: int, generator: int | None = None) -> Any:
        """Plan the sketch's pass over ``A`` (shapes only, nothing read): :meth:`_plan_sketch`."""
        return self._plan_sketch(self._sketch_params(seed, generator))

    def sketch_y_chunk(self, seed: int, generator: int | None = None) -> int:
        """The chunk height of the ``Y`` the sketch's pass writes (whole strips of ``y_buffer`` bytes)."""
        params = self._sketch_params(seed, generator)
        row_bytes = self.plan.sketch_size[0] * np.dtype(self.dtype).itemsize
        return output_chunk_rows(self._plan_sketch(params), params["y_buffer"] // row_bytes)

    def _plan_sketch(self, params: dict) -> Any:
        """The sketch's pass within the budget, split as :func:`blocklin.plan.svd.sketch_tasks` says."""
        p = self.plan
        tasks = sketch_tasks(p.M, p.N, p.sketch_size, np.dtype(self.dtype).itemsize, p.memory)
        plan = plan_kernel_pass(self.job, K.sketch_kernel, [self.source], params, memory=p.memory,
                                reserve=p.client_bytes, min_tasks=tasks, device=self.device)
        threads = sketch_blas_threads(plan.blas_threads, plan.strip, p.N, p.sketch_size)
        return plan if threads == plan.blas_threads else dataclasses.replace(plan, blas_threads=threads)

    def sketch(self, kp: int, s: int, seed: int, y_path: Any = None,
               generator: int | None = None) -> tuple:
        """As :meth:`Source.sketch`; ``generator``: the test matrices' (None: the current one; an older one
        for the appended rows of a sketch made with it, :mod:`blocklin.linalg.update.sketch`)."""
        params = self._sketch_params(seed, generator)
        plan = self._plan_sketch(params)
        params["y_chunk"] = output_chunk_rows(plan, params["y_buffer"] // (kp * np.dtype(self.dtype).itemsize))
        if y_path is None:
            blk = self._tmp_block(kp, params["y_chunk"])
        else:  # kept in the output (an updatable result): written there by the pass, read there after it
            create_array(y_path, shape=(self.M, kp), dtype=self.dtype, chunks=(params["y_chunk"], kp), codec="none")
            blk = TallBlock(self.job, y_path, self.M, kp, self.dtype, params["y_chunk"], self.memory)
        states = self._run(K.sketch_kernel, params, plan, "sketch: single pass", outputs=(("Y", blk.path),))
        xt = reduce_sum(states, "Xt")
        if self.shift:
            xt = self.shift.finish(xt, reduce_sum(states, "TX") if params.get("shifted") else None)
        return xt, reduce_sum(states, "PZ"), reduce_sum(states, "G"), blk

    def rmat(self, u: np.ndarray, description: str = "") -> np.ndarray | None:
        """``B^H u`` (float64 or complex128) from one pass over ``A``, the ``M x d`` block ``u`` held in memory
        (:func:`~blocklin.linalg.blocks.tall_kernels.rmat_kernel`: ``B^T conj(u)``, conjugated once);
        ``None`` where that pass does not plan within the budget (the caller keeps what it has)."""
        wd = work_dtype(self.dtype)
        cplx = wd.kind == "c"
        params = {"Y": np.ascontiguousarray(np.conj(u) if cplx else u).astype(self.dtype, copy=False), "n": self.N}
        try:
            plan = self._plan(K.rmat_kernel, params)
        except BudgetError:
            return None
        z = np.asarray(reduce_sum(self._run(K.rmat_kernel, params, plan, description), "Z"), dtype=wd)
        return np.conj(z) if cplx else z

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


def stored_y_rows(M: int, kp: int, dtype: Any) -> int:
    """Chunk height of a kept ``Y`` written from memory: about :data:`SKETCH_Y_BUFFER` per chunk."""
    return max(1, min(M, SKETCH_Y_BUFFER // max(1, kp * np.dtype(dtype).itemsize)))


def load_incore(job: Job, A: Any, plan: SvdPlan) -> np.ndarray:
    """Read ``B`` (``A`` or ``A^T``) into memory in one pass, leaving room for the in-core work."""
    memory = max(plan.memory - plan.M * plan.N * A.dtype.itemsize, plan.memory // 4)
    return load_tall(job, A, transposed=plan.transposed, memory=memory,
                     description="read A into memory (pass 1 over A)")
