"""Cholesky, SPD-solve and LU benchmark: blocklin out of core vs SciPy in memory and Dask, on the same zarr data.

Usage::

    python benchmarks/factor.py [--n 4096] [--chunk 512] [--memory 64MiB] [--dir bench-data] [--keep]

An SPD matrix ``A = G G^T / n + I``-like (built tile by tile in bounded memory: a random lower
triangle made diagonally dominant, mirrored) is written to zarr with square chunks. Each variant runs
in its own subprocess (its own peak RSS, over the baseline of its imports):

* ``blocklin``: ``blocklin.cholesky(A, out)`` within ``--memory``, and
  ``blocklin.solve(A, b, assume_a="pos")`` (Cholesky, triangular solves, refinement);
* ``scipy``: read A from zarr, ``scipy.linalg.cho_factor``, write the factor to zarr (end to end), and
  ``cho_solve`` for the solve. Above ``n = 15000`` the factorization runs on one BLAS thread: the
  threaded ``potrf`` of the wheels' OpenBLAS segfaults there (see ``blocklin.device.cpu``), so the
  ratio at such sizes is against a one-thread reference and says so;
* ``dask``: ``dask.array.linalg.cholesky(da.from_zarr(A), lower=True)`` written with ``to_zarr``
  (threaded scheduler), and ``dask.array.linalg.solve(..., sym_pos)`` via its Cholesky.

With ``--qr``, ``blocklin.qr`` (``Q`` and ``R``, tiled, and ``R`` alone, TSQR) on a tall ``n x n/4`` matrix against
``numpy.linalg.qr`` (read, factor, write) and ``dask.array.linalg.qr`` (``to_zarr`` of ``Q`` and ``R``; its
TSQR needs one chunk across the columns). With ``--qr-square``, the square ``n x n`` case: the tile QR
(``method="tiles"``) and the column panels (``method="tiled"``), ``Q`` and ``R`` and ``R`` alone, against
``numpy.linalg.qr`` end to end (ratios to NumPy's time in the same run; ``--rows M`` for a tall
``M x n``). With ``--gen-solve``, ``blocklin.solve(G, b)`` on the random square matrix (out-of-core LU,
triangular solves, refinement; also ``precision="mixed"``) against ``scipy.linalg.solve`` end to end and
``dask.array.linalg.solve``.

With ``--tikhonov N``, ``blocklin.solve(A, b, lam=...)`` for a random ``N x N`` matrix whose Gram matrix
exceeds ``--tikhonov-memory`` (the stored Gram route: out-of-core SYRK and Cholesky), after the same at
``--tikhonov-check`` (default 2000, with the budget scaled to the same ratio) against SciPy in memory;
each checked by the residual of the regularized normal equations (streamed) and its peak memory.
The issue's case: ``--no-cholesky --chunk 1024 --tikhonov 20000 --tikhonov-memory 512MiB --lam 1``.

With ``--lu``, also ``blocklin.lu`` against ``scipy.linalg.lu_factor`` (read, factor, write) and
``dask.array.linalg.lu`` (``to_zarr`` of ``L`` and ``U``), on a random (non-symmetric) matrix of the same size.

Accuracy: ``||A - L L^T||_F / ||A||_F`` for every factor (one in-memory check at the end) and the
normwise backward error of every solution.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import numpy as np

#: Each child's peak resident memory (the high-water mark of its own process).
PEAK = """def peak():
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
"""

CHILD = textwrap.dedent(r"""
import json, sys, time
variant, a_path, b_path, out, x_out, memory = sys.argv[1:7]
import numpy as np
{PEAK}
import zarr, blocklin, scipy.linalg, dask.array as da
base = peak()
t0 = time.perf_counter()
if variant == "blocklin":
    f = blocklin.cholesky(a_path, out, memory=memory)
    t1 = time.perf_counter()
    x = blocklin.solve(a_path, b_path, assume_a="pos", out=x_out, memory=memory)
    t2 = time.perf_counter()
elif variant == "scipy":
    a = zarr.open_array(a_path, mode="r")[...]
    from blocklin.device.cpu import potrf_threads  # one thread where the threaded potrf crashes
    with potrf_threads(a.shape[0]):
        c, low = scipy.linalg.cho_factor(a, lower=True, overwrite_a=True, check_finite=False)
    l = np.tril(c)
    z = zarr.create_array(out, shape=l.shape, dtype=l.dtype, chunks=zarr.open_array(a_path).chunks,
                          compressors=None)
    z[...] = l
    t1 = time.perf_counter()
    b = zarr.open_array(b_path, mode="r")[...]
    xs = scipy.linalg.cho_solve((l, True), b, check_finite=False)
    zx = zarr.create_array(x_out, shape=xs.shape, dtype=xs.dtype, chunks=xs.shape, compressors=None)
    zx[...] = xs
    t2 = time.perf_counter()
    del a, c, l
elif variant == "dask":
    a = da.from_zarr(a_path)
    da.linalg.cholesky(a, lower=True).to_zarr(out)
    t1 = time.perf_counter()
    b = da.from_zarr(b_path).rechunk((a.chunks[0], -1))
    low = da.from_zarr(out)
    y = da.linalg.solve_triangular(low, b, lower=True)
    da.linalg.solve_triangular(low.T, y, lower=False).to_zarr(x_out)
    t2 = time.perf_counter()
print(json.dumps({"factor_seconds": t1 - t0, "solve_seconds": t2 - t1, "peak": peak() - base}))
""").replace("{PEAK}", PEAK)

LU_CHILD = textwrap.dedent(r"""
import json, sys, time
variant, a_path, out, memory = sys.argv[1:5]
import numpy as np
{PEAK}
import zarr, blocklin, scipy.linalg, dask.array as da
base = peak()
t0 = time.perf_counter()
extra = {}
if variant == "blocklin":
    f = blocklin.lu(a_path, out, memory=memory)
    extra["growth_factor"] = f.report["growth_factor"]
    extra["tile"] = f.report["plan"]["tile"]
elif variant == "scipy":
    a = zarr.open_array(a_path, mode="r")[...]
    lu, piv = scipy.linalg.lu_factor(a, overwrite_a=True, check_finite=False)
    z = zarr.create_array(out, shape=lu.shape, dtype=lu.dtype, chunks=zarr.open_array(a_path).chunks,
                          compressors=None)
    z[...] = lu
    del a, lu
elif variant == "dask":
    a = da.from_zarr(a_path)
    p, l, u = da.linalg.lu(a)
    da.to_zarr(l, out + "-l")
    da.to_zarr(u, out + "-u")
print(json.dumps({"seconds": time.perf_counter() - t0, "peak": peak() - base, **extra}))
""").replace("{PEAK}", PEAK)


QR_CHILD = textwrap.dedent(r"""
import json, sys, time
variant, a_path, out, memory = sys.argv[1:5]
method = sys.argv[5] if len(sys.argv) > 5 else "auto"
import numpy as np
{PEAK}
import zarr, blocklin, dask.array as da
base = peak()
t0 = time.perf_counter()
extra = {}
if variant == "blocklin":
    q, r = blocklin.qr(a_path, out + "-r", q=out + "-q", mode="reduced", memory=memory, method=method)
    extra.update(tile=r.report["plan"]["tile"], method=r.report["method"])
elif variant == "blocklin-r":
    r = blocklin.qr(a_path, out + "-r", memory=memory, method=method)
    extra.update(tile=r.report["plan"].get("tile"), method=r.report["method"])  # TSQR: no tile
elif variant == "numpy":
    a = zarr.open_array(a_path, mode="r")[...]
    q, r = np.linalg.qr(a)
    for name, x in (("-q", q), ("-r", r)):
        z = zarr.create_array(out + name, shape=x.shape, dtype=x.dtype, chunks=(1024, 1024), compressors=None)
        z[...] = x
    del a, q, r
elif variant == "dask":
    a = da.from_zarr(a_path)
    a = a.rechunk((a.chunks[0][0], a.shape[1]))
    q, r = da.linalg.qr(a)
    da.to_zarr(q, out + "-q")
    da.to_zarr(r, out + "-r")
print(json.dumps({"seconds": time.perf_counter() - t0, "peak": peak() - base, **extra}))
""").replace("{PEAK}", PEAK)

GEN_CHILD = textwrap.dedent(r"""
import json, sys, time
variant, a_path, b_path, out, memory = sys.argv[1:6]
import numpy as np
{PEAK}
import zarr, blocklin, scipy.linalg, dask.array as da
base = peak()
t0 = time.perf_counter()
extra = {}
if variant in ("blocklin", "blocklin-mixed"):
    x = blocklin.solve(a_path, b_path, out=out, memory=memory,
                       precision="mixed" if variant == "blocklin-mixed" else "double")
    extra.update(method=x.report["method"], steps=x.report["refine_steps"])
elif variant == "scipy":
    a = zarr.open_array(a_path, mode="r")[...]
    b = zarr.open_array(b_path, mode="r")[...]
    xs = scipy.linalg.solve(a, b, overwrite_a=True, check_finite=False)
    z = zarr.create_array(out, shape=xs.shape, dtype=xs.dtype, chunks=xs.shape, compressors=None)
    z[...] = xs
    del a
elif variant == "dask":
    a = da.from_zarr(a_path)
    b = da.from_zarr(b_path).rechunk((a.chunks[0], -1))
    da.linalg.solve(a, b).to_zarr(out)
print(json.dumps({"seconds": time.perf_counter() - t0, "peak": peak() - base, **extra}))
""").replace("{PEAK}", PEAK)


def run_child(code: str, *argv: str) -> dict:
    """One variant in its own interpreter (its own peak RSS); ``{"error": ...}`` when it fails."""
    proc = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True)
    if proc.returncode != 0:
        return {"error": (proc.stderr.strip().splitlines() or ["?"])[-1]}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def run_qr(folder: Path, args: argparse.Namespace) -> None:
    """Tall QR: ``n x n/4``; accuracy ``||A - Q R||_F / ||A||_F`` and ``||Q^T Q - I||_F``."""
    import zarr

    m, n = args.n, max(1, args.n // 4)
    path = folder / "T.zarr"
    a = _random_zarr(path, m, n, args.chunk, seed=3)[...]
    print(f"\nQR, {m} x {n} float64 ({m * n * 8 / 2**20:.0f} MiB), random entries")
    print(f"{'variant':11} {'seconds':>8} {'peak MiB':>9} {'||A-QR||/||A||':>15} {'||QtQ-I||':>10}  notes")
    for variant in ("blocklin", "blocklin-r", "numpy", "dask"):
        out = str(folder / f"QR-{variant}")
        r = run_child(QR_CHILD, variant, str(path), out, args.memory)
        if "error" in r:
            print(f"{variant:11} failed: {r['error']}")
            continue
        acc = qtq = float("nan")
        rr = zarr.open_array(out + "-r")[...]
        if variant != "blocklin-r":
            q = zarr.open_array(out + "-q")[...]
            acc = np.linalg.norm(a - q @ rr) / np.linalg.norm(a)
            qtq = np.linalg.norm(q.T @ q - np.eye(n))
            del q
        else:
            acc = np.linalg.norm(rr.T @ rr - a.T @ a) / np.linalg.norm(a) ** 2
        notes = _qr_notes(variant, r)
        print(f"{variant:11} {r['seconds']:8.2f} {r['peak'] / 2**20:9.0f} {acc:15.1e} {qtq:10.1e}  {notes}")


def _qr_notes(variant: str, r: dict) -> str:
    if "method" not in r:
        return ""
    kind = {"tiled": "column panels of", "tiles": "tiles of", "tsqr": "TSQR"}[r["method"]]
    notes = f"{r['method']}: {kind}" + (f" {r['tile']}" if r["method"] != "tsqr" else "")
    return notes + (", R only (||R^TR-A^TA||/||A||^2)" if variant.endswith("-r") else "")


def run_qr_square(folder: Path, args: argparse.Namespace) -> None:
    """Square QR, ``n x n``: the tile QR (``method="tiles"``) against the column panels (``"tiled"``) and
    ``numpy.linalg.qr`` end to end (read, factor, write ``Q`` and ``R``), ``Q`` and ``R`` and ``R`` alone;
    the ratios are to NumPy's time in the same run. ``--rows M`` makes it ``M x n`` (tall)."""
    import zarr

    n = args.n
    m = args.rows or n
    path = folder / "S.zarr"
    a = _random_zarr(path, m, n, args.chunk, seed=5)[...]
    na = np.linalg.norm(a)
    print(f"\n{'Square' if m == n else 'Tall'} QR, {m} x {n} float64 ({m * n * 8 / 2**20:.0f} MiB), random entries, "
          f"blocklin memory {args.memory}")
    print(f"{'variant':16} {'seconds':>8} {'x numpy':>8} {'peak MiB':>9} {'||A-QR||/||A||':>15} "
          f"{'||QtQ-I||':>10}  notes")
    ref = None
    for variant, method in (("numpy", ""), ("blocklin", "tiles"), ("blocklin", "tiled"), ("blocklin-r", "tiles"),
                            ("blocklin-r", "tiled")):
        name = f"{variant}:{method}" if method else variant
        out = str(folder / f"SQR-{variant}-{method}")
        r = run_child(QR_CHILD, variant, str(path), out, args.memory, *([method] if method else []))
        if "error" in r:
            print(f"{name:16} failed: {r['error']}")
            continue
        rr = zarr.open_array(out + "-r")[...]
        if variant != "blocklin-r":
            q = zarr.open_array(out + "-q")[...]
            acc = np.linalg.norm(a - q @ rr) / na
            qtq = np.linalg.norm(q.T @ q - np.eye(n))
            del q
        else:
            acc, qtq = np.linalg.norm(rr.T @ rr - a.T @ a) / na**2, float("nan")
        ref = r["seconds"] if variant == "numpy" else ref
        ratio = f"{r['seconds'] / ref:8.2f}" if ref else f"{'':8}"
        print(f"{name:16} {r['seconds']:8.2f} {ratio} {r['peak'] / 2**20:9.0f} {acc:15.1e} {qtq:10.1e}  "
              f"{_qr_notes(variant, r)}")


def run_gen_solve(folder: Path, g_path: Path, args: argparse.Namespace) -> None:
    """``A x = b`` for the random square ``G``: backward error ``||b - A x|| / (||A|| ||x|| + ||b||)``."""
    import zarr

    b_path = folder / "bg.zarr"
    zb = zarr.create_array(str(b_path), shape=(args.n, 1), dtype="float64", chunks=(args.chunk, 1), compressors=None,
                           overwrite=True)  # a kept --dir is reused
    zb[...] = np.random.default_rng(4).standard_normal((args.n, 1))
    a, b = zarr.open_array(str(g_path))[...], zb[...]
    print(f"\nsquare solve A x = b, n = {args.n} float64, random entries, budget {args.memory}")
    rows = {}
    for variant in args.gen_variants.split(","):
        out = str(folder / f"xg-{variant}.zarr")
        shutil.rmtree(out, ignore_errors=True)
        r = run_child(GEN_CHILD, variant, str(g_path), str(b_path), out, args.memory)
        if "error" not in r:
            x = zarr.open_array(out)[...].reshape(args.n, -1)
            r["eta"] = np.linalg.norm(b - a @ x) / (np.linalg.norm(a) * np.linalg.norm(x) + np.linalg.norm(b))
        rows[variant] = r
    # time over SciPy's in the same run (the goal: 1.3x at most, holding half of A or less)
    ref = rows.get("scipy", {}).get("seconds")
    print(f"{'variant':15} {'seconds':>8} {'x scipy':>8} {'peak MiB':>9} {'eta':>9}  notes")
    for variant, r in rows.items():
        if "error" in r:
            print(f"{variant:15} failed: {r['error']}")
            continue
        ratio = f"{r['seconds'] / ref:8.2f}" if ref else f"{'-':>8}"
        notes = f"{r['method']}, {r['steps']} refinement step(s)" if "method" in r else ""
        print(f"{variant:15} {r['seconds']:8.2f} {ratio} {r['peak'] / 2**20:9.0f} {r['eta']:9.1e}  {notes}")


TIKHONOV_CHILD = textwrap.dedent(r"""
import json, sys, time
a_path, b_path, out, memory, lam = sys.argv[1:6]
{PEAK}
import numpy as np
import blocklin
# the same route on a tiny problem first: the baseline then includes every import and pool it starts
w = np.random.default_rng(0).standard_normal((200, 200))
blocklin.solve(w, w[:, :1], lam=1.0, memory=800000)
base = peak()
t0 = time.perf_counter()
x = blocklin.solve(a_path, b_path, lam=float(lam), out=out, memory=memory)
r = x.report
print(json.dumps({"seconds": time.perf_counter() - t0, "peak": peak() - base, "method": r["method"],
                  "gram": r.get("gram"), "gram_tile": r.get("gram_tile"), "residual_norm": r["residual_norm"],
                  "method_reason": r["method_reason"]}))
""").replace("{PEAK}", PEAK)


def make_tikhonov(folder: Path, n: int, chunk: int, seed: int = 5) -> tuple[Path, Path]:
    """A random ``n x n`` float64 ``A`` (standard normal entries) and ``b``, written strip by strip."""
    import zarr

    a_path, b_path = folder / f"TA{n}.zarr", folder / f"Tb{n}.zarr"
    z = zarr.create_array(str(a_path), shape=(n, n), dtype="float64", chunks=(chunk, chunk), compressors=None)
    rng = np.random.default_rng(seed)
    for i in range(0, n, chunk):
        z[i:i + chunk, :] = rng.standard_normal((min(chunk, n - i), n))
    zb = zarr.create_array(str(b_path), shape=(n, 1), dtype="float64", chunks=(chunk, 1), compressors=None)
    zb[...] = rng.standard_normal((n, 1))
    return a_path, b_path


def normal_equations_residual(a_path: Path, b_path: Path, x: np.ndarray, lam: float, strip: int,
                              power_steps: int = 6) -> dict:
    """``||A^T (b - A x) - lam^2 x|| / (||K|| ||x|| + ||A^T b||)``, ``K = A^T A + lam^2 I``, streaming
    ``A`` in row strips (bounded memory at any size).

    ``||K||_2`` is estimated from below by ``power_steps`` power iterations on ``A^T A`` (a smaller
    norm makes the ratio larger: the check is at least as strict as with the true norm).
    """
    import zarr

    za, b = zarr.open_array(str(a_path)), zarr.open_array(str(b_path))[...]
    m, n = za.shape

    def strips():
        for i in range(0, m, strip):
            yield i, za[i:i + strip, :]

    atr, atb = np.zeros_like(x), np.zeros_like(x)
    for i, s in strips():
        bi = b[i:i + s.shape[0]]
        atr += s.T @ (bi - s @ x)
        atb += s.T @ bi
    v = np.random.default_rng(0).standard_normal(n)
    v /= np.linalg.norm(v)
    norm_ata = 0.0
    for _ in range(power_steps):
        w = np.zeros(n)
        for _, s in strips():
            w += s.T @ (s @ v)
        norm_ata = float(np.linalg.norm(w))
        v = w / norm_ata
    norm_k = norm_ata + lam**2
    res = float(np.linalg.norm(atr - lam**2 * x))
    return {"relative": res / (norm_k * float(np.linalg.norm(x)) + float(np.linalg.norm(atb))),
            "norm_k": norm_k, "cond_bound": 1 + norm_ata / lam**2}


def run_tikhonov(folder: Path, args: argparse.Namespace) -> None:
    """``min ||A x - b||^2 + lam^2 ||x||^2`` for a square ``A`` whose Gram matrix exceeds the budget.

    First at ``--tikhonov-check`` (small) against the in-memory reference ``cho_solve(A^T A + lam^2 I,
    A^T b)`` (the same route, a budget scaled so its Gram matrix exceeds it by the same ratio), then
    at ``--tikhonov`` alone. Accuracy of both: the relative residual of the regularized normal
    equations, ``||A^T (b - A x) - lam^2 x|| / (||A^T A + lam^2 I||_2 ||x|| + ||A^T b||)``, from a
    streaming check; peak memory over the child's import baseline against the budget + 10%.
    """
    import zarr
    from scipy.linalg import cho_factor, cho_solve

    from blocklin.config import parse_size

    budget = parse_size(args.tikhonov_memory)
    for n, small in ((args.tikhonov_check, True), (args.tikhonov, False)):
        if not n:
            continue
        # the small run: the large run's ratio of Gram matrix to budget and of chunk to n (within reason)
        ratio = (args.tikhonov or n) ** 2 * 8 / budget
        memory = budget if not small else max(8 * 2**20, int(n * n * 8 / ratio))
        chunk = args.chunk if not small else max(64, 2 ** int(np.log2(max(1, args.chunk * n / (args.tikhonov or n)))))
        a_path, b_path = make_tikhonov(folder, n, chunk)
        out = folder / f"Tx{n}.zarr"
        r = run_child(TIKHONOV_CHILD, str(a_path), str(b_path), str(out), str(memory), str(args.lam))
        print(f"\nTikhonov, {n} x {n} float64 ({n * n * 8 / 2**20:.0f} MiB, Gram matrix as large, "
              f"{n * n * 8 / memory:.1f}x the budget), lam {args.lam}, memory {memory / 2**20:.0f} MiB")
        if "error" in r:
            print(f"failed: {r['error']}")
            continue
        x = zarr.open_array(str(out))[...]
        chk = normal_equations_residual(a_path, b_path, x, args.lam, chunk)
        within = r["peak"] <= 1.1 * memory
        print(f"{r['seconds']:.1f} s, peak {r['peak'] / 2**20:.0f} MiB over baseline "
              f"({r['peak'] / memory:.2f}x the budget: {'within' if within else 'OVER'} budget + 10%), "
              f"Gram tiles {r['gram_tile']} (A's chunks {chunk}), method {r['method']} (Gram {r['gram']})")
        print(f"residual norm ||A x - b|| {r['residual_norm']:.6e}; normal equations relative residual "
              f"{chk['relative']:.1e} (||K||_2 ~ {chk['norm_k']:.3e}, cond(K) <= {chk['cond_bound']:.1e})")
        if small:
            a, b = zarr.open_array(str(a_path))[...], zarr.open_array(str(b_path))[...]
            k = a.T @ a
            k[np.diag_indices_from(k)] += args.lam**2
            ref = cho_solve(cho_factor(k), a.T @ b)
            print(f"against the in-memory cho_solve: ||x - x_ref|| / ||x_ref|| = "
                  f"{np.linalg.norm(x - ref) / np.linalg.norm(ref):.1e}")
            del a, k
        shutil.rmtree(a_path, ignore_errors=True)
        shutil.rmtree(out, ignore_errors=True)


def _llt_error(a: np.ndarray, low: np.ndarray, step: int = 2048) -> float:
    """``||A - L L^T||_F`` by row blocks: one 16384 x 16384 product with a transposed operand crashed
    NumPy's bundled OpenBLAS here (a segfault inside dgemm), and blocks need less memory too."""
    total = 0.0
    for i in range(0, a.shape[0], step):
        total += float(np.linalg.norm(a[i:i + step] - low[i:i + step] @ low.T)) ** 2
    return total ** 0.5


def make_spd(path: Path, n: int, chunk: int, seed: int = 0) -> None:
    """A symmetric, diagonally dominant (hence SPD) ``n x n`` matrix, written chunk by chunk."""
    import zarr

    rng = np.random.default_rng(seed)
    z = zarr.create_array(str(path), shape=(n, n), dtype="float64", chunks=(chunk, chunk), compressors=None)
    for i in range(0, n, chunk):
        for j in range(0, i + 1, chunk):
            blk = rng.uniform(-1, 1, (min(chunk, n - i), min(chunk, n - j)))
            if i == j:
                blk = np.tril(blk) + np.tril(blk, -1).T + n * np.eye(blk.shape[0])
            z[i:i + blk.shape[0], j:j + blk.shape[1]] = blk
            if i != j:
                z[j:j + blk.shape[1], i:i + blk.shape[0]] = blk.T


def make_random(folder: Path, args: argparse.Namespace) -> Path:
    """The random square matrix ``G`` of the LU and square-solve benchmarks (written once)."""
    g_path = folder / "G.zarr"
    if g_path.exists():
        return g_path
    _random_zarr(g_path, args.n, args.n, args.chunk, seed=2)
    return g_path


def _random_zarr(path: Path, m: int, n: int, chunk: int, *, seed: int):
    """An ``m x n`` float64 zarr array of standard normal entries in ``chunk``-square uncompressed
    chunks, written a row of chunks at a time."""
    import zarr

    z = zarr.create_array(str(path), shape=(m, n), dtype="float64", chunks=(chunk, chunk), compressors=None)
    rng = np.random.default_rng(seed)
    for i in range(0, m, chunk):
        z[i:i + chunk, :] = rng.standard_normal((min(chunk, m - i), n))
    return z


def run_lu(folder: Path, args: argparse.Namespace) -> None:
    g_path = make_random(folder, args)
    print(f"\nLU, n = {args.n} float64, random entries")
    print(f"{'variant':10} {'seconds':>8} {'peak MiB':>9}  notes")
    for variant in ("blocklin", "scipy", "dask"):
        out = str(folder / f"LU-{variant}.zarr")
        proc = subprocess.run([sys.executable, "-c", LU_CHILD, variant, str(g_path), out, args.memory],
                              capture_output=True, text=True)
        if proc.returncode != 0:
            print(f"{variant:10} failed: {proc.stderr.strip().splitlines()[-1]}")
            continue
        r = json.loads(proc.stdout.strip().splitlines()[-1])
        notes = f"growth factor {r['growth_factor']:.1f}, panels of {r['tile']}" if "growth_factor" in r else ""
        print(f"{variant:10} {r['seconds']:8.2f} {r['peak'] / 2**20:9.0f}  {notes}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=4096)
    ap.add_argument("--chunk", type=int, default=512)
    ap.add_argument("--memory", default="64MiB")
    ap.add_argument("--dir")
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--lu", action="store_true", help="also benchmark the LU factorization")
    ap.add_argument("--qr", action="store_true", help="also benchmark QR on a tall n x n/4 matrix")
    ap.add_argument("--qr-square", action="store_true",
                    help="also benchmark QR on the square n x n matrix (tile QR, column panels, NumPy)")
    ap.add_argument("--rows", type=int, help="rows of the --qr-square matrix (default n: square; more: tall)")
    ap.add_argument("--gen-solve", action="store_true", help="also benchmark square solves (LU, mixed precision)")
    ap.add_argument("--gen-variants", default="blocklin,blocklin-mixed,scipy,dask",
                    help="comma-separated variants of --gen-solve (e.g. blocklin,scipy)")
    ap.add_argument("--no-cholesky", action="store_true", help="skip the Cholesky and SPD-solve part")
    ap.add_argument("--tikhonov", type=int, metavar="N", help="also a Tikhonov solve of a random N x N matrix")
    ap.add_argument("--tikhonov-memory", default="512MiB", help="budget of the Tikhonov solve")
    ap.add_argument("--tikhonov-check", type=int, default=2000, metavar="N",
                    help="size of the Tikhonov run checked against an in-memory reference first (0: skip)")
    ap.add_argument("--lam", type=float, default=1.0, help="lambda of the Tikhonov solve")
    args = ap.parse_args()
    folder = Path(args.dir or tempfile.mkdtemp(prefix="blocklin-bench-factor-"))
    folder.mkdir(parents=True, exist_ok=True)
    try:
        if not args.no_cholesky:
            run_cholesky(folder, args)
        if args.lu:
            run_lu(folder, args)
        if args.gen_solve:
            run_gen_solve(folder, make_random(folder, args), args)
        if args.qr:
            run_qr(folder, args)
        if args.qr_square:
            run_qr_square(folder, args)
        if args.tikhonov:
            run_tikhonov(folder, args)
    finally:
        if not args.keep:
            shutil.rmtree(folder, ignore_errors=True)


def run_cholesky(folder: Path, args: argparse.Namespace) -> None:
    """Cholesky and the SPD solve: blocklin, SciPy, Dask."""
    import zarr

    a_path, b_path = folder / "A.zarr", folder / "b.zarr"
    make_spd(a_path, args.n, args.chunk)
    zb = zarr.create_array(str(b_path), shape=(args.n, 1), dtype="float64", chunks=(args.chunk, 1),
                           compressors=None)
    zb[...] = np.random.default_rng(1).standard_normal((args.n, 1))
    a = zarr.open_array(str(a_path))[...]
    b = zarr.open_array(str(b_path))[...]
    na = np.linalg.norm(a)
    rows = []
    for variant in ("blocklin", "scipy", "dask"):
        out, x_out = folder / f"L-{variant}.zarr", folder / f"x-{variant}.zarr"
        proc = subprocess.run([sys.executable, "-c", CHILD, variant, str(a_path), str(b_path), str(out),
                               str(x_out), args.memory], capture_output=True, text=True)
        if proc.returncode != 0:
            rows.append({"variant": variant, "error": proc.stderr.strip().splitlines()[-1]})
            continue
        r = json.loads(proc.stdout.strip().splitlines()[-1])
        low = zarr.open_array(str(out))[...]
        x = zarr.open_array(str(x_out))[...].reshape(args.n, -1)
        r["factor_backward_error"] = _llt_error(a, low) / na
        r["solve_backward_error"] = float(np.linalg.norm(b - a @ x) / (na * np.linalg.norm(x) + np.linalg.norm(b)))
        r["variant"] = variant
        rows.append(r)
        del low, x
    print(f"n = {args.n} float64 ({args.n**2 * 8 / 2**20:.0f} MiB), chunks {args.chunk}, blocklin memory "
          f"{args.memory}")
    print(f"{'variant':10} {'factor s':>9} {'solve s':>8} {'peak MiB':>9} {'||A-LL^T||/||A||':>17} "
          f"{'solve eta':>10}")
    for r in rows:
        if "error" in r:
            print(f"{r['variant']:10} failed: {r['error']}")
            continue
        print(f"{r['variant']:10} {r['factor_seconds']:9.2f} {r['solve_seconds']:8.2f} {r['peak'] / 2**20:9.0f} "
              f"{r['factor_backward_error']:17.1e} {r['solve_backward_error']:10.1e}")
    from blocklin.device.cpu import THREADED_POTRF_MAX

    if args.n > THREADED_POTRF_MAX:
        print(f"(scipy factored on one BLAS thread: n > {THREADED_POTRF_MAX}, where the threaded OpenBLAS potrf "
              "of the wheels crashes)")


if __name__ == "__main__":
    main()
