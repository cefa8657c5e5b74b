"""Solves with a stored factor: ``blocklin.cho_solve`` and ``blocklin.lu_solve`` (SciPy's names and pairs),
and ``blocklin solve --factored``, against the factorization's own matrix (ported from SciPy's
``linalg/tests/test_decomp_cholesky.py::TestChoSolve`` and ``test_decomp_lu.py::TestLUSolve``).

Bound: the two triangular solves of a backward-stable factorization are backward stable
(``(A + E) x = b``, ``|E| <= gamma_cn |L| |U|``: Higham Thm 9.4 and 10.4), checked as a residual by
:func:`support.tolerances.assert_residual`; for LU the growth factor of the factorization multiplies it
(``||L|| ||U|| / ||A||``, passed as the constant).
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import scipy.linalg

import blocklin as bl
from blocklin.cli.main import main
from blocklin.errors import ParameterError
from support.tolerances import assert_residual

# 300 x 300 float64 (703 KiB): 1 MiB tiles it (several tiles per side), 256 MiB holds it in one.
BUDGETS = {"tiled": "1MiB", "one tile": "256MiB"}


def spd(n: int = 300, seed: int = 0) -> np.ndarray:
    a = np.random.default_rng(seed).standard_normal((n, n))
    return a @ a.T + n * np.eye(n)


def lu_growth(a: np.ndarray) -> float:
    """``||L|| ||U|| / ||A||`` of LAPACK's LU: what multiplies the LU solve's backward error."""
    p, l, u = scipy.linalg.lu(a)
    return float(np.linalg.norm(l) * np.linalg.norm(u) / np.linalg.norm(a))


@pytest.mark.parametrize("budget", list(BUDGETS))
@pytest.mark.parametrize("k", [None, 4], ids=["vector", "block"])
def test_cho_solve_with_a_stored_factor(tmp_path, budget, k):
    s = spd()
    rng = np.random.default_rng(1)
    b = rng.standard_normal(300) if k is None else rng.standard_normal((300, k))
    L = bl.cholesky(s, tmp_path / "L.zarr", memory=BUDGETS[budget])
    x = bl.cho_solve(str(tmp_path / "L.zarr"), b, memory=BUDGETS[budget])
    assert x.shape == (300, 1 if k is None else k) and x.report["method"] == "two tiled triangular solves"
    assert_residual(s, x.to_numpy(), b)
    # SciPy's pair, with an upper factor (A = U^T U) held in memory
    u = np.linalg.cholesky(s).T
    assert_residual(s, bl.cho_solve((u, False), b, memory=BUDGETS[budget]).to_numpy(), b)
    assert_residual(s, bl.cho_solve(L, b).to_numpy(), b)


@pytest.mark.parametrize("budget", list(BUDGETS))
def test_lu_solve_with_recorded_or_given_pivots(tmp_path, budget):
    a = np.random.default_rng(2).standard_normal((300, 300))
    b = np.random.default_rng(3).standard_normal((300, 3))
    F = bl.lu(a, tmp_path / "lu.zarr", memory=BUDGETS[budget])
    growth = lu_growth(a)
    for factor in (F, str(tmp_path / "lu.zarr")):  # the pivots from the report, then from the store
        assert_residual(a, bl.lu_solve(factor, b, memory=BUDGETS[budget]).to_numpy(), b, const=4.0 * growth)
    lu, piv = scipy.linalg.lu_factor(a)
    assert_residual(a, bl.lu_solve((lu, piv), b, memory=BUDGETS[budget]).to_numpy(), b, const=4.0 * growth)
    assert_residual(a, bl.lu_solve(lu, b[:, 0], piv=piv).to_numpy(), b[:, 0], const=4.0 * growth)


def test_refusals_name_the_fix():
    lu, piv = scipy.linalg.lu_factor(np.random.default_rng(4).standard_normal((20, 20)))
    with pytest.raises(ParameterError, match="piv: is needed for factors blocklin.lu did not write.*Fix: pass piv="):
        bl.lu_solve(lu, np.ones(20))
    with pytest.raises(ParameterError, match=r"piv: must hold n = 20 row indices in \[0, 20\)"):
        bl.lu_solve(lu, np.ones(20), piv=piv + 5)
    with pytest.raises(ParameterError, match="c: must be the factor or SciPy's pair"):
        bl.cho_solve((lu, True, 1), np.ones(20))


@pytest.mark.parametrize("budget", list(BUDGETS))
@pytest.mark.parametrize("where", [(40, 40), (250, 7)], ids=["diagonal", "below"])
def test_nonfinite_factor_is_refused_by_its_parameter(tmp_path, budget, where):
    """NaN/Inf in a factor is refused naming SciPy's parameter (``c``, ``lu``) and the position; it had
    named ``t``, solve_triangular's parameter, which neither function takes (found by a randomized search)."""
    from blocklin.errors import NonFiniteError

    a = spd()
    lower = np.linalg.cholesky(a)
    lu, piv = scipy.linalg.lu_factor(a)
    lower[where], lu[where] = np.nan, -np.inf
    at = rf"at \[{where[0]}, {where[1]}\]"
    with pytest.raises(NonFiniteError, match=rf"^c: must be finite.*{at}"):
        bl.cho_solve((lower, True), np.ones(300), memory=BUDGETS[budget])
    with pytest.raises(NonFiniteError, match=rf"^lu: must be finite.*{at}"):
        bl.lu_solve((lu, piv), np.ones(300), memory=BUDGETS[budget])
    with pytest.raises(NonFiniteError, match=rf"^t: must be finite.*{at}"):
        bl.solve_triangular(lower, np.ones(300), lower=True, memory=BUDGETS[budget])


def test_cli_solves_with_a_stored_factor(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    s = spd(120)
    a = np.random.default_rng(5).standard_normal((120, 120))
    b = np.random.default_rng(6).standard_normal((120, 2))
    bl.from_array(s, "S.zarr"), bl.from_array(a, "A.zarr"), bl.from_array(b, "b.zarr")
    assert main(["factor", "cholesky", "S.zarr", "-o", "L.zarr"]) == 0
    assert main(["factor", "lu", "A.zarr", "-o", "LU.zarr"]) == 0
    capsys.readouterr()
    assert main(["solve", "L.zarr", "b.zarr", "-o", "x.zarr", "--factored", "cholesky", "--json"]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["factored"] == "cholesky"
    assert_residual(s, bl.open("x.zarr").to_numpy(), b)
    assert main(["solve", "LU.zarr", "b.zarr", "-o", "y.zarr", "--factored", "lu"]) == 0
    assert_residual(a, bl.open("y.zarr").to_numpy(), b, const=4.0 * lu_growth(a))
    assert main(["solve", "LU.zarr", "b.zarr", "-o", "z.zarr", "--factored", "lu", "--lambda", "1"]) == 1
    assert "--factored: solves with the given factor only" in capsys.readouterr().err
    assert not (tmp_path / "z.zarr").exists()
