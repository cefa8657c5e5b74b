"""The square solve of a graded ``A = Dr B Dc`` (rows or columns scaled over many binades, ``B`` well
conditioned): equilibrated by powers of two as LAPACK's expert driver ``xGESVX`` (``FACT = 'E'``) does, with
``inv``'s rule (``xGEEQUB``'s scalings, ``xLAQGE``'s decision): ``(R A C) y = R b``, ``x = C y``. It had warned
that ``A`` is ill-conditioned (``cond_2(A)`` near ``2^1200``) and returned NumPy's ``x``, off by a factor of
3000 where the rows alternate ``2^600`` and ``2^-600``.

Bound. The LU with refinement solves ``E y = R b``, ``E = R A C = P B G`` with ``P = R Dr`` and ``G = Dc C``
diagonal of a small range (each row's, then column's, largest entry brought into ``[0.5, 1)``), to a backward
error of order ``n eps``, so ``||y^ - y|| <= c n eps cond(E) ||y||`` (Higham 2002, Thm 7.2). ``x = C y`` and
the grading are exact powers of two: the ungraded solution ``z = Dc x = G y`` of ``B z = Dr^-1 b`` has
``||z^ - z|| <= cond(G) ||y^ - y|| / ||y|| ||z||``, and ``cond(E) <= cond(P) cond(B) cond(G)``. With ``P`` and
``G`` of ranges below 4 for a Gaussian ``B``, ``||z^ - z|| / ||z|| <= 4 n eps cond(B)`` per column (the
constant as the inverse's tests take it); the refined solutions measure far below it. The reference ``z`` is
``B^-1 (Dr^-1 b)`` refined once in long double (its error, ``eps cond(B) eps``, is far below the bound).
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import blocklin as bl
from blocklin import errors
from blocklin.errors import ParameterError
from blocklin.linalg.blocks import equilibrate
from blocklin.linalg.solve import square
from support.placements import DEVICES, SCHEDULERS, scheduler_arg


def graded(n: int, span: int, side: str, dtype=np.float64, seed: int = 0, k: int = 2):
    """``A = Dr B Dc`` with ``Dr`` (rows), ``Dc`` (cols) or both (reversed) powers of two over
    ``2^-span..2^span`` in random order, or, with ``side`` ending in ``-alt``, alternating ``2^span`` and
    ``2^-span``; ``b = Dr B z`` for a Gaussian ``z``. Returns ``A``, ``b``, ``B``, ``Dr`` and ``Dc``."""
    rng = np.random.default_rng(seed)
    cplx = np.dtype(dtype).kind == "c"
    B = rng.standard_normal((n, n)) + (1j * rng.standard_normal((n, n)) if cplx else 0)
    B = B.astype(dtype)
    if side.endswith("-alt"):
        d = np.where(np.arange(n) % 2 == 0, 2.0 ** span, 2.0 ** -span)
        side = side[:-4]
    else:
        d = 2.0 ** np.round(np.linspace(-span, span, n))
        rng.shuffle(d)
    dr = d if side in ("rows", "both") else np.ones(n)
    dc = (d[::-1] if side == "both" else d) if side in ("cols", "both") else np.ones(n)
    z = rng.standard_normal((n, k)) + (1j * rng.standard_normal((n, k)) if cplx else 0)
    b = (dr[:, None] * (B @ z.astype(dtype))).astype(dtype)
    a = (dr[:, None] * B * dc[None, :]).astype(dtype)
    return a, b, B, dr, dc


def reference(B, b, dr):
    """``z = B^-1 Dr^-1 b``, refined once with the residual in long double."""
    wide = np.clongdouble if B.dtype.kind == "c" else np.longdouble
    work = np.complex128 if B.dtype.kind == "c" else np.float64
    rhs = (b.astype(wide) / dr[:, None].astype(wide))
    z = np.linalg.solve(B.astype(work), rhs.astype(work))
    r = rhs - B.astype(wide) @ z.astype(wide)
    return z.astype(wide) + np.linalg.solve(B.astype(work), r.astype(work)).astype(wide)


def check(x, B, b, dr, dc, *, eps=None):
    """Each column of ``Dc x`` within ``4 n eps cond(B)`` of the reference (module docstring)."""
    n = len(B)
    wide = np.clongdouble if B.dtype.kind == "c" else np.longdouble
    ref = reference(B, b, dr)
    got = dc[:, None].astype(wide) * np.asarray(x).reshape(n, -1).astype(wide)  # exact: powers of two
    err = (np.linalg.norm((got - ref).astype(np.complex128), axis=0)
           / np.linalg.norm(ref.astype(np.complex128), axis=0))
    work = np.complex128 if B.dtype.kind == "c" else np.float64
    eps = float(np.finfo(B.dtype).eps) if eps is None else eps
    bound = 4 * n * eps * np.linalg.cond(B.astype(work))
    assert np.isfinite(np.asarray(x)).all() and err.max() <= bound, (err.max(), bound)


def solve_quiet(a, b, **kw):
    """``bl.solve`` with the ill-conditioning warning asserted absent."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        x = bl.solve(a, b, **kw)
    said = [str(w.message) for w in caught if issubclass(w.category, (errors.IllConditionedWarning,
                                                                      errors.ConvergenceWarning))]
    assert not said, said
    return x


CASES = [("rows", 3), ("cols", 3), ("both", 3), ("rows", 40), ("cols", 40), ("both", 40), ("rows", 300),
         ("cols", 300), ("both", 300), ("rows-alt", 600), ("cols-alt", 600), ("both-alt", 300)]
#: (n, budget): one in-core tile, and a budget whose LU runs in panels of 32 columns over 4 tiles
STORED = [(48, None), (100, "256KiB")]


def budget(memory, dtype):
    """``memory`` for 8-byte entries, one and a half times it for complex128 (the same panels of 32)."""
    return "384KiB" if memory == "256KiB" and np.dtype(dtype).itemsize == 16 else memory


@pytest.mark.parametrize("dtype", [np.float64, np.complex128])
@pytest.mark.parametrize(("n", "memory"), STORED, ids=["in-memory", "out-of-core"])
@pytest.mark.parametrize(("side", "span"), CASES, ids=[f"{s}-{p}" for s, p in CASES])
def test_graded_system_is_equilibrated_and_accurate(side, span, n, memory, dtype):
    a, b, B, dr, dc = graded(n, span, side, dtype)
    x = solve_quiet(a, b, memory=budget(memory, dtype))
    r = x.report
    eq = r["equilibration"]
    assert eq["applied"] and "(R A C) y = R b" in eq["note"]
    if memory is not None:
        assert r["plan"]["tile"] < n  # out of core: the LU in panels
    # the condition estimate is that of R A C, within a few times cond(B)
    assert r["condition_estimate"] * np.finfo(dtype).eps < 1e-8
    assert r["backward_error"] <= r["tol"]
    check(x.to_numpy(), B, b, dr, dc)


@pytest.mark.parametrize("dtype", [np.float32, np.complex64])
@pytest.mark.parametrize(("side", "span"), [("rows", 40), ("cols", 40), ("both", 20), ("rows-alt", 60)])
def test_graded_single_precision_system(side, span, dtype):
    a, b, B, dr, dc = graded(48, span, side, dtype)
    x = solve_quiet(a, b)
    assert x.dtype == dtype and x.report["equilibration"]["applied"]
    check(x.to_numpy(), B, b, dr, dc)


@pytest.mark.parametrize("memory", [None, "256KiB"])
@pytest.mark.parametrize("precision", ["mixed", "bf16"])
@pytest.mark.parametrize(("side", "span"), [("rows", 300), ("rows-alt", 600), ("cols-alt", 60), ("both", 40)])
def test_graded_system_in_mixed_and_half_precision(side, span, precision, memory):
    """The float32 (16-bit GEMM) factorization of ``R A C``: refined in float64 to its backward error (the
    cast of ``A`` itself would have flushed rows near ``2^-300`` and overflowed rows near ``2^300``). Where
    only the columns are scaled, LAPACK's ``C`` is that of ``R A`` but ``R`` is not applied: ``A C`` keeps the
    rows' size (``2^60`` here; columns ``2^600`` apart leave ``A C`` near ``2^600``, which the float32 cast
    refuses by name, as it refused ``A``)."""
    n = 48 if memory is None else 100
    a, b, B, dr, dc = graded(n, span, side)
    x = solve_quiet(a, b, precision=precision, memory=memory)
    assert x.report["equilibration"]["applied"] and x.report["factor_dtype"] == "float32"
    check(x.to_numpy(), B, b, dr, dc)


@pytest.mark.filterwarnings("error::RuntimeWarning")
def test_mixed_precision_of_columns_equilibrated_beyond_float32s_range_is_refused_by_name():
    """Columns near ``2^600`` factored in float32: refused naming ``precision``, with blocklin's message alone
    (NumPy's overflow warning of the panel's cast to float32 had come before it)."""
    a, b, B, dr, dc = graded(48, 600, "cols-alt")
    with pytest.raises(ParameterError, match="precision: a float32 factorization needs A's entries within float32's"):
        bl.solve(a, b, precision="mixed")
    check(solve_quiet(a, b).to_numpy(), B, b, dr, dc)


@pytest.mark.parametrize("memory", [None, "256KiB"])
def test_numpy_loses_digits_where_the_equilibrated_solve_does_not(memory):
    """Rows alternating ``2^600`` and ``2^-600`` with ``b`` graded alike: NumPy's ``x`` is off by orders of
    magnitude beyond the bound; blocklin's is within it, without a warning (``cond(R A C)`` near ``cond(B)``)."""
    a, b, B, dr, dc = graded(37, 600, "rows-alt", k=1)
    with pytest.raises(AssertionError):
        check(np.linalg.solve(a, b), B, b, dr, dc)
    check(solve_quiet(a, b, memory=memory).to_numpy(), B, b, dr, dc)


@pytest.mark.parametrize("memory", [None, "256KiB"])
def test_ill_conditioned_equilibrated_system_still_warns(memory):
    """A graded ``A`` whose ``B`` is itself numerically singular (cond 1e20): the warning names the
    equilibrated matrix's condition."""
    rng = np.random.default_rng(3)
    n = 40 if memory is None else 100
    q1, _ = np.linalg.qr(rng.standard_normal((n, n)))
    q2, _ = np.linalg.qr(rng.standard_normal((n, n)))
    B = (q1 * np.logspace(0, -20, n)) @ q2.T
    d = 2.0 ** np.round(np.linspace(-200, 200, n))
    with pytest.warns(errors.IllConditionedWarning, match=r"cond_2\(R A C\)"):
        x = bl.solve(d[:, None] * B, rng.standard_normal((n, 1)), memory=memory)
    assert x.report["equilibration"]["applied"]


@pytest.mark.parametrize("dtype", [np.float64, np.complex128, np.float32])
@pytest.mark.parametrize("memory", [None, "256KiB"])
def test_a_matrix_the_rule_leaves_alone_keeps_its_bits(monkeypatch, memory, dtype):
    """A matrix whose ROWCND and COLCND are at least 0.1 takes the code path of before, bit for bit (the
    scan only reads)."""
    rng = np.random.default_rng(7)
    n = 48 if memory is None else 100
    a = rng.standard_normal((n, n)) + (1j * rng.standard_normal((n, n)) if np.dtype(dtype).kind == "c" else 0)
    a = (a + np.sqrt(n) * np.eye(n)).astype(dtype)
    b = rng.standard_normal((n, 3)).astype(dtype)
    memory = budget(memory, dtype)
    x = bl.solve(a, b, memory=memory)
    eq = x.report["equilibration"]
    assert not eq["applied"] and min(eq["rowcnd"], eq["colcnd"]) >= equilibrate.THRESH
    monkeypatch.setattr(equilibrate, "scan", lambda job, m: None)  # the code before: no scan, no entry
    y = bl.solve(a, b, memory=memory)
    assert "equilibration" not in y.report
    assert np.array_equal(x.to_numpy(), y.to_numpy())
    assert x.report["condition_estimate"] == y.report["condition_estimate"]


@pytest.mark.parametrize("memory", [None, "256KiB"])
def test_an_equilibrated_solution_beyond_the_range_is_refused_by_name(memory):
    """Every other column of ``A = B Dc`` near ``2^-1000`` with ``b`` near ``2^100``: ``x = Dc^-1 z`` near
    ``2^1100``. ``y`` of ``R A C`` is in range; ``x = C y`` is not: refused naming the range, not returned
    as inf."""
    rng = np.random.default_rng(0)
    n = 40 if memory is None else 100
    dc = 2.0 ** np.where(np.arange(n) % 2 == 0, -1000, 0)
    a = rng.standard_normal((n, n)) * dc[None, :]
    with pytest.raises(ParameterError, match="must give a solution x within float64's range"):
        bl.solve(a, 2.0 ** 100 * rng.standard_normal(n), memory=memory)


def test_only_assume_a_gen_is_equilibrated():
    """``pos`` and ``sym`` keep their symmetric factorizations (``R A C`` is not symmetric): no scan."""
    rng = np.random.default_rng(1)
    m = rng.standard_normal((30, 30))
    spd = m @ m.T + 30 * np.eye(30)
    for assume_a in ("pos", "sym"):
        assert "equilibration" not in bl.solve(spd, np.ones(30), assume_a=assume_a).report
    assert square.EQUILIBRATED in bl.solve(
        spd * 2.0 ** np.arange(30)[:, None], np.ones(30)).report["equilibration"]["note"]


def top_of_range(a, dc):
    """``a`` and ``dc`` times one power of two that brings ``a``'s largest part into ``[2^1023, 2^1024)``, within
    a factor 2 of float64's top (exact)."""
    peak = max(np.abs(a.real).max(), np.abs(a.imag).max() if a.dtype.kind == "c" else 0.0)
    e = 1024 - int(np.frexp(peak)[1])
    return a * 2.0 ** e, dc * 2.0 ** e


@pytest.mark.parametrize("dtype", [np.float64, np.complex128])
@pytest.mark.parametrize(("n", "memory"), STORED, ids=["in-memory", "out-of-core"])
def test_graded_columns_at_the_top_of_the_range(n, memory, dtype):
    """Columns graded over ``2^+-40`` and the largest entry within a factor 2 of float64's top: rows alike in
    scale leave ``ROWCND >= 0.1``, and ``R A``'s column scalings applied alone made ``A C``'s columns up to
    ``2 max|a|``, beyond the range: the solve had been refused as ``A`` holding an Inf (a complex entry's
    modulus beyond the range alike). ``xLAQGE`` scales the rows too where ``AMAX`` lies outside
    ``[SMALL, 1 / SMALL]``; the solve is then as accurate as any graded one (module docstring)."""
    a, b, B, dr, dc = graded(n, 40, "cols", dtype)
    a, dc = top_of_range(a, dc)
    x = solve_quiet(a, b, memory=budget(memory, dtype))
    eq = x.report["equilibration"]
    assert eq["applied"] and eq["rowcnd"] >= equilibrate.THRESH  # the rows scaled for AMAX alone
    check(x.to_numpy(), B, b, dr, dc)


@pytest.mark.parametrize("memory", [None, "256KiB"])
def test_r_b_flushed_to_zero_is_refused_naming_b(memory):
    """One row ``2^600`` above the others and ``b`` near ``2^-1000`` in it: ``R b`` (``R`` near ``2^-600`` there)
    is 0, the equilibrated solve returned ``y = 0`` with a backward error of 0 and ``x = 0`` came back without a
    word (``x`` near ``2^-1600`` lies below the range; unequilibrated, that was refused naming ``b``). ``R b`` is
    now scaled into the range and ``x = C y 2^-s`` is 0: refused naming ``b``; the fix it names (``b`` scaled
    up) solves it."""
    rng = np.random.default_rng(0)
    n = 8 if memory is None else 100
    B = rng.standard_normal((n, n)) + n * np.eye(n)
    dr = np.ones(n)
    dr[0] = 2.0 ** 600
    a = dr[:, None] * B
    b = np.zeros((n, 1))
    b[0] = 2.0 ** -1000
    with pytest.raises(errors.ConvergenceError, match=r"^b: must give a solution x = A\^-1 b within the range.*"
                                                      r"x = 0 in 1 column.*Fix: scale b up"):
        bl.solve(a, b, memory=memory)
    b = np.ldexp(b, 1600)  # the fix: x scaled up alike (near 1, where the reference's norms hold)
    x = solve_quiet(a, b, memory=memory)
    check(x.to_numpy(), B, b, dr, np.ones(n))


def exact_solution(B, b, dr, dc):
    """``x = Dc^-1 B^-1 Dr^-1 b`` in 300-bit arithmetic (``mpmath``): ``Dr`` and ``Dc`` are powers of two, so
    the graded solve is that of the well-conditioned ``B``, and ``x`` keeps its exact magnitude whatever float64's
    range; mpmath numbers, one list per column."""
    mpmath = pytest.importorskip("mpmath")
    with mpmath.workprec(300):
        m = mpmath.matrix(B.tolist())
        cols = []
        for j in range(b.shape[1]):
            rhs = mpmath.matrix([mpmath.ldexp(mpmath.mpf(float(b[i, j])), -int(np.log2(dr[i]))) for i in range(len(dr))])
            z = mpmath.lu_solve(m, rhs)
            cols.append([mpmath.ldexp(z[i], -int(np.log2(dc[i]))) for i in range(len(dc))])
        return cols


def relative_errors(x, cols):
    """Each column's ``||x - x*|| / ||x*||`` against :func:`exact_solution`'s ``x*`` (in 300 bits: no underflow)."""
    mpmath = pytest.importorskip("mpmath")
    x = np.asarray(x).reshape(len(cols[0]), -1)
    with mpmath.workprec(300):
        return [float(mpmath.sqrt(sum((mpmath.mpf(float(x[i, j])) - c[i]) ** 2 for i in range(len(c))))
                      / mpmath.sqrt(sum(v ** 2 for v in c))) for j, c in enumerate(cols)]


@pytest.mark.parametrize("memory", [None, "256KiB"])
def test_r_b_below_the_normal_range_is_scaled_into_it(memory):
    """Rows ``2^600`` above one other and a column ``2^-600`` below the others (``C`` near ``2^600`` there), ``b``
    near ``2^-450``: ``R b`` near ``2^-1050`` is subnormal, the solve of ``(R A C) y = R b`` kept a few of its
    bits and ``x = C y`` (its large entry near ``2^-450``, in the normal range) came back with a relative error
    of ``2e-7`` (``3e-6`` out of core) for a bound ``4 n eps cond(B)`` near ``5e-12``, with a warning that
    called ``x`` subnormal. ``R b`` is scaled by a power of two into the normal range and ``x = C y 2^-s``
    (one rounding): within the bound (module docstring), no warning, the scaling reported; a column ``R b``
    leaves in the range is not scaled."""
    rng = np.random.default_rng(0)
    n = 8 if memory is None else 100
    B = rng.standard_normal((n, n)) + np.sqrt(n) * np.eye(n)
    dr, dc = np.ones(n), np.ones(n)
    dr[1:], dc[1] = 2.0 ** 600, 2.0 ** -600
    a = dr[:, None] * B * dc[None, :]
    b = np.zeros((n, 2))
    b[1:, 0] = 2.0 ** -450 * rng.standard_normal(n - 1)
    b[:, 1] = dr * (B @ rng.standard_normal(n))
    x = solve_quiet(a, b, memory=memory)
    eq = x.report["equilibration"]
    assert eq["applied"] and eq["b_exponents"][1] == 0 and eq["b_exponents"][0] > 1000
    bound = 4 * n * np.finfo(np.float64).eps * np.linalg.cond(B)
    assert max(relative_errors(x.to_numpy(), exact_solution(B, b, dr, dc))) <= bound


@pytest.mark.parametrize("memory", [None, "256KiB"])
def test_a_subnormal_x_of_a_scaled_r_b_is_rounded_once_and_named(memory):
    """One row ``2^600`` above the others and ``b`` near ``2^-460`` in it: ``x`` near ``2^-1060`` is itself
    subnormal, so its best float64 has a relative error up to ``2^-1075 sqrt(n) / ||x||`` (half a unit of the
    smallest subnormal an entry). The subnormal ``y`` of ``R b`` had taken it to ``3e-4`` (``4e-2`` out of core,
    about 30 and 600 times that); ``y`` solved in the normal range and rounded once stays within it (plus the
    solve's own ``4 n eps cond(B)``), and a warning says ``x`` is subnormal."""
    mpmath = pytest.importorskip("mpmath")
    rng = np.random.default_rng(0)
    n = 8 if memory is None else 100
    B = rng.standard_normal((n, n)) + np.sqrt(n) * np.eye(n)
    dr = np.ones(n)
    dr[0] = 2.0 ** 600
    b = np.zeros((n, 1))
    b[0] = 2.0 ** -460
    with pytest.warns(errors.BlocklinWarning, match="x is subnormal"):
        x = bl.solve(dr[:, None] * B, b, memory=memory)
    ref = exact_solution(B, b, dr, np.ones(n))
    with mpmath.workprec(300):
        norm = mpmath.sqrt(sum(v ** 2 for v in ref[0]))
        rounding = float(mpmath.ldexp(mpmath.sqrt(n), -1075) / norm)
    assert relative_errors(x.to_numpy(), ref)[0] <= rounding + 4 * n * np.finfo(float).eps * np.linalg.cond(B)


@pytest.mark.parametrize("memory", [None, "256KiB"])
def test_a_normal_x_of_small_norm_is_not_called_subnormal(memory):
    """``x`` whose largest entry is normal (in ``[2^-1021, 2^-1020)``) but whose norm is below ``sqrt(n)`` times
    the smallest normal (n = 100): the square solve judged the range by ``||x_j|| < sqrt(n) tiny`` and warned
    that ``x`` is subnormal, where the other routes judge ``max |x_j| < tiny`` (:func:`~blocklin.linalg.blocks.
    result_range.check_columns`: a column whose largest entry is normal keeps ``eps`` relative, its subnormal
    small entries costing ``sqrt(n) 2^-1075 / ||x|| <= sqrt(n) 2^-54`` at most). One rule now: no warning, and
    ``x`` within the bound of the subnormal case (rounding plus ``4 n eps cond(B)``)."""
    mpmath = pytest.importorskip("mpmath")
    rng = np.random.default_rng(0)
    n = 100
    B = rng.standard_normal((n, n)) + np.sqrt(n) * np.eye(n)
    dr = np.ones(n)
    dr[0] = 2.0 ** 600
    c = np.linalg.solve(B, np.eye(n)[:, 0])  # x = 2^-600 b_0 c
    b = np.zeros((n, 1))
    b[0] = 2.0 ** (600 - 1020 - int(np.frexp(np.abs(c).max())[1]))  # max |x| in [2^-1021, 2^-1020)
    ref = exact_solution(B, b, dr, np.ones(n))
    with mpmath.workprec(300):
        norm = mpmath.sqrt(sum(v ** 2 for v in ref[0]))
        rounding = float(mpmath.ldexp(mpmath.sqrt(n), -1075) / norm)
    tiny = float(np.finfo(float).tiny)
    assert max(abs(float(v)) for v in ref[0]) >= tiny and float(norm) < np.sqrt(n) * tiny  # the old rule's case
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        x = bl.solve(dr[:, None] * B, b, memory=memory)
    said = [str(w.message) for w in caught if "subnormal" in str(w.message)]
    assert not said, said
    assert relative_errors(x.to_numpy(), ref)[0] <= rounding + 4 * n * np.finfo(float).eps * np.linalg.cond(B)


@pytest.mark.parametrize("memory", [None, "256KiB"])
def test_y_below_the_range_where_the_rows_are_not_scaled(memory):
    """float32 columns alternating ``2^-56`` and ``2^59`` with rows alike (``ROWCND >= 0.1``: ``R`` is not
    applied, and ``A C`` keeps ``A``'s rows near ``2^60``, ``C`` being that of ``R A``) and ``b`` near ``2^-108``:
    ``y = (A C)^-1 b`` near ``2^-168`` lies below float32's range, and ``x = 0`` was refused as an ``x`` below the
    range (``||b|| / ||A||_F`` about ``1e-51``), where ``x``'s large entries are near ``2^-52``. ``b`` is scaled so
    that ``y`` is near 1 (``b_exponents``) and ``x`` is within ``4 n eps cond(B)`` of the exact one (the entries
    near ``2^-167`` flush to 0, far below that relative to ``||x||``)."""
    rng = np.random.default_rng(5)
    n = 8 if memory is None else 100
    B = (rng.standard_normal((n, n)) + np.sqrt(n) * np.eye(n)).astype(np.float32).astype(np.float64)
    dc = np.where(np.arange(n) % 2 == 0, 2.0 ** -56, 2.0 ** 59)
    a = (B * dc[None, :]).astype(np.float32)
    b = (2.0 ** -108 * rng.standard_normal((n, 1))).astype(np.float32)
    x = solve_quiet(a, b, memory=memory)
    assert x.report["equilibration"]["rowcnd"] >= equilibrate.THRESH and x.report["equilibration"]["b_exponents"][0] > 0
    bound = 4 * n * np.finfo(np.float32).eps * np.linalg.cond(B)
    assert relative_errors(x.to_numpy(), exact_solution(B, b.astype(np.float64), np.ones(n), dc))[0] <= bound


@pytest.mark.parametrize("scheduler", SCHEDULERS)
def test_equilibrated_solve_has_the_same_bits_on_every_scheduler(scheduler, request):
    """The scan, the staging of ``R A C`` and ``R b`` and the panel LU out of core: the sync run's bits on
    every scheduler, and within the module's bound."""
    a, b, B, dr, dc = graded(100, 300, "both")
    ref = bl.solve(a, b, memory="256KiB", scheduler="sync").to_numpy()
    x = solve_quiet(a, b, memory="256KiB", scheduler=scheduler_arg(scheduler, request))
    assert x.report["equilibration"]["applied"] and x.report["plan"]["tile"] < 100
    np.testing.assert_array_equal(x.to_numpy(), ref)
    check(x.to_numpy(), B, b, dr, dc)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize(("n", "memory"), STORED, ids=["in-memory", "out-of-core"])
def test_graded_system_on_every_device(n, memory, device):
    """The equilibrated system's LU and refinement on the device (the scan and scalings are host passes):
    within the module's bound there too."""
    a, b, B, dr, dc = graded(n, 300, "both")
    x = solve_quiet(a, b, memory=memory, device=device)
    assert x.report["equilibration"]["applied"] and x.report["device"] == device
    check(x.to_numpy(), B, b, dr, dc)
