"""Scaled data: every operation on ``c A`` (``c`` a power of two from ``2^-600`` to ``2^600``) gives the
right power of ``c`` times its result on ``A``, in memory and streamed (blocklin.linalg.blocks.scaling).

Multiplying by a power of two is exact in binary floating point, so ``c A`` is ``A`` with other
exponents: a route that scales its data by a power of two before it squares or factors it makes the
same roundings on ``c A`` as on ``A``. The comparisons are norm-wise with bounds from the rounding
analysis of each result (``tests/support/tolerances.py``), never bit equality, so the tests do not depend on
the routes being exactly equivariant (a streamed run of ``c A`` reads its first pass twice, once
unscaled), only on them being right. The probe's cases (one column scaled by 1e201, entries near
1e200 and 1e-200) are checked against references computed independently.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import scipy.linalg

import blocklin as bl
from blocklin.errors import BlocklinWarning, ConvergenceError, ParameterError
from blocklin.linalg.blocks import scaling
from blocklin.linalg.lowrank.triplets import triplet_report
from support.tolerances import assert_close_to, assert_residual, eps

#: The factors of the property tests (float64); float32 has its own smaller range.
C64 = [2.0 ** e for e in (-600, -300, -60, 0, 60, 300, 600)]
C32 = [2.0 ** e for e in (-100, -60, 0, 60, 100)]
#: A budget below every streamed operand here (they are a few hundred KiB), above the passes' minimum.
STREAM = "160KiB"
IN_MEMORY = "64MiB"


def _ldexp(x, e):
    with np.errstate(over="ignore", under="ignore"):
        return np.ldexp(np.asarray(x, dtype=np.float64), e)


def _exp(c: float) -> int:
    return int(np.log2(c))


@pytest.fixture(scope="module")
def tall():
    """A tall 600 x 16 matrix with singular values from 10 down to 0.1 (well separated at the top)."""
    rng = np.random.default_rng(7)
    u, _ = np.linalg.qr(rng.standard_normal((600, 16)))
    v, _ = np.linalg.qr(rng.standard_normal((16, 16)))
    return (u * np.logspace(1, -1, 16)) @ v.T


def _svd(a, method, memory, dtype=np.float64):
    with warnings.catch_warnings():
        warnings.simplefilter("error", bl.errors.ConvergenceWarning)  # a wrong answer must not look converged
        return bl.svd(np.asarray(a, dtype=dtype), 3, method=method, seed=3, memory=memory)


# -- svd ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("method", ["gram", "lanczos", "rsvd", "sketch", "auto"])
def test_svd_of_cA_is_c_times_svd_of_A(tall, method):
    ref = _svd(tall, method, IN_MEMORY)
    # Weyl: each run's singular values are exact for A + E with ||E|| <= c n eps ||A|| (n = 600 rows
    # summed); the two runs see A and c A, so |s(cA)/c - s(A)| <= 2 * 4 * 600 * eps * s_1 (the sketch
    # is not backward stable but deterministic in its seed: the same bound holds against itself)
    bound = 8 * 600 * eps(np.float64) * float(ref.s[0])
    for c in C64:
        got = _svd(c * tall, method, IN_MEMORY)
        assert_close_to(_ldexp(got.s, -_exp(c)), ref.s, bound=bound, what=f"svd {method} s, c = 2^{_exp(c)}")
        if method != "sketch":
            assert got.report["converged"] is True
            assert np.allclose(got.report["relative_residuals"], ref.report["relative_residuals"], rtol=0,
                               atol=1e3 * eps(np.float64))  # relative residuals do not scale; both at rounding
        # the short factor (V) does not scale: its columns agree up to sign to the singular gap's accuracy
        # (the top three of 10 ... 0.1 are separated by 8 %: error <= ||E|| / gap ~ 1e3 eps)
        v, v0 = np.abs(got.Vt), np.abs(ref.Vt)
        assert_close_to(v, v0, bound=1e4 * eps(np.float64), what=f"svd {method} V, c = 2^{_exp(c)}")
        assert (got.report.get("scaling") is not None) == (abs(_exp(c)) > 256)


@pytest.mark.parametrize("method", ["gram", "lanczos", "rsvd", "sketch"])
def test_svd_of_cA_streamed(tall, method):
    ref = _svd(tall, method, STREAM)
    assert ref.report["in_core"] is False and ref.report.get("scaling") is None
    bound = 8 * 600 * eps(np.float64) * float(ref.s[0])  # as in memory (Weyl, two runs)
    for c in (2.0 ** -600, 2.0 ** 600):
        got = _svd(c * tall, method, STREAM)
        assert_close_to(_ldexp(got.s, -_exp(c)), ref.s, bound=bound, what=f"streamed svd {method}, c = 2^{_exp(c)}")
        # one more pass: the first pass over A met data outside the range that is squared safely
        assert got.report["scaling"]["extra_passes"] == 1
        assert got.report["passes"] == ref.report["passes"] + 1


@pytest.mark.parametrize("method", ["gram", "lanczos"])
def test_svd_float32(tall, method):
    a = tall.astype(np.float32)
    ref = _svd(a, method, IN_MEMORY, np.float32)
    # float32: the same Weyl bound with float32's eps (the Gram route sums in float64, which only helps)
    bound = 8 * 600 * eps(np.float32) * float(ref.s[0])
    for c in C32:
        got = _svd(c * a, method, IN_MEMORY, np.float32)
        assert got.s.dtype == np.float32
        assert_close_to(_ldexp(got.s, -_exp(c)), ref.s, bound=bound, what=f"float32 svd {method}, c = 2^{_exp(c)}")


@pytest.mark.parametrize("dtype", [np.float32, np.complex64])
@pytest.mark.parametrize("memory", [IN_MEMORY, STREAM])
def test_single_precision_values_beyond_its_range_are_refused(tall, dtype, memory, tmp_path):
    """Finite float32 data whose singular values pass float32's largest (3.4e38) had returned
    ``s = inf`` with ``converged=True`` (the values are computed scaled, in float64, then cast): refused
    now, naming the power of two whose scaled data's values fit, which then gives them."""
    a = np.ldexp(tall, 126)  # entries up to about 2^126 * 0.5, singular values up to 10 * 2^126 > 2^128
    if np.dtype(dtype).kind == "c":
        a = a * np.exp(0.3j)
    a = a.astype(dtype)
    assert np.isfinite(a).all()
    with pytest.raises(ParameterError, match=r"singular values within the range of float32.*2\.0\*\*-13[0-9]"):
        bl.svd(a, 3, seed=3, memory=memory)
    h = np.ldexp(np.ones((16, 16)) + tall.T @ tall / 1000, 125).astype(np.float32)  # largest eigenvalue > 16 * 2^125
    with pytest.raises(ParameterError, match=r"eigenvalues within the range of float32"):
        bl.eigsh(h, 2, seed=3, memory=memory)
    import scipy.sparse as sp

    with pytest.raises(ParameterError, match=r"eigenvalues within the range of float32"):
        bl.eigsh(bl.from_sparse(sp.csr_matrix(h), tmp_path / "h.zarr"), 2, seed=3, memory=memory)


@pytest.mark.parametrize("e", [126, -140])
def test_norms_and_condition_of_float32_data_near_its_range_ends(tall, e):
    """``norm(a, 2 / -2 / 'nuc')`` and ``cond(a)`` return Python floats from singular values kept in float64:
    cast to float32 first they were inf (cond NaN) for finite data near 1e38, and lost digits below its
    normal range (entries near 1e-42). Bound: Weyl with float32's eps (the data are float32, exactly
    ``2^e`` times ``tall`` rounded to float32, whose float64 SVD is the reference)."""
    a32 = np.ldexp(tall, e).astype(np.float32)
    a = a32.astype(np.float64)
    ref = np.linalg.svd(a, compute_uv=False)
    assert np.isfinite(a32).all() and (e < 0 or ref[0] > np.finfo(np.float32).max)
    bound = 8 * 600 * eps(np.float32) * float(ref[0])
    for ord_, want in ((2, ref[0]), (-2, ref[-1]), ("nuc", ref.sum())):
        got = bl.norm(a32, ord_, memory=STREAM)
        assert isinstance(got, float) and np.isfinite(got)
        assert_close_to(np.array([got]), np.array([want]), bound=bound * (16 if ord_ == "nuc" else 1),
                        what=f"norm(2^{e} a, {ord_})")
    got = bl.cond(a32, memory=STREAM)
    # cond = s_1 / s_n: each value within the bound, s_n = 0.1 * 2^e well above it
    lo, hi = (ref[0] - bound) / (ref[-1] + bound), (ref[0] + bound) / (ref[-1] - bound)
    assert lo <= got <= hi, (got, ref[0] / ref[-1])


@pytest.mark.parametrize("e", [-1062, 1020])
@pytest.mark.parametrize("memory", [IN_MEMORY, STREAM])
def test_cond_of_float64_data_near_its_range_ends(tall, e, memory):
    """``cond(a)`` (``p`` None, 2, -2) is a ratio of the singular values of the data as scaled to be read: of
    subnormal data (``2^-1062`` times ``tall``) those multiplied back had been rounded to the few bits left
    below ``2^-1022`` (``s_n`` of a matrix of condition 5e6 to 0: cond inf, without a word, in a randomized
    search), and of data near ``2^1024`` refused (``s_1`` beyond float64). Reference: the float64 SVD of the
    stored data times ``2^-e`` (exact); bound: Weyl, ``|ds| <= 8 m eps s_1`` for each value."""
    a = _ldexp(tall, e)
    ref = np.linalg.svd(_ldexp(a, -e), compute_uv=False)
    assert np.isfinite(a).all() and np.all(ref > 0)
    bound = 8 * 600 * eps(np.float64) * float(ref[0])
    lo, hi = (ref[0] - bound) / (ref[-1] + bound), (ref[0] + bound) / (ref[-1] - bound)
    for p in (None, 2, -2):
        got = bl.cond(a, p, memory=memory)
        assert (lo <= got <= hi) if p != -2 else (1 / hi <= got <= 1 / lo), (p, got, ref[0] / ref[-1])


@pytest.mark.parametrize("dtype", [np.float64, np.complex128])
@pytest.mark.parametrize("memory", [IN_MEMORY, STREAM])
def test_standardized_columns_far_below_the_others(tall, dtype, memory):
    """``scale=True`` makes every column's standard deviation 1, so multiplying one column by a power of two
    changes nothing. A column ``2^-660`` times the others had squares below float64's range: its variance
    came out 0, the column was taken as constant and centered away (``s_1`` 23.9 for 26.8; with every other
    column near ``2^-660``: ``s = [9.8, 0, 0]``), finite and wrong (a randomized search). Refused now,
    naming ``scale`` and the fix; at ``2^-400`` (variance ``2^-800``, in range) it is computed, to the
    bound of the unmodified run: Weyl, ``|ds| <= 16 m eps s_1``, plus the convergence of the two runs."""
    from blocklin.runtime.powers import ldexp

    a = tall.astype(dtype)
    if np.dtype(dtype).kind == "c":
        a = a + 1j * np.roll(tall, 1, axis=1)
    ref = bl.svd(a, 3, center=True, scale=True, seed=3, memory=memory)
    b = a.copy()
    b[:, 5] = ldexp(b[:, 5], -400)
    got = bl.svd(b, 3, center=True, scale=True, seed=3, memory=memory)
    rr = max(ref.report["relative_residuals"] + got.report["relative_residuals"])
    assert_close_to(got.s, ref.s, bound=(16 * 600 * eps(np.float64) + 4 * rr) * float(ref.s[0]),
                    what="standardized svd, one column 2^-400")
    b[:, 5] = ldexp(b[:, 5], -260)
    with pytest.raises(ParameterError, match=r"scale: needs each column's variance.*column 6 first.*power of two"):
        bl.svd(b, 3, center=True, scale=True, seed=3, memory=memory)
    with pytest.raises(ParameterError, match=r"scale: needs each column's variance"):
        bl.pca(b, 3, scale=True, seed=3, memory=memory)
    c = ldexp(a, -660)  # every column near 2^-660 but one (near 2^5): the data is not scaled, 15 columns lost
    c[:, 3] = ldexp(a[:, 3], 5)
    with pytest.raises(ParameterError, match=r"scale: needs each column's variance.*15 column"):
        bl.svd(c, 3, center=True, scale=True, seed=3, memory=memory)



def _paired(x):
    """``x`` with rows ``2i + 1`` the negatives of rows ``2i``: every even run of rows sums to exactly 0."""
    y = x.copy()
    y[1::2] = -y[0::2]
    return y


@pytest.mark.parametrize("wide", [False, True])
@pytest.mark.parametrize("memory,scheduler,device", [(IN_MEMORY, "sync", "cpu"), (STREAM, "threads", "cpu"),
                                                     (IN_MEMORY, "sync", "gpu"), (STREAM, "threads", "gpu"),
                                                     pytest.param(STREAM, "processes", "cpu", marks=pytest.mark.slow)])
def test_standardized_column_of_zero_mean_far_below_the_others(tall, wide, memory, scheduler, device):
    """A column far below the others whose mean is exactly 0 (entries ``+-2^-600`` in pairs, or a column
    ``2^-660`` times the others): its mean and variance both came out 0, which the refusal of
    :func:`test_standardized_columns_far_below_the_others` took for a zero column, so it was centered away
    and the singular values came out finite and wrong with converged=True (``s_3`` 33.90 for NumPy's
    34.23 of the column scaled up by its power of two, tall; wide, every method, in memory and out of
    core). Refused now by name on every route; a zero column stays zero, as NumPy's standardization with
    its scale 1 keeps it: Weyl, ``|ds| <= 16 m eps s_1``, plus the convergence of the run. ``device="gpu"``:
    under the CuPy stand-in (the moments passes read on the CPU, the products on the device)."""
    if device == "cpu":
        _zero_mean_column_refused(tall, wide, dict(memory=memory, scheduler=scheduler, seed=3))
        return
    from support import cupy_standin

    with cupy_standin.installed():
        _zero_mean_column_refused(tall, wide, dict(memory=memory, scheduler=scheduler, device=device, seed=3))
        cupy_standin.synchronize_all()
        assert not cupy_standin.STATE.races


def _zero_mean_column_refused(tall, wide, options):
    from blocklin.runtime.powers import ldexp

    base = np.random.default_rng(11).standard_normal((16, 600)) if wide else tall
    j = 5
    for e, col in ((600, np.sign(base[:, j]) + (base[:, j] > 1)), (660, base[:, j])):
        b = base.copy()
        b[:, j] = ldexp(_paired(col), -e)
        assert b[:, j].sum() == 0 and np.any(b[:, j] != 0)
        for method in ("auto", "rsvd", "lanczos", "gram"):
            with pytest.raises(ParameterError, match=r"scale: needs each column's variance.*column 6 first.*power "
                                                     r"of two"):
                bl.svd(b, 3, center=True, scale=True, method=method, **options)
        with pytest.raises(ParameterError, match=r"scale: needs each column's variance"):
            bl.pca(b, 3, scale=True, **options)
    z = base.copy()
    z[:, j] = 0.0
    y = (z - z.mean(axis=0)) / np.where(np.arange(z.shape[1]) == j, 1.0, z.std(axis=0))
    ref = np.linalg.svd(y, compute_uv=False)[:3]
    for method in ("auto", "rsvd", "lanczos", "gram"):
        got = bl.svd(z, 3, center=True, scale=True, method=method, **options)
        rr = max(got.report["relative_residuals"])
        assert_close_to(got.s, ref, bound=(16 * max(z.shape) * eps(np.float64) + 4 * rr) * float(ref[0]),
                        what=f"standardized svd with a zero column, {method}")

# -- pca, eigsh, gram ----------------------------------------------------------------------------------
@pytest.mark.parametrize("memory", [IN_MEMORY, pytest.param(STREAM, marks=pytest.mark.slow)])
def test_pca_centered(tall, memory):
    x = tall + 3.0  # means 3, spread ~0.4: the centering matters
    ref = bl.pca(x, 3, seed=1, memory=memory)
    # s: Weyl with the centered products rounded at ||A|| of the uncentered data (docs/svd.md)
    bound = 8 * 600 * eps(np.float64) * float(np.linalg.norm(x, 2))
    for c in (C64 if memory == IN_MEMORY else (2.0 ** -600, 2.0 ** 600)):
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            got = bl.pca(c * x, 3, seed=1, memory=memory)
        e = _exp(c)
        assert_close_to(_ldexp(got.singular_values_, -e), ref.singular_values_, bound=bound, what=f"pca s, 2^{e}")
        # ratios and components do not scale (relative quantities: the same bound over s_1)
        assert_close_to(got.explained_variance_ratio_, ref.explained_variance_ratio_,
                        bound=4 * bound / float(ref.singular_values_[0]), what=f"pca ratio, 2^{e}")
        assert_close_to(got.components_, ref.components_, bound=1e4 * eps(np.float64), what=f"pca components, 2^{e}")
        assert_close_to(_ldexp(got.mean_, -e), ref.mean_, bound=600 * eps(np.float64) * 3.0 * 4,
                        what=f"pca mean, 2^{e}")  # a sum of 600 terms of size 3 per column, 16 columns
        if abs(e) >= 600:  # s_i^2 ~ 2^+-1200 is out of float64's range: said, not returned silently
            assert any("beyond float64's range" in str(x.message) for x in w)
        else:
            assert_close_to(_ldexp(got.explained_variance_, -2 * e), ref.explained_variance_,
                            bound=4 * bound * float(ref.singular_values_[0]) / 599, what=f"pca variance, 2^{e}")


@pytest.mark.parametrize("dtype,k", [(np.float64, 700), (np.float64, -700), (np.float32, 90), (np.float32, -90)])
def test_pca_whitened_scores_near_the_range_ends(dtype, k):
    """Whitened scores do not depend on the data's scale; the variances they divide by do, and leave
    the dtype's range here (``4^k`` times: inf or 0). The scores then take their standard deviations
    from the singular values (which stay in range): with the same seed, the bits of the unscaled run
    where that run's variances are in range, within a rounding of its own ``sqrt(s^2 / (m - 1))``
    otherwise (1 ulp of the deviation, relative: ``4 eps`` of the dtype on each score). The variances
    that left the range are said (``BlocklinWarning``), float32's too (their cast had been silent)."""
    rng = np.random.default_rng(21)
    x = rng.standard_normal((80, 30)).astype(dtype)
    ref = bl.pca(x, 3, whiten=True, seed=0)
    # the warning names what the out-of-range variances spoil (score and the covariance too)
    with pytest.warns(BlocklinWarning, match=f"beyond {'float64' if dtype == np.float64 else 'float32'}'s range"
                      ".*score, score_samples, get_covariance and get_precision"):
        got = bl.pca(np.ldexp(x, k), 3, whiten=True, seed=0)
    want = ref.transform(x[:5])
    scores = got.transform(np.ldexp(x[:5], k))
    assert np.abs(scores - want).max() <= 4 * eps(dtype) * np.abs(want).max()
    back = got.inverse_transform(scores)  # the whitening undone with the same deviations
    assert np.abs(np.ldexp(back.astype(np.float64), -k) - ref.inverse_transform(want)).max() <= \
        64 * eps(dtype) * np.abs(x).max()


@pytest.mark.parametrize("memory", [IN_MEMORY, pytest.param("1MiB", marks=pytest.mark.slow)])
def test_eigsh(memory):
    rng = np.random.default_rng(2)
    n = 200 if memory == IN_MEMORY else 400  # streamed: 1.25 MB, over the budget
    q, _ = np.linalg.qr(rng.standard_normal((n, n)))
    s = (q * np.concatenate([[40.0, 30.0, 25.0], np.linspace(1, 20, n - 3)])) @ q.T
    s = (s + s.T) / 2
    ref = bl.eigsh(s, 3, order="descending", seed=0, memory=memory)
    assert ref.report["in_core"] is (memory == IN_MEMORY)
    # Ritz values of a symmetric matrix: |w_i - w_ref_i| <= c n eps ||S|| for each run (Weyl)
    bound = 8 * n * eps(np.float64) * 40
    for c in (C64 if memory == IN_MEMORY else (2.0 ** -600, 2.0 ** 600)):
        got = bl.eigsh(c * s, 3, order="descending", seed=0, memory=memory)
        assert got.report["converged"]
        assert_close_to(_ldexp(got.w, -_exp(c)), ref.w, bound=bound, what=f"eigsh, 2^{_exp(c)}")


@pytest.mark.parametrize("memory", [IN_MEMORY, STREAM])
def test_gram(tall, memory):
    g0 = tall.T @ tall
    # product bound: |G - fl(G)| <= m eps |A|^T |A| entry-wise, norm-wise <= m eps ||A||_F^2 (each run)
    bound = 2 * 600 * eps(np.float64) * float(np.linalg.norm(tall)) ** 2
    for c in C64:
        e = _exp(c)
        if abs(e) >= 600:  # the true Gram (2^+-1200 times) is beyond float64: a clear error with the fix
            with pytest.raises(ParameterError, match="scaled form"):
                bl.gram(c * tall, memory=memory)
            continue
        got = bl.gram(c * tall, memory=memory)
        assert_close_to(_ldexp(got.to_numpy(), -2 * e), g0, bound=bound, what=f"gram, 2^{e}")
    # the fix the error names works: scale * A^T A with a power of two that fits
    got = bl.gram(2.0 ** 600 * tall, scale=2.0 ** -1000, memory=memory)
    assert_close_to(_ldexp(got.to_numpy(), -200), g0, bound=bound, what="gram(scale=2^-1000) of 2^600 A")
    assert got.report["scaling"]["exponent"] > 0


def test_gram_tiled_route_refuses_an_overflow():
    """A Gram over the budget is built by tiles of unscaled squares: an overflow is refused with the fix."""
    a = np.random.default_rng(11).standard_normal((60, 300))
    ok = bl.gram(a, memory="256KiB")
    assert ok.report["route"] == "tiles"
    with pytest.raises(ParameterError, match="scale a by a power of two"):
        bl.gram(np.ldexp(a, 600), memory="256KiB")


@pytest.mark.parametrize("dtype,e", [(np.float64, -600), (np.float32, -100), (np.complex64, -130)])
def test_gram_tiled_route_refuses_squares_that_underflowed_whole(dtype, e):
    """Squares that underflow to 0 leave an all-zero Gram, which is right only for a zero ``A``: the
    tiled route returned zeros for float32 data near 1e-30 (found by a randomized search). An all-zero
    diagonal is now checked against ``A``'s norm (read again, scaled); a zero ``A`` still gives zeros."""
    rng = np.random.default_rng(13)
    a = rng.standard_normal((60, 300))
    if np.dtype(dtype).kind == "c":
        a = a + 1j * rng.standard_normal((60, 300))
    a = (np.ldexp(a.real, e) + (1j * np.ldexp(a.imag, e) if np.dtype(dtype).kind == "c" else 0)).astype(dtype)
    assert np.abs(a).max() > 0 and np.all(np.abs(a) ** 2 == 0)  # every square underflows
    with pytest.raises(ParameterError, match="all-zero diagonal.*scale a by a power of two"):
        bl.gram(a, memory="256KiB")
    zero = bl.gram(np.zeros((60, 300), dtype), memory="256KiB")
    assert zero.report["route"] == "tiles" and not zero.to_numpy().any()


@pytest.mark.parametrize("dtype", [np.float64, np.complex128])
@pytest.mark.parametrize("e,scale", [(-600, 1000), (600, -1000)], ids=["underflow", "overflow"])
def test_gram_tiled_route_with_scale(dtype, e, scale):
    """``scale=2^p`` on the tiled route goes into ``A`` (its slices times ``2^(p/2)`` as read): squares
    that underflow (``2^-1200``, all zeros before) or overflow (refused before) unscaled while
    ``scale A^T A`` fits are formed in range. Bound as :func:`test_gram`."""
    rng = np.random.default_rng(12)
    a = rng.standard_normal((60, 300))
    if dtype == np.complex128:
        a = a + 1j * rng.standard_normal((60, 300))
    g0 = a.conj().T @ a
    bound = 2 * 60 * eps(np.float64) * float(np.linalg.norm(a)) ** 2
    got = bl.gram(np.ldexp(a.real, e) + (1j * np.ldexp(a.imag, e) if dtype == np.complex128 else 0),
                  scale=2.0 ** scale, memory="256KiB")
    assert got.report["route"] == "tiles"
    back = got.to_numpy() * 2.0 ** -(2 * e + scale)  # 2^+-200: exact
    assert_close_to(back, g0, bound=bound, what=f"tiled gram of 2^{e} A")


def test_syrk_slices_scale_where_they_lie():
    """The tiled SYRK's power of two: a slice read into its own array is scaled in place (no third slice
    beside the two its plan counts), a view is copied (its owner is left as it was); exact either way."""
    from blocklin.runtime.blockops import _scaled

    rng = np.random.default_rng(5)
    for x in (rng.standard_normal((8, 6)), rng.standard_normal((8, 6)) + 1j * rng.standard_normal((8, 6))):
        want = x * 2.0 ** 40
        own = x.copy()
        assert _scaled(own, 40) is own and np.array_equal(own, want)
        base = x.copy()
        got = _scaled(base[:, :4], 40)
        assert not np.shares_memory(got, base) and np.array_equal(base, x)
        assert np.array_equal(got, want[:, :4])
    assert _scaled(x, 0) is x


# -- solve -----------------------------------------------------------------------------------------------
def _lstsq_problem():
    rng = np.random.default_rng(4)
    a = rng.standard_normal((500, 12)) * np.logspace(0, -1, 12)
    b = a @ rng.standard_normal((12, 2)) + 0.05 * rng.standard_normal((500, 2))
    return a, b


@pytest.mark.parametrize("method,lam", [("qr", 0.0), ("normal", 0.0), ("qr", 0.3), ("normal", 0.3),
                                        ("auto", "gcv"), ("auto", [0.1, 1.0])])
@pytest.mark.parametrize("memory", [IN_MEMORY, pytest.param(STREAM, marks=pytest.mark.slow)])
def test_solve_tall(method, lam, memory):
    a, b = _lstsq_problem()
    ref = bl.solve(a, b, lam=lam, method=method, memory=memory)
    x0 = ref.to_numpy()
    kappa = np.linalg.cond(a)
    # a backward-stable least-squares solve has forward error <= c m eps kappa^2 ||x|| (squared for the
    # normal equations; kappa = 10 here); two runs
    bound = 2 * 500 * eps(np.float64) * kappa ** 2 * float(np.linalg.norm(x0))
    for ea, eb in ((-600, -600), (-300, -60), (0, 300), (600, 600), (300, -60)):
        lam_c = lam if isinstance(lam, str) else (
            [float(np.ldexp(v, ea)) for v in lam] if isinstance(lam, list) else float(np.ldexp(lam, ea)))
        got = bl.solve(np.ldexp(a, ea), np.ldexp(b, eb), lam=lam_c, method=method, memory=memory)
        # x(2^ea A, 2^eb b) = 2^(eb - ea) x(A, b); lambda scales with A
        assert_close_to(_ldexp(got.to_numpy(), ea - eb), x0, bound=bound, what=f"solve {method} lam={lam} 2^{ea},2^{eb}")
        assert_close_to(_ldexp(got.report["residual_norm"], -eb), ref.report["residual_norm"],
                        bound=bound * float(np.linalg.norm(a, 2)) + 1e-12, what="residual norm")
        assert_close_to(_ldexp(got.report["lam"], -ea), ref.report["lam"], bound=1e-6 * np.max(ref.report["lam"]),
                        what="lambda")


def test_solve_wide_and_square():
    rng = np.random.default_rng(5)
    w = rng.standard_normal((20, 60))
    bw = rng.standard_normal((20, 1))
    g = rng.standard_normal((40, 40)) + 8 * np.eye(40)
    bg = rng.standard_normal((40, 1))
    spd = g @ g.T
    solved = {"wide": bl.solve(w, bw, lam=0.2), "lu": bl.solve(g, bg), "pos": bl.solve(spd, bg, assume_a="pos")}
    refs = {name: x.to_numpy() for name, x in solved.items()}
    # condition numbers below 1e3 here: forward error <= c n eps kappa^2 ||x|| (two runs)
    for ea, eb in ((-600, -600), (-300, 0), (300, 300), (600, 600)):
        got = {"wide": bl.solve(np.ldexp(w, ea), np.ldexp(bw, eb), lam=float(np.ldexp(0.2, ea))),
               "lu": bl.solve(np.ldexp(g, ea), np.ldexp(bg, eb)),
               "pos": bl.solve(np.ldexp(spd, ea), np.ldexp(bg, eb), assume_a="pos")}
        for name, x in got.items():
            x0 = refs[name]
            bound = 2 * 60 * eps(np.float64) * 1e6 * float(np.linalg.norm(x0))
            assert_close_to(_ldexp(x.to_numpy(), ea - eb), x0, bound=bound, what=f"solve {name} 2^{ea},2^{eb}")
            if name != "wide":  # the refinement's report: norms scale, the backward error does not
                r0 = solved[name].report
                assert_close_to(_ldexp(x.report["norm_a"], -ea), r0["norm_a"], bound=60 * eps(np.float64) * r0["norm_a"],
                                what=f"{name} norm_a")  # a sum of 1600 squares, computed twice
                assert 0 < x.report["backward_error"] <= 10 * eps(np.float64)  # LAPACK's level, never 0 or NaN


@pytest.mark.slow
def test_stored_gram_route_refuses_what_it_cannot_scale():
    """A Gram over the budget is stored and summed from unscaled squares: exact where they fit (2^200),
    refused with the fix where they underflow whole (2^-560), never a misleading 'not positive definite'."""
    rng = np.random.default_rng(12)
    a, b = rng.standard_normal((1500, 300)), rng.standard_normal((1500, 1))
    ref = bl.solve(a, b, lam=0.1, memory="600KiB")
    assert "exceeds" in ref.report["method_reason"]
    got = bl.solve(np.ldexp(a, 200), np.ldexp(b, 200), lam=float(np.ldexp(0.1, 200)), memory="600KiB")
    # the same roundings with other exponents (no under- or overflow at 2^200): within two runs' bound
    assert_close_to(got.to_numpy(), ref.to_numpy(), bound=4 * 1500 * eps(np.float64) * np.linalg.norm(ref.to_numpy()),
                    what="stored-Gram solve at 2^200")
    with pytest.raises(ParameterError, match="scale a \\(and b\\) by a power of two"):
        bl.solve(np.ldexp(a, -560), np.ldexp(b, -560), lam=float(np.ldexp(0.1, -560)), memory="600KiB")


def test_solve_float32():
    a, b = _lstsq_problem()
    a, b = a.astype(np.float32), b.astype(np.float32)
    ref = bl.solve(a, b, method="qr").to_numpy()
    bound = 2 * 500 * eps(np.float32) * 100 * float(np.linalg.norm(ref))  # kappa^2 = 100
    for e in (-100, 100):
        got = bl.solve(np.ldexp(a, e), np.ldexp(b, e), method="qr").to_numpy()
        assert_close_to(got, ref, bound=bound, what=f"float32 solve 2^{e}")


# -- factorizations ----------------------------------------------------------------------------------
@pytest.mark.parametrize("memory", [IN_MEMORY, pytest.param("1MiB", marks=pytest.mark.slow)])
def test_factorizations(memory):
    rng = np.random.default_rng(6)
    n = 96 if memory == IN_MEMORY else 256  # 1MiB: tiles of 64 (32 for the QR), out of core
    x = rng.standard_normal((n, n))
    spd, gen, t = x @ x.T + n * np.eye(n), x + 0.5 * np.eye(n), rng.standard_normal((2 * n, n))
    l0 = bl.cholesky(spd, memory=memory).to_numpy()
    p0 = bl.lu(gen, memory=memory).to_numpy()
    r0 = bl.qr(t, memory=memory).to_numpy()
    i0 = bl.inv(gen, memory=memory).to_numpy()
    # every factor is backward stable: ||F(cA)/c^p - F(A)|| <= c n eps ||F(A)|| growth-free for SPD,
    # Householder; LU's packed factors with partial pivoting (growth ~ 1 here); inv: kappa eps ||A^-1||
    tol = 4 * n * eps(np.float64)
    for c in (C64 if memory == IN_MEMORY else (2.0 ** -600, 2.0 ** 300, 2.0 ** 600)):
        e = _exp(c)
        assert_close_to(_ldexp(bl.cholesky(c * spd, memory=memory).to_numpy(), -e // 2), l0,
                        bound=tol * np.linalg.norm(l0), what=f"cholesky 2^{e}")  # chol(c S) = sqrt(c) chol(S)
        p = bl.lu(c * gen, memory=memory).to_numpy()
        assert_close_to(np.tril(p, -1), np.tril(p0, -1), bound=tol * n, what=f"lu L 2^{e}")  # L does not scale
        assert_close_to(_ldexp(np.triu(p), -e), np.triu(p0), bound=tol * n * np.linalg.norm(np.triu(p0)),
                        what=f"lu U 2^{e}")
        assert_close_to(_ldexp(bl.qr(c * t, memory=memory).to_numpy(), -e), r0, bound=tol * np.linalg.norm(r0),
                        what=f"qr R 2^{e}")
        # inv(c A) = inv(A) / c; beyond about 2^+-500 ||A||_F and ||X||_F are read again by scaled tiles
        kappa = np.linalg.cond(gen)
        x = bl.inv(c * gen, memory=memory)
        assert_close_to(_ldexp(x.to_numpy(), e), i0, bound=tol * kappa * np.linalg.norm(i0), what=f"inv 2^{e}")
        assert 0 < x.report["backward_error"] <= tol, (e, x.report["backward_error"])  # measured, not 0 or NaN


@pytest.mark.parametrize("dtype", [np.float64, np.complex128])
@pytest.mark.parametrize("e", [-1000, -600, 600])
def test_reported_norms_of_data_near_the_range_ends(dtype, e):
    """``||A||_F`` in the reports of the streaming QR (``qr(method="tsqr")``, and its ``||b_j||`` and
    residual norms) and of the tiled Cholesky had been summed from unscaled squares: 0 for entries near
    1e-200 (the squares underflow) and inf near 1e200, with a right factor beside them (a randomized
    search). Bounds: Householder QR is backward stable column by column, ``||A + dA|| = ||R||`` with
    ``||dA||_F <= m n eps ||A||_F`` (Higham 2002, Thm 19.4); a sum of squares in any order is within
    ``N eps`` relative; ``rho`` is ``min ||A x - b||`` of a problem with ``cond(A) ~ 1``, to ``m n eps ||b||``."""
    from blocklin.linalg.blocks.streaming_qr import streaming_r
    from blocklin.runtime.powers import ldexp

    rng = np.random.default_rng(21)
    m, n = 400, 12
    a, b = rng.standard_normal((m, n)), rng.standard_normal((m, 2))
    if np.dtype(dtype).kind == "c":
        a, b = a + 1j * rng.standard_normal((m, n)), b + 1j * rng.standard_normal((m, 2))
    tol = m * n * eps(np.float64)
    na, nb = np.linalg.norm(a), np.linalg.norm(b, axis=0)
    rho = np.linalg.norm(b - a @ np.linalg.lstsq(a, b, rcond=None)[0], axis=0)
    r = bl.qr(ldexp(a, e), method="tsqr", memory="2MiB")
    assert r.report["method"] == "tsqr"
    assert_close_to(_ldexp(r.report["norm_a"], -e), na, bound=tol * na, what=f"qr(tsqr) norm_a, 2^{e}")
    sr = streaming_r(ldexp(a, e), ldexp(b, e), memory="2MiB")
    assert_close_to(_ldexp(sr.norm_a, -e), na, bound=tol * na, what=f"streaming R norm_a, 2^{e}")
    assert_close_to(_ldexp(sr.norm_b, -e), nb, bound=tol * nb.max(), what=f"streaming R norm_b, 2^{e}")
    assert_close_to(_ldexp(sr.rho, -e), rho, bound=tol * nb.max(), what=f"streaming R rho, 2^{e}")
    n = 48
    x = rng.standard_normal((n, n)) + (1j * rng.standard_normal((n, n)) if np.dtype(dtype).kind == "c" else 0)
    spd = x @ x.conj().T + n * np.eye(n)
    for memory, tile in ((IN_MEMORY, None), ("256KiB", 16)):  # one tile, and tiles of 16 (out of core)
        got = bl.cholesky(ldexp(spd, e), memory=memory, tile=tile)
        assert got.report["plan"]["tile"] == (tile or n)
        assert_close_to(_ldexp(got.report["norm_a"], -e), np.linalg.norm(spd),
                        bound=4 * n * eps(np.float64) * np.linalg.norm(spd), what=f"cholesky norm_a, 2^{e}, tile={tile}")


@pytest.mark.parametrize("memory", [IN_MEMORY, "128KiB"])
@pytest.mark.parametrize("dtype,case", [(np.float32, "all near 1e-39"), (np.complex64, "all near 1e-40"),
                                        (np.float32, "8 columns near 1e-39"), (np.float64, "all near 1e-310")])
def test_lu_of_columns_near_the_underflow_threshold(dtype, case, memory):
    """Single-precision matrices whose columns sit near the underflow threshold had subnormal pivots,
    which the panel ``getrf`` (OpenBLAS: it multiplies by the pivot's reciprocal) factored with
    multipliers near ``1e-39`` and ``||PA - LU|| / ||A|| = 0.7`` (1.9 with only 8 such columns), and
    ``slogdet`` 235 off (a randomized search). Such columns are scaled by a power of two near 1 before the
    panel is factored, ``U``'s scaled back (exact: pivoting compares within a column).
    Bound: the LU backward error ``4 n eps |L| |U|`` (Higham 2002, Thm 9.3), norm-wise, plus underflow:
    every entry of ``L U`` sums ``n`` products, each off by at most half the smallest subnormal, and ``U``
    is rounded to subnormals once more when scaled back (``2 n^2`` of them, norm-wise ``2 n^2 tiny_s``)."""
    rng = np.random.default_rng(21)
    n = 96
    real = np.float32 if np.dtype(dtype) == np.complex64 else dtype
    a = rng.standard_normal((n, n)) + (1j * rng.standard_normal((n, n)) if np.dtype(dtype).kind == "c" else 0)
    scale = {"all near 1e-39": 1e-39, "all near 1e-40": 1e-40, "8 columns near 1e-39": 1.0, "all near 1e-310": 1e-310}
    a = a * scale[case]
    if case.startswith("8 columns"):
        a[:, -8:] *= 1e-39
    a = a.astype(dtype)
    f = bl.lu(a, memory=memory)
    packed = f.to_numpy().astype(np.complex128)
    low, up = np.tril(packed, -1) + np.eye(n), np.triu(packed)
    pa = a.astype(np.complex128)
    for i, p in enumerate(f.report["pivots"]):
        pa[[i, p]] = pa[[p, i]]
    tiny_s = float(np.finfo(real).smallest_subnormal)
    bound = 4 * n * eps(real) * np.linalg.norm(np.abs(low) @ np.abs(up)) + 2 * n * n * tiny_s
    assert np.linalg.norm(low @ up - pa) <= bound, (np.linalg.norm(low @ up - pa) / np.linalg.norm(pa))
    # partial pivoting's multipliers: at most 1, or sqrt(2) where the pivot is chosen by |Re| + |Im| (icamax)
    assert np.abs(np.tril(packed, -1)).max() <= (np.sqrt(2) if np.dtype(dtype).kind == "c" else 1.0) * (1 + 1e-6)


def assert_lu_near_the_top(f, a, real):
    """``P A D = L U`` within ``4 n eps || |L| |U| ||`` (the LU backward error), ``D`` scaling column 0 (whose
    entries lie near the range's top) by ``2^-(maxexp - 1)`` so that the check itself stays in range;
    returns the packed factors."""
    n = len(a)
    d = np.ones(n)
    d[0] = 2.0 ** -(np.finfo(real).maxexp - 1)
    packed = f.to_numpy().astype(np.complex128)
    low, up = np.tril(packed, -1) + np.eye(n), np.triu(packed) * d
    pa = a.astype(np.complex128) * d
    for i, p in enumerate(f.report["pivots"]):
        pa[[i, p]] = pa[[p, i]]
    bound = 4 * n * eps(real) * np.linalg.norm(np.abs(low) @ np.abs(up))
    assert np.linalg.norm(low @ up - pa) <= bound, np.linalg.norm(low @ up - pa) / bound
    return packed


@pytest.mark.parametrize("memory", [IN_MEMORY, "256KiB"])  # 256 KiB: panels of 32 columns
@pytest.mark.parametrize("dtype", [np.complex64, np.complex128, np.float32, np.float64])
def test_lu_of_a_column_near_the_overflow_threshold(dtype, memory):
    """A first column whose entries sit near the overflow threshold (``0.95 max``): the panel ``getrf``
    divides by its pivot through the reciprocal, which for a complex pivot (Smith's quotient, denominator
    up to ``|Re| + |Im|``) overflowed to zero, so a complex64 LU had multipliers 0 for ``1e-3 - 0.14j``
    (``||PA - LU|| / (||L|| ||U||)`` 2e5 ``eps``, as SciPy's ``lu_factor``; a randomized search). Such a
    column is scaled by ``2^-3`` before the panel is factored and ``U``'s scaled back (exact).
    Bound: the LU backward error ``4 n eps |L| |U|`` (Higham 2002, Thm 9.3), norm-wise, checked on
    ``A D = P L (U D)`` with ``D`` the power of two that brings the first column near 1 (exact)."""
    rng = np.random.default_rng(22)
    n = 96
    real = np.float32 if np.dtype(dtype) in (np.complex64, np.float32) else np.float64
    a = rng.standard_normal((n, n)) + (1j * rng.standard_normal((n, n)) if np.dtype(dtype).kind == "c" else 0)
    peak = max(np.abs(a[:, 0].real).max(), np.abs(a[:, 0].imag).max())
    a[:, 0] *= 0.95 * float(np.finfo(real).max) / peak
    if np.dtype(dtype).kind == "c":  # the pivot: |Re| = |Im|, where |z|^2 / |Re| is twice the part
        a[0, 0] = 0.7 * float(np.finfo(real).max) * (1 + 1j)  # |z| 0.99 max, |z|^2 / |Re| 1.4 max
    else:
        a[0, 0] = 0.95 * float(np.finfo(real).max)
    a = a.astype(dtype)
    assert np.isfinite(a).all()
    f = bl.lu(a, memory=memory)
    packed = assert_lu_near_the_top(f, a, real)
    assert np.abs(np.tril(packed, -1)).max() <= (np.sqrt(2) if np.dtype(dtype).kind == "c" else 1.0) * (1 + 1e-6)


@pytest.mark.parametrize("memory", [IN_MEMORY, "256KiB"])
@pytest.mark.parametrize("dtype", [np.complex64, np.complex128])
def test_lu_of_a_complex_entry_whose_modulus_exceeds_the_range(dtype, memory):
    """A finite complex entry ``0.95 max (1 + 1j)`` has a modulus ``1.34 max`` beyond the dtype's range:
    ``max |A|`` had read ``inf`` and ``lu`` warned that ``A`` holds Inf (finite data, checked). No warning
    now, and the factors hold the LU backward error (bound as in the test above, on ``A D``)."""
    rng = np.random.default_rng(24)
    n = 64
    real = np.float32 if np.dtype(dtype) == np.complex64 else np.float64
    big = float(np.finfo(real).max)
    a = rng.standard_normal((n, n)) + 1j * rng.standard_normal((n, n))
    a[:, 0] *= 0.1 * big
    a[0, 0] = 0.95 * big * (1 + 1j)
    a = a.astype(dtype)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        f = bl.lu(a, memory=memory)
    assert_lu_near_the_top(f, a, real)


@pytest.mark.parametrize("precision", ["fp16", "bf16"])
@pytest.mark.parametrize("c", [2.0 ** 100, 1e39, 2.0 ** -100], ids=["2^100", "1e39", "2^-100"])
def test_16_bit_solves_of_a_scaled_a_with_b_near_1(precision, c):
    """``A`` near ``2^100`` with ``b`` near 1 puts ``x`` near ``2^-100`` and its corrections near float32's
    underflow threshold, where the preconditioner's float32 solves lost their digits: GMRES-IR stalled at a
    backward error of ``2.4e-13`` and ``solve`` and ``inv`` were refused (a randomized search). The
    solves take each column scaled by a power of two (exact). Bound: the float64 backward error of a
    refined solve (:func:`assert_residual`), the inverse column by column ``||A X - I||``."""
    rng = np.random.default_rng(23)
    n = 64
    a = (rng.standard_normal((n, n)) + np.sqrt(n) * np.eye(n)) * c
    b = rng.standard_normal((n, 2))
    x = bl.solve(a, b, precision=precision, memory="1MiB")
    assert_residual(a, x.to_numpy(), b, dtype=np.float64)
    assert_residual(a, bl.inv(a, precision=precision, memory="1MiB").to_numpy(), np.eye(n), dtype=np.float64)


# -- the probe's cases -----------------------------------------------------------------------------------
def _graded_reference(a: np.ndarray, k: int) -> np.ndarray:
    """Singular values of ``a`` whose column 0 is 1e201 times the others, from the exact structure:
    s_1 = ||a_0|| (1 + O(1e-400)), the rest those of the other columns projected off a_0."""
    a0 = a[:, 0] / scipy.linalg.norm(a[:, 0])  # scaled 2-norm: no overflow
    rest = a[:, 1:] - np.outer(a0, a0 @ a[:, 1:])
    return np.concatenate([[scipy.linalg.norm(a[:, 0])], np.linalg.svd(rest, compute_uv=False)[:k - 1]])


@pytest.mark.parametrize("method", ["auto", "gram", "lanczos"])
@pytest.mark.parametrize("memory", [IN_MEMORY, STREAM])
def test_one_column_scaled_by_1e201(method, memory):
    rng = np.random.default_rng(8)
    a = rng.standard_normal((800, 12))
    a[:, 0] *= 1e201
    ref = _graded_reference(a, 3)
    got = bl.svd(a, 3, method=method, seed=0, memory=memory)
    # each singular value to its own rounding: Householder QR keeps each column's error relative to that
    # column (Higham Thm 19.4), xGESVD the graded R's small values to their own size (checked: 1e-15)
    assert np.all(np.abs(got.s - ref) <= 1e3 * eps(np.float64) * ref), (got.s, ref)
    assert "tsqr" in got.report["fallback"] and got.report["converged"]
    u = got.U.to_numpy()
    assert_close_to(u.T @ u, np.eye(3), bound=100 * 800 * eps(np.float64), what="U orthonormal")


@pytest.mark.parametrize("c", [1e200, 1e-200])
def test_huge_and_tiny_entries_svd_k5(c):
    rng = np.random.default_rng(9)
    a = rng.standard_normal((300, 40)) @ np.diag(np.logspace(0, -2, 40))
    ref = np.linalg.svd(a, compute_uv=False)[:5]
    for memory in (IN_MEMORY, STREAM):
        for method in ("auto", "lanczos"):
            same = bl.svd(a, 5, method=method, seed=0, memory=memory).s
            got = bl.svd(c * a, 5, method=method, seed=0, memory=memory)
            assert got.report["converged"] and got.s.size == 5
            # against LAPACK: the default tol targets the singular values to about 10 sqrt(eps) relative
            # (docs/svd.md, Defaults and accuracy): |s_i - s_ref_i| <= 10 sqrt(eps) s_1 per value
            assert_close_to(got.s / c, ref, bound=10 * np.sqrt(eps(np.float64)) * ref[0] * np.sqrt(5),
                            what=f"svd {method} k=5 c={c:g} against LAPACK")
            # against the same run on A (c is 2^+-664.4: not a power of two, so c A rounds once more per
            # entry): Weyl with ||E|| <= eps ||A|| from that rounding plus both runs' 4 m eps s_1
            assert_close_to(got.s / c, same, bound=(8 * 300 + 2) * eps(np.float64) * ref[0],
                            what=f"svd {method} k=5 c={c:g} against A")


@pytest.mark.parametrize("c", [1e200, 1e-200])
def test_solve_with_scaled_a_and_b(c):
    rng = np.random.default_rng(10)
    a = rng.standard_normal((200, 30))
    b = a @ rng.standard_normal((30, 1))
    x_ref = np.linalg.lstsq(a, b, rcond=None)[0]
    kappa = np.linalg.cond(a)
    for method in ("qr", "normal", "auto"):
        x = bl.solve(c * a, c * b, method=method, memory=STREAM)
        assert np.isfinite(x.report["residual_norm"])
        assert_close_to(x.to_numpy(), x_ref, bound=4 * 200 * eps(np.float64) * kappa ** 2 * np.linalg.norm(x_ref),
                        what=f"solve {method} c={c:g}")


@pytest.mark.parametrize("dtype, c", [(np.float32, 2.0 ** 100), (np.float64, 2.0 ** 996), (np.complex64, 2.0 ** 100),
                                      (np.float32, 2.0 ** -100), (np.float64, 2.0 ** -990)])
@pytest.mark.parametrize("method", ["normal", "qr"])
def test_wide_solve_near_the_range_ends(dtype, c, method):
    """The dual form ``x = A^T y`` of a wide ``A``: ``y = (A A^T)^-1 b`` is ``kappa^2 / |A|^2`` times ``b``,
    and the GEMM's sums ``A^T (2^(eb - ea) y')`` had overflowed to an Inf in every entry (``c = 1e30`` in
    float32, ``1e300`` in float64, condition ``1e6``; found by a randomized search). ``c A`` and ``c b``
    (``c`` a power of two: exact) give the bits of ``A`` and ``b``'s ``x``; float64's is within the normal
    equations' ``kappa^2 eps`` of LAPACK's minimum-norm solution."""
    from blocklin.runtime.powers import ldexp  # keeps the dtype, complex parts included

    rng = np.random.default_rng(3)
    m, n = 6, 50
    kappa = 1e6 if np.dtype(dtype) == np.float64 else 1e5  # kappa^2 |A| beyond the dtype's range at c
    u, _ = np.linalg.qr(rng.standard_normal((m, m)))
    a = (u * np.logspace(0, -np.log10(kappa), m)) @ np.linalg.qr(rng.standard_normal((n, m)))[0].T
    b = rng.standard_normal(m)
    if np.dtype(dtype).kind == "c":
        a = a + 1j * ((u * np.logspace(0, -np.log10(kappa), m)) @ np.linalg.qr(rng.standard_normal((n, m)))[0].T)
        b = b + 1j * rng.standard_normal(m)
    a, b = a.astype(dtype), b.astype(dtype)
    plain = bl.solve(a, b, method=method, memory=IN_MEMORY).to_numpy()
    got = bl.solve(ldexp(a, _exp(c)), ldexp(b, _exp(c)), method=method, memory=IN_MEMORY)
    assert got.dtype == dtype
    got = got.to_numpy()
    assert np.isfinite(got).all()
    np.testing.assert_array_equal(got, plain)
    if np.dtype(dtype) == np.float64:
        x_ref = np.linalg.lstsq(a, b, rcond=None)[0]
        bound = 8 * n * eps(dtype) * np.linalg.cond(a) ** 2 * np.linalg.norm(x_ref)
        assert_close_to(got[:, 0], x_ref, bound=bound, what=f"wide solve {method} c=2^{_exp(c)}")


def test_an_overflowed_wide_solution_is_refused(monkeypatch):
    """Were the GEMM's sums ever to overflow (the earlier split of the exponents, put back here), the Inf
    is refused, never returned as ``x``: the per-column judgement of ``x``
    (:func:`~blocklin.linalg.blocks.result_range.check_columns`) refuses the column naming ``b``. float64 data
    near the top of its range: float32 data's ``x = A^T y`` is summed in float64, where that split does not
    overflow."""
    from blocklin.linalg.solve import wide

    monkeypatch.setattr(wide, "dual_exponents", lambda y, eb, ea, dtype: (eb - ea, -ea))
    rng = np.random.default_rng(3)
    u, _ = np.linalg.qr(rng.standard_normal((4, 4)))
    a = (u * np.logspace(0, -5, 4)) @ np.linalg.qr(rng.standard_normal((40, 4)))[0].T * 2.0 ** 1000
    b = rng.standard_normal(4) * 2.0 ** 1000
    with pytest.raises(bl.errors.ParameterError, match="^b: must give a solution x within the range of float64.*"
                       "beyond 1.8e\\+308"):
        bl.solve(a, b, method="normal", memory=IN_MEMORY)


# -- converged only for checked, finite residuals -------------------------------------------------------
def test_nan_residuals_never_read_as_converged():
    s = np.array([3.0, 2.0, 1.0])
    rep = triplet_report(s, np.array([1e-12, np.nan, 1e-12]), 1e-4, np.float64)
    assert rep["converged_triplets"] == [True, False, True]
    rep = triplet_report(s, np.array([np.nan, 0.0, 0.0]), None, np.float64)  # no tol: still not converged
    assert rep["converged_triplets"][0] is False
    with pytest.raises(ConvergenceError, match="must be finite"):
        scaling.check_finite_result("residual_norm", [1.0, np.nan], "the solve's residual norm")


def test_sketch_is_never_reported_converged(tall):
    """The single-pass sketch measures no residual: converged is None, with the note saying why."""
    res = bl.svd(2.0 ** 600 * tall, 3, method="sketch", seed=0)
    assert res.report["converged"] is None and "not computed" in res.report["residual_note"]


def test_exponent_choice():
    lo, hi = scaling.safe_range(np.float64)
    assert (lo, hi) == (2.0 ** -256, 2.0 ** 256)
    assert scaling.exponent_for(1.0, np.float64) == 0 and scaling.exponent_for(hi, np.float64) == 0
    assert scaling.exponent_for(1e200, np.float64) == int(np.frexp(1e200)[1])
    assert 0.5 <= 1e-200 / 2.0 ** scaling.exponent_for(1e-200, np.float64) < 1
    assert scaling.exponent_for(float("nan"), np.float64) == 0 and scaling.exponent_for(0.0, np.float64) == 0
    assert scaling.safe_range(np.float32) == (2.0 ** -32, 2.0 ** 32)
    assert scaling.squares_lose_columns(np.array([1.0, 2.0 ** -520, 0.0, 2.0 ** -500])) == 1


def test_column_exponents_only_where_one_power_loses_a_column():
    """A right-hand side's powers per column (``Scaling.per_column``): None while the one power ``2^-e`` keeps every
    column's largest entry above ``tiny * 2^nmant`` (the passes then scale by that one power, with its bits), one
    power per column where it does not; a zero column keeps ``e``. ``strip_exponent`` gives a pass one ``int``
    for equal powers."""
    from blocklin.linalg.blocks.scaling import column_exponents_for
    from blocklin.runtime.passes import strip_exponent

    assert column_exponents_for(np.array([2.0**600, 2.0**100]), 601, np.float64) is None
    assert column_exponents_for(np.array([2.0**600]), 601, np.float64) is None
    got = column_exponents_for(np.array([2.0**600, 2.0**-600, 0.0]), 601, np.float64)
    assert got.tolist() == [601, -599, 601]
    assert column_exponents_for(np.array([2.0**100, 2.0**-30]), 101, np.float32) is not None  # below 2^-126 * 2^23
    assert column_exponents_for(np.array([2.0**100, 2.0**-2]), 101, np.float32) is None
    assert strip_exponent(5) == 5 and strip_exponent((3, 3)) == 3 and strip_exponent(np.array([3, -4])) == (3, -4)


@pytest.mark.parametrize("e", [-600, -300, 600])
def test_wide_ridge_over_the_gram_budget_of_data_near_the_range_ends(tmp_path, e):
    """A wide ridge whose SYRK pass (which scales ``A`` by a power of two) is over the budget forms ``A A^T`` by
    an out-of-core GEMM, unscaled: at ``2^-600`` its squares underflowed, the Gram was 0 and ``x = 0`` came back
    without a word (a randomized search; the SYRK pass at 3 KiB gives x). Refused now, naming the budget, where
    ``max |a|`` is beyond the range squared without loss; at ``2^-300`` the GEMM's Gram is right: x to the bound
    ``8 m eps kappa ||x||`` (kappa of ``A A^T + lam^2 I``, the dual form's matrix)."""
    from blocklin.errors import BudgetError

    rng = np.random.default_rng(0)
    t = rng.standard_normal((5, 21))
    b = rng.standard_normal((5, 1))
    a = bl.from_array(_ldexp(t, e), tmp_path / "a.zarr", chunks=(3, 4))
    lam = 1e-3
    if abs(e) > 485:
        with pytest.raises(BudgetError, match="SYRK pass for data beyond the range squared without loss"):
            bl.solve(a, b, lam=float(_ldexp(lam, e)), memory="2KiB")
        return
    x = _ldexp(bl.solve(a, b, lam=float(_ldexp(lam, e)), memory="2KiB").to_numpy(), e)
    g = t @ t.T + lam ** 2 * np.eye(5)
    ref = t.T @ np.linalg.solve(g, b)
    bound = 8 * 5 * eps(np.float64) * np.linalg.cond(g) * np.linalg.norm(ref)
    assert np.linalg.norm(x - ref) <= bound, (np.linalg.norm(x - ref), bound)
