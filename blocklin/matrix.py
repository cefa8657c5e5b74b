"""The :class:`Matrix` handle: a lazy, zarr-backed 2-D array."""

from __future__ import annotations

from typing import Any

import numpy as np

from blocklin.errors import StoreReadError, explain
from blocklin.storage.backend import backend, remove
from blocklin.storage.location import as_location
from blocklin.storage.readerrors import reading
from blocklin.storage.zarr_store import describe_codecs, open_zarr


#: Reads of a store that keeps being replaced before :meth:`Matrix.__getitem__` gives up.
_READ_ATTEMPTS = 8


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
    (:mod:`blocklin.linalg.interop.numpy_protocol`); every other NumPy function loads it (``np.asarray``).

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

    def _read(self, key: Any) -> np.ndarray:
        """Read ``key`` from one version of the store, never a mix.

        An output replaced by a commit while it is read (``overwrite=True``) would mix old and new
        chunks; the read is repeated until the store's generation is the same before and after it.
        """
        for _ in range(_READ_ATTEMPTS):
            before = self._generation()
            if before != self._opened:
                self._array, self._opened = open_zarr(self.location), before
            data = np.asarray(self._array[key])
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
        arr = self.to_numpy()
        return arr.astype(dtype, copy=False) if dtype is not None else arr

    # -- NumPy's dispatch protocols ----------------------------------------------------------------
    def __array_function__(self, func: Any, types: Any, args: tuple, kwargs: dict) -> Any:
        impl = ARRAY_FUNCTIONS.get(func)
        if impl is None:  # not an out-of-core operation: NumPy's own on the loaded arrays
            return func._implementation(*_loaded(args), **{k: _loaded(v) for k, v in kwargs.items()})
        return impl(*args, **kwargs)

    def __array_ufunc__(self, ufunc: Any, method: str, *inputs: Any, **kwargs: Any) -> Any:
        if ufunc is np.matmul and method == "__call__" and not kwargs and np.matmul in ARRAY_FUNCTIONS:
            return ARRAY_FUNCTIONS[np.matmul](*inputs)
        return getattr(ufunc, method)(*_loaded(inputs), **kwargs)

    def __matmul__(self, other: Any) -> Any:
        return np.matmul(self, other)

    def __rmatmul__(self, other: Any) -> Any:
        return np.matmul(other, self)

    def __getitem__(self, key: Any) -> np.ndarray:
        """Read a region; an output replaced during the read is read again, never mixed."""
        with reading(self._array, slice(None), slice(None), "matrix"):
            return self._read(key)

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
