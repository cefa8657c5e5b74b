"""CLI: blocklin factor cholesky and blocklin solve --assume-a pos."""

from __future__ import annotations

import json

import numpy as np
import scipy.linalg as sl

import blocklin as bl
from blocklin.cli.main import main
from support.tolerances import assert_solve


def _spd(n):
    g = np.random.default_rng(0).standard_normal((n, n))
    return g @ g.T / n + np.eye(n)


def test_factor_cholesky_json(tmp_path, capsys):
    a = _spd(70)
    pa = bl.from_array(a, tmp_path / "a.zarr", chunks=(32, 32)).path
    out = tmp_path / "l.zarr"
    assert main(["factor", "cholesky", pa, "-o", str(out), "--json", "--scheduler", "sync"]) == 0
    s = json.loads(capsys.readouterr().out)
    assert s["output"] == str(out) and s["tasks"] == 6 and s["tile"] == 32 and s["lower"]
    np.testing.assert_allclose(bl.open(out)[...], sl.cholesky(a, lower=True), rtol=0, atol=1e-12)
    assert main(["factor", "cholesky", pa, "-o", str(tmp_path / "u.zarr"), "--upper", "--resume"]) == 0
    np.testing.assert_allclose(bl.open(tmp_path / "u.zarr")[...], sl.cholesky(a), rtol=0, atol=1e-12)


def test_factor_cholesky_explain_and_errors(tmp_path, capsys):
    pa = bl.from_array(_spd(70), tmp_path / "a.zarr", chunks=(32, 32)).path
    assert main(["factor", "cholesky", pa, "-o", str(tmp_path / "l.zarr"), "--explain", "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)["plan"]
    assert plan["tile"] == 32 and plan["tiles"] == 3
    assert not (tmp_path / "l.zarr").exists()
    bad = bl.from_array(-np.eye(8), tmp_path / "bad.zarr").path
    rc = main(["factor", "cholesky", bad, "-o", str(tmp_path / "x.zarr")])
    err = capsys.readouterr().err
    assert rc != 0 and "positive definite" in err and "assume_a='gen'" in err


def test_solve_assume_pos(tmp_path, capsys):
    a = _spd(50)
    b = np.arange(100.0).reshape(50, 2)
    pa = bl.from_array(a, tmp_path / "a.zarr").path
    pb = bl.from_array(b, tmp_path / "b.zarr").path
    assert main(["solve", pa, pb, "-o", str(tmp_path / "x.zarr"), "--assume-a", "pos", "--json"]) == 0
    s = json.loads(capsys.readouterr().out)
    assert s["method"] == "cholesky" and s["backward_error"] <= 50**0.5 * np.finfo(float).eps
    assert_solve(bl.open(tmp_path / "x.zarr")[...], np.linalg.solve(a, b), a)


def test_factor_lu_json(tmp_path, capsys):
    a = np.random.default_rng(1).standard_normal((50, 50))
    pa = bl.from_array(a, tmp_path / "a.zarr", chunks=(32, 32)).path
    out = tmp_path / "lu.zarr"
    assert main(["factor", "lu", pa, "-o", str(out), "--json", "--memory", "1MiB"]) == 0
    s = json.loads(capsys.readouterr().out)
    assert s["output"] == str(out) and s["growth_factor"] >= 1.0
    m = bl.open(out)
    lu_ref, piv_ref = sl.lu_factor(a)
    np.testing.assert_allclose(m[...], lu_ref, rtol=0, atol=1e-12)
    np.testing.assert_array_equal(m.provenance["pivots"], piv_ref)
    assert main(["factor", "lu", pa, "-o", str(out), "--explain", "--memory", "120KiB"]) == 0
    assert "2 column panels of 32" in capsys.readouterr().out  # 1 panel of 50 does not fit 120 KiB
    assert main(["factor", "lu", pa, "-o", str(out), "--explain"]) == 0
    assert "1 column panels of 50" in capsys.readouterr().out  # as wide as the budget allows


def test_upper_factor_solves_with_its_recorded_triangle(tmp_path, capsys):
    """``blocklin factor cholesky --upper`` writes ``U`` (its lower triangle zeros); ``solve --factored
    cholesky`` (which has no triangle option) and ``cho_solve(U, b)`` had read it as ``L`` and
    returned a wrong ``x`` (relative residual 0.07) without a word. The triangle blocklin.cholesky
    recorded is used now, and an explicit ``lower=`` that contradicts it is refused, as is an LU
    output given to the Cholesky solve. ``x`` is checked
    by its backward error (Higham 2002, Thm. 10.4: ``xPOTRS`` is backward stable)."""
    import pytest

    from blocklin.errors import ParameterError
    from support.tolerances import assert_residual

    a = _spd(37)
    b = np.random.default_rng(1).standard_normal((37, 3))
    pa = bl.from_array(a, tmp_path / "a.zarr", chunks=(8, 8)).path
    pb = bl.from_array(b, tmp_path / "b.zarr", chunks=(8, 3)).path
    u = tmp_path / "u.zarr"
    assert main(["factor", "cholesky", pa, "-o", str(u), "--upper", "--scheduler", "sync"]) == 0
    assert main(["solve", str(u), pb, "-o", str(tmp_path / "x.zarr"), "--factored", "cholesky",
                 "--scheduler", "sync"]) == 0
    assert_residual(a, bl.open(tmp_path / "x.zarr")[...], b)
    assert_residual(a, bl.cho_solve(str(u), b, scheduler="sync")[...], b)
    assert_residual(a, bl.cho_solve(bl.open(u), b, lower=False, scheduler="sync")[...], b)
    with pytest.raises(ParameterError, match=r"lower: .*holds U \(upper\).*lower=True.*pass lower=False"):
        bl.cho_solve((str(u), True), b)
    lu = tmp_path / "lu.zarr"  # packed LU factors read as a Cholesky factor: refused too
    assert main(["factor", "lu", pa, "-o", str(lu), "--scheduler", "sync"]) == 0
    capsys.readouterr()
    assert main(["solve", str(lu), pb, "-o", str(tmp_path / "y.zarr"), "--factored", "cholesky"]) != 0
    err = capsys.readouterr().err
    assert "c: must be a Cholesky factor" in err and "--factored lu" in err and not (tmp_path / "y.zarr").exists()
