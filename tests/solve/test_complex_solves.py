"""Complex solves (lu_solve, cho_solve, solve_triangular, solve with assume_a 'gen'/'pos', det, slogdet)
against SciPy/NumPy, out of core and in memory, on every scheduler.

Ported cases: SciPy's ``linalg/tests/test_basic.py`` (``TestSolve``: complex ``a`` and ``b``, a real ``a`` with
a complex ``b``; ``TestSolveTriangular``: ``trans`` 0/1/2 of complex data), ``test_decomp_lu.py``
(``TestLUSolve.test_lu`` with complex data), ``test_decomp_cholesky.py`` (``TestChoFactor``/``cho_solve``
of a Hermitian matrix); Dask's ``array/tests/test_linalg.py`` (``test_solve``, ``test_cholesky_complex``'s
``A A^H + n I``); NumPy's ``linalg/tests/test_linalg.py`` (``TestDet``/``slogdet`` of complex matrices:
``sign`` a complex number of modulus 1).

Tolerances: the real norm-wise bounds of :mod:`support.tolerances` with ``eps`` of the parts' dtype, times
:data:`COMPLEX` = ``3 sqrt(2)`` (Higham 2002, Lemma 3.5 and §3.6: complex products and inner products carry
``sqrt(2) gamma_{n+2}`` in place of ``gamma_n``).
"""

from __future__ import annotations

import numpy as np
import pytest
import scipy.linalg as sl

import blocklin as bl
from blocklin.errors import DTypeError, NotPositiveDefiniteError, NotSymmetricError, ParameterError, SingularMatrixError
from support.tolerances import assert_residual, assert_solve, eps

CDTYPES = [np.complex64, np.complex128]
COMPLEX = 3 * np.sqrt(2)
SCHEDULERS = ["sync", "threads", "processes"]


def _crandn(rng, shape, dtype=np.complex128):
    return (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(dtype)


def _general(n, dtype, seed=0):
    """Well conditioned (cond about 10): a random complex matrix with a dominant diagonal."""
    return (_crandn(np.random.default_rng(seed), (n, n)) + 3 * np.sqrt(n) * np.eye(n)).astype(dtype)


def _hpd(n, dtype, seed=0):
    g = _crandn(np.random.default_rng(seed), (n, n))
    return (g @ g.conj().T + n * np.eye(n)).astype(dtype)


def _check_solve(a, x, b, dtype, ref=None):
    """Backward error (Higham Thm 9.4, 10.4: 4 n eps ||A|| ||x||) and, against a reference, the forward error
    cond(A) allows, both with the complex factor."""
    assert_residual(a, x, b, dtype=dtype, const=4 * COMPLEX)
    if ref is not None:
        assert_solve(x, ref, a, dtype=dtype, const=8 * COMPLEX)


@pytest.mark.parametrize("dtype", CDTYPES)
@pytest.mark.parametrize("n,tile", [(10, 32), (70, 16)])
def test_lu_solve_complex(dtype, n, tile):
    a = _general(n, dtype, seed=n)
    b = _crandn(np.random.default_rng(1), (n, 3), dtype)
    f = bl.lu(a, tile=tile, scheduler="sync")
    x = bl.lu_solve(f, b, tile=tile, scheduler="sync")[...]
    assert x.dtype == dtype
    _check_solve(a, x, b, dtype, sl.lu_solve(sl.lu_factor(a), b))
    # SciPy's pair, and a 1-D right-hand side (TestLUSolve.test_lu)
    x1 = bl.lu_solve((f[...], f.report["pivots"]), b[:, 0], tile=tile, scheduler="sync")[...]
    _check_solve(a, x1, b[:, :1], dtype, sl.lu_solve(sl.lu_factor(a), b[:, :1]))


@pytest.mark.parametrize("dtype", CDTYPES)
@pytest.mark.parametrize("lower", [True, False])
def test_cho_solve_complex(dtype, lower):
    n = 70
    a = _hpd(n, dtype, seed=2)
    b = _crandn(np.random.default_rng(3), (n, 2), dtype)
    c = bl.cholesky(a, lower=lower, tile=16, scheduler="sync")
    x = bl.cho_solve((c, lower), b, tile=16, scheduler="sync")[...]
    assert x.dtype == dtype
    _check_solve(a, x, b, dtype, sl.cho_solve(sl.cho_factor(a, lower=lower), b))
    # SciPy's factor solved by blocklin: the same convention (A = L L^H or U^H U)
    cf, low = sl.cho_factor(a, lower=lower)
    x2 = bl.cho_solve((np.tril(cf) if low else np.triu(cf), low), b, tile=16, scheduler="sync")[...]
    _check_solve(a, x2, b, dtype)


@pytest.mark.parametrize("dtype", CDTYPES)
@pytest.mark.parametrize("lower", [True, False])
@pytest.mark.parametrize("trans", [0, 1, 2, "N", "T", "C"])
def test_solve_triangular_complex_trans(dtype, lower, trans):
    n = 50
    rng = np.random.default_rng(4)
    full = _crandn(rng, (n, n), dtype) / np.sqrt(n) + 2 * np.eye(n, dtype=dtype)
    t = np.tril(full) if lower else np.triu(full)
    b = _crandn(rng, (n, 2), dtype)
    x = bl.solve_triangular(full, b, lower=lower, trans=trans, tile=16, scheduler="sync")[...]  # one triangle read
    op = {0: t, 1: t.T, 2: t.conj().T, "N": t, "T": t.T, "C": t.conj().T}[trans]
    ref = sl.solve_triangular(t, b, lower=lower, trans=trans)
    # triangular solves: (T + E) x = b with |E| <= gamma_n |T| (Higham Thm 8.5)
    _check_solve(op, x, b, dtype, ref)


@pytest.mark.parametrize("assume_a", ["her", "hermitian"])
def test_scipys_hermitian_assume_a_is_refused_naming_what_takes_it(assume_a):
    """SciPy's ``assume_a='her'`` (Hermitian indefinite, ``hesv``) had been refused with a list that did not
    say why: the refusal names it and the two routes blocklin has for a Hermitian ``a``."""
    a = np.eye(3) + 0j
    with pytest.raises(ParameterError, match=r"SciPy's 'her' is a Hermitian indefinite factorization.*'pos'"):
        bl.solve(a, np.ones(3), assume_a=assume_a)


def test_solve_triangular_trans_refused():
    with pytest.raises(ParameterError, match="trans.*'C'"):
        bl.solve_triangular(np.eye(3), np.ones(3), trans="H")
    with pytest.raises(ParameterError, match="trans"):
        bl.solve_triangular(np.eye(3), np.ones(3), trans=3)


def test_triangular_and_factored_solves_promote_as_numpy():
    """A real factor with a complex ``b`` gives a complex ``x`` (and the reverse), as SciPy/NumPy promote."""
    n = 40
    rng = np.random.default_rng(5)
    t = np.tril(rng.standard_normal((n, n))) / np.sqrt(n) + 2 * np.eye(n)
    bc = _crandn(rng, (n, 2))
    x = bl.solve_triangular(t, bc, lower=True, trans="C", tile=16, scheduler="sync")[...]
    assert x.dtype == np.complex128
    _check_solve(t.T, x, bc, np.complex128, sl.solve_triangular(t, bc, lower=True, trans="C"))
    tc = np.tril(_crandn(rng, (n, n))) / np.sqrt(n) + 2 * np.eye(n)
    br = rng.standard_normal((n, 2))
    x = bl.solve_triangular(tc, br, lower=True, tile=16, scheduler="sync")[...]
    assert x.dtype == np.complex128
    _check_solve(tc, x, br, np.complex128, sl.solve_triangular(tc, br, lower=True))
    a = rng.standard_normal((n, n)) + 2 * np.sqrt(n) * np.eye(n)
    x = bl.lu_solve(bl.lu(a, tile=16, scheduler="sync"), bc, tile=16, scheduler="sync")[...]
    assert x.dtype == np.complex128
    _check_solve(a, x, bc, np.complex128, np.linalg.solve(a, bc))


@pytest.mark.parametrize("dtype", CDTYPES)
@pytest.mark.parametrize("assume_a", ["gen", "pos"])
@pytest.mark.parametrize("memory", ["256KiB", "64MiB"], ids=["out-of-core", "in-memory"])
def test_solve_complex_square(dtype, assume_a, memory):
    """scipy.linalg.solve(a, b, assume_a=...) of complex data (TestSolve), refined to the backward error of
    the dtype: the report's ``||b - A x|| / (||A|| ||x|| + ||b||)`` within ``sqrt(n) eps``, its residuals
    complex."""
    n = 96
    a = _general(n, dtype, seed=6) if assume_a == "gen" else _hpd(n, dtype, seed=6)
    b = _crandn(np.random.default_rng(7), (n, 3), dtype)
    x = bl.solve(a, b, assume_a=assume_a, memory=memory, scheduler="sync")
    assert x.dtype == dtype and x.report["method"] == ("lu" if assume_a == "gen" else "cholesky")
    tiles = x.report["plan"]["tiles"] if "tiles" in x.report["plan"] else -(-n // x.report["plan"]["tile"])
    assert (tiles > 1) == (memory == "256KiB")
    assert x.report["backward_error"] <= np.sqrt(n) * eps(dtype)
    _check_solve(a, x[...], b, dtype, sl.solve(a, b, assume_a=assume_a))


@pytest.mark.parametrize("dtype", CDTYPES)
def test_solve_real_and_complex_operands_promote(dtype):
    """A complex ``b`` with a real ``a`` (and the reverse) of one precision gives ``x`` in the complex dtype, as
    ``numpy.linalg.solve``; the real ``a`` is factored in its real dtype."""
    n = 60
    real = np.finfo(dtype).dtype
    rng = np.random.default_rng(8)
    ar = (rng.standard_normal((n, n)) + 2 * np.sqrt(n) * np.eye(n)).astype(real)
    bc = _crandn(rng, (n, 2), dtype)
    x = bl.solve(ar, bc, memory="256KiB", scheduler="sync")
    assert x.dtype == dtype and x.report["factor_dtype"] == real.name
    assert x.report["backward_error"] <= np.sqrt(n) * eps(dtype)
    _check_solve(ar, x[...], bc, dtype, np.linalg.solve(ar, bc))
    spd = (ar @ ar.T / n + np.eye(n)).astype(real)
    x = bl.solve(spd, bc, assume_a="pos", memory="256KiB", scheduler="sync")
    assert x.dtype == dtype and x.report["method"] == "cholesky"
    _check_solve(spd, x[...], bc, dtype, np.linalg.solve(spd, bc))
    ac = _general(n, dtype, seed=8)
    br = rng.standard_normal((n, 2)).astype(real)
    x = bl.solve(ac, br, memory="256KiB", scheduler="sync")
    assert x.dtype == dtype
    _check_solve(ac, x[...], br, dtype, np.linalg.solve(ac, br))


@pytest.mark.parametrize("real_a", [False, True], ids=["complex-a", "real-a"])
def test_solve_complex_more_right_hand_sides_than_a_panel(real_a):
    """``k`` wider than a panel: the LU in LAPACK's layout, the row swaps and the tiled solves (not the panels'
    own solve), complex right-hand sides with a complex or a real ``a``."""
    n, k = 96, 70
    rng = np.random.default_rng(16)
    a = (rng.standard_normal((n, n)) + 3 * np.sqrt(n) * np.eye(n)) if real_a else _general(n, np.complex128, seed=16)
    b = _crandn(rng, (n, k))
    x = bl.solve(a, b, memory="256KiB", scheduler="sync")
    assert x.report["plan"]["tile"] < k and x.dtype == np.complex128
    assert x.report["backward_error"] <= np.sqrt(n) * eps(np.complex128)
    _check_solve(a, x[...], b, np.complex128, np.linalg.solve(a, b))


def test_solve_complex_refusals():
    n = 20
    a = _general(n, np.complex128)
    b = _crandn(np.random.default_rng(9), (n, 1))
    with pytest.raises(ParameterError, match="assume_a.*complex symmetric"):
        bl.solve(a, b, assume_a="sym")
    with pytest.raises(ParameterError, match="precision.*float64"):
        bl.solve(a, b, precision="mixed")
    with pytest.raises(DTypeError, match="share one dtype"):  # a precision upcast is never silent
        bl.solve(a.astype(np.complex64), b)
    with pytest.raises(NotPositiveDefiniteError, match="Hermitian"):
        bl.solve(-_hpd(n, np.complex128), b, assume_a="pos")


def _symmetric_not_hermitian(n, dtype, seed=0):
    """Complex *symmetric* ``A = A^T`` with a real positive diagonal (its Hermitian check on the diagonal
    passes), not Hermitian: ``n I + S``, ``S`` complex symmetric of norm about ``n / 2``."""
    s = _crandn(np.random.default_rng(seed), (n, n))
    s = (s + s.T) / 2
    np.fill_diagonal(s, 0)
    return (s + n * np.eye(n)).astype(dtype)


@pytest.mark.parametrize("dtype", CDTYPES)
@pytest.mark.parametrize("memory", [None, "256KiB"])
def test_solve_pos_refuses_complex_symmetric(tmp_path, dtype, memory):
    """``assume_a='pos'`` of a complex symmetric, non-Hermitian ``A`` is refused naming ``A^H``: the Cholesky
    reads the lower triangle as that of the Hermitian matrix it stands for and factors another matrix,
    whose refinement against ``A`` stalls (backward error 1e-3 to 1e-6 here against ``tol = sqrt(n) eps``); it
    had returned that ``x`` with a warning blaming the condition number (cond(A) is about 3 here)."""
    n = 6
    a = _symmetric_not_hermitian(n, dtype)
    assert np.linalg.cond(a) < 10 and np.array_equal(a, a.T) and not np.allclose(a, a.conj().T)
    b = _crandn(np.random.default_rng(1), (n, 2), dtype)
    src = bl.from_array(a, str(tmp_path / "a.zarr"), chunks=(2, 2)) if memory else a
    with pytest.raises(NotSymmetricError, match=r"a: must be Hermitian positive definite for assume_a='pos'.*A\^H"):
        bl.solve(src, b, assume_a="pos", scheduler="sync", **({"memory": memory} if memory else {}))
    # the same A with assume_a='gen' is solved (LU), to the backward error of the bound
    x = bl.solve(src, b, assume_a="gen", scheduler="sync", **({"memory": memory} if memory else {})).to_numpy()
    assert_residual(a, x, b, dtype=dtype, const=4 * COMPLEX)


def test_solve_pos_hermitian_not_refused_by_the_check():
    """The check runs on a stall only, and a Hermitian ``A`` formed in floating point (``G G^H + n I``,
    asymmetric by rounding) is solved: its refinement reaches ``tol``."""
    for dtype in CDTYPES:
        a = _hpd(30, dtype)
        b = _crandn(np.random.default_rng(2), (30, 1), dtype)
        x = bl.solve(a, b, assume_a="pos", scheduler="sync").to_numpy()
        assert_residual(a, x, b, dtype=dtype, const=4 * COMPLEX)


@pytest.mark.parametrize("scheduler", SCHEDULERS)
def test_complex_solves_identical_bits_across_schedulers(tmp_path, scheduler):
    n = 80
    a = bl.from_array(_general(n, np.complex128, seed=10), tmp_path / "a.zarr", chunks=(16, 16))
    h = bl.from_array(_hpd(n, np.complex128, seed=10), tmp_path / "h.zarr", chunks=(16, 16))
    b = bl.from_array(_crandn(np.random.default_rng(11), (n, 2)), tmp_path / "b.zarr", chunks=(16, 2))
    got = [bl.solve(a, b, memory="256KiB", scheduler=scheduler, workers=2)[...],
           bl.solve(h, b, assume_a="pos", memory="256KiB", scheduler=scheduler, workers=2)[...]]
    ref = [bl.solve(a, b, memory="256KiB", scheduler="sync")[...],
           bl.solve(h, b, assume_a="pos", memory="256KiB", scheduler="sync")[...]]
    for g, r in zip(got, ref):
        np.testing.assert_array_equal(g, r)
    _check_solve(a[...], got[0], b[...], np.complex128, np.linalg.solve(a[...], b[...]))
    _check_solve(h[...], got[1], b[...], np.complex128, np.linalg.solve(h[...], b[...]))


@pytest.mark.parametrize("dtype", CDTYPES)
def test_det_and_slogdet_complex(dtype):
    """NumPy's slogdet of a complex matrix: ``sign`` of modulus 1 and ``logabsdet``; ``det = sign e^logabsdet``."""
    n = 50
    a = _crandn(np.random.default_rng(12), (n, n), dtype)
    sign, logdet = bl.slogdet(a, memory="256KiB")
    ref_sign, ref_logdet = np.linalg.slogdet(a.astype(np.complex128))
    assert isinstance(sign, complex) and abs(abs(sign) - 1) <= 4 * eps(np.float64)
    # log|det| = sum log|U_ii| with |U_ii| to GEPP's backward error: off by at most n times the relative error
    # of one pivot, and the phase likewise (c n eps rho, the growth factor below 8 for these matrices)
    bound = 8 * COMPLEX * n * eps(dtype) * n
    assert abs(logdet - ref_logdet) <= bound and abs(sign - ref_sign) <= bound
    small = a[:6, :6].astype(np.complex128)
    d = bl.det(small)
    assert isinstance(d, complex)
    assert abs(d - np.linalg.det(small)) <= 8 * COMPLEX * 6 * eps(dtype) * 6 * abs(np.linalg.det(small))
    singular = np.ones((8, 8), dtype=dtype)
    assert bl.slogdet(singular) == (0j, -np.inf) and bl.det(singular) == 0j


def test_numpy_functions_on_a_complex_matrix(tmp_path):
    """NumPy's dispatch: np.linalg.solve, cholesky, slogdet of a complex blocklin.Matrix run blocklin's."""
    n = 40
    h = bl.from_array(_hpd(n, np.complex128, seed=13), tmp_path / "h.zarr")
    b = _crandn(np.random.default_rng(14), (n,))
    low = np.linalg.cholesky(h)
    _check_solve(h[...], bl.cho_solve(low, b)[...], b.reshape(-1, 1), np.complex128)
    x = np.linalg.solve(h, b)
    _check_solve(h[...], np.asarray(x).reshape(-1, 1), b.reshape(-1, 1), np.complex128)
    sign, logdet = np.linalg.slogdet(h)
    ref = np.linalg.slogdet(h[...])
    assert abs(sign - ref[0]) <= 1e-12 and abs(logdet - ref[1]) <= 1e-10 * abs(ref[1])


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", CDTYPES)
def test_complex_solves_on_gpu(dtype):
    """Through CudaDevice (a GPU, or the CuPy stand-in: ``pytest --cupy-standin``)."""
    n = 70
    rng = np.random.default_rng(15)
    b = _crandn(rng, (n, 2), dtype)
    for assume_a, a in (("gen", _general(n, dtype, seed=15)), ("pos", _hpd(n, dtype, seed=15))):
        x = bl.solve(a, b, assume_a=assume_a, memory="256KiB", device="gpu", scheduler="sync")
        assert x.report["device"] == "gpu" and x.report["backward_error"] <= np.sqrt(n) * eps(dtype)
        _check_solve(a, x[...], b, dtype, sl.solve(a, b, assume_a=assume_a))
    t = np.tril(_crandn(rng, (n, n), dtype)) / np.sqrt(n) + 2 * np.eye(n, dtype=dtype)
    x = bl.solve_triangular(t, b, lower=True, trans="C", tile=32, device="gpu", scheduler="sync")[...]
    _check_solve(t.conj().T, x, b, dtype, sl.solve_triangular(t, b, lower=True, trans="C"))
    h = _hpd(n, dtype, seed=16)
    c = bl.cholesky(h, tile=32, device="gpu", scheduler="sync")
    x = bl.cho_solve(c, b, tile=32, device="gpu", scheduler="sync")[...]
    _check_solve(h, x, b, dtype, sl.cho_solve(sl.cho_factor(h, lower=True), b))


@pytest.mark.parametrize("dtype", [np.complex128, np.float64])
def test_singular_factor_refused_naming_the_factor(dtype):
    """A factor with a zero on its diagonal (a singular matrix factored) is refused naming the argument
    the caller passed, ``lu`` or ``c``, with fixes that exist for it; the refusal had named the triangular
    solve's own ``t`` and suggested ``lam > 0``, a keyword lu_solve and cho_solve do not have."""
    a = np.array([[1, 2j], [2, 4j]], dtype=dtype) if np.dtype(dtype).kind == "c" else np.array([[1., 2], [2, 4]])
    f = bl.lu(a, scheduler="sync")
    assert f[...][1, 1] == 0  # U's exact zero pivot, as LAPACK's getrf leaves it
    for call in (lambda: bl.lu_solve(f, np.ones(2, dtype), scheduler="sync"),
                 lambda: bl.lu_solve((f[...], f.report["pivots"]), np.ones(2, dtype), scheduler="sync")):
        with pytest.raises(SingularMatrixError, match=r"^lu: .*lu_solve.*zero on the diagonal at row 1.*lstsq"):
            call()
    c = np.array([[1, 0], [1j if np.dtype(dtype).kind == "c" else 1, 0]], dtype=dtype)
    with pytest.raises(SingularMatrixError, match=r"^c: .*cho_solve.*zero on the diagonal at row 1"):
        bl.cho_solve((c, True), np.ones(2, dtype), scheduler="sync")
