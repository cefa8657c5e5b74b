"""Equilibration of a square matrix by powers of two (LAPACK's ``xGEEQUB`` and ``xLAQGE``'s rule).

A graded matrix ``A = D B`` (rows or columns scaled over many binades) has an accurate inverse,
``C (R A C)^-1 R``, but every normwise check of the routes (a leaf's reciprocal condition,
``||I - A X||_F``, Newton-Schulz's acceptance) reads it as numerically singular. The scalings are
powers of two, so ``R A C`` and ``C Y R`` are exact (but for entries below the range's bottom, which
are negligible next to their row's largest): the routes invert the equilibrated matrix and their checks
judge that.

One row pass gathers the row maxima (each strip holds whole rows, so the row scalings are known before
the column maxima of ``R A`` are taken: both in the same pass); a matrix that fits one in-core leaf has
them gathered by the leaf task, which reads it anyway, before it inverts (:func:`strip_maxima`). A second
pass stages ``R A C`` in a work store
(only where the rule asks for it); a last one writes ``X = C Y R`` from the inverse ``Y`` of the
equilibrated matrix. The square solve (:mod:`blocklin.linalg.solve.square`) does the same for ``A x = b``,
as LAPACK's expert driver ``xGESVX`` with ``FACT = 'E'``: it solves ``(R A C) y = R b`` (``R A C`` and ``R b``
staged) and writes ``x = C y``.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np

from blocklin.plan.passes import PassMemory
from blocklin.runtime.passes import plan_kernel_pass, row_kernel, run_pass, source

#: LAPACK's ``THRESH`` of ``xLAQGE``: rows (columns) are scaled where the ratio of their smallest to their
#: largest maximum is below it.
THRESH = 0.1


#: The inverse's note: what its report's entries describe once the matrix was equilibrated.
NOTE = ("X = C Y R with Y the inverse of R A C (R, C powers of two): residual, backward_error, cond_estimate and "
        "history are those of the equilibrated matrix R A C")


@dataclasses.dataclass(frozen=True)
class Equilibration:
    """The exponents of ``R = diag(2^row)`` and ``C = diag(2^col)`` (zeros where that side is not
    scaled), ``ROWCND`` and ``COLCND`` as LAPACK defines them, and whether any scaling applies."""

    row: np.ndarray
    col: np.ndarray
    rowcnd: float
    colcnd: float
    rows_scaled: bool
    cols_scaled: bool
    #: ``e`` with ``max |R A C| < 2^e``: 0 where the rows are scaled (each row's largest entry in ``[0.5, 1)``),
    #: else that of ``A``'s largest entry (``A C``'s rows keep their size: ``C`` is that of ``R A``).
    peak: int = 0

    @property
    def applied(self) -> bool:
        return self.rows_scaled or self.cols_scaled

    def report(self, note: str = NOTE) -> dict:
        """The report's ``equilibration`` entry (``note``: what the report's other entries then describe)."""
        out: dict = {"applied": self.applied, "rowcnd": self.rowcnd, "colcnd": self.colcnd,
                     "rule": f"LAPACK xLAQGE: rows scaled where ROWCND < {THRESH} (or AMAX > 1 / SMALL with "
                             f"the columns scaled), columns where COLCND < {THRESH}"}
        if self.applied:
            out["row_exponents"] = [int(self.row.min()), int(self.row.max())]
            out["column_exponents"] = [int(self.col.min()), int(self.col.max())]
            out["note"] = note
        return out


#: Rows of a complex strip whose parts' magnitudes are compared at a time (:func:`_magnitude`'s temporary).
_PART_ROWS = 16


def _magnitude(m: Any) -> np.ndarray:
    """``|m|``, and for complex entries ``max(|Re|, |Im|)``, within ``sqrt(2)`` of the modulus (any magnitude
    works: the scalings are powers of two), which never overflows: the modulus of a finite entry near the
    range's top is Inf, read as a NaN/Inf in the data (no scaling, and the routes refused the matrix as
    non-finite). The parts are compared :data:`_PART_ROWS` rows at a time (no second strip-sized array)."""
    m = np.asarray(m)
    if m.dtype.kind != "c":
        return np.abs(m)
    x = np.abs(m.real)
    for r0 in range(0, m.shape[0], _PART_ROWS):
        np.maximum(x[r0:r0 + _PART_ROWS], np.abs(m.imag[r0:r0 + _PART_ROWS]), out=x[r0:r0 + _PART_ROWS])
    return x


def _exponents(maxima: np.ndarray) -> np.ndarray:
    """``-e`` with ``maxima = f 2^e``, ``f`` in ``[0.5, 1)``: ``2^-e maxima`` in ``[0.5, 1)`` (0 for a zero maximum)."""
    e = np.frexp(maxima)[1].astype(np.int64)
    return np.where(maxima > 0, -e, 0)


def power_of_two(e: int) -> float:
    """``2^e`` as a float64, ``inf`` beyond its range (a message's magnitude of an exponent ``scale_into`` found)."""
    with np.errstate(over="ignore"):
        return float(np.ldexp(1.0, int(e)))


def _scan_memory(params: Any, sources: tuple) -> PassMemory:
    w = sources[0].width
    # the strip's magnitudes (float64 at most), their exponents and a mask (strip_maxima), and the column maxima
    return PassMemory(fixed=4 * w * 8, per_row=w * (8 + 4 + 1) + 32)


#: The exponent of a column of zeros in :class:`ColumnMaxima` (below every entry's).
_NO_ENTRY = np.iinfo(np.int32).min // 4


@dataclasses.dataclass
class ColumnMaxima:
    """The column maxima of ``R A`` as ``frac 2^exp`` (``frac`` in ``[0.5, 1)``, 0 for a column of zeros), exact
    where the product itself would leave float64's range: rows ``2^600`` times others and columns ``2^-600``
    times others make ``R A``'s small columns near ``2^-1200``, which ``ldexp`` flushes to 0 (read as a zero
    column: no scaling), while ``R A C``, scaled in one ``ldexp`` by ``r_i + c_j``, is exact."""

    frac: np.ndarray
    exp: np.ndarray

    @classmethod
    def empty(cls, n: int) -> ColumnMaxima:
        return cls(np.zeros(n), np.full(n, _NO_ENTRY, dtype=np.int64))

    def merge(self, other: ColumnMaxima) -> None:
        """``self = max(self, other)``, column by column."""
        take = (other.exp > self.exp) | ((other.exp == self.exp) & (other.frac > self.frac))
        take |= np.isnan(other.frac)
        self.frac = np.where(take, other.frac, self.frac)
        self.exp = np.where(take, other.exp, self.exp)

    def values(self) -> np.ndarray:
        """The maxima as float64 (0 below its range, as LAPACK's product gives)."""
        with np.errstate(over="ignore", under="ignore"):
            return np.ldexp(self.frac, np.clip(self.exp, -4096, 4096).astype(np.int32))


def strip_maxima(m: Any) -> tuple[np.ndarray, ColumnMaxima]:
    """Each row's largest magnitude of a strip of whole rows, float64, and the column maxima of ``R`` times
    the strip (``R`` from those row maxima) as :class:`ColumnMaxima`. Beside the magnitudes (the strip's
    real dtype) it holds their binary exponents (int32) and a mask: 5 bytes an entry."""
    x = _magnitude(m)
    rmax = x.max(axis=1, initial=0.0).astype(np.float64)
    bad = ~np.isfinite(x).all(axis=0)
    e = np.empty(x.shape, dtype=np.int32)
    np.frexp(x, out=(x, e))  # x now the fractions, in [0.5, 1) or 0 (exact in its own dtype)
    e += _exponents(rmax).astype(np.int32)[:, None]  # R's exponents: |e| stays below 2^12
    e[x == 0] = _NO_ENTRY
    cexp = e.max(axis=0, initial=_NO_ENTRY)
    x[e != cexp[None, :]] = 0
    cfrac = x.max(axis=0, initial=0.0).astype(np.float64)
    cfrac[bad] = np.nan  # NaN/Inf: decide() applies no scaling
    return rmax, ColumnMaxima(cfrac, cexp.astype(np.int64))


@row_kernel(memory=_scan_memory, device="cpu", read_only=True)
def scan_kernel(device: Any, arrays: tuple, rows: slice, params: dict, state: Any) -> tuple[dict, None]:
    """Each row's largest magnitude, and the column maxima of ``R A`` (``R`` from those row maxima)."""
    rmax, cmax = strip_maxima(arrays[0])
    if state is None:
        state = {"rows": [], "cmax": cmax}
    else:
        state["cmax"].merge(cmax)
    state["rows"].append((rows.start, rmax))
    return state, None


def scan(job: Any, M: Any) -> Equilibration:
    """One row pass over ``M``: its row and column scalings and LAPACK's decision to apply them (:func:`decide`)."""
    n = M.shape[0]
    states, _ = run_pass(job, scan_kernel, [source(M, name="a")], {}, check_finite=False, peaks=False,
                         description="row and column maxima (equilibration)")
    rmax = np.empty(n)
    cmax = ColumnMaxima.empty(n)
    for st in states:
        if st is None:  # a group without strips
            continue
        for r0, blk in st["rows"]:
            rmax[r0:r0 + blk.shape[0]] = blk
        cmax.merge(st["cmax"])
    return decide(rmax, cmax, np.dtype(M.dtype))


def decide(rmax: np.ndarray, cmax: ColumnMaxima, dtype: Any = np.float64) -> Equilibration:
    """The scalings of row maxima ``rmax`` and column maxima ``cmax`` of ``R A``, and xLAQGE's decision for a
    matrix of ``dtype``. NaN/Inf (``check_finite=False``) or a zero row or column: no scaling (the routes refuse
    such a matrix). A column maximum below float64's range counts as LAPACK's ``SMLNUM`` in ``COLCND`` and keeps
    its exact exponent.

    Rows are scaled where ``ROWCND < THRESH``, and, as ``xLAQGE`` has it, where the largest entry ``AMAX`` is
    above ``LARGE = 1 / SMALL`` (``SMALL`` the dtype's safe minimum over its precision) and the columns are
    scaled: the column scalings are those of ``R A``, so ``A C`` alone has column maxima up to ``2 max_i rmax_i``, beyond the range for
    data within a factor 2 of its top (a float64 matrix led by ``0.7 * 1.8e308`` with graded columns had
    been refused as holding an Inf). ``xLAQGE`` scales the rows where ``AMAX < SMALL`` too; ``A C``'s
    maxima are then of the data's own size, and data that small is left to the routes' power-of-two
    scaling (their refusals of an ``x`` or inverse beyond the range name the fix)."""
    n = len(rmax)
    zero = np.zeros(n, dtype=np.int64)
    if not (np.isfinite(rmax).all() and np.isfinite(cmax.frac).all()) or rmax.min() == 0 or cmax.frac.min() == 0:
        return Equilibration(zero, zero, math.nan, math.nan, False, False)
    tiny, big = np.finfo(np.float64).tiny, 1 / np.finfo(np.float64).tiny  # LAPACK's SMLNUM and BIGNUM
    values = cmax.values()
    rowcnd = max(float(rmax.min()), tiny) / min(float(rmax.max()), big)
    colcnd = max(float(values.min()), tiny) / min(float(values.max()), big)
    # xGEEQUB's column scalings are those of R A whether or not xLAQGE applies R
    row, col = _exponents(rmax), -cmax.exp
    fi = np.finfo(np.dtype(dtype))
    large = float(fi.eps) / float(fi.tiny)  # LAPACK's LARGE = 1 / SMALL, SMALL = xLAMCH('S') / xLAMCH('P')
    cols_scaled = colcnd < THRESH
    # (only with C: rows alike in scale and no column scaling leave A as it was, and its routes' own scaling)
    rows_scaled = rowcnd < THRESH or (cols_scaled and float(rmax.max()) > large)
    peak = 0 if rows_scaled else int(np.frexp(float(rmax.max()))[1])
    return Equilibration(row if rows_scaled else zero, col if cols_scaled else zero, rowcnd, colcnd,
                         bool(rows_scaled), bool(cols_scaled), peak)


def _rhs_memory(params: Any, sources: tuple) -> PassMemory:
    w = sources[0].width
    # the strip's magnitudes (float64 at most), their exponents (int32) and the column maxima
    return PassMemory(fixed=2 * w * 8, per_row=w * (8 + 4) + 8)


@row_kernel(memory=_rhs_memory, device="cpu", read_only=True)
def rhs_kernel(device: Any, arrays: tuple, rows: slice, params: dict, state: Any) -> tuple[Any, None]:
    """The binary exponent of each column's largest magnitude of ``diag(2^left[rows]) b[rows]``."""
    x = _magnitude(arrays[0])
    e = np.frexp(x)[1].astype(np.int64) + np.asarray(params["left"][rows], dtype=np.int64)[:, None]
    e[x == 0] = _NO_ENTRY
    cexp = e.max(axis=0, initial=_NO_ENTRY)
    return (cexp if state is None else np.maximum(state, cexp)), None


def rhs_exponents(job: Any, B: Any, eq: Equilibration, dtype: Any) -> tuple[np.ndarray, np.ndarray]:
    """The powers of two ``2^s_j`` that keep the solution ``y`` of ``(R A C) y = R B 2^s`` within ``dtype``'s
    normal range, from one read of ``B``. ``||y|| >= ||R b|| / ||R A C||_2``, and ``||R A C||_2 < n 2^peak``
    (:attr:`Equilibration.peak`): where ``max |R b| / 2^peak`` lies within ``n`` (and a factor 2) of the range's
    bottom, or beyond its top, ``s_j`` brings it to 1 (``y`` near 1 while ``R A C`` is well conditioned); 0
    elsewhere (those columns keep their bits). The exponents of ``R B`` are exact whatever the product's range.
    ``R b`` of rows ``2^600`` above the others and ``b`` near ``2^-450`` there is subnormal: the solve kept a
    few of its bits and ``x = C y`` brought the loss back into the normal range (relative errors of ``1e-7`` to
    ``1e-2`` for a bound of ``1e-11``); float32 columns ``2^115`` apart with rows alike (not scaled: ``A C`` near
    ``A``'s ``2^60``) and ``b`` near ``4e-33`` gave ``y`` below the range and ``x = 0``, refused as below it, where
    ``x`` is near ``2e-16``. The column's ``x`` is then ``2^-s_j`` times the solution (exact but where it leaves
    the range).

    Also returned: each column's binary exponent (frexp's ``e``, ``|v| < 2^e``) of ``max |R b 2^s|``, the right-hand
    sides the solve eliminates (:func:`rhs_within` judges them against a narrower factor's range)."""
    k = B.shape[1]
    states, _ = run_pass(job, rhs_kernel, [source(B, name="b")], {"left": np.asarray(eq.row, dtype=np.int32)},
                         check_finite=False, peaks=False, over="b", description="column maxima of R b")
    cexp = np.full(k, _NO_ENTRY, dtype=np.int64)
    for st in states:
        if st is not None:
            np.maximum(cexp, st, out=cexp)
    fi = np.finfo(np.dtype(dtype))
    # frexp's e: |v| < 2^e; y's columns near 2^(cexp - peak), at least 2^(cexp - peak - 1) / n
    ey = cexp - eq.peak
    margin = 1 + math.ceil(math.log2(max(B.shape[0], 1)))
    out = (cexp != _NO_ENTRY) & ((ey < fi.minexp + margin) | (ey > fi.maxexp - margin))
    shift = np.where(out, -ey, 0).astype(np.int64)
    return shift, np.where(cexp != _NO_ENTRY, cexp + shift, _NO_ENTRY)


def rhs_within(exponents: np.ndarray, dtype: Any) -> bool:
    """Whether every column whose largest magnitude has the binary exponent ``exponents`` (of
    :func:`rhs_exponents`: ``2^(e-1) <= max |v| < 2^e``) casts to ``dtype`` within its normal range, neither
    beyond its largest value nor below its smallest normal one (a zero column is within it)."""
    fi = np.finfo(np.dtype(dtype))
    e = np.asarray(exponents, dtype=np.int64)
    return bool(np.all((e == _NO_ENTRY) | ((e >= fi.minexp) & (e < fi.maxexp))))


def _scale_memory(params: Any, sources: tuple) -> PassMemory:
    w, dt = sources[0].width, np.dtype(params["dtype"])
    # the strip's exponents (int32), the scaled block written, a cast copy of a narrower source, and with
    # ``check`` the overflow masks (three bools) and, only where one overflowed, the frexp of the block
    per_row = w * (4 + dt.itemsize + (0 if np.dtype(sources[0].dtype) == dt else dt.itemsize))
    per_row += w * (3 + 8 + 4) if params["check"] else 0
    return PassMemory(fixed=2 * w * 8, per_row=per_row)


def _scaled(m: Any, e: np.ndarray, dtype: np.dtype) -> np.ndarray:
    m = np.asarray(m)
    if dtype.kind == "c":
        out = np.empty(m.shape, dtype=dtype)
        np.ldexp(m.real, e, out=out.real)
        np.ldexp(m.imag, e, out=out.imag)
        return out
    return np.ldexp(np.asarray(m, dtype=dtype), e).astype(dtype, copy=False)


@row_kernel(memory=_scale_memory, device="cpu")
def scale_kernel(device: Any, arrays: tuple, rows: slice, params: dict, state: Any) -> tuple[dict, dict]:
    """``out[rows] = diag(2^left[rows]) m[rows] diag(2^right)`` (exact but below the range's bottom). With
    ``check``: the entries that overflowed from finite ones (an inverse beyond the dtype's range) and
    the largest binary exponent they would have had."""
    state = state or {"overflow": 0, "peak": 0}
    e = (np.asarray(params["left"][rows], dtype=np.int32)[:, None] + np.asarray(params["right"], dtype=np.int32)[None, :])
    with np.errstate(over="ignore", under="ignore", invalid="ignore"):
        out = _scaled(arrays[0], e, np.dtype(params["dtype"]))
        if params["check"]:
            bad = int(np.count_nonzero(np.isinf(out) & np.isfinite(np.asarray(arrays[0]))))
            if bad:
                y = _magnitude(arrays[0])
                state["peak"] = max(state["peak"], int((np.frexp(y)[1] + e)[np.isfinite(y)].max()))
            state["overflow"] += bad
    return state, {"out": out}


def scale_into(job: Any, src: Any, dst: Any, left: np.ndarray, right: np.ndarray, dtype: np.dtype, chunk: int, *,
               description: str, over: str, check: bool = False) -> tuple[int, int]:
    """Row pass ``dst = diag(2^left) src diag(2^right)`` in ``dtype``, strips of whole chunk rows of
    ``dst``; returns the number of entries that overflowed (``check``) and the largest binary exponent
    ``e`` (``|x| < 2^e``) of those entries."""
    src_ = [source(src, name="a").aligned_to(chunk)]
    params = {"left": np.asarray(left, dtype=np.int32), "right": np.asarray(right, dtype=np.int32),
              "dtype": np.dtype(dtype).name, "check": check}
    prp = plan_kernel_pass(job, scale_kernel, src_, params, max_strip=4 * chunk)
    n = src.shape[0]
    if prp.strip % chunk and prp.strip < n:  # a strip must own whole chunk rows of dst (as the staging pass)
        prp = plan_kernel_pass(job, scale_kernel, src_, params, max_strip=chunk, workers=1, min_tasks=1)
    states, _ = run_pass(job, scale_kernel, src_, params, plan=prp, outputs=(("out", dst),), check_finite=False,
                         peaks=False, over=over, description=description)
    states = [s for s in states if s is not None]
    return sum(s["overflow"] for s in states), max((s["peak"] for s in states), default=0)


__all__ = ["ColumnMaxima", "Equilibration", "NOTE", "THRESH", "decide", "power_of_two", "rhs_exponents", "rhs_within", "scale_into",
           "scan", "strip_maxima"]
