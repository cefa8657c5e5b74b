"""Triplets at the rounding level of a graded matrix: ``U`` and ``V`` stay orthonormal on every route.

A matrix whose rows (or columns) are graded over tens of decades has many singular values just above the
zero cut ``eps sqrt(M) s_1`` (:func:`blocklin.linalg.lowrank.triplets.numerically_zero`). Its ``Y = B Q``
is rank-deficient, ``R`` of ``Y = Q_Y R`` has zero rows and ``Q_Y`` zero columns there; LAPACK's left
vectors of ``R`` for values near the cut are accurate only to ``eps ||R|| / gap`` and had put up to 1e-2 of
their weight on those rows, which ``U = Q_Y U_R`` then dropped: ``||U^H U - I||`` of 1e-8 to 1e-3 with the
values and (on ``rsvd``) ``converged=True`` right. Bounds: ``U`` is an orthonormal ``Q_Y`` (CholeskyQR
refined to ``O(M eps)``) times a unitary ``U_R``, so ``||U^H U - I||_F <= c M eps sqrt(k)``
(``support.tolerances.assert_orthonormal`` with ``n = max(m, n)``); ``V = Q W`` likewise.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from support.tolerances import assert_orthonormal

import blocklin as bl


def _graded(m: int, n: int, decades: float, *, rows: bool, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    g = rng.standard_normal((m, n)) + 1j * rng.standard_normal((m, n))
    scale = 10.0 ** np.linspace(0, -decades, m if rows else n)
    return g * (scale[:, None] if rows else scale[None, :])


def _factors(res) -> tuple[np.ndarray, np.ndarray]:
    U, _, Vt = res
    return np.asarray(U), np.asarray(Vt).conj().T


def _check_orthonormal(res, a: np.ndarray) -> None:
    U, V = _factors(res)
    M = max(a.shape)
    assert_orthonormal(U, n=M)
    assert_orthonormal(V, n=M)


@pytest.mark.parametrize("method", ["rsvd", "gram", "lanczos"])
@pytest.mark.parametrize("decades", [40, 60])
def test_square_graded_rows_factors_orthonormal(method, decades):
    """113 x 113 complex, rows graded over 40 or 60 decades (numerical rank 41, 28), k = 64: the factors
    were orthonormal to 1e-3 on the three routes; every triplet's U column now to working precision."""
    a = _graded(113, 113, decades, rows=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the residual warning is not what is checked here
        res = bl.svd(a, 64, method=method, seed=1)
    _check_orthonormal(res, a)


@pytest.mark.parametrize("memory", ["4MiB", "64MiB"])
def test_tall_graded_columns_rsvd_converged_and_orthonormal(memory):
    """2000 x 60 complex, columns over 60 decades, k = 40, streamed and in memory: rsvd said converged
    with ``U`` orthonormal only to 1e-7 (a silently wrong factor); now orthonormal to working precision."""
    a = _graded(2000, 60, 60, rows=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = bl.svd(a, 40, method="rsvd", seed=1, memory=memory)
    assert res.report["in_core"] == (memory == "64MiB")
    _check_orthonormal(res, a)


def test_whole_space_graded_rows_orthonormal():
    """``method="full"`` of the graded square matrix: ``U = Q_Y U_R`` from the same rank-deficient ``R``."""
    a = _graded(113, 113, 60, rows=True)
    res = bl.svd(a, 60, method="full", which="SM", seed=1)
    _check_orthonormal(res, a)


@pytest.mark.parametrize("method", ["rsvd", "gram", "lanczos"])
def test_graded_in_memory_residuals_are_those_of_the_returned_triplets(method):
    """The residuals of triplets far below ``s_1`` had been measured through ``B^H B`` only, rounded at
    ``eps sqrt(M) s_1^2 / s`` (up to 4e-3 s_1 reported where the returned triplets' own are 1e-15 s_1):
    accurate triplets read as unconverged, with a warning. In memory they are measured from ``B^H u``.

    Each reported residual is within ``10 eps sqrt(M) s_1`` (a measure through ``B^H B`` kept where it is
    within 10 times the direct product's rounding) plus ``2 gamma_M ||A||_F`` (the direct product, ours
    and this check's: ``support.tolerances.product_bound``) of ``||A^H u - s v||`` recomputed here; the
    run converges (to the default tol) and says nothing."""
    a = _graded(113, 113, 60, rows=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        res = bl.svd(a, 64, method=method, seed=1)
    assert res.report["converged"] is True
    U, V = _factors(res)
    s = res.s
    true = np.linalg.norm(a.conj().T @ U - V * s, axis=0)
    reported = np.asarray(res.report["residuals"])
    M, e = max(a.shape), np.finfo(a.dtype).eps
    bound = 10 * e * np.sqrt(M) * s[0] + 2 * M * e * np.linalg.norm(a)
    live = s > 0  # zero values: their completed columns are reported 0 (orthogonal to range(A) by construction)
    assert np.all(np.abs(reported[live] - true[live]) <= bound), (reported[live] - true[live], bound)


def _real_or_complex(m: int, n: int, dtype, decades: float, *, rows: bool, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    g = rng.standard_normal((m, n))
    if np.dtype(dtype).kind == "c":
        g = g + 1j * rng.standard_normal((m, n))
    scale = 10.0 ** np.linspace(0, -decades, m if rows else n)
    return (g * (scale[:, None] if rows else scale[None, :])).astype(dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.complex64, np.complex128])
@pytest.mark.parametrize("shape,rows", [((52, 274), True), ((274, 52), False), ((67, 67), False)])
@pytest.mark.parametrize("method", ["rsvd", "gram", "lanczos", "sketch"])
def test_graded_every_route_dtype_and_shape(dtype, shape, rows, method):
    """Graded rows or columns (50 decades: values on both sides of the zero cut), tall, wide and square,
    real and complex, single and double precision, ``k`` about two thirds of ``min(m, n)`` (a random
    search found a wide float64 ``rsvd`` run with ``V`` orthonormal to 3e-7 and ``converged=True``).
    Both factors orthonormal to ``c M eps sqrt(k)`` in the data's precision; a converged run's triplets
    have the reported residuals (within the rounding of measuring them, as above)."""
    m, n = shape
    a = _real_or_complex(m, n, dtype, 50, rows=rows, seed=m + n)
    k = 2 * min(m, n) // 3
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        res = bl.svd(a, k, method=method, seed=2)
    U, V = _factors(res)
    M = max(m, n)
    assert_orthonormal(U, n=M, dtype=dtype)
    assert_orthonormal(V, n=M, dtype=dtype)
    if res.report["converged"]:
        s, e = np.asarray(res.s, dtype=np.float64), np.finfo(dtype).eps
        a64 = a.astype(np.complex128)
        true = np.linalg.norm(a64.conj().T @ U - V * s, axis=0) if m >= n else np.linalg.norm(a64 @ V - U * s, axis=0)
        floor = np.maximum(s, np.sqrt(e) * s[0])
        bound = 10 * e * np.sqrt(M) * s[0] + 2 * M * e * np.linalg.norm(a64)
        assert np.all(true <= res.report["tol"] * floor + bound)
