"""Compressed local chunks decoded straight into place (rawchunks.DecodedChunks): the same bits as
zarr, the same bytes counted, several chunks at once on the decode pool, and a damaged chunk named."""

from __future__ import annotations

import concurrent.futures
import shutil
import threading

import numpy as np
import pytest
import zarr

import blocklin
import blocklin._readstats as readstats
import blocklin.storage.rawchunks as rawchunks
from blocklin.errors import StoreReadError
from blocklin.storage.zarr_store import fetched_bytes, read_block

CODECS = {"zstd": lambda: zarr.codecs.ZstdCodec(level=3), "zstd-checksum": lambda: zarr.codecs.ZstdCodec(checksum=True),
          "blosc": lambda: zarr.codecs.BloscCodec(cname="lz4", shuffle="shuffle")}
SELECTIONS = [(slice(0, 53), slice(0, 41)), (slice(5, 50), slice(3, 40)), (slice(16, 32), slice(12, 24)),
              (slice(48, 53), slice(36, 41)), (slice(0, 16), slice(0, 41)), (slice(7, 8), slice(0, 1)),
              (slice(10, 10), slice(0, 5)), (slice(16, 48), slice(0, 36))]


def _array(path, x, codec, chunks=(16, 12)):
    arr = zarr.create_array(str(path), shape=x.shape, dtype=x.dtype, chunks=chunks, compressors=CODECS[codec](),
                            zarr_format=3, fill_value=0)
    arr[...] = x
    return arr


@pytest.fixture(params=[1, 3])
def decode_threads(request, monkeypatch):
    """Decoded one chunk at a time, and three at once on the pool."""
    monkeypatch.setattr(rawchunks, "DECODE_THREADS", request.param)
    return request.param


@pytest.mark.parametrize("codec", sorted(CODECS))
@pytest.mark.parametrize("dtype", ["float64", "float32", "int16"])
def test_reads_match_zarr_bit_for_bit(tmp_path, codec, dtype, decode_threads):
    rng = np.random.default_rng(0)
    x = (rng.standard_normal((53, 41)) * 100).astype(dtype)
    arr = _array(tmp_path / "x.zarr", x, codec)
    arr[16:32, 12:24] = 0  # zarr skips writing an all-fill chunk: the file is missing
    x[16:32, 12:24] = 0
    assert not (tmp_path / "x.zarr" / "c" / "1" / "1").exists()
    assert rawchunks.decoded_access(arr) is not None and rawchunks.raw_access(arr) is None
    for rows, cols in SELECTIONS:
        out = np.full((rows.stop - rows.start, cols.stop - cols.start), 7, dtype=dtype)
        with readstats.tallying() as tally:
            got = read_block(arr, rows, cols, out=out)
        assert got is out
        np.testing.assert_array_equal(out, x[rows, cols])
        assert out.tobytes() == np.ascontiguousarray(x[rows, cols]).tobytes()  # bits, signed zeros included
        assert tally.bytes == fetched_bytes(arr, rows, cols)  # the encoded chunk files touched, as zarr's reads


def test_only_plain_compressed_local_arrays_take_the_path(tmp_path):
    x = np.arange(64.0).reshape(8, 8)
    crc = zarr.create_array(str(tmp_path / "crc.zarr"), shape=x.shape, chunks=(4, 4), dtype="float64",
                            compressors=[zarr.codecs.ZstdCodec(), zarr.codecs.Crc32cCodec()])
    gz = zarr.create_array(str(tmp_path / "gz.zarr"), shape=x.shape, chunks=(4, 4), dtype="float64",
                           compressors=zarr.codecs.GzipCodec())
    big = zarr.create_array(str(tmp_path / "big.zarr"), shape=x.shape, chunks=(4, 4), dtype=">f8",
                            compressors=zarr.codecs.ZstdCodec())
    for arr in (crc, gz, big):
        arr[...] = x
        assert rawchunks.decoded_access(arr) is None
        out = np.empty((5, 6))
        np.testing.assert_array_equal(read_block(arr, slice(1, 6), slice(2, 8), out=out), x[1:6, 2:8])


def test_a_pass_over_a_compressed_matrix_is_unchanged(tmp_path, monkeypatch):
    """The column sums and Gram matrix of a row pass: the same bits one chunk at a time and pooled."""
    rng = np.random.default_rng(2)
    x = rng.standard_normal((3000, 24))
    _array(tmp_path / "a.zarr", x, "zstd", chunks=(250, 8))
    results = []
    pooled = []
    run_all = rawchunks._run_all
    monkeypatch.setattr(rawchunks, "_run_all", lambda *a: pooled.append(a[3]) or run_all(*a))
    for threads in (1, 4):
        monkeypatch.setattr(rawchunks, "DECODE_THREADS", threads)
        res = blocklin.gram(str(tmp_path / "a.zarr"), tmp_path / f"g{threads}.zarr", memory="4MiB")
        results.append(res.to_numpy())
    ref = x.T @ x
    # the Gram route sums 3000 products per entry: norm-wise bound 3000 * eps * ||x||_F^2
    assert np.linalg.norm(results[0] - ref) <= 3000 * np.finfo(np.float64).eps * np.linalg.norm(x) ** 2
    assert results[0].tobytes() == results[1].tobytes()
    assert pooled and max(pooled) > 1  # the strips' chunks were decoded several at once


def test_a_damaged_chunk_decoded_on_the_pool_is_named(tmp_path, decode_threads):
    x = np.random.default_rng(3).standard_normal((64, 64))
    arr = _array(tmp_path / "x.zarr", x, "zstd", chunks=(16, 16))
    chunk = tmp_path / "x.zarr" / "c" / "2" / "1"
    data = bytearray(chunk.read_bytes())
    data[10:30] = b"\xff" * 20
    chunk.write_bytes(bytes(data))
    with pytest.raises(StoreReadError, match="chunk c/2/1 of .*x.zarr"):
        read_block(arr, slice(0, 64), slice(0, 64), out=np.empty((64, 64)))


def test_a_chunk_of_another_shape_is_refused(tmp_path):
    """A chunk file whose header declares other than one chunk of bytes is never decoded into place."""
    x = np.random.default_rng(4).standard_normal((32, 32))
    arr = _array(tmp_path / "x.zarr", x, "zstd", chunks=(16, 16))
    other = _array(tmp_path / "y.zarr", x, "zstd", chunks=(16, 32))
    assert other is not None
    shutil.copy(tmp_path / "y.zarr" / "c" / "0" / "0", tmp_path / "x.zarr" / "c" / "1" / "1")
    with pytest.raises(StoreReadError, match="chunk c/1/1"):
        read_block(arr, slice(0, 32), slice(0, 32), out=np.empty((32, 32)))


def _zstd_frame_without_size(raw: bytes) -> bytes:
    """One zstd frame holding ``raw`` in one raw block, its header declaring no content size (as a
    streaming encoder writes it): magic, a frame header of no flags, a window descriptor of 1 KiB."""
    assert len(raw) <= 1024
    return (0xFD2FB528).to_bytes(4, "little") + bytes([0, 0]) + ((len(raw) << 3) | 1).to_bytes(3, "little") + raw


def test_a_zstd_frame_that_declares_no_size_reads_as_zarr_reads_it(tmp_path):
    """A valid frame without a content size in its header (zarr decodes it) had been refused as a
    damaged chunk with the fix 're-create it'; one decoding to other than a chunk is still refused."""
    x = np.random.default_rng(5).standard_normal((16, 6))
    arr = _array(tmp_path / "x.zarr", x, "zstd", chunks=(8, 6))
    chunk = tmp_path / "x.zarr" / "c" / "1" / "0"
    chunk.write_bytes(_zstd_frame_without_size((x[8:] + 1).tobytes()))
    ref = zarr.open_array(str(tmp_path / "x.zarr"))[...]
    np.testing.assert_array_equal(ref[8:], x[8:] + 1)
    assert rawchunks.decoded_access(arr) is not None
    for rows, cols in [(slice(0, 16), slice(0, 6)), (slice(5, 12), slice(1, 4))]:
        out = np.empty((rows.stop - rows.start, cols.stop - cols.start))
        np.testing.assert_array_equal(read_block(arr, rows, cols, out=out), ref[rows, cols])
    chunk.write_bytes(_zstd_frame_without_size(x[8:12].tobytes()))  # half a chunk
    with pytest.raises(StoreReadError, match="chunk c/1/0"):
        read_block(arr, slice(0, 16), slice(0, 6), out=np.empty((16, 6)))
    chunk.write_bytes(b"\0" * 40)  # not a zstd frame at all
    with pytest.raises(StoreReadError, match="chunk c/1/0"):
        read_block(arr, slice(0, 16), slice(0, 6), out=np.empty((16, 6)))


def test_a_failing_lane_waits_for_the_others_before_raising():
    """An error (or an interrupt) in one decode lane: no other lane still runs once the read returns."""
    running = [0]
    lock = threading.Lock()
    started = threading.Barrier(3)

    def work(i):
        with lock:
            running[0] += 1
        try:
            if i < 3:
                started.wait(timeout=10)  # three lanes busy at once
            if i == 1:
                raise KeyboardInterrupt
        finally:
            with lock:
                running[0] -= 1

    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        with pytest.raises(KeyboardInterrupt):
            rawchunks._run_all(pool, work, [(i,) for i in range(50)], 3)
        assert running[0] == 0


@pytest.mark.parametrize("codec", sorted(CODECS))
def test_frames_and_part_chunks_are_reused_within_a_run(tmp_path, codec, decode_threads, monkeypatch):
    """Inside a run's buffer scope (``device.pool.reusing``) the encoded bytes and a part's decoded chunk
    go through buffers handed back for the next chunk: the same bits as zarr, whether a buffer is new or
    reused; outside the scope nothing is kept. A frame larger than the kept size (``FRAME_SLACK``)
    is read into a buffer of its own."""
    from blocklin.device import pool

    rng = np.random.default_rng(1)
    x = rng.standard_normal((53, 41))  # incompressible: frames near the chunk's size
    arr = _array(tmp_path / "x.zarr", x, codec)
    chunk_bytes = 16 * 12 * 8
    cap = (chunk_bytes + chunk_bytes // 128 + rawchunks.FRAME_SLACK,)
    taken = []
    real_empty = pool.empty
    monkeypatch.setattr(pool, "empty", lambda shape, dtype: (taken.append(tuple(shape)), real_empty(shape, dtype))[1])
    with pool.reusing():
        for _ in range(2):
            for rows, cols in SELECTIONS:
                out = np.empty((rows.stop - rows.start, cols.stop - cols.start))
                np.testing.assert_array_equal(read_block(arr, rows, cols, out=out), x[rows, cols])
        kept = {k[0]: len(v) for k, v in pool._free.items()}
    assert cap in taken and (16, 12) in taken  # frames, and decoded chunks for the parts
    # no more kept than ever in flight at once: a frame and a part's chunk per decoding lane
    assert 1 <= kept[cap] <= decode_threads and kept.get((16, 12), 0) <= decode_threads
    assert pool._free is None
    monkeypatch.setattr(rawchunks, "FRAME_SLACK", 16 - chunk_bytes - chunk_bytes // 128)  # kept frames of 16 bytes
    taken.clear()
    with pool.reusing():
        out = np.empty((53, 41))
        np.testing.assert_array_equal(read_block(arr, slice(0, 53), slice(0, 41), out=out), x)
        assert not any(len(k[0]) == 1 for k in pool._free)
    assert not any(len(s) == 1 for s in taken)


@pytest.mark.parametrize("out", [True, False])
@pytest.mark.parametrize("lanes", [1, 2, 3])
def test_reads_through_zarr_decode_at_most_lanes_chunks_at_once(lanes, out, monkeypatch):
    """Where zarr decodes the chunks (an object store's compressed chunks, here an in-memory store), a read
    given ``lanes`` asks zarr for at most that many chunks per call, as the row pass's plan counted
    (``RowPassPlan.lanes``); zarr decodes every chunk of one call at once. Same values as one read."""
    import zarr
    from zarr.storage import MemoryStore

    x = np.random.default_rng(6).standard_normal((70, 90))
    arr = zarr.create_array(store=MemoryStore(), shape=x.shape, chunks=(16, 20), dtype=x.dtype,
                            compressors=zarr.codecs.ZstdCodec())
    arr[...] = x
    calls = []
    real_get, real_item = zarr.Array.get_basic_selection, zarr.Array.__getitem__

    def chunks_of(sel):
        rows, cols = (slice(*s.indices(n)) for s, n in zip(sel, x.shape))
        return len(range(rows.start // 16, -(-rows.stop // 16))) * len(range(cols.start // 20, -(-cols.stop // 20)))

    def get(self, selection, *a, **kw):
        calls.append(chunks_of(selection))
        return real_get(self, selection, *a, **kw)

    def item(self, selection):
        calls.append(chunks_of(selection))
        return real_item(self, selection)

    monkeypatch.setattr(zarr.Array, "get_basic_selection", get)
    monkeypatch.setattr(zarr.Array, "__getitem__", item)
    for rows, cols in [(slice(0, 16), slice(0, 90)), (slice(5, 40), slice(13, 77)), (slice(None), slice(None))]:
        calls.clear()
        dest = np.empty(x[rows, cols].shape) if out else None
        got = read_block(arr, rows, cols, out=dest, lanes=lanes)
        np.testing.assert_array_equal(got, x[rows, cols])
        assert calls and max(calls) <= lanes, calls
