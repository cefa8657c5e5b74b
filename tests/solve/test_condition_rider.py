"""The square solve's condition estimate rides the first solve.

``report["condition_estimate"]`` is ``||A||_F / sqrt(n)`` times ``||F^-1 z|| / ||z||`` for a fixed Gaussian ``z``
(Dixon 1983; :func:`blocklin.linalg.solve.square._condition_lower`). ``z`` is known before anything is solved,
so where the LU panels eliminate ``B`` beside the factorization (out of core, ``k`` within a panel) it is
eliminated with them as one more column and back-substituted with ``B``'s: the estimate's own pair of triangular
solves, a read of ``L`` and of ``U`` (``n^2`` entries of the factor), is gone. ``z``'s column is solved by BLAS
calls of its own on the same reads of the factor: ``x`` keeps its bits (one call over ``k + 1`` columns had
changed them, a float64 ``x`` of 4 columns where a fifth was added, OpenBLAS's kernels blocking the columns by
their unroll width), and the estimate is that of before.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import blocklin as bl
from blocklin import errors
from blocklin.linalg.solve import square


def system(n, k, dtype, graded, seed=0):
    rng = np.random.default_rng(seed)
    cplx = np.dtype(dtype).kind == "c"
    a = rng.standard_normal((n, n)) + (1j * rng.standard_normal((n, n)) if cplx else 0) + np.sqrt(n) * np.eye(n)
    if graded:  # equilibrated: the panels eliminate R b beside R A C
        a = a * 2.0 ** np.round(np.linspace(-30, 30, n))[:, None]
    return a.astype(dtype), rng.standard_normal((n, k)).astype(dtype)


def solve_both(monkeypatch, a, b, memory):
    """The solve as it runs, and with ``z`` not riding (``lu_rhs_fits`` refusing ``k + 1`` columns: the estimate's
    own solves, as before)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", errors.IllConditionedWarning)
        x = bl.solve(a, b, memory=memory)
        fits, k = square.lu_rhs_fits, b.shape[1]
        monkeypatch.setattr(square, "lu_rhs_fits", lambda n, w, cols, *rest: cols <= k and fits(n, w, cols, *rest))
        y = bl.solve(a, b, memory=memory)
    return x, y


@pytest.mark.parametrize("graded", [False, True], ids=["plain", "equilibrated"])
@pytest.mark.parametrize("k", [1, 4, 8])
@pytest.mark.parametrize("dtype", [np.float64, np.float32, np.complex128])
def test_the_estimate_rides_the_first_solve_and_x_keeps_its_bits(monkeypatch, dtype, k, graded):
    n = 300
    a, b = system(n, k, dtype, graded)
    x, y = solve_both(monkeypatch, a, b, "1MiB" if np.dtype(dtype).itemsize < 16 else "1536KiB")
    assert x.report["plan"]["tile"] < n  # out of core: the LU in panels
    assert np.array_equal(x.to_numpy(), y.to_numpy())
    assert x.report["condition_estimate"] == pytest.approx(y.report["condition_estimate"], rel=1e-12)
    # the factor's entries read once less (L and U: n^2 of them, the diagonal blocks twice)
    itemsize = np.dtype(dtype).itemsize
    assert y.report["bytes_read"] - x.report["bytes_read"] >= n * n * itemsize

