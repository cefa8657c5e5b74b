"""``numpy.linalg.lstsq`` out of core: the minimum-norm least-squares solution of any rank and shape.

``A = U diag(s) V^T`` by the SVD over the whole space (:func:`blocklin.svd`, ``method="full"``: the QR
of ``A``'s tall orientation and LAPACK's SVD of its ``R``), then ``x = V diag(1/s_i) U^T b`` over the
singular values above ``rcond * s_1``: the truncated-SVD solution LAPACK's ``xGELSS`` returns
(Golub and Van Loan, *Matrix Computations*, 4th ed., 5.5.4), with its rank and singular values.
"""

from __future__ import annotations

import os
import warnings
from typing import Any, Unpack

import numpy as np

from blocklin.config import Settings
from blocklin.errors import BlocklinWarning, ParameterError, ShapeError, explain
from blocklin.linalg.blocks.result_range import ColumnRange, check_columns, scaled_columns
from blocklin.linalg.blocks.scaling import check_result_range, check_scaled_back_range, unscale
from blocklin.linalg.labels import check_rows, is_dataarray
from blocklin.linalg.lowrank.svd import scaled_values, svd
from blocklin.linalg.solve.lstsq_complex import is_complex, lstsq_complex
from blocklin.linalg.solve.rcond import check_rcond, rank_cut
from blocklin.linalg.products.gemm import product
from blocklin.matrix import Matrix
from blocklin.runtime.powers import ldexp, max_exponent
from blocklin.validate import in_memory_array, linalg_promoted
from blocklin.storage import remove


class LstsqResult(tuple):
    """``(x, residuals, rank, s)`` as ``numpy.linalg.lstsq`` returns them, with a ``report`` attribute:
    the SVD's report (passes, bytes read, peak memory) and ``passes_total`` over all steps. ``rank`` is a
    ``numpy.intc`` as NumPy's (its gufunc's ``int`` output; it had been a Python ``int``)."""

    def __new__(cls, x: np.ndarray, residuals: np.ndarray, rank: int, s: np.ndarray, report: dict) -> LstsqResult:
        obj = super().__new__(cls, (x, residuals, np.intc(rank), s))
        obj.report = report
        return obj


def _dense(x: Any) -> np.ndarray:
    return x.to_numpy() if isinstance(x, Matrix) else np.asarray(x)


def _drop(x: Any, *, group: bool = False) -> None:
    """Remove a temporary stored result once read: a product's store, or the SVD's group (``group``)."""
    if isinstance(x, Matrix) and x.temporary:
        remove(x.location.parent) if group else x.delete()


def lstsq(a: Any, b: Any, rcond: float | None = None, **settings: Unpack[Settings]) -> LstsqResult:
    """Least-squares solution of ``A x = b`` of minimum norm, for any rank, tall or wide ``A``.

    Parameters
    ----------
    a : path, zarr array, Matrix, NumPy or Dask array, or xarray DataArray
        ``m x n``, any rank (integers are cast to float64, as NumPy casts them). Complex ``a`` or ``b``
        (complex64, complex128) take the streaming R factor and its SVD in memory instead
        (:mod:`blocklin.linalg.solve.lstsq_complex`: one pass over ``A`` and ``b`` for tall ``A``, two for
        wide ``A``), with LAPACK's conjugate transposes and NumPy's result dtypes. A ``DataArray`` gives
        its data (the result is NumPy's, unlabelled; :func:`blocklin.solve` labels its ``x``).
    b : array_like
        ``m`` or ``m x k`` right-hand sides (held in memory, as ``x`` is). When both ``a`` and ``b``
        are ``DataArray`` objects sharing ``a``'s row dimension, their coordinates there must be equal (rows
        are matched by position: other labels are refused, never reordered).
    rcond : float, optional
        Singular values at most ``rcond * s_1`` count as zero. ``None`` (default): ``eps * max(m, n)``,
        NumPy's default; an ``rcond`` at most 0 (NumPy's old default ``-1``) or at least 1 cuts at
        ``eps / 2 * s_1``, as NumPy's LAPACK ``xGELSD`` does (:mod:`blocklin.linalg.solve.rcond`).
    **settings
        As for every operation (:class:`~blocklin.config.Settings`).

    Returns
    -------
    LstsqResult
        ``x, residuals, rank, s = result`` as ``numpy.linalg.lstsq``: ``x`` (``n`` or ``n x k``),
        ``residuals`` the squared norms ``||b - A x||^2`` per column when ``rank == n < m`` (computed
        from ``b - A x`` by one more pass over ``A``, not from a difference of squares), else empty;
        ``rank`` and ``s`` (every singular value, descending). ``result.report`` has the SVD's report.

    Notes
    -----
    Costs the SVD over the whole space (one pass over ``A``, a stored copy of its tall orientation and
    three passes over it, ``N x N`` factors in memory with ``N = min(m, n)``), one pass over the stored
    long factor for ``U^T b`` (tall ``A``) or ``V y`` (wide ``A``), and for full-rank tall ``A`` one pass
    over ``A`` for the residuals. Backward stable as LAPACK's ``xGELSS``: the solution of a nearby
    problem whose rank decision is that of ``rcond``.

    References
    ----------
    G. H. Golub, C. F. Van Loan, *Matrix Computations*, 4th ed., Johns Hopkins, 2013, 5.5.4.
    T. F. Chan, "An improved algorithm for computing the singular value decomposition", ACM TOMS 8(1), 1982.

    Examples
    --------
    >>> import numpy as np
    >>> import blocklin as bl
    >>> a = np.array([[1.0, 2.0], [2.0, 4.0], [3.0, 6.0]])   # rank one
    >>> x, res, rank, s = bl.lstsq(a, np.array([1.0, 2.0, 3.0]))
    >>> rank, np.allclose(x, np.linalg.lstsq(a, [1.0, 2.0, 3.0])[0])
    (1, True)
    """
    check_rcond(rcond)
    if is_dataarray(a) or is_dataarray(b):  # their data, as NumPy's lstsq takes them: the result is NumPy
        check_rows(a, b)  # rows are matched by position: other labels would solve another problem
        a, b = (v.data if is_dataarray(v) else v for v in (a, b))
    if isinstance(b, (str, os.PathLike)):  # a stored right-hand side, as a accepts one
        from blocklin import open as open_matrix

        b = open_matrix(b, storage_options=settings.get("storage_options"))
    bb = in_memory_array(b, "b")  # a masked or longdouble b refused, not read wrongly
    vector = bb.ndim == 1
    if bb.ndim not in (1, 2):
        raise ShapeError(explain("b", "must be 1-D or 2-D", f"shape {bb.shape}", "pass m or m x k right-hand sides"))
    bb = bb.reshape(-1, 1) if vector else bb
    shape = tuple(getattr(a, "shape", ()))
    if len(shape) == 2 and 0 in shape:  # nothing to factor: NumPy's answer (the SVD refuses k = 0)
        return _empty(shape, bb, vector, np.dtype(getattr(a, "dtype", np.float64)))
    if is_complex(a, bb):  # the SVD over the whole space is real: the R factor's SVD in memory instead
        x, residuals, rank, s, report = lstsq_complex(a, bb, rcond, settings)
        _check_range(x, x.dtype)
        return LstsqResult(x[:, 0] if vector else x, residuals, rank, s, report)
    a = _promoted_in_memory(a, bb)
    # the singular values of 2^-ea A, the data as the SVD scaled it to be read (ea: 0 within the range): the
    # rank and x = 2^-ea V S'^+ U^T b from them, s returned multiplied back. Those multiplied back first had
    # been rounded for subnormal A (s near 2^-1070 to a few bits): x off by 7% at 2^-1062 (a randomized search)
    with scaled_values():
        U, s, Vt = res = svd(a, **settings)
    report = dict(res.report)
    ea = int((report.get("scaling") or {}).get("exponent", 0))
    try:
        check_scaled_back_range("a", s, ea, "singular values")
        with np.errstate(over="ignore", under="ignore"):  # the values returned: in s's dtype (float32's range)
            check_result_range("a", np.ldexp(s.astype(np.float64), ea), s.dtype, "singular values")
        m, n = U.shape[0], Vt.shape[1]
        if bb.shape[0] != m:
            raise ShapeError(explain("b", f"must have m = {m} rows (A is {m} x {n})", f"shape {np.asarray(b).shape}",
                                     f"pass a right-hand side of length {m}"))
        dtype = np.result_type(s.dtype, bb.dtype if bb.dtype.kind == "f" else np.float64)
        if np.finfo(dtype).eps < np.finfo(s.dtype).eps:
            _warn_narrow(s.dtype, bb.dtype, dtype)
        bb = bb.astype(np.float64)
        cut = rank_cut(s, m, n, rcond, s.dtype)
        keep = s > cut
        rank = int(np.count_nonzero(keep))
        # divided by s, never multiplied by 1 / s: 1 / s had overflowed for s below 2^-1024 (a subnormal A,
        # before its s were taken scaled), and inf times U^T b returned x all NaN without an error
        # (until 2026-12-05, found by a randomized search)
        div = np.where(keep, s, 1.0).astype(np.float64)
        passes = report.get("passes_total", report.get("passes", 0))
        # c = U^T (2^-eb b), each column of b brought near 1 (exact): the products of a b near 2^-1060 had been
        # rounded to subnormal numbers (x of a subnormal A and b off by 3e-4)
        eb = np.array([max_exponent(bb[:, j]) for j in range(bb.shape[1])], dtype=np.int64)
        bs = ldexp(bb, -eb[None, :])
        if m >= n:  # U is the stored long factor: c = U^T b in one pass over it
            c = _product(U, bs, s.dtype, trans_a=True, settings=settings)
        else:
            c = _dense(U).astype(np.float64).T @ bs
        # y = S^+ c as 2^e y' (y' near 1, e per column: the quotient c / s leaves the range for s near 2^1000 and
        # b near 1), x = V y' in the range, then 2^e applied once on x: x near 2^-1060 had been formed from
        # subnormal quotients, and an x below the range returned as 0 without a word
        c = np.where(keep[:, None], c, 0.0)
        es, ec = max_exponent(div[keep]), np.array([max_exponent(c[:, j]) for j in range(c.shape[1])], dtype=np.int64)
        with np.errstate(over="ignore"):  # a dropped s's 1.0 may pass the top: its c is 0
            y = ldexp(c, -ec[None, :]) / ldexp(div, -es)[:, None]
        e = ec + eb - es - ea
        if m >= n:
            x = _dense(Vt).astype(np.float64).T @ y
        else:  # V is the stored long factor: x = V (S^+ U^T b) in one pass over it
            x = _product(Vt, y, s.dtype, trans_a=True, settings=settings)
        passes += 1
        # 2^e x once, in float64 (exact but where float64's range ends): the residual's x; its cast is the x
        # returned (a float32 x rounded once from it), judged here
        z, x = x, scaled_columns(x, e, np.float64)[0]
        cols = ColumnRange(z.shape[1])
        with np.errstate(over="ignore", under="ignore"):
            cols.add(z, x.astype(dtype, copy=False))
        check_columns(cols, e, dtype, op="lstsq")
        _check_range(x, dtype)
        residuals = np.empty((0,), dtype=dtype)
        if rank == n and m > n:  # NumPy's rule: residuals only for a full-rank overdetermined system
            r = bb - _product(a, x, s.dtype, trans_a=False, settings=settings)
            with np.errstate(over="ignore"):  # beyond the dtype's range: Inf, as NumPy's lstsq returns it
                residuals = np.sum(r * r, axis=0).astype(dtype)
            passes += 1
    finally:
        _drop(U, group=True)
        _drop(Vt, group=True)
    report.update(operation="lstsq", rank=rank, rcond=cut / float(s[0]) if s.size and s[0] > 0 else cut,
                  passes_total=passes)
    x = x.astype(dtype)
    with np.errstate(under="ignore"):  # s of subnormal A rounded as NumPy's are: the values returned
        s = unscale(s, ea)
    # s in the real dtype of the result, as NumPy returns it (float32 a with a float64 b: float64 s)
    return LstsqResult(x[:, 0] if vector else x, residuals, rank, s.astype(np.finfo(dtype).dtype), report)


def _promoted_in_memory(a: Any, bb: np.ndarray) -> Any:
    """A NumPy ``a`` in NumPy's computing dtype for ``a`` and ``b`` where their precisions differ (float32 with a
    float64 or integer ``b``: float64, :func:`~blocklin.validate.linalg_promoted`), cast in
    memory as ``numpy.linalg.lstsq`` casts it, so the SVD, the rank and ``x`` carry float64's accuracy; a stored
    ``a`` is not copied unasked (:func:`_warn_narrow` says so)."""
    dtype = linalg_promoted(a, bb) if isinstance(a, np.ndarray) else None
    return a if dtype is None else a.astype(dtype)


def _warn_narrow(computed: np.dtype, bdt: np.dtype, dtype: np.dtype) -> None:
    """A result in a wider dtype than the SVD ran in (float32 ``A``, float64 ``b``: NumPy's result dtype) carries
    the narrower one's accuracy; blocklin upcasts no stored input unasked (as :func:`blocklin.solve`, which refuses
    the mix), so it says so rather than return float64 numbers of float32's accuracy without a word."""
    warnings.warn(explain(
        "a", f"is computed in its own dtype ({np.dtype(computed).name}: the SVD, the rank and x carry its accuracy, "
        f"about {np.finfo(computed).eps:.0e} times the condition number), though the result is "
        f"{np.dtype(dtype).name} (NumPy's dtype for b: {np.dtype(bdt).name})",
        f"a: {np.dtype(computed).name}, b: {np.dtype(bdt).name}",
        f"for {np.dtype(dtype).name} accuracy pass a in {np.dtype(dtype).name} (a.astype(np.{np.dtype(dtype).name}); a "
        f"stored a: blocklin convert IN OUT.zarr --dtype {np.dtype(dtype).name}), or call np.linalg.lstsq(M, b), "
        "which upcasts a stored M to a temporary copy; for the narrow dtype's result pass b in it"),
        BlocklinWarning, stacklevel=3)


def _empty(shape: tuple, bb: np.ndarray, vector: bool, adt: np.dtype) -> LstsqResult:
    """``numpy.linalg.lstsq`` of an ``m x 0`` or ``0 x n`` ``A``: ``x = 0``, rank 0, no singular values,
    and for ``m > n = 0`` the residuals ``||b||^2`` (NumPy's rule: full rank ``n`` and ``m > n``)."""
    m, n = shape
    if bb.shape[0] != m:
        raise ShapeError(explain("b", f"must have m = {m} rows (A is {m} x {n})", f"shape {bb.shape[:1]}",
                                 f"pass a right-hand side of length {m}"))
    kinds = [d if d.kind in "fc" else np.dtype(np.float64) for d in (adt, bb.dtype)]
    dtype = np.result_type(*kinds)
    real = np.finfo(dtype).dtype
    x = np.zeros((n, bb.shape[1]), dtype=dtype)
    residuals = (np.abs(bb.astype(dtype)) ** 2).sum(axis=0).astype(real) if m > n else np.empty((0,), real)
    report = {"operation": "lstsq", "rank": 0, "passes_total": 0}
    return LstsqResult(x[:, 0] if vector else x, residuals, 0, np.empty((0,), real), report)


def _check_range(x: np.ndarray, dtype: Any) -> None:
    """An ``x`` beyond the result dtype's range is refused by name (it had reached the residual pass as a
    NaN "in b", or been written as Inf)."""
    with np.errstate(over="ignore", invalid="ignore"):
        bad = not np.isfinite(x.astype(dtype, copy=False)).all()
    if bad:
        raise ParameterError(explain("b", f"must give a solution within the range of {np.dtype(dtype).name}",
                                     "a minimum-norm solution x beyond it (the kept singular values are too "
                                     "small for b's size)", "scale b down (or a up) by a power of two and scale "
                                     "x back yourself, or pass a larger rcond"))


def _product(a: Any, x: np.ndarray, dtype: np.dtype, *, trans_a: bool, settings: dict) -> np.ndarray:
    """``op(A) x`` in the SVD's dtype (integers of ``A`` cast as the SVD cast them) for a small in-memory
    ``x``, returned in memory in float64 (its temporary store removed)."""
    # data near 2^-1030 give a product below the normal numbers, which matmul refuses: the solve states its accuracy
    p = product(a, x.astype(dtype), trans_a=trans_a, dtype=dtype, below_normal_ok=True, **settings)
    try:
        return _dense(p).astype(np.float64)
    finally:
        _drop(p)
