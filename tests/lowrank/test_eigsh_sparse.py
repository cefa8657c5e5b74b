"""blocklin.eigsh of a stored sparse symmetric matrix: block Lanczos on the row-block products."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

import blocklin as bl
from blocklin.errors import NotSymmetricError, ParameterError
from support.tolerances import assert_ritz_values, eps


def _symmetric(n=400, seed=0):
    """A sparse symmetric matrix with five separated eigenvalues at each end of its spectrum."""
    rng = np.random.default_rng(seed)
    q = np.linalg.qr(rng.standard_normal((n, n)))[0]
    d = np.r_[[50.0, 40.0, 30.0, 20.0, 10.0], rng.uniform(-1, 1, n - 10), [-12.0, -24.0, -36.0, -48.0, -60.0]]
    dense = (q * d) @ q.T
    dense[np.abs(dense) < 0.02] = 0.0  # sparse, still symmetric
    return (dense + dense.T) / 2


@pytest.mark.parametrize("which", ["LA", "SA"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_sparse_eigsh_matches_lapack(tmp_path, which, dtype):
    dense = _symmetric().astype(dtype)
    s = bl.from_sparse(sp.csr_matrix(dense), tmp_path / "S.zarr")
    w, V = res = bl.eigsh(str(s.path), 5, which=which, order="descending", seed=1)
    full = np.linalg.eigvalsh(dense.astype(np.float64))
    ref = full[::-1][:5] if which == "LA" else full[:5][::-1]
    assert res.report["converged"] and w.dtype == dtype and V.shape == (400, 5)
    norm = float(np.abs(full).max())
    resid = np.asarray(res.report["residuals"])
    assert_ritz_values(w, ref, spectrum=full, residuals=resid, n=400, norm=norm, dtype=dtype)
    # each pair's residual as reported (plus the rounding of forming it again in the data's dtype)
    got = np.linalg.norm(dense.astype(np.float64) @ V.astype(np.float64) - V.astype(np.float64) * w, axis=0)
    assert (got <= resid + 4 * 400 * eps(dtype) * norm).all()


def test_sparse_eigsh_refusals(tmp_path):
    s = bl.from_sparse(sp.csr_matrix(_symmetric(60)), tmp_path / "S.zarr")
    with pytest.raises(ParameterError, match="resume: is not available for a sparse matrix"):
        bl.eigsh(s, 2, out=tmp_path / "E.zarr", resume=True, order="ascending")
    with pytest.raises(ParameterError, match="center: is not available"):
        bl.eigsh(s, 2, center=True, order="ascending")
    a = bl.from_sparse(sp.random(60, 60, density=0.2, random_state=1, format="csr"), tmp_path / "A.zarr")
    with pytest.raises(NotSymmetricError, match="must be symmetric"):
        bl.eigsh(a, 2, order="ascending")
    r = bl.from_sparse(sp.random(60, 40, density=0.2, random_state=2, format="csr"), tmp_path / "R.zarr")
    with pytest.raises(ParameterError, match="must be square and symmetric"):
        bl.eigsh(r, 2, order="ascending")


@pytest.mark.parametrize("n", [0, 1, 2])
@pytest.mark.parametrize("stored", ["dense", "sparse"])
def test_eigsh_k_refusal_speaks_of_eigenpairs(tmp_path, n, stored, capsys):
    # eigs of a tiny matrix is refused in its own terms: k against the order n, and eigh for the eigenvalues
    # (it had named min(m, n), singular values and numpy.linalg.svd, the SVD's refusal)
    from blocklin.cli.main import main

    a = np.eye(n)
    if stored == "dense":
        path = bl.from_array(a, tmp_path / "a.zarr").path
    else:
        sp.save_npz(tmp_path / "a.npz", sp.csr_matrix(a))
        path = str(tmp_path / "a.zarr")
        if n == 0:
            pytest.skip("an empty coordinate matrix has no sparse group to store")
        assert main(["convert", str(tmp_path / "a.npz"), path, "--sparse", "--no-progress"]) == 0
        capsys.readouterr()
    k = max(n, 1)
    with pytest.raises(ParameterError) as info:
        bl.eigsh(path, k=k)
    msg = str(info.value)
    assert f"1 <= k < n = {n}" in msg and "singular" not in msg and "min(m, n)" not in msg, msg
    assert ("numpy.linalg.eigh" if n < 2 else "pass 1 <= k <= 1") in msg, msg
    assert main(["eigs", path, "-k", str(k), "-o", str(tmp_path / "e.zarr"), "--no-progress"]) == 1
    assert f"1 <= k < n = {n}" in capsys.readouterr().err
