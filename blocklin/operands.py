"""Accepting operands: paths, zarr arrays, Matrix handles, NumPy and Dask arrays.

Tasks pass store locations (:class:`~blocklin.storage.location.Location`: a path or URL with its
storage options), so in-memory operands are staged to a temporary zarr store under the configured
temp dir, local or a URL (removed when the operation ends, on failure and Ctrl-C too). Stored
operands, local or remote, are read in place and never modified.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import uuid
from typing import Any

import numpy as np

from blocklin.config import Config
from blocklin.errors import ParameterError, ShapeError, explain
from blocklin.matrix import Matrix
from blocklin.plan.chunks import auto_chunks
from blocklin.storage.completeness import check_complete
from blocklin.storage.ownership import end_work_folder, start_work_folder
from blocklin.storage.dask_io import store_dask
from blocklin.storage.location import Location, as_location
from blocklin.storage.zarr_store import create_array, open_zarr, store_path
from blocklin.validate import in_memory_array, native, numeric



@dataclasses.dataclass(frozen=True)
class Operand:
    """A stored operand: its location and metadata."""

    name: str
    path: Location
    shape: tuple[int, ...]
    dtype: np.dtype
    chunks: tuple[int, ...]
    staged: bool = False
    #: The stored row of this operand's row 0: rows ``first_row:first_row + shape[0]`` of the
    #: array at ``path`` (:func:`row_range`).
    first_row: int = 0
    #: The stored array a staged copy was made from (integers cast to float64, a 1-D vector as a
    #: column), None for in-memory data: what names the operand in a resume token, whose content a
    #: resumed run checks and which no output may replace (:func:`stored_input`).
    source: Location | None = None


def stored_input(op: Operand) -> Location | None:
    """The stored array ``op`` reads: its own location, or the one its staged copy was made from; None
    for in-memory data. What an output must not replace and whose content a resumed run checks."""
    return op.source if op.staged else op.path


def stored_location(x: Any, cfg: Config) -> Location | None:
    """Where the stored array ``x`` names lives (a path, URL, Location, :class:`~blocklin.matrix.Matrix`,
    zarr array or store, or an xarray DataArray of one), found without reading it: what a run stamps
    before its first read (:mod:`blocklin.storage.input_guard`). None for in-memory data, or where
    :func:`as_operand` would refuse ``x`` (it says why)."""
    if any(c.__module__.startswith("xarray") for c in type(x).__mro__[:-1]) and hasattr(x, "dims") \
            and hasattr(x, "data"):
        x = x.data
    try:
        if isinstance(x, Matrix):
            return x.location
        if isinstance(x, (str, os.PathLike, Location)):
            return as_location(x, cfg.storage_options, name="input")
        if type(x).__module__.startswith("zarr") and hasattr(x, "chunks") and hasattr(x, "shape"):
            path = store_path(x)
            return None if path is None else as_location(path, cfg.storage_options, name="input")
        if type(x).__module__.startswith("zarr"):
            return as_location(x, cfg.storage_options, name="input")
    except (ValueError, TypeError, OSError):
        return None
    return None


def staged_at(op: Operand, memory: int) -> Operand:
    """``op`` as a run with budget ``memory`` would read it: a staged copy is chunked from the budget
    (:func:`~blocklin.plan.chunks.auto_chunks`, as :func:`as_operand` and :func:`cast_integers` stage
    it), a stored array is read as it is. What a search for the least budget plans with, so that the
    budget it names plans again once a rerun stages the copy at that budget."""
    if not op.staged:
        return op
    return dataclasses.replace(op, chunks=tuple(auto_chunks(tuple(op.shape), op.dtype, int(memory))))


def row_range(op: Operand, start: int, stop: int) -> Operand:
    """Rows ``start:stop`` of a stored operand, as an operand (passes read those rows only)."""
    return dataclasses.replace(op, shape=(int(stop) - int(start),) + tuple(op.shape[1:]),
                               first_row=op.first_row + int(start))


def _is_dask(x: Any) -> bool:
    return type(x).__module__.startswith("dask") and hasattr(x, "dask") and hasattr(x, "chunks")


def temp_root(cfg: Config) -> Location:
    """The configured temp dir as a location (a local folder or a URL)."""
    return as_location(cfg.temp_dir, cfg.storage_options, name="temp_dir")


def temp_store_reads(cfg: Config) -> str:
    """How a store a call writes under the temp dir will be read back, as
    :func:`~blocklin.storage.zarr_store.read_kind` will find it once written (a call plans the
    products over its work stores before it writes them)."""
    if (cfg.codec or "none").lower() != "none":
        return "chunks"
    return "direct" if temp_root(cfg).is_local else "ranges"


def decoded_chunks(op: Operand) -> tuple[int, int, int] | None:
    """``(rows, cols, itemsize)`` of the chunks a read of ``op`` decodes whole (read kind ``"chunks"``:
    compressed, or on an object store with a codec), whose temporaries a tile plan counts
    (:func:`blocklin.plan.chunks.chunk_io`); None where reads take only the bytes they keep (local
    chunk files read directly, byte ranges)."""
    from blocklin.storage.zarr_store import read_kind

    if len(op.chunks) != 2 or read_kind(op.path) != "chunks":
        return None
    return int(op.chunks[0]), int(op.chunks[1]), int(np.dtype(op.dtype).itemsize)


def _stage_dir(cfg: Config, stack: contextlib.ExitStack) -> Location:
    d = temp_root(cfg) / f"blocklin-stage-{uuid.uuid4().hex[:12]}"
    stack.callback(end_work_folder, d)  # registered first: an interrupt cannot slip between
    start_work_folder(d, operation="stage")
    return d


def as_operand(x: Any, name: str, cfg: Config, stack: contextlib.ExitStack, *, ndim: int = 2,
               client: Any = None) -> Operand:
    """Resolve ``x`` to a stored operand, staging in-memory arrays under ``cfg.temp_dir``.

    Dask arrays are staged by ``client``'s workers when given (the job's cluster).

    Raises
    ------
    ParameterError
        For unsupported kinds of input.
    ShapeError
        When ``x`` is not ``ndim``-dimensional.
    StoreNotFoundError, StoreReadError
        For paths that do not hold a readable zarr array.
    """
    staged = False
    if any(c.__module__.startswith("xarray") for c in type(x).__mro__[:-1]) and hasattr(x, "dims") \
            and hasattr(x, "data"):
        x = x.data  # a DataArray (or a labelled solve's subclass): its NumPy or Dask data
    if isinstance(x, Matrix):
        path, arr = x.location, x.zarr
    elif isinstance(x, (str, os.PathLike, Location)):
        path = as_location(x, cfg.storage_options, name=name)
        arr = open_zarr(path, name=name)
    elif type(x).__module__.startswith("zarr") and hasattr(x, "chunks") and hasattr(x, "shape"):
        path = store_path(x)
        arr = x
        if path is None:  # an in-process store (zarr MemoryStore): stage a copy tasks can open
            path, arr, staged = _stage_numpy(np.asarray(x[...]), name, cfg, stack)
        else:
            path = as_location(path, cfg.storage_options, name=name)
    elif type(x).__module__.startswith("zarr"):  # a store object: open the array at its root
        path = as_location(x, cfg.storage_options, name=name)
        arr = open_zarr(path, name=name)
    elif _is_dask(x):
        x = check_dask(x, name)
        if x.ndim == 1 and ndim == 2:  # a vector is a column
            x = x.reshape(-1, 1)
        _check_ndim(name, x.shape, ndim)
        d = _stage_dir(cfg, stack) / f"{name}.zarr"
        chunks = auto_chunks(x.shape, x.dtype, cfg.memory)
        arr = create_array(d, shape=x.shape, dtype=x.dtype, chunks=chunks, codec="none")
        # Written by the workers on a cluster, into the job's temp dir, which they were checked to
        # reach, and removed with it (on failure and Ctrl-C too).
        store_dask(x.rechunk(chunks), d, client)
        path, staged = d, True
    elif _is_sparse_handle(x):  # its __array__ (np.asarray(S)) is for users; a dense route never densifies it
        raise _unsupported(x, name)
    elif isinstance(x, np.ndarray) or hasattr(x, "__array__") or isinstance(x, (list, tuple)):
        path, arr, staged = _stage_numpy(in_memory_array(x, name), name, cfg, stack)
    else:
        raise _unsupported(x, name)
    source = path if not staged and isinstance(path, Location) else None
    if arr.ndim == 1 and ndim == 2:  # a stored vector: staged as an n x 1 column (tasks read 2-D blocks)
        path, arr, staged = _stage_column(arr, name, cfg, stack)
    _check_ndim(name, arr.shape, ndim)
    if not staged and isinstance(path, Location):
        check_complete(arr, path, name, bool(cfg.require_complete))
    # a big-endian store (zarr v2 ``>f8``) is read as native: its dtype is compared and computed as such
    return Operand(name=name, path=path, shape=tuple(arr.shape), dtype=native(arr.dtype),
                   chunks=tuple(arr.chunks), staged=staged, source=source if staged else None)


#: What takes a sparse matrix: the routes of docs/sparse.md, on a stored blocklin-csr group.
SPARSE_ROUTES = "svd, pca, eigsh, solve (LSQR), gram, norm and matmul with one dense operand"


def _is_sparse_handle(x: Any) -> bool:
    return type(x).__name__ == "SparseMatrix" and type(x).__module__ == "blocklin.sparse"


def _unsupported(x: Any, name: str) -> ParameterError:
    """The refusal of an input this operation cannot read as a dense operand; for a sparse matrix it names
    the operations that take one (the generic fix, a NumPy array or a zarr path, had sent a stored sparse
    matrix's user to a path that was refused too)."""
    what = "must be a path, zarr array, blocklin.Matrix, NumPy or Dask array"
    if _is_sparse_handle(x):
        return ParameterError(explain(
            name, f"{what}: this operation reads dense blocks, and a stored sparse matrix is taken by {SPARSE_ROUTES} "
            "only", f"a SparseMatrix ({x.shape[0]} x {x.shape[1]}, {x.nnz} entries)", "use one of those, or write "
            "it densely (blocklin convert SOURCE OUT.zarr --dense, or blocklin.from_array(s.to_numpy(), PATH) where "
            "it fits in memory)"))
    if type(x).__module__.startswith("scipy.sparse") and hasattr(x, "nnz"):
        return ParameterError(explain(
            name, f"{what}: in-memory SciPy sparse matrices are not read", f"a {type(x).__name__} "
            f"{getattr(x, 'shape', '?')}", f"write it with blocklin.from_sparse(x, 'S.zarr') for {SPARSE_ROUTES}, "
            "or pass x.toarray() where it fits in memory"))
    return ParameterError(explain(name, what, f"{type(x).__name__}", "pass a NumPy array or the path of a zarr array"))


def as_columns(b: Any) -> Any:
    """A 1-D NumPy right-hand side as one column (stored and 2-D operands as they are)."""
    return b.reshape(-1, 1) if isinstance(b, np.ndarray) and b.ndim == 1 else b


def _check_ndim(name: str, shape: tuple[int, ...], ndim: int) -> None:
    if len(shape) != ndim:
        raise ShapeError(explain(name, f"must be {ndim}-D (a matrix)", f"shape {tuple(shape)}",
                                 "reshape it, e.g. x.reshape(-1, 1) for a column vector"))


def _stage_column(arr: Any, name: str, cfg: Config, stack: contextlib.ExitStack) -> tuple[Location, Any, bool]:
    """A 2-D ``n x 1`` copy of a stored 1-D array, copied in slices of at most a sixteenth of the budget."""
    n = int(arr.shape[0])
    d = _stage_dir(cfg, stack) / f"{name}.zarr"
    chunks = auto_chunks((n, 1), arr.dtype, cfg.memory)
    out = create_array(d, shape=(n, 1), dtype=arr.dtype, chunks=chunks, codec="none")
    step = max(chunks[0], (cfg.memory // 16 // max(1, arr.dtype.itemsize)) // chunks[0] * chunks[0])
    for r0 in range(0, n, step):
        out[r0:r0 + step, 0] = arr[r0:r0 + step]
    return d, out, True


def cast_integers(op: Operand, cfg: Config, stack: contextlib.ExitStack) -> Operand:
    """``op`` as float64 when it holds integers or booleans (as ``numpy.linalg`` and ``scipy.linalg``
    cast them), else ``op`` itself: a staged float64 copy, written in row blocks of at most a sixteenth
    of the budget, removed with the job. Integers beyond ``2^53`` round as NumPy's cast rounds them."""
    if np.dtype(op.dtype).kind not in "biu":
        return op
    src = open_zarr(op.path, name=op.name)
    m, n = op.shape
    d = _stage_dir(cfg, stack) / f"{op.name}-float64.zarr"
    chunks = auto_chunks(op.shape, np.float64, cfg.memory)
    out = create_array(d, shape=op.shape, dtype=np.float64, chunks=chunks, codec="none")
    step = max(chunks[0], (cfg.memory // 16 // max(1, 8 * n)) // chunks[0] * chunks[0])
    for r0 in range(0, m, step):
        out[r0:r0 + step] = np.asarray(src[r0:r0 + step]).astype(np.float64)
    return Operand(name=op.name, path=d, shape=op.shape, dtype=np.dtype(np.float64), chunks=tuple(chunks),
                   staged=True, source=stored_input(op))


def check_dask(x: Any, name: str) -> Any:
    """A Dask array ready to be written to zarr: numbers (:func:`~blocklin.validate.numeric`), unmasked,
    and with known chunk sizes, computed once where a boolean mask left them unknown (NaN). A Dask array of
    masked chunks is refused: its masks would be dropped as it is written (whether any entry is
    masked is known only once it is computed)."""
    numeric(name, x.dtype)
    if isinstance(getattr(x, "_meta", None), np.ma.MaskedArray):
        raise ParameterError(explain(name, "must not be a masked Dask array (masks are not read: the values under "
                                     "them would be used)", "a Dask array of numpy.ma chunks",
                                     f"pass dask.array.ma.filled({name}, value) with the value masked entries "
                                     "stand for"))
    if any(c != c for dim in x.chunks for c in dim):
        # zarr needs every chunk's size before anything is written: Dask's own answer computes the
        # array once to learn them (it is computed again as it is written)
        x = x.compute_chunk_sizes()
    return x


def _stage_numpy(x: np.ndarray, name: str, cfg: Config, stack: contextlib.ExitStack) -> tuple[Location, Any, bool]:
    numeric(name, x.dtype)
    if x.ndim == 1:  # a vector is a column
        x = x.reshape(-1, 1)
    if x.ndim != 2:
        _check_ndim(name, x.shape, 2)
    x = x.astype(native(x.dtype), copy=False)  # staged in native byte order
    d = _stage_dir(cfg, stack) / f"{name}.zarr"
    arr = create_array(d, shape=x.shape, dtype=x.dtype, chunks=auto_chunks(x.shape, x.dtype, cfg.memory),
                       codec="none")
    if x.size:
        arr[...] = x
    return d, arr, True
