"""``blocklin.lstsq`` against ``numpy.linalg.lstsq``: minimum-norm solutions of any rank and shape, with
NumPy's rank, singular values and residuals (ported from NumPy's ``linalg/tests/test_linalg.py``
``TestLstsq`` and Dask's ``array/tests/test_linalg.py::test_lstsq``, whose rank-deficient case repeats
a column).

Bounds. The singular values: a backward-stable SVD's, ``c M eps s_1`` (Weyl; :mod:`support.tolerances`).
The solution: the truncated-SVD solution of rank ``r`` is that of a problem within ``eps ||A||`` of the
given one, and its perturbation (Wedin; Higham, *Accuracy and Stability*, 2nd ed., Thm 20.1, applied to
the rank-``r`` part, whose singular values are separated from the dropped zeros) is
``||dx|| <= c M eps kappa_r (||x|| + kappa_r ||r|| / s_1)`` with ``kappa_r = s_1 / s_r``; ``c = 8``
covers ours and NumPy's. The residual norms: ``||r||^2`` moves by ``2 ||r|| ||A dx|| + ||A dx||^2``.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import blocklin as bl
from blocklin.errors import ParameterError, ShapeError
from support.tolerances import assert_close_to, assert_singular_values, eps

BUDGETS = {"streamed": "1MiB", "in-memory": "256MiB"}


def of_rank(m: int, n: int, r: int, *, seed: int = 0, dtype=np.float64) -> np.ndarray:
    """``m x n`` of rank ``r`` with singular values from 10 down to 1 (then exact zeros)."""
    rng = np.random.default_rng(seed)
    u, _ = np.linalg.qr(rng.standard_normal((m, r)))
    v, _ = np.linalg.qr(rng.standard_normal((n, r)))
    return ((u * np.linspace(10.0, 1.0, r)) @ v.T).astype(dtype)


def check(a, b, got, *, dtype=np.float64):
    x, res, rank, s = got
    xr, resr, rankr, sr = np.linalg.lstsq(a.astype(np.float64), np.asarray(b, dtype=np.float64), rcond=None)
    M = max(a.shape)
    assert rank == rankr and x.shape == xr.shape and x.dtype == dtype
    assert_singular_values(s, sr, n=M, dtype=dtype)
    kappa = sr[0] / sr[rank - 1]
    r = np.linalg.norm(np.asarray(b, dtype=np.float64) - a.astype(np.float64) @ xr)
    bound = 8 * M * eps(dtype) * kappa * (np.linalg.norm(xr) + kappa * r / sr[0])
    assert_close_to(x, xr, bound=bound, what="x")
    assert res.shape == resr.shape
    if res.size:
        adx = sr[0] * bound
        assert_close_to(res, resr, bound=(2 * r * adx + adx ** 2) * np.sqrt(res.size), what="residuals")


@pytest.mark.parametrize("budget", list(BUDGETS))
@pytest.mark.parametrize("m, n, r", [(2000, 30, 30), (2000, 30, 12), (30, 2000, 30), (30, 2000, 12)],
                         ids=["tall", "tall-deficient", "wide", "wide-deficient"])
@pytest.mark.parametrize("k", [None, 3], ids=["vector", "block"])
def test_any_rank_and_shape_as_numpy(m, n, r, k, budget):
    a = of_rank(m, n, r, seed=m + r)
    rng = np.random.default_rng(1)
    b = rng.standard_normal(m) if k is None else rng.standard_normal((m, k))
    got = bl.lstsq(a, b, memory=BUDGETS[budget])
    assert got.report["in_core"] == (budget == "in-memory") and got.report["method"] == "full"
    check(a, b, got)


def test_repeated_column_as_dask():
    """Dask's ``test_lstsq``: a 100 x 10 matrix whose last column repeats its first has rank 9."""
    rng = np.random.default_rng(0)
    a = rng.standard_normal((100, 10))
    a[:, -1] = a[:, 0]
    b = rng.standard_normal(100)
    got = bl.lstsq(a, b, memory="64KiB")
    assert got[2] == 9
    check(a, b, got)


def test_square_singular_in_memory():
    a = of_rank(120, 120, 80, seed=3)
    b = np.random.default_rng(2).standard_normal(120)
    check(a, b, bl.lstsq(a, b))


def test_rcond_cuts_as_numpy():
    """NumPy's ``test_future_rcond`` rule: values at most ``rcond * s_1`` count as zero."""
    a = of_rank(500, 20, 20, seed=4)  # singular values 10 ... 1
    b = np.arange(500.0)
    x, res, rank, s = bl.lstsq(a, b, rcond=0.5)
    assert rank == np.linalg.lstsq(a, b, rcond=0.5)[2] == int(np.sum(s > 5.0))
    assert res.size == 0  # rank < n: NumPy returns no residuals


@pytest.mark.parametrize("dtype", [np.float64, np.complex128])
@pytest.mark.parametrize("rcond", [0.0, -1, 1.0, 2.0])
@pytest.mark.parametrize("wide", [False, True], ids=["tall", "wide"])
def test_rcond_outside_zero_one_as_lapack(rcond, dtype, wide):
    """NumPy passes ``rcond`` to LAPACK's ``xGELSD``, which cuts at the unit roundoff ``eps / 2`` for an
    ``rcond`` at most 0 (NumPy's old default ``-1``) or at least 1. Singular values 1, 0.5 and 1e-20 (a
    permuted diagonal: every SVD gets them to their own rounding, or the last as 0): rank 2, ``x`` NumPy's.
    ``rcond >= 1`` had returned rank 0 and ``x = 0``; ``rcond=0`` had inverted 1e-20 (``||x|| = 5e20``,
    complex); ``rcond=-1`` had been refused."""
    a = np.zeros((5, 3), dtype=dtype)
    a[0, 1], a[2, 2], a[4, 0] = 1.0, 0.5, 1e-20
    b = np.arange(1.0, 6.0).astype(dtype)
    if wide:
        a, b = a.T.copy(), b[:3]
    x, res, rank, s = bl.lstsq(a, b, rcond=rcond, memory="256KiB")
    xr, resr, rankr, sr = np.linalg.lstsq(a, b, rcond=rcond)
    assert rank == rankr == 2 and res.shape == resr.shape == (0,)
    kappa, r = sr[0] / sr[1], np.linalg.norm(b - a @ xr)  # the module's bound at rank 2
    assert_close_to(x, xr, bound=8 * 5 * eps(dtype) * kappa * (np.linalg.norm(xr) + kappa * r / sr[0]), what="x")


@pytest.mark.parametrize("shape, bshape, dtype", [((0, 3), (0,), np.float64), ((3, 0), (3,), np.float64),
                                                   ((3, 0), (3, 2), np.float32), ((3, 0), (3, 2), np.complex64),
                                                   ((0, 0), (0,), np.float64)])
def test_empty_a_as_numpy(shape, bshape, dtype):
    """An ``A`` with no rows or no columns: NumPy's ``x = 0``, rank 0, no singular values, and for ``m > n = 0``
    the residuals ``||b||^2`` (exact: one sum of squares each). It had been refused naming ``k``, a parameter
    lstsq does not take (the SVD's ``1 <= k <= min(m, n) = 0``)."""
    a = np.zeros(shape, dtype=dtype)
    b = np.arange(1.0, 1.0 + np.prod(bshape)).reshape(bshape).astype(np.float32 if dtype != np.float64 else dtype)
    x, res, rank, s = bl.lstsq(a, b)
    xr, resr, rankr, sr = np.linalg.lstsq(a, b)
    assert rank == rankr == 0 and s.shape == sr.shape == (0,) and s.dtype == sr.dtype
    assert x.dtype == xr.dtype and np.array_equal(x, xr)
    assert res.dtype == resr.dtype and np.array_equal(res, resr)


@pytest.mark.parametrize("bdtype", [np.float64, np.int64])
def test_mixed_dtypes_of_a_numpy_a_promote_as_numpy(bdtype):
    """A NumPy float32 ``A`` with a float64 (or integer) ``b``: computed in float64 as ``numpy.linalg.lstsq``
    computes it (``a`` cast in memory), so ``x``, ``residuals`` and ``s`` are float64 with float64's accuracy
    (the module docstring's bound at float64's ``eps``), without a warning. They had been the float32 SVD's
    (relative error ~1e-7 against NumPy's ~1e-16), with a warning naming the fix."""
    a = of_rank(300, 6, 6, seed=8, dtype=np.float32)
    b = (4 * np.random.default_rng(9).standard_normal(300)).astype(bdtype)
    with warnings.catch_warnings():
        warnings.simplefilter("error", bl.errors.BlocklinWarning)
        got = bl.lstsq(a, b, memory="64KiB")
    check(a, b, got, dtype=np.float64)
    xr, resr, _, sr = np.linalg.lstsq(a, b, rcond=None)
    assert (got[1].dtype, got[3].dtype) == (resr.dtype, sr.dtype) == (np.float64,) * 2


@pytest.mark.parametrize("bdtype", [np.float64, np.int64])
def test_mixed_dtypes_of_a_stored_a_say_the_precision(bdtype, tmp_path):
    """A stored float32 ``A`` with a float64 (or integer) ``b``: NumPy's ``x``, ``residuals`` and ``s`` are float64
    (``s`` had stayed float32); the values are the float32 SVD's (docs/solve.md: the rank at the precision the SVD
    runs in; blocklin upcasts no stored input unasked), which a warning says, naming the fix (float64 numbers of
    float32's accuracy had come back without a word)."""
    a = of_rank(300, 6, 6, seed=8, dtype=np.float32)
    b = (4 * np.random.default_rng(9).standard_normal(300)).astype(bdtype)
    stored = bl.from_array(a, tmp_path / "a.zarr")
    with pytest.warns(bl.errors.BlocklinWarning, match=r"^a: is computed in its own dtype \(float32.*result is "
                      r"float64.*Fix: for float64 accuracy pass a in float64") as said:
        x, res, rank, s = bl.lstsq(stored, b, memory="64KiB")
    assert len(said) == 1 and said[0].filename == __file__  # the caller's line
    xr, resr, rankr, sr = np.linalg.lstsq(a, b, rcond=None)
    assert (x.dtype, res.dtype, s.dtype) == (xr.dtype, resr.dtype, sr.dtype) == (np.float64,) * 3
    assert rank == rankr == 6
    assert_singular_values(s, sr, n=300, dtype=np.float32)


def test_float32_and_integers():
    a = of_rank(1000, 12, 12, seed=5, dtype=np.float32)
    b = np.random.default_rng(3).standard_normal(1000).astype(np.float32)
    with warnings.catch_warnings():
        warnings.simplefilter("error", bl.errors.BlocklinWarning)  # one precision: computed in it, nothing to say
        check(a, b, bl.lstsq(a, b, memory="256KiB"), dtype=np.float32)
        ai = np.random.default_rng(4).integers(-3, 4, (300, 8))
        check(ai, np.arange(300) % 5, bl.lstsq(ai, np.arange(300) % 5, memory="64KiB"))


@pytest.mark.parametrize("scheduler", ["processes"])
def test_on_another_scheduler(scheduler):
    a = of_rank(2000, 30, 12, seed=6)
    b = np.random.default_rng(5).standard_normal(2000)
    check(a, b, bl.lstsq(a, b, memory="1MiB", scheduler=scheduler))


def test_nothing_left_in_the_temp_dir(tmp_path):
    """The SVD's group and the products are temporary stores lstsq removes (the test's temp dir is
    BLOCKLIN_TEMP_DIR, tests/conftest.py)."""
    a = of_rank(2000, 30, 12, seed=7)
    bl.lstsq(a, np.ones(2000), memory="1MiB")
    bl.lstsq(a.T.copy(), np.ones(30), memory="1MiB")
    assert not list((tmp_path / "blocklin-tmp").iterdir())


def test_bad_arguments():
    a = of_rank(50, 5, 5)
    for bad in (float("nan"), float("inf"), "eps", True):
        with pytest.raises(ParameterError, match="rcond: must be a finite number or None; got"):
            bl.lstsq(a, np.ones(50), rcond=bad)
    with pytest.raises(ShapeError, match=r"b: must have m = 50 rows .* shape \(49,\)"):
        bl.lstsq(a, np.ones(49))
    with pytest.raises(ShapeError, match="b: must be 1-D or 2-D"):
        bl.lstsq(a, np.ones((50, 1, 1)))
