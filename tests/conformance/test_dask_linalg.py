"""Dask's ``dask/array/tests/test_linalg.py`` ported to blocklin (its shapes, chunkings and dtypes).

Each test names the Dask test it ports. Dask's chunkings are kept: the input is the Dask array of
that chunking (blocklin stages it), so irregular, thin and unknown chunk sizes reach blocklin as they
reach Dask. Where Dask *refuses* a chunking (``tsqr`` of a short-fat or 2 x 2 blocked array,
``sfqr`` of a tall one, ``svd`` chunked in both dimensions, ``lu`` of ``5 x 4`` chunks) the case is
ported as the factorization it asks for, which blocklin computes: the refusal is a limit of Dask's
algorithm, not a rule of the operation. Dask compares with ``assert_eq`` (``allclose``, rtol 1e-5 /
1e-8 for float64); those tolerances are its own, so every accuracy check here is the operation's
error bound from ``tests/support/tolerances.py`` (backward error of QR/LU/Cholesky, Weyl for
singular values, the condition number for solves). The default scheduler runs them; the cases big
enough to tile are also run at the least budget the planner accepts (``memory="least"``).

Not applicable (not ported):

==============================================  =================================================
Dask test                                       why
==============================================  =================================================
test_linalg_consistent_names                    Dask graph key names (no graph is returned)
test_svd_compressed_compute                     ``compute=True`` graph size (Dask-internal); its
                                                equality of two seeded runs is kept below
test_svd_flip_sign (14 cases)                   Dask's ``svd_flip`` helper on f2/f16/complex
                                                arrays (blocklin has no such public helper)
test_svd_flip_correction (18 cases)             ``svd_flip`` of Dask's outputs, a helper; the
                                                reconstruction it checks is in
                                                test_svd_supported_array_shapes
test_svd_incompatible_chunking                  Dask's chunking limit (blocklin takes any)
test_solve_assume_a ``sym_pos=``                the deprecated keyword (its ``assume_a="pos"``
                                                parts are ported)
test_norm_any_ndim/any_slice/1dim/              vectors, axes, ``keepdims`` and N-d stacks:
implemented_errors (the 1-D, ``axis=``,         ``blocklin.norm`` is the matrix norm of one
``keepdims``, N-d cases)                        ``m x n`` matrix; the 2-D ``axis=None`` cases of
                                                test_norm_any_ndim/any_prec/2dim are ported
==============================================  =================================================
"""

from __future__ import annotations

import dask.array as da
import numpy as np
import pytest
import scipy.linalg

import blocklin as bl
from blocklin.errors import BlocklinError
from support.conformance import dense, flip, lu_parts, run
from support.tolerances import (assert_close_to, assert_factorization, assert_orthonormal, assert_residual,
                                assert_singular_values, assert_solve, eps)

TSQR_CASES = [  # test_tsqr / test_sfqr / test_qr's table: (m, n, chunks)
    (20, 10, 10), (20, 10, (3, 10)), (20, 10, ((8, 4, 8), 10)), (40, 10, ((15, 5, 5, 8, 7), 10)),
    (128, 2, (16, 2)), (129, 2, (16, 2)), (130, 2, (16, 2)), (131, 2, (16, 2)),
    (300, 10, (40, 10)), (300, 10, (30, 10)), (300, 10, (20, 10)),
    (10, 5, 10), (5, 10, 10), (10, 10, 10),
    (10, 40, (10, 10)), (10, 40, (10, 15)), (10, 40, (10, (15, 5, 5, 8, 7))),  # Dask's tsqr: ValueError
    (20, 20, 10),  # Dask's tsqr/sfqr: ValueError, qr: NotImplementedError
]


def _check_qr(mat, q, r):
    m, n = mat.shape
    k = min(m, n)
    q, r = dense(q), dense(r)
    assert q.shape == (m, k) and r.shape == (k, n)
    assert np.array_equal(r, np.triu(r))
    # Householder QR: ||A - QR|| <= gamma_cn ||A||, ||Q^T Q - I|| <= gamma_cn (Higham Thm 19.4)
    assert_factorization(mat, q @ r, const=4.0)
    assert_orthonormal(q, n=max(m, n), const=4.0)


def _check_svd(mat, u, s, vt):
    m, n = mat.shape
    k = min(m, n)
    u, vt = dense(u), dense(vt)
    assert u.shape == (m, k) and s.shape == (k,) and vt.shape == (k, n)
    assert_singular_values(s, np.linalg.svd(mat, compute_uv=False), n=max(m, n))
    assert_orthonormal(u, n=max(m, n), const=4.0)
    assert_orthonormal(vt.T, n=max(m, n), const=4.0)
    assert_factorization(mat, (u * s) @ vt, const=8.0)  # the SVD (4) and forming U S V^T (two products)


@pytest.mark.parametrize("m,n,chunks", TSQR_CASES)
def test_tsqr(m, n, chunks):
    """Dask's test_tsqr (QR and ``compute_svd=True``): thin factors (``vh`` ``k x n``, not Dask's square one)."""
    mat = np.random.default_rng(m * n).random((m, n))
    data = da.from_array(mat, chunks=chunks, name="A")
    q, r = bl.qr(data, mode="reduced")
    _check_qr(mat, q, r)
    _check_svd(mat, *bl.svd(data))


@pytest.mark.parametrize("m,n,chunks", TSQR_CASES)
def test_sfqr(m, n, chunks):
    """Dask's test_sfqr (Dask refuses the tall chunkings: ValueError; blocklin factors every shape)."""
    mat = np.random.default_rng(m + n).random((m, n))
    _check_qr(mat, *bl.qr(da.from_array(mat, chunks=chunks), mode="reduced"))


@pytest.mark.parametrize("memory", [None, "least"])
@pytest.mark.parametrize("m,n,chunks", TSQR_CASES)
def test_qr(m, n, chunks, memory):
    """Dask's test_qr, in memory and at the least budget (the tiled route)."""
    mat = np.random.default_rng(m + 2 * n).random((m, n))
    data = da.from_array(mat, chunks=chunks)
    _check_qr(mat, *run(lambda mem: bl.qr(data, mode="reduced", memory=mem), memory))


UNCERTAIN_CASES = [  # test_tsqr_uncertain's table (error_type None in every row Dask keeps)
    (10, 5, (10, 5), True, False), (10, 5, (10, 5), False, True), (10, 5, (10, 5), True, True),
    (40, 5, (10, 5), True, False), (40, 5, (10, 5), False, True), (40, 5, (10, 5), True, True),
    (300, 10, (40, 10), True, False), (300, 10, (30, 10), True, False), (300, 10, (20, 10), True, False),
    (300, 10, (40, 10), False, True), (300, 10, (30, 10), False, True), (300, 10, (20, 10), False, True),
    (300, 10, (40, 10), True, True), (300, 10, (30, 10), True, True), (300, 10, (20, 10), True, True),
]


@pytest.mark.parametrize("m_min,n_max,chunks,vary_rows,vary_cols", UNCERTAIN_CASES)
def test_tsqr_uncertain(m_min, n_max, chunks, vary_rows, vary_cols):
    """Dask's test_tsqr_uncertain: unknown (NaN) chunk sizes from boolean indexing."""
    rng = np.random.default_rng(m_min + n_max)
    mat = rng.random((m_min * 2, n_max))
    mat[0:m_min, 0] += 1
    _c0, _r0 = mat[:, 0].copy(), mat[0, :].copy()
    data = da.from_array(mat, chunks=chunks, name="A")
    if vary_rows:
        data = data[da.from_array(_c0, chunks=m_min) > 0.5, :]
        mat = mat[_c0 > 0.5, :]
    if vary_cols:
        data = data[:, da.from_array(_r0, chunks=n_max) > 0.5]
        mat = mat[:, _r0 > 0.5]
    _check_qr(mat, *bl.qr(data, mode="reduced"))
    _check_svd(mat, *bl.svd(data))


def test_tsqr_zero_height_chunks():
    """Dask's test_tsqr_zero_height_chunks: empty chunks, known and unknown."""
    mat = np.random.default_rng(5).random((10, 5))
    _check_qr(mat, *bl.qr(da.from_array(mat, chunks=((4, 0, 1, 0, 5), (5,))), mode="reduced"))
    mat2 = np.vstack([mat, -(np.ones((10, 5)))])
    x2 = da.from_array(mat2, chunks=5)
    x = x2[da.from_array(mat2[:, 0], chunks=5) >= 0, :]
    _check_qr(mat, *bl.qr(x, mode="reduced"))


@pytest.mark.parametrize("m,n", [(10, 20), (15, 15), (20, 10)])
def test_dask_svd_self_consistent(m, n):
    """Dask's test_dask_svd_self_consistent: shapes and dtypes of the factors (rows chunked by 3)."""
    a = np.random.default_rng(m).random((m, n))
    u, s, vt = bl.svd(da.from_array(a, chunks=(3, n)))
    k = min(m, n)
    assert (u.shape, s.shape, vt.shape) == ((m, k), (k,), (k, n))
    assert u.dtype == s.dtype == vt.dtype == a.dtype
    _check_svd(a, u, s, vt)


@pytest.mark.parametrize("n_iter", [1, 2])
def test_svd_compressed(n_iter):
    """Dask's test_svd_compressed (``n_power_iter`` 1 or 2, k = 10) and test_svd_compressed_compute's equality.

    Halko et al. (2011) eq. 1.10/1.11 bound the expected error ``||A - U_r S_r V_r^T||_2`` by
    ``(1 + tol) s_{r+1}``: Dask's ``tol = 0.4`` from simulation, kept as the peer's stated accuracy.
    """
    m, n, r = 100, 50, 5
    a = np.random.default_rng(4321).random((m, n))
    u, s, vt = bl.svd(da.from_array(a, chunks=(m, n)), 2 * r, n_iter=n_iter, seed=4321)
    u, vt = dense(u), dense(vt)
    s_true = scipy.linalg.svd(a, compute_uv=False)
    norm = scipy.linalg.norm(a - (u[:, :r] * s[:r]) @ vt[:r, :], 2)
    assert norm / s_true[r + 1] - 1 < 0.4
    assert_orthonormal(u[:, :r], n=m)
    assert_orthonormal(vt[:r].T, n=m)
    u2, s2, vt2 = bl.svd(da.from_array(a, chunks=(10, 10)), 2 * r, n_iter=n_iter, seed=4321)
    np.testing.assert_array_equal(dense(vt2), vt)  # the seed fixes the result, whatever the chunking


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_svd_compressed_dtype_preservation(dtype):
    """Dask's test_svd_compressed_dtype_preservation (k = 1 of a 50 x 50 matrix)."""
    x = np.random.default_rng(1).random((50, 50)).astype(dtype)
    u, s, vt = bl.svd(da.from_array(x, chunks=(50, 50)), 1, seed=4321)
    assert u.dtype == s.dtype == vt.dtype == dtype


@pytest.mark.parametrize("chunks", [(10, 50), (50, 10), (-1, -1)])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_svd_dtype_preservation(chunks, dtype):
    """Dask's test_svd_dtype_preservation (Dask refuses none of these; neither does blocklin)."""
    x = np.random.default_rng(2).random((50, 50)).astype(dtype)
    u, s, vt = bl.svd(da.from_array(x, chunks=chunks))
    assert u.dtype == s.dtype == vt.dtype == dtype


def test_svd_compressed_deterministic():
    """Dask's test_svd_compressed_deterministic: two runs with one seed are identical."""
    x = da.random.default_rng(1234).random(size=(30, 25), chunks=(5, 5))
    u, s, vt = bl.svd(x, 3, seed=1234)
    u2, s2, vt2 = bl.svd(x, 3, seed=1234)
    assert (dense(u) == dense(u2)).all() and (s == s2).all() and (dense(vt) == dense(vt2)).all()


@pytest.mark.parametrize("m", [5, 10, 15, 20])
@pytest.mark.parametrize("n", [5, 10, 15, 20])
@pytest.mark.parametrize("chunks", [(5, 10), (10, 5)])
def test_svd_compressed_shapes(m, n, chunks):
    """Dask's test_svd_compressed_shapes (k = 5, ``n_power_iter=1``)."""
    x = da.random.default_rng(m * n).random(size=(m, n), chunks=chunks)
    u, s, v = bl.svd(x, 5, n_iter=1, seed=1)
    r = min(m, n, 5)
    assert u.shape == (m, r) and s.shape == (r,) and v.shape == (r, n)


def _check_lu(a, f):
    p, lo, up = lu_parts(f, f.report["pivots"])
    assert np.array_equal(lo, np.tril(lo)) and np.array_equal(up, np.triu(up))
    # |A - P L U| <= gamma_n |L| |U| (Higham Thm 9.3): the growth is in ||L|| ||U||
    assert_factorization(a, p @ lo @ up, factors=(lo, up))


_A1 = np.array([[7, 3, -1, 2], [3, 8, 1, -4], [-1, 1, 4, -1], [2, -4, -1, 6]])
_A3 = np.array([[7, 3, 2, 1, 4, 1], [7, 11, 5, 2, 5, 2], [21, 25, 16, 10, 16, 5], [21, 41, 18, 13, 16, 11],
                [14, 46, 23, 24, 21, 22], [0, 56, 29, 17, 14, 8]])


@pytest.mark.parametrize("a", [_A1, np.diag([7, 8, 4, 6, 3, 5]), _A3], ids=["A1", "A2-diagonal", "A3-shuffle"])
def test_lu_1(a):
    """Dask's test_lu_1: SciPy's ``P, L, U`` equal (no shuffle) or ``P L U = A`` (with shuffle); chunks 2."""
    f = bl.lu(da.from_array(a, chunks=(2, 2)))
    _check_lu(a, f)
    if a is not _A3:  # Dask compares the factors themselves where no row is exchanged
        p, lo, up = scipy.linalg.lu(a)
        p2, lo2, up2 = lu_parts(f, f.report["pivots"])
        for got, ref in ((p2, p), (lo2, lo), (up2, up)):
            np.testing.assert_allclose(got, ref, rtol=0, atol=8 * 6 * eps(np.float64) * np.abs(a).max())


@pytest.mark.parametrize("memory", [None, "least"])
@pytest.mark.parametrize("size,chunk", [(10, 5), (20, 5), (30, 5), (50, 5), (50, 25), (100, 25), (200, 25)],
                         ids=["lu_2-10", "lu_2-20", "lu_2-30", "lu_2-50", "lu_3-50", "lu_3-100", "lu_3-200"])
def test_lu_2_3(size, chunk, memory):
    """Dask's test_lu_2 (chunks 5) and test_lu_3 (chunks 25): integer matrices 0..9 (slow in Dask; fast here)."""
    a = np.random.default_rng(10).integers(0, 10, (size, size))
    _check_lu(a, run(lambda mem: bl.lu(da.from_array(a, chunks=(chunk, chunk)), memory=mem), memory))


def test_lu_errors():
    """Dask's test_lu_errors: a 3-D array is refused; the ``10 x 8`` and ``5 x 4``-chunked cases Dask
    refuses (rectangular, non-square chunks) are factored."""
    rng = np.random.default_rng(3)
    with pytest.raises((BlocklinError, ValueError)):
        bl.lu(rng.integers(0, 11, (10, 10, 10)))
    for a, chunks in ((rng.integers(1, 11, (10, 8)), (5, 4)), (rng.integers(1, 11, (20, 20)) + 20 * np.eye(20), (5, 4))):
        _check_lu(a, bl.lu(da.from_array(a, chunks=chunks)))


def _check_trsm(t, b, lower, res):
    x = dense(res).reshape(b.shape)
    ref = scipy.linalg.solve_triangular(t, b, lower=lower)
    # a triangular solve is backward stable componentwise (Higham Thm 8.5): residual and forward error
    assert_residual(t, x, b)
    assert_solve(x, ref, t)


@pytest.mark.parametrize("kind", ["vector", "matrix", "matrix2"])
@pytest.mark.parametrize("shape,chunk", [(20, 10), (50, 10), (70, 20), (50, 20)])
def test_solve_triangular(kind, shape, chunk):
    """Dask's test_solve_triangular_vector ((20,10), (50,10), (70,20)), _matrix and _matrix2 ((20,10),
    (50,10), (50,20)): upper and lower, integer entries."""
    if (kind == "vector") != (shape == 70) and (shape, chunk) in ((70, 20), (50, 20)):
        pytest.skip("not a parametrization of this Dask test")
    rng = np.random.default_rng(1)
    hi = 11 if kind == "vector" else 10
    a = rng.integers(1, hi, (shape, shape))
    b = rng.integers(1, hi, {"vector": (shape,), "matrix": (shape, 5), "matrix2": (shape, shape)}[kind])
    bchunks = chunk if kind == "vector" else (chunk, min(chunk, b.shape[1]))
    for lower, t in ((False, np.triu(a)), (True, np.tril(a))):
        res = bl.solve_triangular(da.from_array(t, (chunk, chunk)), da.from_array(b, bchunks), lower=lower)
        _check_trsm(t.astype(float), b.astype(float), lower, res)


def test_solve_triangular_errors():
    """Dask's test_solve_triangular_errors: a 3-D matrix is refused; mismatched chunks (Dask's
    ValueError) are solved."""
    rng = np.random.default_rng(4)
    b = rng.integers(1, 10, 10)
    with pytest.raises((BlocklinError, ValueError)):
        bl.solve_triangular(rng.integers(0, 10, (10, 10, 10)), b)
    t = np.triu(rng.integers(1, 10, (10, 10)))
    res = bl.solve_triangular(da.from_array(t, chunks=(3, 3)), da.from_array(b, chunks=5))
    _check_trsm(t.astype(float), b.astype(float), False, res)


def _check_solve(a, b, res):
    x = dense(res).reshape(b.shape)
    assert_residual(a, x, b)
    assert_solve(x, scipy.linalg.solve(a, b), a)


@pytest.mark.parametrize("memory", [None, "least"])
@pytest.mark.parametrize("shape,chunk", [(20, 10), (50, 10)])
def test_solve(shape, chunk, memory):
    """Dask's test_solve: a vector, a tall block and a square right-hand side."""
    rng = np.random.default_rng(1)
    a = rng.integers(1, 10, (shape, shape))
    for bshape, bchunk in (((shape,), chunk), ((shape, 5), (chunk, 5)), ((shape, shape), (chunk, chunk))):
        b = rng.integers(1, 10, bshape)
        res = run(lambda mem: bl.solve(da.from_array(a, (chunk, chunk)), da.from_array(b, bchunk), memory=mem), memory)
        _check_solve(a.astype(float), b.astype(float), res)


@pytest.mark.parametrize("memory", [None, "least"])
@pytest.mark.parametrize("shape,chunk", [(20, 10), (50, 10)])
def test_inv(shape, chunk, memory):
    """Dask's test_inv: against SciPy's inverse, and ``A X = I``."""
    a = np.random.default_rng(1).integers(1, 10, (shape, shape)).astype(float)
    x = dense(run(lambda mem: bl.inv(da.from_array(a, (chunk, chunk)), memory=mem), memory))
    assert_solve(x, scipy.linalg.inv(a), a)
    assert_residual(a, x, np.eye(shape))


def _symmat(size):
    lo = np.tril(np.random.default_rng(1).integers(1, 21, (size, size)))
    return lo.dot(lo.T)


@pytest.mark.parametrize("memory", [None, "least"])
@pytest.mark.parametrize("shape,chunk", [(20, 10), (30, 6)])
def test_solve_assume_a(shape, chunk, memory):
    """Dask's test_solve_assume_a (``assume_a="pos"``; not its deprecated ``sym_pos=``)."""
    rng = np.random.default_rng(1)
    a = _symmat(shape)
    for bshape, bchunk in (((shape,), chunk), ((shape, 5), (chunk, 5)), ((shape, shape), (chunk, chunk))):
        b = rng.integers(1, 10, bshape)
        res = run(lambda mem: bl.solve(da.from_array(a, (chunk, chunk)), da.from_array(b, bchunk), assume_a="pos",
                                       memory=mem), memory)
        _check_solve(a.astype(float), b.astype(float), res)


@pytest.mark.parametrize("memory", [None, "least"])
@pytest.mark.parametrize("shape,chunk", [(20, 10), (12, 3), (30, 3), (30, 6)])
def test_cholesky(shape, chunk, memory):
    """Dask's test_cholesky: upper and lower against SciPy's (the factor is unique: forward error
    ``||dR|| / ||R|| <= c n eps kappa(A)``, Higham Thm 10.8; the backward error as the residual)."""
    a = _symmat(shape).astype(float)
    for lower in (False, True):
        c = dense(run(lambda mem: bl.cholesky(da.from_array(a, (chunk, chunk)), lower=lower, memory=mem), memory))
        ref = scipy.linalg.cholesky(a, lower=lower)
        assert np.array_equal(c, np.tril(c) if lower else np.triu(c))
        assert_factorization(a, c @ c.T if lower else c.T @ c, factors=(c, c))
        assert_close_to(c, ref, bound=4 * shape * eps(np.float64) * np.linalg.cond(a) * np.linalg.norm(ref),
                        what="Cholesky factor against SciPy's")


@pytest.mark.parametrize("shape,chunk", [(20, 10), (12, 3), (30, 6)])
def test_cholesky_complex(shape, chunk):
    """Dask's test_cholesky_complex: Hermitian positive definite, lower and upper."""
    rng = np.random.default_rng(42)
    a = rng.standard_normal((shape, shape)) + 1j * rng.standard_normal((shape, shape))
    a = a @ a.conj().T + shape * np.eye(shape)
    for lower in (True, False):
        c = dense(bl.cholesky(da.from_array(a, (chunk, chunk)), lower=lower))
        ref = scipy.linalg.cholesky(a, lower=lower)
        assert_close_to(c, ref, bound=4 * shape * eps(np.float64) * np.linalg.cond(a) * np.linalg.norm(ref),
                        what="complex Cholesky factor against SciPy's")


def _lstsq_case(nrow, ncol, chunk, iscomplex, rng):
    a = rng.integers(1, 20, (nrow, ncol)).astype(float)
    b = rng.integers(1, 20, nrow).astype(float)
    if iscomplex:
        a = a + 1.0j * rng.integers(1, 20, a.shape)
        b = b + 1.0j * rng.integers(1, 20, b.shape)
    return a, b


def _check_lstsq(a, b, got, chunk):
    x, r, rank, s = np.linalg.lstsq(a, b, rcond=-1)
    dx, dr, drank, ds = bl.lstsq(da.from_array(a, (chunk, a.shape[1])),
                                 da.from_array(b, (chunk,) + b.shape[1:])) if got is None else got
    assert drank == rank
    n = max(a.shape)
    assert_singular_values(ds, s, n=n)
    # full-rank least squares: forward error kappa(A) times the backward error (Higham Thm 20.1),
    # the residual's sum of squares within 2 ||r|| of that error
    kappa = s[0] / s[-1]
    err = 8 * n * eps(np.float64) * kappa * np.linalg.norm(x)
    assert_close_to(dx, x, bound=err + 8 * n * eps(np.float64) * kappa ** 2 * np.linalg.norm(b) / s[0],
                    what="least-squares solution")
    assert_close_to(dr, r, bound=2 * np.sqrt(np.sum(r)) * np.linalg.norm(a, 2) * err + 8 * n * eps(np.float64)
                    * np.linalg.norm(b) ** 2, what="residual sum of squares")


@pytest.mark.parametrize("iscomplex", [False, True])
@pytest.mark.parametrize("nrow,ncol,chunk", [(20, 10, 5), (100, 10, 10)])
def test_lstsq(nrow, ncol, chunk, iscomplex):
    """Dask's test_lstsq: full rank (x, residuals, rank, s), a repeated column (rank only), 2-D ``b``."""
    rng = np.random.default_rng(1)
    a, b = _lstsq_case(nrow, ncol, chunk, iscomplex, rng)
    _check_lstsq(a, b, None, chunk)
    a[:, 1] = a[:, 2]
    x, r, rank, s = np.linalg.lstsq(a, b, rcond=np.finfo(np.double).eps * max(nrow, ncol))
    assert rank == ncol - 1
    assert bl.lstsq(da.from_array(a, (chunk, ncol)), da.from_array(b, chunk))[2] == rank
    a, _ = _lstsq_case(nrow, ncol, chunk, iscomplex, rng)
    b2 = rng.integers(1, 20, (nrow, ncol // 2)).astype(float)
    if iscomplex:
        b2 = b2 + 1.0j * rng.integers(1, 20, b2.shape)
    _check_lstsq(a, b2, None, chunk)


def test_no_chunks_svd():
    """Dask's test_no_chunks_svd: unknown row chunks, and unknown row and column chunks."""
    x = np.random.default_rng(6).random((100, 10))
    u, s, v = np.linalg.svd(x, full_matrices=False)
    for chunks in [((np.nan,) * 10, (10,)), ((np.nan,) * 10, (np.nan,))]:
        dx = da.from_array(x, chunks=(10, 10))
        dx._chunks = chunks
        du, ds, dv = bl.svd(dx)
        _check_svd(x, du, ds, dv)
        # the singular vectors up to sign (distinct singular values): sin-theta, gap * bound
        gap = np.min(np.diff(s[::-1]))
        bnd = 8 * 100 * eps(np.float64) * s[0] / gap
        assert_close_to(np.abs(dense(du)), np.abs(u), bound=bnd * np.sqrt(10), what="|U|")
        assert_close_to(np.abs(dense(dv)), np.abs(v), bound=bnd * np.sqrt(10), what="|V|")


@pytest.mark.parametrize("chunks", [(10, -1), (-1, 10), (9, -1), (-1, 9)])
@pytest.mark.parametrize("shape", [(10, 100), (100, 10), (10, 10)])
def test_svd_supported_array_shapes(chunks, shape):
    """Dask's test_svd_supported_array_shapes: factors against NumPy's after ``svd_flip``."""
    x = np.random.default_rng(sum(shape)).random(shape)
    du, ds, dv = bl.svd(da.from_array(x, chunks=chunks))
    _check_svd(x, du, ds, dv)
    nu, ns, nv = np.linalg.svd(x, full_matrices=False)
    du, dv = flip(du, dv)
    nu, nv = flip(nu, nv)
    gap = np.min(np.abs(np.diff(ns)))
    bnd = 8 * max(shape) * eps(np.float64) * ns[0] / gap * np.sqrt(min(shape))  # sin-theta (Wedin)
    assert_close_to(du, nu, bound=bnd, what="U")
    assert_close_to(dv, nv, bound=bnd, what="Vt")


@pytest.mark.parametrize("ndim", [0, pytest.param(1, marks=pytest.mark.xfail(
    strict=True, reason="svd takes a 1-D array as one column (Dask and NumPy refuse it)")), 3])
def test_svd_incompatible_dimensions(ndim):
    """Dask's test_svd_incompatible_dimensions: not 2-D is refused, naming the shape."""
    x = np.random.default_rng(0).random((10,) * ndim)
    with pytest.raises(BlocklinError, match="2-D|2D|two-dimensional|ndim|shape"):
        bl.svd(x)


def test_svd_full_matrices_raises(tmp_path):
    """Dask's test_svd_full_matrices_raises: NumPy's ``full_matrices=True`` on a non-square stored matrix."""
    m = bl.from_array(np.random.default_rng(0).random((10, 6)), tmp_path / "m.zarr")
    with pytest.raises(BlocklinError, match="full_matrices"):
        np.linalg.svd(m, full_matrices=True)


@pytest.mark.parametrize("shape", [(10, 20), (20, 10), (10, 10)])
def test_svd_full_matrices_false(shape, tmp_path):
    """Dask's test_svd_full_matrices_false: ``np.linalg.svd(M, full_matrices=False)`` on a stored matrix."""
    x = np.random.default_rng(sum(shape) + 1).random(shape)
    du, ds, dv = np.linalg.svd(bl.from_array(x, tmp_path / "x.zarr"), full_matrices=False)
    _check_svd(x, du, ds, dv)


@pytest.mark.parametrize("norm", [None, 1, -1, np.inf, -np.inf, "fro", "nuc", 2, -2])
@pytest.mark.parametrize("precision", ["single", "double"])
def test_norm_2dim(norm, precision):
    """Dask's test_norm_any_ndim / test_norm_any_prec / test_norm_2dim, their 2-D ``axis=None``
    cases (shape (5, 6), chunks (2, 2)): the norm against NumPy's, to the sum's rounding."""
    dtype = np.float32 if precision == "single" else np.float64
    a = np.random.default_rng(7).random((5, 6)).astype(dtype)
    got = bl.norm(da.from_array(a, chunks=(2, 2)), norm)
    ref = np.linalg.norm(a.astype(np.float64), norm)
    # entry sums of 30 terms (Higham §4.2), or singular values (Weyl): 4 n eps ||A||_F
    assert abs(got - ref) <= 4 * 6 * eps(dtype) * np.linalg.norm(a.astype(np.float64)) * 6


@pytest.mark.parametrize("norm", [None, 1, -1, np.inf, -np.inf])
def test_norm_complex(norm):
    """Dask's test_norm_any_prec with ``isreal=False`` (2-D)."""
    rng = np.random.default_rng(8)
    a = rng.random((5, 6)) + 1j * rng.random((5, 6))
    got = bl.norm(da.from_array(a, chunks=(2, 2)), norm)
    assert abs(got - np.linalg.norm(a, norm)) <= 4 * 6 * eps(np.float64) * np.linalg.norm(a) * 6
