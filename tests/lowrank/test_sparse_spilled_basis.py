"""eigsh and svd of a stored sparse matrix with their Krylov bases spilled to the work folder
(:mod:`blocklin.linalg.lowrank.basis`, :mod:`blocklin.linalg.lowrank.basis_budget`): eigsh gives the bits
of the in-memory run on every scheduler (svd the bits of its Lanczos iteration: its spilled Rayleigh-Ritz
step takes no residual directions and sums its Gram by strips), residuals against SciPy's eigenpairs and
singular triplets, the factors written strip by strip (``Matrix`` results), the scratch files gone after
success, an error and Ctrl-C, the refusal naming the spilled minimum, the plan saying it spills, and
the peak within the budget."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest

import blocklin as bl
import blocklin.linalg.lowrank.basis as basis_mod
import blocklin.linalg.lowrank.basis_budget as basis_budget
import blocklin.linalg.lowrank.lanczos as lanczos_mod
from blocklin.errors import BudgetError
from blocklin.linalg.lowrank.sparse_plan import sparse_lowrank_plan
from support.memcheck import margin, needs_hwm, run_child
from support.sparse_lowrank_child import CHILD
from support.tolerances import eps

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
from power_law_graph import write_power_law_mtx  # noqa: E402

SCHEDULERS = ["sync", "threads", pytest.param("processes", marks=pytest.mark.slow)]
K, BLOCK = 5, 6


@pytest.fixture(scope="module")
def graph(tmp_path_factory):
    """A 20000-node power-law graph (about 200 000 stored entries) in a few row blocks."""
    return _stored_graph(tmp_path_factory.mktemp("spill"), 20_000, 100_000, "24MiB")


def _stored_graph(d, n: int, edges: int, memory: str):
    """A power-law graph of ``n`` nodes (``examples/power_law_graph.py``, seed 3), converted in ``d``."""
    write_power_law_mtx(str(d / "g.mtx"), n, edges, seed=3)
    bl.convert(str(d / "g.mtx"), str(d / "S.zarr"), memory=memory)
    return bl.open(str(d / "S.zarr"))


@pytest.fixture
def small_strips(monkeypatch):
    """Strips of 256 KiB: the spilled run's buffers small beside the graph's products."""
    monkeypatch.setattr(basis_mod, "STRIP_BYTES", 1 << 18)


def _minimum(fn, monkeypatch, spill: bool) -> int:
    monkeypatch.setattr(basis_budget, "SPILL", spill)
    with pytest.raises(BudgetError) as info:
        fn(memory="1MiB")
    monkeypatch.setattr(basis_budget, "SPILL", True)
    return int(info.value.minimum)


def _spilling_budget(s, monkeypatch) -> int:
    """A budget below the in-memory run's minimum (so the bases spill) at which the spilled run fits."""
    def eig(**kw):
        return bl.eigsh(s, K, block_size=BLOCK, order="descending", seed=0, **kw)

    in_memory, spilled = _minimum(eig, monkeypatch, False), _minimum(eig, monkeypatch, True)
    assert spilled < in_memory - (1 << 20)
    return in_memory - (1 << 19)


def _run(s, memory, **kw):
    return bl.eigsh(s, K, block_size=BLOCK, order="descending", seed=0, memory=memory, max_passes=200, **kw)


def _dense_v(V):
    return V.to_numpy() if hasattr(V, "to_numpy") else np.asarray(V)


@pytest.mark.parametrize("scheduler", SCHEDULERS)
def test_spilled_eigsh_has_the_in_memory_bits(graph, small_strips, monkeypatch, tmp_path, scheduler):
    budget = _spilling_budget(graph, monkeypatch)
    mem = _run(graph, "256MiB", scheduler=scheduler, workers=2)
    spilled = _run(graph, budget, scheduler=scheduler, workers=2, out=tmp_path / "E.zarr")
    assert mem.report["basis_spilled"] is False and spilled.report["basis_spilled"] is True
    assert spilled.report["basis_bytes"] == mem.report["basis_bytes"] > 0  # the same bases, on disk
    assert (mem.report["passes"], mem.report["restarts"]) == (spilled.report["passes"], spilled.report["restarts"])
    assert np.array_equal(mem[0], spilled[0]) and mem.report["residuals"] == spilled.report["residuals"]
    assert isinstance(spilled[1], bl.Matrix) and np.array_equal(mem[1], spilled[1].to_numpy())
    stored = bl.open(str(tmp_path / "E.zarr" / "V")).to_numpy()
    assert np.array_equal(stored, mem[1])


def test_spilled_eigsh_against_scipy(graph, small_strips, monkeypatch):
    """Every Ritz value within its residual norm of SciPy's eigenvalue (a symmetric matrix's Ritz value
    lies within ``||S v - w v||`` of an eigenvalue), every residual within ``tol`` of the largest, and the
    residual of the returned vectors as reported (plus the rounding of forming it again)."""
    import scipy.sparse.linalg

    budget = _spilling_budget(graph, monkeypatch)
    tol = 1e-8
    w, V = res = _run(graph, budget, tol=tol)
    assert res.report["basis_spilled"] and res.report["converged"] and res.report["tol"] == tol
    x = graph.to_scipy(memory="256MiB").astype(np.float64)
    ref = np.sort(scipy.sparse.linalg.eigsh(x, K, which="LA", tol=1e-12)[0])[::-1]
    norm = float(scipy.sparse.linalg.norm(x, 1))  # bounds ||S||_2 for a symmetric S
    resid = np.asarray(res.report["residuals"])
    rounding = 4 * graph.shape[0] * eps(np.float64) * norm
    assert (np.abs(w - ref) <= resid + rounding).all(), (w, ref, resid)
    assert (resid <= tol * float(np.abs(w).max()) + rounding).all()
    v = _dense_v(V)
    got = np.linalg.norm(x @ v - v * w, axis=0)
    assert (got <= resid + rounding).all()
    assert np.linalg.norm(v.T @ v - np.eye(K)) <= 1e-10


def _spied(monkeypatch) -> list[str]:
    made, init = [], basis_mod.SpilledBasis.__init__

    def spy(self, n, cap, dtype, path, strips=None):
        made.append(path)
        init(self, n, cap, dtype, path, strips)

    monkeypatch.setattr(basis_mod.SpilledBasis, "__init__", spy)
    return made


def _failing_step(monkeypatch, exc: type[BaseException]) -> list[bool]:
    """``exc`` raised at the third step's next block, with whether the spilled files existed then."""
    seen, original = [], lanczos_mod.next_block

    def boom(v, *args, **kw):
        if kw.get("counter", 0) >= 3:
            seen.append(bool(v.spilled) and Path(v.path).exists())
            raise exc("stopped here")
        return original(v, *args, **kw)

    monkeypatch.setattr(lanczos_mod, "next_block", boom)
    return seen


@pytest.mark.parametrize("ending", ["success", "error", "interrupt"])
def test_spilled_files_are_removed(graph, small_strips, monkeypatch, tmp_path, ending):
    budget = _spilling_budget(graph, monkeypatch)
    made = _spied(monkeypatch)
    if ending == "success":
        assert _run(graph, budget).report["basis_spilled"]
    else:
        exc = RuntimeError if ending == "error" else KeyboardInterrupt
        seen = _failing_step(monkeypatch, exc)
        with pytest.raises(exc, match="stopped here"):
            _run(graph, budget)
        assert seen == [True]
    assert len(made) == 2 and all(Path(p).name.startswith("lanczos-") for p in made)
    assert not any(Path(p).exists() for p in made)
    temp = tmp_path / "blocklin-tmp"  # no work folder left (a successful run's result group is the caller's)
    assert not [p.name for p in temp.iterdir() if p.name.startswith("blocklin-eigsh") and p.suffix != ".zarr"]


def test_refusal_names_the_spilled_minimum_and_runs_there(graph, small_strips, monkeypatch):
    with pytest.raises(BudgetError, match="memory=") as info:
        bl.eigsh(graph, K, order="descending", seed=0, memory="1MiB")
    minimum = int(info.value.minimum)
    res = bl.eigsh(graph, K, order="descending", seed=0, memory=minimum, max_passes=300)
    assert res.report["basis_spilled"] and res.report["block"] == basis_budget.MIN_SPILLED_BLOCK
    assert res.report["converged"]


def test_plan_says_the_bases_spill(graph, small_strips, monkeypatch):
    budget = _spilling_budget(graph, monkeypatch)
    plan = sparse_lowrank_plan(graph, K, operation="eigsh", block_size=BLOCK, memory=budget)
    res = _run(graph, budget)
    assert plan.basis_spilled == res.report["basis_bytes"] > 0 and plan.details["block"] == res.report["block"]
    assert "spilled to the work folder" in plan.explain() and plan.fits
    in_memory = sparse_lowrank_plan(graph, K, operation="eigsh", block_size=BLOCK, memory="256MiB")
    assert in_memory.basis_spilled == 0 and "spilled" not in in_memory.explain()


def test_svd_plan_says_the_bases_spill(graph, small_strips, monkeypatch):
    budget = _svd_budget(graph, monkeypatch)
    plan = sparse_lowrank_plan(graph, K, operation="svd", memory=budget)
    res = bl.svd(graph, K, seed=0, memory=budget)
    assert plan.basis_spilled == res.report["basis_bytes"] > 0 and plan.details["block"] == res.report["block"]
    assert "spilled to the work folder" in plan.explain() and plan.fits
    assert sparse_lowrank_plan(graph, K, operation="svd", memory="256MiB").basis_spilled == 0


def _svd_budget(s, monkeypatch) -> int:
    """Just below the in-memory svd's minimum: its bases spill, its block kept."""
    def svd(**kw):
        return bl.svd(s, K, seed=0, **kw)

    return _minimum(svd, monkeypatch, False) - (1 << 19)


@pytest.mark.parametrize("scheduler", SCHEDULERS)
def test_spilled_svd_against_the_in_memory_run_and_scipy(graph, small_strips, monkeypatch, scheduler):
    import scipy.sparse.linalg

    budget = _svd_budget(graph, monkeypatch)
    made = _spied(monkeypatch)
    mem = bl.svd(graph, K, seed=0, memory="256MiB", scheduler=scheduler, workers=2)
    U, sv, Vt = res = bl.svd(graph, K, seed=0, memory=budget, scheduler=scheduler, workers=2)
    assert mem.report["basis_spilled"] is False and res.report["basis_spilled"] is True
    assert len(made) == 4 and not any(Path(p).exists() for p in made)  # V, W, then Y, Z of the last step
    # the Lanczos iteration, bit for bit; the final step over the k Ritz vectors alone
    assert res.report["block"] == mem.report["block"]
    for key in ("lanczos_steps", "restarts", "history"):
        assert res.report[key] == mem.report[key]
    assert res.report["rayleigh_ritz_width"] == K < mem.report["rayleigh_ritz_width"]
    assert "spilled" in res.report["phases"]["Krylov bases"]
    assert isinstance(U, bl.Matrix) and isinstance(Vt, bl.Matrix) and Vt.shape == (K, graph.shape[1])
    x = graph.to_scipy(memory="256MiB").astype(np.float64)
    u, v = U.to_numpy(), Vt.to_numpy().T
    n = graph.shape[0]
    norm = float(scipy.sparse.linalg.norm(x, 1))
    rounding = 4 * n * eps(np.float64) * norm
    resid = np.asarray(res.report["residuals"])
    got = np.linalg.norm(x.T @ u - v * sv, axis=0)
    assert (got <= resid + rounding).all()
    assert (np.linalg.norm(x @ v - u * sv, axis=0) <= rounding).all()  # B v = s u by construction
    ref = np.sort(scipy.sparse.linalg.svds(x, K, tol=1e-12, random_state=0)[1])[::-1]
    assert (np.abs(sv - ref) <= resid + rounding).all(), (sv, ref, resid)
    assert np.linalg.norm(u.T @ u - np.eye(K)) <= 1e-10 and np.linalg.norm(v.T @ v - np.eye(K)) <= 1e-10
    assert res.report["converged"]


def test_spilled_svd_refusal_names_its_minimum(graph, small_strips):
    with pytest.raises(BudgetError, match="memory=") as info:
        bl.svd(graph, K, seed=0, memory="1MiB")
    minimum = int(info.value.minimum)
    res = bl.svd(graph, K, seed=0, memory=minimum)
    assert res.report["basis_spilled"] and res.report["block"] == basis_budget.MIN_SPILLED_BLOCK




@pytest.fixture(scope="module")
def large(tmp_path_factory):
    """A 2x10^5-node power-law graph (about 1.2 million stored entries)."""
    return _stored_graph(tmp_path_factory.mktemp("spill-large"), 200_000, 600_000, "64MiB")


@needs_hwm
@pytest.mark.slow  # about 10-20 s each: a 2x10^5-node graph in a child
@pytest.mark.parametrize("op", ["eigsh", "svd"])
def test_spilled_peak_within_the_budget(large, tmp_path, monkeypatch, op):
    """n = 2x10^5 at a budget below its in-memory minimum (the bases, 2 x n x cap float64): the peak resident
    set above the child's baseline within the budget plus the margin."""
    def call(**kw):
        if op == "svd":
            return bl.svd(large, K, seed=0, **kw)
        return bl.eigsh(large, K, order="descending", seed=0, **kw)

    in_memory, spilled = _minimum(call, monkeypatch, False), _minimum(call, monkeypatch, True)
    budget = max(64 << 20, spilled)
    assert budget < in_memory
    r = run_child(CHILD, json.dumps({"op": op, "path": large.path, "k": K, "memory": budget, "dir": str(tmp_path),
                                  "eigsh_out": True, "max_passes": 300}))
    used = r["peak"] - r["baseline"]
    print(f"spilled {op}: {used / 2**20:.1f} MiB above the baseline at memory={budget / 2**20:.0f} MiB "
          f"(in memory needs {in_memory / 2**20:.0f} MiB), block {r['block']}, {r['passes']} passes")
    assert r["spilled"]
    assert used <= budget + margin(budget), f"{used / 2**20:.1f} MiB for {budget / 2**20:.0f} MiB"


@pytest.mark.parametrize("shape", [(30000, 20000), (20000, 30000)], ids=["tall", "wide"])
def test_spilled_svd_of_rectangular_matrices(tmp_path, small_strips, monkeypatch, shape):
    """Tall and wide: the long factor written by strips in its orientation (``Vt`` rows of a wide ``A``),
    the short one too, against SciPy's singular values within the reported residuals."""
    import scipy.sparse
    import scipy.sparse.linalg

    big = scipy.sparse.csr_matrix((100.0 * np.arange(1, 7), (np.arange(6) * 7, np.arange(6) * 11)), shape=shape)
    rng, nnz = np.random.default_rng(7), 120_000
    noise = scipy.sparse.coo_matrix((rng.random(nnz), (rng.integers(0, shape[0], nnz), rng.integers(0, shape[1], nnz))),
                                    shape=shape)
    x = (noise + big).tocsr()  # six large separated values: a gap, it converges in a few passes
    s = bl.from_sparse(x, tmp_path / "R.zarr", memory="24MiB")
    budget = _svd_budget(s, monkeypatch)
    U, sv, Vt = res = bl.svd(s, K, seed=0, memory=budget, out=tmp_path / "F.zarr")
    assert res.report["basis_spilled"] and U.shape == (shape[0], K) and Vt.shape == (K, shape[1])
    u, v = U.to_numpy(), Vt.to_numpy().T
    rounding = 4 * max(shape) * eps(np.float64) * float(scipy.sparse.linalg.norm(x, 1))
    resid = np.asarray(res.report["residuals"])
    # B v = s u exactly by construction (B = A, or A^T for a wide A), B^T u - s v as reported
    exact, measured = (x.T @ u - v * sv, x @ v - u * sv) if shape[0] < shape[1] else (x @ v - u * sv, x.T @ u - v * sv)
    assert (np.linalg.norm(measured, axis=0) <= resid + rounding).all()
    assert (np.linalg.norm(exact, axis=0) <= rounding).all()
    assert res.report["converged"]
    ref = np.sort(scipy.sparse.linalg.svds(x, K, tol=1e-12, random_state=0)[1])[::-1]
    assert (np.abs(sv - ref) <= resid + rounding).all()
    assert np.array_equal(bl.open(str(tmp_path / "F.zarr" / "S")).to_numpy(), sv)


def test_spilled_svd_refuses_k_above_the_rank(tmp_path, small_strips, monkeypatch):
    """A rank below ``k`` needs an orthonormal completion of ``U`` built in memory: refused by name."""
    import scipy.sparse

    two = scipy.sparse.random(30000, 2, density=0.01, random_state=3, format="csc")
    low = scipy.sparse.hstack([two, scipy.sparse.csc_matrix((30000, 19998))]).tocsr()  # rank 2, N = 20000
    s = bl.from_sparse(low, tmp_path / "L.zarr", memory="24MiB")
    budget = _svd_budget(s, monkeypatch)
    with pytest.raises(bl.errors.ParameterError, match="k: must not exceed the numerical rank"):
        bl.svd(s, K, seed=0, memory=budget)


def test_spilled_laplacian_eigsh_has_the_in_memory_bits(graph, small_strips, monkeypatch):
    def eig(**kw):
        return bl.eigsh(graph, K, which="SA", laplacian="normalized", block_size=BLOCK, order="ascending", seed=0,
                        max_passes=60, **kw)

    budget = _minimum(eig, monkeypatch, False) - (1 << 19)
    mem, spilled = eig(memory="256MiB"), eig(memory=budget)
    assert spilled.report["basis_spilled"] and not mem.report["basis_spilled"]
    assert np.array_equal(mem[0], spilled[0]) and np.array_equal(mem[1], spilled[1].to_numpy())
