"""NumPy's dispatch protocols on :class:`~blocklin.Matrix` (NEP 18 ``__array_function__`` and the
``matmul`` ufunc's ``__array_ufunc__``): NumPy-written code runs out of core on stored matrices.

``np.matmul`` (``@``), ``np.dot`` and ``np.linalg``'s ``solve``, ``inv``, ``svd``, ``qr``, ``cholesky``,
``lstsq``, ``norm``, ``cond``, ``det`` and ``slogdet`` called with a ``Matrix`` run the blocklin operation
and return a ``Matrix`` where the result is as large as an operand (products, inverses, factors) and
NumPy values where it is small (norms, determinants, singular values, solutions of a vector right-hand
side). Any other NumPy function loads the matrix through ``__array__`` as before (``np.asarray(M)`` is
the explicit "load it all", refused when it exceeds this machine's memory).

The table is filled here and read by :class:`~blocklin.Matrix` (the storage layer knows no operation):
``blocklin/__init__.py`` imports this module.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from typing import Any

import numpy as np

from blocklin.errors import NotSquareError, ParameterError, explain
from blocklin.matrix import ARRAY_FUNCTIONS, Matrix
from blocklin.validate import dtype_of, linalg_promoted


def _vector_result(x: Any, b: Any) -> Any:
    """``x`` as NumPy returns it for a 1-D right-hand side or operand: a 1-D array (it is vector-sized)."""
    if np.ndim(b) == 1 and isinstance(x, Matrix):
        v = x.to_numpy().reshape(-1)
        if x.temporary:
            x.delete()
        return v
    return x


_NUMPY_RESULTS: dict[str, type] = {}


def _named(kind: str, values: tuple) -> tuple:
    """``values`` as NumPy 2 returns them: its named tuple (``SVDResult`` with ``U``, ``S``, ``Vh``;
    ``QRResult`` with ``Q``, ``R``; ``SlogdetResult`` with ``sign``, ``logabsdet``), so that NumPy code
    reading the fields runs (a plain tuple had raised ``AttributeError``). A subclass with a ``__dict__``
    keeps blocklin's ``report`` where the result has one."""
    if kind not in _NUMPY_RESULTS:
        probe = {"svd": np.linalg.svd, "qr": np.linalg.qr, "slogdet": np.linalg.slogdet}[kind](np.eye(1))
        base = type(probe)
        _NUMPY_RESULTS[kind] = type(base.__name__, (base,), {}) if hasattr(base, "_fields") else tuple
    out = _NUMPY_RESULTS[kind](*values) if _NUMPY_RESULTS[kind] is not tuple else tuple(values)
    report = getattr(values, "report", None)
    if report is not None and hasattr(out, "__dict__"):
        out.report = report
    return out


def _promoted(a: Any, b: Any) -> Any:
    """NumPy's result dtype of ``a @ b`` where the operands' dtypes differ and it is a float or complex one
    (``float64 @ float32`` is float64, ``complex64 @ float64`` complex128), else ``None``: blocklin's
    products refuse to upcast unasked (``dtype=``), which the ``@`` of NumPy code has no way to pass; an
    upcast is exact. Integers of two kinds keep blocklin's rule."""
    da, db = (np.dtype(x.dtype) if hasattr(x, "dtype") else np.asarray(x).dtype for x in (a, b))
    out = np.result_type(da, db)
    return out if da != db and out.kind in "fc" else None


def matmul(a: Any, b: Any) -> Any:
    from blocklin.linalg.products.gemm import matmul as bl_matmul
    from blocklin.validate import in_memory_array

    dtype = _promoted(a, b)
    if np.ndim(a) == 1:  # a row vector times B: (B^T a)^T, vector-sized
        v = _vector_result(bl_matmul(b, in_memory_array(a, "a"), trans_a=True, dtype=dtype), a)
        # two vectors: their inner product, NumPy's scalar (it had been an array of shape (1,))
        return v.reshape(())[()] if np.ndim(b) == 1 else v
    return _vector_result(bl_matmul(a, b, dtype=dtype), b)


def dot(a: Any, b: Any, out: Any = None) -> Any:
    if out is not None:
        raise ParameterError(explain("out", "is not taken by np.dot on a blocklin.Matrix (the result is a new "
                                     "store)", "an array", "drop out= and use the returned Matrix"))
    if np.ndim(a) == 0 or np.ndim(b) == 0:  # a scalar times the matrix: NumPy's own, on the loaded matrix
        # np.dot itself, not np.multiply: a Python float makes np.dot's float32 result float64, multiply's float32
        return _load_then(np.dot, a, b)
    return matmul(a, b)


def _upcast(x: Any, dtype: np.dtype, stack: contextlib.ExitStack, name: str) -> Any:
    """``x`` (the operand ``name``) in ``dtype`` (an exact widening): an array cast, a stored ``Matrix`` copied
    to a temporary store under the temp dir, removed when ``stack`` closes (the input is never touched); the
    copy is checked against the temp dir's free space first, as every temporary store is."""
    if dtype_of(x) == dtype:
        return x
    if not isinstance(x, Matrix):  # a Dask or xarray operand casts lazily, as it is read; a list is loaded
        return x.astype(dtype) if hasattr(x, "astype") else np.asarray(x).astype(dtype)
    from blocklin.config import get_config
    from blocklin.storage.convert import convert

    root = _local_temp_dir(get_config())
    _check_upcast_space(x, dtype, root or tempfile.gettempdir(), name)
    folder = stack.enter_context(tempfile.TemporaryDirectory(prefix="blocklin-upcast-", dir=root))
    out = os.path.join(folder, "operand.zarr")
    convert(x.path, out, dtype=dtype, storage_options=x.location.storage_options or None)
    return Matrix(out)


def _check_upcast_space(x: Matrix, dtype: np.dtype, root: str, name: str) -> None:
    """Refuse, before anything is written, an upcast copy of ``x`` that the free space of the temp dir ``root``
    cannot hold: the message names the temp dir (not the work folder, removed with the error), the copy and
    the fixes, converting the operand once among them."""
    from blocklin.errors import DiskSpaceError
    from blocklin.storage.space import check_space
    from blocklin.storage.zarr_store import array_file_bytes

    m, n = x.shape if len(x.shape) == 2 else (x.shape[0], 1)
    try:
        check_space(os.path.join(root, "blocklin-upcast-operand.zarr"), array_file_bytes(x.shape, x.chunks, dtype),
                    f"{name}'s {np.dtype(dtype).name} copy (NumPy's promotion of {x.dtype.name} {name})",
                    f"{m} x {n} {np.dtype(dtype).name} of {x.path}")
    except DiskSpaceError as exc:
        raise DiskSpaceError(f"{exc}; or convert {name} once and pass the copy (blocklin convert {x.path} "
                             f"OUT.zarr --dtype {np.dtype(dtype).name})") from None


def _local_temp_dir(cfg: Any) -> Any:
    """The configured temp dir where it is a local folder (else the system's)."""
    d = str(cfg.temp_dir) if cfg.temp_dir else None
    return d if d and "://" not in d and os.path.isdir(d) else None


def solve(a: Any, b: Any) -> Any:
    """``numpy.linalg.solve``: a square ``a`` only, as NumPy's (``blocklin.solve`` of a rectangle is a least-squares
    solution, which had come back for NumPy's LinAlgError without a word, ``A x != b`` for an inconsistent ``b``)."""
    from blocklin.linalg.solve.router import solve as bl_solve

    shape = np.shape(a)
    if len(shape) == 2 and shape[0] != shape[1]:
        raise NotSquareError(explain(
            "a", "must be square for numpy.linalg.solve (as NumPy's: a rectangle has no exact solution in general)",
            f"shape {shape[0]} x {shape[1]}", "call numpy.linalg.lstsq(a, b) or blocklin.solve(a, b) for the "
            "least-squares solution"))
    dtype = linalg_promoted(a, b)
    if dtype is None:
        return _vector_result(bl_solve(a, b), b)
    with contextlib.ExitStack() as stack:
        x = bl_solve(_upcast(a, dtype, stack, "a"), _upcast(b, dtype, stack, "b"))
        return _vector_result(x, b)


def inv(a: Any) -> Matrix:
    from blocklin.linalg.inverse.inverse import inv as bl_inv

    return bl_inv(a)


def svd(a: Any, full_matrices: bool = True, compute_uv: bool = True, hermitian: bool = False) -> Any:
    from blocklin.linalg.lowrank.svd import svd as bl_svd

    shape = np.shape(a)  # of 2 dimensions or refused by blocklin.svd naming them
    m, n = shape if len(shape) == 2 else (0, 0)
    if compute_uv and full_matrices and m != n:
        raise ParameterError(explain(
            "full_matrices", "must be False for a non-square blocklin.Matrix (the square factor of the long side "
            "is larger than the matrix and holds nothing it needs)", f"True for a {m} x {n} matrix",
            "pass full_matrices=False (the thin SVD, as numpy.linalg.svd(a, full_matrices=False))"))
    if hermitian:  # NumPy's eigh route assumes it; checked, never assumed nor ignored (interop.hermitian)
        from blocklin.linalg.interop.hermitian import check_hermitian

        check_hermitian(a)
    res = bl_svd(a, return_singular_vectors=bool(compute_uv))
    return _named("svd", res) if compute_uv else res


def qr(a: Any, mode: str = "reduced") -> Any:
    from blocklin.linalg.factor.qr import qr as bl_qr

    if mode not in ("reduced", "r"):
        raise ParameterError(explain("mode", "must be 'reduced' or 'r' for a blocklin.Matrix", repr(mode),
                                     "pass mode='reduced' (Q and R) or mode='r'"))
    res = bl_qr(a, mode=mode)
    return _named("qr", res) if mode == "reduced" else res


def cholesky(a: Any, upper: bool = False) -> Matrix:
    from blocklin.linalg.factor.cholesky import cholesky as bl_cholesky

    return bl_cholesky(a, lower=not upper)


def lstsq(a: Any, b: Any, rcond: Any = None) -> tuple:
    from blocklin.linalg.solve.lstsq import lstsq as bl_lstsq

    dtype = linalg_promoted(a, b)
    if dtype is None:
        return bl_lstsq(a, b, rcond=rcond)
    with contextlib.ExitStack() as stack:  # the SVD of float32 A had been float32's, in a float64 result
        return bl_lstsq(_upcast(a, dtype, stack, "a"), _upcast(b, dtype, stack, "b"), rcond=rcond)


def norm(x: Any, ord: Any = None, axis: Any = None, keepdims: bool = False) -> Any:  # noqa: A002
    from blocklin.linalg.interop.norms import norm as bl_norm

    if axis is not None or keepdims:
        from blocklin.sparse import SparseMatrix

        if isinstance(x, SparseMatrix):
            raise ParameterError(explain("axis", "must be None (the matrix norm, keepdims=False) for a stored sparse "
                                         "matrix", f"axis={axis!r}, keepdims={keepdims!r}",
                                         "call numpy.linalg.norm(S, ord) (S.to_scipy() for norms of its rows or "
                                         "columns)"))
        return _load_then(np.linalg.norm, x, ord=ord, axis=axis, keepdims=keepdims)
    return as_numpy_result(bl_norm(x, ord), x, real=True)


def cond(x: Any, p: Any = None) -> Any:
    from blocklin.linalg.interop.norms import cond as bl_cond

    return as_numpy_result(bl_cond(x, p), x, real=True)


def det(a: Any) -> Any:
    from blocklin.linalg.interop.norms import det as bl_det

    return as_numpy_result(bl_det(a), a)


def slogdet(a: Any) -> tuple:
    from blocklin.linalg.interop.norms import slogdet as bl_slogdet

    sign, logdet = bl_slogdet(a)
    return _named("slogdet", (as_numpy_result(sign, a), as_numpy_result(logdet, a, real=True)))


def linalg_dtype(dtype: Any) -> np.dtype:
    """The dtype ``numpy.linalg`` computes in for an input of ``dtype``: half and single precision (float16,
    float32, complex64) stay as they are (``numpy.linalg.norm`` of float16 data is a ``numpy.float16``; its
    other functions refuse float16, as blocklin's), everything else (float64, integers, booleans) double."""
    dt = np.dtype(dtype)
    if dt.kind == "c":
        return np.dtype(np.complex64 if dt.itemsize <= 8 else np.complex128)
    if dt.kind == "f" and dt.itemsize <= 4:
        return dt
    return np.dtype(np.float64)


def as_numpy_result(value: Any, a: Any, *, real: bool = False) -> Any:
    """``value`` (computed by blocklin in float64 or complex128) as the scalar ``numpy.linalg`` returns for
    an operand of ``a``'s dtype: ``numpy.float32`` for float32 data (``numpy.float16`` for float16),
    ``numpy.complex64`` (or its real part's ``numpy.float32`` where ``real``: norms, conditions, ``logabsdet``)
    for complex64, float64 otherwise.

    A value beyond float32's (float16's) range becomes ``inf`` (below it, ``0`` or a subnormal) in the cast, as in
    NumPy's own result, which overflows there too (and earlier: its sums of squares are float32); the float64
    value stays in ``blocklin.norm``, ``cond``, ``det`` and ``slogdet``."""
    dt = linalg_dtype(getattr(a, "dtype", np.float64))
    if real:
        dt = np.finfo(dt).dtype  # a complex dtype's real part
    with np.errstate(over="ignore", under="ignore"):  # the cast's Inf is NumPy's float32 overflow, said above
        return dt.type(value)


def _load_then(func: Any, *args: Any, **kwargs: Any) -> Any:
    """``func`` on the loaded arrays (what NumPy did before the protocol: ``__array__``)."""
    load = [np.asarray(x) if isinstance(x, Matrix) else x for x in args]
    return func(*load, **kwargs)


ARRAY_FUNCTIONS.update({
    np.dot: dot, np.matmul: matmul,
    np.linalg.solve: solve, np.linalg.inv: inv, np.linalg.svd: svd, np.linalg.qr: qr,
    np.linalg.cholesky: cholesky, np.linalg.lstsq: lstsq, np.linalg.norm: norm, np.linalg.cond: cond,
    np.linalg.det: det, np.linalg.slogdet: slogdet,
})
if hasattr(np.linalg, "matmul"):  # NumPy 2's array-API spelling
    ARRAY_FUNCTIONS[np.linalg.matmul] = matmul
