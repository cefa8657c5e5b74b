"""A/B on one machine: how a read's pieces are handed to the chunk I/O pool. Variants, alternated:
``pool`` (as shipped: every piece on the pool's threads, the caller waits), ``caller`` (the calling
thread reads as one of the lanes), ``caller4`` (that, with pieces of at least 4 MiB). Later passes of
benchmarks/feed.py's null kernel (CPU; and the CUDA device where asked), 1 GiB float64, budgets 1/16 and
1/4; best and median of ROUNDS; the raw limit beside."""
import concurrent.futures, importlib.util, json, os, shutil, sys, tempfile, threading, time
sys.path.insert(0, os.getcwd())
spec = importlib.util.spec_from_file_location("feed", "benchmarks/feed.py")
feed = importlib.util.module_from_spec(spec); spec.loader.exec_module(feed)
from blocklin.storage import rawchunks
import blocklin._readstats as readstats
shipped = rawchunks._run_all
def caller_lane(pool, fn, work, lanes):
    items = iter(work); lock = threading.Lock(); stop = threading.Event()
    def lane():
        while not stop.is_set():
            with lock:
                item = next(items, None)
            if item is None:
                return
            try:
                fn(*item)
            except BaseException:
                stop.set(); raise
    futures = [pool.submit(readstats.in_context(lane)) for _ in range(lanes - 1)]
    try:
        lane()
        for f in futures:
            f.result()
    except BaseException:
        stop.set()
        for f in futures:
            f.cancel()
        concurrent.futures.wait(futures)
        raise
PIECE = rawchunks.READ_PIECE_BYTES
VARIANTS = {"pool": (shipped, PIECE), "caller": (caller_lane, PIECE), "caller4": (caller_lane, 4 << 20)}
rounds = int(os.environ.get("ROUNDS", "5"))
w = tempfile.mkdtemp(dir=sys.argv[1] if len(sys.argv) > 1 else None); path = os.path.join(w, "a.zarr")
m, n = 262144, 512
nb = m * n * 8
try:
    feed.make(path, m, n, 2048, "none")
    files = feed.chunk_files(path); cores = os.cpu_count()
    feed.raw_read(files, cores, 2048 * n * 8, "none")
    raws = []
    for _ in range(3):
        t = time.perf_counter(); feed.raw_read(files, cores, 2048 * n * 8, "none"); raws.append(nb / (time.perf_counter() - t) / 1e9)
    res = {"cores": cores, "raw_limit": max(raws)}
    print("raw limit", round(max(raws), 2), flush=True)
    for dev in sys.argv[2:] or ["cpu"]:
        for frac in (16, 4):
            got = {k: [] for k in VARIANTS}
            for r in range(rounds):
                for name, (fn, piece) in VARIANTS.items():
                    rawchunks._run_all, rawchunks.READ_PIECE_BYTES = fn, piece
                    out = feed.blocklin_feed(path, nb // frac, dev, later=True)
                    got[name].append(nb / out["seconds"] / 1e9)
            for name, v in got.items():
                res[f"{dev} 1/{frac} {name}"] = {"best": max(v), "median": sorted(v)[len(v) // 2], "all": v}
                print(dev, f"1/{frac}", name, "best", round(max(v), 2), "median", round(sorted(v)[len(v) // 2], 2), flush=True)
    rawchunks._run_all, rawchunks.READ_PIECE_BYTES = shipped, PIECE
    print(json.dumps(res))
finally:
    shutil.rmtree(w, ignore_errors=True)
