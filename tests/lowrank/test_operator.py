"""blocklin.aslinearoperator: SciPy solvers on out-of-core data."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse.linalg as spla

import blocklin as bl
from blocklin.errors import ShapeError
from support.tolerances import assert_eigenvalues, assert_singular_values


@pytest.fixture
def stored(tmp_path):
    rng = np.random.default_rng(0)
    a = rng.standard_normal((700, 60))
    m = bl.from_array(a, tmp_path / "a.zarr", chunks=(64, 60))
    return a, m


def test_products_stream_the_matrix(stored):
    a, m = stored
    op = bl.aslinearoperator(m, memory="512KiB")
    assert op.shape == (700, 60) and op.dtype == np.float64
    rng = np.random.default_rng(1)
    x, y = rng.standard_normal(60), rng.standard_normal(700)
    np.testing.assert_allclose(op.matvec(x), a @ x, atol=1e-12)
    np.testing.assert_allclose(op.rmatvec(y), a.T @ y, atol=1e-12)
    X = rng.standard_normal((60, 3))
    np.testing.assert_allclose(op.matmat(X), a @ X, atol=1e-12)
    np.testing.assert_allclose(op.H.matmat(rng.standard_normal((700, 2))).shape, (60, 2))
    np.testing.assert_allclose((op.T @ y), a.T @ y, atol=1e-12)
    assert op.passes == 5  # one streamed pass per product
    assert op.bytes_read >= 5 * a.nbytes


def test_svds_on_stored_matrix(stored):
    a, m = stored
    op = bl.aslinearoperator(m.path, memory="512KiB")
    u, s, vt = spla.svds(op, k=4, random_state=0)
    ref = np.linalg.svd(a, compute_uv=False)[:4]
    # ARPACK on A^T A to machine precision: the Gram bound (values rounded at s_1^2)
    assert_singular_values(np.sort(s)[::-1], ref, n=a.shape[0], gram=True)
    # sign-free: the rank-4 reconstruction from svds equals the exact one
    uu, ss, vv = np.linalg.svd(a, full_matrices=False)
    np.testing.assert_allclose((u * s) @ vt, (uu[:, :4] * ss[:4]) @ vv[:4], atol=1e-8)


def test_lsqr_and_eigsh(stored):
    a, m = stored
    op = bl.aslinearoperator(m, memory="512KiB")
    xt = np.arange(60.0)
    x = spla.lsqr(op, a @ xt, atol=1e-14, btol=1e-14, iter_lim=500)[0]
    np.testing.assert_allclose(x, xt, rtol=1e-8, atol=1e-8)
    g = a.T @ a
    gop = bl.aslinearoperator(g, memory="256KiB")
    w = spla.eigsh(gop, k=3, return_eigenvectors=False)
    assert_eigenvalues(np.sort(w), np.linalg.eigvalsh(g)[-3:], norm=np.linalg.norm(g, 2), n=g.shape[0])


def test_float32_and_errors(tmp_path):
    a = np.random.default_rng(2).standard_normal((200, 30)).astype(np.float32)
    op = bl.aslinearoperator(a, memory="256KiB")
    assert op.dtype == np.float32
    np.testing.assert_allclose(op.matvec(np.ones(30, np.float32)), a.sum(axis=1), rtol=1e-4, atol=1e-4)
    with pytest.raises(ShapeError, match="rows"):
        op._pass(np.ones(31), False)
    with pytest.raises(TypeError):  # float16 is refused (DTypeError is a TypeError); integers are cast as NumPy does
        bl.aslinearoperator(np.ones((5, 5), dtype=np.float16))
    iop = bl.aslinearoperator(np.ones((5, 5), dtype=np.int64))
    assert iop.dtype == np.float64 and np.array_equal(iop.matvec(np.ones(5)), np.full(5, 5.0))
    iop.close()
    op.close()
