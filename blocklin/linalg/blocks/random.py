"""Random test matrices keyed by block of rows (the same numbers whatever the strips, budget or scheduler).

Rows ``[r0, r1)`` of an ``(inf x width)`` standard-normal matrix are built from fixed blocks of
rows, each generated from its own key ``(seed, stream, block index, ...)``. The numbers therefore
depend only on the seed, never on strip sizes, budgets, workers or the scheduler, and any row range
(the rows appended to an updatable sketch, say) is reproducible on its own. Each use draws from its
own stream, so one seed gives independent matrices.

:class:`GaussianRows` (the single-pass sketch's test matrices, the orthonormal completion's rows) has
versioned generators (generator 3 draws the sketch's ``Upsilon`` and ``Phi`` as random signs,
:class:`SignRows`), because a faster one changes every seed's numbers: results and resume tokens
that depend on them record :data:`SKETCH_GENERATOR`, and an updatable sketch made by an older
generator keeps drawing its appended rows from that one (:data:`GENERATORS`).

Complex dtypes get complex Gaussian matrices (independent standard-normal real and imaginary parts, each
entry drawn as a consecutive pair of the real stream of twice the width), so that a range finder sees
the whole complex space; real dtypes draw exactly the numbers they always did.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from blocklin.errors import ParameterError, explain

#: Rows per independently seeded block of a random test matrix (:func:`gaussian`).
RNG_BLOCK = 1024
#: Rows per block of :class:`GaussianRows` with generator 1 (small, because each block paid its own
#: ``SeedSequence`` and ``Philox`` setup while strips of a few rows took their rows from it).
SKETCH_RNG_BLOCK = 64

#: :class:`GaussianRows` generator 1: NumPy's ``Philox`` keyed through ``SeedSequence`` by
#: ``(seed, stream, block, draws, 64)`` for every block of 64 rows (about 17 us of setup per block and
#: 10 ns per normal here). Kept for updatable sketches made with it.
GENERATOR_PHILOX64 = 1
#: :class:`GaussianRows` generator 2: NumPy's ``SFC64`` (Chris Doty-Humphrey's Small Fast Chaotic
#: generator, 256 bits of state) seeded through ``SeedSequence`` by ``(seed, stream, block, draws, rows,
#: 2)`` (NumPy's way to independent parallel streams: hashed keys, no overlapping counters to manage)
#: for blocks of :func:`block_rows` rows (thousands for narrow widths, so the setup is amortized),
#: normals by NumPy's ziggurat: about 1.5x fewer ns per normal than ``Philox`` here and no per-64-row
#: setup.
GENERATOR_SFC64 = 2
#: Generator 3: the test matrices drawn per row of ``A`` (``Upsilon`` and ``Phi``, :func:`row_test_rows`)
#: are random sign matrices (:class:`SignRows`); ``Omega``, ``Psi`` and every other use draw the normals
#: of generator 2.
GENERATOR_SIGNS = 3
#: Every generator a result may record (generator 3 draws ``Upsilon`` and ``Phi`` by :class:`SignRows`, its
#: other test matrices by :class:`GaussianRows` as generator 2).
GENERATORS = (GENERATOR_PHILOX64, GENERATOR_SFC64, GENERATOR_SIGNS)
#: The generator of new results (recorded with them: ``generator`` in an updatable sketch's state).
SKETCH_GENERATOR = GENERATOR_SIGNS
#: Generator 2's keyed block: about this many normals (2 MiB of float64, never held: drawn in pieces),
#: at most :data:`MAX_BLOCK_ROWS` rows and at least :data:`SKETCH_RNG_BLOCK` rows.
BLOCK_DRAWS = 1 << 18
MAX_BLOCK_ROWS = 4096
#: Normals per piece a block is drawn in where they cannot go straight into the destination (16 KiB of
#: float64, or :data:`SKETCH_RNG_BLOCK` rows of wide widths): large enough that NumPy's per-call cost is
#: small beside the draws, small enough to sit in cache. The pieces do not change the numbers.
PIECE_DRAWS = 1 << 11

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


def check_generator(generator: Any = None) -> int:
    """``generator`` as one of :data:`GENERATORS` (the version recorded with a result; None: the current
    one, :data:`SKETCH_GENERATOR`, read when called), or a clear error."""
    if generator is None:
        generator = SKETCH_GENERATOR
    ok = isinstance(generator, (int, np.integer)) and not isinstance(generator, bool) and generator in GENERATORS
    if not ok:
        raise ParameterError(explain("generator", f"must be one of the test-matrix generators {list(GENERATORS)}",
                                     repr(generator), f"pass generator={SKETCH_GENERATOR} (the current one), or "
                                     "recompute a result whose recorded generator this version does not know"))
    return int(generator)


def block_rows(draws: int, generator: int | None = None) -> int:
    """Rows per keyed block of :class:`GaussianRows` drawing ``draws`` normals a row (part of the numbers'
    key): 64 for generator 1; for generator 2 the power of two nearest below ``BLOCK_DRAWS / draws``,
    within ``[64, 4096]`` (the key's setup amortized over a thousand rows or more; memory does not grow
    with it: a block is drawn in pieces, :func:`piece_rows`, as it is used)."""
    if check_generator(generator) == GENERATOR_PHILOX64:
        return SKETCH_RNG_BLOCK
    rows = 1 << max(0, (BLOCK_DRAWS // max(1, int(draws))).bit_length() - 1)
    return max(SKETCH_RNG_BLOCK, min(MAX_BLOCK_ROWS, rows))


def piece_rows(draws: int, generator: int | None = None) -> int:
    """Rows of the piece :class:`GaussianRows` draws through: :data:`PIECE_DRAWS` normals, at least
    :data:`SKETCH_RNG_BLOCK` rows, at most a block."""
    return min(block_rows(draws, generator), max(SKETCH_RNG_BLOCK, PIECE_DRAWS // max(1, int(draws))))


def block_bytes(width: int, complex: bool = False, generator: int | None = None) -> int:
    """Host bytes one :class:`GaussianRows` keeps for ``width`` columns: its piece (float64; complex:
    ``2 width`` columns), 16 KiB or :data:`SKETCH_RNG_BLOCK` rows, whichever is more."""
    draws = (2 if complex else 1) * int(width)
    return piece_rows(draws, generator) * draws * 8


class GaussianRows:
    """Consecutive rows of the standard-normal matrix of ``(seed, stream)``, ``width`` columns, in fixed
    blocks of :func:`block_rows` rows, each drawn from its own key (``seed, stream, block index, draws
    a row, block rows``; see :data:`GENERATOR_SFC64` and :data:`GENERATOR_PHILOX64`).

    The numbers depend on the seed, stream, width and ``generator`` only: any row range is the same
    whatever range or split it is taken in. The generator of the block in use is kept with its
    position, so strips taken in row order continue its stream (each block keyed once, its rows drawn
    once) and a row range further back starts its block again. Rows go straight into a float64 (or
    complex128) C-contiguous ``out``, else through a piece of :func:`piece_rows` rows (memory:
    :func:`block_bytes`; complex128 with ``complex``: the rows of ``2 width`` real columns
    taken in pairs, as :func:`gaussian`).
    """

    def __init__(self, seed: int, stream: int, width: int, block: int | None = None,
                 complex: bool = False, generator: int | None = None) -> None:
        self.generator = check_generator(generator)
        self.seed, self.stream, self.width = int(seed), int(stream), int(width)
        self.complex = bool(complex)
        self.draws = (2 if complex else 1) * self.width
        self.block = int(block) if block is not None else block_rows(self.draws, self.generator)
        self.index, self.pos, self.gen = -1, 0, None
        piece = min(self.block, max(SKETCH_RNG_BLOCK, PIECE_DRAWS // max(1, self.draws)))
        self.buf = np.empty((piece, self.draws), dtype=np.float64)
        self.values = self.buf.view(np.complex128) if complex else self.buf

    def _key(self, b: int) -> np.random.SeedSequence:
        if self.generator == GENERATOR_PHILOX64:
            return np.random.SeedSequence([self.seed, self.stream, b, self.draws, self.block])
        # generator 3 draws its normals as generator 2 does
        return np.random.SeedSequence([self.seed, self.stream, b, self.draws, self.block, GENERATOR_SFC64])

    def _seek(self, b: int, row: int) -> None:
        """Position the stream at row ``row`` of block ``b`` (the rows before it drawn and dropped)."""
        if b != self.index or row < self.pos:
            bits = np.random.Philox if self.generator == GENERATOR_PHILOX64 else np.random.SFC64
            self.gen, self.index, self.pos = np.random.Generator(bits(self._key(b))), b, 0
        while self.pos < row:
            n = min(row - self.pos, self.buf.shape[0])
            self.gen.standard_normal(out=self.buf[:n])
            self.pos += n

    def _draw(self, dst: np.ndarray) -> None:
        """The next ``len(dst)`` rows of the stream into ``dst`` (a stream's numbers do not depend on how
        its draws are split: each normal takes the next words of the bit generator)."""
        n = dst.shape[0]
        if dst.dtype == self.values.dtype and dst.flags.c_contiguous and dst.shape[1:] == (self.width,):
            self.gen.standard_normal(out=dst.view(np.float64) if self.complex else dst)
        else:
            h = self.buf.shape[0]
            for i in range(0, n, h):
                j = min(n, i + h)
                self.gen.standard_normal(out=self.buf[:j - i])
                dst[i:j] = self.values[:j - i]
        self.pos += n

    def rows(self, r0: int, r1: int, out: np.ndarray | None = None) -> np.ndarray:
        """Rows ``r0:r1`` into ``out`` (any ``(r1 - r0) x width`` array or view; new float64, or complex128,
        if None)."""
        out = np.empty((max(0, r1 - r0), self.width), dtype=self.values.dtype) if out is None else out
        h = self.block
        for b in range(r0 // h, -(-r1 // h)):
            lo, hi = max(r0, b * h), min(r1, (b + 1) * h)
            self._seek(b, lo - b * h)
            self._draw(out[lo - r0:hi - r0])
        return out


class SignRows:
    """Consecutive rows of the random sign matrix of ``(seed, stream)``, ``width`` columns: independent
    entries ``+1`` or ``-1`` with equal odds (complex: ``+-1 +- 1j``, the real and imaginary signs a
    consecutive pair of the real stream of ``2 width`` columns, as :func:`gaussian`).

    The sketch's co-range and core test matrices ``Upsilon`` and ``Phi`` under generator 3: the sparse
    sign test matrix of Tropp, Yurtsever, Udell and Cevher (2019), "Streaming low-rank matrix
    approximation with an application to scientific simulation", SIAM J. Sci. Comput. 41(4), section
    3.9, with every entry of a column (our row, one per row of ``A``) nonzero (``zeta = d``; the paper's
    ``zeta = min(d, 8)`` saves products, not draws, and choosing the positions cost NumPy as much as the
    normals). One bit per entry: 6x fewer ns a row than the normals of generator 2 at the widths of
    ``k = 10`` (docs/benchmarks.md, "Sign test matrices for the rows of A"), for the same accuracy in
    their experiments and ours. Unscaled: the sketch's reconstruction does not change when ``Upsilon``
    or ``Phi`` is scaled, and ``+-1`` is exact in every dtype.

    The bits are NumPy's ``SFC64`` keyed per block of :func:`block_rows` rows (generator 2's blocks) by
    ``(seed, stream, block, draws a row, rows, 3)``: each row takes the next ``ceil(draws / 64)`` 64-bit
    words, read as little-endian bytes, least significant bit first, a set bit ``-1``. Like
    :class:`GaussianRows`, the numbers depend on the seed, stream and width only, never on the split
    they are taken in: the block in use is kept with its position, and rows are drawn through a piece of
    :func:`sign_piece_rows` rows (:func:`sign_block_bytes`).
    """

    def __init__(self, seed: int, stream: int, width: int, complex: bool = False) -> None:
        self.seed, self.stream, self.width = int(seed), int(stream), int(width)
        self.complex = bool(complex)
        self.draws = (2 if complex else 1) * self.width
        self.words = -(-self.draws // 64)
        self.block = block_rows(self.draws, GENERATOR_SFC64)
        self.piece = sign_piece_rows(self.draws)
        self.index, self.pos, self.bits = -1, 0, None

    def _seek(self, b: int, row: int) -> None:
        """Position the stream at row ``row`` of block ``b`` (the words before it drawn and dropped)."""
        if b != self.index or row < self.pos:
            key = np.random.SeedSequence([self.seed, self.stream, b, self.draws, self.block, GENERATOR_SIGNS])
            self.bits, self.index, self.pos = np.random.SFC64(key), b, 0
        while self.pos < row:
            n = min(row - self.pos, self.piece)
            self.bits.random_raw(n * self.words)
            self.pos += n

    def _signs(self, n: int) -> np.ndarray:
        """The next ``n`` rows' signs (int8, ``n x draws``)."""
        raw = self.bits.random_raw(n * self.words).astype("<u8", copy=False).view(np.uint8).reshape(n, -1)
        signs = np.unpackbits(raw, axis=1, count=self.draws, bitorder="little").view(np.int8)
        signs *= -2
        signs += 1
        self.pos += n
        return signs

    def rows(self, r0: int, r1: int, out: np.ndarray | None = None) -> np.ndarray:
        """Rows ``r0:r1`` into ``out`` (any ``(r1 - r0) x width`` array or view; new float64, or complex128,
        if None)."""
        if out is None:
            out = np.empty((max(0, r1 - r0), self.width), dtype=np.complex128 if self.complex else np.float64)
        h = self.block
        for b in range(r0 // h, -(-r1 // h)):
            lo, hi = max(r0, b * h), min(r1, (b + 1) * h)
            self._seek(b, lo - b * h)
            for i in range(lo, hi, self.piece):
                j = min(hi, i + self.piece)
                src, dst = self._signs(j - i), out[i - r0:j - r0]
                if self.complex:
                    dst.real, dst.imag = src[:, 0::2], src[:, 1::2]
                else:
                    np.copyto(dst, src, casting="unsafe")
        return out


#: Bytes of the piece :class:`SignRows` draws through (its words and signs): NumPy's per-call costs (six
#: calls a piece) stay small beside its hundreds of rows, and it sits in cache.
SIGN_PIECE = 1 << 14


def sign_piece_rows(draws: int) -> int:
    """Rows of a :class:`SignRows` piece: :data:`SIGN_PIECE` bytes of words and signs, at least
    :data:`SKETCH_RNG_BLOCK` rows, at most a block."""
    row = int(draws) + 8 * -(-int(draws) // 64)
    return min(block_rows(draws, GENERATOR_SFC64), max(SKETCH_RNG_BLOCK, SIGN_PIECE // max(1, row)))


def sign_block_bytes(width: int, complex: bool = False) -> int:
    """Host bytes one :class:`SignRows` holds for ``width`` columns: a piece's words and signs."""
    draws = (2 if complex else 1) * int(width)
    return sign_piece_rows(draws) * (8 * -(-draws // 64) + draws)


def row_test_rows(seed: int, stream: int, width: int, complex: bool = False,
                  generator: int | None = None) -> GaussianRows | SignRows:
    """The rows of the sketch's test matrices drawn per row of ``A`` (``Upsilon`` and ``Phi``): random
    signs for generator 3 (:class:`SignRows`), Gaussian for generators 1 and 2."""
    if check_generator(generator) == GENERATOR_SIGNS:
        return SignRows(seed, stream, width, complex=complex)
    return GaussianRows(seed, stream, width, complex=complex, generator=generator)


def row_test_bytes(width: int, complex: bool = False, generator: int | None = None) -> int:
    """Host bytes a :func:`row_test_rows` generator keeps."""
    if check_generator(generator) == GENERATOR_SIGNS:
        return sign_block_bytes(width, complex)
    return block_bytes(width, complex, generator)


def sketch_test_matrices(seed: int, n: int, kp: int, s: int, dtype: Any = np.float64,
                          generator: int | None = None) -> np.ndarray:
    """``[Omega | Psi]`` (``n x (kp + s)``) of the single-pass sketch: its range and co-range test
    matrices side by side, generated in place block by block (one :class:`GaussianRows` block of
    temporaries), so that one product ``B_i [Omega | Psi]`` makes both sketches of a strip."""
    out = np.empty((n, kp + s), dtype=dtype)
    c = is_complex(dtype)
    GaussianRows(seed, STREAM_SKETCH_OMEGA, kp, complex=c, generator=generator).rows(0, n, out=out[:, :kp])
    GaussianRows(seed, STREAM_SKETCH_PSI, s, complex=c, generator=generator).rows(0, n, out=out[:, kp:])
    return out


def probes(n: int, k: int, seed: int) -> np.ndarray:
    """The ``n x k`` standard normal probe block of a residual estimate (``E ||R p||^2 = ||R||_F^2``)."""
    return np.random.default_rng([seed, 7]).standard_normal((n, k))
