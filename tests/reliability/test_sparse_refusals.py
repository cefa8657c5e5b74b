"""Refusals that name what a sparse input asked for (found by a randomized search, 2026-12-06): a stored
sparse matrix given to an operation that reads dense blocks, an in-memory SciPy sparse matrix, lstsq and
cond of a sparse matrix (refused as "k: must be an integer; got None. Fix: pass k=10", a parameter the
caller never passed), and a k or n_components that no value can satisfy ("Fix: pass 1 <= k <= 0")."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp

import blocklin as bl
from blocklin.errors import ParameterError


@pytest.fixture
def stored(tmp_path):
    x = sp.random(30, 20, density=0.2, random_state=0, format="csr")
    return x, bl.from_sparse(x, tmp_path / "S.zarr")


@pytest.mark.parametrize("call", [lambda s: bl.qr(s), lambda s: bl.inv(s.rows(0, 20)),
                                  lambda s: bl.matmul(np.ones((4, 30)), np.ones((30, 3)), c=s)],
                         ids=["qr", "inv-scipy", "matmul-c"])
def test_dense_operations_name_the_sparse_routes(stored, call):
    """(``norm`` takes a stored sparse matrix: test_norms_and_numpy_protocol's sparse norms.)"""
    with pytest.raises(ParameterError, match=r"(svd, pca, eigsh, solve \(LSQR\), gram, norm and matmul with one "
                                             r"dense operand)"):
        call(stored[1])


def test_an_in_memory_scipy_matrix_names_from_sparse(stored):
    with pytest.raises(ParameterError, match=r"^a: .*SciPy sparse.*csr_matrix \(30, 20\).*blocklin\.from_sparse"):
        bl.svd(stored[0], 3)


@pytest.mark.parametrize("call", [lambda s: bl.lstsq(s, np.ones(30)), lambda s: bl.cond(s)], ids=["lstsq", "cond"])
def test_full_spectrum_calls_name_the_truncated_svd(stored, call):
    with pytest.raises(ParameterError, match=r"^k: .*stored sparse matrix.*k=None, as blocklin\.lstsq and "
                                             r"blocklin\.cond ask for.*blocklin\.solve\(S, b\)"):
        call(stored[1])


def test_a_single_column_has_no_k_to_pass(tmp_path):
    s = bl.from_sparse(sp.random(19, 1, density=0.5, random_state=0, format="csr"), tmp_path / "C.zarr")
    with pytest.raises(ParameterError, match="no truncated decomposition") as err:
        bl.svd(s, 1)
    assert "1 <= k <= 0" not in str(err.value)
    with pytest.raises(ParameterError, match="at most one component") as err:
        bl.pca(s, 1)
    assert "n_components=0" not in str(err.value)


def test_a_k_too_large_names_the_full_decomposition_of_its_operation(tmp_path):
    """svd's refusal of ``k = min(m, n)`` on a stored sparse matrix had named ``scipy.linalg.eigh`` (the
    eigensolver) as the fix for its full decomposition (found by a randomized search)."""
    s = bl.from_sparse(sp.random(3, 17, density=0.5, random_state=0, format="csr"), tmp_path / "W.zarr")
    with pytest.raises(ParameterError, match=r"^k: must satisfy 1 <= k < min\(m, n\) = 3.*numpy\.linalg\.svd") as err:
        bl.svd(s, 3, method="rsvd", seed=0)
    assert "eigh" not in str(err.value)
    q = bl.from_sparse(sp.identity(4, format="csr"), tmp_path / "I.zarr")
    with pytest.raises(ParameterError, match=r"^k: .*scipy\.linalg\.eigh for a full decomposition"):
        bl.eigsh(q, 4, seed=0)


@pytest.mark.parametrize("call", [lambda s, q: bl.svd(s, 3, seed=0), lambda s, q: bl.svd(s, 3, method="rsvd", seed=0),
                                  lambda s, q: bl.svd(s, 3, method="sketch", seed=0),
                                  lambda s, q: bl.svd(s, 3, seed=0, check_finite=False),
                                  lambda s, q: bl.pca(s, 3, seed=0), lambda s, q: bl.eigsh(q, 3, seed=0),
                                  lambda s, q: bl.eigsh(q, 3, seed=0, laplacian="combinatorial")],
                         ids=["lanczos", "rsvd", "sketch", "unchecked", "pca", "eigsh", "laplacian"])
@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_a_stored_nan_or_inf_is_a_nonfinite_error_naming_its_place(tmp_path, call, bad):
    """Refused as a ``ConvergenceError`` (a ``RuntimeError``) about the first product before, where every dense
    route and sparse matmul and solve raise ``NonFiniteError`` (a ``ValueError``); now it names the entry."""
    x = sp.random(40, 30, density=0.2, random_state=0, format="csr")
    x.data[17] = bad
    q = (x[:30] + x[:30].T).tocsr()  # the bad entry and its mirror image, off the diagonal
    row = int(np.searchsorted(x.indptr, 17, side="right")) - 1
    assert row != x.indices[17]
    s, g = bl.from_sparse(x, tmp_path / "S.zarr"), bl.from_sparse(q, tmp_path / "Q.zarr")
    with pytest.raises(bl.errors.NonFiniteError, match=r"^a: must hold finite values.*got (nan|inf) at \(\d+, \d+\)"):
        call(s, g)
    with pytest.raises(bl.errors.NonFiniteError, match=rf"at \({row}, {x.indices[17]}\)"):
        bl.svd(s, 3, seed=0)
