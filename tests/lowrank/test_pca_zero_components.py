"""``pca(n_components=0)``: the isotropic Gaussian model ``N(mu, noise I)`` from one pass (the column
moments), against scikit-learn's ``PCA(0)`` (and NumPy for complex data): no component, the mean, the
noise ``total variance / min(m, n)``, and the model's covariance, precision, scores and projections;
float32 and float64, tall and wide, in memory and at the least budget, on every scheduler."""

from __future__ import annotations

import json

import numpy as np
import pytest
from sklearn.decomposition import PCA
from sklearn.preprocessing import StandardScaler

import blocklin as bl
from blocklin.cli.main import main
from blocklin.errors import ParameterError
from support.conformance import run
from support.tolerances import assert_close_to, assert_mean, eps


def make(m: int, n: int, dtype, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((m, n)) * np.linspace(0.5, 3.0, n) + 4.0 * rng.random(n)).astype(dtype)


def noise_bound(x, dtype) -> float:
    """The total variance ``||A - 1 mu^T||_F^2 / (m - 1)`` is off by ``c m eps ||A||_F^2 / (m - 1)``
    (a sum of squares after the means' cancellation, c = 4); the noise is it over ``min(m, n)``."""
    m, n = x.shape
    return 4 * m * eps(dtype) * float(np.sum(np.abs(x.astype(np.complex128)) ** 2)) / (m - 1) / min(m, n)


def _check_model(ours, ref, x, dtype) -> None:
    m, n = x.shape
    x64 = x.astype(np.float64)
    assert ours.n_components_ == ref.n_components_ == 0
    assert ours.components_.shape == ref.components_.shape == (0, n) and ours.components_.dtype == dtype
    for name in ("explained_variance_", "explained_variance_ratio_", "singular_values_"):
        assert getattr(ours, name).shape == getattr(ref, name).shape == (0,)
    assert_mean(ours.mean_, x, dtype=dtype)
    nb = noise_bound(x, dtype)
    assert abs(ours.noise_variance_ - ref.noise_variance_) <= nb
    noise = ref.noise_variance_
    # the model's covariance noise I and precision I / noise, each off by the noise's error
    assert_close_to(ours.get_covariance(), ref.get_covariance(), bound=np.sqrt(n) * nb, what="covariance")
    assert_close_to(ours.get_precision(), ref.get_precision(), bound=np.sqrt(n) * 2 * nb / noise ** 2,
                    what="precision")
    # score_samples = -||x - mu||^2 / (2 noise) - n log(2 pi noise) / 2: the noise's relative error times
    # both terms, and the mean's error through ||x - mu||
    xc = x64 - x64.mean(axis=0)
    q = np.sum(xc ** 2, axis=1)
    mean_err = 2 * m * eps(dtype) * np.linalg.norm(np.abs(x64).mean(axis=0))
    bound = (q / noise + n) * nb / noise + 2 * np.sqrt(q) * mean_err / noise + 8 * n * eps(np.float64) * (q / noise + n)
    err = np.abs(ours.score_samples(x) - ref.score_samples(x64))
    assert np.all(err <= bound), (err.max(), bound.min())
    assert abs(ours.score(x) - ref.score(x64)) <= bound.max()
    t = ours.transform(x)
    assert t.shape == ref.transform(x64).shape == (m, 0) and t.dtype == dtype
    # back in feature space: the mean (scikit-learn refuses a 0-column input here)
    np.testing.assert_array_equal(ours.inverse_transform(t), np.broadcast_to(ours.mean_.astype(dtype), (m, n)))


@pytest.mark.parametrize("memory", [None, "least"], ids=["in-memory", "streamed"])
@pytest.mark.parametrize("shape", [(300, 12), (12, 300)], ids=["tall", "wide"])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_matches_sklearn(dtype, shape, memory, tmp_path):
    x = make(*shape, dtype, seed=1)
    ours = run(lambda mem: bl.pca(x, 0, memory=mem, temp_dir=str(tmp_path)), memory)
    ref = PCA(0).fit(x.astype(np.float64))
    assert ours.report["passes"] == 1 and ours.report["method"] == "moments"
    _check_model(ours, ref, x, dtype)


def test_standardized_matches_sklearn_on_scaled_data():
    """``scale=True``: the model of the standardized columns (a constant column stays 0)."""
    x = make(200, 9, np.float64, seed=2)
    x[:, 3] = 7.0
    ours = bl.pca(x, 0, scale=True)
    ref = PCA(0).fit(StandardScaler().fit_transform(x))
    np.testing.assert_allclose(ours.scale_, np.where(x.std(axis=0) > 0, x.std(axis=0), 1.0),
                               rtol=100 * 200 * eps(np.float64))
    # the standardized variances are exactly m / (m - 1) per nonconstant column; ours from the moments
    assert abs(ours.noise_variance_ - ref.noise_variance_) <= 8 * 200 * eps(np.float64)
    assert ours.noise_variance_ == pytest.approx(8 * 200 / 199 / 9, rel=1e-13)


@pytest.mark.parametrize("memory", [None, "least"], ids=["in-memory", "streamed"])
@pytest.mark.parametrize("e,zero_mean", [(660, False), (600, True)])
def test_standardized_column_far_below_the_others_is_refused(e, zero_mean, memory, tmp_path):
    """``scale=True`` with a column ``2^-e`` times the others (its squares below float64's range; with
    ``zero_mean`` its entries in pairs ``+-x`` that sum to exactly 0): its variance came out 0 and the
    column counted as constant, so the total variance of the standardized columns came out 8 for 9
    (``8 * 200 / 199`` for ``9 * 200 / 199``), finite and wrong. Refused as the SVD's route refuses it
    (:func:`blocklin.linalg.lowrank.run.check_standardizable`); a zero column stays a constant one."""
    x = make(200, 9, np.float64, seed=2)
    col = x[:, 3].copy()
    if zero_mean:
        col[1::2] = -col[0::2]
    x[:, 3] = np.ldexp(col, -e)
    with pytest.raises(ParameterError, match=r"scale: needs each column's variance.*column 4 first.*power of two"):
        run(lambda mem: bl.pca(x, 0, scale=True, memory=mem, temp_dir=str(tmp_path)), memory)
    x[:, 3] = 0.0
    ours = run(lambda mem: bl.pca(x, 0, scale=True, memory=mem, temp_dir=str(tmp_path)), memory)
    assert ours.total_variance_ == pytest.approx(8 * 200 / 199, rel=8 * 200 * eps(np.float64))


def test_complex_isotropic_model():
    """Complex data: the circularly symmetric ``CN(mu, noise I)``, noise ``sum mean |x - mu|^2 / min(m, n)``
    (``ddof=1``), the density ``exp(-|x - mu|^2 / noise) / (pi noise)^n``."""
    rng = np.random.default_rng(3)
    x = make(150, 6, np.float64, seed=3) + 1j * make(150, 6, np.float64, seed=4)
    ours = bl.pca(x, 0)
    xc = x - x.mean(axis=0)
    noise = np.sum(np.abs(xc) ** 2) / 149 / 6
    assert abs(ours.noise_variance_ - noise) <= noise_bound(x, np.complex128)
    assert ours.components_.shape == (0, 6) and ours.components_.dtype == np.complex128
    y = x[:5] + 0.1 * rng.standard_normal((5, 6))
    yc = y - ours.mean_
    ref = -np.sum(np.abs(yc) ** 2, axis=1) / noise - 6 * np.log(np.pi * noise)
    np.testing.assert_allclose(ours.score_samples(y), ref, rtol=1e3 * eps(np.float64) * 150)


@pytest.mark.parametrize("scheduler", ["threads", "processes"])
def test_identical_bits_on_every_scheduler(scheduler, tmp_path):
    x = make(12, 400, np.float64, seed=5)
    runs = [run(lambda mem, s=s: bl.pca(x, 0, memory=mem, scheduler=s, workers=2, temp_dir=str(tmp_path)), "least")
            for s in ("sync", scheduler)]
    np.testing.assert_array_equal(runs[0].mean_, runs[1].mean_)
    assert runs[0].noise_variance_ == runs[1].noise_variance_


def test_score_picks_the_model_with_one_component():
    """scikit-learn's test_pca_score3: the held-out score of 0, 1, 2 components is highest at 1."""
    rng = np.random.RandomState(0)
    xl = rng.randn(200, 3) + rng.randn(200, 1) * np.array([3, 4, 5]) + np.array([1, 0, 7])
    xt = rng.randn(200, 3) + rng.randn(200, 1) * np.array([3, 4, 5]) + np.array([1, 0, 7])
    ll = [bl.pca(xl, k, method="full").score(xt) for k in range(3)]
    ref = [PCA(k, svd_solver="full").fit(xl).score(xt) for k in range(3)]
    assert int(np.argmax(ll)) == 1
    np.testing.assert_allclose(ll, ref, rtol=1e-12)


@pytest.mark.parametrize("kw", [{"out": "p.zarr"}, {"updatable": True}], ids=["out", "updatable"])
def test_nothing_to_store_is_refused(kw, tmp_path):
    kw = {k: str(tmp_path / v) if k == "out" else v for k, v in kw.items()}
    with pytest.raises(ParameterError, match=r"n_components.*no factorization to store.*drop"):
        bl.pca(make(50, 4, np.float64), 0, **kw)


@pytest.mark.parametrize("method", ["rsvd", "lanczos", "sketch"])
def test_iterative_methods_refuse_zero(method):
    """As scikit-learn's randomized and arpack solvers: a method that computes triplets refuses 0."""
    with pytest.raises(ParameterError, match=r"n_components.*method='" + method + r"'.*method='auto'"):
        bl.pca(make(50, 4, np.float64), 0, method=method)


def test_svd_k0_stays_refused():
    """As SciPy's ``svds``: ``k`` must be at least 1 (the isotropic model is PCA's, not the SVD's)."""
    with pytest.raises(ParameterError, match=r"\bk\b"):
        bl.svd(make(50, 4, np.float64), 0)


def test_cli_k0(tmp_path, capsys):
    x = make(400, 8, np.float64, seed=6)
    path = str(tmp_path / "a.zarr")
    bl.from_array(x, path, chunks=(100, 8))
    assert main(["pca", path, "-k", "0", "--json", "--memory", "64KiB"]) == 0
    out = json.loads(capsys.readouterr().out)
    ref = PCA(0).fit(x)
    assert out["k"] == 0 and out["explained_variance"] == [] and out["passes"] == 1
    assert abs(out["noise_variance"] - ref.noise_variance_) <= noise_bound(x, np.float64)
    assert main(["pca", path, "-k", "0"]) == 0
    assert "0 components" in capsys.readouterr().out
