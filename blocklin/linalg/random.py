"""Counter-based random test matrices (the same numbers whatever the strips, budget or scheduler).

Rows ``[r0, r1)`` of an ``(inf x width)`` standard-normal matrix are built from fixed blocks of
:data:`RNG_BLOCK` rows, each seeded by ``(seed, stream, block)``. The numbers therefore depend only
on the seed, never on strip sizes, budgets, workers or the scheduler. Each use draws from its own
stream, so one seed gives independent matrices.
"""

from __future__ import annotations

from typing import Any

import numpy as np

#: Rows per independently seeded block of a random test matrix.
RNG_BLOCK = 1024

#: Streams of random numbers (independent for one seed).
STREAM_OMEGA = 1      # right test matrix of rsvd (N x l)
STREAM_LANCZOS = 2    # starting block of Lanczos
STREAM_UPSILON = 3    # sketch: co-range test matrix, rows of B
STREAM_PHI = 4        # sketch: core test matrix, rows of B
STREAM_SKETCH_OMEGA = 5
STREAM_SKETCH_PSI = 6
STREAM_FILL = 7       # Lanczos: random directions after a breakdown
STREAM_CHECK = 8      # eigsh: symmetry probe


def gaussian(seed: int, stream: int, r0: int, r1: int, width: int, dtype: Any = np.float64) -> np.ndarray:
    """Rows ``r0:r1`` of the standard-normal matrix of ``(seed, stream)`` with ``width`` columns."""
    out = np.empty((max(0, r1 - r0), width), dtype=np.float64)
    b0, b1 = r0 // RNG_BLOCK, -(-r1 // RNG_BLOCK)
    for b in range(b0, b1):
        rng = np.random.Generator(np.random.Philox(np.random.SeedSequence([int(seed), int(stream), b, int(width)])))
        block = rng.standard_normal((RNG_BLOCK, width))
        lo, hi = max(r0, b * RNG_BLOCK), min(r1, (b + 1) * RNG_BLOCK)
        out[lo - r0:hi - r0] = block[lo - b * RNG_BLOCK:hi - b * RNG_BLOCK]
    return out.astype(dtype, copy=False)


def probes(n: int, k: int, seed: int) -> np.ndarray:
    """The ``n x k`` standard normal probe block of a residual estimate (``E ||R p||^2 = ||R||_F^2``)."""
    return np.random.default_rng([seed, 7]).standard_normal((n, k))
