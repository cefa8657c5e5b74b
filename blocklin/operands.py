"""Accepting operands: paths, zarr arrays, Matrix handles, NumPy and Dask arrays.

Tasks pass paths, so in-memory operands are staged to a temporary zarr store under the configured
temp dir (removed when the operation ends). Stored operands are read in place and never modified.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import uuid
from pathlib import Path
from typing import Any

import numpy as np

from blocklin.config import Config
from blocklin.errors import ParameterError, ShapeError, explain
from blocklin.matrix import Matrix
from blocklin.plan.chunks import auto_chunks
from blocklin.storage.zarr_store import create_array, open_zarr, store_path



@dataclasses.dataclass(frozen=True)
class Operand:
    """A stored operand: its path and metadata."""

    name: str
    path: str
    shape: tuple[int, ...]
    dtype: np.dtype
    chunks: tuple[int, ...]
    staged: bool = False


def _is_dask(x: Any) -> bool:
    return type(x).__module__.startswith("dask") and hasattr(x, "dask") and hasattr(x, "chunks")


def _stage_dir(cfg: Config, stack: contextlib.ExitStack) -> Path:
    d = Path(cfg.temp_dir) / f"blocklin-stage-{uuid.uuid4().hex[:12]}"
    d.mkdir(parents=True, exist_ok=False)
    stack.callback(shutil.rmtree, d, True)
    return d


def as_operand(x: Any, name: str, cfg: Config, stack: contextlib.ExitStack, *, ndim: int = 2) -> Operand:
    """Resolve ``x`` to a stored operand, staging in-memory arrays under ``cfg.temp_dir``.

    Raises
    ------
    TypeError
        For unsupported kinds of input.
    ShapeError
        When ``x`` is not ``ndim``-dimensional.
    StoreNotFoundError, StoreReadError
        For paths that do not hold a readable zarr array.
    """
    staged = False
    if isinstance(x, Matrix):
        path, arr = x.path, x.zarr
    elif isinstance(x, (str, os.PathLike)):
        path = str(x)
        arr = open_zarr(path, name=name)
    elif type(x).__module__.startswith("zarr") and hasattr(x, "chunks") and hasattr(x, "shape"):
        path = store_path(x)
        arr = x
        if path is None or not os.path.isdir(path):  # memory or remote store: stage a local copy
            path, arr, staged = _stage_numpy(np.asarray(x[...]), name, cfg, stack)
    elif _is_dask(x):
        _check_ndim(name, x.shape, ndim)
        d = _stage_dir(cfg, stack) / f"{name}.zarr"
        import dask.array as da

        chunks = auto_chunks(x.shape, x.dtype, cfg.memory) if x.ndim == 2 else "auto"
        da.to_zarr(x.rechunk(chunks), str(d), zarr_format=3, compressors=None)
        path, arr, staged = str(d), open_zarr(d, name=name), True
    elif isinstance(x, np.ndarray) or hasattr(x, "__array__") and not isinstance(x, (list, tuple)):
        path, arr, staged = _stage_numpy(np.asarray(x), name, cfg, stack)
    elif isinstance(x, (list, tuple)):
        path, arr, staged = _stage_numpy(np.asarray(x), name, cfg, stack)
    else:
        raise ParameterError(explain(name, "must be a path, zarr array, blocklin.Matrix, NumPy or Dask array",
                                f"{type(x).__name__}", "pass a NumPy array or the path of a zarr array"))
    _check_ndim(name, arr.shape, ndim)
    return Operand(name=name, path=path, shape=tuple(arr.shape), dtype=np.dtype(arr.dtype),
                   chunks=tuple(arr.chunks), staged=staged)


def _check_ndim(name: str, shape: tuple[int, ...], ndim: int) -> None:
    if len(shape) != ndim:
        raise ShapeError(explain(name, f"must be {ndim}-D (a matrix)", f"shape {tuple(shape)}",
                                 "reshape it, e.g. x.reshape(-1, 1) for a column vector"))


def _stage_numpy(x: np.ndarray, name: str, cfg: Config, stack: contextlib.ExitStack) -> tuple[str, Any, bool]:
    if x.ndim != 2:
        _check_ndim(name, x.shape, 2)
    d = _stage_dir(cfg, stack) / f"{name}.zarr"
    arr = create_array(d, shape=x.shape, dtype=x.dtype, chunks=auto_chunks(x.shape, x.dtype, cfg.memory),
                       codec="none")
    if x.size:
        arr[...] = x
    return str(d), arr, True
