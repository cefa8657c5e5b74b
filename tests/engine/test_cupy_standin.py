"""The CuPy stand-in itself, and the CUDA device bugs it catches.

The first half checks that the stand-in models CuPy's contracts and CUDA's ordering adversarially
(lazy streams, vector-clock race reports with both call sites, pinned-buffer checks, legacy-stream
rules). The second half drives ``CudaDevice``/``TileStream`` and the operations through it; each of
those tests failed on the stand-in before the bug it names was fixed.
"""

from __future__ import annotations

import numpy as np
import pytest

from support import cupy_standin

import blocklin as bl
from blocklin.device import TileStream, get_device
from support.tolerances import assert_gram, assert_product




# -- the stand-in's model ----------------------------------------------------------------------------
def test_queued_work_runs_only_when_forced(standin):
    cp = standin
    s = cp.cuda.Stream(non_blocking=True)
    host = np.arange(6.0).reshape(2, 3)
    d = cp.empty((2, 3))
    d.set(host, stream=s)
    with s:
        d *= 2.0
    # nothing forced the stream: the buffer still holds what cudaMalloc left
    assert not s.done
    assert np.array_equal(d.get(stream=s), 2 * host)  # a blocking get forces the stream
    assert s.done and cupy_standin.take_races() == []


def test_event_wait_forces_the_other_stream_and_orders_it(standin):
    cp = standin
    h2d, comp = cp.cuda.Stream(non_blocking=True), cp.cuda.Stream(non_blocking=True)
    d = cp.empty((4,))
    d.set(np.ones(4), stream=h2d)
    ev = cp.cuda.Event()
    ev.record(h2d)
    comp.wait_event(ev)
    with comp:
        d += 1.0
    comp.synchronize()  # forces the upload it depends on first
    assert h2d.done
    assert np.array_equal(d.get(stream=comp), np.full(4, 2.0))
    assert cupy_standin.take_races() == []


def test_unordered_cross_stream_access_is_reported_with_both_sites(standin):
    cp = standin
    h2d, comp = cp.cuda.Stream(non_blocking=True), cp.cuda.Stream(non_blocking=True)
    d = cp.empty((4,))
    d.set(np.ones(4), stream=h2d)  # line A
    with comp:
        d *= 3.0  # line B: no event between the streams
    found = cupy_standin.take_races()
    assert len(found) == 1
    assert "write" in found[0] and "test_cupy_standin.py" in found[0]
    assert found[0].count("test_cupy_standin.py") >= 2  # both call sites


def test_disjoint_rows_of_one_buffer_do_not_race(standin):
    cp = standin
    a, b = cp.cuda.Stream(non_blocking=True), cp.cuda.Stream(non_blocking=True)
    d = cp.zeros((4, 3))
    cp.cuda.Device().synchronize()
    d[:2].set(np.ones((2, 3)), stream=a)
    d[2:].set(np.ones((2, 3)), stream=b)
    assert cupy_standin.take_races() == []


def test_non_blocking_streams_are_unordered_with_the_legacy_stream(standin):
    cp = standin
    s = cp.cuda.Stream(non_blocking=True)
    d = cp.empty((3,))
    d.set(np.ones(3), stream=s)
    d.get()  # legacy stream: no ordering with s
    assert len(cupy_standin.take_races()) == 1
    blocking = cp.cuda.Stream()  # a blocking stream is ordered with the legacy one
    e = cp.empty((3,))
    e.set(np.ones(3), stream=blocking)
    assert np.array_equal(e.get(), np.ones(3))
    assert cupy_standin.take_races() == []


def test_host_writing_a_pinned_buffer_before_its_copy_ran_is_reported(standin):
    import cupyx

    cp = standin
    s = cp.cuda.Stream(non_blocking=True)
    buf = cupyx.empty_pinned((5,), dtype=np.float64)
    buf[...] = 1.0
    d = cp.empty((5,))
    d.set(buf, stream=s)
    buf[...] = 2.0  # refilled while the copy may still be queued
    s.synchronize()
    found = cupy_standin.take_races()
    assert len(found) == 1 and "pinned" in found[0]
    # pageable memory is staged at the call, so the same pattern is safe there
    page = np.ones(5)
    d.set(page, stream=s)
    page[...] = 7.0
    assert np.array_equal(d.get(stream=s), np.ones(5)) and cupy_standin.take_races() == []


def test_async_download_leaves_garbage_until_forced(standin):
    import cupyx

    cp = standin
    s = cp.cuda.Stream(non_blocking=True)
    with s:
        d = cp.asarray(np.arange(4.0))
    out = cupyx.empty_pinned((4,), dtype=np.float64)
    d.get(stream=s, out=out, blocking=False)
    assert np.isnan(out).all()
    s.synchronize()
    assert np.array_equal(out, np.arange(4.0)) and cupy_standin.take_races() == []


def test_copy_and_gemm_contracts_match_cupy(standin):
    cp = standin
    d = cp.empty((2, 3), dtype=np.float32)
    with pytest.raises(TypeError, match="float64 array cannot be set to float32 array"):
        d.set(np.ones((2, 3)))
    with pytest.raises(ValueError, match="Shape mismatch"):
        d.set(np.ones((3, 2), dtype=np.float32))
    with pytest.raises(RuntimeError, match="non-contiguous"):
        cp.empty((4, 4))[:, ::2].set(np.ones((4, 2)))
    with pytest.raises(TypeError, match="cannot be obtained"):
        d.get(out=np.empty((2, 3)))
    with pytest.raises(AssertionError):
        cp.cublas.gemm("N", "N", d, cp.empty((3, 2)), out=cp.empty((2, 2)))
    with pytest.raises(AssertionError):
        cp.cublas.gemm("N", "N", cp.empty((2, 3)), cp.empty((3, 2)), out=cp.empty((2, 3)))
    with pytest.raises(TypeError, match="Implicit conversion"):
        np.asarray(d)
    with pytest.raises(TypeError, match="numpy.ndarray"):
        d += np.ones((2, 3), dtype=np.float32)


def test_gemm_and_syrk_match_numpy(standin, rng):
    cp = standin
    a, b, c = rng.standard_normal((5, 4)), rng.standard_normal((4, 3)), rng.standard_normal((5, 3))
    out = cp.asarray(c)
    cp.cublas.gemm("N", "N", cp.asarray(a), cp.asarray(b), out=out, alpha=2.0, beta=1.0)
    # + beta C: one more rounding of each entry, at most eps ||C|| for the two computations
    assert_product(out.get(), 2 * a @ b + c, a, b, alpha=2.0, extra=np.finfo(np.float64).eps * np.linalg.norm(c))
    g = cp.cublas.syrk("T", cp.asarray(a), out=cp.zeros((4, 4)), lower=True)
    assert_gram(np.tril(g.get()), np.tril(a.T @ a), a)
    assert np.all(np.triu(g.get(), 1) == 0)  # the other triangle is not written
    assert cupy_standin.take_races() == []


def test_elapsed_time_follows_cuda_rules(standin):
    cp = standin
    s = cp.cuda.Stream(non_blocking=True)
    e0, e1 = cp.cuda.Event(), cp.cuda.Event()
    e0.record(s)
    e1.record(s)
    with pytest.raises(cupy_standin.CUDARuntimeError, match="NotReady"):
        cp.cuda.get_elapsed_time(e0, e1)
    e1.synchronize()
    assert cp.cuda.get_elapsed_time(e0, e1) >= 0
    with pytest.raises(cupy_standin.CUDARuntimeError, match="disable_timing"):
        quiet = cp.cuda.Event(disable_timing=True)
        quiet.record(s)
        quiet.synchronize()
        cp.cuda.get_elapsed_time(e0, quiet)


def test_free_memory_counts_the_pools_cache(standin):
    cp = standin
    free0, total = cp.cuda.runtime.memGetInfo()
    x = cp.empty((1 << 20,), dtype=np.uint8)
    del x
    free1, _ = cp.cuda.runtime.memGetInfo()
    assert free1 == free0 - (1 << 20)  # the pool keeps the freed block: cudaMemGetInfo sees it used
    assert cp.get_default_memory_pool().free_bytes() == 1 << 20


# -- CudaDevice and TileStream on the stand-in: the bugs of issue 10 ---------------------------------
def _panel_loader(k_panels: int, m: int, k: int, rng):
    full = rng.standard_normal((m, k * k_panels))

    def load(i, bufs):
        (buf,) = bufs
        view = buf.reshape(-1)[: m * k].reshape(m, k)
        view[...] = full[:, i * k:(i + 1) * k]
        return (view,)

    return full, load


@pytest.mark.parametrize("depth", [0, 1, 2])
def test_tile_stream_refills_pinned_slots_only_after_their_upload(standin, rng, depth):
    """Issue 10: the depth-0 stream refilled the pinned buffer while its upload could still run."""
    cp = standin
    dev = get_device("gpu")
    full, load = _panel_loader(5, 6, 4, rng)
    acc = dev.zeros((6, 6), np.float64)
    for _, (x,) in TileStream(dev, 5, load, [(6, 4)], "float64", depth=depth):
        dev.gemm_acc(acc, x, x.T)
    got = dev.download(acc, slice(0, 6))
    assert_gram(got, full @ full.T, full, trans=True)
    assert cupy_standin.take_races() == []


def test_two_tile_streams_on_one_thread_do_not_overlap(standin, rng):
    """Issue 10: the next stream overwrote device slots / pinned buffers the previous one still used."""
    dev = get_device("gpu")
    accs, fulls = [], []
    for _ in range(3):  # no blocking download between the streams
        full, load = _panel_loader(3, 4, 5, rng)
        acc = dev.zeros((4, 4), np.float64)
        for _, (x,) in TileStream(dev, 3, load, [(4, 5)], "float64", depth=1):
            dev.gemm_acc(acc, x, x.T)
        accs.append(acc)
        fulls.append(full)
    for acc, full in zip(accs, fulls):
        assert_gram(dev.download(acc, slice(0, 4)), full @ full.T, full, trans=True)
    assert cupy_standin.take_races() == []


@pytest.mark.parametrize("depth", [0, 1])
def test_a_stream_closed_at_an_item_orders_the_next_streams_upload_after_its_compute(standin, rng, depth):
    """A GEMM run closes its panel stream while the last tile's item is out (``items.close()``): that
    item's slot kept no record of its compute, and the thread's next stream, reusing the slots, uploaded
    into it unordered with that compute (CI's stand-in run, 2026-12-02)."""
    dev = get_device("gpu")
    full, load = _panel_loader(2, 4, 5, rng)
    acc = dev.zeros((4, 4), np.float64)
    items = iter(TileStream(dev, 2, load, [(4, 5)], "float64", depth=depth))
    for _, (x,) in items:
        dev.gemm_acc(acc, x, x.T)  # queued on compute, reading the slot; not waited for
        break
    items.close()
    first = full[:, :5]  # the panel the first stream handed out
    _, load2 = _panel_loader(1, 4, 5, rng)
    for _, (y,) in TileStream(dev, 1, load2, [(4, 5)], "float64", depth=depth):
        dev.gemm_acc(dev.zeros((4, 4), np.float64), y, y.T)
    assert cupy_standin.take_races() == []
    assert_gram(dev.download(acc, slice(0, 4)), first @ first.T, first, trans=True)


def test_non_contiguous_upload_is_ordered_with_compute(standin, rng):
    """Issue 10: the fallback upload ran on the legacy stream, unordered with the compute stream."""
    dev = get_device("gpu")
    host = rng.standard_normal((4, 6))
    dev.slots(1, [(4, 3)], np.float64)
    (x,) = dev.upload(0, (host[:, ::2],))
    acc = dev.zeros((4, 4), np.float64)
    dev.gemm_acc(acc, x, x.T)
    dev.after_use(0)
    assert_gram(dev.download(acc, slice(0, 4)), host[:, ::2] @ host[:, ::2].T, host[:, ::2], trans=True)
    assert cupy_standin.take_races() == []


@pytest.mark.parametrize("kind", ["cpu", "gpu"])
def test_zeroing_clears_nan_and_inf(standin, kind):
    """Issue 10: zeroing multiplied by 0, so NaN and Inf survived."""
    dev = get_device(kind)
    acc = dev.zeros((2, 3), np.float64)
    dev.axpby(acc, 1.0, np.array([[np.nan, np.inf, 1.0], [-np.inf, 2.0, np.nan]]), 1.0)
    dev.axpby(acc, 0.0, None, 0.0)
    assert np.array_equal(np.array(dev.download(acc, slice(0, 2))), np.zeros((2, 3)))
    assert cupy_standin.take_races() == []


def test_matmul_with_a_cast_operand_on_the_gpu(standin, tmp_path, rng):
    """Issue 10: a float32 operand computed in float64 crashed in ndarray.set (slots had the stored dtype)."""
    a = rng.standard_normal((40, 30)).astype(np.float32)
    b = rng.standard_normal((30, 20))
    res = bl.matmul(a, b, tmp_path / "c.zarr", dtype="float64", device="gpu", memory="256KiB",
                    device_memory="64KiB")
    ref = a.astype(np.float64) @ b
    # both operands exact in float64 (a is a rounded float32): float64 rounding of a length-30 dot
    assert np.abs(res.to_numpy() - ref).max() <= 30 * 4 * np.finfo(np.float64).eps * np.abs(ref).max()
    assert cupy_standin.take_races() == []


def test_stream_test_pattern_reading_on_the_legacy_stream_is_caught(standin):
    """Issue 10: the GPU stream test read uploads with x.get() on the legacy stream."""
    dev = get_device("gpu")

    def load(i, bufs):
        bufs[0][...] = i
        return bufs

    for _, (x,) in TileStream(dev, 3, load, [(2, 2)], "float64", depth=1):
        x.get()  # the old test's read: unordered with the upload stream
    assert cupy_standin.take_races()


def test_wide_solve_honours_device(standin, rng):
    """Issue 10: solve's wide path dropped ``device``, so its GEMMs ran wherever 'auto' pointed."""
    a = rng.standard_normal((20, 50))
    b = rng.standard_normal(20)
    cupy_standin.STATE.counts.clear()
    x = bl.solve(a, b, lam=0.1, device="cpu", memory="64KiB")
    assert cupy_standin.STATE.counts.get("cublas.gemm", 0) == 0  # CPU asked: the GPU stand-in stays idle
    ref = a.T @ np.linalg.solve(a @ a.T + 0.01 * np.eye(20), b)
    np.testing.assert_allclose(np.asarray(x.to_numpy() if hasattr(x, "to_numpy") else x).ravel(), ref,
                               rtol=1e-8, atol=1e-10)


# -- precision, overlap and resources ----------------------------------------------------------------
def test_tf32_only_inside_math_block_and_mode_restored(standin, rng):
    """``CUPY_TF32`` does not reach cublasSgemm; the device sets the cuBLAS math mode itself."""
    dev = get_device("gpu")
    k = 256
    a = rng.standard_normal((8, k)).astype(np.float32)
    b = rng.standard_normal((k, 8)).astype(np.float32)
    ref = a.astype(np.float64) @ b.astype(np.float64)
    scale = np.abs(a).astype(np.float64) @ np.abs(b).astype(np.float64)

    def run(precision):
        acc = dev.zeros((8, 8), np.float32)
        with dev.math(precision):
            dev.gemm_acc(acc, dev.to_device(a), dev.to_device(b))
        return float(np.max(np.abs(dev.download(acc, slice(0, 8)) - ref) / scale))

    fp32, tf32 = run(None), run("tf32")
    # float32: about k * 2^-24 at worst; TF32 rounds the inputs to 10 mantissa bits (2^-11 each)
    assert fp32 < k * 2.0**-24
    assert 2.0**-14 < tf32 < 4 * 2.0**-11
    assert cupy_standin.STATE.math_mode == 0  # the handle's mode is restored
    assert cupy_standin.take_races() == []


def test_download_async_lets_the_next_gemm_queue(standin, rng):
    import cupyx

    dev = get_device("gpu")
    x = rng.standard_normal((6, 5))
    acc = dev.zeros((6, 6), np.float64)
    xd = dev.to_device(x)
    dev.gemm_acc(acc[:3], xd[:3], xd.T)
    out = cupyx.empty_pinned((3, 6), dtype=np.float64)
    view, done = dev.download_async(acc, slice(0, 3), out=out)
    dev.gemm_acc(acc[3:], xd[3:], xd.T)  # queued while the copy of rows 0:3 is in flight
    assert not done.done and not dev.compute.done  # nothing forced either
    done.synchronize()
    assert_product(view, x[:3] @ x.T, x[:3], x.T)
    assert_product(dev.download(acc, slice(3, 6)), x[3:] @ x.T, x[3:], x.T)
    assert cupy_standin.take_races() == []


def test_pinned_memory_released_when_the_job_ends(standin, tmp_path, rng):
    a = rng.standard_normal((64, 48))
    b = rng.standard_normal((48, 32))
    res = bl.matmul(a, b, tmp_path / "c.zarr", device="gpu", memory="256KiB", device_memory="64KiB")
    assert_product(res.to_numpy(), a @ b, a, b)
    assert cupy_standin.pinned_bytes_held() == 0
    assert cupy_standin.take_races() == []


def test_device_budget_counts_the_pools_cached_blocks_as_ours(standin):
    cp = standin
    dev = get_device("gpu")
    before = dev.free_memory()
    x = cp.empty((1 << 20,), dtype=np.uint8)
    del x  # cached by the pool: cudaMemGetInfo calls it used, but this process can reuse it
    assert dev.free_memory() == before
    cupy_standin.STATE.others = 1 << 24  # another process takes 16 MiB
    assert dev.free_memory() == before - (1 << 24)


def test_device_budget_is_total_minus_what_other_processes_hold(standin):
    """Issue 10: the default budget shrank by this process's own live arrays (counted twice by the
    per-GPU DeviceBudget, which already holds the tasks' bytes)."""
    cp = standin
    dev = get_device("gpu")
    usable = dev.usable_memory()
    assert usable == dev.total_memory()  # nothing held by anyone
    live = cp.empty((1 << 20,), dtype=np.uint8)  # one of our tasks' arrays
    assert dev.usable_memory() == usable and dev.free_memory() == usable - (1 << 20)
    del live
    cupy_standin.STATE.others = 1 << 24  # another process takes 16 MiB
    assert dev.usable_memory() == usable - (1 << 24)
    from blocklin.runtime.job import Job

    with Job("test", device="gpu") as job:
        assert job.device_memory() == int(0.8 * (usable - (1 << 24)))


@pytest.mark.parametrize("kind", ["cpu", "gpu"])
@pytest.mark.parametrize("loaders", [1, 3])
def test_several_loaders_keep_order(standin, kind, loaders, rng):
    dev = get_device(kind)
    full, load = _panel_loader(9, 5, 3, rng)
    acc = dev.zeros((5, 5), np.float64)
    seen = []
    stream = TileStream(dev, 9, load, [(5, 3)], "float64", depth=3, loaders=loaders)
    for i, (x,) in stream:
        seen.append(i)
        dev.gemm_acc(acc, x, x.T)
    assert seen == list(range(9)) and stream.loaders == loaders
    assert_gram(np.array(dev.download(acc, slice(0, 5))), full @ full.T, full, trans=True)
    assert cupy_standin.take_races() == []


def test_device_modules_import_without_a_cycle():
    import subprocess
    import sys

    for mod in ("blocklin.device.cpu", "blocklin.device.cuda"):  # each first in a fresh interpreter
        subprocess.run([sys.executable, "-c", f"import {mod}"], check=True)


# -- dense operations on every device ----------------------------------------------------------------
def _tol(dtype) -> float:
    # backward-stable LAPACK/cuSOLVER kernels on well-conditioned 12 x 12 inputs: a few hundred eps
    return 500 * np.finfo(np.dtype(dtype)).eps


@pytest.mark.parametrize("kind", ["cpu", "gpu"])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_dense_operations_match_numpy(standin, kind, dtype, rng):
    dev = get_device(kind)
    tol = _tol(dtype)
    a = rng.standard_normal((30, 12)).astype(dtype)
    spd = (a.T.astype(np.float64) @ a + 12 * np.eye(12)).astype(dtype)
    b = rng.standard_normal((12, 3)).astype(dtype)
    h = dev.to_host
    da = dev.to_device(a)

    g = dev.zeros((12, 12), dtype)
    dev.syrk_acc(g, da)
    ref = a.T.astype(np.float64) @ a
    assert np.abs(h(g) - ref).max() <= tol * np.abs(ref).max()

    low = h(dev.cholesky(dev.to_device(spd)))
    assert np.allclose(np.triu(low, 1), 0)
    assert np.abs(low.astype(np.float64) @ low.T - spd).max() <= tol * np.abs(spd).max()

    x = h(dev.solve_triangular(dev.to_device(low), dev.to_device(b), lower=True))
    assert np.abs(low.astype(np.float64) @ x - b).max() <= tol * np.abs(low).max() * np.abs(x).max() * 12
    xt = h(dev.solve_triangular(dev.to_device(low), dev.to_device(b), lower=True, trans=True))
    assert np.abs(low.T.astype(np.float64) @ xt - b).max() <= tol * np.abs(low).max() * np.abs(xt).max() * 12

    q, r = (h(t) for t in dev.qr(da))
    assert q.shape == (30, 12) and np.allclose(np.tril(r, -1), 0)
    assert np.abs(q.astype(np.float64) @ r - a).max() <= tol * np.abs(a).max()
    assert np.abs(q.T.astype(np.float64) @ q - np.eye(12)).max() <= tol

    u, s, vt = (h(t) for t in dev.svd(da))
    np.testing.assert_allclose(s, np.linalg.svd(a.astype(np.float64), compute_uv=False), rtol=tol * 10)
    assert np.abs((u * s).astype(np.float64) @ vt - a).max() <= tol * 10 * np.abs(a).max()

    w, v = (h(t) for t in dev.eigh(dev.to_device(spd)))
    np.testing.assert_allclose(w, np.linalg.eigvalsh(spd.astype(np.float64)), rtol=tol * 10)
    assert np.abs((v * w).astype(np.float64) @ v.T - spd).max() <= tol * 10 * np.abs(spd).max()

    inv = h(dev.inv(dev.to_device(spd)))
    assert np.abs(spd.astype(np.float64) @ inv - np.eye(12)).max() <= tol * np.linalg.cond(spd.astype(np.float64))
    assert cupy_standin.take_races() == []


@pytest.mark.parametrize("kind", ["cpu", "gpu"])
def test_dense_failures_raise_on_every_device(standin, kind):
    from blocklin.errors import SingularMatrixError

    dev = get_device(kind)
    indefinite = np.diag([1.0, -1.0, 2.0])
    with pytest.raises(SingularMatrixError, match="positive definite"):
        dev.cholesky(dev.to_device(indefinite))
    with pytest.raises(SingularMatrixError, match="nonsingular"):
        dev.inv(dev.to_device(np.ones((3, 3))))
    assert cupy_standin.take_races() == []


@pytest.mark.slow  # the whole benchmark at its dry-run sizes (the slowest test of the default run before)
def test_gpu_check_runs_on_the_standin(standin, tmp_path, capsys):
    """benchmarks/gpu_check.py's code paths at small sizes: correctness, out-of-core GEMM, overlap, inverse."""
    import importlib.util
    import json
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu_check.py"
    spec = importlib.util.spec_from_file_location("gpu_check", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    rc = mod.main(["--dry-run", "--dir", str(tmp_path)])  # small sizes, on the GPU when one is visible
    lines = capsys.readouterr().out.strip().splitlines()
    summary = json.loads(lines[-1])  # one JSON summary, on the last line
    assert sum(line.startswith("{") for line in lines) == 1
    assert rc == 0 and summary["device"] == "gpu" and summary["correct"], [c for c in summary["checks"] if not c["ok"]]
    names = {c["check"] for c in summary["checks"]}
    assert {"gemm_acc", "gemm_acc_tf32", "syrk_acc", "cholesky", "qr", "svd", "eigh", "inv_leaf"} <= names
    # precision= of every operation that has one
    assert {"matmul float64 data, precision=float32", "matmul float64 data, precision=tf32", "inv precision=tf32",
            "solve assume_a='pos', precision=mixed", "solve assume_a='pos', precision=tf32"} <= names
    assert [g["compute_dtype"] for g in summary["gemm_precision"]] == ["float32", "float32"]
    assert all(g["rel_error_vs_float64"] < 1e-2 for g in summary["gemm_precision"])
    for p in ("double", "mixed", "tf32"):
        assert summary["solve"][p]["backward_error"] <= 16 * np.finfo(np.float64).eps
    assert summary["solve"]["tf32"]["factor_dtype"] == "float32"
    assert {"lu (P A = L U)", "solve_triangular", "solve assume_a='pos'", "pca k=4", "svd sketch k=5 (in core)",
            "svd rsvd k=5 (streamed)", "solve tall, normal equations (Gram SYRK pass)"} <= names
    # every public operation says where it ran: on the GPU, but for LU's panel getrf (also in the
    # mixed-precision inverse, which takes the LU route) and for the read-bound passes that 'auto'
    # keeps on the CPU (none here: the check asks for device='gpu')
    lu_inv = {"LU panel updates (TRSM, GEMM)": "gpu", "LU panel factorization (getrf)": "cpu",
              "rows of the inverse and residual probes": "cpu", "Newton-Schulz steps": "gpu"}
    assert summary["phases_elsewhere"] == {"lu (P A = L U)": {"panel updates (TRSM, GEMM)": "gpu",
                                                               "panel factorization (getrf)": "cpu"},
                                           "inv precision=mixed": lu_inv, "inv precision=tf32": lu_inv}
    for g in summary["gemm"]:
        assert 0 < g["busy_fraction"] <= 1 and g["rel_error"] < 1e-4
        assert g["plan"]["n_tasks"] * g["plan"]["k_steps"] > 1  # really out of core: tiles and k-panels
    assert summary["inverse"]["mixed"]["backward_error"] < 1e-12
    assert summary["inverse"]["tf32"]["backward_error"] < 1e-12
    assert cupy_standin.take_races() == []


def test_gemm_downloads_overlap_the_next_strips_gemm(standin, tmp_path, rng):
    """Issue 10: each download was waited for before the next strip's GEMM was queued."""
    a = rng.standard_normal((256, 64))
    b = rng.standard_normal((64, 48))
    c0 = rng.standard_normal((256, 48))
    cupy_standin.STATE.counts.clear()
    res = bl.matmul(bl.from_array(a, tmp_path / "a.zarr", chunks=(32, 32)), b, tmp_path / "c.zarr", c=c0,
                    beta=2.0, device="gpu", memory="192KiB", device_memory="128KiB")
    ref = a @ b + 2 * c0
    assert np.abs(res.to_numpy() - ref).max() <= 4 * 64 * np.finfo(np.float64).eps * np.abs(ref).max()
    strips = cupy_standin.STATE.counts.get("d2h copy", 0)
    assert strips > 2
    # every strip's copy but the last of each tile ran while a later GEMM was already queued
    assert cupy_standin.STATE.counts.get("d2h copy overlapping queued gemm", 0) >= strips // 2
    assert cupy_standin.take_races() == []


# -- operations wired to the device ------------------------------------------------------------------
@pytest.mark.parametrize("source_dtype", ["float64", "float32"])
def test_tall_solve_passes_run_on_the_gpu(standin, rng, source_dtype):
    """Issue 10: tall/square solve was hard-coded to the CPU."""
    a = rng.standard_normal((400, 30)).astype(source_dtype)
    b = rng.standard_normal((400, 2)).astype(source_dtype)
    lam = 0.5
    cupy_standin.STATE.counts.clear()
    x = bl.solve(a, b, lam=lam, method="normal", refine=1, device="gpu", memory="256KiB")
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    ref = np.linalg.solve(a64.T @ a64 + lam**2 * np.eye(30), a64.T @ b64)
    # cond(A^T A + lam^2 I) is about 4: solved in float64 and stored in the inputs' dtype, so a few
    # hundred eps of the output dtype
    assert np.abs(x.to_numpy() - ref).max() <= 1e3 * np.finfo(np.dtype(source_dtype)).eps * np.abs(ref).max()
    assert x.report["phases"] == {"gram pass": "gpu", "residual pass": "gpu"}
    assert cupy_standin.STATE.counts.get("cublas.syrk", 0) > 0
    assert cupy_standin.take_races() == []


def test_auto_keeps_read_bound_passes_on_the_cpu(standin, rng):
    a = rng.standard_normal((300, 4))  # 4 columns: about 2 flops per byte read, bound by reading
    x = bl.solve(a, rng.standard_normal(300), lam=0.1, method="normal", device="auto", memory="256KiB")
    assert x.report["phases"]["gram pass"] == "cpu"


@pytest.mark.parametrize("method", ["rsvd", "sketch", "lanczos"])
def test_in_core_svd_products_run_on_the_gpu(standin, rng, method):
    """Issue 10: in-core svd copied A to the device and straight back, then computed with NumPy."""
    a = rng.standard_normal((300, 40)) * np.logspace(0, -3, 40)
    cupy_standin.STATE.counts.clear()
    res = bl.svd(a, 4, method=method, seed=1, device="gpu", memory="64MiB")
    counts = dict(cupy_standin.STATE.counts)
    if method != "sketch":  # converged methods: the leading singular values
        np.testing.assert_allclose(res.s, np.linalg.svd(a, compute_uv=False)[:4], rtol=1e-8)
    # the same algorithm as on the CPU (same seeds): the same factors up to rounding (float64, well
    # separated singular values: 1e-8 leaves room for the different summation orders)
    ref = bl.svd(a, 4, method=method, seed=1, device="cpu", memory="64MiB")
    np.testing.assert_allclose(res.s, ref.s, rtol=1e-8)
    u, u_ref = res.U.to_numpy(), ref.U.to_numpy()  # the long factor, written from the device
    np.testing.assert_allclose(np.abs(u), np.abs(u_ref), atol=1e-8)
    assert res.report["phases"] == {"read A": "cpu", "products with A": "gpu"}
    assert counts.get("cublas.gemm", 0) > 0
    assert counts.get("d2h copy", 0) < 200  # no strip-by-strip round trip of A
    if method != "lanczos":  # the sketch's orthonormalization (QR or Gram of Y) on the device too
        assert counts.get("linalg.qr", 0) + counts.get("cublas.syrk", 0) > 0
    assert cupy_standin.take_races() == []


@pytest.mark.parametrize("precision", [None, "mixed"])
def test_inverse_leaves_run_on_the_gpu(standin, rng, precision):
    """Issue 10: the leaf inverses stayed on the host with device='gpu'."""
    n = 300
    m = rng.standard_normal((n, n)) + np.sqrt(n) * np.eye(n)
    cupy_standin.STATE.counts.clear()
    x = bl.inv(m, device="gpu", precision=precision, memory="1MiB", method="schur")
    eta = np.linalg.norm(np.eye(n) - m @ x.to_numpy()) / (np.linalg.norm(m) * np.linalg.norm(x.to_numpy()))
    assert eta < n * np.finfo(np.float64).eps  # refined to float64 backward error
    assert x.report["phases"]["leaf inverses"] == "gpu" and x.report["leaves"] >= 1
    assert cupy_standin.STATE.counts.get("linalg.inv", 0) == x.report["leaves"]
    assert x.report["min_leaf_rcond"] > 0
    assert cupy_standin.take_races() == []


def test_tf32_inverse_uses_tensor_cores_and_refines_to_float64(standin):
    """``precision="tf32"`` really enables TF32 (cuBLAS math mode) for the float32 GEMMs, then refines."""
    # A seed whose butterfly-randomized leaves are well conditioned: with some draws the pivot-free
    # recursion meets a leaf with rcond ~1e-6 and (correctly) refuses at this precision.
    rng = np.random.default_rng(2)
    n = 256  # with 384 KiB: a recursion with float32 Schur-complement GEMMs
    m = rng.standard_normal((n, n)) + np.sqrt(n) * np.eye(n)  # cond ~ 3: TF32's 1e-3 start converges
    cupy_standin.STATE.counts.clear()
    x = bl.inv(m, device="gpu", precision="tf32", memory="384KiB", method="schur")
    xs = x.to_numpy()
    assert x.dtype == np.float64
    assert np.linalg.norm(np.eye(n) - m @ xs) / (np.linalg.norm(m) * np.linalg.norm(xs)) < n * np.finfo(np.float64).eps
    assert cupy_standin.STATE.counts.get("cublas.gemm tf32", 0) > 0
    assert cupy_standin.STATE.math_mode == 0
    cupy_standin.STATE.counts.clear()
    bl.inv(m, device="gpu", precision="mixed", memory="384KiB")
    assert cupy_standin.STATE.counts.get("cublas.gemm tf32", 0) == 0  # "mixed" stays full float32
    assert cupy_standin.take_races() == []


def test_tasks_on_one_gpu_share_one_device_budget(standin):
    import threading
    import time

    from blocklin.device.cuda import DeviceBudget

    budget = DeviceBudget()
    order = []
    first_in = threading.Event()

    def task(name, hold_s):
        with budget.hold(60, 100):
            order.append(f"{name} in")
            first_in.set()
            time.sleep(hold_s)
            order.append(f"{name} out")

    t1 = threading.Thread(target=task, args=("a", 0.2))
    t1.start()
    first_in.wait()
    t2 = threading.Thread(target=task, args=("b", 0.0))
    t2.start()
    t1.join()
    t2.join()
    assert order == ["a in", "a out", "b in", "b out"] and budget.peak == 60 and budget.waits == 1
    with budget.hold(500, 100):  # larger than the whole budget: runs alone instead of never
        assert budget.held == 500


def test_concurrent_gemm_tasks_stay_within_the_device_budget(standin, tmp_path, rng):
    from blocklin.device.cuda import DeviceBudget

    a = rng.standard_normal((192, 96))
    b = rng.standard_normal((96, 160))
    DeviceBudget._budgets.clear()
    a_s = bl.from_array(a, tmp_path / "a.zarr", chunks=(32, 32))
    b_s = bl.from_array(b, tmp_path / "b.zarr", chunks=(32, 32))
    res = bl.matmul(a_s, b_s, tmp_path / "c.zarr", device="gpu", memory="4MiB", device_memory="256KiB", workers=3,
                    scheduler="threads")
    assert res.report["tasks"] > 3
    assert np.abs(res.to_numpy() - a @ b).max() <= 4 * 96 * np.finfo(np.float64).eps * np.abs(a @ b).max()
    assert 0 < DeviceBudget.of(0).peak <= 256 * 1024
    assert cupy_standin.take_races() == []


def test_in_core_eigsh_products_run_on_the_gpu(standin, rng):
    g = rng.standard_normal((120, 60))
    a = g.T @ g
    cupy_standin.STATE.counts.clear()
    res = bl.eigsh(a, 3, seed=0, device="gpu", memory="64MiB")
    np.testing.assert_allclose(np.sort(res.w), np.linalg.eigvalsh(a)[-3:], rtol=1e-8)
    assert res.report["phases"] == {"read A": "cpu", "products with A": "gpu"}
    assert cupy_standin.STATE.counts.get("cublas.gemm", 0) > 0
    assert cupy_standin.take_races() == []


def test_freed_memory_reused_while_another_stream_reads_it_is_a_race(standin):
    cp = standin
    compute, d2h = cp.cuda.Stream(non_blocking=True), cp.cuda.Stream(non_blocking=True)
    with compute:
        acc = cp.zeros((64,))
    ev = compute.record()
    d2h.wait_event(ev)
    acc.get(stream=d2h, blocking=False, out=__import__("cupyx").empty_pinned((64,)))  # copy still queued
    del acc  # freed to the compute stream's pool while d2h may still read it
    with compute:
        cp.zeros((64,))  # the same block, written on compute: unordered with the pending read
    found = cupy_standin.take_races()
    assert len(found) == 1 and "reusing" in found[0]


def test_streaming_qr_solve_runs_on_the_gpu(standin, rng):
    """Issue 10: the QR (TSQR) path of tall solve stayed on the CPU."""
    a = rng.standard_normal((500, 24))
    b = rng.standard_normal((500, 1))
    cupy_standin.STATE.counts.clear()
    x = bl.solve(a, b, lam=[0.1, 1.0], method="qr", device="gpu", memory="256KiB")
    for j, lam in enumerate([0.1, 1.0]):
        ref = np.linalg.solve(a.T @ a + lam**2 * np.eye(24), a.T @ b[:, 0])
        # QR route, cond(A) ~ 2: a few hundred float64 eps
        assert np.abs(x.to_numpy()[:, j] - ref).max() <= 1e3 * np.finfo(np.float64).eps * np.abs(ref).max()
    assert x.report["phases"]["tsqr pass"] == "gpu"
    assert cupy_standin.STATE.counts.get("linalg.qr", 0) > 1
    assert cupy_standin.take_races() == []


@pytest.mark.parametrize("n", [37, 64])
def test_butterfly_on_the_device_is_the_host_butterfly(standin, rng, n):
    """The random butterfly's Givens rotations through the device (contiguous range pairs) apply the same
    orthogonal V as the host, on both sides and transposed, for odd and even sizes."""
    from blocklin.linalg.inverse.kernels import Butterfly

    bf = Butterfly(n, 3, seed=5)
    v = bf.right(np.eye(n))  # V = I V
    np.testing.assert_allclose(v @ v.T, np.eye(n), atol=1e-14)
    dev = get_device("gpu")
    coef = bf.coefficients(dev)
    x = rng.standard_normal((9, n))
    y = rng.standard_normal((n, 7))
    for transpose in (False, True):
        vt = v.T if transpose else v
        got = dev.to_host(bf.right(dev.to_device(x), transpose=transpose, device=dev, coef=coef))
        np.testing.assert_allclose(got, x @ vt, atol=1e-13)
        np.testing.assert_array_equal(got, bf.right(x.copy(), transpose=transpose))  # same flops, same bits
        got = dev.to_host(bf.left(dev.to_device(y), transpose=transpose, device=dev, coef=coef))
        np.testing.assert_allclose(got, vt @ y, atol=1e-13)
    assert cupy_standin.take_races() == []


def test_inverse_butterfly_and_probes_run_where_asked(standin, rng):
    """device='gpu': the butterfly passes and the residual probes run on the GPU (same result as the CPU);
    device='auto' keeps these read-bound passes on the CPU."""
    n = 256
    m = rng.standard_normal((n, n)) + np.sqrt(n) * np.eye(n)
    ref = bl.inv(m, device="cpu", memory="384KiB", seed=3, method="schur")
    assert ref.report["butterfly_depth"] > 0
    cupy_standin.STATE.counts.clear()
    x = bl.inv(m, device="gpu", memory="384KiB", seed=3, method="schur")
    phases = x.report["phases"]
    assert phases["butterfly transforms"] == "gpu" and phases["residual probes"] == "gpu"
    assert cupy_standin.STATE.counts.get("multiply", 0) > 0  # the rotations ran on the device
    # same algorithm, different summation orders on the device: both at float64 backward error
    for res in (ref, x):
        xs = res.to_numpy()
        assert np.linalg.norm(np.eye(n) - m @ xs) / (np.linalg.norm(m) * np.linalg.norm(xs)) < n * np.finfo(float).eps
    np.testing.assert_allclose(x.to_numpy(), ref.to_numpy(), rtol=0, atol=1e3 * n * np.finfo(float).eps
                               * np.abs(ref.to_numpy()).max())
    # the probed estimates of ||I - M X||_F (probe passes on the GPU) track the exact backward error
    xs = x.to_numpy()
    exact = np.linalg.norm(np.eye(n) - m @ xs) / (np.linalg.norm(m) * np.linalg.norm(xs))
    assert x.report["residual_method"] == "probed" and x.report["backward_error"] < n * np.finfo(float).eps
    assert exact / 10 < x.report["backward_error"] < 10 * exact  # 32 probes: within a small factor
    auto = bl.inv(m, device="auto", memory="384KiB", seed=3, method="schur")
    assert auto.report["phases"]["butterfly transforms"] == "cpu"
    assert auto.report["phases"]["residual probes"] == "cpu"
    assert cupy_standin.take_races() == []


def test_every_report_says_where_its_phases_ran(standin, rng, tmp_path):
    """device='gpu': the factorizations, triangular solves and GEMM say their heavy phases ran on the GPU
    (and LU's panel getrf on the host); results as on the CPU."""
    n = 96
    spd = rng.standard_normal((n, n))
    spd = spd @ spd.T + n * np.eye(n)
    kw = {"device": "gpu", "memory": "2MiB"}
    c = bl.cholesky(spd, tmp_path / "l.zarr", **kw)
    np.testing.assert_allclose(c.to_numpy(), np.linalg.cholesky(spd), atol=1e-12 * np.abs(spd).max())
    assert set(c.report["phases"].values()) == {"gpu"}
    x = bl.solve_triangular(c, spd[:, :5], tmp_path / "x.zarr", lower=True, **kw)
    np.testing.assert_allclose(x.to_numpy(), np.linalg.solve(np.linalg.cholesky(spd), spd[:, :5]), atol=1e-10)
    assert set(x.report["phases"].values()) == {"gpu"}
    lu = bl.lu(spd, tmp_path / "lu.zarr", **kw)
    assert lu.report["phases"] == {"panel updates (TRSM, GEMM)": "gpu", "panel factorization (getrf)": "cpu"}
    g = bl.matmul(spd, spd, tmp_path / "g.zarr", **kw)
    assert_product(g.to_numpy(), spd @ spd, spd, spd)
    assert g.report["phases"]["GEMM tiles (A B, alpha, beta C)"] == "gpu"
    assert cupy_standin.take_races() == []


def test_orthonormalize_in_core_on_the_gpu(standin, rng):
    from blocklin.linalg.blocks.orth import orthonormalize

    y = rng.standard_normal((200, 12))
    cupy_standin.STATE.counts.clear()
    q, r = orthonormalize(y, device="gpu", memory="4MiB")
    qs = q.to_numpy()
    np.testing.assert_allclose(qs.T @ qs, np.eye(12), atol=1e-13)
    np.testing.assert_allclose(qs @ r, y, atol=1e-12 * np.abs(y).max())
    assert np.all(np.diag(r) > 0)
    assert q.report["phases"] == {"read Y": "cpu", "Householder QR": "gpu"}
    assert cupy_standin.STATE.counts.get("linalg.qr", 0) == 1
    assert cupy_standin.take_races() == []


@pytest.mark.parametrize("device", ["auto", "gpu"])
def test_streamed_svd_and_eigsh_passes_where_they_win(standin, rng, device):
    """Out of core, a pass over A with a narrow block does a few flops per byte read: 'auto' keeps it on
    the CPU; 'gpu' runs it on the GPU. The results agree either way."""
    a = rng.standard_normal((400, 60)) * np.logspace(0, -2, 60)
    # 160 KiB < the 188 KiB of A (streamed); the preflight plans the passes over the stored Y too (133 KiB)
    res = bl.svd(a, 3, method="rsvd", seed=1, device=device, memory="160KiB")
    assert not res.report["in_core"]
    want = "cpu" if device == "auto" else "gpu"
    assert res.report["phases"] == {"passes over A": want}
    np.testing.assert_allclose(res.s, np.linalg.svd(a, compute_uv=False)[:3], rtol=1e-6)
    b = rng.standard_normal((400, 400))
    s = b @ b.T  # 1.25 MiB: streamed with a 1 MiB budget
    w = bl.eigsh(s, 2, seed=0, device=device, memory="1MiB")
    assert not w.report["in_core"] and w.report["phases"] == {"passes over A": want}
    np.testing.assert_allclose(np.sort(w.w), np.sort(np.linalg.eigvalsh(s))[-2:], rtol=1e-8)
    assert cupy_standin.take_races() == []


@pytest.mark.parametrize("work_dtype", ["float64", "float32"])
def test_inverse_epilogue_on_the_device_matches_the_host(standin, rng, work_dtype):
    """The Newton-Schulz GEMMs' epilogue (+ I on the global diagonal, ||tile||_F^2) runs on the GPU
    before the strip's download: same written blocks and norms as on the CPU, for regions off the
    store's origin (diagonal entries cut by tiles and strips). The probe products ``X P`` are a row
    pass of their own (``refine.probe_products``), not part of the epilogue."""
    from blocklin.linalg.inverse.kernels import InverseEpilogue
    from blocklin.runtime.blockops import BlockOps
    from blocklin.runtime.job import Job
    from blocklin.storage.zarr_store import open_zarr

    n, off = 96, 32
    a = rng.standard_normal((n, n)).astype(work_dtype)
    b = rng.standard_normal((n, n)).astype(work_dtype)
    got = {}
    for kind in ("cpu", "gpu"):
        with Job("t", device=kind, memory="160KiB", device_memory="96KiB") as job:
            ops = BlockOps(job, 32)
            pa, pb = ops.store("a", n, n, work_dtype), ops.store("b", n, n, work_dtype)
            open_zarr(pa, mode="r+")[...] = a
            open_zarr(pb, mode="r+")[...] = b
            out = ops.store("o", n, n, work_dtype)
            for ident, region in ((True, (off, 0)), (False, (0, off))):
                m_, n_ = n - region[0], n - region[1]
                res = ops.gemm(out, region, m_, n_, n, pa, (region[0], 0), pb, (0, region[1]), dtype=work_dtype,
                               alpha=-1.0, epilogue=InverseEpilogue(identity=ident))
                got[(kind, ident)] = (np.array(open_zarr(out)[...]), sum(r["sumsq"] for r in res))
    eps = np.finfo(np.dtype(work_dtype)).eps
    for ident in (True, False):
        (xc, sc), (xg, sg) = got[("cpu", ident)], got[("gpu", ident)]
        np.testing.assert_allclose(xg, xc, rtol=0, atol=4 * n * eps * np.abs(xc).max())
        assert sg == pytest.approx(sc, rel=1e-12 if work_dtype == "float64" else 1e-5)
        assert sg == pytest.approx(float(np.sum(xg.astype(np.float64)[region_rows(ident, off)] ** 2)),
                                   rel=1e-10 if work_dtype == "float64" else 1e-4)
    ref = -(a.astype(np.float64)[off:] @ b.astype(np.float64))
    ref[np.arange(n - off), off + np.arange(n - off)] += 1  # + I where global row == global column
    np.testing.assert_allclose(got[("gpu", True)][0][off:], ref, atol=4 * n * eps * np.abs(ref).max())
    assert cupy_standin.take_races() == []


def region_rows(ident: bool, off: int) -> tuple:
    """The part of the output the epilogue's region covered (rows from ``off``, or columns from it)."""
    return (slice(off, None), slice(None)) if ident else (slice(None), slice(off, None))


def test_gpu_row_passes_fit_the_device_budget_and_hold_it(standin, rng):
    """A pass over stored data on the GPU keeps its strips and states there: planned within the device
    budget as well as the host's, and each task holds its share of the per-GPU budget while it runs."""
    from blocklin.device.cuda import DeviceBudget
    from blocklin.linalg.solve.kernels import gram_kernel
    from blocklin.runtime.job import Job
    from blocklin.runtime.passes import reduce_sum, run_pass, source

    a = rng.standard_normal((2000, 40))
    b = rng.standard_normal((2000, 2))
    budget = DeviceBudget.of(0)
    peaks = {}
    for dm in (None, "256KiB"):
        budget.peak = 0
        with Job("t", device="gpu", memory="4MiB", device_memory=dm) as job:
            res = run_pass(job, gram_kernel, [source(job.operand(a, "a")), source(job.operand(b, "b"))],
                           {"dtype": "float64"})
        assert_gram(reduce_sum(res.states, "g"), a.T @ a, a)
        assert_product(reduce_sum(res.states, "c"), a.T @ b, a.T, b)
        assert budget.held == 0 and 0 < budget.peak  # held while the tasks ran, released after
        peaks[dm] = res.plan.peak_memory
    assert peaks["256KiB"] <= 256 << 10 < peaks[None] <= 4 << 20
    assert cupy_standin.take_races() == []
