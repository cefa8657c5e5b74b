"""Zarr arrays (v2 and v3 read, v3 written) on top of :mod:`blocklin.storage.zarr_store`.

The writer builds the output through :class:`~blocklin.storage.atomic.AtomicOutput` (a partial
folder renamed into place locally; chunks under the final prefix and a commit record on object
stores); each finished block leaves a marker so ``resume=True`` skips it.
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np

import blocklin._readstats as readstats
from blocklin.config import get_config
from blocklin.storage.atomic import AtomicOutput
from blocklin.storage.completeness import check_complete, chunk_census
from blocklin.storage.backend import backend
from blocklin.storage.location import as_location
from blocklin.storage.versions import VERSIONS_KEY
from blocklin.storage.formats.base import Reader, Writer, check_2d, check_matrix_dtype
from blocklin.storage.zarr_store import (create_array, describe_codecs, open_zarr, read_block, stored_dtype,
                                         stored_order, write_block)


class ZarrReader(Reader):
    """A 2-D zarr array (v2 or v3); corrupt chunks and checksum mismatches raise StoreReadError."""

    format = "zarr"

    def __init__(self, path: Any, *, check_chunks: bool = True, **_: Any) -> None:
        super().__init__(str(path))
        self._loc = self.location = as_location(path, name="input")
        self._arr = open_zarr(self._loc, name="input")
        if check_chunks:  # blocklin info reports missing chunk files instead
            check_complete(self._arr, self._loc, "input", bool(get_config().require_complete))
        # a 1-D array (an SVD's S, a PCA's mean) is read as an n x 1 column; ndim tells writers
        self.ndim = len(self._arr.shape)
        self.shape = check_2d(self._arr.shape, "zarr input", vector=True)
        self.dtype = check_matrix_dtype(self._arr.dtype, "zarr input")
        self.chunks = tuple(int(c) for c in (self._arr.shards or self._arr.chunks)) + (1,) * (2 - self.ndim)
        self.chunk_bytes = int(np.prod(self.chunks)) * self.dtype.itemsize
        self.order = "C"  # the order of the blocks it returns; describe() reports the chunks' own

    def read(self, rows: slice, cols: slice) -> np.ndarray:
        r0, r1, _ = rows.indices(self.shape[0])
        c0, c1, _ = cols.indices(self.shape[1])
        out = np.empty((r1 - r0, c1 - c0), self.dtype)
        if self.ndim == 1:
            if c1 > c0:
                out[:, 0] = self._arr[r0:r1]
                self.bytes_read += out.nbytes
            return out
        # StoreReadError names a damaged chunk; what was fetched from storage (encoded chunks, or row ranges)
        self.bytes_read += readstats.measured(read_block, self._arr, slice(r0, r1), slice(c0, c1), out)
        return out

    def describe(self) -> dict[str, Any]:
        d = super().describe()
        prov = self._arr.attrs.get("blocklin")
        d.update(codec=describe_codecs(self._arr), zarr_format=self._arr.metadata.zarr_format,
                 order=stored_order(self._arr), dtype=stored_dtype(self._arr).str,
                 chunks=list(self._arr.chunks), shards=list(self._arr.shards) if self._arr.shards else None,
                 bytes_on_disk=self._loc and backend(self._loc).size(""),
                 checksum=any("crc32c" in type(c).__name__.lower() for c in _codecs(self._arr)),
                 provenance=json.loads(json.dumps(prov)) if prov is not None else None,
                 versions=json.loads(json.dumps(self._arr.attrs.get(VERSIONS_KEY))) if VERSIONS_KEY in self._arr.attrs
                 else None,
                 chunk_files=chunk_census(self._arr, self._loc))
        return d


def _codecs(arr) -> list:
    out = []
    for attr in ("compressors", "filters", "serializer"):
        try:
            v = getattr(arr, attr)
        except Exception:  # pragma: no cover
            continue
        out.extend(v if isinstance(v, (tuple, list)) else [v])
    return out


class ZarrWriter(Writer):
    """A zarr v3 output built atomically, resumable block by block."""

    format = "zarr"
    supports_resume = True

    def __init__(self, path: str, shape: tuple[int, int], dtype: Any, *, chunks: tuple[int, int],
                 codec: str | None = "none", checksum: bool = False, inputs: list[str] = (),
                 overwrite: bool = False, resume: bool = False, token: str | None = None, **_: Any) -> None:
        super().__init__(path, shape, check_matrix_dtype(dtype, "dtype"))
        self.codec = codec or "none"
        self.checksum = bool(checksum)
        self.chunks = tuple(max(1, int(c)) for c in chunks)
        self.unit = self.chunks
        self._out = AtomicOutput(path, inputs=list(inputs), overwrite=overwrite, resume=resume, token=token)
        try:
            self._open()
        except BaseException:  # an interrupt while the array is created: the partial goes too
            self._out.abort()
            raise

    def _open(self) -> None:
        self.partial = self._out.partial
        self.location = self._out.array_path()
        self.done = self._out.done
        self._arr = None
        if self._out.resumed:
            try:
                arr = open_zarr(self._out.array_path(), mode="r+")
                if (tuple(arr.shape) == self.shape and np.dtype(arr.dtype) == self.dtype
                        and tuple(arr.chunks) == self.chunks):
                    self._arr = arr
            except Exception:
                self._arr = None
        self.resumed = self._arr is not None
        if self._arr is None:
            self._out.clear_units()  # markers without their array are void
            try:
                self._arr = create_array(self._out.array_path(), shape=self.shape, dtype=self.dtype,
                                         chunks=self.chunks, codec=self.codec, checksum=self.checksum, overwrite=True)
            except BaseException:
                self._out.abort(refused=True)  # refused up front (no space): nothing of this run is left
                raise
        # Chunks are copied once to be made contiguous and encoded; count both while in flight.
        self.chunk_bytes = int(np.prod(self.chunks)) * self.dtype.itemsize

    def write(self, rows: slice, cols: slice, block: np.ndarray) -> None:
        write_block(self._arr, rows, cols, block)

    def is_done(self, unit: str) -> bool:
        return self._out.is_done(unit)

    def mark_done(self, unit: str) -> None:
        self._out.mark_done(unit)

    def commit(self, *, operation: str = "convert", plan: dict | None = None, params: dict | None = None,
               report: dict | None = None) -> str:
        return self._out.commit(operation, plan=plan, params=params, report=report)

    def abort(self, *, refused: bool = False) -> None:
        self._out.abort(refused=refused)

    @property
    def kept(self) -> str | None:
        """Where an aborted output's partial was kept for a rerun with ``resume=True`` (else None)."""
        return self._out.owner_location.url if self._out.kept else None
