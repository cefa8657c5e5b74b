"""blocklin.update of a single-pass sketch runs at the budget its refusal names: every pass of the update
(the appended rows' sketch pass and the passes over the grown ``Y``) is planned before the first, and
the least budget at which all of them plan is named (the appended rows' pass alone had been named, which
the passes over ``Y`` then refused, 1.2 to 1.7 times short). Checked against NumPy's SVD of the grown matrix.
"""

from __future__ import annotations

import shutil

import numpy as np
import pytest

import blocklin as bl
from blocklin.errors import BudgetError
from support.tolerances import assert_orthonormal, assert_singular_values, eps

M, P, N = 3000, 500, 100


def _data(k: int, dtype: str) -> np.ndarray:
    """Rank ``k + 5`` (values 1 to 1e-2), below ``k + oversample``: the sketch holds the range exactly
    (Tropp et al. 2019), so what is left is rounding, and its ``Y`` takes the TSQR fallback."""
    rng = np.random.default_rng(k)
    r = k + 5
    x = (rng.standard_normal((M + P, r)) * np.logspace(0, -2, r)) @ np.linalg.qr(rng.standard_normal((N, r)))[0].T
    return x.astype(dtype)


@pytest.mark.parametrize("k,dtype", [(55, "float32"), (55, "float64"), (5, "float64")])
def test_sketch_update_runs_at_the_named_minimum(tmp_path, k, dtype):
    x = _data(k, dtype)
    path, out = tmp_path / "A.zarr", tmp_path / "F.zarr"
    bl.from_array(x[:M], path, chunks=(256, N))
    bl.svd(path, k, method="sketch", updatable=True, out=out, seed=0)
    bl.append(path, x[M:])
    with pytest.raises(BudgetError) as err:
        bl.update(out, memory=1 << 10)
    need = err.value.minimum
    # below it (a copy of the result, updated apart): refused, naming a minimum that runs too (the search
    # from there may stop lower: it grows the budget by steps of at least a quarter), or run
    shutil.copytree(out, tmp_path / "F2.zarr")
    try:
        bl.update(tmp_path / "F2.zarr", memory=int(0.8 * need))
    except BudgetError as below:
        assert below.minimum > int(0.8 * need)
        assert bl.update(tmp_path / "F2.zarr", memory=below.minimum).report["updated"]["rows_read"] == P
    res = bl.update(out, memory=need)  # never refused at the minimum it named
    assert res.report["updated"]["rows_read"] == P

    a = x.astype(np.float64)
    s_ref = np.linalg.svd(a, compute_uv=False)
    # the streamed products' backward error, of order m eps ||A||_2 (m the rows summed); the exact-rank
    # sketch adds the rounding of its small solves (measured below 0.1 m eps ||A||); Weyl for the values
    m = M + P
    bound = 4 * m * eps(dtype) * s_ref[0]
    assert_singular_values(res.s, s_ref[:k], n=m, dtype=dtype)
    U, V = res.U.to_numpy().astype(np.float64), np.asarray(res.Vt, dtype=np.float64).T
    assert_orthonormal(U, dtype=dtype)
    assert_orthonormal(V, dtype=dtype, n=m)
    assert np.linalg.norm(a @ V - U * res.s, axis=0).max() <= bound
    assert np.linalg.norm(a.T @ U - V * res.s, axis=0).max() <= bound
