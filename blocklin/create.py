"""Opening stored matrices and writing in-memory ones."""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from blocklin.config import resolve
from blocklin.errors import ShapeError, explain
from blocklin.matrix import Matrix
from blocklin.plan.chunks import auto_chunks
from blocklin.storage.atomic import AtomicOutput
from blocklin.storage.zarr_store import create_array


def open(path: str | os.PathLike) -> Matrix:  # noqa: A001 - the natural name in the public API
    """Open a zarr array (v3, or v2 read-only use) as a :class:`Matrix`."""
    return Matrix(path)


def from_array(x: Any, path: str | os.PathLike, *, chunks: Any = "auto", codec: str | None = None,
               overwrite: bool = False, memory: Any = None) -> Matrix:
    """Write a NumPy or Dask array to a zarr store at ``path`` (atomically) and open it.

    Parameters
    ----------
    x : array_like or dask.array.Array
        A 2-D array. Dask arrays are written chunk by chunk (bounded memory).
    path : path
        Output folder; refused if it exists unless ``overwrite``.
    chunks : "auto" or (int, int)
        ``auto`` picks chunks suited to the engine's tiles for the budget.
    codec : str, optional
        ``none`` (default for random floats), ``zstd``, ``blosc-lz4``, ...
    """
    cfg = resolve(memory=memory)
    is_dask = type(x).__module__.startswith("dask")
    if not is_dask:
        x = np.asarray(x)
    if x.ndim != 2:
        raise ShapeError(explain("x", "must be 2-D (a matrix)", f"shape {tuple(x.shape)}",
                                 "reshape it, e.g. x.reshape(-1, 1) for a column vector"))
    if isinstance(chunks, str):
        if chunks != "auto":
            raise ShapeError(explain("chunks", "must be 'auto' or (rows, cols)", repr(chunks), "pass chunks='auto'"))
        chunks = auto_chunks(x.shape, x.dtype, cfg.memory)
    chunks = tuple(int(c) for c in chunks)
    if len(chunks) != 2 or min(chunks) < 1:
        raise ShapeError(explain("chunks", "must be two positive integers", repr(chunks), "pass chunks=(1024, 1024)"))
    with AtomicOutput(path, overwrite=overwrite) as ao:
        arr = create_array(ao.array_path(), shape=x.shape, dtype=x.dtype, chunks=chunks, codec=codec or cfg.codec)
        if is_dask:
            import dask.array as da

            da.store(x.rechunk(chunks), arr, lock=False)
        elif x.size:
            arr[...] = x
        ao.commit("from_array", params={"chunks": list(chunks), "codec": codec or cfg.codec})
    return Matrix(ao.path)
