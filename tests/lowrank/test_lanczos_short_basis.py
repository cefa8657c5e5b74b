"""A step limit at which the block Lanczos basis cannot reach ``k`` vectors is refused by name; so is a ``k``
that is not an integer, with an example the matrix takes.

``max_passes`` steps of a block of ``b`` build at most ``max_passes * b`` basis vectors, so at most that many
Ritz pairs. Below ``k`` the solver had returned the Ritz pairs it had: an ``eigsh`` result of fewer than
``k`` pairs (``V`` of 60 columns for ``k = 70``), out of core or from a stored sparse matrix, under a
warning that named a repeated eigenvalue. Refused before the first pass, naming ``max_passes`` and
``block_size``; a limit that lets the basis reach ``k`` still returns ``k`` pairs. Exact comparisons only
(shapes and the refusal): no tolerance is involved.
"""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse

import blocklin as bl
from blocklin.errors import ParameterError

N = 90


def _matrix() -> np.ndarray:
    z = np.random.default_rng(3).standard_normal((N, N))
    return (z + z.T) / 2


def test_out_of_core_eigsh_refuses_a_basis_shorter_than_k(tmp_path):
    a = bl.from_array(_matrix(), tmp_path / "a.zarr")
    with pytest.raises(ParameterError, match=r"^max_passes: must let the Lanczos basis reach k = 70 vectors"):
        bl.eigsh(a, 70, block_size=1, max_passes=60, memory="767KiB", order="ascending")


def test_stored_sparse_eigsh_refuses_a_basis_shorter_than_k(tmp_path):
    path = tmp_path / "s.zarr"
    bl.from_sparse(scipy.sparse.csr_matrix(_matrix()), path)
    with pytest.raises(ParameterError, match=r"^max_passes: .* block of 1\); got a limit of 10 steps") as info:
        bl.eigsh(path, 30, block_size=1, max_passes=10, order="ascending")
    assert "block_size (at least 3 for 10 steps)" in str(info.value)


def test_a_limit_that_reaches_k_returns_k_pairs(tmp_path):
    path = tmp_path / "s.zarr"
    bl.from_sparse(scipy.sparse.csr_matrix(_matrix()), path)
    with pytest.warns(bl.errors.ConvergenceWarning):  # 12 steps of 3: a basis of 36, not converged
        w, V = bl.eigsh(path, 30, block_size=3, max_passes=12, order="ascending")
    assert w.shape == (30,) and np.shape(V) == (N, 30)


def test_a_non_integer_k_is_refused_with_a_k_that_fits():
    """The integer refusal's example ``k`` is one the matrix takes (it had proposed ``k=10`` for a 10 x 10
    eigsh, whose rule is ``k < n``)."""
    a = np.diag(np.arange(1.0, 11.0))
    with pytest.raises(ParameterError, match=r"^k: must be an integer; got 2\.5\. Fix: pass k=9$"):
        bl.eigsh(a, 2.5, order="ascending")
