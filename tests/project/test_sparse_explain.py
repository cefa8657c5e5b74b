"""``--explain`` (and ``explain=True``) of the operations on a stored sparse matrix: plans counted in
nonzeros (one read of ``S`` is its indptr, indices and values), whose passes, bytes and tiles are
those the run then reports, and whose refusals are the run's own."""

from __future__ import annotations

import json

import numpy as np
import pytest
import scipy.sparse

import blocklin
from blocklin.cli.main import main
from blocklin.errors import BudgetError, ParameterError
from blocklin.linalg.lowrank.sparse_plan import sparse_lowrank_plan

M, N, DENSITY = 3000, 400, 0.02


@pytest.fixture
def stored(tmp_path):
    x = scipy.sparse.random(M, N, density=DENSITY, random_state=1, format="csr")
    blocklin.from_sparse(x, tmp_path / "S.zarr")
    return tmp_path / "S.zarr", x


def _pass_bytes(x) -> int:
    return (x.shape[0] + 1) * 8 + x.nnz * (8 + 4)  # int64 indptr, int32 indices, float64 values


def _explain(capsys, args):
    assert main([*args, "--explain", "--json", "--no-progress"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert main([*args, "--explain", "--no-progress"]) == 0
    return d, capsys.readouterr().out


def _within(got, planned):
    """The run's bytes read against the plan's: equal up to the row offsets of extra strips."""
    assert planned * 0.95 <= got <= planned * 1.05, (got, planned)


def test_svd_rsvd_plan_is_the_run(tmp_path, stored, capsys):
    path, x = stored
    args = ["svd", str(path), "-k", "5", "-o", str(tmp_path / "F.zarr"), "--method", "rsvd", "--power-iters", "2",
            "--memory", "64MiB"]
    d, text = _explain(capsys, args)
    assert d["route"] == "sparse" and d["nnz"] == x.nnz and d["pass_bytes"] == _pass_bytes(x)
    assert d["passes"] == 3 and d["plan"]["reads_per_pass"] == 2 and d["fits"]
    assert f"nnz {x.nnz}" in text and "passes 3" in text and "holds" in text and "row block" in text
    assert not (tmp_path / "F.zarr").exists()  # nothing run
    assert main([*args, "--seed", "0", "--json", "--no-progress"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert r["passes"] == d["passes"]
    if r["bytes_read"]:  # counted where the sparse reads are (blocklin._readstats)
        _within(r["bytes_read"], d["bytes_read"])


@pytest.mark.filterwarnings("ignore::blocklin.errors.ConvergenceWarning")  # the bound is what is tested
def test_lanczos_passes_within_the_bound(tmp_path, stored, capsys):
    path, x = stored
    d, text = _explain(capsys, ["svd", str(path), "-k", "4", "-o", str(tmp_path / "F.zarr"), "--max-passes", "10"])
    assert d["passes"] is None and d["passes_bound"] == 10 and "passes <= 10" in text
    # the row blocks fit the default budget: held between the products, S read once for all the passes
    assert d["plan"]["held_blocks"] > 0 and d["bytes_read"] == _pass_bytes(x) and "S read once" in text
    res = blocklin.svd(path, 4, method="lanczos", max_passes=10, seed=0)
    assert 1 <= res.report["passes"] <= d["passes_bound"]


def test_pca_plan_is_the_run(stored, capsys):
    path, x = stored
    p, text = _explain(capsys, ["pca", str(path), "-k", "4", "--method", "rsvd", "--power-iters", "1"])
    assert p["passes"] == 2 and p["plan"]["extra_reads"] == 1 and "+ 1 read" in text and f"nnz {x.nnz}" in text
    # the column means' pass, then the q + 1 pairs of products from the row blocks held (one read)
    assert p["plan"]["held_blocks"] > 0 and p["bytes_read"] == (1 + 1) * _pass_bytes(x)
    run = blocklin.pca(path, 4, method="rsvd", power_iters=1, seed=0)
    assert run.report["passes"] == p["passes"] and run.report["sparse_reads"] == 1
    if run.report["bytes_read"]:  # the report counts the products' reads (the means pass runs before its job)
        assert 0.95 * _pass_bytes(x) <= run.report["bytes_read"] <= p["bytes_read"]


def test_eigsh_plan(tmp_path):
    a = scipy.sparse.random(400, 400, density=0.03, random_state=2, format="csr")
    blocklin.from_sparse((a + a.T + scipy.sparse.diags(np.r_[np.zeros(395), 100.0 * np.arange(1, 6)])).tocsr(), tmp_path / "Y.zarr")  # a gap: converges
    plan = sparse_lowrank_plan(tmp_path / "Y.zarr", 4, operation="eigsh", max_passes=40, memory="64MiB")
    y = blocklin.open(tmp_path / "Y.zarr")
    assert plan.pass_bytes == (401 * 8 + y.nnz * 12) and plan.passes_bound == 40
    # the row blocks held: the symmetry check's S^T X and every step's S X from them, S read once
    assert plan.held_blocks > 0 and plan.extra_reads == 0 and plan.reads == 1
    assert "eigsh (lanczos)" in plan.explain() and f"nnz {y.nnz}" in plan.explain()
    res = blocklin.eigsh(tmp_path / "Y.zarr", 4, max_passes=40, tol=1e-4, order="descending", seed=0)
    assert 1 <= res.report["passes"] <= plan.passes_bound + 1 and res.report["sparse_reads"] == plan.reads
    assert res.report["bytes_read"] <= plan.bytes_read


def test_eigs_cli_plan_with_a_laplacian(tmp_path, capsys):
    a = scipy.sparse.random(300, 300, density=0.03, random_state=4, format="csr")
    blocklin.from_sparse((a + a.T).tocsr(), tmp_path / "W.zarr")
    args = ["eigs", str(tmp_path / "W.zarr"), "-k", "3", "-o", str(tmp_path / "E.zarr"), "--which", "SA",
            "--laplacian", "normalized", "--max-passes", "80", "--tol", "1e-3", "--memory", "64MiB"]
    d, text = _explain(capsys, args)
    w = blocklin.open(tmp_path / "W.zarr")
    assert d["nnz"] == w.nnz and d["plan"]["extra_reads"] == 1 and d["passes_bound"] == 80  # the degree pass
    assert "eigsh (lanczos)" in text and f"nnz {w.nnz}" in text and "degrees" in text
    assert not (tmp_path / "E.zarr").exists()
    assert main([*args, "--seed", "0", "--json", "--no-progress"]) == 0
    r = json.loads(capsys.readouterr().out)
    assert 1 <= r["passes"] <= d["passes_bound"] + 2 and d["plan"]["reads"] == 2  # the degrees, then S held
    if r["bytes_read"]:
        assert r["bytes_read"] <= d["bytes_read"]
    blocklin.from_sparse(scipy.sparse.random(20, 10, density=0.2, random_state=3, format="csr"), tmp_path / "R.zarr")
    with pytest.raises(ParameterError, match="a: must be square and symmetric"):
        sparse_lowrank_plan(tmp_path / "R.zarr", 4, operation="eigsh")


@pytest.mark.parametrize("trans", [False, True])
def test_gemm_plan_is_the_run(tmp_path, stored, capsys, trans):
    path, x = stored
    rows = M if trans else N
    blocklin.from_array(np.ones((rows, 3)), tmp_path / "B.zarr")
    args = ["gemm", str(path), str(tmp_path / "B.zarr"), "-o", str(tmp_path / "C.zarr"), "--memory", "16MiB",
            "--workers", "1"] + (["--trans-a"] if trans else [])
    d, text = _explain(capsys, args)
    plan = d["plan"]
    assert plan["operation"] == ("S^T B" if trans else "S B") and plan["pass_bytes"] == _pass_bytes(x)
    assert f"nnz {x.nnz}" in text and "read" in text
    c = blocklin.matmul(path, tmp_path / "B.zarr", tmp_path / "C.zarr", trans_a=trans, memory="16MiB", workers=1)
    run = c.report["plan"]
    assert {k: run[k] for k in ("rows", "cols", "inner", "entries")} == {k: plan["details"][k] for k in
                                                                          ("rows", "cols", "inner", "entries")}
    assert d["peak_memory"] == run["peak_memory"] and d["flops"] == c.report["flops"]
    _within(c.report["bytes_read"], d["bytes_read"])


def test_gram_plan_and_its_refusal_are_the_runs(tmp_path, stored, capsys):
    path, x = stored
    g, text = _explain(capsys, ["gram", str(path), "-o", str(tmp_path / "G.zarr"), "--memory", "64MiB"])
    assert g["plan"]["passes"] == 1 and "S^T S" in text and f"nnz {x.nnz}" in text
    res = blocklin.gram(path, tmp_path / "G.zarr", memory="64MiB")
    assert res.report["passes"] == 1 and res.report["plan"]["peak_memory"] == g["peak_memory"]
    _within(res.report["bytes_read"], g["bytes_read"])
    with pytest.raises(BudgetError) as planned:
        blocklin.gram(path, tmp_path / "H.zarr", memory="1MiB", explain=True)
    with pytest.raises(BudgetError) as ran:
        blocklin.gram(path, tmp_path / "H.zarr", memory="1MiB")
    assert str(planned.value) == str(ran.value)


@pytest.mark.parametrize(("memory", "kw", "what"), [
    # the Lanczos bases over the budget: the whole call's minimum, the bases beside a product
    ("2MiB", dict(method="lanczos", block_size=200, max_basis=400), "one task's row block and partial, beside"),
    ("1MiB", dict(method="rsvd", power_iters=1), "a product S X holds X, the result"),  # the products'
])
def test_svd_refusal_is_the_runs(stored, memory, kw, what):
    path, _x = stored
    with pytest.raises(BudgetError) as planned:
        sparse_lowrank_plan(path, 5, memory=memory, **kw)
    with pytest.raises(BudgetError) as ran:
        blocklin.svd(path, 5, memory=memory, seed=0, **kw)
    assert str(planned.value) == str(ran.value) and what in str(ran.value)


def test_dense_input_is_refused(tmp_path, capsys):
    blocklin.from_array(np.ones((20, 10)), tmp_path / "D.zarr")
    assert main(["svd", str(tmp_path / "D.zarr"), "-k", "2", "-o", str(tmp_path / "F.zarr"), "--explain",
                 "--no-progress"]) == 1
    assert "--explain: svd --explain plans a stored sparse matrix" in capsys.readouterr().err
