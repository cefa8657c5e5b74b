"""Peak memory of the out-of-core SVD methods stays within the budget (subprocess high-water mark).

The child opens the matrix, measures its baseline (interpreter, NumPy, SciPy, zarr, Dask, blocklin),
resets the kernel's high-water mark, runs the factorization of a matrix four times the budget and
reports the new high-water mark. Allowed: budget + baseline + margin (10% of the budget + 24 MiB for
allocator slack, thread stacks and Python objects), as for GEMM.
"""

from __future__ import annotations

import numpy as np
import pytest

import blocklin as bl
from support.memcheck import margin, needs_hwm, run_child

CHILD = """
    import numpy as np, scipy.linalg
    import blocklin as bl
    import dask.threaded  # noqa: F401
    path, method, memory = sys.argv[1:4]
    bl.open(path)[0:1, 0:1]
    base = hwm()
    reset_hwm()
    res = bl.svd(path, 8, method=method, memory=memory, seed=0, power_iters=1 if method == "rsvd" else "auto",
                 max_passes=6)
    print(json.dumps({"baseline": base, "peak": hwm(), "passes": res.report["passes"],
                      "in_core": res.report["in_core"], "s0": float(res.s[0])}))
"""


@needs_hwm
# rsvd and gram in the default run, sketch and lanczos in the slow job (one child of 62.5 MiB each)
@pytest.mark.parametrize("method", ["rsvd", pytest.param("sketch", marks=pytest.mark.slow),
                                    pytest.param("lanczos", marks=pytest.mark.slow), "gram"])
@pytest.mark.parametrize("shape", [(40960, 200), (200, 40960)], ids=["tall", "wide"])
def test_svd_peak_within_budget(tmp_path, method, shape):
    budget = 16 * 2**20
    chunks = (1024, 200) if shape[0] > shape[1] else (200, 1024)
    a = bl.random(tmp_path / "a.zarr", shape, seed=1, chunks=chunks)  # 62.5 MiB: about 4x the budget
    assert a.nbytes >= 3.5 * budget
    r = run_child(CHILD, a.path, method, "16MiB")
    assert not r["in_core"]
    used = r["peak"] - r["baseline"]
    assert used <= budget + margin(budget), f"{method}: used {used / 2**20:.1f} MiB over a {budget / 2**20:.0f} MiB budget"
    assert np.isfinite(r["s0"]) and r["s0"] > 0


@needs_hwm
def test_gram_route_peak_within_budget_when_the_gram_is_most_of_it(tmp_path):
    """An 800 x 800 Gram (5 MiB; its tasks' sums, the total and eigh's work about 20 MiB) in a 32 MiB
    budget beside the strips of a 122 MiB operand."""
    budget = 32 * 2**20
    a = bl.random(tmp_path / "a.zarr", (20000, 800), seed=2, chunks=(250, 800))
    assert a.nbytes >= 3.5 * budget
    r = run_child(CHILD, a.path, "gram", "32MiB")
    assert not r["in_core"] and r["passes"] >= 2
    used = r["peak"] - r["baseline"]
    assert used <= budget + margin(budget), f"gram: used {used / 2**20:.1f} MiB over a {budget / 2**20:.0f} MiB budget"
    assert np.isfinite(r["s0"]) and r["s0"] > 0
