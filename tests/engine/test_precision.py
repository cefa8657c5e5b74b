"""``precision=`` of matmul, solve and inv: one vocabulary, real lower-precision compute on the CPU,
the cuBLAS math mode and dtypes on the CuPy stand-in."""

from __future__ import annotations

import re
import subprocess
import sys

import numpy as np
import pytest

from support import cupy_standin

import blocklin as bl
from blocklin.errors import ParameterError
from support.tolerances import assert_residual, assert_solve

U32 = 2.0**-24  # unit roundoff of float32
U64 = 2.0**-53
UTF32 = 2.0**-11  # TF32 keeps 10 explicit mantissa bits


def _gemm_bound(a, b, u):
    """Componentwise bound of a product computed at unit roundoff ``u`` from inputs rounded to it:
    ``|fl(A) fl(B) - A B| <= (k + 2) u |A| |B|`` (Higham 2002, eq. 3.13, plus the two input roundings)."""
    k = a.shape[1]
    return (k + 2) * u * (np.abs(a) @ np.abs(b))


@pytest.fixture
def data():
    rng = np.random.default_rng(7)
    return rng.standard_normal((150, 120)), rng.standard_normal((120, 90)), rng.standard_normal((150, 90))


# -- matmul ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("precision", ["float32", "tf32"])
def test_matmul_float32_compute_of_float64_data_on_the_cpu(data, precision):
    a, b, c = data
    r = bl.matmul(a, b, c=c, alpha=2.0, beta=0.5, precision=precision, memory="128KiB")
    x = r.to_numpy()
    assert x.dtype == np.float64 and r.report["compute_dtype"] == "float32"
    assert r.report["precision"] == precision and r.report["plan"]["out_dtype"] == "float64"
    assert r.report["plan"]["k_steps"] > 1 and r.report["plan"]["n_tasks"] > 1  # really streamed
    exact = 2.0 * a @ b + 0.5 * c
    err = np.abs(x - exact)
    # float32 product (TF32 is plain float32 on a CPU), then alpha and beta*C in float64
    assert np.all(err <= 2.0 * _gemm_bound(a, b, U32) + 4 * U64 * np.abs(exact))
    # and really float32: far above what float64 compute leaves
    assert err.max() > 1e3 * _gemm_bound(a, b, U64).max()
    assert r.report["plan"]["peak_memory"] <= 128 << 10


@pytest.mark.parametrize("precision", ["float32", "tf32"])
@pytest.mark.parametrize("case", ["a overflows", "b flushes", "sums overflow", "products flush", "in range",
                                  "stored row range"])
def test_matmul_float32_compute_refuses_what_leaves_its_range(data, precision, case, tmp_path):
    """float64 data whose cast, or whose float32 products, leave float32's range had given Inf, NaN or
    zeros where the float64 product is finite (a randomized search): refused by name before anything is
    computed, from the operands' largest entries (a pass each, or their recorded peaks). Within the
    range the componentwise bound holds."""
    a, b, _ = data
    k = a.shape[1]
    scale = {"a overflows": (2.0**130, 1.0), "b flushes": (1.0, 2.0**-110), "sums overflow": (2.0**64, 2.0**64),
             "products flush": (2.0**-56, 2.0**-56), "in range": (2.0**60, 2.0**-90),
             "stored row range": (2.0**60, 2.0**-60)}[case]
    a, b = a * scale[0], b * scale[1]
    if case == "stored row range":  # a row range of a stored operand: the range of its rows alone is asked
        big = np.vstack([a, np.full((5, k), 2.0**140)])
        a = bl.open(bl.from_array(big, tmp_path / "a.zarr").path)[: a.shape[0]]
    if case in ("in range", "stored row range"):
        x = bl.matmul(a, b, precision=precision, memory="128KiB").to_numpy()
        a = np.asarray(a)
        assert np.all(np.abs(x - a @ b) <= 2.0 * _gemm_bound(a, b, U32))
        return
    # the range a cast keeps with full precision, as the factorizations' refusal names it
    low, high = float(np.finfo(np.float32).tiny) * 2.0**23, float(np.finfo(np.float32).max)
    what = "the sums of" if case in ("sums overflow", "products flush") else re.escape(
        f"{'a' if case == 'a overflows' else 'b'}'s entries must lie within float32's range (between {low:.3g} and "
        f"{high:.3g};")
    with pytest.raises(ParameterError, match=f"precision: '{precision}' computes in float32: {what}"):
        bl.matmul(a, b, precision=precision, memory="128KiB")


def test_matmul_float64_compute_of_float32_data(data):
    a, b, _ = (x.astype(np.float32) for x in data)
    r = bl.matmul(a, b, precision="float64", memory="512KiB")
    x = r.to_numpy()
    assert x.dtype == np.float32 and r.report["compute_dtype"] == "float64"
    exact = a.astype(np.float64) @ b.astype(np.float64)
    # the float64 product rounded once to float32
    assert np.all(np.abs(x - exact) <= U32 * np.abs(exact) + _gemm_bound(a, b, U64))
    plain = bl.matmul(a, b, memory="512KiB").to_numpy()  # float32 compute is measurably worse
    assert np.abs(plain - exact).max() > np.abs(x - exact).max()


def test_matmul_default_precision_keeps_plans_and_bits(data):
    a, b, _ = data
    p0 = bl.matmul_plan(a, b, memory="512KiB")
    p1 = bl.matmul_plan(a, b, precision="default", memory="512KiB")
    assert p0 == p1 and "out_dtype" not in p0.to_dict() and p0.out_dtype is None
    p32 = bl.matmul_plan(a, b, precision="float32", memory="512KiB")
    assert p32.dtype == "float32" and p32.out_dtype == "float64" and p32.peak_memory <= 512 << 10
    assert "computed in float32, output float64" in p32.explain()
    np.testing.assert_array_equal(bl.matmul(a, b, precision=None).to_numpy(), bl.matmul(a, b).to_numpy())


def test_matmul_gram_route_only_at_the_data_precision(data):
    a = data[0]
    full = bl.matmul(a, a, trans_a=True, memory="512KiB")
    assert "SYRK" in full.report["route_reason"]  # X^T X as its Gram matrix
    low = bl.matmul(a, a, trans_a=True, precision="float32", memory="512KiB")
    assert low.report["compute_dtype"] == "float32" and "route_reason" not in low.report
    assert np.all(np.abs(low.to_numpy() - a.T @ a) <= 2.0 * _gemm_bound(a.T, a, U32))


@pytest.mark.parametrize("bad, match", [
    ("mixed", "for matmul must be one of.*no refinement step"),
    ("fp16", "for matmul must be one of.*no refinement step"),  # a solver's precision: factor low, refine
    ("half", "precision: must be one of"),
    (3, "precision: must be one of"),
])
def test_matmul_precision_refused(data, bad, match):
    a, b, _ = data
    with pytest.raises(ParameterError, match=match):
        bl.matmul(a, b, precision=bad)


def test_matmul_precision_refused_for_complex():
    z = np.ones((4, 4), dtype=np.complex128)
    with pytest.raises(ParameterError, match="precision: applies to real"):
        bl.matmul(z, z, precision="float32")


# -- solve and inv --------------------------------------------------------------------------------
@pytest.mark.parametrize("assume_a", ["gen", "pos"])
def test_solve_tf32_on_the_cpu_is_mixed_and_refines_to_float64(assume_a):
    rng = np.random.default_rng(3)
    n = 160
    g = rng.standard_normal((n, n))
    a = g + np.sqrt(n) * np.eye(n) if assume_a == "gen" else g @ g.T / n + np.eye(n)
    b = rng.standard_normal((n, 2))
    runs = {p: bl.solve(a, b, assume_a=assume_a, precision=p, memory="512KiB") for p in ("mixed", "tf32")}
    for p, x in runs.items():
        r = x.report
        assert r["precision"] == p and r["factor_dtype"] == "float32" and x.dtype == np.float64
        assert r["refine_steps"] >= 1  # the float32 factor alone is not float64-accurate
        assert r["backward_error"] <= np.sqrt(n) * np.finfo(np.float64).eps  # the default tol
        assert_residual(a, x.to_numpy(), b, dtype=np.float64)  # refined to float64's backward error
        assert_solve(x.to_numpy(), np.linalg.solve(a, b), a, dtype=np.float64)
    # no TF32 on a CPU: the same float32 computation, the same bits
    np.testing.assert_array_equal(runs["mixed"].to_numpy(), runs["tf32"].to_numpy())


@pytest.mark.parametrize("bad", ["float32", "float64", "half"])
def test_solve_precision_refused(bad):
    a = np.eye(4)
    with pytest.raises(ParameterError, match="precision"):
        bl.solve(a, np.ones(4), precision=bad)


def test_solve_precision_none_is_double():
    rng = np.random.default_rng(1)
    a = rng.standard_normal((40, 40)) + 8 * np.eye(40)
    b = rng.standard_normal(40)
    x0, x1 = bl.solve(a, b), bl.solve(a, b, precision=None)
    assert x1.report["precision"] == "double"
    np.testing.assert_array_equal(x0.to_numpy(), x1.to_numpy())


def test_inv_precision_default_alias_and_refusal():
    a = np.array([[4.0, 1.0], [2.0, 3.0]])
    assert bl.inv(a, precision="default").dtype == np.float64
    with pytest.raises(ParameterError, match="precision: must be one of"):
        bl.inv(a, precision="fast")


def test_cli_precision_options(tmp_path):
    rng = np.random.default_rng(0)
    a = bl.from_array(rng.standard_normal((64, 48)), tmp_path / "a.zarr")
    b = bl.from_array(rng.standard_normal((48, 32)), tmp_path / "b.zarr")
    s = bl.from_array(rng.standard_normal((48, 48)) + 8 * np.eye(48), tmp_path / "s.zarr")
    y = bl.from_array(rng.standard_normal((48, 1)), tmp_path / "y.zarr")
    run = [sys.executable, "-m", "blocklin.cli.main"]
    subprocess.run(run + ["gemm", str(a.path), str(b.path), "-o", str(tmp_path / "c.zarr"), "--precision", "float32"],
                   check=True, capture_output=True)
    c = bl.open(tmp_path / "c.zarr")
    assert c.dtype == np.float64 and c.provenance["params"]["precision"] == "float32"
    an, bn = a.to_numpy(), b.to_numpy()
    assert np.all(np.abs(c.to_numpy() - an @ bn) <= 2.0 * _gemm_bound(an, bn, U32))
    subprocess.run(run + ["solve", str(s.path), str(y.path), "-o", str(tmp_path / "x.zarr"), "--precision", "tf32"],
                   check=True, capture_output=True)
    x = bl.open(tmp_path / "x.zarr")
    assert_solve(x.to_numpy(), np.linalg.solve(s.to_numpy(), y.to_numpy()), s.to_numpy(), dtype=np.float64)
    bad = subprocess.run(run + ["gemm", str(a.path), str(b.path), "-o", str(tmp_path / "d.zarr"), "--precision",
                                "mixed"], capture_output=True, text=True)
    assert bad.returncode != 0 and "--precision" in bad.stderr


# -- on the CuPy stand-in -------------------------------------------------------------------------


@pytest.mark.parametrize("precision", ["float32", "tf32"])
def test_matmul_precision_on_the_gpu_sets_dtype_and_math_mode(standin, data, precision):
    a, b, c = data
    cupy_standin.STATE.counts.clear()
    r = bl.matmul(a, b, c=c, beta=1.0, precision=precision, device="gpu", memory="1MiB", device_memory="256KiB")
    counts = cupy_standin.STATE.counts
    assert counts.get("cublas.gemm float32", 0) > 0 and counts.get("cublas.gemm float64", 0) == 0
    assert (counts.get("cublas.gemm tf32", 0) > 0) == (precision == "tf32")
    assert cupy_standin.STATE.math_mode == 0  # the handle's mode restored
    exact = a @ b + c
    u = UTF32 if precision == "tf32" else U32
    assert np.all(np.abs(r.to_numpy() - exact) <= 2.0 * _gemm_bound(a, b, u) + 4 * U64 * np.abs(exact))
    assert r.to_numpy().dtype == np.float64
    assert cupy_standin.take_races() == []


def test_solve_tf32_on_the_gpu_uses_tensor_cores_and_refines(standin):
    rng = np.random.default_rng(5)
    n = 128
    g = rng.standard_normal((n, n))
    a = g @ g.T / n + np.eye(n)  # cond ~ 5: TF32's 1e-3 start converges
    b = rng.standard_normal((n, 2))
    cupy_standin.STATE.counts.clear()
    x = bl.solve(a, b, assume_a="pos", precision="tf32", device="gpu", memory="256KiB")
    assert cupy_standin.STATE.counts.get("cublas.gemm tf32", 0) > 0
    assert x.report["backward_error"] <= np.sqrt(n) * np.finfo(np.float64).eps
    assert_residual(a, x.to_numpy(), b, dtype=np.float64)
    assert_solve(x.to_numpy(), np.linalg.solve(a, b), a, dtype=np.float64)
    cupy_standin.STATE.counts.clear()
    bl.solve(a, b, assume_a="pos", precision="mixed", device="gpu", memory="256KiB")
    assert cupy_standin.STATE.counts.get("cublas.gemm tf32", 0) == 0  # "mixed" stays full float32
    assert cupy_standin.take_races() == []


@pytest.mark.parametrize("case", ["a overflows", "sums overflow"])
def test_matmul_dtype_float32_refusal_names_dtype(tmp_path, data, case, capsys):
    """float64 operands multiplied with ``dtype="float32"`` (CLI ``--dtype float32``), no precision=: the
    range refusal names dtype and its fix, not ``precision: 'default'`` and ``precision=None``, which the
    caller never passed."""
    from blocklin.cli.main import main

    a, b, _ = data
    a = a * (2.0**130 if case == "a overflows" else 2.0**64)
    b = b * (1.0 if case == "a overflows" else 2.0**64)
    with pytest.raises(ParameterError, match=r"^dtype: dtype=float32 computes in float32: .*Fix: pass dtype=None"):
        bl.matmul(a, b, dtype="float32", memory="128KiB")
    pa, pb = bl.from_array(a, tmp_path / "a.zarr").path, bl.from_array(b, tmp_path / "b.zarr").path
    assert main(["gemm", pa, pb, "-o", str(tmp_path / "c.zarr"), "--dtype", "float32", "--no-progress"]) == 1
    err = capsys.readouterr().err
    assert "ParameterError: dtype: dtype=float32" in err and "precision" not in err, err
