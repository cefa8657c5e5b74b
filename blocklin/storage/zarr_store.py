"""Opening, creating, reading and writing zarr arrays (v3 written, v2 and v3 read)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import zarr
import zarr.codecs
from zarr.core.buffer.cpu import NDBuffer

from blocklin.errors import ConfigError, StoreNotFoundError, StoreReadError, explain
from blocklin.storage.rawchunks import raw_access


def codec_chain(codec: str | None, checksum: bool = False) -> tuple[Any, ...]:
    """Zarr v3 bytes-to-bytes codecs for a codec name.

    ``"none"`` (the engine default: random floats do not compress), ``"zstd"``, ``"blosc-lz4"``,
    ``"blosc-zstd"``, ``"gzip"``; ``checksum=True`` appends a crc32c codec so that corrupted
    chunks fail loudly on read.
    """
    name = (codec or "none").lower()
    table = {
        "none": (),
        "zstd": (zarr.codecs.ZstdCodec(level=3),),
        "blosc-lz4": (zarr.codecs.BloscCodec(cname="lz4", clevel=5, shuffle="shuffle"),),
        "blosc-zstd": (zarr.codecs.BloscCodec(cname="zstd", clevel=3, shuffle="shuffle"),),
        "gzip": (zarr.codecs.GzipCodec(level=5),),
    }
    if name not in table:
        raise ConfigError(explain("codec", f"must be one of {sorted(table)}", repr(codec), "pass codec='none' or 'zstd'"))
    chain = table[name]
    if checksum:
        chain = chain + (zarr.codecs.Crc32cCodec(),)
    return chain


def describe_codecs(arr: zarr.Array) -> str:
    """A short human name for an array's compression (``"none"``, ``"zstd"``, ...)."""
    try:
        comps = list(arr.compressors)
    except Exception:  # pragma: no cover - exotic metadata
        return "unknown"
    names = []
    for c in comps:
        cls = type(c).__name__.replace("Codec", "").lower()
        if cls == "blosc":
            cname = getattr(c, "cname", None)
            cls = f"blosc-{getattr(cname, 'value', cname)}"
        names.append(cls)
    return "+".join(names) if names else "none"


def open_zarr(path: str | os.PathLike, *, name: str = "path", mode: str = "r") -> zarr.Array:
    """Open a zarr array (v2 or v3) with errors that name the path and a fix."""
    p = Path(path)
    if not p.exists():
        raise StoreNotFoundError(explain(name, "must name an existing zarr array", f"{str(p)!r}, which does not exist",
                                         "check the path, or create it with blocklin.from_array / blocklin convert"))
    if not ((p / "zarr.json").exists() or (p / ".zarray").exists()):
        hint = "it is a zarr group; name one of its arrays (PATH/NAME)" if (
            (p / ".zgroup").exists() or p.is_dir() and any(p.glob("*/zarr.json"))) else \
            "convert it first: blocklin convert FILE OUT.zarr"
        raise StoreReadError(explain(name, "must be a zarr array (a folder with zarr.json or .zarray)",
                                     f"{str(p)!r}", hint))
    try:
        arr = zarr.open_array(str(p), mode=mode)
    except Exception as exc:
        raise StoreReadError(explain(name, "must be a readable zarr array", f"{str(p)!r} ({exc})",
                                     "check the store's metadata, or re-create it")) from exc
    return arr


def store_path(arr: Any) -> str | None:
    """Filesystem path of a zarr array on a local store, else None."""
    store = getattr(arr, "store", None)
    root = getattr(store, "root", None)
    if root is None:
        return None
    sub = getattr(arr, "path", "") or ""
    return str(Path(root) / sub) if sub else str(Path(root))


def create_array(path: str | os.PathLike, *, shape: tuple[int, ...], dtype: Any, chunks: tuple[int, ...],
                 codec: str | None = "none", checksum: bool = False, attributes: dict | None = None,
                 overwrite: bool = False) -> zarr.Array:
    """Create a zarr v3 array at ``path`` (a local folder)."""
    chunks = tuple(max(1, int(c)) for c in chunks)
    return zarr.create_array(
        store=str(path), shape=tuple(int(s) for s in shape), chunks=chunks, dtype=np.dtype(dtype),
        compressors=codec_chain(codec, checksum) or None, fill_value=0, zarr_format=3,
        attributes=attributes or {}, overwrite=overwrite,
    )


def _norm(sel: slice, n: int) -> slice:
    start, stop, step = sel.indices(n)
    return slice(start, max(start, stop)) if step == 1 else sel


def read_block(arr: zarr.Array, rows: slice, cols: slice, out: np.ndarray | None = None) -> np.ndarray:
    """Read ``arr[rows, cols]``, into the preallocated ``out`` when given (no extra copy).

    Uncompressed local zarr v3 arrays are read straight from their chunk files
    (:mod:`blocklin.storage.rawchunks`); everything else goes through zarr.
    """
    raw = raw_access(arr)
    if raw is not None:
        rows, cols = _norm(rows, arr.shape[0]), _norm(cols, arr.shape[1])
        if rows.step in (None, 1) and cols.step in (None, 1):
            shape = (rows.stop - rows.start, cols.stop - cols.start)
            if out is None:
                out = np.empty(shape, dtype=arr.dtype)
            if out.flags.c_contiguous and out.shape == shape and out.dtype == arr.dtype:
                return raw.read(rows, cols, out)
    if out is None:
        return np.asarray(arr[rows, cols])
    if out.flags.c_contiguous:
        arr.get_basic_selection((rows, cols), out=NDBuffer.from_numpy_array(out))
    else:
        out[...] = arr[rows, cols]
    return out


def write_block(arr: zarr.Array, rows: slice, cols: slice, block: np.ndarray) -> None:
    """Write ``block`` to ``arr[rows, cols]`` (callers align the block to whole chunks).

    Whole chunks of uncompressed local zarr v3 arrays are written straight to their chunk files.
    """
    raw = raw_access(arr)
    if raw is not None:
        rows, cols = _norm(rows, arr.shape[0]), _norm(cols, arr.shape[1])
        if raw.aligned(rows, cols) and block.shape == (rows.stop - rows.start, cols.stop - cols.start):
            raw.write(rows, cols, np.asarray(block, dtype=arr.dtype))
            return
    arr[rows, cols] = block


def create_group(path: str | os.PathLike, *, attributes: dict | None = None) -> Any:
    """Create a zarr v3 group at ``path`` (a local folder that may already exist)."""
    return zarr.open_group(str(path), mode="a", zarr_format=3, attributes=attributes or {})


def write_array(path: str | os.PathLike, data: np.ndarray, *, chunks: tuple[int, ...] | None = None,
                codec: str | None = "none") -> zarr.Array:
    """Create a zarr v3 array at ``path`` holding the (small, in-memory) ``data``."""
    data = np.asarray(data)
    arr = create_array(path, shape=data.shape, dtype=data.dtype, chunks=chunks or tuple(max(1, s) for s in data.shape),
                       codec=codec)
    if data.size:
        arr[...] = data
    return arr
