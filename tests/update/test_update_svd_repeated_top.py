"""blocklin.update of an updatable svd whose top singular value is repeated (before and after the append),
for ``k`` below, at and above the number of copies: the top ``k`` singular subspace is then not unique,
so the result is checked by what defines it: the values against NumPy's SVD of the stacked matrix,
each triplet's residuals ``||A v - s u||`` and ``||A^H u - s v||``, and orthonormal factors. Real and
complex, in memory and at the least budget (streamed); none may raise (a ``k = 1`` update of such a
matrix had been reported to end in a ZeroDivisionError writing a long factor of 0 columns).
"""

from __future__ import annotations

import numpy as np
import pytest

import blocklin as bl
from blocklin.linalg.update.bands import write_affine
from blocklin.runtime.job import Job
from support.conformance import run
from support.tolerances import assert_singular_values, eps

M, P, N = 400, 100, 12


def _block(rng, rows, values, basis, dtype):
    """``Q diag(values) basis^H`` with ``Q`` orthonormal (rows x N): its Gram is ``basis diag(values^2) basis^H``."""
    cplx = np.dtype(dtype).kind == "c"
    g = rng.standard_normal((rows, N)) + (1j * rng.standard_normal((rows, N)) if cplx else 0)
    return ((np.linalg.qr(g)[0] * values) @ basis.conj().T).astype(dtype)


def _matrix(copies, dtype):
    """Old rows and appended rows, each with the top value 2 repeated ``copies`` times (the rest 1 to 0.1)
    on the same right singular vectors: the stacked matrix repeats it too (values 2 sqrt(2) ...)."""
    rng = np.random.default_rng(copies)
    cplx = np.dtype(dtype).kind == "c"
    basis = np.linalg.qr(rng.standard_normal((N, N)) + (1j * rng.standard_normal((N, N)) if cplx else 0))[0]
    values = np.linspace(1.0, 0.1, N)
    values[:copies] = 2.0
    return _block(rng, M, values, basis, dtype), _block(rng, P, values, basis, dtype)


def _dense(x) -> np.ndarray:
    return np.asarray(x.to_numpy() if hasattr(x, "to_numpy") else x)


@pytest.mark.parametrize("memory", [None, "least"], ids=["in-memory", "streamed"])
@pytest.mark.parametrize("dtype", ["float64", "complex128"])
@pytest.mark.parametrize("copies", [2, 3, 4])
@pytest.mark.parametrize("k", [1, 2, 3])
def test_update_with_a_repeated_top_value(tmp_path, k, copies, dtype, memory):
    old, new = _matrix(copies, dtype)
    path, out = tmp_path / "A.zarr", tmp_path / "F.zarr"
    bl.from_array(old, path, chunks=(64, N))
    run(lambda mem: bl.svd(path, k, out=out, updatable=True, overwrite=True, memory=mem), memory)
    bl.append(path, new)
    res = run(lambda mem: bl.update(out, memory=mem), memory)
    assert res.report["updated"]["rows"] == M + P

    a = np.vstack([old, new]).astype(np.complex128 if dtype == "complex128" else np.float64)
    m = a.shape[0]
    s_ref = np.linalg.svd(a, compute_uv=False)
    s = np.asarray(res.s, dtype=np.float64)
    U, V = _dense(res.U), _dense(res.Vt).conj().T
    assert U.shape == (m, k) and V.shape == (N, k) and s.shape == (k,)
    # The update is the Gram route: V and s from the eigenpairs of the updated Gram, whose rounding is
    # ||dG|| <= gamma_m ||A||_F^2 ~ m eps N s_1^2 (sums of m products; Higham 3.5); Weyl moves each s_i^2
    # by ||dG||, so s_i by ||dG|| / (s_i + s_ref_i) (assert_singular_values' gram bound).
    assert_singular_values(s, s_ref[:k], n=m * N, dtype=dtype, gram=True, s1=s_ref[0])
    dg = 4 * m * N * eps(dtype) * s_ref[0] ** 2
    # u = B v / s from the rows: ||A v - s u|| is the rounding of that product, m eps ||A|| per column,
    # plus what the rotated old rows' scores carry (u_errors, relative: times s) where they were rotated
    u_err = np.asarray(res.report["u_errors"]) if res.report["updated"]["scores"] == "rotated" else np.zeros(k)
    assert (np.linalg.norm(a @ V - U * s, axis=0) <= 4 * m * eps(dtype) * s_ref[0] + s * u_err).all()
    # ||A^H u - s v|| = ||(A^H A - s^2) v|| / s: the Gram's eigen-residual and rounding, dg / s
    assert (np.linalg.norm(a.conj().T @ U - V * s, axis=0) <= dg / s + s_ref[0] * u_err).all()
    # V orthonormal to LAPACK's eigh (N eps); U^H U = S^-1 V^H (A^H A) V S^-1 = I + S^-1 V^H dG V S^-1
    assert np.linalg.norm(V.conj().T @ V - np.eye(k)) <= 4 * N * eps(dtype) * np.sqrt(k)
    assert np.linalg.norm(U.conj().T @ U - np.eye(k)) <= 2 * dg / s[-1] ** 2 + 2 * np.sqrt(k) * u_err.max()


def test_long_factor_of_no_columns_is_written_not_divided_by(tmp_path):
    """write_affine with maps of 0 columns (no triplet to write) makes an m x 0 factor; it had divided
    the budget by the bytes of a row of the factor, 0 there (ZeroDivisionError)."""
    a = np.ones((10, 3))
    bl.from_array(a, tmp_path / "A.zarr", chunks=(5, 3))
    bl.from_array(np.ones((6, 1)), tmp_path / "U0.zarr", chunks=(3, 1))
    with Job("update-svd", memory="1MiB") as job:
        write_affine(job, str(tmp_path / "U.zarr"), str(tmp_path / "U0.zarr"), str(tmp_path / "A.zarr"), m0=6, m1=10,
                     old_map=(np.zeros((1, 0)), np.zeros(0)), new_map=(np.zeros((3, 0)), np.zeros(0)),
                     dtype=np.float64, old_chunk=3)
    assert bl.open(tmp_path / "U.zarr").shape == (10, 0)
