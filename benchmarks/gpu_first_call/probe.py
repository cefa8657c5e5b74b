"""CuPy and CUDA facts behind the GPU issue (pinned-pool rounding, link speeds, copy blocking, cuBLAS
handles, GEMM rates), measured in about 30 s on an H200.

``python3 benchmarks/gpu_first_call/probe.py OUT.json [--small]`` with the CuPy that imports there
(the lent image's own build). ``--small`` shrinks every size (the stand-in runs it so: the facts of
real CuPy it lacks are then recorded as ``*_error`` entries). Each entry is recorded as soon as it is
measured, so a crash still leaves the earlier ones.
"""
from __future__ import annotations

import json
import sys
import threading
import time

import numpy as np

OUT = sys.argv[1] if len(sys.argv) > 1 and not sys.argv[1].startswith("--") else "probe.json"
SMALL = "--small" in sys.argv
res: dict = {}


def rec(key, value):
    res[key] = value
    print(f"{key}: {value}", flush=True)
    with open(OUT, "w") as f:
        json.dump(res, f, indent=1, default=str)


def guarded(name, fn):
    try:
        fn()
    except Exception as exc:  # noqa: BLE001 - one failed probe must not hide the others
        rec(f"{name}_error", f"{type(exc).__name__}: {exc}")


import cupy as cp  # noqa: E402
import cupyx  # noqa: E402
import cupy.cublas  # noqa: E402,F401 - cp.cublas: CuPy 14 does not import the submodule with the package
from cupy.cuda import runtime  # noqa: E402
from cupy_backends.cuda.libs import cublas as lib  # noqa: E402

GiB = 1 << 30
#: Bytes of the copies timed (1 GiB; 1 MiB with --small) and the side of the timed GEMMs.
COPY = (1 << 20) if SMALL else GiB
SIDE = 256 if SMALL else 16384


def env():
    p = runtime.getDeviceProperties(0)
    name = p["name"].decode() if isinstance(p["name"], bytes) else p["name"]
    rec("cupy", cp.__version__)
    rec("cuda_runtime", runtime.runtimeGetVersion())
    rec("cuda_driver", runtime.driverGetVersion())
    rec("device", name)
    rec("compute_capability", cp.cuda.Device(0).compute_capability)
    rec("sms", p["multiProcessorCount"])
    free, total = runtime.memGetInfo()
    rec("memGetInfo_free_total_GiB", [round(free / GiB, 2), round(total / GiB, 2)])


def pinned_pool():
    # B3: PinnedMemoryPool.malloc rounds every request up to a power of two (pinned_memory.pyx).
    x = cupyx.empty_pinned((12288 // 16, 4096 // 16) if SMALL else (12288, 4096), np.float64)  # a slot of a real plan
    rec("pinned_request_MiB", x.nbytes / 2**20)
    rec("pinned_block_MiB", x.base.mem.size / 2**20)
    pool = cp.get_default_pinned_memory_pool()
    del x
    n0 = pool.n_free_blocks()
    s = cp.cuda.Stream(non_blocking=True)
    with s:  # cp.asarray of pageable data stages it through a pinned block of the same pool
        d = cp.asarray(np.ones((SIDE // 4, SIDE // 4)))
    s.synchronize()
    cp.cuda.alloc_pinned_memory(0)  # lets CuPy's event watcher hand finished staging blocks back
    rec("asarray_staging_blocks_added_to_pinned_pool", pool.n_free_blocks() - n0)
    del d
    t0 = time.perf_counter()
    big = cupyx.empty_pinned((2 * COPY,), np.uint8)
    t1 = time.perf_counter()
    del big
    pool.free_all_blocks()
    t2 = time.perf_counter()
    rec("cudaHostAlloc_s_per_GiB", round((t1 - t0) / 2 * GiB / COPY, 3))
    rec("cudaFreeHost_s_per_GiB", round((t2 - t1) / 2 * GiB / COPY, 3))


def bandwidth():
    n = COPY
    s1, s2 = cp.cuda.Stream(non_blocking=True), cp.cuda.Stream(non_blocking=True)
    d1, d2 = cp.empty(n, cp.uint8), cp.empty(n, cp.uint8)
    h1, h2 = cupyx.empty_pinned((n,), np.uint8), cupyx.empty_pinned((n,), np.uint8)
    h1[:] = 1
    pg = np.ones(n, np.uint8)

    def timed(fn, stream):
        best = 1e9
        for _ in range(3):
            e0, e1 = cp.cuda.Event(), cp.cuda.Event()
            e0.record(stream)
            fn()
            e1.record(stream)
            e1.synchronize()
            best = min(best, cp.cuda.get_elapsed_time(e0, e1) / 1e3)
        return round(n / best / 1e9, 1)

    rec("pinned_h2d_GBps", timed(lambda: d1.set(h1, stream=s1), s1))
    rec("pinned_d2h_GBps", timed(lambda: d1.get(stream=s1, out=h2, blocking=False), s1))
    t0 = time.perf_counter()
    for _ in range(3):
        d1.set(h1, stream=s1)
        d2.get(stream=s2, out=h2, blocking=False)
    s1.synchronize()
    s2.synchronize()
    rec("pinned_bidirectional_GBps_each_way", round(3 * n / (time.perf_counter() - t0) / 1e9, 1))
    t0 = time.perf_counter()
    d1.set(pg, stream=s1)  # pageable: staged by the driver before the call returns
    t1 = time.perf_counter()
    s1.synchronize()
    t2 = time.perf_counter()
    rec("pageable_h2d_GBps", round(n / (t2 - t0) / 1e9, 1))
    rec("pageable_h2d_call_returned_after_fraction", round((t1 - t0) / (t2 - t0), 2))
    t0 = time.perf_counter()
    d1.get(stream=s1, out=pg, blocking=False)  # pageable D2H: returns only when the copy completed
    rec("pageable_d2h_GBps_blocking_false", round(n / (time.perf_counter() - t0) / 1e9, 1))


def stream_semantics():
    s = cp.cuda.Stream(non_blocking=True)
    with s:
        a = cp.asarray(np.random.default_rng(0).standard_normal((SIDE, SIDE // 2)))
        b = cp.asarray(np.random.default_rng(1).standard_normal((SIDE // 2, SIDE)))
        c = cp.zeros((SIDE, SIDE))
    s.synchronize()
    small_pg, small_pin = np.ones(1 << 20, np.uint8), cupyx.empty_pinned((1 << 20,), np.uint8)
    ds = cp.empty(1 << 20, cp.uint8)
    for pinned in (True, False):
        with s:
            cp.cublas.gemm("N", "N", a, b, out=c, beta=1.0)  # about 80 ms of DGEMM queued on s
        t0 = time.perf_counter()
        ds.set(small_pin if pinned else small_pg, stream=s)
        t1 = time.perf_counter()
        s.synchronize()
        t2 = time.perf_counter()
        rec(f"set_1MiB_{'pinned' if pinned else 'pageable'}_call_ms_vs_stream_ms",
            [round((t1 - t0) * 1e3, 2), round((t2 - t0) * 1e3, 1)])
    with s:
        cp.cublas.gemm("N", "N", a, b, out=c, beta=1.0)
        ev = s.record()
    w0, c0 = time.perf_counter(), time.process_time()
    ev.synchronize()
    rec("event_sync_cpu_over_wall", round((time.process_time() - c0) / max(time.perf_counter() - w0, 1e-9), 2))
    # cuBLAS handles: one per thread (device.pyx), bound to the current stream at each call (cublas.pyx)
    handles = {}

    def worker(i):
        st = cp.cuda.Stream(non_blocking=True)
        with st:
            cp.cublas.gemm("N", "N", a[:256, :256], b[:256, :256], out=c[:256, :256].copy(), beta=1.0)
            h = cp.cuda.device.get_cublas_handle()
            handles[i] = (h, lib.getStream(h) == st.ptr, lib.getMathMode(h))
        st.synchronize()

    ts = [threading.Thread(target=worker, args=(i,)) for i in range(2)]
    [t.start() for t in ts]
    [t.join() for t in ts]
    rec("per_thread_handles_distinct", handles[0][0] != handles[1][0])
    rec("handle_stream_is_the_current_stream", [handles[0][1], handles[1][1]])
    rec("default_math_mode", handles[0][2])
    mem = cp.get_default_memory_pool()
    f0 = runtime.memGetInfo()[0]
    x = cp.empty(COPY, cp.uint8)
    del x
    rec("after_free_pool_free_GiB_and_memGetInfo_drop_GiB",
        [round(mem.free_bytes() / GiB, 2), round((f0 - runtime.memGetInfo()[0]) / GiB, 2)])


def rates():
    s = cp.cuda.Stream(non_blocking=True)
    rng = np.random.default_rng(2)
    out = {}
    for dt, tf32 in (("float64", False), ("float32", False), ("float32", True)):
        with s:
            a = cp.asarray(rng.standard_normal((SIDE, SIDE // 4)).astype(dt))  # the OOC GEMM panel shapes
            b = cp.asarray(rng.standard_normal((SIDE // 4, SIDE)).astype(dt))
            c = cp.zeros((SIDE, SIDE), dt)
            h = cp.cuda.device.get_cublas_handle()
            mode = lib.getMathMode(h)
            if tf32:
                lib.setMathMode(h, 3)  # CUBLAS_TF32_TENSOR_OP_MATH, as CudaDevice.math("tf32")
            try:
                cp.cublas.gemm("N", "N", a, b, out=c, beta=1.0)
                e0, e1 = cp.cuda.Event(), cp.cuda.Event()
                e0.record(s)
                for _ in range(5):
                    cp.cublas.gemm("N", "N", a, b, out=c, beta=1.0)
                e1.record(s)
            finally:
                lib.setMathMode(h, mode)
        e1.synchronize()
        t = cp.cuda.get_elapsed_time(e0, e1) / 1e3
        out[dt + ("_tf32" if tf32 else "")] = round(5 * 2 * SIDE * SIDE * (SIDE // 4) / t / 1e12, 3)
        del a, b, c
    rec(f"cublas_gemm_TFLOPs_{SIDE}x{SIDE}x{SIDE // 4}_beta1", out)
    cp.get_default_memory_pool().free_all_blocks()


for name, fn in (("env", env), ("pinned_pool", pinned_pool), ("bandwidth", bandwidth),
                 ("stream_semantics", stream_semantics), ("rates", rates)):
    guarded(name, fn)
