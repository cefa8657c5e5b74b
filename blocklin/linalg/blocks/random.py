"""Counter-based random test matrices (the same numbers whatever the strips, budget or scheduler).

Rows ``[r0, r1)`` of an ``(inf x width)`` standard-normal matrix are built from fixed blocks of
:data:`RNG_BLOCK` rows, each seeded by ``(seed, stream, block)``. The numbers therefore depend only
on the seed, never on strip sizes, budgets, workers or the scheduler. Each use draws from its own
stream, so one seed gives independent matrices.

Complex dtypes get complex Gaussian matrices (independent standard-normal real and imaginary parts, each
entry drawn as a consecutive pair of the real stream of twice the width), so that a range finder sees
the whole complex space; real dtypes draw exactly the numbers they always did.
"""

from __future__ import annotations

from typing import Any

import numpy as np

#: Rows per independently seeded block of a random test matrix.
RNG_BLOCK = 1024
#: Rows per block of the single-pass sketch's test matrices (:class:`GaussianRows`): small, because a
#: task keeps its current block of each while strips of a few rows take their rows from it.
SKETCH_RNG_BLOCK = 64

#: Streams of random numbers (independent for one seed).
STREAM_OMEGA = 1      # right test matrix of rsvd (N x l)
STREAM_LANCZOS = 2    # starting block of Lanczos
STREAM_UPSILON = 3    # sketch: co-range test matrix, rows of B
STREAM_PHI = 4        # sketch: core test matrix, rows of B
STREAM_SKETCH_OMEGA = 5
STREAM_SKETCH_PSI = 6
STREAM_FILL = 7       # Lanczos: random directions after a breakdown
STREAM_CHECK = 8      # eigsh: symmetry probe
STREAM_COMPLETE = 9   # svd: the orthonormal completion of a long factor (rows of B)


def is_complex(dtype: Any) -> bool:
    """Whether ``dtype`` is complex64 or complex128."""
    return np.dtype(dtype).kind == "c"


def gaussian(seed: int, stream: int, r0: int, r1: int, width: int, dtype: Any = np.float64) -> np.ndarray:
    """Rows ``r0:r1`` of the standard-normal matrix of ``(seed, stream)`` with ``width`` columns (complex
    Gaussian for a complex ``dtype``: the real matrix of ``2 width`` columns, each pair of columns one
    entry's real and imaginary parts)."""
    if is_complex(dtype):
        pairs = gaussian(seed, stream, r0, r1, 2 * width)
        return pairs.view(np.complex128).astype(dtype, copy=False)
    out = np.empty((max(0, r1 - r0), width), dtype=np.float64)
    b0, b1 = r0 // RNG_BLOCK, -(-r1 // RNG_BLOCK)
    for b in range(b0, b1):
        rng = np.random.Generator(np.random.Philox(np.random.SeedSequence([int(seed), int(stream), b, int(width)])))
        block = rng.standard_normal((RNG_BLOCK, width))
        lo, hi = max(r0, b * RNG_BLOCK), min(r1, (b + 1) * RNG_BLOCK)
        out[lo - r0:hi - r0] = block[lo - b * RNG_BLOCK:hi - b * RNG_BLOCK]
    return out.astype(dtype, copy=False)


class GaussianRows:
    """Consecutive rows of the standard-normal matrix of ``(seed, stream)``, ``width`` columns, in fixed
    blocks of ``block`` rows (each seeded by ``(seed, stream, block index, width, block)``).

    The numbers depend on the seed, stream, width and ``block`` only. The block last generated is
    kept, so strips shorter than a block (taken in row order) generate each block once instead of once
    per strip; memory: one block, ``block x width`` float64 (complex128 with ``complex``: the rows of
    ``2 width`` real columns taken in pairs, as :func:`gaussian`).
    """

    def __init__(self, seed: int, stream: int, width: int, block: int = SKETCH_RNG_BLOCK,
                 complex: bool = False) -> None:
        self.seed, self.stream, self.width, self.block = int(seed), int(stream), int(width), int(block)
        self.index = -1
        self.complex = bool(complex)
        self.buf = np.empty((self.block, (2 if complex else 1) * self.width), dtype=np.float64)
        self.values = self.buf.view(np.complex128) if complex else self.buf

    def _fill(self, b: int) -> np.ndarray:
        if b != self.index:
            draws = (2 if self.complex else 1) * self.width
            ss = np.random.SeedSequence([self.seed, self.stream, b, draws, self.block])
            np.random.Generator(np.random.Philox(ss)).standard_normal(out=self.buf)
            self.index = b
        return self.values

    def rows(self, r0: int, r1: int, out: np.ndarray | None = None) -> np.ndarray:
        """Rows ``r0:r1`` into ``out`` (any ``(r1 - r0) x width`` array or view; new float64, or complex128,
        if None)."""
        out = np.empty((max(0, r1 - r0), self.width), dtype=self.values.dtype) if out is None else out
        h = self.block
        for b in range(r0 // h, -(-r1 // h)):
            lo, hi = max(r0, b * h), min(r1, (b + 1) * h)
            out[lo - r0:hi - r0] = self._fill(b)[lo - b * h:hi - b * h]
        return out


def sketch_test_matrices(seed: int, n: int, kp: int, s: int, dtype: Any = np.float64) -> np.ndarray:
    """``[Omega | Psi]`` (``n x (kp + s)``) of the single-pass sketch: its range and co-range test
    matrices side by side, generated in place block by block (one :class:`GaussianRows` block of
    temporaries), so that one product ``B_i [Omega | Psi]`` makes both sketches of a strip."""
    out = np.empty((n, kp + s), dtype=dtype)
    GaussianRows(seed, STREAM_SKETCH_OMEGA, kp, complex=is_complex(dtype)).rows(0, n, out=out[:, :kp])
    GaussianRows(seed, STREAM_SKETCH_PSI, s, complex=is_complex(dtype)).rows(0, n, out=out[:, kp:])
    return out


def probes(n: int, k: int, seed: int) -> np.ndarray:
    """The ``n x k`` standard normal probe block of a residual estimate (``E ||R p||^2 = ||R||_F^2``)."""
    return np.random.default_rng([seed, 7]).standard_normal((n, k))
