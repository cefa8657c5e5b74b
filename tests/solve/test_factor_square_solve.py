"""Square systems through solve(): LU (assume_a='gen'), 'sym' (Cholesky, else LU), mixed precision."""

from __future__ import annotations

import json
import re
import warnings

import numpy as np
import pytest
import scipy.linalg as sl

import blocklin as bl
from blocklin import errors
from blocklin.cli.main import main
from blocklin.errors import (ConvergenceError, NotPositiveDefiniteError, NotSymmetricError, ParameterError,
                             SingularMatrixError)
from support.tolerances import assert_residual, assert_solve


def _eta(a, x, b):
    """Normwise backward error ||b - A x||_F / (||A||_F ||x||_F + ||b||_F), in float64."""
    a, x, b = (np.asarray(v, dtype=np.float64) for v in (a, x, b))
    return np.linalg.norm(b - a @ x) / (np.linalg.norm(a) * np.linalg.norm(x) + np.linalg.norm(b))


def _singular_leading_block(n):
    a = np.zeros((n, n))
    h = n // 2
    a[:h, h:] = np.eye(h)
    a[h:, :h] = np.eye(n - h)
    return a + 1e-3 * np.random.default_rng(0).standard_normal((n, n))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("n,memory", [(1, "1MiB"), (13, "1MiB"), (97, "256KiB"), (128, "256KiB")],
                         ids=["1", "13-one-tile", "97-prime-many-tiles", "128-tile-multiple"])
def test_gen_square_solve_is_lu_and_matches_scipy(dtype, n, memory):
    rng = np.random.default_rng(n)
    a = rng.standard_normal((n, n)).astype(dtype)
    b = rng.standard_normal((n, 2)).astype(dtype)
    x = bl.solve(a, b, memory=memory, scheduler="sync")
    r = x.report
    assert r["method"] == "lu" and "square a" in r["method_reason"] and x.dtype == dtype
    eps = np.finfo(dtype).eps
    # refined to the target sqrt(n) u; the stored x's backward error (recomputed in float64) is that
    # up to the rounding of x itself (a factor 4)
    assert r["backward_error"] <= np.sqrt(n) * eps
    assert _eta(a, x[...], b) <= 4 * np.sqrt(n) * eps
    ref = sl.solve(a.astype(np.float64), b.astype(np.float64))
    # forward error <= 2 cond(A) * backward error (Higham 2002, (7.2))
    cond = np.linalg.cond(a.astype(np.float64))
    assert np.linalg.norm(x[...] - ref) <= 2 * cond * 4 * np.sqrt(n) * eps * np.linalg.norm(ref)
    np.testing.assert_allclose(r["residual_norm"], np.linalg.norm(b - a.astype(np.float64) @ x[...], axis=0),
                               rtol=0.5, atol=4 * eps * np.linalg.norm(a) * np.linalg.norm(x[...]))


@pytest.mark.parametrize("make", [_singular_leading_block, lambda n: np.eye(n)[np.random.default_rng(2).permutation(n)],
                                  lambda n: np.triu(np.ones((n, n))) + np.diag(np.arange(n, dtype=float))],
                         ids=["singular-leading-block", "permutation", "upper-unit-dominant"])
def test_gen_solve_pivots_where_block_pivoting_fails(make):
    a = make(70)
    b = np.random.default_rng(1).standard_normal((70, 1))
    x = bl.solve(a, b, memory="128KiB", scheduler="sync")  # panels of 32: the leading block is singular
    assert x.report["method"] == "lu" and x.report["plan"]["tiles"] > 1
    assert_residual(a, x[...], b)
    assert_solve(x[...], sl.solve(a, b), a)


def test_mixed_precision_reaches_double_backward_error():
    rng = np.random.default_rng(3)
    n = 90
    a = rng.standard_normal((n, n)) + 5 * np.eye(n)
    b = rng.standard_normal((n, 3))
    x = bl.solve(a, b, precision="mixed", memory="256KiB", scheduler="sync")
    r = x.report
    assert r["precision"] == "mixed" and r["factor_dtype"] == "float32" and x.dtype == np.float64
    assert r["refine_steps"] >= 1 and r["backward_error"] <= np.sqrt(n) * np.finfo(np.float64).eps
    assert _eta(a, x[...], b) <= 4 * np.sqrt(n) * np.finfo(np.float64).eps
    assert [h["step"] for h in r["history"]] == list(range(r["refine_steps"] + 1))
    spd = a @ a.T + n * np.eye(n)
    y = bl.solve(spd, b, assume_a="pos", precision="mixed", memory="256KiB")
    assert y.report["method"] == "cholesky" and y.report["backward_error"] <= np.sqrt(n) * np.finfo(float).eps


def test_mixed_precision_refuses_when_it_cannot_converge(tmp_path):
    rng = np.random.default_rng(4)
    n = 60
    u, _ = np.linalg.qr(rng.standard_normal((n, n)))
    v, _ = np.linalg.qr(rng.standard_normal((n, n)))
    ill = u @ np.diag(np.logspace(0, -10, n)) @ v.T  # cond 1e10: cond * u_32 >> 1
    # plain refinement (the default switches to GMRES-IR where it stalls, which reaches tol for this A)
    with pytest.raises(ConvergenceError, match="precision='double'"):
        bl.solve(ill, np.ones(n), precision="mixed", refinement="plain", out=tmp_path / "x.zarr")
    assert not (tmp_path / "x.zarr").exists()
    with pytest.raises(ParameterError, match="float64"):
        bl.solve(np.eye(4, dtype=np.float32), np.ones(4, dtype=np.float32), precision="mixed")
    with pytest.raises(ParameterError, match="square systems"):
        bl.solve(np.ones((6, 3)), np.ones(6), precision="mixed")


def test_sym_uses_cholesky_when_positive_definite_else_lu():
    rng = np.random.default_rng(5)
    n = 75
    g = rng.standard_normal((n, n))
    b = rng.standard_normal((n, 1))
    spd = g @ g.T + n * np.eye(n)
    x = bl.solve(spd, b, assume_a="sym", memory="256KiB")
    assert x.report["method"] == "cholesky"
    assert_solve(x[...], sl.solve(spd, b), spd)
    indefinite = g + g.T
    y = bl.solve(indefinite, b, assume_a="sym", memory="256KiB")
    assert y.report["method"] == "lu" and "<= 0" in y.report["method_reason"]
    np.testing.assert_allclose(y[...], sl.solve(indefinite, b, assume_a="sym"), rtol=1e-8)
    # positive diagonal but indefinite: the Cholesky pivot fails, LU takes over
    late = np.diag(np.full(n, 2.0))
    late[n - 1, 0] = late[0, n - 1] = 3.0
    z = bl.solve(late, b, assume_a="sym", memory="256KiB")
    assert z.report["method"] == "lu" and "Cholesky pivot" in z.report["method_reason"]
    assert_solve(z[...], sl.solve(late, b), late)


def test_least_squares_routes_stay_where_asked():
    rng = np.random.default_rng(6)
    a = rng.standard_normal((40, 40))
    b = rng.standard_normal((40, 1))
    assert bl.solve(a, b, method="qr").report["method"] == "qr"
    assert bl.solve_plan(a, b).operation == "lu" == bl.solve(a, b, explain=True).operation
    assert bl.solve(a, b, lam=0.1).report["method"] != "lu"
    sing = np.ones((20, 20))
    with pytest.raises(SingularMatrixError, match="lam"):
        bl.solve(sing, np.ones(20))
    with pytest.raises(ParameterError, match="lam"):
        bl.solve(a, b, assume_a="sym", lam=0.5)


def test_gen_solve_identical_bits_across_schedulers(tmp_path):
    a = bl.from_array(np.random.default_rng(7).standard_normal((90, 90)), tmp_path / "a.zarr", chunks=(32, 32))
    b = np.random.default_rng(8).standard_normal((90, 2))
    xs = [bl.solve(a, b, scheduler=s, workers=2)[...] for s in ("sync", "threads", "processes")]
    for x in xs[1:]:
        np.testing.assert_array_equal(x, xs[0])


def test_cli_solve_square(tmp_path, capsys):
    rng = np.random.default_rng(9)
    a = bl.from_array(rng.standard_normal((64, 64)) + 8 * np.eye(64), tmp_path / "a.zarr", chunks=(32, 32))
    b = bl.from_array(rng.standard_normal((64, 1)), tmp_path / "b.zarr", chunks=(32, 1))
    assert main(["solve", a.path, b.path, "-o", str(tmp_path / "x.zarr"), "--precision", "mixed", "--json",
                 "--no-progress"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["method"] == "lu" and out["precision"] == "mixed" and out["backward_error"] <= 8 * 2.2e-16
    assert_solve(bl.open(tmp_path / "x.zarr")[...], sl.solve(a[...], b[...]), a[...], dtype=np.float64)
    sym = bl.from_array(a[...] + a[...].T, tmp_path / "s.zarr", chunks=(32, 32))
    assert main(["solve", sym.path, b.path, "-o", str(tmp_path / "y.zarr"), "--assume-a", "sym", "--json",
                 "--no-progress"]) == 0
    assert json.loads(capsys.readouterr().out)["method"] in ("cholesky", "lu")


def test_gen_solve_with_more_right_hand_sides_than_a_panel():
    """Up to a panel's width of columns the solve streams the stored panels (BlockOps.lu_solve); more
    go through the packed factor and the tile triangular solves: both against SciPy."""
    rng = np.random.default_rng(11)
    n = 100
    a = rng.standard_normal((n, n))
    b = rng.standard_normal((n, 70))
    for cols in (5, 70):
        x = bl.solve(a, b[:, :cols], memory="256KiB", scheduler="sync")
        assert (cols <= x.report["plan"]["tile"]) == (cols == 5)
        # refined to sqrt(n) u; the solution error is then within cond(A) times that
        assert x.report["backward_error"] <= np.sqrt(n) * np.finfo(float).eps
        assert _eta(a, x[...], b[:, :cols]) <= 4 * np.sqrt(n) * np.finfo(float).eps
        np.testing.assert_allclose(x[...], sl.solve(a, b[:, :cols]), rtol=0,
                                   atol=1e-10 * np.abs(sl.solve(a, b[:, :cols])).max())


def _spy_lu_solves(monkeypatch):
    """The ``forward`` flag of every LU solve task (True: the solve also reads L back)."""
    import blocklin.linalg.factor.lu_panels as bo

    calls, real = [], bo.lu_solve_task

    def spy(spec, pivots, forward=True):
        calls.append(forward)
        return real(spec, pivots, forward)

    monkeypatch.setattr(bo, "lu_solve_task", spy)
    return calls


@pytest.mark.parametrize("dtype,precision", [(np.float64, "double"), (np.float32, "double"), (np.float64, "mixed")])
def test_gen_solve_forward_substitution_runs_in_the_panels(monkeypatch, dtype, precision):
    """The first solve is the back substitution alone (the panels eliminated b as they were factored: Gaussian
    elimination on [A | b]); refinement steps solve with the stored factors, forward and back."""
    calls = _spy_lu_solves(monkeypatch)
    rng = np.random.default_rng(12)
    n = 150
    a = (rng.standard_normal((n, n)) + (5 * np.eye(n) if precision == "mixed" else 0)).astype(dtype)
    b = rng.standard_normal((n, 3)).astype(dtype)
    x = bl.solve(a, b, memory="256KiB", scheduler="sync", precision=precision)
    r = x.report
    assert r["plan"]["tiles"] > 2
    # and none for the condition estimate: its Gaussian right-hand side rode the panels and the first back
    # substitution as one more column (tests/solve/test_condition_rider.py)
    assert calls == [False] + [True] * r["refine_steps"]
    if precision == "mixed":
        assert r["refine_steps"] >= 1
    else:  # the fused forward substitution alone reaches the target: a wrong one would need refinement steps
        assert r["refine_steps"] == 0 and r["history"][0]["backward_error"] <= np.sqrt(n) * np.finfo(dtype).eps
    eps = np.finfo(x.dtype).eps
    assert r["backward_error"] <= np.sqrt(n) * eps
    # the stored x's backward error, recomputed in float64: the target up to the rounding of x (a factor 4)
    assert _eta(a, x[...], b) <= 4 * np.sqrt(n) * eps
    ref = sl.solve(a.astype(np.float64), b.astype(np.float64))
    cond = np.linalg.cond(a.astype(np.float64))  # forward error <= 2 cond(A) backward error (Higham (7.2))
    assert np.linalg.norm(x[...] - ref) <= 2 * cond * 4 * np.sqrt(n) * eps * np.linalg.norm(ref)


def test_gen_solve_forward_substitution_only_where_it_fits_the_panel_budget(monkeypatch):
    """Right-hand sides that do not fit beside a panel (lu_rhs_fits) are solved after the factorization,
    forward and back: the same solution up to rounding."""
    import blocklin.linalg.solve.square as sq
    from blocklin.plan.factor import lu_panel_bytes, lu_rhs_fits

    # after its factorization a panel frees its update and sub-panel buffers: n x k must fit there
    n, w = 65536, 1024
    assert lu_rhs_fits(n, w, 1, 8, 8) and not lu_rhs_fits(n, w, w, 8, 8)
    free = lu_panel_bytes(n, w, 8) - n * w * 8
    k = max(j for j in range(1, w + 1) if lu_rhs_fits(n, w, j, 8, 8))
    assert (3 * n * k + 3 * w * k) * 8 <= free < (3 * n + 3 * w) * (k + 1) * 8  # y and its saved bytes
    assert not lu_rhs_fits(n, w, k, 4, 8)  # the float64 rows read before the cast to float32 count too
    rng = np.random.default_rng(13)
    m = 120
    a, b = rng.standard_normal((m, m)), rng.standard_normal((m, 4))
    xs = []
    for fits in (True, False):
        calls = _spy_lu_solves(monkeypatch)
        if not fits:
            monkeypatch.setattr(sq, "lu_rhs_fits", lambda *args: False)
        x = bl.solve(a, b, memory="256KiB", scheduler="sync")
        assert calls[0] == (not fits)
        assert x.report["backward_error"] <= np.sqrt(m) * np.finfo(float).eps
        xs.append(x[...])
        monkeypatch.undo()
    # both refined to sqrt(n) eps backward error: within cond(A) times that of each other and of SciPy
    ref = sl.solve(a, b)
    tol = 2 * np.linalg.cond(a) * 4 * np.sqrt(m) * np.finfo(float).eps * np.linalg.norm(ref)
    for x in xs:
        assert np.linalg.norm(x - ref) <= tol


def test_gen_solve_resumes_inside_the_panels_forward_substitution(tmp_path, monkeypatch):
    """Killed after some panels (their eliminated right-hand sides kept for the rerun), the rerun continues
    from the last finished panel and gives the bits of an uninterrupted run."""
    import os

    import blocklin.linalg.factor.lu_panels as bo

    rng = np.random.default_rng(14)
    a = bl.from_array(rng.standard_normal((160, 160)), tmp_path / "a.zarr", chunks=(32, 32))
    b = bl.from_array(rng.standard_normal((160, 2)), tmp_path / "b.zarr", chunks=(32, 2))
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    kw = dict(memory="256KiB", scheduler="sync", temp_dir=str(tmp))
    ref = bl.solve(a.path, b.path, out=str(tmp_path / "ref.zarr"), **kw)
    assert ref.report["plan"]["tiles"] >= 4
    real, ran = bo._lu_forward_rhs, []

    def dies_at_panel_3(spec, j, *args):
        if j == 3:
            raise KeyboardInterrupt
        ran.append(j)
        return real(spec, j, *args)

    monkeypatch.setattr(bo, "_lu_forward_rhs", dies_at_panel_3)
    with pytest.raises(KeyboardInterrupt):
        bl.solve(a.path, b.path, out=str(tmp_path / "x.zarr"), resume=True, **kw)
    monkeypatch.setattr(bo, "_lu_forward_rhs", lambda spec, j, *args: (ran.append(j), real(spec, j, *args))[1])
    ran.clear()
    x = bl.solve(a.path, b.path, out=str(tmp_path / "x.zarr"), resume=True, **kw)
    assert x.report["resumed"] and ran[0] == 3  # panels 0-2 were not run again
    np.testing.assert_array_equal(x[...], ref[...])
    assert os.listdir(tmp) == []


def test_gen_solve_vector_stores_are_not_padded_to_tiles():
    """x is chunked (tile, k): a chunk as wide as a tile would be padded to tile x tile on disk."""
    x = bl.solve(np.random.default_rng(15).standard_normal((100, 100)), np.ones(100), memory="256KiB")
    assert x.chunks[1] == 1 and x.chunks[0] > 1


def _tiny_system(dtype, e, n=40, seed=5):
    """A well-conditioned ``n x n`` system, ``max |A| = 2^e`` (entries near float32's bottom for ``e`` near
    -130), ``b`` near 1: ``x`` is about ``2^-e``."""
    rng = np.random.default_rng(seed)
    q, _ = np.linalg.qr(rng.standard_normal((n, n)))
    a = q + 0.1 * rng.standard_normal((n, n))
    if np.dtype(dtype).kind == "c":
        a = a + 0.3j * rng.standard_normal((n, n))
    a = a / np.abs(a).max()
    return np.ldexp(1.0, e) * a, rng.standard_normal((n, 1))


@pytest.mark.parametrize("dtype", [np.float32, np.complex64])
@pytest.mark.parametrize("memory", ["64MiB", "512KiB"])
def test_float32_solution_beyond_its_range_is_named_not_singular(dtype, memory, tmp_path):
    """float32 data near 1e-39 (a well-conditioned A times 2^-130) has x near 1e39, past float32's 3.4e38:
    the substitutions overflow. That had been refused as a singular A; the refusal names the range, the
    size and the fix (float64, or A scaled by a power of two), and the fix's float64 solve is right."""
    a64, b64 = _tiny_system(dtype, -130, n=40 if memory == "64MiB" else 160)
    a = bl.from_array(a64.astype(dtype), tmp_path / "a.zarr", chunks=(32, 32))
    b = bl.from_array(b64.astype(dtype), tmp_path / "b.zarr", chunks=(32, 1))
    with pytest.raises(ParameterError, match=r"a: must give a solution x within float32's range.*max \|x\| about "
                       r"max \|b\| / min \|u_ii\| = [0-9.]+e\+(39|40).*not singular.*Fix: solve in "
                       r"(float64|complex128).*2\.0\*\*1[23][0-9]") as err:
        bl.solve(a, b, memory=memory)
    assert not isinstance(err.value, SingularMatrixError)
    wide = np.complex128 if np.dtype(dtype).kind == "c" else np.float64
    a_w, b_w = a[...].astype(wide), b[...].astype(wide)
    x = bl.solve(a_w, b_w, memory=memory).to_numpy()
    assert np.abs(x).max() > np.finfo(np.float32).max  # it is the range: float64 holds x
    assert_solve(x, sl.solve(a_w, b_w), a_w, dtype=wide)


@pytest.mark.parametrize("dtype", [np.float32, np.complex64])
def test_singular_float32_data_near_its_bottom_is_still_named_singular(dtype):
    """Two equal rows (an exact zero pivot) at the same scale stay a singular A."""
    a, b = _tiny_system(dtype, -130)
    a[7] = a[3]
    with pytest.raises(SingularMatrixError, match="singular"):
        bl.solve(a.astype(dtype), b.astype(dtype), memory="64MiB")


@pytest.mark.parametrize("dtype", [np.float32, np.complex64])
@pytest.mark.parametrize("e", [126, 127])
def test_float32_data_near_its_top_is_solved_or_names_the_lu_growth(dtype, e):
    """Entries near 1.7e38: the elimination's growth may overflow float32 (a first panel that overflowed to
    NaN had read as max |U| = 0 with an exact zero pivot: "A is singular"). Solved right, or refused naming
    A's LU factors and the power of two whose scaling of A and b (exact: x unchanged) solves; x (near
    1e-38, partly subnormal) within assert_solve's bound either way."""
    a64, b64 = _tiny_system(dtype, e)
    a, b = a64.astype(dtype), b64.astype(dtype)
    wide = np.complex128 if np.dtype(dtype).kind == "c" else np.float64
    ref = sl.solve(a.astype(wide), b.astype(wide))
    p = 0
    try:
        x = bl.solve(a, b, memory="64MiB").to_numpy()
    except ParameterError as err:
        assert re.search(r"a: must keep its LU factors within (float32|complex64)'s range.*max \|U\| = (inf|nan).*"
                         r"2\.0\*\*-\d+ \(exact: x is unchanged\)", str(err)), str(err)
        p = int(str(err).split("2.0**-")[1].split(" ")[0])
        x = bl.solve(np.ldexp(1.0, -p) * a, np.ldexp(1.0, -p) * b, memory="64MiB").to_numpy()
    assert_solve(x, ref, np.ldexp(1.0, -p) * a.astype(wide), dtype=dtype)


def test_mixed_precision_of_data_near_float32s_bottom_names_the_cast(tmp_path):
    """float64 data near 1e-41 (``precision="mixed"``): its float32 cast is subnormal, the float32
    substitutions overflow; refused naming the cast (it had been a singular A)."""
    a, b = _tiny_system(np.float64, -136)
    with pytest.raises(ParameterError, match=r"precision: a float32 factorization.*flush them to zero.*"
                       r"Fix: pass precision='double'"):
        bl.solve(a, b, precision="mixed", memory="64MiB")
    x = bl.solve(a, b, memory="64MiB").to_numpy()  # the fix
    assert_solve(x, sl.solve(a, b), a, dtype=np.float64)


@pytest.mark.parametrize("memory", ["64MiB", "256KiB"])
@pytest.mark.parametrize("line", ["row", "column"])
def test_mixed_precision_of_a_line_its_cast_would_flush_is_equilibrated(line, memory):
    """float64 data whose one row (or column) is ``2^-660`` times the others: the float32 cast of
    ``precision="mixed"`` flushed it to zero and the factorization met a zero pivot, refused as a singular
    A, then named with the line and the power of two that scales it. The equilibration (LAPACK's rule:
    ROWCND or COLCND near ``2^-660``) now applies that scaling itself: solved to the float64 bound."""
    rng = np.random.default_rng(0)
    n = 50
    a = rng.standard_normal((n, n)) + 5 * np.eye(n)
    b = rng.standard_normal(n)
    if line == "row":
        a[7] *= 2.0 ** -660
        b[7] *= 2.0 ** -660
    d = np.ones(n)
    d[7] = 2.0 ** 660  # the scaling, exact
    # checked on the well-scaled system (a column's scaling scales x's entry 8 by 2^660: compared as y = x / d)
    if line == "row":
        scaled, bs, back = d[:, None] * a, d * b, np.ones(n)
    else:
        a[:, 7] *= 2.0 ** -660
        scaled, bs, back = a * d, b, d
    ref = sl.solve(scaled, bs)
    x = bl.solve(a, b, precision="mixed", memory=memory)
    assert x.report["equilibration"]["applied"] and x.report["factor_dtype"] == "float32"
    assert_solve(x.to_numpy().ravel() / back, ref, scaled, dtype=np.float64)
    assert_solve(bl.solve(a, b, memory=memory).to_numpy().ravel() / back, ref, scaled, dtype=np.float64)


@pytest.mark.parametrize("memory", ["64MiB", "256KiB"])
def test_mixed_precision_cholesky_of_a_line_its_cast_flushes_names_it(memory):
    """A positive definite float64 ``D A D`` whose row and column 8 are ``2^-330`` times the others (its
    diagonal entry ``2^-660`` times): the float32 cast of ``precision="mixed"`` flushes that row and column
    to zero, and the Cholesky's pivot 0 had been refused as an ``A`` not positive definite (fix: a ridge, or
    assume_a='gen'). It is named as the LU's flushed line is, with a fix that keeps ``A`` symmetric; both
    fixes solve it."""
    rng = np.random.default_rng(0)
    n = 50
    g = rng.standard_normal((n, n))
    base = g @ g.T / n + 5 * np.eye(n)
    d = np.ones(n)
    d[7] = 2.0 ** -330
    a, b = d[:, None] * base * d, d * rng.standard_normal(n)
    with pytest.raises(ParameterError, match=r"precision: a float32 factorization needs every row and column.*"
                       r"got row and column 8 of A: max \|a\| = .*e-10\d.*Fix: pass precision='double', or scale "
                       r"row and column 8 of a and entry 8 of b by 2\.0\*\*33\d") as refused:
        bl.solve(a, b, assume_a="pos", precision="mixed", memory=memory)
    back = np.ones(n)  # the scaling fix the refusal names, exact (compared on the scaled system, y = x / back)
    back[7] = 2.0 ** int(re.search(r"by 2\.0\*\*(\d+)", str(refused.value)).group(1))
    scaled, bs = back[:, None] * a * back, back * b
    ref = sl.solve(scaled, bs, assume_a="pos")
    assert_solve(bl.solve(a, b, assume_a="pos", memory=memory).to_numpy().ravel() / back, ref, scaled,
                 dtype=np.float64)
    assert_solve(bl.solve(scaled, bs, assume_a="pos", precision="mixed", memory=memory).to_numpy().ravel(), ref,
                 scaled, dtype=np.float64)


def test_mixed_precision_cholesky_of_a_diagonal_that_underflowed_stays_indefinite():
    """``D A D`` with ``d_8 = 2^-600``: ``a_88`` underflows to 0 in float64 itself, so the matrix as given is
    not positive definite (a zero diagonal beside nonzero entries); its flushed line is not named as the
    cause (the fix it names would not hold), the Cholesky's error stands."""
    rng = np.random.default_rng(1)
    n = 50
    g = rng.standard_normal((n, n))
    a = g @ g.T / n + np.eye(n)
    d = np.ones(n)
    d[7] = 2.0 ** -600
    a = d[:, None] * a * d[None, :]
    assert a[7, 7] == 0 and np.abs(a[7]).max() > 0
    with pytest.raises(NotPositiveDefiniteError, match=r"a: must be symmetric positive definite"):
        bl.solve(a, rng.standard_normal(n), assume_a="pos", precision="mixed", memory="256KiB")


@pytest.mark.parametrize("memory", ["64MiB", "256KiB"])
@pytest.mark.parametrize("eb", [-664, -200])
def test_mixed_plain_refinement_of_a_residual_its_cast_flushes_names_it(eb, memory):
    """float64 A near 1, b near 2^-664 or 2^-200 (found by a randomized search): the float32 solves of plain
    refinement flushed b below float32's range (x_0 = 0, and every residual is b), so no step moved
    x; that had been refused as "A is too ill-conditioned". The LU's solves and the Cholesky's scale each
    column beyond the range by a power of two (``lu_panels.rhs_exponents``): plain refinement solves it
    (x is 2^eb times the solution of A y = b), as GMRES-IR does."""
    a, b = _tiny_system(np.float64, 0)
    spd = a @ a.T + np.eye(a.shape[0])
    for a, kw in ((spd, {"assume_a": "pos", "refinement": "plain"}), (spd, {"assume_a": "pos"}), (a, {}),
                  (a, {"refinement": "plain"})):
        x = bl.solve(a, np.ldexp(b, eb), precision="mixed", memory=memory, **kw)
        y = np.ldexp(x.to_numpy(), -eb)  # exact
        assert_residual(a, y, b, dtype=np.float64)
        assert_solve(y, sl.solve(a, b), a, dtype=np.float64)


def test_mixed_precision_of_a_b_beyond_float32s_range_solved():
    """float64 A near 1 with b near 2^664 (found by a randomized search): the float32 solves of the
    Cholesky's plain refinement overflowed, refused naming x's range; its solves, as the LU's, now scale each
    column beyond the range into it (x is 2^664 times the solution of A y = b), as GMRES-IR does."""
    a, b = _tiny_system(np.float64, 0)
    spd = a @ a.T + np.eye(a.shape[0])
    for a, kw in ((spd, {"assume_a": "pos"}), (spd, {"assume_a": "pos", "refinement": "gmres"}),
                  (a, {"refinement": "gmres"}), (a, {})):
        x = bl.solve(a, np.ldexp(b, 664), precision="mixed", memory="256KiB", **kw)
        y = np.ldexp(x.to_numpy(), -664)  # exact
        assert_residual(a, y, b, dtype=np.float64)
        assert_solve(y, sl.solve(a, b), a, dtype=np.float64)


def test_cli_solve_names_the_range(tmp_path, capsys):
    a64, b64 = _tiny_system(np.float32, -130)
    a = bl.from_array(a64.astype(np.float32), tmp_path / "a.zarr")
    b = bl.from_array(b64.astype(np.float32), tmp_path / "b.zarr")
    assert main(["solve", a.path, b.path, "-o", str(tmp_path / "x.zarr"), "--no-progress"]) == 1
    err = capsys.readouterr().err
    assert "within float32's range" in err and "SingularMatrixError" not in err


@pytest.mark.parametrize("memory", ["64MiB", "256KiB"])
def test_cholesky_solution_beyond_float32s_range_is_named_not_singular(memory):
    """``assume_a="pos"``: a well-conditioned SPD float32 A times 2^-130 had been refused as "a singular or
    overflowing diagonal tile"; the Cholesky's pivots L_ii^2 (none numerically zero) name the range."""
    rng = np.random.default_rng(0)
    n = 40
    g = rng.standard_normal((n, n))
    spd = g @ g.T / n + np.eye(n)
    a = (np.ldexp(1.0, -130) * spd / np.abs(spd).max()).astype(np.float32)
    with pytest.raises(ParameterError, match=r"a: must give a solution x within float32's range.*min L_ii\^2 = "
                       r"[0-9.]+e\+(39|40).*Fix: solve in float64"):
        bl.solve(a, np.ones(n, dtype=np.float32), assume_a="pos", memory=memory)


@pytest.mark.parametrize("dtype,e", [(np.float32, 100), (np.float64, 1000)])
@pytest.mark.parametrize("memory", [None, "128KiB"])
def test_substitution_products_beyond_the_range_are_named(dtype, e, memory):
    """A nonsingular ``A`` with entries near ``2^e`` and ``x`` near ``2^47`` (both in range): the LU's
    substitutions form ``u_ij x_j`` near ``2^(e + 48)`` before they cancel back to ``b``'s size, and overflow.
    That had been refused as "a solution x beyond the range" with ``max |x|`` about 1, and a fix (scale
    ``a`` alone) that would have pushed ``x`` itself beyond it. The refusal now names the products and
    the fix that keeps ``x``: ``a`` and ``b`` scaled together; following it solves the system."""
    n = 48
    a = ((np.eye(n) - 2 * np.eye(n, k=1)) * 2.0 ** e).astype(dtype)  # x_i = 2^(n - i) - 1 for b = 2^e
    b = np.full((n, 2), 2.0 ** e).astype(dtype)
    kw = {"memory": memory} if memory else {}
    with pytest.raises(ParameterError, match=r"substitutions' products u_ij x_j within .*Fix: scale a and b by the "
                                             rf"same power of two, 2\.0\*\*-{e + 2} \(exact: x is unchanged\)"):
        bl.solve(a, b, **kw)
    s = 2.0 ** -(e + 2)
    x = bl.solve(a * dtype(s), b * dtype(s), **kw)[...]
    assert np.abs(x).max() >= 2.0 ** 47
    assert_residual(a.astype(np.float64) * s, x, b.astype(np.float64) * s, dtype=dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_pos_refuses_a_nonsymmetric_a_whose_refinement_stalls(dtype):
    """``assume_a='pos'`` of a real nonsymmetric ``A`` with a dominant positive diagonal: the Cholesky reads
    the lower triangle, the refinement against ``A`` stalls above ``tol = sqrt(n) eps`` (the factor is that
    of another matrix), and the call is refused naming ``A^T``; it had returned that ``x`` with a warning
    blaming the condition number (cond(A) about 1.35 here). A more dominant diagonal can let the refinement
    reach ``tol``, and that ``x`` is right."""
    n = 5
    s = np.random.default_rng(0).standard_normal((n, n))
    np.fill_diagonal(s, 0)
    a = (s + 2 * n * np.eye(n)).astype(dtype)
    b = np.ones((n, 1), dtype)
    assert np.linalg.cond(a) < 2
    with pytest.raises(NotSymmetricError, match=r"a: must be symmetric positive definite for assume_a='pos'.*A\^T"):
        bl.solve(a, b, assume_a="pos", scheduler="sync")
    assert_residual(a, bl.solve(a, b, scheduler="sync").to_numpy(), b, dtype=dtype)  # LU: solved


def _graded(n, seed, dtype=np.float64):
    """``A = D A_0`` with rows alternating ``2^600`` and ``2^-600`` (``A_0`` diagonally dominant: cond_2 near
    2) and ``b`` graded alike: the exact ``x = A_0^-1 D^-1 b`` is near 1, cond_2(A) near ``2^1200``."""
    rng = np.random.default_rng(seed)
    rows = np.where(np.arange(n) % 2 == 0, 2.0 ** 600, 2.0 ** -600)
    a0 = rng.standard_normal((n, n)) + 3 * np.sqrt(n) * np.eye(n)
    if np.dtype(dtype).kind == "c":
        a0 = a0 + 1j * rng.standard_normal((n, n))
    return (rows[:, None] * a0).astype(dtype), (rng.standard_normal((n, 1)) * rows[:, None]).astype(dtype)


@pytest.mark.parametrize("dtype", [np.float64, np.complex128])
@pytest.mark.parametrize("memory", [None, "256KiB"])
def test_a_graded_system_is_equilibrated_not_warned_about(dtype, memory):
    """Rows 2^600 and 2^-600 apart: x had been NumPy's, off by a factor of 3000, with a warning that A is
    ill-conditioned (its condition estimate inf: the solves with a Gaussian z overflow). The system is
    equilibrated by powers of two (LAPACK's xGESVX): the estimate is that of R A C, near cond(A_0) (about
    2), no warning, and x within n eps cond(A_0) of A_0^-1 D^-1 b (tests/solve/test_square_equilibration.py)."""
    n = 37
    a, b = _graded(n, 0, dtype)
    with warnings.catch_warnings():
        warnings.simplefilter("error", errors.IllConditionedWarning)
        x = bl.solve(a, b, memory=memory)
    r = x.report
    assert r["equilibration"]["applied"] and r["condition_estimate"] < 10
    assert r["backward_error"] <= np.sqrt(n) * np.finfo(np.float64).eps
    rows = np.where(np.arange(n) % 2 == 0, 2.0 ** 600, 2.0 ** -600)
    a0, b0 = a / rows[:, None], b / rows[:, None]  # exact: powers of two
    ref = np.linalg.solve(a0.astype(np.complex128), b0.astype(np.complex128))
    err = np.linalg.norm(x.to_numpy() - ref) / np.linalg.norm(ref)
    assert err <= 4 * n * np.finfo(np.float64).eps * np.linalg.cond(a0), err


@pytest.mark.parametrize("memory", [None, "256KiB"])
def test_the_condition_estimate_is_a_lower_bound_and_warns_at_one_over_eps(memory):
    """``||A||_F / sqrt(n) ||F^-1 z|| / ||z||`` is at most ``cond_2(A)`` (both factors are lower bounds, F
    close to A to ``n eps cond`` relatively) and, for this seeded z, within ``4 n`` of it; no warning while
    ``cond eps < 1``, a warning where the matrix is numerically singular (cond 1e20)."""
    rng = np.random.default_rng(3)
    n = 40
    q1, _ = np.linalg.qr(rng.standard_normal((n, n)))
    q2, _ = np.linalg.qr(rng.standard_normal((n, n)))
    b = rng.standard_normal((n, 2))
    for top, warns in ((1e3, False), (1e10, False), (1e20, True)):
        a = (q1 * np.logspace(0, -np.log10(top), n)) @ q2.T
        kappa = np.linalg.cond(a)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            x = bl.solve(a, b, memory=memory)
        said = [w for w in caught if issubclass(w.category, errors.IllConditionedWarning)]
        assert bool(said) == warns, (top, [str(w.message) for w in caught])
        est = x.report["condition_estimate"]
        if not warns:
            assert kappa / (4 * n) <= est <= kappa * (1 + 1e-3), (top, est, kappa)
        else:
            assert est * np.finfo(np.float64).eps >= 1, (top, est)


@pytest.mark.parametrize("assume_a", ["gen", "pos"])
def test_square_solution_below_the_range_is_refused_and_a_subnormal_one_answered(assume_a):
    """``A`` near ``1e200``, ``b`` near ``1e-200``: ``x`` (near ``1e-400``) is below float64's range. The LU
    route returned ``x = 0`` with only a warning ("backward error 1.0 ... condition too large for
    float64?"); it is refused naming ``b``. A subnormal ``x`` (near ``1e-312``) is answered, to the
    absolute resolution of subnormals (``n`` roundings of ``4.9e-324`` each, plus the ``cond(A) eps``
    relative error of the LU), with a warning that names the range instead of the condition."""
    rng = np.random.default_rng(0)
    n = 20
    a = rng.standard_normal((n, n))
    a = a @ a.T + n * np.eye(n)  # symmetric positive definite, well conditioned
    xr = rng.standard_normal(n)
    b = a @ xr
    with pytest.raises(ConvergenceError, match="b: must give a solution x = A\\^-1 b within the range of float64"):
        bl.solve(a * 1e200, b * 1e-200, assume_a=assume_a)
    with pytest.warns(Warning, match="x is subnormal"):
        x = bl.solve(a * 1e150, b * 1e-160, assume_a=assume_a).to_numpy().ravel()
    ref = np.linalg.solve(a, b) * 1e-310
    cond = np.linalg.cond(a)
    sub = np.finfo(float).smallest_subnormal
    assert np.allclose(x, ref, rtol=n * cond * np.finfo(float).eps, atol=4 * n * sub), (x[:3], ref[:3])
