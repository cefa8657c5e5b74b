"""Inputs users bring from NumPy, Dask and scikit-learn (issue 28's bugs found on the way): Dask arrays
with unknown chunk sizes are staged, arrays that hold no numbers are refused by name, and a float32
PCA projects to float32 as scikit-learn's does."""

from __future__ import annotations

import numpy as np
import pytest

import blocklin as bl
from blocklin.errors import DTypeError

da = pytest.importorskip("dask.array")


def _masked(x):
    """A Dask array whose row chunks are unknown (NaN) until computed: a boolean mask's result."""
    d = da.from_array(x, chunks=(64, x.shape[1]))
    return d[d[:, 0] > -1e9]


def test_dask_arrays_with_unknown_chunk_sizes_are_staged(tmp_path):
    rng = np.random.default_rng(2)
    x = rng.standard_normal((300, 24))
    b = rng.standard_normal((24, 5))
    d = _masked(x)
    assert any(np.isnan(c) for c in d.chunks[0])
    # a product: C = X B, one rounding per element of k = 24 terms (norm-wise bound, float64)
    c = bl.matmul(d, b, tmp_path / "c.zarr", memory="64KiB").to_numpy()
    assert np.linalg.norm(c - x @ b) <= 24 * np.finfo(np.float64).eps * np.linalg.norm(x) * np.linalg.norm(b) * 4
    s = bl.svd(_masked(x), 3, memory="128KiB", seed=0).s
    ref = np.linalg.svd(x, compute_uv=False)[:3]
    # singular values are perfectly conditioned: |s - s_ref| <= ||E||_2, with ||E|| a few eps ||X||
    assert np.max(np.abs(s - ref)) <= 1e3 * np.finfo(np.float64).eps * ref[0]


@pytest.mark.parametrize("bad", [
    np.array([[1, 2], [3, 4]], dtype=object),
    np.array([["1", "2"], ["3", "4"]]),
    np.array([["2026-01-01", "2026-01-02"]] * 2, dtype="datetime64[D]"),
])
@pytest.mark.parametrize("wrap", ["numpy", "dask"])
def test_arrays_that_hold_no_numbers_are_refused_by_name(bad, wrap):
    x = da.from_array(bad, chunks=1) if wrap == "dask" else bad
    with pytest.raises(DTypeError, match=r"a: must hold numbers .*got dtype .*Fix: convert it first"):
        bl.svd(x, 1)
    with pytest.raises(DTypeError, match=r"b: must hold numbers"):
        bl.matmul(np.ones((2, 2)), x)


def test_pca_transform_keeps_float32_as_scikit_learn_does():
    x = np.random.default_rng(3).standard_normal((200, 12)).astype(np.float32)
    p = bl.pca(x, 3)
    assert p.components_.dtype == np.float32
    t32, t64 = p.transform(x), p.transform(x.astype(np.float64))
    assert t32.dtype == np.float32 and t64.dtype == np.float64 and p.transform(x.astype(np.int64)).dtype == np.float64
    # the same float64 projection, rounded once to float32
    np.testing.assert_array_equal(t32, t64.astype(np.float32))
