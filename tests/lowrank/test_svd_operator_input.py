"""``svd`` of a SciPy ``LinearOperator`` (``scipy.sparse.linalg.svds``' input; ported from SciPy's
``sparse/linalg/_eigen/tests/test_svds.py`` ``test_svd_linop``): block Lanczos (the default) or rsvd
through its ``matmat``/``rmatmat``, against LAPACK's SVD of the matrix behind it.

Bounds: the singular values of a Rayleigh-Ritz step on a converged subspace, within the
residual's square over the gap plus the products' rounding (:func:`assert_ritz_values`); the vectors
as residuals ``||A v - s u||`` and ``||A^T u - s v||``, which the method reports and bounds by ``tol``.
"""

from __future__ import annotations

import numpy as np
import pytest
from scipy.sparse.linalg import LinearOperator, aslinearoperator

import blocklin as bl
from blocklin.errors import ParameterError
from support.tolerances import assert_ritz_values, eps


def decaying(m: int, n: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    u, _ = np.linalg.qr(rng.standard_normal((m, min(m, n))))
    v, _ = np.linalg.qr(rng.standard_normal((n, min(m, n))))
    return (u * np.logspace(0, -4, min(m, n))) @ v.T


@pytest.mark.parametrize("wide", [False, True], ids=["tall", "wide"])
@pytest.mark.parametrize("kw", [{}, {"method": "rsvd", "power_iters": 6}], ids=["lanczos", "rsvd"])
def test_linear_operator_as_svds(wide, kw):
    a = decaying(1500, 60, seed=1)
    a = a.T.copy() if wide else a
    calls = {"matmat": 0}

    def matmat(x):
        calls["matmat"] += 1
        return a @ x

    op = LinearOperator(a.shape, matvec=lambda x: a @ x, rmatvec=lambda y: a.T @ y, matmat=matmat,
                        rmatmat=lambda y: a.T @ y, dtype=np.float64)
    U, s, Vt = res = bl.svd(op, 5, seed=0, **kw)
    assert res.report["method"] == ("rsvd" if kw else "lanczos") and res.report["passes"] >= 1
    assert calls["matmat"] >= 1 and isinstance(U if not wide else Vt, bl.Matrix)
    full = np.linalg.svd(a, compute_uv=False)
    tol = res.report["tol"] or 10 * np.sqrt(eps(np.float64))
    residuals = np.array(res.report["residuals"])
    assert_ritz_values(s, full[:5], spectrum=full, residuals=residuals, n=max(a.shape), norm=full[0])
    u = U.to_numpy() if isinstance(U, bl.Matrix) else U
    vt = Vt.to_numpy() if isinstance(Vt, bl.Matrix) else Vt
    # B v = s u by construction for the tall orientation B (A, or A^T when wide), to the products' rounding;
    # B^T u - s v is the reported residual
    built = np.linalg.norm(a @ vt.T - u * s, axis=0)
    other = np.linalg.norm(a.T @ u - vt.T * s, axis=0)
    if wide:
        built, other = other, built
    rounding = 8 * max(a.shape) * eps(np.float64) * full[0]
    assert built.max() <= rounding and np.all(other <= residuals + rounding)
    if not kw:  # block Lanczos runs to its tolerance (rsvd's fixed power iterations have none)
        assert res.report["converged"] and np.all(residuals <= tol * np.maximum(s, np.sqrt(eps(np.float64)) * s[0])
                                                  * (1 + 1e-9))


def test_operator_results_and_refusals():
    a = decaying(800, 40, seed=2)
    s = bl.svd(aslinearoperator(a), 3, return_singular_vectors=False, seed=0)
    assert isinstance(s, np.ndarray) and s.shape == (3,)
    for bad in ({"center": True}, {"which": "SM"}, {"v0": np.ones(40)}):
        with pytest.raises(ParameterError, match="a LinearOperator takes rsvd or block Lanczos"):
            bl.svd(aslinearoperator(a), 3, **bad)
    with pytest.raises(ParameterError, match="for a LinearOperator"):
        bl.svd(aslinearoperator(a), 3, method="gram")
    with pytest.raises(ParameterError, match="k: must be an integer"):
        bl.svd(aslinearoperator(a))
