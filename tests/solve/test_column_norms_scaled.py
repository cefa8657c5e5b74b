"""Column 2-norms scaled by powers of two (:func:`blocklin.linalg.blocks.scaling.column_norms`), the one
helper the spectral routes' accuracy bound and LSQR's reported norms take.

``per_column`` divides each column by the power of two near its own largest entry: columns ``1e300`` and
``1e-300`` in one array (one power for the array flushes the small column's squares to 0), Inf and NaN
entries kept. The bound: ``sqrt(sum x_i^2)`` of ``m`` terms has relative error at most ``(m / 2 + 1) u``
(Higham 2002, 3.1: ``gamma_m`` for the sum, halved by the square root, plus the root's rounding), of
a reference exact to 100 digits (mpmath)."""

from __future__ import annotations

import mpmath as mp
import numpy as np
import pytest

from blocklin.linalg.blocks.scaling import column_norms
from blocklin.linalg.solve.spectrum import Spectrum, accuracy
from support.tolerances import eps


def _reference(x: np.ndarray) -> np.ndarray:
    with mp.workdps(100):
        return np.array([float(mp.sqrt(mp.fsum(mp.mpf(float(t)) ** 2 for t in col))) for col in x.T])


def _within(got: np.ndarray, ref: np.ndarray, m: int) -> None:
    rel = np.abs(got - ref) / ref
    assert np.all(rel <= (m / 2 + 1) * eps(np.float64)), rel


@pytest.mark.parametrize("seed", range(4))
def test_columns_far_apart_in_one_array(seed):
    rng = np.random.default_rng(seed)
    m = 17
    scales = np.array([1e300, 1e-300, 1.0, 2.0 ** -1070 * 2.0 ** 40, 1e155, 1e-160])
    x = rng.standard_normal((m, scales.size)) * scales
    got = column_norms(x, per_column=True)
    _within(got, _reference(x), m)
    # one power of two for the whole array: the small columns' squares underflow (what per_column is for)
    assert np.any(column_norms(x)[[1, 3]] == 0.0)


def test_inside_the_range_the_bits_of_the_plain_sum():
    """Scaling by ``2^-e`` is exact and so is the ``2^e`` the root gives back: where the squares stay in
    range the bits are those of ``sqrt(sum x_i^2)``, so routes that switch to scaled norms out of range
    keep their in-range values."""
    rng = np.random.default_rng(5)
    for m, n in [(1, 1), (7, 3), (64, 5)]:
        x = rng.standard_normal((m, n)) * 10.0 ** rng.uniform(-100, 100, n)
        assert np.array_equal(column_norms(x, per_column=True), np.sqrt(np.einsum("ij,ij->j", x, x)))


def test_inf_nan_and_zero_columns():
    x = np.array([[1e300, np.inf, np.nan, 0.0, 3e-300],
                  [1e300, 1.0, 1.0, 0.0, 4e-300]])
    got = column_norms(x, per_column=True)
    assert got[1] == np.inf and np.isnan(got[2]) and got[3] == 0.0
    assert got[0] == np.ldexp(np.sqrt(2.0) * np.ldexp(1e300, -997), 997)
    _within(got[[0, 4]], _reference(x[:, [0, 4]]), 2)
    # a norm beyond float64's range is Inf, not an error
    assert column_norms(np.full((4, 1), 1.7e308), per_column=True)[0] == np.inf


def test_accuracy_bound_is_scale_free():
    """The spectral routes' bound (:func:`accuracy`) is relative: ``b`` scaled by ``2^+-600`` (``beta`` near
    ``1e180`` or ``1e-180``, whose squares leave the range; the error terms ``eps`` below them stay normal)
    gives the bound of ``b`` itself, bit for bit."""
    rng = np.random.default_rng(3)
    s = np.array([3.0, 1.0, 1e-3, 1e-9])
    beta = rng.standard_normal((4, 3))
    spec = lambda bt: Spectrum(s=s, basis=np.eye(4), beta=bt, rho0sq=np.zeros(3), m=10, n=4)
    ref = accuracy(spec(beta), 1e-2)
    assert np.all(np.isfinite(ref)) and np.all(ref > 0)
    for k in (600, -600):
        assert np.array_equal(accuracy(spec(np.ldexp(beta, k)), 1e-2), ref)
    # one column near 2^600 beside one near 2^-600: each keeps its own bound
    mixed = beta * np.ldexp(1.0, np.array([600, -600, 0]))
    assert np.array_equal(accuracy(spec(mixed), 1e-2), ref)
