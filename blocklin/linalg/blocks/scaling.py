"""Scaling by powers of two: data with entries near the ends of the floating-point range.

Routes that square their operand (the Gram ``A^T A``, the normal operator ``A^T (A Q)``, the
variances of a centered ``A``) overflow for entries near ``1e200`` and underflow for entries near
``1e-200`` although the problem is well posed; LAPACK scales before it squares (``dlascl``, the
scaling of ``xNRM2``) and so do these routes. The largest magnitude ``max |a|`` of an operand is
recorded by the first row pass that reads it (:mod:`blocklin.runtime.passes`, beside the NaN/Inf
check), a power of two ``2^e`` brings it near 1, every later pass divides its strips by ``2^e`` as
it reads them (never a scaled copy on disk), and the results are multiplied back: singular values
by ``2^e``, a Gram by ``2^(2e)``, a solution ``x`` of ``A x = b`` by ``2^(e_b - e_a)``. Multiplying
by a power of two is exact in binary floating point (barring underflow of what sits ``2^-1074``
below the largest entry), so the scaled problem is the problem.

Data inside :func:`safe_range` is never scaled (``e = 0``): its bits and passes are those of an
unscaled run. Outside it, a pass that was made before ``max |a|`` was known is made again scaled
(one more pass, reported as ``report["scaling"]["extra_passes"]``).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any, TypeVar

import numpy as np

from blocklin.runtime.passes import take_recorded_peaks
from blocklin.runtime.powers import ldexp, max_exponent

T = TypeVar("T")


def safe_range(dtype: Any) -> tuple[float, float]:
    """``(low, high)``: magnitudes of ``max |a|`` that every route squares without overflow or underflow.

    ``2^(+-maxexp/4)`` (``2^+-256`` in float64, ``2^+-32`` in float32): the square of the largest
    entry times a sum over ``2^(maxexp/2)`` terms stays below the overflow threshold ``2^maxexp``, and
    the square of an entry ``eps`` below the largest stays above the smallest normal number
    (``2^(-maxexp/2 - 2 mant)`` > ``2^(minexp)``), so a Gram keeps its relative accuracy.
    """
    dt = np.dtype(dtype)
    if dt.kind not in "fc":  # integers are computed on as float64 (the cast NumPy and SciPy make)
        dt = np.dtype(np.float64)
    q = np.finfo(dt).maxexp // 4
    return 2.0 ** -q, 2.0 ** q


def exponent_for(amax: float, dtype: Any) -> int:
    """The power ``e`` to divide by (``0``: no scaling): ``max |a| / 2^e`` in ``[0.5, 1)`` when
    ``max |a|`` is outside :func:`safe_range`; ``0`` for zero, NaN or Inf (the NaN/Inf check names those)."""
    if not math.isfinite(amax) or amax <= 0:
        return 0
    low, high = safe_range(dtype)
    if low <= amax <= high:
        return 0
    return int(np.frexp(amax)[1])


def column_exponents_for(peaks: Any, e: int, dtype: Any) -> np.ndarray | None:
    """One power of two per column (each column's largest entry ``/ 2^e_j`` in ``[0.5, 1)``; ``e`` for a
    column of zeros, NaN or Inf) where the one power ``2^-e`` takes some nonzero column's largest entry
    below ``tiny * 2^nmant`` of ``dtype`` (:func:`narrow_range`: from there down a column keeps fewer than
    its bits, or is flushed to 0) or below ``2^-511`` (float64's: its squares, of which the routes form the
    residual and solution norms they report, fall out of float64's normal range, as
    :func:`squares_lose_columns` says of a Gram; a column near ``2^-600`` beside one near 1, ``e = 0``, had both
    norms reported as 0); None where ``2^-e`` keeps every column (the bits of one power)."""
    if peaks is None or np.size(peaks) < 2:
        return None
    p = np.asarray(peaks, dtype=np.float64).ravel()
    dt = np.dtype(dtype) if np.dtype(dtype).kind in "fc" else np.dtype(np.float64)
    ok = np.isfinite(p) & (p > 0)
    with np.errstate(under="ignore"):
        low = max(narrow_range(dt)[0], float(np.ldexp(1.0, (np.finfo(np.float64).minexp + 1) // 2)))
        lost = ok & (np.ldexp(np.where(ok, p, 0.0), -int(e)) < low)
    if not lost.any():
        return None
    return np.where(ok, np.frexp(np.where(ok, p, 1.0))[1], int(e)).astype(np.int64)


def scale(x: Any, e: int) -> Any:
    """``x * 2^-e`` (exact), keeping the dtype; ``x`` itself when ``e == 0``."""
    if not e:
        return x
    return ldexp(np.asarray(x), -e)


def unscale(x: Any, e: int) -> Any:
    """``x * 2^e`` (exact where it fits), keeping the dtype; ``x`` itself when ``e == 0``."""
    return scale(x, -e)


def unscale_float(x: float, e: int) -> float:
    """``x * 2^e`` for one Python float (``inf`` where it overflows, not an ``OverflowError``)."""
    if not e:
        return float(x)
    with np.errstate(over="ignore", under="ignore"):
        return float(np.ldexp(np.float64(x), e))


class _Power:
    """``known`` and ``exponent`` of a power of two ``e`` that is ``None`` until learned."""

    e: int | None

    @property
    def known(self) -> bool:
        return self.e is not None

    @property
    def exponent(self) -> int:
        return self.e or 0


@dataclasses.dataclass
class Scaling(_Power):
    """The power of two of one operand, once known (``e is None`` before its first pass)."""

    path: str
    dtype: Any
    e: int | None = None
    amax: float | None = None
    extra_passes: int = 0
    #: The :class:`~blocklin.runtime.passes.Source` the passes stream, where the peaks its writer
    #: recorded may give ``e`` before the first pass (:meth:`of`)
    source: Any = dataclasses.field(default=None, repr=False, compare=False)
    #: The operation that cannot compute with NaN or Inf (``"svd"``, ``"eigsh"``): :meth:`learn` refuses
    #: a non-finite ``max |a|`` for it (:func:`refuse_nonfinite`); ``None``: NaN and Inf propagate
    finite_for: str | None = dataclasses.field(default=None, compare=False)
    #: A right-hand side solved column by column (each column of ``x`` its own problem): where the one
    #: power ``2^-e`` would take a column's largest entry below the range its precision needs
    #: (:func:`blocklin.linalg.blocks.result_range.refuse_flushed_rhs` refused those), each column is
    #: divided by its own power, :attr:`columns` (learned from the first pass's column peaks: the
    #: caller adds the path to ``job.column_peaks``)
    per_column: bool = dataclasses.field(default=False, compare=False)
    columns: np.ndarray | None = None

    @classmethod
    def of(cls, src: Any, dtype: Any, finite_for: str | None = None) -> Scaling:
        """The scaling of the operand the passes stream as ``src``."""
        return cls(str(src.path), dtype, source=src, finite_for=finite_for)

    def params(self) -> dict[str, int]:
        """``run_pass(..., scale=...)`` for this operand (empty before it is known)."""
        if self.columns is not None:
            return {self.path: tuple(int(v) for v in self.columns)}
        return {self.path: self.e} if self.e else {}

    @property
    def column_exponents(self) -> Any:
        """The power each column was divided by: :attr:`columns`, else the one ``exponent``."""
        return self.columns if self.columns is not None else self.exponent

    @property
    def largest(self) -> int:
        """The largest column's power where each column has its own (:attr:`columns`), else the one
        ``exponent``: the unit a sum over the columns is kept in."""
        return int(np.max(self.columns)) if self.columns is not None else self.exponent

    @property
    def column_shift(self) -> np.ndarray | None:
        """Per column, its power less the largest's (``columns - largest``, all ``<= 0``; None with one power):
        what takes column ``j``'s sums from its own units into the largest column's."""
        return None if self.columns is None else np.asarray(self.columns, dtype=np.int64) - self.largest

    def learn(self, job: Any) -> int:
        """Set ``e`` from ``job.amax`` (the first pass's record), and :attr:`columns` where they are
        wanted and needed (:func:`column_exponents_for`); the exponent."""
        if self.e is None:
            self.amax = float(job.amax.get(self.path, 0.0))
            if self.finite_for:
                refuse_nonfinite(self.amax, self.finite_for)
            self.e = exponent_for(self.amax, self.dtype)
            if self.per_column:  # e = 0 too: a column far below the largest, whose squares underflow
                self.columns = column_exponents_for(job.peaks.get(self.path), self.e, self.dtype)
        return self.e

    def run(self, job: Any, run: Callable[[dict[str, int]], T], *, others: tuple[Scaling, ...] = ()) -> T:
        """``run(scale)`` a pass over this operand (and ``others``, read by the same pass) scaled by
        what is known; a pass that learned an exponent not zero is made again, scaled (the unscaled
        one may have overflowed). An operand whose writer recorded its peaks
        (:mod:`blocklin.storage.recorded_peaks`) learns its power before: its first pass runs scaled
        at once, with the bits of the rerun it spares."""
        every = (self, *others)
        for s in every:
            if not s.known and s.source is not None:
                take_recorded_peaks(job, [s.source])
                if s.path in job.amax:
                    s.learn(job)
        fresh = [s for s in every if not s.known]
        result = run(_merge(every))
        if fresh and any([bool(s.learn(job)) or s.columns is not None for s in fresh]):  # every one learns first
            self.extra_passes += 1
            result = run(_merge(every))
        for s in fresh:
            s.learn(job)
        return result

    def report(self) -> dict | None:
        """``report["scaling"]``: ``None`` when the data needed none."""
        if not self.e:
            return None
        return {"exponent": int(self.e), "max_abs": self.amax, "extra_passes": self.extra_passes,
                "note": f"the data was multiplied by 2^{-self.e} as it was read and the results by the "
                        f"matching power of 2^{self.e} (max |a| = {self.amax:.3g} is outside the range "
                        f"squared without overflow or underflow)"}


@dataclasses.dataclass
class ProductScaling(_Power):
    """The power of two of an operator known only by its products (a SciPy ``LinearOperator``, a stored
    sparse matrix's row blocks), learned from its first product.

    The methods on an operator square it as the streamed routes do (``B^T (B Q)``, the Gram of ``B Q``,
    Lanczos' orthogonalization), so entries near ``1e200`` overflow and near ``1e-200`` underflow
    although no single product does. No pass reads ``max |b|`` first; ``max |B X|`` of the first
    product stands for it: the first block ``X`` is random (orthonormal, or Gaussian in the sketch),
    so ``max |B X|`` is within a factor of about ``sqrt(n N)`` of ``||B||`` for almost every draw,
    far inside the ``2^256`` of room that :func:`safe_range` leaves on either side. Every later
    product then multiplies ``2^-e B``, its input scaled first (``B (2^-e X)``, so that no product
    leaves the range either), and the results are multiplied back as for a stored operand. Inside
    :func:`safe_range` ``e = 0``: the bits of an unscaled run.
    """

    dtype: Any
    e: int | None = None
    amax: float | None = None

    @property
    def into_exponent(self) -> int:
        """The power :meth:`into` divides an input by: ``e``, but never by more than ``2^-(maxexp - 32)``
        (the input's entries, orthonormal or Gaussian, stay far below the overflow threshold). An operator
        whose entries are all subnormal has ``e`` below ``-maxexp``: ``2^-e x`` overflowed to Inf, and
        svd, pca and eigsh crashed (``LinAlgError``, ``array must not contain infs or NaNs``); the rest
        of the power is applied to the product by :meth:`learn`."""
        dt = np.dtype(self.dtype) if np.dtype(self.dtype).kind in "fc" else np.dtype(np.float64)
        return max(self.exponent, -(np.finfo(dt).maxexp - 32))

    @property
    def first_lost_digits(self) -> bool:
        """Whether the first product's largest entry is so small (below ``tiny / eps`` of the dtype) that
        its rounding, near the subnormal numbers' fixed spacing, lost relative digits: the caller makes that
        product again, its input scaled (the scaled Lanczos start had been off by ``2^-18`` relative for
        entries near ``1e-318``, and eigsh's symmetry check refused a symmetric matrix)."""
        dt = np.dtype(self.dtype) if np.dtype(self.dtype).kind in "fc" else np.dtype(np.float64)
        fi = np.finfo(dt)
        return self.amax is not None and 0 < self.amax < float(fi.tiny) / float(fi.eps)

    def into(self, x: Any) -> Any:
        """The input of a product with ``2^-e B``: ``2^-e x`` (``x`` itself before ``e`` is known; the part
        of the power beyond :attr:`into_exponent` is applied to the product by :meth:`learn`)."""
        return scale(x, self.into_exponent)

    def learn(self, y: Any, name: str = "a") -> Any:
        """``y`` as a product of ``2^-e B``: on the first product (``y = B x``), ``e`` is learned from
        ``max |y|`` and ``2^-e y`` returned; a later product ``y = B into(x)`` times the power of two
        :meth:`into` left out (``y`` itself but for operators whose entries are all subnormal). A first
        product holding NaN or Inf is refused (:func:`check_finite_result`, naming ``name``)."""
        if self.e is not None:
            return scale(y, self.e - self.into_exponent)
        check_finite_result(name, y, "the product of the operator with its first block: the data holds NaN or "
                            "Inf, or its entries are so large that one product overflows")
        y = np.asarray(y)
        self.amax = float(np.abs(y).max()) if y.size else 0.0
        self.e = exponent_for(self.amax, self.dtype)
        return scale(y, self.e)

    def report(self) -> dict | None:
        """``report["scaling"]``: ``None`` when the operator needed none."""
        if not self.e:
            return None
        return {"exponent": int(self.e), "max_abs_first_product": self.amax,
                "note": f"every product was made with 2^{-self.e} times the operator and the results multiplied "
                        f"by the matching power of 2^{self.e} (its first product's largest entry, "
                        f"{self.amax:.3g}, is outside the range squared without overflow or underflow)"}


def _merge(every: tuple[Scaling, ...]) -> dict[str, int]:
    out: dict[str, int] = {}
    for s in every:
        out.update(s.params())
    return out


def squares_lose_columns(peaks: np.ndarray | None) -> int:
    """How many nonzero columns a float64 Gram cannot hold: those whose largest entry is below
    ``2^-511`` times the largest of all (their squares fall below ``2^-1022`` relative to the largest
    square, out of float64's normal range: the Gram holds zeros or a few bits for them, and the
    singular values they carry are lost however the data is scaled)."""
    if peaks is None or peaks.size == 0:
        return 0
    top = float(peaks.max())
    if not top > 0:
        return 0
    cut = np.ldexp(top, (np.finfo(np.float64).minexp + 1) // 2)
    return int(np.count_nonzero((peaks > 0) & (peaks < cut)))


def incore_exponent(b: np.ndarray) -> tuple[int, float]:
    """``(e, max |b|)`` of an array held in memory."""
    amax = max(float(b.max()), -float(b.min())) if b.size else 0.0  # no temporary the size of b
    return exponent_for(amax, b.dtype), amax


def refuse_nonfinite(amax: float | None, what: str, name: str = "a") -> None:
    """Raise :class:`~blocklin.errors.NonFiniteError` when ``amax`` (the data's largest magnitude, NaN
    where it holds a NaN) is not finite, for an operation (``what``) that has no answer on NaN or Inf.

    With ``check_finite=True`` the first pass refuses such data itself, naming the position; this is
    ``check_finite=False``'s guard: skipping the check must not turn the NaN of a decomposition into an
    empty or finite wrong result (its rank-revealing steps dropped every NaN column: ``s = []``). Like
    ``numpy.linalg.svd``, which raises ``LinAlgError`` on NaN or Inf, it refuses instead of returning NaN."""
    refusal = nonfinite_refusal(amax, what, name)
    if refusal is not None:
        raise refusal


def nonfinite_refusal(amax: float | None, what: str, name: str = "a") -> Exception | None:
    """The :class:`~blocklin.errors.NonFiniteError` :func:`refuse_nonfinite` raises (None for a finite or
    unknown ``amax``): for callers that build their error first (a singular block that was NaN)."""
    from blocklin.errors import NonFiniteError, explain

    if amax is not None and not math.isfinite(amax):
        return NonFiniteError(explain(
            name, f"must be finite for {what} (a decomposition has no answer on NaN or Inf; check_finite=False "
            "skipped the check that names the position)",
            f"largest magnitude {amax} ({'a NaN' if math.isnan(amax) else 'an Inf'} in the data)",
            "clean the input (for example numpy.nan_to_num, or fill the chunks never written), or run with "
            "check_finite=True to find where it is"))


def check_finite_result(name: str, values: Any, what: str) -> None:
    """Raise :class:`~blocklin.errors.ConvergenceError` naming ``name`` when ``values`` holds NaN or
    Inf: a result that is never reported as converged."""
    from blocklin.errors import ConvergenceError, explain

    v = np.asarray(values, dtype=np.float64)
    if v.size and not np.isfinite(v).all():
        raise ConvergenceError(explain(
            name, f"must be finite ({what})", f"{int((~np.isfinite(v)).sum())} of {v.size} non-finite",
            "check the input's range (entries near the overflow or underflow limits of the dtype); "
            "use float64, or rescale the data"))


def check_scaled_back_range(name: str, values: Any, e: int, what: str) -> None:
    """Refuse values of the data scaled by ``2^-e`` (singular values) whose ``2^e`` multiple leaves float64:
    scaled back they would be Inf, which had been refused as a non-finite result (``ConvergenceError``)
    whose fix said to use float64. The fix names the power of two whose scaled data's values fit."""
    from blocklin.errors import ParameterError, explain

    v = np.abs(np.asarray(values, dtype=np.float64))
    v = v[np.isfinite(v) & (v > 0)]
    if not v.size:
        return
    top = int(np.frexp(float(v.max()))[1]) + int(e)  # the largest value is below 2^top
    if top > np.finfo(np.float64).maxexp:
        raise ParameterError(explain(
            name, f"must have {what} within the range of float64, the precision they are returned in",
            f"a largest value of about 2^{top - 1} (above float64's 1.798e+308)",
            f"scale the data by 2.0**-{top - 1000} (exact: the values of the scaled data are 2^-{top - 1000} "
            f"times these)"))


def check_result_range(name: str, values: Any, dtype: Any, what: str) -> None:
    """Refuse values computed in float64 from scaled data (singular values, eigenvalues) that the
    result's precision, ``dtype``'s real type, cannot hold: cast, they would be Inf (float32 data near
    ``1e38``, whose singular values reach past ``3.4e38``, had returned ``s = inf`` with
    ``converged=True``). The fix names the power of two whose scaled data's values fit."""
    from blocklin.errors import ParameterError, explain

    fi = np.finfo(np.dtype(dtype))
    v = np.abs(np.asarray(values, dtype=np.float64))
    v = v[np.isfinite(v)]
    if v.size and float(v.max()) > float(fi.max):
        e = int(np.frexp(float(v.max()))[1])
        raise ParameterError(explain(
            name, f"must have {what} within the range of {fi.dtype.name}, the precision they are returned in",
            f"a largest value of {float(v.max()):.4g}, above {fi.dtype.name}'s {float(fi.max):.4g}",
            f"convert the data to float64 (blocklin convert --dtype float64), or scale it by 2.0**-{e} (exact: "
            f"the values of the scaled data are 2^-{e} times these)"))


#: Smallest float64 sum of squares taken as exact: a sum of squares below it lost digits to
#: subnormal numbers (entries near 2^-450 and smaller).
SUMSQ_FLOOR = 2.0 ** -900


def sumsq_in_range(sumsq: float) -> bool:
    """Whether a float64 sum of squares kept its digits (no overflow, no underflow towards subnormals)."""
    return (sumsq == 0.0 or sumsq >= SUMSQ_FLOOR) and math.isfinite(sumsq)


def column_norms(x: Any, *, per_column: bool = False) -> np.ndarray:
    """Each column's 2-norm of an array in memory (float64), of ``x`` divided by a power of two near its
    largest entry (exact): no square overflows or underflows (entries near 1e200 or 1e-200), and inside
    the range the bits are those of ``sqrt(sum |x_ij|^2)``.

    ``per_column``: each column divided by the power of two near its own largest entry, for columns far
    apart in one array (a column near ``1e-300`` beside one near ``1e300``: one power for the array flushes
    the small column's squares to 0). The bits are still those of ``sqrt(sum |x_ij|^2)`` where its squares
    stay in range (scaling by ``2^-e`` is exact, and so is the ``2^e`` the square root gives back). A column
    holding Inf has norm Inf, one holding NaN (and no Inf) NaN, as the unscaled sum has."""
    ss, e = _scaled_sumsq_cols(x, per_column=per_column)
    with np.errstate(over="ignore", under="ignore"):
        return np.ldexp(np.sqrt(ss), e)


def fro_norm(x: Any) -> float:
    """``||x||_F`` of an array in memory, scaled as :func:`column_norms`."""
    ss, e = _scaled_sumsq_cols(x)
    return unscale_float(math.sqrt(float(ss.sum())), e)


def _scaled_sumsq_cols(x: Any, *, per_column: bool = False) -> tuple[np.ndarray, Any]:
    """``sum |x_ij / 2^e|^2`` per column (float64) and ``e``: one power of two for ``x``, or with
    ``per_column`` one per column (0 for a column of zeros, Inf or NaN, which scaling does not change)."""
    x = np.asarray(x)
    x = x.reshape(x.shape[0], -1) if x.ndim != 2 else x
    if per_column:
        with np.errstate(invalid="ignore"):
            top = np.abs(x).max(axis=0, initial=0.0).astype(np.float64)
        e: Any = np.where(np.isfinite(top) & (top > 0), np.frexp(top)[1], 0).astype(np.int64)
        parts = (x.real, x.imag) if x.dtype.kind == "c" else (x,)
        parts = tuple(np.ldexp(np.asarray(q, np.float64), -e) for q in parts)
    else:
        e = max_exponent(x)
        y = ldexp(x, -e)
        parts = (y.real, y.imag) if y.dtype.kind == "c" else (y,)
    return sum(np.einsum("ij,ij->j", q, q, dtype=np.float64) for q in parts), e


def backward_error(res: float, norm_a: float, norm_x: float, norm_b: float) -> float:
    """The normwise backward error of ``A x = b``, ``res / (||A|| ||x|| + ||b||)`` (Rigal and Gaches 1967), of
    norms that are each in float64's range, with the denominator formed by powers of two (exact): ``||A||
    ||x||`` of data near ``1e200`` overflows and of data near ``1e-200`` underflows, and the quotient had
    been ``0`` (converged) or NaN. Shared by plain refinement and GMRES-IR. ``0`` where the denominator is zero; ``inf`` where a norm is
    not finite (nothing is measured)."""
    if not all(np.isfinite(v) for v in (res, norm_a, norm_x, norm_b)):
        return float("inf")
    mant = {}
    for name, v in (("a", norm_a), ("x", norm_x), ("b", norm_b)):
        f, e = np.frexp(v)
        mant[name] = (float(f), int(e))
    product = norm_a > 0 and norm_x > 0
    terms = ([mant["a"][1] + mant["x"][1]] if product else []) + ([mant["b"][1]] if norm_b > 0 else [])
    if not terms:
        return 0.0
    e = max(terms)  # the exponent of the larger term: the other may underflow, never overflow
    with np.errstate(over="ignore", under="ignore"):
        denom = float(np.ldexp(mant["a"][0] * mant["x"][0], mant["a"][1] + mant["x"][1] - e)) if product else 0.0
        denom += float(np.ldexp(norm_b, -e))
        return float(np.ldexp(res, -e)) / denom


def safe_norm(ops: Any, region: Any, sumsq: float) -> float:
    """``sqrt(sumsq)``, or where the sum of squares left float64's range (entries near 1e200 or 1e-200)
    the Frobenius norm of ``region`` read again by tiles scaled by powers of two (``ops.norm``, a
    :class:`~blocklin.runtime.blockops.BlockOps`)."""
    return math.sqrt(sumsq) if sumsq_in_range(sumsq) and sumsq != 0.0 else ops.norm(region)


def max_abs(op: Any, *, keep_nan: bool = False) -> float:
    """``max |a_ij|`` of a stored operand: its recorded peaks where they are current (no read), else a
    pass over its rows by bands (a check that no pass plans: ``precision=`` narrower than the data).
    ``keep_nan``: NaN where the operand holds one (else the NaN is passed over, as Python's ``max`` does)."""
    rec = _recorded_max_abs(op)
    if rec is not None:
        return rec
    top = 0.0
    for _, block in _row_bands(op):
        top = float(np.maximum(top, block.max())) if keep_nan else max(top, float(block.max()))
    return top


def max_finite_abs(op: Any) -> float:
    """``max |a_ij|`` over the finite entries of a stored operand (0 where none is): one pass over its rows by
    bands, for a range check where ``check_finite=False`` keeps its NaN and Inf (they propagate as NumPy's;
    a finite entry beyond the range would not)."""
    top = 0.0
    for _, block in _row_bands(op):
        kept = block[np.isfinite(block)]
        if kept.size:
            top = max(top, float(kept.max()))
    return top


def _recorded_max_abs(op: Any) -> float | None:
    """``max |a_ij|`` of a stored operand from the peaks its writer recorded, where they are current and
    ``op`` is the whole stored array; None elsewhere."""
    from blocklin.storage.recorded_peaks import recorded

    whole, shape = _whole_stored(op)
    if whole:
        rec = recorded(op.path, shape, column_peaks=False)
        if rec is not None:
            return float(rec.amax)
    return None


def recorded_line_peaks(op: Any, *, rows: bool) -> np.ndarray | None:
    """Each stored row's (``rows``) or column's ``max |a_ij|`` of a real stored matrix from the peaks its writer
    recorded, where they are current, of that side (a writer records the short side's) and ``op`` is the whole
    stored array; None elsewhere (complex data's record holds ``max(|Re|, |Im|)``, not ``|a_ij|``). No pass:
    the record's file of one float64 per line."""
    from blocklin.storage.recorded_peaks import recorded

    whole, shape = _whole_stored(op)
    if not whole or shape is None or np.dtype(op.dtype).kind != "f":
        return None
    rec = recorded(op.path, shape, column_peaks=True, transposed=rows)
    return None if rec is None or rec.columns is None else np.asarray(rec.columns, np.float64)


def _whole_stored(op: Any) -> tuple[bool, tuple[int, int] | None]:
    """Whether ``op`` is the whole of its stored array (not a row range), and that array's 2-D shape (None for a
    vector)."""
    from blocklin.storage.zarr_store import open_cached

    n = int(op.shape[0]) if len(op.shape) else 0
    arr = open_cached(op.path, "r")
    return (int(getattr(op, "first_row", 0)) == 0 and n == arr.shape[0],
            tuple(int(x) for x in arr.shape) if arr.ndim == 2 else None)


def max_and_smallest_nonzero(op: Any) -> tuple[float, float]:
    """:func:`max_abs` and ``min |a_ij|`` over the nonzero entries (0 where every entry is 0) of a stored
    operand, from one pass over its rows by bands (the largest is the recorded peak where :func:`max_abs`
    takes it): for the checks of a cast to a narrower dtype (which entries it takes beyond, or below, that
    dtype's normal range)."""
    top, low = 0.0, math.inf
    for _, block in _row_bands(op):
        top = max(top, float(block.max()))
        nz = block[block > 0]
        if nz.size:
            low = min(low, float(nz.min()))
    rec = _recorded_max_abs(op)
    return top if rec is None else rec, 0.0 if low == math.inf else low


def triangle_max_abs(op: Any, *, lower: bool) -> float:
    """``max |t_ij|`` over the ``lower`` (or upper) triangle of a stored square operand, diagonal included:
    one pass by bands, the other triangle ignored (a packed factor's, or anything the solve does not read).
    NaN where the triangle holds one."""
    top = 0.0
    for r0, block in _row_bands(op):
        part = np.tril(block, r0) if lower else np.triu(block, r0)
        top = float(np.maximum(top, part.max()))  # NaN kept (Python's max drops it)
    return top


def _row_bands(op: Any) -> Any:
    """``(first row, |band|)`` of a stored operand's rows by bands of about 8 MiB, in order (a vector as
    one column): the unplanned checks' one pass (:func:`max_abs`, :func:`flushed_line`)."""
    from blocklin.storage.zarr_store import row_bands

    n = int(op.shape[0]) if len(op.shape) else 0
    for rows, block in row_bands(op.path, first=int(getattr(op, "first_row", 0)), n=n):
        if block.size:
            yield rows.start, np.abs(block)


def flushed_line(op: Any, work: Any) -> tuple[str, int, float] | None:
    """The first row, else column, of a stored operand that a cast to the narrower ``work`` dtype flushes
    below its range (:func:`narrow_range`): ``("row" or "column", index, its max |a_ij|)``, nonzero but
    under the low bound; None where every line keeps its precision. One pass over ``op``'s rows by bands,
    made only to name why a factorization of the cast met a zero pivot: a row ``2^-660`` times the others
    is nonsingular in float64, and had been called singular."""
    low, top = narrow_range(work)[0], None
    for r0, block in _row_bands(op):
        line = block.max(axis=1)
        bad = np.flatnonzero((line > 0) & (line < low))
        if bad.size:
            return "row", r0 + int(bad[0]), float(line[bad[0]])
        top = block.max(axis=0) if top is None else np.maximum(top, block.max(axis=0))
    bad = np.flatnonzero((top > 0) & (top < low)) if top is not None else np.empty(0, dtype=int)
    return ("column", int(bad[0]), float(top[bad[0]])) if bad.size else None


def narrow_range(work: Any) -> tuple[float, float]:
    """``(low, high)``: the magnitudes a cast to ``work`` keeps with its full precision, from its smallest
    normal times ``2^p`` (below, an entry keeps a few bits or flushes to zero) up to, not including, its
    largest (from there, Inf)."""
    info = np.finfo(work)
    return float(info.tiny) * 2.0 ** info.nmant, float(info.max)


def range_refusal(amax: float, work: Any, needs: str, name: str, fix: str, *,
                  param: str = "precision") -> Exception | None:
    """The error for a cast to ``work`` of entries whose largest magnitude ``amax`` lies outside
    :func:`narrow_range`: ``needs`` says who needs them within it (``"a float32 factorization needs A's
    entries"``), ``name`` is the operand's in the value named, ``param`` the setting that asked for the
    cast. None within the range."""
    from blocklin.errors import ParameterError, explain

    low, high = narrow_range(work)
    if low <= amax < high:
        return None
    wd = np.dtype(work).name
    cast = "overflow" if amax >= high else "flush them to zero"
    return ParameterError(explain(param, f"{needs} within {wd}'s range (between {low:.3g} and {high:.3g}; "
                                  f"its cast would {cast})", f"max |{name}| = {amax:.3g}", fix))


def narrow_range_refusal(amax: float, source: Any, work: Any, fix: str) -> Exception | None:
    """The error for a factorization in a narrower ``work`` dtype (``precision="mixed"``: float32 of float64
    data) of data whose largest magnitude ``amax`` its cast cannot hold (:func:`range_refusal`). Those had
    been refused as a singular or indefinite ``A`` (found by a randomized search). None where the range
    holds, ``amax`` is not finite or zero, or ``work`` is not narrower than ``source``."""
    src, wd = np.dtype(source), np.dtype(work)
    if wd.itemsize >= src.itemsize or not np.isfinite(amax) or amax == 0:
        return None
    return range_refusal(amax, wd, f"a {wd.name} factorization needs A's entries", "A", fix)
