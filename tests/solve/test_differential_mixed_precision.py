"""Findings of a differential search against NumPy/SciPy: the square solve in mixed precision."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.linalg as sl

import blocklin as bl
from blocklin.errors import NotPositiveDefiniteError, SingularMatrixError
from support.tolerances import assert_solve


def _singular_in_float32(n: int = 40) -> tuple[np.ndarray, np.ndarray]:
    """A positive definite float64 ``A`` (cond about 2^32) whose float32 cast is singular: rows and
    columns 20 and 21 hold ``[[1, 1], [1, 1 + 2^-30]]`` (``1 + 2^-30`` rounds to 1 in float32, whose eps
    is ``2^-23``), the rest a well-conditioned positive definite block."""
    rng = np.random.default_rng(0)
    g = rng.standard_normal((n, n))
    a = g @ g.T / n + np.eye(n)
    a[20:22] = 0.0
    a[:, 20:22] = 0.0
    a[20:22, 20:22] = [[1.0, 1.0], [1.0, 1.0 + 2.0 ** -30]]
    return a, rng.standard_normal(n)


@pytest.mark.parametrize("memory", [pytest.param("64MiB", marks=pytest.mark.slow), "256KiB"])
@pytest.mark.parametrize("assume_a, error", [("gen", SingularMatrixError), ("pos", NotPositiveDefiniteError)])
def test_mixed_precision_of_an_a_singular_only_in_float32_names_the_precision(assume_a, error, memory):
    """``precision="mixed"`` factors ``A`` rounded to float32, which is singular (the LU's zero pivot) or
    not positive definite (the Cholesky's pivot 0) where ``A`` is neither, only too ill-conditioned for
    float32. That had been refused as "A is singular" or "not positive definite", with a ridge or
    lstsq as the fix, which change the problem; the refusal now names the float32 factorization and
    ``precision='double'``, which solves it."""
    a, b = _singular_in_float32()
    assert np.linalg.eigvalsh(a).min() > 0
    with pytest.raises(error, match=r"float32.*precision='mixed'.*Fix: pass precision='double'"):
        bl.solve(a, b, assume_a=assume_a, precision="mixed", memory=memory)
    x = bl.solve(a, b, assume_a=assume_a, memory=memory).to_numpy().ravel()  # the fix
    assert_solve(x, sl.solve(a, b), a, dtype=np.float64)
