"""``precision="fp16"``/``"bf16"``: square solves and ``inv`` factored with 16-bit GEMM inputs (scaled
into the format's range, emulated on the CPU, rounded on the CuPy stand-in) and refined by GMRES-IR,
against LAPACK in float64; the switch from stalled plain refinement; the refusals."""

from __future__ import annotations

import numpy as np
import pytest

from support import cupy_standin

import blocklin as bl
from blocklin.device.half import FORMATS, round_to
from blocklin.errors import BudgetError, ConvergenceError, ParameterError
from blocklin.linalg.solve.gmres_ir import LIMIT, U_PRECOND, gmres, krylov_plan
from blocklin.linalg.solve.half_scaling import check_rounding
from blocklin.linalg.solve.square import solve_square
from support.tolerances import assert_residual, assert_solve, eps

EPS64 = np.finfo(np.float64).eps
SCHEDULERS = ["sync", "threads", "processes"]
#: n = 96 at this budget: LU panels of 64 columns (two panels, so the second is updated by a GEMM whose
#: inputs are rounded to 16 bits) and Cholesky tiles of 32; the Krylov vectors of one column fit.
N, MEMORY = 96, "256KiB"


def _randsvd(n, kappa, seed, spd=False):
    """``U diag(s) V^T`` with singular values geometric from 1 to ``1/kappa`` (Higham's randsvd, mode 3):
    ``cond_2 = kappa`` exactly; symmetric positive definite with ``V = U``."""
    rng = np.random.default_rng(seed)
    u = np.linalg.qr(rng.standard_normal((n, n)))[0]
    v = u if spd else np.linalg.qr(rng.standard_normal((n, n)))[0]
    return (u * np.logspace(0, -np.log10(kappa), n)) @ v.T


def _check(x, a, b, kappa, precision):
    """Refined to float64's backward error (the mixed route's bound), the forward error LAPACK's bound
    gives at ``kappa``, and a first step at the 16-bit format's accuracy (the emulation really ran)."""
    r, xn = x.report, x.to_numpy()
    n = a.shape[0]
    assert r["precision"] == precision and r["factor_dtype"] == "float32" and xn.dtype == np.float64
    assert r["backward_error"] <= np.sqrt(n) * EPS64  # the default tol
    assert_residual(a, xn, b, dtype=np.float64)
    assert_solve(xn, np.linalg.solve(a, b), a, dtype=np.float64, cond=kappa)
    # x0 = M^-1 b from a float32 factorization would sit near n u_32 = 6e-6 at most; 16-bit inputs leave
    # it above 1e-6 (u_16 = 4.9e-4, u_bf16 = 3.9e-3): the GEMMs really took rounded operands
    assert r["history"][0]["backward_error"] > 1e-6
    assert r["scaling"]["mu"] == (2.0 ** 12 if precision == "fp16" else 1.0)
    assert "emulated on the CPU" in r["half_gemm"]


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
@pytest.mark.parametrize("assume_a", ["gen", "pos"])
@pytest.mark.parametrize("kappa", [1e2, 1e4, pytest.param(1e6, marks=pytest.mark.slow)])
def test_solve_half_refined_to_float64(precision, assume_a, kappa):
    a = _randsvd(N, kappa, seed=int(np.log10(kappa)), spd=assume_a == "pos")
    b = np.random.default_rng(1).standard_normal((N, 1))
    x = bl.solve(a, b, assume_a=assume_a, precision=precision, memory=MEMORY)
    _check(x, a, b, kappa, precision)
    r = x.report
    assert r["refinement"] == "gmres" and r["method"] == {"gen": "lu", "pos": "cholesky"}[assume_a]
    its = [h["gmres_iterations"] for h in r["history"][:-1]]
    assert its and all(i >= 1 for i in its) and r["refine_steps"] == len(its)
    assert r["condition_estimate"] * U_PRECOND < LIMIT


@pytest.mark.parametrize("scheduler", SCHEDULERS)
def test_solve_half_same_bits_on_every_scheduler(scheduler):
    a = _randsvd(N, 1e3, seed=5)
    b = np.random.default_rng(2).standard_normal((N, 2))
    ref = bl.solve(a, b, precision="fp16", memory=MEMORY, scheduler="sync")
    x = bl.solve(a, b, precision="fp16", memory=MEMORY, scheduler=scheduler)
    _check(x, a, b, 1e3, "fp16")
    np.testing.assert_array_equal(x.to_numpy(), ref.to_numpy())


def test_plain_refinement_stalls_where_gmres_ir_converges():
    """fp16: plain refinement from the 16-bit LU contracts by about cond(A) u_16 per step and stalls at
    cond 1e5; GMRES-IR from the same factorization converges. mixed (float32 LU) at cond 1e8: plain
    refinement stalls and "auto" switches to GMRES-IR, which the report says."""
    a = _randsvd(N, 1e5, seed=11)
    b = np.random.default_rng(3).standard_normal((N, 1))
    with pytest.raises(ConvergenceError, match="plain refinement.*refinement='gmres'"):
        solve_square(a, b, precision="fp16", refinement="plain", memory=MEMORY)
    x = solve_square(a, b, precision="fp16", memory=MEMORY)
    _check(x, a, b, 1e5, "fp16")
    assert x.report["refinement"] == "gmres"

    a = _randsvd(128, 1e8, seed=0)
    b = np.random.default_rng(0).standard_normal((128, 1))
    with pytest.raises(ConvergenceError, match="float32 factorization"):
        solve_square(a, b, precision="mixed", refinement="plain", memory=MEMORY)
    x = solve_square(a, b, precision="mixed", memory=MEMORY)
    r = x.report
    assert r["refinement"] == "plain, then gmres"
    switched = [h for h in r["history"] if "switched" in h]
    assert len(switched) == 1 and "plain refinement stalled" in switched[0]["switched"]
    kinds = [h["refinement"] for h in r["history"]]
    assert kinds[0] == "plain" and kinds[-1] == "gmres"
    assert r["backward_error"] <= np.sqrt(128) * EPS64
    assert_residual(a, x.to_numpy(), b, dtype=np.float64)
    assert_solve(x.to_numpy(), np.linalg.solve(a, b), a, dtype=np.float64, cond=1e8)


@pytest.mark.parametrize("precision", ["fp16", "bf16", "mixed"])
def test_refused_beyond_the_condition_rule(precision):
    """An upper bidiagonal matrix (1 on the diagonal, -2 above): its entries are exact in 16 bits, so the
    low-precision LU is A itself and the estimate sees cond_2 = 5.6e14, beyond cond u_p < 2^6."""
    n = 48
    a = np.eye(n) - 2 * np.eye(n, k=1)
    assert np.linalg.cond(a) * U_PRECOND > LIMIT
    with pytest.raises(ParameterError, match=r"cond\(A\) u_p < 64.*got cond_2\(A\) >= [0-9.e+]+ \(a lower estimate"):
        # (a budget at which GMRES's products plan too: they are planned before the factorization)
        solve_square(a, np.ones(n), precision=precision, refinement="gmres", memory="256KiB")


@pytest.mark.parametrize("precision", ["fp16", pytest.param("bf16", marks=pytest.mark.slow)])
def test_stall_of_a_budget_shortened_restart_names_memory(precision):
    """n = 128 at cond 1e6: at 256 KiB the Krylov basis fits 20 vectors, and GMRES(20) stalls at a backward
    error near 1e-6 where GMRES(100) refines to float64's. The refusal had named only a wider precision; it
    now names the budget too, and the larger budget it points to solves the system (the same factorization:
    both budgets plan two LU panels of 64)."""
    a = _randsvd(128, 1e6, seed=6)
    b = np.random.default_rng(1).standard_normal((128, 1))
    with pytest.raises(ConvergenceError, match=r"or a larger memory= \(GMRES restarted every 20 iterations.*up to 100"):
        bl.solve(a, b, precision=precision, memory="256KiB")
    x = bl.solve(a, b, precision=precision, memory="512KiB")
    assert x.report["gmres_restart"] == 100 and x.report["plan"]["tile"] == 64
    _check(x, a, b, 1e6, precision)


def test_scaling_brings_a_matrix_outside_fp16s_range_into_it():
    """Rows from 1e-6 to 1e6 (entries up to 1e7, down to 1e-9): unscaled, float16 overflows and flushes
    them; the equilibration and the two-sided scaling (Higham, Pranesh, Zounon 2019) make it solvable at
    float64 accuracy."""
    rng = np.random.default_rng(4)
    g = rng.standard_normal((N, N)) + np.sqrt(N) * np.eye(N)
    d = np.logspace(-6, 6, N)
    rng.shuffle(d)
    a = d[:, None] * g
    b = rng.standard_normal((N, 1))
    raw = round_to(a.astype(np.float32), "fp16")
    assert np.isinf(raw).any() and (raw[a != 0] == 0).any()  # outside float16's range unscaled
    x = bl.solve(a, b, precision="fp16", memory=MEMORY)
    r = x.report
    assert r["backward_error"] <= np.sqrt(N) * EPS64
    assert_residual(a, x.to_numpy(), b, dtype=np.float64)
    kappa = np.linalg.cond(a)
    assert_solve(x.to_numpy(), np.linalg.solve(a, b), a, dtype=np.float64, cond=kappa)
    # rows scaled by powers of two across the range: by the equilibration of A (LAPACK's rule, ROWCND 1e-12),
    # before the format's own scaling, which then finds R A C's rows alike
    eq = r["equilibration"]
    assert eq["applied"] and eq["row_exponents"][1] - eq["row_exponents"][0] >= 2 * np.log2(1e6) - 4
    assert r["scaling"]["rounding_perturbation"] <= FORMATS["fp16"]["u"]


#: ``(ea, eb)``: the powers of two of A and b (A near 2^1000 is beyond float32's cast: 'mixed' refuses it
#: by name, tests/solve/test_factor_square_solve.py)
NORMS_BEYOND = [(0, -664), (0, 664), (-1000, 0), (1000, 0)]


@pytest.mark.parametrize("precision, refinement, assume_a, ea, eb", [
    (p, r, s, ea, eb) for p, r, s in [("fp16", "auto", "gen"), ("bf16", "auto", "pos"), ("fp16", "plain", "pos"),
                                      ("mixed", "gmres", "gen")]
    for ea, eb in NORMS_BEYOND if not (p == "mixed" and ea)])
def test_refined_where_the_norms_leave_float64s_range(precision, refinement, assume_a, ea, eb):
    """``2^ea A x = 2^eb b`` with b (or A and b) near 1e-200 or 1e200 (found by a randomized search): the
    refinement's residual and solution norms, taken by summing squares, underflowed to 0 (a backward
    error of 0 after step 0, then refused as "A is too ill-conditioned") or overflowed to NaN (refused
    as not converging). The scaled system is the system (powers of two): x is ``2^(eb - ea)`` times
    the solution of ``A y = b``, refined to float64's backward error."""
    kappa = 10.0  # plain refinement from fp16 contracts by about cond u_16 per step
    a = _randsvd(N, kappa, seed=6, spd=assume_a == "pos")
    b = np.random.default_rng(5).standard_normal((N, 2))
    x = bl.solve(np.ldexp(a, ea), np.ldexp(b, eb), precision=precision, refinement=refinement, assume_a=assume_a,
                 memory=MEMORY)
    y = np.ldexp(x.to_numpy(), ea - eb)  # exact
    assert x.report["backward_error"] <= np.sqrt(N) * EPS64
    assert_residual(a, y, b, dtype=np.float64)
    assert_solve(y, np.linalg.solve(a, b), a, dtype=np.float64, cond=kappa)


@pytest.mark.parametrize("precision, assume_a", [("fp16", "gen"), ("bf16", "pos")])
@pytest.mark.parametrize("ea, eb, way", [(1000, -664, "up"), (-1000, 664, "down")])
def test_solution_beyond_float64s_range_is_named(precision, assume_a, ea, eb, way):
    """``2^ea A x = 2^eb b``: x near ``2^(eb - ea)`` is ``2^-1664`` (0 in float64) or ``2^1664`` (Inf), found
    by a randomized search. It had been refused as not converging (backward error 1), as a singular A
    (the row scaling of b near 2^664 by 2^1000 overflowed before the solves), or by a condition
    estimate of inf; named now, from the first solve, with the fix, which solves it."""
    a = _randsvd(N, 1e2, seed=7, spd=assume_a == "pos")
    b = np.random.default_rng(8).standard_normal((N, 1))
    kw = dict(precision=precision, assume_a=assume_a, memory=MEMORY)
    with pytest.raises(ParameterError, match=rf"b: must give a solution x = A\^-1 b within float64's range.*"
                       rf"Fix: scale b {way} by a power of two"):
        bl.solve(np.ldexp(a, ea), np.ldexp(b, eb), **kw)
    eb = eb + (1000 if way == "up" else -1000)  # the fix: x near 2^(eb - ea) = 2^-+664
    x = bl.solve(np.ldexp(a, ea), np.ldexp(b, eb), **kw)
    y = np.ldexp(x.to_numpy(), ea - eb)  # exact
    assert_residual(a, y, b, dtype=np.float64)
    assert_solve(y, np.linalg.solve(a, b), a, dtype=np.float64, cond=1e2)


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
@pytest.mark.parametrize("e", [-20, 100])
def test_positive_definite_with_one_line_scaled_is_scaled_back(precision, e):
    """``D A D`` (positive definite, ``cond 1e3``) with ``d_6 = 2^e`` (found by a randomized search): the
    row maxima's symmetric scaling left it as ill-conditioned as given (the off-diagonal entries of line
    6 set the other rows' maxima), and GMRES-IR refused it (first step, or the condition rule at an
    estimate near 1e34). The diagonal's scaling (Higham and Pranesh 2021) undoes D: refined to float64's
    backward error of the system as given."""
    a = _randsvd(N, 1e3, seed=9, spd=True)
    d = np.ones(N)
    d[6] = 2.0 ** e
    a = d[:, None] * a * d[None, :]  # exact
    b = np.random.default_rng(10).standard_normal((N, 1))
    x = bl.solve(a, b, assume_a="pos", precision=precision, memory=MEMORY)
    assert x.report["backward_error"] <= np.sqrt(N) * EPS64
    assert_residual(a, x.to_numpy(), b, dtype=np.float64)
    lo, hi = x.report["scaling"]["row_scale_range"]
    assert abs(np.log2(hi / lo) - abs(e)) <= 1  # the scaling took out d_6 (powers of two near a_ii^(-1/2))


@pytest.mark.parametrize("precision, refinement", [("fp16", "auto"), ("mixed", "gmres")])
def test_solution_whose_norm_is_beyond_float64s_range_is_named(precision, refinement):
    """x with every entry below 1.8e308 and ``||x||_F`` beyond it (found by a randomized search: b near
    2^1000): the condition estimate, a ratio of norms, had been inf (refused by the condition rule), the
    backward error NaN. Named from the first solve; the fix (b scaled down) solves it."""
    a = _randsvd(N, 1e2, seed=11)
    b = np.random.default_rng(12).standard_normal((N, 1))
    y = np.linalg.solve(a, b)
    p = 1023 - int(np.frexp(np.abs(y).max())[1])  # max |x| in [2^1022, 2^1023): ||x||_F near 2^1024 or beyond
    assert not np.isfinite(np.linalg.norm(np.ldexp(y, p)))
    kw = dict(precision=precision, refinement=refinement, memory=MEMORY)
    with pytest.raises(ParameterError, match=r"b: must give a solution x = A\^-1 b within float64's range.*"
                       r"got \|\|x_0\|\|_F beyond.*Fix: scale b down by a power of two"):
        bl.solve(a, np.ldexp(b, p), **kw)
    x = bl.solve(a, np.ldexp(b, p - 8), **kw)  # the fix
    assert_residual(a, np.ldexp(x.to_numpy(), 8 - p), b, dtype=np.float64)


def test_backward_error_keeps_its_terms_in_range():
    """``res / (||A|| ||x|| + ||b||)`` with its denominator formed by powers of two: the terms' products
    overflow or underflow as float64 products, and a zero x (a solution below float64's range) must
    give 1, not 0 (a 0 had been reported as converged). Three roundings (product, sum, quotient)."""
    from blocklin.linalg.blocks.scaling import backward_error

    rel = 3 * eps(np.float64)
    assert backward_error(1.1e-199, 3.5e301, 0.0, 1.1e-199) == 1.0  # x = 0: ||b|| / ||b||
    assert backward_error(1e-300, 1e-200, 1e-200, 0.0) == pytest.approx(1e100, rel=rel)  # product underflows
    assert backward_error(1e283, 1e300, 1e200, 1e-300) == pytest.approx(1e-217, rel=rel)  # product overflows
    assert backward_error(1.0, 2.0, 3.0, 4.0) == pytest.approx(0.1, rel=rel)
    assert backward_error(0.0, 0.0, 0.0, 0.0) == 0.0
    assert backward_error(1.0, np.inf, 1.0, 1.0) == np.inf  # nothing measured: never converged


def test_rounding_rule_refuses_what_the_format_cannot_hold():
    u = FORMATS["fp16"]["u"]
    check_rounding(u, "fp16")  # what rounding to nearest can do
    with pytest.raises(ParameterError, match=r"precision: 'fp16' needs A.*2u = .*got \|\|A_s - fl\(A_s\)\|\|_F"):
        check_rounding(3 * u, "fp16")
    with pytest.raises(ParameterError, match="'bf16'"):
        check_rounding(float("inf"), "fp16")  # overflow


def test_gmres_matches_a_direct_solve():
    """The lockstep GMRES against LAPACK: each column of A d = r to its tolerance, restarted."""
    rng = np.random.default_rng(6)
    a = np.eye(60) + 0.4 * rng.standard_normal((60, 60)) / np.sqrt(60)
    r = rng.standard_normal((60, 3))
    r[:, 1] = 0.0  # a zero right-hand side stays zero

    class Ops:
        def matvec(self, x):
            return a @ x

        def precond(self, x):
            return x

    d, its, converged = gmres(Ops(), r, restart=8, tol=1e-10, max_iter=200)
    assert converged and its > 8  # restarted at least once
    ref = np.linalg.solve(a, r)
    assert np.linalg.norm(d - ref) <= 1e-8 * np.linalg.norm(ref)
    assert not d[:, 1].any()


def test_krylov_budget_refusal_names_the_minimum():
    with pytest.raises(BudgetError, match=r"GMRES vectors.*pass memory >= \d+ bytes") as e:
        krylov_plan(10_000, 1, 100_000, what="precision='fp16'")
    assert e.value.minimum == 2 * 10 * 8 * 10_000
    assert krylov_plan(100, 1, e.value.minimum, what="x")[0] >= 5


def test_many_right_hand_sides_take_the_shorter_restart_for_wider_blocks():
    """Where the full restart leaves room for fewer columns than a chunk, the shorter one is taken when it
    holds more of them: an inverse of n = 190 at 4x its least budget had been refined 2 columns at a time
    (restart 100, 95 blocks, each GMRES iteration a pass over the factor: 52 s), now 11 (restart 20: 9 s).
    Where the full restart holds a whole chunk it is kept."""
    from blocklin.linalg.solve.gmres_ir import RESTART, SHORT

    n, memory = 190, 936000  # half of it: 468000 bytes of GMRES vectors
    restart, width = krylov_plan(n, n, memory, what="x", chunk=144)
    assert (restart, width) == (SHORT, 468000 // ((SHORT + 5) * 8 * n))
    assert width > 468000 // ((RESTART + 5) * 8 * n)
    assert krylov_plan(n, 2, memory, what="x", chunk=2) == (RESTART, 2)  # a chunk fits the full restart


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
def test_inv_half_one_panel(precision):
    """inv(precision=...) is A X = I by the 16-bit route, in column blocks; at this budget the LU is one
    panel (the plumbing, fast); the GEMM-rounding case is the slow test below."""
    a = _randsvd(48, 1e3, seed=8)
    x = bl.inv(a, precision=precision, memory="2MiB")
    r, xn = x.report, x.to_numpy()
    assert r["precision"] == precision and r["operation"] == "inv" and xn.dtype == np.float64
    assert r["backward_error"] <= np.sqrt(48) * EPS64
    assert_residual(a, xn, np.eye(48), dtype=np.float64)
    assert_solve(xn, np.linalg.inv(a), a, dtype=np.float64, cond=1e3)


@pytest.mark.slow
def test_inv_half_with_rounded_gemms():
    """Two LU panels at this budget, so the GEMM update's inputs are rounded; the Krylov vectors of one
    column fit beside them: 64 blocks of one column (about a minute)."""
    a = _randsvd(64, 1e2, seed=9)
    x = bl.inv(a, precision="fp16", memory="128KiB")
    r, xn = x.report, x.to_numpy()
    assert r["plan"]["tile"] < 64 and r["rhs_blocks"] > 1
    assert r["backward_error"] <= np.sqrt(64) * EPS64
    assert_residual(a, xn, np.eye(64), dtype=np.float64)
    assert_solve(xn, np.linalg.inv(a), a, dtype=np.float64, cond=1e2)


@pytest.mark.parametrize("bad", [np.complex128, np.float32])
def test_half_refuses_complex_and_float32_data(bad):
    a = (np.eye(8) * 3).astype(bad)
    with pytest.raises(ParameterError, match=r"precision: 'fp16' factors in float32 with 16-bit GEMM inputs.*"
                       r"must be float64 \(not complex\)"):
        bl.solve(a, np.ones((8, 1), dtype=bad), precision="fp16")
    with pytest.raises(ParameterError, match="precision"):
        bl.inv(a, precision="bf16")


@pytest.mark.parametrize("kwargs, match", [
    ({"method": "schur"}, "method must be 'auto' or 'lu'"),
    ({"explain": True}, "no inverse plan"),
    ({"refine": 2}, "refine='auto'"),
])
def test_inv_half_refuses_what_its_route_does_not_take(kwargs, match):
    with pytest.raises(ParameterError, match=f"precision: 'fp16' inverts by the square solve.*{match}"):
        bl.inv(np.eye(4) * 2, precision="fp16", **kwargs)
    with pytest.raises(ParameterError, match="no inverse plan"):
        bl.inv_plan(np.eye(4), precision="bf16")


def test_refinement_vocabulary():
    a = np.eye(4) * 2
    with pytest.raises(ParameterError, match="refinement"):
        solve_square(a, np.ones(4), refinement="gmres")  # precision='double'
    with pytest.raises(ParameterError, match="refinement"):
        solve_square(a, np.ones(4), precision="fp16", refinement="newton")


# -- on the CuPy stand-in -------------------------------------------------------------------------
@pytest.mark.parametrize("precision,fmt", [("fp16", "float16"), ("bf16", "bfloat16")])
def test_half_gemms_on_the_gpu_take_16bit_inputs(standin, precision, fmt):
    a = _randsvd(N, 1e3, seed=12)
    b = np.random.default_rng(7).standard_normal((N, 1))
    cupy_standin.STATE.counts.clear()
    x = bl.solve(a, b, precision=precision, device="gpu", memory=MEMORY)
    counts = dict(cupy_standin.STATE.counts)
    assert counts.get(f"cublas.gemm {fmt} inputs", 0) > 0  # the factorization's updates
    assert counts.get("cublas.gemm tf32", 0) == 0 and cupy_standin.STATE.math_mode == 0
    r = x.report
    assert r["backward_error"] <= np.sqrt(N) * EPS64 and "on the GPU" in r["half_gemm"]
    assert_residual(a, x.to_numpy(), b, dtype=np.float64)
    assert_solve(x.to_numpy(), np.linalg.solve(a, b), a, dtype=np.float64, cond=1e3)
    cupy_standin.STATE.counts.clear()
    bl.solve(a, b, precision="mixed", device="gpu", memory=MEMORY)  # float32 operands: no 16-bit GEMM
    assert cupy_standin.STATE.counts.get("cublas.gemm float16 inputs", 0) == 0
    assert cupy_standin.take_races() == []


def test_cli_half_precisions(tmp_path):
    import subprocess
    import sys

    a = _randsvd(48, 1e2, seed=13)
    s = bl.from_array(a, tmp_path / "s.zarr")
    y = bl.from_array(np.random.default_rng(8).standard_normal((48, 1)), tmp_path / "y.zarr")
    run = [sys.executable, "-m", "blocklin.cli.main"]
    subprocess.run(run + ["solve", str(s.path), str(y.path), "-o", str(tmp_path / "x.zarr"), "--precision", "fp16",
                          "--memory", "2MiB"], check=True, capture_output=True)
    x = bl.open(tmp_path / "x.zarr")
    assert x.provenance["params"]["precision"] == "fp16"
    assert_residual(a, x.to_numpy(), y.to_numpy(), dtype=np.float64)
    out = subprocess.run(run + ["inv", str(s.path), "-o", str(tmp_path / "i.zarr"), "--precision", "bf16",
                                "--memory", "2MiB"], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert_solve(bl.open(tmp_path / "i.zarr").to_numpy(), np.linalg.inv(a), a, dtype=np.float64, cond=1e2)


@pytest.mark.slow
def test_beyond_what_gmres_ir_recovers_stops_with_the_fix():
    """cond 1e12 from an fp16 LU: the estimate saturates near 1 / u_16 (M is that far from A), so it is
    the refinement that stops: GMRES-IR stalls above the tolerance and the error names the fix."""
    a = _randsvd(N, 1e12, seed=3)
    b = np.random.default_rng(0).standard_normal((N, 1))
    with pytest.raises(ConvergenceError, match=r"'fp16' must refine.*gmres refinement.*GMRES iterations.*"
                       r"Fix: pass precision='mixed'"):
        bl.solve(a, b, precision="fp16", memory=MEMORY)
