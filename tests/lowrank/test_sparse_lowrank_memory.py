"""Peak memory of ``svd`` and ``eigsh`` of a stored sparse matrix (a power-law graph's adjacency,
``examples/power_law_graph.py``), each in a child process against the budget (``support.memcheck``:
``VmHWM`` above the child's baseline after a warm-up call, within the budget plus the margin).

What the budgets cover: each run refuses up front a budget below what it holds at once (the
Lanczos bases and Ritz vectors, ``plan_svd``'s ``client_bytes``, beside the largest of its products:
``X``, the result, one task's row block and partial, :func:`blocklin.runtime.sparse_pass.check_products`),
naming the whole call's minimum, and its products' tasks take only what that work leaves
(``Job.client_reserved``). Measured here at the minimum: svd about 150 MiB above the baseline for
146 MiB, eigsh about 100 MiB for 104 MiB (before the schedulers' reference cycles were collected
after every graph, ``Job.run``, both peaked near twice their budget).
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import pytest

import blocklin as bl
from support.memcheck import margin, needs_hwm, run_child
from support.sparse_lowrank_child import CHILD

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
from power_law_graph import write_power_law_mtx  # noqa: E402

MiB = 2**20
K = 5



@pytest.fixture(scope="module")
def graph(tmp_path_factory):
    """A 60000-node power-law graph, about 400 000 stored entries (5 MiB of CSR) in a few row blocks."""
    d = tmp_path_factory.mktemp("sparse-svd-mem")
    write_power_law_mtx(str(d / "g.mtx"), 60_000, 200_000, seed=3)
    bl.convert(str(d / "g.mtx"), str(d / "S.zarr"), memory="24MiB")
    return bl.open(str(d / "S.zarr"))


def _child(op: str, path: str, memory: int) -> dict:
    out = Path(tempfile.mkdtemp(prefix="svd-", dir=Path(path).parent))  # the factors beside the matrix
    return run_child(CHILD, json.dumps({"op": op, "path": path, "k": K, "memory": memory, "dir": str(out)}))


def _used(r: dict) -> int:
    return r["peak"] - r["baseline"]


def test_sparse_svd_refuses_a_budget_below_its_plan(graph):
    """The guarantee svd gives today: a budget below the plan's in-memory Lanczos work (bases and
    factors, ``plan_svd``'s ``client_bytes``) is refused before any pass, naming the minimum."""
    with pytest.raises(bl.errors.BudgetError) as info:
        bl.svd(graph, K, seed=0, memory=8 * MiB)
    assert info.value.minimum > 8 * MiB
    assert "memory=" in str(info.value)


@needs_hwm
@pytest.mark.slow  # about 5 s: two children
def test_sparse_svd_within_its_planned_budget(graph):
    """At the minimum the plan names the peak should stay within it plus the margin."""
    refused = _child("svd", graph.path, 8 * MiB)
    assert refused.get("minimum"), f"svd at 8 MiB was not refused: {refused}"
    budget = int(refused["minimum"])
    r = _child("svd", graph.path, budget)
    assert "peak" in r, f"svd refused its own minimum {budget / MiB:.1f} MiB: {r}"
    used = _used(r)
    print(f"svd: {used / MiB:.1f} MiB above the baseline at memory={budget / MiB:.1f} MiB, {r['passes']} products")
    assert used <= budget + margin(budget), f"{used / MiB:.1f} MiB above the baseline for {budget / MiB:.1f} MiB"


@needs_hwm
@pytest.mark.slow  # about 5 s: two children
def test_sparse_eigsh_within_its_budget(graph):
    """eigsh refuses a budget below what it holds (the Lanczos bases and Ritz vectors, a product's ``X``,
    result and task), naming the whole call's minimum; at that minimum it stays within it."""
    refused = _child("eigsh", graph.path, 8 * MiB)
    assert refused.get("minimum"), f"eigsh at 8 MiB was not refused: {refused}"
    budget = int(refused["minimum"])
    r = _child("eigsh", graph.path, budget)
    assert "peak" in r, f"eigsh refused its own minimum {budget / MiB:.1f} MiB: {r}"
    used = _used(r)
    print(f"eigsh: {used / MiB:.1f} MiB above the baseline at memory={budget / MiB:.1f} MiB, {r['passes']} passes")
    assert used <= budget + margin(budget), f"{used / MiB:.1f} MiB above the baseline for {budget / MiB:.1f} MiB"
