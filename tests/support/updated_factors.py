"""The check of an updated svd/pca against NumPy's SVD of the grown matrix (the bounds of the
co-moments update, :mod:`blocklin.linalg.update.svd`), shared by the dense and the sparse update tests."""

from __future__ import annotations

import numpy as np

from support.tolerances import assert_singular_values, eps


def reference(x, center):
    x = x.astype(np.float64)
    if center:
        x = x - x.mean(axis=0)
    return np.linalg.svd(x, full_matrices=False)


def check_updated_factors(res, x, *, k, center, dtype, u_errors=None):
    """Singular values by Weyl on the Gram (the update's route); each right vector within Davis-Kahan's
    ``||dG|| / gap`` and each left one within the same through ``B dv / s`` plus what the report says the
    rotated old rows lost (``u_errors``). A stored PCA updates as a ``PCAResult``: its factors are ``.svd``."""
    U, s, Vt = res.svd if hasattr(res, "components_") else res
    u_ref, s_ref, vt_ref = reference(x, center)
    m, n = x.shape
    assert_singular_values(s, s_ref[:k], n=m, dtype=dtype, gram=True, s1=s_ref[0])  # stored in the data's dtype
    lam = s_ref ** 2
    gaps = np.array([min(lam[i - 1] - lam[i] if i else np.inf, lam[i] - lam[i + 1]) for i in range(k)])
    dg = 4 * m * eps(np.float64) * lam[0] + 4 * m * eps(dtype) * lam[0]  # the Gram's rounding, the data's
    V = np.asarray(Vt, dtype=np.float64).T
    d = np.sign(np.einsum("ij,ij->j", V, vt_ref[:k].T))
    v_err = np.linalg.norm(V - vt_ref[:k].T * d, axis=0)
    assert (v_err <= dg / gaps + 4 * np.sqrt(n) * eps(dtype)).all(), (v_err, dg / gaps)
    if U is not None:
        u = U.to_numpy().astype(np.float64)
        u_err = np.linalg.norm(u - u_ref[:, :k] * d, axis=0)
        allowed = dg / gaps * s_ref[0] / s_ref[:k] + 4 * np.sqrt(m) * eps(dtype)
        if u_errors is not None:
            allowed = allowed + np.asarray(u_errors)
        assert (u_err <= allowed).all(), (u_err, allowed)
