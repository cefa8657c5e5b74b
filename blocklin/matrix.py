"""The :class:`Matrix` handle: a lazy, zarr-backed 2-D array."""

from __future__ import annotations

from typing import Any

import numpy as np

from blocklin.errors import MatrixIndexError, ParameterError, StoreReadError, explain
from blocklin.storage.backend import backend, remove
from blocklin.storage.location import as_location
from blocklin.storage.readerrors import reading
from blocklin.storage.zarr_store import describe_codecs, open_zarr
from blocklin.validate import is_int


#: Reads of a store that keeps being replaced before :meth:`Matrix.__getitem__` gives up.
_READ_ATTEMPTS = 8

#: The most bytes :meth:`Matrix.__iter__` holds at once (a strip of rows, read whole chunks deep).
_ITER_BYTES = 64 << 20


def _index_error(key: Any, axis: int | None, rule: str, actual: str, fix: str) -> MatrixIndexError:
    where = "key" if axis is None else f"key (axis {axis})"
    return MatrixIndexError(explain(where, rule, f"{actual} in m[{_show(key)}]", fix))


def _show(key: Any) -> str:
    """``key`` as written between the brackets (arrays by their shape and dtype, long lists cut)."""
    items = key if isinstance(key, tuple) else (key,)
    return ", ".join("..." if k is Ellipsis else _show_slice(k) if isinstance(k, slice)
                     else f"<{k.dtype} array of shape {k.shape}>" if isinstance(k, np.ndarray) and k.ndim
                     else repr(k)[:60] for k in items)


def _show_slice(s: slice) -> str:
    text = ":".join("" if v is None else str(v) for v in (s.start, s.stop))
    return text if s.step is None else f"{text}:{s.step}"


def _selection(key: Any, shape: tuple[int, int]) -> tuple[Any, str, tuple[int, ...]]:
    """``key`` as what zarr reads: ``(selection, how, output axes to reverse)``, ``how`` one of
    ``"basic"``, ``"oindex"`` (an array on one axis) and ``"vindex"`` (a boolean mask of the shape).

    Checked before any read, as NumPy checks it: an out-of-range integer raises an ``IndexError``
    (:class:`MatrixIndexError`) here instead of failing inside zarr, where every exception of a read
    is taken for a damaged chunk (:func:`~blocklin.storage.readerrors.reading`). A negative step is
    read as the forward range it covers, then reversed (the same chunks, each read once). Integer and
    boolean arrays on one axis are read orthogonally (NumPy's result with one advanced index).
    """
    if isinstance(key, np.ndarray) and key.dtype == bool and key.ndim == 2:  # m[mask]: the entries, flat
        if key.shape != tuple(shape):
            raise _index_error(key, None, f"a boolean mask must have the matrix's shape, {tuple(shape)}",
                               f"shape {key.shape}", "pass a mask of the matrix's shape")
        return key, "vindex", ()
    items = key if isinstance(key, tuple) else (key,)
    if sum(k is Ellipsis for k in items) > 1:
        raise _index_error(key, None, "may hold one Ellipsis (...)", f"{sum(k is Ellipsis for k in items)}",
                           "write one ... at most")
    if any(k is Ellipsis for k in items):  # (not "in": == on an array index compares its entries)
        at = next(i for i, k in enumerate(items) if k is Ellipsis)
        items = items[:at] + (slice(None),) * max(0, 2 - (len(items) - 1)) + items[at + 1:]
    if len(items) > 2:
        raise _index_error(key, None, "may index the 2 axes of a Matrix at most", f"{len(items)} indices",
                           "index rows and columns only: m[rows, cols]")
    items = items + (slice(None),) * (2 - len(items))
    out, flips, advanced, kept = [], [], 0, 0
    for axis, (k, n) in enumerate(zip(items, shape)):
        if is_int(k):
            i = int(k)
            if not -n <= i < n:
                raise _index_error(key, axis, f"must be within -{n}..{n - 1} (the axis has {n} entries)",
                                   f"index {i}", f"use an index from -{n} to {n - 1}")
            out.append(i + n if i < 0 else i)
            continue
        if isinstance(k, slice):
            for v, what in ((k.start, "start"), (k.stop, "stop"), (k.step, "step")):
                if v is not None and not is_int(v):
                    raise _index_error(key, axis, f"a slice's {what} must be an integer or None", repr(v),
                                       "use integer slice bounds")
            if k.step == 0:
                raise ParameterError(explain(f"key (axis {axis})", "a slice's step must not be zero (NumPy's rule)",
                                             f"step 0 in m[{_show(key)}]", "use a step of 1 or more, or below 0"))
            start, stop, step = k.indices(n)
            if step < 0:  # the same entries, read forward from the last (lowest) one, then reversed
                count = len(range(start, stop, step))
                low = start + step * (count - 1) if count else 0
                out.append(slice(low, low + (-step) * (count - 1) + 1 if count else 0, -step))
                flips.append(kept)
            else:
                out.append(slice(start, stop, step))
            kept += 1
            continue
        arr = np.asarray(k) if isinstance(k, (list, np.ndarray)) else None
        if isinstance(k, list) and not k:  # NumPy takes [] as no integer index, not as float64
            arr = np.zeros(0, np.int64)
        if arr is None or arr.ndim != 1 or arr.dtype.kind not in "iub":
            raise _index_error(key, axis, "must be an integer, a slice, ..., a 1-D integer or boolean array, or "
                               "one boolean mask of the matrix's shape (numpy.newaxis and other arrays are not "
                               "read from a store)",
                               f"{type(k).__name__} {k!r}"[:120], "read the region with integers and slices, then "
                               "index the NumPy array it returns")
        if arr.dtype.kind == "b":
            if arr.size != n:
                raise _index_error(key, axis, f"a boolean index must have the axis' length, {n}",
                                   f"length {arr.size}", f"pass a mask of {n} entries")
            arr = np.flatnonzero(arr)
        arr = arr.astype(np.int64)
        bad = arr[(arr < -n) | (arr >= n)]
        if bad.size:
            raise _index_error(key, axis, f"must be within -{n}..{n - 1} (the axis has {n} entries)",
                               f"index {int(bad[0])}", f"use indices from -{n} to {n - 1}")
        out.append(np.where(arr < 0, arr + n, arr))
        advanced += 1
        kept += 1
    if advanced > 1:
        raise _index_error(key, None, "may hold an integer or boolean array on one axis only (NumPy pairs two "
                           "arrays entry by entry)", "arrays on both axes", "read m[rows][:, cols], or "
                           "m.zarr.vindex[rows, cols] for pointwise entries")
    return tuple(out), "oindex" if advanced else "basic", tuple(flips)


def _check_fits_memory(shape: tuple[int, ...], dtype: np.dtype, path: str) -> None:
    from blocklin._memory import machine_memory

    need = int(np.prod([int(s) for s in shape], dtype=object)) * np.dtype(dtype).itemsize
    limit = machine_memory()
    if limit is not None and need > limit[0]:
        from blocklin.config import format_size
        from blocklin.errors import BudgetError, explain

        raise BudgetError(explain("matrix", "to_numpy() loads the whole matrix, which must fit this machine's "
                                  f"memory ({format_size(limit[0])})", f"{' x '.join(map(str, shape))} "
                                  f"{np.dtype(dtype).name} ({format_size(need)}) in {path}",
                                  "read slices (m[r0:r1, c0:c1]) or use blocklin's out-of-core operations; "
                                  "check that the shape in the store's metadata is the intended one"), minimum=need)


#: NumPy functions a :class:`Matrix` computes out of core (NEP 18), filled by
#: :mod:`blocklin.linalg.interop.numpy_protocol` (this layer knows no operation); any other function loads it.
ARRAY_FUNCTIONS: dict = {}


#: NumPy functions that write into their first argument: given a stored matrix there, they would write into
#: the copy loaded for them and return, the store keeping its entries without a word.
WRITE_FIRST = (np.copyto, np.fill_diagonal, np.put, np.place, np.putmask, np.put_along_axis)


def refuse_writes(handle: type, name: str, first: Any, out: Any, writes_first: bool) -> None:
    """Refuse a NumPy call that would write into a stored matrix (an instance of ``handle``): one in ``out=``
    (``out``: the keyword's value, a tuple for ufuncs), or ``first`` where the call writes into its first
    argument (``writes_first``: :data:`WRITE_FIRST`, a ufunc's ``at``). The store is read into a new array for
    NumPy, so the writes would be lost (a ufunc's ``out=`` had recursed without end)."""
    outs = out if isinstance(out, tuple) else (out,)
    if any(isinstance(o, handle) for o in outs):
        where, what = "out", f"a blocklin {handle.__name__} as out= of numpy.{name}"
    elif writes_first and isinstance(first, handle):
        where, what = f"numpy.{name}'s first argument", f"a blocklin {handle.__name__}"
    else:
        return
    raise ParameterError(explain(
        where, "must not be a stored matrix (NumPy writes in place, and it would write into a copy read from the "
        "store: the store would keep its entries)", what,
        f"load it (x = np.asarray(M)), call numpy.{name} on x, and store x with blocklin.from_array(x, path)"))


def _loaded(x: Any) -> Any:
    """``x`` with every Matrix in it (one level of lists and tuples too) loaded as NumPy."""
    if isinstance(x, Matrix):
        return np.asarray(x)
    if isinstance(x, (list, tuple)):
        return type(x)(_loaded(v) for v in x)
    return x


class Matrix:
    """A 2-D matrix stored as a zarr array (local folder or object store); nothing is loaded until asked.

    NumPy's ``@``/``np.matmul``, ``np.dot`` and ``np.linalg``'s ``solve``, ``inv``, ``svd``, ``qr``,
    ``cholesky``, ``lstsq``, ``norm``, ``cond``, ``det`` and ``slogdet`` on a Matrix compute out of core
    (:mod:`blocklin.linalg.interop.numpy_protocol`); every other NumPy function loads it (``np.asarray``), and
    ``==`` and ``!=`` compare the loaded entries as NumPy's operators.

    Parameters
    ----------
    path : path, URL, Location, zarr store or zarr array
        Where the array lives (``"A.zarr"``, ``"s3://bucket/A.zarr"``).
    storage_options : dict, optional
        fsspec options for a URL (credentials, endpoint), merged over the configured ones.

    Attributes
    ----------
    path : str
        Folder or URL of the zarr array.
    location : blocklin.storage.Location
        The same, with its storage options (what tasks open).
    report : dict
        For results of an operation: seconds, flops, bytes read/written, peak memory, plan.
    """

    def __init__(self, path: Any, *, report: dict | None = None, temporary: bool = False,
                 storage_options: dict | None = None) -> None:
        self.location = as_location(path, storage_options)
        self.path = self.location.url
        self._opened = self._generation()
        self._array = open_zarr(self.location)
        self.report = report or {}
        self.temporary = temporary

    # -- metadata --------------------------------------------------------------------------------
    @property
    def zarr(self) -> Any:
        """The underlying ``zarr.Array``."""
        return self._array

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self._array.shape)

    @property
    def dtype(self) -> np.dtype:
        return np.dtype(self._array.dtype)

    @property
    def chunks(self) -> tuple[int, int]:
        return tuple(self._array.chunks)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape)) * self.dtype.itemsize

    @property
    def codec(self) -> str:
        return describe_codecs(self._array)

    @property
    def attrs(self) -> dict:
        return dict(self._array.attrs)

    @property
    def provenance(self) -> dict:
        """What blocklin recorded when it wrote this matrix (operation, inputs, plan, version)."""
        return dict(self._array.attrs.get("blocklin", {}))

    # -- data --------------------------------------------------------------------------------------
    def _generation(self) -> Any:
        """What changes when the store is replaced (a new commit writes a new ``zarr.json``)."""
        return backend(self.location).metadata_stamp()

    def _read(self, key: Any, how: str = "basic") -> np.ndarray:
        """Read ``key`` from one version of the store, never a mix (``how``: ``"oindex"`` or ``"vindex"``
        through zarr's indexers of those names, see :func:`_selection`).

        An output replaced by a commit while it is read (``overwrite=True``) would mix old and new
        chunks; the read is repeated until the store's generation is the same before and after it.
        """
        for _ in range(_READ_ATTEMPTS):
            before = self._generation()
            if before != self._opened:
                self._array, self._opened = open_zarr(self.location), before
            data = np.asarray(self._array[key] if how == "basic" else getattr(self._array, how)[key])
            if self._generation() == before:
                return data
        raise StoreReadError(explain("path", "must not be replaced while it is read",
                                     f"{self.path!r} was replaced {_READ_ATTEMPTS} times during one read",
                                     "read it again once the runs writing it have finished"))

    def to_numpy(self) -> np.ndarray:
        """Load the whole matrix into memory (one version of it, see :meth:`__getitem__`; refused when it
        exceeds this machine's memory)."""
        _check_fits_memory(self.shape, self.dtype, self.path)
        with reading(self._array, slice(None), slice(None), "matrix"):
            return self._read(...)

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        """The loaded matrix (:meth:`to_numpy`), always a new array. ``copy=False`` (NumPy 2's "never
        copy", ``np.asarray(M, copy=False)``) is refused with NumPy's ``ValueError``: the entries live in
        the store, and writing into a copy taken for a view would not change them."""
        if copy is False:
            raise ParameterError(explain(
                "copy", "must not be False for a blocklin.Matrix (its entries are read from the store into a "
                "new array; NumPy 2's copy=False promises a view)", "copy=False",
                "pass copy=None (np.asarray(M)) for the loaded array; write into the store with "
                "blocklin.from_array(x, M.path, overwrite=True)"))
        arr = self.to_numpy()
        return arr.astype(dtype, copy=False) if dtype is not None else arr

    # -- NumPy's dispatch protocols ----------------------------------------------------------------
    def __array_function__(self, func: Any, types: Any, args: tuple, kwargs: dict) -> Any:
        refuse_writes(Matrix, func.__name__, args[0] if args else None, kwargs.get("out"), func in WRITE_FIRST)
        impl = ARRAY_FUNCTIONS.get(func)
        if impl is None:  # not an out-of-core operation: NumPy's own on the loaded arrays
            # like=M (np.array(x, like=M), np.ones(3, like=M)): creators have no _implementation; NumPy's own
            # makes the ndarray, as like= an ndarray does (they had raised AttributeError)
            own = getattr(func, "_implementation", func)
            return own(*_loaded(args), **{k: _loaded(v) for k, v in kwargs.items()})
        return impl(*args, **kwargs)

    def __array_ufunc__(self, ufunc: Any, method: str, *inputs: Any, **kwargs: Any) -> Any:
        refuse_writes(Matrix, f"{ufunc.__name__}" + (f".{method}" if method != "__call__" else ""),
                      inputs[0] if inputs else None, kwargs.get("out"), method == "at")
        if ufunc is np.matmul and method == "__call__" and not kwargs and np.matmul in ARRAY_FUNCTIONS:
            return ARRAY_FUNCTIONS[np.matmul](*inputs)
        return getattr(ufunc, method)(*_loaded(inputs), **kwargs)

    # == and != compare the entries, as NumPy's operators (on the loaded matrix, as every NumPy function the
    # protocol does not compute out of core): the default object identity had answered M == 0 with False.
    def __eq__(self, other: Any) -> Any:  # type: ignore[override]
        return np.equal(self, other)

    def __ne__(self, other: Any) -> Any:  # type: ignore[override]
        return np.not_equal(self, other)

    __hash__ = object.__hash__  # a handle stays a dictionary key by identity, as before

    def __bool__(self) -> bool:
        """NumPy's truth value: that of the one entry of a matrix of one entry, refused otherwise (``if M:`` had
        been ``True`` whatever ``M`` held, ``M`` 1 x 1 of a zero included)."""
        if self.nbytes > self.dtype.itemsize:  # more than one entry: nothing is read to refuse it
            raise ParameterError(explain(
                "M", "must hold one entry to have a truth value (NumPy's rule: more are ambiguous)",
                f"a {' x '.join(map(str, self.shape))} matrix", "use np.any(M) or np.all(M)"))
        return bool(self.to_numpy())

    def __matmul__(self, other: Any) -> Any:
        return np.matmul(self, other)

    def __rmatmul__(self, other: Any) -> Any:
        return np.matmul(other, self)

    def __getitem__(self, key: Any) -> np.ndarray:
        """Read a region, as NumPy indexes: integers (negative from the end), slices (a negative step
        reads the forward range, then reverses it), ``...``, a 1-D integer or boolean array on one
        axis, and a boolean mask of the matrix's shape. An index out of range raises :class:`~blocklin.errors.MatrixIndexError` (an
        ``IndexError``) before anything is read; an output replaced during the read is read again,
        never mixed."""
        sel, how, flips = _selection(key, self.shape)
        with reading(self._array, slice(None), slice(None), "matrix"):
            data = self._read(sel, how)
        for axis in flips:
            data = np.flip(data, axis)
        return data

    def __iter__(self) -> Any:
        """The rows, as iterating a NumPy array gives them, read a strip of whole chunks at a time (each
        chunk decoded once, at most :data:`_ITER_BYTES` held; never one read per row)."""
        m, n = self.shape[0], int(np.prod(self.shape[1:]))  # a stored vector's entries are its rows
        fit = max(1, _ITER_BYTES // max(1, n * self.dtype.itemsize))  # rows within the bound
        c = self.chunks[0]
        step = fit // c * c if fit >= c else fit  # whole chunks deep where they fit
        for r0 in range(0, m, step):
            yield from self[r0:min(m, r0 + step)]

    def to_dask(self) -> Any:
        """A ``dask.array`` view with the store's chunks."""
        import dask.array as da

        return da.from_zarr(self._array)

    def delete(self) -> None:
        """Remove the store, wherever it lives (for temporary results)."""
        remove(self.location)

    def __repr__(self) -> str:
        return (f"Matrix(path={self.path!r}, shape={self.shape}, dtype={self.dtype.name}, "
                f"chunks={self.chunks}, codec={self.codec!r})")
