"""svd, pca and eigsh of a stored sparse matrix with its row blocks held in memory between the products
(:func:`blocklin.runtime.sparse_pass.hold_blocks`): the same bits as the streamed products on every
scheduler, one read of ``S`` in the report and the plan, held only where the budget holds the blocks
beside the method's work, and the peak within that budget (a child process, ``support.memcheck``)."""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp

import blocklin as bl
import blocklin.runtime.sparse_pass as sparse_pass
from blocklin.errors import BudgetError
from blocklin.linalg.lowrank.sparse_plan import sparse_lowrank_plan
from support.memcheck import margin, needs_hwm, run_child

SCHEDULERS = ["sync", "threads", pytest.param("processes", marks=pytest.mark.slow)]  # processes: about 9 s


@pytest.fixture(scope="module")
def written(tmp_path_factory):
    """A 30000 x 300 matrix and an 8000-node symmetric one, stored at small budgets: several row blocks."""
    d = tmp_path_factory.mktemp("held")
    x = sp.random(30000, 300, density=0.03, random_state=4, format="csr")
    a = sp.random(8000, 8000, density=0.003, random_state=5, format="csr", data_rvs=lambda k: np.full(k, 0.1))
    y = (a + a.T + sp.diags(np.r_[np.zeros(7994), 100.0 * np.arange(1, 7)])).tocsr()  # a gap: converges
    return (x, bl.from_sparse(x, d / "S.zarr", memory="9MiB")), (y, bl.from_sparse(y, d / "Y.zarr", memory="9MiB"))


@pytest.fixture
def stored(written, monkeypatch):
    """The matrices with their row blocks cut into several groups (threads take two at once), and a held
    block's sweeps of ``S^T S X`` into many pieces (two threads share them: ``sparse_pass.normal_sweep``)."""
    monkeypatch.setattr(sparse_pass, "GROUP_ENTRIES", 20000)
    monkeypatch.setattr(sparse_pass, "SWEEP_ENTRIES", 2000)
    for _x, s in written:
        assert s.n_blocks >= 3 and len(sparse_pass.row_groups(s._store)) >= 3
    return written


def _both(monkeypatch, fn):
    """``fn()`` with the row blocks held, then streamed (every product reads them)."""
    held = fn()
    monkeypatch.setattr(sparse_pass, "HOLD_BLOCKS", False)
    streamed = fn()
    monkeypatch.setattr(sparse_pass, "HOLD_BLOCKS", True)
    return held, streamed


def _arrays(res):
    return [np.asarray(r.to_numpy() if hasattr(r, "to_numpy") else r) for r in res[:3]]


@pytest.mark.parametrize("scheduler", SCHEDULERS)
def test_svd_from_held_blocks_has_the_streamed_bits(stored, monkeypatch, scheduler):
    (x, s), _ = stored
    held, streamed = _both(monkeypatch, lambda: bl.svd(s, 5, seed=0, scheduler=scheduler, workers=2))
    for a, b in zip(_arrays(held), _arrays(streamed)):
        assert np.array_equal(a, b)
    products = held.report["operator_products"]
    assert held.report["passes"] == streamed.report["passes"] == products  # passes: the products with S
    assert held.report["sparse_reads"] == 1 and streamed.report["sparse_reads"] == 2 * products
    assert held.report["sparse_held_bytes"] <= sparse_pass.held_bytes(s._store, np.float64)
    assert "held in memory" in held.report["phases"]["products with the operator"]
    one_read = (x.shape[0] + 1) * 8 + x.nnz * 12  # int64 offsets, int32 indices, float64 values
    assert one_read * 0.95 <= held.report["bytes_read"] <= one_read * 1.05
    assert streamed.report["bytes_read"] >= 2 * products * one_read * 0.95
    assert held.report["tasks"] >= 2 * products  # every group a unit of work, as a task would be
    # against LAPACK's singular values: within the residual bound the report gives
    ref = np.linalg.svd(x.toarray(), compute_uv=False)[:5]
    assert np.allclose(held[1], ref, rtol=0, atol=float(np.max(held.report["residuals"])) * 10 + 1e-12)


def test_a_wide_final_step_from_held_blocks_has_the_streamed_bits(stored, monkeypatch):
    """The last Rayleigh-Ritz step is wider than a slab of columns (``k = 12`` and its residual directions):
    its sweeps over the held blocks, one slab at a time, give the bits of the streamed products."""
    _, (y, s) = stored
    seen = []
    real = sparse_pass.HeldBlocks.normal
    monkeypatch.setattr(sparse_pass.HeldBlocks, "normal", lambda self, job, groups, x: seen.append(x.shape[1]) or
                        real(self, job, groups, x))
    held, streamed = _both(monkeypatch, lambda: bl.svd(s, 12, tol=1e-3, seed=0, workers=2))
    assert held.report["rayleigh_ritz_width"] > sparse_pass.SLAB_COLUMNS
    assert max(seen) == held.report["rayleigh_ritz_width"]  # the wide step swept the held blocks
    for a, b in zip(_arrays(held), _arrays(streamed)):
        assert np.array_equal(a, b)


@pytest.mark.parametrize("scheduler", SCHEDULERS)
def test_eigsh_from_held_blocks_has_the_streamed_bits(stored, monkeypatch, scheduler):
    _, (y, s) = stored
    held, streamed = _both(monkeypatch, lambda: bl.eigsh(s, 4, seed=0, order="descending", tol=1e-4, max_passes=40,
                                                        scheduler=scheduler, workers=2))
    assert np.array_equal(held[0], streamed[0]) and np.array_equal(held[1], streamed[1])
    assert held.report["passes"] == streamed.report["passes"]
    assert held.report["sparse_reads"] == 1 and streamed.report["sparse_reads"] == streamed.report["passes"]
    from scipy.sparse.linalg import eigsh

    w = np.sort(eigsh(y, 4, which="LA", tol=1e-12)[0])[::-1]  # ARPACK's, converged far below the tolerance
    assert np.allclose(held[0], w, rtol=0, atol=10 * float(np.max(held.report["residuals"])) + 1e-9)


def test_pca_from_held_blocks_has_the_streamed_bits(stored, monkeypatch):
    (_x, s), _ = stored
    held, streamed = _both(monkeypatch, lambda: bl.pca(s, 3, seed=0, scheduler="threads", workers=2))
    assert np.array_equal(held.components_, streamed.components_)
    assert np.array_equal(held.singular_values_, streamed.singular_values_)
    assert held.report["sparse_reads"] == 1 and streamed.report["sparse_reads"] > 2


def test_blocks_held_only_where_the_budget_holds_them(stored):
    """At the least budget the products stream; from that plus the held blocks they are held: the plan
    and the run agree on both sides."""
    (_x, s), _ = stored
    with pytest.raises(BudgetError) as info:
        bl.svd(s, 5, seed=0, memory="1MiB")
    least = int(info.value.minimum)
    extra = sparse_pass.held_bytes(s._store, np.float64)
    for budget, held in ((least, False), (least + extra - 1, False), (least + extra, True)):
        plan = sparse_lowrank_plan(s, 5, memory=budget)
        run = bl.svd(s, 5, seed=0, memory=budget, scheduler="sync")
        assert bool(plan.held_blocks) is held and ("sparse_held_bytes" in run.report) is held, budget
        assert run.report["sparse_reads"] == plan.reads if held else run.report["sparse_reads"] > 2
        assert ("S read once" in plan.explain()) is held
        if held:
            assert dict(plan.held)["the row blocks of S, held between the products (read once)"] == extra


def test_a_cluster_streams_its_products(stored, monkeypatch):
    """On a distributed cluster the products stay the workers' tasks: nothing held in the client."""
    from types import SimpleNamespace

    (_x, s), _ = stored
    job = SimpleNamespace(scheduler=SimpleNamespace(kind="distributed"), cfg=SimpleNamespace(memory=1 << 40))
    assert sparse_pass.hold_blocks(job, s._store, np.float64, 0, 0) == 0


_CODE = """
import os
import numpy as np, scipy.sparse
import blocklin
args = json.loads(sys.argv[1])
r = scipy.sparse.random(300, 300, density=0.05, random_state=1)
tiny = blocklin.from_sparse(r + r.T, os.path.join(args["dir"], "w.zarr"))
def run(a, mem):
    if args["op"] == "svd":
        return blocklin.svd(a, args["k"], seed=0, memory=mem, out=os.path.join(args["dir"], f"F{mem}.zarr"))
    return blocklin.eigsh(a, args["k"], seed=0, order="descending", memory=mem)
run(tiny, 64 << 20)
s = blocklin.open(args["path"])
s.row_block(0)
base = hwm()
reset_hwm()
res = run(s, args["memory"])
print(json.dumps({"baseline": base, "peak": hwm(), "held": res.report.get("sparse_held_bytes", 0)}))
"""


@pytest.fixture(scope="module")
def graph(tmp_path_factory):
    """A 60000-node power-law graph (about 5 MiB of CSR), as tests/lowrank/test_sparse_lowrank_memory.py's."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
    from power_law_graph import write_power_law_mtx

    d = tmp_path_factory.mktemp("held-mem")
    write_power_law_mtx(str(d / "g.mtx"), 60_000, 200_000, seed=3)
    bl.convert(str(d / "g.mtx"), str(d / "S.zarr"), memory="24MiB")
    return bl.open(str(d / "S.zarr"))


@needs_hwm
@pytest.mark.slow  # about 6 s: two children
@pytest.mark.parametrize("op", ["svd", "eigsh"])
def test_held_blocks_stay_within_the_budget(graph, op, monkeypatch):
    """At the least budget that holds the row blocks (the whole call's minimum with the Krylov bases in
    memory, plus the blocks) the peak stays within the budget plus the margin, the blocks held."""
    import blocklin.linalg.lowrank.basis_budget as basis_budget

    monkeypatch.setattr(basis_budget, "SPILL", False)  # the refusal names the in-memory minimum
    with pytest.raises(BudgetError) as info:
        kw = {} if op == "svd" else {"order": "descending"}
        (bl.svd if op == "svd" else bl.eigsh)(graph, 5, seed=0, memory="8MiB", **kw)
    budget = int(info.value.minimum) + sparse_pass.held_bytes(graph._store, np.float64)
    d = tempfile.mkdtemp(prefix="held-", dir=Path(graph.path).parent)
    r = run_child(_CODE, json.dumps({"op": op, "path": graph.path, "k": 5, "memory": budget, "dir": d}))
    used = r["peak"] - r["baseline"]
    print(f"{op}: {used / 2**20:.1f} MiB above the baseline at memory={budget / 2**20:.1f} MiB, "
          f"{r['held'] / 2**20:.1f} MiB of row blocks held")
    assert r["held"] > 0
    assert used <= budget + margin(budget), f"{used / 2**20:.1f} MiB for {budget / 2**20:.1f} MiB"
