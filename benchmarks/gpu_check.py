"""One-command GPU check: correctness of every GPU operation, out-of-core GEMM vs in-core cuBLAS, mixed
inverse, each timing against its roofline.

Runs in the current interpreter with whichever CuPy imports (a CUDA 12 or 13 build: ``cupy-cuda12x``
from the ``gpu`` extra, or the CuPy of a machine's own image); it installs nothing. On a machine that
reaches no package registry (the lent H200), carry wheels of the pure-Python packages its image lacks
(blocklin's dependencies: ``pip download --no-deps -d .whl PACKAGE==VERSION`` elsewhere), install them
into a folder there and put it and the repository on ``PYTHONPATH``, as ``benchmarks/gpu_first_call.sh``
does::

    python3 -m pip install --no-index --no-deps --target /tmp/site .whl/*.whl
    PYTHONPATH=/tmp/site:$PWD python3 benchmarks/gpu_check.py --dir /dev/shm

The defaults took about 100 s on one H200 (correctness checks and timings, operands on tmpfs; a run
without a record in the repository, see docs/gpu.md), plus some 10 s for the rates of step 0;
``--n``/``--inv-n`` size the timed parts, ``--skip-checks``/``--skip-timing`` run one half. The
whole summary (versions, GPU, rates, every check and timing) is written as JSON to
``benchmarks/results/gpu-DATE.json`` after every step (``--json PATH`` elsewhere; ``--dry-run`` writes
none unless given ``--json``): commit it with any figure quoted in the docs. A step that fails is
recorded in the summary and the next one still runs.

Steps:

0. The roofline's rates: ``blocklin calibrate`` on the GPU (cached in this machine's rates cache: the
   in-core GEMM rate per arithmetic, float64, float32 and float32 on TF32 tensor cores, by cuBLAS
   through ``CudaDevice.gemm_acc``, with the host feed, write and CPU rates), then the raw feed limit
   of ``--dir`` by ``benchmarks/feed.py``'s raw read (chunk files read by 1..all cores' threads into
   reused buffers, the best), added to the same cache entry. Every GPU job's report then carries its
   roofline from them (``roofline_seconds``, ``roofline_efficiency``), and each timing below prints it.
1. Correctness on the GPU against NumPy/SciPy: every dense device operation (GEMM accumulate, TF32
   GEMM, SYRK, Cholesky, triangular solves, QR, SVD, eigh, leaf inverse) and every public
   operation (``matmul`` with transposes/alpha/beta/casts and ``precision="float32"``/``"tf32"``,
   ``inv`` in float64, mixed and TF32 precision, ``solve`` tall, wide, SPD (also with
   ``precision="mixed"``/``"tf32"``) and by the normal equations (Gram pass), ``cholesky``,
   ``solve_triangular``, ``lu``, ``svd`` with every method in memory and streamed, ``eigsh``,
   ``pca``, ``orthonormalize``) at small sizes with per-dtype tolerances.
2. Out-of-core GEMM, float64 and float32, n x n operands in zarr on local disk with a device budget
   smaller than the operands, against in-core ``cupy.matmul`` on the same sizes (operands already on
   the GPU, timed with CUDA events). The overlap figure is the fraction of the k-loop during which
   the GPU computes: the sum of the GEMM kernel times (CUDA events around every GEMM) over the span
   from the first GEMM's start to the last GEMM's end, per tile stream. Then the float64 operands
   again with ``precision="tf32"`` (float32 tiles, TF32 tensor cores): time against the float64
   run and the error against the float64 result.
3. ``inv`` with ``precision="mixed"`` (float32 GEMMs) and ``"tf32"`` (TF32 tensor cores) against
   ``precision="float64"``, at a budget of a quarter of the matrix (``--inv-memory``) so that all three
   run the out-of-core recursion (in core the mixed requests run the float64 one-task inverse):
   time and backward error ``||I - A X||_F / (||A||_F ||X||_F)``; the
   out-of-core SPD solve (``solve(assume_a="pos")``, tiled Cholesky) likewise, with its backward
   error ``||b - A x||_F / (||A||_F ||x||_F + ||b||_F)``.

Prints one JSON summary on the last line; exits 1 when a correctness check fails, 2 without a GPU.
``--device cpu`` runs the same code paths on the CPU (overlap and roofline figures need CUDA);
``--dry-run`` runs every step at small sizes (on the GPU when one is visible, else the CPU: a check
of the script itself, which the test suite runs on the CuPy stand-in); ``--quick-checks`` checks
only the dense device kernels (seconds). Each correctness entry carries the operation's ``phases``
(where each phase ran); ``phases_elsewhere`` lists the operations with a phase that ran off the
requested device (for example LU's panel ``getrf``, which stays on the host; phases that did not run
are not counted).
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
#: Where the summaries of runs on GPU machines are kept (see its README.md).
RESULTS = ROOT / "benchmarks" / "results"


def _eps(dtype: Any) -> float:
    return float(np.finfo(np.dtype(dtype)).eps)


def _check(out: list[dict], name: str, dtype: Any, err: float, tol: float, **extra: Any) -> None:
    out.append({"check": name, "dtype": np.dtype(dtype).name, "error": float(err), "tol": float(tol),
                "ok": bool(err <= tol), **extra})


def _where(result: Any) -> dict:
    """Where each phase of a public operation ran (its report's ``phases``)."""
    report = getattr(result, "report", None) or {}
    return {"phases": report.get("phases"), "device": report.get("device")}


def _roof(report: dict) -> dict:
    """A job report's roofline entries (GPU jobs; ``{}`` elsewhere): see ``Job.report``."""
    return {k: report[k] for k in ("roofline_seconds", "roofline_efficiency", "roofline") if k in report}


def _roof_text(entry: dict) -> str:
    """``; roofline 0.42 s (measured rates): 31% of it`` for an entry with a roofline, else ``""``."""
    eff = entry.get("roofline_efficiency")
    if eff is None:
        return ""
    rl = entry.get("roofline") or {}
    which = "measured" if all(str(rl.get(k, "")).startswith("measured") for k in ("gflops_source", "feed_source")) \
        else "default or partly default"
    return f"; roofline {entry['roofline_seconds']:.3g} s ({which} rates, bound by {rl.get('bound')}): {eff:.0%} of it"


def ran_elsewhere(where: Any, device: str) -> bool:
    """Whether a phase ran, and ran (at least in part) off ``device``: its value names devices
    (``"cpu"``, ``"gpu"``, ``"cpu/gpu"``); None (a phase that did not run) or a description
    (``"spilled to the work folder ..."``) is not a place it ran."""
    if not isinstance(where, str):
        return False
    parts = where.split("/")
    return all(p in ("cpu", "gpu") for p in parts) and any(p != device for p in parts)


def phases_elsewhere(checks: list[dict], device: str) -> dict:
    """The checks with a phase that ran off ``device`` (reads and writes aside), with all their phases."""
    return {c["check"]: c["phases"] for c in checks if c.get("phases") and any(
        ran_elsewhere(v, device) for k, v in c["phases"].items() if not k.startswith(("read", "reads")))}


# -- 0. the roofline's rates, and what ran ------------------------------------------------------------
def _dist_version(name: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def _cuda_version(v: Any) -> str | None:
    """CUDA's integer version (13000) as ``"13.0"``."""
    return None if v is None else f"{int(v) // 1000}.{int(v) % 1000 // 10}"


def environment() -> dict:
    """The versions and the machine a run's figures belong to: Python, NumPy, SciPy, Dask, zarr, CuPy
    (which build: ``cupy-cuda12x``, ``cupy-cuda13x``, ...), the CUDA runtime and driver, the GPU."""
    import dask
    import scipy
    import zarr

    import blocklin

    env: dict[str, Any] = {"python": platform.python_version(), "platform": platform.platform(),
                           "cores": os.cpu_count(), "blocklin": getattr(blocklin, "__version__", None),
                           "numpy": np.__version__, "scipy": scipy.__version__, "dask": dask.__version__,
                           "distributed": _dist_version("distributed"), "zarr": zarr.__version__}
    try:
        import cupy

        env["cupy"] = cupy.__version__
        if str(getattr(cupy, "__file__", "")).endswith("cupy_standin.py"):
            env["cupy_package"] = "the CuPy stand-in (tests/support/cupy_standin.py)"
        else:
            env["cupy_package"] = next((f"{d} {_dist_version(d)}" for d in ("cupy-cuda13x", "cupy-cuda12x",
                                                                              "cupy-cuda11x", "cupy")
                                        if _dist_version(d)), None)
        rt = cupy.cuda.runtime
        for key, fn in (("cuda_runtime", "runtimeGetVersion"), ("cuda_driver", "driverGetVersion")):
            env[key] = _cuda_version(getattr(rt, fn)()) if hasattr(rt, fn) else None
        from blocklin.device.calibrate import gpu_name

        env["gpu"] = gpu_name()
        env["gpu_memory_bytes"] = int(rt.memGetInfo()[1])
    except Exception as exc:  # noqa: BLE001 - no CuPy or no GPU: recorded, the check says so later
        env["cupy_error"] = f"{type(exc).__name__}: {exc}"
    return env


def _feed_module() -> Any:
    """``benchmarks/feed.py`` (its raw read is the feed limit: not duplicated here)."""
    spec = importlib.util.spec_from_file_location("blocklin_feed_benchmark", ROOT / "benchmarks" / "feed.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def raw_feed_limit(where: str, gib: float, *, small: bool = False, repeats: int = 3) -> dict:
    """The raw read limit of ``where``: an uncompressed float64 zarr of ``gib`` GiB (8 MiB chunks; 128 KiB
    with ``small``) written by ``benchmarks/feed.py``'s ``make``, read once into the page cache, then
    read by 1..all cores' threads (its ``raw_read``), ``repeats`` rounds, the best rate (10^9 bytes/s)."""
    feed = _feed_module()
    cols, chunk_rows = (128, 256) if small else (512, 2048)
    m = max(chunk_rows, int(gib * 2**30) // (8 * cols) // chunk_rows * chunk_rows)
    cores = os.cpu_count() or 1
    threads = sorted({t for t in (1, 2, 4, 8, 16, 32, 64, cores) if t <= cores})
    work = tempfile.mkdtemp(prefix="blocklin-rawfeed-", dir=where)
    try:
        path = os.path.join(work, "a.zarr")
        feed.make(path, m, cols, chunk_rows, "none")
        files = feed.chunk_files(path)
        chunk_bytes = chunk_rows * cols * 8
        feed.raw_read(files, cores, chunk_bytes, "none")  # into the page cache (on tmpfs: already there)
        readers = {str(t): (lambda t=t: feed.raw_read(files, t, chunk_bytes, "none")) for t in threads}
        rates, _ = feed.best_rates(readers, m * cols * 8, repeats)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return {"dir": where, "operand_bytes": m * cols * 8, "chunk_bytes": chunk_rows * cols * 8,
            "gbps_by_threads": rates, "raw_feed_gbps": max(rates.values())}


def roofline_rates(kind: str, where: str, *, dry_run: bool, feed_gib: float) -> dict:
    """Step 0: ``blocklin calibrate`` on ``kind`` (its temp dir ``where``; cached for this machine), then
    the raw feed limit of ``where`` added to the same cache entry. Returns both, and the rates cached."""
    import contextlib
    import dataclasses
    import io

    from blocklin.cli.main import main as blocklin_main
    from blocklin.plan.rates import Rates, load_rates, save_rates

    argv = ["calibrate", "--device", kind, "--temp-dir", where, "--json"]
    if dry_run:
        argv += ["--size", "1MiB", "--gemm-size", "64"]
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = blocklin_main(argv)
    if rc != 0:
        raise RuntimeError(f"blocklin calibrate exited with {rc}: {out.getvalue()[-500:]}")
    calibrated = json.loads(out.getvalue().strip().splitlines()[-1])
    raw = raw_feed_limit(where, feed_gib, small=dry_run)
    key = calibrated["key"]
    rates = load_rates(key.rsplit("/", 1)[1])
    if rates.key == key:  # the entry calibrate just wrote: the feed limit measured beside it
        rates = dataclasses.replace(rates, raw_feed_gbps=raw["raw_feed_gbps"])
        save_rates(rates)
    else:  # pragma: no cover - another process replaced the cache in between
        rates = Rates.from_dict({**calibrated["rates"], "raw_feed_gbps": raw["raw_feed_gbps"]})
    return {"calibrate": calibrated, "raw_feed": raw, "rates": rates.to_dict(), "cache": calibrated["path"]}


# -- 1. correctness ----------------------------------------------------------------------------------
def device_checks(kind: str) -> list[dict]:
    """Every dense device operation against NumPy (errors relative to the operands' scale)."""
    from blocklin.device import get_device

    dev = get_device(kind)
    rng = np.random.default_rng(0)
    out: list[dict] = []
    for dtype in ("float32", "float64"):
        # Backward-stable kernels on well-conditioned inputs of size <= 300: errors of a few
        # hundred eps relative to the operands' magnitude (n * eps with n = 300 plus margin).
        tol = 1000 * _eps(dtype)
        a = rng.standard_normal((300, 64)).astype(dtype)
        b = rng.standard_normal((64, 50)).astype(dtype)
        a64, b64 = a.astype(np.float64), b.astype(np.float64)
        h = dev.to_host
        acc = dev.zeros((300, 50), dtype)
        dev.gemm_acc(acc, dev.to_device(a), dev.to_device(b))
        dev.gemm_acc(acc, dev.to_device(a), dev.to_device(b))
        ref = 2 * a64 @ b64
        _check(out, "gemm_acc", dtype, np.abs(h(acc) - ref).max() / np.abs(ref).max(), tol)
        if dtype == "float32" and kind == "gpu":
            acc = dev.zeros((300, 50), dtype)
            with dev.math("tf32"):
                dev.gemm_acc(acc, dev.to_device(a), dev.to_device(b))
            err = np.abs(h(acc) - a64 @ b64).max() / (np.abs(a64) @ np.abs(b64)).max()
            _check(out, "gemm_acc_tf32", dtype, err, 4 * 2.0**-11)  # inputs rounded to 10 mantissa bits
        g = dev.zeros((64, 64), dtype)
        dev.syrk_acc(g, dev.to_device(a))
        ref = a64.T @ a64
        _check(out, "syrk_acc", dtype, np.abs(h(g) - ref).max() / np.abs(ref).max(), tol)
        spd = (ref + 64 * np.eye(64)).astype(dtype)
        low = h(dev.cholesky(dev.to_device(spd)))
        _check(out, "cholesky", dtype, np.abs(low.astype(np.float64) @ low.T - spd).max() / np.abs(spd).max(), tol)
        x = h(dev.solve_triangular(dev.to_device(low), dev.to_device(b), lower=True))
        _check(out, "solve_triangular", dtype,
               np.abs(low.astype(np.float64) @ x - b64).max() / (np.abs(low).max() * np.abs(x).max()), tol)
        q, r = (h(t) for t in dev.qr(dev.to_device(a)))
        _check(out, "qr", dtype, max(np.abs(q.astype(np.float64) @ r - a64).max() / np.abs(a64).max(),
                                     np.abs(q.T.astype(np.float64) @ q - np.eye(64)).max()), tol)
        u, s, vt = (h(t) for t in dev.svd(dev.to_device(a)))
        _check(out, "svd", dtype, np.abs((u * s).astype(np.float64) @ vt - a64).max() / np.abs(a64).max(), tol)
        w, v = (h(t) for t in dev.eigh(dev.to_device(spd)))
        _check(out, "eigh", dtype, np.abs((v * w).astype(np.float64) @ v.T - spd).max() / np.abs(spd).max(), tol)
        inv = h(dev.inv(dev.to_device(spd)))
        cond = np.linalg.cond(spd.astype(np.float64))
        _check(out, "inv_leaf", dtype, np.abs(spd.astype(np.float64) @ inv - np.eye(64)).max(), tol * cond)
    return out


def operation_checks(kind: str, tmp: str) -> list[dict]:
    """Every public operation with ``device=kind`` against NumPy at small sizes."""
    import blocklin as bl

    rng = np.random.default_rng(1)
    out: list[dict] = []
    budget = {"memory": "8MiB", "device_memory": "4MiB"}
    for dtype in ("float32", "float64"):
        # blocked summation over k <= 1500: 4 k eps relative error bound (see tests/conftest.py gemm_tol)
        for (m, n, k), ta, tb in [((1000, 700, 900), False, False), ((513, 1025, 257), True, False),
                                  ((300, 200, 1500), False, True), ((1, 999, 333), True, True)]:
            a = rng.standard_normal((k, m) if ta else (m, k)).astype(dtype)
            b = rng.standard_normal((n, k) if tb else (k, n)).astype(dtype)
            c0 = rng.standard_normal((m, n)).astype(dtype)
            res = bl.matmul(a, b, os.path.join(tmp, f"c-{dtype}-{m}-{ta}{tb}.zarr"), c=c0, alpha=0.5, beta=-1.0,
                            trans_a=ta, trans_b=tb, device=kind, **budget)
            ref = 0.5 * ((a.T if ta else a).astype(np.float64) @ (b.T if tb else b).astype(np.float64)) - c0
            err = np.abs(res.to_numpy() - ref).max() / max(1.0, np.abs(ref).max())
            _check(out, f"matmul {m}x{n}x{k} trans={ta},{tb}", dtype, err, 4 * k * _eps(dtype))
    a32 = rng.standard_normal((400, 300)).astype(np.float32)
    b64 = rng.standard_normal((300, 200))
    res = bl.matmul(a32, b64, os.path.join(tmp, "cast.zarr"), dtype="float64", device=kind, **budget)
    ref = a32.astype(np.float64) @ b64
    _check(out, "matmul float32 x float64 -> float64", "float64",
           np.abs(res.to_numpy() - ref).max() / np.abs(ref).max(), 4 * 300 * _eps(np.float64))
    a64 = rng.standard_normal((500, 400))
    for precision, u in (("float32", 2.0**-24), ("tf32", 2.0**-11)):
        b = rng.standard_normal((400, 150))
        res = bl.matmul(a64, b, os.path.join(tmp, f"prec-{precision}.zarr"), device=kind, precision=precision,
                        **budget)
        ref = a64 @ b
        # float32 (TF32: 10-bit mantissa) products: |error| <= (k + 2) u |A||B| (Higham 2002, eq. 3.13)
        err = (np.abs(res.to_numpy() - ref) / (np.abs(a64) @ np.abs(b))).max()
        _check(out, f"matmul float64 data, precision={precision}", "float64", err, (400 + 2) * u,
               compute_dtype=res.report["compute_dtype"], **_where(res))

    n = 600
    u, _ = np.linalg.qr(rng.standard_normal((n, n)))
    v, _ = np.linalg.qr(rng.standard_normal((n, n)))
    m = (u * np.logspace(0, -3, n)) @ v.T  # cond 1e3
    for precision, dtype in ((None, "float64"), ("mixed", "float64"), ("tf32", "float64")):
        if precision == "tf32":  # TF32's 1e-3 start needs a well-conditioned matrix to converge
            m = rng.standard_normal((n, n)) + np.sqrt(n) * np.eye(n)
        # 4 MiB: below the one-task inverse of this 2.9 MB matrix, so every precision runs the
        # out-of-core recursion (in core "mixed"/"tf32" run the float64 inverse instead)
        res = bl.inv(m, precision=precision, device=kind, memory="4MiB")
        x = res.to_numpy()
        eta = np.linalg.norm(np.eye(n) - m @ x) / (np.linalg.norm(m) * np.linalg.norm(x))
        # refined to float64 backward error: a small multiple of n * eps
        _check(out, f"inv precision={precision}", dtype, eta, n * _eps(np.float64), **_where(res))

    for shape in ((800, 60), (60, 800)):
        a = rng.standard_normal(shape)
        b = rng.standard_normal(shape[0])
        lam = 0.1
        res = bl.solve(a, b, lam=lam, device=kind, memory="4MiB")
        x = np.asarray(res.to_numpy() if hasattr(res, "to_numpy") else res).ravel()
        ref = np.linalg.solve(a.T @ a + lam**2 * np.eye(shape[1]), a.T @ b)
        # the regularized problem has cond <= 1 + (s1/lam)^2 ~ 1e5 here: 1e5 * eps margin
        _check(out, f"solve {shape[0]}x{shape[1]}", "float64",
               np.abs(x - ref).max() / np.abs(ref).max(), 1e5 * 100 * _eps(np.float64), **_where(res))

    out += guarded("factor checks", factor_checks, kind, rng)
    out += guarded("spectral checks", spectral_checks, kind, rng)
    return out


def guarded(name: str, fn: Any, *args: Any) -> list[dict]:
    """``fn(*args)``'s checks, or one failed check carrying the exception: one crash must not hide the
    other groups' results (a GPU run is scarce)."""
    import traceback

    try:
        return fn(*args)
    except Exception as exc:  # noqa: BLE001 - reported as a failed check with its traceback
        traceback.print_exc()
        return [{"check": f"{name} (raised)", "dtype": "-", "error": float("inf"), "tol": 0.0, "ok": False,
                 "exception": f"{type(exc).__name__}: {exc}"}]


def factor_checks(kind: str, rng: np.random.Generator) -> list[dict]:
    """Cholesky, triangular and SPD solves, LU, the Gram (normal-equation) solve against NumPy/SciPy."""
    import scipy.linalg

    import blocklin as bl

    out: list[dict] = []
    n = 500
    g = rng.standard_normal((n, n))
    spd = g @ g.T / n + np.eye(n)  # cond ~ 10
    kw = {"device": kind, "memory": "4MiB"}  # below the 2 MiB operand x 2: tiled
    low = bl.cholesky(spd, **kw)
    ref = np.linalg.cholesky(spd)
    # backward-stable factorization: ||L - L_ref|| <= cond * n * eps relative
    _check(out, "cholesky", "float64", np.abs(low.to_numpy() - ref).max() / np.abs(ref).max(),
           10 * n * _eps(np.float64), **_where(low))
    b = rng.standard_normal((n, 7))
    x = bl.solve_triangular(low, b, lower=True, **kw)
    xr = scipy.linalg.solve_triangular(ref, b, lower=True)
    _check(out, "solve_triangular", "float64", np.abs(x.to_numpy() - xr).max() / np.abs(xr).max(),
           10 * n * _eps(np.float64), **_where(x))
    xr = np.linalg.solve(spd, b)
    for precision in ("double", "mixed", "tf32"):
        x = bl.solve(spd, b, assume_a="pos", precision=precision, **kw)
        name = "solve assume_a='pos'" + ("" if precision == "double" else f", precision={precision}")
        # refined to float64 backward error (float32 factor for mixed/tf32): forward error <= cond * eta
        _check(out, name, "float64", np.abs(x.to_numpy() - xr).max() / np.abs(xr).max(),
               10 * n * _eps(np.float64), backward_error=x.report["backward_error"],
               refine_steps=x.report["refine_steps"], **_where(x))
    lu = bl.lu(g, **kw)
    packed, piv = lu.to_numpy(), np.asarray(lu.report["pivots"])
    l, u = np.tril(packed, -1) + np.eye(n), np.triu(packed)
    pa = g.copy()
    for i, p in enumerate(piv):  # LAPACK's row swaps, in order
        pa[[i, p]] = pa[[p, i]]
    # getrf's backward error: ||PA - LU|| <= growth * n * eps ||A||
    _check(out, "lu (P A = L U)", "float64", np.abs(pa - l @ u).max() / np.abs(g).max(),
           lu.report["growth_factor"] * n * 10 * _eps(np.float64), **_where(lu))
    a = rng.standard_normal((3000, 80))
    rhs = rng.standard_normal(3000)
    x = bl.solve(a, rhs, method="normal", device=kind, memory="1MiB")
    xr = np.linalg.lstsq(a, rhs, rcond=None)[0]
    # refined against the data: the least-squares solution to a few cond(A)^2 eps (cond ~ 1.4 here)
    _check(out, "solve tall, normal equations (Gram SYRK pass)", "float64",
           np.abs(np.asarray(x.to_numpy()).ravel() - xr).max() / np.abs(xr).max(), 1e4 * _eps(np.float64), **_where(x))
    return out


def spectral_checks(kind: str, rng: np.random.Generator) -> list[dict]:
    """svd (every method), eigsh, pca and orthonormalize against NumPy."""
    import blocklin as bl
    from blocklin.linalg.blocks.orth import orthonormalize

    out: list[dict] = []
    a = rng.standard_normal((2000, 100)) * np.logspace(0, -2, 100)
    s_ref = np.linalg.svd(a, compute_uv=False)
    res = bl.svd(a, 5, method="lanczos", seed=2, device=kind, memory="2MiB")
    _check(out, "svd lanczos k=5 (streamed)", "float64", np.abs(np.asarray(res.s) - s_ref[:5]).max() / s_ref[0],
           1e-8, **_where(res))
    # rank 8: the randomized methods are exact up to rounding (sketches wider than the rank)
    u, _ = np.linalg.qr(rng.standard_normal((1500, 8)))
    v, _ = np.linalg.qr(rng.standard_normal((120, 8)))
    lowrank = (u * np.logspace(0, -1, 8)) @ v.T
    s8 = np.linalg.svd(lowrank, compute_uv=False)[:5]
    for method in ("rsvd", "sketch", "lanczos"):
        for memory in ("16MiB", "1MiB"):  # in memory (A kept on the device), then streamed
            res = bl.svd(lowrank, 5, method=method, seed=2, device=kind, memory=memory)
            where = "in core" if res.report["in_core"] else "streamed"
            _check(out, f"svd {method} k=5 ({where})", "float64", np.abs(np.asarray(res.s) - s8).max() / s8[0],
                   1e-9, **_where(res))
    w = bl.eigsh(a.T @ a, 3, seed=0, device=kind, memory="1MiB")
    _check(out, "eigsh k=3", "float64", np.abs(np.sort(np.asarray(w.w)) - np.sort(s_ref[:3] ** 2)).max()
           / s_ref[0] ** 2, 1e-8, **_where(w))
    x = lowrank + 3.0  # PCA centers: the offset must not matter (rank <= 9 after centering: rsvd exact)
    p = bl.pca(x, 4, seed=1, device=kind, memory="16MiB")
    ev = np.linalg.svd(x - x.mean(axis=0), compute_uv=False)[:4] ** 2 / (x.shape[0] - 1)
    _check(out, "pca k=4", "float64", np.abs(np.asarray(p.explained_variance_) - ev).max() / ev[0], 1e-8,
           **_where(p))
    q, r = orthonormalize(a, device=kind, memory="16MiB")
    qs = q.to_numpy()
    _check(out, "orthonormalize (Householder in core)", "float64",
           max(np.abs(qs.T @ qs - np.eye(100)).max(), np.abs(qs @ r - a).max() / np.abs(a).max()),
           100 * 2000 * _eps(np.float64), **_where(q))
    return out


# -- 2. out-of-core GEMM vs in-core ------------------------------------------------------------------
def busy_fraction() -> dict:
    """GPU compute time over the k-loop span, from the CUDA events around every GEMM."""
    from blocklin.device.cuda import CudaDevice

    busy = span = 0.0
    for dev in CudaDevice.instances():
        b, s = dev.compute_timeline()
        busy, span = busy + b, span + s
    return {"gemm_seconds": busy, "k_loop_seconds": span, "busy_fraction": busy / span if span > 0 else None}


def ooc_gemm(kind: str, n: int, dtype: str, memory: str, device_memory: str, tmp: str) -> dict:
    import blocklin as bl

    chunk = min(4096, max(64, n // 4))
    a = bl.random(os.path.join(tmp, f"A{dtype}.zarr"), (n, n), seed=1, chunks=(chunk, chunk), dtype=dtype)
    b = bl.random(os.path.join(tmp, f"B{dtype}.zarr"), (n, n), seed=2, chunks=(chunk, chunk), dtype=dtype)
    flops = 2.0 * n**3
    plan = bl.matmul(a, b, memory=memory, device=kind, device_memory=device_memory, explain=True)
    profiling = kind == "gpu"
    if profiling:
        from blocklin.device.cuda import CudaDevice

        CudaDevice.profile(True)
    try:
        c = bl.matmul(a, b, os.path.join(tmp, f"C{dtype}.zarr"), memory=memory, device=kind,
                      device_memory=device_memory)
        overlap = busy_fraction() if profiling else {"busy_fraction": None}
    finally:
        if profiling:
            CudaDevice.profile(False)
    secs = c.report["seconds"]
    result = {"n": n, "dtype": dtype, "out_of_core_seconds": secs, "out_of_core_gflops": flops / secs / 1e9,
              "load_seconds": c.report["load_seconds"], "wait_seconds": c.report["wait_seconds"],
              "bytes_read": c.report["bytes_read"], "bytes_written": c.report["bytes_written"],
              "plan": plan.to_dict(), **overlap, **_roof(c.report)}
    # copies each host slot carries over the job: pinned from PIN_MIN_USES up (blocklin.device.cuda)
    result["slot_uses"] = plan.n_tasks * plan.k_steps / max(1, min(plan.prefetch + 1, plan.k_steps))
    result["in_core_gflops"] = in_core_gemm(kind, a, b, flops)
    result["ratio_vs_in_core"] = result["out_of_core_gflops"] / result["in_core_gflops"]
    if "roofline" in result:  # in core: the roofline is the GEMM rate alone (no bytes from storage)
        result["in_core_roofline_efficiency"] = result["in_core_gflops"] / result["roofline"]["gflops"]
    # spot-check the result: one row block against the in-core product of the same operands
    rows = slice(0, min(n, 256))
    ref = a[rows, :].astype(np.float64) @ b[...].astype(np.float64) if n <= 8192 else None
    if ref is not None:
        result["rel_error"] = float(np.abs(c[rows, :] - ref).max() / np.abs(ref).max())
    return result


def ooc_gemm_precision(kind: str, base: dict, precision: str, memory: str, device_memory: str, tmp: str) -> dict:
    """The float64 operands of ``base`` (an :func:`ooc_gemm` result) multiplied with ``precision=``: time
    against the float64 run, error against its float64 result."""
    import blocklin as bl

    n = base["n"]
    a, b = bl.open(os.path.join(tmp, "Afloat64.zarr")), bl.open(os.path.join(tmp, "Bfloat64.zarr"))
    profiling = kind == "gpu"
    if profiling:
        from blocklin.device.cuda import CudaDevice

        CudaDevice.profile(True)
    try:
        c = bl.matmul(a, b, os.path.join(tmp, f"C64-{precision}.zarr"), memory=memory, device=kind,
                      device_memory=device_memory, precision=precision)
        overlap = busy_fraction() if profiling else {"busy_fraction": None}
    finally:
        if profiling:
            CudaDevice.profile(False)
    secs = c.report["seconds"]
    rows = slice(0, min(n, 256))
    c64 = bl.open(os.path.join(tmp, "Cfloat64.zarr"))[rows, :]
    return {"n": n, "dtype": "float64", "precision": precision, "compute_dtype": c.report["compute_dtype"],
            "out_of_core_seconds": secs, "out_of_core_gflops": 2.0 * n**3 / secs / 1e9,
            "speedup_vs_float64": base["out_of_core_seconds"] / secs,
            "rel_error_vs_float64": float(np.abs(c[rows, :] - c64).max() / np.abs(c64).max()),
            "plan": c.report["plan"], **overlap, **_roof(c.report)}


def in_core_gemm(kind: str, a: Any, b: Any, flops: float) -> float:
    if kind != "gpu":
        x, y = a.to_numpy(), b.to_numpy()
        t = time.perf_counter()
        x @ y
        return flops / (time.perf_counter() - t) / 1e9
    import cupy as cp

    s = cp.cuda.Stream(non_blocking=True)
    with s:  # the uploads on the same stream as the product (the legacy stream is unordered with s)
        A, B = cp.asarray(a.to_numpy()), cp.asarray(b.to_numpy())
        cp.matmul(A[:256, :256], B[:256, :256])  # warm up cuBLAS
        e0, e1 = cp.cuda.Event(), cp.cuda.Event()
        e0.record(s)
        C = cp.matmul(A, B)
        e1.record(s)
    e1.synchronize()
    secs = cp.cuda.get_elapsed_time(e0, e1) / 1e3
    del A, B, C
    cp.get_default_memory_pool().free_all_blocks()
    return flops / max(secs, 1e-9) / 1e9


# -- 3. mixed-precision inverse ----------------------------------------------------------------------
def mixed_inverse(kind: str, n: int, memory: str | None, device_memory: str, tmp: str) -> dict:
    """``inv`` in float64, mixed and TF32 precision at a budget of a quarter of the matrix (``memory``
    None), where all three run the out-of-core recursion: in core, "mixed" and "tf32" run the float64
    one-task inverse, which is faster there."""
    import blocklin as bl

    rng = np.random.default_rng(3)
    m = rng.standard_normal((n, n)) + n**0.5 * np.eye(n)  # well conditioned (cond ~ 10)
    src = bl.from_array(m, os.path.join(tmp, "M.zarr"), chunks=(min(n, 2048), min(n, 2048)))
    memory = memory or f"{max(4, n * n * 8 // 4 >> 20)}MiB"
    out: dict[str, Any] = {"n": n, "memory": memory}
    for precision in ("float64", "mixed", "tf32"):
        x = bl.inv(src, precision=precision, device=kind, memory=memory, out=os.path.join(tmp, f"X{precision}.zarr"))
        xs = x.to_numpy()
        eta = float(np.linalg.norm(np.eye(n) - m @ xs) / (np.linalg.norm(m) * np.linalg.norm(xs)))
        out[precision] = {"seconds": x.report["seconds"], "backward_error": eta, "method": x.report["method"],
                          "work_dtype": x.report["work_dtype"], "refine_steps": x.report["refine_steps"],
                          "bytes_read": x.report.get("bytes_read"), **_roof(x.report)}
        shutil.rmtree(os.path.join(tmp, f"X{precision}.zarr"), ignore_errors=True)
    out["speedup_mixed"] = out["float64"]["seconds"] / out["mixed"]["seconds"]
    out["speedup_tf32"] = out["float64"]["seconds"] / out["tf32"]["seconds"]
    return out


def mixed_solve(kind: str, n: int, memory: str, tmp: str) -> dict:
    """The out-of-core SPD solve (tiled Cholesky, refinement) in float64, mixed and TF32 precision."""
    import blocklin as bl

    rng = np.random.default_rng(4)
    g = bl.random(os.path.join(tmp, "G.zarr"), (n, n), seed=5, chunks=(min(n, 2048),) * 2)
    # A = G G^T / n + I (cond ~ 5, SPD) formed out of core, then solved against 4 right-hand sides
    a = bl.matmul(g, g, os.path.join(tmp, "S.zarr"), trans_b=True, alpha=1.0 / n, device=kind, memory=memory)
    spd = a.to_numpy() + np.eye(n)
    src = bl.from_array(spd, os.path.join(tmp, "SPD.zarr"), chunks=(min(n, 2048),) * 2)
    b = rng.standard_normal((n, 4))
    out: dict[str, Any] = {"n": n}
    for precision in ("double", "mixed", "tf32"):
        x = bl.solve(src, b, assume_a="pos", precision=precision, device=kind, memory=memory,
                     out=os.path.join(tmp, f"x-{precision}.zarr"))
        out[precision] = {"seconds": x.report["seconds"], "backward_error": x.report["backward_error"],
                          "refine_steps": x.report["refine_steps"], "factor_dtype": x.report["factor_dtype"],
                          **_roof(x.report)}
    out["speedup_mixed"] = out["double"]["seconds"] / out["mixed"]["seconds"]
    out["speedup_tf32"] = out["double"]["seconds"] / out["tf32"]["seconds"]
    return out


# -- driver ------------------------------------------------------------------------------------------
def run_timings(args: argparse.Namespace, summary: dict, timed_step: Any, tmp: str) -> None:
    """Steps 2 and 3, each recorded (or its failure) before the next starts."""
    if args.device == "gpu" and not args.dry_run:
        # CuPy compiles each elementwise kernel on its first use in a machine (seconds in all, kept in
        # ~/.cupy/kernel_cache): run every timed step once at a small size so the timings do not hold it
        t0 = time.perf_counter()
        warm = os.path.join(tmp, "warm-up")
        os.makedirs(warm)
        ooc_gemm_precision(args.device, ooc_gemm(args.device, 512, "float64", "64MiB", "8MiB", warm), "tf32",
                           "64MiB", "8MiB", warm)
        ooc_gemm(args.device, 512, "float32", "64MiB", "8MiB", warm)
        mixed_inverse(args.device, 512, None, "8MiB", warm)
        mixed_solve(args.device, 512, "1MiB", warm)
        shutil.rmtree(warm, ignore_errors=True)
        summary["warm_up_seconds"] = time.perf_counter() - t0
    gemm = []
    for dt in ("float64", "float32"):
        g = timed_step(f"gemm_{dt}", ooc_gemm, args.device, args.n, dt, args.memory, args.device_memory, tmp)
        if "error" not in g:
            gemm.append(g)
            bf = g["busy_fraction"]
            eff = g.get("in_core_roofline_efficiency")
            print(f"out-of-core {g['dtype']} n={g['n']}: {g['out_of_core_gflops']:.0f} GFLOP/s vs in-core "
                  f"{g['in_core_gflops']:.0f}{'' if eff is None else f' ({eff:.0%} of the measured rate)'} = "
                  f"{g['ratio_vs_in_core']:.2f}x; GPU computing {'n/a' if bf is None else f'{100 * bf:.0f}%'} "
                  f"of the k-loop{_roof_text(g)}", flush=True)
        summary.pop(f"gemm_{dt}")
    summary["gemm"] = gemm
    precision = []
    if gemm and gemm[0]["dtype"] == "float64":
        for p in ("float32", "tf32"):
            g = timed_step(f"gemm_{p}", ooc_gemm_precision, args.device, gemm[0], p, args.memory,
                           args.device_memory, tmp)
            summary.pop(f"gemm_{p}")
            if "error" not in g:
                precision.append(g)
                print(f"out-of-core float64 data, precision={p}: {g['out_of_core_gflops']:.0f} GFLOP/s, "
                      f"{g['speedup_vs_float64']:.2f}x the float64 run, error {g['rel_error_vs_float64']:.1e}"
                      f"{_roof_text(g)}", flush=True)
    summary["gemm_precision"] = precision
    sv = timed_step("solve", mixed_solve, args.device, args.inv_n, args.memory, tmp)
    if "error" not in sv:
        print(f"solve(assume_a='pos') n={sv['n']}: mixed {sv['speedup_mixed']:.2f}x, tf32 {sv['speedup_tf32']:.2f}x "
              f"the float64 time (eta {sv['mixed']['backward_error']:.1e}, {sv['tf32']['backward_error']:.1e})",
              flush=True)
        for p in ("double", "mixed", "tf32"):
            if _roof_text(sv[p]):
                print(f"  solve {p}: {sv[p]['seconds']:.3g} s{_roof_text(sv[p])}", flush=True)
    inv = timed_step("inverse", mixed_inverse, args.device, args.inv_n, args.inv_memory, args.device_memory, tmp)
    if "error" not in inv:
        print(f"inv n={inv['n']}: mixed {inv['mixed']['seconds']:.1f} s (eta {inv['mixed']['backward_error']:.1e})"
              f" vs float64 {inv['float64']['seconds']:.1f} s (eta {inv['float64']['backward_error']:.1e}): "
              f"{inv['speedup_mixed']:.2f}x; tf32 {inv['tf32']['seconds']:.1f} s "
              f"(eta {inv['tf32']['backward_error']:.1e}): {inv['speedup_tf32']:.2f}x", flush=True)
        for p in ("float64", "mixed", "tf32"):
            if _roof_text(inv[p]):
                print(f"  inv {p}: {inv[p]['seconds']:.3g} s{_roof_text(inv[p])}", flush=True)


def default_json_path(now: datetime.datetime | None = None) -> Path:
    """``benchmarks/results/gpu-YYYY-MM-DD.json`` (UTC), ``-2``, ``-3``, ... when that day has one already."""
    day = (now or datetime.datetime.now(datetime.timezone.utc)).strftime("%Y-%m-%d")
    path, i = RESULTS / f"gpu-{day}.json", 2
    while path.exists():
        path, i = RESULTS / f"gpu-{day}-{i}.json", i + 1
    return path


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="gpu", choices=("gpu", "cpu"))
    # the sizes of the one (unrecorded) H200 run of docs/gpu.md: about 100 s for the whole check
    p.add_argument("--n", type=int, default=16384, help="size of the out-of-core GEMM operands")
    p.add_argument("--inv-n", type=int, default=4096, help="size of the inverse and SPD solve comparisons")
    p.add_argument("--memory", default="32GiB", help="host budget")
    p.add_argument("--inv-memory", default=None, help="host budget of the inverse comparison (default: a quarter "
                   "of the matrix, so that every precision runs out of core)")
    p.add_argument("--device-memory", default="6GiB", help="device budget (below the operands' size)")
    p.add_argument("--dir", default=None, help="scratch directory (local disk; /dev/shm for tmpfs): the operands, "
                   "and the store whose raw read is the roofline's feed limit")
    p.add_argument("--feed-gib", type=float, default=1.0, help="GiB read to measure the raw feed limit (default 1)")
    p.add_argument("--skip-timing", action="store_true", help="correctness only (no rates, no timings)")
    p.add_argument("--skip-checks", action="store_true", help="timings only (no correctness step)")
    p.add_argument("--quick-checks", action="store_true", help="of the correctness step, only the dense device "
                   "kernels (seconds)")
    p.add_argument("--json", default=None, help="where to write the summary, after every step (default "
                   "benchmarks/results/gpu-DATE.json; none for --dry-run)")
    p.add_argument("--dry-run", action="store_true",
                   help="every step at small sizes, on the GPU when one is visible, else the CPU (checks the "
                        "script itself; no figures worth keeping)")
    args = p.parse_args(argv)
    from blocklin.device import gpu_available

    if args.dry_run:  # small sizes; the GPU when one is visible (the CuPy stand-in in the tests)
        args.device = "gpu" if gpu_available() else "cpu"
        args.n, args.inv_n, args.memory, args.device_memory = 384, 256, "4MiB", "1MiB"
        args.inv_memory = "320KiB"  # below the one-task inverse: the recursion, as at full size
    elif args.json is None:
        args.json = str(default_json_path())

    if args.device == "gpu" and not gpu_available():
        print("gpu_check: no CUDA device visible to CuPy (on a GPU machine, see this script's docstring for how "
              "to run it with the CuPy that imports there)", file=sys.stderr)
        return 2
    tmp = tempfile.mkdtemp(prefix="blocklin-gpucheck-", dir=args.dir)
    t0 = time.perf_counter()
    summary: dict[str, Any] = {"device": args.device, "argv": argv, "dry_run": args.dry_run,
                               "started": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                               "environment": environment()}

    def save() -> None:
        if args.json:
            Path(args.json).parent.mkdir(parents=True, exist_ok=True)
            Path(args.json).write_text(json.dumps(summary, default=str, indent=1))

    def timed_step(key: str, fn: Any, *a: Any) -> Any:
        """One timed step; a failure is recorded under ``key`` and the next step still runs."""
        import traceback

        try:
            summary[key] = fn(*a)
        except Exception as exc:  # noqa: BLE001 - reported in the summary, with the traceback on stderr
            traceback.print_exc()
            summary[key] = {"error": f"{type(exc).__name__}: {exc}"}
            summary["timing_errors"] = summary.get("timing_errors", 0) + 1
        save()
        return summary[key]

    try:
        save()
        if not args.skip_timing:
            r = timed_step("roofline_rates", lambda: roofline_rates(
                args.device, tmp, dry_run=args.dry_run, feed_gib=1 / 64 if args.dry_run else args.feed_gib))
            if "error" not in r:
                rt = r["rates"]
                print(f"roofline rates: in-core GEMM {rt['gpu_gflops'] or 0:.0f} GFLOP/s float64, "
                      f"{rt['gpu_gflops32'] or 0:.0f} float32, {rt['gpu_gflops_tf32'] or 0:.0f} TF32; raw feed "
                      f"{rt['raw_feed_gbps']:.2f} GB/s from {args.dir or tempfile.gettempdir()} "
                      f"(cached in {r['cache']})", flush=True)
        if args.skip_checks:
            checks = []
        elif args.quick_checks:
            checks = guarded("device checks", device_checks, args.device)
        else:
            checks = (guarded("device checks", device_checks, args.device)
                      + guarded("operation checks", operation_checks, args.device, tmp))
        for c in checks:
            print(f"{c['check']:40s} {c['dtype']:8s} err {c['error']:.1e} (tol {c['tol']:.0e}) "
                  f"{'ok' if c['ok'] else 'FAIL'}", flush=True)
        summary["correct"] = all(c["ok"] for c in checks)
        summary["checks"] = checks
        summary["phases_elsewhere"] = phases_elsewhere(checks, args.device)
        save()
        if not args.skip_timing:
            run_timings(args, summary, timed_step, tmp)
        summary["seconds"] = time.perf_counter() - t0
        save()
        print(json.dumps(summary, default=str))
        if args.json:
            print(f"gpu_check: summary written to {args.json}", file=sys.stderr)
        return 0 if summary["correct"] and not summary.get("timing_errors") else 1
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
