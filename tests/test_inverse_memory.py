"""Peak memory of the out-of-core inverse stays within its budget (subprocess peak RSS).

The child imports everything, opens the stored matrix, resets the kernel's high-water mark and
inverts a matrix several times larger than the budget (recursion, butterfly passes, probing and
a Newton-Schulz step). Allowed: budget + baseline + margin (10% of the budget + 24 MiB for
allocator slack, thread stacks and Python objects), well below the matrix's own size.
"""

from __future__ import annotations

import blocklin as bl
from memcheck import margin, needs_hwm, run_child

CHILD = """
    import numpy as np
    import blocklin as bl
    a_path, out, memory = sys.argv[1:4]
    bl.open(a_path)[0:1, 0:1]
    bl.inv(np.eye(4) * 2.0, memory=memory)  # imports and thread pools are part of the baseline
    import dask.threaded  # noqa: F401
    base = hwm()
    reset_hwm()
    x = bl.inv(a_path, out=out, memory=memory, refine=1, tol=1e-300)
    r = x.report
    print(json.dumps({"baseline": base, "peak": hwm(), "plan_peak": r["plan"]["peak_memory"],
                      "leaves": r["leaves"], "steps": r["refine_steps"], "eta": r["backward_error"]}))
"""


@needs_hwm
def test_inverse_peak_within_budget(tmp_path):
    n = 2560  # 50 MiB, about 3x the budget
    memory_mib = 16
    a = bl.random(tmp_path / "a.zarr", (n, n), seed=3, chunks=(256, 256))
    budget = memory_mib * 2**20
    assert a.nbytes >= 3 * budget
    r = run_child(CHILD, a.path, str(tmp_path / "x.zarr"), f"{memory_mib}MiB", timeout=600)
    used = r["peak"] - r["baseline"]
    assert r["plan_peak"] <= budget
    assert r["leaves"] >= 4 and r["steps"] == 1  # recursion and one out-of-core Newton-Schulz step
    assert r["eta"] < 1e-14
    assert used <= budget + margin(budget), f"used {used / 2**20:.1f} MiB over baseline, budget {memory_mib} MiB"
