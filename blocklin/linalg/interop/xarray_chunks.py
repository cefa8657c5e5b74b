"""xarray's chunk manager for a :class:`~blocklin.Matrix` held in a ``DataArray`` (``xr.DataArray(M, dims=...)``).

xarray takes any duck array with a ``chunks`` attribute for a chunked (lazy) array and asks its registered
chunk managers which one owns it (``xarray.namedarray.pycompat.is_chunked_array``: ``is_duck_array(x) and
hasattr(x, "chunks")``). A ``Matrix`` has ``chunks`` (its zarr chunk shape) and no manager claimed it, so
``.load()``, ``.compute()``, ``.chunk()`` and ``to_netcdf`` raised "Could not find a Chunk Manager which
recognises type Matrix". This manager, registered under the ``xarray.chunkmanagers`` entry point (as
Dask's and cubed's are), owns ``Matrix``: loading reads it whole into NumPy (:meth:`~blocklin.Matrix.to_numpy`,
refused beyond the memory budget), ``.chunk()`` gives the Dask array over its store
(:meth:`~blocklin.Matrix.to_dask`), and xarray's lazy operations on the handle itself are refused by name with
that fix. The ``dask`` chunk manager stays xarray's default.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from xarray.namedarray.parallelcompat import ChunkManagerEntrypoint

from blocklin.errors import ParameterError, explain
from blocklin.matrix import Matrix


def _refuse(what: str) -> ParameterError:
    return ParameterError(explain(
        "data", f"a blocklin.Matrix in an xarray object is read whole or through Dask; xarray's {what} does not "
        "run on the handle itself", f"{what} of a DataArray holding a blocklin.Matrix",
        "wrap its Dask array instead: xr.DataArray(M.to_dask(), dims=...), or call .chunk() first; or load it "
        "(.load(), M.to_numpy())"))


class MatrixChunkManager(ChunkManagerEntrypoint):
    """The ``xarray.chunkmanagers`` entry point ``blocklin``: a ``Matrix`` in a ``DataArray`` (module docstring)."""

    def __init__(self) -> None:
        self.array_cls = Matrix

    def is_chunked_array(self, data: Any) -> bool:
        return isinstance(data, Matrix)

    def chunks(self, data: Any) -> tuple[tuple[int, ...], ...]:
        """The zarr chunk grid in Dask's form (the sizes along each axis, the last one short)."""
        return tuple(tuple(min(c, s - i) for i in range(0, s, c)) if s else (0,)
                     for s, c in zip(data.shape, data.chunks))

    def normalize_chunks(self, chunks: Any, shape: Any = None, limit: Any = None, dtype: Any = None,
                         previous_chunks: Any = None) -> Any:
        from dask.array.core import normalize_chunks

        return normalize_chunks(chunks, shape=shape, limit=limit, dtype=dtype, previous_chunks=previous_chunks)

    def from_array(self, data: Any, chunks: Any, **kwargs: Any) -> Any:
        raise _refuse("chunking into a blocklin.Matrix (chunked_array_type='blocklin')")

    def rechunk(self, data: Any, chunks: Any, **kwargs: Any) -> Any:
        """``.chunk()``: the Dask array over the store, in the chunks asked for (nothing is read yet)."""
        return data.to_dask().rechunk(chunks, **kwargs)

    def compute(self, *data: Any, **kwargs: Any) -> tuple[np.ndarray, ...]:
        """``.load()``, ``.compute()``, ``.values``: each ``Matrix`` read whole into NumPy (refused beyond the
        memory budget, as :meth:`~blocklin.Matrix.to_numpy`)."""
        return tuple(d.to_numpy() if isinstance(d, Matrix) else np.asarray(d) for d in data)

    def persist(self, *data: Any, **kwargs: Any) -> tuple[Any, ...]:
        return self.compute(*data, **kwargs)

    def apply_gufunc(self, *args: Any, **kwargs: Any) -> Any:
        raise _refuse("apply_ufunc(dask='parallelized')")

    def map_blocks(self, *args: Any, **kwargs: Any) -> Any:
        raise _refuse("map_blocks")

    def blockwise(self, *args: Any, **kwargs: Any) -> Any:
        raise _refuse("blockwise")

    def reduction(self, *args: Any, **kwargs: Any) -> Any:
        raise _refuse("reduction")

    def scan(self, *args: Any, **kwargs: Any) -> Any:
        raise _refuse("cumulative operation")

    def store(self, sources: Any, targets: Any, **kwargs: Any) -> Any:
        raise _refuse("store (to_zarr, to_netcdf)")


__all__ = ["MatrixChunkManager"]
