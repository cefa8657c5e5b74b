"""blocklin.solve of a stored sparse matrix: LSQR on the row-block products, against dense closed forms.

References are the dense closed forms in float64 (``numpy.linalg.lstsq`` of the small densified
matrix, or the regularized normal equations by ``scipy.linalg.solve``), never SciPy's own ``lsqr``
(an iterative answer to the same tolerance says nothing about accuracy). The bound
(:func:`lsqr_bound`) comes from LSQR's stopping tests (Paige and Saunders 1982, section 6): with
``Ab = [A; lam I]``, ``rb = [b - A x; -lam x]`` and ``g = Ab^T rb = A^T r - lam^2 x`` (the gradient of
the damped problem), a column stops when ``||rb|| <= tol ||b|| + tol ||Ab|| ||x||`` (test S1, then
``||g|| <= ||Ab|| ||rb||``) or ``||g|| <= tol ||Ab|| ||rb||`` (test S2, with ``||rb|| <= ||b||``: LSQR
minimizes ``||rb||`` over growing subspaces from ``x = 0``); LSQR's estimate of ``||Ab||`` is at most
``||Ab||_F``. Either way ``||g|| <= tol ||Ab||_F (||b|| + ||Ab||_F ||x||)``, and
``x - x_ref = K^-1 g`` with ``K = A^T A + lam^2 I`` restricted to the row space of ``A`` (where LSQR's
iterates live; that is what makes the ``lam = 0`` wide solution the minimum-norm one), whose smallest
eigenvalue is ``s_min^2 + lam^2`` (``s_min`` the smallest nonzero singular value). A factor 4 covers
LSQR's norm estimates being recurrences rather than exact norms, and the rounding of both solutions
adds :func:`support.tolerances.assert_solve`'s ``8 n eps cond(K) ||x||``.
"""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest
import scipy.linalg
import scipy.sparse as sp

import blocklin as bl
from blocklin.errors import (BudgetError, ConvergenceWarning, NonFiniteError, OutputExistsError, ParameterError,
                             ShapeError)
from blocklin.linalg.solve.sparse_lsqr import DEFAULT_TOL
from blocklin.plan.solve import SparseSolvePlan
from blocklin.storage.sparse import SparseWriter
from support.memcheck import margin, needs_hwm, run_child
from support.tolerances import assert_close_to, eps


def _matrix(m, n, seed, density=0.08, dtype=np.float64):
    """A sparse m x n matrix of full rank (a scaled identity on the diagonal keeps it well conditioned)."""
    x = sp.random(m, n, density=density, random_state=seed, format="lil", dtype=np.float64)
    for i in range(min(m, n)):
        x[i, i] = 1.0 + (i % 5) / 4
    return x.tocsr().astype(dtype)


def _stored(x, path):
    """``x`` as a blocklin-csr group of four or five row blocks and small chunks (the products stream them)."""
    x = sp.csr_matrix(x)
    rows_per_block = x.shape[0] // 4 + 1
    w = SparseWriter(path, x.shape, x.dtype, entry_chunk=128, row_chunk=32)
    for r0 in range(0, x.shape[0], rows_per_block):
        r1 = min(x.shape[0], r0 + rows_per_block)
        blk = x[r0:r1]
        w.write_rows(r0, r1, blk.indptr, blk.indices, blk.data)
    w.commit()
    return bl.open(path)


def _reference(a, b, lam):
    """The damped least-squares solution in float64: min-norm lstsq at lam = 0, else the normal equations."""
    a = np.asarray(a, np.float64)
    if lam == 0:
        return np.linalg.lstsq(a, b, rcond=None)[0]
    n = a.shape[1]
    return scipy.linalg.solve(a.T @ a + lam ** 2 * np.eye(n), a.T @ b, assume_a="pos")


def lsqr_bound(a, b, lam, x_ref, tol):
    """``||x - x_ref||_F`` allowed by LSQR's stopping tests and the rounding of both (module notes)."""
    a = np.asarray(a, np.float64)
    m, n = a.shape
    s = np.linalg.svd(a, compute_uv=False)
    smin = s[s > s[0] * max(m, n) * eps(np.float64)].min()
    ab = np.sqrt(np.linalg.norm(a) ** 2 + n * lam ** 2)  # ||[A; lam I]||_F
    lmin, lmax = smin ** 2 + lam ** 2, s[0] ** 2 + lam ** 2
    b, x_ref = np.atleast_2d(b.T).T, np.atleast_2d(x_ref.T).T
    bound = 0.0
    for j in range(b.shape[1]):  # per column, then summed: a Frobenius bound
        g = tol * ab * (np.linalg.norm(b[:, j]) + ab * np.linalg.norm(x_ref[:, j]))
        bound += (4 * g / lmin + 8 * n * eps(np.float64) * (lmax / lmin) * np.linalg.norm(x_ref[:, j])) ** 2
    return float(np.sqrt(bound))


def _check(x, a, b, lam, tol=DEFAULT_TOL["float64"], what="LSQR"):
    ref = _reference(a, b, lam)
    assert_close_to(x, ref, bound=lsqr_bound(a, b, lam, ref, tol), what=f"{what} (lam {lam})")
    return ref


@pytest.mark.parametrize("shape, lam", [((400, 50), 0.0), ((400, 50), 0.7), ((40, 300), 0.7), ((40, 300), 0.0)],
                         ids=["tall-lstsq", "tall-ridge", "wide-ridge", "wide-min-norm"])
def test_against_the_dense_closed_form(tmp_path, rng, shape, lam):
    m, n = shape
    x = _matrix(m, n, 1)
    s = _stored(x, tmp_path / "S.zarr")
    assert s.n_blocks > 1
    b = rng.standard_normal((m, 3))
    got = bl.solve(s, b, lam=lam)
    assert isinstance(got, bl.Matrix) and got.shape == (n, 3)
    ref = _check(got.to_numpy(), x.toarray(), b, lam)
    r = got.report
    assert r["method"] == "lsqr" and r["converged"] and r["lam"] == lam
    assert r["passes"] == 2 * r["iterations"] + 2  # S^T b, two per iteration, the residual b - S x
    assert r["nnz"] == s.nnz and r["flops"] >= 4 * s.nnz * 3 * r["iterations"]
    # the reported norms are those of the returned x (the residual from a pass of its own)
    dense = x.toarray()
    # (to the rounding of forming a residual: n eps ||S||_F ||x|| absolute, which a compatible system's tiny one shows)
    xs = got.to_numpy()
    np.testing.assert_allclose(r["residual_norm"], np.linalg.norm(dense @ xs - b, axis=0), rtol=1e-12,
                               atol=4 * n * eps(np.float64) * np.linalg.norm(dense) * np.linalg.norm(xs))
    np.testing.assert_allclose(r["solution_norm"], np.linalg.norm(got.to_numpy(), axis=0), rtol=1e-12)
    if lam == 0 and m < n:  # the minimum-norm solution: no component outside the row space of S
        assert np.linalg.norm(ref) <= np.linalg.norm(got.to_numpy()) * (1 + 1e-8)


@pytest.mark.parametrize("scale", [1e-100, 1e100])
def test_data_near_underflow_or_overflow_is_solved_as_at_scale_one(tmp_path, rng, scale):
    """``S``, ``b`` and ``lam`` scaled alike leave ``x`` unchanged, and LSQR's stopping tests are ratios
    of the data's own norms: near 1e-100 the test ``||S^T r|| <= tol ||S|| ||r||`` once compared with
    ``eps`` absolutely, and every column stopped after one iteration, 78% off, reported converged."""
    x = _matrix(400, 50, 2)
    b = rng.standard_normal((400, 2))
    got = bl.solve(_stored(x * scale, tmp_path / "S.zarr"), b * scale, lam=0.7 * scale)
    assert got.report["converged"] and got.report["iterations"] > 1
    _check(got.to_numpy(), x.toarray(), b, 0.7)


def test_a_lam_sequence_is_every_separate_solve(tmp_path, rng):
    x = _matrix(150, 20, 2)
    s = _stored(x, tmp_path / "S.zarr")
    b = rng.standard_normal((150, 2))
    lams = [0.0, 0.3, 3.0]
    seq = bl.solve(str(s.path), b, lam=lams)  # the path is taken as the sparse group too
    assert seq.shape == (20, 6) and seq.report["lam"] == lams
    assert len(seq.report["residual_norm"]) == 3 and len(seq.report["residual_norm"][0]) == 2
    for l, lam in enumerate(lams):
        one = bl.solve(s, b, lam=lam)
        block = seq.to_numpy()[:, 2 * l:2 * l + 2]
        ref = _check(block, x.toarray(), b, lam, what="a lambda of the sequence")
        # both within the bound of the same reference
        assert_close_to(block, one.to_numpy(), bound=2 * lsqr_bound(x.toarray(), b, lam, ref, DEFAULT_TOL["float64"]),
                        what=f"sequence vs separate solve (lam {lam})")
        np.testing.assert_allclose(seq.report["residual_norm"][l], one.report["residual_norm"], rtol=1e-8)
    # larger lambdas converge in fewer iterations: their columns froze early
    its = np.asarray(seq.report["column_iterations"]).reshape(3, 2)
    assert its[2].max() < its[0].max() and seq.report["iterations"] == its.max()


@pytest.mark.parametrize("lam", [0.5, [0.2, 2.0]])
def test_fit_intercept_matches_sklearn_ridge(tmp_path, rng, lam):
    from sklearn.linear_model import Ridge

    x = _matrix(250, 30, 3) + sp.csr_matrix(np.c_[np.full((250, 1), 4.0), np.zeros((250, 29))])  # a column far from 0
    s = _stored(x, tmp_path / "S.zarr")
    b = rng.standard_normal((250, 2)) + 10.0
    got = bl.solve(s, b, lam=lam, fit_intercept=True)
    lams = lam if isinstance(lam, list) else [lam]
    dense = x.toarray()
    ac, bc = dense - dense.mean(axis=0), b - b.mean(axis=0)
    assert got.report["passes"] == 2 * got.report["iterations"] + 3  # and the means pass
    for l, v in enumerate(lams):
        ridge = Ridge(alpha=v ** 2, fit_intercept=True, solver="cholesky").fit(dense, b)
        coef = got.to_numpy()[:, 2 * l:2 * l + 2]
        bound = lsqr_bound(ac, bc, v, ridge.coef_.T, DEFAULT_TOL["float64"])  # the centered problem
        assert_close_to(coef, ridge.coef_.T, bound=bound, what=f"coefficients (lam {v})")
        x0 = got.intercept if len(lams) == 1 else got.intercept[l]
        # x0 = bbar - mu^T x: its error is mu^T (x - x_ref)
        assert_close_to(x0, ridge.intercept_, bound=np.linalg.norm(dense.mean(axis=0)) * bound + 1e-12,
                        what=f"intercept (lam {v})")


def test_float32_storage_is_solved_in_float64(tmp_path, rng):
    x = _matrix(300, 40, 4, dtype=np.float32)
    s = _stored(x, tmp_path / "S.zarr")
    b = rng.standard_normal(300)  # a vector: one column
    got = bl.solve(s, b, lam=0.1)
    assert got.shape == (40, 1) and got.dtype == np.float64 and got.report["tol"] == DEFAULT_TOL["float32"]
    # the reference: the float32 values exactly, in float64; LSQR's tolerance 1e-6 bounds the error
    _check(got.to_numpy(), x.toarray().astype(np.float64), b[:, None], 0.1, tol=DEFAULT_TOL["float32"])
    b32 = bl.solve(s, b.astype(np.float32), lam=0.1, tol=1e-8)
    assert b32.dtype == np.float32 and b32.report["tol"] == 1e-8


@pytest.mark.parametrize("kw, name", [
    ({"method": "qr"}, "method"), ({"method": "normal"}, "method"), ({"assume_a": "pos"}, "assume_a"),
    ({"assume_a": "sym"}, "assume_a"), ({"precision": "mixed"}, "precision"), ({"resume": True}, "resume"),
    ({"updatable": True}, "updatable"), ({"refine": 1}, "refine"), ({"lam": "gcv"}, "lam"),
    ({"lam": "lcurve"}, "lam"), ({"tol": 2.0}, "tol"), ({"tol": 0}, "tol"), ({"max_iter": 0}, "max_iter"),
    ({"max_iter": 2.5}, "max_iter"), ({"lam": -1.0}, "lam")])
def test_refusals_name_the_parameter(tmp_path, rng, kw, name):
    s = bl.from_sparse(_matrix(50, 10, 5), tmp_path / "S.zarr")
    with pytest.raises(ParameterError, match=rf"^{name}: "):
        bl.solve(s, rng.standard_normal(50), **kw)
    assert not list(tmp_path.glob(".*partial*"))


def test_dense_a_refuses_the_sparse_options(rng):
    a, b = rng.standard_normal((30, 5)), rng.standard_normal(30)
    for kw, name in (({"tol": 1e-8}, "tol"), ({"max_iter": 5}, "max_iter"), ({"method": "lsqr"}, "method")):
        with pytest.raises(ParameterError, match=rf"^{name}: applies to a stored sparse a only"):
            bl.solve(a, b, **kw)


def test_shapes_and_non_finite_values(tmp_path, rng):
    x = _matrix(60, 10, 6)
    s = bl.from_sparse(x, tmp_path / "S.zarr")
    with pytest.raises(ShapeError, match="^b: must have one row per row of a"):
        bl.solve(s, rng.standard_normal(59))
    b = rng.standard_normal(60)
    b[3] = np.nan
    with pytest.raises(NonFiniteError, match="^b: "):
        bl.solve(s, b)
    y = x.copy()
    y.data[5] = np.inf
    t = bl.from_sparse(y, tmp_path / "T.zarr")
    with pytest.raises(NonFiniteError, match="^a: must hold finite values"):
        bl.solve(t, rng.standard_normal(60))
    # a zero right-hand side has the solution 0, at once
    z = bl.solve(s, np.c_[np.zeros(60), rng.standard_normal(60)], lam=0.1)
    assert (z.to_numpy()[:, 0] == 0).all() and z.report["column_iterations"][0] == 0 and z.report["converged"]


def test_out_is_atomic_with_its_report(tmp_path, rng):
    x = _matrix(200, 20, 7)
    s = _stored(x, tmp_path / "S.zarr")
    b = bl.from_array(rng.standard_normal((200, 2)), tmp_path / "b.zarr", chunks=(64, 2))  # a stored b
    out = tmp_path / "X.zarr"
    got = bl.solve(s, b, lam=[0.1, 1.0], out=out)
    assert got.path == str(out) and got.shape == (20, 4)
    prov = bl.open(out).provenance
    assert prov["operation"] == "solve" and prov["params"]["lam"] == [0.1, 1.0] and prov["plan"]["nnz"] == s.nnz
    rec = prov["report"]
    assert rec["method"] == "lsqr" and rec["converged"] is True and rec["iterations"] == got.report["iterations"]
    assert rec["passes"] == got.report["passes"] and rec["tol"] == DEFAULT_TOL["float64"]
    assert not [p for p in tmp_path.iterdir() if "partial" in p.name]
    _check(got.to_numpy()[:, :2], x.toarray(), b.to_numpy(), 0.1)
    with pytest.raises(OutputExistsError):
        bl.solve(s, b, lam=0.1, out=out)
    again = bl.solve(s, b, lam=0.1, out=out, overwrite=True)
    assert again.shape == (20, 2)
    np.save(tmp_path / "b.npy", b.to_numpy())  # a .npy file of right-hand sides too
    npy = bl.solve(s, str(tmp_path / "b.npy"), lam=0.1)
    np.testing.assert_array_equal(npy.to_numpy(), again.to_numpy())


def test_not_converged_within_max_iter_warns_and_reports(tmp_path, rng):
    s = bl.from_sparse(_matrix(200, 30, 8), tmp_path / "S.zarr")
    with pytest.warns(ConvergenceWarning, match=r"LSQR stopped before tol=1e-10 .*Raise max_iter"):
        got = bl.solve(s, rng.standard_normal((200, 2)), lam=0.01, max_iter=2)
    r = got.report
    assert r["converged"] is False and r["iterations"] == 2 and r["passes"] == 6
    assert r["column_converged"] == [False, False] and r["stop_reasons"] == ["iteration limit"] * 2


def test_budget_refusal_names_the_minimum(tmp_path, rng):
    s = bl.from_sparse(_matrix(2000, 300, 9, density=0.01), tmp_path / "S.zarr")
    b = rng.standard_normal((2000, 4))
    with pytest.raises(BudgetError, match=r"^memory: must hold the sparse LSQR .*raise it to at least") as exc:
        bl.solve(s, b, lam=[0.1, 1.0], memory="64KiB")
    need = exc.value.minimum
    plan = bl.solve(s, b, lam=[0.1, 1.0], memory=need, explain=True)
    assert isinstance(plan, SparseSolvePlan) and plan.peak_memory == need
    got = bl.solve(s, b, lam=[0.1, 1.0], memory=need)  # the minimum suffices
    assert got.report["converged"]


def test_explain_counts_the_stored_entries(tmp_path, rng):
    s = _stored(_matrix(300, 40, 10), tmp_path / "S.zarr")
    plan = bl.solve_plan(s, rng.standard_normal((300, 2)), lam=[0.1, 1.0, 10.0], fit_intercept=True, max_iter=50)
    assert isinstance(plan, SparseSolvePlan) and (plan.k, plan.lams, plan.nnz) == (2, 3, s.nnz)
    assert plan.bytes_per_pass == s.nnz * (8 + 4) + 8 * 301
    assert plan.setup_passes == 3 and plan.max_passes == 103 and plan.row_blocks == s.n_blocks
    assert "LSQR" in plan.explain() and "read per pass" in str(plan)
    assert not list(tmp_path.glob("*.zarr"))[1:]  # nothing written


@pytest.mark.parametrize("scheduler", ["sync", "threads", pytest.param("processes", marks=pytest.mark.slow)])
def test_schedulers_give_the_same_bits(tmp_path, rng, scheduler):
    s = _stored(_matrix(200, 30, 11), tmp_path / "S.zarr")
    b = rng.standard_normal((200, 2))
    iters = 3 if scheduler == "processes" else 60  # a process pool per product (runtime/sparse_pass): a few
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        got = bl.solve(s, b, lam=0.2, scheduler=scheduler, workers=2, max_iter=iters)
    assert got.report["scheduler"] == scheduler and got.report["tasks"] == got.report["passes"]
    # the products' groups of row blocks are fixed by the matrix (runtime/sparse_pass): the same bits anywhere
    np.testing.assert_array_equal(got.to_numpy(), _in_process(s, b, 0.2, iters))


def _in_process(s, b, lam, max_iter=60):
    """LSQR with the products in this process (no job: SparseOperator's in-process path)."""
    from blocklin.linalg.solve.sparse_lsqr import lsqr_columns

    op = s.aslinearoperator()
    return lsqr_columns(op.matmat, op.rmatmat, b, [lam], tol=DEFAULT_TOL["float64"], conlim=1e12,
                        max_iter=max_iter).x


@pytest.mark.slow
def test_on_a_local_cluster(tmp_path, rng, client):
    s = _stored(_matrix(200, 30, 12), tmp_path / "S.zarr")
    b = rng.standard_normal((200, 2))
    got = bl.solve(s, b, lam=0.2, scheduler=client, out=tmp_path / "X.zarr", max_iter=60)
    np.testing.assert_array_equal(got.to_numpy(), _in_process(s, b, 0.2))


def test_cli_runs_and_explains(tmp_path, rng, capsys):
    from blocklin.cli.main import main

    x = _matrix(150, 20, 13)
    s = _stored(x, tmp_path / "S.zarr")
    b = rng.standard_normal(150)
    np.save(tmp_path / "b.npy", b)
    out = tmp_path / "X.zarr"
    assert main(["solve", str(s.path), str(tmp_path / "b.npy"), "-o", str(out), "--lam", "0.1,1", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["method"] == "lsqr" and summary["converged"] and summary["shape"] == [20, 2]
    _check(bl.open(out).to_numpy()[:, :1], x.toarray(), b[:, None], 0.1)
    assert main(["solve", str(s.path), str(tmp_path / "b.npy"), "-o", str(tmp_path / "Y.zarr"), "--lam", "0.1",
                 "--explain"]) == 0
    text = capsys.readouterr().out
    assert "LSQR" in text and "read per pass" in text and not (tmp_path / "Y.zarr").exists()
    assert main(["solve", str(s.path), str(tmp_path / "b.npy"), "-o", str(tmp_path / "Z.zarr"), "--lam", "gcv"]) != 0
    assert "lam: 'gcv' needs the singular values" in capsys.readouterr().err
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        assert main(["solve", str(s.path), str(tmp_path / "b.npy"), "-o", str(tmp_path / "W.zarr"), "--max-iter", "1",
                     "--tol", "1e-12"]) == 0
    assert "NOT converged" in capsys.readouterr().out


LSQR_CHILD = """
    import numpy as np
    import scipy.sparse.linalg  # noqa: F401  (imported by the run anyway; part of the baseline)
    import dask.threaded  # noqa: F401
    import warnings
    import blocklin as bl
    s_path, b_path, memory = sys.argv[1:4]
    b = np.load(b_path)
    base = hwm()
    reset_hwm()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # 3 iterations: not converged, and that is not the point
        x = bl.solve(s_path, b, lam=[0.1, 1.0], memory=memory, max_iter=3)
    plan = bl.solve_plan(s_path, b, lam=[0.1, 1.0], memory=memory, max_iter=3)
    print(json.dumps({"baseline": base, "peak": hwm(), "plan_peak": plan.peak_memory, "passes": x.report["passes"]}))
"""


@needs_hwm
@pytest.mark.slow
def test_lsqr_peak_within_budget(tmp_path):
    """The solve streams S (46 MiB of CSR, more than the budget and its margin) with 16 MiB: the
    vectors and one product task, as planned (about 20 s, most of it the conversion)."""
    x = sp.random(60000, 4000, density=0.0167, random_state=1, format="csr")  # 4 M entries
    s = bl.from_sparse(x, tmp_path / "s.zarr", memory="16MiB")
    np.save(tmp_path / "b.npy", np.random.default_rng(0).standard_normal((60000, 2)))
    budget = 16 * 2**20
    assert s.nbytes >= budget + margin(budget)
    r = run_child(LSQR_CHILD, s.path, str(tmp_path / "b.npy"), "16MiB")
    used = r["peak"] - r["baseline"]
    print(f"used {used / 2**20:.1f} MiB, plan {r['plan_peak'] / 2**20:.1f} MiB, {r['passes']} passes")
    assert r["plan_peak"] <= budget and r["passes"] == 8
    assert used <= budget + margin(budget), f"used {used / 2**20:.1f} MiB over baseline, budget 16 MiB"
