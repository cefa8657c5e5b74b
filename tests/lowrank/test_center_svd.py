"""svd(center=True, scale=...) against NumPy's SVD of the explicitly centered (scaled) matrix.

The centered matrix is built exactly rank k, so any method recovers it to rounding; the means are
large (about 100 times the spread), which is what the rank-one correction has to survive.
"""

from __future__ import annotations

import numpy as np
import pytest

import blocklin as bl
from support.tolerances import assert_mean, assert_singular_values, assert_std

K = 4


def make(m: int, n: int, dtype, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """``A = A_c + 1 mu^T`` with ``A_c`` centered, of rank ``K``; returns ``(A, A_c)`` (float64)."""
    rng = np.random.default_rng(seed)
    basis, _ = np.linalg.qr(np.column_stack([np.ones(m), rng.standard_normal((m, K))]))
    u = basis[:, 1:]  # orthogonal to the ones vector: the columns of u v^T have zero mean
    v, _ = np.linalg.qr(rng.standard_normal((n, K)))
    ac = (u * (np.sqrt(m) * np.array([4.0, 2.0, 1.0, 0.5]))) @ v.T
    mu = 100.0 + rng.standard_normal(n)
    a = (ac + mu).astype(dtype)
    return a, a.astype(np.float64) - a.astype(np.float64).mean(axis=0)


def tolerance(a: np.ndarray, reference_s1: float) -> float:
    # Products with A are rounded relative to ||A|| (means included) before the rank-one correction
    # removes the mean, so the error is eps * ||A||_2 / s_1(A_c) relative to s_1, times a sqrt(n)
    # growth of the inner products and a factor 10 for the in-core orthogonalization steps.
    eps = np.finfo(a.dtype).eps
    return 10 * np.sqrt(min(a.shape)) * eps * np.linalg.norm(a.astype(np.float64), 2) / reference_s1


def check(res, ref: np.ndarray, tol: float) -> None:
    U, s, Vt = res
    U = U.to_numpy() if hasattr(U, "to_numpy") else np.asarray(U)
    Vt = Vt.to_numpy() if hasattr(Vt, "to_numpy") else np.asarray(Vt)
    u0, s0, vt0 = np.linalg.svd(ref, full_matrices=False)
    assert np.max(np.abs(s - s0[:K])) <= tol * s0[0]
    # sign-free: |<v_i, v0_i>| = 1 and the rank-k product agrees
    assert np.all(np.abs(np.abs(np.sum(Vt.astype(np.float64) * vt0[:K], axis=1)) - 1) <= 10 * tol * s0[0] / s0[K - 1])
    rec = (U.astype(np.float64) * s.astype(np.float64)) @ Vt.astype(np.float64)
    assert np.linalg.norm(rec - ref) <= 10 * tol * np.linalg.norm(ref)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("shape", [(1200, 40), (40, 1200)])
@pytest.mark.parametrize("memory", ["1GiB", "192KiB"])
@pytest.mark.parametrize("method", ["rsvd", "lanczos", "gram"])
def test_centered_svd_matches_numpy(dtype, shape, memory, method, tmp_path):
    if method == "gram" and shape[0] < shape[1]:
        method = "auto"  # the Gram route centers tall matrices only: auto takes Lanczos here
    a, ac = make(*shape, dtype)
    res = bl.svd(a, K, center=True, method=method, memory=memory, seed=3, temp_dir=str(tmp_path))
    assert res.report["center"] and res.report["in_core"] == (memory == "1GiB")
    np.testing.assert_allclose(res.mean, a.astype(np.float64).mean(axis=0), rtol=0, atol=1e-12 * 200)
    assert res.scale is None
    check(res, ac, tolerance(a, np.linalg.norm(ac, 2)))


@pytest.mark.parametrize("shape", [(900, 30), (30, 900)])
@pytest.mark.parametrize("memory", ["1GiB", "160KiB"])
def test_scaled_svd_matches_numpy(shape, memory, tmp_path):
    a, _ = make(*shape, np.float64, seed=1)
    a = a * np.linspace(0.5, 20, shape[1])  # unequal column scales: standardizing changes the answer
    a64 = a.astype(np.float64)
    ref = (a64 - a64.mean(axis=0)) / a64.std(axis=0)
    res = bl.svd(a, K, center=True, scale=True, memory=memory, seed=2, temp_dir=str(tmp_path))
    assert_std(res.scale, a64)
    U, s, Vt = res
    s0 = np.linalg.svd(ref, compute_uv=False)
    # ref is not of rank K after scaling: compare against a converged run's top values only
    assert np.max(np.abs(s - s0[:K])) <= 1e-6 * s0[0]


def test_streamed_passes_and_no_copy(tmp_path):
    a, ac = make(3000, 50, np.float64)
    res = bl.svd(a, K, center=True, power_iters=2, memory="256KiB", seed=0, temp_dir=str(tmp_path))
    rep = res.report
    assert not rep["in_core"]
    # q power iterations (the first one also takes the means), the final projection
    assert rep["passes"] == 2 + 1
    assert "column means from the first pass" in rep["passes_formula"]
    # a standardized PCA needs the standard deviations before its first product: a pass of its own
    scaled = bl.svd(a, K, center=True, scale=True, power_iters=2, memory="256KiB", seed=0, temp_dir=str(tmp_path))
    assert scaled.report["passes"] == 2 + 1 + 1 and "+ 1 (column means)" in scaled.report["passes_formula"]
    # nothing of A's size was written: only Y (m x l) and the factors
    assert rep["bytes_written"] < a.nbytes


def test_centered_sketch_agrees_with_in_core(tmp_path):
    a, _ = make(1500, 40, np.float64, seed=4)
    ref = bl.svd(a, K, center=True, method="sketch", seed=5, temp_dir=str(tmp_path))
    streamed = bl.svd(a, K, center=True, method="sketch", memory="256KiB", seed=5, temp_dir=str(tmp_path))
    assert not streamed.report["in_core"] and ref.report["in_core"]
    # same random sketches on the same centered matrix: equal up to rounding
    np.testing.assert_allclose(streamed.s, ref.s, rtol=1e-9)


def test_out_group_stores_mean_and_scale(tmp_path):
    import zarr

    a, _ = make(500, 20, np.float64)
    bl.svd(a, K, center=True, scale=True, out=str(tmp_path / "f.zarr"), seed=0, temp_dir=str(tmp_path))
    g = zarr.open_group(str(tmp_path / "f.zarr"), mode="r")
    assert_mean(g["mean"][:], a)
    assert_std(g["scale"][:], a)


def test_uncentered_default_unchanged(tmp_path):
    a, _ = make(400, 20, np.float64)
    res = bl.svd(a, K, seed=0, temp_dir=str(tmp_path))
    assert res.mean is None and res.report["center"] is False
    # uncentered: the first singular value is the mean direction's
    assert res.s[0] > 10 * np.linalg.norm(a - a.mean(axis=0), 2)


@pytest.mark.parametrize("shape", [(1200, 30), (30, 1200)])
@pytest.mark.parametrize("method", ["rsvd", "sketch", "lanczos", "gram"])
def test_centered_passes_on_the_gpu_standin(shape, method, tmp_path):
    """The correction's device operations (rank-one GEMMs, the row scale) under the CuPy stand-in,
    which checks stream ordering: the same results as on the CPU, and no race."""
    from support import cupy_standin

    a, _ = make(*shape, np.float64, seed=6)
    a = a * np.linspace(1, 4, shape[1])
    cpu = bl.svd(a, K, center=True, scale=True, method=method, memory="160KiB", seed=4, temp_dir=str(tmp_path))
    with cupy_standin.installed():
        gpu = bl.svd(a, K, center=True, scale=True, method=method, memory="160KiB", seed=4, device="gpu",
                     temp_dir=str(tmp_path))
        cupy_standin.synchronize_all()
        races, cupy_standin.STATE.races = cupy_standin.STATE.races, []
    assert races == []
    # a standardized wide A scales rows of B = A^T: those passes run on the CPU, and say so
    where = "cpu" if shape[0] < shape[1] else "gpu"
    assert not gpu.report["in_core"] and gpu.report["phases"] == {"passes over A": where}
    # the same algorithm in float64 on both devices: equal up to the order of rounding, which is at the
    # size of the scaled data with its means (Weyl with s_1 of the uncentered scaled A)
    assert_singular_values(gpu.s, cpu.s, n=max(shape), s1=np.linalg.norm(a / a.std(axis=0), 2),
                           gram=method == "gram")


@pytest.mark.parametrize("shape", [(900, 30), (30, 900)])
def test_scale_without_center(shape, tmp_path):
    # scale alone divides by the standard deviations about the mean, without subtracting the mean
    a, _ = make(*shape, np.float64, seed=7)
    a = a * np.linspace(0.5, 3, shape[1])
    ref = a / a.std(axis=0)
    cpu_in = bl.svd(a, K, scale=True, seed=1, tol=1e-10, temp_dir=str(tmp_path))
    streamed = bl.svd(a, K, scale=True, seed=1, tol=1e-10, memory="160KiB", temp_dir=str(tmp_path))
    s0 = np.linalg.svd(ref, compute_uv=False)[:K]
    for res in (cpu_in, streamed):
        assert res.mean is None and res.report["scale"] and not res.report["center"]
        np.testing.assert_allclose(res.s, s0, rtol=1e-9)


@pytest.mark.parametrize("memory", ["1GiB", "160KiB"])
@pytest.mark.parametrize("center", [True, False])
def test_a_column_of_one_repeated_value_is_constant(center, memory, tmp_path):
    """A column of one repeated value has a variance of rounding (``5e-16`` of its mean), not 0: divided
    by its square root it became a component of noise (``s`` of 1e16). It is left unscaled, as
    scikit-learn's ``StandardScaler`` leaves it (``_is_constant_feature``)."""
    rng = np.random.default_rng(0)
    x = np.hstack([rng.standard_normal((900, 3)) * [3.0, 2.0, 1.0], np.full((900, 1), 0.1)])
    x = np.tile(x, (1, 8))  # 32 columns: streamed at 160 KiB
    ref = x - x.mean(axis=0) if center else x.copy()
    sd = x.std(axis=0)
    const = np.arange(x.shape[1]) % 4 == 3
    ref[:, ~const] /= sd[~const]
    res = bl.svd(x, 3, scale=True, center=center, seed=1, tol=1e-10, memory=memory, temp_dir=str(tmp_path))
    np.testing.assert_array_equal(res.scale[const], 1.0)
    s0 = np.linalg.svd(ref, compute_uv=False)[:3]
    assert_singular_values(res.s, s0, n=x.shape[0], s1=s0[0])


@pytest.mark.parametrize("dtype, far", [(np.float64, 1e-200), (np.float64, 1e200), (np.float32, 1e-30),
                                        (np.complex64, 1e30)])
def test_scale_alone_of_constant_columns_far_from_one(dtype, far, tmp_path):
    """``scale`` without ``center``: a constant column is left unscaled, so where every column is constant
    the matrix is ``A`` itself, factored scaled by a power of two and scaled back (``s`` came out ``2^e``
    off: 1.49 for 3.9e-200). Constant columns beside standardized ones on such data: refused."""
    rng = np.random.default_rng(0)
    a = (rng.standard_normal((1, 20)) * far).astype(dtype)  # one row: every column constant
    res = bl.svd(a, scale=True, memory="16MiB", temp_dir=str(tmp_path))
    b = a.astype(np.complex128 if np.dtype(dtype).kind == "c" else np.float64)
    peak = np.abs(b).max()
    want = peak * np.linalg.norm(b / peak)  # the norm of one row, without over- or underflow
    assert res.report["scaling"]["exponent"] != 0
    np.testing.assert_allclose(res.s[0], want, rtol=8 * np.finfo(dtype).eps * 20)
    mixed = np.random.default_rng(1).standard_normal((300, 4)) * far
    mixed[:, 3] = far
    with pytest.raises(bl.errors.ParameterError, match="scale: leaves a constant column unscaled.*column 4"):
        bl.svd(mixed.astype(dtype), 3, scale=True, memory="16MiB", seed=0, temp_dir=str(tmp_path))
    got = bl.svd(mixed.astype(dtype), 3, scale=True, center=True, memory="16MiB", seed=0, temp_dir=str(tmp_path))
    assert np.isfinite(got.s).all()


def _exact_std(a: np.ndarray) -> np.ndarray:
    """Population standard deviations to about ``u``: each column's mean by ``math.fsum`` (correctly rounded),
    then its deviations' squares summed by ``fsum``. NumPy's two-pass ``std`` is itself off by about
    ``(u sqrt(m) |mean| / std)^2``, its mean's summation error squared: 181 u at the means below."""
    import math

    out = np.empty(a.shape[1])
    for j in range(a.shape[1]):
        col = a[:, j]
        mu = math.fsum(col) / col.size
        d = col - mu
        out[j] = math.sqrt(math.fsum(d * d) / col.size)
    return out


@pytest.mark.parametrize("center", [False, True])
# uncentered, the products are rounded at ||A|| = 1e7 times the spread, beyond the default tol's reach for the
# small triplets: a truthful ConvergenceWarning (the residual check below is what this test is about)
@pytest.mark.filterwarnings("ignore::blocklin.errors.ConvergenceWarning")
def test_streamed_standard_deviations_of_large_means(center, tmp_path):
    """Column means 1e7 times the spread, read by passes (4 MiB for 8 MB of data): the means pass's Chan-Golub-
    LeVeque merges took ``d`` from strip means summed directly, rounded at ``u sqrt(r) |mean|``, which entered
    the variance at first order (``2 d delta``): the standard deviations were off by 6e-10 relative (2.8e6 u),
    and the reported residuals, of the problem with those deviations, under-reported the error of the
    standardized problem by that much. With means kept as (shift, offset) they are within a few u, the same
    bits on every scheduler."""
    rng = np.random.default_rng(0)
    m, n = 20000, 50
    a = 1e7 * (1 + rng.random(n)) + rng.standard_normal((m, n)) * (0.5 + rng.random(n))
    ref = _exact_std(a)
    eps = np.finfo(np.float64).eps
    runs = {}
    for scheduler in ("sync", "threads", "processes"):
        runs[scheduler] = res = bl.svd(a, 3, center=center, scale=True, method="lanczos", memory="4MiB", seed=0,
                                       scheduler=scheduler, temp_dir=str(tmp_path))
        assert not res.report["in_core"]
        # Each strip's squares are summed in blocks of rows and the strips merged pairwise: rounding of about
        # u sqrt(m) in the variance (probabilistic bound, Higham and Mary 2019; the worst case is m u),
        # half that in its square root; the offsets' rounding adds u. 2 sqrt(m) u = 6e-14 here.
        assert np.max(np.abs(res.scale - ref) / ref) <= 2 * np.sqrt(m) * eps
    for scheduler in ("threads", "processes"):  # the sums run in row order whatever the scheduler
        assert np.array_equal(runs[scheduler].scale, runs["sync"].scale)
        assert np.array_equal(runs[scheduler].s, runs["sync"].s)
    res = runs["sync"]
    # The reported residuals ||B^T u - s v|| are those of the standardized matrix B itself: measured in float64
    # against the exact standard deviations they agree to the rounding of the products, u sqrt(m) ||A|| / std
    # (the products are formed before the means are removed; see blocklin.linalg.blocks.center), times 8.
    z = (a - (a.mean(axis=0) if center else 0.0)) / ref
    u, s, v = np.asarray(res.U), np.asarray(res.s), np.asarray(res.Vt).T
    measured = np.linalg.norm(z.T @ u - v * s, axis=0)
    rounding = 8 * np.sqrt(m) * eps * np.linalg.norm(a / ref, 2)
    assert np.all(measured <= np.asarray(res.report["residuals"]) + rounding)
