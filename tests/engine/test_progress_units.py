"""Progress within a pass: rows of a row pass and k-panels of a GEMM tile, not "0/1" for one long task."""

from __future__ import annotations

import numpy as np
import pytest

import blocklin as bl
from blocklin.progress import ProgressRecorder
from support.tolerances import assert_gram


@pytest.mark.parametrize("scheduler", ["sync", "threads", "processes"])
def test_row_pass_progress_in_rows(scheduler):
    x = np.random.default_rng(0).standard_normal((6000, 40))
    p = ProgressRecorder()
    g = bl.gram(x, memory="1MiB", progress=p, scheduler=scheduler, workers=1)
    assert_gram(g.to_numpy(), x.T @ x, x)
    starts = [e[1] for e in p.events if e[0] == "start"]
    assert starts == [(6000, "Gram A^T A (SYRK) (rows)")] and p.done == p.total == 6000
    steps = [e[1] for e in p.events if e[0] == "advance"]
    if scheduler == "processes":  # another process: its rows are counted when its task ends
        assert len(steps) >= 1
    else:  # one task, moving strip by strip
        assert g.report["tasks"] == 1 and len(steps) > 3 and max(steps) < 6000


def test_gemm_tile_progress_in_k_panels():
    x = np.random.default_rng(1).standard_normal((20000, 30))  # A^T b: the tiles (no thin route)
    p = ProgressRecorder()
    c = bl.matmul(x, np.ones(20000), trans_a=True, memory="4MiB", progress=p)
    plan = c.report["plan"]
    assert plan["n_tasks"] == 1 and plan["k_steps"] > 2
    assert [e[1] for e in p.events if e[0] == "start"] == [(plan["k_steps"], "gemm tiles (k-panels)")]
    assert p.done == plan["k_steps"] and sum(1 for e in p.events if e[0] == "advance") == plan["k_steps"]
