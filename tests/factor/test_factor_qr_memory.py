"""Peak memory of the tiled QR (R and Q) and of the LU solve within the budget, operands 3x the budget."""

from __future__ import annotations

import numpy as np
import pytest

import blocklin as bl
from support.memcheck import margin, needs_hwm, run_child

QR_CHILD = """
    import blocklin as bl
    a_path, r_out, q_out, memory, method = sys.argv[1:6]
    bl.open(a_path)[0:1, 0:1]
    import dask.threaded  # noqa: F401  (imported by the run anyway; part of the baseline)
    import scipy.linalg  # noqa: F401
    base = hwm()
    reset_hwm()
    q, r = bl.qr(a_path, r_out, q=q_out, mode="reduced", memory=memory, method=method)
    print(json.dumps({"baseline": base, "peak": hwm(), "plan_peak": r.report["plan"]["peak_memory"],
                      "method": r.report["method"], "tile": r.report["plan"]["tile"]}))
"""

SOLVE_CHILD = """
    import blocklin as bl
    a_path, b_path, out, memory = sys.argv[1:5]
    bl.open(a_path)[0:1, 0:1]
    import dask.threaded  # noqa: F401
    import scipy.linalg  # noqa: F401
    base = hwm()
    reset_hwm()
    x = bl.solve(a_path, b_path, out=out, memory=memory)
    print(json.dumps({"baseline": base, "peak": hwm(), "method": x.report["method"],
                      "eta": x.report["backward_error"]}))
"""


@needs_hwm
@pytest.mark.parametrize("method", ["tiled", "tiles"])
def test_tiled_qr_peak_within_budget(tmp_path, method):
    m, n, memory_mib = 1536, 1280, 5  # 15 MiB: 3x the budget
    a = bl.random(tmp_path / "a.zarr", (m, n), seed=2, chunks=(256, 256))
    budget = memory_mib * 2**20
    assert a.nbytes >= 3 * budget
    r = run_child(QR_CHILD, a.path, str(tmp_path / "r.zarr"), str(tmp_path / "q.zarr"), f"{memory_mib}MiB", method)
    used = r["peak"] - r["baseline"]
    assert r["method"] == method and r["plan_peak"] <= budget
    # the budget narrows the column panels below A's chunks; square tiles of 256 fit (8 tiles, 4 MiB)
    assert r["tile"] < 256 if method == "tiled" else r["tile"] == 256
    assert used <= budget + margin(budget), f"used {used / 2**20:.1f} MiB over baseline, budget {memory_mib} MiB"
    # spot check: the first 48 columns of A = Q R, and Q's orthonormality there
    q, rr, a48 = bl.open(tmp_path / "q.zarr")[:, 0:48], bl.open(tmp_path / "r.zarr")[0:48, 0:48], a[:, 0:48]
    eps = np.finfo(float).eps
    # Householder QR: ||A - Q R|| <= c m n u ||A||, ||Q^T Q - I|| <= c m n u (Higham 2002, Thm. 19.4)
    assert np.linalg.norm(a48 - q @ rr) <= 4 * m * eps * np.linalg.norm(a48)
    assert np.linalg.norm(q.T @ q - np.eye(48)) <= 4 * m * eps


@needs_hwm
def test_lu_solve_peak_within_budget(tmp_path):
    n, memory_mib = 2048, 10  # 32 MiB: 3.2x the budget
    a = bl.random(tmp_path / "a.zarr", (n, n), seed=3, chunks=(256, 256))
    b = bl.random(tmp_path / "b.zarr", (n, 1), seed=4, chunks=(256, 1))
    budget = memory_mib * 2**20
    r = run_child(SOLVE_CHILD, a.path, b.path, str(tmp_path / "x.zarr"), f"{memory_mib}MiB")
    used = r["peak"] - r["baseline"]
    assert r["method"] == "lu" and r["eta"] <= np.sqrt(n) * np.finfo(float).eps
    assert used <= budget + margin(budget), f"used {used / 2**20:.1f} MiB over baseline, budget {memory_mib} MiB"
    x = bl.open(tmp_path / "x.zarr")[...]
    a64, b64 = a[...], b[...]
    eta = np.linalg.norm(b64 - a64 @ x) / (np.linalg.norm(a64) * np.linalg.norm(x) + np.linalg.norm(b64))
    assert eta <= 4 * np.sqrt(n) * np.finfo(float).eps
