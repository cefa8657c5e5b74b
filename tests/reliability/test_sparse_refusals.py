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


@pytest.mark.parametrize("call", [lambda s: bl.norm(s), lambda s: bl.qr(s), lambda s: bl.inv(s.rows(0, 20)),
                                  lambda s: bl.matmul(np.ones((4, 30)), np.ones((30, 3)), c=s)],
                         ids=["norm", "qr", "inv-scipy", "matmul-c"])
def test_dense_operations_name_the_sparse_routes(stored, call):
    with pytest.raises(ParameterError, match=r"(svd, pca, eigsh, solve \(LSQR\), gram and matmul with one dense "
                                             r"operand)"):
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
