"""Powers of two (``runtime/powers.py``): exact scalings, and the power a block's largest magnitude needs."""

from __future__ import annotations

import numpy as np
import pytest

from blocklin.runtime.powers import ldexp, max_exponent


@pytest.mark.parametrize("dtype", ["float32", "float64", "complex64", "complex128"])
def test_ldexp_is_exact_and_keeps_the_dtype(rng, dtype):
    x = rng.standard_normal(50).astype(dtype)
    if np.dtype(dtype).kind == "c":
        x = x + 1j * rng.standard_normal(50).astype(x.real.dtype)
    y = ldexp(x, -7)
    assert y.dtype == x.dtype and np.array_equal(y * 2 ** 7, x)  # a power of two: no rounding
    z = x.copy()
    assert ldexp(z, 3, out=z) is z and np.array_equal(z, x * 8)  # in place


def test_ldexp_of_integers_gives_float64_never_truncated():
    """An integer block scaled by 2^-1 keeps its halves (cast back to int64 it would have lost them)."""
    y = ldexp(np.array([3, 5, -7]), -1)
    assert y.dtype == np.float64 and y.tolist() == [1.5, 2.5, -3.5]


def test_max_exponent():
    assert max_exponent(np.array([0.75, -3.0])) == 2  # 3 = 0.75 * 2^2
    assert max_exponent(np.array([1e200])) == int(np.frexp(1e200)[1])
    assert max_exponent(np.array([1e-200 + 0j])) == int(np.frexp(1e-200)[1])
    for none in (np.zeros(3), np.array([]), np.array([np.nan]), np.array([np.inf])):
        assert max_exponent(none) == 0
