"""Results on a dask.distributed cluster (the ``client`` fixture: two worker processes) against NumPy and
SciPy, for the public operations and NumPy protocol functions no other test checks there: ``qr``,
``lstsq``, ``solve_triangular``, ``cho_solve``, ``lu_solve``, ``norm``, ``cond``, ``det``, ``slogdet``,
``aslinearoperator`` and NumPy's ``@``/``numpy.linalg`` on a stored ``Matrix`` with the cluster in force.

Operands are stored with small chunks and run under budgets of a few hundred KiB, so that every call
streams and splits its work into several tasks on the workers. Bounds (Higham, *Accuracy and Stability
of Numerical Algorithms*, 2nd ed., 2002; ``support.tolerances``):

- QR: ``||A - Q R|| <= gamma_{cn} ||A||`` and ``||Q^T Q - I|| <= gamma_{cn}`` (Thm 19.4);
- triangular, Cholesky and LU solves: forward error ``8 n eps kappa(A) ||x||`` (backward error through
  Thm 7.2, :func:`support.tolerances.assert_solve`);
- least squares: the perturbation bound of Thm 20.1 (``kappa`` and ``kappa^2 ||r||`` terms);
- entry-wise norms: sums of ``t`` non-negative terms, ``2 t eps`` relative (Thm 3.5, 4.3);
- singular values (2, -2, nuc, cond): Weyl, ``4 M eps s_1`` per value; the 2-norm by block Lanczos to a
  residual ``r = 10 sqrt(eps) s_1``, within ``r^2 / gap`` more (Kato-Temple);
- ``log |det A|``: LU's backward error moves it by ``n ||A^-1||_2 ||dA||_2`` (first order, Thm 9.3).
"""

from __future__ import annotations


import numpy as np
import pytest
import scipy.linalg as sl

import blocklin as bl
from support.tolerances import (assert_factorization, assert_orthonormal, assert_product, assert_solve,
                                assert_spectral_norms, eps, fro_norm)

distributed = pytest.importorskip("distributed")

F64 = eps(np.float64)


def _spectrum(m, n, s, seed):
    rng = np.random.default_rng(seed)
    u, _ = np.linalg.qr(rng.standard_normal((m, len(s))))
    v, _ = np.linalg.qr(rng.standard_normal((n, len(s))))
    return (u * s) @ v.T


def _store(tmp_path, name, x, chunks):
    return bl.from_array(x, tmp_path / f"{name}.zarr", chunks=chunks)


def _distributed(result):
    assert result.report["scheduler"] == "distributed", result.report.get("scheduler")


@pytest.mark.parametrize("shape", [(400, 30), (40, 70)], ids=["tall", "wide"])
def test_qr(tmp_path, client, shape):
    a = np.random.default_rng(1).standard_normal(shape)
    A = _store(tmp_path, "a", a, (50, 10))
    q, r = bl.qr(A, mode="reduced", memory="640KiB", scheduler=client)
    _distributed(r)
    q, r = q.to_numpy(), r.to_numpy()
    k = min(shape)
    assert q.shape == (shape[0], k) and r.shape == (k, shape[1])
    assert np.array_equal(r, np.triu(r))
    assert_factorization(a, q @ r, const=4.0)
    assert_orthonormal(q, const=4.0)
    # R alone (mode="r", by TSQR where tall) is NumPy's R up to the signs of its rows: R^T R = A^T A with
    # the backward error above, so ||R - D R_ref|| is bounded as the factorization (well conditioned A)
    r_only = bl.qr(A, memory="640KiB", scheduler=client, method="tsqr" if shape[0] > shape[1] else "auto")
    _distributed(r_only)
    r_only = r_only.to_numpy()
    ref = np.linalg.qr(a, mode="r")
    signs = np.sign(np.diag(r_only)) * np.sign(np.diag(ref))
    kappa = np.linalg.cond(a)
    assert fro_norm(r_only - ref * signs[:, None]) <= 8 * max(shape) * F64 * kappa * fro_norm(a)


@pytest.mark.parametrize("shape", [(400, 20), (30, 60)], ids=["tall", "wide"])
def test_lstsq(tmp_path, client, shape):
    rng = np.random.default_rng(2)
    a = rng.standard_normal(shape)
    b = rng.standard_normal((shape[0], 2))
    x, _, rank, s = bl.lstsq(_store(tmp_path, "a", a, (50, 10)), _store(tmp_path, "b", b, (50, 2)),
                             memory="256KiB", scheduler=client)
    ref, _, ref_rank, ref_s = np.linalg.lstsq(a, b, rcond=None)
    x = x.to_numpy() if isinstance(x, bl.Matrix) else np.asarray(x)
    assert rank == ref_rank and x.shape == ref.shape
    m, n = shape
    assert np.max(np.abs(np.asarray(s) - ref_s)) <= 4 * max(shape) * F64 * ref_s[0]
    kappa = ref_s[0] / ref_s[-1]
    r = fro_norm(a @ ref - b)
    bound = 8 * max(shape) * F64 * (kappa * fro_norm(ref) + kappa ** 2 * r / ref_s[0])
    assert fro_norm(x - ref) <= bound


def test_factored_and_triangular_solves(tmp_path, client):
    rng = np.random.default_rng(3)
    n = 90
    g = rng.standard_normal((n, n))
    spd = g @ g.T / n + np.eye(n)
    b = rng.standard_normal((n, 3))
    B = _store(tmp_path, "b", b, (20, 3))
    kw = {"memory": "192KiB", "tile": 20, "scheduler": client}

    t = np.tril(g) / 8 + 2 * np.eye(n)
    x = bl.solve_triangular(_store(tmp_path, "t", t, (20, 20)), B, lower=True, trans=True, **kw)
    _distributed(x)
    assert_solve(x.to_numpy(), sl.solve_triangular(t, b, lower=True, trans=1), t.T)

    c = sl.cholesky(spd, lower=True)
    x = bl.cho_solve(_store(tmp_path, "c", c, (20, 20)), B, lower=True, **kw)
    _distributed(x)
    assert_solve(x.to_numpy(), np.linalg.solve(spd, b), spd)

    lu, piv = sl.lu_factor(g)
    x = bl.lu_solve(_store(tmp_path, "lu", lu, (20, 20)), B, piv=piv, **kw)
    _distributed(x)
    assert_solve(x.to_numpy(), np.linalg.solve(g, b), g)
    # blocklin's own factors, computed on the cluster too
    f = bl.lu(_store(tmp_path, "g", g, (20, 20)), tmp_path / "f.zarr", memory="192KiB", scheduler=client)
    x = bl.lu_solve(f, B, **kw)
    assert_solve(x.to_numpy(), np.linalg.solve(g, b), g)
    L = bl.cholesky(_store(tmp_path, "spd", spd, (20, 20)), tmp_path / "l.zarr", memory="192KiB", scheduler=client)
    x = bl.cho_solve(L, B, **kw)
    assert_solve(x.to_numpy(), np.linalg.solve(spd, b), spd)


def test_norms_cond_and_determinants(tmp_path, client):
    s = np.concatenate([[10.0, 5.0], np.linspace(2.0, 0.01, 28)])
    M, n = 600, 30
    a = _spectrum(M, n, s, seed=4)
    A = _store(tmp_path, "a", a, (50, 10))
    kw = {"memory": "512KiB", "scheduler": client}
    for o in (None, "fro", 1, -1, np.inf, -np.inf):
        t = a.size if o in (None, "fro") else M
        ref = np.linalg.norm(a, o)
        assert abs(bl.norm(A, o, **kw) - ref) <= 2 * t * F64 * ref, o
    assert_spectral_norms(bl.norm, bl.cond, A, s, rows=M, **kw)

    rng = np.random.default_rng(5)
    m = 120
    sq = rng.standard_normal((m, m)) + 12 * np.eye(m)
    SQ = _store(tmp_path, "sq", sq, (25, 25))
    sign, logdet = bl.slogdet(SQ, **kw)
    ref = np.linalg.slogdet(sq)
    bound = m * np.linalg.norm(np.linalg.inv(sq), 2) * 2 * m * F64 * np.linalg.norm(sq) * 2
    assert sign == ref.sign and abs(logdet - ref.logabsdet) <= bound
    d = bl.det(SQ, **kw)  # exp(logdet): the relative error of exp is the absolute error of its argument
    assert np.sign(d) == ref.sign and abs(d / np.linalg.det(sq) - 1) <= 2 * bound
    k1 = np.linalg.cond(sq, 1)
    assert abs(bl.cond(SQ, 1, **kw) - k1) <= 16 * m * F64 * np.linalg.cond(sq) * k1


def test_linear_operator_products(tmp_path, client):
    rng = np.random.default_rng(6)
    a = rng.standard_normal((500, 30))
    op = bl.aslinearoperator(_store(tmp_path, "a", a, (50, 10)), memory="256KiB", scheduler=client)
    x = rng.standard_normal((30, 2))
    y = rng.standard_normal((500, 2))
    assert_product(op.matmat(x), a @ x, a, x)
    assert_product(op.rmatmat(y), a.T @ y, a.T, y)
    assert_product(op.matvec(x[:, 0]), a @ x[:, 0], a, x[:, :1])
    assert op.passes >= 3


def test_numpy_protocol_with_the_cluster_in_force(tmp_path, client):
    """NumPy code on stored matrices, ``blocklin.config.set(scheduler=client)`` around it: the protocol
    functions run on the cluster (as their reports say) and agree with NumPy's."""
    rng = np.random.default_rng(7)
    n = 80
    a = rng.standard_normal((n, n)) + 10 * np.eye(n)
    tall = rng.standard_normal((300, 12))
    A = _store(tmp_path, "a", a, (20, 20))
    T = _store(tmp_path, "t", tall, (50, 12))
    b = rng.standard_normal(n)
    with bl.config.set(scheduler=client, memory="256KiB"):
        c = A @ A
        _distributed(c)
        assert_product(c.to_numpy(), a @ a, a, a)
        v = np.dot(A, b)
        assert v.shape == (n,)
        assert_product(v, a @ b, a, b[:, None])
        w = b @ A
        assert_product(w, b @ a, a.T, b[:, None])
        x = np.linalg.solve(A, b)
        assert x.shape == (n,)
        assert_solve(x, np.linalg.solve(a, b), a)
        # a float32 stored operand with a float64 right-hand side: NumPy's float64, its upcast copy staged
        A32 = _store(tmp_path, "a32", a.astype(np.float32), (20, 20))
        x = np.linalg.solve(A32, b)
        a32 = a.astype(np.float32).astype(np.float64)
        assert x.dtype == np.float64
        assert_solve(x, np.linalg.solve(a32, b), a32)
        inv = np.linalg.inv(A)
        _distributed(inv)
        assert_solve(inv.to_numpy(), np.linalg.inv(a), a)
        spd = a @ a.T / n
        L = np.linalg.cholesky(_store(tmp_path, "spd", spd, (20, 20)))
        assert_factorization(spd, L.to_numpy() @ L.to_numpy().T, factors=(L.to_numpy(), L.to_numpy()))
        Q, R = np.linalg.qr(T)
        assert_factorization(tall, Q.to_numpy() @ R.to_numpy(), const=4.0)
        assert_orthonormal(Q.to_numpy(), const=4.0)
        sv = np.linalg.svd(T, compute_uv=False)
        ref_s = np.linalg.svd(tall, compute_uv=False)
        assert np.max(np.abs(sv - ref_s)) <= 4 * 300 * F64 * ref_s[0]
        x, _, rank, _ = np.linalg.lstsq(T, np.ones(300), rcond=None)
        ref = np.linalg.lstsq(tall, np.ones(300), rcond=None)[0]
        kappa = ref_s[0] / ref_s[-1]
        r = fro_norm(tall @ ref - 1)
        assert rank == 12 and fro_norm(x - ref) <= 8 * 300 * F64 * (kappa * fro_norm(ref) + kappa ** 2 * r / ref_s[0])
        ref_fro = np.linalg.norm(a)
        assert abs(np.linalg.norm(A) - ref_fro) <= 2 * a.size * F64 * ref_fro
        sign, logdet = np.linalg.slogdet(A)
        ref = np.linalg.slogdet(a)
        bound = n * np.linalg.norm(np.linalg.inv(a), 2) * 2 * n * F64 * np.linalg.norm(a) * 2
        assert sign == ref.sign and abs(logdet - ref.logabsdet) <= bound
