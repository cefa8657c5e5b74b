"""Validation of the arguments every entry point shares, written once (scipy's ``_iv`` pattern).

One validator per kind of argument. Each raises the error of :mod:`blocklin.errors` with a
message built by :func:`~blocklin.errors.explain` (the parameter, the rule, the actual value, a
fix) and returns the normalized value, so an entry point reads as a list of checks:

>>> method = choice("method", "rsvd", ("rsvd", "sketch", "lanczos"), fix="pass method='rsvd'")
>>> tol = positive("tol", 1e-6, fix="pass tol=1e-6", optional=True)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from blocklin.errors import DTypeError, NotSquareError, ParameterError, ShapeError, explain

#: The floating dtypes the factorizations compute in (float16 has too few digits for them).
FLOAT_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))
#: The complex dtypes (GEMM, LU, Cholesky and the solves built on them compute in these too).
COMPLEX_DTYPES = (np.dtype(np.complex64), np.dtype(np.complex128))
#: The dtypes GEMM computes in.
GEMM_DTYPES = FLOAT_DTYPES + COMPLEX_DTYPES


#: What ``precision=`` may ask for (``matmul``, ``solve``, ``inv``; each accepts those that make
#: sense for it). ``None``, ``"default"`` and ``"double"`` (the solver's older name) mean the working
#: dtype: the data's, or ``dtype=``.
PRECISIONS = {
    "default": "the working dtype (the data's, or dtype=)",
    "float64": "compute in float64",
    "float32": "compute in float32",
    "tf32": "float32 with the GEMMs on TF32 tensor cores on a GPU (float32 on a CPU)",
    "mixed": "the O(n^3) work in float32, refined to the float64 backward error",
    "fp16": "a float32 factorization whose GEMM updates take float16 inputs (float32 accumulation), scaled "
            "into float16's range, refined to the float64 backward error by GMRES-IR (square solves, inv)",
    "bf16": "as 'fp16' with bfloat16 GEMM inputs (float32's range, 8-bit significands)",
}


def precision(value: Any, allowed: Sequence[str], *, operation: str, why: str = "", fix: str) -> str:
    """``precision=`` normalized (``None``/``"double"`` to ``"default"``) and one that ``operation`` allows."""
    v = "default" if value is None or (isinstance(value, str) and value.strip().lower() == "double") else value
    v = v.strip().lower() if isinstance(v, str) else v
    if v not in PRECISIONS:
        raise ParameterError(explain("precision", f"must be one of {tuple(PRECISIONS)} (or None)", repr(value), fix))
    if v not in allowed:
        raise ParameterError(explain("precision", f"for {operation} must be one of {tuple(allowed)}"
                                     + (f" ({why})" if why else ""), repr(value), fix))
    return v


#: The fix a refusal of complex data offers, until every operation takes complex.
COMPLEX_FIX = ("split it into real and imaginary parts (for a linear system, the real form [[Re, -Im], [Im, Re]]), "
               "or use an operation that takes complex: blocklin.matmul, gram, qr, lu, cholesky, svd, pca, eigsh "
               "(Hermitian), inv, solve, lstsq, lu_solve, cho_solve, solve_triangular, det, slogdet, norm, cond")


def native(dtype: Any) -> np.dtype:
    """``dtype`` in native byte order (a zarr v2 ``>f8`` is read as ``float64``; comparisons use this)."""
    dt = np.dtype(dtype)
    return dt.newbyteorder("=") if dt.byteorder not in ("=", "|") else dt


def numeric(name: str, dtype: Any) -> None:
    """Refuse arrays that do not hold numbers (object, string, datetime, structured dtypes), and extended
    precision (``numpy.longdouble``, ``clongdouble``): neither zarr nor BLAS holds it, and a silent cast
    to float64 would drop the digits it was chosen for (``numpy.linalg`` refuses it too)."""
    dt = np.dtype(dtype)
    if dt.kind not in "biufc":
        held = {"O": "Python objects", "U": "strings", "S": "bytes", "M": "datetimes", "m": "timedeltas",
                "V": "structured records"}.get(dt.kind, f"kind {dt.kind!r}")
        raise DTypeError(explain(name, "must hold numbers (a float, integer, complex or bool dtype)",
                                 f"dtype {dt} ({held})", "convert it first, for example x.astype(numpy.float64)"))
    if dt.kind in "fc" and np.finfo(dt).bits > 64:
        wide = "complex128" if dt.kind == "c" else "float64"
        raise DTypeError(explain(name, "must not be extended precision (it is computed in float32 or float64 at "
                                 "most, and would lose its extra digits without a word)",
                                 f"dtype {dt.name}", f"convert it knowingly: {name}.astype(numpy.{wide})"))


def refuse_masked(x: Any, name: str) -> None:
    """Refuse a ``numpy.ma.MaskedArray`` with masked entries, as ``scipy.linalg`` refuses masked arrays:
    ``numpy.asarray`` drops the mask, so the values under it would be used (a mask with nothing masked
    is read as its data)."""
    if isinstance(x, np.ma.MaskedArray) and np.ma.count_masked(x):
        raise ParameterError(explain(name, "must not have masked entries (masks are not read: the values under "
                                     "them would be used)", f"a masked array {x.shape} with "
                                     f"{np.ma.count_masked(x)} masked entries",
                                     f"pass {name}.filled(value) with the value they stand for, or {name}.data "
                                     "to use the values under the mask"))


def in_memory_array(x: Any, name: str) -> np.ndarray:
    """``x`` (array_like) as a NumPy array of numbers, refusing what ``numpy.asarray`` would read wrongly.

    A masked array with masked entries is refused, as ``scipy.linalg`` refuses masked arrays:
    ``numpy.asarray`` drops the mask, so the hidden values under it would be computed with (a mask
    with nothing masked is read as its data). Non-numeric and extended-precision dtypes are refused
    (:func:`numeric`).
    """
    refuse_masked(x, name)
    arr = np.asarray(x)
    numeric(name, arr.dtype)
    return arr


def float_operand(op: Any, operation: str | None = None, *, complex_ok: bool = False) -> np.dtype:
    """The dtype of an operand that must be float32 or float64 (float16, integers, complex refused),
    or with ``complex_ok`` also complex64 or complex128 (an operation built and tested for complex data).

    Complex data is refused with its own fix (converting it to a real dtype would drop the imaginary
    parts); ``operation`` names the operation in that message.
    """
    dt = native(op.dtype)
    if dt in COMPLEX_DTYPES and complex_ok:
        return dt
    if dt.kind == "c":
        raise DTypeError(explain(op.name, f"dtype must be float32 or float64 ({operation or 'this operation'} does "
                                 "not take complex data yet)", dt.name, COMPLEX_FIX))
    if dt not in FLOAT_DTYPES:
        raise DTypeError(explain(op.name, "dtype must be float32 or float64", dt.name,
                                 "convert it (blocklin convert --dtype float64)"))
    return dt


def result_dtype(operands: Sequence[Any], dtype: Any, allowed: tuple = GEMM_DTYPES,
                 operation: str | None = None) -> np.dtype:
    """The compute dtype: the operands' common dtype, or ``dtype`` when given (no silent upcast).

    A real ``dtype`` for complex operands is refused (the cast would drop the imaginary parts), and
    so is complex data where ``allowed`` has no complex dtype (``operation`` names it then).
    """
    takes_complex = any(d.kind == "c" for d in allowed)
    dts = {native(op.dtype) for op in operands}
    if dtype is not None:
        dt = native(dtype)
        if dt.kind == "c" and not takes_complex:
            raise DTypeError(explain("dtype", f"must be one of {[d.name for d in allowed]} "
                                     f"({operation or 'this operation'} does not take complex data yet)", dt.name,
                                     COMPLEX_FIX))
        if dt not in allowed:
            raise DTypeError(explain("dtype", f"must be one of {[d.name for d in allowed]}", dt.name,
                                     "pass dtype='float64' or dtype='float32'"))
        cplx = [op for op in operands if native(op.dtype).kind == "c"]
        if cplx and dt.kind != "c":
            raise DTypeError(explain("dtype", "a complex operand cannot be cast to a real dtype (the cast would drop "
                                     "its imaginary parts)", f"dtype={dt.name} for {cplx[0].name}: "
                                     f"{native(cplx[0].dtype).name}",
                                     "pass a complex dtype or none" if takes_complex else COMPLEX_FIX))
        return dt
    if len(dts) > 1:
        listing = ", ".join(f"{op.name}: {native(op.dtype).name}" for op in operands)
        # NumPy's promotion names the dtype that loses nothing (complex where any operand is: a real
        # dtype would be refused, the imaginary parts dropped)
        common = np.result_type(*dts)
        common = common if common in allowed else np.dtype(np.complex128 if common.kind == "c" else np.float64)
        raise DTypeError(explain("dtype", "operands must share one dtype (blocklin never upcasts silently)", listing,
                                 f"pass dtype='{common.name}' to cast while streaming, or convert the inputs "
                                 f"(blocklin convert --dtype {common.name})"))
    dt = dts.pop()
    if dt.kind == "c" and not takes_complex:
        raise DTypeError(explain(operands[0].name, f"dtype must be one of {[d.name for d in allowed]} "
                                 f"({operation or 'this operation'} does not take complex data yet)", dt.name,
                                 COMPLEX_FIX))
    if dt not in allowed:
        raise DTypeError(explain(operands[0].name, f"dtype must be one of {[d.name for d in allowed]}", dt.name,
                                 "convert it (blocklin convert --dtype float64) or pass dtype='float64'"))
    return dt


def linalg_promoted(a: Any, b: Any) -> Any:
    """NumPy's computing dtype of ``numpy.linalg.solve`` or ``lstsq`` on ``a`` and ``b`` where their float or
    complex dtypes differ in precision (``float32`` with ``float64``: float64; ``float32`` with
    ``complex128``: complex128), else ``None`` (blocklin's own solve takes one dtype, or a real and a
    complex one of one precision). NumPy casts both operands up and solves in that dtype; so must a
    ``Matrix`` met through NumPy's API, whose code has no ``dtype=`` to pass."""
    # integers count as the float64 NumPy casts them to (blocklin casts them alike): float32 with integers is
    # float64 in NumPy, which had been computed in float32 and returned as float64
    da, db = (np.dtype(np.float64) if d.kind in "iub" else d for d in (dtype_of(a), dtype_of(b)))
    if da.kind not in "fc" or db.kind not in "fc":
        return None
    out = np.result_type(da, db)
    same_precision = np.finfo(da).dtype == np.finfo(db).dtype
    return None if same_precision else out


def dtype_of(x: Any) -> np.dtype:
    """``x``'s dtype, or NumPy's for a list or scalar."""
    return np.dtype(x.dtype) if hasattr(x, "dtype") else np.asarray(x).dtype


def same_dtype(*operands: Any, complex_promotion: bool = False) -> np.dtype:
    """Operands that share one dtype (a solve casts nothing silently, as GEMM does not).

    With ``complex_promotion`` a real and a complex operand of one precision (float64 and complex128,
    float32 and complex64) give the complex dtype, NumPy's promotion (the real one is read as complex;
    nothing gains precision); any other mix is refused.
    """
    dts = {native(op.dtype) for op in operands}
    if complex_promotion and len(dts) == 2 and len({d.kind for d in dts}) == 2:
        promoted = np.result_type(*dts)
        if all(np.finfo(d).dtype == np.finfo(promoted).dtype for d in dts):
            return promoted
    if len(dts) > 1:
        listing = ", ".join(f"{op.name}: {native(op.dtype).name}" for op in operands)
        widest = np.result_type(*dts).name  # float64 with complex64: complex128, which loses nothing
        raise DTypeError(explain("dtype", "operands must share one dtype (blocklin never upcasts silently)", listing,
                                 f"convert the narrower one: blocklin convert IN OUT.zarr --dtype {widest}"))
    return dts.pop()


def finite(name: str, value: Any, *, fix: str) -> float:
    """A finite real number (NaN and +-Inf refused: they would turn every element of a result into NaN)."""
    if isinstance(value, (complex, np.complexfloating)):  # it had been called "not a finite number"
        raise ParameterError(explain(name, "must be a real number (a complex one is not taken, a zero imaginary "
                                     "part included)", repr(value), f"{fix}, and multiply an operand by a complex "
                                     f"factor first (e.g. bl.matmul(a, 1j * b))"))
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)) \
            or not np.isfinite(value):
        raise ParameterError(explain(name, "must be a finite number", repr(value), fix))
    return float(value)


def square(op: Any, why: str, fix: str) -> int:
    """The side of an operand that must be square (a :class:`~blocklin.errors.NotSquareError` otherwise, also
    NumPy's ``LinAlgError``, as ``numpy.linalg`` refuses a rectangle)."""
    m, n = op.shape
    if m != n:
        raise NotSquareError(explain(op.name, f"must be square {why}", f"{m} x {n}", fix))
    return m


def not_empty(op: Any, what: str, fix: str) -> None:
    """An operand with at least one row and one column (a plan divides by both)."""
    m, n = op.shape
    if not (m and n):
        raise ShapeError(explain(op.name, f"must have at least one row and one column {what}", f"{m} x {n}", fix))


def same_rows(a: Any, b: Any) -> None:
    """``b`` has one row per row of ``a`` (blocklin never broadcasts)."""
    if b.shape[0] != a.shape[0]:
        raise ShapeError(explain(b.name, f"must have as many rows as {a.name} (no broadcasting)",
                                 f"{a.name} {a.shape[0]} x {a.shape[1]}, {b.name} {b.shape[0]} x {b.shape[1]}",
                                 f"pass {b.name} with one row per row of {a.name}"))


def choice(name: str, value: Any, options: Sequence[Any], *, fix: str) -> Any:
    """``value`` is one of ``options`` (of the same type: ``True`` is not ``1``); a ``str`` subclass such as
    NumPy's ``str_`` (an element of an array of names) matches its ``str`` option and is returned as it."""
    for o in options:
        if value is o or (type(value) is type(o) and value == o):
            return value
        if type(o) is str and isinstance(value, str) and str(value) == o:
            return o
    raise ParameterError(explain(name, f"must be one of {tuple(options)}", repr(value), fix))


def flag(name: str, value: Any, *, fix: str | None = None) -> bool:
    """A yes/no option: ``True`` or ``False`` (NumPy's booleans too), never a truthy string or number."""
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    raise ParameterError(explain(name, "must be True or False", repr(value), fix or f"pass {name}=True or {name}=False"))


def is_int(value: Any) -> bool:
    """Whether ``value`` is a Python or NumPy integer (``bool`` and ``numpy.bool_`` are not)."""
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


#: The largest size or count any option takes: what an int64 holds (sizes index int64 arrays).
MAX_COUNT = 2**63 - 1
#: Most refinement steps a ``refine=`` asks for (Newton-Schulz for ``inv``, the normal equations'
#: passes for ``solve``): they converge quickly once they converge at all, so a few dozen reach
#: any precision, while a huge count would run for hours.
MAX_REFINE = 100


def chunk_pair(value: Any, name: str = "chunks") -> tuple[int, int]:
    """``value`` as the ``(rows, cols)`` sides of a store's chunks: two positive integers (not bools, not
    2.5, which ``int()`` would have cut to 2). An int alone (NumPy's and zarr's every-axis spelling) had
    raised "'int' object is not iterable"; it is refused by name, as a string other than ``"auto"``."""
    try:
        parts = tuple(value) if not isinstance(value, str) else ()
    except TypeError:
        parts = ()
    if len(parts) != 2 or not all(is_int(p) for p in parts) or min(parts) < 1 or max(parts) > MAX_COUNT:
        fix = f"pass chunks=({value}, {value}) for square chunks" if is_int(value) and value >= 1 else \
            "pass chunks='auto', or two positive integers such as chunks=(1024, 1024)"
        raise ShapeError(explain(name, "must be 'auto' or (rows, cols), two positive integers", repr(value), fix))
    return int(parts[0]), int(parts[1])


def count(name: str, value: Any, *, fix: str, minimum: int = 0, auto: tuple[Any, ...] = (),
          maximum: int | None = None, why: str = "") -> Any:
    """An integer ``>= minimum`` and ``<= maximum`` (at most :data:`MAX_COUNT`), or one of the
    ``auto`` words (``None`` among them for an optional count), returned as given.

    Floats are refused even when whole (``5.0``), bools too: a size is an integer. ``why`` says
    where ``maximum`` comes from (``"the matrix has 300 rows"``).
    """
    if any(value is a or (isinstance(a, str) and value == a) for a in auto):
        return value
    top = MAX_COUNT if maximum is None else min(int(maximum), MAX_COUNT)
    words = "".join(f"{a!r} or " for a in auto)
    if not is_int(value) or value < minimum:
        raise ParameterError(explain(name, f"must be {words}an integer >= {minimum}", repr(value), fix))
    if value > top:
        raise ParameterError(explain(name, f"must be {words}an integer <= {top}" + (f" ({why})" if why else ""),
                                     repr(value), fix))
    return int(value)


def size(name: str, value: Any, *, fix: str, maximum: int | None = None, why: str = "",
         optional: bool = True) -> int | None:
    """A positive integer size or count (a tile side, a number of workers, passes, chunks), ``None``
    allowed when ``optional``: :func:`count` with ``minimum=1``."""
    return count(name, value, fix=fix, minimum=1, auto=(None,) if optional else (), maximum=maximum, why=why)


def positive(name: str, value: Any, *, fix: str, optional: bool = False) -> float | None:
    """A finite number ``> 0`` (``None`` allowed when ``optional``)."""
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)) \
            or not np.isfinite(value) or not value > 0:
        raise ParameterError(explain(name, "must be a positive number", repr(value), fix))
    return float(value)


def check_k(k: Any, m: int, n: int, *, whole: bool = False, eig: bool = False) -> int:
    """``k`` wanted pairs of an ``m x n`` matrix: an integer with ``1 <= k < min(m, n)`` (``<=`` with
    ``whole``: the operation also computes every pair); ``eig``: eigenpairs of a square matrix (the
    refusal speaks of its order n and its eigenvalues, not of singular values)."""
    top = min(m, n) if whole else min(m, n) - 1
    if not is_int(k):  # the example fits the matrix (k=10 had been proposed for a 10 x 10 eigsh, which refuses it)
        raise ParameterError(explain("k", "must be an integer", repr(k), f"pass k={max(1, min(10, top))}"))
    if not 1 <= k <= top:
        size = f"n = {n}" if eig else f"min(m, n) = {min(m, n)}"
        rule = f"1 <= k <= {size}" if whole else f"1 <= k < {size}"
        if top < 1 and eig:  # an eigensolver of a 0 x 0 or 1 x 1 matrix: nothing to truncate
            fix = (f"a {n} x {n} matrix has {n} eigenvalue(s) and no truncated decomposition: compute it in memory "
                   "(numpy.linalg.eigh)")
        elif top < 1:  # no k fits: "pass 1 <= k <= 0" had been the fix
            fix = (f"a {m} x {n} matrix has {min(m, n)} singular value(s) and no truncated decomposition: compute it "
                   "in memory (numpy.linalg.svd, or numpy.linalg.norm of the vector for its one singular value)")
        else:
            full = "scipy.linalg.eigh" if eig else "numpy.linalg.svd of a dense copy"  # svd's had named eigh
            fix = f"pass 1 <= k <= {top}" + ("" if whole else f" (use {full} for a full decomposition)")
        raise ParameterError(explain("k", f"must satisfy {rule}", f"k={k} for a {m} x {n} matrix", fix))
    return int(k)


def seed_arg(seed: Any) -> int | None:
    """``seed`` as an integer or ``None``: a NumPy ``Generator``, ``RandomState`` or ``SeedSequence``
    (scikit-learn's ``random_state``, SciPy's ``rng``) gives one integer drawn from it, so the same
    generator state gives the same results (the integer is recorded in the report)."""
    if isinstance(seed, np.random.Generator):
        return int(seed.integers(0, 2**63 - 1))
    if isinstance(seed, np.random.RandomState):
        return int(seed.randint(0, 2**63 - 1, dtype=np.int64))
    if isinstance(seed, np.random.SeedSequence):
        return int(seed.generate_state(1, dtype=np.uint64)[0] % (2**63))
    if seed is None or (is_int(seed) and seed >= 0):
        return None if seed is None else int(seed)
    raise ParameterError(explain("seed", "must be a non-negative integer, None, or a NumPy Generator, RandomState or "
                                 "SeedSequence", repr(seed), "pass seed=0"))


def start_vector(v0: Any, n: int) -> np.ndarray | None:
    """A starting vector: ``None``, or ``n`` finite float64 values, not all zero; a masked array with masked
    entries is refused (:func:`refuse_masked`: the values under its mask would start the iteration)."""
    if v0 is None:
        return None
    refuse_masked(v0, "v0")
    v = np.asarray(v0)
    if v.dtype.kind not in "biuf" or v.ndim != 1 or v.size != n or not np.all(np.isfinite(v)) or not np.any(v):
        raise ParameterError(explain("v0", f"must be a finite, nonzero real vector of length min(m, n) = {n}",
                                     f"dtype {v.dtype}, shape {v.shape}", "pass v0=None (a random start) or such a "
                                     "vector"))
    return v.astype(np.float64)


def resolve_seed(seed: Any) -> int:
    """A non-negative integer seed (:func:`seed_arg`); ``None`` draws one (to be recorded in the report)."""
    seed = seed_arg(seed)
    if seed is None:
        return int(np.random.SeedSequence().entropy % (2**63))
    return seed
