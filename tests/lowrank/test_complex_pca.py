"""pca of complex data (blocklin's extension; scikit-learn's PCA refuses complex input) against
``numpy.linalg.svd`` of the centered complex128 matrix.

The definition (module docstring of :mod:`blocklin.linalg.lowrank.pca`): ``components_ = V^H`` rows,
``explained_variance_ = s^2 / (m - 1)`` real, ``mean_`` complex, ``transform(x) = (x - mu) V``,
``inverse_transform(y) = y V^H + mu``; the probabilistic model with circularly symmetric complex Gaussian
samples: ``get_covariance() = V diag(ev - noise) V^H + noise I``, ``score_samples`` the log-density
``-(x - mu)^H C^-1 (x - mu) - log det(pi C)`` computed here from the model's covariance by NumPy.

Bounds: those of :mod:`support.tolerances` times ``3 sqrt(2)`` (Higham 2002, Lemma 3.5).
"""

from __future__ import annotations

import numpy as np
import pytest
from support.conformance import least_budget
from support.tolerances import assert_close_to, assert_explained_variance, assert_mean, eps

import blocklin as bl
from blocklin.errors import ParameterError

COMPLEX = 3 * np.sqrt(2)


def make(m: int, n: int, dtype, seed: int = 0) -> np.ndarray:
    """Complex Gaussian samples with a decaying spectrum and complex means."""
    rng = np.random.default_rng(seed)
    z = rng.standard_normal((m, n)) + 1j * rng.standard_normal((m, n))
    q, _ = np.linalg.qr(rng.standard_normal((n, n)) + 1j * rng.standard_normal((n, n)))
    a = (z * 0.6 ** np.arange(n)) @ q.conj().T + (3 + 2j) * rng.standard_normal(n)
    return a.astype(dtype)


def _phase_aligned(got, ref):
    """``ref``'s rows multiplied by the unit phases that best align them with ``got``'s rows."""
    p = np.sum(np.conj(ref) * got, axis=1)
    return ref * (p / np.abs(p))[:, None]


@pytest.mark.parametrize("dtype", [np.complex64, np.complex128])
@pytest.mark.parametrize("memory", [None, "least"], ids=["in-memory", "streamed"])
@pytest.mark.parametrize("n_components", [None, 0.9, 5])
def test_complex_pca_matches_the_centered_svd(dtype, memory, n_components, tmp_path):
    m, n = 400, 12
    a = make(m, n, dtype)
    a64 = a.astype(np.complex128)
    ac = a64 - a64.mean(axis=0)
    _, s0, vt0 = np.linalg.svd(ac, full_matrices=False)
    ev0 = s0 ** 2 / (m - 1)
    call = (lambda mem: bl.pca(a, n_components, memory=mem, temp_dir=str(tmp_path),
                               **({"method": "full"} if n_components == 5 else {})))
    p = least_budget(call) if memory == "least" else call(None)
    assert p.report["in_core"] == (memory is None)
    k = p.n_components_
    if n_components == 0.9:
        assert k == int(np.searchsorted(np.cumsum(ev0 / ev0.sum()), 0.9, side="right")) + 1
    assert p.components_.dtype == dtype and p.explained_variance_.dtype == np.finfo(dtype).dtype
    assert p.mean_.dtype == np.complex128
    assert_mean(p.mean_, a, dtype=dtype, const=2 * COMPLEX)
    assert_explained_variance(p.explained_variance_, ev0[:k], p.explained_variance_ratio_, (ev0 / ev0.sum())[:k],
                              a64, dtype=dtype, const=4 * COMPLEX)
    # the components: V^H's rows up to a unit phase each; their perturbation is Weyl's b over the gap
    b = 4 * COMPLEX * m * eps(dtype) * float(np.linalg.norm(a64, 2))
    gaps = np.abs(np.diff(s0))
    gap = min(gaps[max(i - 1, 0):i + 1].min() for i in range(k))
    comps = p.components_.astype(np.complex128)
    assert_close_to(comps, _phase_aligned(comps, vt0[:k]), bound=2 * np.sqrt(k) * b / gap,
                    what="components_ against V^H")
    if k < min(m, n):
        assert abs(p.noise_variance_ - ev0[k:].mean()) <= 2 * (2 * s0[k] + b) * b / (m - 1)
    # transform = (x - mu) V and inverse_transform = y V^H + mu, in complex128 of the model's values
    x = make(50, n, dtype, seed=7)
    y = p.transform(x)
    assert y.dtype == dtype
    v = comps.conj().T
    mu = np.asarray(p.mean_)
    y_ref = (x.astype(np.complex128) - mu) @ v
    assert_close_to(y, y_ref, bound=COMPLEX * 2 * n * eps(dtype) * np.linalg.norm(x - mu) * np.sqrt(k),
                    what="transform")
    back = p.inverse_transform(y_ref)
    assert_close_to(back, y_ref @ v.conj().T + mu,
                    bound=COMPLEX * 2 * (k + 1) * eps(dtype) * (np.linalg.norm(y_ref) * np.sqrt(n) + np.linalg.norm(mu) * 50),
                    what="inverse_transform")


def test_complex_pca_model_is_the_circular_gaussian(tmp_path):
    """get_covariance, get_precision and score_samples of the circularly symmetric complex Gaussian model,
    against NumPy's inverse, slogdet and the log-density formed from the model's covariance."""
    m, n, k = 500, 10, 4
    a = make(m, n, np.complex128, seed=1)
    p = bl.pca(a, k, temp_dir=str(tmp_path))
    v = p.components_.conj().T
    cov0 = (v * (p.explained_variance_ - p.noise_variance_)) @ v.conj().T + p.noise_variance_ * np.eye(n)
    cov = p.get_covariance()
    cond = np.linalg.cond(cov0)
    assert_close_to(cov, cov0, bound=COMPLEX * 2 * n * eps(np.float64) * np.linalg.norm(cov0), what="get_covariance")
    assert np.allclose(cov, cov.conj().T, rtol=0, atol=COMPLEX * 2 * n * eps(np.float64) * np.linalg.norm(cov0))
    prec = p.get_precision()
    inv0 = np.linalg.inv(cov0)
    assert_close_to(prec, inv0, bound=COMPLEX * 4 * n * eps(np.float64) * cond * np.linalg.norm(inv0),
                    what="get_precision (inversion lemma) against numpy.linalg.inv")
    x = make(30, n, np.complex128, seed=2)
    xc = x - p.mean_
    _, logdet = np.linalg.slogdet(np.pi * cov0)
    ll0 = -np.einsum("ij,ij->i", xc.conj(), np.linalg.solve(cov0, xc.T).T).real - logdet.real
    ll = p.score_samples(x)
    assert ll.dtype == np.float64
    # each log-density: the quadratic form's error (cond times its rounding) and the log det's (n cond eps)
    quad = np.einsum("ij,ij->i", xc.conj(), xc).real / np.linalg.eigvalsh(cov0)[0]
    assert np.all(np.abs(ll - ll0) <= COMPLEX * 4 * n * eps(np.float64) * cond * (quad + n))
    assert p.score(x) == pytest.approx(float(np.mean(ll)), rel=1e-15)
    # the real model's density (half the quadratic form, 2 pi) is outside the bound: the check can fail
    real = -0.5 * (ll0 + logdet.real) - 0.5 * (n * np.log(2 * np.pi) + logdet.real - n * np.log(np.pi))
    assert np.any(np.abs(real - ll0) > COMPLEX * 4 * n * eps(np.float64) * cond * (quad + n))


def test_complex_pca_mle_is_refused_naming_the_parameter():
    with pytest.raises(ParameterError, match="n_components.*'mle' takes real data.*complex128"):
        bl.pca(make(100, 5, np.complex128), "mle")


@pytest.mark.parametrize("scheduler", ["threads", "processes"])
def test_complex_pca_same_bits_on_every_scheduler(scheduler, tmp_path):
    a = make(600, 10, np.complex128, seed=3)
    runs = [least_budget(lambda mem, s=s: bl.pca(a, 3, memory=mem, scheduler=s, workers=2, seed=1,
                                                  temp_dir=str(tmp_path))) for s in ("sync", scheduler)]
    np.testing.assert_array_equal(runs[0].mean_, runs[1].mean_)
    np.testing.assert_array_equal(runs[0].components_, runs[1].components_)
    np.testing.assert_array_equal(runs[0].explained_variance_, runs[1].explained_variance_)
