"""Differential checks of the factorizations, solves and inverses against NumPy/SciPy.

A small sweep of what a randomized search covered more widely: degenerate shapes (1 x 1, 1 x n,
n x 1, tall, wide), every input dtype (float32/64, complex64/128, integers and booleans, computed
in float64), stores chunked by 1 and by more than the matrix, and the schedulers. Each result is
held to the norm-wise bound of its error analysis (``support.tolerances``), in the dtype it was
computed in, and its shape and dtype to NumPy's.
"""

from __future__ import annotations

import numpy as np
import pytest
import scipy.linalg as sl

import blocklin as bl
from support.tolerances import assert_factorization, assert_orthonormal, assert_residual, assert_solve, eps

#: the cases beyond a few per test run in the slow job (the default job's time is short)
SLOW = pytest.mark.slow


def _matrix(shape, dtype, seed=0):
    rng = np.random.default_rng(seed)
    dt = np.dtype(dtype)
    if dt.kind == "b":
        return rng.random(shape) < 0.5
    if dt.kind in "iu":
        return rng.integers(-5, 6, shape).astype(dt)
    a = rng.standard_normal(shape)
    if dt.kind == "c":
        a = a + 1j * rng.standard_normal(shape)
    return a.astype(dt)


def _work_dtype(dtype):
    """The dtype blocklin computes an input of ``dtype`` in: its own, float64 for integers and booleans."""
    dt = np.dtype(dtype)
    return dt if dt.kind in "fc" else np.dtype(np.float64)


def _stored(a, tmp_path, chunks, name="a.zarr"):
    """``a`` in a zarr store chunked ``chunks`` (``"over"``: larger than the matrix), or ``a`` itself."""
    if chunks is None:
        return a
    c = (a.shape[0] + 3, a.shape[1] + 2) if chunks == "over" else (1, 1) if chunks == 1 else chunks
    return bl.from_array(a, tmp_path / name, chunks=c, codec="zstd")


def _f64(x):
    return np.asarray(x, dtype=np.complex128 if np.iscomplexobj(x) else np.float64)


def _nonsingular(n, dtype, seed=0):
    """A square matrix of ``dtype`` far from singular (diagonally dominant for integers and booleans)."""
    a = _matrix((n, n), dtype, seed)
    if np.dtype(dtype).kind in "biu":
        a = (a.astype(np.int64) + 3 * n * np.eye(n, dtype=np.int64)).astype(np.int64 if a.dtype == bool else a.dtype)
    return a


@pytest.mark.parametrize("shape,dtype,chunks", [
    ((1, 1), np.float64, None), ((1, 5), np.complex64, 1), pytest.param((5, 1), np.float32, "over", marks=SLOW),
    ((9, 4), np.int32, (2, 3)), pytest.param((4, 9), np.complex128, (1, 9), marks=SLOW),
    pytest.param((7, 7), np.bool_, (3, 2), marks=SLOW),
])
def test_lu_of_any_shape_and_dtype_reproduces_pa(shape, dtype, chunks, tmp_path):
    a = _matrix(shape, dtype)
    f = bl.lu(_stored(a, tmp_path, chunks), memory="1MiB")
    got = f.to_numpy()
    wdt = _work_dtype(dtype)
    assert got.shape == shape and got.dtype == wdt
    m, n = shape
    k = min(m, n)
    low, up = np.tril(got, -1)[:, :k] + np.eye(m, k), np.triu(got)[:k]
    pa = _f64(a).copy()
    for i, p in enumerate(f.report["pivots"]):
        pa[[i, p]] = pa[[p, i]]
    assert_factorization(pa, _f64(low) @ _f64(up), factors=(low, up), dtype=wdt)


@pytest.mark.parametrize("shape,dtype,chunks", [
    ((1, 1), np.complex128, 1), pytest.param((1, 6), np.float64, None, marks=SLOW), ((6, 1), np.float32, (2, 1)),
    pytest.param((11, 5), np.complex64, "over", marks=SLOW), ((5, 11), np.int64, (2, 4)),
])
def test_qr_of_any_shape_and_dtype_is_orthonormal_times_upper(shape, dtype, chunks, tmp_path):
    a = _matrix(shape, dtype, seed=1)
    q, r = bl.qr(_stored(a, tmp_path, chunks), q=tmp_path / "q.zarr", mode="reduced", memory="1MiB")
    q, r = q.to_numpy(), r.to_numpy()
    k, wdt = min(shape), _work_dtype(dtype)
    assert q.shape == (shape[0], k) and r.shape == (k, shape[1]) and q.dtype == r.dtype == wdt
    assert not np.any(np.tril(r, -1))
    assert_orthonormal(q, dtype=wdt)
    assert_factorization(a, _f64(q) @ _f64(r), dtype=wdt, const=4.0)


@pytest.mark.parametrize("n,dtype,chunks,lower", [
    pytest.param(1, np.float32, None, True, marks=SLOW), (6, np.complex128, 1, False), (13, np.float64, (4, 4), True),
    pytest.param(9, np.complex64, "over", False, marks=SLOW),
])
def test_cholesky_of_any_dtype_and_chunking_reproduces_a(n, dtype, chunks, lower, tmp_path):
    g = _f64(_matrix((n, n), dtype, seed=2))
    a = (g @ g.conj().T / n + np.eye(n)).astype(dtype)
    c = bl.cholesky(_stored(a, tmp_path, chunks), lower=lower, memory="1MiB").to_numpy()
    assert c.shape == (n, n) and c.dtype == np.dtype(dtype)
    assert not np.any(np.triu(c, 1) if lower else np.tril(c, -1))
    c = _f64(c)
    assert_factorization(a, c @ c.conj().T if lower else c.conj().T @ c, factors=(c, c), dtype=dtype)


@pytest.mark.parametrize("n,dtype,chunks", [
    pytest.param(1, np.float64, None, marks=SLOW), (5, np.int32, 1), (12, np.complex64, (5, 3)),
    pytest.param(8, np.bool_, "over", marks=SLOW),
])
def test_square_solve_inverse_and_slogdet_of_any_dtype(n, dtype, chunks, tmp_path):
    a = _nonsingular(n, dtype, seed=3)
    wdt = _work_dtype(dtype)
    b = _matrix((n, 2), wdt, seed=4)
    a_in = _stored(a, tmp_path, chunks)
    a64 = _f64(a)
    x = bl.solve(a_in, b, memory="1MiB").to_numpy()
    assert x.shape == (n, 2) and x.dtype == wdt
    assert_residual(a64, x, b, dtype=wdt)
    assert_solve(x, np.linalg.solve(a64, _f64(b)), a64, dtype=wdt)
    inv = bl.inv(a_in, memory="1MiB").to_numpy()
    assert inv.shape == (n, n) and inv.dtype == wdt
    assert_solve(inv, np.linalg.inv(a64), a64, dtype=wdt)
    sign, logdet = bl.slogdet(a_in, memory="1MiB")
    ref_sign, ref_logdet = np.linalg.slogdet(a64)
    # a backward error E of the LU moves log|det A| by |tr(A^-1 E)| <= n ||A^-1||_2 ||E||_2 (||E|| <= 4 n eps ||A||)
    bound = 4 * n * n * eps(wdt) * np.linalg.cond(a64)
    assert abs(logdet - ref_logdet) <= bound + 4 * eps(wdt) * abs(ref_logdet)
    assert abs(sign - ref_sign) <= 2 * bound


@pytest.mark.parametrize("dtype,trans,lower", [
    pytest.param(np.float32, 0, True, marks=SLOW), pytest.param(np.float64, 1, False, marks=SLOW),
    (np.complex128, 2, True), pytest.param(np.complex64, 1, False, marks=SLOW),
])
def test_triangular_and_factored_solves_match_scipy(dtype, trans, lower, tmp_path):
    n = 10
    t = _matrix((n, n), dtype, seed=5)
    t = np.tril(t) if lower else np.triu(t)
    t[np.diag_indices(n)] = 4.0  # well conditioned
    b = _matrix((n, 3), dtype, seed=6)
    x = bl.solve_triangular(_stored(t, tmp_path, (3, 4)), b, lower=lower, trans=trans, memory="1MiB").to_numpy()
    op = _f64(t) if trans == 0 else (_f64(t).T if trans == 1 else _f64(t).conj().T)
    assert x.shape == (n, 3) and x.dtype == np.dtype(dtype)
    assert_solve(x, sl.solve_triangular(_f64(t), _f64(b), lower=lower, trans=trans), op, dtype=dtype)
    a = _nonsingular(n, dtype, seed=7)
    f = bl.lu(a, tmp_path / "lu.zarr", memory="1MiB")
    assert_solve(bl.lu_solve(f, b, memory="1MiB").to_numpy(), np.linalg.solve(_f64(a), _f64(b)), _f64(a),
                 dtype=dtype)


@pytest.mark.parametrize("shape,dtype", [pytest.param((1, 1), np.float64, marks=SLOW), ((7, 1), np.complex128),
                                         pytest.param((1, 7), np.float32, marks=SLOW),
                                         pytest.param((12, 5), np.int16, marks=SLOW), ((5, 12), np.complex64)])
def test_lstsq_of_any_shape_matches_numpy(shape, dtype):
    a = _matrix(shape, dtype, seed=8)
    wdt = _work_dtype(dtype)
    b = _matrix((shape[0],), wdt, seed=9)
    x, _, rank, s = bl.lstsq(a, b)
    x = np.asarray(x)
    ref, _, ref_rank, ref_s = np.linalg.lstsq(_f64(a), _f64(b), rcond=None)
    assert x.shape == (shape[1],) and rank == ref_rank
    k = min(shape)
    assert np.linalg.norm(np.asarray(s, dtype=np.float64) - ref_s) <= 4 * max(shape) * eps(wdt) * np.linalg.norm(ref_s)
    # full rank: the perturbation bound of least squares (Higham Thm 20.1), kappa and kappa^2 ||r|| terms
    kappa = ref_s[0] / ref_s[k - 1]
    r = np.linalg.norm(_f64(a) @ ref - _f64(b))
    bound = 8 * max(shape) * eps(wdt) * (kappa * np.linalg.norm(ref) + kappa ** 2 * r / ref_s[0])
    assert np.linalg.norm(_f64(x) - ref) <= bound


@pytest.mark.slow
@pytest.mark.parametrize("scheduler", ["sync", "threads", "client"])
def test_factorizations_and_solves_agree_on_every_scheduler(scheduler, request, tmp_path):
    """Out of core (stored with chunks of 7, a 1 MiB budget): the same bits on every scheduler, each
    within its bound."""
    sched = request.getfixturevalue("client") if scheduler == "client" else scheduler
    n = 60
    a = _nonsingular(n, np.float64, seed=10)
    b = _matrix((n, 2), np.float64, seed=11)
    A = _stored(a, tmp_path, (7, 7))
    x = bl.solve(A, b, memory="1MiB", scheduler=sched).to_numpy()
    assert_solve(x, np.linalg.solve(a, b), a)
    f = bl.lu(A, tmp_path / "lu.zarr", memory="1MiB", scheduler=sched)
    assert np.array_equal(f.report["pivots"], sl.lu_factor(a)[1])
    g = a @ a.T / n + np.eye(n)
    c = bl.cholesky(_stored(g, tmp_path, (7, 7), "g.zarr"), memory="1MiB", scheduler=sched).to_numpy()
    assert_factorization(g, c @ c.T, factors=(c, c))
    inv = bl.inv(A, memory="1MiB", scheduler=sched).to_numpy()
    assert_solve(inv, np.linalg.inv(a), a)


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_triangular_solve_without_the_finite_check_names_a_nonfinite_t_not_a_singular_one(bad):
    """``check_finite=False`` with a NaN or Inf off the diagonal of ``t`` (whose diagonal is 2): the
    substitution's NaN had been refused as "a singular or overflowing diagonal tile" (the pass that
    looks for the range dropped the NaN: Python's ``max(0.0, nan)`` is 0.0). ``t`` is named non-finite;
    a NaN in ``b`` is named as a possible cause."""
    n = 20
    t = np.triu(np.ones((n, n))) + np.eye(n)
    t[1, 17] = bad
    with pytest.raises(bl.errors.NonFiniteError, match=r"t: must be finite for a triangular solve.*got largest "
                       rf"magnitude {bad}"):
        bl.solve_triangular(t, np.ones(n), check_finite=False, tile=8)
    t[1, 17] = 1.0
    b = np.ones(n)
    b[15] = bad
    with pytest.raises(bl.errors.SingularMatrixError, match=r"or a NaN or Inf in the right-hand side "
                       r"\(check_finite=False skipped the check"):
        bl.solve_triangular(t, b, check_finite=False, tile=8)
    x = bl.solve_triangular(t, np.ones(n), check_finite=False, tile=8).to_numpy()  # finite: solved
    assert_solve(x, sl.solve_triangular(t, np.ones((n, 1))), t)


@pytest.mark.parametrize("bad", [np.nan, np.inf])
@pytest.mark.parametrize("where", [(0, 35), (3, 30), (9, 20)], ids=["corner", "first tile row", "middle"])
def test_lu_solve_with_the_finite_check_names_a_nonfinite_entry_of_u_off_its_diagonal_tiles(where, bad):
    """``lu_solve`` with the finite check on and a NaN or Inf in ``U`` outside its diagonal tiles: the back
    substitution read those tiles unchecked (the forward step reads ``L``'s triangle and the diagonal tiles
    whole), and the NaN was refused as ``check_finite=False``'s guard refuses it, saying that option "skipped
    the check", which was on. Now the tiles are checked as read: the refusal names ``lu`` and the entry's
    position; with ``check_finite=False`` the guard's refusal stands, and a finite factor is solved."""
    n = 40
    rng = np.random.default_rng(21)
    a = rng.standard_normal((n, n)) + n * np.eye(n)
    lu, piv = sl.lu_factor(a)
    f = lu.copy()
    f[where] = bad
    with pytest.raises(bl.errors.NonFiniteError, match=rf"^lu: must be finite \(check_finite is on\); got {bad} at "
                       rf"\[{where[0]}, {where[1]}\]"):
        bl.lu_solve((f, piv), np.ones((n, 2)), tile=8)
    with pytest.raises(bl.errors.NonFiniteError, match=r"^lu: must be finite for a triangular solve .*check_finite="
                       rf"False skipped the check.*got largest magnitude {bad}"):
        bl.lu_solve((f, piv), np.ones((n, 2)), tile=8, check_finite=False)
    x = bl.lu_solve((lu, piv), np.ones((n, 2)), tile=8).to_numpy()
    assert_solve(x, sl.lu_solve((lu, piv), np.ones((n, 2))), a)


@pytest.mark.parametrize("shape", [(4, 4), (3, 5)])
def test_qr_without_the_finite_check_refuses_a_nan_that_stays_off_rs_diagonal(shape):
    """``check_finite=False``, ``A = 2 I`` with ``a_12 = NaN``: LAPACK's ``R`` is ``2 I`` with ``r_12 = NaN``,
    which the refusal, reading only ``R``'s diagonal, had let through (the TSQR of ``R`` alone, and the
    wide route's leading block): refused as the other routes do (docs/engine.md)."""
    a = 2.0 * np.eye(*shape)
    a[1, 2] = np.nan
    with pytest.raises(bl.errors.NonFiniteError, match=r"a: must be finite for qr.*got largest magnitude nan"):
        bl.qr(a, check_finite=False)


@pytest.mark.parametrize("where,kw", [
    ("a", {"lam": 0.5}), ("b", {"lam": 0.5, "method": "qr"}), pytest.param("a", {"lam": 0.5, "method": "qr"}, marks=SLOW),
    pytest.param("b", {"lam": 0.5}, marks=SLOW), pytest.param("a", {"lam": [0.1, 1.0], "method": "normal"}, marks=SLOW),
    pytest.param("b", {"lam": [0.1, 1.0], "method": "normal"}, marks=SLOW),
])
def test_ridge_without_the_finite_check_names_the_nonfinite_operand(where, kw):
    """``check_finite=False`` with a NaN in ``a`` (an Inf in ``b``): the tall ridge's Gram matrix or R factor
    (``A^T b``, ``Q^T b``) carried it into NumPy's eigensolver or SVD, which raised ``LinAlgError: SVD did
    not converge``; refused by name, as the square solves refuse it (docs/engine.md)."""
    rng = np.random.default_rng(12)
    a, b = rng.standard_normal((40, 6)), np.ones(40)
    if where == "a":
        a[2, 1] = np.nan
    else:
        b[2] = np.inf
    with pytest.raises(bl.errors.NonFiniteError, match=rf"{where}: must be finite for a least-squares or ridge "
                       r"solve.*check_finite=False"):
        bl.solve(a, b, check_finite=False, **kw)


@pytest.mark.parametrize("bad,assume_a", [(np.nan, "gen"), (np.inf, "pos")])
def test_square_solve_without_the_finite_check_names_a_nonfinite_b_not_as_range(bad, assume_a):
    """``check_finite=False`` with a NaN or Inf in ``b`` of a well-conditioned square system: the overflowed
    substitutions had been refused as ``a``'s range ("must keep the substitutions' products within
    float64's range ... scale a and b", "max |b| / min |u_ii| = 0": the NaN dropped), a fix that cannot
    hold; ``b`` is named non-finite."""
    rng = np.random.default_rng(13)
    a = rng.standard_normal((30, 30)) + 6 * np.eye(30)
    a = a @ a.T if assume_a == "pos" else a
    b = np.ones(30)
    b[4] = bad
    with pytest.raises(bl.errors.NonFiniteError, match=rf"b: must be finite for a square solve.*got largest "
                       rf"magnitude {bad}"):
        bl.solve(a, b, assume_a=assume_a, check_finite=False)


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_wide_qr_without_the_finite_check_refuses_a_nonfinite_a2(bad):
    """``check_finite=False``, a wide ``A`` (40 x 300) with a NaN or Inf right of its leading 40 x 40 block
    (``a[1, 200]``): ``R_2 = Q^H A_2`` had been returned holding it, where docs/engine.md says qr refuses;
    refused from the peaks the GEMM's tiles take of ``R_2``'s strips, naming ``a``."""
    a = np.random.default_rng(14).standard_normal((40, 300))
    a[1, 200] = bad
    with pytest.raises(bl.errors.NonFiniteError, match=rf"a: must be finite for qr.*got largest magnitude {bad}"):
        bl.qr(a, check_finite=False)


def test_qr_whose_r_overflows_names_the_range_not_a_nonfinite_a():
    """Finite data, checked (``check_finite`` on), whose ``R`` leaves float64's range (300 x 40 entries up to
    about 7e307: a column norm beyond 1.8e308): it had been refused as a NaN in the data that
    ``check_finite=False`` let through; named as ``R``'s overflow with the power of two that brings ``a`` in."""
    a = np.random.default_rng(15).standard_normal((300, 40)) * 1.5e307
    with pytest.raises(bl.errors.ParameterError, match=r"a: must have R within float64's range for qr.*"
                       r"\(finite\): R overflowed.*scale a by 2.0\*\*-1023"):
        bl.qr(a)


@pytest.mark.parametrize("bad,pos,route", [
    (np.nan, (0, 0), "cholesky"), (np.inf, (29, 3), "cholesky"), (np.nan, (20, 13), "pos"), (np.nan, (3, 3), "mixed"),
    pytest.param(np.inf, (17, 17), "pos", marks=SLOW), pytest.param(np.nan, (29, 29), "cholesky", marks=SLOW),
])
def test_cholesky_without_the_finite_check_names_a_nonfinite_a_not_an_indefinite_one(bad, pos, route):
    """``check_finite=False``, a NaN or Inf (and its mirror) in a positive definite ``A``, in the first, a
    middle or the last tile: the pivot it reached had been refused as ``NotPositiveDefiniteError`` ("pivot
    <= 0 (or NaN)", a ridge as the fix); the failed pivot looks at the tiles that reach it and names ``a``
    non-finite, as the square solves do (docs/engine.md). ``precision='mixed'``: the float32 pivot had been
    named float32's, ``precision='double'`` the fix (``max |a|`` had passed the NaN over)."""
    g = np.random.default_rng(16).standard_normal((30, 30))
    a = g @ g.T + 30 * np.eye(30)
    a[pos] = a[pos[::-1]] = bad
    with pytest.raises(bl.errors.NonFiniteError, match=rf"a: must be finite for a Cholesky factorization.*got "
                       rf"largest magnitude {bad}"):
        if route == "cholesky":
            bl.cholesky(a, check_finite=False, tile=8)
        else:
            bl.solve(a, np.ones(30), assume_a="pos", check_finite=False,
                     precision="mixed" if route == "mixed" else "double")


@pytest.mark.parametrize("check", [True, False])
def test_cholesky_whose_updates_overflow_names_the_pivot_of_finite_data(check):
    """Finite data whose Cholesky updates overflow (``a_jj = 1e-300`` beside ``a_ij = 1e300``: ``L_ij = Inf``,
    the next diagonal tile's pivot ``-Inf``): not positive definite, named as a pivot that overflowed, with
    the finite check and without it (where the data is looked at and found finite)."""
    a = np.eye(16)
    a[:8, :8] *= 1e-300
    a[8:, :8] = a[:8, 8:] = 1e300
    with pytest.raises(bl.errors.NotPositiveDefiniteError, match=r"a pivot that overflowed to NaN or Inf at "
                       r"row/column 8 .*A's entries being finite"):
        bl.cholesky(a, check_finite=check, tile=8)


@pytest.mark.parametrize("operation,bad,pos", [
    ("lu_solve", np.inf, (20, 20)), ("cho_solve", np.inf, (39, 39)), ("lu_solve", np.nan, (30, 12)),
    pytest.param("lu_solve", np.inf, (5, 2), marks=SLOW), pytest.param("cho_solve", np.inf, (1, 1), marks=SLOW),
    pytest.param("lu_solve", np.nan, (39, 0), marks=SLOW),
])
def test_factored_solves_without_the_finite_check_refuse_a_nonfinite_factor(operation, bad, pos):
    """``check_finite=False`` with a factor holding an Inf on its diagonal (``x_i = (b_i - ...) / Inf = 0``:
    a finite, wrong ``x`` had been returned, as SciPy's is) or a NaN or Inf in ``L`` below the diagonal of
    packed LU factors (solved unscaled: refused as "a singular or overflowing diagonal block" of ``U``):
    refused as ``NonFiniteError`` naming the factor (docs/engine.md), in the first, a middle and the last tile."""
    n = 40
    a = np.random.default_rng(17).standard_normal((n, n)) + 8 * np.eye(n)
    if operation == "lu_solve":
        f, piv = sl.lu_factor(a)
        f[pos] = bad
        arg, name = (f, piv), "lu"
    else:
        f = np.linalg.cholesky(a @ a.T)
        f[pos] = bad
        arg, name = (f, True), "c"
    with pytest.raises(bl.errors.NonFiniteError, match=rf"{name}: must be finite for a triangular solve.*largest "
                       rf"magnitude {bad}"):
        getattr(bl, operation)(arg, np.ones(n), check_finite=False, tile=8)
