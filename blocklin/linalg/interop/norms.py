"""Matrix norms, condition numbers and determinants of out-of-core matrices, as ``numpy.linalg`` names them.

The entry-wise norms (Frobenius, the largest column and row sums ``1`` and ``inf`` and their minima)
come from one row pass that keeps, per task, LAPACK's scaled sum of squares (``xLASSQ``: ``scale`` and
``ssq`` with ``sum a^2 = scale^2 ssq``, so no square overflows or underflows), the column sums of
``|a|`` and the extremes of the row sums. The spectral norms (``2``, ``-2``, ``nuc``) and the condition
number come from the singular values (:func:`blocklin.svd`), the determinant from the LU factors
(:func:`blocklin.lu`): ``det A = (-1)^swaps prod U_ii``, accumulated as ``slogdet`` so that it neither
overflows nor underflows.
"""

from __future__ import annotations

import math
import warnings
from typing import Any, Unpack

import numpy as np

from blocklin.config import Settings
from blocklin.errors import BlocklinWarning, NotSquareError, ParameterError, SingularMatrixError, explain
from blocklin.plan.passes import PassMemory
from blocklin.runtime.job import Job
from blocklin.runtime.passes import row_kernel, run_pass, source
from blocklin.storage import input_guard

#: ``ord`` values of :func:`norm` for a matrix (NumPy's).
ORDS = (None, "fro", "nuc", 1, -1, 2, -2, np.inf, -np.inf)


def _sums_memory(params: Any, sources: tuple) -> PassMemory:
    w = sources[0].width
    # the column sums (float64) and, per strip row, |a| in float64 and its row sums
    return PassMemory(fixed=2 * w * 8, per_row=(w + 1) * 8, chunk_temporaries=True, write_row_bytes=0)


def _sums_init(device: Any, params: dict) -> dict:
    # "bad": the largest non-finite |a| seen (NaN beats inf, as np.maximum keeps NaN), 0.0 while finite
    return {"scale": 0.0, "ssq": 1.0, "bad": 0.0, "cols": np.zeros(params["n"]), "row_max": 0.0,
            "row_min": math.inf}


@row_kernel(memory=_sums_memory, init=_sums_init, device="cpu")
def sums_kernel(device: Any, arrays: tuple, rows: slice, params: dict, state: dict) -> tuple[dict, None]:
    """Per strip: fold ``|a|`` into the scaled sum of squares, the column sums and the row sums' extremes
    (of complex data the moduli, ``hypot(re, im)``, as ``numpy.linalg.norm`` takes them).

    NaN and Inf (read with ``check_finite=False``) propagate as NumPy's sums do: the column and row sums
    hold them by IEEE arithmetic, the extremes by ``np.maximum``/``np.minimum`` (Python's ``max`` keeps
    its first argument against a NaN), and the sum of squares is set aside as ``bad`` (its scaling,
    ``a / peak``, has no meaning for ``peak`` NaN or Inf)."""
    x = np.asarray(arrays[0])
    a = np.abs(x).astype(np.float64, copy=False) if x.dtype.kind == "c" else np.abs(x.astype(np.float64))
    if a.size:
        peak = float(a.max())  # NaN where a holds one (max propagates it)
        if not math.isfinite(peak):
            # numpy's Frobenius norm of complex data sums re^2 + im^2: a NaN part is NaN even beside an
            # infinite one, whose modulus hypot(inf, nan) is inf
            if x.dtype.kind == "c" and not math.isnan(peak) and np.isnan(x).any():
                peak = math.nan
            state["bad"] = float(np.maximum(state["bad"], peak))
        elif peak > 0:
            state = _lassq(state, a, peak)
        state["cols"] += a.sum(axis=0)
        r = a.sum(axis=1)
        state["row_max"] = float(np.maximum(state["row_max"], r.max()))
        state["row_min"] = float(np.minimum(state["row_min"], r.min()))
    return state, None


def _lassq(state: dict, a: np.ndarray, peak: float) -> dict:
    """``scale^2 ssq += sum a^2`` without forming a square beyond the range (LAPACK's ``xLASSQ`` rule);
    ``peak``: ``max a``, finite and positive."""
    scale, ssq = state["scale"], state["ssq"]
    part = float(np.sum(np.square(a / peak)))
    if peak > scale:
        ssq = part + ssq * (scale / peak) ** 2 if scale > 0 else part
        scale = peak
    else:
        ssq += part * (peak / scale) ** 2
    return state | {"scale": scale, "ssq": ssq}


def _merge(states: list) -> dict:
    total = _sums_init(None, {"n": states[0]["cols"].size})
    for st in states:
        if st["scale"] > 0:
            if st["scale"] > total["scale"]:
                total["ssq"] = st["ssq"] + (total["ssq"] * (total["scale"] / st["scale"]) ** 2
                                            if total["scale"] > 0 else 0.0)
                total["scale"] = st["scale"]
            else:
                total["ssq"] += st["ssq"] * (st["scale"] / total["scale"]) ** 2
        total["cols"] += st["cols"]
        # np.maximum/np.minimum keep a NaN whichever side it is on (Python's max and min do not)
        total["bad"] = float(np.maximum(total["bad"], st["bad"]))
        total["row_max"] = float(np.maximum(total["row_max"], st["row_max"]))
        total["row_min"] = float(np.minimum(total["row_min"], st["row_min"]))
    return total


def entrywise(a: Any, **settings: Unpack[Settings]) -> dict:
    """One pass over ``A``: ``fro`` (scaled, no overflow), the column sums of ``|A|`` and the largest and
    smallest row sums; with the job's ``report``."""
    with Job("norm", **settings) as job:
        A = job.operand(a, "a", integers="cast")
        m, n = A.shape
        states = run_pass(job, sums_kernel, [source(A)], {"n": n}, description="norm: sums over A").states
        total = _merge([st for st in states if st is not None])
        fro = total["scale"] * math.sqrt(total["ssq"]) if total["scale"] > 0 else 0.0
        if total["bad"]:  # NaN or Inf read with check_finite=False: NumPy's sqrt(sum a^2), NaN or inf
            fro = total["bad"]
        return {"fro": fro, "cols": total["cols"], "row_max": total["row_max"],
                "row_min": total["row_min"] if m else 0.0, "shape": (m, n), "report": job.report(operation="norm")}


def norm(a: Any, ord: Any = None, **settings: Unpack[Settings]) -> float:  # noqa: A002 - NumPy's name
    """The matrix norm ``numpy.linalg.norm(a, ord)`` of an out-of-core matrix.

    Parameters
    ----------
    a : path, zarr array, Matrix, NumPy or Dask array
        ``m x n``.
    ord : {None, "fro", "nuc", 1, -1, 2, -2, inf, -inf}
        As NumPy for matrices: ``None``/``"fro"`` Frobenius, ``1``/``-1`` the largest/smallest column sum
        of ``|a|`` (moduli for complex ``a``), ``inf``/``-inf`` the largest/smallest row sum (one pass over ``A``); ``2``/``-2`` the
        largest/smallest singular value, ``"nuc"`` their sum (:func:`blocklin.svd`: the largest by block
        Lanczos to a residual of ``10 sqrt(eps)`` of float64, or ``100 eps`` of single-precision data, whose
        rounded products reach no lower; the others from every singular value, ``N x N`` in memory; of complex
        ``a`` too).
    **settings
        As for every operation.

    Returns
    -------
    float

    Examples
    --------
    >>> import numpy as np
    >>> import blocklin as bl
    >>> a = np.arange(12.0).reshape(4, 3)
    >>> [bool(np.isclose(bl.norm(a, o), np.linalg.norm(a, o))) for o in (None, 1, np.inf, 2, "nuc")]
    [True, True, True, True, True]
    """
    from blocklin.sparse import SparseMatrix, as_sparse_matrix

    ord = _check_ord(ord)
    _check_vector_ord(a, ord, settings.get("storage_options"))
    sparse = as_sparse_matrix(a, settings.get("storage_options"))
    if isinstance(sparse, SparseMatrix):  # one run, checked against the stamp of the matrix's open (here: a path)
        with input_guard.run_reading(sparse.location, sparse.stamp, "the norm result", own_open=sparse is not a):
            return _sparse_norm(sparse, ord, settings)
    if ord in (2, -2, "nuc"):
        return _spectral(a, ord, settings)
    sums = entrywise(a, **settings)
    if 0 in sums["shape"]:
        return _empty_norm(ord, sums["shape"])
    if ord is None or ord == "fro":
        return float(sums["fro"])
    cols = sums["cols"] if sums["cols"].size else np.zeros(1)
    if ord == 1:
        return float(cols.max())
    if ord == -1:
        return float(cols.min())
    return float(sums["row_max"] if ord == np.inf else sums["row_min"])


def _vector_length(a: Any, storage_options: dict | None) -> int | None:
    """The entries of a 1-D ``a`` (an array, or a stored 1-D zarr array named by path); None otherwise."""
    import os

    if isinstance(a, (str, os.PathLike)) or type(a).__name__ == "Location":
        from blocklin.storage.location import as_location
        from blocklin.storage.versions import read_meta

        try:
            meta = read_meta(as_location(a, storage_options))
        except Exception:  # noqa: BLE001 - not a zarr array: the operand's own checks say why
            return None
        shape = (meta or {}).get("shape") if (meta or {}).get("node_type") == "array" else None
    else:
        shape = getattr(a, "shape", None) if getattr(a, "ndim", None) == 1 else None
    return int(shape[0]) if shape is not None and len(shape) == 1 else None


def _check_vector_ord(a: Any, ord: Any, storage_options: dict | None) -> None:
    """A 1-D ``a`` is taken as an ``n x 1`` column, whose matrix norms ``None``, ``1``, ``2``, ``inf``, ``-inf``
    are NumPy's vector norms of it; for ``-1`` and ``-2`` NumPy's vector norm is another number (``norm(x, -1)``
    had returned ``sum |x|`` for NumPy's ``1 / sum(1 / |x|)``), and ``'fro'``, ``'nuc'`` NumPy refuses for a
    vector: refused."""
    if ord not in (-1, -2, "fro", "nuc"):
        return
    n = _vector_length(a, storage_options)
    if n is None:
        return
    raise ParameterError(explain(
        "ord", "must be None, 1, 2, inf or -inf for a 1-D a: blocklin takes a vector as an n x 1 column, whose "
        "matrix norms of those orders are numpy.linalg.norm's vector norms; for -1 and -2 NumPy's vector norm "
        "(sum |x|^ord)^(1/ord) is another number, and 'fro' and 'nuc' it refuses for a vector",
        f"ord={ord!r} of a vector of {n} entries", "numpy.linalg.norm(x, ord) in memory for the vector norm, or "
        "pass x.reshape(-1, 1) for the column's matrix norm"))


def _sparse_norm(s: Any, ord: Any, settings: dict) -> float:
    """``norm`` of a stored sparse matrix (:class:`~blocklin.sparse.SparseMatrix`), as
    ``scipy.sparse.linalg.norm``: the entry-wise norms from one read of its row blocks (one in memory at a
    time: the stored entries' scaled sum of squares, column sums by index, row sums, an empty row's 0
    among them), ``2`` from the largest singular value (:func:`blocklin.svd` with ``k=1``); ``-2`` and
    ``"nuc"`` need every singular value, which a sparse SVD does not give (SciPy refuses them too)."""
    if ord in (-2, "nuc"):
        raise ParameterError(explain(
            "ord", "must be None, 'fro', 1, -1, 2, inf or -inf for a stored sparse matrix (-2 and 'nuc' need every "
            "singular value, which its truncated SVD does not give; scipy.sparse.linalg.norm refuses them too)",
            repr(ord), f"convert it to a dense array first (blocklin convert {s.path} D.zarr --dense), then "
            "blocklin.norm(D, ord)"))
    if 0 in s.shape:
        return _empty_norm(ord, s.shape)
    if ord == 2:
        return _largest(s, s.dtype, settings) if min(s.shape) > 1 else _sparse_norm(s, None, settings)
    m, n = s.shape
    state = _sums_init(None, {"n": n})
    for _, blk in s.iter_row_blocks():
        x = blk.data
        # the absolute values in float64, as sums_kernel takes them: np.abs of int8 -128 is -128, and the column
        # and row sums of a signed integer matrix holding its dtype's minimum had come back negative or short
        a = np.abs(x).astype(np.float64, copy=False) if x.dtype.kind == "c" else np.abs(x.astype(np.float64))
        if a.size:
            peak = float(a.max())
            if not math.isfinite(peak):  # as sums_kernel: NaN and Inf propagate as NumPy's sums do
                if x.dtype.kind == "c" and not math.isnan(peak) and np.isnan(x).any():
                    peak = math.nan
                state["bad"] = float(np.maximum(state["bad"], peak))
            elif peak > 0:
                state = _lassq(state, a, peak)
            state["cols"] += np.bincount(blk.indices, weights=a, minlength=n)
        if blk.shape[0]:
            r = np.add.reduceat(np.append(a, 0.0), blk.indptr[:-1]) if a.size else np.zeros(blk.shape[0])
            r[np.diff(blk.indptr) == 0] = 0.0  # reduceat gives an empty row the next row's first entry
            state["row_max"] = float(np.maximum(state["row_max"], r.max()))
            state["row_min"] = float(np.minimum(state["row_min"], r.min()))
    if ord is None or ord == "fro":
        fro = state["scale"] * math.sqrt(state["ssq"]) if state["scale"] > 0 else 0.0
        return float(state["bad"]) if state["bad"] else fro
    if ord in (1, -1):
        cols = state["cols"] if n else np.zeros(1)
        return float(cols.max() if ord == 1 else cols.min())
    return float(state["row_max"] if ord == np.inf else state["row_min"] if m else 0.0)


def _check_ord(ord: Any) -> Any:
    """``ord`` as one of :data:`ORDS` (numbers compared by value, booleans refused)."""
    if ord is None or (isinstance(ord, str) and ord in ("fro", "nuc")):
        return ord
    if isinstance(ord, (int, float, np.integer, np.floating)) and not isinstance(ord, (bool, np.bool_)) \
            and float(ord) in (1.0, -1.0, 2.0, -2.0, math.inf, -math.inf):
        return float(ord) if math.isinf(float(ord)) else int(ord)
    raise ParameterError(explain("ord", "must be one of None, 'fro', 'nuc', 1, -1, 2, -2, inf, -inf (a matrix norm, "
                                 "as numpy.linalg.norm)", repr(ord), "pass ord=None (Frobenius)"))


def _empty_norm(ord: Any, shape: tuple[int, int]) -> float:
    """``numpy.linalg.norm`` of a matrix with no entries: ``0.0`` (a sum of nothing, and the largest singular
    value, row sum or column sum of none), except the smallest column sum of a matrix with no columns, row sum
    of one with no rows, or singular value of either (``-1``, ``-inf``, ``-2``): a minimum over nothing, which
    NumPy refuses. (``2`` and ``'nuc'`` had been refused as an SVD's ``k=0``, ``-inf`` of rows with no columns
    had returned ``inf`` for NumPy's ``0.0``, and ``-1`` with no columns ``0.0`` where NumPy refuses.)"""
    m, n = shape
    if ord == -2 or (ord == -1 and n == 0) or (ord == -math.inf and m == 0):
        what = {-2: "singular value", -1: "column sum of |a|", -math.inf: "row sum of |a|"}[ord]
        raise ParameterError(explain(
            "ord", f"must name a norm defined for an empty matrix: ord={ord!r} is its smallest {what}, a minimum "
            "over none (numpy.linalg.norm refuses it too)", f"ord={ord!r} of a {m} x {n} matrix",
            "pass ord=None, 1, 2 or inf (0.0 for a matrix with no entries), or a matrix with entries"))
    return 0.0


def _spectral(a: Any, ord: Any, settings: dict) -> float:
    from blocklin.linalg.lowrank.svd import float64_values, svd

    shape, dtype = _shape_dtype(a, settings)
    if 0 in shape:
        return _empty_norm(ord, shape)
    if ord == 2 and min(shape) > 1:
        return _largest(a, dtype, settings)
    # the values in float64, as computed: cast to float32 data's precision they had overflowed to inf
    # (norm(2) of finite float32 data near 1e38) or lost digits below its normal range
    with float64_values():
        s = svd(a, return_singular_vectors=False, **settings)
    return float(s[0] if ord == 2 else s[-1] if ord == -2 else np.sum(s, dtype=np.float64))


def _largest(a: Any, dtype: np.dtype, settings: dict) -> float:
    """The largest singular value alone: block Lanczos, converged to its residual tolerance."""
    from blocklin.linalg.lowrank.svd import float64_values, svd

    # float32 data's products are rounded at its eps: a residual below ~100 of them is out of reach
    # (10 sqrt(eps) of float64 alone warned on every float32 norm after 30 passes, the value right);
    # integer data is multiplied as float64 (np.finfo of a stored sparse int64 matrix had raised a ValueError)
    tol = max(10 * math.sqrt(float(np.finfo(np.float64).eps)),
              100 * float(np.finfo(dtype if np.dtype(dtype).kind in "fc" else np.float64).eps))
    with float64_values():
        return float(svd(a, 1, tol=tol, return_singular_vectors=False, seed=0, **settings)[0])


def _shape_dtype(a: Any, settings: dict) -> tuple[tuple[int, int], np.dtype]:
    with Job("norm", **settings) as job:
        op = job.operand(a, "a", integers="cast")
        return op.shape, np.dtype(op.dtype)


def cond(a: Any, p: Any = None, **settings: Unpack[Settings]) -> float:
    """The condition number ``numpy.linalg.cond(a, p)`` of an out-of-core matrix.

    ``p=None``/``2``: ``s_1 / s_N`` from every singular value (:func:`blocklin.svd`); ``inf`` for a
    matrix singular to working precision, whose ``s_N`` is at the rounding level of ``s_1`` (about ``eps
    sqrt(m) s_1`` and below: :func:`blocklin.svd` reports it as ``0``), where NumPy returns ``inf`` or a
    finite value of rounding-level accuracy (exact only for a graded matrix it happens to resolve);
    ``-2``: its inverse; ``"fro"``, ``1``, ``-1``, ``inf``, ``-inf``:
    ``norm(a, p) * norm(inv(a), p)`` for square ``a`` (:func:`blocklin.inv`); ``inf`` where ``inv``
    meets an exact zero pivot (NumPy's too: its NaN of a failed inversion becomes ``inf``); a matrix
    ``inv`` refuses as numerically singular (a reciprocal condition at most ``n eps``, not 0) stays refused,
    where NumPy returns a finite value of rounding-level accuracy. A graded matrix (rows or columns scaled
    over many binades), which ``inv`` equilibrates, has its condition computed (NumPy's value).
    """
    from blocklin.linalg.inverse.inverse import inv
    from blocklin.linalg.lowrank.svd import float64_values, scaled_values, svd

    if p is None or (p in (2, -2) and not isinstance(p, bool)):
        # as norm's: float32's inf / inf had made the condition NaN; the values of the data as scaled to be
        # read (2^-e A, the same ratios): multiplied back, those of a subnormal A had been rounded (s_N to 0:
        # cond inf for a condition of 5e6)
        with float64_values(), scaled_values():
            s = svd(a, return_singular_vectors=False, **settings)
        with np.errstate(divide="ignore"):
            c = s[0] / s[-1] if s[-1] > 0 else np.inf
        return float(c if p != -2 else (1.0 / c if c else np.inf))
    # inv and two norms are one run: a rewritten between them is refused, not a norm of each version
    with input_guard.run_inputs() as (inputs, outermost):
        shape, _ = _shape_dtype(a, settings)
        if shape[0] != shape[1]:
            raise NotSquareError(explain("a", f"must be square for cond(p={p!r}) (a norm of the inverse)",
                                     f"shape {shape}", "pass p=None (the 2-norm condition of any shape)"))
        try:
            x = inv(a, **settings)
        except SingularMatrixError as err:  # had raised where NumPy returns inf (numpy.linalg.cond of a singular matrix)
            if getattr(err, "exact_zero_pivot", False):
                return math.inf
            raise
        try:
            value = norm(a, p, **settings) * norm(x, p, **settings)
        finally:
            x.delete()
        if outermost:
            inputs.check("the cond result")
        return value


def slogdet(a: Any, **settings: Unpack[Settings]) -> tuple[float | complex, float]:
    """``(sign, logabsdet)`` of a square out-of-core matrix, as ``numpy.linalg.slogdet``: from the LU
    factors with partial pivoting (:func:`blocklin.lu`), ``sign = (-1)^swaps prod sign(U_ii)`` and
    ``logabsdet = sum log |U_ii|`` (``(0, -inf)`` for a singular matrix). Of a complex matrix ``sign``
    is a complex number of modulus 1, ``(-1)^swaps prod U_ii / |U_ii|``, as NumPy's. Factors beyond the dtype's
    range (a float32 ``A`` near ``2^126``, whose elimination's growth overflows) are refused by :func:`blocklin.lu`,
    naming the power of two after which ``A`` factors, where they had given ``(nan, nan)``."""
    from blocklin.linalg.factor.lu import square_lu

    with warnings.catch_warnings():  # a zero pivot is the answer here, (0, -inf), not a warning
        warnings.filterwarnings("ignore", message="lu: an exact zero pivot", category=BlocklinWarning)
        # check_finite=False with NaN or Inf: the determinant of getrf's factors, NumPy's NaN or Inf
        warnings.filterwarnings("ignore", message="lu: A holds", category=BlocklinWarning)
        # blocklin.lu factors any shape; a determinant needs a square matrix (numpy.linalg refuses others too)
        f = square_lu(a, "for a determinant (det, slogdet)", "pass a square matrix; for the volume a rectangular "
                      "matrix scales by, multiply its singular values (blocklin.svd(a, return_singular_vectors=False))",
                      **settings)
    try:
        d = diagonal(f)
        swaps = int(np.count_nonzero(np.asarray(f.report["pivots"]) != np.arange(len(f.report["pivots"]))))
    finally:
        if f.temporary:
            f.delete()
    if not np.all(d != 0):
        return (0j if d.dtype.kind == "c" else 0.0), -math.inf
    mod = np.abs(d)
    if d.dtype.kind == "c":  # the unit phases' product, renormalized against its rounding drift
        phase = complex(np.prod(d / mod))
        return (-1.0) ** swaps * phase / abs(phase), float(np.sum(np.log(mod)))
    sign = (-1.0) ** swaps * float(np.prod(np.sign(d)))
    return sign, float(np.sum(np.log(mod)))


def det(a: Any, **settings: Unpack[Settings]) -> float | complex:
    """``numpy.linalg.det`` of a square out-of-core matrix: ``sign * exp(logabsdet)`` of :func:`slogdet`
    (``inf`` or ``0`` where the determinant leaves float64's range, as NumPy's overflows; complex for a
    complex matrix)."""
    sign, logdet = slogdet(a, **settings)
    with np.errstate(over="ignore", invalid="ignore"):
        value = sign * np.exp(logdet)
    return complex(value) if isinstance(sign, complex) else float(value)


def diagonal(x: Any) -> np.ndarray:
    """The diagonal of a stored square matrix, read one diagonal chunk block at a time."""
    arr = x.zarr
    n = min(arr.shape)
    r, c = arr.chunks
    out = np.empty(n, dtype=np.complex128 if np.dtype(arr.dtype).kind == "c" else np.float64)
    i = 0
    while i < n:
        j = min(n, (i // r + 1) * r, (i // c + 1) * c)
        out[i:j] = np.diagonal(np.asarray(arr[i:j, i:j]))
        i = j
    return out
