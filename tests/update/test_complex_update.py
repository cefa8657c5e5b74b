"""append of complex rows and blocklin.update of results of complex data, against NumPy's references
recomputed from the grown matrix in complex128.

Covered: ``append`` (complex rows, real rows into a complex matrix, complex rows into a real matrix
refused naming the imaginary parts), ``gram`` (``A^H A`` plus the new rows' HERK), ``matmul(a, b,
trans_a=True)`` (``A^T B`` plus the new rows' product), ``qr(mode="r")`` (the ``R`` of ``[R; R_new]``,
real non-negative diagonal), ``svd``/``pca`` with ``updatable=True`` (complex co-moments merged with
``conj(d) d^T``, the Hermitian updated Gram's eigenpairs, ``Vt = V^H``), and the single-pass sketch's
kept complex sums; in memory and at the least budget, on every scheduler.

Bounds: those of :mod:`support.tolerances` with ``eps`` of the parts' dtype, times ``3 sqrt(2)`` for
complex arithmetic (Higham 2002, Lemma 3.5).
"""

from __future__ import annotations

import numpy as np
import pytest
from support.conformance import least_budget
from support.tolerances import assert_close_to, assert_gram, assert_product, assert_singular_values, eps

import blocklin as bl
from blocklin.errors import DTypeError

COMPLEX = 3 * np.sqrt(2)
CDTYPES = [np.complex64, np.complex128]
M, P, N, K = 600, 90, 16, 3


def _rows(rng, p, dtype, n=N):
    """Complex Gaussian rows: a rank-K signal with well separated values, small noise, complex means."""
    basis = np.linalg.qr(np.random.default_rng(99).standard_normal((n, n))
                         + 1j * np.random.default_rng(98).standard_normal((n, n)))[0]
    z = rng.standard_normal((p, n)) + 1j * rng.standard_normal((p, n))
    z *= np.r_[[40.0, 20.0, 10.0], np.full(max(n - K, 0), 0.5)][:n]
    return (z @ basis.conj().T + (3 - 2j)).astype(dtype)


def _grown(tmp_path, dtype, n=N, name="A"):
    rng = np.random.default_rng(1 if name == "A" else 2)
    a = _rows(rng, M, dtype, n)
    path = tmp_path / f"{name}.zarr"
    bl.from_array(a, path, chunks=(128, n))
    return a, _rows(rng, P, dtype, n), path


def _at(memory, call):
    if memory == "least":
        return least_budget(call)
    return call(None)


@pytest.mark.parametrize("dtype", CDTYPES)
def test_append_complex_rows(tmp_path, dtype):
    a, new, path = _grown(tmp_path, dtype)
    m = bl.append(path, new)
    assert m.shape == (M + P, N) and m.dtype == dtype
    np.testing.assert_array_equal(bl.Matrix(path).to_numpy(), np.vstack([a, new]))  # a copy: bit for bit
    real = np.ones((2, N), dtype=np.finfo(dtype).dtype)  # real rows of its precision into a complex matrix: exact
    bl.append(path, real)
    np.testing.assert_array_equal(bl.Matrix(path).to_numpy()[-2:], real.astype(dtype))


def test_complex_rows_into_a_real_matrix_are_refused(tmp_path):
    bl.from_array(np.ones((4, 3)), tmp_path / "R.zarr")
    with pytest.raises(DTypeError, match=r"rows.*float64 without loss \(the imaginary parts\).*complex128.*Fix"):
        bl.append(tmp_path / "R.zarr", np.ones((2, 3), dtype=np.complex128))


@pytest.mark.parametrize("dtype", CDTYPES)
@pytest.mark.parametrize("memory", [None, "least"], ids=["in-memory", "streamed"])
def test_complex_gram_matmul_qr_updates(tmp_path, dtype, memory):
    a, new, path = _grown(tmp_path, dtype)
    b, newb, pathb = _grown(tmp_path, dtype, n=4, name="B")
    _at(memory, lambda mem: bl.gram(path, out=tmp_path / "G.zarr", memory=mem, overwrite=True))
    _at(memory, lambda mem: bl.matmul(path, pathb, trans_a=True, out=tmp_path / "C.zarr", memory=mem, overwrite=True))
    _at(memory, lambda mem: bl.qr(path, mode="r", out=tmp_path / "R.zarr", memory=mem, overwrite=True))
    bl.append(path, new)
    bl.append(pathb, newb)
    a1 = np.vstack([a, new]).astype(np.complex128)
    b1 = np.vstack([b, newb]).astype(np.complex128)
    g = _at(memory, lambda mem: bl.update(tmp_path / "G.zarr", memory=mem)).to_numpy()
    # the stored result added once more: one rounding of |G| beyond the product bound (module notes of update.gram)
    assert_gram(g, a1.conj().T @ a1, a1, dtype=dtype, const=2 * COMPLEX,
                extra=COMPLEX * eps(dtype) * np.linalg.norm(a1[:M]) ** 2)
    assert np.all(np.diag(g).imag == 0)  # HERK's real diagonal
    c = _at(memory, lambda mem: bl.update(tmp_path / "C.zarr", memory=mem)).to_numpy()
    assert_product(c, a1.T @ b1, a1.T, b1, dtype=dtype, const=2 * COMPLEX,
                   extra=COMPLEX * eps(dtype) * np.linalg.norm(a1[:M]) * np.linalg.norm(b1[:M]))
    r = _at(memory, lambda mem: bl.update(tmp_path / "R.zarr", memory=mem)).to_numpy()
    assert r.dtype == dtype and np.all(np.diag(r).imag == 0) and np.all(np.diag(r).real >= 0)
    assert np.allclose(np.tril(r, -1), 0, rtol=0, atol=0)
    # R^H R = A^H A to the backward error of two Householder QRs (Higham Thm 19.4), whatever cond(A)
    assert_close_to(r.conj().T.astype(np.complex128) @ r, a1.conj().T @ a1,
                    bound=COMPLEX * 4 * (M + P) * eps(dtype) * np.linalg.norm(a1) ** 2, what="R^H R against A^H A")


def _check_svd(res, ref, a1, dtype, *, center):
    """``s`` within the Gram route's bound, ``Vt`` orthonormal rows (``V^H``), and ``U diag(s) = B V``."""
    U = res[0].to_numpy().astype(np.complex128)
    s, vt = np.asarray(res[1]), np.asarray(res[2]).astype(np.complex128)
    assert s.dtype == np.finfo(dtype).dtype and res[2].dtype == dtype
    s0 = np.linalg.svd(ref, compute_uv=False)
    big = float(np.linalg.norm(a1, 2))  # the co-moments are rounded at the data's size, means included
    assert_singular_values(s, s0[:K], n=a1.shape[0], dtype=np.float64 if dtype == np.complex128 else dtype,
                           gram=True, s1=big, const=4 * COMPLEX)
    assert_close_to(vt @ vt.conj().T, np.eye(K), bound=COMPLEX * 2 * N * eps(dtype) * np.sqrt(K),
                    what="Vt's rows orthonormal")
    # the written scores: U = B V S^-1 for every row. Rotated old rows (Brand 2006) are off by exactly what
    # the old factors left out, ||E0 w_i|| / s_i, which the update reports (u_errors) and holds within tol
    # (else it reads every row again: then 0); plus the rounding of the products at ||A||_F / s_i
    err = np.linalg.norm(U - (ref @ vt.conj().T) / s.astype(np.float64), axis=0)
    rotated = res.report["updated"].get("scores") == "rotated"
    left_out = np.asarray(res.report["u_errors"]) if rotated else np.zeros(K)
    assert np.all(left_out <= res.report["tol"])
    rounding = COMPLEX * 4 * N * eps(dtype) * np.linalg.norm(a1) / s.astype(np.float64)
    # u_errors is the square root of a quadratic form in the float64 Gram: off by sqrt(gamma_m) ||B||_F / s_i
    reported = np.sqrt(COMPLEX * a1.shape[0] * eps(np.float64)) * np.linalg.norm(a1) / s.astype(np.float64)
    assert np.all(err <= left_out + reported + rounding), (err, left_out, rounding)


@pytest.mark.parametrize("dtype", CDTYPES)
@pytest.mark.parametrize("memory", [None, "least"], ids=["in-memory", "streamed"])
@pytest.mark.parametrize("center,scale", [(False, False), (True, False), (True, True)])
def test_complex_svd_update_matches_the_grown_matrix(tmp_path, dtype, memory, center, scale):
    a, new, path = _grown(tmp_path, dtype)
    out = tmp_path / "S.zarr"
    _at(memory, lambda mem: bl.svd(path, K, center=center, scale=scale, updatable=True, out=out, memory=mem,
                                   overwrite=True, seed=1))
    bl.append(path, new)
    res = _at(memory, lambda mem: bl.update(out, memory=mem))
    a1 = np.vstack([a, new]).astype(np.complex128)
    ref = a1 - a1.mean(axis=0) if center else a1
    if scale:
        ref = ref / np.sqrt(np.mean(np.abs(ref) ** 2, axis=0))
    assert res.report["updated"]["rows"] == M + P
    assert res.report["updated"]["how"].startswith("updated:")  # from the co-moments, not a recompute
    if center:
        np.testing.assert_allclose(res.mean, a1.mean(axis=0), rtol=0,
                                   atol=COMPLEX * 2 * (M + P) * eps(dtype) * np.abs(a1).mean(axis=0).max())
    _check_svd(res, ref, a1 / (np.sqrt(np.mean(np.abs(a1 - a1.mean(0)) ** 2, axis=0)) if scale else 1), dtype,
               center=center)


@pytest.mark.parametrize("scheduler", ["threads", "processes"])
def test_complex_svd_update_same_bits_on_every_scheduler(tmp_path, scheduler):
    runs = []
    for s in ("sync", scheduler):
        d = tmp_path / s
        d.mkdir()
        a, new, path = _grown(d, np.complex128)
        out = d / "S.zarr"
        bl.svd(path, K, center=True, updatable=True, out=out, seed=1, scheduler=s, workers=2)
        bl.append(path, new)
        runs.append(least_budget(lambda mem, s=s, out=out: bl.update(out, memory=mem, scheduler=s, workers=2)))
    np.testing.assert_array_equal(runs[0].s, runs[1].s)
    np.testing.assert_array_equal(runs[0].Vt, runs[1].Vt)
    np.testing.assert_array_equal(runs[0].U.to_numpy(), runs[1].U.to_numpy())


@pytest.mark.parametrize("dtype", CDTYPES)
def test_complex_pca_update(tmp_path, dtype):
    a, new, path = _grown(tmp_path, dtype)
    out = tmp_path / "P.zarr"
    bl.pca(path, K, updatable=True, out=out)
    bl.append(path, new)
    res = bl.update(out)
    assert res.report["updated"]["how"].startswith("updated:")
    a1 = np.vstack([a, new]).astype(np.complex128)
    _check_svd(res.svd, a1 - a1.mean(axis=0), a1, dtype, center=True)  # a PCAResult: its factors


@pytest.mark.parametrize("dtype", CDTYPES)
def test_complex_sketch_update_equals_the_sketch_of_the_grown_matrix(tmp_path, dtype):
    """The kept complex sums plus the new rows' sketch (same seed, their own rows of the test matrices) are
    the sketch of the grown matrix: its singular values and components as a run on it gives, up to the
    order of the sums (a product bound at ``||A||``)."""
    a, new, path = _grown(tmp_path, dtype)
    out = tmp_path / "K.zarr"
    bl.svd(path, K, method="sketch", updatable=True, out=out, seed=5)
    bl.append(path, new)
    res = bl.update(out)
    assert res.report["updated"]["how"].startswith("updated:")
    a1 = np.vstack([a, new])
    ref = bl.svd(a1, K, method="sketch", seed=5)
    big = float(np.linalg.norm(a1.astype(np.complex128), 2))
    bound = COMPLEX * 4 * (M + P) * eps(dtype) * big
    assert np.all(np.abs(res.s.astype(np.float64) - ref.s) <= bound)
    assert res.Vt.dtype == dtype and res.s.dtype == np.finfo(dtype).dtype
    s0 = np.linalg.svd(a1.astype(np.complex128), compute_uv=False)
    assert_close_to(res.Vt, ref.Vt, bound=np.sqrt(K) * bound / np.min(np.abs(np.diff(s0[:K + 1]))),
                    what="the updated sketch's Vt against the grown matrix's")


def _ridge_reference(A, B, lam, intercept):
    """NumPy's ``(A_c^H A_c + lam^2 I)^-1 A_c^H b_c`` in complex128 (centered with an intercept)."""
    if intercept:
        A, B = A - A.mean(axis=0), B - B.mean(axis=0)
    K = A.conj().T @ A + lam ** 2 * np.eye(A.shape[1])
    return np.linalg.solve(K, A.conj().T @ B), K


@pytest.mark.parametrize("memory", [None, "least"], ids=["in-memory", "streamed"])
@pytest.mark.parametrize("intercept", [False, True])
@pytest.mark.parametrize("lam", [0.5, "gcv", [0.1, 1.0]])
def test_complex_ridge_update_matches_the_grown_problem(tmp_path, lam, intercept, memory):
    """solve(updatable=True) of complex data: the kept A^H A, A^H b, |b|^2 (and complex means) plus the new
    rows' sums, solved again by the normal equations, against NumPy's solution of the grown problem at the
    lambdas the update chose (the rule chosen again on the updated spectrum: as a recompute chooses)."""
    a, new, pa = _grown(tmp_path, np.complex128, n=8, name="A")
    b, newb, pb = _grown(tmp_path, np.complex128, n=2, name="B")
    out = tmp_path / "x.zarr"
    _at(memory, lambda mem: bl.solve(pa, pb, lam=lam, out=out, updatable=True, fit_intercept=intercept,
                                     memory=mem, overwrite=True))
    bl.append(pa, new)
    bl.append(pb, newb)
    u = _at(memory, lambda mem: bl.update(out, memory=mem))
    assert u.report["updated"]["rows_read"] == P and u.report["method"] == "normal"
    assert u.report["updated"]["how"].startswith("updated:")
    A, B = np.vstack([a, new]), np.vstack([b, newb])
    m, n = A.shape
    lams = u.report["lam"] if isinstance(u.report["lam"], list) else [u.report["lam"]]
    x = u.to_numpy()
    assert x.dtype == np.complex128
    for j, lm in enumerate(lams):
        ref, K = _ridge_reference(A, B, lm, intercept)
        # the sums' rounding (gamma_m ||A||_F^2, the kept ones added once more) and the solve's (8 n eps ||K||),
        # moved by cond(K) relative (Higham Thm 7.2), times 3 sqrt(2) for complex arithmetic
        bound = COMPLEX * np.linalg.cond(K) * (8 * n * eps(np.float64) * np.linalg.norm(K)
                                               + 3 * m * eps(np.float64) * np.linalg.norm(A) ** 2) \
            / np.linalg.norm(K, 2) * np.linalg.norm(ref)
        cols = slice(j * B.shape[1], (j + 1) * B.shape[1])
        assert_close_to(x.reshape(n, -1)[:, cols], ref, bound=bound, what=f"x at lam={lm:g}")
    if intercept:
        xs = x.reshape(n, -1)[:, :B.shape[1]]
        icpt = np.ravel(np.asarray(u.intercept))[:B.shape[1]]
        assert_close_to(icpt, B.mean(axis=0) - A.mean(axis=0) @ xs,
                        bound=COMPLEX * 4 * n * eps(np.float64) * np.linalg.norm(A.mean(axis=0)) * np.linalg.norm(xs)
                        + COMPLEX * 2 * m * eps(np.float64) * np.abs(B).mean(axis=0).sum(), what="intercept")
