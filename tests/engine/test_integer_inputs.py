"""Integer and boolean inputs of the ``numpy.linalg``-like operations are cast to float64, as NumPy and
SciPy cast them, whether they come as NumPy or Dask arrays or as stored zarr arrays; products
(``matmul``, ``gram``) keep NumPy's rule that integers stay integers and are refused with the fix
(``dtype='float64'``). Ported from SciPy's ``test_decomp_cholesky.py::TestCholesky::test_simple`` and
``test_decomp_lu.py`` (integer matrices), Dask's ``test_linalg.py::test_solve`` and scikit-learn's
``test_pca.py::test_pca_int_dtype_upcast_to_double``.

Every reference is NumPy's on the float64 cast of the same data; the bounds are those of the float64
computation (:mod:`support.tolerances`).
"""

from __future__ import annotations

import numpy as np
import pytest
import zarr

import blocklin as bl
from blocklin.errors import DTypeError
from support.tolerances import assert_factorization, assert_residual, assert_ritz_values, assert_singular_values

da = pytest.importorskip("dask.array")


def spd_int(n: int = 30, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    a = rng.integers(-5, 6, (3 * n, n))
    return a.T @ a + n * np.eye(n, dtype=np.int64)


def as_kind(x: np.ndarray, kind: str, tmp_path, name: str = "int"):
    """``x`` as a NumPy, Dask or stored (zarr, int32) input."""
    if kind == "numpy":
        return x
    if kind == "dask":
        return da.from_array(x, chunks=(16, 16))
    path = tmp_path / f"{name}.zarr"
    zarr.create_array(str(path), data=x.astype(np.int32), chunks=(16, 16))
    return str(path)


@pytest.mark.parametrize("kind", ["numpy", "dask", "stored"])
def test_factorizations_and_solves_cast_integers(kind, tmp_path):
    """SciPy's ``test_simple`` cases of Cholesky and LU on integer matrices, and the solves on them."""
    s = spd_int()
    a = as_kind(s, kind, tmp_path)
    f = s.astype(np.float64)
    L = bl.cholesky(a, memory="256KiB")
    assert L.dtype == np.float64
    assert_factorization(f, L.to_numpy() @ L.to_numpy().T, factors=(L.to_numpy(), L.to_numpy().T))
    assert "cast to float64" in " ".join(L.report.get("read_notes", []))
    b = np.arange(30) % 7  # an integer right-hand side too
    x = bl.solve(a, b, assume_a="pos", memory="256KiB")
    assert_residual(f, np.asarray(x.to_numpy() if isinstance(x, bl.Matrix) else x).ravel(), b.astype(np.float64))
    x = bl.solve(a, b, memory="256KiB")
    assert_residual(f, np.asarray(x.to_numpy() if isinstance(x, bl.Matrix) else x).ravel(), b.astype(np.float64))
    inv = bl.inv(a, memory="256KiB").to_numpy()
    assert_residual(f, inv, np.eye(30), const=8.0 * np.linalg.cond(f))
    lu = bl.lu(a, memory="256KiB")
    assert lu.dtype == np.float64 and lu.report["min_pivot"] > 0


@pytest.mark.parametrize("kind", ["numpy", "dask", "stored"])
def test_low_rank_and_qr_cast_integers(kind, tmp_path):
    """scikit-learn's ``test_pca_int_dtype_upcast_to_double``; the SVD, QR and eigsh of integer data."""
    rng = np.random.default_rng(4)
    x = rng.integers(0, 10, (400, 20))
    a = as_kind(x, kind, tmp_path)
    f = x.astype(np.float64)
    p = bl.pca(a, 3, memory="256KiB", seed=0)
    assert p.components_.dtype == p.explained_variance_.dtype == np.float64
    s = bl.svd(a, memory="256KiB").s
    assert_singular_values(s, np.linalg.svd(f, compute_uv=False), n=400)
    R = bl.qr(a, memory="256KiB").to_numpy()
    assert_factorization(f.T @ f, R.T @ R, factors=(R.T, R), const=4.0 * 400)
    g = f.T @ f
    w = bl.eigsh(as_kind(x.T @ x, kind, tmp_path, "gram"), 2, which="LA", order="descending", seed=0, tol=1e-12,
                 memory="256KiB").w
    spectrum = np.linalg.eigvalsh(g)
    norm = float(spectrum[-1])  # residuals within tol times the largest eigenvalue (eigsh's threshold)
    assert_ritz_values(w, spectrum[::-1][:2], spectrum=spectrum, residuals=1e-12 * norm, n=20, norm=norm)


def test_booleans_are_cast_too():
    x = np.eye(12, dtype=bool) | np.eye(12, k=1, dtype=bool)
    s = bl.svd(x, return_singular_vectors=False)
    assert_singular_values(s, np.linalg.svd(x.astype(np.float64), compute_uv=False), n=12)


def test_products_keep_numpy_rule_for_integers():
    """``np.matmul`` of integers is an integer product; blocklin has no integer GEMM, so it refuses and
    says how to get the float product (NumPy's linalg functions cast, its products do not)."""
    x = np.arange(12).reshape(3, 4)
    with pytest.raises(DTypeError, match="int64.*dtype='float64'"):
        bl.matmul(x, x.T)
    c = bl.matmul(x, x.T, dtype="float64").to_numpy()
    assert np.array_equal(c, (x @ x.T).astype(np.float64))  # small integers: exact in float64
