"""Convert benchmark: a multi-GiB ``.npy`` to zarr, blocklin against the raw read rate and two
alternatives, uncompressed and compressed, measured in one run.

Usage::

    python benchmarks/convert.py [--gib 2] [--memory 512MiB] [--dir bench-data] [--codec blosc-lz4] [--keep]

Variants, each in its own subprocess (so its peak resident memory, ``VmHWM``, is its own):

* ``raw read``: ``np.fromfile`` of the whole file (the read rate of the same bytes; needs their size);
* ``raw copy``: the ``.npy``, and the chunk files of an uncompressed zarr copy of it, copied file by
  file through one reused 64 MiB buffer, against ``blocklin.convert`` of each to uncompressed zarr;
* ``blocklin``: ``blocklin.convert`` within ``--memory``;
* ``zarr.from_array``: ``zarr.from_array(store, data=np.load(path, mmap_mode="r"))``;
* ``dask``: ``dask.array.from_array(np.load(path, mmap_mode="r"), chunks).to_zarr(store)``;

all with the same chunks (blocklin's ``auto`` for the budget) and codec. Every variant imports the same
modules and then waits ``--settle`` seconds (default 4) before its clock starts: the previous variant's
output was just deleted, and on a virtual machine that reports freed memory to its host (virtio-balloon
free page reporting, about 2 s after the free) a writer that starts at once reuses those pages while
one that starts later pays the host's faults for every page of its output. Without the wait the
variant that started fastest (the raw copy: no imports) won by that alone (2026-12-04: the same zarr
copy at 0.44-3.97 GB/s depending on the delay, 0.34-0.40 GB/s after the wait). Printed: seconds, GB/s of
the source bytes, peak memory, and the ratios to the raw read rate and to each alternative. The file
is written first (page cache warm for every variant, as in a pipeline that just produced it) and
deleted afterwards unless ``--keep``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import textwrap

CHILD = textwrap.dedent(r"""
import json, sys, time
variant, src, out, memory, codec, chunks, settle = sys.argv[1:8]
chunks = tuple(int(c) for c in chunks.split(","))
import numpy as np
def peak():
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
import blocklin, zarr, dask.array  # noqa: F401  (every variant starts alike)
if variant == "baseline":
    print(json.dumps({"seconds": 0.0, "peak": peak()}))
    sys.exit()
time.sleep(float(settle))
t0 = time.perf_counter()
if variant == "raw":
    a = np.fromfile(src, dtype=np.uint8)
    n = a.nbytes
elif variant == "rawcopy":  # every file of src (a file or a folder) copied through one reused 64 MiB buffer
    import os
    buf = memoryview(bytearray(64 << 20))
    files = [src] if os.path.isfile(src) else [os.path.join(d, f) for d, _, fs in os.walk(src) for f in fs]
    n = 0
    for i, f in enumerate(files):
        dst = out if os.path.isfile(src) else os.path.join(out, os.path.relpath(f, src))
        os.makedirs(os.path.dirname(dst) or ".", exist_ok=True)
        with open(f, "rb", buffering=0) as r, open(dst, "wb", buffering=0) as w:
            while True:
                got = r.readinto(buf)
                if not got:
                    break
                w.write(buf[:got])
                n += got
elif variant == "blocklin":
    import blocklin
    rep = blocklin.convert(src, out, chunks=chunks, codec=codec, memory=memory)
    n = rep["bytes_read"]
else:
    import zarr
    from blocklin.storage.zarr_store import codec_chain
    mm = np.load(src, mmap_mode="r")
    n = mm.nbytes
    if variant == "zarr":
        zarr.from_array(out, data=mm, chunks=chunks, compressors=codec_chain(codec) or None, zarr_format=3)
    else:
        import dask.array as da
        z = zarr.create_array(out, shape=mm.shape, chunks=chunks, dtype=mm.dtype,
                              compressors=codec_chain(codec) or None, zarr_format=3)
        da.from_array(mm, chunks=chunks).to_zarr(z)
secs = time.perf_counter() - t0
print(json.dumps({"seconds": secs, "bytes": n, "peak": peak()}))
""")


#: Seconds each variant waits, after its imports, before its clock starts (``--settle``).
SETTLE = 4.0


def run(variant: str, src: str, out: str, memory: str, codec: str, chunks: tuple[int, int],
        settle: float = SETTLE) -> dict:
    shutil.rmtree(out, ignore_errors=True)
    if os.path.isfile(out):
        os.remove(out)
    proc = subprocess.run([sys.executable, "-c", CHILD, variant, src, out, memory, codec, f"{chunks[0]},{chunks[1]}",
                           str(settle)],
                          capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"{variant} failed:\n{proc.stderr}")
    res = json.loads(proc.stdout.strip().splitlines()[-1])
    shutil.rmtree(out, ignore_errors=True)
    if os.path.isfile(out):
        os.remove(out)
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gib", type=float, default=2.0, help="size of the .npy in GiB (default 2)")
    ap.add_argument("--memory", default="512MiB", help="blocklin budget (default 512MiB)")
    ap.add_argument("--codec", default="blosc-lz4", help="codec of the compressed runs (default blosc-lz4)")
    ap.add_argument("--dir", default="bench-data", help="scratch folder (default bench-data)")
    ap.add_argument("--keep", action="store_true", help="keep the generated .npy")
    ap.add_argument("--settle", type=float, default=SETTLE,
                    help=f"seconds each variant waits before its clock starts (default {SETTLE:g}; see the docstring)")
    args = ap.parse_args()

    def go(*a: object) -> dict:
        return run(*a, settle=args.settle)

    import numpy as np

    from blocklin.config import parse_size
    from blocklin.plan.chunks import auto_chunks

    os.makedirs(args.dir, exist_ok=True)
    cols = 8192
    rows = max(1, int(args.gib * 2**30 / 8 / cols))
    src = os.path.join(args.dir, "bench.npy")
    if not os.path.exists(src) or os.path.getsize(src) < rows * cols * 8:
        mm = np.lib.format.open_memmap(src, mode="w+", dtype=np.float64, shape=(rows, cols))
        rng = np.random.default_rng(0)
        step = max(1, (64 << 20) // (8 * cols))
        for r in range(0, rows, step):  # half random, half smooth: compressible but not trivially
            k = min(step, rows - r)
            mm[r:r + k] = np.round(rng.standard_normal((k, cols)), 2)
        mm.flush()
        del mm
    chunks = auto_chunks((rows, cols), np.float64, parse_size(args.memory))
    out = os.path.join(args.dir, "out.zarr")
    print(f"source {src}: {rows} x {cols} float64 = {rows * cols * 8 / 2**30:.2f} GiB; chunks {chunks}; "
          f"blocklin budget {args.memory}; {os.cpu_count()} cores")
    base = go("baseline", src, out, args.memory, "none", chunks)["peak"]
    raw = go("raw", src, out, args.memory, "none", chunks)
    rate_raw = raw["bytes"] / raw["seconds"] / 1e9
    print(f"  {'raw read (np.fromfile)':<34} {raw['seconds']:7.2f} s {rate_raw:6.2f} GB/s  "
          f"peak {raw['peak'] / 2**20:7.0f} MiB")
    results = {"raw": raw, "baseline_peak": base}
    # The raw copy rate (issue 24's bar for conversions): the same bytes read and written by one
    # thread through one buffer, for the .npy and for an uncompressed zarr copy of it (its chunk files).
    zsrc = os.path.join(args.dir, "src.zarr")
    if not os.path.exists(zsrc):
        import blocklin

        blocklin.convert(src, zsrc, chunks=chunks, codec="none", memory=args.memory)
    for name, source in (("npy", src), ("zarr", zsrc)):
        copy = go("rawcopy", source, out + (".copy" if name == "npy" else ""), args.memory, "none", chunks)
        copy["gbps"] = copy["bytes"] / copy["seconds"] / 1e9
        conv = go("blocklin", source, out, args.memory, "none", chunks)
        conv["gbps"] = conv["bytes"] / conv["seconds"] / 1e9
        results[f"copy_{name}"] = {"raw_copy": copy, "blocklin": conv}
        print(f"  {name} -> zarr uncompressed: raw copy {copy['gbps']:.2f} GB/s, blocklin.convert {conv['gbps']:.2f} GB/s "
              f"({conv['gbps'] / copy['gbps']:.2f}x the raw copy)")
    for codec in ("none", args.codec):
        rows_out = {}
        for variant, label in (("blocklin", "blocklin.convert"), ("zarr", "zarr.from_array"),
                               ("dask", "dask.array.from_array.to_zarr")):
            r = go(variant, src, out, args.memory, codec, chunks)
            r["gbps"] = r["bytes"] / r["seconds"] / 1e9
            rows_out[variant] = r
            print(f"  {label + ' [' + codec + ']':<34} {r['seconds']:7.2f} s {r['gbps']:6.2f} GB/s  "
                  f"peak {r['peak'] / 2**20:7.0f} MiB")
        b = rows_out["blocklin"]
        print(f"    blocklin/raw read {b['gbps'] / rate_raw:.2f}x; blocklin vs zarr.from_array "
              f"{b['gbps'] / rows_out['zarr']['gbps']:.2f}x at {b['peak'] / rows_out['zarr']['peak']:.2f}x the "
              f"memory; vs dask {b['gbps'] / rows_out['dask']['gbps']:.2f}x at "
              f"{b['peak'] / rows_out['dask']['peak']:.2f}x the memory (import baseline {base / 2**20:.0f} MiB)")
        results[codec] = rows_out
    print(json.dumps(results, default=str))
    if not args.keep:
        os.remove(src)
        shutil.rmtree(zsrc, ignore_errors=True)
    shutil.rmtree(out, ignore_errors=True)


if __name__ == "__main__":
    main()
