"""Sparse matrices and operators whose entries sit near the ends of the floating-point range:
``svd``, ``eigsh`` and ``pca`` run on ``2^-e`` times the operator, ``e`` learned from its first
product (:class:`blocklin.linalg.blocks.scaling.ProductScaling`), and multiply the results back.

Multiplying by a power of two is exact in binary floating point, and every product of the scaled
operator is ``2^(k - e)`` times the product of the unscaled one; so a run on ``2^k S`` must give the
bits of the run on ``S`` (same seed), singular values and eigenvalues times ``2^k``, vectors and
variance ratios equal. The unscaled runs are checked against LAPACK here too, with the bounds of
``test_svd_sparse.py`` (:func:`assert_ritz_values`). Before the scaling, ``2^+-700`` gave values 15-95%
off, some with ``converged`` and no warning.
"""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
from scipy.sparse.linalg import aslinearoperator

import blocklin as bl
from blocklin.errors import BlocklinWarning, ConvergenceError
from blocklin.runtime import sparse_pass
from support.tolerances import assert_ritz_values

#: Powers of two per dtype: near the ends of the range (float64 2^+-1022 and float32 2^+-126 are its
#: limits), where the products' squares leave it, and beyond the safe range (2^+-256, 2^+-32).
POWERS = {np.float64: (700, -700, 300, -300), np.float32: (90, -90)}
CASES = [(dt, k) for dt, ks in POWERS.items() for k in ks]
IDS = [f"{np.dtype(dt).name}-2^{k}" for dt, k in CASES]


def _tall(dtype) -> sp.csr_matrix:
    x = sp.random(500, 60, density=0.1, random_state=3, format="csr")
    return (x @ sp.diags(np.logspace(0, -3, 60))).tocsr().astype(dtype)


def _symmetric(dtype) -> sp.csr_matrix:
    x = sp.random(300, 300, density=0.03, random_state=2, format="csr")
    return (x + x.T).tocsr().astype(dtype)


def _scaled(x: sp.csr_matrix, k: int) -> sp.csr_matrix:
    y = x.copy()
    y.data = np.ldexp(y.data, k).astype(x.dtype)  # exact: no entry leaves the range
    assert np.array_equal(np.ldexp(y.data.astype(np.float64), -k), x.data.astype(np.float64))
    return y


def _back(v, k):
    return np.ldexp(np.asarray(v, dtype=np.float64), -k)


@pytest.mark.parametrize("method", ["lanczos", "rsvd"])
@pytest.mark.parametrize("dtype,k", CASES, ids=IDS)
def test_svd_of_a_scaled_sparse_matrix_is_the_scaled_svd(tmp_path, dtype, k, method):
    x = _tall(dtype)
    a = bl.from_sparse(x, tmp_path / "a.zarr")
    b = bl.from_sparse(_scaled(x, k), tmp_path / "b.zarr")
    U, s, Vt = ref = bl.svd(a, 4, method=method, seed=0)
    U2, s2, Vt2 = got = bl.svd(b, 4, method=method, seed=0)
    assert np.array_equal(_back(s2, k), np.asarray(s, np.float64))
    assert np.array_equal(Vt2, Vt) and np.array_equal(np.asarray(U2), np.asarray(U))
    assert np.array_equal(_back(got.report["residuals"], k), np.asarray(ref.report["residuals"]))
    assert got.report["scaling"]["exponent"] != 0 and ref.report["scaling"] is None
    full = np.linalg.svd(x.toarray().astype(np.float64), compute_uv=False)
    assert_ritz_values(s, full[:4], spectrum=full, residuals=np.asarray(ref.report["residuals"]), n=500,
                       norm=full[0], dtype=dtype)


@pytest.mark.parametrize("scheduler", ["sync", "threads", "processes"])
def test_streamed_products_near_the_range_ends(tmp_path, monkeypatch, scheduler):
    """Row blocks not held: every product is one pass of the job's tasks over ``S`` (several groups),
    on each scheduler. The scaling wraps the products, so the same bits as the unscaled run."""
    monkeypatch.setattr(sparse_pass, "HOLD_BLOCKS", False)
    monkeypatch.setattr(sparse_pass, "GROUP_ENTRIES", 800)
    x = _tall(np.float64)
    a = bl.from_sparse(x, tmp_path / "a.zarr")
    b = bl.from_sparse(_scaled(x, -700), tmp_path / "b.zarr")
    _U, s, Vt = ref = bl.svd(a, 3, method="lanczos", seed=0, scheduler=scheduler, workers=2)
    _U2, s2, Vt2 = got = bl.svd(b, 3, method="lanczos", seed=0, scheduler=scheduler, workers=2)
    assert got.report["phases"]["products with the operator"] == "the job's tasks (row blocks)"
    assert np.array_equal(_back(s2, -700), s) and np.array_equal(Vt2, Vt)
    full = np.linalg.svd(x.toarray(), compute_uv=False)
    assert_ritz_values(s, full[:3], spectrum=full, residuals=np.asarray(ref.report["residuals"]), n=500,
                       norm=full[0])


@pytest.mark.parametrize("dtype,k", CASES, ids=IDS)
def test_eigsh_of_a_scaled_sparse_matrix_is_the_scaled_eigsh(tmp_path, dtype, k):
    x = _symmetric(dtype)
    a = bl.from_sparse(x, tmp_path / "a.zarr")
    b = bl.from_sparse(_scaled(x, k), tmp_path / "b.zarr")
    w, V = ref = bl.eigsh(a, 4, seed=0, order="descending")
    w2, V2 = got = bl.eigsh(b, 4, seed=0, order="descending")
    assert np.array_equal(_back(w2, k), np.asarray(w, np.float64)) and np.array_equal(V2, V)
    assert got.report["converged"] and got.report["scaling"]["exponent"] != 0
    full = np.linalg.eigvalsh(x.toarray().astype(np.float64))
    assert_ritz_values(w, full[::-1][:4], spectrum=full, residuals=np.asarray(ref.report["residuals"]), n=300,
                       norm=float(np.abs(full).max()), dtype=dtype)


@pytest.mark.parametrize("dtype,k", CASES, ids=IDS)
def test_pca_of_a_scaled_sparse_matrix(tmp_path, dtype, k):
    """Components, singular values and variance ratios as for ``S``; the variances themselves are
    ``4^k`` times S's, which float64 cannot hold at ``k = +-700`` (inf or 0, with a warning, as the
    dense route says)."""
    x = _tall(dtype)
    a = bl.from_sparse(x, tmp_path / "a.zarr")
    b = bl.from_sparse(_scaled(x, k), tmp_path / "b.zarr")
    ref = bl.pca(a, 3, seed=0)
    if abs(k) > 500:
        with pytest.warns(BlocklinWarning, match="beyond float64's range"):
            got = bl.pca(b, 3, seed=0)
    else:
        with np.errstate(over="ignore"):  # float32's variances at 4^+-90 are out of its range (inf, 0)
            got = bl.pca(b, 3, seed=0)
    if 2 * abs(k) < np.finfo(dtype).maxexp - 16:  # 4^k S's variances in the dtype's range: exact
        np.testing.assert_array_equal(np.ldexp(got.explained_variance_.astype(np.float64), -2 * k),
                                      ref.explained_variance_.astype(np.float64))
    assert np.array_equal(got.explained_variance_ratio_, ref.explained_variance_ratio_)
    assert np.array_equal(_back(got.singular_values_, k), np.asarray(ref.singular_values_, np.float64))
    assert np.array_equal(got.components_, ref.components_)
    assert np.array_equal(_back(got.mean_, k), np.asarray(ref.mean_, np.float64))


def test_a_scipy_operator_near_the_range_ends(rng):
    """A SciPy ``LinearOperator`` (no entries to read): the same bits as the unscaled operator."""
    dense = rng.standard_normal((200, 30)) @ np.diag(np.logspace(0, -2, 30))
    _U, s, Vt = ref = bl.svd(aslinearoperator(dense), 3, method="lanczos", seed=0)
    for k in (800, -800):
        _U2, s2, Vt2 = res = bl.svd(aslinearoperator(np.ldexp(dense, k)), 3, method="lanczos", seed=0)
        assert np.array_equal(_back(s2, k), s) and np.array_equal(Vt2, Vt), k
        assert res.report["scaling"]["exponent"] != 0
    full = np.linalg.svd(dense, compute_uv=False)
    assert_ritz_values(s, full[:3], spectrum=full, residuals=np.asarray(ref.report["residuals"]), n=200,
                       norm=full[0])


def test_an_operator_whose_first_product_is_not_finite_is_refused():
    bad = np.ones((50, 10))
    bad[3, 4] = np.nan
    with pytest.raises(ConvergenceError, match="first block"):
        bl.svd(aslinearoperator(bad), 2, method="lanczos", seed=0)


def _few_bits(m: int, n: int, dtype, seed: int) -> sp.csr_matrix:
    """Entries of 8 significant bits (``j / 256``, ``j`` in 1..255, by a power of two per column), so that
    ``2^-1040 S`` (float64) and ``2^-140 S`` (float32), subnormal everywhere, hold them exactly."""
    x = sp.random(m, n, density=0.15, random_state=seed, format="csr")
    x.data = np.ldexp(np.ceil(x.data * 255), -8)
    return (x @ sp.diags(np.ldexp(1.0, -np.arange(n) % 4))).tocsr().astype(dtype)


SUBNORMAL = [(np.float64, -1040), (np.float32, -140)]


@pytest.mark.parametrize("operation", ["svd-lanczos", "svd-rsvd", "pca", "eigsh"])
@pytest.mark.parametrize("dtype,k", SUBNORMAL, ids=[f"{np.dtype(d).name}-2^{k}" for d, k in SUBNORMAL])
def test_a_sparse_matrix_of_subnormal_entries(tmp_path, dtype, k, operation):
    """Every entry subnormal: ``e`` is below ``-maxexp``, where ``2^-e X`` overflowed (svd, pca and eigsh
    crashed: ``LinAlgError``, ``array must not contain infs or NaNs``). The input is now scaled by at most
    ``2^(maxexp - 32)``, the rest of the power applied to the product, and the first product, near the
    subnormals' fixed spacing, is made again scaled: the bits of the run on ``S``, times ``2^k`` (the
    values returned, subnormal themselves, rounded to the subnormals' spacing)."""
    x = _symmetric_few_bits(dtype) if operation == "eigsh" else _few_bits(300, 40, dtype, 4)
    y = _scaled(x, k)
    assert np.abs(y.data).max() < np.finfo(dtype).tiny  # all subnormal
    a = bl.from_sparse(x, tmp_path / "a.zarr")
    b = bl.from_sparse(y, tmp_path / "b.zarr")
    if operation == "eigsh":
        (w, V), (w2, V2) = (bl.eigsh(s, 3, seed=0, order="descending") for s in (a, b))
        assert _same_but_subnormal_rounding(w2, w, k, dtype) and np.array_equal(V2, V)
        full = np.linalg.eigvalsh(x.toarray().astype(np.float64))[::-1]
        vals, residuals = w, np.asarray(bl.eigsh(a, 3, seed=0, order="descending").report["residuals"])
    elif operation == "pca":
        with pytest.warns(BlocklinWarning, match="variances are beyond"):  # 2^-2080: 0, as the dense route says
            got = bl.pca(b, 3, seed=0)
        ref = bl.pca(a, 3, seed=0)
        # the means of subnormal entries are rounded to the subnormals' spacing, so 2^k S is centered with
        # an error E of at most that per entry: Weyl, |sigma_i(C + E) - sigma_i(C)| <= ||E||_F <= sqrt(m n) h;
        # each run's values are within their residuals of their operator's (Ritz pairs), plus one rounding
        assert _same_but_subnormal_rounding(got.mean_, ref.mean_, k, dtype)
        fi = np.finfo(dtype)
        h = np.ldexp(1.0, fi.minexp - fi.nmant - 1 - k)
        bound = (np.sqrt(np.prod(x.shape)) + 1) * h + np.asarray(ref.report["residuals"]) + _back(
            got.report["residuals"], k)
        assert np.all(np.abs(_back(got.singular_values_, k) - np.asarray(ref.singular_values_, np.float64)) <= bound)
        return  # pca of S itself is checked against scikit-learn in test_pca_sparse.py
    else:
        method = operation.split("-")[1]
        ref, got = (bl.svd(t, 3, method=method, seed=0) for t in (a, b))
        (s, Vt), (s2, Vt2) = ref[1:], got[1:]
        assert _same_but_subnormal_rounding(s2, s, k, dtype) and np.array_equal(Vt2, Vt)
        full = np.linalg.svd(x.toarray().astype(np.float64), compute_uv=False)
        vals, residuals = s, np.asarray(ref.report["residuals"])
    assert_ritz_values(vals, full[:3], spectrum=full, residuals=residuals, n=x.shape[0], norm=float(np.abs(full).max()),
                       dtype=dtype)


def _same_but_subnormal_rounding(got, ref, k: int, dtype) -> bool:
    """``got`` is ``2^k ref`` rounded once to the subnormals' spacing (``2^-1074``, float32's ``2^-149``)."""
    fi = np.finfo(dtype)
    half_spacing = np.ldexp(1.0, fi.minexp - fi.nmant - 1 - k)  # 2^-1075 (float32 2^-150) times 2^-k
    return bool(np.all(np.abs(_back(got, k) - np.asarray(ref, np.float64)) <= half_spacing))


def _symmetric_few_bits(dtype) -> sp.csr_matrix:
    x = _few_bits(200, 200, dtype, 5)
    return (x + x.T).tocsr().astype(dtype)  # sums of two 8-bit entries: 10 bits, exact at 2^-1040 and 2^-140
