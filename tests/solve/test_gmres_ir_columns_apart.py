"""GMRES-IR refines every right-hand side of a block, whatever its scale beside the others.

GMRES runs one independent GMRES per column in lockstep; its stopping tests and Arnoldi norms are each
column's own. They had been taken with one power of two for the whole block
(:func:`blocklin.linalg.blocks.scaling.column_norms`): beside a column near ``2^500``, one near
``2^-500`` had its squares flushed to 0, read as converged, and was never corrected, so it kept the
16-bit factorization's accuracy (``1e-6`` to ``1e-3``) while the block's normwise backward error, which
the large column decides, reported float64's. Each column is an independent solve, so each must meet
:func:`support.tolerances.assert_solve`'s bound ``8 n eps kappa(A)`` (Higham 2002, Thm 7.2) against
LAPACK's solution of the same column taken at scale 1 (the powers of two are exact)."""

from __future__ import annotations

import numpy as np
import pytest

import blocklin as bl
from support.tolerances import assert_solve


@pytest.mark.parametrize("kw", [{"precision": "fp16"}, {"precision": "bf16"},
                                {"precision": "mixed", "refinement": "gmres"},
                                {"precision": "fp16", "memory": "64KiB"}], ids=str)
@pytest.mark.filterwarnings("error::RuntimeWarning")  # blocklin's own messages only (no NumPy overflow of a cast)
def test_columns_2_pow_1000_apart_each_refined(kw, tmp_path):
    rng = np.random.default_rng(3)
    n = 40
    a = rng.standard_normal((n, n))
    b1 = rng.standard_normal((n, 3))
    powers = np.array([500.0, -500.0, 0.0])
    b = b1 * 2.0 ** powers
    x = bl.solve(a, b, out=tmp_path / "x.zarr", **kw).to_numpy()
    for j, p in enumerate(powers):
        ref = np.linalg.solve(a, b1[:, j])
        assert_solve(np.ldexp(x[:, j], -int(p)), ref, a)
