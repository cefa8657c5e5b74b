"""Results through ``CudaDevice`` (a GPU, or the CuPy stand-in: ``pytest --cupy-standin``) against NumPy and
SciPy, for the public operations no other gpu-marked test checks: ``eigsh``, ``lstsq``, ``norm`` (2, -2,
nuc), ``cond``, ``det``, ``slogdet``, ``aslinearoperator`` and NumPy's protocol functions with
``device="gpu"`` in force. In memory and streamed (a budget of a few hundred KiB).

Bounds as in ``tests/engine/test_cluster_coverage.py`` (Higham 2002; ``support.tolerances``); eigenvalues
of a symmetric ``A`` by Weyl, ``4 n eps ||A||_2`` (:func:`support.tolerances.assert_eigenvalues`), with the
Lanczos residual's ``r^2 / gap`` (Kato-Temple) where converged to ``tol``.
"""

from __future__ import annotations


import numpy as np
import pytest

import blocklin as bl
from support.tolerances import assert_product, assert_solve, assert_spectral_norms, eps, fro_norm

pytestmark = pytest.mark.gpu

F64 = eps(np.float64)
BUDGETS = {"streamed": "512KiB", "in-memory": "64MiB"}
GPU = {"device": "gpu", "scheduler": "sync"}


def _spectrum(m, n, s, seed):
    rng = np.random.default_rng(seed)
    u, _ = np.linalg.qr(rng.standard_normal((m, len(s))))
    v, _ = np.linalg.qr(rng.standard_normal((n, len(s))))
    return (u * s) @ v.T


@pytest.mark.parametrize("budget", list(BUDGETS))
def test_eigsh_on_gpu(tmp_path, budget):
    n = 120
    w_all = np.concatenate([np.linspace(-1.0, 1.0, n - 4), [10.0, 12.0, 15.0, 20.0]])
    q, _ = np.linalg.qr(np.random.default_rng(1).standard_normal((n, n)))
    a = (q * w_all) @ q.T
    a = (a + a.T) / 2
    A = bl.from_array(a, tmp_path / "a.zarr", chunks=(30, 30))
    tol = 1e-10
    res = bl.eigsh(A, 4, tol=tol, seed=0, order="ascending", memory=BUDGETS[budget], **GPU)
    assert res.report["device"] == "gpu"
    ref = np.linalg.eigvalsh(a)[-4:]
    # converged to a residual tol * |w| each: Kato-Temple r^2 / gap (gap >= 2), and Weyl for the products
    r = tol * 20.0
    assert np.max(np.abs(res.w - ref)) <= r ** 2 / 2.0 + 4 * n * F64 * 20.0
    v = np.asarray(res.V.to_numpy() if isinstance(res.V, bl.Matrix) else res.V)
    # A v = w v to the residual reached, plus the rounding of forming A v
    assert fro_norm(a @ v - v * res.w) <= 4 * (r + 4 * n * F64 * 20.0)


@pytest.mark.parametrize("budget", list(BUDGETS))
def test_lstsq_on_gpu(tmp_path, budget):
    rng = np.random.default_rng(2)
    a = rng.standard_normal((300, 20)) * np.logspace(0, -2, 20)
    b = rng.standard_normal((300, 2))
    x, _, rank, s = bl.lstsq(bl.from_array(a, tmp_path / "a.zarr", chunks=(50, 20)), b, memory=BUDGETS[budget], **GPU)
    ref, _, ref_rank, ref_s = np.linalg.lstsq(a, b, rcond=None)
    x = x.to_numpy() if isinstance(x, bl.Matrix) else np.asarray(x)
    assert rank == ref_rank
    assert np.max(np.abs(np.asarray(s) - ref_s)) <= 4 * 300 * F64 * ref_s[0]
    kappa = ref_s[0] / ref_s[-1]
    r = fro_norm(a @ ref - b)
    assert fro_norm(x - ref) <= 8 * 300 * F64 * (kappa * fro_norm(ref) + kappa ** 2 * r / ref_s[0])


@pytest.mark.parametrize("budget", list(BUDGETS))
def test_spectral_norms_cond_and_determinants_on_gpu(tmp_path, budget):
    s = np.concatenate([[10.0, 5.0], np.linspace(2.0, 0.01, 28)])
    M, n = 600, 30
    a = _spectrum(M, n, s, seed=3)
    A = bl.from_array(a, tmp_path / "a.zarr", chunks=(50, 30))
    kw = {"memory": "2MiB" if budget == "streamed" else BUDGETS[budget], **GPU}
    assert_spectral_norms(bl.norm, bl.cond, A, s, rows=M, **kw)

    rng = np.random.default_rng(4)
    m = 100
    sq = rng.standard_normal((m, m)) + 12 * np.eye(m)
    SQ = bl.from_array(sq, tmp_path / "sq.zarr", chunks=(25, 25))
    sign, logdet = bl.slogdet(SQ, memory=BUDGETS[budget], **GPU)
    ref = np.linalg.slogdet(sq)
    bound = m * np.linalg.norm(np.linalg.inv(sq), 2) * 2 * m * F64 * np.linalg.norm(sq) * 2
    assert sign == ref.sign and abs(logdet - ref.logabsdet) <= bound
    d = bl.det(SQ, memory=BUDGETS[budget], **GPU)
    assert np.sign(d) == ref.sign and abs(d / np.linalg.det(sq) - 1) <= 2 * bound
    k1 = np.linalg.cond(sq, 1)
    assert abs(bl.cond(SQ, 1, memory=BUDGETS[budget], **GPU) - k1) <= 16 * m * F64 * np.linalg.cond(sq) * k1


def test_linear_operator_on_gpu(tmp_path):
    rng = np.random.default_rng(5)
    a = rng.standard_normal((500, 30))
    op = bl.aslinearoperator(bl.from_array(a, tmp_path / "a.zarr", chunks=(50, 30)), memory="256KiB", **GPU)
    x = rng.standard_normal((30, 2))
    y = rng.standard_normal((500, 2))
    assert_product(op.matmat(x), a @ x, a, x)
    assert_product(op.rmatmat(y), a.T @ y, a.T, y)


def test_numpy_protocol_with_the_gpu_in_force(tmp_path):
    rng = np.random.default_rng(6)
    n = 80
    a = rng.standard_normal((n, n)) + 10 * np.eye(n)
    A = bl.from_array(a, tmp_path / "a.zarr", chunks=(20, 20))
    b = rng.standard_normal(n)
    with bl.config.set(memory="256KiB", **GPU):
        c = A @ A
        assert c.report["device"] == "gpu"
        assert_product(c.to_numpy(), a @ a, a, a)
        x = np.linalg.solve(A, b)
        assert_solve(x, np.linalg.solve(a, b), a)
        inv = np.linalg.inv(A)
        assert inv.report["device"] == "gpu"
        assert_solve(inv.to_numpy(), np.linalg.inv(a), a)
        A32 = bl.from_array(a.astype(np.float32), tmp_path / "a32.zarr", chunks=(20, 20))
        a32 = a.astype(np.float32).astype(np.float64)
        x = np.linalg.solve(A32, b)
        assert x.dtype == np.float64
        assert_solve(x, np.linalg.solve(a32, b), a32)
