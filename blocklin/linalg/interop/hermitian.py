"""The check behind ``numpy.linalg.svd(M, hermitian=True)`` of a stored matrix.

NumPy's ``hermitian=True`` computes the SVD from ``eigh``, which reads one triangle and assumes the other
is its conjugate transpose: a non-Hermitian input gets the SVD of another matrix, without a word. blocklin's
SVD needs no such assumption (the SVD of ``M`` itself is ``eigh``'s, up to the signs of the vector pairs,
when ``M`` is Hermitian), so it checks the promise, one pass over ``M``, and refuses a broken one by name
rather than take or ignore it.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from blocklin.errors import NotSquareError, NotSymmetricError, explain


def asymmetry_rtol(dtype: Any) -> float:
    """Largest ``||A - A^H||_F / ||A||_F`` taken as rounding: ``sqrt(eps)`` of ``dtype`` (float64 for integers),
    the relative asymmetry :func:`blocklin.eigsh` and the Cholesky's check tolerate (a Hermitian matrix formed
    in floating point, such as ``B @ B.conj().T``, carries about ``n eps ||A||``)."""
    dt = np.dtype(dtype)
    return math.sqrt(float(np.finfo(dt if dt.kind in "fc" else np.float64).eps))


def check_hermitian(a: Any) -> None:
    """Refuse ``a`` unless it is square and Hermitian (symmetric, of real data) to :func:`asymmetry_rtol`:
    ``||A - A^H||_F`` by tiles against their mirror tiles, scaled against overflow (one pass over ``A``)."""
    from blocklin.runtime.blockops import BlockOps, Region
    from blocklin.runtime.job import Job

    with Job("svd") as job:
        A = job.operand(a, "a")
        m, n = A.shape
        if m != n:
            raise NotSquareError(explain("a", "must be square for hermitian=True (NumPy's eigh route needs it)",
                                         f"shape {m} x {n}", "pass hermitian=False (the default)"))
        if m == 0:
            return
        ops = BlockOps(job, max(A.chunks))
        region = Region.of(A.path, A.shape)
        gap, size = ops.asymmetry(region), ops.norm(region)
    rtol = asymmetry_rtol(A.dtype)
    if gap > rtol * size:
        h, what = ("H", "Hermitian") if np.dtype(A.dtype).kind == "c" else ("T", "symmetric")
        raise NotSymmetricError(explain(
            "a", f"must be {what} for hermitian=True (NumPy's svd then takes one triangle through eigh and assumes "
            f"the other; ||A - A^{h}||_F <= {rtol:.1e} ||A||_F)", f"relative asymmetry {gap / size:.2e}",
            f"pass hermitian=False for the SVD of a as it is, or symmetrize it first ((A + A^{h}) / 2) if that is "
            "the matrix meant"))


__all__ = ["check_hermitian", "asymmetry_rtol"]
