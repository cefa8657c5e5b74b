"""Tikhonov solves whose Gram matrix exceeds the budget: out-of-core Cholesky of ``A^H A + lam^2 I``.

:func:`blocklin.solve` keeps the ``n x n`` (``m x m`` for wide ``A``) regularized Gram matrix in core
when it fits; beyond that it comes here (``method="auto"`` or ``"normal"``, one scalar ``lam``). Real
data is computed in float64, complex data in complex128 (``A^H`` for ``A^T``: HERK, ``L L^H``, the
back substitution with ``L^H``; the GEMM's transposes are plain ones, so ``A^H v = conj(A^T conj(v))``).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from blocklin.config import format_size
from blocklin.linalg.products.gemm import Gemm
from blocklin.linalg.solve.normal import cholesky_condition
from blocklin.linalg.solve.report import solve_report
from blocklin.operands import Operand
from blocklin.plan.factor import plan_factor
from blocklin.linalg.factor.cholesky_tiles import tiled_cholesky
from blocklin.runtime.blockops import BlockOps, Region
from blocklin.runtime.job import Job
from blocklin.storage.identity import plan_settings, resume_token

F64 = np.dtype(np.float64)
C128 = np.dtype(np.complex128)


def compute_dtype(A: Any, B: Any) -> np.dtype:
    """The dtype the stored-Gram route computes in: complex128 for complex data, else float64."""
    return C128 if "c" in (A.dtype.kind, B.dtype.kind) else F64


def solve_gram_stored(job: Job, A: Any, B: Any, lam: float, *, out: Any, overwrite: bool, explain: bool,
                      refine: Any, params: dict, resume: bool = False) -> Any:
    """The regularized Gram matrix exceeds the budget: store it and factor it out of core."""
    (m, n), side = A.shape, min(A.shape)
    if explain:
        return plan_factor("cholesky", side, compute_dtype(A, B), memory=job.cfg.memory, workers=job.workers(1))
    token = _stored_gram_token(job, A, B, lam, refine, out)
    ao = job.claim(out, [A, B], overwrite=overwrite, resume=resume, token=token)
    info = solve_gram_out_of_core(job, A, B, lam, ao, refine=refine, resume=resume, token=token)
    report, recorded = solve_report(job, route="stored gram", orientation="wide" if m < n else "tall", **info)
    x = job.finish(ao, out, report, operation="solve", plan=info.get("plan", {}), params=params,
                   recorded=recorded)
    x.intercept = None  # as every route's x: no intercept fitted (the route does not center)
    return x


def _stored_gram_token(job: Job, A: Any, B: Any, lam: float, refine: Any, out: Any) -> str:
    """Deterministic in what decides the stored-Gram route's bits: inputs, ``lam``, ``refine``, output and the
    settings its tile plans depend on."""
    return resume_token("solve-gram", [A, B], lam, refine, str(out), plan_settings(job))


def solve_gram_out_of_core(job: Any, A: Any, B: Any, lam: float, ao: Any, *, refine: Any = "auto",
                           resume: bool = False, token: str = "") -> dict:
    """``min ||A x - b||^2 + lam^2 ||x||^2`` with the regularized Gram matrix stored, not held.

    Tall/square ``A`` (``m >= n``): ``K = A^T A + lam^2 I`` and ``A^T b`` by the blocked region SYRK over
    ``A^T`` (in one read of ``A`` per block row; Dongarra et al., 1990, for SYRK), its tiled Cholesky,
    ``x = K^{-1} A^T b`` by two out-of-core triangular solves, then ``refine`` steps (default 1) of
    iterative refinement against the original problem (``x += K^{-1} (A^T (b - A x) - lam^2 x)``).
    Wide ``A``: the dual form ``x = A^T y``, ``(A A^T + lam^2 I) y = b``, refined on the dual
    system. Everything is computed in float64; ``x`` is written in the operands' dtype to ``x_path`` (created here).

    Complex data (LAPACK's conventions, computed in complex128): ``K = A^H A + lam^2 I`` and ``A^H b``
    by the region HERK over the conjugate-transposed view ``A^H`` (``A A^H`` for wide ``A``), the tiled
    ``K = L L^H``, ``K^-1 = L^-H L^-1`` (the back substitution with ``trans="C"``), the refinement's
    ``A^H r = conj(A^T conj(r))`` and the dual ``x = A^H y`` likewise (the out-of-core GEMM transposes
    without conjugating; the conjugations are passes over the ``k``-column stores).

    Accuracy: ``cond(K) <= 1 + (sigma_1 / lam)^2``, so the error of ``x`` before refinement is about
    ``cond(K) eps``; refinement against the original problem recovers what the conditioning of the
    least-squares problem itself allows, while ``cond(K) eps < 1`` (else the Cholesky fails with
    :class:`~blocklin.errors.NotPositiveDefiniteError`: choose a larger ``lam``).

    Resume (``resume=True``, the atomic output ``ao`` taken over): every step runs as a recorded stage
    (:class:`~blocklin.runtime.stages.Stages`) over stores in a deterministic work folder named by
    ``token``; the SYRK and Cholesky tiles keep their markers there, and the solution iterates alternate
    between two stores, so no step writes what it reads and ``x`` has the bits of an uninterrupted run.
    """
    from blocklin.runtime.stages import Stages
    from blocklin.storage.zarr_store import create_array

    g = _GramSolve(job, A, B, lam, stages=None)
    x_path, (n, k) = ao.array_path(), (A.shape[1], B.shape[1])
    work = job.work_dir("solve", token, output=ao, resume=resume)
    g.stages = Stages(work, ao.done, resume=resume and ao.resumed, codec=job.cfg.codec, start=lambda: create_array(
        x_path, shape=(n, k), dtype=np.result_type(A.dtype, B.dtype), chunks=(min(g.t, n), min(g.t, k)),
        codec=job.cfg.codec, overwrite=True))
    g.markers = work / "tile-markers"
    g.scale_b()
    g.make_stores()
    g.stage_b()
    g.factor()
    steps = 1 if refine == "auto" else int(refine)
    warn_stored_condition(g.kappa, g.lam, "A A^T" if g.wide else "A^T A", cplx=g.cplx)
    xs = g.solve_wide(steps) if g.wide else g.solve_tall(steps)
    return g.finish(xs, x_path, steps)


def diagonal_condition(dk: np.ndarray, dl: np.ndarray) -> float:
    """A lower estimate of ``cond_2(K)`` from the diagonals of ``K = L L^H`` and of its Cholesky factor:
    ``lambda_max(K) >= max K_ii`` and ``lambda_min(K) = sigma_min(L)^2 <= min |L_ii|^2`` (the singular
    values of a triangular matrix bracket the moduli of its diagonal, its eigenvalues: Horn and Johnson,
    *Topics in Matrix Analysis*, 1991, 3.3.4 / Weyl's product inequalities). A column nearly in the span of
    the ones before it has a small ``L_ii`` (Cholesky's pivot is its distance to them, squared), so
    graded or nearly dependent columns show; the ``s / tile`` diagonal blocks are what it reads."""
    top, low = float(np.max(dk, initial=0.0)), float(np.min(np.abs(dl), initial=np.inf)) ** 2
    if top == 0.0:
        return 1.0
    return top / low if low > 0 else float("inf")


def warn_stored_condition(kappa: float, lam: float, gram: str, *, cplx: bool = False) -> None:
    """Warn as the in-memory normal equations do (:func:`blocklin.linalg.solve.normal.refuse_or_warn`)
    where the stored ``K``'s condition estimate passes ``1 / AUTO_RCOND``: its Cholesky solve loses
    ``log10(cond(K))`` digits before refinement, which recovers them only while ``cond(K) eps < 1``."""
    from blocklin.errors import warn
    from blocklin.linalg.solve.normal import AUTO_RCOND

    if kappa * AUTO_RCOND <= 1.0:
        return
    gram = gram.replace("^T", "^H") if cplx else gram
    warn(f"solve: the stored {gram} + lam^2 I (over the budget) has a condition estimate of {kappa:.1e} "
         f"(report['condition_estimate'] after refinement; lam = {lam:.3g}); the normal equations may lose "
         "accuracy (refinement helps while it is below 1 / eps); a larger lam avoids it, or a budget that holds "
         "the streaming QR's R factor (method='qr') avoids squaring the condition number")


class _GramSolve:
    """The stores and steps of one out-of-core Gram solve (all float64, or complex128 for complex data;
    square tiles of ``tile``)."""

    def __init__(self, job: Any, A: Any, B: Any, lam: float, stages: Any) -> None:
        self.job, self.A, self.B, self.lam = job, A, B, lam
        (self.m, self.n), self.k = A.shape, B.shape[1]
        self.wide = self.m < self.n
        self.s = self.m if self.wide else self.n
        self.dt = compute_dtype(A, B)
        self.cplx = self.dt.kind == "c"
        plan = _tile_plan(job, A, self.s, self.k, self.wide, self.dt)
        self.t = plan.tile
        self.ops = BlockOps(job, self.t)
        self.ops.workers = plan.workers
        self.stages, self.markers = stages, None
        # the solve runs on 2^-e b (e: the exponent of max |b|; x is linear in b):
        # its iterates sit near K^-1 times a right-hand side near 1, where an x of 2^1090 had overflowed the
        # substitutions (refused as a singular tile); x = 2^e z is judged and written once (finish)
        self.e = 0
        #: one power per column where one for all would lose a column (:meth:`scale_b`; None: ``e`` for all), and
        #: the right-hand side the solve reads: ``B``, or its copy with each column divided by its own power
        self.columns: np.ndarray | None = None
        self.rhs = B

    def scale_b(self) -> None:
        """``e`` (:attr:`down`) from ``b``'s column maxima, before any step. The route scales all of ``b`` by that
        one power (the GEMMs' and substitutions' scalar ``alpha``) unless it would take a column's largest entry
        below ``2^-510`` (its squares, of which the reported norms are made, out of float64's normal range) or
        below the normal range itself (:func:`~blocklin.linalg.blocks.scaling.column_exponents_for`): then each
        column is divided by its own power into a copy of ``b`` in the solve's dtype (:meth:`stage_b`) that the solve reads
        with ``e = 0``, and column ``j`` of ``x`` is multiplied back by its own (:attr:`col_e`), as the in-memory
        routes do. Columns ``2^1200`` apart had been refused here, and before that flushed to 0 and refused after
        the factorization as an ``x`` below the range."""
        from blocklin.linalg.blocks.scaling import column_exponents_for

        self.e, top = _scale_exponent(self.B.path, int(getattr(self.B, "first_row", 0)), self.m)
        cols = column_exponents_for(top, self.e, F64)
        if cols is not None:  # within [-1000, 1000] as e: 2^c and 2^-c are float64 numbers, each exact
            self.columns, self.e = np.clip(cols, -1000, 1000).astype(np.int64), 0

    @property
    def col_e(self) -> Any:
        """The power of two each column of ``x`` is multiplied back by: :attr:`columns`, else ``e``."""
        return self.columns if self.columns is not None else self.e

    def stage_b(self) -> None:
        """``b`` with column ``j`` divided by ``2^columns[j]`` (exact) into a store of the solve's dtype, one pass per column,
        which the solve reads as its right-hand side (where :meth:`scale_b` set :attr:`columns`)."""
        if self.columns is None:
            return
        path = self.store("b", self.m, self.k)

        def scale() -> None:
            for j, c in enumerate(self.columns):
                col = Region.of(self.B.path, (self.m, 1), off=(0, j))
                self.ops.axpby(Region.of(path, (self.m, 1), off=(0, j)), col, col, alpha=float(np.ldexp(1.0, -int(c))),
                               beta=0.0, dtype=self.dt, description=f"b column {j} / 2^{int(c)}")
        self.step("scale b", scale)
        self.rhs = self.operand(path, (self.m, self.k), "b")

    def make_stores(self) -> None:
        """Every store of the solve, created before any step in a fixed order (their names number them)."""
        s, k, n = self.s, self.k, self.n
        self.gram, self.l = self.store("gram", s, s), self.store("l", s, s)
        self.y = self.store("y", s, k)
        self.z, self.z_next = self.store("z", s, k), self.store("z", s, k)  # the iterates, alternating
        self.r, self.d = self.store("r", self.m, k), self.store("d", s, k)
        self.c = self.store("c", n, k) if not self.wide else None
        self.xt = self.store("xt", n, k) if self.wide else None
        self.rc = self.store("rc", self.m, k) if self.cplx and not self.wide else None  # conj(r), last: numbering

    def chunks(self, cols: int) -> tuple[int, int]:
        """Tiles of ``t`` rows; a store of ``k < t`` columns (right-hand sides) is one chunk wide, not
        padded to ``t`` columns (zarr stores a chunk whole: ``t / k`` times the bytes for each row tile)."""
        return (self.t, min(self.t, max(1, cols)))

    def store(self, name: str, rows: int, cols: int) -> str:
        return self.stages.store(name, (rows, cols), self.dt, self.chunks(cols))

    def step(self, name: str, fn: Any) -> Any:
        """``fn()`` as a recorded stage (skipped when a resumed run finished it)."""
        return self.stages.run(name, fn)

    def operand(self, path: str, shape: tuple[int, int], name: str) -> Operand:
        return Operand(name=name, path=path, shape=shape, dtype=self.dt, chunks=self.chunks(shape[1]))

    def gemm(self, out: str, a: Any, b: Any, c: Any = None, *, trans_a: bool = False, alpha: float = 1.0,
             beta: float = 0.0, description: str) -> None:
        op = Gemm.of(a, b, c, trans_a=trans_a, alpha=alpha, beta=beta, dtype=self.dt.name)
        gp = op.plan(self.job, out_chunks=(min(self.t, op.shape[0]), min(self.t, op.shape[1])),
                     read_reserve=True)  # measured over budget at 16 MiB without it
        op.run(self.job, gp, out, description=description, count_pass="a" if a is self.A else "intermediate")

    def region(self, path: str, rows: int) -> Region:
        return Region.of(path, (rows, self.k))

    def conj_into(self, dst: str, src: str, rows: int, *, beta: float = 0.0, y: str | None = None,
                  description: str) -> None:
        """``dst = conj(src) + beta * y`` tile by tile (``dst`` may be ``src``: each task reads, then writes,
        its own tile); a copy of real data."""
        x = dataclasses.replace(self.region(src, rows), conj=True)
        self.ops.axpby(self.region(dst, rows), x, self.region(y, rows) if y is not None else x, alpha=1.0,
                       beta=beta, dtype=self.dt, description=description)

    def adjoint_product(self, out: str, v: str, tmp: str, rows: int, description: str) -> None:
        """``out = A^H v`` (``v`` of ``rows`` rows): the GEMM's ``A^T`` of ``conj(v)`` (staged in ``tmp``),
        conjugated in place; ``A^T v`` of real data."""
        A, k = self.A, self.k
        src = v
        if self.cplx:
            self.conj_into(tmp, v, rows, description="conj(v)")
            src = tmp
        self.gemm(out, A, self.operand(src, (rows, k), "v"), trans_a=True, description=description)
        if self.cplx:  # out is rewritten whole by the GEMM before this in-place pass: a rerun is safe
            self.conj_into(out, out, A.shape[1], description="conj(A^T v)")

    def add_to_z(self, description: str) -> None:
        """``z_next = z + d``, then the two swap roles (out of place: a rerun of the step reads the same z)."""
        self.ops.axpby(self.region(self.z_next, self.s), self.region(self.z, self.s), self.region(self.d, self.s),
                       dtype=self.dt, description=description)

    @property
    def down(self) -> float:
        """``2^-e``, the scaling of ``b`` (exact)."""
        return float(np.ldexp(1.0, -self.e))

    def swap(self) -> None:
        self.z, self.z_next = self.z_next, self.z

    def factor(self) -> None:
        """``K = A^T A + lam^2 I`` (tall) or ``A A^T + lam^2 I`` (wide), lower tiles, and its Cholesky factor.

        Tall: ``c = A^T b`` comes from the same read of ``A`` (the diagonal SYRK blocks). Complex data:
        the region HERK of ``A^H`` (``a a^H`` of the view ``a = A^H`` is ``A^H A``, its ``a b`` is ``A^H b``).
        """
        s = self.s
        g_path, l_path = self.gram, self.l
        a_reg = Region.of(self.A.path, self.A.shape)
        self.step("gram", lambda: self.ops.syrk(
            Region.of(g_path, (s, s)), a_reg if self.wide else a_reg.H, dtype=self.dt, shift=self.lam**2,
            check=self.job.check_finite, done_dir=self.markers,
            rhs=None if self.wide else Region.of(self.rhs.path, self.rhs.shape),
            rhs_out=None if self.wide else self.region(self.c, self.n),
            description=f"Gram blocks {'A A^T' if self.wide else 'A^T A, A^T b'} + lam^2 I") and None)
        from blocklin.linalg.products.gram import check_diagonal, stored_diagonal

        # the stored Gram is summed from unscaled squares: refused where they left float64's range
        dk = check_diagonal(g_path, s, self.t, F64, "the stored-Gram route, for a Gram over the budget, sums unscaled "
                       "squares", "or raise memory= so the in-memory routes (which scale by themselves) hold it",
                       zero_ok=self.lam == 0, operands="a (and b)")  # lam > 0: a zero diagonal underflowed
        self.step("cholesky", lambda: tiled_cholesky(
            self.ops, Region.of(g_path, (s, s)), Region.of(l_path, (s, s)), dtype=self.dt, check=False, done_dir=self.markers,
            description="Cholesky of the Gram matrix") and None)
        self.lreg = Region.of(l_path, (s, s))
        self.kappa = diagonal_condition(dk, stored_diagonal(l_path, s, self.t))

    def k_solve(self, rhs: str, dst: str, alpha: float = 1.0) -> None:
        """``dst = K^-1 (alpha rhs)`` by forward and back substitution (``L^H`` of complex data)."""
        y = self.region(self.y, self.s)
        self.ops.trsm(self.lreg, self.region(rhs, self.s), y, lower=True, alpha=alpha, dtype=self.dt,
                      description="forward substitution")
        self.ops.trsm(self.lreg, y, self.region(dst, self.s), lower=True, trans="C", dtype=self.dt,
                      description="back substitution")

    def solve_wide(self, steps: int) -> str:
        """The dual variable ``y`` refined on ``(A A^T + lam^2 I) y = b``; returns the store of ``x = A^T y``."""
        A, B, m, n, k = self.A, self.rhs, self.m, self.n, self.k
        self.step("solve", lambda: self.k_solve(B.path, self.z, alpha=self.down))
        for _ in range(steps):  # rd = b - A A^T y - lam^2 y, y += K^-1 rd
            x_tmp = self.xt

            def dual_residual() -> None:  # r is rewritten whole before its in-place update: a rerun is safe
                self.adjoint_product(x_tmp, self.z, self.d, self.s, "x = A^H y")  # d: rewritten by the correction
                self.gemm(self.r, A, self.operand(x_tmp, (n, k), "x"), B, alpha=-1.0, beta=self.down,
                          description="b - A x")
                r_reg = self.region(self.r, m)
                self.ops.axpby(r_reg, r_reg, self.region(self.z, self.s), beta=-self.lam**2, dtype=self.dt,
                               description="dual residual")
            self.step("dual residual", dual_residual)
            self.step("correction", lambda: self.k_solve(self.r, self.d))
            self.step("update", lambda: self.add_to_z("y += d"))
            self.swap()
        xs = self.xt
        self.step("x", lambda: self.adjoint_product(xs, self.z, self.d, self.s, "x = A^H y"))
        return xs

    def solve_tall(self, steps: int) -> str:
        """``x`` refined against the original problem; returns its store."""
        A, B, k = self.A, self.rhs, self.k
        c_path = self.c  # A^T b, from the SYRK's read of A (rewritten by refinement)
        self.step("solve", lambda: self.k_solve(c_path, self.z, alpha=self.down))
        for _ in range(steps):
            zop = self.operand(self.z, (self.s, k), "z")
            self.step("residual", lambda: self.gemm(self.r, A, zop, B, alpha=-1.0, beta=self.down,
                                                    description="r = b - A x"))
            self.step("normal residual", lambda: self.normal_residual(c_path, zop))
            self.step("correction", lambda: self.k_solve(c_path, self.d))
            self.step("update", lambda: self.add_to_z("x += d"))
            self.swap()
        return self.z

    def normal_residual(self, c_path: str, zop: Operand) -> None:
        """``c = A^H r - lam^2 x``: one GEMM of real data; of complex data ``A^T conj(r)``, then
        ``c = conj(c) - lam^2 x`` in place (``c`` is rewritten whole by the GEMM first: a rerun is safe)."""
        A, m, k = self.A, self.m, self.k
        if not self.cplx:
            # x only where lam > 0: a c with beta = 0 is Gemm's user warning ("c is ignored"), said on every step
            # of a plain least-squares solve
            shift = -self.lam**2
            self.gemm(c_path, A, self.operand(self.r, (m, k), "r"), zop if shift else None, trans_a=True, alpha=1.0,
                      beta=shift, description="A^T r - lam^2 x")
            return
        self.conj_into(self.rc, self.r, m, description="conj(r)")  # out of place: a rerun reads the same r
        self.gemm(c_path, A, self.operand(self.rc, (m, k), "conj(r)"), trans_a=True, description="A^T conj(r)")
        self.conj_into(c_path, c_path, self.n, beta=-self.lam**2, y=self.z, description="A^H r - lam^2 x")

    def finish(self, xs: str, x_path: str, steps: int) -> dict:
        """Write ``x`` to ``x_path`` (created at the start) in the operands' dtype; the route's report fields
        from the final residual, and what a resumed run skipped."""
        A, B, m, n, k, lam = self.A, self.rhs, self.m, self.n, self.k, self.lam
        self.step("final residual", lambda: self.gemm(self.r, A, self.operand(xs, (n, k), "x"), B, alpha=-1.0,
                                                      beta=self.down, description="final residual b - A x"))
        rr = _col_sumsq(self.ops, self.r, (m, k))  # of 2^-e (b - A x) and 2^-e x
        xx = _col_sumsq(self.ops, xs, (n, k))
        self._check_x_range(xs)
        self.step("write x", lambda: self.write_x(xs, x_path))

        def norms(v: np.ndarray) -> Any:
            with np.errstate(over="ignore"):  # a norm beyond float64's range is reported as inf
                v = np.ldexp(np.sqrt(np.maximum(v, 0.0)), self.col_e)
            return float(v[0]) if v.size == 1 else v.tolist()

        gram = "A A^T" if self.wide else "A^T A"
        gram = gram.replace("^T", "^H") if self.cplx else gram
        return {"method": "normal", "method_reason": f"the {self.s} x {self.s} regularized Gram matrix "
                f"({gram} + lam^2 I, {format_size(self.s * self.s * self.dt.itemsize)}) exceeds the budget: "
                "stored and factored by the out-of-core tiled Cholesky, refined against the original problem",
                "lam": lam, "residual_norm": norms(rr), "solution_norm": norms(xx),
                "objective": norms(rr + lam**2 * xx), "refine_steps": steps, "gram": "out of core",
                "residual_norm_source": "final residual pass", "gram_tile": self.t,
                "norm_a": None, "cond_estimate": float(np.sqrt(self.kappa)),
                "condition_estimate": cholesky_condition(1.0 / self.kappa, steps),
                "phases": {"Gram SYRK, Cholesky, solves": self.job.device},
                "resumed": self.stages.resumed, "stages_skipped": self.stages.skipped}


    def write_x(self, xs: str, x_path: str) -> None:
        """``x = 2^e z`` into ``x_path``, each column by its own power where :attr:`columns` is set."""
        n = self.n
        if self.columns is None:
            xreg = self.region(xs, n)
            self.ops.axpby(self.region(x_path, n), xreg, xreg, alpha=float(np.ldexp(1.0, self.e)), beta=0.0,
                           dtype=self.dt, description="write x = 2^e z")
            return
        for j, c in enumerate(self.columns):
            col = Region.of(xs, (n, 1), off=(0, j))
            self.ops.axpby(Region.of(x_path, (n, 1), off=(0, j)), col, col, alpha=float(np.ldexp(1.0, int(c))),
                           beta=0.0, dtype=self.dt, description=f"write x column {j} = 2^{int(c)} z")

    def _check_x_range(self, xs: str) -> None:
        """``x`` judged as the in-memory routes judge theirs (:func:`~blocklin.linalg.blocks.result_range.check_columns`):
        the route solves for ``z = 2^-e x`` (``b`` scaled near 1) and ``x = 2^e z`` is rounded once as written: a
        column of ``x`` flushed to 0 or beyond the range where ``b``'s is not 0 is refused naming ``b`` and the power
        of two, one in the output dtype's subnormal range warns. ``A`` near ``2^450`` and ``b`` near ``2^-640`` had
        returned ``x = 0`` without a word; the wide route's subnormal ``x`` (near ``2^-1050``) was refused, its
        ``y`` below the range; an ``x`` near ``2^1090`` overflowed the substitutions and was refused as a singular
        or overflowing tile of ``t``."""
        from blocklin.linalg.blocks.result_range import ColumnRange, check_columns, scaled_columns
        from blocklin.storage.zarr_store import row_bands

        out = np.result_type(self.A.dtype, self.B.dtype)
        cols = ColumnRange(self.k)
        for _, block in row_bands(xs):  # x = 2^e z as written (axpby's product by 2^e rounds once, as ldexp)
            cols.merge(scaled_columns(block, self.col_e, out)[1])
        live = np.zeros(self.k, dtype=bool)
        for _, block in row_bands(self.B.path, first=int(getattr(self.B, "first_row", 0)), n=self.m):
            live |= np.any(block != 0, axis=0)
        cols.nonzero |= live
        gram = "(A A^H + lam^2 I)^-1 (2^-e b)" if self.wide else "(A^H A + lam^2 I)^-1 A^H (2^-e b)"
        check_columns(cols, self.col_e, out, detail=f"the stored-Gram route, for a Gram over the budget, forms x = 2^e A^H y, "
                      f"y = {gram}" if self.wide else f"the stored-Gram route, for a Gram over the budget, forms "
                      f"x = 2^e {gram}", fix="scale b up by a power of two 2^e (exact: x is 2^e times the "
                      "solution) and scale x back yourself, or raise memory= so the in-memory routes (which scale "
                      "by powers of two themselves) hold the Gram matrix")


def _scale_exponent(path: str, first: int, rows: int) -> tuple[int, np.ndarray]:
    """``e`` with the stored right-hand side's largest magnitude in ``[2^(e-1), 2^e)``, kept within
    ``[-1000, 1000]`` so that ``2^e`` and ``2^-e`` are float64 numbers (0 for a zero right-hand side), and
    each column's largest magnitude."""
    from blocklin.linalg.blocks.result_range import column_maxima

    cols = column_maxima(path, first=first, rows=rows)
    top = float(cols.max(initial=0.0))
    e = int(np.frexp(top)[1]) if 0 < top < np.inf else 0
    return int(np.clip(e, -1000, 1000)), cols


def _tile_plan(job: Any, A: Any, s: int, k: int, wide: bool, dt: Any = F64) -> Any:
    """Tiles of the Gram matrix, its factor and the solves.

    On ``A``'s square chunks when they fit (every store of the solve then shares them with ``A``,
    which the region GEMMs over ``A`` need to plan within small budgets); a larger multiple of them
    when the budget holds it and those GEMMs still plan: the left-looking Cholesky reads
    ``n^3 / (3 t)`` elements and runs ``(n / t)^2 / 2`` tasks, so the largest tile wins.
    """
    from blocklin.errors import BudgetError

    base = plan_factor("cholesky", s, dt, memory=job.cfg.memory, workers=job.workers(1), chunks=tuple(A.chunks))
    try:
        big = plan_factor("cholesky", s, dt, memory=job.cfg.memory, workers=job.workers(1))
    except BudgetError:
        return base
    c = tuple(A.chunks)
    if c[0] != c[1] or base.tile != c[0] or big.tile <= base.tile or big.tile % base.tile or big.tile >= s:
        return base
    m, n = A.shape
    t = big.tile
    try:  # the products over A that the solve runs, with its stores on tiles of t
        v = Operand(name="v", path="", shape=(m if wide else n, k), dtype=dt, chunks=(t, min(t, k)))
        Gemm.of(A, v, trans_a=wide, dtype=np.dtype(dt).name).plan(job, out_chunks=(t, min(t, k)))
        r = Operand(name="r", path="", shape=(n if wide else m, k), dtype=dt, chunks=(t, min(t, k)))
        Gemm.of(A, r, trans_a=not wide, dtype=np.dtype(dt).name).plan(job, out_chunks=(t, min(t, k)))
    except BudgetError:
        return base
    return big


def _col_sumsq(ops: BlockOps, path: str, shape: tuple[int, int]) -> np.ndarray:
    """Column sums of squares of a stored ``rows x k`` matrix (k small), one block sumsq per column."""
    return np.array([ops.sumsq(Region.of(path, (shape[0], 1), off=(0, j)), description="column norm")
                     for j in range(shape[1])])


__all__ = ["compute_dtype", "solve_gram_out_of_core", "solve_gram_stored"]
