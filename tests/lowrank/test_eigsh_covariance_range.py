"""eigsh(center=True): the covariance eigenvalues ``w = s^2 / (m - 1)`` within the range of their dtype, and
the count ``k`` refused in eigsh's own terms.

``w`` is the square of the singular values: data whose singular values fit (float32 data near ``2^64``,
float64 data near ``2^512``) can have covariance eigenvalues beyond the dtype's largest number. They had been
returned as Inf with only NumPy's overflow warning; they are refused, naming the power of two that brings
them in range. A ``k = min(m, n)`` had been refused by the Lanczos SVD naming a ``method=`` that eigsh does
not take.

Bounds: the values that fit are Ritz values of the covariance from vectors with the residuals the report
gives, so :func:`support.tolerances.assert_ritz_values` (Kato-Temple plus the rounding of the products, at
the covariance's 2-norm) with ``eps`` of the data's dtype.
"""

from __future__ import annotations

import re
import warnings

import numpy as np
import pytest
from support.tolerances import assert_ritz_values

import blocklin as bl
from blocklin.errors import ParameterError

M, N, K = 60, 6, 2


def _data(dtype, power: int) -> tuple[np.ndarray, np.ndarray]:
    """Gaussian data times ``2^power`` (exact) in ``dtype``, and its covariance spectrum in float64 scaled
    by ``2^-2 power`` (exact)."""
    x = np.random.default_rng(7).standard_normal((M, N)).astype(dtype)
    spectrum = np.linalg.eigvalsh(np.cov(x.astype(np.float64), rowvar=False))
    return np.ldexp(x, power).astype(dtype), spectrum


@pytest.mark.parametrize("dtype,power", [(np.float32, 70), (np.float64, 600)])
def test_covariance_eigenvalues_beyond_the_dtype_are_refused_by_name(dtype, power):
    """``2^140`` and ``2^1200`` times the unit covariance's values: past float32's and float64's range."""
    a, spectrum = _data(dtype, power)
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # NumPy's overflow warning had been all that was said
        with pytest.raises(ParameterError, match="covariance eigenvalues within the range") as info:
            bl.eigsh(a, K, center=True, order="descending")
    q = int(re.search(r"scale the data by 2\.0\*\*-(\d+)", str(info.value)).group(1))
    res = bl.eigsh(np.ldexp(a, -q).astype(dtype), K, center=True, order="descending")  # the fix, applied
    scale = 2.0 ** (2 * (power - q))
    assert np.isfinite(res.w).all()
    assert_ritz_values(res.w / scale, spectrum[::-1][:K], spectrum=spectrum, n=M, norm=float(spectrum[-1]),
                       residuals=np.asarray(res.report["residuals"]) / scale, dtype=dtype)


@pytest.mark.parametrize("shape", [(M, N), (3, 10), (1, 1)])
def test_covariance_k_of_every_pair_is_refused_in_eigsh_terms(shape):
    """``k = min(m, n)`` and above: a ``k`` refusal with eigsh's rule and fix, never svd's ``method=``."""
    a = np.random.default_rng(1).standard_normal(shape)
    for k in (min(shape), min(shape) + 1):
        with pytest.raises(ParameterError, match=r"^k: must be an integer with 1 <= k < min\(m, n\)") as info:
            bl.eigsh(a, k, center=True, order="descending")
        assert "method" not in str(info.value)


@pytest.mark.parametrize("dtype,power", [(np.float32, -70), (np.float64, -540)])
def test_covariance_eigenvalues_below_the_normal_numbers_are_refused_by_name(dtype, power):
    """``2^-140`` and ``2^-1080`` times the unit covariance's values: below float32's and float64's normal
    numbers. They had been returned as 0 (float64) or with a few digits (float32, about 2^-9 relative
    error), without a word, where the overflow of the same values is refused."""
    a, spectrum = _data(dtype, power)
    with pytest.raises(ParameterError, match="covariance eigenvalues within the range.*smallest normal") as info:
        bl.eigsh(a, K, center=True, order="descending")
    q = int(re.search(r"scale the data by 2\.0\*\*(\d+)", str(info.value)).group(1))
    res = bl.eigsh(np.ldexp(a, q).astype(dtype), K, center=True, order="descending")  # the fix, applied
    scale = 2.0 ** (2 * (power + q))
    assert_ritz_values(res.w / scale, spectrum[::-1][:K], spectrum=spectrum, n=M, norm=float(spectrum[-1]),
                       residuals=np.asarray(res.report["residuals"]) / scale, dtype=dtype)
