"""Complex least-squares problems and their reference for the complex solve tests: a complex Gaussian
``A`` and ``B``, the complex128 Tikhonov solution (the normal equations, or the dual form for wide
``A``), and the check of a result against it with ``assert_solve``'s bound times ``3 sqrt(2)`` (a
complex product's rounding, Higham, Lemma 3.5)."""

from __future__ import annotations

import numpy as np

from support.tolerances import assert_solve

CDTYPES = [np.complex64, np.complex128]
COMPLEX = 3 * np.sqrt(2)


def crandn(rng, shape, dtype=np.complex128):
    return (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(dtype)


def problem(shape, dtype, k=2, seed=0):
    rng = np.random.default_rng(seed)
    return crandn(rng, shape, dtype), crandn(rng, (shape[0], k), dtype)


def ridge(a, b, lam):
    """The complex128 Tikhonov solution and the matrix whose condition bounds its forward error."""
    a, b = a.astype(np.complex128), b.astype(np.complex128)
    m, n = a.shape
    if m >= n:
        k = a.conj().T @ a + lam**2 * np.eye(n)
        return np.linalg.solve(k, a.conj().T @ b), k
    k = a @ a.conj().T + lam**2 * np.eye(m)
    return a.conj().T @ np.linalg.solve(k, b), k


def check(x, a, b, lam, dtype):
    ref, k = ridge(a, b, lam)
    assert x.dtype == np.dtype(dtype)
    assert_solve(x, ref, k, dtype=dtype, const=8 * COMPLEX)
