"""blocklin.pca against sklearn.decomposition.PCA(svd_solver="full") on matrices with large column means."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.decomposition import PCA
from sklearn.preprocessing import StandardScaler

import blocklin as bl
from support.tolerances import assert_mean, assert_std

K = 5


def make(m: int, n: int, dtype, seed: int = 0) -> np.ndarray:
    """Rank-K signal with a decaying spectrum, small noise (a gap of 100 after K), column means about 50."""
    rng = np.random.default_rng(seed)
    sig = rng.standard_normal((m, K)) * np.array([8.0, 5.0, 3.0, 2.0, 1.5])
    a = sig @ np.linalg.qr(rng.standard_normal((n, K)))[0].T + 0.01 * rng.standard_normal((m, n))
    return (a + 50.0 + rng.standard_normal(n)).astype(dtype)


def tol(a: np.ndarray) -> float:
    # rounding of products formed before the mean is removed: eps * ||A|| / ||A_c|| (means about 50 against a
    # spread of about 8), grown by sqrt(n) over the inner products; the SVD's own error (gap 100 after K,
    # 4 power iterations) is far below this for either dtype
    eps = np.finfo(a.dtype).eps
    a64 = a.astype(np.float64)
    return 10 * np.sqrt(a.shape[1]) * eps * np.linalg.norm(a64) / np.linalg.norm(a64 - a64.mean(axis=0))


def compare(ours, ref, t: float, a: np.ndarray) -> None:
    assert_mean(ours.mean_, a)
    np.testing.assert_allclose(ours.explained_variance_, ref.explained_variance_, rtol=t)
    np.testing.assert_allclose(ours.explained_variance_ratio_, ref.explained_variance_ratio_, rtol=t)
    np.testing.assert_allclose(ours.singular_values_, ref.singular_values_, rtol=t)
    # sign-free: align each component's sign with the reference before comparing
    c, c0 = ours.components_.astype(np.float64), ref.components_.astype(np.float64)
    signs = np.sign(np.sum(c * c0, axis=1))
    gap = ref.singular_values_[-1] / ref.singular_values_[0]
    np.testing.assert_allclose(c * signs[:, None], c0, atol=10 * t / gap)
    assert ours.n_components_ == ref.n_components_ == K


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
@pytest.mark.parametrize("memory", ["1GiB", "256KiB"])
def test_pca_matches_sklearn(dtype, memory, tmp_path):
    a = make(2000, 40, dtype)
    ours = bl.pca(a, K, memory=memory, seed=0, temp_dir=str(tmp_path))
    ref = PCA(n_components=K, svd_solver="full").fit(a.astype(np.float64))
    compare(ours, ref, tol(a), a)
    assert ours.report["in_core"] == (memory == "1GiB")
    np.testing.assert_allclose(ours.transform(a[:50]), ref.transform(a[:50].astype(np.float64)),
                               atol=100 * tol(a) * np.abs(ref.transform(a[:50])).max())
    # no temporary left behind without out=
    assert [p for p in tmp_path.rglob("*") if p.is_file()] == []


def test_pca_wide(tmp_path):
    a = make(40, 600, np.float64, seed=1)
    # 4 power iterations (rsvd): the tolerance of compare() assumes their accuracy on this gap; the default
    # (block Lanczos to 10 sqrt(eps) relative residuals) bounds the components' error by tol * s / gap instead
    ours = bl.pca(a, K, memory="128KiB", seed=0, power_iters=4, temp_dir=str(tmp_path))
    ref = PCA(n_components=K, svd_solver="full").fit(a)
    compare(ours, ref, tol(a), a)
    assert [p for p in tmp_path.rglob("*") if p.is_file()] == []  # the temporary factors were removed


@pytest.mark.parametrize("memory", ["1GiB", "256KiB"])
def test_standardized_pca_matches_scaler_then_pca(memory, tmp_path):
    a = make(1500, 30, np.float64, seed=2) * np.linspace(0.1, 30, 30)
    ours = bl.pca(a, K, scale=True, memory=memory, seed=0, temp_dir=str(tmp_path))
    scaler = StandardScaler().fit(a)
    ref = PCA(n_components=K, svd_solver="full").fit(scaler.transform(a))
    assert_std(ours.scale_, a)  # StandardScaler's scale_ is the ddof=0 standard deviation
    assert_mean(ours.mean_, a)
    # after scaling the noise is no longer far below the signal: compare with the converged tolerance
    res = bl.pca(a, K, scale=True, memory=memory, seed=0, tol=1e-10, temp_dir=str(tmp_path))
    np.testing.assert_allclose(res.explained_variance_ratio_, ref.explained_variance_ratio_, rtol=1e-8)
    np.testing.assert_allclose(res.explained_variance_, ref.explained_variance_, rtol=1e-8)


def test_pca_out_keeps_factors(tmp_path):
    a = make(300, 12, np.float64)
    ours = bl.pca(a, 3, out=str(tmp_path / "p.zarr"), seed=0, temp_dir=str(tmp_path))
    assert ours.svd is not None and (tmp_path / "p.zarr" / "mean").exists()
