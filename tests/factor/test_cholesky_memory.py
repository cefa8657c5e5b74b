"""Peak memory of the out-of-core Cholesky stays within its budget for an operand 3x the budget."""

from __future__ import annotations

import numpy as np

import blocklin as bl
from blocklin.storage.zarr_store import open_zarr
from support.memcheck import margin, needs_hwm, run_child

CHILD = """
    import blocklin as bl
    a_path, out, memory = sys.argv[1:4]
    bl.open(a_path)[0:1, 0:1]
    import dask.threaded  # noqa: F401  (imported by the run anyway; part of the baseline)
    import scipy.linalg  # noqa: F401
    base = hwm()
    reset_hwm()
    f = bl.cholesky(a_path, out, memory=memory)
    print(json.dumps({"baseline": base, "peak": hwm(), "plan_peak": f.report["plan"]["peak_memory"], "tile": f.report["plan"]["tile"],
                      "tasks": f.report["tasks"]}))
"""


@needs_hwm
def test_cholesky_peak_within_budget(tmp_path):
    n, chunk, memory_mib = 3584, 256, 32  # 98 MiB: 3x the budget
    a = bl.random(tmp_path / "a.zarr", (n, n), seed=1, chunks=(chunk, chunk))
    arr = open_zarr(a.path, mode="r+")
    for i in range(0, n, chunk):  # diagonally dominant from its lower triangle: SPD
        blk = arr[i:i + chunk, i:i + chunk]
        arr[i:i + chunk, i:i + chunk] = blk + 4.0 * n * np.eye(blk.shape[0])
    budget = memory_mib * 2**20
    assert a.nbytes >= 3 * budget
    r = run_child(CHILD, a.path, str(tmp_path / "l.zarr"), f"{memory_mib}MiB")
    used = r["peak"] - r["baseline"]
    assert r["plan_peak"] <= budget
    nt = -(-n // r["tile"])  # tiles of whole chunks, widened as the budget allows
    assert r["tile"] % chunk == 0 and nt >= 4 and r["tasks"] == nt * (nt + 1) // 2
    assert used <= budget + margin(budget), f"used {used / 2**20:.1f} MiB over baseline, budget {memory_mib} MiB"
    # spot check: the last diagonal tile against a dense factor of the same entries
    low = open_zarr(str(tmp_path / "l.zarr"))
    corner = slice(n - chunk, n)
    l_last = low[corner, :]
    a_cc = np.tril(arr[corner, corner]) + np.tril(arr[corner, corner], -1).T
    np.testing.assert_allclose(l_last @ l_last.T, a_cc, rtol=0, atol=8 * n * np.finfo(float).eps * np.abs(a_cc).max())
