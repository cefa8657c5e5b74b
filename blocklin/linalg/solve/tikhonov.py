"""One in-memory Tikhonov solve, ``min ||A x - b||^2 + lam^2 ||x||^2``: its state and what its routes share.

:class:`TikhonovRun` holds the operands, the lambdas (bounded by :data:`LAM_MAX`, then those of the
problem scaled by powers of two), the step records of a resumable run and the intercept's means. The
routes (:mod:`~blocklin.linalg.solve.normal`, :mod:`~blocklin.linalg.solve.qr_route`,
:mod:`~blocklin.linalg.solve.wide`, :mod:`~blocklin.linalg.solve.spectrum`) share the device of a
pass, the norms, the refusal of a rank-deficient problem and the writing of ``x``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from blocklin.errors import ParameterError, SingularMatrixError
from blocklin.errors import explain as _msg
from blocklin.linalg.blocks.result_range import check_columns, column_maxima, refuse_flushed_rhs, scaled_columns
from blocklin.linalg.blocks.scaling import Scaling, refuse_nonfinite
from blocklin.plan.chunks import auto_chunks
from blocklin.runtime.job import Job
from blocklin.runtime.powers import ldexp
from blocklin.runtime.stages import StepRecords
from blocklin.storage.zarr_store import create_array, write_block

#: Largest ``lam``: ``lam^2`` plus the entries of ``A^T A`` must stay finite in float64 (1e300
#: overflowed with ``OverflowError``); beyond it the solution is zero to every digit anyway.
LAM_MAX = 1e150


def check_lam_max(vals: list[float], e: int = 0) -> None:
    """``lam <= LAM_MAX`` for the problem whose ``A`` is divided by ``2^e`` (:mod:`blocklin.linalg.blocks.scaling`:
    a tall ``A`` with huge entries takes a lambda of their size)."""
    for v in vals:
        if np.ldexp(v, -e) > LAM_MAX:
            bound = f"{LAM_MAX:g}" if not e else f"{LAM_MAX:g} * 2^{e} (the scale of A)"
            raise ParameterError(_msg("lam", f"must be <= {bound} (lam^2 is added to A^T A in float64, where "
                                     "a larger square overflows)", repr(v), "pass a smaller lam; scale A and b "
                                     "instead (x is about A^T b / lam^2 at such a lam)"))


@dataclasses.dataclass
class TikhonovRun:
    """The state of one in-memory Tikhonov solve, passed to every step of its route."""

    job: Job
    A: Any
    B: Any
    m: int
    n: int
    k: int
    kind: str
    lams: list[float]
    refine: Any
    method: str
    phases: dict = dataclasses.field(default_factory=dict)  # pass -> device it ran on, for the report
    intercept: bool = False
    #: fit_intercept on tall A: column means of A (float64) and of b, from the Gram pass's sums
    mu: np.ndarray | None = None
    bbar: np.ndarray | None = None
    #: fit_intercept on tall A: what the passes subtract from the rows of A and b before they sum them (the
    #: first rows, :meth:`shifts`, in the units of the scaled problem), and the means of the shifted rows,
    #: ``mu - shift_a`` and ``bbar - shift_b`` as summed (never formed by that difference)
    shift_a: np.ndarray | None = None
    shift_b: np.ndarray | None = None
    dmu: np.ndarray | None = None
    dbbar: np.ndarray | None = None
    #: the first rows of A and b as stored (read once, :meth:`shifts`)
    first_rows: tuple | None = None
    #: results of finished passes, kept for resume=True (runtime/stages.py)
    saved: StepRecords = dataclasses.field(default_factory=lambda: StepRecords(None))
    #: the powers of two A and B are divided by as they are read (blocklin.linalg.blocks.scaling); the problem
    #: solved is then 2^-ea A x' = 2^-eb b with lam' = 2^-ea lam, and x = 2^(eb - ea) x'
    sa: Scaling | None = None
    sb: Scaling | None = None
    #: whether ``lams`` are already those of the scaled problem
    scaled_lams: bool = False
    #: ``sample_weight`` as a stored ``m x 1`` operand (None: every row weighs 1), checked by
    #: :func:`blocklin.linalg.solve.weights.check_weights`: its sum and count of positive entries
    W: Any = None
    wsum: float | None = None
    wpos: int | None = None
    #: the weights in memory (the wide route, whose ``m`` is small)
    wvec: Any = None
    #: ``positive=True``: coefficients >= 0 (:mod:`blocklin.linalg.solve.positive`)
    positive: bool = False
    #: ``lam="loo"``: one lambda per right-hand side, and the per-row squared errors kept
    per_target: bool = False
    store_cv: bool = False
    #: the leave-one-out choice of the last spectrum it was made on (:mod:`blocklin.linalg.solve.loo`)
    loo_choice: Any = None
    #: ``scoring=`` of the cross-validated choice (:mod:`blocklin.linalg.solve.scoring`)
    scoring: Any = None
    #: ``cv=``: the folds (:class:`blocklin.linalg.solve.kfold.Folds`), their stored fold numbers ``L`` where
    #: not contiguous, the Gram quantities the fold sums gave (read instead of a Gram pass), and the wide
    #: route's ``A A^T``, ``b`` and weights of the scaled problem
    folds: Any = None
    L: Any = None
    gram: dict | None = None
    dual_sums: Any = None
    #: a wide ``A``'s kernel and right-hand side as its spectrum was taken of them (weighted; with an intercept the
    #: kernel of the rows less a row, unweighted, and ``b`` weighted and centered): the leave-one-out errors are solved
    #: again from them where lines far apart ask (:mod:`~blocklin.linalg.solve.loo`)
    dual_kernel: Any = None
    #: with an intercept, rows far apart: ``(t, K_t)``, the row a wide ``A``'s kernel was summed again less and that
    #: kernel (:func:`~blocklin.linalg.solve.shifted_gram.less_typical_row`), for the product less the same row
    less_row: Any = None
    #: the solutions in hand are ``2^-xe x'`` of the scaled problem (:func:`blocklin.linalg.solve.spectrum.x_exponent`)
    xe: int = 0

    def scaled_run(self, run: Any) -> dict:
        """``run(scale)`` a pass over ``A`` and ``B`` (made again scaled when its first reading finds
        data outside the safe range); its result records the exponents (a resumed run reads them)."""
        out = self.sa.run(self.job, run, others=(self.sb,))
        cols = {} if self.sb.columns is None else {"eb_columns": [int(v) for v in self.sb.columns]}
        return out | {"ea": self.sa.exponent, "eb": self.sb.exponent} | cols

    def adopt(self, rec: dict) -> None:
        """The exponents of a pass's record (fresh or resumed); ``lams`` of the scaled problem. With
        ``check_finite=False``, a NaN or Inf of the data in its sums (``A^T A``, ``R``; ``A^T b``, ``Q^T b``,
        ``||b||^2``) is refused by name: it had reached NumPy's eigensolver or SVD, "SVD did not converge"."""
        if not self.job.check_finite:
            for key, name in (("g", "a"), ("r", "a"), ("c", "b"), ("qtb", "b"), ("bb", "b")):
                if key in rec and np.size(rec[key]):
                    refuse_nonfinite(float(np.max(np.abs(np.asarray(rec[key])))), "a least-squares or ridge solve",
                                     name)
        if "ea" in rec and not self.sa.known:
            self.sa.e, self.sb.e = int(rec["ea"]), int(rec["eb"])
            if "eb_columns" in rec:
                self.sb.columns = np.asarray(rec["eb_columns"], dtype=np.int64)
        if not self.scaled_lams:
            check_lam_max(self.lams, self.sa.exponent)
            self.lams = [float(np.ldexp(lam, -self.sa.exponent)) for lam in self.lams]
            self.scaled_lams = True

    def shifts(self, scale: dict) -> tuple[np.ndarray, np.ndarray]:
        """The rows a pass of an intercept fit subtracts from ``A`` and ``B`` before it sums: their first rows
        (one row read), divided by the pass's powers of two (``scale``: a path's exponent, as
        :func:`~blocklin.runtime.passes.run_pass` takes it).

        The centered sums are then the shifted rows' sums less a rank-one term of their (small) means:
        ``A_c^T A_c = A_s^T A_s - m d d^T`` with ``A_s = A - 1 a_1^T``, ``d = mean(A_s)``, rounded relative to
        ``||A_s||^2`` (about ``m (var + d^2)``) instead of ``||A||^2`` (``m (var + mu^2)``): with column
        means ``10^6`` times the spread the uncentered correction had lost 12 digits, the shifted one
        loses about ``(d / sd)^2``, a few units for a typical first row."""
        if self.first_rows is None:
            self.first_rows = (first_row(self.A, self.cdtype), first_row(self.B, self.cdtype))
        # a per-column power (Scaling.per_column) divides each entry of b's first row by its column's
        return tuple(ldexp(v, -np.asarray(scale.get(str(s.path), 0), dtype=np.int64))
                     for v, s in zip(self.first_rows, (self.sa, self.sb)))

    @property
    def cdtype(self) -> str:
        """The dtype of the passes and the small problem: float64, complex128 for complex data (LAPACK's
        conventions: ``A^H A``, ``A^H b``, ``|x|^2``)."""
        return "complex128" if "c" in (self.A.dtype.kind, self.B.dtype.kind) else "float64"

    @property
    def weighted(self) -> bool:
        return self.W is not None

    @property
    def total_weight(self) -> float:
        """``sum w`` (``m`` unweighted): what the centering corrections multiply by."""
        return float(self.wsum) if self.weighted else float(self.m)

    @property
    def rows_in_problem(self) -> int:
        """Rows of positive weight (all ``m`` unweighted): the ``m`` of GCV (a zero row is no data)."""
        return int(self.wpos) if self.weighted else self.m

    def sources(self) -> list:
        """The row-pass sources ``A``, ``B`` (and ``w``)."""
        from blocklin.runtime.passes import source

        return [source(self.A), source(self.B)] + ([source(self.W)] if self.weighted else [])

    @property
    def scale(self) -> dict:
        return self.sa.params() | self.sb.params()

    def intercepts(self, xs: list[np.ndarray], info: dict) -> Any:
        """``info["intercept"]`` of the solutions ``xs`` (:meth:`offset`), with :func:`warn_intercept` from
        ``info["condition_estimate"]`` (the spectral and Cholesky routes set it)."""
        icpts = [self.offset(x) for x in xs]
        delta = float(info.get("condition_estimate", 0.0)) * np.finfo(np.float64).eps
        with np.errstate(over="ignore", under="ignore", invalid="ignore"):
            spread = [ldexp(np.abs(self.mu) @ np.abs(x), self.xe) if self.xe else np.abs(self.mu) @ np.abs(x)
                      for x in xs]
        warn_intercept(delta, np.concatenate([np.ravel(v) for v in spread]),
                       np.concatenate([np.ravel(v) for v in icpts]), "")
        return [i.tolist() for i in icpts] if len(icpts) > 1 else icpts[0].tolist()

    def offset(self, x: np.ndarray) -> np.ndarray:
        """The intercept ``bbar - mu^T x`` of a solution of the centered problem (``x`` given as ``2^-xe x``)."""
        if not self.xe:
            return self.bbar - self.mu @ x
        with np.errstate(over="ignore", under="ignore"):
            return ldexp(ldexp(self.bbar, -self.xe) - self.mu @ x, self.xe)


def warn_intercept(delta: float, spread: np.ndarray, icpt: np.ndarray, fix: str) -> None:
    """An :class:`~blocklin.errors.IllConditionedWarning` where the intercept ``bbar - mu^T x`` may have no
    correct digit: ``x``'s relative error bound ``delta`` (``report["condition_estimate"]`` times eps) enters it
    as ``delta |mu|^T |x|`` (``spread``, per right-hand side), at least ``|x0|`` there. Rows ``2^600`` apart
    (``mu`` and ``bbar`` near ``2^600 / m``) gave ``x`` right to 1e-15 and an intercept ``5e10`` times off; column
    means ``1e8`` with ``method="qr"`` on a wide ``A``, 0.32 for 0.37."""
    from blocklin.errors import IllConditionedWarning, warn

    spread = delta * np.abs(np.asarray(spread, dtype=np.float64)).ravel()
    size = np.abs(np.asarray(icpt)).ravel()
    bad = (spread > 0) & ~(spread < size)
    if bad.any():
        j = int(np.argmax(np.where(bad, spread / np.where(size > 0, size, 1.0), 0.0)))
        warn(f"solve: the intercept may have no correct digit: x's relative error bound {delta:.1e} "
             f"(report['condition_estimate'] times eps) enters x0 = bbar - mu^T x as {spread[j]:.1e} against "
             f"|x0| = {size[j]:.1e} (the means of a's columns large against the intercept, in the problem scaled "
             f"by powers of two){'; ' + fix if fix else ''}", IllConditionedWarning)


def first_row(op: Any, dtype: str) -> np.ndarray:
    """Row 0 of a stored operand (``dtype``: float64 or complex128), one row read."""
    from blocklin.storage.zarr_store import open_cached, read_block

    row = read_block(open_cached(op.path), slice(op.first_row, op.first_row + 1), slice(0, op.shape[1]))
    return np.asarray(row, dtype=dtype)[0].copy()


def dots(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """``Re(x_j^H y_j)`` per column (``x_j^T y_j`` of real data): the real inner products the norms of a
    complex problem are made of (``||b||^2 - 2 Re(x^H A^H b) + x^H G x``)."""
    return np.einsum("ij,ij->j", x.conj(), y).real if np.iscomplexobj(x) or np.iscomplexobj(y) else \
        np.einsum("ij,ij->j", x, y)


def norms(values: np.ndarray) -> Any:
    v = np.sqrt(np.maximum(np.asarray(values, dtype=float), 0.0))
    return float(v[0]) if v.size == 1 else v.tolist()


def singular(cond: float, what: str) -> SingularMatrixError:
    return SingularMatrixError(_msg(
        "a", f"must have full {what} rank for lam = 0 (ordinary least squares)",
        f"a numerically rank-deficient matrix (condition estimate {cond:.1e})",
        "blocklin.lstsq(a, b) for the minimum-norm solution (numpy.linalg.lstsq's), or regularize with lam > 0, "
        "e.g. blocklin.solve(a, b, lam=1e-3 * ||A||), or let lam='gcv' choose it"))


def device_of_pass(ctx: TikhonovRun, phase: str, flops: float) -> str:
    """Device of a pass over A and B (``auto``: the GPU only where it wins), recorded for the report."""
    from blocklin.device import pass_device

    read = ctx.m * (ctx.n * ctx.A.dtype.itemsize + ctx.k * ctx.B.dtype.itemsize)
    # complex data on the CPU: the device kernels' A^T B and x * x sums are the real conventions
    dev = "cpu" if ctx.cdtype != "float64" else pass_device(ctx.job.cfg.device, flops, read, ctx.job.device)
    ctx.phases[phase] = dev
    return dev


def write_x(ctx: TikhonovRun, x_path: str, x: np.ndarray) -> None:
    out_dtype = np.result_type(ctx.A.dtype, ctx.B.dtype)
    known = ctx.sa is not None and ctx.sa.known  # x of the scaled problem: x = 2^(eb - ea) x'
    # b's columns each divided by their own power where one power would have lost some (Scaling.per_column)
    e = (ctx.sb.column_exponents - ctx.sa.exponent if known else 0) + ctx.xe
    if np.ndim(e) and x.ndim == 2 and x.shape[1] != np.size(e):  # a sequence: one block of k columns per lambda
        e = np.tile(e, x.shape[1] // np.size(e))
    if known and ctx.sb.exponent and ctx.k > 1 and ctx.sb.columns is None:  # b's strips scaled by 2^-eb
        refuse_flushed_rhs(b_column_maxima(ctx), ctx.sb.exponent, ctx.B.dtype)
    # rounded once to the output; a column flushed to 0 or beyond the range is refused, a subnormal one warns
    x, cols = scaled_columns(x, e, out_dtype)
    check_columns(cols, e, out_dtype)
    chunks = auto_chunks(x.shape, out_dtype, ctx.job.cfg.memory)
    arr = create_array(x_path, shape=x.shape, dtype=out_dtype, chunks=chunks, codec=ctx.job.cfg.codec)
    write_block(arr, slice(0, x.shape[0]), slice(0, x.shape[1]), x.astype(out_dtype, copy=False))


def b_column_maxima(ctx: TikhonovRun) -> np.ndarray:
    """Each column's largest magnitude of the ``b`` the passes streamed: the first pass's record where it
    kept each column's (``b`` in ``job.column_peaks``: the per-column scaling's routes), else read again.
    A complex record holds ``max(|Re|, |Im|)`` where the read gives ``|b|``; :func:`write_x` asks only where
    the one power kept every column above ``tiny * 2^nmant`` (``columns`` None), where neither refuses."""
    peaks = ctx.job.peaks.get(ctx.sb.path) if ctx.sb.path in ctx.job.column_peaks else None
    if peaks is not None and np.size(peaks) == ctx.k:
        return np.asarray(peaks, dtype=np.float64)
    return column_maxima(ctx.B.path, first=int(getattr(ctx.B, "first_row", 0)), rows=ctx.m)


def unscaled_x(x: np.ndarray, e: Any, dtype: Any) -> np.ndarray:
    """``2^e x`` (``e`` one exponent, or one per column); a solution beyond the output dtype's range raises
    (never an Inf written silently)."""
    e = np.asarray(e, dtype=np.int64)
    if not np.any(e):
        return x
    with np.errstate(over="ignore", under="ignore"):
        out = ldexp(x, e if e.ndim == 0 or x.ndim == 1 else e[None, :])
    if not np.isfinite(out.astype(dtype, copy=False)).all():
        raise ParameterError(_msg("b", f"must give a solution within the range of {np.dtype(dtype).name}",
                                  f"a solution x of norm about 2^{int(np.frexp(np.linalg.norm(x))[1]) + int(e.max())}",
                                  "scale b down (or a up) by a power of two and scale x back yourself"))
    return out


def factor_regularized(g: np.ndarray, lam: float) -> tuple[Any, float]:
    """Cholesky factor of ``A^T A + lam^2 I`` (``A^H A + lam^2 I`` of complex data: ``zpotrf``) and its
    reciprocal condition estimate (None, 0 when it fails)."""
    from scipy.linalg import cho_factor, lapack

    from blocklin.device.cpu import potrf_threads

    kmat = g.copy()
    kmat[np.diag_indices_from(kmat)] += lam**2
    anorm = float(np.abs(kmat).sum(axis=0).max()) if kmat.size else 0.0
    try:
        with potrf_threads(kmat.shape[0]):
            cf = cho_factor(kmat, lower=False, check_finite=False)
        pocon = lapack.get_lapack_funcs("pocon", (cf[0],))
        return cf, float(pocon(cf[0], anorm, uplo="U")[0]) if g.shape[0] else 1.0
    except np.linalg.LinAlgError:
        return None, 0.0


__all__ = ["LAM_MAX", "TikhonovRun", "check_lam_max", "device_of_pass", "dots", "first_row", "ldexp", "factor_regularized", "norms", "singular", "unscaled_x", "warn_intercept", "write_x"]
