"""The direct chunk-file path agrees with zarr for reads and writes, and steps aside when ineligible."""

from __future__ import annotations

import numpy as np
import pytest
import zarr

from blocklin.storage.rawchunks import raw_access
from blocklin.storage.zarr_store import create_array, read_block, write_block


@pytest.mark.parametrize("dtype", ["float64", "float32", "int32", "complex128", "uint8"])
def test_reads_match_zarr(tmp_path, dtype):
    rng = np.random.default_rng(0)
    x = (rng.standard_normal((53, 41)) * 100).astype(dtype)
    arr = create_array(tmp_path / "x.zarr", shape=x.shape, dtype=dtype, chunks=(16, 12))
    arr[...] = x
    arr[16:32, 12:24] = 0  # zarr skips writing an all-fill chunk: the file is missing
    x[16:32, 12:24] = 0
    assert raw_access(arr) is not None
    for rows, cols in [(slice(0, 53), slice(0, 41)), (slice(5, 50), slice(3, 40)), (slice(16, 32), slice(12, 24)),
                       (slice(48, 53), slice(36, 41)), (slice(0, 16), slice(0, 41)), (slice(7, 8), slice(0, 1)),
                       (slice(10, 10), slice(0, 5))]:
        out = np.full((rows.stop - rows.start, cols.stop - cols.start), 7, dtype=dtype)
        np.testing.assert_array_equal(read_block(arr, rows, cols, out=out), x[rows, cols])
        np.testing.assert_array_equal(read_block(arr, rows, cols), x[rows, cols])


def test_whole_chunk_writes_match_zarr(tmp_path):
    rng = np.random.default_rng(1)
    x = rng.standard_normal((50, 30))
    arr = create_array(tmp_path / "x.zarr", shape=x.shape, dtype="float64", chunks=(16, 16))
    write_block(arr, slice(0, 32), slice(0, 30), x[0:32])       # includes edge chunks on the right
    write_block(arr, slice(32, 50), slice(0, 16), x[32:50, :16])  # bottom edge
    write_block(arr, slice(32, 50), slice(16, 30), x[32:50, 16:])
    reopened = zarr.open_array(str(tmp_path / "x.zarr"), mode="r")
    np.testing.assert_array_equal(reopened[...], x)
    write_block(arr, slice(3, 9), slice(2, 5), np.ones((6, 3)))  # unaligned: zarr does the read-modify-write
    x[3:9, 2:5] = 1
    np.testing.assert_array_equal(zarr.open_array(str(tmp_path / "x.zarr"), mode="r")[...], x)
    assert not list((tmp_path / "x.zarr").rglob("*.tmp-*"))


def test_ineligible_arrays_use_zarr(tmp_path):
    x = np.arange(20.0).reshape(4, 5)
    z = create_array(tmp_path / "z.zarr", shape=x.shape, dtype="float64", chunks=(2, 2), codec="zstd")
    z[...] = x
    assert raw_access(z) is None
    v2 = zarr.create_array(store=str(tmp_path / "v2.zarr"), shape=x.shape, chunks=(2, 2), dtype="f8", zarr_format=2)
    v2[...] = x
    assert raw_access(v2) is None
    for arr in (z, v2):
        np.testing.assert_array_equal(read_block(arr, slice(1, 4), slice(0, 3)), x[1:4, 0:3])


def test_truncated_chunk_is_reported(tmp_path):
    from blocklin.errors import StoreReadError

    arr = create_array(tmp_path / "x.zarr", shape=(8, 8), dtype="float64", chunks=(4, 4))
    arr[...] = np.ones((8, 8))
    chunk = tmp_path / "x.zarr" / "c" / "1" / "0"
    chunk.write_bytes(chunk.read_bytes()[:100])
    with pytest.raises(StoreReadError, match="truncated or corrupt"):
        read_block(arr, slice(0, 8), slice(0, 8), out=np.empty((8, 8)))
