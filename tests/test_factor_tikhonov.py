"""Tikhonov solves whose regularized Gram matrix exceeds the budget (stored, out-of-core Cholesky)."""

from __future__ import annotations

import numpy as np
import pytest

import blocklin as bl
from blocklin.plan.solve import small_bytes


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


def test_stored_gram_identical_bits_across_schedulers(tmp_path):
    rng = np.random.default_rng(1)
    a = bl.from_array(rng.standard_normal((150, 170)), tmp_path / "a.zarr", chunks=(32, 32))
    b = rng.standard_normal((150, 1))
    memory = small_bytes(150, 1) // 2
    xs = [bl.solve(a, b, lam=0.3, memory=memory, scheduler=s, workers=2)[...] for s in ("sync", "threads")]
    np.testing.assert_array_equal(xs[0], xs[1])


def test_stored_gram_route_on_small_chunks_and_budget(tmp_path):
    """The Gram tiles follow A's chunks, so the region GEMMs over A plan within a small budget."""
    rng = np.random.default_rng(2)
    a = rng.standard_normal((600, 600))
    b = rng.standard_normal((600, 1))
    pa = bl.from_array(a, tmp_path / "a.zarr", chunks=(64, 64))
    x = bl.solve(pa, b, lam=1.0, memory="4MiB", scheduler="sync")
    assert "out-of-core tiled Cholesky" in x.report["method_reason"] and x.report["gram_tile"] == 64
    ref = _reference(a, b, 1.0)
    # cond(K) <= 1 + (sigma_1 / lam)^2 ~ 2.4e3 with sigma_1 ~ 2 sqrt(600): float64 accuracy after refinement
    assert np.abs(x[...] - ref).max() <= 1e3 * np.finfo(np.float64).eps * np.abs(ref).max()
