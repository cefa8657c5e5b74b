"""A complex stored sparse matrix is refused by every sparse route, never computed as its real part.

``from_sparse`` and ``convert`` store complex sparse matrices exactly, but the sparse routes compute
with real row blocks: ``svd`` returned the singular values of ``Re(A)`` with ``converged=True`` (7.74
expected, 5.59 returned), ``eigsh`` of a Hermitian matrix those of ``Re(H)``, ``solve`` a real ``x`` 148%
off and ``pca`` real means (found by a randomized search). Each now raises ``DTypeError`` naming the
matrix, and the fix it names (a dense complex store written row block by row block) gives NumPy's values.
"""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
import zarr

import blocklin as bl
from blocklin.errors import DTypeError
from blocklin.sparse import SparseMatrix


@pytest.fixture
def stored(tmp_path):
    a = (sp.random(60, 40, density=0.2, random_state=0) + 1j * sp.random(60, 40, density=0.2, random_state=1)).tocsr()
    h = sp.random(40, 40, density=0.2, random_state=3) + 1j * sp.random(40, 40, density=0.2, random_state=4)
    h = (h + h.conj().T).tocsr()
    return a, bl.from_sparse(a, tmp_path / "S.zarr"), bl.from_sparse(h, tmp_path / "H.zarr")


CALLS = {
    "svd": lambda s, h: bl.svd(s, 3, seed=0),
    "svd-lanczos": lambda s, h: bl.svd(s, 3, method="lanczos", seed=0),
    "svd-path": lambda s, h: bl.svd(str(s.path), 3, seed=0),
    "eigsh": lambda s, h: bl.eigsh(h, 3, which="LA", seed=0),
    "solve": lambda s, h: bl.solve(s, np.ones(60), lam=0.1),
    "pca": lambda s, h: bl.pca(s, 3, seed=0),
    "matmul": lambda s, h: bl.matmul(s, np.ones((40, 2))),
    "matmul-float64": lambda s, h: bl.matmul(s, np.ones((40, 2)), dtype="float64"),
    "gram": lambda s, h: bl.gram(s),
}


@pytest.mark.parametrize("call", sorted(CALLS))
def test_every_sparse_route_refuses_complex_data(stored, call, tmp_path):
    _, s, h = stored
    with pytest.raises(DTypeError, match=r"a: must be a real sparse matrix.*complex128"):
        CALLS[call](s, h)


def test_the_named_fix_gives_numpys_values(stored, tmp_path):
    a, s, _ = stored
    assert isinstance(s, SparseMatrix)
    dense = zarr.create_array(store=str(tmp_path / "D.zarr"), shape=s.shape, dtype=s.dtype, chunks=(16, 40))
    for r0 in range(0, s.shape[0], 16):  # row block by row block, as the message says
        r1 = min(s.shape[0], r0 + 16)
        dense[r0:r1] = s.rows(r0, r1).toarray()
    got = bl.svd(str(tmp_path / "D.zarr"), 3, method="full")
    want = np.linalg.svd(a.toarray(), compute_uv=False)[:3]
    # singular values to c n eps ||A||_2 (Weyl)
    assert np.all(np.abs(got[1] - want) <= 40 * 60 * np.finfo(float).eps * want[0])


@pytest.fixture
def real_stored(tmp_path):
    a = sp.random(60, 40, density=0.2, random_state=5, format="csr")
    return a, bl.from_sparse(a, tmp_path / "R.zarr")


PRODUCTS = {  # a real stored sparse matrix with a complex dense operand, or dtype=complex
    "S B": (lambda s, b: bl.matmul(s, b), "b: complex128"),
    "S B, dtype=float64": (lambda s, b: bl.matmul(s, b, dtype="float64"), "b: complex128"),
    "S^T C": (lambda s, b: bl.matmul(s, np.ones((60, 2)) * 1j, trans_a=True), "b: complex128"),
    "X S": (lambda s, b: bl.matmul(b.T, s, trans_b=True), "a: complex128"),
    "S B, dtype=complex128": (lambda s, b: bl.matmul(s, b.real, dtype="complex128"), "dtype=complex128"),
    "gram, dtype=complex128": (lambda s, b: bl.gram(s, dtype="complex128"), "dtype=complex128"),
}


@pytest.mark.parametrize("case", sorted(PRODUCTS))
def test_sparse_products_refuse_complex_dense_operands_with_a_fix_that_works(real_stored, case):
    """The dense routes' message had listed ``matmul`` among the operations that take complex data (true
    of dense stores only) and, for a real S with a complex B, suggested ``dtype='float64'``, which was
    then refused as dropping the imaginary parts."""
    _, s = real_stored
    call, got = PRODUCTS[case]
    b = np.arange(80.0).reshape(40, 2) * (1 + 2j)
    with pytest.raises(DTypeError, match=r"stored sparse matrix is computed in float32 or float64") as err:
        call(s, b)
    assert got in str(err.value)
    assert "take complex data" not in str(err.value).split("Fix:")[0]


def test_the_named_fix_for_a_complex_dense_operand_gives_numpys_values(real_stored):
    a, s = real_stored
    b = np.random.default_rng(0).standard_normal((40, 3)) + 1j * np.random.default_rng(1).standard_normal((40, 3))
    got = np.asarray(bl.matmul(s, b.real)) + 1j * np.asarray(bl.matmul(s, b.imag))
    # each real product to gamma_n |S| |B| entrywise; |Re B| and |Im B| <= |B|
    bound = 2 * 40 * np.finfo(float).eps * (abs(a) @ np.abs(b))
    assert np.all(np.abs(got - a @ b) <= bound)
