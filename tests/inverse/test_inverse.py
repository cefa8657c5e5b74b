"""blocklin.inv: recursive Schur-complement inverse with a butterfly guard and Newton-Schulz refinement.

Small matrices with budgets of about 512 KiB force the out-of-core recursion (leaves of ~190 rows,
32 x 32 working chunks); every result is checked against NumPy and against the exact backward
error ``||I - M X||_F / (||M||_F ||X||_F)``.
"""

from __future__ import annotations

import json
import os
import warnings

import numpy as np
import pytest

import blocklin as bl
from blocklin.errors import BlocklinWarning
from blocklin.errors import NonFiniteError, OutputExistsError, ParameterError, ShapeError, SingularMatrixError
from blocklin.linalg.inverse.kernels import MEMORY
from blocklin.plan.inverse import plan_inverse


def exact_eta(m: np.ndarray, x: np.ndarray) -> float:
    m64, x64 = m.astype(np.float64), x.astype(np.float64)
    return float(np.linalg.norm(np.eye(len(m)) - m64 @ x64) / (np.linalg.norm(m64) * np.linalg.norm(x64)))


def with_cond(rng, n: int, cond: float) -> np.ndarray:
    u, _ = np.linalg.qr(rng.standard_normal((n, n)))
    v, _ = np.linalg.qr(rng.standard_normal((n, n)))
    return (u * np.logspace(0, -np.log10(cond), n)) @ v.T


def test_plan_recurses_when_the_matrix_exceeds_the_budget():
    plan = plan_inverse(1000, "float64", memory=2**20, kernels=MEMORY, method="schur")
    assert plan.depth == 2 and len(plan.leaves) > 2 and plan.leaf < 1000
    assert all(size <= plan.leaf for _, size in plan.leaves)
    assert sum(size for _, size in plan.leaves) == 1000
    assert all(off % plan.chunk == 0 for off, _ in plan.leaves)
    assert plan.peak_memory <= 2**20
    small = plan_inverse(100, "float64", memory=2**20, kernels=MEMORY)
    assert small.depth == 0 and small.leaves == ((0, 100),) and not small.nodes


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_in_core_leaf_matches_numpy(rng, dtype):
    a = rng.standard_normal((57, 57)).astype(dtype)
    x = bl.inv(a, memory="4MiB")
    assert x.dtype == np.dtype(dtype) and x.shape == (57, 57)
    ref = np.linalg.inv(a.astype(np.float64))
    tol = 1e-4 if dtype == "float32" else 1e-11
    np.testing.assert_allclose(x.to_numpy(), ref, rtol=0, atol=tol * np.abs(ref).max())
    assert x.report["backward_error"] <= x.report["tol"]


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_out_of_core_random_not_multiple_of_tiles(rng, dtype):
    n = 377  # not a multiple of the 32 x 32 working chunks; above the float32 and float64 leaf sizes
    a = rng.standard_normal((n, n)).astype(dtype)
    x = bl.inv(a, memory="1MiB", method="schur")
    r = x.report
    assert r["leaves"] >= 2 and r["gemm_steps"] >= 6 and r["butterfly_depth"] == 2
    got = x.to_numpy()
    eta = exact_eta(a, got)
    assert eta <= 2 * r["tol"], (eta, r["history"])
    assert r["backward_error"] <= r["tol"]
    ref = np.linalg.inv(a.astype(np.float64))
    cond = np.linalg.cond(a.astype(np.float64))
    eps = np.finfo(dtype).eps
    assert np.linalg.norm(got - ref) / np.linalg.norm(ref) <= 10 * cond * eps * np.sqrt(n)


@pytest.mark.parametrize("kind", ["spd", "diagdom"])
def test_structured(rng, kind):
    n = 280
    g = rng.standard_normal((n, n))
    a = g @ g.T / n + 0.1 * np.eye(n) if kind == "spd" else g + 2 * np.sqrt(n) * np.diag(np.sign(rng.standard_normal(n)) + 0.0) * 2
    inv = bl.inv(a, memory="512KiB")
    x = inv.to_numpy()
    ref = np.linalg.inv(a)
    assert np.linalg.norm(x - ref) / np.linalg.norm(ref) <= 1e-10
    assert exact_eta(a, x) <= 2 * inv.report["tol"]
    assert exact_eta(a, bl.inv(a, memory="512KiB", tol=1e-16).to_numpy()) <= 2e-16  # asked for: one step


@pytest.mark.parametrize("cond", [1e8, 1e10, 1e12])
def test_ill_conditioned_refined_to_promised_backward_error(rng, cond):
    n = 290
    a = with_cond(rng, n, cond)
    x = bl.inv(a, memory="512KiB")
    r = x.report
    got = x.to_numpy()
    eta = exact_eta(a, got)
    # the promise: the reported backward error meets tol, and the exact one agrees with it
    assert r["backward_error"] <= r["tol"]
    assert eta <= 2 * r["tol"], (eta, r["history"])
    assert 1e-1 * cond <= r["cond_estimate"]  # ||A||_F ||X||_F >= cond_2
    # forward error as good as LAPACK's pivoted inverse (both ~ cond * eps)
    ref = np.linalg.inv(a)
    assert np.linalg.norm(got - ref) / np.linalg.norm(ref) <= max(1e-6, 100 * cond * 2.2e-16)


def accurate_inverse(a: np.ndarray) -> np.ndarray:
    """A reference inverse accurate beyond float64: LAPACK's, refined twice with residuals in extended precision."""
    x, al = np.linalg.inv(a).astype(np.longdouble), a.astype(np.longdouble)
    for _ in range(2):
        x = x + x @ (np.eye(len(a), dtype=np.longdouble) - al @ x)
    return x


def forward_error(x: np.ndarray, ref: np.ndarray) -> float:
    return float(np.linalg.norm((x - ref).astype(np.float64)) / np.linalg.norm(ref.astype(np.float64)))


@pytest.mark.skipif(np.finfo(np.longdouble).eps >= np.finfo(np.float64).eps, reason="needs extended precision")
@pytest.mark.parametrize("cond", [None, 1e4, 1e8])
def test_default_tol_gives_numpys_accuracy_out_of_core(rng, cond):
    """Out of core, the default gives the forward error NumPy's in-core inverse gives (within 4x)."""
    n = 300
    a = rng.standard_normal((n, n)) if cond is None else with_cond(rng, n, cond)
    ref = accurate_inverse(a)
    x = bl.inv(a, memory="512KiB", method="schur")
    assert x.report["leaves"] >= 2  # out of core
    # 4x: both errors are ~ cond * eps times factors of order one that differ between the methods
    assert forward_error(x.to_numpy(), ref) <= 4 * forward_error(np.linalg.inv(a), ref)
    unrefined = bl.inv(a, memory="512KiB", refine=False, method="schur").to_numpy()
    assert forward_error(unrefined, ref) > forward_error(x.to_numpy(), ref)  # the step was needed


@pytest.mark.parametrize("n_steps", [1, 3])
def test_refine_n_takes_exactly_n_steps(rng, n_steps):
    n = 280
    a = rng.standard_normal((n, n))
    x = bl.inv(a, memory="512KiB", refine=n_steps, tol=1e-3)  # met before any step: the steps are taken anyway
    r = x.report
    assert r["refine_steps"] == n_steps
    assert [h["stage"] for h in r["history"] if h["stage"].startswith("step")] == \
        [f"step {i}" for i in range(1, n_steps + 1)]
    assert exact_eta(a, x.to_numpy()) <= 2 * np.finfo(np.float64).eps


def test_singular_leading_block_is_guarded(rng):
    """M = [[0, B], [C, 0]]: every leading block of M is singular, M is not (pivot-free recursion fails)."""
    n, h = 300, 150
    a = np.zeros((n, n))
    a[:h, h:] = rng.standard_normal((h, h)) + 3 * np.eye(h)
    a[h:, :h] = rng.standard_normal((h, h)) + 3 * np.eye(h)
    x = bl.inv(a, memory="512KiB", method="schur")
    assert x.report["leaves"] >= 2
    got = x.to_numpy()
    np.testing.assert_allclose(got, np.linalg.inv(a), atol=1e-10 * np.abs(got).max())
    assert exact_eta(a, got) <= 2 * x.report["tol"]


def test_permutation_matrix(rng):
    n = 270
    p = np.eye(n)[rng.permutation(n)]
    # A one-sided butterfly leaves a singular leading block here; the documented retry handles it
    # (512 KiB: out of core, leaves below n).
    with pytest.warns(BlocklinWarning, match="retrying with a two-sided random butterfly"):
        x = bl.inv(p, memory="512KiB", method="schur").to_numpy()
    np.testing.assert_allclose(x, p.T, atol=1e-12)


def test_mixed_precision_refines_to_float64(rng):
    n = 260
    a = rng.standard_normal((n, n)) + 0.0
    x = bl.inv(a, memory="1MiB", precision="mixed")
    r = x.report
    assert x.dtype == np.float64 and r["work_dtype"] == "float32"
    assert r["refine_steps"] >= 1
    assert r["history"][0]["backward_error"] > 1e-10  # float32 inverse
    assert exact_eta(a, x.to_numpy()) <= 2 * r["tol"] and r["tol"] < 1e-13


@pytest.mark.parametrize("precision", ["mixed", "tf32"])
def test_mixed_precision_in_core_runs_the_float64_inverse(rng, precision):
    """In core the float64 one-task inverse (2 n^3 flops) beats float32 work refined by Newton-Schulz
    (4 n^3 float64 flops a step): the request runs it, bit for bit, and the report says why."""
    n = 300
    a = rng.standard_normal((n, n)) + np.sqrt(n) * np.eye(n)
    x = bl.inv(a, memory="64MiB", precision=precision)
    ref = bl.inv(a, memory="64MiB")
    r = x.report
    assert r["method"] == "direct" and r["work_dtype"] == "float64" and r["precision"] == "float64"
    assert "fits one in-core inversion" in r["precision_reason"] and precision in r["precision_reason"]
    np.testing.assert_array_equal(x.to_numpy(), ref.to_numpy())
    assert "precision_reason" not in ref.report
    assert precision in bl.inv(a, memory="64MiB", precision=precision, explain=True).explain()
    # out of core the float32 recursion still runs
    assert bl.inv(a, memory="1MiB", precision=precision).report["work_dtype"] == "float32"


def test_mixed_precision_recursion_with_ill_conditioned_float32_blocks():
    """The float32 recursion only starts Newton-Schulz: leading blocks are accepted up to float32's
    rounding (not n eps, which rejected the rcond ~1e-6 of almost every Gaussian block of 1000+ rows),
    and the float64 refinement decides. cond 1e3: refined to float64. cond 1e6: a Schur complement
    singular in float32 (not in float64): the error names precision= as the fix, which works."""
    rng = np.random.default_rng(0)
    n = 600
    u, _ = np.linalg.qr(rng.standard_normal((n, n)))
    v, _ = np.linalg.qr(rng.standard_normal((n, n)))
    m = (u * np.logspace(0, -3, n)) @ v.T
    x = bl.inv(m, memory="2MiB", method="schur", precision="mixed")
    assert x.report["work_dtype"] == "float32" and x.report["leaves"] > 1 and x.report["refine_steps"] >= 1
    assert exact_eta(m, x.to_numpy()) <= 2 * x.report["tol"]
    m = (u * np.logspace(0, -6, n)) @ v.T
    with pytest.raises(SingularMatrixError, match=r"float32 Schur complement.*Fix: invert without precision="):
        bl.inv(m, memory="2MiB", method="schur", precision="mixed")
    x = bl.inv(m, memory="2MiB", method="schur")  # the fix works
    assert exact_eta(m, x.to_numpy()) < 1e-14


def test_refine_switches(rng):
    n = 280
    a = rng.standard_normal((n, n))
    none = bl.inv(a, memory="512KiB", refine=False)
    assert none.report["refine_steps"] == 0 and none.report["residual_method"] == "probed"
    forced = bl.inv(a, memory="512KiB", refine=True)
    assert forced.report["refine_steps"] >= 1
    assert exact_eta(a, forced.to_numpy()) <= exact_eta(a, none.to_numpy())
    # the probed estimate is within a small factor of the exact residual
    est = none.report["residual"]
    exact = np.linalg.norm(np.eye(n) - a @ none.to_numpy())
    assert exact / 3 <= est <= 3 * exact


def test_a_step_that_does_not_improve_is_undone(rng, monkeypatch):
    """Newton-Schulz at the rounding floor can make X worse: the previous iterate is kept and returned."""
    from blocklin.linalg.inverse import refine

    n = 96
    a = rng.standard_normal((n, n)) + n**0.5 * np.eye(n)  # well conditioned: X is accurate before any step
    before = bl.inv(a, memory="256KiB", refine=False).to_numpy()  # the iterate before any step
    real, calls = refine.probe_estimate, []

    def worse_after_the_step(*args, **kwargs):  # the second probe is the one after the step
        calls.append(1)
        return real(*args, **kwargs) * (1e6 if len(calls) == 2 else 1.0)

    monkeypatch.setattr(refine, "probe_estimate", worse_after_the_step)
    x = bl.inv(a, memory="256KiB", refine=True)
    r = x.report
    stages = [h["stage"] for h in r["history"]]
    assert stages[-2:] == ["step 1", "kept the previous iterate"] and r["refine_steps"] == 1
    kept = r["history"][-1]
    assert kept["method"] == "exact" and (r["residual"], r["residual_method"]) == (kept["residual"], "exact")
    # the returned X is the pre-step iterate (the same computation, bit for bit), still accurate
    np.testing.assert_array_equal(x.to_numpy(), before)
    assert exact_eta(a, x.to_numpy()) <= 16 * n * np.finfo(np.float64).eps


def test_singular_raises_with_condition_and_pointer(rng, tmp_path):
    n = 290
    a = rng.standard_normal((n, n - 1)) @ rng.standard_normal((n - 1, n))
    out = tmp_path / "x.zarr"
    with pytest.raises(SingularMatrixError, match=r"condition.*solve\(a, b, lam"):
        bl.inv(a, out=out, memory="512KiB")
    assert not out.exists() and not any(p.name.startswith(".x.zarr") for p in tmp_path.iterdir())
    with pytest.raises(SingularMatrixError, match="lam"):
        bl.inv(np.ones((5, 5)), memory="512KiB")


@pytest.mark.parametrize("memory", ["256KiB", "1MiB", "64MiB"])
@pytest.mark.parametrize("refine", ["auto", False])
@pytest.mark.filterwarnings("ignore:inv. a leading block:blocklin.errors.BlocklinWarning")
def test_exactly_singular_refused_at_every_budget(rng, tmp_path, memory, refine):
    """A row that is a multiple of another: refused whatever the budget, never returned as an inverse.

    The normalised backward error of a garbage X can be tiny (||X|| is huge), so acceptance rests on
    ||I - A X||_F < 1, which no X can reach for a singular A.
    """
    n = 300
    a = rng.standard_normal((n, n))
    a[7] = 3.0 * a[3]
    out = tmp_path / "x.zarr"
    with pytest.raises(SingularMatrixError, match=r"a: must be .*nonsingular.*Fix: regularize"):
        bl.inv(a, out=out, memory=memory, refine=refine)
    assert not out.exists() and not any(p.name.startswith(".x.zarr") for p in tmp_path.iterdir())


def test_bad_inputs(rng, tmp_path):
    with pytest.raises(ShapeError, match="square"):
        bl.inv(rng.standard_normal((5, 4)))
    a = rng.standard_normal((40, 40))
    a[3, 7] = np.nan
    src = bl.from_array(a, tmp_path / "a.zarr")
    before = src.to_numpy().copy()
    with pytest.raises(NonFiniteError, match=r"\[3, 7\]"):
        bl.inv(src, out=tmp_path / "x.zarr")
    assert not (tmp_path / "x.zarr").exists()
    np.testing.assert_array_equal(bl.open(tmp_path / "a.zarr").to_numpy(), before)
    good = bl.from_array(rng.standard_normal((20, 20)), tmp_path / "g.zarr")
    bl.inv(good, out=tmp_path / "y.zarr")
    with pytest.raises(OutputExistsError):
        bl.inv(good, out=tmp_path / "y.zarr")
    with pytest.raises(ValueError, match="precision"):
        bl.inv(good, precision="half")
    with pytest.raises(ValueError, match="refine"):
        bl.inv(good, refine="often")


def test_output_is_atomic_store_with_provenance(rng, tmp_path):
    a = bl.from_array(rng.standard_normal((280, 280)), tmp_path / "a.zarr", chunks=(100, 70))
    x = bl.inv(a, out=tmp_path / "x.zarr", memory="512KiB")
    prov = x.provenance
    assert prov["operation"] == "inv" and prov["report"]["backward_error"] <= prov["params"]["tol"]
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_distributed_matches_local(rng):
    distributed = pytest.importorskip("distributed")
    a = rng.standard_normal((280, 280))
    local = bl.inv(a, memory="512KiB", scheduler="sync", method="schur")  # out of core: leaves below n
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                  dashboard_address=None) as cluster, distributed.Client(cluster) as client:
        remote = bl.inv(a, memory="512KiB", scheduler=client, method="schur")
        assert remote.report["scheduler"] == "distributed"
        assert remote.report["leaves"] == local.report["leaves"] >= 2
        # same plan, butterfly and probes; BLAS thread counts differ, so equal up to rounding (cond * eps)
        x, y = remote.to_numpy(), local.to_numpy()
        assert np.linalg.norm(x - y) / np.linalg.norm(y) <= 1e-11
        assert exact_eta(a, x) <= 2 * remote.report["tol"] and exact_eta(a, y) <= 2 * local.report["tol"]


def test_cli_inv(rng, tmp_path, capsys):
    from blocklin.cli.main import main

    a = bl.from_array(rng.standard_normal((60, 60)), tmp_path / "a.zarr")
    rc = main(["inv", a.path, "-o", str(tmp_path / "x.zarr"), "--refine", "2", "--json", "--memory", "4MiB"])
    assert rc == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["backward_error"] <= summary["tol"] and os.path.isdir(summary["output"])
    assert summary["refine_steps"] == 2  # --refine N: exactly N steps
    np.testing.assert_allclose(bl.open(tmp_path / "x.zarr").to_numpy(), np.linalg.inv(a.to_numpy()), atol=1e-10)
    rc = main(["inv", a.path, "-o", str(tmp_path / "x.zarr"), "--json"])
    assert rc == 1 and "OutputExistsError" in capsys.readouterr().out


@pytest.mark.gpu
def test_gpu_matches_cpu(rng):
    a = rng.standard_normal((300, 300))
    x = bl.inv(a, memory="512KiB", device="gpu", precision="mixed")
    assert exact_eta(a, x.to_numpy()) <= 2 * x.report["tol"]


@pytest.mark.parametrize("src_dtype,precision", [("float64", None), ("float32", "float64"), ("float32", None)])
def test_one_leaf_straight_from_the_input(rng, tmp_path, src_dtype, precision):
    """A matrix that fits the budget is read once, inverted in place by LAPACK and written once; the
    residual is probed in the same task (left probes P^T (I - M X)) and agrees with the exact one."""
    n = 300
    a = bl.from_array(rng.standard_normal((n, n)).astype(src_dtype), tmp_path / "a.zarr", chunks=(128, 128))
    x = bl.inv(a, memory="64MiB", precision=precision)
    r = x.report
    assert r["plan"]["direct"] and r["leaves"] == 1 and r["butterfly_depth"] == 0
    assert r["refine_steps"] == 0 and r["residual_method"] == "probed"
    out_dt = np.dtype(precision or src_dtype)
    assert x.dtype == out_dt
    m = a.to_numpy().astype(np.float64)
    got = x.to_numpy().astype(np.float64)
    exact = float(np.linalg.norm(np.eye(n) - m @ got))
    # 32 Gaussian probes: the squared estimate has relative spread sqrt(2/32) = 0.25; 3x either way is
    # far outside it
    assert exact / 3 <= r["residual"] <= 3 * exact
    assert r["norm_a"] == pytest.approx(np.linalg.norm(m), rel=1e-12)
    # LAPACK's pivoted inverse of the same input: its backward error, up to rounding (n eps bound)
    assert exact_eta(m, got) <= n * np.finfo(out_dt).eps and r["backward_error"] <= r["tol"]
    ref = np.linalg.inv(m.astype(out_dt)).astype(np.float64)
    tol = 50 * np.linalg.cond(m) * np.finfo(out_dt).eps  # forward error of two backward-stable inverses
    assert np.linalg.norm(got - ref) / np.linalg.norm(ref) <= tol


def test_one_leaf_refuses_non_finite_and_singular(rng, tmp_path):
    a = rng.standard_normal((200, 200))
    a[17, 3] = np.nan
    with pytest.raises(NonFiniteError, match=r"nan at \[17, 3\]"):
        bl.inv(a, memory="64MiB")
    b = rng.standard_normal((200, 200))
    b[:, 5] = b[:, 9]
    with pytest.raises(SingularMatrixError, match="numerically singular matrix at rows 0:200"):
        bl.inv(b, out=tmp_path / "x.zarr", memory="64MiB")
    assert not (tmp_path / "x.zarr").exists()


@pytest.mark.gpu
def test_gpu_one_leaf_matches_numpy(rng):
    """The one-leaf inverse on the GPU: cuSOLVER's inverse downloaded into the block read."""
    a = rng.standard_normal((300, 300))
    x = bl.inv(a, memory="64MiB", device="gpu")
    r = x.report
    assert r["plan"]["direct"] and r["phases"]["leaf inverses"] == "gpu"
    ref = np.linalg.inv(a)
    tol = 50 * np.linalg.cond(a) * np.finfo(np.float64).eps  # two backward-stable inverses
    assert np.linalg.norm(x.to_numpy() - ref) / np.linalg.norm(ref) <= tol
    assert exact_eta(a, x.to_numpy()) <= r["tol"]


# -- method "lu": the out-of-core pivoted LU, then the rows of the inverse from its panels ----------------


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("n", [377, 256])  # panels and row strips that do and do not divide n
def test_lu_route_has_lapacks_accuracy_without_refinement(rng, dtype, n):
    a = rng.standard_normal((n, n)).astype(dtype)
    x = bl.inv(a, memory="1MiB")  # out of core (float32 too: no one-task inverse)
    r = x.report
    assert r["method"] == "lu" and r["refine_steps"] == 0 and r["leaves"] == 0
    assert r["plan"]["lu_tile"] < n  # several panels (and, for float64, several strips of rows)
    assert r["plan"]["row_width"] < n or dtype == "float32"
    got = x.to_numpy()
    assert got.dtype == np.dtype(dtype)
    eps = float(np.finfo(dtype).eps)
    # LU with partial pivoting is backward stable: ||I - A X|| / (||A|| ||X||) is a small multiple of eps
    # (Higham, ASNA 2nd ed., section 14.3); 4x NumPy's own (same algorithm, other blocking) plus 2 eps of
    # rounding noise, and the default tol (n eps) is met without a Newton-Schulz step
    eta = exact_eta(a, got)
    assert eta <= 4 * exact_eta(a, np.linalg.inv(a)) + 2 * eps
    assert eta <= r["tol"] and r["backward_error"] <= r["tol"]
    ref = np.linalg.inv(a.astype(np.float64))
    cond = np.linalg.cond(a.astype(np.float64))
    # forward error <= cond * backward error (times sqrt(n) between norms)
    assert np.linalg.norm(got - ref) / np.linalg.norm(ref) <= 10 * cond * eps * np.sqrt(n)


@pytest.mark.skipif(np.finfo(np.longdouble).eps >= np.finfo(np.float64).eps, reason="needs extended precision")
@pytest.mark.parametrize("cond", [None, 1e8])
def test_lu_route_forward_error_within_the_lu_bound_unrefined(rng, cond):
    n = 300
    a = rng.standard_normal((n, n)) if cond is None else with_cond(rng, n, cond)
    ref = accurate_inverse(a)
    x = bl.inv(a, memory="512KiB", refine=False)
    assert x.report["method"] == "lu"
    # An inverse from a backward-stable LU has forward error ||X - A^-1|| / ||A^-1|| <= c_n u kappa(A)
    # (Higham, Accuracy and Stability of Numerical Algorithms, 2nd ed., section 14.3), c_n of order
    # sqrt(n) in practice for random matrices (small growth factor); 4 sqrt(n) u kappa here. NumPy's own
    # error is no bound: for the same matrix it measured 6.2e-14 on one OpenBLAS thread and 3.3e-13
    # on two (its getrf blocks by thread count), against 4.8e-13 for this route on either.
    u = np.finfo(np.float64).eps / 2
    assert forward_error(x.to_numpy(), ref) <= 4 * np.sqrt(n) * u * np.linalg.cond(a)


def test_lu_route_pivots_where_the_recursion_needs_a_butterfly(rng):
    n, h = 300, 150
    a = np.zeros((n, n))  # every leading block singular: partial pivoting needs no guard or retry
    a[:h, h:] = rng.standard_normal((h, h)) + 3 * np.eye(h)
    a[h:, :h] = rng.standard_normal((h, h)) + 3 * np.eye(h)
    p = np.eye(n)[rng.permutation(n)]
    for m in (a, p):
        x = bl.inv(m, memory="512KiB", refine=False)
        assert x.report["method"] == "lu"
        np.testing.assert_allclose(x.to_numpy(), np.linalg.inv(m), atol=1e-13 * np.abs(np.linalg.inv(m)).max())


def test_lu_route_mixed_precision(rng):
    a = rng.standard_normal((300, 300))
    x = bl.inv(a, memory="1MiB", precision="mixed")
    r = x.report
    assert r["method"] == "lu" and r["work_dtype"] == "float32" and r["refine_steps"] >= 1
    assert x.to_numpy().dtype == np.float64
    assert exact_eta(a, x.to_numpy()) <= 2 * r["tol"]


def test_lu_route_refuses_singular(rng):
    a = rng.standard_normal((300, 300))
    a[:, 7] = a[:, 3]  # numerically singular: a tiny (not exactly zero) pivot
    with pytest.raises(SingularMatrixError, match="nonsingular"):
        bl.inv(a, memory="512KiB")
    z = a.copy()
    z[:, 5] = 0.0  # an exact zero pivot
    with pytest.raises(SingularMatrixError, match="nonsingular"):
        bl.inv(z, memory="512KiB")


def test_method_choice_and_errors(rng):
    from blocklin.errors import BudgetError, ParameterError

    a = rng.standard_normal((300, 300))
    with pytest.raises(ParameterError, match="method"):
        bl.inv(a, method="qr")
    assert bl.inv_plan(a, memory="512KiB").method == "lu"
    assert "method lu" in bl.inv_plan(a, memory="512KiB").explain()
    assert bl.inv_plan(a, memory="512KiB", method="schur").method == "schur"
    assert bl.inv_plan(a, memory="64MiB", method="schur").method == "direct"  # fits: one task either way
    # two LU panels of n rows beyond the budget: "auto" would take the recursion, whose staging strips
    # (with the BLAS copy the row passes count) do not fit either here; both refuse with the minimum
    with pytest.raises(BudgetError, match="raise it to at least"):
        plan_inverse(1500, "float64", memory=2**20, kernels=MEMORY)
    with pytest.raises(BudgetError, match="raise it to at least"):
        plan_inverse(1500, "float64", memory=2**20, kernels=MEMORY, method="lu")


@pytest.mark.parametrize("dtype", [np.float32, np.complex64])
@pytest.mark.parametrize("memory,method", [("64MiB", "auto"), ("512KiB", "lu"), ("512KiB", "schur")])
@pytest.mark.filterwarnings("ignore:inv. a leading block:blocklin.errors.BlocklinWarning")
def test_float32_inverse_beyond_its_range_is_named_not_singular(dtype, memory, method):
    """A well-conditioned float32 matrix times 2^-130 (entries near 1e-39) has an inverse near 1e39, past
    float32's 3.4e38: every route overflowed and had refused it as singular (the Schur route as NaN data).
    Each names the range and the fix; the fix's float64 inverse holds those entries. The overflow is
    expected and handled: no NumPy RuntimeWarning (``invalid value encountered in matmul`` of the Inf
    rows in the probe or the substitutions) comes before the error."""
    import warnings

    rng = np.random.default_rng(5)
    n = 40 if memory == "64MiB" else 200
    q, _ = np.linalg.qr(rng.standard_normal((n, n)))
    a = q + 0.1 * rng.standard_normal((n, n))
    if np.dtype(dtype).kind == "c":
        a = a + 0.3j * rng.standard_normal((n, n))
    a = (np.ldexp(1.0, -130) * a / np.abs(a).max()).astype(dtype)
    with pytest.raises(ParameterError, match=r"a: must (give an inverse|keep the Schur recursion's blocks) within "
                       r"(float32|complex64)'s range.*Fix: invert in (float64|complex128).*2\.0\*\*1[23][0-9]") as err, \
            warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        bl.inv(a, memory=memory, method=method)
    assert not isinstance(err.value, SingularMatrixError)
    leaked = [f"{w.message} ({w.filename}:{w.lineno})" for w in caught if issubclass(w.category, RuntimeWarning)]
    assert not leaked, leaked
    wide = np.complex128 if np.dtype(dtype).kind == "c" else np.float64
    x = bl.inv(a.astype(wide), memory=memory, method=method).to_numpy()
    assert np.abs(x).max() > np.finfo(np.float32).max


def test_singular_float32_matrix_near_its_bottom_is_still_named_singular():
    rng = np.random.default_rng(5)
    a = np.ldexp(1.0, -130) * rng.standard_normal((40, 40)) / 4
    a[7] = a[3]
    with pytest.raises(SingularMatrixError, match="nonsingular"):
        bl.inv(a.astype(np.float32), memory="64MiB")


@pytest.mark.parametrize("method", ["lu", "schur"])
@pytest.mark.parametrize("e", [120, 126])
def test_float32_matrix_near_its_top_is_inverted_or_names_a(method, e):
    """Entries near 1e36-1e38 out of core: the Schur recursion's products overflow float32 (refused as NaN
    data with check_finite on), the LU's growth too (named as precision='mixed', never passed). Inverted
    within LU's bound (kappa n eps, Higham Thm 14.2 via the residual), or refused naming a and a fix that
    inverts (float64)."""
    rng = np.random.default_rng(5)
    n = 200
    q, _ = np.linalg.qr(rng.standard_normal((n, n)))
    a = q + 0.1 * rng.standard_normal((n, n))
    a = (np.ldexp(1.0, e) * a / np.abs(a).max()).astype(np.float32)
    ref = np.linalg.inv(a.astype(np.float64))
    try:
        with warnings.catch_warnings():
            # 120-schur: the leaves' norms fit float64; 126-lu: the panels' overflow is read as max |U| (and
            # refused), no NumPy overflow warning beside it
            if (e, method) in ((120, "schur"), (126, "lu")):
                warnings.simplefilter("error", RuntimeWarning)
            x = bl.inv(a, memory="512KiB", method=method).to_numpy()
    except ParameterError as err:
        # at 2^120 only the leaves' row sums passed float32's top; an Inf norm had refused it as the recursion's
        assert (e, method) != (120, "schur"), str(err)
        assert str(err).startswith("a: must keep") and "float32's range" in str(err), str(err)
        assert "inv(a, precision='float64')" in str(err)
        x = bl.inv(a, memory="512KiB", method=method, precision="float64").to_numpy()
        bound = 8 * n * np.finfo(np.float64).eps * np.linalg.cond(ref)
    else:
        bound = 8 * n * np.finfo(np.float32).eps * np.linalg.cond(ref)
    assert np.linalg.norm(x - ref) <= bound * np.linalg.norm(ref)


@pytest.mark.parametrize("dtype,memory", [(np.float32, "64KiB")])
@pytest.mark.filterwarnings("ignore:inv. a leading block:blocklin.errors.BlocklinWarning")
def test_schur_inverse_near_the_top_of_float32_is_named_for_the_range(dtype, memory):
    """Gaussian float32 data times 2^-126 (entries at float32's smallest normals, many subnormal) has an
    inverse whose entries reach about 1e38, inside float32's 3.4e38: NumPy inverts it. The Schur
    recursion's leaves stay finite, but the products that combine them (``A^-1 + E S^-1 F``) overflow,
    and the acceptance check had read the NaN residual as a singular ``A`` (``SingularMatrixError``,
    fix: regularize). It is named for the range, with fixes that invert it: float64, the power of two
    that brings ``||A||_F`` near 1, or the pivoted route; no NumPy RuntimeWarning comes before it. The
    float64 inverse the fix names is checked against LAPACK's within ``8 n eps kappa`` (Higham Thm 14.2
    via the residual, as :func:`support.tolerances.assert_solve`)."""
    import re
    import warnings

    rng = np.random.default_rng(0)
    n = 64
    b = rng.standard_normal((n, n))
    if np.dtype(dtype).kind == "c":
        b = b + 1j * rng.standard_normal((n, n))
    a = (np.ldexp(1.0, -126) * b).astype(dtype)
    with pytest.raises(ParameterError, match=r"a: must keep the Schur recursion's blocks within (float32|complex64)'s "
                       r"range.*Fix: invert in (float64|complex128).*2\.0\*\*12[0-9].*method='lu'") as err, \
            warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        bl.inv(a, memory=memory, method="schur")
    assert not isinstance(err.value, SingularMatrixError)
    leaked = [f"{w.message} ({w.filename}:{w.lineno})" for w in caught if issubclass(w.category, RuntimeWarning)]
    assert not leaked, leaked
    # the power of two the message names inverts it in float32 (exact scaling), within LU's bound
    p = int(re.search(r"2\.0\*\*(\d+)", str(err.value)).group(1))
    wide = np.complex128 if np.dtype(dtype).kind == "c" else np.float64
    ref = np.linalg.inv(a.astype(wide))
    x = np.ldexp(1.0, p) * bl.inv(np.ldexp(1.0, p) * a, memory=memory, method="schur").to_numpy().astype(wide)
    bound = 8 * n * np.finfo(np.float32).eps * np.linalg.cond(ref)
    assert np.linalg.norm(x - ref) <= bound * np.linalg.norm(ref)
