"""Peak memory of the sparse products stays within the budget (subprocess high-water mark, as
``test_gemm_memory.py``): ``S^T B`` and ``S B`` with ``S`` (CSR arrays) and ``B`` each larger than
the budget."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse

import blocklin as bl
from support.memcheck import margin, needs_hwm, run_child

CHILD = """
    import blocklin as bl
    s_path, b_path, out, memory, trans = sys.argv[1:6]
    bl.open(b_path)[0:1, 0:1]
    import dask.threaded  # noqa: F401  (imported by the run anyway; part of the baseline)
    base = hwm()
    reset_hwm()
    c = bl.matmul(s_path, b_path, out, memory=memory, trans_a=trans == "1")
    print(json.dumps({"baseline": base, "peak": hwm(), "plan_peak": c.report["plan"]["peak_memory"],
                      "tasks": c.report["tasks"]}))
"""


@needs_hwm
@pytest.mark.slow
@pytest.mark.parametrize("trans", [True, False], ids=["StB", "SB"])
def test_sparse_product_peak_within_budget(tmp_path, trans):
    m, n, p = 40000, 3000, 48
    x = scipy.sparse.random(m, n, density=0.02, random_state=1, format="csr")  # 2.4 M entries: 28 MiB of CSR
    s = bl.from_sparse(x, tmp_path / "s.zarr", memory="16MiB")
    rows = m if trans else n
    b = bl.random(tmp_path / "b.zarr", (rows, p), seed=2, chunks=(1024, p))
    memory_mib = 12
    budget = memory_mib * 2**20
    assert s.nbytes >= 2 * budget
    r = run_child(CHILD, s.path, b.path, str(tmp_path / "c.zarr"), f"{memory_mib}MiB", "1" if trans else "0")
    used = r["peak"] - r["baseline"]
    print(f"used {used / 2**20:.1f} MiB, plan {r['plan_peak'] / 2**20:.1f} MiB, {r['tasks']} tasks")
    assert r["plan_peak"] <= budget  # S in pieces, B in strips or panels: one task or more
    assert used <= budget + margin(budget), f"used {used / 2**20:.1f} MiB over baseline, budget {memory_mib} MiB"
