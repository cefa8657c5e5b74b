"""The factorizations through CudaDevice (a GPU, or the CuPy stand-in: ``pytest --cupy-standin``)."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.linalg as sl

import blocklin as bl
from blocklin.errors import NotPositiveDefiniteError
from support.tolerances import assert_solve

pytestmark = pytest.mark.gpu


def _spd(n, seed=0):
    g = np.random.default_rng(seed).standard_normal((n, n))
    return g @ g.T / n + np.eye(n)


@pytest.mark.parametrize("lower", [True, False])
def test_cholesky_on_gpu(tmp_path, lower):
    a = _spd(75)
    f = bl.cholesky(a, tmp_path / "l.zarr", lower=lower, tile=32, device="gpu", scheduler="sync")
    assert f.report["device"] == "gpu"
    # Cholesky backward error bound 4 n eps ||A|| (see tests/factor/test_cholesky.py), as forward error here
    # (cond(A) is a few)
    np.testing.assert_allclose(f[...], sl.cholesky(a, lower=lower), rtol=0, atol=4 * 75 * 2.3e-16 * 16)


def test_cholesky_not_spd_on_gpu(tmp_path):
    a = np.eye(40)
    a[37, 37] = -1.0
    with pytest.raises(NotPositiveDefiniteError, match="row/column 37"):
        bl.cholesky(a, tile=16, device="gpu", scheduler="sync")


def test_triangular_spd_and_lu_on_gpu(tmp_path):
    rng = np.random.default_rng(1)
    t = np.tril(rng.standard_normal((70, 70))) / 8 + 2 * np.eye(70)
    b = rng.standard_normal((70, 3))
    x = bl.solve_triangular(t, b, lower=True, trans=True, tile=32, device="gpu", scheduler="sync")[...]
    assert_solve(x, sl.solve_triangular(t, b, lower=True, trans=1), t.T)
    a = _spd(70, 2)
    s = bl.solve(a, b, assume_a="pos", device="gpu", scheduler="sync")
    assert s.report["backward_error"] <= 70**0.5 * np.finfo(float).eps
    g = rng.standard_normal((70, 70))
    f = bl.lu(g, tile=32, device="gpu", scheduler="sync")
    lu_ref, piv_ref = sl.lu_factor(g)
    np.testing.assert_array_equal(f.report["pivots"], piv_ref)
    np.testing.assert_allclose(f[...], lu_ref, rtol=0, atol=1e-11)


def test_qr_and_square_solve_on_gpu(tmp_path):
    rng = np.random.default_rng(3)
    a = rng.standard_normal((90, 70))
    q, r = bl.qr(a, mode="reduced", tile=32, device="gpu", scheduler="sync")
    assert r.report["device"] == "gpu" and r.report["method"] == "tiled"
    # Householder QR: ||A - Q R|| <= c m n u ||A|| (Higham 2002, Thm. 19.4), c m n -> 4 max(m, n)
    assert np.linalg.norm(a - q[...] @ r[...]) <= 4 * 90 * np.finfo(float).eps * np.linalg.norm(a)
    # the tile QR asked for on a GPU job: host LAPACK kernels, the same bound
    q, r = bl.qr(a, mode="reduced", method="tiles", tile=32, device="gpu", scheduler="sync")
    assert r.report["method"] == "tiles"
    assert np.linalg.norm(a - q[...] @ r[...]) <= 4 * 90 * np.finfo(float).eps * np.linalg.norm(a)
    g = rng.standard_normal((70, 70))
    b = rng.standard_normal((70, 2))
    x = bl.solve(g, b, device="gpu", scheduler="sync", memory="256KiB")
    assert x.report["method"] == "lu" and x.report["backward_error"] <= 70**0.5 * np.finfo(float).eps
    np.testing.assert_allclose(x[...], sl.solve(g, b), rtol=1e-9)
