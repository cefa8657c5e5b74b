"""The feed: how fast stored operands reach a device, against the storage's raw limit.

One tall float64 matrix is stored twice as zarr v3 (uncompressed chunks, and zstd chunks), its
chunk files read once so they sit in the page cache (or on tmpfs with ``--dir /dev/shm``). Then, in
one process, each reader runs ``--repeats`` times, alternated round by round so that every figure
comes from the same load, and the best round of each counts:

* ``raw``: the chunk files read by 1..all cores' threads, each thread into one reused page-aligned
  buffer (``preadv``; for zstd, the file read and decoded with numcodecs into the buffer): the limit;
* ``blocklin_cpu``: a row pass of a null kernel on the CPU device (the strips delivered to the
  kernel by the task's ``TileStream``, and each summed once on the CPU, so that every byte is read: a
  strip mapped from the page cache is delivered only when read), at a budget of ``--memory`` (a fraction
  of the operand, ``1/16`` by default: the operand is far larger than the budget), timed with its
  job; the first pass of a job over an operand also records its largest magnitude (the scaling of data
  near overflow needs it; it stands in for the NaN/Inf check);
* ``blocklin_columns``: the same first pass recording each column's largest magnitude, as an SVD's
  first pass does (``Job.column_peaks``);
* ``blocklin_recorded``: that first pass (each column's peak) over the operand with the peaks its
  writer recorded (``.blocklin-peaks.json``, as ``blocklin convert`` leaves beside its outputs,
  :mod:`blocklin.storage.recorded_peaks`): the record, checked against the chunk files' stamps, stands
  in for the scan. The record is put in place for these rounds only, so the other readers scan;
* ``blocklin_seen``: a job's first pass (its largest magnitude) over the operand whose peaks the
  previous job's scan kept in the user's cache (:mod:`blocklin.storage.seen_peaks`: data another tool
  wrote, scanned once). The scanning readers drop that entry before they run, and the run drops it
  with the operand;
* ``blocklin_later``: the same pass run again in the same job, as every later pass of an iterative
  method (nothing but the delivery), timed alone;
* ``blocklin_gpu``: the same pass on the CUDA device (``device="gpu"``): real CuPy where it imports
  and sees a GPU, else the CuPy stand-in of ``tests/support/cupy_standin.py``, which then measures the host
  side (pinned slots, uploads as NumPy copies);
* ``blocklin_gpu_later``: a later pass of the same job on the CUDA device, timed alone, with the device's
  cache of strips off (every strip read on the host and uploaded, as where the operand outgrows the
  device; no column peaks);
* ``blocklin_gemm``: a thin product ``A @ B`` (``B`` ``n x 4``, in memory) by ``blocklin.matmul`` on the
  CPU at the same budget: its thin-product route, one row pass with ``B`` held (its output, ``m x 4``,
  is written too);
* ``zarr``: zarr's own read, one chunk row of strips at a time into one reused buffer
  (``get_basic_selection(..., out=)``);
* ``dask``: ``dask.array.from_zarr`` with a null ``map_blocks``, on the threaded scheduler;
* ``numpy_fromfile``: ``numpy.fromfile`` of every chunk file (uncompressed only), one thread;
* ``touch`` (uncompressed only): every byte of the chunk files summed by all cores' threads, once
  copied into one reused buffer per thread (``copy_sum``, the raw read and the cheapest kernel that
  reads every byte) and once mapped from the page cache and summed where it lies (``map_sum``: no
  copy), with the share of a mapped chunk file the kernel maps in 2 MiB pages (``pmd_mapped``). It
  says whether strips mapped into place would beat copied ones on this host: where the page cache
  holds the files in small pages the mapped sum is the slower (``docs/benchmarks.md``, "Strips mapped
  from the page cache"); and mapped with each 1 MiB's max and min taken before the sum
  (``map_peaks_sum``): what a job's first pass does with every byte (its largest magnitude, then the
  kernel's read), with no engine around it: the least a first pass can cost on this host.

It prints GB/s (10^9 bytes of decoded operand per second) for each, blocklin's ratio to the raw
limit (the best thread count), and one JSON line last. Usage::

    python benchmarks/feed.py                       # 1 GiB operand in a temp dir (160 s on 2 cores at load 8)
    python benchmarks/feed.py --quick               # seconds: a check of the script itself
    python benchmarks/feed.py --gib 4 --dir /dev/shm --memory 1/16,1/4 --repeats 5
    python benchmarks/feed.py --codecs none --reread  # the files as read back, not as just written

Figures mean something only on a quiet machine (``uptime``: load well under the core count).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from fractions import Fraction
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent

#: Every key of the JSON line (the test checks them).
FIELDS = ("shape", "chunks", "operand_bytes", "cores", "cpu", "load_average", "repeats", "gpu_backend", "reread", "raw",
          "raw_limit", "blocklin_cpu", "blocklin_columns", "blocklin_recorded", "blocklin_seen",
          "blocklin_later", "blocklin_gpu", "blocklin_gpu_later", "blocklin_gemm", "zarr",
          "dask", "numpy_fromfile", "touch", "ratio_to_raw")
CODECS = ("none", "zstd")


# -- data ------------------------------------------------------------------------------------------
def make(path: str, m: int, n: int, chunk_rows: int, codec: str) -> bytes:
    """An ``m x n`` float64 zarr v3 array of normal deviates, chunks of ``chunk_rows`` whole rows; returns
    the record of its peaks that a blocklin writer leaves (:mod:`blocklin.storage.recorded_peaks`),
    removed from the array: :func:`recorded_feed` puts it back for the rounds that take it."""
    import zarr

    from blocklin.storage.recorded_peaks import PeakTally, record
    from blocklin.storage.records import PEAKS_RECORD

    compressors = None if codec == "none" else zarr.codecs.ZstdCodec(level=1)
    arr = zarr.create_array(store=path, shape=(m, n), chunks=(chunk_rows, n), dtype="float64",
                            compressors=compressors, zarr_format=3, fill_value=0.0)
    tally = PeakTally((m, n))
    for r0 in range(0, m, chunk_rows):
        r1 = min(m, r0 + chunk_rows)
        block = np.random.default_rng([7, r0]).standard_normal((r1 - r0, n))
        arr[r0:r1] = block
        tally.add(block, r0, 0)
    record(path, tally)
    kept = Path(path, PEAKS_RECORD)
    raw = kept.read_bytes()
    kept.unlink()
    return raw


def recorded_feed(path: str, raw: bytes, memory: int) -> dict:
    """A job's first pass (each column's peak) with the record ``raw`` beside the array at ``path``,
    removed after, so that the other readers scan."""
    from blocklin.storage.records import PEAKS_RECORD

    kept = Path(path, PEAKS_RECORD)
    kept.write_bytes(raw)
    try:
        out = blocklin_feed(path, memory, "cpu", columns=True)
    finally:
        kept.unlink()
    assert out["recorded"], "the job took the record"
    return out


def seen_feed(path: str, memory: int) -> dict:
    """A job's first pass (its largest magnitude) taking the peaks the previous job's scan of ``path``
    kept in the cache."""
    out = blocklin_feed(path, memory, "cpu", seen=True)
    assert out["seen"], "the job took the peaks an earlier scan kept"
    return out


def chunk_files(path: str) -> list[str]:
    folder = os.path.join(path, "c")
    return [os.path.join(folder, ci, cj) for ci in sorted(os.listdir(folder), key=int)
            for cj in sorted(os.listdir(os.path.join(folder, ci)), key=int)]


def evict(files: list[str]) -> None:
    """Drop the chunk files from the page cache (written back first; a no-op on tmpfs): read again,
    they come back through the kernel's read-ahead, as after a reboot or memory pressure, not in the
    pages their writes filled."""
    for f in files:
        fd = os.open(f, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


# -- the raw limit -----------------------------------------------------------------------------------
def _page_aligned(nbytes: int) -> np.ndarray:
    """A buffer of ``nbytes`` starting on a page boundary: the kernel's copy from the page cache is
    several times slower into one that starts 16 bytes past a cache line, where glibc puts the blocks
    it maps (and so ``numpy.empty``'s large arrays once blocklin has fixed the mmap threshold)."""
    raw = np.empty(nbytes + 4096, dtype=np.uint8)
    skip = -raw.ctypes.data % 4096
    return raw[skip:skip + nbytes]


def raw_read(files: list[str], threads: int, chunk_bytes: int, codec: str) -> None:
    """Every chunk file read (and decoded) by ``threads`` threads, each into one reused buffer."""
    from numcodecs import Zstd

    def lane(j: int) -> None:
        buf = _page_aligned(chunk_bytes)
        view = memoryview(buf)
        raw = np.empty(chunk_bytes + 65536, dtype=np.uint8) if codec != "none" else None
        zstd = Zstd()
        for f in files[j::threads]:
            fd = os.open(f, os.O_RDONLY)
            try:
                if raw is None:
                    got = os.preadv(fd, [view], 0)
                else:
                    size = os.fstat(fd).st_size
                    if size > len(raw):
                        raw = np.empty(size, dtype=np.uint8)
                    got = os.preadv(fd, [memoryview(raw)[:size]], 0)
                    zstd.decode(raw[:got], out=buf)
            finally:
                os.close(fd)
            assert got > 0

    ts = [threading.Thread(target=lane, args=(j,)) for j in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()


#: Bytes of a mapped chunk file whose max and min ``touch_read(peaks=True)`` takes at a time: a first
#: pass's pieces (``blocklin.runtime.passes.PEAK_PIECE_BYTES``).
PEAK_PIECE = 1 << 20


def touch_read(files: list[str], threads: int, chunk_bytes: int, mapped: bool, peaks: bool = False) -> None:
    """Every byte of the chunk files summed by ``threads`` threads: copied into one reused page-aligned
    buffer per thread, or (``mapped``) mapped read-only from the page cache and summed in place; with
    ``peaks`` (mapped) each file's max and min taken first, a :data:`PEAK_PIECE` at a time, as a job's
    first pass takes them before its kernel reads the strip: the least a first pass costs here."""
    import mmap

    def lane(j: int) -> None:
        buf = None if mapped else _page_aligned(chunk_bytes)
        for f in files[j::threads]:
            fd = os.open(f, os.O_RDONLY)
            try:
                if mapped:
                    m = mmap.mmap(fd, 0, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ)
                else:
                    got = os.preadv(fd, [memoryview(buf)], 0)
                    assert got == chunk_bytes
            finally:
                os.close(fd)
            if mapped:
                v = np.frombuffer(m, dtype=np.float64)
                if peaks:
                    step = PEAK_PIECE // 8
                    for a in range(0, v.size, step):
                        max(v[a:a + step].max(), -v[a:a + step].min())
                v.sum()
                del v  # the mapping closes only once no view of it is left
                m.close()
            else:
                buf.view(np.float64).sum()

    ts = [threading.Thread(target=lane, args=(j,)) for j in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()


def pmd_mapped_share(path: str) -> float | None:
    """The share of chunk file ``path``, mapped and read, that the kernel maps in 2 MiB pages (the
    growth of ``FilePmdMapped`` in ``/proc/self/smaps_rollup``); None where that is not reported."""
    import mmap

    from blocklin.storage.mapped import pmd_mapped_kib as pmd_kib

    before = pmd_kib()
    if before is None:
        return None
    with open(path, "rb") as f:
        m = mmap.mmap(f.fileno(), 0, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ)
    try:
        v = np.frombuffer(m, dtype=np.uint8)
        v.max()  # every page touched
        during = pmd_kib()
        size = v.nbytes
        del v
    finally:
        m.close()
    return None if during is None or not size else min(1.0, (during - before) * 1024 / size)


# -- blocklin --------------------------------------------------------------------------------------
def _null_memory(params: Any, sources: Any) -> Any:
    from blocklin.plan.passes import PassMemory

    return PassMemory(fixed=0)


def _null_kernel() -> Callable:
    from blocklin.runtime.passes import row_kernel

    @row_kernel(memory=_null_memory, device="any", read_only=True)
    def null_kernel(device: Any, arrays: Any, rows: slice, params: Any, state: Any) -> tuple[Any, None]:
        if device.host_resident:  # every byte read once: a strip mapped from the page cache is delivered only
            for a in arrays:  # then (a GPU's upload has read every byte already)
                a.sum()
        return (0 if state is None else state) + (rows.stop - rows.start), None

    return null_kernel


NULL_KERNEL: Callable | None = None


def blocklin_feed(path: str, memory: int, device: str, later: bool = False, columns: bool = False,
                  seen: bool = False) -> dict:
    """A row pass of the null kernel over ``path`` on ``device``; its plan's shape.

    The first pass of a job over an operand also records its largest magnitude (what the scaling of
    data near overflow needs; it stands in for the NaN/Inf check too), and with ``columns`` each
    column's, as an SVD's first pass does: that pass is timed with its job. ``later``: a second pass in
    the same job, as every later pass of an iterative method reads, timed alone (``"seconds"`` in the
    result). ``seen``: take the peaks an earlier job's scan kept (:mod:`blocklin.storage.seen_peaks`);
    without it what the cache keeps of ``path`` is dropped first, so that the pass scans.
    """
    global NULL_KERNEL
    from blocklin.runtime.job import Job
    from blocklin.runtime.passes import run_pass, source

    from blocklin.storage import seen_peaks

    if NULL_KERNEL is None:
        NULL_KERNEL = _null_kernel()
    if not seen:
        seen_peaks.forget(path)
    out: dict = {}
    from blocklin.device import resident

    kept = resident.ENABLED
    resident.ENABLED = False  # the feed, not strips kept on the device
    try:
        with Job("feed", memory=memory, device=device, check_finite=False) as job:
            op = job.operand(path, "a")
            if columns:
                job.column_peaks.add(str(op.path))
            # the stream's end waits for its slots' uploads: on a GPU every byte has reached the device
            states, plan = run_pass(job, NULL_KERNEL, [source(op)], description="feed", check_finite=False)
            if later:
                t0 = time.perf_counter()
                states, plan = run_pass(job, NULL_KERNEL, [source(op)], description="feed", check_finite=False)
                out["seconds"] = time.perf_counter() - t0
    finally:
        resident.ENABLED = kept
    assert sum(states) == op.shape[0], "the null pass saw every row once"
    return {"recorded": bool(job.recorded_peaks), "seen": bool(job.seen_peaks), "strip": plan.strip, "workers": plan.workers, "prefetch": plan.prefetch, "loaders": plan.loaders, **out}


def blocklin_thin_product(path: str, memory: int, work: str) -> dict:
    """``A @ B`` with ``B`` a thin in-memory ``n x 4`` block: the GEMM tile task's feed."""
    import blocklin

    a = blocklin.open(path)
    b = np.random.default_rng(3).standard_normal((a.shape[1], 4))
    out = os.path.join(work, "thin.zarr")
    res = blocklin.matmul(path, b, out, memory=memory, device="cpu", check_finite=False, overwrite=True)
    plan = res.report.get("plan", {}) if isinstance(res.report, dict) else {}
    shutil.rmtree(out)
    if plan.get("route") == "rows":  # matmul's thin-product route: one row pass (B held)
        pp = plan["pass_plan"]
        return {"route": "rows", "strip": pp["strip"], "tasks": len(pp["groups"]), "workers": pp["workers"],
                "out_chunks": plan["out_chunks"]}
    return {k: plan[k] for k in ("tm", "tn", "tk", "workers", "prefetch", "n_tasks") if k in plan}


def gpu_backend() -> str:
    """``"cupy"`` with a visible GPU, else ``"standin"`` (installed here)."""
    try:
        import cupy

        if str(getattr(cupy, "__file__", "")).endswith("cupy_standin.py"):
            return "standin"  # installed already (the test suite's --cupy-standin)
        if cupy.cuda.runtime.getDeviceCount() > 0:
            return "cupy"
    except Exception:  # noqa: BLE001 - no CuPy, or no GPU: the stand-in measures the host side
        pass
    sys.path.insert(0, str(ROOT / "tests"))
    from support import cupy_standin

    cupy_standin.install()
    return "standin"


# -- other readers ---------------------------------------------------------------------------------
def zarr_read(path: str, chunk_rows: int) -> None:
    import zarr
    from zarr.core.buffer.cpu import NDBuffer

    arr = zarr.open_array(path, mode="r")
    m, n = arr.shape
    buf = np.empty((chunk_rows, n))
    for r0 in range(0, m, chunk_rows):
        r1 = min(m, r0 + chunk_rows)
        arr.get_basic_selection((slice(r0, r1), slice(0, n)), out=NDBuffer.from_numpy_array(buf[:r1 - r0]))


def dask_read(path: str) -> None:
    import dask
    import dask.array as da

    x = da.from_zarr(path)
    nb = tuple((1,) * len(c) for c in x.chunks)
    with dask.config.set(scheduler="threads"):
        x.map_blocks(lambda b: np.zeros((1, 1)), chunks=nb, dtype=float).sum().compute()


def fromfile_read(files: list[str]) -> None:
    for f in files:
        np.fromfile(f, dtype=np.uint8)


# -- the run ----------------------------------------------------------------------------------------
def best_rates(readers: dict[str, Callable[[], Any]], nbytes: int, repeats: int) -> tuple[dict[str, float], dict]:
    """Each reader's best rate in GB/s over ``repeats`` rounds, readers alternated within a round."""
    best = {k: 0.0 for k in readers}
    info: dict = {}
    for _ in range(repeats):
        for name, fn in readers.items():
            t0 = time.perf_counter()
            out = fn()
            dt = time.perf_counter() - t0
            if isinstance(out, dict) and "seconds" in out:  # a reader that times its own part
                dt = out.pop("seconds")
            best[name] = max(best[name], nbytes / dt / 1e9)
            if isinstance(out, dict):
                info[name] = out
    return best, info


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``; empty where none is found): the kernel's copy from the
    page cache, which bounds every reader here, differs between CPU models."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


def parse_fraction(s: str) -> Fraction:
    f = Fraction(s)
    if not 0 < f <= 4:
        raise argparse.ArgumentTypeError(f"--memory fractions must lie in (0, 4], got {s}")
    return f


def main(argv: list[str] | None = None) -> int:
    from blocklin.storage import seen_peaks

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--gib", type=float, default=1.0, help="operand size in GiB (default 1)")
    p.add_argument("--cols", type=int, default=512, help="operand columns (default 512)")
    p.add_argument("--chunk-rows", type=int, default=2048, help="rows per chunk (default 2048: 8 MiB chunks)")
    p.add_argument("--memory", default="1/16",
                   help="blocklin's budgets as fractions of the operand, comma-separated (default 1/16)")
    p.add_argument("--repeats", type=int, default=3, help="rounds; the best of each reader counts (default 3)")
    p.add_argument("--threads", type=int, default=None, help="most raw-read threads (default: all cores)")
    p.add_argument("--codecs", default="none,zstd", help="stored variants (default none,zstd)")
    p.add_argument("--dir", default=None, help="where to store the operand (default: a temp dir; /dev/shm for tmpfs)")
    p.add_argument("--no-gpu", action="store_true", help="skip the CUDA device's feed")
    p.add_argument("--reread", action="store_true",
                   help="drop the written chunk files from the page cache and read them back before measuring")
    p.add_argument("--quick", action="store_true", help="a seconds-long run at small sizes (checks the script)")
    args = p.parse_args(argv)
    if args.quick:
        args.gib, args.cols, args.chunk_rows, args.repeats = 1 / 64, 128, 256, 1
    fractions = [parse_fraction(s) for s in args.memory.split(",")]
    codecs = [c for c in args.codecs.split(",") if c]
    bad = [c for c in codecs if c not in CODECS]
    if bad:
        p.error(f"--codecs: {bad} not among {list(CODECS)}")
    cores = os.cpu_count() or 1
    most = args.threads or cores
    threads = sorted({t for t in (1, 2, 4, 8, 16, 32, 64, most) if t <= most})
    n = args.cols
    m = max(args.chunk_rows, int(args.gib * 2**30) // (8 * n) // args.chunk_rows * args.chunk_rows)
    nbytes = m * n * 8
    chunk_bytes = args.chunk_rows * n * 8
    backend = "none" if args.no_gpu else gpu_backend()

    work = tempfile.mkdtemp(prefix="blocklin-feed-", dir=args.dir)
    summary: dict[str, Any] = {"shape": [m, n], "chunks": [args.chunk_rows, n], "operand_bytes": nbytes,
                               "cores": cores, "cpu": cpu_model(), "load_average": list(os.getloadavg()), "repeats": args.repeats,
                               "gpu_backend": backend, "reread": args.reread, "raw": {}, "raw_limit": {},
                               "blocklin_cpu": {}, "blocklin_columns": {}, "blocklin_recorded": {}, "blocklin_seen": {},
                               "blocklin_later": {}, "blocklin_gpu": {}, "blocklin_gpu_later": {}, "blocklin_gemm": {},
                               "zarr": {}, "dask": {}, "numpy_fromfile": None, "touch": None,
                               "ratio_to_raw": {}}
    try:
        for codec in codecs:
            path = os.path.join(work, f"a-{codec}.zarr")
            record = make(path, m, n, args.chunk_rows, codec)
            files = chunk_files(path)
            if args.reread:
                evict(files)
            raw_read(files, cores, chunk_bytes, codec)  # into the page cache
            readers: dict[str, Callable[[], Any]] = {
                f"raw_{t}": (lambda t=t: raw_read(files, t, chunk_bytes, codec)) for t in threads}
            for f in fractions:
                budget = max(1, int(nbytes * f))
                readers[f"cpu_{f}"] = lambda b=budget: blocklin_feed(path, b, "cpu")
                readers[f"seen_{f}"] = lambda b=budget: seen_feed(path, b)  # after cpu_f's scan, which kept them
                readers[f"columns_{f}"] = lambda b=budget: blocklin_feed(path, b, "cpu", columns=True)
                readers[f"recorded_{f}"] = lambda b=budget: recorded_feed(path, record, b)
                readers[f"later_{f}"] = lambda b=budget: blocklin_feed(path, b, "cpu", later=True)
                if backend != "none":
                    readers[f"gpu_{f}"] = lambda b=budget: blocklin_feed(path, b, "gpu")
                    readers[f"gpu_later_{f}"] = lambda b=budget: blocklin_feed(path, b, "gpu", later=True)
                readers[f"gemm_{f}"] = lambda b=budget: blocklin_thin_product(path, b, work)
            readers["zarr"] = lambda: zarr_read(path, args.chunk_rows)
            readers["dask"] = lambda: dask_read(path)
            if codec == "none":
                readers["numpy_fromfile"] = lambda: fromfile_read(files)
                readers["copy_sum"] = lambda: touch_read(files, cores, chunk_bytes, mapped=False)
                readers["map_sum"] = lambda: touch_read(files, cores, chunk_bytes, mapped=True)
                readers["map_peaks_sum"] = lambda: touch_read(files, cores, chunk_bytes, mapped=True, peaks=True)
            rates, plans = best_rates(readers, nbytes, args.repeats)
            raw = {str(t): rates[f"raw_{t}"] for t in threads}
            limit = max(raw.values())
            summary["raw"][codec] = raw
            summary["raw_limit"][codec] = limit
            summary["zarr"][codec] = rates["zarr"]
            summary["dask"][codec] = rates["dask"]
            if codec == "none":
                summary["numpy_fromfile"] = rates["numpy_fromfile"]
                summary["touch"] = {"threads": cores, "copy_sum": rates["copy_sum"], "map_sum": rates["map_sum"],
                                    "map_peaks_sum": rates["map_peaks_sum"],
                                    "pmd_mapped": pmd_mapped_share(files[0])}
            for dev in ("cpu", "columns", "recorded", "seen", "later", "gpu", "gpu_later", "gemm"):
                got = {str(f): {"gbps": rates[f"{dev}_{f}"], "plan": plans.get(f"{dev}_{f}")}
                       for f in fractions if f"{dev}_{f}" in rates}
                summary[f"blocklin_{dev}"][codec] = got
                for f, r in got.items():
                    summary["ratio_to_raw"][f"{dev} {codec} {f}"] = r["gbps"] / limit
            _print(codec, raw, rates, fractions, limit, backend, summary["touch"] if codec == "none" else None)
            seen_peaks.forget(path)  # what the scans kept of the operand, with it
            shutil.rmtree(path)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(json.dumps(summary))
    return 0


def _print(codec: str, raw: dict, rates: dict, fractions: list, limit: float, backend: str,
           touch: dict | None = None) -> None:
    print(f"-- {codec} chunks (GB/s, best round)")
    print("raw, threads: " + ", ".join(f"{t}: {r:.2f}" for t, r in raw.items()) + f"  (limit {limit:.2f})")
    for f in fractions:
        for dev in ("cpu", "columns", "recorded", "seen", "later", "gpu", "gpu_later", "gemm"):
            if f"{dev}_{f}" in rates:
                r = rates[f"{dev}_{f}"]
                where = {"cpu": "row pass, cpu, a job's first (its largest magnitude)",
                         "columns": "row pass, cpu, a job's first (each column's peak, an svd's)",
                         "recorded": "row pass, cpu, a job's first, its peaks recorded by their writer",
                         "seen": "row pass, cpu, a job's first, its peaks seen by an earlier job's scan",
                         "later": "row pass, cpu, a later pass", "gpu": f"row pass, gpu ({backend}), a job's first",
                         "gpu_later": f"row pass, gpu ({backend}), a later pass", "gemm": "thin product, cpu"}[dev]
                print(f"blocklin {where}, memory {f} of the operand: {r:.2f}  ({r / limit:.2f}x raw)")
    print(f"zarr: {rates['zarr']:.2f}   dask from_zarr: {rates['dask']:.2f}"
          + (f"   numpy fromfile: {rates['numpy_fromfile']:.2f}" if "numpy_fromfile" in rates else ""))
    if touch is not None:
        share = "not reported" if touch["pmd_mapped"] is None else f"{touch['pmd_mapped']:.0%}"
        print(f"every byte summed, {touch['threads']} threads: copied into a reused buffer {touch['copy_sum']:.2f}, "
              f"mapped from the page cache {touch['map_sum']:.2f} (a mapped chunk file in 2 MiB pages: {share}); "
              f"mapped, each 1 MiB's max and min taken first (a first pass's least cost) {touch['map_peaks_sum']:.2f}")


if __name__ == "__main__":
    sys.exit(main())
