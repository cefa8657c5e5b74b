"""The demo job: multiply two matrices larger than the memory budget, out of core, and verify.

Used by ``blocklin demo``; also a worked example of the public API.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from blocklin.config import parse_size
from blocklin.create import random
from blocklin.linalg.products.gemm import matmul
from blocklin._memory import peak_rss


def _reset_peak() -> bool:
    """Reset this process's peak-RSS counter (Linux), so the GEMM's own peak can be read."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _status(field: str) -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def _demo_wrote(path: Path) -> bool:
    """Whether ``path`` is a store the demo wrote (blocklin provenance of ``random`` or ``matmul``)."""
    import json

    try:
        attrs = json.loads((path / "zarr.json").read_text()).get("attributes", {})
    except (OSError, ValueError):
        return False
    return attrs.get("blocklin", {}).get("operation") in ("random", "matmul")


def run_demo(*, n: int = 6144, memory: Any = "256MiB", dtype: str = "float64", folder: str | None = None,
             keep: bool = False, device: str | None = None, scheduler: Any = None, progress: Any = None,
             samples: int = 8, seed: int = 0) -> dict:
    """Create A and B (n x n, each larger than ``memory``), compute C = A @ B out of core, verify.

    Verification: ``samples`` full rows of C recomputed from the same stored A and B, plus
    Freivalds' check ``C x == A (B x)`` for a random vector, both against float64 references with
    the tolerance of the dtype (``8 * sqrt(n) * eps * |A||B|`` elementwise bound).
    """
    budget = parse_size(memory)
    base = Path(folder) if folder else Path(tempfile.mkdtemp(prefix="blocklin-demo-"))
    made = folder is None or not base.exists()  # a folder the user had is kept: only the demo's stores go
    base.mkdir(parents=True, exist_ok=True)
    try:
        t0 = time.perf_counter()
        A = random(base / "A.zarr", (n, n), dtype=dtype, seed=seed, memory=budget, overwrite=True, progress=progress)
        B = random(base / "B.zarr", (n, n), dtype=dtype, seed=seed + 1, memory=budget, overwrite=True,
                   progress=progress)
        t_gen = time.perf_counter() - t0
        reset = _reset_peak()
        baseline = _status("VmRSS") or 0  # resident before the GEMM (interpreter, libraries)
        C = matmul(A, B, base / "C.zarr", memory=budget, device=device, scheduler=scheduler, progress=progress,
                   overwrite=True)
        gemm_peak = peak_rss() if reset else C.report["peak_memory"]
        rep = C.report
        # Verification (in memory: a few rows and vectors only).
        rng = np.random.default_rng(seed + 2)
        rows = np.sort(rng.choice(n, size=min(samples, n), replace=False))
        a_rows = np.stack([A[int(r), :] for r in rows]).astype(np.float64)
        ref_rows = np.zeros((len(rows), n))
        step = B.chunks[0]
        for r0 in range(0, n, step):  # NumPy reference, streaming B in chunk rows (bounded memory)
            ref_rows += a_rows[:, r0:r0 + step] @ B[r0:r0 + step, :].astype(np.float64)
        got_rows = np.stack([C[int(r), :] for r in rows]).astype(np.float64)
        eps = np.finfo(np.dtype(dtype)).eps
        bound = 8 * np.sqrt(n) * eps * (np.abs(a_rows) @ np.ones(n)).max() * 5.0  # |B| entries ~ N(0,1), < 5
        row_err = float(np.abs(got_rows - ref_rows).max())
        x = rng.standard_normal((n, 1)).astype(dtype)
        # the products are stores of their own: in the demo's folder, removed with its matrices
        cx = matmul(C, x, base / "Cx.zarr", memory=budget, overwrite=True).to_numpy().astype(np.float64)
        bx = matmul(B, x, base / "Bx.zarr", memory=budget, overwrite=True)
        abx = matmul(A, bx, base / "ABx.zarr", memory=budget, overwrite=True).to_numpy().astype(np.float64)
        frei = float(np.abs(cx - abx).max() / max(1.0, np.abs(abx).max()))
        ok = row_err <= bound and frei <= 100 * np.sqrt(n) * eps
        return {
            "n": n, "dtype": dtype, "memory_budget": budget, "matrix_bytes": A.nbytes,
            "output": str(C.path), "generate_seconds": t_gen, "seconds": rep["seconds"], "gflops": rep["gflops"],
            "flops": rep["flops"], "bytes_read": rep["bytes_read"], "bytes_logical": rep["bytes_logical"],
            "bytes_written": rep["bytes_written"],
            "peak_memory": gemm_peak, "baseline_memory": baseline,
            "gemm_memory": gemm_peak - baseline if reset else None, "planned_peak_memory": rep["plan"]["peak_memory"],
            "plan": rep["plan"], "max_row_error": row_err, "row_error_bound": float(bound),
            "freivalds_relative_error": frei, "verified": bool(ok), "folder": str(base), "kept": keep,
        }
    finally:
        if not keep:
            for name in ("A.zarr", "B.zarr", "C.zarr", "Cx.zarr", "Bx.zarr", "ABx.zarr") if not made else ():
                if _demo_wrote(base / name):
                    shutil.rmtree(base / name, ignore_errors=True)
            if made:
                shutil.rmtree(base, ignore_errors=True)
