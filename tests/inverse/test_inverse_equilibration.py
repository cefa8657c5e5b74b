"""``blocklin.inv`` of graded matrices (rows or columns scaled over many binades): equilibrated by powers of
two (LAPACK's xGEEQUB scalings and xLAQGE's rule), ``X = C inv(R A C) R``, where the normwise checks of the
routes had refused the matrix as numerically singular (``numpy.linalg.inv`` inverts it accurately).

The reference is the exact ``inv(B)`` scaled by ``D^-1``. Bound: the route inverts ``E = R A C = P B G`` with
``P = R D`` and ``G = C`` (or ``D C``) diagonal of a small range (each row's largest entry of ``B`` brought
into ``[0.5, 1)``), to a backward error of order ``n eps``; ``Y = inv(E)`` then has a forward error of order
``n eps cond(E)`` in each column (row) relative to that column's norm, and ``X = C Y R`` and the grading
``D`` are powers of two: the columns of ``X D`` (rows of ``D X``) carry the relative errors of ``Y``'s, up to
the small range of ``P`` and ``G``, which turns ``cond(E)`` into ``cond(B)`` within a factor of a few (4
here). NumPy's own inverse measures 0.01-0.07 of ``n eps cond(B)`` on these matrices, blocklin's 0.00-0.01.
"""

from __future__ import annotations

import json
import os
import signal

import numpy as np
import pytest

import blocklin as bl
from blocklin.errors import ParameterError, SingularMatrixError
from blocklin.linalg.blocks import equilibrate
from support.placements import SCHEDULERS, scheduler_arg


def graded(n: int, span: int, side: str, dtype=np.float64, seed: int = 0):
    """``A = D B`` (rows), ``B D`` (columns) or ``D B D'`` (both), ``D`` powers of two over ``2^-span..2^span``
    in random order; returns ``A``, ``B`` and the row and column scalings."""
    rng = np.random.default_rng(seed)
    b = rng.standard_normal((n, n))
    if np.dtype(dtype).kind == "c":
        b = b + 1j * rng.standard_normal((n, n))
    b = b.astype(dtype)
    d = 2.0 ** np.round(np.linspace(-span, span, n))
    rng.shuffle(d)
    dr = d if side in ("rows", "both") else np.ones(n)
    dc = (d[::-1] if side == "both" else d) if side in ("cols", "both") else np.ones(n)
    a = (dr[:, None] * b * dc[None, :]).astype(dtype)
    return a, b, dr, dc


def check(x: np.ndarray, b: np.ndarray, dr: np.ndarray, dc: np.ndarray, side: str, c: float = 4.0) -> None:
    """Column-wise (rows graded: ``X = inv(B) Dr^-1``) or row-wise (columns graded) relative error of the
    ungraded ``Dc X Dr`` against ``inv(B)``, within ``c n eps cond(B)`` (module docstring)."""
    b64 = b.astype(np.complex128 if b.dtype.kind == "c" else np.float64)
    ib = np.linalg.inv(b64)
    z = dc[:, None] * x.astype(ib.dtype) * dr[None, :]  # exact: powers of two
    axis = 1 if side == "cols" else 0
    err = np.linalg.norm(z - ib, axis=axis) / np.linalg.norm(ib, axis=axis)
    bound = c * len(b) * float(np.finfo(b.dtype).eps) * np.linalg.cond(b64)
    assert np.isfinite(x).all() and err.max() <= bound, (err.max(), bound)


ROUTES = [  # (n, settings, the route that runs)
    (64, {}, "direct"),
    (200, {"memory": "256KiB"}, "lu"),
    (200, {"memory": "256KiB", "method": "schur"}, "schur"),
]


@pytest.mark.parametrize("side", ["rows", "cols", "both"])
@pytest.mark.parametrize("span", [40, 300])
@pytest.mark.parametrize(("n", "settings", "route"), ROUTES)
def test_graded_float64_is_inverted_accurately(n, settings, route, span, side):
    # refused before as numerically singular (reciprocal condition 1e-26 at 2^+-40, ||I - A X|| = inf at 2^+-300)
    a, b, dr, dc = graded(n, span, side)
    x = bl.inv(a, **settings)
    r = x.report
    assert r["method"] == route
    eq = r["equilibration"]
    assert eq["applied"] and "equilibrated" in eq["note"]
    assert eq[{"rows": "rowcnd", "cols": "colcnd", "both": "rowcnd"}[side]] < equilibrate.THRESH
    assert r["backward_error"] <= 1e-14  # of the equilibrated matrix, as reported
    check(x.to_numpy(), b, dr, dc, side)


@pytest.mark.parametrize("side", ["rows", "cols"])
def test_graded_float32(side):
    a, b, dr, dc = graded(64, 40, side, dtype=np.float32)
    x = bl.inv(a)
    assert x.dtype == np.float32 and x.report["equilibration"]["applied"]
    check(x.to_numpy(), b, dr, dc, side)


@pytest.mark.parametrize(("n", "settings"), [(48, {}), (120, {"memory": "512KiB"})])
def test_graded_complex(n, settings):
    a, b, dr, dc = graded(n, 40, "rows", dtype=np.complex128)
    x = bl.inv(a, **settings)
    assert x.dtype == np.complex128 and x.report["equilibration"]["applied"]
    check(x.to_numpy(), b, dr, dc, "rows")


def test_graded_mixed_precision_out_of_core():
    a, b, dr, dc = graded(200, 40, "rows")
    x = bl.inv(a, memory="256KiB", precision="mixed")
    assert x.report["work_dtype"] == "float32" and x.report["equilibration"]["applied"]
    check(x.to_numpy(), b, dr, dc, "rows")


@pytest.mark.parametrize(("n", "settings"), [(64, {}), (200, {"memory": "256KiB"}),
                                             (200, {"memory": "256KiB", "method": "schur"})])
def test_an_ordinary_matrix_keeps_its_bits(monkeypatch, n, settings):
    """A matrix the rule leaves alone takes the route it took before, bit for bit (the scan only reads)."""
    a = np.random.default_rng(3).standard_normal((n, n))
    x = bl.inv(a, **settings)
    eq = x.report["equilibration"]
    assert not eq["applied"] and eq["rowcnd"] >= equilibrate.THRESH and eq["colcnd"] >= equilibrate.THRESH
    if not settings:  # in core the leaf task gathers the maxima from the block it reads: A is read once
        assert x.report["bytes_read"] == a.nbytes
    # the code before equilibration: no scan pass, and the one leaf gathers nothing
    from blocklin.linalg.inverse import kernels

    none = equilibrate.Equilibration(np.zeros(n, int), np.zeros(n, int), 1.0, 1.0, False, False)
    monkeypatch.setattr(equilibrate, "scan", lambda job, m: None)
    monkeypatch.setattr(kernels, "_equilibration", lambda block: none)
    before = bl.inv(a, **settings)
    np.testing.assert_array_equal(x.to_numpy(), before.to_numpy())


@pytest.mark.parametrize("settings", [{}, {"memory": "256KiB"}, {"memory": "256KiB", "method": "schur"}])
def test_a_singular_graded_matrix_is_still_refused(settings):
    a, b, dr, dc = graded(96 if not settings else 200, 40, "rows")
    a[5] = a[7] * 2.0**30  # row 5 a multiple of row 7: singular after equilibration too
    with pytest.raises(SingularMatrixError, match="must be (numerically )?nonsingular"):
        bl.inv(a, **settings)


@pytest.mark.parametrize(("n", "settings"), [(64, {}), (200, {"memory": "256KiB"})])
def test_columns_whose_scaled_maxima_leave_the_range_are_equilibrated(n, settings):
    """Columns alternating ``2^600`` and ``2^-600``: every row's largest entry is near ``2^600``, so the column
    maxima of ``R A`` are near ``2^-1200`` for half the columns. Taken as floats they flushed to 0, read as a
    zero column (no scaling), and the matrix was refused as singular; their exponents are kept exactly
    (``equilibrate.ColumnMaxima``) and ``R A C``, scaled in one step, is exact."""
    rng = np.random.default_rng(0)
    b = rng.standard_normal((n, n))
    d = np.where(np.arange(n) % 2 == 0, 2.0 ** 600, 2.0 ** -600)
    x = bl.inv(b * d[None, :], **settings)
    eq = x.report["equilibration"]
    assert eq["applied"] and eq["column_exponents"][1] - eq["column_exponents"][0] >= 1200
    check(x.to_numpy(), b, np.ones(n), d, "cols")


def test_column_maxima_are_exact_where_their_floats_are():
    """Where ``R A``'s column maxima are floats (subnormal included), the exact ones equal them: the scalings
    and the decision are those of before."""
    rng = np.random.default_rng(5)
    for span in (3, 40, 300, 500):
        a = rng.standard_normal((50, 50)) * 2.0 ** rng.integers(-span, span, (50, 1)) \
            * 2.0 ** rng.integers(-span, span, (1, 50))
        rmax, cmax = equilibrate.strip_maxima(a.copy())
        e = -np.frexp(rmax)[1]
        floats = np.ldexp(np.abs(a), e[:, None]).max(axis=0)
        assert np.array_equal(cmax.values(), floats) and np.array_equal(-cmax.exp, -np.frexp(floats)[1])


@pytest.mark.parametrize("settings", [{}, {"memory": "256KiB"}])
def test_an_equilibrated_inverse_beyond_the_range_is_refused_by_name(settings):
    """Every other column of ``A = B D`` near ``2^-1060``: ``X = D^-1 inv(B)`` has rows near ``2^1060``. The
    last pass of ``X = C Y R`` counted them and its refusal's message took ``math.ldexp(1.0, 1024)``, which
    raised ``OverflowError: math range error``; the refusal names the range."""
    rng = np.random.default_rng(0)
    n = 40
    a = rng.standard_normal((n, n)) * 2.0 ** np.where(np.arange(n) % 2 == 0, -1060, 0)[None, :]
    with pytest.raises(ParameterError, match="must give an inverse within float64's range.*beyond float64's range"):
        bl.inv(a, **settings)


def test_a_subnormal_inverse_beyond_the_range_is_refused_by_name():
    """A 2 x 2 ``A`` of subnormal entries (multiples of ``2^-1074``), not singular (``rcond`` above eps), whose
    inverse passes ``2^1024``: LAPACK's ``rcond ||A||_inf`` underflows to 0, and the refusal's estimate
    ``1 / (rcond ||A||_inf)`` had raised ``ZeroDivisionError``; the refusal names the range."""
    a = np.array([[-1975.0, 471.0], [15814.0, -3773.0]]) * 2.0 ** -1074
    with pytest.raises(ParameterError, match="must give an inverse within float64's range.*beyond float64's range"):
        bl.inv(a)


@pytest.mark.parametrize("p", [1, -1, np.inf, -np.inf, "fro"])
def test_cond_of_a_graded_matrix(p):
    a, *_ = graded(64, 40, "rows")
    got = bl.cond(a, p)  # had been refused by inv
    ref = np.linalg.cond(a, p)
    # the norms of A and X are sums of entries whose relative errors are those of the columns/rows (check())
    assert got == pytest.approx(ref, rel=1e-10)


# -- resume through the equilibrated route ---------------------------------------------------------------


@pytest.fixture(scope="module")
def graded_problem(tmp_path_factory):
    from tests.inverse.test_inverse_resume import child

    d = tmp_path_factory.mktemp("resume-eq")
    a_np, b, dr, dc = graded(200, 40, "rows", seed=5)
    a = bl.from_array(a_np, d / "a.zarr", chunks=(64, 64))
    tmp = d / "tmp"
    tmp.mkdir()
    done = child(a.path, d / "ref.zarr", tmp, "SIGKILL", -1, "api", 0)
    assert done.returncode == 0, done.stderr
    info = json.loads(done.stdout.strip().splitlines()[-1])
    # the equilibrated matrix staged, the 17 steps of the Schur route on it, C Y R written
    assert info["steps_run"] == 19 and os.listdir(tmp) == []
    ref = bl.open(d / "ref.zarr").to_numpy()
    check(ref, b, dr, dc, "rows")
    return d, a, ref


@pytest.mark.parametrize(("sig", "kill_in"), [("SIGKILL", 1), ("SIGINT", 6), ("SIGKILL", 19)])
def test_resume_of_an_equilibrated_run_gives_the_same_bits(graded_problem, tmp_path, sig, kill_in):
    from tests.inverse.test_inverse_resume import child

    d, a, ref = graded_problem
    out, tmp = tmp_path / "x.zarr", tmp_path / "tmp"
    tmp.mkdir()
    killed = child(a.path, out, tmp, sig, kill_in, "api", 1)
    if sig == "SIGKILL":
        assert killed.returncode == -signal.SIGKILL, killed.stderr
    else:
        assert killed.returncode != 0 and "nterrupt" in killed.stderr, killed.stderr
    assert not out.exists() and len(os.listdir(tmp)) == 1
    again = child(a.path, out, tmp, sig, -1, "api", 1)
    assert again.returncode == 0, again.stderr
    info = json.loads(again.stdout.strip().splitlines()[-1])
    assert info["resumed"] and info["skipped"] == kill_in - 1
    np.testing.assert_array_equal(bl.open(out).to_numpy(), ref)
    assert os.listdir(tmp) == []


def test_resume_after_the_input_changed_starts_over(tmp_path):
    """The interrupted run's steps were made from another matrix: the inputs' stamps differ, the rerun
    starts over (saying so) and inverts the matrix as it is now (its scalings scanned again)."""
    from tests.inverse.test_inverse_resume import child

    a_np, b, dr, dc = graded(200, 40, "rows", seed=5)
    a = bl.from_array(a_np, tmp_path / "a.zarr", chunks=(64, 64))
    out, tmp = tmp_path / "x.zarr", tmp_path / "tmp"
    tmp.mkdir()
    killed = child(a.path, out, tmp, "SIGKILL", 6, "api", 1)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    a2, b2, dr2, dc2 = graded(200, 300, "cols", seed=6)
    bl.from_array(a2, tmp_path / "a.zarr", chunks=(64, 64), overwrite=True)
    again = child(a.path, out, tmp, "SIGKILL", -1, "api", 1)
    assert again.returncode == 0, again.stderr
    assert "starting over" in again.stderr
    assert not json.loads(again.stdout.strip().splitlines()[-1])["resumed"]
    check(bl.open(out).to_numpy(), b2, dr2, dc2, "cols")


def test_an_inverse_beyond_float32s_range_is_refused_for_the_range():
    """float32 rows down to 2^-130: X = C Y R overflows float32 (NumPy returns 39 Inf entries); the last
    pass names the range and the fix, which inverts it (the float32 data exactly, in float64)."""
    from blocklin.errors import ParameterError

    n = 64
    b = np.random.default_rng(0).standard_normal((n, n)).astype(np.float32)
    d = 2.0 ** np.round(np.linspace(-130, 0, n))
    a = (d[:, None] * b).astype(np.float32)  # its smallest rows subnormal: b' = a / d below, exactly
    with pytest.raises(ParameterError, match=r"within float32's range.*precision='float64'"):
        bl.inv(a)
    x = bl.inv(a, precision="float64")
    assert x.dtype == np.float64
    check(x.to_numpy(), a.astype(np.float64) / d[:, None], d, np.ones(n), "rows")


def test_cli_says_it_equilibrated(tmp_path, capsys):
    from blocklin.cli.main import main

    a, b, dr, dc = graded(64, 300, "rows")
    bl.from_array(a, tmp_path / "a.zarr", chunks=(32, 32))
    rc = main(["inv", str(tmp_path / "a.zarr"), "-o", str(tmp_path / "x.zarr"), "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0 and out["equilibration"]["applied"]
    assert out["equilibration"]["row_exponents"][1] - out["equilibration"]["row_exponents"][0] >= 590
    check(bl.open(tmp_path / "x.zarr").to_numpy(), b, dr, dc, "rows")
    rc = main(["inv", str(tmp_path / "a.zarr"), "-o", str(tmp_path / "y.zarr")])
    assert rc == 0 and "equilibrated by powers of two (rows 2^" in capsys.readouterr().out


@pytest.mark.gpu
@pytest.mark.parametrize("settings", [{"memory": "64MiB"}, {"memory": "512KiB"}])
def test_graded_on_the_gpu(settings):
    """The equilibrated matrix's leaf on the GPU (cuSOLVER), and the Schur route's GEMMs there (the scan
    and the scalings are host passes)."""
    a, b, dr, dc = graded(300, 40, "both")
    x = bl.inv(a, device="gpu", **settings)
    assert x.report["equilibration"]["applied"]
    check(x.to_numpy(), b, dr, dc, "both")


@pytest.mark.parametrize(("n", "settings", "route"), ROUTES[:2])
def test_stored_inverse_records_its_equilibration(tmp_path, n, settings, route):
    """The output's record carries the report's ``equilibration`` (its residual and backward error are
    those of ``R A C``), as the returned report has it; a matrix that needs none records it unapplied."""
    a, b, dr, dc = graded(n, 300, "rows")
    x = bl.inv(a, out=tmp_path / "X.zarr", **settings)
    stored = bl.open(tmp_path / "X.zarr").provenance["report"]
    assert x.report["method"] == route and x.report["equilibration"]["applied"]
    assert stored["equilibration"] == json.loads(json.dumps(x.report["equilibration"]))
    assert stored["backward_error"] == x.report["backward_error"]
    plain = bl.inv(b, out=tmp_path / "Y.zarr", **settings)
    assert bl.open(tmp_path / "Y.zarr").provenance["report"]["equilibration"] == \
        json.loads(json.dumps(plain.report["equilibration"])) and not plain.report["equilibration"]["applied"]


@pytest.mark.parametrize("dtype", [np.float64, np.complex128])
@pytest.mark.parametrize(("n", "settings", "route"), ROUTES, ids=[r[2] for r in ROUTES])
def test_graded_columns_at_the_top_of_the_range(n, settings, route, dtype):
    """Columns graded over ``2^+-40`` and the largest entry within a factor 2 of float64's top: rows alike in
    scale leave ``ROWCND >= 0.1``, and ``R A``'s column scalings applied alone made ``A C``'s columns up to
    ``2 max|a|``, beyond the range: the matrix had been refused as holding an Inf (found by a randomized
    search; a complex entry's modulus beyond the range alike). ``xLAQGE`` scales the rows too where ``AMAX``
    lies outside ``[SMALL, 1 / SMALL]``."""
    a, b, dr, dc = graded(n, 40, "cols", dtype)
    peak = max(np.abs(a.real).max(), np.abs(a.imag).max() if a.dtype.kind == "c" else 0.0)
    e = 1024 - int(np.frexp(peak)[1])  # the largest part into [2^1023, 2^1024), exact
    a, dc = a * 2.0 ** e, dc * 2.0 ** e
    if "memory" in settings and np.dtype(dtype).kind == "c":  # entries twice the size: twice the budget
        settings = {**settings, "memory": "512KiB"}
    x = bl.inv(a, **settings)
    eq = x.report["equilibration"]
    assert eq["applied"] and eq["rowcnd"] >= equilibrate.THRESH  # the rows scaled for AMAX alone
    assert x.report["method"] == route
    check(x.to_numpy(), b, dr, dc, "cols")


@pytest.mark.parametrize("scheduler", SCHEDULERS)
@pytest.mark.parametrize(("n", "settings", "route"), ROUTES[1:])
def test_equilibrated_inverse_has_the_same_bits_on_every_scheduler(n, settings, route, scheduler, request):
    """The out-of-core routes of the equilibrated matrix: the sync run's bits on every scheduler."""
    a, b, dr, dc = graded(n, 300, "both")
    ref = bl.inv(a, scheduler="sync", **settings).to_numpy()
    x = bl.inv(a, scheduler=scheduler_arg(scheduler, request), **settings)
    assert x.report["method"] == route and x.report["equilibration"]["applied"]
    np.testing.assert_array_equal(x.to_numpy(), ref)
    check(x.to_numpy(), b, dr, dc, "both")
