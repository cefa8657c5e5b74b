"""A stored ``Y`` far from orthogonal: CholeskyQR's first factor is applied once and written
(``orth._settle``), so its refinements and the long factor read the same bits.

Recomputing ``Y R_1^-1`` in each pass rounds differently where the strips differ in height (BLAS's
small-matrix kernels), by ``kappa(Y) u``, which the second step's factor does not correct: ``U`` of
``svd(method="full")`` at 1-4x its least budget was orthonormal only to 3e-10..5e-8 for ``kappa`` of 1e9
to 1e11, while the residuals reported 5e-15 (found by a randomized search). Checked with the bounds of
``support.tolerances``: both factors orthonormal to ``c n eps``, each triplet's actual residual
``||B^T u - s v||`` within ``c M eps s_1`` as the reported one is.
"""

from __future__ import annotations

import numpy as np
import pytest
from support.tolerances import assert_orthonormal, assert_singular_values, eps

import blocklin as bl
from blocklin.errors import BudgetError
from blocklin.linalg.blocks.orth import orthonormalize


def _graded(m: int, n: int, low: float, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    q1, _ = np.linalg.qr(rng.standard_normal((m, n)))
    q2, _ = np.linalg.qr(rng.standard_normal((n, n)))
    return (q1 * np.logspace(0, low, n)) @ q2.T


def _least(a: np.ndarray, **kw) -> int:
    with pytest.raises(BudgetError) as err:
        bl.svd(a, seed=0, memory="16KiB", scheduler="sync", **kw)
    return err.value.minimum


def _dense(x) -> np.ndarray:
    return x if isinstance(x, np.ndarray) else x.to_numpy()


@pytest.mark.parametrize("times", [2.0, 3.94])
@pytest.mark.parametrize("shape, low, seed", [((5000, 60), -9, 0), ((60, 5223), -11, 0)], ids=["tall", "wide"])
def test_whole_space_of_an_ill_conditioned_matrix_streamed(shape, low, seed, times):
    a = _graded(max(shape), min(shape), low, seed)
    if shape[0] < shape[1]:
        a = np.ascontiguousarray(a.T)
    res = bl.svd(a, seed=0, memory=int(_least(a) * times), scheduler="sync")
    assert not res.report["in_core"]
    assert res.report["orth"].get("settled"), "a Y of condition 1e9 has its first factor written"
    u, s, vt = _dense(res.U), np.asarray(res.s), _dense(res.Vt)
    assert_orthonormal(u)
    assert_orthonormal(vt.T)
    assert_singular_values(s, np.linalg.svd(a, compute_uv=False), n=max(shape))
    b, long, short = (a, u, vt.T) if shape[0] >= shape[1] else (a.T, vt.T, u)
    resid = np.linalg.norm(b.T @ long - short * s, axis=0)
    bound = 4 * max(shape) * eps(np.float64) * s[0]  # backward stable: eps ||A|| per triplet (LAPACK's xGESVD)
    assert resid.max() <= bound
    assert max(res.report["residuals"]) <= bound


def test_stored_block_orthonormalized_through_its_written_factor(tmp_path):
    """``orthonormalize`` of a stored ``Y`` of condition 1e10 (shifted CholeskyQR3, its first factor
    written): ``Q`` orthonormal to ``c n eps`` and ``Q R = Y`` to ``c M eps ||Y||``."""
    y = _graded(7000, 40, -10, 3)
    bl.from_array(y, tmp_path / "y.zarr", chunks=(333, 40))
    q, r = orthonormalize(tmp_path / "y.zarr", memory="700KiB", scheduler="sync")
    assert q.report["orth"].get("settled")
    qd = q.to_numpy()
    assert_orthonormal(qd)
    assert np.linalg.norm(qd @ r - y) <= 4 * 7000 * eps(np.float64) * np.linalg.norm(y)


def test_well_conditioned_block_is_not_written_again(tmp_path):
    """Below ``orth.SETTLE_CONDITION`` recomputing ``Y R_1^-1`` is within CholeskyQR2's own rounding: no
    extra write."""
    y = np.random.default_rng(0).standard_normal((7000, 40))
    bl.from_array(y, tmp_path / "y.zarr", chunks=(333, 40))
    q, r = orthonormalize(tmp_path / "y.zarr", memory="700KiB", scheduler="sync")
    assert "settled" not in q.report["orth"]
    assert_orthonormal(q.to_numpy())
