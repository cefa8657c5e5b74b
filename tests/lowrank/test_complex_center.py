"""svd(center=True, scale=...) and eigsh(center=True) of complex data against LAPACK's SVD of the
explicitly centered (standardized) matrix in complex128.

The complex means are complex (``mu = mean(a, axis=0)``), the variances real (``mean |a - mu|^2``), and the
centered passes conjugate: ``A_c^H A_c``'s co-moments merge with ``conj(d) d^T``, the adjoint products'
correction subtracts ``conj(mu)``. The centered matrix is complex Gaussian of exact rank ``K`` with
complex means about 30 times its spread, which is what the rank-one correction has to survive.

Bounds: those of :mod:`support.tolerances` (Weyl for the singular values at ``||A||_2`` of the uncentered
``A``, where the streamed products are rounded; the sums of the means and variances) with ``eps`` of the
parts' dtype, times ``3 sqrt(2)`` for complex arithmetic (Higham 2002, Lemma 3.5).
"""

from __future__ import annotations

import numpy as np
import pytest
from support.conformance import run_checked, least_budget
from support.tolerances import assert_close_to, assert_mean, assert_orthonormal, assert_singular_values, eps

import blocklin as bl

COMPLEX = 3 * np.sqrt(2)
K = 4


def make(m: int, n: int, dtype, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """``A = A_c + 1 mu^T`` (complex ``mu``) with ``A_c`` centered of rank ``K``; returns ``(A, A_c)``,
    ``A_c`` the complex128 centering of the stored ``A``."""
    rng = np.random.default_rng(seed)
    g = rng.standard_normal((m, K)) + 1j * rng.standard_normal((m, K))
    basis, _ = np.linalg.qr(np.column_stack([np.ones(m), g]))
    u = basis[:, 1:]  # orthogonal to the ones vector: the columns of u v^H have zero mean
    v, _ = np.linalg.qr(rng.standard_normal((n, K)) + 1j * rng.standard_normal((n, K)))
    ac = (u * (np.sqrt(m) * np.array([4.0, 2.0, 1.0, 0.5]))) @ v.conj().T
    mu = (30.0 + rng.standard_normal(n)) * np.exp(1j * rng.uniform(0, 2 * np.pi, n))
    a = (ac + mu).astype(dtype)
    a64 = a.astype(np.complex128)
    return a, a64 - a64.mean(axis=0)


def _dense(x):
    return x.to_numpy() if isinstance(x, bl.Matrix) else np.asarray(x)


_run = run_checked  # tests/support/conformance.py


def _check_factors(res, a, ref, dtype):
    """``s`` within Weyl's bound at ``||A||_2``, orthonormal factors, and ``U S V^H = A_c`` (rank ``K``)."""
    U, s, Vt = _dense(res[0]), np.asarray(res[1]), _dense(res[2])
    m, n = a.shape
    s0 = np.linalg.svd(ref, compute_uv=False)
    big = float(np.linalg.norm(a.astype(np.complex128), 2))
    assert s.dtype == np.finfo(dtype).dtype and U.dtype == dtype and Vt.dtype == dtype
    assert_singular_values(s, s0[:K], n=max(m, n), dtype=dtype, s1=big, const=4 * COMPLEX)
    assert_orthonormal(U, dtype=dtype, const=2 * COMPLEX, n=max(m, n))
    assert_orthonormal(Vt.conj().T, dtype=dtype, const=2 * COMPLEX, n=max(m, n))
    # U S V^H is A_c + E projected on its top K singular subspace: ||E|| <= b (Weyl's b above), moved
    # by at most (1 + s_1 / s_K) b; sqrt(K) for the Frobenius norm of a rank-2K difference
    b = 4 * COMPLEX * max(m, n) * eps(dtype) * big
    rec = (U.astype(np.complex128) * s) @ Vt.astype(np.complex128)
    assert_close_to(rec, ref, bound=np.sqrt(2 * K) * (1 + s0[0] / s0[K - 1]) * b,
                    what="U diag(s) V^H against the centered A")


@pytest.mark.parametrize("dtype", [np.complex64, np.complex128])
@pytest.mark.parametrize("shape", [(400, 24), (24, 400)], ids=["tall", "wide"])
@pytest.mark.parametrize("memory", [None, "least"], ids=["in-memory", "streamed"])
@pytest.mark.parametrize("method", ["rsvd", "lanczos", "gram", "sketch", "full"])
def test_complex_centered_svd_matches_lapack(dtype, shape, memory, method, tmp_path):
    if method == "gram" and shape[0] < shape[1]:
        method = "lanczos"  # the Gram route centers tall matrices only
    a, ac = make(*shape, dtype)
    res = _run(lambda mem: bl.svd(a, K, center=True, method=method, memory=mem, seed=3,
                                  temp_dir=str(tmp_path)), memory)
    assert res.report["center"] and res.scale is None
    assert res.mean.dtype == np.complex128
    assert_mean(res.mean, a, dtype=dtype, const=2 * COMPLEX)
    # the variances are real: mean |a - mu|^2
    assert res.moments.var.dtype == np.float64
    var0 = np.mean(np.abs(ac) ** 2, axis=0)
    kappa2 = np.sum(np.abs(a.astype(np.complex128)) ** 2, axis=0) / (shape[0] * var0)
    assert np.all(np.abs(res.moments.var - var0) <= 2 * COMPLEX * shape[0] * eps(dtype) * kappa2 * var0)
    _check_factors(res, a, ac, dtype)


@pytest.mark.parametrize("dtype", [np.complex64, np.complex128])
@pytest.mark.parametrize("shape", [(400, 24), (24, 400)], ids=["tall", "wide"])
@pytest.mark.parametrize("memory", [None, "least"], ids=["in-memory", "streamed"])
def test_complex_standardized_svd_matches_lapack(dtype, shape, memory, tmp_path):
    """``scale=True``: the columns divided by the real standard deviations ``sqrt(mean |a - mu|^2)``; the
    standardized matrix keeps rank ``K`` (a column scaling), so the full method's factors are compared."""
    a, ac = make(*shape, dtype, seed=1)
    res = _run(lambda mem: bl.svd(a, K, center=True, scale=True, method="full", memory=mem,
                                  temp_dir=str(tmp_path)), memory)
    sd = np.sqrt(np.mean(np.abs(ac) ** 2, axis=0))
    assert res.scale.dtype == np.float64
    kappa2 = np.sum(np.abs(a.astype(np.complex128)) ** 2, axis=0) / (shape[0] * sd ** 2)
    assert np.all(np.abs(res.scale - sd) <= COMPLEX * shape[0] * eps(dtype) * kappa2 * sd)
    # the products are rounded at ||A D^-1||_2 (the data with its means, scaled)
    _check_factors(res, a / sd.astype(dtype), ac / sd, dtype)


@pytest.mark.parametrize("scheduler", ["sync", "threads", "processes"])
def test_complex_centered_svd_on_every_scheduler(scheduler, tmp_path):
    """The streamed centered passes give the same bits on every scheduler (row-ordered merges)."""
    a, ac = make(600, 20, np.complex128, seed=2)
    runs = [least_budget(lambda mem, s=s: bl.svd(a, K, center=True, method="lanczos", seed=5, memory=mem,
                                                  scheduler=s, workers=2, temp_dir=str(tmp_path)))
            for s in ("sync", scheduler)]
    for res in runs:
        assert not res.report["in_core"]
        _check_factors(res, a, ac, np.complex128)
    np.testing.assert_array_equal(runs[0].mean, runs[1].mean)
    np.testing.assert_array_equal(runs[0].s, runs[1].s)
    np.testing.assert_array_equal(_dense(runs[0].Vt), _dense(runs[1].Vt))


@pytest.mark.parametrize("memory", [None, "least"], ids=["in-memory", "streamed"])
def test_complex_covariance_eigsh_matches_lapack(memory, tmp_path):
    """eigsh(center=True): the top eigenpairs of the Hermitian covariance ``A_c^H A_c / (m - 1)``, real
    eigenvalues, complex eigenvectors ``V`` (``C V = V diag(w)``)."""
    a, ac = make(500, 20, np.complex128, seed=3)
    m = a.shape[0]
    res = _run(lambda mem: bl.eigsh(a, K, center=True, memory=mem, temp_dir=str(tmp_path), seed=1,
                                    order="descending"), memory)
    w, v = np.asarray(res[0]), _dense(res[1])
    cov = ac.conj().T @ ac / (m - 1)
    w0 = np.linalg.eigvalsh(cov)[::-1][:K]
    assert w.dtype == np.float64 and v.dtype == np.complex128
    order = np.argsort(w)[::-1]
    big = float(np.linalg.norm(a, 2))
    # w = s^2 / (m - 1): |w - w0| <= (2 s + b) b / (m - 1), b Weyl's bound at ||A||_2
    b = 4 * COMPLEX * m * eps(np.complex128) * big
    assert np.all(np.abs(w[order] - w0) <= (2 * np.sqrt(w0 * (m - 1)) + b) * b / (m - 1))
    assert_orthonormal(v, const=2 * COMPLEX, n=m)
    r = cov @ v - v * w
    assert np.linalg.norm(r) <= np.sqrt(K) * (1 + w0[0] / w0[-1]) * (2 * np.sqrt(w0[0] * (m - 1)) + b) * b / (m - 1)

