"""``precision="mixed"``'s default refinement solves a right-hand side beyond float32's range.

The float32 LU's triangular solves cast ``b`` (and each residual) to float32. Cast as it was, a column
near ``2^500`` became inf (NumPy's "overflow encountered in cast" leaked, and the solve was refused naming
float32's range, although ``x`` near ``2^500`` is well within float64's), and one near ``2^-500`` became
zeros: its ``x`` came back as zeros, silently, since the block's normwise backward error is decided by
the other columns. Each such column is now divided by a power of two before the cast and its solution
multiplied back (exact), in memory and out of core (``memory="64KiB"``: panels of 32 columns). Each column is an independent solve, so each must
meet :func:`support.tolerances.assert_solve`'s bound ``8 n eps kappa(A)`` (Higham 2002, Thm 7.2; mixed
precision refinement reaches float64's, Higham 2002, Thm 12.3) against LAPACK's solution of the same
column taken at scale 1 (the powers of two are exact)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import blocklin as bl
from support.tolerances import assert_solve


@pytest.mark.parametrize("memory", [None, "64KiB"], ids=["in-memory", "out-of-core"])
@pytest.mark.parametrize("powers", [(0.0, 500.0, 0.0), (0.0, -500.0, 0.0), (500.0, -500.0, 0.0)], ids=str)
def test_columns_beyond_float32_range_solved(powers, memory, tmp_path):
    rng = np.random.default_rng(5)
    n = 40
    a = rng.standard_normal((n, n)) + n * np.eye(n)
    b1 = rng.standard_normal((n, len(powers)))
    b = b1 * 2.0 ** np.array(powers)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no NumPy cast warning, nor any other
        x = bl.solve(a, b, precision="mixed", out=tmp_path / "x.zarr",
                     **({"memory": memory} if memory else {})).to_numpy()
    for j, p in enumerate(powers):
        assert_solve(np.ldexp(x[:, j], -int(p)), np.linalg.solve(a, b1[:, j]), a)


@pytest.mark.parametrize("memory", [None, "64KiB"], ids=["in-memory", "out-of-core"])
@pytest.mark.parametrize("rows", [(-300.0, -200.0), (200.0, 300.0)], ids=["R-b-near-2^250", "R-b-near-2^-250"])
def test_equilibrated_rhs_beyond_float32_range(rows, memory, tmp_path):
    """Rows of ``A`` graded over ``2^rows`` (equilibrated: ``R`` near ``2^-rows``) and ``b`` near 1, within
    float32's range; the LU panels eliminate ``R b``, near ``2^250`` or ``2^-250``, beyond it. Its range had
    been judged on ``b``: the panels cast ``R b`` to float32 unscaled, which overflowed (NumPy's warning leaked
    and the solve was refused as beyond float32's range, ``x`` near ``2^250`` being well within float64's) or
    flushed to zeros (``x0 = 0``, backward error 1, left for refinement to recover). ``x`` solves
    ``G x = b / d`` exactly (``A = d G``, ``d`` powers of two): :func:`support.tolerances.assert_solve`'s
    ``8 n eps kappa(G)`` per column; the first float32 solve's backward error is that of a float32 LU
    solve, ``O(n u_32)`` (Higham 2002, Thm 9.4: ``8 n u_32`` with this ``G``'s modest growth), not 1."""
    rng = np.random.default_rng(7)
    n = 64
    d = 2.0 ** np.round(np.linspace(*rows, n))[rng.permutation(n), None]
    g = rng.standard_normal((n, n)) + np.sqrt(n) * np.eye(n)
    b = rng.standard_normal((n, 2))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no NumPy cast warning, nor any other
        x = bl.solve(d * g, b, precision="mixed", out=tmp_path / "x.zarr", **({"memory": memory} if memory else {}))
    r = x.report
    assert r["equilibration"]["applied"]
    assert r["history"][0]["backward_error"] <= 8 * n * np.finfo(np.float32).eps, r["history"][0]
    x = x.to_numpy()
    for j in range(b.shape[1]):
        assert_solve(x[:, j], np.linalg.solve(g, b[:, j] / d[:, 0]), g)


#: The routes whose float32 solves are tile operations on a stored factor: an LU with more right-hand sides
#: than a panel is wide (``memory="64KiB"``: panels of 32 columns; 40 columns here), solved by row swaps and
#: two triangular solves, and the Cholesky of ``assume_a="pos"``, in memory and out of core.
STORED_FACTOR_ROUTES = {"lu-wider-than-a-panel": {"memory": "64KiB"}, "cholesky": {"assume_a": "pos"},
                        "cholesky-out-of-core": {"assume_a": "pos", "memory": "64KiB"}}


@pytest.mark.parametrize("route", list(STORED_FACTOR_ROUTES))
@pytest.mark.parametrize("power", [500.0, -500.0, -120.0, 120.0], ids=str)
def test_stored_factor_columns_beyond_float32_range_solved(route, power, tmp_path):
    """As above, on the routes that solve with the stored factor's triangular solves. Their tile tasks cast
    ``b`` (and each residual) to float32 as read: a column near ``2^500`` overflowed (NumPy's "overflow
    encountered in cast" leaked and the solve was refused), one near ``2^-500`` flushed to zeros and came back
    as ``x = 0`` under the block's small backward error, silently. A column near ``2^-120`` is within float32's
    range but its residuals, ``u_64`` times smaller, are not: their corrections were flushed. Each column is
    now scaled into the range by a power of two and its solution scaled back (exact), so each meets
    :func:`support.tolerances.assert_solve`'s ``8 n eps kappa(A)`` against LAPACK's solution at scale 1."""
    kw = STORED_FACTOR_ROUTES[route]
    rng = np.random.default_rng(11)
    n, k = 40, (40 if "lu" in route else 3)
    g = rng.standard_normal((n, n)) + n * np.eye(n)
    a = g @ g.T if kw.get("assume_a") == "pos" else g
    b1 = rng.standard_normal((n, k))
    powers = np.zeros(k)
    powers[1] = power
    b = b1 * 2.0 ** powers
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no NumPy cast warning, nor any other
        x = bl.solve(a, b, precision="mixed", out=tmp_path / "x.zarr", **kw)
    if "lu" in route:
        assert x.report["plan"]["tile"] < k, x.report["plan"]  # the stored LU's route, not the panels'
    x = x.to_numpy()
    for j in range(k):
        assert_solve(np.ldexp(x[:, j], -int(powers[j])), np.linalg.solve(a, b1[:, j]), a)
