"""Chunk and panel arithmetic shared by every planner."""

from __future__ import annotations

import abc
import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from blocklin._memory import IO_CONCURRENCY  # zarr's chunks in flight; each holds chunk temporaries
from blocklin.config import size_hint
from blocklin.errors import BudgetError, explain

#: Largest chunk the engine creates by default: big enough for efficient I/O and BLAS tiles,
#: small enough that a budget of a few hundred MiB holds several.
MAX_CHUNK_BYTES = 16 * 2**20


class LazyPieces(Sequence):
    """A sequence of ``(start, stop)`` pieces computed on access (subclasses give :meth:`piece` and
    ``__len__``): O(1) memory, so that a declared shape of 10^12 rows never becomes a list of millions
    of tuples."""

    @abc.abstractmethod
    def piece(self, i: int) -> tuple[int, int]:
        """Piece ``i`` (``0 <= i < len(self)``)."""

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        i = index + len(self) if index < 0 else index
        if not 0 <= i < len(self):
            raise IndexError(index)
        return self.piece(i)

    def __eq__(self, other: object) -> bool:
        return list(self) == list(other) if isinstance(other, (list, tuple, Sequence)) else NotImplemented


class Pieces(LazyPieces):
    """Consecutive ``(start, stop)`` pieces of ``range(n)``, computed on access."""

    def __init__(self, n: int, step: int, offset: int = 0) -> None:
        self.n, self.step, self.offset = max(0, int(n)), max(1, int(step)), int(offset)

    def __len__(self) -> int:
        return -(-self.n // self.step)

    def piece(self, i: int) -> tuple[int, int]:
        start = i * self.step
        return self.offset + start, self.offset + min(start + self.step, self.n)

    def __repr__(self) -> str:
        return f"Pieces(n={self.n}, step={self.step}, offset={self.offset})"


def split(n: int, step: int) -> Pieces:
    """Cut ``range(n)`` into consecutive ``(start, stop)`` pieces of ``step`` (the last may be short)."""
    return Pieces(n, step)


def round_down_multiple(value: int, unit: int) -> int:
    """Largest multiple of ``unit`` not above ``value`` (``unit`` itself when ``value < unit``)."""
    unit = max(1, int(unit))
    return max(unit, (int(value) // unit) * unit)


#: Matrices with fewer columns than this (vectors, a few right-hand sides) are "skinny": their row
#: chunks are capped at ``SKINNY_ROWS_PER_SIDE`` square sides. Every auto-chunked tall matrix has
#: power-of-two row chunks of at least one side, so a skinny operand's chunks then divide them or
#: are a small multiple of them: a product with a tall matrix plans k-panels of whole chunks of both
#: (one 300000-row chunk of a vector would force 300000-wide panels or re-read it per panel).
SKINNY_COLUMNS = 64
SKINNY_ROWS_PER_SIDE = 8


def auto_chunks(shape: tuple[int, int], dtype, memory: int | None = None) -> tuple[int, int]:
    """Chunks suited to the engine's tiles.

    Square power-of-two chunks of at most ``min(MAX_CHUNK_BYTES, memory / 32)`` bytes; a dimension
    shorter than the side is taken whole and the other side grows to keep the chunk size.
    """
    itemsize = np.dtype(dtype).itemsize
    m, n = (max(1, int(s)) for s in shape)
    target = MAX_CHUNK_BYTES if memory is None else max(4 * 2**10, min(MAX_CHUNK_BYTES, memory // 32))
    elems = max(1, target // itemsize)
    side = 2 ** int(math.floor(math.log2(max(1.0, math.sqrt(elems)))))
    if m <= side and n <= side:
        return (m, n)
    if m <= side:
        return (m, min(n, max(side, 2 ** int(math.floor(math.log2(max(1, elems // m)))))))
    if n <= side:
        rows = max(side, 2 ** int(math.floor(math.log2(max(1, elems // n)))))
        if n < SKINNY_COLUMNS:  # vectors and skinny matrices are read beside tall ones in k-panels
            rows = min(rows, SKINNY_ROWS_PER_SIDE * side)
        return (min(m, rows), n)
    return (side, side)


def panel_rows(n_rows: int, row_bytes: int, budget: int, copies: int = 2, unit: int = 1,
               what: str = "panel") -> int:
    """Rows per panel so that ``copies`` panels of ``row_bytes`` per row fit ``budget``.

    The result is a multiple of ``unit`` (a chunk height) when the budget allows, else the largest
    row count that fits. Raises :class:`BudgetError` naming the minimum when one row does not fit.
    """
    per_row = max(1, row_bytes) * copies
    rows = budget // per_row
    if rows < 1:
        need = per_row
        raise BudgetError(explain("memory", f"must hold {copies} copies of one {what} row", f"{budget} bytes",
                                  f"raise the budget to at least {need} bytes (memory='{size_hint(need)}')"))
    rows = min(n_rows, rows)
    if rows >= unit:
        rows = round_down_multiple(rows, unit)
    return max(1, rows)


def chunks_touched(span: int, unit: int, total: int) -> int:
    """Most chunks of ``unit`` that one of the ``span``-long pieces ``[i span, (i + 1) span)`` of
    ``total`` touches (strips and tile columns start at multiples of their own length)."""
    span, total = max(1, span), max(1, total)
    period = span * unit // math.gcd(span, unit)
    return max((min(s + span, total) - 1) // unit - s // unit + 1 for s in range(0, min(total, period), span))


def read_temporaries(touched: int, chunk_bytes: int) -> int:
    """Bytes of zarr's temporaries of one read that touches ``touched`` chunks of ``chunk_bytes`` each, which
    it decodes whole: a raw, a decoded and our copy of each, at most :data:`~blocklin._memory.IO_CONCURRENCY`
    chunks at once (measured: ``tests/products/test_gemm_memory.py``)."""
    return min(IO_CONCURRENCY, touched) * 3 * chunk_bytes


def chunk_io(rows: int, cols: int, decoded: tuple[int, int, int] | None, shape: tuple[int, int],
             kept: int = 0) -> int:
    """Bytes of zarr's temporaries (:func:`read_temporaries`) of one ``rows x cols`` read of a ``shape``
    array whose chunks it decodes whole (``decoded``: chunk rows, columns and itemsize,
    :func:`blocklin.operands.decoded_chunks`; None: read directly), beyond ``kept``, the buffers a plan
    already keeps for the read (the block as read and one set of temporaries). Reads start at multiples
    of their own size (:func:`chunks_touched`). Counted where a chunk outgrows the block read: a 512-tile
    of a 1536 x 1536 zstd chunk had a Cholesky at 48 MiB peak at 138 MiB, an LU at 32 MiB at 84."""
    if decoded is None:
        return 0
    c0, c1, isz = max(1, decoded[0]), max(1, decoded[1]), decoded[2]
    touched = chunks_touched(rows, c0, shape[0]) * chunks_touched(cols, c1, shape[1])
    return max(0, read_temporaries(touched, c0 * c1 * isz) - kept)
