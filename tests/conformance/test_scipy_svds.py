"""SciPy's ``scipy/sparse/linalg/_eigen/tests/test_svds.py`` ported to ``blocklin.svd(a, k, which=...)``.

Each test names the SciPy test it ports. SciPy runs ``SVDSCommonTests`` once per solver (ARPACK,
LOBPCG, PROPACK); the solver is not a parameter here, so each case runs once. ``svds`` returns values
ascending, blocklin descending: compared after sorting. SciPy's ``_check_svds`` tolerances (atol 1e-10,
rtol 1e-7 or tighter) are its iterative solvers' stopping rules; here the singular values are held to
the backward-stable bound (Weyl, tests/support/tolerances.py) and the factors to orthonormality and
``U^T A = diag(s) V^T`` residual bounds. The 20 x 21 cases also run at the least budget.

Not applicable (not ported): the ``solver=`` axis and Test_SVDS_once.test_svds_input_validation_solver
(the solver choice); ARPACK's ``ncv`` tests, ``maxiter`` tests and test_svd_maxiter (ARPACK/LOBPCG
iteration counts); test_svds_input_validation_tol_2 / _k_2 (SciPy's TypeError texts of ``int()``/``<``);
test_svd_rng, _rng_2, _rng_3 (``rng=``'s reproducibility through SciPy's own draws: blocklin's
``seed`` is tested by the Dask and scikit-learn ports); test_small_sigma_sparse and the ``csc_array``/
``csr_array`` ``lo_type`` of test_svd_simple (sparse input, issue 29); test_svd_linop (SciPy's
``CheckingLinearOperator`` internals); test_svds_diff0_docstring_example (a ``LinearOperator`` built
from ``np.diff``: blocklin's operator input has its own tests).
"""

from __future__ import annotations

import numpy as np
import pytest

import blocklin as bl
from blocklin.errors import BlocklinError
from support.conformance import dense, run
from support.tolerances import assert_orthonormal, assert_singular_values


def _check_svds(a, k, res, which="LM"):
    """SciPy's _check_svds: shapes, semi-orthogonal factors, the values of ``scipy.linalg.svd``."""
    u, s, vh = dense(res[0]), res[1], dense(res[2])
    m, n = a.shape
    assert u.shape == (m, k) and s.shape == (k,) and vh.shape == (k, n)
    assert_orthonormal(u, n=max(m, n), const=8.0)
    assert_orthonormal(vh.T, n=max(m, n), const=8.0)
    full = np.linalg.svd(a.astype(np.complex128 if np.iscomplexobj(a) else np.float64), compute_uv=False)
    ref = full[:k] if which == "LM" else full[::-1][:k][::-1]
    assert_singular_values(np.sort(s)[::-1], ref, n=max(m, n), s1=full[0])


@pytest.mark.parametrize("which", ["LM", "SM"])
def test_svds_int_A(which):
    """test_svds_int_A: a 2 x 2 integer matrix, k = 1."""
    a = np.asarray([[1, 2], [3, 4]])
    _check_svds(a, 1, bl.svd(a, 1, which=which, seed=0), which)


@pytest.mark.parametrize("a", [np.asarray([[]]), np.array([["a", "b"], ["c", "d"]], dtype="object"), "hi",
                               np.asarray([[[1., 2.], [3., 4.]]])], ids=["empty", "object", "str", "3-d"])
def test_svds_input_validation_A(a):
    """test_svds_input_validation_A: empty, non-numeric, not an array, 3-D: refused."""
    with pytest.raises((BlocklinError, ValueError, TypeError)):
        bl.svd(a, 1, seed=0)


@pytest.mark.parametrize("k", [-1, 0, 4, 5, 1.5, "1"])
def test_svds_input_validation_k_1(k):
    """test_svds_input_validation_k_1 (k = 3 = min(m, n) is blocklin's every triplet, below)."""
    with pytest.raises((BlocklinError, ValueError, TypeError), match="k"):
        bl.svd(np.random.default_rng(0).random((4, 3)), k, seed=0)


def test_svds_k_equals_min():
    """test_svds_input_validation_k_1's k = 3 of a 4 x 3 matrix: as PROPACK, the complete SVD."""
    a = np.random.default_rng(0).random((4, 3))
    _check_svds(a, 3, bl.svd(a, 3, seed=0))


@pytest.mark.parametrize("tol", (-1, np.inf, np.nan))
def test_svds_input_validation_tol_1(tol):
    """test_svds_input_validation_tol_1: a negative, infinite or NaN tolerance is refused."""
    with pytest.raises((BlocklinError, ValueError), match="tol"):
        bl.svd(np.eye(10), 2, tol=tol, seed=0)


@pytest.mark.parametrize("which", ("LA", "SA", "ekki", 0))
def test_svds_input_validation_which(which):
    """test_svds_input_validation_which."""
    with pytest.raises((BlocklinError, ValueError), match="which"):
        bl.svd(np.eye(10), 2, which=which, seed=0)


@pytest.mark.parametrize("v0", ("hi", 1, np.ones(5)))
def test_svds_input_validation_v0(v0):
    """test_svds_input_validation_v0_1/_3: a ``v0`` of the wrong length or type is refused."""
    with pytest.raises((BlocklinError, ValueError, TypeError), match="v0"):
        bl.svd(np.random.default_rng(0).random((10, 8)), 2, v0=v0, seed=0)


@pytest.mark.parametrize("rsv", ("ekki", 10))
def test_svds_input_validation_return_singular_vectors(rsv):
    """test_svds_input_validation_return_singular_vectors."""
    with pytest.raises((BlocklinError, ValueError), match="return_singular_vectors"):
        bl.svd(np.eye(10), 2, return_singular_vectors=rsv, seed=0)


@pytest.mark.parametrize("k", [3, 5])
@pytest.mark.parametrize("which", ["LM", "SM"])
def test_svds_parameter_k_which(k, which):
    """test_svds_parameter_k_which: 10 x 10, the k largest or smallest."""
    a = np.random.default_rng(0).random((10, 10))
    _check_svds(a, k, bl.svd(a, k, which=which, seed=0), which)


@pytest.mark.parametrize("rsv", (True, False, "u", "vh"))
@pytest.mark.parametrize("shape", ((5, 7), (6, 6), (7, 5)))
def test_svd_return_singular_vectors(rsv, shape):
    """test_svd_return_singular_vectors: which factors come back, k = 2."""
    a = np.random.default_rng(0).random(shape)
    res = bl.svd(a, 2, return_singular_vectors=rsv, seed=0)
    ref = np.linalg.svd(a, compute_uv=False)[:2]
    if rsv is False:
        assert_singular_values(res, ref, n=7)
        return
    u, s, vh = res
    assert_singular_values(s, ref, n=7)
    assert (u is None) == (rsv == "vh") and (vh is None) == (rsv == "u")
    if u is not None:
        assert_orthonormal(dense(u), n=7)
    if vh is not None:
        assert_orthonormal(dense(vh).T, n=7)


_A1 = np.array([[1, 2, 3], [3, 4, 3], [1 + 1j, 0, 2], [0, 0, 1]])
_A2 = np.array([[1, 2, 3, 8 + 5j], [3 - 2j, 4, 3, 5], [1, 0, 2, 3], [0, 0, 1, 0]])


@pytest.mark.parametrize("transpose", (False, True))
@pytest.mark.parametrize("real", (True, False))
@pytest.mark.parametrize("k", range(1, 5))
@pytest.mark.parametrize("name", ["A1", "A2"])
def test_svd_simple(name, k, real, transpose):
    """test_svd_simple (``lo_type=np.asarray``): A1 (4 x 3), A2 (4 x 4), real parts or complex, transposed."""
    a = _A1 if name == "A1" else _A2
    a = a.real if real else a
    a = a.T if transpose else a
    if k > min(a.shape):
        pytest.skip("SciPy skips k > min(m, n) too")
    _check_svds(a, k, bl.svd(a, k, seed=0))


@pytest.mark.parametrize("shape", ((6, 5), (5, 5), (5, 6)))
@pytest.mark.parametrize("dtype", (float, complex))
def test_svd_LM_ones_matrix(shape, dtype):
    """test_svd_LM_ones_matrix: rank one, k = 3: ``s = [sqrt(mn), 0, 0]``, ``U S V^T = A``."""
    a = np.ones(shape, dtype=dtype)
    u, s, vh = bl.svd(a, 3, seed=0)
    u, vh = dense(u), dense(vh)
    assert_singular_values(s, [np.sqrt(a.size), 0, 0], n=max(shape))
    np.testing.assert_allclose((u * s) @ vh, a, atol=8 * max(shape) * np.finfo(float).eps * np.sqrt(a.size))
    assert_orthonormal(u, n=max(shape), const=8.0)
    assert_orthonormal(vh.T, n=max(shape), const=8.0)


@pytest.mark.parametrize("shape", ((3, 4), (4, 4), (4, 3), (4, 2)))
@pytest.mark.parametrize("dtype", (float, complex))
def test_zero_matrix(shape, dtype):
    """test_zero_matrix: k = 1 of zeros: ``s = 0``, orthonormal factors."""
    a = np.zeros(shape, dtype=dtype)
    u, s, vh = bl.svd(a, 1, seed=0)
    assert np.array_equal(s, [0.0])
    assert_orthonormal(dense(u), n=max(shape))
    assert_orthonormal(dense(vh).T, n=max(shape))


@pytest.mark.parametrize("memory", [None, "least"])
@pytest.mark.parametrize("shape", ((20, 20), (20, 21), (21, 20)))
@pytest.mark.parametrize("dtype", (np.float32, np.float64, np.complex64, np.complex128))
def test_small_sigma(shape, dtype, memory):
    """test_small_sigma: singular values 1e-8 ... 1e-4 (the smallest ``k = 5`` with ``which="SM"``)."""
    rng = np.random.default_rng(0)
    a = rng.random(shape)
    if np.issubdtype(dtype, np.complexfloating):
        a = a + 1j * rng.random(shape)
    u, _, vh = np.linalg.svd(a, full_matrices=False)
    e = np.linspace(1e-8, 1e-4, min(shape))[::-1]
    a = ((u * e) @ vh).astype(dtype)
    k = 5
    res = run(lambda mem: bl.svd(a, k, which="SM", seed=0, memory=mem), memory)
    _check_svds(a, k, res, "SM")
