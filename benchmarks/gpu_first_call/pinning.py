"""Where an out-of-core GPU GEMM's load time goes: pinned against pageable host slots, and large against
small panels, alternated in one process on the same operands.

The first call on an H200 (``benchmarks/results/gpu-2026-12-04-first-call/``) loaded 17 GB in 4.0 s of
a 6.9 s n = 32768 GEMM whose host slots carried 2.25 copies each, below ``PIN_MIN_USES`` (3): pageable
slots, each touched for the first time, and copies from them that block the thread at 9.9 GB/s. Each
variant here runs ``bl.matmul`` at n = ``N`` (float64, chunks of 4096) with ``PIN_MIN_USES`` set to 3 (as
shipped) or 1 (every slot pinned), at a host budget that gives 4096-wide k-panels or one a quarter of
that, ``ROUNDS`` times in rotation, and records each run's time, load and wait seconds and plan.

``python3 benchmarks/gpu_first_call/pinning.py OUT.json SCRATCH_DIR`` (``N``, ``ROUNDS`` from the
environment; 16384 and 2 by default). The result is written after every run.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time

import numpy as np

OUT, SCRATCH = sys.argv[1], sys.argv[2]
N = int(os.environ.get("N", "16384"))
ROUNDS = int(os.environ.get("ROUNDS", "2"))
DMEM = os.environ.get("DEVICE_MEMORY", "6GiB")
#: (name, PIN_MIN_USES, host budget): the budgets of the first call's timing (32 GiB) and an eighth of it
VARIANTS = [("pin3_wide", 3, os.environ.get("WIDE", "32GiB")), ("pin1_wide", 1, os.environ.get("WIDE", "32GiB")),
            ("pin3_narrow", 3, os.environ.get("NARROW", "4GiB")), ("pin1_narrow", 1, os.environ.get("NARROW", "4GiB"))]

import blocklin as bl  # noqa: E402
from blocklin.device import cuda  # noqa: E402

res: dict = {"n": N, "rounds": ROUNDS, "device_memory": DMEM, "runs": []}


def save() -> None:
    with open(OUT, "w") as f:
        json.dump(res, f, indent=1, default=str)


tmp = tempfile.mkdtemp(prefix="blocklin-pinning-", dir=SCRATCH)
try:
    w = bl.random(os.path.join(tmp, "w.zarr"), (512, 512), seed=3, chunks=(256, 256))
    bl.matmul(w, w, os.path.join(tmp, "wc.zarr"), device="gpu", memory="64MiB", device_memory="64MiB")  # CUDA set-up
    chunk = min(4096, max(64, N // 4))
    t0 = time.perf_counter()
    a = bl.random(os.path.join(tmp, "A.zarr"), (N, N), seed=1, chunks=(chunk, chunk), dtype="float64")
    b = bl.random(os.path.join(tmp, "B.zarr"), (N, N), seed=2, chunks=(chunk, chunk), dtype="float64")
    res["operands_seconds"] = time.perf_counter() - t0
    save()
    first = None
    for r in range(ROUNDS):
        for name, uses, memory in VARIANTS:
            cuda.PIN_MIN_USES = uses
            plan = bl.matmul(a, b, memory=memory, device="gpu", device_memory=DMEM, explain=True)
            path = os.path.join(tmp, f"C-{name}.zarr")
            c = bl.matmul(a, b, path, memory=memory, device="gpu", device_memory=DMEM)
            rep = c.report
            slot_uses = plan.n_tasks * plan.k_steps / max(1, min(plan.prefetch + 1, plan.k_steps))
            row = {"round": r, "variant": name, "pin_min_uses": uses, "memory": memory, "seconds": rep["seconds"],
                   "load_seconds": rep["load_seconds"], "wait_seconds": rep["wait_seconds"],
                   "gflops": 2.0 * N**3 / rep["seconds"] / 1e9, "slot_uses": slot_uses,
                   "pinned": slot_uses >= uses,
                   "plan": {k: getattr(plan, k) for k in ("tm", "tn", "tk", "prefetch", "n_tasks", "k_steps")}}
            corner = c[0:64, 0:64]  # every variant sums k in its own plan's order: compared within rounding
            if first is None:
                first = corner
            row["corner_rel_diff"] = float(np.abs(corner - first).max() / np.abs(first).max())
            res["runs"].append(row)
            save()
            print(json.dumps(row), flush=True)
            shutil.rmtree(path, ignore_errors=True)
    for name, _, _ in VARIANTS:
        secs = sorted(x["seconds"] for x in res["runs"] if x["variant"] == name)
        loads = sorted(x["load_seconds"] for x in res["runs"] if x["variant"] == name)
        res[f"{name}_best_seconds"], res[f"{name}_best_load_seconds"] = secs[0], loads[0]
    cuda.PIN_MIN_USES = 3
except Exception as exc:  # noqa: BLE001 - recorded: device time is scarce
    import traceback

    traceback.print_exc()
    res["error"] = f"{type(exc).__name__}: {exc}"
finally:
    save()
    shutil.rmtree(tmp, ignore_errors=True)
print(json.dumps({k: v for k, v in res.items() if k != "runs"}, default=str))
sys.exit(1 if "error" in res else 0)
