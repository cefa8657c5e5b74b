"""blocklin.eigsh of Hermitian complex matrices against LAPACK (``scipy.linalg.eigh``).

A Hermitian ``A = A^H`` has real eigenvalues (float32 of complex64 data, as ``eigh``) and complex
eigenvectors, each determined up to a unit-modulus factor (ARPACK and LAPACK leave it free: compared
here through the residual ``||A V - V diag(w)||`` and ``V^H V = I``). Largest, smallest and
largest-magnitude, in memory and streamed at the least budget, on the sync, threads and processes
schedulers (bit-identical); a non-Hermitian matrix is refused as the real path refuses a non-symmetric one.

Bounds: Kato-Temple from the converged residuals plus Weyl's rounding term
(:func:`support.tolerances.assert_ritz_values`), ``c n eps`` orthonormality, with ``eps`` of the parts'
dtype times ``3 sqrt(2)`` for complex arithmetic (Higham 2002, Lemma 3.5).
"""

from __future__ import annotations

import numpy as np
import pytest
import scipy.linalg
from support.tolerances import assert_orthonormal, assert_ritz_values, eps

import blocklin as bl
from blocklin.errors import NotSymmetricError

CDTYPES = [np.complex64, np.complex128]
COMPLEX = 3 * np.sqrt(2)
N = 160


def _hermitian(dtype, seed=0):
    """``Q diag(lambda) Q^H`` with a complex Gaussian ``Q`` and eigenvalues ``(-0.9)^i``: both signs, distinct
    moduli (``LM`` is unambiguous), separated by at least a tenth of their size at either end."""
    rng = np.random.default_rng(seed)
    q, _ = np.linalg.qr(rng.standard_normal((N, N)) + 1j * rng.standard_normal((N, N)))
    lam = (-0.9) ** np.arange(N)
    a = (q * lam) @ q.conj().T
    return ((a + a.conj().T) / 2).astype(dtype)


#: Streams every step of the 160 x 160 complex128 matrix (400 KiB: it is held from about 1.7 MiB).
STREAMED = "1MiB"


def _run(call, memory):
    return call(STREAMED if memory == "streamed" else None)


def _wanted(ref, k, which):
    if which == "LA":
        return np.sort(ref)[-k:]
    if which == "SA":
        return np.sort(ref)[:k]
    return np.sort(ref[np.argsort(-np.abs(ref), kind="stable")[:k]])


@pytest.mark.parametrize("dtype", CDTYPES)
@pytest.mark.parametrize("which", ["LA", "SA", "LM"])
@pytest.mark.parametrize("memory", ["in-memory", "streamed"])
def test_complex_eigsh_matches_eigh(dtype, which, memory):
    a = _hermitian(dtype)
    k = 4
    res = _run(lambda mem: bl.eigsh(a, k, which=which, order="ascending", seed=1, memory=mem), memory)
    w, v = res
    assert res.report["in_core"] == (memory == "in-memory")
    assert w.dtype == np.finfo(dtype).dtype and v.dtype == dtype and v.shape == (N, k)
    a128 = a.astype(np.complex128)
    ref = scipy.linalg.eigh(a128, eigvals_only=True)
    norm = float(np.max(np.abs(ref)))
    assert_ritz_values(w, _wanted(ref, k, which), spectrum=ref, residuals=np.asarray(res.report["residuals"]), n=N,
                       norm=norm, dtype=dtype, const=4 * COMPLEX)
    assert_orthonormal(v, dtype=dtype, const=2 * COMPLEX)
    # every pair's residual: within the tolerance it converged to, plus the rounding of the product
    r = np.linalg.norm(a128 @ v - v * w.astype(np.float64), axis=0)
    assert np.all(r <= res.report["tol"] * norm * 1.01 + 2 * COMPLEX * N * eps(dtype) * norm)


@pytest.mark.parametrize("shape_memory", ["in-memory", "streamed"])
def test_complex_eigsh_refuses_a_non_hermitian_matrix(shape_memory):
    a = _hermitian(np.complex128)
    a[0, 1] += 0.1j  # A^H differs from A in one entry: complex symmetric parts do not make it Hermitian
    mem = None if shape_memory == "in-memory" else "1MiB"
    with pytest.raises(NotSymmetricError, match="Hermitian"):
        bl.eigsh(a, 3, order="ascending", seed=0, **({"memory": mem} if mem else {}))
    sym = (a + a.T) / 2  # complex symmetric, not Hermitian
    with pytest.raises(NotSymmetricError, match="A\\^H"):
        bl.eigsh(sym, 3, order="ascending", seed=0)


def test_complex_eigsh_identical_bits_on_every_scheduler():
    a = _hermitian(np.complex128, seed=2)
    runs = [bl.eigsh(a, 3, order="descending", seed=3, memory=STREAMED, scheduler=s, workers=2)
            for s in ("sync", "threads", "processes")]
    assert not runs[0].report["in_core"]
    for w, v in runs[1:]:
        np.testing.assert_array_equal(w, runs[0][0])
        np.testing.assert_array_equal(v, runs[0][1])


def test_complex_eigsh_checks_can_fail():
    """The residual bound catches the eigenvectors' conjugates (the eigenvectors of ``A^T``)."""
    a = _hermitian(np.complex128)
    w, v = bl.eigsh(a, 3, which="LA", order="ascending", seed=1)
    r = np.linalg.norm(a @ v.conj() - v.conj() * w, axis=0)
    assert np.any(r > 10 * np.sqrt(eps(np.complex128)) * np.max(np.abs(w)))

