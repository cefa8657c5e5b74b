"""The peaks of a block (:mod:`blocklin.peaks`): exact in every layout, what first passes scan and
writers record."""

from __future__ import annotations

import numpy as np
import pytest

from blocklin.peaks import column_peaks, flat_peaks


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
