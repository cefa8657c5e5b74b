"""The peaks of a block (:mod:`blocklin.peaks`): exact in every layout, what first passes scan and
writers record."""

from __future__ import annotations

import numpy as np
import pytest

from blocklin.peaks import column_peaks, flat_peaks, max_nan


@pytest.mark.parametrize("dtype", ["float32", "float64", "complex64", "complex128", "int16"])
def test_column_peaks_of_folded_strips_are_exact(dtype):
    """Narrow C-ordered strips are reduced folded (``FOLD_ELEMENTS`` per row of the view), other layouts
    row by row: every layout and height gives the exact ``max |x|`` of each column (``max(|Re|, |Im|)``
    of complex data), NaN and Inf included, in float64."""
    rng = np.random.default_rng(3)
    for h in (1, 63, 64, 65, 4097):
        for n in (1, 3, 64, 4096, 5000):
            x = rng.standard_normal((h, n)) * 10
            if np.dtype(dtype).kind == "c":
                x = x + 1j * rng.standard_normal((h, n))
            v = x.astype(dtype)
            if h > 3 and n > 2 and v.dtype.kind in "fc":
                v[h // 2, 1], v[1, 2] = np.nan, -np.inf
            want = np.maximum(np.abs(v.real).max(axis=0), np.abs(v.imag).max(axis=0)) if v.dtype.kind == "c" \
                else np.abs(v).max(axis=0)
            for w in (v, np.asfortranarray(v), v[:, ::-1]):
                got = column_peaks(w)
                assert got.dtype == np.float64
                np.testing.assert_array_equal(got, want[::-1] if w.strides[1] < 0 else want)


@pytest.mark.parametrize("dtype", ["float32", "float64", "complex64", "complex128"])
def test_flat_peaks_are_the_largest_column_peak(dtype):
    rng = np.random.default_rng(4)
    x = rng.standard_normal((300, 7)) * np.logspace(-5, 5, 7)
    if np.dtype(dtype).kind == "c":
        x = x - 1j * rng.standard_normal((300, 7))
    v = x.astype(dtype)
    for w in (v, np.asfortranarray(v)):
        np.testing.assert_array_equal(flat_peaks(w), np.full(7, column_peaks(w).max()))
    v[5, 5] = np.nan
    assert np.isnan(flat_peaks(v)).all()


def _specials(dtype, h, rng):
    """An ``h x 8`` block of ``dtype`` whose columns hold what a scan must not get wrong: NaN (of either
    sign) among finite values, -Inf, -0.0 alone, +0.0 and -0.0 mixed, subnormals of both signs, values
    near overflow, and an ordinary column (complex: in the real or the imaginary part)."""
    real = np.empty(0, dtype).real.dtype
    fi = np.finfo(real) if real.kind == "f" else None
    x = rng.standard_normal((h, 8)) * 10
    if fi is not None:
        x[:, 1] = -0.0
        x[:, 2] = np.where(rng.random(h) < 0.5, -0.0, 0.0)
        x[:, 3] = fi.smallest_subnormal * rng.integers(-3, 4, h)
        x[:, 4] = fi.max * rng.uniform(-1, 1, h) if real.itemsize > 4 else fi.max * np.sign(rng.standard_normal(h))
        x[h // 2, 5] = -np.inf
        x[h // 3, 6] = np.nan
        x[-1, 7] = -np.nan
    v = x.astype(real)
    if np.dtype(dtype).kind == "c":
        w = (rng.standard_normal((h, 8)) * 10).astype(real)
        w[:, 0] *= 1e3  # the imaginary part larger
        v = v.astype(dtype) + (1j * w).astype(dtype)
        v.imag[:, 1:5] = -0.0  # the real part's specials hold
    return v.astype(dtype)


def _same_bits(got, want):
    """Equal bit for bit, but that any NaN matches any NaN (which of them a max returns is unspecified)."""
    assert got.dtype == np.float64 and got.shape == want.shape
    nan = np.isnan(want)
    np.testing.assert_array_equal(np.isnan(got), nan)
    np.testing.assert_array_equal(got[~nan].view(np.uint64), want[~nan].view(np.uint64))


@pytest.mark.parametrize("dtype", ["float32", "float64", "complex64", "complex128", "int16"])
def test_peaks_taken_by_pieces_are_the_bits_of_numpy_on_the_whole(dtype):
    """Peaks taken a piece at a time and merged (as a first pass takes them, piece by piece of each
    strip, and strip by strip) are ``np.abs(x).max(axis=0)`` of the whole, bit for bit (``max(|Re|,
    |Im|)`` of complex data): NaN where a column holds one, +0.0 for a column of zeros of either or both
    signs (a max of +0.0 and -0.0 returns either: the peak was -0.0 or +0.0 by the pieces' order),
    subnormals and values near overflow exact, whatever the pieces' heights and the block's layout;
    the largest magnitude alone is their largest."""
    rng = np.random.default_rng(5)
    for h in (1, 7, 300, 1100):
        v = _specials(dtype, h, rng)
        want = np.maximum(np.abs(v.real).max(axis=0), np.abs(v.imag).max(axis=0)) if v.dtype.kind == "c" \
            else np.abs(v).max(axis=0)
        want = want.astype(np.float64)
        for step in (1, 3, 256, h):
            for w in (v, np.asfortranarray(v)):
                cols = max_nan([column_peaks(w[r0:r0 + step]) for r0 in range(0, h, step)])
                flat = max_nan([flat_peaks(w[r0:r0 + step]) for r0 in range(0, h, step)])
                _same_bits(cols, want)
                _same_bits(column_peaks(w), want)
                _same_bits(flat, np.full(8, want.max()))
                _same_bits(flat_peaks(w), np.full(8, want.max()))
