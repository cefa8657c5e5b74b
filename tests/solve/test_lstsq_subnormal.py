"""blocklin.lstsq of a matrix whose singular values are below 2^-1024 (subnormal data).

The SVD scales such a matrix by a power of two and returns its singular values right, but ``x`` was
formed as ``c * (1 / s)``: ``1 / s`` overflowed to ``inf`` and ``x`` came back all NaN without an error
(square and rank-deficient tall ``A``; a full-rank tall or a wide ``A`` raised a NonFiniteError that
named ``b``). Now ``x`` is ``c / s``; an ``x`` truly beyond float64's range is refused by name.
"""

from __future__ import annotations

import numpy as np
import pytest

import blocklin as bl
from blocklin.errors import ParameterError


def _matrix(shape, rank, seed=0):
    rng = np.random.default_rng(seed)
    m, n = shape
    return rng.standard_normal((m, rank)) @ rng.standard_normal((rank, n))


@pytest.mark.parametrize("shape, rank", [((12, 12), 12), ((30, 12), 5), ((30, 12), 12), ((12, 30), 12),
                                         ((12, 30), 5)],
                         ids=["square", "tall-deficient", "tall", "wide", "wide-deficient"])
def test_subnormal_singular_values(shape, rank):
    e = -1030  # every entry and singular value subnormal: their 2^1030 multiples are exact
    a = _matrix(shape, rank)
    b = np.random.default_rng(1).standard_normal(shape[0])
    x, _, got_rank, s = bl.lstsq(np.ldexp(a, e), np.ldexp(b, e), memory="1MiB")
    ref, _, ref_rank, sr = np.linalg.lstsq(a, b, rcond=None)  # the same problem at scale 1
    assert got_rank == ref_rank == rank
    # x is scale-free (2^e a, 2^e b); the data keep 52 - 6 = 46 bits at 2^-1030 (subnormal), so the
    # bound of tests/solve/test_lstsq.py with eps 2^-46 for the data's rounding: 8 max(m, n) eps kappa
    # (||x|| + kappa ||r|| / s_1); it had been NaN
    kappa = sr[0] / sr[rank - 1]
    r = np.linalg.norm(b - a @ ref)
    bound = 8 * max(shape) * 2.0 ** -46 * kappa * (np.linalg.norm(ref) + kappa * r / sr[0])
    assert np.isfinite(x).all() and np.linalg.norm(x - ref) <= bound


@pytest.mark.parametrize("shape", [(12, 12), (30, 12), (12, 30)], ids=["square", "tall", "wide"])
def test_solution_beyond_the_range_is_refused(shape):
    a = np.ldexp(_matrix(shape, min(shape)), -1030)  # x = A^+ b of norm about 2^1030 for b of size 1
    b = np.ones(shape[0])
    with pytest.raises(ParameterError, match="within the range of float64"):
        bl.lstsq(a, b, memory="1MiB")


@pytest.mark.parametrize("shape, kind", [((30, 6), "real"), ((6, 30), "real"), ((30, 6), "complex")],
                         ids=["tall", "wide", "tall-complex"])
def test_x_of_the_stored_subnormal_data_to_float64_accuracy(shape, kind):
    """At ``2^-1062`` the data keep 12 bits, but the stored numbers are the problem: ``x`` is that of
    ``2^1062 A`` and ``2^1062 b`` (exact), to float64's bound. It had been formed from the singular values
    multiplied back to ``2^-1062`` (rounded to a few bits) and from ``U^T b`` in subnormal numbers: 7%
    off (a randomized search); of complex data (the streaming R route) from the R factor and ``Q^H b`` of the
    unscaled data: 3% off. Bound: 8 max(m, n) eps kappa (||x|| + kappa ||r|| / s_1)."""
    e = -1062
    a = _matrix(shape, min(shape), seed=3) * np.logspace(0, -2, shape[1])
    b = np.random.default_rng(4).standard_normal(shape[0])
    if kind == "complex":
        a = a + 1j * _matrix(shape, min(shape), seed=5)
        b = b + 1j * np.random.default_rng(6).standard_normal(shape[0])
    a, b = (x * 2.0 ** (e // 2) * 2.0 ** (e - e // 2) for x in (a, b))
    a0, b0 = (x * 2.0 ** -(e // 2) * 2.0 ** -(e - e // 2) for x in (a, b))  # the stored data at scale 1, exactly
    x, _, rank, _ = bl.lstsq(a, b, memory="1MiB")
    ref, _, ref_rank, sr = np.linalg.lstsq(a0, b0, rcond=None)
    assert rank == ref_rank == min(shape)
    kappa = sr[0] / sr[-1]
    r = np.linalg.norm(b0 - a0 @ ref)
    bound = 8 * max(shape) * np.finfo(np.float64).eps * kappa * (np.linalg.norm(ref) + kappa * r / sr[0])
    assert np.linalg.norm(x - ref) <= bound, (np.linalg.norm(x - ref), bound)


def test_float32_values_beyond_its_range_refused_and_the_report_in_the_data_s_units():
    """``s`` is taken of the data as the SVD scaled it (``2^-e A``) and multiplied back at the end: float32
    data near ``3e38``, whose largest singular value is past float32's range, is refused by name as before
    (it had come back ``inf``); and the report's ``sigma_max``, residuals and worst triplet are of ``A``, not
    of ``2^-e A`` (float32 data near ``1e10`` had reported ``sigma_max`` 1.4 beside ``s[0]`` 5.4e10)."""
    a = np.array([[3e38, 3e38], [3e38, -1e38], [1e38, 2e38]], np.float32)
    with pytest.raises(ParameterError, match="singular values within the range of float32"):
        bl.lstsq(a, np.array([1, 2, 3], np.float32))
    a = (np.random.default_rng(0).standard_normal((20, 4)) * 1e10).astype(np.float32)
    res = bl.lstsq(a, np.ones(20, np.float32))
    ref = np.linalg.svd(a.astype(np.float64), compute_uv=False)
    # s of float32 data: Weyl, |s_i - s_i'| <= ||E||_2 with ||E||_2 <= c sqrt(mn) eps32 ||A||_2, c = 8
    tol = 8 * np.sqrt(80) * np.finfo(np.float32).eps * ref[0]
    assert abs(res.report["sigma_max"] - ref[0]) <= tol and abs(float(res[3][0]) - ref[0]) <= tol
    w = res.report["worst_triplet"]
    assert abs(w["s"] - ref[w["index"] - 1]) <= tol
    # the same SVD as bl.svd's, whose report multiplies back by the same power of two (exact): equal bits
    svd = bl.svd(a).report
    assert res.report["sigma_max"] == svd["sigma_max"] and res.report["residuals"] == svd["residuals"]
    assert res.report["worst_triplet"] == svd["worst_triplet"]
