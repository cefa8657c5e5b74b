"""Peak memory of the out-of-core inverse stays within its budget (subprocess peak RSS).

The child imports everything, opens the stored matrix, resets the kernel's high-water mark and
inverts a matrix several times larger than the budget (recursion, butterfly passes, probing and
a Newton-Schulz step). Allowed: budget + baseline + margin (10% of the budget + 24 MiB for
allocator slack, thread stacks and Python objects), well below the matrix's own size.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

import blocklin as bl

CHILD = textwrap.dedent("""
    import json, sys
    import numpy as np
    import blocklin as bl
    def hwm():
        for line in open('/proc/self/status'):
            if line.startswith('VmHWM'):
                return int(line.split()[1]) * 1024
    a_path, out, memory = sys.argv[1:4]
    bl.open(a_path)[0:1, 0:1]
    bl.inv(np.eye(4) * 2.0, memory=memory)  # imports and thread pools are part of the baseline
    import dask.threaded  # noqa: F401
    base = hwm()
    open('/proc/self/clear_refs', 'w').write('5')
    x = bl.inv(a_path, out=out, memory=memory, refine=1, tol=1e-300)
    r = x.report
    print(json.dumps({"baseline": base, "peak": hwm(), "plan_peak": r["plan"]["peak_memory"],
                      "leaves": r["leaves"], "steps": r["refine_steps"], "eta": r["backward_error"]}))
""")


def _can_reset_hwm() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


@pytest.mark.skipif(sys.platform != "linux" or not _can_reset_hwm(), reason="needs Linux /proc high-water mark")
def test_inverse_peak_within_budget(tmp_path):
    n = 2560  # 50 MiB, about 3x the budget
    memory_mib = 16
    a = bl.random(tmp_path / "a.zarr", (n, n), seed=3, chunks=(256, 256))
    budget = memory_mib * 2**20
    assert a.nbytes >= 3 * budget
    proc = subprocess.run([sys.executable, "-c", CHILD, a.path, str(tmp_path / "x.zarr"), f"{memory_mib}MiB"],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    r = json.loads(proc.stdout.strip().splitlines()[-1])
    used = r["peak"] - r["baseline"]
    margin = 0.10 * budget + 24 * 2**20
    assert r["plan_peak"] <= budget
    assert r["leaves"] >= 4 and r["steps"] == 1  # recursion and one out-of-core Newton-Schulz step
    assert r["eta"] < 1e-14
    assert used <= budget + margin, f"used {used / 2**20:.1f} MiB over baseline, budget {memory_mib} MiB"
