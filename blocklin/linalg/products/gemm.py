"""Blocked out-of-core GEMM: ``alpha * op(A) @ op(B) + beta * C``.

:func:`matmul` is the public operation (its own job, output and report); :class:`Gemm` is the same
product inside a job that another operation already runs (the wide regularized solve forms
``A A^T`` and ``A^T y`` with it), so operations compose without nesting jobs.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
from collections.abc import Callable
from typing import Any, Unpack

import numpy as np

from blocklin.config import Settings
from blocklin.device.pool import reusing
from blocklin.errors import ParameterError, ShapeError, warn
from blocklin.errors import explain as _msg
from blocklin.linalg.blocks.scaling import (max_abs, max_and_smallest_nonzero, max_finite_abs, narrow_range,
                                           range_refusal, recorded_line_peaks)
from blocklin.matrix import Matrix
from blocklin.plan.gemm import GemmPlan, _panel_reads, plan_gemm
from blocklin.plan.rechunk import rechunk_advice
from blocklin.plan.thin import ThinPlan
from blocklin.runtime.graph import TileGraph
from blocklin.runtime.job import Job
from blocklin.storage.identity import plan_settings, resume_token
from blocklin.runtime.tiles import GemmSpec, gemm_runs, gemm_tiles, tile_peaks
from blocklin.linalg.products.below_normal import refusal as below_normal_refusal, shortfall, split_power
from blocklin.linalg.products.thin import run_thin, thin_plan
from blocklin.operands import temp_root
from blocklin.storage.atomic import open_or_create_array
from blocklin.storage.location import as_location
from blocklin.storage.recorded_peaks import PeakTally, recordable, record as record_peaks
from blocklin.storage.zarr_store import read_kind
from blocklin.validate import finite, result_dtype
from blocklin.validate import precision as check_precision

#: ``matmul(precision=...)``: a product has no refinement step, so ``"mixed"`` has no meaning here.
PRECISIONS = ("default", "float64", "float32", "tf32")


def _op_shape(shape: tuple[int, int], trans: bool) -> tuple[int, int]:
    return (shape[1], shape[0]) if trans else shape


@dataclasses.dataclass(frozen=True)
class Gemm:
    """``alpha * op(A) @ op(B) + beta * C`` over resolved operands, run inside an existing job.

    Build it with :meth:`of` (which checks the shapes), plan it with :meth:`plan` and write it into
    an array created with the plan's output chunks with :meth:`run`.
    """

    A: Any
    B: Any
    C: Any
    alpha: float
    beta: float
    trans_a: bool
    trans_b: bool
    dtype: Any
    #: The dtype the tiles are computed in (``dtype`` unless ``precision=`` asks for another).
    compute: Any = None
    #: ``precision=`` as normalized (``"default"``, ``"float64"``, ``"float32"``, ``"tf32"``).
    precision: str = "default"
    #: A stored ``1 x K`` row both operands are shifted by as they are read (:attr:`GemmSpec.shift
    #: <blocklin.runtime.tiles.GemmSpec.shift>`; set with :func:`dataclasses.replace`), or None.
    shift: Any = None
    #: The row of ``A`` that ``shift`` holds (the resume token names it: a product less row 0 and one less row
    #: ``t`` are different products).
    shift_row: int = 0

    def __post_init__(self) -> None:
        if self.compute is None:  # built without of(): computed in the output dtype
            object.__setattr__(self, "compute", self.dtype)

    @classmethod
    def of(cls, A: Any, B: Any, C: Any = None, *, alpha: float = 1.0, beta: float = 0.0, trans_a: bool = False,
           trans_b: bool = False, dtype: Any = None, precision: Any = None) -> Gemm:
        precision = check_precision(
            precision, PRECISIONS, operation="matmul", why="a product has no refinement step: 'float32' or 'tf32' "
            "compute it in float32 and store it in the result dtype",
            fix="pass precision='float32' (or 'tf32', or None for the operands' dtype)")
        alpha = finite("alpha", alpha, fix="pass alpha=1.0")
        beta = finite("beta", beta, fix="pass beta=0.0 (or 1.0 to add c)")
        m, ka = _op_shape(A.shape, trans_a)
        kb, n = _op_shape(B.shape, trans_b)
        if ka != kb:
            raise ShapeError(_msg(
                "b", "rows of op(B) must equal columns of op(A) (no broadcasting)",
                f"op(A) {m} x {ka}{' (A transposed)' if trans_a else ''} and op(B) {kb} x {n}"
                f"{' (B transposed)' if trans_b else ''}",
                "pass operands with matching inner dimensions, or set trans_a/trans_b"))
        if C is not None and C.shape != (m, n):
            raise ShapeError(_msg("c", "must have the shape of the result (no broadcasting)",
                                  f"{C.shape[0]} x {C.shape[1]}, result {m} x {n}", f"pass a {m} x {n} matrix"))
        if C is not None and beta == 0.0:
            warn("c is ignored because beta=0; pass beta=1.0 to add it")
            C = None
        if C is None and beta != 0.0:
            raise ShapeError(_msg("c", "is required when beta != 0", "c=None", "pass c=... or beta=0.0"))
        dt = result_dtype([A, B] + ([C] if C is not None else []), dtype)
        return cls(A=A, B=B, C=C, alpha=float(alpha), beta=float(beta), trans_a=trans_a, trans_b=trans_b, dtype=dt,
                   compute=_compute_dtype(dt, precision), precision=precision)

    @property
    def operands(self) -> list:
        return [self.A, self.B] + ([self.C] if self.C is not None else [])

    @property
    def shape(self) -> tuple[int, int]:
        return _op_shape(self.A.shape, self.trans_a)[0], _op_shape(self.B.shape, self.trans_b)[1]

    def plan(self, job: Job, out_chunks: tuple[int, int] | None = None, out: Any = None, *,
             read_reserve: bool = False, reads: tuple[str, str] | None = None) -> GemmPlan:
        """The plan in ``job``'s budget; ``out`` (the output's path, default under the temp dir) tells
        whether it is written straight to its chunk files; ``read_reserve`` as for
        :func:`~blocklin.plan.gemm.plan_gemm`; ``reads``: how ``A`` and ``B`` will be read where they
        are not stored yet (a call planning its later products before it writes their operands),
        else from their stores (:func:`~blocklin.storage.zarr_store.read_kind`)."""
        m, k = _op_shape(self.A.shape, self.trans_a)
        return plan_gemm(m, self.shape[1], k, self.compute, out_dtype=self.dtype, a_chunks=_op_shape(self.A.chunks, self.trans_a),
                         b_chunks=_op_shape(self.B.chunks, self.trans_b), memory=job.cfg.memory,
                         source_dtypes=(self.A.dtype, self.B.dtype),
                         c_chunks=self.C.chunks if self.C is not None else None, workers=job.workers(1),
                         cores=job.cores(), device=job.device, device_memory=job.device_memory(),
                         out_chunks=out_chunks, reads=reads or (read_kind(self.A.path), read_kind(self.B.path)) + (
                             (read_kind(self.C.path),) if self.C is not None else ()),
                         trans=(self.trans_a, self.trans_b), direct_writes=_direct_output(job, out),
                         read_reserve=read_reserve)

    def read_advice(self, plan: GemmPlan) -> list[str]:
        """Where the plan's k-panels re-read chunks of A or B, the rechunk that avoids it."""
        return read_advice(self.A, self.B, plan, trans_a=self.trans_a, trans_b=self.trans_b)

    def token(self, plan: GemmPlan | ThinPlan, settings: tuple = ()) -> str:
        """Deterministic in the inputs, parameters and plan, tiles' or thin route's (what resuming an
        output checks: a partial of one route is never taken up by the other), and the job's ``settings``
        (:func:`~blocklin.storage.identity.plan_settings`): the plan names no output codec, and a resumed
        run writes into the array the interrupted one created, so a run resumed under another codec
        would keep the first one's."""
        return resume_token("matmul", self.operands, self.params(), plan.to_dict(),
                            *((settings,) if settings else ()))

    def params(self) -> dict:
        p = {"alpha": self.alpha, "beta": self.beta, "trans_a": self.trans_a, "trans_b": self.trans_b,
             "dtype": self.dtype.name}
        if self.precision != "default":
            p["precision"] = self.precision
        if self.shift is not None:  # its values are a row of A (the solve's own scratch): named by A
            p["shift"] = True if not self.shift_row else f"row {int(self.shift_row)}"
        return p

    @property
    def math(self) -> str | None:
        """The device math mode of the tiles' GEMMs (TF32 for ``precision="tf32"``)."""
        return "tf32" if self.precision == "tf32" else None

    def run(self, job: Job, plan: GemmPlan, out_path: Any, *, done_dir: Any = None,
            description: str = "gemm tiles", count_pass: str | None = None, peaks: PeakTally | None = None) -> None:
        """Write the product into the array at ``out_path`` (created with ``plan.out_chunks``).

        ``peaks``: a tally of the whole output, into which each tile's peaks of the bits it wrote are
        merged (computed where the tile ran, returned with its result; a tile a resumed run skips gives
        the peaks its first run kept in its resume marker); marked incomplete where any tile's are unknown.
        """
        spec = GemmSpec(a=self.A.path, b=self.B.path, c=self.C.path if self.C is not None else None, out=out_path,
                        trans_a=self.trans_a, trans_b=self.trans_b, alpha=self.alpha, beta=self.beta,
                        dtype=self.compute.name, plan=plan, device=job.device, device_memory=job.device_memory(),
                        check_finite=job.check_finite, done_dir=done_dir,
                        blas_threads=job.task_blas_threads(plan.blas_threads), precision=self.math,
                        out_dtype=self.dtype.name if self.compute != self.dtype else None,
                        # rows of a stored operand from a stored row on (appended rows, operands.row_range)
                        a_off=(getattr(self.A, "first_row", 0), 0), b_off=(getattr(self.B, "first_row", 0), 0),
                        peaks=None if peaks is None else peaks.transposed,
                        shift=self.shift)
        for note in self.read_advice(plan):
            job.note_reads(note)
        graph = TileGraph.named("gemm", self.token(plan))
        graph.expect(plan.n_tasks, gemm_tiles)  # before the tiles are listed
        # progress in k-panels: a one-tile product still moves
        for run in gemm_runs(list(plan.tiles()), plan.workers, job.scheduler.kind):
            i, j = run[0][:2]
            graph.weigh(graph.add((i, j), gemm_tiles, spec, run, units=len(run)), max(1, plan.k_steps) * len(run),
                        "k-panels")
        with reusing():  # tiles run here take the accumulator and panel slots the previous one left
            results = job.run(graph, workers=plan.workers, blas_threads=plan.blas_threads, description=description,
                              count_pass=count_pass)
        if peaks is not None:
            tile_peaks(results, peaks, plan.n_tasks)


def read_advice(A: Any, B: Any, plan: GemmPlan, *, trans_a: bool = False, trans_b: bool = False) -> list[str]:
    """Advice for each of ``A``, ``B`` (anything with ``path``, ``shape``, ``chunks``) whose chunks the
    plan's k-panels read whole more than once per pass, with the ``blocklin convert`` that avoids it."""
    if not isinstance(plan, GemmPlan):  # X^T X handed to gram: its plan states its own reads
        return []
    notes = []
    for name, x, trans, k_axis in (("a", A, trans_a, 1), ("b", B, trans_b, 0)):
        stored_k = k_axis if not trans else 1 - k_axis  # the stored axis k runs along
        kind = read_kind(x.path)
        partial = kind == "direct" or kind == "ranges" and stored_k == 0
        rereads = _panel_reads(plan.tk, max(1, x.chunks[stored_k]), max(1, plan.k), partial)[1]
        if rereads > 1:
            want = list(x.chunks)
            want[stored_k] = plan.tk
            why = (f"{plan.tk}-wide k-panels cut them "
                   + ("across their width" if stored_k == 1 else "and compressed chunks are read whole"))
            notes.append(rechunk_advice(name, x.path, tuple(x.shape), tuple(x.chunks), tuple(want), rereads, why))
    return notes


def _compute_dtype(dt: np.dtype, precision: str) -> np.dtype:
    """The dtype the tiles are computed in for ``precision`` (a complex product keeps its own)."""
    if precision == "default":
        return dt
    if dt.kind == "c":
        raise ParameterError(_msg("precision", "applies to real (float32/float64) products", f"{precision!r} for a "
                                  f"{dt.name} product", "drop precision= (or pass dtype='complex64')"))
    return np.dtype(np.float64) if precision == "float64" else np.dtype(np.float32)


def _direct_output(job: Job, out: Any) -> bool:
    """Whether an output at ``out`` (None: under the temp dir) is written straight to chunk files."""
    if (job.cfg.codec or "none").lower() != "none":
        return False
    try:
        return (as_location(out) if out is not None else temp_root(job.cfg)).is_local
    except Exception:  # noqa: BLE001 - a store object or anything else: plan zarr's temporaries
        return False


def matmul(a: Any, b: Any, out: Any = None, *, c: Any = None, alpha: float = 1.0, beta: float = 0.0,
           trans_a: bool = False, trans_b: bool = False, dtype: Any = None, precision: str | None = None,
           overwrite: bool = False, resume: bool = False, explain: bool = False,
           out_chunks: tuple[int, int] | None = None, **settings: Unpack[Settings]) -> Any:
    """Out-of-core ``alpha * op(A) @ op(B) + beta * C``, written to a zarr store.

    Each output tile is one task that streams its k-loop through the device (NumPy/BLAS with a
    prefetch thread, or CuPy streams) and writes whole output chunks. The summation order over k is
    fixed by the plan, so results are identical across schedulers and worker counts.

    ``X^T X`` and ``X X^T`` of one stored operand (the same store or array object, one side
    transposed, no ``c``, planner-chosen ``out_chunks``) are handed to :func:`blocklin.gram`: SYRK in
    one read of ``X``, half the flops; the report's ``route`` and ``route_reason`` say so. A thin ``op(B)``
    (at most 64 columns, an eighth of the budget) is held while ``A`` is streamed in one row pass
    (:mod:`blocklin.linalg.products.thin`, ``route: "rows"``): read once, on every core.

    Parameters
    ----------
    a, b : path, zarr array, Matrix, NumPy or Dask array
        Operands (2-D). Shapes must agree exactly: no broadcasting.
    out : path, optional
        Output zarr store; a new store under the temp dir when omitted. Written under a temporary
        name and renamed when complete.
    c : operand, optional
        ``C`` of ``beta * C`` (shape ``m x n``).
    alpha, beta : float
        Scalars.
    trans_a, trans_b : bool
        Use ``A.T`` / ``B.T`` (read transposed tile by tile, never copied whole).
    dtype : {None, "float32", "float64", ...}
        Compute and output dtype; by default the operands' common dtype (mixed dtypes are an error).
    precision : {None, "float64", "float32", "tf32"}
        The dtype the tiles are computed in when it should differ from ``dtype`` (the output keeps
        ``dtype``): ``"float32"`` reads float64 operands as float32 and accumulates in float32 (half
        the memory per tile, the float32 BLAS/cuBLAS speed; the error grows to about ``k u_32 |A||B|``,
        ``u_32 = 2^-24``); ``"tf32"`` the same with the GEMMs on TF32 tensor cores on a GPU (10-bit
        mantissas, ``u = 2^-11``; plain float32 on a CPU); ``"float64"`` computes a float32 product in
        float64. ``alpha`` and ``beta * C`` are applied in the output dtype. A product has no
        refinement step, so there is no ``"mixed"`` here (see :func:`blocklin.solve` and
        :func:`blocklin.inv`). ``None``: compute in ``dtype``.
    overwrite, resume : bool
        Replace an existing ``out``; continue an interrupted run (same inputs and plan).
    explain : bool
        Return the :class:`~blocklin.plan.GemmPlan` without running (kept for compatibility:
        :func:`matmul_plan` returns it and always one type).
    out_chunks : (int, int), optional
        Output chunks (must divide the tiles); chosen by the planner by default.
    **settings
        As for every operation: :class:`~blocklin.config.Settings`.

    Returns
    -------
    Matrix
        The result, with ``.report`` (seconds, flops, bytes, peak memory, plan).

    Notes
    -----
    The blocking follows the classical out-of-core GEMM analysis (the I/O lower bound of Hong and
    Kung, 1981): with ``tm x tn`` output tiles, ``op(A)`` is read ``ceil(n/tn)`` times and ``op(B)``
    ``ceil(m/tm)`` times; the planner maximizes the tiles that fit the budget.

    Examples
    --------
    >>> import numpy as np
    >>> import blocklin as bl
    >>> a = np.arange(6.0).reshape(2, 3)
    >>> c = bl.matmul(a, a.T, "C.zarr", memory="64MiB")
    >>> c.to_numpy()
    array([[ 5., 14.],
           [14., 50.]])
    >>> c.shape, c.report["flops"]
    ((2, 2), 24)
    >>> plan = bl.matmul("C.zarr", a, memory="64MiB", explain=True)
    >>> plan.grid, plan.k_steps
    ((1, 1), 1)
    >>> bl.matmul("C.zarr", "C.zarr", trans_b=True, memory="64MiB", explain=True).route  # C C^T: gram
    'pass'
    """
    return product(a, b, out, c=c, alpha=alpha, beta=beta, trans_a=trans_a, trans_b=trans_b, dtype=dtype,
                   precision=precision, overwrite=overwrite, resume=resume, explain=explain, out_chunks=out_chunks,
                   **settings)


def product(a: Any, b: Any, out: Any = None, *, c: Any = None, alpha: float = 1.0, beta: float = 0.0,
            trans_a: bool = False, trans_b: bool = False, dtype: Any = None, precision: str | None = None,
            overwrite: bool = False, resume: bool = False, explain: bool = False,
            out_chunks: tuple[int, int] | None = None, below_normal_ok: bool = False,
            **settings: Unpack[Settings]) -> Any:
    """:func:`matmul` for blocklin's own callers: ``below_normal_ok`` keeps an output whose every entry the
    operands put below the normal numbers, which :func:`matmul` refuses (``lstsq``'s ``A x`` of data near
    ``2^-1030``, whose accuracy the solve states itself)."""
    sparse = _sparse_route(a, b, out, c=c, alpha=alpha, beta=beta, trans_a=trans_a, trans_b=trans_b, dtype=dtype,
                           precision=precision, overwrite=overwrite, resume=resume, explain=explain,
                           out_chunks=out_chunks, settings=settings, below_normal_ok=below_normal_ok)
    if sparse is not None:
        return sparse
    if explain:  # the plan alone: matmul_plan
        return matmul_plan(a, b, out, c=c, alpha=alpha, beta=beta, trans_a=trans_a, trans_b=trans_b, dtype=dtype,
                           precision=precision, out_chunks=out_chunks, **settings)
    with Job("matmul", **settings) as job:
        A = job.operand(a, "a")
        op = Gemm.of(A, A if b is a else job.operand(b, "b"), job.operand(c, "c") if c is not None else None,
                     alpha=alpha, beta=beta, trans_a=trans_a, trans_b=trans_b, dtype=dtype, precision=precision)
        _check_narrow_range(op, job.check_finite)
        _check_c_range(op)
        if out_chunks is None and _is_gram(op):
            return _as_gram(job, op, out, overwrite=overwrite, resume=resume)
        # the peaks of the blocks as written, recorded with the output: an SVD of it need not scan
        tally = PeakTally(op.shape) if recordable(op.dtype) and min(op.shape) > 0 else None
        thin = thin_plan(job, op, out_chunks)
        if thin is not None:  # op(B) held, A streamed by rows in one pass
            return _write(job, op, thin, out, lambda ao: run_thin(job, op, thin, ao.array_path(), peaks=tally),
                          overwrite=overwrite, resume=resume, route="rows", peaks=tally, below_normal_ok=below_normal_ok,
                          route_reason=f"op(B) has {thin.n} column(s): held in memory, A streamed by rows in one "
                                       "pass (read once, on every core)",
                          phases={"products of row strips (A B, alpha, beta C)": job.device, "reads and writes": "cpu"})
        plan = op.plan(job, out_chunks, out)
        return _write(job, op, plan, out, lambda ao: op.run(job, plan, ao.array_path(), done_dir=ao.done, peaks=tally),
                      overwrite=overwrite, resume=resume, peaks=tally, below_normal_ok=below_normal_ok,
                      phases={"GEMM tiles (A B, alpha, beta C)": job.device, "reads and writes": "cpu"})


def _check_narrow_range(op: Gemm, check_finite: bool = True) -> None:
    """``precision='float32'`` or ``'tf32'`` of float64 operands: refused where their entries, or the sums
    of ``k`` products of them, leave float32's range, which the cast and float32 arithmetic cannot hold
    (they had returned Inf, NaN or zeros where the float64 product is finite: found by a randomized
    search). A pass over each operand whose peaks are not recorded; nothing for the operands' own
    precision. An operand holding NaN or Inf is judged by its finite entries: with ``check_finite`` the
    streaming check refuses it, naming the entry; without, the product is returned as computed (NaN and Inf
    where NumPy's has them). Its Inf had been refused as a range problem, its cast said to overflow."""
    if op.compute.itemsize >= max(op.A.dtype.itemsize, op.B.dtype.itemsize):
        return
    low, high = narrow_range(op.compute)
    # the narrow compute dtype asked for by dtype= (CLI --dtype) or by precision=: the refusal names that one
    param = "dtype" if op.precision == "default" else "precision"
    computes = (f"dtype={op.dtype.name}" if param == "dtype" else f"'{op.precision}'") + f" computes in {op.compute.name}"
    fix = (f"pass {param}=None (the operands' own {param}), or scale the operands by powers of two into "
           f"{op.compute.name}'s range (exact) and the result back")
    peaks = {}
    for name, x in (("a", op.A), ("b", op.B)):
        peaks[name] = max_abs(x, keep_nan=True)  # NaN kept: Python's max had dropped a NaN band's finite peak
        if not np.isfinite(peaks[name]):
            if check_finite:  # the streaming check refuses it naming the entry's position, not its range
                peaks[name] = 0.0
                continue
            # check_finite=False: NaN and Inf go through as computed (NumPy's), a finite entry beyond the range
            # is still refused (its cast would make an Inf the operand does not hold)
            peaks[name] = max_finite_abs(x)
        refusal = range_refusal(peaks[name], op.compute, f"{computes}: {name}'s entries must lie", name, fix,
                                param=param) if peaks[name] else None
        if refusal is not None:
            raise refusal
    k = op.A.shape[0] if op.trans_a else op.A.shape[1]
    top = peaks["a"] * peaks["b"]
    if top and not (low <= top and top * max(k, 1) < high):
        raise ParameterError(_msg(
            param, f"{computes}: the sums of {k} products of a's and b's entries must lie within its range "
            f"(max |a| max |b| at least {low:.3g}, times k below {high:.3g})",
            f"max |a| max |b| = {top:.3g}, k = {k}", fix))


def _check_c_range(op: Gemm) -> None:
    """Refuse, before any work, a ``beta C`` the output dtype cannot hold: ``C`` is cast to the output
    dtype and ``beta`` applied there, so an entry of ``C``, ``beta`` itself (where ``C`` is cast to a
    narrower dtype: the cast flushes the entries beta would bring in range) or ``|beta| max |C|`` at or
    beyond its largest value gives Inf. Those had been refused after the run as sums of ``a`` that
    are not finite, with NumPy's overflow warnings leaked. One pass over ``C`` (none for its recorded peak
    where there is one), only where ``C`` is cast to a narrower dtype or ``|beta| > 1``; where both, the
    pass gives the smallest nonzero entry too: an entry the cast takes below the output's normal range,
    which ``beta`` would bring back into it, is refused (the cast kept it to the smallest subnormal only)."""
    if op.C is None:
        return
    narrowing = op.C.dtype.itemsize > op.dtype.itemsize
    if not narrowing and abs(op.beta) <= 1.0:
        return
    top = float(np.finfo(op.dtype).max)
    name = op.dtype.name
    own = ", or pass dtype=None (c's own dtype)" if narrowing else ""
    fix = f"scale c by a power of two and beta by its inverse (exact) into {name}'s range{own}"
    if narrowing and abs(op.beta) >= top:
        raise ParameterError(_msg("beta", f"must lie within the output dtype {name}'s range (below {top:.3g}): "
                                  "c is cast to it before beta is applied", f"beta = {op.beta:.3g}", fix))
    # where both, the smallest nonzero entry is wanted too (below): both from the one read
    both = narrowing and abs(op.beta) > 1.0
    peak, low = max_and_smallest_nonzero(op.C) if both else (max_abs(op.C), 0.0)
    if peak >= top:
        raise ParameterError(_msg("c", f"entries must lie within the output dtype {name}'s range (below "
                                  f"{top:.3g}): c is cast to it", f"max |c| = {peak:.3g}", fix))
    if abs(op.beta) * peak >= top:
        product = f"= {abs(op.beta) * peak:.3g}" if abs(op.beta) * peak < np.inf else "beyond float64's range"
        raise ParameterError(_msg("beta", f"times c must lie within the output dtype {name}'s range (below "
                                  f"{top:.3g}): beta C is computed in it", f"|beta| max |c| "
                                  f"{product} (beta = {op.beta:.3g}, max |c| = {peak:.3g})",
                                  f"scale c (or beta) and alpha by the same power of two below 1 (exact) and the "
                                  f"result back{own}"))
    tiny = float(np.finfo(op.dtype).tiny)
    if both:
        # the cast keeps an entry below the output's normal range to the smallest subnormal only, and beta then
        # brings it into the normal range with that absolute error: c from 1e-45 to 1e-40 (1e-45: float32's
        # 1.4e-45, 40% off) with beta = 1e30 had given entries 1.6e-4 off, without a word
        if 0.0 < low < tiny and abs(op.beta) * low >= tiny:
            raise ParameterError(_msg(
                "c", f"entries that beta brings into the output dtype {name}'s normal range must lie in it before "
                f"(c is cast to {name}, then multiplied by beta): the cast keeps an entry below {tiny:.3g} to "
                f"{float(np.finfo(op.dtype).smallest_subnormal):.3g} absolute only",
                f"min |c| = {low:.3g} (nonzero), beta = {op.beta:.3g}",
                "pass c multiplied by beta in c's own dtype and beta=1 (one rounding), or dtype=None"))


def _overflow_refusal(op: Gemm, fix: str | None = None) -> ParameterError:
    """The refusal of a product of finite operands (checked while streaming) whose output holds Inf or NaN:
    its sums left the output dtype's range (entries near ``1e200`` had given a matrix of Inf, silently, where
    ``gram`` of the same data refuses). Names the power of two that brings ``max |a| max |b| k`` in range;
    one pass over each operand whose peaks are not recorded, on this failure path only."""
    k = op.A.shape[0] if op.trans_a else op.A.shape[1]
    factors = (max_abs(op.A), max_abs(op.B), abs(op.alpha), float(max(k, 1)))
    fi = np.finfo(op.dtype)
    # max |a| max |b| |alpha| k < 2^e, by exponents (the product itself may overflow float64)
    e = sum(int(np.frexp(f)[1]) for f in factors) if all(0 < f < np.inf for f in factors) else None
    p = e - (fi.maxexp - 2) if e is not None else 0
    fix = fix or (f"scale a by 2.0**-{p} (exact: the product is then 2^-{p} times alpha op(A) op(B)), or b, alpha or c "
           "by powers of two that keep every sum in range" if p > 0 else
           "scale c (beta C) by a power of two into range" if op.C is not None else
           "scale a or b by a power of two (exact)")
    return ParameterError(_msg("a", f"must give a product within {op.dtype.name}'s range (largest "
                               f"{float(fi.max):.3g}): its operands are finite (checked while streaming), its sums "
                               "are not", "an output holding Inf or NaN (max |a| max |b| |alpha| k "
                               f"{'below 2^' + str(e) if e is not None else 'unknown'}, k = {k})", fix))


def check_output_range(job: Job, op: Gemm, out_path: Any, peaks: PeakTally | None, fix: str | None = None, *,
                       below_normal: bool = False, recompute: str | None = None) -> None:
    """Refuse (:func:`_overflow_refusal`) an output of finite operands that holds Inf or NaN, where the job
    checks for them: from the tiles' peaks where every tile gave them, else by reading the output once
    (a resumed run skipped tiles whose markers kept no peaks: their sums had gone unchecked, and a
    product of overflowing sums was returned). ``fix``: the refusal's fix, where not the scaling of ``a``.

    ``below_normal``: refuse too (:func:`_check_normal_range`) an output whose every entry the operands put
    below the normal numbers (:func:`matmul`'s; blocklin's own products of data it scaled, or whose accuracy
    it states, as ``lstsq``'s ``A x`` of subnormal data, keep it). ``recompute``: ``op`` is an update's, of the
    appended rows with the stored result as ``C``; the refusal's fix scales the whole of ``a`` and ``b`` and
    recomputes as this says."""
    if not job.check_finite:
        return
    if peaks is not None and peaks.complete:
        top = float(np.max(peaks.columns)) if peaks.columns.size else 0.0  # NaN propagates
    else:
        from blocklin.storage.zarr_store import row_bands

        top = 0.0
        for _, block in row_bands(out_path):
            if block.size:  # max(|Re|, |Im|), as the peaks
                big = np.abs(block) if block.dtype.kind != "c" else np.maximum(abs(block.real), abs(block.imag))
                band = float(np.max(big))  # NaN propagates here, not through max(top, nan)
                if not np.isfinite(band):
                    raise _overflow_refusal(op, fix)
                top = max(top, band)
    if not np.isfinite(top):
        raise _overflow_refusal(op, fix)
    if below_normal and top < float(np.finfo(op.dtype).tiny) and min(op.shape) > 0:
        _check_normal_range(op, recompute)


def _check_normal_range(op: Gemm, recompute: str | None = None) -> None:
    """Refuse an output whose every entry lies below the output dtype's normal numbers because the operands
    put it there: ``|alpha| k max |a| max |b| + |beta| max |c|`` below ``2^minexp``, or the same with
    ``k max |a|`` as ``sum_l max_i |a_il|`` where a's writer recorded those peaks (``b``'s likewise), free and
    tighter where a few lines hold the large entries
    (:mod:`~blocklin.linalg.products.below_normal`; operands near ``2^-600`` had given a zero product, near
    ``2^-530`` one ``3e-5`` off, silently, where ``gram`` refuses). Called where the output's largest entry
    is below it: a pass over each operand whose peaks are not recorded, on that path only. ``recompute``: see
    :func:`check_output_range` (an update of a product whose old rows gave exact zeros had returned the
    appended rows' product as subnormals of few digits, silently)."""
    k = op.A.shape[0] if op.trans_a else op.A.shape[1]
    peak_a, peak_b = functools.cache(lambda: max_abs(op.A)), functools.cache(lambda: max_abs(op.B))
    peak_c = functools.cache(lambda: max_abs(op.C))  # one pass over an unrecorded C (an update's copy) at most
    # |op(A) op(B)|_ij <= sum_l |a_il| |b_lj|, at most k max |a| max |b|, and at most sum_l max_i |a_il| times
    # max |b| (or the mirror) where a writer recorded op(A)'s peaks along the inner index: no pass, and tighter
    # where a few lines hold the large entries (fsum: one rounding, within the shortfall's margin)
    bounds = [("k max |a| max |b|", (lambda: float(k), peak_a, peak_b))]
    lines_a = recorded_line_peaks(op.A, rows=op.trans_a)
    if lines_a is not None:
        bounds.append(("sum_l max_i |a_il| max |b| (a's recorded peaks)", (lambda: math.fsum(lines_a), peak_b)))
    lines_b = recorded_line_peaks(op.B, rows=not op.trans_b)
    if lines_b is not None:
        bounds.append(("max |a| sum_l max_j |b_lj| (b's recorded peaks)", (peak_a, lambda: math.fsum(lines_b))))
    best = None
    for what, factors in bounds:
        terms = [(lambda: abs(op.alpha), *factors)]
        if op.C is not None:
            terms.append((lambda: abs(op.beta), peak_c))
        found = shortfall(terms, op.dtype)
        if found is not None and (best is None or found[0] < best[1][0]):
            best = what, found
    if best is None:
        return
    what, (e, p) = best
    pa, pb = split_power(p)
    bound = f"|alpha| {what}{' + |beta| max |c|' if op.C is not None else ''} below 2^{e}, k = {k}"
    if recompute is not None:
        raise below_normal_refusal(
            "a", op.dtype, e, p, f"{bound}; a and b: the appended rows, c: the stored result",
            f"the stored result is unchanged; scale all of a by 2^{pa} and b by 2^{pb} (numpy.ldexp(a, {pa}): exact) "
            f"and {recompute}: the product is then 2^{p} times this one, within range")
    also = f" and c by 2^{p}" if op.C is not None else ""
    raise below_normal_refusal(
        "a", op.dtype, e, p, bound, f"scale a by 2^{pa} and b by 2^{pb}{also} (numpy.ldexp(a, {pa}): exact): the "
        f"product is then 2^{p} times this one, within range; alpha does not help (it is applied to the sums)")


def _write(job: Job, op: Gemm, plan: GemmPlan | ThinPlan, out: Any, run: Callable[[Any], None], *, overwrite: bool,
           resume: bool, peaks: PeakTally | None = None, below_normal_ok: bool = False, **report: Any) -> Matrix:
    """Claim ``out`` (resumable by ``op.token(plan, plan_settings(job))``), create its array in
    ``plan.out_chunks``, ``run`` the route into it (given the claimed output), then report (with ``report``'s entries) and commit: the tail
    of both dense routes, the tiles and the thin product's row pass.

    ``peaks``: the tally ``run`` filled with the output's peaks, recorded once the output is committed
    (:func:`~blocklin.storage.recorded_peaks.record`: nothing where it is incomplete or not finite); the
    report's ``output_peaks_recorded`` says whether it was. ``below_normal_ok``: keep an output whose every
    entry lies below the normal numbers (:func:`check_output_range`)."""
    ao = job.claim(out, op.operands, overwrite=overwrite, resume=resume, token=op.token(plan, plan_settings(job)),
                   size=(op.shape, op.dtype))
    open_or_create_array(ao, shape=op.shape, dtype=op.dtype, chunks=plan.out_chunks, codec=job.cfg.codec)
    run(ao)
    check_output_range(job, op, ao.array_path(), peaks, below_normal=not below_normal_ok)
    rep = job.report(flops=plan.flops, plan=plan.to_dict(), output=str(ao.path), precision=op.precision,
                     compute_dtype=op.compute.name, **report)
    result = job.finish(ao, out, rep, operation="matmul", plan=plan.to_dict(), params=op.params(), keys=REPORT_KEYS)
    if peaks is not None:  # after the commit: the record's stamp is the committed output's
        rep["output_peaks_recorded"] = record_peaks(ao.path, peaks)
    return result


def _sparse_route(a: Any, b: Any, out: Any, *, c: Any, alpha: float, beta: float, trans_a: bool, trans_b: bool,
                  dtype: Any, precision: Any, overwrite: bool, resume: bool, explain: bool, out_chunks: Any,
                  settings: dict, below_normal_ok: bool = False) -> Any:
    """``S B`` or ``S^T B`` of a stored sparse ``a``, or ``op(A) op(S)`` of a dense ``a`` and a stored sparse
    ``b`` (:mod:`blocklin.linalg.products.sparse_gemm`); None when both are dense."""
    from blocklin.linalg.products.sparse_gemm import refuse_options, sparse_matmul, sparse_operand, sparse_product_plan

    so = settings.get("storage_options")
    s = sparse_operand(a, "a", so)
    if s is None:
        right = sparse_operand(b, "b", so)
        if right is None:
            return None
        # op(A) op(S) = (op(S)^T op(A)^T)^T: the sparse tiles with A read across
        refuse_options(operation="matmul(A, S, out, trans_a=..., trans_b=..., dtype=...) only",
                       c=c is not None, beta=beta != 0.0, alpha=alpha != 1.0,
                       precision=precision not in (None, "default"), out_chunks=out_chunks is not None)
        if explain:
            return sparse_product_plan(right, a, trans_a=bool(trans_b), dtype=dtype, dense_left=True,
                                       trans_dense=bool(trans_a), settings=settings)
        return sparse_matmul(right, a, out, trans_a=bool(trans_b), dtype=dtype, overwrite=overwrite, resume=resume,
                             dense_left=True, trans_dense=bool(trans_a), settings=settings,
                             below_normal_ok=below_normal_ok)
    if trans_a and sparse_operand(b, "b", so) is not None and _same_store(s.path, sparse_operand(b, "b", so).path):
        from blocklin.linalg.products.sparse_gemm import sparse_gram

        refuse_options(c=c is not None, beta=beta != 0.0, alpha=alpha != 1.0, trans_b=bool(trans_b),
                       precision=precision not in (None, "default"), out_chunks=out_chunks is not None)
        if explain:  # the plan alone, counted in nonzeros
            return sparse_product_plan(s, gram=True, dtype=dtype, settings=settings)
        return sparse_gram(s, out, dtype=dtype, overwrite=overwrite, resume=resume, settings=settings)  # S^T S
    refuse_options(c=c is not None, beta=beta != 0.0, alpha=alpha != 1.0, trans_b=bool(trans_b),
                   precision=precision not in (None, "default"), out_chunks=out_chunks is not None)
    if explain:
        return sparse_product_plan(s, b, trans_a=bool(trans_a), dtype=dtype, settings=settings)
    return sparse_matmul(s, b, out, trans_a=bool(trans_a), dtype=dtype, overwrite=overwrite, resume=resume,
                         settings=settings, below_normal_ok=below_normal_ok)


def _is_gram(op: Gemm) -> bool:
    """``X^T X`` or ``X X^T`` of one stored operand (the same store, one side transposed, no ``C``),
    computed in its dtype (the Gram route has no other compute precision). Real dtypes only: for
    complex data ``X^T X`` is not the Gram matrix ``X^H X`` SYRK computes, so GEMM runs it."""
    return (op.C is None and op.trans_a != op.trans_b and op.precision == "default" and op.dtype.kind == "f"
            and _same_store(op.A.path, op.B.path))


def _same_store(p: Any, q: Any) -> bool:
    if p is q:
        return True
    if getattr(p, "is_local", False) and getattr(q, "is_local", False):
        return os.path.realpath(p.url) == os.path.realpath(q.url)
    return getattr(p, "url", p) == getattr(q, "url", q) and getattr(p, "options", None) == getattr(q, "options", None)


def _as_gram(job: Job, op: Gemm, out: Any, *, overwrite: bool, resume: bool) -> Matrix:
    """Run ``X^T X`` / ``X X^T`` as :func:`blocklin.gram` (SYRK, one read of ``X``) inside this job."""
    from blocklin.linalg.products.gram import Gram, write_gram

    g = Gram.of(op.A, trans=op.trans_b, dtype=op.dtype, alpha=op.alpha, scale_name="alpha")
    result = write_gram(job, g, g.plan(job), out, overwrite=overwrite, resume=resume, operation="matmul",
                        operands=op.operands, params={**op.params(), "route": "gram"})
    result.report["route_reason"] = (f"{'X X^T' if g.trans else 'X^T X'} of one stored operand: computed as "
                                     "its Gram matrix by SYRK (half the flops, one read)")
    return result


def matmul_plan(a: Any, b: Any, out: Any = None, *, c: Any = None, alpha: float = 1.0, beta: float = 0.0, trans_a: bool = False,
                trans_b: bool = False, dtype: Any = None, precision: str | None = None,
                out_chunks: tuple[int, int] | None = None, **settings: Unpack[Settings]) -> GemmPlan:
    """The :class:`~blocklin.plan.GemmPlan` that :func:`matmul` would run with these arguments, without
    running it (what ``blocklin gemm --explain`` prints); same parameters as :func:`matmul`. For
    ``X^T X`` or ``X X^T`` of one stored operand, which :func:`matmul` hands to :func:`blocklin.gram`,
    the :class:`~blocklin.plan.gram.GramPlan` (the same ``flops``, ``bytes_read``, ``peak_memory``,
    ``explain()``)."""
    with Job("matmul", **settings) as job:
        A = job.operand(a, "a")
        op = Gemm.of(A, A if b is a else job.operand(b, "b"), job.operand(c, "c") if c is not None else None,
                     alpha=alpha, beta=beta, trans_a=trans_a, trans_b=trans_b, dtype=dtype, precision=precision)
        if out_chunks is None and _is_gram(op):  # what matmul would run: the Gram plan
            from blocklin.linalg.products.gram import Gram

            return Gram.of(op.A, trans=op.trans_b, dtype=op.dtype, alpha=op.alpha).plan(job)
        return thin_plan(job, op, out_chunks) or op.plan(job, out_chunks, out)


#: Report entries recorded in the output's attributes.
REPORT_KEYS = ("seconds", "flops", "gflops", "bytes_read", "bytes_logical", "read_notes", "bytes_written", "peak_memory",
               "device", "scheduler", "tasks")
