"""The in-memory steps of block Lanczos: ``tall_qr`` (CholeskyQR2 or Householder), ``next_block`` (one
projection, the Kahan-Parlett test, reprojection) and the estimate-gated explicit residuals, against
NumPy/SciPy's factorizations and eigenvalues."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.linalg

from blocklin.linalg.blocks.orth import CHOLQR_COND, ct, next_block, tall_qr
from blocklin.linalg.lowrank.lanczos import block_lanczos
from tests.support.tolerances import assert_factorization, assert_orthonormal, eps


def _block(rng, n, c, dtype):
    x = rng.standard_normal((n, c))
    if np.dtype(dtype).kind == "c":
        x = x + 1j * rng.standard_normal((n, c))
    return x.astype(dtype)


@pytest.mark.parametrize("dtype", [np.float64, np.complex128])
@pytest.mark.parametrize("cond", [1e2, 1e9, np.inf])  # CholeskyQR2, Householder, rank-deficient Householder
def test_tall_qr_against_householder(dtype, cond):
    rng = np.random.default_rng(1)
    n, c = 3000, 12
    u, _ = np.linalg.qr(_block(rng, n, c, dtype))
    w, _ = np.linalg.qr(_block(rng, c, c, dtype))
    sv = np.logspace(0, -np.log10(cond), c) if np.isfinite(cond) else np.r_[np.ones(c - 2), 0.0, 0.0]
    y = (u * sv) @ ct(w)
    q, r = tall_qr(y)
    assert q.shape == (n, c) and r.shape == (c, c) and q.dtype == np.dtype(dtype)
    assert np.allclose(np.tril(r, -1), 0)
    assert_factorization(y, q @ r)
    if np.isfinite(cond):  # a full-rank block: an orthonormal Q, and R's singular values are Y's (Weyl)
        assert_orthonormal(q, n=n)
        np.testing.assert_allclose(np.linalg.svd(r, compute_uv=False), sv, rtol=0,
                                   atol=4 * n * eps(dtype) * sv[0])


def test_tall_qr_routes():
    rng = np.random.default_rng(2)
    y = rng.standard_normal((500, 6))
    q, r = tall_qr(y)
    # CholeskyQR2's R against LAPACK's up to the signs of its rows
    q_ref, r_ref = np.linalg.qr(y)
    d = np.sign(np.diag(r)) * np.sign(np.diag(r_ref))
    np.testing.assert_allclose(d[:, None] * r, r_ref, atol=8 * 500 * eps(np.float64) * np.linalg.norm(y, 2))
    y[:, 3] = y[:, 2]  # singular: chol(Y^T Y) breaks down or cond >= CHOLQR_COND, Householder takes it
    assert np.linalg.cond(y) > CHOLQR_COND
    q, r = tall_qr(y)
    assert_factorization(y, q @ r)


def _image(seed, n, m, b, dtype, inside):
    """An orthonormal ``V`` (``n x m``), a block ``out`` orthogonal to it and ``z`` = ``inside`` parts in
    ``span(V)`` (times 50) and ``1 - inside`` of ``out``."""
    rng = np.random.default_rng(seed)
    v, _ = np.linalg.qr(_block(rng, n, m, dtype))
    out = _block(rng, n, b, dtype)
    out -= v @ (ct(v) @ out)
    return v, out, inside * (v @ _block(rng, m, b, dtype)) * 50 + (1 - inside) * out


@pytest.mark.parametrize("dtype", [np.float64, np.complex128])
@pytest.mark.parametrize("inside", [0.0, 1 - 1e-9])  # z outside span(V); almost inside (heavy cancellation)
def test_next_block_orthogonal_to_basis(dtype, inside):
    n, m, b = 2000, 40, 8
    v, _, z = _image(3, n, m, b, dtype, inside)
    c = ct(v) @ z
    q1, t = tall_qr(z - v @ c)
    norm_z = float(np.linalg.norm(np.concatenate([c, t]), 2))
    q = next_block(v, q1, t, norm_z=norm_z, seed=0, counter=1, width=b)
    assert q.shape == (n, b)
    assert_orthonormal(q, n=n)
    assert np.linalg.norm(ct(v) @ q) <= 2 * n * eps(dtype) * np.sqrt(m * b)
    # q spans the projected block's directions (its residual against span(q) at the rounding of z)
    y = z - v @ c
    assert np.linalg.norm(y - q @ (ct(q) @ y)) <= 1e3 * n * eps(dtype) * np.linalg.norm(z)


def _basis(v):
    from blocklin.linalg.lowrank.basis import MemoryBasis

    b = MemoryBasis(v.shape[0], v.shape[1], v.dtype)
    b.append(v)
    return b


@pytest.mark.parametrize("dtype", [np.float64, np.complex128])
@pytest.mark.parametrize("inside", [0.0, 1 - 1e-9])
def test_reorthogonalize_projects_again_where_the_test_asks(dtype, inside, monkeypatch):
    """One pass against the whole basis, and a second only where Kahan-Parlett says the first took most of
    the block (the heavy cancellation: no Gram matrix returned then, the second pass changed ``y``);
    either way ``y`` ends orthogonal to ``V`` to the rounding of a projection and equal to the part of
    ``z`` outside ``span(V)`` to the rounding of removing the inside part (``m`` terms each)."""
    from blocklin.linalg.blocks.orth import reorthogonalize

    n, m, b = 2000, 40, 4
    v, out, z = _image(6, n, m, b, dtype, inside)
    V = _basis(v)
    subtracts = []
    monkeypatch.setattr(type(V), "project_out", lambda self, *a, _f=type(V).project_out: subtracts.append(1) or _f(self, *a))
    y, g = reorthogonalize(V, z.copy(), V.dot(z), ct(z) @ z)
    assert len(subtracts) == (1 if inside else 0) and (g is None) == bool(inside)
    assert np.linalg.norm(ct(v) @ y) <= 2 * n * eps(dtype) * np.sqrt(m * b) * np.linalg.norm(y, 2)
    np.testing.assert_allclose(y, (1 - inside) * out, rtol=0, atol=100 * m * eps(dtype) * np.abs(z).max())
    if g is not None:
        np.testing.assert_allclose(g, ct(y) @ y, rtol=0, atol=8 * n * eps(dtype) * np.linalg.norm(y, 2) ** 2)


def test_orth_against_keeps_the_leading_directions_of_an_ill_conditioned_block():
    """``width`` below the block's columns: the leading left singular vectors of the projected block (from
    its Gram matrix), orthonormal and orthogonal to ``V``, though the block is too ill-conditioned for
    CholeskyQR2 (its columns' norms 1 down to 1e-9)."""
    from blocklin.linalg.blocks.orth import orth_against

    rng = np.random.default_rng(8)
    n, m, c, width = 3000, 20, 12, 4
    v, _ = np.linalg.qr(rng.standard_normal((n, m)))
    x = rng.standard_normal((n, c)) * np.logspace(0, -9, c)
    q = orth_against(v, x, width=width)
    assert q.shape == (n, width)
    assert_orthonormal(q, n=n)
    assert np.linalg.norm(v.T @ q) <= 2 * n * eps(np.float64) * np.sqrt(m * width)
    y = x - v @ (v.T @ x)
    u, sv, _ = np.linalg.svd(y, full_matrices=False)
    # span(q) = the leading singular subspace, up to the Gram matrix's rounding over the gap to the next
    cosines = np.linalg.svd(u[:, :width].T @ q, compute_uv=False)
    gap = sv[width - 1] ** 2 - sv[width] ** 2
    assert 1 - cosines.min() <= 1e3 * n * eps(np.float64) * sv[0] ** 2 / gap


def test_next_block_fills_a_breakdown():
    rng = np.random.default_rng(4)
    n, m, b = 600, 10, 4
    v, _ = np.linalg.qr(rng.standard_normal((n, m)))
    z = v @ rng.standard_normal((m, b))  # wholly inside span(V): every direction random, orthogonal to V
    c = ct(v) @ z
    q1, t = tall_qr(z - v @ c)
    q = next_block(v, q1, t, norm_z=float(np.linalg.norm(z, 2)), seed=5, counter=2, width=b)
    q2 = next_block(v, q1, t, norm_z=float(np.linalg.norm(z, 2)), seed=5, counter=2, width=b)
    assert q.shape == (n, b) and np.array_equal(q, q2)  # counter-based: the same directions again
    assert_orthonormal(q, n=n)
    assert np.linalg.norm(v.T @ q) <= 2 * n * eps(np.float64) * np.sqrt(m * b)


@pytest.mark.parametrize("dtype", [np.float64, np.complex128])
def test_lanczos_reports_explicit_residuals(dtype):
    """Converged pairs carry ``||A x - theta x||`` recomputed from A, within the threshold; an unreachable
    threshold returns unconverged after max_steps, its residuals explicit too."""
    rng = np.random.default_rng(5)
    n = 300
    q, _ = np.linalg.qr(_block(rng, n, n, dtype))
    lam = 1.0 / np.sqrt(1 + np.arange(n))  # slow decay: several restarts
    a = (q * lam) @ ct(q)
    a = (a + ct(a)) / 2
    for bound, steps, ok in ((1e-9, 400, True), (1e-30, 6, False)):
        res = block_lanczos(lambda x, s: a @ x, n, 5, which="LA", block=4, max_basis=20, max_steps=steps,
                            threshold=lambda th: np.full(th.shape, bound), seed=0, dtype=dtype)
        assert res.converged is ok
        direct = np.linalg.norm(a @ res.vectors - res.vectors * res.values, axis=0)
        np.testing.assert_allclose(res.residuals, direct, rtol=1e-6, atol=10 * n * eps(dtype))
        np.testing.assert_allclose(res.residuals, np.linalg.norm(res.residual_vectors, axis=0), rtol=1e-12)
        assert_orthonormal(res.vectors, n=n)
        if ok:
            assert np.all(res.residuals <= bound) and res.restarts > 0
            ref = scipy.linalg.eigh(a, eigvals_only=True)[::-1][:5]
            np.testing.assert_allclose(res.values, ref, rtol=0, atol=bound ** 2 / 1e-3 + 4 * n * eps(dtype))
        else:
            assert res.steps == steps


def test_lanczos_resumes_bit_identical():
    """A run resumed from any step's checkpoint ends with the same bits as one that never stopped."""
    rng = np.random.default_rng(6)
    n = 250
    q, _ = np.linalg.qr(rng.standard_normal((n, n)))
    a = (q * (1.0 / (1 + np.arange(n)))) @ q.T
    a = (a + a.T) / 2
    saved = []
    kw = dict(which="LA", block=3, max_basis=15, max_steps=300, threshold=lambda th: np.full(th.shape, 1e-10), seed=0)
    full = block_lanczos(lambda x, s: a @ x, n, 4, checkpoint=lambda st: saved.append(
        {key: np.array(val, copy=True) for key, val in st.items()}), **kw)
    assert full.converged and len(saved) > 4
    again = block_lanczos(lambda x, s: a @ x, n, 4, state=saved[len(saved) // 2], **kw)
    assert np.array_equal(again.values, full.values) and np.array_equal(again.vectors, full.vectors)
    assert again.steps == full.steps and again.restarts == full.restarts
