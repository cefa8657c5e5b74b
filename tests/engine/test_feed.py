"""The feed: runs of row-pass groups and of GEMM tiles, and reads split over the chunk I/O pool.

Each change only moves work between threads and tasks; the results must be the bits the old
loaders gave (a task per group or tile, one thread per read), on every scheduler.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest

import blocklin as bl
from blocklin.errors import StoreReadError
from blocklin.plan.passes import PassMemory
from blocklin.runtime import passes, tiles
from blocklin.runtime.job import Job
from blocklin.runtime.passes import row_kernel, run_pass, source
from blocklin.storage import mapped as mapping
from blocklin.storage import rawchunks
from blocklin.storage.zarr_store import create_array, read_block


def _sum_memory(params, sources):
    return PassMemory(fixed=sources[0].width * 8)


@row_kernel(memory=_sum_memory, device="cpu")
def _column_sums(device, arrays, rows, params, state):
    """float32 sums strip by strip: the order of the additions shows in the bits."""
    (x,) = arrays
    s = x.sum(axis=0, dtype=np.float32)
    return (s if state is None else state + s), None


#: The same sums by a kernel that never writes into its strips: its passes may map them (mapped_inputs).
_column_sums_read_only = row_kernel(memory=_sum_memory, device="cpu", read_only=True)(
    lambda device, arrays, rows, params, state: _column_sums(device, arrays, rows, params, state))


@row_kernel(memory=lambda params, sources: PassMemory(fixed=0), device="cpu")
def _rows_seen(device, arrays, rows, params, state):
    """The rows a task saw (any dtype)."""
    return (state or 0) + arrays[0].shape[0], None


def _per_unit(monkeypatch):
    """The old scheduling: a task per row-pass group and per GEMM tile."""
    monkeypatch.setattr(passes, "group_runs", lambda plan, scheduler: [(g, g + 1) for g in range(len(plan.groups))])
    monkeypatch.setattr("blocklin.linalg.products.gemm.gemm_runs", lambda t, workers, scheduler: [(x,) for x in t])


@pytest.fixture
def tall(tmp_path):
    x = (np.random.default_rng(3).standard_normal((3000, 40)) * 1e3).astype(np.float32)
    return x, bl.from_array(x, tmp_path / "x.zarr", chunks=(100, 40))


def _pass_states(path, scheduler):
    with Job("feed-test", memory="96KiB", scheduler=scheduler, workers=2) as job:
        op = job.operand(path, "a")
        states, plan = run_pass(job, _column_sums, [source(op)], check_finite=False, min_tasks=8)
    return states, plan


@pytest.mark.parametrize("scheduler", ["sync", "threads"])
def test_row_pass_runs_give_each_groups_bits(tall, monkeypatch, scheduler):
    _, a = tall
    runs, plan = _pass_states(a.path, scheduler)
    assert len(plan.groups) > 4 and len(passes.group_runs(plan, scheduler)) == 2
    with monkeypatch.context() as m:
        _per_unit(m)
        alone, _ = _pass_states(a.path, scheduler)
    assert len(runs) == len(alone) == len(plan.groups)
    for r, s in zip(runs, alone):
        assert r.dtype == np.float32 and np.array_equal(r, s)


def test_group_runs_cover_the_groups_in_order():
    class P:
        groups = tuple((10 * g, 10 * g + 10) for g in range(7))
        workers = 3

    for sched, want in (("threads", 3), ("sync", 3), ("processes", 7), ("distributed", 7)):
        runs = passes.group_runs(P, sched)
        assert len(runs) == want
        assert [g for a, b in runs for g in range(a, b)] == list(range(7))
    assert tiles.gemm_runs([], 2, "threads") == []
    t = [(i, 0, slice(i, i + 1), slice(0, 1)) for i in range(5)]
    assert [x for run in tiles.gemm_runs(t, 2, "threads") for x in run] == t
    assert tiles.gemm_runs(t, 2, "distributed") == [(x,) for x in t]


@pytest.mark.parametrize("scheduler", ["sync", "threads", "processes"])
def test_gemm_runs_give_each_tiles_bits(tmp_path, monkeypatch, scheduler):
    rng = np.random.default_rng(5)
    a = bl.from_array(rng.standard_normal((300, 200)).astype(np.float32), tmp_path / "a.zarr", chunks=(50, 50))
    b = bl.from_array(rng.standard_normal((200, 120)).astype(np.float32), tmp_path / "b.zarr", chunks=(50, 40))
    kw = dict(memory="192KiB", scheduler=scheduler, workers=2)
    runs = bl.matmul(a, b, tmp_path / "runs.zarr", **kw)
    assert runs.report["plan"]["n_tasks"] > 2 and runs.report["tasks"] == runs.report["plan"]["n_tasks"]
    with monkeypatch.context() as m:
        _per_unit(m)
        alone = bl.matmul(a, b, tmp_path / "alone.zarr", **kw)
    assert np.array_equal(runs.to_numpy(), alone.to_numpy())
    assert runs.report["bytes_read"] == alone.report["bytes_read"]


def test_gemm_run_resumes_tile_by_tile(tmp_path, monkeypatch):
    """A run interrupted after some tiles keeps their markers; the resumed run skips exactly those."""
    rng = np.random.default_rng(6)
    a = bl.from_array(rng.standard_normal((256, 160)), tmp_path / "a.zarr", chunks=(32, 32))
    b = bl.from_array(rng.standard_normal((160, 96)), tmp_path / "b.zarr", chunks=(32, 32))
    ref = bl.matmul(a, b, memory="96KiB", scheduler="sync").to_numpy()
    real, seen = tiles.run_tile, []

    def dying(*args, **kwargs):
        if len(seen) == 3:
            raise KeyboardInterrupt
        seen.append(args[1:3])
        return real(*args, **kwargs)

    monkeypatch.setattr(tiles, "run_tile", dying)
    with pytest.raises(KeyboardInterrupt):
        bl.matmul(a, b, tmp_path / "c.zarr", memory="96KiB", scheduler="threads", workers=1, resume=True)
    monkeypatch.undo()
    c = bl.matmul(a, b, tmp_path / "c.zarr", memory="96KiB", scheduler="threads", workers=1, resume=True)
    assert c.report["skipped"] == 3 and np.array_equal(c.to_numpy(), ref)


def _normals_stored(path, shape, chunks, seed):
    """Standard normals and the uncompressed zarr array at ``path`` holding them."""
    x = np.random.default_rng(seed).standard_normal(shape)
    arr = create_array(path, shape=x.shape, dtype="float64", chunks=chunks)
    arr[...] = x
    return x, arr


@pytest.fixture
def wide(tmp_path):
    return _normals_stored(tmp_path / "w.zarr", (700, 300), (256, 128), 4)


@pytest.mark.parametrize("threads", [1, 2, 5])
def test_pooled_reads_equal_serial_reads(wide, monkeypatch, threads):
    x, arr = wide
    monkeypatch.setattr(rawchunks, "READ_THREADS", threads)
    monkeypatch.setattr(rawchunks, "READ_PIECE_BYTES", 4096)  # pieces even in a small array
    for rows, cols in [(slice(0, 700), slice(0, 300)), (slice(3, 690), slice(0, 128)), (slice(250, 700), slice(5, 290)),
                       (slice(0, 700), slice(128, 256)), (slice(699, 700), slice(0, 300))]:
        out = np.full((rows.stop - rows.start, cols.stop - cols.start), np.nan)
        assert np.array_equal(read_block(arr, rows, cols, out=out), x[rows, cols])


def test_pooled_read_splits_only_where_cores_are_free(wide, monkeypatch):
    _, arr = wide
    monkeypatch.setattr(rawchunks, "READ_THREADS", 2)
    monkeypatch.setattr(rawchunks, "READ_PIECE_BYTES", 4096)
    lanes = []
    real = rawchunks._run_all
    monkeypatch.setattr(rawchunks, "_run_all", lambda *a: lanes.append(a[3]) or real(*a))
    out = np.empty((700, 128))
    read_block(arr, slice(0, 700), slice(0, 128), out=out)
    assert lanes == [2]
    with rawchunks._reading():  # another read under way takes the other core
        read_block(arr, slice(0, 700), slice(0, 128), out=out)
    assert lanes == [2]


def test_pooled_read_takes_the_calling_thread_as_a_lane(wide, monkeypatch):
    """The thread that asks for a read reads pieces of it too, beside the pool's threads."""
    x, arr = wide
    monkeypatch.setattr(rawchunks, "READ_THREADS", 3)
    monkeypatch.setattr(rawchunks, "READ_PIECE_BYTES", 4096)
    where, real = [], rawchunks.RawChunks._read_rows_into

    def piece(self, path, r0, r1, dest):
        where.append(threading.current_thread().name)
        threading.Event().wait(0.005)  # every lane finds a piece to take
        real(self, path, r0, r1, dest)

    monkeypatch.setattr(rawchunks.RawChunks, "_read_rows_into", piece)
    out = read_block(arr, slice(0, 700), slice(0, 128), out=np.empty((700, 128)))
    assert np.array_equal(out, x[:, :128])
    me = threading.current_thread().name
    assert me in where and len(set(where) - {me}) == 2, where


def test_truncated_chunk_in_a_pooled_read_names_it(wide, monkeypatch):
    _, arr = wide
    monkeypatch.setattr(rawchunks, "READ_THREADS", 2)
    monkeypatch.setattr(rawchunks, "READ_PIECE_BYTES", 4096)
    path = arr.store.root / "c" / "1" / "0"
    path.write_bytes(path.read_bytes()[:1000])
    with pytest.raises(StoreReadError, match=r"c[/\\]1[/\\]0"):
        read_block(arr, slice(0, 700), slice(0, 128), out=np.empty((700, 128)))


def test_interrupted_pooled_read_leaves_no_piece_running(wide, monkeypatch):
    """Ctrl-C in one piece: the read returns only once no piece writes into the buffer any more."""
    _, arr = wide
    monkeypatch.setattr(rawchunks, "READ_THREADS", 4)
    monkeypatch.setattr(rawchunks, "READ_PIECE_BYTES", 4096)
    real = rawchunks.RawChunks._read_rows_into
    running, calls = [0], [0]
    lock, other = threading.Lock(), threading.Event()

    def piece(self, path, r0, r1, dest):
        with lock:
            calls[0] += 1
            first = calls[0] == 1
            running[0] += 1
        try:
            if first:
                other.wait(5)  # interrupted while another piece is under way
                raise KeyboardInterrupt
            other.set()
            real(self, path, r0, r1, dest)
        finally:
            with lock:
                running[0] -= 1

    monkeypatch.setattr(rawchunks.RawChunks, "_read_rows_into", piece)
    with pytest.raises(KeyboardInterrupt):
        read_block(arr, slice(0, 700), slice(0, 128), out=np.empty((700, 128)))
    assert calls[0] > 1 and running[0] == 0 and rawchunks._readers == 0


def test_feed_bound_tiles_leave_cores_to_the_reads():
    from blocklin.plan.gemm import plan_gemm

    thin = plan_gemm(262144, 4, 512, np.float64, a_chunks=(2048, 512), b_chunks=(512, 4), memory=64 << 20,
                     cores=2, reads=("direct", "direct"))
    square = plan_gemm(4096, 4096, 4096, np.float64, a_chunks=(1024, 1024), b_chunks=(1024, 1024),
                       memory=512 << 20, cores=2, reads=("direct", "direct"))
    assert thin.blas_threads == 1 and square.blas_threads == 2
    # whole-width k-panels: a part of each row costs a mapping of the chunk, not one contiguous read
    assert thin.tk == 512


@pytest.mark.parametrize("reads", [("direct", "direct"), ("chunks", "chunks")])
def test_read_bound_tiles_keep_their_panels_in_cache(reads):
    """A read-bound CPU tile's panel of A stays within FEED_PANEL_BYTES (the GEMM reads what the loader
    just wrote from the cache) at any budget; tiles that compute enough are as large as before."""
    from blocklin.plan.gemm import FEED_PANEL_BYTES, plan_gemm

    for memory in (64 << 20, 256 << 20, 1 << 30):
        thin = plan_gemm(262144, 4, 512, np.float64, a_chunks=(2048, 512), b_chunks=(512, 4), memory=memory,
                         cores=2, reads=reads)
        assert thin.tm * thin.tk * 8 <= FEED_PANEL_BYTES and thin.tk == 512
    square = plan_gemm(8192, 8192, 8192, np.float64, a_chunks=(1024, 1024), b_chunks=(1024, 1024),
                       memory=1 << 30, cores=2, reads=reads)
    assert square.tm * square.tk * 8 > FEED_PANEL_BYTES


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_first_pass_peaks_stand_in_for_the_finite_check(tmp_path, bad):
    """The first pass's column peaks replace the NaN/Inf check where they are finite; where not, the
    check still names the first bad value."""
    from blocklin.errors import NonFiniteError

    x = np.random.default_rng(9).standard_normal((600, 12))
    x[437, 5] = bad
    a = bl.from_array(x, tmp_path / "x.zarr", chunks=(100, 12))
    with Job("feed-test", memory="64KiB") as job:
        op = job.operand(a.path, "a")
        with pytest.raises(NonFiniteError, match=r"\[437, 5\]"):
            run_pass(job, _column_sums, [source(op)], min_tasks=3)


@pytest.mark.parametrize("mapped,codec", [(False, "none"), (True, "none"), (False, "zstd")],
                         ids=["copied", "mapped", "decoded"])
@pytest.mark.parametrize("columns", [False, True])
def test_first_pass_records_the_peaks_asked_for(tmp_path, monkeypatch, mapped, codec, columns):
    """A job's first pass records the largest magnitude of its input (``job.amax``: the scaling's), and
    each column's (``job.peaks``) only for inputs the job asks it of (``job.column_peaks``: an SVD's);
    the rest take one flat max and min a piece (of zstd chunks, a decoded chunk's part). Exact either
    way, NaN where the input holds one, Inf kept; strips copied, mapped from the page cache or decoded
    alike (the kernel sees the stored strips)."""
    monkeypatch.setattr(passes, "PEAK_PIECE_BYTES", 7 * 32 * 8)  # 7-row pieces: across chunk boundaries
    monkeypatch.setattr(mapping, "large_pages", lambda path: mapped)
    monkeypatch.setattr(mapping, "within_budget", lambda budget, tasks: True)  # budgets of KiB
    x = np.random.default_rng(4).standard_normal((600, 32)) * np.logspace(-3, 3, 32)
    x[17, 2] = -3e6  # the largest magnitude, negative
    for bad in (None, np.inf, np.nan):
        if bad is not None:
            x[333, 7] = bad
        # 32 KiB chunks: mapped where asked
        a = bl.from_array(x, tmp_path / f"x{bad}.zarr", chunks=(128, 32), codec=codec)
        with Job("feed-test", memory="160KiB", check_finite=False) as job:
            op = job.operand(a.path, "a")
            if columns:
                job.column_peaks.add(str(a.path))
            sums, _ = run_pass(job, _column_sums_read_only, [source(op)], min_tasks=3, check_finite=False)
            assert bool(job.stats.get("bytes_mapped")) == mapped
            amax, peaks = job.amax[str(a.path)], job.peaks.get(str(a.path))
        want = np.abs(x).max() if bad is None else bad
        assert amax == want or (np.isnan(want) and np.isnan(amax))
        if columns:
            np.testing.assert_array_equal(peaks, np.abs(x).max(axis=0))  # NaN, Inf in column 7
        else:
            assert peaks is None
        # the kernel saw the stored strips: float32 sums within 600 roundings of sum |x| (Higham, eq. 3.5)
        got, ref = sum(sums).astype(np.float64), x.sum(axis=0)
        fine = np.isfinite(ref)
        assert np.all(np.abs(got[fine] - ref[fine]) <= 600 * 2.0**-24 * np.abs(x).sum(axis=0)[fine] * 2)
        assert np.array_equal(got[~fine], ref[~fine], equal_nan=True)



@pytest.mark.parametrize("codec", ["none", "zstd"])
def test_first_pass_peaks_read_in_pieces_are_those_of_whole_strips(tmp_path, monkeypatch, codec):
    """The first pass over local uncompressed chunks reads each strip a piece at a time and takes each
    piece's column peaks as it lands (``_read_with_peaks``); compressed chunks are read whole (a piece
    would decode its chunks again). The job's peaks are the exact column maxima of ``|x|`` all the
    same, NaN where a column holds one, and the strips the kernel sees are the stored ones."""
    monkeypatch.setattr(passes, "PEAK_PIECE_BYTES", 7 * 12 * 8)  # 7-row pieces: across chunk boundaries
    pieces = []
    for cls in (rawchunks.RawChunks, rawchunks.DecodedChunks):  # every read of the pass goes through one
        monkeypatch.setattr(cls, "read", lambda self, rows, cols, out, real=cls.read, **kw: (
            pieces.append(rows.stop - rows.start), real(self, rows, cols, out, **kw))[1])
    real_pieces = rawchunks.RawChunks.pieces

    def counted_pieces(self, rows, out, step):  # a first pass's pieces of one strip, each chunk file opened once
        for a, b in real_pieces(self, rows, out, step):
            pieces.append(b - a)
            yield a, b

    monkeypatch.setattr(rawchunks.RawChunks, "pieces", counted_pieces)

    x = np.random.default_rng(4).standard_normal((600, 12)) * np.logspace(-3, 3, 12)
    x[17, 2] = -1e6  # a column whose peak is its most negative value
    x[333, 7] = np.inf
    x[512, 9] = np.nan
    a = bl.from_array(x, tmp_path / "x.zarr", chunks=(100, 12), codec=codec)
    monkeypatch.setattr(mapping, "large_pages", lambda path: False)  # copied strips (mapped: the next test)
    with Job("feed-test", memory="64KiB", check_finite=False) as job:
        op = job.operand(a.path, "a")
        job.column_peaks.add(str(a.path))  # as an SVD asks (lowrank.run)
        sums, _ = run_pass(job, _column_sums, [source(op)], min_tasks=3, check_finite=False)
        peaks = job.peaks[str(a.path)]
    ref = np.abs(x).max(axis=0)
    np.testing.assert_array_equal(peaks, ref)  # NaN in column 9, Inf in column 7
    assert np.isnan(peaks[9]) and peaks[7] == np.inf and peaks[2] == 1e6
    assert sum(pieces) == 600
    assert (max(pieces) <= 7) == (codec == "none")
    # the kernel saw the stored strips: the same float32 sums as a pass that records no peaks
    with Job("feed-test", memory="64KiB", check_finite=False) as job:
        op = job.operand(a.path, "a")
        job.peaks[str(a.path)], job.amax[str(a.path)] = ref, np.nan  # recorded already: whole strips read
        pieces.clear()
        again, _ = run_pass(job, _column_sums, [source(op)], min_tasks=3, check_finite=False)
    assert sum(pieces) == 600 and max(pieces) > 7
    for s, t in zip(sums, again):
        np.testing.assert_array_equal(s, t)


def test_read_bound_tiles_over_decoded_chunks_get_a_second_loader():
    """A read-bound CPU tile whose panels of A are decoded (compressed chunks, reads through zarr) gets
    two loaders and two panels read ahead where the budget holds them; uncompressed local reads,
    one core, products that compute enough, and budgets too small keep one loader."""
    from blocklin.plan.gemm import plan_gemm

    def plan(memory, reads=("chunks", "chunks"), n=4, cores=2):
        return plan_gemm(49152, n, 256, np.float64, a_chunks=(1024, 256), b_chunks=(256, 4), memory=memory << 20,
                         cores=cores, reads=reads, direct_writes=True)

    two = plan(20)
    assert (two.loaders, two.prefetch) == (2, 2) and two.peak_memory <= 20 << 20
    assert two.to_dict()["loaders"] == 2
    # the tiles are those of one loader (the bits do not depend on the loaders): a second loader only
    # where the chosen tiles leave room for it
    assert (two.tm, two.tn, two.tk) == (1024, 4, 256)
    for one in (plan(16), plan(24), plan(20, reads=("direct", "direct")), plan(20, cores=1), plan(256, n=4096)):
        assert one.loaders == 1 and "loaders" not in one.to_dict()


@pytest.mark.parametrize("scheduler", ["sync", "threads"])
def test_two_loaders_give_the_bits_of_one(tmp_path, monkeypatch, scheduler):
    import dataclasses

    import blocklin.linalg.products.gemm as gemm

    monkeypatch.setattr("blocklin.linalg.products.thin.THIN_MAX_COLUMNS", 0)  # the tiles this test is about
    rng = np.random.default_rng(11)
    x = rng.standard_normal((12288, 256))
    b = rng.standard_normal((256, 4))
    a = bl.from_array(x, tmp_path / "a.zarr", chunks=(1024, 256), codec="zstd")
    two = bl.matmul(a.path, b, tmp_path / "two.zarr", memory="20MiB", scheduler=scheduler)
    assert two.report["plan"]["loaders"] == 2
    planned = gemm.plan_gemm
    monkeypatch.setattr(gemm, "plan_gemm", lambda *args, **kw: dataclasses.replace(
        planned(*args, **kw), prefetch=1, loaders=1))
    one = bl.matmul(a.path, b, tmp_path / "one.zarr", memory="20MiB", scheduler=scheduler)
    assert "loaders" not in one.report["plan"]
    got = two.to_numpy()
    assert got.tobytes() == one.to_numpy().tobytes()
    # each entry a dot product of length k = 256 (Higham, eq. 3.13): gamma_k |A||B|
    u = np.finfo(np.float64).eps / 2
    assert np.all(np.abs(got - x @ b) <= 256 * u / (1 - 256 * u) * (np.abs(x) @ np.abs(b)))


@pytest.mark.parametrize("codec", ["zstd", "none"])
def test_two_loaders_on_an_object_store_give_the_bits_of_one(s3, tmp_path, monkeypatch, codec):
    """The thin product of a matrix on the loopback S3 server: decoded chunks (zstd) and range requests
    (uncompressed chunks) are not local direct reads, so two loaders are planned there too; the bits
    are those of one loader and of the same product from local files."""
    import dataclasses

    import blocklin.linalg.products.gemm as gemm

    monkeypatch.setattr("blocklin.linalg.products.thin.THIN_MAX_COLUMNS", 0)  # the tiles this test is about
    base, opts = s3
    rng = np.random.default_rng(12)
    x = rng.standard_normal((12288, 256))
    b = rng.standard_normal((256, 4))
    remote = bl.from_array(x, f"{base}/a.zarr", chunks=(1024, 256), codec=codec, storage_options=opts)
    local = bl.from_array(x, tmp_path / "a.zarr", chunks=(1024, 256), codec=codec)
    two = bl.matmul(remote, b, memory="20MiB", scheduler="threads", storage_options=opts)
    assert two.report["plan"]["loaders"] == 2
    planned = gemm.plan_gemm
    monkeypatch.setattr(gemm, "plan_gemm", lambda *args, **kw: dataclasses.replace(
        planned(*args, **kw), prefetch=1, loaders=1))
    one = bl.matmul(remote, b, memory="20MiB", scheduler="threads", storage_options=opts)
    assert "loaders" not in one.report["plan"]
    monkeypatch.setattr(gemm, "plan_gemm", planned)
    here = bl.matmul(local.path, b, tmp_path / "c.zarr", memory="20MiB", scheduler="threads")
    got = two.to_numpy()
    assert got.tobytes() == one.to_numpy().tobytes()
    # local files plan their own tiles: within the bound of every blocked sum of length k = 256
    u = np.finfo(np.float64).eps / 2
    bound = 256 * u / (1 - 256 * u) * (np.abs(x) @ np.abs(b))
    assert np.all(np.abs(got - x @ b) <= bound) and np.all(np.abs(here.to_numpy() - x @ b) <= bound)


@pytest.mark.parametrize("scheduler", ["sync", "threads"])
def test_row_pass_tasks_resolve_their_chunk_readers_once(tall, monkeypatch, scheduler):
    """A row pass's task resolves each local uncompressed input's chunk reader once and reads every
    strip through it, later passes too (``read_block`` parsed the array's metadata again for every
    strip); the strips and so the sums are those ``read_block`` gives."""
    x, a = tall
    ref, plan = _pass_states(a.path, scheduler)  # a first pass (with its peaks), in a job of its own
    resolved, through_block = [], []
    real_raw, real_block = passes.raw_access, passes.read_block
    monkeypatch.setattr(passes, "raw_access", lambda arr: (resolved.append(1), real_raw(arr))[1])
    monkeypatch.setattr(passes, "read_block", lambda *args, **kw: (through_block.append(1), real_block(*args, **kw))[1])
    with Job("feed-test", memory="96KiB", scheduler=scheduler, workers=2) as job:
        op = job.operand(a.path, "a")
        first, _ = run_pass(job, _column_sums, [source(op)], check_finite=False, min_tasks=8)
        later, plan = run_pass(job, _column_sums, [source(op)], check_finite=False, min_tasks=8)
    tasks = len(passes.group_runs(plan, scheduler))
    strips = sum(len(plan.strips(g)) for g in range(len(plan.groups)))
    assert strips > 4 * tasks and len(resolved) == 2 * tasks and not through_block
    # the same bits as strips read through read_block
    monkeypatch.setattr(passes, "_direct_into", lambda raw, arr, out: False)
    with Job("feed-test", memory="96KiB", scheduler=scheduler, workers=2) as job:
        op = job.operand(a.path, "a")
        job.peaks[str(a.path)], job.amax[str(a.path)] = np.abs(x).max(axis=0), float(np.abs(x).max())
        blocks, _ = run_pass(job, _column_sums, [source(op)], check_finite=False, min_tasks=8)
    assert through_block
    for s, t, u, v in zip(ref, first, later, blocks):
        np.testing.assert_array_equal(s, t)
        np.testing.assert_array_equal(t, u)
        np.testing.assert_array_equal(u, v)
    # and the stored data's: float32 sums within recursive summation's bound n u sum |x| (Higham, 2002, 4.2)
    exact = x.astype(np.float64).sum(axis=0)
    assert (np.abs(sum(later) - exact) <= len(x) * 2.0**-24 * np.abs(x).astype(np.float64).sum(axis=0)).all()


@pytest.fixture
def narrow(tmp_path):
    """Chunks one array wide (the layout a first pass reads a piece at a time), a short last chunk row."""
    return _normals_stored(tmp_path / "n.zarr", (700, 24), (256, 24), 5)


@pytest.mark.parametrize("rows,step", [((0, 700), 64), ((30, 600), 100), ((250, 260), 3), ((512, 700), 1000)])
def test_pieces_read_the_rows_a_piece_at_a_time_opening_each_chunk_once(narrow, monkeypatch, rows, step):
    """``RawChunks.pieces`` fills ``out`` with the stored rows, yields each piece once it is in (at most
    ``step`` rows, never across a chunk), and opens each chunk file once for all its pieces."""
    x, arr = narrow
    raw = rawchunks.raw_access(arr)
    r0, r1 = rows
    out = np.full((r1 - r0, 24), np.nan)
    assert raw.reads_pieces(slice(0, 24), out)
    opened, real_open = [], rawchunks.os.open
    monkeypatch.setattr(rawchunks.os, "open", lambda path, *a: (opened.append(path), real_open(path, *a))[1])
    seen = []
    for a, b in raw.pieces(slice(r0, r1), out, step):
        seen.append((a, b))
        np.testing.assert_array_equal(out[a:b], x[r0 + a:r0 + b])  # in place when yielded
        assert b - a <= step and (r0 + a) // 256 == (r0 + b - 1) // 256
    assert [a for a, _ in seen] == [0] + [b for _, b in seen[:-1]] and seen[-1][1] == r1 - r0
    np.testing.assert_array_equal(out, x[r0:r1])
    chunk_rows = sorted({r // 256 for r in range(r0, r1)})
    assert len(opened) == len(set(opened)) == len(chunk_rows)


def test_pieces_of_a_missing_chunk_are_the_fill_value_and_a_short_one_is_named(tmp_path):
    x = np.arange(600 * 8, dtype=np.float64).reshape(600, 8)
    import zarr

    arr = zarr.create_array(str(tmp_path / "m.zarr"), shape=x.shape, dtype="float64", chunks=(200, 8),
                            fill_value=-2.5, compressors=None)
    arr[...] = x
    root = tmp_path / "m.zarr"
    (root / "c" / "1" / "0").unlink()
    raw = rawchunks.raw_access(arr)
    out = np.empty((600, 8))
    list(raw.pieces(slice(0, 600), out, 64))
    np.testing.assert_array_equal(out[:200], x[:200])
    assert (out[200:400] == -2.5).all()
    np.testing.assert_array_equal(out[400:], x[400:])
    short = root / "c" / "2" / "0"
    short.write_bytes(short.read_bytes()[:1000])
    with pytest.raises(StoreReadError, match=r"c[/\\]2[/\\]0"):
        list(raw.pieces(slice(0, 600), out, 64))


def test_pieces_only_where_the_strip_is_the_chunks_whole_width(wide, narrow):
    """Arrays several chunks wide, column ranges, strided or recast destinations use ``read`` instead."""
    _, w = wide
    _, n = narrow
    raw_w, raw_n = rawchunks.raw_access(w), rawchunks.raw_access(n)
    assert not raw_w.reads_pieces(slice(0, 300), np.empty((10, 300)))
    assert raw_n.reads_pieces(slice(None), np.empty((10, 24)))
    assert not raw_n.reads_pieces(slice(0, 12), np.empty((10, 12)))
    assert not raw_n.reads_pieces(slice(0, 24), np.empty((10, 48))[:, ::2])
    assert not raw_n.reads_pieces(slice(0, 24), np.empty((10, 24), dtype=np.float32))


def test_first_pass_over_a_short_chunk_names_it(tmp_path):
    """A chunk cut short on disk, read a piece at a time by a job's first pass: refused, the chunk named."""
    x = np.random.default_rng(6).standard_normal((600, 12))
    a = bl.from_array(x, tmp_path / "x.zarr", chunks=(100, 12))
    chunk = tmp_path / "x.zarr" / "c" / "3" / "0"
    chunk.write_bytes(chunk.read_bytes()[:500])
    with Job("feed-test", memory="64KiB", check_finite=False) as job:
        op = job.operand(a.path, "a")
        with pytest.raises(StoreReadError, match=r"c[/\\]3[/\\]0"):
            run_pass(job, _column_sums, [source(op)], min_tasks=3, check_finite=False)


@pytest.mark.parametrize("dtype", ["float64", "complex64"])
def test_first_pass_peaks_of_compressed_chunks_are_taken_as_each_chunk_lands(tmp_path, monkeypatch, dtype):
    """A first pass over compressed chunks takes each chunk's part's peaks in the thread that decoded it
    (never a whole strip of several chunks), merged across the chunks of a strip's width: the job's
    peaks are the exact ``max |x|`` of each column (``max(|Re|, |Im|)``), NaN and Inf included."""
    monkeypatch.setattr(rawchunks, "DECODE_THREADS", 3)
    rng = np.random.default_rng(8)
    x = rng.standard_normal((600, 30)) * np.logspace(-4, 4, 30)
    if dtype == "complex64":
        x = x + 1j * rng.standard_normal((600, 30))[:, ::-1] * np.logspace(-4, 4, 30)
    x = x.astype(dtype)
    x[123, 4] = -np.inf
    x[444, 17] = np.nan
    x[599, 29] = 7e4  # the last row of the last chunk across
    a = bl.from_array(x, tmp_path / "x.zarr", chunks=(50, 8), codec="zstd")
    scanned = []
    real = passes._column_peaks
    monkeypatch.setattr(passes, "_column_peaks", lambda v: (scanned.append(v.shape), real(v))[1])
    with Job("feed-test", memory="1MiB", check_finite=False) as job:
        op = job.operand(a.path, "a")
        job.column_peaks.add(str(a.path))  # as an SVD asks (lowrank.run)
        rows, plan = run_pass(job, _rows_seen, [source(op)], min_tasks=2, check_finite=False)
        peaks = job.peaks[str(a.path)]
    assert sum(rows) == 600 and plan.strip > 50 and scanned
    assert max(r for r, _ in scanned) <= 50 and max(c for _, c in scanned) <= 8  # chunk parts, never a strip
    ref = np.maximum(np.abs(x.real), np.abs(x.imag)).astype(np.float64).max(axis=0)
    np.testing.assert_array_equal(peaks, ref)
    assert peaks[4] == np.inf and np.isnan(peaks[17])


def test_first_pass_over_a_damaged_compressed_chunk_names_it(tmp_path, monkeypatch):
    """A damaged zstd chunk decoded by a first pass (peaks taken as chunks land): refused, the chunk named."""
    monkeypatch.setattr(rawchunks, "DECODE_THREADS", 2)
    x = np.random.default_rng(10).standard_normal((400, 24))
    a = bl.from_array(x, tmp_path / "x.zarr", chunks=(50, 8), codec="zstd")
    chunk = tmp_path / "x.zarr" / "c" / "5" / "1"
    data = bytearray(chunk.read_bytes())
    data[10:30] = b"\xff" * 20
    chunk.write_bytes(bytes(data))
    with Job("feed-test", memory="1MiB", check_finite=False) as job:
        op = job.operand(a.path, "a")
        with pytest.raises(StoreReadError, match=r"chunk c/5/1 of .*x.zarr"):
            run_pass(job, _rows_seen, [source(op)], min_tasks=2, check_finite=False)


def test_a_first_pass_interrupted_between_pieces_closes_its_chunk_file(narrow, monkeypatch):
    """Ctrl-C while a piece's peaks are taken: the chunk file the strip's pieces read from is closed."""
    _, arr = narrow
    raw = rawchunks.raw_access(arr)
    opened, closed = [], []
    real_open, real_close = rawchunks.os.open, rawchunks.os.close
    monkeypatch.setattr(rawchunks.os, "open", lambda *a: (lambda fd: (opened.append(fd), fd)[1])(real_open(*a)))
    monkeypatch.setattr(rawchunks.os, "close", lambda fd: (closed.append(fd), real_close(fd))[1])
    calls = [0]
    real_peaks = passes._column_peaks

    def peaks(v):
        calls[0] += 1
        if calls[0] == 3:  # the second piece of the first chunk
            raise KeyboardInterrupt
        return real_peaks(v)

    monkeypatch.setattr(passes, "_column_peaks", peaks)
    monkeypatch.setattr(passes, "PEAK_PIECE_BYTES", 64 * 24 * 8)
    with pytest.raises(KeyboardInterrupt):
        passes._read_with_peaks(arr, slice(0, 512), slice(0, 24), np.empty((512, 24)), raw)
    assert opened and sorted(opened) == sorted(closed)
