"""Budget sweep: every operation on one input, at budgets from 1/16 of the operand to more than all of it.

The input is a symmetric positive definite ``n x n`` float64 matrix ``A = Q diag(s) Q^T`` with a
known spectrum ``s_i = max(0.9^i, 1e-2)`` (Q orthonormal), stored as zarr in ``--chunk`` square
chunks, so that every operation runs on it: GEMM (``A @ A``), each SVD method, eigsh, solve
(``A x = b``), inv, convert (a rechunk), Cholesky and LU. Each run is its own subprocess: its
baseline is its resident memory after imports, and its peak is the high-water mark above that
(reset just before the operation, after the same operation ran once on a tiny input so that lazy
imports and thread pools are part of the baseline, and after a 1024 x 1024 product and inverse in
memory, so that the BLAS/LAPACK work buffers are too; ``--cold-blas`` leaves that out). Printed
per run: seconds, passes over A (GEMM, the factorizations and inv: logical bytes read over the
size of A, of both operands for GEMM), physical bytes read, peak memory above baseline, and an
accuracy figure against the exact answer (NumPy/SciPy, computed after the peak is taken).

Flags against the goals (issue "fast and accurate at any budget"):

* ``time``: more than 1.3x the time of the largest budget with the same pass count;
* ``peak``: peak above baseline over the budget + 10%;
* ``refused``: a budget too small is fine only as a ``BudgetError`` stating the minimum;
* ``gemm-rate``: GEMM at a budget of 1/4 of one operand below 0.7x the BLAS-alone rate
  (NumPy ``A @ A`` in memory, measured in its own subprocess in the same sweep).

Usage::

    python benchmarks/budgets.py                         # n = 2048 (32 MiB operand), all operations
    python benchmarks/budgets.py --n 4096 --ops gemm,inv --fractions 0.25,4
    python benchmarks/budgets.py --json sweep.jsonl      # also one JSON line per run
    python benchmarks/budgets.py --n 4096 --chunk 1024 --ops svd-rsvd,svd-sketch,svd-lanczos,eigsh --repeat 3

The machine's load changes timings: compare ratios within one sweep.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time

import numpy as np

OPS = ("gemm", "svd-rsvd", "svd-sketch", "svd-lanczos", "svd-gram", "eigsh", "solve", "inv", "convert", "cholesky", "lu")
FRACTIONS = (1 / 16, 1 / 8, 1 / 4, 1 / 2, 1, 2)
K = 10  # singular/eigen triplets
#: Whether the child warms BLAS/LAPACK (a 1024 x 1024 product and inverse in memory) before its baseline.
WARM_BLAS = [True]

CHILD = textwrap.dedent(r"""
    import json, sys, time, traceback
    import numpy as np
    op, path, bpath, out, memory, k, warm, warm_b, warm_blas = sys.argv[1:10]
    memory, k = int(memory), int(k)
    import dask.threaded, scipy.linalg, zarr  # noqa: F401 - part of the baseline, not of the run
    import blocklin as bl
    from blocklin.errors import BudgetError

    def hwm():
        for line in open("/proc/self/status"):
            if line.startswith("VmHWM"):
                return int(line.split()[1]) * 1024

    def reset():
        try:
            open("/proc/self/clear_refs", "w").write("5")
        except OSError:
            pass

    def run(op, path, bpath, out, memory, k):
        if op == "gemm":
            r = bl.matmul(path, path, out, memory=memory, overwrite=True)
        elif op.startswith("svd-"):
            r = bl.svd(path, k, method=op[4:], memory=memory, seed=0, out=out, overwrite=True)
        elif op == "eigsh":
            r = bl.eigsh(path, k, memory=memory, seed=0, out=out, overwrite=True, order="descending")
        elif op == "solve":
            r = bl.solve(path, bpath, memory=memory, out=out, overwrite=True)
        elif op == "inv":
            r = bl.inv(path, memory=memory, out=out, overwrite=True)
        elif op == "convert":
            r = bl.convert(path, out, chunks=(256, 256), memory=memory, overwrite=True)
        elif op == "cholesky":
            r = bl.cholesky(path, out, memory=memory, overwrite=True)
        elif op == "lu":
            r = bl.lu(path, out, memory=memory, overwrite=True)
        return r

    bl.open(path)[0:1, 0:1]
    try:  # the same operation on a tiny input first: lazy imports and thread pools join the baseline
        run(op, warm, warm_b, out, memory, 2)
    except Exception:  # noqa: BLE001 - a warm-up only
        pass
    import shutil
    shutil.rmtree(out, ignore_errors=True)
    if warm_blas == "1":  # BLAS/LAPACK work buffers of full-size calls join the baseline (like thread pools)
        g = np.random.default_rng(2).standard_normal((1024, 1024))
        np.linalg.inv(g @ g)
        del g
    reset()
    base = hwm()  # the resident memory now: the warm-up's own peak (since freed) is no baseline
    res = {"op": op, "memory": memory}
    t0 = time.perf_counter()
    try:
        r = run(op, path, bpath, out, memory, k)
    except BudgetError as exc:
        res.update(refused=str(exc), peak=hwm() - base)
        print(json.dumps(res))
        sys.exit(0)
    res["seconds"] = time.perf_counter() - t0
    res["peak"] = hwm() - base
    rep = r if isinstance(r, dict) else r.report
    res.update(passes=rep.get("passes"), bytes_read=rep.get("bytes_read"), bytes_logical=rep.get("bytes_logical"),
               read_notes=rep.get("read_notes"), plan_peak=(rep.get("plan") or {}).get("peak_memory"))
    # accuracy, after the peak is taken
    a = zarr.open_array(path, mode="r")[...]
    s_true = np.load(path + ".s.npy")
    if op == "gemm":
        ref = a @ a
        res["error"] = float(np.abs(r.to_numpy() - ref).max() / np.abs(ref).max())
    elif op.startswith("svd-"):
        res["error"] = float(np.max(np.abs(r.s - s_true[:k]) / s_true[:k]))
    elif op == "eigsh":
        w = np.sort(np.asarray(r.w))[::-1]
        res["error"] = float(np.max(np.abs(w - s_true[:k]) / s_true[:k]))
    elif op == "solve":
        b = zarr.open_array(bpath, mode="r")[...]
        x = r.to_numpy()
        res["error"] = float(np.linalg.norm(a @ x - b) / (np.linalg.norm(a, 2) * np.linalg.norm(x)))
    elif op == "inv":
        x = r.to_numpy()
        res["error"] = float(np.abs(a @ x - np.eye(a.shape[0])).max() / (np.abs(a).max() * np.abs(x).max() * a.shape[0]))
    elif op == "convert":
        res["error"] = float(np.abs(zarr.open_array(out, mode="r")[...] - a).max())
        res["passes"] = 1
    elif op == "cholesky":
        low = np.tril(r.to_numpy())
        res["error"] = float(np.abs(low @ low.T - a).max() / np.abs(a).max())
    elif op == "lu":
        packed = r.to_numpy()
        low, up = np.tril(packed, -1) + np.eye(a.shape[0]), np.triu(packed)
        pa = a.copy()
        for i, p in enumerate(rep["pivots"]):
            pa[[i, p]] = pa[[p, i]]
        res["error"] = float(np.abs(low @ up - pa).max() / np.abs(a).max())
    if op == "inv" and res["bytes_logical"]:
        # the report counts row passes (the probe) only; the LU route's panels read A again and again
        res["passes"] = None
    if res["passes"] is None and res["bytes_logical"]:  # GEMM, the factorizations, inv: reads of A
        res["passes"] = f"{res['bytes_logical'] / (a.nbytes * (2 if op == 'gemm' else 1)):.1f}x"
    print(json.dumps(res))
""")

BLAS = textwrap.dedent(r"""
    import json, sys, time
    import numpy as np, zarr
    a = zarr.open_array(sys.argv[1], mode="r")[...]
    a @ a  # warm
    t0 = time.perf_counter()
    a @ a
    print(json.dumps({"seconds": time.perf_counter() - t0}))
""")


def make_input(d: str, n: int, chunk: int, name: str = "A") -> tuple[str, str, int]:
    """The SPD matrix, its spectrum (``PATH.s.npy``) and a right-hand side; returns paths and bytes."""
    import zarr

    rng = np.random.default_rng(0)
    q, _ = np.linalg.qr(rng.standard_normal((n, n)))
    s = np.maximum(0.9 ** np.arange(n), 1e-2)
    a = (q * s) @ q.T
    a = (a + a.T) / 2
    path, bpath = os.path.join(d, f"{name}.zarr"), os.path.join(d, f"{name}-b.zarr")
    z = zarr.create_array(store=path, shape=a.shape, chunks=(chunk, chunk), dtype="f8", compressors=None,
                          overwrite=True)
    z[...] = a
    np.save(path + ".s.npy", s)
    zb = zarr.create_array(store=bpath, shape=(n, 1), chunks=(chunk, 1), dtype="f8", compressors=None, overwrite=True)
    zb[...] = rng.standard_normal((n, 1))
    return path, bpath, a.nbytes


def run_repeated(op: str, inputs: tuple[str, str, str, str], out: str, memory: int, timeout: int,
                 repeat: int) -> dict:
    """:func:`run_one` ``repeat`` times: the run of median time, with the highest peak of all and every time."""
    runs = [run_one(op, inputs, out, memory, timeout) for _ in range(max(1, repeat))]
    done = [r for r in runs if "seconds" in r]
    if len(done) < len(runs):  # a refusal or failure is reported as it is
        return next(r for r in runs if "seconds" not in r)
    done.sort(key=lambda r: r["seconds"])
    r = dict(done[(len(done) - 1) // 2])
    r["peak"] = max(d["peak"] for d in done)
    if len(done) > 1:
        r["all_seconds"] = [d["seconds"] for d in done]
    return r


def run_one(op: str, inputs: tuple[str, str, str, str], out: str, memory: int, timeout: int) -> dict:
    path, bpath, warm, warm_b = inputs
    try:
        proc = subprocess.run([sys.executable, "-c", CHILD, op, path, bpath, out, str(memory), str(K), warm, warm_b,
                               "1" if WARM_BLAS[0] else "0"],
                              capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"op": op, "memory": memory, "failed": f"timed out after {timeout} s"}
    finally:
        shutil.rmtree(out, ignore_errors=True)
    if proc.returncode != 0:
        return {"op": op, "memory": memory, "failed": proc.stderr.strip().splitlines()[-1] if proc.stderr else "?"}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def flags(rows: list[dict], blas_seconds: float | None, n: int, operand: int) -> None:
    """Add ``flags`` to each run of one operation (the goals in the module docstring)."""
    done = [r for r in rows if "seconds" in r]
    for r in rows:
        f = []
        if "failed" in r:
            f.append("FAILED")
        elif "refused" in r:
            need = _stated_minimum(r["refused"])
            if need is None:
                f.append("refused without the minimum")
            elif need <= r["memory"]:
                f.append(f"stated minimum {fmt_size(need)} is not above the budget")
        else:
            same = [d for d in done if d["passes"] == r["passes"]]
            ref = max(same, key=lambda d: d["memory"]) if same else None
            if ref is not None and r["seconds"] > 1.3 * ref["seconds"]:
                f.append(f"time {r['seconds'] / ref['seconds']:.2f}x")
            if r["peak"] > 1.1 * r["memory"]:
                f.append(f"peak {r['peak'] / r['memory']:.2f}x budget")
            if r["op"] == "gemm" and blas_seconds:
                r["blas_ratio"] = blas_seconds / r["seconds"]
                if r["memory"] <= operand // 4 and r["blas_ratio"] < 0.7:
                    f.append(f"gemm-rate {r['blas_ratio']:.2f}x BLAS")
        r["flags"] = f


def _stated_minimum(message: str) -> int | None:
    """The bytes after "at least" in a BudgetError message (``12.21 MiB``), or None."""
    import re

    found = re.search(r"at least ([0-9.]+) ?(B|KiB|MiB|GiB|TiB)\b", message)
    if found is None:
        return None
    units = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40}
    return int(float(found.group(1)) * units[found.group(2)])


def fmt_size(b: float | None) -> str:
    if b is None:
        return "-"
    for unit, div in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(b) >= div:
            return f"{b / div:.1f}{unit}"
    return f"{int(b)}B"


def line(r: dict) -> str:
    head = f"{r['op']:<12} {fmt_size(r['memory']):>9}"
    if "failed" in r:
        return f"{head}  FAILED: {r['failed'][:150]}"
    if "refused" in r:
        # the first "at least": the budget the operation states as sufficient (a nested step may follow)
        need = r["refused"].split("at least ")[1].split(" (")[0].split(";")[0] if "at least" in r["refused"] else "?"
        return f"{head}  refused (needs at least {need}){'  ' + ', '.join(r['flags']) if r['flags'] else ''}"
    rate = f" {r['blas_ratio']:.2f}xBLAS" if "blas_ratio" in r else ""
    return (f"{head} {r['seconds']:8.2f}s {str(r['passes']):>6} {fmt_size(r['bytes_read']):>9} "
            f"{fmt_size(r['bytes_logical']):>9} {fmt_size(r['peak']):>9} {r['error']:9.1e}{rate}"
            f"{'  ' + ', '.join(r['flags']) if r['flags'] else '  ok'}")


def print_table(path: str) -> None:
    """Re-flag and print the runs of a ``--json`` file (BLAS time and operand size as recorded)."""
    runs = [json.loads(x) for x in open(path) if x.strip()]
    head = runs[0].get("sweep", {}) if runs else {}
    for op in dict.fromkeys(r["op"] for r in runs if "op" in r):
        rows = [r for r in runs if r.get("op") == op]
        flags(rows, head.get("blas_seconds"), head.get("n", 0), head.get("operand", 0))
        for r in rows:
            print(line(r))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--n", type=int, default=2048, help="matrix order (default 2048: a 32 MiB operand)")
    p.add_argument("--chunk", type=int, default=512, help="square chunk edge of the input")
    p.add_argument("--ops", default=",".join(OPS), help=f"comma-separated subset of {','.join(OPS)}")
    p.add_argument("--fractions", default=",".join(str(f) for f in FRACTIONS),
                   help="budgets as fractions of the operand size")
    p.add_argument("--dir", default=None, help="folder for the input (default: a temporary one, removed)")
    p.add_argument("--timeout", type=int, default=900, help="seconds per run")
    p.add_argument("--repeat", type=int, default=1,
                   help="runs per operation and budget: the median time and the highest peak are printed")
    p.add_argument("--json", default=None, help="also write one JSON line per run to this file")
    p.add_argument("--cold-blas", action="store_true",
                   help="do not warm BLAS/LAPACK before the baseline: the peak then includes the pages of "
                        "their work buffers that the operation touches first (up to a few MiB, once per process)")
    p.add_argument("--table", default=None, metavar="JSONL",
                   help="print the table (with flags) of an earlier run's --json file instead of running")
    args = p.parse_args()
    if args.table:
        return print_table(args.table)
    WARM_BLAS[0] = not args.cold_blas
    ops = [o for o in args.ops.split(",") if o]
    unknown = sorted(set(ops) - set(OPS))
    if unknown:
        p.error(f"--ops: unknown {unknown}; choose from {','.join(OPS)}")
    d = args.dir or tempfile.mkdtemp(prefix="blocklin-budgets-")
    os.makedirs(d, exist_ok=True)
    try:
        t0 = time.perf_counter()
        path, bpath, operand = make_input(d, args.n, args.chunk)
        inputs = (path, bpath) + make_input(d, 64, 32, name="warm")[:2]
        budgets = sorted({max(2**20, int(float(f) * operand)) for f in args.fractions.split(",")})
        print(f"input: {args.n} x {args.n} float64 ({fmt_size(operand)}) in {args.chunk} x {args.chunk} chunks, "
              f"made in {time.perf_counter() - t0:.1f} s; budgets {', '.join(fmt_size(b) for b in budgets)}; "
              f"{args.repeat} run(s) each (median time, highest peak); load average "
              f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}")
        blas = None
        if "gemm" in ops:
            blas = json.loads(subprocess.run([sys.executable, "-c", BLAS, path], capture_output=True, text=True,
                                             check=True).stdout)["seconds"]
            print(f"BLAS alone (NumPy A @ A in memory): {blas:.2f} s, {2 * args.n**3 / blas / 1e9:.1f} GFLOP/s")
        print(f"{'op':<12} {'budget':>9} {'seconds':>9} {'passes':>6} {'read':>9} {'logical':>9} {'peak':>9} "
              f"{'error':>9}  flags")
        out_json = open(args.json, "w") if args.json else None
        if out_json:
            out_json.write(json.dumps({"sweep": {"n": args.n, "chunk": args.chunk, "operand": operand,
                                                 "blas_seconds": blas, "repeat": args.repeat,
                                                 "load": os.getloadavg()}}) + "\n")
        for op in ops:
            rows = []
            for mem in budgets:
                rows.append(run_repeated(op, inputs, os.path.join(d, f"out-{op}.zarr"), mem, args.timeout,
                                         args.repeat))
            flags(rows, blas, args.n, operand)
            for r in rows:
                print(line(r), flush=True)
                if out_json:
                    out_json.write(json.dumps(r) + "\n")
                    out_json.flush()
        print(f"load average at the end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
        if out_json:
            out_json.close()
    finally:
        if args.dir is None:
            shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    main()
