"""Every component by the Gram route: ``pca(method="gram")`` with ``n_components=min(m, n)`` (``None``,
a fraction, ``"mle"``) and ``svd(method="gram")`` with ``k=min(m, n)``, scikit-learn's
``PCA(svd_solver="covariance_eigh")``.

The route takes every eigenvector of the (centered) Gram and the Rayleigh-Ritz step over that whole
space (:func:`blocklin.linalg.lowrank.methods.gram`), so its singular values come from ``B Q`` and carry
the full route's ``eps s_1``, not the Gram's ``eps s_1^2 / s_i``: checked against NumPy and against
scikit-learn's ``full`` and ``covariance_eigh`` solvers, tall and wide, in memory and streamed, on every
scheduler the tests use.
"""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.decomposition import PCA

import blocklin as bl
from blocklin.errors import ParameterError
from support.conformance import dense, least_budget, run
from support.placements import DEVICES, scheduler_arg
from support.tolerances import assert_explained_variance, assert_mean, assert_orthonormal, assert_singular_values, eps


def graded(m: int, n: int, cond: float, seed: int = 0) -> np.ndarray:
    """``m x n`` data whose centered singular values fall geometrically from 1 to ``1 / cond`` (well
    separated: ratio at least ``cond^(1 / (N - 1))``), with means ten times the spread."""
    rng = np.random.default_rng(seed)
    N = min(m, n)
    u, _ = np.linalg.qr(rng.standard_normal((m, N)))
    u -= u.mean(axis=0)  # centered columns: the centered data keeps these singular values to rounding
    u, _ = np.linalg.qr(u)
    v, _ = np.linalg.qr(rng.standard_normal((n, N)))
    x = (u * np.logspace(0, -np.log10(cond), N)) @ v.T
    return x + 10.0 * (1 + rng.random(n)) / np.sqrt(m)


def _check(ours, a, *, dtype=np.float64):
    """Against NumPy's SVD of the centered data: Weyl at the uncentered data's rounding for the variances,
    each component of a nonzero variance within Wedin's ``rounding / gap`` of NumPy's (signs by
    scikit-learn's rule), the mean, and the noise variance 0 (every component kept) as scikit-learn's."""
    x = a.astype(np.float64)
    ac = x - x.mean(axis=0)
    m, n = a.shape
    N = min(m, n)
    _, s0, vt0 = np.linalg.svd(ac, full_matrices=False)
    ref = PCA(N, svd_solver="full").fit(x)
    assert ours.report["method"] == "gram" and ours.n_components_ == N
    assert_mean(ours.mean_, x)
    norm = np.linalg.norm(x, 2)
    assert_singular_values(ours.singular_values_, s0, n=max(m, n), s1=norm, dtype=dtype)
    assert_explained_variance(ours.explained_variance_, ref.explained_variance_, ours.explained_variance_ratio_,
                              ref.explained_variance_ratio_, x, dtype=dtype)
    assert_orthonormal(ours.components_.T, n=n, dtype=dtype)
    gaps = np.array([np.min(np.abs(np.delete(s0, i) - s0[i])) for i in range(N)])
    rounding = 4 * max(m, n) * eps(dtype) * norm
    err = np.linalg.norm(ours.components_.astype(np.float64) - ref.components_, axis=1)
    live = s0 > rounding  # the centered wide data's last direction is a zero: any completion (orthonormal above)
    assert np.all(err[live] <= 2 * rounding / gaps[live]), (err, 2 * rounding / gaps)
    assert ours.noise_variance_ == ref.noise_variance_ == 0.0


@pytest.mark.parametrize("memory", [None, "least"], ids=["in-memory", "streamed"])
@pytest.mark.parametrize("shape", [(400, 12), (12, 400)], ids=["tall", "wide"])
@pytest.mark.parametrize("n_components", ["all", None])
def test_every_component_matches_sklearn(n_components, shape, memory, tmp_path):
    """``n_components=min(m, n)`` (and ``None``) by the Gram route had been refused ("the smallest triplets
    come from the whole space"); now every component, as ``PCA(svd_solver="full")`` and, on this well
    conditioned spectrum, ``"covariance_eigh"``."""
    a = graded(*shape, cond=1e3, seed=1)
    N = min(shape)
    nc = N if n_components == "all" else None
    ours = run(lambda mem: bl.pca(a, nc, method="gram", memory=mem, temp_dir=str(tmp_path)), memory)
    assert ours.report["in_core"] == (memory is None)
    if memory == "least":  # the Gram with the means, then the Rayleigh-Ritz pass over the whole space
        assert ours.report["passes"] == 2 and ours.report["lanczos_steps"] == 0
    _check(ours, a)
    cov = PCA(N, svd_solver="covariance_eigh").fit(a)
    # scikit-learn's eigenvalues of the covariance carry its rounding, Weyl's c max(m, n) eps ||A||^2 / (m - 1)
    # absolute (its zero variance of wide data comes out near 1e-12 here)
    m = shape[0]
    bound = 4 * max(shape) * eps(np.float64) * np.linalg.norm(a, 2) ** 2 / (m - 1)
    assert np.abs(ours.explained_variance_ - cov.explained_variance_).max() <= bound
    assert np.abs(ours.explained_variance_ratio_ - cov.explained_variance_ratio_).max() <= \
        2 * bound / cov.explained_variance_.sum()
    assert ours.noise_variance_ == cov.noise_variance_


@pytest.mark.parametrize("memory", [None, "least"], ids=["in-memory", "streamed"])
def test_small_variances_to_the_full_routes_accuracy(memory, tmp_path):
    """Centered singular values from 1 down to 1e-7, below ``sqrt(eps)``: eigenvalues of the Gram alone
    (scikit-learn's ``covariance_eigh``) hold the smallest to ``eps s_1^2 / s_i``, about 1e-9 relative
    error in ``s_i`` here; the Rayleigh-Ritz step over the Gram's eigenvectors gives them to the full
    route's ``eps s_1`` (Weyl), and their components to Wedin's ``rounding / gap``."""
    a = graded(300, 10, cond=1e7, seed=2)
    ours = run(lambda mem: bl.pca(a, 10, method="gram", memory=mem, temp_dir=str(tmp_path)), memory)
    _check(ours, a)


@pytest.mark.parametrize("n_components", [0.9, "mle"])
def test_fraction_and_mle_take_every_component_by_the_gram_route(n_components, tmp_path):
    """A fraction or ``"mle"`` computes every component and keeps scikit-learn's count."""
    a = graded(400, 12, cond=1e3, seed=3)
    ours = least_budget(lambda mem: bl.pca(a, n_components, method="gram", memory=mem, temp_dir=str(tmp_path)))
    ref = PCA(n_components, svd_solver="full").fit(a)
    assert ours.report["method"] == "gram" and ours.n_components_ == ref.n_components_
    assert_explained_variance(ours.explained_variance_, ref.explained_variance_, ours.explained_variance_ratio_,
                              ref.explained_variance_ratio_, a)
    assert abs(ours.noise_variance_ - ref.noise_variance_) <= 4 * 400 * eps(np.float64) * np.linalg.norm(a) ** 2 / 399


@pytest.mark.parametrize("memory", [None, "least"], ids=["in-memory", "streamed"])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_uncentered_svd_every_triplet(dtype, memory, tmp_path):
    """``svd(method="gram")`` with ``k=None``: NumPy's singular values to Weyl's bound, orthonormal factors."""
    a = graded(500, 16, cond=1e4 if dtype == np.float64 else 1e2, seed=4).astype(dtype)
    res = run(lambda mem: bl.svd(a, method="gram", memory=mem, temp_dir=str(tmp_path)), memory)
    assert res.report["method"] == "gram" and res.s.size == 16
    s0 = np.linalg.svd(a.astype(np.float64), compute_uv=False)
    assert_singular_values(res.s, s0, n=500, dtype=dtype)
    assert_orthonormal(dense(res.U), n=500, dtype=dtype)
    assert_orthonormal(dense(res.Vt).T, n=16, dtype=dtype)


@pytest.mark.parametrize("scheduler", ["threads", "processes", pytest.param("cluster", marks=pytest.mark.slow)])
def test_identical_bits_on_every_scheduler(scheduler, tmp_path, request):
    """The Gram's task sums are added in a fixed order: the same components on every scheduler (a
    LocalCluster's among them)."""
    a = graded(400, 12, cond=1e3, seed=5)
    runs = [least_budget(lambda mem, s=s: bl.pca(a, 12, method="gram", memory=mem, scheduler=s, workers=2,
                                                 temp_dir=str(tmp_path))) for s in ("sync", scheduler_arg(scheduler, request))]
    for name in ("components_", "explained_variance_", "mean_"):
        np.testing.assert_array_equal(getattr(runs[0], name), getattr(runs[1], name))


def test_the_smallest_triplets_alone_stay_refused():
    """``which="SM"`` with ``k < min(m, n)`` still names the full route."""
    with pytest.raises(ParameterError, match="whole space"):
        bl.svd(graded(100, 8, cond=10.0), 3, which="SM", method="gram")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("memory", [None, "least"], ids=["in-memory", "streamed"])
@pytest.mark.parametrize("shape", [(400, 12), (12, 400)], ids=["tall", "wide"])
def test_every_component_on_every_device(shape, memory, device, tmp_path):
    """Every component (``n_components=None``) with the Gram's passes and the whole-space Rayleigh-Ritz
    step on the device: NumPy's and scikit-learn's to the bounds of :func:`_check`."""
    a = graded(*shape, cond=1e3, seed=1)
    ours = run(lambda mem: bl.pca(a, None, method="gram", memory=mem, device=device, temp_dir=str(tmp_path)), memory)
    assert ours.report["device"] == device
    _check(ours, a)
