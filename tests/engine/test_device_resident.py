"""Operands kept on the device (blocklin/device/resident.py) on the CuPy stand-in.

Every run is compared with the streamed run of the same plan (the cache turned off through
``resident.ENABLED``: the same tiles and strips, every block read from storage each time): the bits
must be identical, the stored blocks read once where they stay resident, fewer bytes read where a
smaller cache reuses some, every device byte freed when the job ends, and the cache's bytes within
``device_memory``. Products and singular values are also checked against NumPy.
"""

from __future__ import annotations

import collections
import gc
import threading

import numpy as np
import pytest

from support import cupy_standin

import blocklin as bl
from blocklin.config import parse_size
from blocklin.device import resident
from blocklin.device.cuda import CudaDevice, DeviceBudget
from blocklin.device.resident import DeviceCache
from blocklin.plan.gemm import plan_gemm
from support.tolerances import assert_product, assert_singular_values

SCHEDULERS = [("sync", 1), ("threads", 2)]


@pytest.fixture
def reads(monkeypatch):
    """Every block read from storage by a GEMM tile or a row pass: ``(array shape, rows, cols) -> count``."""
    import blocklin.runtime.passes as passes
    import blocklin.runtime.tiles as tiles

    seen: collections.Counter = collections.Counter()
    for mod in (tiles, passes):
        real = mod.read_block

        def counted(arr, rows, cols, *args, _real=real, **kw):
            seen[(tuple(arr.shape), rows.start, rows.stop, cols.start, cols.stop)] += 1
            return _real(arr, rows, cols, *args, **kw)

        monkeypatch.setattr(mod, "read_block", counted)
    # a row pass reads local uncompressed strips through its task's chunk reader, a first pass a piece
    # at a time with their peaks (each piece through _read_direct too: counted once, as its strip)
    real_peaks, real_direct = passes._read_with_peaks, passes._read_direct
    inside = threading.local()

    def counted_with_peaks(arr, rows, cols, out, raw=None, peaks_of=None):
        seen[(tuple(arr.shape), rows.start, rows.stop, cols.start, cols.stop)] += 1
        inside.peaks = True
        try:
            return real_peaks(arr, rows, cols, out, raw, peaks_of)
        finally:
            inside.peaks = False

    def counted_direct(arr, raw, rows, cols, out):
        if not getattr(inside, "peaks", False):
            seen[(tuple(arr.shape), rows.start, rows.stop, cols.start, cols.stop)] += 1
        return real_direct(arr, raw, rows, cols, out)

    monkeypatch.setattr(passes, "_read_with_peaks", counted_with_peaks)
    monkeypatch.setattr(passes, "_read_direct", counted_direct)
    return seen


def _streamed(monkeypatch, fn):
    """``fn()`` with the device cache off (the same plan, streamed), then on again."""
    monkeypatch.setattr(resident, "ENABLED", False)
    try:
        return fn()
    finally:
        monkeypatch.setattr(resident, "ENABLED", True)


def _nothing_left(device_memory: str) -> None:
    """No device byte allocated after the job, the cache empty, and its bytes were within the budget."""
    budget = DeviceBudget.of(0)
    assert cupy_standin.STATE.device_used == 0 and cupy_standin.STATE.device_cached == 0
    assert budget.held == 0 and budget.cached == 0
    assert all(not c.entries and c.bytes == 0 for c in DeviceCache.all())
    assert all(not inst._held for inst in CudaDevice.instances())
    assert 0 < cupy_standin.STATE.device_peak <= parse_size(device_memory)
    assert budget.peak <= parse_size(device_memory)
    assert cupy_standin.take_races() == []


def _operands(tmp_path, m=256, k=192, n=224, chunks=(32, 32)):
    rng = np.random.default_rng(3)
    a, b = rng.standard_normal((m, k)), rng.standard_normal((k, n))
    return a, b, bl.from_array(a, tmp_path / "a.zarr", chunks=chunks), bl.from_array(b, tmp_path / "b.zarr", chunks=chunks)


# -- GEMM -----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("scheduler, workers", SCHEDULERS)
def test_gemm_with_a_and_b_resident_reads_each_panel_once(standin, tmp_path, monkeypatch, reads, scheduler,
                                                           workers):
    a, b, A, B = _operands(tmp_path)
    opts = dict(device="gpu", memory="256KiB", device_memory="2MiB", scheduler=scheduler, workers=workers)
    plan = bl.matmul(A, B, explain=True, **opts)
    assert plan.resident and plan.n_tasks > workers, plan  # several tiles per run share the panels
    assert plan.cache_bytes >= a.nbytes + b.nbytes and plan.device_peak <= parse_size("2MiB")
    assert "A and B resident on the device" in plan.explain()
    cupy_standin.STATE.device_peak = 0
    c = bl.matmul(A, B, tmp_path / "c.zarr", **opts)
    _nothing_left("2MiB")
    kept = dict(reads)
    reads.clear()
    ref = _streamed(monkeypatch, lambda: bl.matmul(A, B, tmp_path / "s.zarr", **opts))
    assert np.array_equal(c.to_numpy(), ref.to_numpy())  # the same panels, the same sums
    assert_product(c.to_numpy(), a @ b, a, b)
    r, s = c.report, ref.report
    assert r["plan"] == s["plan"]
    # every panel read once by each run that needs it (a run keeps its own: one run reads A and B
    # once in all), as planned
    assert max(kept.values()) <= workers and r["bytes_read"] == plan.bytes_read
    if workers == 1:
        assert max(kept.values()) == 1 and r["bytes_read"] == a.nbytes + b.nbytes
    assert max(reads.values()) > 1  # streamed: a panel read by every tile that needs it
    assert r["bytes_read"] + r["bytes_device_cache"] == s["bytes_read"] and s["bytes_device_cache"] == 0
    assert 0 < r["device_resident"] <= plan.cache_bytes


@pytest.mark.parametrize("scheduler, workers", SCHEDULERS)
def test_out_of_core_gemm_reuses_what_a_smaller_cache_holds(standin, tmp_path, monkeypatch, scheduler, workers):
    """A device budget below the operands: the planner keeps a cache of panels beside the tiles, the run
    reads less than the streamed run of the same plan, and the bits are the same."""
    a, b, A, B = _operands(tmp_path, m=384, k=256, n=320)
    opts = dict(device="gpu", memory="512KiB", device_memory="1MiB", scheduler=scheduler, workers=workers)
    plan = bl.matmul(A, B, explain=True, **opts)
    assert not plan.resident and 0 < plan.cache_bytes < a.nbytes + b.nbytes, plan
    assert "operand cache" in plan.explain()
    cupy_standin.STATE.device_peak = 0
    c = bl.matmul(A, B, tmp_path / "c.zarr", **opts)
    _nothing_left("1MiB")
    ref = _streamed(monkeypatch, lambda: bl.matmul(A, B, tmp_path / "s.zarr", **opts))
    assert np.array_equal(c.to_numpy(), ref.to_numpy())
    assert_product(c.to_numpy(), a @ b, a, b)
    r, s = c.report, ref.report
    assert r["bytes_read"] < s["bytes_read"] and r["bytes_read"] + r["bytes_device_cache"] == s["bytes_read"]
    if scheduler == "sync":  # one run: the planner's least-recently-used count is exact
        assert r["bytes_read"] == plan.bytes_read


def test_gemm_plans_prefer_residency_and_count_the_cache_in_the_device_budget():
    """Tiles bound by the host budget (8 x 8 of them): the device budget left beside them keeps the
    panels, whole (each operand read once) or in part (fewer reads than streamed); a CPU plan (and
    its resume token) has no cache fields."""
    mib, whole = 1 << 20, 2 * 2048 * 2048 * 8

    def plan(**kw):
        return plan_gemm(2048, 2048, 2048, np.float64, a_chunks=(256, 256), b_chunks=(256, 256), memory=8 * mib,
                         workers=1, **kw)

    cpu = plan()
    assert cpu.grid == (8, 8) and cpu.bytes_read == 8 * whole
    assert cpu.cache_bytes == 0 and "cache_bytes" not in cpu.to_dict() and "resident" not in cpu.to_dict()
    big = plan(device="gpu", device_memory=96 * mib)
    assert big.resident and big.bytes_read == whole and whole <= big.cache_bytes <= big.device_peak <= 96 * mib
    small = plan(device="gpu", device_memory=16 * mib)
    assert not small.resident and 0 < small.cache_bytes and small.device_peak <= 16 * mib
    assert whole < small.bytes_read < cpu.bytes_read


# -- row passes of iterative methods ---------------------------------------------------------------------
def _low_rank(m=3000, n=60, r=12, seed=4):
    rng = np.random.default_rng(seed)
    u, _ = np.linalg.qr(rng.standard_normal((m, r)))
    v, _ = np.linalg.qr(rng.standard_normal((n, r)))
    return (u * (2.0 ** -np.arange(r))) @ v.T


@pytest.mark.parametrize("method", ["rsvd", "lanczos"])
@pytest.mark.parametrize("scheduler, workers", SCHEDULERS)
def test_iterative_svd_passes_take_a_from_the_device(standin, tmp_path, monkeypatch, reads, method, scheduler,
                                                     workers):
    """The power iterations of rsvd and the steps of block Lanczos read A's strips once; later passes
    with the same strips take them from the device: the same bits as the streamed run."""
    a = _low_rank()
    A = bl.from_array(a, tmp_path / "a.zarr", chunks=(250, 60))
    opts = dict(method=method, seed=2, memory="512KiB", device="gpu", device_memory="8MiB", scheduler=scheduler,
                workers=workers)
    cupy_standin.STATE.device_peak = 0
    got = bl.svd(A, 5, **opts)
    _nothing_left("8MiB")
    kept = {key: n for key, n in reads.items() if key[0] == a.shape}
    reads.clear()
    ref = _streamed(monkeypatch, lambda: bl.svd(A, 5, **opts))
    streamed = {key: n for key, n in reads.items() if key[0] == a.shape}
    for x, y in zip(got, ref):  # U (a Matrix), s, Vt
        assert np.array_equal(np.asarray(x[...]), np.asarray(y[...]))
    r, s = got.U.report, ref.U.report
    assert r["passes"] == s["passes"] >= 3
    assert max(kept.values()) == 1 < max(streamed.values())  # each strip of A read once, not once a pass
    assert 0 < r["bytes_device_cache"] and r["bytes_read"] + r["bytes_device_cache"] == s["bytes_read"]
    assert r["device_resident"] >= a.nbytes
    exact = np.linalg.svd(a, compute_uv=False)[:5]
    assert_singular_values(got[1], exact, n=a.shape[0])


# -- the cache is the job's -----------------------------------------------------------------------------
def test_a_job_never_reads_blocks_of_an_input_changed_since_the_last_job(standin, tmp_path, monkeypatch):
    """Two jobs on one input rewritten in place between them (same path, shape and chunks): the second
    job's singular values are the new matrix's, bit for bit those of its streamed run."""
    a = _low_rank()
    path = tmp_path / "a.zarr"
    opts = dict(method="rsvd", seed=2, memory="512KiB", device="gpu", device_memory="8MiB")
    bl.from_array(a, path, chunks=(250, 60))
    first = bl.svd(path, 5, **opts)
    assert first.U.report["bytes_device_cache"] > 0
    assert all(not c.entries for c in DeviceCache.all())  # freed when the job ended
    b = 3.0 * _low_rank(seed=5)
    bl.from_array(b, path, chunks=(250, 60), overwrite=True)
    second = bl.svd(path, 5, **opts)
    ref = _streamed(monkeypatch, lambda: bl.svd(path, 5, **opts))
    assert np.array_equal(second[1], ref[1])
    assert_singular_values(second[1], np.linalg.svd(b, compute_uv=False)[:5], n=b.shape[0])
    assert second.U.report["bytes_read"] >= b.nbytes  # read from storage again


def test_cache_keeps_its_blocks_within_its_limit_and_the_budget_least_recently_used_first(standin):
    """Admissions evict the oldest idle block; a block a task still reads is never evicted; a task that
    does not fit beside the cache evicts idle blocks before it runs; everything is freed at the end."""
    dev = CudaDevice.current(device_memory=4096)
    cache = DeviceCache.of(dev.device_id)
    budget = DeviceBudget.of(dev.device_id)

    def put(key, fill):
        e = cache.admit(key, 1000, limit=3072, budget=4096)
        if e is None:
            return None
        with dev.compute:
            arr = standin.full((125,), fill)
        ev = standin.cuda.Event(disable_timing=True)
        ev.record(dev.compute)
        cache.fill(e, arr, ev, checked=True)
        cache.unpin(e, None, dev)
        return e

    for i in range(3):
        assert put(("s", i), float(i)) is not None
    assert cache.bytes == budget.cached == 3 * 1024  # counted as CuPy's pool allocates (512-byte units)
    pinned = cache.lookup(("s", 0))  # now the most recently used, and held by a reader
    assert pinned is not None and float(pinned.array.get(stream=dev.compute)[0]) == 0.0
    put(("s", 3), 3.0)  # over the limit: the oldest idle block goes (1), not the pinned one
    assert set(cache.entries) == {("s", 0), ("s", 2), ("s", 3)}
    assert cache.lookup(("s", 1)) is None
    with dev.reserve(2048):  # a task beside three cached blocks in a 4 KiB budget: idle ones evicted
        assert budget.held + budget.cached <= 4096 and ("s", 0) in cache.entries
    cache.unpin(pinned, None, dev)
    CudaDevice.release_all()
    assert not cache.entries and budget.cached == 0 and cupy_standin.STATE.device_used == 0
    assert cupy_standin.take_races() == []


def test_a_non_finite_panel_fails_the_job_and_frees_the_cache(standin, tmp_path):
    """With the panels kept on the device each is read once, and checked as it is read: a NaN fails the
    job with its position, and the failed job leaves no device bytes and no cached block behind."""
    a, b, A, B = _operands(tmp_path)
    a[200, 100] = np.nan
    A = bl.from_array(a, tmp_path / "nan.zarr", chunks=(32, 32))
    opts = dict(device="gpu", memory="256KiB", device_memory="2MiB")
    assert bl.matmul(A, B, explain=True, **opts).resident
    with pytest.raises(bl.errors.NonFiniteError, match=r"\[200, 100\]") as info:
        bl.matmul(A, B, tmp_path / "c.zarr", **opts)
    del info  # its traceback's frames hold the task's device arrays
    gc.collect()
    assert cupy_standin.STATE.device_used == 0 and DeviceBudget.of(0).cached == 0
    assert all(not c.entries for c in DeviceCache.all())
    assert cupy_standin.take_races() == []
