"""Complex LU and Cholesky (blocklin.lu, blocklin.cholesky) against SciPy/LAPACK, out of core and in memory.

Ported cases: SciPy's ``linalg/tests/test_decomp_lu.py`` (``TestLUFactor``: ``ca``, ``cb``, ``chrect``,
``cvrect``, ``cmed`` against ``getrf``) and ``test_decomp_cholesky.py`` (``TestCholesky.test_simple_complex``,
``test_random_complex``); Dask's ``array/tests/test_linalg.py`` (``test_cholesky_complex``: ``A A^H + n I``
in chunks of (20, 10), (12, 3), (30, 6), both triangles; ``test_lu_*`` shapes through the rectangular LU).

Tolerances: the real bounds of :mod:`support.tolerances` with ``eps`` of the parts' dtype (float32 for
complex64, float64 for complex128), times :data:`COMPLEX`: in complex arithmetic a product carries
``sqrt(2) gamma_2`` and an inner product of length n ``sqrt(2) gamma_{n+2}`` in place of ``gamma_n``
(Higham 2002, Lemma 3.5 and §3.6), and ``sqrt(2) (n + 2) / n <= 3 sqrt(2)`` for every ``n >= 1``.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import scipy.linalg as sl

import blocklin as bl
from blocklin.errors import NotPositiveDefiniteError
from support.tolerances import assert_close_to, assert_factorization, eps

CDTYPES = [np.complex64, np.complex128]
#: The complex-arithmetic factor on the real rounding-error bounds (see the module docstring).
COMPLEX = 3 * np.sqrt(2)


def _crandn(rng, shape, dtype=np.complex128):
    return (rng.standard_normal(shape) + 1j * rng.standard_normal(shape)).astype(dtype)


def _hpd(n, dtype, seed=0):
    """Dask's test_cholesky_complex matrix: ``G G^H + n I`` (cond a few)."""
    g = _crandn(np.random.default_rng(seed), (n, n))
    return (g @ g.conj().T + n * np.eye(n)).astype(dtype)


def _perm(pivots, m):
    perm = np.arange(m)
    for i, p in enumerate(pivots):
        perm[[i, p]] = perm[[p, i]]
    return perm


def _check_lu(a, f, dtype):
    """``P A = L U`` to the backward error of GEPP, and the pivot rule's bound on ``|L|``."""
    m, n = a.shape
    k = min(m, n)
    packed = f[...]
    assert packed.dtype == dtype and packed.shape == (m, n)
    low = np.tril(packed, -1)[:, :k] + np.eye(m, k)
    up = np.triu(packed)[:k]
    # GEPP: |P A - L U| <= gamma_n |L| |U| (Higham Thm 9.3), growth included through ||L|| ||U||
    assert_factorization(a[_perm(f.report["pivots"], m)], low.astype(np.complex128) @ up.astype(np.complex128),
                         factors=(low, up), dtype=dtype, const=2 * COMPLEX)
    # the pivot has the largest |Re| + |Im| of its column, so |l_ij| <= |Re| + |Im| of l_ij <= ... <= sqrt(2)
    # (the ratio of moduli is at most sqrt(2) times the ratio of |Re| + |Im|), up to rounding
    assert np.abs(low).max() <= np.sqrt(2) * (1 + 4 * eps(dtype))


def _gepp_margins(a):
    """Per elimination step, the relative gap between the largest and second largest ``|Re| + |Im|``
    in the pivot column (unblocked GEPP in complex128): a gap far above the rounding means the
    pivot choice cannot differ between blocked orders of the same sums."""
    s = np.array(a, dtype=np.complex128)
    m, n = s.shape
    gaps = []
    for j in range(min(m, n)):
        col = np.abs(s[j:, j].real) + np.abs(s[j:, j].imag)
        order = np.argsort(col)[::-1]
        if col.size > 1:
            gaps.append((col[order[0]] - col[order[1]]) / col[order[0]])
        p = j + order[0]
        s[[j, p]] = s[[p, j]]
        s[j + 1:, j] /= s[j, j]
        s[j + 1:, j + 1:] -= np.outer(s[j + 1:, j], s[j, j + 1:])
    return min(gaps, default=1.0)


def _without_near_ties(shape, dtype, seed):
    """A random complex matrix (the first from ``seed`` on) whose every pivot beats the runner-up by more
    than two blocked orders of the same sums can move them: ``2 gamma_m |L| |U|`` (Higham Thm 9.3), under
    ``100 m eps`` relative with a growth factor below 8."""
    for s in range(seed, seed + 100):
        a = _crandn(np.random.default_rng(s), shape, dtype)
        if _gepp_margins(a) > 100 * shape[0] * eps(dtype):
            return a
    raise AssertionError("no matrix without near-ties in 100 seeds")


@pytest.mark.parametrize("dtype", CDTYPES)
@pytest.mark.parametrize("m,n,tile", [(1, 1, 32), (37, 37, 8), (64, 64, 16), (101, 101, 32), (90, 40, 16),
                                      (40, 90, 16)])
def test_complex_lu_matches_lapack(tmp_path, dtype, m, n, tile):
    a = _without_near_ties((m, n), dtype, seed=m * 1000 + n)
    f = bl.lu(a, tmp_path / "lu.zarr", tile=tile, scheduler="sync")
    _check_lu(a, f, dtype)
    lu_ref, piv_ref = sl.lu_factor(a)
    assert f.report["growth_factor"] < 8  # within the margin _without_near_ties assumed
    np.testing.assert_array_equal(f.report["pivots"], piv_ref)
    assert f.provenance["pivots"] == f.report["pivots"].tolist()
    assert f.report["growth_factor"] >= 1 / np.sqrt(2) and f.report["min_pivot"] > 0


@pytest.mark.parametrize("name", ["ca", "cb", "chrect", "cvrect", "cmed"])
def test_scipy_lu_factor_complex_cases(name):
    """SciPy's TestLUFactor complex matrices, against ``getrf`` (``cmed``: 30 x 40 in panels of 8)."""
    rng = np.random.default_rng(1682281250228846)
    rng.random((30, 40))  # SciPy draws ``med`` first
    cases = {"ca": np.array([[1, 2, 3], [1, 2, 3], [2, 5j, 6]]),
             "cb": np.array([[1j, 2j, 3j], [4j, 5j, 6j], [7j, 8j, 9j]]),
             "chrect": np.array([[1, 2, 3, 4], [5, 6, 7, 8], [9, 10, 12, 12]]) * 1.j,
             "cvrect": 1.j * np.array([[1, 2, 3], [4, 5, 6], [7, 8, 9], [10, 12, 12]]),
             "cmed": rng.random((30, 40)) + 1.j * rng.random((30, 40))}
    a = cases[name].astype(np.complex128)
    with warnings.catch_warnings():  # the small cases are singular: blocklin warns, as LAPACK returns them
        warnings.filterwarnings("ignore", message="lu: an exact zero pivot")
        f = bl.lu(a, tile=8 if name == "cmed" else 32, scheduler="sync")
    getrf = sl.get_lapack_funcs("getrf", (a,))
    lu_ref, piv_ref, _ = getrf(a, overwrite_a=False)
    np.testing.assert_array_equal(f.report["pivots"], piv_ref)
    # small integer-valued cases: exact up to the rounding of a few divisions
    assert_close_to(f[...], lu_ref, bound=2 * COMPLEX * max(a.shape) * eps(np.float64) * np.linalg.norm(a)
                    * max(1.0, f.report["growth_factor"]), what=f"packed LU of {name}")


def test_complex_pivot_is_lapacks_largest_re_plus_im_not_the_modulus(tmp_path):
    """``izamax`` (reference BLAS, used by ``zgetrf``) picks the largest ``|Re| + |Im|``: at column 40 (the
    third panel of 16) the candidates are ``3`` (modulus 3, |Re| + |Im| 3) and ``2 + 2j`` (modulus 2.83,
    |Re| + |Im| 4): LAPACK, and blocklin, pivot on ``2 + 2j``."""
    n, k = 64, 40
    rng = np.random.default_rng(7)
    a = np.triu(_crandn(rng, (n, n)) * 0.1, 1) + 10 * np.eye(n)  # diagonal pivots, no elimination before k
    a[k, k], a[k + 5, k] = 3.0, 2.0 + 2.0j
    a[k + 5, k + 5] = 10.0
    f = bl.lu(a, tile=16, scheduler="sync")
    piv_ref = sl.lu_factor(a)[1]
    assert piv_ref[k] == k + 5 and abs(a[k, k]) > abs(a[k + 5, k])  # LAPACK's rule, not the modulus
    np.testing.assert_array_equal(f.report["pivots"], piv_ref)
    _check_lu(a, f, np.complex128)


def _check_cholesky(a, got, lower, dtype):
    low = got if lower else got.conj().T
    assert got.dtype == dtype
    assert not np.triu(low, 1).any() and np.all(np.diagonal(low).imag == 0) and np.all(np.diagonal(low).real > 0)
    n = a.shape[0]
    # backward stable: ||A - L L^H|| <= c n u ||A|| (Higham Thm 10.3), c = 4 as the real tests
    backward = 4 * COMPLEX * n * eps(dtype) * np.linalg.norm(a.astype(np.complex128))
    assert_close_to(low.astype(np.complex128) @ low.conj().T.astype(np.complex128), a, bound=backward,
                    what="A - L L^H")
    # forward error against LAPACK: each factor within kappa(A) times the relative backward error of the exact
    # one (perturbation of the Cholesky factor: Sun 1991; Higham Thm 10.8), two computations
    ref = sl.cholesky(a.astype(np.complex128), lower=lower)
    kappa = np.linalg.cond(a.astype(np.complex128))
    assert_close_to(got, ref, bound=2 * kappa * backward / np.linalg.norm(a) * np.linalg.norm(ref),
                    what="L against LAPACK")


@pytest.mark.parametrize("dtype", CDTYPES)
@pytest.mark.parametrize("n,chunk", [(20, 10), (12, 3), (30, 6), (70, 16)])
@pytest.mark.parametrize("lower", [True, False])
def test_complex_cholesky_matches_lapack(tmp_path, dtype, n, chunk, lower):
    a = _hpd(n, dtype, seed=n)
    f = bl.cholesky(a, tmp_path / "l.zarr", lower=lower, tile=chunk, scheduler="sync")
    _check_cholesky(a, f[...], lower, dtype)
    assert f.report["tasks"] == -(-n // chunk) * (-(-n // chunk) + 1) // 2
    np.testing.assert_allclose(f.report["norm_a"], np.linalg.norm(a.astype(np.complex128)), rtol=4 * n * eps(dtype))


def test_scipy_cholesky_complex_cases():
    """SciPy's TestCholesky.test_simple_complex and test_random_complex (n = 20, tiles of 8)."""
    m = np.array([[3 + 1j, 3 + 4j, 5], [0, 2 + 2j, 2 + 7j], [0, 0, 7 + 4j]])
    rng = np.random.default_rng(20)
    r = rng.random((20, 20)) + 1j * rng.random((20, 20))
    r[np.diag_indices(20)] = 20 * (0.1 + np.abs(np.diagonal(r)))
    for mat, tile in ((m, 32), (r, 8)):
        a = mat.conj().T @ mat
        a[np.diag_indices_from(a)] = a.diagonal().real  # Hermitian as a product's exact value is
        c = bl.cholesky(a, lower=False, tile=tile, scheduler="sync")[...]
        _check_cholesky(a, c, False, np.complex128)
        low = c.conj().T
        again = low @ low.conj().T
        again[np.diag_indices_from(again)] = again.diagonal().real
        # both orientations factor it within the bounds; their bits need not agree (their tiles' TRSM and
        # HERK run in other orientations, which OpenBLAS's complex Haswell kernels round differently)
        _check_cholesky(again, bl.cholesky(again, lower=True, tile=tile, scheduler="sync")[...], True, np.complex128)
        _check_cholesky(again, bl.cholesky(again, lower=False, tile=tile, scheduler="sync")[...], False,
                        np.complex128)


def test_complex_cholesky_reads_only_its_triangle():
    a = _hpd(50, np.complex128, seed=3)
    junk = a + np.triu(np.full((50, 50), 7.0 - 3.0j), 1)
    np.testing.assert_array_equal(bl.cholesky(junk, tile=16, scheduler="sync")[...],
                                  bl.cholesky(a, tile=16, scheduler="sync")[...])
    junk = a + np.tril(np.full((50, 50), 7.0 - 3.0j), -1)
    np.testing.assert_array_equal(bl.cholesky(junk, lower=False, tile=16, scheduler="sync")[...],
                                  bl.cholesky(a, lower=False, tile=16, scheduler="sync")[...])


@pytest.mark.parametrize("dtype", CDTYPES)
def test_rounding_on_a_hermitian_diagonal_is_dropped(dtype):
    """A Hermitian matrix formed in floating point (``G @ G.conj().T``) can carry imaginary parts up to about
    ``n eps |a_jj|`` on its diagonal; they are dropped (as zpotrf reads only each pivot's real part): the
    factor is that of ``A`` with its real diagonal. Beyond ``sqrt(eps) |a_jj|`` they are refused."""
    n = 40
    a = _hpd(n, dtype, seed=5)
    clean = bl.cholesky(a, tile=16, scheduler="sync")[...]
    rounding = a.copy()
    rounding[np.diag_indices(n)] += (1j * n * eps(dtype) * np.diagonal(a).real).astype(dtype)
    np.testing.assert_array_equal(bl.cholesky(rounding, tile=16, scheduler="sync")[...], clean)
    over = a.copy()
    over[17, 17] += 2j * np.sqrt(eps(dtype)) * a[17, 17].real
    with pytest.raises(NotPositiveDefiniteError, match=r"a\[17, 17\]"):
        bl.cholesky(over, tile=16, scheduler="sync")


@pytest.mark.parametrize("lower", [True, False])
def test_non_real_diagonal_is_not_positive_definite(lower):
    a = _hpd(40, np.complex128, seed=6)
    a[29, 29] += 1e-3j * abs(a[29, 29])  # far beyond rounding: not Hermitian
    with pytest.raises(NotPositiveDefiniteError) as e:
        bl.cholesky(a, lower=lower, tile=16, scheduler="sync")
    assert e.value.pivot == 29
    msg = str(e.value)
    assert "Hermitian" in msg and "a[29, 29]" in msg and "not real" in msg and "assume_a='gen'" in msg


def test_indefinite_hermitian_names_its_pivot():
    a = _hpd(40, np.complex64, seed=7)
    a[33, 33] = -1.0
    with pytest.raises(NotPositiveDefiniteError, match="Hermitian positive definite") as e:
        bl.cholesky(a, tile=16, scheduler="sync")
    assert e.value.pivot is not None and e.value.pivot <= 33


@pytest.mark.parametrize("dtype", CDTYPES)
def test_out_of_core_and_in_memory_plans(dtype):
    """A small budget gives several panels and tiles, a large one a single panel and tile: the same factors
    to the backward error, and LU's pivots."""
    a = _crandn(np.random.default_rng(9), (96, 96), dtype)
    h = _hpd(96, dtype, seed=9)
    small, large = "256KiB", "64MiB"
    f_small, f_large = bl.lu(a, memory=small, scheduler="sync"), bl.lu(a, memory=large, scheduler="sync")
    assert f_small.report["plan"]["tiles"] > 1 and f_large.report["plan"]["tiles"] == 1
    for f in (f_small, f_large):
        _check_lu(a, f, dtype)
        np.testing.assert_array_equal(f.report["pivots"], sl.lu_factor(a)[1])
    c_small, c_large = bl.cholesky(h, memory=small, scheduler="sync"), bl.cholesky(h, memory=large, scheduler="sync")
    assert c_small.report["plan"]["tile"] < 96 <= c_large.report["plan"]["tile"]
    for c in (c_small, c_large):
        _check_cholesky(h, c[...], True, dtype)


def test_complex_factors_identical_bits_across_schedulers(tmp_path):
    a = bl.from_array(_crandn(np.random.default_rng(10), (80, 80)), tmp_path / "a.zarr", chunks=(16, 16))
    h = bl.from_array(_hpd(80, np.complex128, seed=10), tmp_path / "h.zarr", chunks=(16, 16))
    lus = [bl.lu(a, scheduler=s, workers=2) for s in ("sync", "threads", "processes")]
    chols = [bl.cholesky(h, scheduler=s, workers=2)[...] for s in ("sync", "threads", "processes")]
    for f in lus[1:]:
        np.testing.assert_array_equal(f[...], lus[0][...])
        np.testing.assert_array_equal(f.report["pivots"], lus[0].report["pivots"])
    for c in chols[1:]:
        np.testing.assert_array_equal(c, chols[0])
    _check_lu(a[...], lus[0], np.complex128)
    _check_cholesky(h[...], chols[0], True, np.complex128)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", CDTYPES)
def test_complex_factors_on_gpu(dtype):
    """Through CudaDevice (a GPU, or the CuPy stand-in: ``pytest --cupy-standin``)."""
    a = _crandn(np.random.default_rng(11), (75, 75), dtype)
    f = bl.lu(a, tile=32, device="gpu", scheduler="sync")
    _check_lu(a, f, dtype)
    np.testing.assert_array_equal(f.report["pivots"], sl.lu_factor(a)[1])
    h = _hpd(75, dtype, seed=11)
    for lower in (True, False):
        c = bl.cholesky(h, lower=lower, tile=32, device="gpu", scheduler="sync")
        assert c.report["device"] == "gpu"
        _check_cholesky(h, c[...], lower, dtype)
    h[40, 40] = -1.0
    with pytest.raises(NotPositiveDefiniteError):
        bl.cholesky(h, tile=32, device="gpu", scheduler="sync")


def test_complex_factors_resume_to_the_same_bits(tmp_path, monkeypatch):
    """A lost worker mid-factorization: the rerun with resume=True keeps the finished tiles and panels and
    writes the bits of an uninterrupted run (as tests/factor/test_cholesky.py and test_factor_lu.py, complex)."""
    import blocklin.linalg.factor.cholesky_tiles as ct
    import blocklin.linalg.factor.lu_panels as lp
    from blocklin.errors import WorkerLostError

    h = bl.from_array(_hpd(64, np.complex128, seed=12), tmp_path / "h.zarr", chunks=(16, 16))
    a = bl.from_array(_crandn(np.random.default_rng(12), (64, 64)), tmp_path / "a.zarr", chunks=(16, 16))
    ref_c = bl.cholesky(h, tmp_path / "ref-l.zarr", tile=16, scheduler="sync")[...]
    ref_f = bl.lu(a, tmp_path / "ref-lu.zarr", tile=16, scheduler="sync")
    real_diag, real_piv = ct._factor_diagonal, lp._panel_pivots

    def lost_diag(dev, acc, offset, spec):
        if offset == 48:
            raise WorkerLostError("lost")
        return real_diag(dev, acc, offset, spec)

    def lost_piv(spec, j):
        if j == 2:
            raise WorkerLostError("lost")
        return real_piv(spec, j)

    monkeypatch.setattr(ct, "_factor_diagonal", lost_diag)
    monkeypatch.setattr(lp, "_panel_pivots", lost_piv)
    with pytest.raises(WorkerLostError):
        bl.cholesky(h, tmp_path / "l.zarr", tile=16, scheduler="sync", resume=True)
    with pytest.raises(WorkerLostError):
        bl.lu(a, tmp_path / "lu.zarr", tile=16, scheduler="sync", resume=True)
    monkeypatch.setattr(ct, "_factor_diagonal", real_diag)
    monkeypatch.setattr(lp, "_panel_pivots", real_piv)
    c = bl.cholesky(h, tmp_path / "l.zarr", tile=16, scheduler="sync", resume=True)
    f = bl.lu(a, tmp_path / "lu.zarr", tile=16, scheduler="sync", resume=True)
    assert c.report["skipped"] == 9 and f.report["skipped"] == 3  # columns 0-2 of tiles; panels 0-2
    np.testing.assert_array_equal(c[...], ref_c)
    np.testing.assert_array_equal(f[...], ref_f[...])
    np.testing.assert_array_equal(f.report["pivots"], ref_f.report["pivots"])
