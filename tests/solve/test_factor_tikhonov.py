"""Tikhonov solves whose regularized Gram matrix exceeds the budget (stored, out-of-core Cholesky)."""

from __future__ import annotations

import numpy as np
import pytest

import blocklin as bl
from blocklin.plan.solve import small_bytes
from support.memcheck import margin, needs_hwm, run_child


def _reference(a, b, lam):
    """``min ||A x - b||^2 + lam^2 ||x||^2`` as the least-squares problem ``[A; lam I] x = [b; 0]`` (QR)."""
    n = a.shape[1]
    aug = np.vstack([a, lam * np.eye(n)])
    rhs = np.vstack([b, np.zeros((n, b.shape[1]))])
    return np.linalg.lstsq(aug, rhs, rcond=None)[0]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("m,n", [(307, 211), (211, 307), (257, 257)])
def test_stored_gram_route_matches_reference(tmp_path, dtype, m, n):
    rng = np.random.default_rng(m * n)
    a = rng.standard_normal((m, n)).astype(dtype)
    b = rng.standard_normal((m, 2)).astype(dtype)
    lam = 0.5
    memory = small_bytes(min(m, n), 2) // 2  # the in-core route cannot hold its problem
    pa = bl.from_array(a, tmp_path / "a.zarr", chunks=(64, 64))  # stored in chunks, as large operands are
    x = bl.solve(pa, b, lam=lam, memory=memory, scheduler="sync")
    r = x.report
    assert "out-of-core tiled Cholesky" in r["method_reason"] and r["method"] == "normal"
    assert x.dtype == dtype and x.shape == (n, 2)
    ref = _reference(a.astype(np.float64), b.astype(np.float64), lam)
    # computed in float64 from the stored operands: with lam = 0.5 the regularized problem is well
    # conditioned (cond(K) <= 1 + (sigma_1 / lam)^2 ~ 4e3), so after one refinement step x carries
    # float64 accuracy; the float32 output then rounds it (half an ulp of float32).
    got = x[...].astype(np.float64)
    tol = 1e3 * np.finfo(np.float64).eps if dtype == np.float64 else np.finfo(np.float32).eps
    assert np.abs(got - ref).max() <= tol * np.abs(ref).max()
    res = np.linalg.norm(b.astype(np.float64) - a.astype(np.float64) @ ref, axis=0)
    np.testing.assert_allclose(r["residual_norm"], res, rtol=1e-6 if dtype == np.float32 else 1e-10)


def test_stored_gram_least_squares_without_lam_says_nothing_of_c(tmp_path):
    """``lam=0`` on the stored-Gram route: each refinement step's ``A^T r - lam^2 x`` had passed ``x`` as a
    GEMM's ``c`` with ``beta = 0``, and the GEMM warned the user "c is ignored because beta=0; pass beta=1.0
    to add it" (of arguments the call never had). ``x`` against NumPy's least-squares solution: the bound of
    Higham Thm 20.1 (``kappa`` and ``kappa^2 ||r||`` terms, two computations)."""
    import warnings

    rng = np.random.default_rng(4)
    a = rng.standard_normal((400, 120))
    b = rng.standard_normal((400, 2))
    with warnings.catch_warnings():
        warnings.simplefilter("error", bl.errors.BlocklinWarning)
        x = bl.solve(bl.from_array(a, tmp_path / "a.zarr", chunks=(64, 64)), b, memory="192KiB", scheduler="sync")
    assert x.report["method"] == "normal" and "out-of-core" in x.report["method_reason"]
    ref, _, _, s = np.linalg.lstsq(a, b, rcond=None)
    kappa = s[0] / s[-1]
    r = np.linalg.norm(a @ ref - b)
    bound = 8 * 400 * np.finfo(np.float64).eps * (kappa * np.linalg.norm(ref) + kappa ** 2 * r / s[0])
    assert np.linalg.norm(x[...] - ref) <= bound


def test_stored_gram_identical_bits_across_schedulers(tmp_path):
    rng = np.random.default_rng(1)
    a = bl.from_array(rng.standard_normal((150, 170)), tmp_path / "a.zarr", chunks=(32, 32))
    b = rng.standard_normal((150, 1))
    memory = small_bytes(150, 1) // 2
    xs = [bl.solve(a, b, lam=0.3, memory=memory, scheduler=s, workers=2)[...] for s in ("sync", "threads")]
    np.testing.assert_array_equal(xs[0], xs[1])


def test_stored_gram_route_on_small_chunks_and_budget(tmp_path):
    """The Gram tiles are A's chunks or a multiple of them (when the region GEMMs over A still plan
    within the budget), so those GEMMs run within a small budget."""
    rng = np.random.default_rng(2)
    a = rng.standard_normal((600, 600))
    b = rng.standard_normal((600, 1))
    pa = bl.from_array(a, tmp_path / "a.zarr", chunks=(64, 64))
    x = bl.solve(pa, b, lam=1.0, memory="4MiB", scheduler="sync")
    assert "out-of-core tiled Cholesky" in x.report["method_reason"] and x.report["gram_tile"] % 64 == 0
    ref = _reference(a, b, 1.0)
    # cond(K) <= 1 + (sigma_1 / lam)^2 ~ 2.4e3 with sigma_1 ~ 2 sqrt(600): float64 accuracy after refinement
    assert np.abs(x[...] - ref).max() <= 1e3 * np.finfo(np.float64).eps * np.abs(ref).max()


TIKHONOV_CHILD = """
    import numpy as np
    import blocklin as bl
    a_path, b_path, out, memory = sys.argv[1:5]
    w = np.random.default_rng(0).standard_normal((200, 200))
    bl.solve(w, w[:, :1], lam=1.0, memory=800000, scheduler="sync")  # every import and pool of the route
    base = hwm()
    reset_hwm()
    x = bl.solve(a_path, b_path, lam=1.0, out=out, memory=memory, scheduler="sync")
    print(json.dumps({"baseline": base, "peak": hwm(), "reason": x.report["method_reason"],
                      "tile": x.report["gram_tile"]}))
"""


@needs_hwm
def test_stored_gram_route_peak_within_budget(tmp_path):
    # A and its Gram matrix A^T A + I are each 4.3x the 16 MiB budget: the SYRK blocks, the tiled
    # Cholesky and the solves must all hold within it (peak RSS over the child's warmed-up baseline)
    n, mib = 3000, 16
    rng = np.random.default_rng(7)
    a = rng.standard_normal((n, n))
    b = rng.standard_normal((n, 1))
    pa = bl.from_array(a, tmp_path / "a.zarr", chunks=(256, 256))
    pb = bl.from_array(b, tmp_path / "b.zarr", chunks=(256, 1))
    budget = mib * 2**20
    assert a.nbytes >= 4 * budget
    r = run_child(TIKHONOV_CHILD, pa.path, pb.path, str(tmp_path / "x.zarr"), f"{mib}MiB", timeout=900)
    used = r["peak"] - r["baseline"]
    assert "out-of-core tiled Cholesky" in r["reason"]
    assert used <= budget + margin(budget), f"used {used / 2**20:.1f} MiB over baseline, budget {mib} MiB"
    x = bl.open(tmp_path / "x.zarr").to_numpy()
    # the regularized normal equations: cond(K) <= 1 + (sigma_1 / lam)^2 ~ 1.2e4 here, and one
    # refinement step leaves a float64 backward error: relative to the terms' sizes, the residual is
    # the rounding of sums of n products (~ sqrt(n) eps), whatever cond(K)
    k_norm = np.linalg.norm(a, 2) ** 2 + 1.0
    res = np.linalg.norm(a.T @ (b - a @ x) - x) / (k_norm * np.linalg.norm(x) + np.linalg.norm(a.T @ b))
    assert res <= 4 * np.sqrt(n) * np.finfo(np.float64).eps


@pytest.mark.gpu
@pytest.mark.parametrize("m,n", [(300, 200), (200, 300)])
def test_stored_gram_route_on_gpu(tmp_path, m, n):
    # the SYRK blocks (in-place SYRK where the device has one, the product otherwise), the Cholesky
    # and the solves all run through the device interface
    rng = np.random.default_rng(11)
    a = rng.standard_normal((m, n))
    b = rng.standard_normal((m, 1))
    pa = bl.from_array(a, tmp_path / "a.zarr", chunks=(64, 64))
    x = bl.solve(pa, b, lam=0.5, memory=small_bytes(min(m, n), 1) // 2, device="gpu", device_memory="64MiB")
    assert "out-of-core tiled Cholesky" in x.report["method_reason"] and x.report["device"] == "gpu"
    ref = _reference(a, b, 0.5)
    # float64 throughout, cond(K) ~ 4e3, one refinement step: as on the CPU
    assert np.abs(x[...] - ref).max() <= 1e3 * np.finfo(np.float64).eps * np.abs(ref).max()
