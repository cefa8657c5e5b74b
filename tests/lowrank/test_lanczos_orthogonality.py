"""Lanczos SVD factors stay orthonormal to working precision when one singular value dominates.

An uncentered matrix whose columns have mean 1e3 and spread 1 has ``s_1 / s_2`` near 6e3: on the normal
operator ``B^T B`` the first Krylov block's remainder has condition near ``(s_1 / s_2)^2 = 3e7``, and block
Gram-Schmidt twice followed by normalizing that block left ``V^T V - I`` at ``u cond`` (1e-9 to 1e-8) where the
method promises ``u`` (:func:`blocklin.linalg.lowrank.lanczos._keep_orthogonal`).
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import blocklin as bl


def _orth_loss(x):
    x = np.asarray(x, dtype=np.float64)
    return float(np.linalg.norm(x.T @ x - np.eye(x.shape[1]), 2))


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_lanczos_svd_factors_orthonormal_with_a_dominant_singular_value(dtype):
    rng = np.random.default_rng(0)
    a = (1e3 + rng.standard_normal((2000, 40))).astype(dtype)
    k = 5
    eps = float(np.finfo(dtype).eps)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # float32 may stop at its resolution floor: accuracy is checked below
        res = bl.svd(a, k, method="lanczos", seed=1)
    u, s, vt = np.asarray(res.U), np.asarray(res.s), np.asarray(res.Vt)
    # Orthonormal to a few rounding units per column pair: Gram-Schmidt twice with the normalized block
    # projected again keeps the basis at c u whatever s_1/s_2; the factors are then stored in ``dtype``
    # (rounding each entry: sqrt(k) u). Before the fix ||V^T V - I|| was 1.4e7 u in float64.
    bound = 64 * np.sqrt(k) * eps
    assert _orth_loss(vt.T) <= bound
    assert _orth_loss(u) <= bound
    # The reported residuals are honest: a triplet with B v = s u and ||B^T u - s v|| = r (u, v orthonormal to
    # u) has a singular value within r + c u s_1 of s (Weyl), and r matches the residual measured here in
    # float64 up to the rounding of B^T u (about sqrt(M) u ||B||).
    a64 = a.astype(np.float64)
    v64, u64 = vt.T.astype(np.float64), u.astype(np.float64)
    ref = np.linalg.svd(a64, compute_uv=False)[:k]
    rounding = 16 * np.sqrt(a.shape[0]) * eps * ref[0]
    reported = np.asarray(res.report["residuals"], dtype=np.float64)
    measured = np.linalg.norm(a64.T @ u64 - v64 * s, axis=0)
    assert np.all(measured <= reported + rounding)
    assert np.all(np.abs(s - ref) <= reported + rounding)
