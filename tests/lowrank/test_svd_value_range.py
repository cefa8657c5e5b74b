"""Singular values beyond float64's range: refused naming the power of two that brings them in.

Reference: NumPy's SVD of the data scaled by that power of two (exact: a power of two).
"""

from __future__ import annotations

import re
import warnings

import numpy as np
import pytest

import blocklin as bl
from blocklin.errors import ParameterError


def _beyond_float64() -> np.ndarray:
    """Finite float64 entries (below 2^1024) whose largest singular value is about 2^1025."""
    a = np.random.default_rng(0).standard_normal((4, 200)) * 2.0 ** 1021
    assert np.isfinite(a).all() and np.abs(a).max() < np.finfo(np.float64).max
    assert np.linalg.norm(np.ldexp(a, -1000), 2) > 2.0 ** 24  # s_1 > 2^1024: beyond float64
    return a


@pytest.mark.parametrize("memory", [None, "256KiB"])
@pytest.mark.parametrize("method", ["gram", "lanczos", "rsvd", "sketch", "full"])
def test_singular_values_beyond_float64_are_refused_with_the_scaling(method, memory):
    a = _beyond_float64()
    kw = {"memory": memory} if memory else {}
    k = None if method == "full" else 2
    with pytest.raises(ParameterError, match=r"singular values within the range of float64") as err:
        bl.svd(a, k, method=method, seed=0, **kw)  # had raised ConvergenceError (non-finite s: 'use float64')
    e = int(re.search(r"2\.0\*\*-(\d+)", str(err.value)).group(1))
    # the fix named runs, and its values are the scaled data's
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # convergence of the iterative methods is not what this tests
        s = bl.svd(np.ldexp(a, -e), k, method=method, seed=0, **kw).s
    exact = np.linalg.svd(np.ldexp(a, -e), compute_uv=False)[:len(s)]
    assert np.isfinite(s).all()
    np.testing.assert_allclose(s[:1], exact[:1], rtol=1e-6)


@pytest.mark.parametrize("memory", [None, "1MiB"])
def test_eigenvalues_beyond_float64_are_refused_with_the_scaling(memory):
    a = np.random.default_rng(0).standard_normal((200, 200)) * 2.0 ** 1020
    a = (a + a.T) / 2  # finite entries, eigenvalues near 2^1024 * 1.3
    kw = {"memory": memory} if memory else {}
    with pytest.raises(ParameterError, match=r"eigenvalues within the range of float64") as err:
        bl.eigsh(a, 2, which="LM", order="descending", seed=0, **kw)  # had raised ConvergenceError
    e = int(re.search(r"2\.0\*\*-(\d+)", str(err.value)).group(1))
    w = bl.eigsh(np.ldexp(a, -e), 2, which="LM", order="descending", seed=0, **kw)[0]
    exact = np.linalg.eigvalsh(np.ldexp(a, -e))
    np.testing.assert_allclose(np.abs(w[0]), np.abs(exact).max(), rtol=1e-8)
