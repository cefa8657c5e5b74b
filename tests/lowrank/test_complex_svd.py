"""blocklin.svd (and norm's 2, -2 and 'nuc') of complex data against LAPACK (``numpy.linalg.svd``).

``A = U diag(s) V^H`` with ``Vt = V^H`` as ``numpy.linalg.svd`` and ``scipy.sparse.linalg.svds`` return it,
``U^H U = V^H V = I``, ``s`` real (float32 of complex64 data), every triplet's phase fixed by making the
largest-modulus entry of each short singular vector real and positive (``v`` of tall ``A``, ``u`` of
wide ``A``: the factor held in memory, whatever ``return_singular_vectors`` returns). Every method (``rsvd``,
``lanczos``, ``gram``, the single-pass ``sketch``, ``full`` and ``auto``), ``which="LM"``/``"SM"``, the
``return_singular_vectors`` variants, tall and wide, in memory and streamed at the least budget its planner
takes, on the sync, threads and processes schedulers (bit-identical results).

The test matrices are complex Gaussian (independent real and imaginary parts) with a prescribed spectrum,
``Q_1 diag(sigma) Q_2^H``. Bounds: the real ones of :mod:`support.tolerances` (Weyl for the singular values;
Kato-Temple from the reported residuals for the iterative methods; ``c n eps`` orthonormality and
reconstruction) with ``eps`` of the parts' dtype, times ``3 sqrt(2)`` for complex arithmetic (Higham 2002,
Lemma 3.5: a complex product carries ``sqrt(2) gamma_2``, an inner product of length n
``sqrt(2) gamma_{n+2}``, and ``sqrt(2) (n + 2) / n <= 3 sqrt(2)``).
"""

from __future__ import annotations

import numpy as np
import pytest
from support.conformance import run_checked, least_budget
from support.tolerances import (assert_factorization, assert_orthonormal, assert_ritz_values, assert_singular_values,
                                eps)

import blocklin as bl

CDTYPES = [np.complex64, np.complex128]
#: The complex-arithmetic factor on the real rounding-error bounds (see the module docstring).
COMPLEX = 3 * np.sqrt(2)
M, N = 300, 24


def _matrix(shape, dtype, *, rank=None, decay=0.7, seed=0):
    """A complex Gaussian ``Q_1 diag(sigma) Q_2^H`` with ``sigma_i = decay^i`` (zero beyond ``rank``)."""
    rng = np.random.default_rng(seed)
    m, n = shape
    k = min(m, n)
    q1, _ = np.linalg.qr(rng.standard_normal((m, k)) + 1j * rng.standard_normal((m, k)))
    q2, _ = np.linalg.qr(rng.standard_normal((n, k)) + 1j * rng.standard_normal((n, k)))
    sigma = decay ** np.arange(k)
    if rank is not None:
        sigma[rank:] = 0
    return ((q1 * sigma) @ q2.conj().T).astype(dtype)


def _dense(x):
    return None if x is None else x.to_numpy() if isinstance(x, bl.Matrix) else np.asarray(x)


_run = run_checked  # tests/support/conformance.py


def _check(a, res, *, which="LM", iterative=False):
    """Dtypes, the singular values against LAPACK's, both factors orthonormal (``U^H U = I``),
    ``U^H A = diag(s) V^H`` and the phase convention."""
    u, s, vt = _dense(res.U), np.asarray(res.s), _dense(res.Vt)
    dt = a.dtype
    k = s.size
    m, n = a.shape
    long_side = max(m, n)
    assert s.dtype == np.finfo(dt).dtype and u.dtype == dt and vt.dtype == dt
    assert u.shape == (m, k) and vt.shape == (k, n)
    exact = np.linalg.svd(a.astype(np.complex128), compute_uv=False)
    ref = exact[:k] if which == "LM" else exact[-k:]
    if iterative:
        assert_ritz_values(s, ref, spectrum=exact, residuals=np.asarray(res.report["residuals"]), n=long_side,
                           norm=exact[0], dtype=dt, const=4 * COMPLEX)
    else:
        assert_singular_values(s, ref, n=long_side, s1=exact[0], dtype=dt, const=4 * COMPLEX)
    assert_orthonormal(u, dtype=dt, const=2 * COMPLEX)
    assert_orthonormal(vt.conj().T, dtype=dt, const=2 * COMPLEX)
    # U^H A = diag(s) V^H: the left factor's projection (exact for the converged triplets)
    a128 = a.astype(np.complex128)
    proj = u.astype(np.complex128).conj().T @ a128
    if iterative:
        r = np.linalg.norm(proj - s[:, None] * vt, axis=1)
        assert np.all(r <= 2 * np.asarray(res.report["residuals"]) + 4 * COMPLEX * long_side * eps(dt) * exact[0])
    else:
        assert_factorization(proj, s[:, None] * vt.astype(np.complex128), factors=(u, a128), dtype=dt,
                             const=4 * COMPLEX)
    v = vt.conj().T if m >= n else u  # the short factor
    big = v[np.argmax(np.abs(v), axis=0), np.arange(k)]
    nonzero = np.abs(big) > 0
    assert np.all(big.real[nonzero] > 0)
    assert np.all(np.abs(big.imag) <= 4 * eps(dt) * np.abs(big))


@pytest.mark.parametrize("dtype", CDTYPES)
@pytest.mark.parametrize("shape", [(M, N), (N, M)], ids=["tall", "wide"])
@pytest.mark.parametrize("memory", [None, "least"], ids=["in-memory", "streamed"])
@pytest.mark.parametrize("method", ["rsvd", "lanczos", "gram", "full", "auto"])
def test_complex_svd_matches_lapack(dtype, shape, memory, method):
    a = _matrix(shape, dtype)
    k = min(shape) if method == "full" else 5
    kw = {"power_iters": 6} if method == "rsvd" else {}
    res = _run(lambda mem: bl.svd(a, k, method=method, seed=1, memory=mem, **kw), memory)
    assert res.report["method"] == ("full" if method == "full" else res.report["method"])
    _check(a, res, iterative=method in ("rsvd", "lanczos", "gram", "auto"))


@pytest.mark.parametrize("dtype", CDTYPES)
@pytest.mark.parametrize("shape", [(M, N), (N, M)], ids=["tall", "wide"])
@pytest.mark.parametrize("memory", [None, "least"], ids=["in-memory", "streamed"])
def test_complex_smallest_triplets(dtype, shape, memory):
    a = _matrix(shape, dtype, decay=0.8)
    res = _run(lambda mem: bl.svd(a, 4, which="SM", seed=1, memory=mem), memory)
    assert res.report["method"] == "full"
    _check(a, res, which="SM")


@pytest.mark.parametrize("dtype", CDTYPES)
@pytest.mark.parametrize("shape", [(M, N), (N, M)], ids=["tall", "wide"])
@pytest.mark.parametrize("memory", [None, "least"], ids=["in-memory", "streamed"])
def test_complex_sketch_of_a_low_rank_matrix(dtype, shape, memory):
    """The single-pass sketch is exact, to rounding, on a matrix of rank below its sketch size; its
    singular values carry the conditioning of the sketch's small solves (``cond(Phi Q)``,
    ``cond(Psi^T P)``, a few units for Gaussian test matrices: a factor 10 allowed)."""
    a = _matrix(shape, dtype, rank=5, decay=0.8)
    res = _run(lambda mem: bl.svd(a, 5, method="sketch", seed=2, memory=mem), memory)
    u, s, vt = _dense(res.U), res.s, _dense(res.Vt)
    exact = np.linalg.svd(a.astype(np.complex128), compute_uv=False)
    assert_singular_values(s, exact[:5], n=max(shape), s1=exact[0], dtype=dtype, const=40 * COMPLEX)
    assert_orthonormal(u, dtype=dtype, const=2 * COMPLEX)
    assert_orthonormal(vt.conj().T, dtype=dtype, const=2 * COMPLEX)
    recon = (u.astype(np.complex128) * s) @ vt
    err = np.linalg.norm(recon - a) / np.linalg.norm(a)
    assert err <= 40 * COMPLEX * max(shape) * eps(dtype)


@pytest.mark.parametrize("shape", [(M, N), (N, M)], ids=["tall", "wide"])
@pytest.mark.parametrize("vectors", [False, "u", "vh"])
def test_complex_return_singular_vectors(shape, vectors):
    a = _matrix(shape, np.complex128)
    full = bl.svd(a, 4, method="lanczos", seed=3)
    res = bl.svd(a, 4, method="lanczos", seed=3, return_singular_vectors=vectors)
    if vectors is False:
        assert isinstance(res, np.ndarray) and res.dtype == np.float64
        np.testing.assert_array_equal(res, full.s)
        return
    u, s, vt = res
    np.testing.assert_array_equal(s, full.s)
    assert (u is None) == (vectors == "vh") and (vt is None) == (vectors == "u")
    if u is not None:
        np.testing.assert_array_equal(_dense(u), _dense(full.U))
    if vt is not None:
        np.testing.assert_array_equal(_dense(vt), _dense(full.Vt))


@pytest.mark.parametrize("shape", [(M, N), (N, M)], ids=["tall", "wide"])
@pytest.mark.parametrize("method", ["lanczos", "sketch", "full"])
def test_complex_identical_bits_on_every_scheduler(shape, method):
    a = _matrix(shape, np.complex128)
    k = min(shape) if method == "full" else 4
    call = (lambda s: lambda mem: bl.svd(a, k, method=method, seed=4, memory=mem, scheduler=s, workers=2))
    runs = [least_budget(call(s)) for s in ("sync", "threads", "processes")]
    for r in runs:
        assert not r.report["in_core"]
    for r in runs[1:]:
        np.testing.assert_array_equal(r.s, runs[0].s)
        np.testing.assert_array_equal(_dense(r.U), _dense(runs[0].U))
        np.testing.assert_array_equal(_dense(r.Vt), _dense(runs[0].Vt))


@pytest.mark.parametrize("dtype", CDTYPES)
@pytest.mark.parametrize("shape", [(M, N), (N, M)], ids=["tall", "wide"])
@pytest.mark.parametrize("memory", [None, "least"], ids=["in-memory", "streamed"])
@pytest.mark.parametrize("name", ["zero", "rank-two"])
def test_complex_zero_singular_values_complete_the_long_factor(dtype, shape, memory, name):
    """Zero singular values: the long factor's columns are an orthonormal completion (``U^H U = I``),
    orthogonal to ``range(A)`` (``A^H u = 0``)."""
    a = np.zeros(shape, dtype=dtype) if name == "zero" else _matrix(shape, dtype, rank=2)
    res = _run(lambda mem: bl.svd(a, 5, method="lanczos", seed=5, memory=mem), memory)
    u, s, vt = _dense(res.U), res.s, _dense(res.Vt)
    zero = s == 0
    assert zero.sum() == (5 if name == "zero" else 3)
    wide = shape[0] < shape[1]
    assert_orthonormal(u, dtype=dtype, const=2 * COMPLEX)
    assert_orthonormal(vt.conj().T, dtype=dtype, const=2 * COMPLEX)
    a128 = a.astype(np.complex128)
    bound = 8 * COMPLEX * max(shape) * eps(dtype) * max(np.linalg.norm(a128), 1.0)
    if wide:  # the completed rows of Vt: A v = 0
        assert np.linalg.norm(a128 @ vt[zero].conj().T) <= bound
    else:  # the completed columns of U: A^H u = 0
        assert np.linalg.norm(a128.conj().T @ u[:, zero]) <= bound


@pytest.mark.parametrize("dtype", CDTYPES)
@pytest.mark.parametrize("shape", [(M, N), (N, M)], ids=["tall", "wide"])
def test_complex_spectral_norms(dtype, shape):
    a = _matrix(shape, dtype, decay=0.9)
    a128 = a.astype(np.complex128)
    e = eps(dtype)
    for order in (2, -2, "nuc"):
        got, ref = bl.norm(a, order), np.linalg.norm(a128, order)
        scale = min(shape) if order == "nuc" else 1
        assert abs(got - ref) <= 4 * COMPLEX * scale * max(shape) * e * np.linalg.norm(a128, 2), order


def test_complex_checks_can_fail():
    """The bounds catch a transpose where the conjugate transpose belongs."""
    a = _matrix((M, N), np.complex128)
    res = bl.svd(a, N, method="full")
    u, s, vt = _dense(res.U), res.s, _dense(res.Vt)
    with pytest.raises(AssertionError):
        assert_factorization(u.conj().T @ a, s[:, None] * vt.conj(), factors=(u, a), const=4 * COMPLEX)
    with pytest.raises(AssertionError):
        assert_orthonormal(u.T, const=2 * COMPLEX)



@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(M, N), (N, M)], ids=["tall", "wide"])
@pytest.mark.parametrize("memory", ["8MiB", "least"], ids=["in-memory", "streamed"])
@pytest.mark.parametrize("method", ["lanczos", "sketch", "gram"])
def test_complex_svd_on_gpu(shape, memory, method):
    """The device path: conjugates where the device computes, HERK for ``Y^H Y``; as the CPU's to rounding."""
    a = _matrix(shape, np.complex128, rank=5 if method == "sketch" else None)
    call = (lambda mem: bl.svd(a, 5, method=method, seed=6, memory=mem, device="gpu", device_memory="64MiB"))
    res = least_budget(call) if memory == "least" else call(memory)
    assert res.report["device"] == "gpu"
    cpu = bl.svd(a, 5, method=method, seed=6)
    assert_singular_values(res.s, cpu.s, n=max(shape), dtype=np.complex128, const=8 * COMPLEX)
    assert_orthonormal(_dense(res.U), const=2 * COMPLEX)
    assert_orthonormal(_dense(res.Vt).conj().T, const=2 * COMPLEX)


@pytest.mark.parametrize("dtype", CDTYPES)
def test_complex_linear_operator_products(dtype):
    """``aslinearoperator`` of complex data: ``A x`` and the adjoint ``A^H y`` (SciPy's ``rmatvec``) streamed,
    within the product bound ``k eps ||A|| ||x||`` times ``3 sqrt(2)``; a real ``A`` with a complex ``x`` too."""
    a = _matrix((M, N), dtype, decay=0.95)
    rng = np.random.default_rng(7)
    x = (rng.standard_normal((N, 2)) + 1j * rng.standard_normal((N, 2))).astype(dtype)
    y = (rng.standard_normal((M, 2)) + 1j * rng.standard_normal((M, 2))).astype(dtype)
    a128 = a.astype(np.complex128)
    for matrix in (a, a.real.copy()):
        op = bl.aslinearoperator(matrix, memory="64KiB")
        try:
            m128 = matrix.astype(np.complex128)
            for got, ref, k, v in ((op.matmat(x), m128 @ x, N, x), (op.rmatmat(y), m128.conj().T @ y, M, y),
                                   (op.H.matvec(y[:, 0]), m128.conj().T @ y[:, 0], M, y[:, 0])):
                bound = 2 * COMPLEX * k * eps(dtype) * np.linalg.norm(a128) * np.linalg.norm(v)
                assert np.linalg.norm(got - ref) <= bound
            assert op.passes == 3
        finally:
            op.close()


@pytest.mark.parametrize("dtype", [np.complex128, np.float64])
@pytest.mark.parametrize("shape", [(4, 10), (23, 61)])
def test_wide_rows_2_600_apart_full_svd(dtype, shape):
    """A wide ``A`` whose rows alternate ``2^600`` and ``2^-600``: the route without squares (TSQR of
    ``B = A^H``) scales ``B`` into range, where the small columns' entries (``2^-1200``) underflow, and its
    ``R`` has exact zeros on its diagonal. ``svd``, ``norm(a, 2)`` and ``cond`` had crashed there in SciPy's
    triangular solve (``LinAlgError: singular matrix``); the values of ``R``'s null space are zeros of ``A``
    at its rounding (the true ones, near ``2^-600``, are ``2^-1200`` times ``s_1``), the rest exact."""
    m, n = shape
    rng = np.random.default_rng(11)
    base = rng.standard_normal((m, n)) + (1j * rng.standard_normal((m, n)) if np.dtype(dtype).kind == "c" else 0)
    a = (np.where(np.arange(m) % 2 == 0, 2.0 ** 600, 2.0 ** -600)[:, None] * base).astype(dtype)
    U, s, Vt = bl.svd(a, method="full", scheduler="sync")
    U, Vt = U[...] if isinstance(U, bl.Matrix) else U, Vt[...] if isinstance(Vt, bl.Matrix) else Vt
    f = 2.0 ** -600  # exact: compare in range (the reference's squares would overflow)
    assert_singular_values(s * f, np.linalg.svd(a * f, compute_uv=False), n=n, dtype=dtype, const=4 * COMPLEX)
    assert_factorization(a * f, (U * (s * f)) @ Vt, dtype=dtype, const=2 * COMPLEX)
    assert_orthonormal(U, dtype=dtype, const=2 * COMPLEX)
    assert_orthonormal(Vt.conj().T, dtype=dtype, const=2 * COMPLEX)
    assert bl.norm(a, 2, scheduler="sync") == s[0] and bl.cond(a, scheduler="sync") == np.inf
