"""The Gram route of blocklin.svd: ``B^T B`` by SYRK, Rayleigh-Ritz over its top eigenvectors, block
Lanczos only where that misses ``tol``; what ``method="auto"`` picks; the centered Gram of the means pass."""

from __future__ import annotations

import numpy as np
import pytest

import blocklin as bl
import blocklin.linalg.lowrank.methods as methods_module
from blocklin.errors import BudgetError
from blocklin.linalg.blocks.center import moments_and_gram
from blocklin.plan.svd import gram_route_fits
from blocklin.runtime.job import Job
from support.tolerances import assert_mean, assert_singular_values


def make(m: int, n: int, s: np.ndarray, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    r = min(m, n)
    u, _ = np.linalg.qr(rng.standard_normal((m, r)))
    v, _ = np.linalg.qr(rng.standard_normal((n, r)))
    return (u * s[:r]) @ v.T


def slow(r: int) -> np.ndarray:
    return 1.0 / np.sqrt(1.0 + np.arange(r))


@pytest.mark.parametrize(("shape", "k", "center", "expected"), [
    ((4000, 60), 5, False, "gram"),       # N = 60 <= 24 (k + 10), M >= 8 N
    ((60, 4000), 5, False, "gram"),       # wide: the Gram of B = A^T, 60 x 60
    ((4000, 60), 5, True, "gram"),        # tall and centered: the means pass makes the Gram
    ((60, 4000), 5, True, "lanczos"),     # wide and centered: the means are along the long side
    ((500, 500), 5, False, "lanczos"),    # square: the N^3 eigh would cost more than the pass
    ((4000, 400), 4, False, "lanczos"),   # N > 24 (k + 10)
])
def test_auto_picks_the_gram_route_for_narrow_matrices(shape, k, center, expected):
    a = make(*shape, slow(min(shape)), seed=1)
    M, N = max(shape), min(shape)
    assert gram_route_fits(M, N, k, 10) == (expected == "gram" or center and shape[0] < shape[1])
    res = bl.svd(a, k, center=center, seed=0, memory="2MiB")
    r = res.report
    assert r["method"] == expected and r["method_requested"] == "auto" and r["converged"]
    assert not r["in_core"]
    if expected == "gram":
        # one pass for the Gram (with the means when centered), one Rayleigh-Ritz pass, no Lanczos step
        assert r["passes"] == 2 and r["lanczos_steps"] == 0 and r["passes_formula"].startswith("2 + L")
    ref = a - a.mean(axis=0) if center else a
    s0 = np.linalg.svd(ref, compute_uv=False)[:k]
    # the default tol targets the singular values to about 10 sqrt(eps) (svd's docstring)
    np.testing.assert_allclose(res.s, s0, rtol=10 * np.sqrt(np.finfo(np.float64).eps))


@pytest.mark.parametrize("memory", ["64MiB", "1MiB"])
@pytest.mark.parametrize("shape", [(3000, 80), (80, 3000)], ids=["tall", "wide"])
def test_gram_route_matches_numpy(shape, memory):
    a = make(*shape, slow(80), seed=2)
    k = 8
    res = bl.svd(a, k, method="gram", seed=0, memory=memory)
    assert res.report["in_core"] == (memory == "64MiB")
    U, s, Vt = (x.to_numpy() if isinstance(x, bl.Matrix) else np.asarray(x) for x in res)
    u0, s0, vt0 = np.linalg.svd(a, full_matrices=False)
    # the singular values from B Q: eps s_1 (times sqrt(n) growth and a factor 10 for the small steps)
    tol = 10 * np.sqrt(80) * np.finfo(np.float64).eps * s0[0]
    assert np.max(np.abs(s - s0[:k])) <= tol
    # the vectors up to sign, to their residuals: the gap to s_{k+1} is about 5% here
    assert np.abs(np.abs(np.sum(Vt * vt0[:k], axis=1)) - 1).max() < 1e-10
    assert np.abs(np.abs(np.sum(U * u0[:, :k], axis=0)) - 1).max() < 1e-10
    assert max(res.report["relative_residuals"]) <= res.report["tol"]


def test_gram_continues_with_lanczos_where_tol_is_missed(monkeypatch):
    """A Gram whose eigenvectors miss ``tol`` (here: replaced by a random subspace) hands its
    subspace and product to block Lanczos, which converges: the result is right, the passes say so."""
    a = make(2400, 70, slow(70), seed=3)
    k = 5

    def poor_subspace(g, width):
        q, _ = np.linalg.qr(np.random.default_rng(0).standard_normal((g.shape[0], width)))
        return q

    monkeypatch.setattr(methods_module, "gram_subspace", poor_subspace)
    res = bl.svd(a, k, method="gram", seed=0, memory="1MiB")
    r = res.report
    assert r["method"] == "gram" and r["converged"] and not r["in_core"]
    # Gram, Rayleigh-Ritz (its product is Lanczos's first step), L - 1 steps, the final Rayleigh-Ritz
    assert r["lanczos_steps"] >= 2 and r["passes"] == r["lanczos_steps"] + 2
    s0 = np.linalg.svd(a, compute_uv=False)[:k]
    np.testing.assert_allclose(res.s, s0, rtol=1e-9)


@pytest.mark.slow  # a converged Lanczos on 12000 x 400 at 3 MiB; the route choice is also in the auto cases above
def test_gram_over_budget_auto_takes_lanczos_and_explicit_refuses():
    a = make(12000, 400, slow(400), seed=4)  # the 400 x 400 Gram route needs about 5 MiB of in-core work
    res = bl.svd(a, 20, seed=0, memory="3MiB")
    assert res.report["method"] == "lanczos" and res.report["converged"]
    with pytest.raises(BudgetError, match=r"memory.*svd \(gram\).*raise it to at least") as info:
        bl.svd(a, 20, method="gram", seed=0, memory="3MiB")
    assert info.value.minimum > 3 * 2**20


@pytest.mark.parametrize("block_bytes", [None, 30 * 8 * 100], ids=["one block a strip", "blocks of 100 rows"])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_moments_and_gram_is_the_centered_gram_whatever_the_means(dtype, block_bytes, monkeypatch):
    """Chan's pairwise update of the strips' (and a strip's blocks') co-moments: no cancellation with
    means 10^6 times the spread, where ``A^T A - m mu mu^T`` would lose every digit in float64."""
    from blocklin.linalg.blocks import center

    if block_bytes is not None:
        monkeypatch.setattr(center, "MOMENTS_BLOCK_BYTES", block_bytes)
    rng = np.random.default_rng(5)
    a = (rng.standard_normal((5000, 30)) * np.linspace(1, 3, 30) + 1e6 * (1 + rng.random(30))).astype(dtype)
    with Job("test", memory="256KiB") as job:
        A = job.operand(a, "a")
        moments, g = moments_and_gram(job, A, memory=256 << 10)
        assert job.passes("a") == 1
    x = a.astype(np.float64)
    c = x - x.mean(axis=0)
    ref = c.T @ c
    # the deviations are rounded relative to the means: float64's eps times mean / spread (10^6 here)
    rtol = 10 * np.finfo(np.float64).eps * np.abs(x.mean(axis=0)).max() / c.std(axis=0).min()
    assert_mean(moments.mean, x)
    np.testing.assert_allclose(moments.var, c.var(axis=0), rtol=rtol)
    assert np.array_equal(g, g.T)
    assert np.abs(g - ref).max() <= rtol * np.abs(ref).max()
    naive = x.T @ x - x.shape[0] * np.outer(x.mean(axis=0), x.mean(axis=0))
    assert np.abs(naive - ref).max() > 1e3 * rtol * np.abs(ref).max()  # what the merge avoids


def test_centered_gram_svd_with_large_means():
    rng = np.random.default_rng(6)
    a = make(3000, 40, slow(40), seed=6) * 50 + 1e5 * (1 + rng.random(40))
    res = bl.svd(a, 6, center=True, scale=True, seed=0, memory="1MiB")
    r = res.report
    assert r["method"] == "gram" and r["passes"] == 2 and r["converged"]
    ref = (a - a.mean(axis=0)) / a.std(axis=0)
    s0 = np.linalg.svd(ref, compute_uv=False)[:6]
    # the Rayleigh-Ritz pass's products are rounded at ||A|| (means included), as for every centered pass
    tol = 10 * np.sqrt(40) * np.finfo(np.float64).eps * np.linalg.norm(a, 2) / np.linalg.norm(a - a.mean(axis=0), 2)
    assert np.max(np.abs(res.s - s0)) <= tol * s0[0]
    assert_mean(res.mean, a)


@pytest.mark.gpu
@pytest.mark.parametrize("memory", ["64MiB", "1MiB"], ids=["in-memory", "streamed"])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_gram_route_on_the_gpu_matches_the_cpu(memory, dtype):
    a = make(3000, 90, slow(90), seed=7).astype(dtype)
    cpu = bl.svd(a, 6, method="gram", seed=0, memory=memory, device="cpu")
    gpu = bl.svd(a, 6, method="gram", seed=0, memory=memory, device="gpu")
    assert gpu.report["in_core"] == cpu.report["in_core"] == (memory == "64MiB")
    assert "gpu" in gpu.report["phases"].values() and gpu.report["passes"] == cpu.report["passes"]
    # the same algorithm with float64 Gram sums on both devices: equal to the rounding of the products
    # (the Gram route's Weyl bound in the data's dtype: a float32 A is read as float32)
    assert_singular_values(gpu.s, cpu.s, n=a.shape[0], gram=True, dtype=dtype)
    U = lambda r: np.abs(np.asarray(r.U.to_numpy(), dtype=np.float64))  # noqa: E731 - signs are free
    np.testing.assert_allclose(U(gpu), U(cpu), atol=100 * (1e-10 if dtype == np.float64 else 1e-4))


def test_centered_gram_too_small_a_budget_is_refused_before_reading_with_a_minimum_that_works():
    """The means pass that makes the centered Gram is planned with the others before anything is read."""
    a = make(800, 60, slow(60), seed=8) + 1e3
    with pytest.raises(BudgetError, match=r"memory.*svd \(gram\).*raise it to at least") as info:
        bl.svd(a, 5, method="gram", center=True, seed=0, memory="256KiB")
    need = info.value.minimum
    res = bl.svd(a, 5, method="gram", center=True, seed=0, memory=need)
    assert res.report["method"] == "gram" and not res.report["in_core"] and res.report["passes"] == 2
    # auto at the small budget takes block Lanczos instead, with the same answer
    low = bl.svd(a, 5, center=True, seed=0, memory="256KiB")
    assert low.report["method"] == "lanczos"
    s0 = np.linalg.svd(a - a.mean(axis=0), compute_uv=False)[:5]
    np.testing.assert_allclose(res.s, s0, rtol=1e-9)
    np.testing.assert_allclose(low.s, s0, rtol=10 * np.sqrt(np.finfo(np.float64).eps))
