"""Region SYRK, TRSM and POTRF tile operations (runtime/blockops.py) against NumPy/SciPy."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.linalg as sl

from blocklin.errors import NotPositiveDefiniteError
from blocklin.linalg.factor.cholesky_tiles import potrf
from blocklin.runtime.blockops import BlockOps, Region
from blocklin.runtime.job import Job
from blocklin.storage.zarr_store import create_array, open_zarr

DTYPES = [np.float32, np.float64]


def _store(path, x, chunk):
    arr = create_array(path, shape=x.shape, dtype=x.dtype, chunks=(chunk, chunk))
    arr[...] = x
    return str(path)


def _tol(dtype, n):
    # forward-error scale of a length-n dot product / triangular solve: a small multiple of n eps
    return 4 * n * np.finfo(dtype).eps


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n,k,chunk", [(5, 3, 8), (37, 11, 8), (64, 64, 16), (29, 40, 8)])
@pytest.mark.parametrize("full", [False, True])
def test_syrk_matches_numpy(tmp_path, dtype, n, k, chunk, full):
    rng = np.random.default_rng(n + k)
    a = rng.standard_normal((n, k)).astype(dtype)
    c = rng.standard_normal((n, n))
    c = (c + c.T).astype(dtype)  # SYRK updates a symmetric C
    a_path, c_path = _store(tmp_path / "a.zarr", a, chunk), _store(tmp_path / "c.zarr", c, chunk)
    out = _store(tmp_path / "o.zarr", np.zeros((n, n), dtype), chunk)
    with Job("test", scheduler="sync", memory="64MiB") as job:
        BlockOps(job, chunk).syrk(Region.of(out, (n, n)), Region.of(a_path, (n, k)), dtype=dtype, alpha=-2.0,
                                  beta=0.5, c=Region.of(c_path, (n, n)), full=full)
    got = open_zarr(out)[...]
    ref = 0.5 * c.astype(np.float64) - 2.0 * a.astype(np.float64) @ a.T.astype(np.float64)
    scale = np.abs(c).max() + 2 * (np.abs(a) @ np.abs(a).T).max()
    low = np.tril_indices(n)
    assert np.abs(got[low] - ref[low]).max() <= _tol(dtype, k) * scale
    if full:
        assert np.abs(got - ref).max() <= _tol(dtype, k) * scale
    else:
        ti, tj = np.indices((n, n)) // chunk
        assert not got[tj > ti].any()  # tiles above the diagonal untouched (diagonal tiles hold both triangles)
        np.testing.assert_array_equal(got[ti == tj], got.T[ti == tj])  # ... symmetric ones


def test_syrk_transposed_view_is_gram(tmp_path):
    rng = np.random.default_rng(3)
    a = rng.standard_normal((23, 13))
    a_path = _store(tmp_path / "a.zarr", a, 8)
    out = _store(tmp_path / "o.zarr", np.zeros((13, 13)), 8)
    with Job("test", scheduler="sync") as job:
        BlockOps(job, 8).syrk(Region.of(out, (13, 13)), Region.of(a_path, a.shape).T, dtype=np.float64, full=True)
    np.testing.assert_allclose(open_zarr(out)[...], a.T @ a, rtol=0, atol=_tol(np.float64, 23) * 23 * 4)


def _triangular(rng, n, dtype, lower):
    t = rng.standard_normal((n, n)) / np.sqrt(n) + 2 * np.eye(n)  # well conditioned
    return (np.tril(t) if lower else np.triu(t)).astype(dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("side", ["left", "right"])
@pytest.mark.parametrize("lower", [True, False])
@pytest.mark.parametrize("trans", [False, True])
@pytest.mark.parametrize("n,k,chunk", [(1, 1, 8), (31, 5, 8), (40, 17, 16)])
def test_trsm_matches_scipy(tmp_path, dtype, side, lower, trans, n, k, chunk):
    rng = np.random.default_rng(n * 7 + k)
    t = _triangular(rng, n, dtype, lower)
    # the unused triangle holds garbage: it must never be read
    t_stored = t + (np.triu(np.ones((n, n)), 1) if lower else np.tril(np.ones((n, n)), -1)).astype(dtype) * 1e3
    b = rng.standard_normal((n, k) if side == "left" else (k, n)).astype(dtype)
    t_path, b_path = _store(tmp_path / "t.zarr", t_stored, chunk), _store(tmp_path / "b.zarr", b, chunk)
    out = _store(tmp_path / "x.zarr", np.zeros(b.shape, dtype), chunk)
    with Job("test", scheduler="sync") as job:
        BlockOps(job, chunk).trsm(Region.of(t_path, (n, n)), Region.of(b_path, b.shape), Region.of(out, b.shape),
                                  lower=lower, trans=trans, side=side, alpha=1.5, dtype=dtype)
    x = open_zarr(out)[...].astype(np.float64)
    op = t.T.astype(np.float64) if trans else t.astype(np.float64)
    # backward error of a triangular solve: |op(T) x - alpha b| <= c n eps |op(T)| |x| (Higham Thm 8.5)
    resid = op @ x - 1.5 * b if side == "left" else x @ op - 1.5 * b
    bound = (np.abs(op) @ np.abs(x)) if side == "left" else (np.abs(x) @ np.abs(op))
    assert np.all(np.abs(resid) <= _tol(dtype, n) * bound + np.finfo(dtype).tiny)


@pytest.mark.parametrize("dtype", DTYPES)
def test_potrf_block(tmp_path, dtype):
    rng = np.random.default_rng(5)
    n = 24
    g = rng.standard_normal((n, n))
    a = np.zeros((40, 40))
    a[8:32, 8:32] = g @ g.T + n * np.eye(n)
    a = a.astype(dtype)
    a_path = _store(tmp_path / "a.zarr", a, 8)
    out = _store(tmp_path / "l.zarr", np.zeros((40, 40), dtype), 8)
    with Job("test", scheduler="sync") as job:
        potrf(BlockOps(job, 8), Region.of(a_path, (n, n), (8, 8)), Region.of(out, (n, n), (8, 8)), dtype=dtype)
    got = open_zarr(out)[...]
    ref = sl.cholesky(a[8:32, 8:32].astype(np.float64), lower=True)
    assert np.abs(got[8:32, 8:32] - ref).max() <= _tol(dtype, n) * np.abs(ref).max() * 4
    assert not got[:8].any() and not got[32:].any()


def test_potrf_not_positive_definite_names_pivot(tmp_path):
    a = np.eye(16)
    a[5, 5] = -1.0
    a_path = _store(tmp_path / "a.zarr", a, 8)
    out = _store(tmp_path / "l.zarr", np.zeros((16, 16)), 8)
    with Job("test", scheduler="sync") as job, pytest.raises(NotPositiveDefiniteError, match="row/column 5") as e:
        potrf(BlockOps(job, 8), Region.of(a_path, (16, 16)), Region.of(out, (16, 16)), dtype=np.float64)
    assert e.value.pivot == 5
    assert "lam" in str(e.value) and "assume_a='gen'" in str(e.value)
