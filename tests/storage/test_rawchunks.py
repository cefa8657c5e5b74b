"""The direct chunk-file path agrees with zarr for reads and writes, and steps aside when ineligible."""

from __future__ import annotations

import numpy as np
import pytest
import zarr

from blocklin.storage.rawchunks import raw_access
from blocklin.storage.zarr_store import create_array, read_block, write_block
from support.tolerances import assert_singular_values


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


def test_a_failed_chunk_write_keeps_the_chunk_and_leaves_no_temporary(tmp_path):
    """A chunk write that fails part way (a full disk, an interrupt) leaves the stored chunk as it was
    and no temporary beside it (every raw chunk write, 2-D and 1-D, goes through ``chunk_file``)."""
    from blocklin.storage.rawchunks import chunk_file

    (tmp_path / "x").mkdir()
    path = tmp_path / "x" / "c.0.0"
    path.write_bytes(b"old chunk")
    with pytest.raises(OSError, match="No space"):
        with chunk_file(str(path), object()) as f:
            f.write(b"half a ne")
            raise OSError(28, "No space left on device")
    assert path.read_bytes() == b"old chunk" and [p.name for p in path.parent.iterdir()] == ["c.0.0"]
    with chunk_file(str(path), object()) as f:
        f.write(b"new chunk")
    assert path.read_bytes() == b"new chunk" and [p.name for p in path.parent.iterdir()] == ["c.0.0"]


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


def _selections(shape, chunks):
    """Blocks that cut chunks every way: row ranges, column ranges (narrow, wide, across chunks)."""
    m, n = shape
    cr, cc = chunks
    return [(slice(3, m - 2), slice(1, n - 1)), (slice(0, m), slice(0, n)), (slice(cr - 1, cr + 2), slice(0, n)),
            (slice(2, 9), slice(1, 3)), (slice(0, m), slice(cc + 1, cc + 2)), (slice(5, m), slice(0, cc - 1)),
            (slice(1, m - 1), slice(cc // 2, 2 * cc)), (slice(m - 1, m), slice(n - 1, n))]


def test_partial_reads_fetch_only_what_they_use(tmp_path):
    """Row ranges of uncompressed chunks are read alone, and so are narrow column ranges of local
    ones: the bytes fetched are the block's own, up to whole rows where a segment is over half a
    chunk row wide (read in one scattering call rather than row by row)."""
    import blocklin._readstats as readstats

    rng = np.random.default_rng(3)
    x = rng.standard_normal((97, 70))
    arr = create_array(tmp_path / "x.zarr", shape=x.shape, dtype="float64", chunks=(20, 16))
    arr[...] = x
    for rows, cols in _selections(x.shape, (20, 16)):
        with readstats.tallying() as tally:
            got = read_block(arr, rows, cols)
        np.testing.assert_array_equal(got, x[rows, cols])
        n_rows = rows.stop - rows.start
        chunk_cols = sum(1 for c in range(0, 80, 16) if c < cols.stop and c + 16 > cols.start)
        assert got.nbytes <= tally.bytes <= n_rows * chunk_cols * 16 * 8  # never whole chunks for a row range
        if (cols.stop - cols.start) * 2 <= 16 and cols.start // 16 == (cols.stop - 1) // 16:
            assert tally.bytes == got.nbytes  # a narrow segment: exactly its bytes


def test_missing_chunks_read_as_fill_in_part(tmp_path):
    arr = create_array(tmp_path / "x.zarr", shape=(40, 40), dtype="float64", chunks=(20, 20))
    arr[0:20, 0:20] = 1.0  # the other chunks are never written
    np.testing.assert_array_equal(read_block(arr, slice(10, 30), slice(5, 35)),
                                  np.pad(np.ones((10, 15)), ((0, 10), (0, 15))))


def test_compressed_reads_count_encoded_chunks(tmp_path):
    import blocklin._readstats as readstats

    x = np.zeros((64, 64))  # compresses to almost nothing
    arr = create_array(tmp_path / "z.zarr", shape=x.shape, dtype="float64", chunks=(32, 32), codec="zstd")
    arr[...] = x + 1.0
    with readstats.tallying() as tally:
        read_block(arr, slice(0, 10), slice(0, 10))  # one chunk, read (and decoded) whole
    assert 0 < tally.bytes < 32 * 32 * 8


def test_object_store_row_ranges_by_range_requests():
    """Uncompressed chunks on an fsspec store: a row range of a chunk is one range request of its bytes."""
    import uuid

    import blocklin._readstats as readstats

    url = f"memory://rawchunks-{uuid.uuid4().hex[:8]}/x.zarr"
    x = np.arange(40.0 * 30).reshape(40, 30)
    arr = create_array(url, shape=x.shape, dtype="float64", chunks=(20, 30))
    arr[...] = x
    raw = raw_access(arr, remote=True)
    assert raw_access(arr) is None and raw is not None and raw.fs is not None
    with readstats.tallying() as tally:
        got = read_block(arr, slice(5, 25), slice(0, 30))
    np.testing.assert_array_equal(got, x[5:25])
    assert tally.bytes == got.nbytes  # two row ranges, nothing else
    with readstats.tallying() as tally:  # whole chunks: zarr, several at once
        np.testing.assert_array_equal(read_block(arr, slice(0, 40), slice(0, 30)), x)
    assert tally.bytes == x.nbytes


@pytest.mark.parametrize("cols", [slice(1, 3), slice(0, 3), slice(0, 8)])
def test_truncated_chunk_is_reported_in_part_reads(tmp_path, cols):
    from blocklin.errors import StoreReadError

    arr = create_array(tmp_path / "x.zarr", shape=(8, 8), dtype="float64", chunks=(4, 4))
    arr[...] = np.ones((8, 8))
    chunk = tmp_path / "x.zarr" / "c" / "1" / "0"
    chunk.write_bytes(chunk.read_bytes()[:40])
    with pytest.raises(StoreReadError, match="truncated or corrupt"):
        read_block(arr, slice(5, 8), cols)


def test_compressed_chunk_band_kept_across_narrow_strips(tmp_path):
    """A budget that cannot hold whole-chunk strips of a compressed array but holds one decoded chunk
    band reads each chunk once per pass (the band is kept for the strips that share it), with the
    same singular values as NumPy; a smaller budget re-reads the chunks and says so."""
    import blocklin as bl

    rng = np.random.default_rng(0)
    m, n, k = 20000, 100, 5
    q1, _ = np.linalg.qr(rng.standard_normal((m, n)))
    q2, _ = np.linalg.qr(rng.standard_normal((n, n)))
    s = 0.5 ** np.arange(n)
    x = (q1 * s) @ q2.T
    arr = create_array(tmp_path / "z.zarr", shape=x.shape, dtype="float64", chunks=(2000, n), codec="zstd")
    arr[...] = x
    encoded = sum(f.stat().st_size for f in (tmp_path / "z.zarr" / "c").rglob("*") if f.is_file())
    y_reads = m * (k + 10) * 8 * 2  # the rsvd's own intermediate (uncompressed, read in its passes)
    kept = bl.svd(tmp_path / "z.zarr", k, method="rsvd", memory="8MiB", seed=0)
    assert not kept.report.get("read_notes")
    assert kept.report["bytes_read"] <= kept.report["passes"] * encoded + y_reads
    reread = bl.svd(tmp_path / "z.zarr", k, method="rsvd", memory="6MiB", seed=0)
    assert "read up to" in reread.report["read_notes"][0]
    assert reread.report["bytes_read"] > 1.5 * kept.report["passes"] * encoded
    # float64 with a 2x decay and 4 power iterations: the top 5 values are exact to rounding
    for r in (kept, reread):
        assert_singular_values(r.s, s[:k], n=m)


@pytest.mark.parametrize("where", ["local", "memory"])
def test_vector_ranges_of_a_group_member_read_only_their_bytes(tmp_path, where):
    """1-D arrays (the sparse store's ``indptr``/``indices``/``data``, members of a group): a range is
    read straight from the chunk files, its bytes alone, local or by range requests; missing chunks
    read as the fill value; compressed members go through zarr."""
    import uuid

    import blocklin._readstats as readstats
    from blocklin.storage.rawchunks import raw_vector
    from blocklin.storage.zarr_store import read_vector

    root = str(tmp_path / "g.zarr") if where == "local" else f"memory://vec-{uuid.uuid4().hex[:8]}/g.zarr"
    group = zarr.open_group(root, mode="w")
    x = np.arange(1000, dtype=np.int64) * 7 - 3
    arr = group.create_array("v", shape=x.shape, chunks=(64,), dtype="int64", compressors=None, fill_value=5)
    arr[:900] = x[:900]  # the last chunks are never written
    x[900:] = 5
    assert raw_vector(arr) is not None
    for a, b in [(0, 1000), (3, 64), (63, 65), (100, 700), (640, 641), (899, 1000), (10, 10)]:
        with readstats.tallying() as tally:
            got = read_vector(arr, a, b)
        np.testing.assert_array_equal(got, x[a:b])
        assert got.dtype == x.dtype and tally.bytes <= got.nbytes  # never whole chunks
    z = group.create_array("z", shape=x.shape, chunks=(64,), dtype="int64")  # zstd by default
    z[:] = x
    if where == "local":
        assert raw_vector(z) is None
    np.testing.assert_array_equal(read_vector(z, 70, 300), x[70:300])


def test_vector_truncated_chunk_is_reported(tmp_path):
    from blocklin.errors import StoreReadError
    from blocklin.storage.zarr_store import read_vector

    group = zarr.open_group(str(tmp_path / "g.zarr"), mode="w")
    arr = group.create_array("v", shape=(100,), chunks=(32,), dtype="float64", compressors=None)
    arr[:] = np.ones(100)
    chunk = tmp_path / "g.zarr" / "v" / "c" / "1"
    chunk.write_bytes(chunk.read_bytes()[:40])
    with pytest.raises(StoreReadError, match="truncated or corrupt"):
        read_vector(arr, 30, 60)


def test_vector_chunks_written_past_the_length_then_resized(tmp_path):
    """The sparse writer's appends: whole chunks written to their files while the array is still empty,
    the last one padded with the fill value, then one resize: zarr reads what was appended."""
    from blocklin.storage.rawchunks import vector_chunk_files

    arr = create_array(tmp_path / "v.zarr", shape=(0,), dtype="int32", chunks=(16,))
    files = vector_chunk_files(arr)
    assert files is not None
    x = np.arange(3 * 16 + 5, dtype=np.int32) - 7
    for i in range(4):
        buf = np.zeros(16, np.int32)
        part = x[16 * i:16 * (i + 1)]
        buf[:len(part)] = part
        files.write(i, buf)
    arr.resize((len(x),))
    np.testing.assert_array_equal(zarr.open_array(str(tmp_path / "v.zarr"), mode="r")[:], x)
    assert not list((tmp_path / "v.zarr").rglob("*.tmp-*"))
    assert vector_chunk_files(create_array(tmp_path / "z.zarr", shape=(8,), dtype="int32", chunks=(4,),
                                           codec="zstd")) is None


_FOREIGN = {  # zarr's own layouts blocklin did not write, each with chunks never written (the fill value)
    "v3 '.' keys, fill 5": dict(chunk_key_encoding={"name": "default", "separator": "."}, fill_value=5.0,
                                compressors=None),
    "v3 v2 keys": dict(chunk_key_encoding={"name": "v2", "separator": "."}, fill_value=5.0, compressors=None),
    "v3 big-endian": dict(serializer=zarr.codecs.BytesCodec(endian="big"), fill_value=5.0, compressors=None),
    "v3 transposed": dict(filters=[zarr.codecs.TransposeCodec(order=(1, 0))], fill_value=5.0, compressors=None),
    "v3 blosc bitshuffle, fill nan": dict(compressors=zarr.codecs.BloscCodec(cname="lz4", shuffle="bitshuffle"),
                                          fill_value=float("nan")),
    "v3 zstd + crc32c": dict(compressors=(zarr.codecs.ZstdCodec(), zarr.codecs.Crc32cCodec()), fill_value=5.0),
    "v3 sharded": dict(shards=(16, 12), fill_value=5.0, compressors=None),
    "v2 order F, '/' keys": dict(zarr_format=2, order="F", fill_value=5.0, compressors=None,
                                 chunk_key_encoding={"name": "v2", "separator": "/"}),
    "v2 big-endian": dict(zarr_format=2, dtype=">f8", fill_value=5.0, compressors=None),
}


@pytest.mark.parametrize("name", list(_FOREIGN))
def test_foreign_layouts_read_as_zarr_reads_them(tmp_path, name):
    """Every layout the direct readers do not take is left to zarr, whose values (missing chunks
    included) every read and every pass sees: a chunk file misread as C-ordered little-endian bytes, or
    a missing one taken for zeros, would be a silently wrong matrix."""
    import blocklin
    from support.tolerances import assert_gram

    kw = dict(_FOREIGN[name])
    x = np.random.default_rng(2).standard_normal((37, 23))
    z = zarr.create_array(store=str(tmp_path / "f.zarr"), shape=x.shape, chunks=(8, 6), dtype=kw.pop("dtype", "f8"),
                          **kw)
    z[:16] = x[:16]
    z[32:] = x[32:]  # rows 16:32 never written: the fill value
    ref = z[...]
    assert np.all((ref[16:32] == 5) | np.isnan(ref[16:32]))
    for rows, cols in [(slice(0, 37), slice(0, 23)), (slice(3, 30), slice(2, 21)), (slice(9, 12), slice(0, 23))]:
        np.testing.assert_array_equal(read_block(z, rows, cols), ref[rows, cols])
        out = np.empty((rows.stop - rows.start, cols.stop - cols.start))
        np.testing.assert_array_equal(read_block(z, rows, cols, out=out), ref[rows, cols])
    np.testing.assert_array_equal(blocklin.open(tmp_path / "f.zarr").to_numpy(), ref)
    if np.isfinite(ref).all():  # a pass over it (strips through the direct, decoding or zarr readers)
        g = blocklin.gram(tmp_path / "f.zarr", tmp_path / "g.zarr").to_numpy()
        assert_gram(g, ref.T @ ref, ref)
