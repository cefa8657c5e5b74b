"""``assume_a="pos"`` with a complex *symmetric* ``A`` (``A = A^T``, not Hermitian) that is nearly Hermitian.

The Cholesky reads one triangle and takes the other as its conjugate transpose, as LAPACK's ``zposv`` and
NumPy's ``cholesky`` do (neither checks). The refinement's residuals are taken against ``A`` itself, so
where ``A``'s skew-Hermitian part ``i Im(A)`` is small enough for the Hermitian factorization to precondition
``A`` (imaginary parts ``1e-20`` to ``1e-6`` of ``||A||``, off the diagonal: the diagonal's imaginary parts
are refused before, a Hermitian matrix has a real diagonal), the ``x`` returned solves ``A``, not the
Hermitian matrix read from one triangle; beyond, the stalled refinement refuses naming ``assume_a``. The
bound: :func:`support.tolerances.assert_solve`'s ``8 n eps kappa(A)`` (Higham 2002, Thm 7.2)."""

from __future__ import annotations

import numpy as np
import pytest

import blocklin as bl
from blocklin.errors import NotSymmetricError
from support.tolerances import assert_solve


def _complex_symmetric(n: int, rel: float, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    g = rng.standard_normal((n, n))
    h = g @ g.T + n * np.eye(n)
    s = rng.standard_normal((n, n))
    s = s + s.T
    np.fill_diagonal(s, 0.0)
    return h + 1j * rel * np.linalg.norm(h) * s / np.linalg.norm(s)


@pytest.mark.parametrize("memory", [None, "100KiB"])
@pytest.mark.parametrize("rel", [1e-20, 1e-8, 1e-6])
def test_nearly_hermitian_complex_symmetric_a_is_solved_as_given(rel, memory):
    n = 48
    a = _complex_symmetric(n, rel)
    b = np.random.default_rng(1).standard_normal((n, 2)) + 0j
    kw = {} if memory is None else {"memory": memory}
    x = bl.solve(a, b, assume_a="pos", **kw).to_numpy()
    assert_solve(x, np.linalg.solve(a, b), a)
    if rel >= 1e-8:  # the Hermitian matrix of one triangle solves to another x, farther than the bound
        h = np.tril(a) + np.tril(a, -1).conj().T
        assert np.linalg.norm(x - np.linalg.solve(h, b)) > 8 * n * np.finfo(float).eps * np.linalg.cond(a) * np.linalg.norm(x)


def test_far_from_hermitian_complex_symmetric_a_is_refused_naming_assume_a():
    a = _complex_symmetric(48, 1e-3)
    with pytest.raises(NotSymmetricError, match="assume_a"):
        bl.solve(a, np.ones((48, 1)), assume_a="pos")
