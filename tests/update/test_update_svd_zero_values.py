"""blocklin.update of an svd/pca result whose grown matrix has zero singular values among the ``k``: their
columns of ``U`` are an orthonormal completion (as blocklin.svd writes them), never zero columns; the update
recomputes there (the report says why). Checked against NumPy's SVD of the grown matrix: the nonzero
values within the Gram's rounding (Weyl), the zero ones below it, ``U^T U = I``, ``A^T u = 0`` for the
completed columns, the nonzero triplets' vectors within Davis-Kahan's ``||dG|| / gap``; and data that
becomes full rank after the append is updated (not recomputed) against the same references.
"""

from __future__ import annotations

import numpy as np
import pytest

import blocklin as bl
from support.tolerances import assert_orthonormal, assert_singular_values, eps

M, N, K, RANK, P = 600, 20, 4, 2, 60


def _rank_deficient(rng, rows, *, offset, exact=False):
    """Rows in a fixed RANK-dimensional subspace (values 30 and 10 apart), plus column means ``offset``;
    ``exact``: the subspace of the first RANK columns, the others exactly zero (the Gram's zero eigenvalues
    then exact zeros, where ``B V S^-1`` is ``0 / 0``)."""
    if exact:
        out = np.zeros((rows, N))
        out[:, :RANK] = rng.standard_normal((rows, RANK)) * np.array([30.0, 10.0]) + offset
        return out
    basis = np.linalg.qr(np.random.default_rng(7).standard_normal((N, N)))[0][:, :RANK]
    return (rng.standard_normal((rows, RANK)) * np.array([30.0, 10.0])) @ basis.T + offset


def _factored(x, center):
    return x - x.mean(axis=0) if center else x


def _check(res, x, *, center, rank):
    """``res`` against NumPy's SVD of what was factored; ``rank`` nonzero values."""
    U, s, Vt = res
    b = _factored(x, center)
    m = b.shape[0]
    u_ref, s_ref, vt_ref = np.linalg.svd(b, full_matrices=False)
    assert_singular_values(s[:rank], s_ref[:rank], n=m, dtype=np.float64, gram=True, s1=s_ref[0])
    assert (np.asarray(s[rank:]) == 0).all()  # reported as exact zeros, as svd does
    u = U.to_numpy()
    assert_orthonormal(u)  # never a zero column
    assert_orthonormal(np.asarray(Vt).T)
    # the completed columns are singular vectors of the zero values: B^T u = 0 within B's rounding
    assert np.linalg.norm(b.T @ u[:, rank:]) <= 8 * np.sqrt(m) * eps(np.float64) * np.linalg.norm(b)
    lam = s_ref[: rank + 1] ** 2
    gaps = np.array([min(lam[i - 1] - lam[i] if i else np.inf, lam[i] - lam[i + 1]) for i in range(rank)])
    dg = 8 * m * eps(np.float64) * lam[0]  # the Gram's rounding
    d = np.sign(np.einsum("ij,ij->j", np.asarray(Vt)[:rank].T, vt_ref[:rank].T))
    u_err = np.linalg.norm(u[:, :rank] - u_ref[:, :rank] * d, axis=0)
    assert (u_err <= dg / gaps * s_ref[0] / s_ref[:rank] + 4 * np.sqrt(m) * eps(np.float64)).all(), u_err


def _updated(folder, center, exact=False, **settings):
    """The rank-deficient matrix, factored updatable, grown by rows of the same subspace, updated."""
    rng = np.random.default_rng(1)
    a, new = _rank_deficient(rng, M, offset=3.0, exact=exact), _rank_deficient(rng, P, offset=3.0, exact=exact)
    folder.mkdir(exist_ok=True)
    path = folder / "A.zarr"
    bl.from_array(a, path, chunks=(128, N))
    make, kw = (bl.pca, {"n_components": K}) if center else (bl.svd, {"k": K})
    make(path, **kw, out=folder / "F.zarr", updatable=True, seed=7, **settings)
    bl.append(path, new)
    res = bl.update(folder / "F.zarr", **settings)
    return (res.svd if center else res), np.vstack([a, new])  # a stored PCA updates as a PCAResult: its factors


@pytest.mark.parametrize("exact", [False, True], ids=["subspace", "zero-columns"])
@pytest.mark.parametrize("center", [False, True], ids=["svd", "pca"])
@pytest.mark.parametrize("scheduler", ["sync", "threads", pytest.param("processes", marks=pytest.mark.slow)])
def test_rank_deficient_append_recomputes_with_the_completion(tmp_path, center, scheduler, exact):
    res, x = _updated(tmp_path / "run", center, exact, scheduler=scheduler)
    how = res.report["updated"]["how"]
    # uncentered, the column means are one more direction (but in the span of the nonzero columns)
    rank = RANK if center or exact else RANK + 1
    zeros = list(range(rank + 1, K + 1))
    assert how.startswith(f"recomputed: singular value(s) {zeros}") and "orthonormal completion" in how
    _check(res, x, center=center, rank=rank)
    ref, _ = _updated(tmp_path / "ref", center, exact, scheduler="sync")  # the seed's completion: the same bits
    assert np.array_equal(res.U.to_numpy(), ref.U.to_numpy()) and np.array_equal(res.s, ref.s)
    assert bl.update(tmp_path / "run" / "F.zarr").report["current"]


@pytest.mark.parametrize("center", [False, True], ids=["svd", "pca"])
def test_append_that_makes_the_matrix_full_rank_is_updated(tmp_path, center):
    rng = np.random.default_rng(2)
    a = _rank_deficient(rng, M, offset=3.0)
    new = _rank_deficient(rng, P, offset=3.0) + 4.0 * rng.standard_normal((P, N))  # every direction now
    path = tmp_path / "A.zarr"
    bl.from_array(a, path, chunks=(128, N))
    make, kw = (bl.pca, {"n_components": K}) if center else (bl.svd, {"k": K})
    old = make(path, **kw, out=tmp_path / "F.zarr", updatable=True)
    s_old = old.singular_values_ if center else old.s
    assert (np.asarray(s_old)[RANK + (not center):] == 0).all()  # the old result completed its zero values
    bl.append(path, new)
    res = bl.update(tmp_path / "F.zarr")
    assert res.report["updated"]["how"].startswith("updated") and res.report["converged"]
    res = res.svd if center else res  # a stored PCA updates as a PCAResult: its factors
    x = np.vstack([a, new])
    b = _factored(x, center)
    u_ref, s_ref, vt_ref = np.linalg.svd(b, full_matrices=False)
    m = b.shape[0]
    assert_singular_values(res.s, s_ref[:K], n=m, dtype=np.float64, gram=True, s1=s_ref[0])
    assert (np.asarray(res.s) > 0).all()
    u, s = res.U.to_numpy(), np.asarray(res.s, dtype=np.float64)
    # U = B V S^-1 from the updated Gram (its rounding dG = 8 m eps s_1^2 over s_i s_j off the identity), plus
    # what the rotated old rows lost (u_errors): orthonormal within that, never a zero column
    rounding = 8 * m * eps(np.float64) * s_ref[0] ** 2
    lost = float(max(res.report["u_errors"]))
    bound = np.sqrt(K) * (2 * m * eps(np.float64) + 2 * lost) + K * rounding / s[-1] ** 2
    assert np.linalg.norm(u.T @ u - np.eye(K)) <= bound
    # U S = B V: each column from the grown matrix's factors
    err = np.linalg.norm(u * s - b @ np.asarray(res.Vt).T, axis=0) / s
    allowed = rounding / s**2 + np.asarray(res.report["u_errors"]) + 4 * np.sqrt(m) * eps(np.float64)
    assert (err <= allowed).all(), (err, allowed)
