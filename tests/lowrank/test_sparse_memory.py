"""Peak memory of ``svd`` and ``eigsh`` of a stored sparse matrix (a power-law graph's adjacency,
``examples/power_law_graph.py``), each in a child process against the budget (``support.memcheck``:
``VmHWM`` above the child's baseline after a warm-up call, within the budget plus the margin).

What the budgets cover today:

* ``svd`` (the operator route, :mod:`blocklin.linalg.lowrank.operator_svd`) plans the in-memory
  Lanczos work (``plan_svd``'s ``client_bytes``: bases, factors) against ``memory=`` and refuses a
  budget below it with the minimum; each product (``runtime/sparse_pass``) checks its block ``X``,
  its result and one task against the same whole budget again, so the two add up.
* ``eigsh`` checks only the products: the Lanczos work (``block_lanczos``) is not counted, so a
  small budget is exceeded in proportion to ``n``.

The tests that a budget holds are strict expected failures until the library counts that work
(they then pass, and strict ``xfail`` fails: drop the marks); what passes today is the refusal.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import pytest

import blocklin as bl
from support.memcheck import margin, needs_hwm, run_child

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
from power_law_graph import write_power_law_mtx  # noqa: E402

MiB = 2**20
K = 5

_CODE = """
import os, tempfile
import numpy as np, scipy.sparse
import blocklin
args = json.loads(sys.argv[1])
# warm-up: the operation's imports, threads and BLAS buffers belong to the baseline
r = scipy.sparse.random(300, 300, density=0.05, random_state=1)
tiny = blocklin.from_sparse(r + r.T, os.path.join(tempfile.mkdtemp(), "w.zarr"))
def run(a, mem, out):
    if args["op"] == "svd":
        return blocklin.svd(a, args["k"], seed=0, memory=mem, out=out)
    return blocklin.eigsh(a, args["k"], seed=0, order="descending", memory=mem)
run(tiny, "64MiB", os.path.join(args["dir"], "warm.zarr"))
s = blocklin.open(args["path"])
s.row_block(0)
base = hwm()
reset_hwm()
try:
    res = run(s, args["memory"], os.path.join(args["dir"], "F.zarr"))
except blocklin.errors.BudgetError as exc:
    print(json.dumps({"minimum": exc.minimum}))
    sys.exit(0)
print(json.dumps({"baseline": base, "peak": hwm(), "passes": res.report.get("operator_products",
                                                                            res.report.get("passes"))}))
"""


@pytest.fixture(scope="module")
def graph(tmp_path_factory):
    """A 60000-node power-law graph, about 400 000 stored entries (5 MiB of CSR) in a few row blocks."""
    d = tmp_path_factory.mktemp("sparse-svd-mem")
    write_power_law_mtx(str(d / "g.mtx"), 60_000, 200_000, seed=3)
    bl.convert(str(d / "g.mtx"), str(d / "S.zarr"), memory="24MiB")
    return bl.open(str(d / "S.zarr"))


def _child(op: str, path: str, memory: int) -> dict:
    out = Path(tempfile.mkdtemp(prefix="svd-", dir=Path(path).parent))  # the factors beside the matrix
    return run_child(_CODE, json.dumps({"op": op, "path": path, "k": K, "memory": memory, "dir": str(out)}))


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
@pytest.mark.xfail(strict=True, raises=AssertionError, reason=(
    "the operator route plans the Lanczos work (client_bytes) against memory= and each sparse product "
    "(runtime/sparse_pass.product_memory) against the whole memory= again, not the pass_memory the plan "
    "leaves: at the plan's minimum the peak is about 1.5x the budget (201 MiB for 131 MiB here)"))
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
@pytest.mark.xfail(strict=True, raises=AssertionError, reason=(
    "sparse eigsh checks only its products (runtime/sparse_pass.product_memory: X, the result, one task) "
    "against memory=; the Lanczos work (block_lanczos: the n x max_basis bases and the restart's copies) "
    "is neither planned nor refused: 32 MiB here peaks about 220 MiB above the baseline"))
def test_sparse_eigsh_within_its_budget(graph):
    """At a budget that holds the products (``X`` and ``S X``: ``2 n block`` float64, 7.3 MiB here),
    eigsh should stay within it, or refuse naming the minimum (the test then passes, strict xfail
    fails: drop the mark)."""
    budget = 32 * MiB
    r = _child("eigsh", graph.path, budget)
    if "minimum" in r:
        return
    used = _used(r)
    print(f"eigsh: {used / MiB:.1f} MiB above the baseline at memory={budget / MiB:.1f} MiB, {r['passes']} passes")
    assert used <= budget + margin(budget), f"{used / MiB:.1f} MiB above the baseline for {budget / MiB:.1f} MiB"
