"""Opening stored matrices and writing in-memory ones.

Writes go through :class:`~blocklin.storage.atomic.AtomicOutput` on any backend. With a
``distributed`` client (given as ``scheduler=``, or active), :func:`random` and :func:`from_array`
of a Dask array write their chunks from the workers, one chunk row or one block per task (bounded
memory per worker); NumPy data is written by the process that holds it.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from blocklin.config import resolve
from blocklin.errors import ParameterError, ShapeError, explain
from blocklin.matrix import Matrix
from blocklin.operands import check_dask
from blocklin.validate import chunk_pair, in_memory_array
from blocklin.peaks import block_peaks
from blocklin.sparse import SparseMatrix
from blocklin.storage.sparse import group_metadata, sparse_group_attributes
from blocklin.plan.chunks import auto_chunks
from blocklin.storage.atomic import AtomicOutput
from blocklin.storage.dask_io import store_dask
from blocklin.storage.location import Location, as_location
from blocklin.storage.recorded_peaks import PeakTally, recordable, record as record_peaks
from blocklin.storage.zarr_store import create_array, open_cached, write_block


def open(path: Any, *, storage_options: dict | None = None) -> Any:  # noqa: A001 - the API's name
    """Open a zarr array (v3, or v2 read-only use) as a :class:`Matrix`, or a sparse matrix (a
    ``blocklin-csr`` group, ``docs/sparse.md``) as a :class:`~blocklin.sparse.SparseMatrix`; a stored
    :func:`blocklin.svd` result group (``out=``) as ``svd`` returned it (an ``SVDResult``: ``U`` stored,
    ``s`` and ``Vt`` in memory, the stored report), a stored :func:`blocklin.pca` as ``pca`` returned it
    (a ``PCAResult`` with the options it was fitted with, its factors ``.svd``).

    ``path`` is a local path, a URL (``s3://bucket/A.zarr``, with ``storage_options`` or the
    configured ones), a :class:`~blocklin.storage.Location`, a zarr store or a ``zarr.Array``. An
    output an interrupted job left unfinished is refused with a message on how to resume or remove it.

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
    loc = as_location(path, storage_options) if not type(path).__module__.startswith("zarr") else None
    meta = group_metadata(loc) if loc is not None else None  # one read of zarr.json (a GET on object stores)
    if sparse_group_attributes(meta) is not None:
        return SparseMatrix(path, storage_options=storage_options)
    if meta is not None:
        from blocklin.linalg.update.update import stored_factorization  # the operations sit above storage

        stored = stored_factorization(loc, meta)
        if stored is not None:
            return stored
    return Matrix(path, storage_options=storage_options)


def from_sparse(x: Any, path: Any, *, memory: Any = None, overwrite: bool = False, dtype: Any = None) -> SparseMatrix:
    """Write a SciPy sparse matrix (or array) as a ``blocklin-csr`` group at ``path`` and open it.

    The entries go through the same bounded-memory sort as ``blocklin convert`` (duplicates summed,
    column indices sorted within each row), so the stored row blocks fit ``memory``.

    Parameters
    ----------
    x : scipy.sparse matrix or array
        Any format (``csr``, ``csc``, ``coo``, ...).
    path : path
        A local output folder (``A.zarr``); refused if it exists unless ``overwrite``.
    memory : int or str, optional
        Budget of the conversion (default: the configured one).
    dtype : dtype, optional
        Value dtype (default: ``x``'s).

    Examples
    --------
    >>> import scipy.sparse
    >>> import blocklin as bl
    >>> s = bl.from_sparse(scipy.sparse.random(50, 40, density=0.1, random_state=0), "R.zarr")
    >>> s.shape, s.nnz
    ((50, 40), 200)
    """
    import scipy.sparse

    from blocklin.storage.sparse_convert import ScipySource, write_sparse

    if not scipy.sparse.issparse(x) or len(x.shape) != 2:
        raise ShapeError(explain("x", "must be a 2-D scipy.sparse matrix or array", f"{type(x).__name__} of shape "
                                 f"{getattr(x, 'shape', '?')}", "pass scipy.sparse.csr_matrix(x), or write dense "
                                 "arrays with blocklin.from_array"))
    write_sparse(ScipySource(x), path, memory=memory, dtype=dtype, overwrite=overwrite, operation="from_sparse",
                 params={"from": "scipy"})
    return SparseMatrix(path)


def _client(scheduler: Any) -> Any:
    """The distributed client to write from, or None (local writes)."""
    from blocklin.runtime.scheduler import resolve_scheduler

    sched = resolve_scheduler(resolve(scheduler=scheduler).scheduler)
    return sched.client if sched.kind == "distributed" else None


def _random_rows_task(loc: Location, seed: int, r0: int, r1: int, n: int, dtype: str,
                      rows: bool = False) -> tuple[int, np.ndarray]:
    """Task: draw and write chunk row ``r0:r1`` (deterministic in ``(seed, r0)``); ``r0`` and its peaks
    (each row's where ``rows``, else each column's)."""
    rng = np.random.default_rng([seed, r0])
    block = rng.standard_normal((r1 - r0, n), dtype=np.float64).astype(np.dtype(dtype), copy=False)
    write_block(open_cached(loc, "r+"), slice(r0, r1), slice(0, n), block)
    return r0, block_peaks(block, rows=rows)


def _sources(x: Any) -> list[Any]:
    """The stores ``x`` reads (a stored :class:`Matrix` or zarr array, a Dask array's zarr arrays, a
    memory-mapped file): the output may not be, hold or sit inside them, since an object-store output
    is emptied first, and a store read whole first is an input all the same (never replaced)."""
    found: list[Any] = []
    if isinstance(getattr(x, "filename", None), str):  # numpy.memmap
        found.append(x.filename)
    if isinstance(x, (Matrix, SparseMatrix)):
        found.append(x.location)
    elif type(x).__module__.startswith("zarr"):
        try:
            found.append(as_location(x))
        except TypeError:  # an in-memory store: nothing on disk to protect
            pass
    graph = getattr(x, "__dask_graph__", lambda: None)()
    for layer in getattr(graph, "layers", {}).values():
        if type(layer).__name__ != "MaterializedLayer":  # where dask keeps the original arrays
            continue
        for value in layer.values():
            value = getattr(value, "value", value)  # a DataNode in newer dask
            if type(value).__module__.startswith("zarr"):
                try:
                    found.append(as_location(value))
                except TypeError:  # an in-memory store: nothing on disk to protect
                    pass
    return found


def from_array(x: Any, path: Any, *, chunks: Any = "auto", codec: str | None = None,
               overwrite: bool = False, memory: Any = None, storage_options: dict | None = None,
               scheduler: Any = None) -> Matrix:
    """Write a NumPy or Dask array to a zarr store at ``path`` (atomically) and open it.

    Parameters
    ----------
    x : array_like or dask.array.Array
        A 2-D array (a 1-D one is stored as an ``n x 1`` column). Dask arrays are written chunk by chunk (bounded memory), by the workers when a
        ``distributed`` client is in use.
    path : path, URL, Location or zarr store
        Output; refused if it exists unless ``overwrite``, which replaces only an output blocklin
        wrote (or an empty folder), and refused if it is, holds or sits inside a store a Dask ``x``
        reads.
    storage_options : dict, optional
        fsspec options for a URL output.
    scheduler : str or distributed.Client, optional
        Where Dask arrays are computed and written (default: the active client, else threads).
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
    if isinstance(x, (str, os.PathLike, Location)):  # numpy.asarray would read the name as a 0-d string
        raise ParameterError(explain("x", "must be an array (from_array writes data held in memory)",
                                     f"the path {str(x)!r}", "open a stored array with blocklin.open(path), or "
                                     "copy one with blocklin convert SOURCE OUT.zarr"))
    if type(x).__module__.startswith("scipy.sparse") and hasattr(x, "nnz"):  # numpy.asarray: a 0-d object array
        raise ParameterError(explain("x", "must be a dense array (from_array writes dense arrays)",
                                     f"a {type(x).__name__} {x.shape}", "write it with blocklin.from_sparse(x, PATH) "
                                     "(a stored sparse matrix), or pass x.toarray() where it fits in memory"))
    is_dask = type(x).__module__.startswith("dask")
    inputs = _sources(x)
    if not is_dask:
        x = in_memory_array(x, "x")  # a mask dropped or longdouble cast by numpy.asarray is refused
    else:
        check_dask(x, "x")
    if x.ndim == 1:  # a vector is stored as an n x 1 column, as every operation takes it
        x = x.reshape(-1, 1)
    if x.ndim != 2:
        raise ShapeError(explain("x", "must be 2-D (a matrix)", f"shape {tuple(x.shape)}",
                                 "reshape it, e.g. x.reshape(-1, 1) for a column vector"))
    chunks = auto_chunks(x.shape, x.dtype, cfg.memory) if isinstance(chunks, str) and chunks == "auto" else \
        chunk_pair(chunks)
    with AtomicOutput(path, inputs=inputs, overwrite=overwrite, storage_options=storage_options) as ao:
        arr = create_array(ao.array_path(), shape=x.shape, dtype=x.dtype, chunks=chunks, codec=codec or cfg.codec)
        if is_dask:
            store_dask(x.rechunk(chunks), ao.array_path(), _client(scheduler))
        elif x.size:
            arr[...] = x
        ao.commit("from_array", params={"chunks": list(chunks), "codec": codec or cfg.codec})
    # the peaks of an array in memory, for the first passes over the output (a Dask array's chunks, or
    # a memory-mapped file's pages, would be read a second time: no record)
    if not is_dask and not isinstance(x, np.memmap) and recordable(x.dtype) and x.size:
        tally = PeakTally(x.shape)
        tally.add(x, 0, 0)
        record_peaks(ao.path, tally)
    return Matrix(ao.path)


def random(path: Any, shape: tuple[int, int], *, dtype: Any = "float64", seed: int = 0,
           chunks: Any = "auto", codec: str | None = None, overwrite: bool = False, memory: Any = None,
           progress: Any = None, storage_options: dict | None = None, scheduler: Any = None) -> Matrix:
    """Write a standard-normal random matrix to ``path`` in bounded memory (one chunk row at a time).

    Each chunk row draws from its own generator seeded by ``(seed, first row)``, so the content is
    deterministic for a given seed and chunk height, whatever the column chunking and whichever
    process writes it: with a ``distributed`` client (``scheduler=``, or active) the workers write
    the chunk rows, one task each.

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
    if not (isinstance(shape, (tuple, list)) and len(shape) == 2):
        raise ShapeError(explain("shape", "must be (rows, cols)", repr(shape),
                                 f"pass shape=({shape!r}, 1) for a column" if isinstance(shape, int) else
                                 "pass shape=(1000, 200)"))
    shape = (int(shape[0]), int(shape[1]))
    dt = np.dtype(dtype)
    chunks = auto_chunks(shape, dt, cfg.memory) if isinstance(chunks, str) and chunks == "auto" else chunk_pair(chunks)
    bar = make_progress(progress)
    with AtomicOutput(path, overwrite=overwrite, storage_options=storage_options) as ao:
        arr = create_array(ao.array_path(), shape=shape, dtype=dt, chunks=chunks, codec=codec or cfg.codec)
        steps = range(0, shape[0], chunks[0])
        bar.start(len(steps), "random")
        tally = PeakTally(shape)  # recorded with the output: its first passes need not scan
        client = _client(scheduler)
        if client is not None:
            from distributed import as_completed

            futures = [client.submit(_random_rows_task, ao.array_path(), seed, r0, min(shape[0], r0 + chunks[0]),
                                     shape[1], dt.str, tally.transposed, pure=False) for r0 in steps]
            for fut in as_completed(futures, loop=client.loop):  # the given client, not the default one
                r0, peaks = fut.result()
                tally.merge(peaks, r0, 0)
                bar.advance(1)
            steps = range(0)
        for r0 in steps:
            r1 = min(shape[0], r0 + chunks[0])
            rng = np.random.default_rng([seed, r0])
            block = rng.standard_normal((r1 - r0, shape[1]), dtype=np.float64).astype(dt, copy=False)
            arr[r0:r1, :] = block
            tally.add(block, r0, 0)
            bar.advance(1)
        bar.close()
        ao.commit("random", params={"seed": seed, "dtype": dt.name, "chunks": list(chunks)})
    if recordable(dt) and shape[0] and shape[1]:
        record_peaks(ao.path, tally)
    return Matrix(ao.path)
