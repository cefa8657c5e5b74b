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
    """Open a zarr array (v3, or v2 read-only use) as a :class:`Matrix`.

    Examples
    --------
    >>> import numpy as np
    >>> import blocklin as bl
    >>> _ = bl.from_array(np.arange(6.0).reshape(2, 3), "M.zarr")
    >>> m = bl.open("M.zarr")
    >>> m.shape, m[:, 1:]
    ((2, 3), array([[1., 2.],
           [4., 5.]]))
    """
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

    Examples
    --------
    >>> import numpy as np
    >>> import blocklin as bl
    >>> m = bl.from_array(np.eye(3), "I.zarr", chunks=(2, 2))
    >>> m
    Matrix(path='I.zarr', shape=(3, 3), dtype=float64, chunks=(2, 2), codec='none')
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


def random(path: str | os.PathLike, shape: tuple[int, int], *, dtype: Any = "float64", seed: int = 0,
           chunks: Any = "auto", codec: str | None = None, overwrite: bool = False, memory: Any = None,
           progress: Any = None) -> Matrix:
    """Write a standard-normal random matrix to ``path`` in bounded memory (one chunk row at a time).

    Each chunk row draws from its own generator seeded by ``(seed, first row)``, so the content is
    deterministic for a given seed and chunk height, whatever the column chunking.

    Examples
    --------
    >>> import blocklin as bl
    >>> a = bl.random("R.zarr", (1000, 300), seed=0, chunks=(256, 300))
    >>> a.shape, a.chunks, a.dtype
    ((1000, 300), (256, 300), dtype('float64'))
    >>> round(float(a.to_numpy().std()), 2)
    1.0
    """
    from blocklin.progress import make_progress

    cfg = resolve(memory=memory)
    shape = (int(shape[0]), int(shape[1]))
    dt = np.dtype(dtype)
    if isinstance(chunks, str):
        chunks = auto_chunks(shape, dt, cfg.memory)
    chunks = (int(chunks[0]), int(chunks[1]))
    bar = make_progress(progress)
    with AtomicOutput(path, overwrite=overwrite) as ao:
        arr = create_array(ao.array_path(), shape=shape, dtype=dt, chunks=chunks, codec=codec or cfg.codec)
        steps = range(0, shape[0], chunks[0])
        bar.start(len(steps), "random")
        for r0 in steps:
            r1 = min(shape[0], r0 + chunks[0])
            rng = np.random.default_rng([seed, r0])
            arr[r0:r1, :] = rng.standard_normal((r1 - r0, shape[1]), dtype=np.float64).astype(dt, copy=False)
            bar.advance(1)
        bar.close()
        ao.commit("random", params={"seed": seed, "dtype": dt.name, "chunks": list(chunks)})
    return Matrix(ao.path)
