"""The device-resource bugs B1-B3 of issue 25, reproduced through blocklin's public API: fixed today,
so every ``*_fixed`` entry should be true.

``python3 benchmarks/gpu_first_call/repro.py OUT.json [--small]`` on the GPU (``--small``: a smaller
product; the stand-in runs it so, through ``standin.py``). Each entry is written as soon as it is
measured.

* B1: a thread's device kept the first job's ``device_memory``. Two jobs on the same 4 threads, with
  budgets 4 MiB then 512 MiB: every ``DeviceBudget.hold`` of a job must be against its own budget.
* B2: device slots outlived the job. After each job nothing blocklin allocated is live on the device
  (CuPy's pool: no used bytes, no cached blocks) and no thread keeps slots.
* B3: pinned memory was up to 2x what blocklin counted. For slot shapes that are not powers of two,
  the block CuPy's pinned pool gives equals what blocklin counts (``pinned_nbytes``); after a GEMM
  with ``C`` (pageable host data copied to the device) the pinned pool holds no blocks.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile

import numpy as np

OUT = sys.argv[1] if len(sys.argv) > 1 and not sys.argv[1].startswith("--") else "repro.json"
SMALL = "--small" in sys.argv

import cupy as cp  # noqa: E402

import blocklin as bl  # noqa: E402
from blocklin.config import parse_size  # noqa: E402
from blocklin.device.cuda import CudaDevice, DeviceBudget, pinned_nbytes  # noqa: E402

res: dict = {"cupy": cp.__version__, "small": SMALL}


def save() -> None:
    with open(OUT, "w") as f:
        json.dump(res, f, indent=1, default=str)


def pool_state() -> dict:
    pool = cp.get_default_memory_pool()
    return {"used_bytes": int(pool.used_bytes()), "total_bytes": int(pool.total_bytes())}


def pinned_block_of(x: np.ndarray) -> int:
    """The pinned block behind ``x``: CuPy's ``PinnedMemoryPointer.mem.size``; the stand-in's root buffer."""
    b = x
    while getattr(b, "base", None) is not None:
        if hasattr(b.base, "mem"):
            return int(b.base.mem.size)
        b = b.base
    return int(b.nbytes)


def within(got: np.ndarray, a: np.ndarray, b: np.ndarray) -> bool:
    """Blocked float64 sums over k: ``4 k eps |A||B|`` (tests/conftest.py gemm_tol)."""
    return bool(np.all(np.abs(got - a @ b) <= 4 * a.shape[1] * np.finfo(float).eps * (np.abs(a) @ np.abs(b))))


tmp = tempfile.mkdtemp(prefix="blocklin-repro-")
try:
    rng = np.random.default_rng(0)
    m, k = (384, 256) if SMALL else (1536, 1024)
    a, b = rng.standard_normal((m, k)), rng.standard_normal((k, m))
    small_budget = "4MiB"
    A = bl.from_array(a, os.path.join(tmp, "a.zarr"), chunks=(m // 6, k // 4))  # several tiles and k-panels
    holds: list[tuple[int, int]] = []
    hold = DeviceBudget.hold

    def recording(self, nbytes, budget):
        holds.append((int(nbytes), int(budget)))
        return hold(self, nbytes, budget)

    DeviceBudget.hold = recording
    jobs = []
    try:
        for i, dmem in enumerate([small_budget, "512MiB"]):  # B1: the second budget is far larger
            del holds[:]
            budget = DeviceBudget.of(0)
            waits0 = budget.waits
            r = bl.matmul(A, b, os.path.join(tmp, f"c{i}.zarr"), device="gpu", memory="16MiB", device_memory=dmem,
                          workers=4, scheduler="threads")
            jobs.append({"device_memory": dmem, "tasks": r.report["tasks"],
                         "budgets_held_against": sorted({lim for _, lim in holds}),
                         "own_budget": parse_size(dmem), "budget_waits": budget.waits - waits0,
                         "pool_after_job": pool_state(),
                         "slot_bytes_per_thread": [sum(x.nbytes for s in d._dev_slots for x in s)
                                                   for d in CudaDevice.instances()],
                         "correct": within(r.to_numpy(), a, b)})
            res["B1_B2_jobs"] = jobs
            save()
    finally:
        DeviceBudget.hold = hold
    res["B1_fixed"] = all(j["budgets_held_against"] == [j["own_budget"]] for j in jobs)
    res["B2_fixed"] = all(j["pool_after_job"]["used_bytes"] == 0 and j["pool_after_job"]["total_bytes"] == 0
                          and not any(j["slot_bytes_per_thread"]) for j in jobs)
    res["correct"] = all(j["correct"] for j in jobs)
    save()

    # B3: the pinned block of slot shapes that are not powers of two, against what blocklin counts
    import cupyx

    rows = []
    for shape in [(12288, 4096), (4096, 12288), (3000, 1000), (6000, 3000)]:
        if SMALL:
            shape = (shape[0] // 16, shape[1] // 16)
        x = cupyx.empty_pinned(shape, np.float64)
        block = pinned_block_of(x)
        rows.append({"shape": shape, "bytes": x.nbytes, "pinned_block": block,
                     "blocklin_counts": pinned_nbytes(x.nbytes), "ratio": round(block / x.nbytes, 3)})
        del x
    cp.get_default_pinned_memory_pool().free_all_blocks()
    res["B3_pinned_rounding"] = rows
    c0 = rng.standard_normal((m, m))
    r = bl.matmul(A, b, os.path.join(tmp, "cc.zarr"), c=c0, beta=1.0, device="gpu", memory="16MiB",
                  device_memory=small_budget)
    pool = cp.get_default_pinned_memory_pool()
    res["B3_after_gemm_with_c"] = {"pinned_free_blocks": int(pool.n_free_blocks()),
                                   "correct": bool(np.all(np.abs(r.to_numpy() - (a @ b + c0)) <= 4 * k * np.finfo(float).eps
                                                          * (np.abs(a) @ np.abs(b) + np.abs(c0))))}
    res["B3_fixed"] = (all(row["pinned_block"] == row["blocklin_counts"] for row in rows)
                       and res["B3_after_gemm_with_c"]["pinned_free_blocks"] == 0)
    res["correct"] = res["correct"] and res["B3_after_gemm_with_c"]["correct"]
except Exception as exc:  # noqa: BLE001 - recorded: the first call on a device is scarce
    import traceback

    traceback.print_exc()
    res["error"] = f"{type(exc).__name__}: {exc}"
finally:
    save()
    shutil.rmtree(tmp, ignore_errors=True)
print(json.dumps(res, default=str))
sys.exit(0 if res.get("correct") and all(res.get(f"B{i}_fixed") for i in (1, 2, 3)) else 1)
