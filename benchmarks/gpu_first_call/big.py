"""One out-of-core float64 GEMM at n = 32768 (``BIG_N``) on the GPU: time, GFLOP/s, its roofline and
efficiency, the GPU's busy fraction of the k-loop, reads and waits, a corner against NumPy, and the
in-core cuBLAS rate.

``python3 benchmarks/gpu_first_call/big.py OUT.json SCRATCH_DIR [DEVICE_MEMORY] [MEMORY]``; it reuses
``benchmarks/gpu_check.py``'s ``ooc_gemm`` (operands written with ``blocklin.random`` in SCRATCH_DIR).
The result is written even when the run fails or is cut short by its timeout (each part as it ends).
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

OUT, SCRATCH = sys.argv[1], sys.argv[2]
DMEM = sys.argv[3] if len(sys.argv) > 3 else "24GiB"
MEM = sys.argv[4] if len(sys.argv) > 4 else "48GiB"
N = int(os.environ.get("BIG_N", "32768"))
ROOT = Path(__file__).resolve().parents[2]

spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "benchmarks" / "gpu_check.py")
gc = importlib.util.module_from_spec(spec)
spec.loader.exec_module(gc)
import blocklin as bl  # noqa: E402


def save(res: dict) -> None:
    with open(OUT, "w") as f:
        json.dump(res, f, indent=1, default=str)


tmp = tempfile.mkdtemp(prefix="blocklin-big-", dir=SCRATCH)
res: dict = {"n": N, "device_memory": DMEM, "memory": MEM, "scratch": SCRATCH}
save(res)
try:
    t0 = time.perf_counter()
    r = gc.ooc_gemm("gpu", N, "float64", MEM, DMEM, tmp)  # writes A, B, C; profiles every GEMM
    res.update({k: v for k, v in r.items() if k != "plan"})
    res["plan"] = {k: r["plan"].get(k) for k in ("tm", "tn", "tk", "prefetch", "workers", "n_tasks", "k_steps",
                                                  "device_peak", "peak_memory")}
    res["step_seconds"] = time.perf_counter() - t0
    save(res)
    a, b = bl.open(os.path.join(tmp, "Afloat64.zarr")), bl.open(os.path.join(tmp, "Bfloat64.zarr"))
    c = bl.open(os.path.join(tmp, "Cfloat64.zarr"))
    corner = min(N, 256)
    x, y = a[0:corner, :], b[:, 0:corner]  # reads 2 x 64 MiB at n = 32768
    ref = x @ y
    # blocked float64 sums over k = N: 4 k eps of |A||B| (tests/conftest.py gemm_tol)
    bound = 4 * N * np.finfo(float).eps * (np.abs(x) @ np.abs(y))
    got = c[0:corner, 0:corner]
    res["corner_rel_error"] = float(np.abs(got - ref).max() / np.abs(ref).max())
    res["corner_within_bound"] = bool(np.all(np.abs(got - ref) <= bound))
except Exception as exc:  # noqa: BLE001 - recorded: the first call on a device is scarce
    import traceback

    traceback.print_exc()
    res["error"] = f"{type(exc).__name__}: {exc}"
finally:
    save(res)
    shutil.rmtree(tmp, ignore_errors=True)
print(json.dumps(res, default=str))
sys.exit(0 if res.get("corner_within_bound") else 1)
