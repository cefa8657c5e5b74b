"""Peak memory of centered (and standardized) SVD and PCA stays within the budget (subprocess high-water mark).

The same check as tests/lowrank/test_svd_memory.py: a matrix four times the budget, the child's peak over its
baseline within budget + margin (10% + 24 MiB). The means pass and the rank-one correction's vectors and
buffers are declared by the kernels, so the planner keeps the whole operation within the budget.
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
    path, scale, memory, method = sys.argv[1:5]
    bl.open(path)[0:1, 0:1]
    base = hwm()
    reset_hwm()
    kw = {"method": "gram"} if method == "gram" else {"power_iters": 1}
    p = bl.pca(path, 8, scale=scale == "1", memory=memory, seed=0, **kw)
    print(json.dumps({"baseline": base, "peak": hwm(), "passes": p.report["passes"],
                      "in_core": p.report["in_core"], "ev0": float(p.explained_variance_[0])}))
"""


@needs_hwm
@pytest.mark.parametrize("method", ["auto", "gram"])
@pytest.mark.parametrize("scale", ["0", "1"])
@pytest.mark.parametrize("shape", [(40960, 200), (200, 40960)], ids=["tall", "wide"])
def test_pca_peak_within_budget(tmp_path, scale, shape, method):
    """``method="gram"``: its means pass in two tasks (their two 200 x 200 sums are small beside 16 MiB),
    each column's mean and M2 of a wide ``A`` held once beside them."""
    budget = 16 * 2**20
    chunks = (1024, 200) if shape[0] > shape[1] else (200, 1024)
    a = bl.random(tmp_path / "a.zarr", shape, seed=1, chunks=chunks)  # 62.5 MiB: about 4x the budget
    r = run_child(CHILD, a.path, scale, "16MiB", method)
    if method == "gram":  # the means with the Gram, then the Rayleigh-Ritz pass
        assert not r["in_core"] and r["passes"] == 2
    else:  # power iteration, projection, and the means: in the first pass for a centered tall A, in a pass
        # of their own when the standard deviations must scale the first product or A is wide
        assert not r["in_core"] and r["passes"] == 1 + 1 + (scale == "1" or shape[0] < shape[1])
    used = r["peak"] - r["baseline"]
    assert used <= budget + margin(budget), f"used {used / 2**20:.1f} MiB over a {budget / 2**20:.0f} MiB budget"
    assert np.isfinite(r["ev0"]) and r["ev0"] > 0
