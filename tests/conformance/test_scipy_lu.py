"""SciPy's ``scipy/linalg/tests/test_decomp_lu.py`` ported to ``blocklin.lu``/``lu_solve``.

Each test names the SciPy test it ports. ``bl.lu`` returns ``lu_factor``'s packed ``m x n`` factor
(its ``min(m, n)`` 0-based pivots in ``report["pivots"]``); SciPy's ``P, L, U`` are rebuilt from it
(``support.conformance.lu_parts``). Where SciPy compares with LAPACK's ``getrf`` bit for bit or to
``assert_allclose``'s 1e-7, a different order of the same partial pivoting can round differently: the
packed factor is compared to the LU forward bound and ``P L U`` to the backward bound
``|A - P L U| <= gamma_n |L| |U|`` (Higham Thm 9.3); the pivots must equal (these matrices have no
ties). The 20 x 20 and 30 x 40 cases also run at the least budget the planner accepts.

Not applicable (not ported):

==============================================  ===============================================
SciPy test                                      why
==============================================  ===============================================
test_simple_lu_shapes_real_complex ``[3, 2,     N-d stacks of matrices (blocklin factors one
9, 9]``, ``[2, 2, 17, 5]``, ``[2, 2, 11, 7]``,  ``m x n`` matrix)
test_1by1_input_output (4-D stacks)
``permute_l=`` / ``p_indices=`` outputs          SciPy's output switches: the packed factor and
                                                pivots hold the same (docs/porting.md); the
                                                ``P L U`` checks of those tests are ported
TestLUFactor.test_check_finite,                 ``check_finite=False``
TestLUSolve.test_check_finite
test_empty_edge_cases float16                   float16 input (blocklin's dtypes: float32/64)
``order='C'/'F'``                               memory order of an in-memory array (the stored
                                                layout is blocklin's own)
==============================================  ===============================================
"""

from __future__ import annotations

import numpy as np
import pytest
import scipy.linalg

import blocklin as bl
from support.conformance import dense, lu_parts, run
from support.tolerances import assert_close_to, assert_factorization, assert_solve, eps

COMPLEX = pytest.mark.filterwarnings("default")  # the complex cases: no mark (complex LU/Cholesky pass)
SEED = 1682281250228846


def _check_plu(a, f):
    p, lo, up = lu_parts(f, f.report["pivots"])
    assert_factorization(a, p @ lo @ up, factors=(lo, up))
    return p, lo, up


def test_old_lu_smoke_tests():
    """TestLU.test_old_lu_smoke_tests (real part): ``P`` the anti-diagonal, SciPy's ``L`` and ``U``."""
    a = np.array([[1, 2, 3], [1, 2, 3], [2, 5, 6]])
    p, lo, up = _check_plu(a, bl.lu(a))
    ref = np.array([[2., 5., 6.], [0.5, -0.5, 0.], [0.5, 1., 0.]])
    np.testing.assert_allclose(p, np.rot90(np.eye(3)))
    np.testing.assert_allclose(lo, np.tril(ref, k=-1) + np.eye(3), atol=4 * eps(float))
    np.testing.assert_allclose(up, np.triu(ref), atol=4 * 6 * eps(float))


@COMPLEX
def test_old_lu_smoke_tests_complex():
    """TestLU.test_old_lu_smoke_tests (complex part)."""
    a = np.array([[1, 2, 3], [1, 2, 3], [2, 5j, 6]])
    p, lo, up = _check_plu(a, bl.lu(a))
    ref = np.array([[2., 5.j, 6.], [0.5, 2 - 2.5j, 0.], [0.5, 1., 0.]])
    np.testing.assert_allclose(p, np.rot90(np.eye(3)))
    np.testing.assert_allclose(up, np.triu(ref), atol=4 * 6 * eps(float))


@pytest.mark.parametrize("shape", [[2, 2], [2, 4], [4, 2], [20, 20], [20, 4], [4, 20]])
def test_simple_lu_shapes_real_complex(shape):
    """TestLU.test_simple_lu_shapes_real_complex and _2d_indices (2-D shapes): ``A = P L U``, real."""
    a = np.random.default_rng(SEED).uniform(-10., 10., size=shape)
    p, lo, up = _check_plu(a, bl.lu(a))
    perm = np.argmax(p, axis=1)  # p_indices: A = L[perm] U
    assert_factorization(a, lo[perm, :] @ up, factors=(lo, up))


@COMPLEX
@pytest.mark.parametrize("shape", [[2, 2], [2, 4], [4, 2], [20, 20], [20, 4], [4, 20]])
def test_simple_lu_shapes_complex(shape):
    """TestLU.test_simple_lu_shapes_real_complex, its complex ``b`` (``permute_l``: ``P L U``)."""
    rng = np.random.default_rng(SEED)
    b = rng.uniform(-10., 10., size=shape) * 1j + rng.uniform(-10, 10, size=shape)
    _check_plu(b, bl.lu(b))


def test_1by1_input_output():
    """TestLU.test_1by1_input_output, one 1 x 1 matrix (float32): ``P = L = 1``, ``U = a``."""
    a = np.random.default_rng(SEED).random([1, 1], dtype=np.float32)
    f = bl.lu(a)
    p, lo, up = lu_parts(f, f.report["pivots"])
    assert f.dtype == np.float32 and np.array_equal(p, [[1]]) and np.array_equal(lo, [[1]])
    np.testing.assert_array_equal(up, a)


@pytest.mark.parametrize("shape", [(0, 0), (0, 3), (3, 0)])
def test_empty_edge_cases(shape):
    """TestLU.test_empty_edge_cases (float64): empty factors."""
    f = bl.lu(np.empty(shape))
    assert f.shape == shape and len(f.report["pivots"]) == 0


_HRECT = np.array([[1, 2, 3, 4], [5, 6, 7, 8], [9, 10, 12, 12]])
_VRECT = np.array([[1, 2, 3], [4, 5, 6], [7, 8, 9], [10, 12, 12]])


def _common_lu_factor(data, memory=None):
    f = run(lambda mem: bl.lu(data, memory=mem), memory)
    lu2, piv2 = scipy.linalg.lu_factor(data)
    np.testing.assert_array_equal(np.asarray(f.report["pivots"]), piv2)
    p, lo, up = _check_plu(data, f)
    # same pivots: the same L and U up to rounding, forward bound kappa(A_k) per leading block;
    # for these well-scaled matrices ||L|| ||U|| n eps times the growth bounds it
    bound = 8 * max(data.shape) * eps(float) * np.linalg.norm(np.tril(lu2, -1) + np.eye(*lu2.shape)) \
        * np.linalg.norm(np.triu(lu2)) * np.linalg.cond(up[:, :min(data.shape)])
    assert_close_to(dense(f), lu2, bound=bound, what="packed LU against lu_factor")


@pytest.mark.parametrize("name", ["hrectangular", "vrectangular"])
def test_rectangular(name):
    """TestLUFactor.test_hrectangular / test_vrectangular: against ``lu_factor``/``getrf``."""
    _common_lu_factor((_HRECT if name == "hrectangular" else _VRECT).astype(float))


@COMPLEX
@pytest.mark.parametrize("name", ["hrectangular_complex", "vrectangular_complex", "medium1_complex"])
def test_rectangular_complex(name):
    """TestLUFactor.test_hrectangular_complex / test_vrectangular_complex / test_medium1_complex."""
    rng = np.random.default_rng(SEED)
    rng.random((30, 40))
    data = {"hrectangular_complex": _HRECT * 1j, "vrectangular_complex": _VRECT * 1j,
            "medium1_complex": rng.random((30, 40)) + 1j * rng.random((30, 40))}[name]
    _common_lu_factor(data)


@pytest.mark.parametrize("memory", [None, "least"])
def test_medium1(memory):
    """TestLUFactor.test_medium1: 30 x 40."""
    _common_lu_factor(np.random.default_rng(SEED).random((30, 40)), memory)


def test_simple_known():
    """TestLUFactor.test_simple_known: no pivoting needed."""
    f = bl.lu(np.array([[2, 1], [0, 1.]]))
    np.testing.assert_allclose(dense(f), np.array([[2, 1], [0, 1]]))
    np.testing.assert_array_equal(f.report["pivots"], np.array([0, 1]))


@pytest.mark.parametrize("m", [0, 1, 2])
@pytest.mark.parametrize("n", [0, 1, 2])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, pytest.param(np.complex64, marks=COMPLEX),
                                   pytest.param(np.complex128, marks=COMPLEX)])
def test_shape_dtype(m, n, dtype):
    """TestLUFactor.test_shape_dtype: the packed factor ``m x n`` of the input's dtype, ``min(m, n)`` pivots."""
    f = bl.lu(np.eye(m, n, dtype=dtype))
    piv = np.asarray(f.report["pivots"])
    assert f.shape == (m, n) and f.dtype == dtype and piv.shape == (min(m, n),)
    assert np.issubdtype(piv.dtype, np.integer)


@pytest.mark.parametrize("m,n", [(0, 0), (0, 2), (2, 0)])
def test_factor_empty(m, n):
    """TestLUFactor.test_empty."""
    f = bl.lu(np.zeros((m, n)))
    assert f.shape == (m, n) and len(f.report["pivots"]) == 0


@pytest.mark.parametrize("memory", [None, "least"])
def test_lu_solve(memory):
    """TestLUSolve.test_lu: ``lu_solve(lu_factor(a), b)`` against ``solve(a, b)``."""
    rng = np.random.default_rng(SEED)
    a, b = rng.random((10, 10)), rng.random((10,))
    f = run(lambda mem: bl.lu(a, memory=mem), memory)
    x = dense(run(lambda mem: bl.lu_solve(f, b, memory=mem), memory)).ravel()
    assert_solve(x, scipy.linalg.solve(a, b), a)


DT = [int, float, np.float32, pytest.param(complex, marks=COMPLEX), pytest.param(np.complex64, marks=COMPLEX)]


@pytest.mark.parametrize("dt", DT)
@pytest.mark.parametrize("dt_b", DT)
def test_lu_solve_empty(dt, dt_b):
    """TestLUSolve.test_empty: 0 x 0 factors solve empty right-hand sides, SciPy's result dtype."""
    ref = scipy.linalg.lu_solve((np.eye(2, dtype=dt), [0, 1]), np.ones(2, dtype=dt_b)).dtype
    for b in (np.asarray([], dtype=dt_b), np.empty((0, 0), dtype=dt_b)):
        x = bl.lu_solve(np.empty((0, 0), dtype=dt), b, piv=np.array([], dtype=int))
        assert dense(x).size == 0 and x.dtype == ref
