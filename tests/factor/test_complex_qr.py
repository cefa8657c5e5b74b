"""blocklin.qr of complex data (tiled Householder, streaming TSQR, the wide route) against NumPy/LAPACK.

``A = Q R`` with ``Q^H Q = I`` and ``R`` upper triangular with a real non-negative diagonal: LAPACK's
``zgeqrf`` (and ``numpy.linalg.qr``, which does not normalize) leave a complex diagonal; blocklin
normalizes ``R`` as it does for real data, ``diag(conj(r_ii) / |r_ii|) R`` and ``Q`` times the
conjugate phases, the unique factorization of a full-rank ``A`` with that diagonal.

Ported cases: SciPy's ``linalg/tests/test_decomp.py`` ``TestQR`` complex cases (``test_simple_complex``,
``test_random_complex``, ``test_random_complex_tall``, ``test_random_complex_trap`` (wide),
``test_random_complex_pivoting`` excepted: no pivoting) and Dask's ``array/tests/test_linalg.py``
``test_tsqr`` shapes with complex data (tall chunked by rows, ``Q^H Q = I``, ``A = Q R``).

Tolerances: Householder QR's backward error ``||A - Q R||_F <= c n eps ||A||_F`` and orthogonality
``||Q^H Q - I||_F <= c m eps sqrt(n)`` (Higham 2002, Thm. 19.4, 19.13; :mod:`support.tolerances`) with
``eps`` of the parts' dtype, times ``3 sqrt(2)`` for complex arithmetic (Lemma 3.5).
"""

from __future__ import annotations

import numpy as np
import pytest

import blocklin as bl
from support.tolerances import assert_factorization, assert_orthonormal, eps

CDTYPES = [np.complex64, np.complex128]
#: The complex-arithmetic factor on the real rounding-error bounds (see the module docstring).
COMPLEX = 3 * np.sqrt(2)


def _rand(shape, dtype, seed=0):
    rng = np.random.default_rng(seed)
    return (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(dtype)


def _normalized(r):
    """NumPy's R with each row multiplied by conj(r_ii) / |r_ii|: a real non-negative diagonal."""
    d = np.sign(np.diag(r)).conj()
    d[d == 0] = 1
    return d[:, None] * r


def _check_r(a, r, dtype):
    m, n = a.shape
    k = min(m, n)
    assert r.dtype == dtype and r.shape == (k, n)
    assert np.array_equal(r, np.triu(r))
    assert not np.diag(r).imag.any() and (np.diag(r).real >= 0).all()  # real, non-negative
    a128, r128 = a.astype(np.complex128), r.astype(np.complex128)
    e = eps(dtype)
    # backward error through the Gram: R^H R = A^H A + E, ||E|| <= c m n u ||A||^2 (Higham Thm. 19.4)
    if m >= n:
        bound = COMPLEX * 4 * m * e * np.linalg.norm(a128) ** 2
        assert np.linalg.norm(r128.conj().T @ r128 - a128.conj().T @ a128) <= bound
    # forward error against NumPy's normalized R: at most cond(A) times the backward error
    ref = _normalized(np.linalg.qr(a128, mode="r"))
    tol = COMPLEX * 4 * max(m, n) * e * np.linalg.cond(a128[:, :k]) * np.linalg.norm(a128)
    assert np.linalg.norm(r128 - ref) <= tol


def _check_qr(a, q, r, dtype):
    _check_r(a, r, dtype)
    m, n = a.shape
    assert q.dtype == dtype and q.shape == (m, min(m, n))
    assert_factorization(a, q.astype(np.complex128) @ r.astype(np.complex128), dtype=dtype, const=2 * COMPLEX)
    assert_orthonormal(q, dtype=dtype, const=2 * COMPLEX)


@pytest.mark.parametrize("dtype", CDTYPES)
@pytest.mark.parametrize("method", ["tiled", "tiles"])
@pytest.mark.parametrize("shape,tile", [((1, 1), 32), ((37, 37), 8), ((101, 61), 16), ((130, 13), 32)],
                         ids=["1x1", "37-prime", "101x61", "130x13-tall"])
def test_complex_householder_qr_matches_numpy(tmp_path, dtype, method, shape, tile):
    # column panels (geqrt, reflectors applied as I - V T^H V^H) and square tiles (geqrt, gemqrt,
    # tpqrt, tpmqrt with 'C')
    a = _rand(shape, dtype, seed=sum(shape))
    q, r = bl.qr(a, tmp_path / "r.zarr", q=tmp_path / "q.zarr", mode="reduced", method=method, tile=tile,
                 scheduler="sync")
    assert r.report["method"] == method
    _check_qr(a, q[...], r[...], dtype)
    # R alone (mode="r") is the same R
    r_only = bl.qr(a, method=method, tile=tile, scheduler="sync")
    assert np.array_equal(r_only[...], r[...])


@pytest.mark.parametrize("dtype", CDTYPES)
def test_complex_tsqr_route_for_r_alone(tmp_path, dtype):
    # Dask's test_tsqr: a tall matrix in row chunks, R in one pass
    a = _rand((300, 23), dtype, seed=3)
    arr = bl.from_array(a, tmp_path / "a.zarr", chunks=(40, 23))
    r = bl.qr(arr, memory="4MiB", scheduler="sync")
    assert r.report["method"] == "tsqr"
    _check_r(a, r[...], dtype)
    t = bl.qr(arr, method="tiled", tile=8, scheduler="sync")
    # both routes give the R with a real non-negative diagonal
    assert np.linalg.norm(t[...].astype(np.complex128) - r[...]) <= COMPLEX * 4 * 300 * eps(dtype) * np.linalg.norm(a)


@pytest.mark.parametrize("dtype", CDTYPES)
@pytest.mark.parametrize("memory", ["256KiB", "64MiB"])
@pytest.mark.parametrize("mode", ["r", "reduced"])
def test_complex_wide_qr_as_numpy(tmp_path, dtype, memory, mode):
    # SciPy's test_random_complex_trap: m < n, R m x n upper trapezoidal, Q m x m
    a = _rand((40, 90), dtype, seed=5)
    arr = bl.from_array(a, tmp_path / "a.zarr", chunks=(16, 16))
    res = bl.qr(arr, mode=mode, memory=memory, scheduler="sync")
    q, r = res if mode == "reduced" else (None, res)
    assert r.report["method"] == "wide"
    _check_r(a, r[...], dtype)
    if q is not None:
        _check_qr(a, q[...], r[...], dtype)


def test_complex_qr_scipy_simple_complex():
    # SciPy's TestQR.test_simple_complex
    a = np.array([[3, 3 + 4j, 5], [5, 2, 2 + 7j], [3, 2, 7]], dtype=np.complex128)
    q, r = bl.qr(a, mode="reduced", scheduler="sync")
    _check_qr(a, q[...], r[...], np.complex128)


@pytest.mark.parametrize("method", ["tiled", "tiles", "tsqr"])
def test_complex_qr_identical_bits_across_schedulers(tmp_path, method):
    a = bl.from_array(_rand((90, 70), np.complex128, seed=6), tmp_path / "a.zarr", chunks=(32, 32))
    if method == "tsqr":
        rs = [bl.qr(a, memory="4MiB", method="tsqr", scheduler=s, workers=2)[...]
              for s in ("sync", "threads", "processes")]
        assert all(np.array_equal(rs[0], x) for x in rs[1:])
        return
    outs = [bl.qr(a, mode="reduced", method=method, tile=32, scheduler=s, workers=2)
            for s in ("sync", "threads", "processes")]
    for q, r in outs[1:]:
        np.testing.assert_array_equal(r[...], outs[0][1][...])
        np.testing.assert_array_equal(q[...], outs[0][0][...])


def test_complex_qr_checks_can_fail():
    # R normalized to a real diagonal is not NumPy's raw R, and A^T A (no conjugate) is not R^H R
    a = _rand((60, 20), np.complex128, seed=9)
    with pytest.raises(AssertionError):
        _check_r(a, np.linalg.qr(a, mode="r"), np.complex128)
    q, r = np.linalg.qr(a)
    assert_orthonormal(q, dtype=np.complex128, const=2 * COMPLEX)
    assert np.linalg.norm(q.T @ q - np.eye(20)) > 1  # the check's conjugate matters: Q^T Q is not I
    with pytest.raises(AssertionError):
        assert_factorization(a, q @ _normalized(r), dtype=np.complex128, const=2 * COMPLEX)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", CDTYPES)
def test_complex_qr_on_gpu(dtype):
    a = _rand((120, 40), dtype, seed=11)
    q, r = bl.qr(a, mode="reduced", method="tiled", tile=16, device="gpu", device_memory="64MiB")
    assert r.report["device"] == "gpu"
    _check_qr(a, q[...], r[...], dtype)
    r2 = bl.qr(a, memory="4MiB", device="gpu", device_memory="64MiB")  # TSQR: the complex strips on the CPU
    _check_r(a, r2[...], dtype)


@pytest.mark.parametrize("dtype", [np.complex128, np.float64])
def test_graded_r_is_not_called_rank_deficient(dtype):
    """Columns ``2^600`` and ``2^-600`` apart give an ``R`` whose diagonal spans ``1e-181 .. 1e181``: its
    smallest-to-largest ratio underflows to 0, and the warning "R has a zero on its diagonal: A is
    rank-deficient" had been given for an ``R`` with no zero; it is given for an exact zero only."""
    import warnings

    rng = np.random.default_rng(12)
    b = rng.standard_normal((10, 4)) + (1j * rng.standard_normal((10, 4)) if np.dtype(dtype).kind == "c" else 0)
    a = (b * np.array([2.0 ** 600, 2.0 ** -600, 2.0 ** 600, 2.0 ** -600])).astype(dtype)
    with warnings.catch_warnings():
        warnings.simplefilter("error", bl.errors.BlocklinWarning)
        r = bl.qr(a, method="tsqr", scheduler="sync")[...]
    assert np.all(np.abs(np.diag(r)) > 0)
    ref = np.abs(np.diag(np.linalg.qr(a, mode="r")))  # Householder keeps each column's rounding to itself
    assert np.all(np.abs(np.abs(np.diag(r)) - ref) <= 4 * 10 * COMPLEX * np.finfo(np.float64).eps * ref)
    a[:, 1] = 0  # a zero column: a zero on R's diagonal, still warned
    with pytest.warns(bl.errors.BlocklinWarning, match="zero on its diagonal"):
        bl.qr(a, method="tsqr", scheduler="sync")
