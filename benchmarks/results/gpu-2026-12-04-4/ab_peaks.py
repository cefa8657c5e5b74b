"""A/B on one machine: a first pass's pieces read through read_block (each piece resolving the array's
chunk reader again) against one RawChunks per strip (blocklin.runtime.passes._read_with_peaks as of
this change); CPU and CUDA devices, alternated, best and median of ROUNDS; the raw limit beside."""
import importlib.util, json, os, shutil, sys, tempfile, time
sys.path.insert(0, os.getcwd())
spec = importlib.util.spec_from_file_location("feed", "benchmarks/feed.py")
feed = importlib.util.module_from_spec(spec); spec.loader.exec_module(feed)
import numpy as np
from blocklin.runtime import passes
from blocklin.storage.zarr_store import read_block
new = passes._read_with_peaks
def old(arr, rows, cols, out):
    step = max(1, passes.PEAK_PIECE_BYTES // max(1, out.shape[1] * out.itemsize))
    peaks = passes._column_peaks(out[:0])
    for r0 in range(0, out.shape[0], step):
        r1 = min(out.shape[0], r0 + step)
        piece = read_block(arr, slice(rows.start + r0, rows.start + r1), cols, out=out[r0:r1])
        peaks = np.maximum(peaks, passes._column_peaks(piece)) if r0 else passes._column_peaks(piece)
    return out, peaks
rounds = int(os.environ.get("ROUNDS", "5"))
w = tempfile.mkdtemp(dir=sys.argv[1] if len(sys.argv) > 1 else None); path = os.path.join(w, "a.zarr")
m, n = 262144, 512
nb = m * n * 8
try:
    feed.make(path, m, n, 2048, "none")
    files = feed.chunk_files(path)
    cores = os.cpu_count()
    t = time.perf_counter(); feed.raw_read(files, cores, 2048 * n * 8, "none")
    raws = []
    for _ in range(3):
        t = time.perf_counter(); feed.raw_read(files, cores, 2048 * n * 8, "none"); raws.append(nb / (time.perf_counter() - t) / 1e9)
    res = {"cores": cores, "raw_limit": max(raws)}
    for dev in sys.argv[2:] or ["cpu", "gpu"]:
        for frac in (16, 4):
            got = {"old": [], "new": []}
            for r in range(rounds):
                for name, fn in (("old", old), ("new", new)):
                    passes._read_with_peaks = fn
                    t = time.perf_counter(); feed.blocklin_feed(path, nb // frac, dev); got[name].append(nb / (time.perf_counter() - t) / 1e9)
            for name, v in got.items():
                res[f"{dev} 1/{frac} {name}"] = {"best": max(v), "median": sorted(v)[len(v) // 2], "all": v}
                print(dev, f"1/{frac}", name, "best", round(max(v), 2), "median", round(sorted(v)[len(v) // 2], 2), flush=True)
    print(json.dumps(res))
finally:
    shutil.rmtree(w, ignore_errors=True)
