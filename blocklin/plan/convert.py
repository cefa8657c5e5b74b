"""Planning a bounded-memory conversion: which blocks to copy, in what order, with what buffers.

Pure arithmetic on shapes, dtypes, chunks and a budget, in the spirit of rechunker's
``algorithm.py``: no I/O. :func:`plan_convert` returns a frozen :class:`ConvertPlan`; the copy loop
in :mod:`blocklin.storage.convert` executes it.

Memory model (bytes alive at the peak)::

    fixed  = reader resident data + reader/writer fixed overheads
             + concurrency * (3 * source chunk: raw, decoded, copied in
                              + 2 * output chunk: contiguous copy and encoding)
    block  = elements * (depth * source itemsize          # block read, and the next one prefetched
                         + output itemsize if casting      # the cast copy
                         + output itemsize if re-laying    # C<->F copy for file writers
                         + writer extra per element)
    peak   = max(fixed + block, prepare)                  # prepare: a reader's staging step, alone

A symmetric dense Matrix Market file stores its lower triangle column by column, so a block of the
full matrix needs values from columns far apart in the file. Its reader first mirrors the file into
a scratch zarr of square chunks, one strip of columns at a time (:func:`plan_mirror`), and the copy
then reads the scratch like any chunked source.

Blocks are whole multiples of the writer's unit (the output chunks), so no two blocks write the same
chunk; C-ordered sources are walked by row panels and F-ordered ones by column panels, full width when
the budget allows.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator

import numpy as np

from blocklin.config import format_size, size_hint
from blocklin.errors import BudgetError, explain

#: Largest block: bigger blocks do not read faster, and smaller ones keep the prefetch pipeline busy.
MAX_BLOCK_BYTES = 256 * 2**20
#: Largest number of zarr chunks encoded or decoded at once.
MAX_CONCURRENCY = 8


@dataclasses.dataclass(frozen=True)
class ConvertPlan:
    """How a conversion copies its source.

    Attributes
    ----------
    shape : tuple of int
        Matrix shape.
    in_dtype, out_dtype : str
        Source and output dtypes.
    order : {"C", "F"}
        ``"C"``: blocks walk row panels (left to right within a panel); ``"F"``: column panels.
    block : tuple of int
        Rows and columns of a full block (edge blocks are smaller).
    unit : tuple of int
        Output granularity (chunks) that block edges are multiples of.
    depth : int
        Source blocks in memory at once (2 when the next block is prefetched during a write).
    concurrency : int
        Zarr chunks encoded or decoded at once.
    memory : int
        Budget in bytes.
    fixed_bytes, block_bytes, peak_memory : int
        Planned bytes: fixed overheads, block buffers, and the peak (their sum, or the reader's
        staging step when that needs more).
    prepare_bytes : int
        Bytes of the reader's staging step before the copy (0: none), never held during the copy.
    bytes_read, bytes_written : int
        Dense bytes of the source and of the output (before compression).
    n_blocks : int
        Number of blocks.
    """

    shape: tuple[int, int]
    in_dtype: str
    out_dtype: str
    order: str
    block: tuple[int, int]
    unit: tuple[int, int]
    depth: int
    concurrency: int
    memory: int
    fixed_bytes: int
    block_bytes: int
    peak_memory: int
    bytes_read: int
    bytes_written: int
    n_blocks: int
    prepare_bytes: int = 0

    def blocks(self) -> Iterator[tuple[int, int, int, int]]:
        """Yield ``(r0, r1, c0, c1)`` of every block in the planned order."""
        m, n = self.shape
        br, bc = self.block
        if m == 0 or n == 0:
            return
        if self.order == "C":
            for r0 in range(0, m, br):
                for c0 in range(0, n, bc):
                    yield r0, min(r0 + br, m), c0, min(c0 + bc, n)
        else:
            for c0 in range(0, n, bc):
                for r0 in range(0, m, br):
                    yield r0, min(r0 + br, m), c0, min(c0 + bc, n)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def _mib(nbytes: int) -> str:
    return size_hint(nbytes)


def _too_small(memory: int, need: int, *, resident: int, fixed: int, resident_what: str, order: str,
               full_span: bool, panel: tuple[int, int], unit: tuple[int, int]) -> BudgetError:
    """The error for a budget that cannot hold one block: what it must hold, and the minimum."""
    if resident and resident + fixed > memory // 2:
        return BudgetError(explain("memory", f"must hold what the reader needs: {resident_what} "
                                   f"({_mib(resident)}) plus one block", f"{_mib(memory)} (needs {_mib(need)})",
                                   f"raise the budget to at least {_mib(need)} (--memory {_mib(need)})"), minimum=need)
    p = f"row panel of {panel[0]} x {panel[1]}" if order == "C" else f"column panel of {panel[1]} x {panel[0]}"
    chunked = not full_span and unit != (1, 1)  # a writer without chunks (HDF5, .npy) has a unit of 1 x 1
    what = f"one block of {unit[0]} x {unit[1]} (the output chunks)" if chunked else \
        f"one {p}" if full_span else "one block"
    return BudgetError(explain("memory", f"must hold {what} with its buffers", f"{_mib(memory)} "
                               f"(needs {_mib(need)})", f"raise the budget to at least {_mib(need)} "
                               f"(--memory {_mib(need)}){', or choose smaller --chunks' if chunked else ''}"),
                       minimum=need)


def _panel_block(m_: int, n_: int, ur_: int, uc_: int, al: tuple[int, int] | None, *, full_span: bool,
                 max_elems: int) -> tuple[int, int]:
    """Block shape in panel coordinates: whole units, aligned to the source chunks where that fits."""
    if m_ == 0 or n_ == 0:
        return max(m_, 1), max(n_, 1)
    if full_span or ur_ * n_ <= max_elems:
        bc_ = n_
    else:
        step = uc_
        if al and al[1] and math.lcm(uc_, al[1]) * ur_ <= max_elems:
            step = math.lcm(uc_, al[1])
        bc_ = min(max(uc_, (max_elems // ur_) // step * step), n_)
    step = ur_
    if al and al[0] and math.lcm(ur_, al[0]) * bc_ <= max_elems:
        step = math.lcm(ur_, al[0])
    return min(max(ur_, (max_elems // bc_) // step * step), m_), bc_


def plan_convert(shape: tuple[int, int], in_dtype, out_dtype, *, memory: int, order: str = "C",
                 unit: tuple[int, int] = (1, 1), full_span: bool = False, align: tuple[int, int] | None = None,
                 resident: int = 0, resident_what: str = "", fixed: int = 0, in_chunk_bytes: int = 0,
                 out_chunk_bytes: int = 0, relayout: bool = False, extra_per_element: int = 0,
                 prefetch: bool = True, max_block_bytes: int = MAX_BLOCK_BYTES, out_chunk_copies: int = 2,
                 prepare: int = 0, prepare_what: str = "") -> ConvertPlan:
    """Plan the blocks of a conversion so that its buffers fit ``memory``.

    Parameters
    ----------
    shape : (int, int)
        Matrix shape.
    in_dtype, out_dtype : dtype
        Source and output element types (a cast costs one more block copy).
    memory : int
        Budget in bytes.
    order : {"C", "F"}
        Walk row panels (C sources) or column panels (F sources).
    unit : (int, int)
        Output chunk shape; blocks are whole multiples of it.
    full_span : bool
        Blocks must span whole rows (C) or whole columns (F): sequential text readers and writers.
    align : (int, int), optional
        Source chunks; block edges are also made multiples of them when the budget allows, so that
        source chunks are decoded once.
    resident : int
        Bytes the reader holds for its life; ``resident_what`` says why, for the error message.
    fixed : int
        Other fixed transient bytes (text parse batches, HDF5 chunk cache).
    in_chunk_bytes, out_chunk_bytes : int
        Bytes of one source / output zarr chunk (0 when not zarr): sized into the concurrency.
    relayout : bool
        The writer copies each block into its own memory order.
    extra_per_element : int
        Other writer bytes per block element.
    prefetch : bool
        Read the next block while the current one is written, when the budget allows.
    out_chunk_copies : int
        Copies of an output chunk alive per write in flight: 2 (a contiguous copy and its encoding)
        for local stores; 3 for fsspec stores (object stores), whose ``set`` also takes the encoded
        chunk as one more ``bytes`` object for the request body.
    prepare, prepare_what : int, str
        Bytes of a staging step the reader runs alone before the copy (:func:`plan_mirror`), and
        what it is, for the error message.

    Raises
    ------
    BudgetError
        When even one unit block (plus the fixed overheads) does not fit; the message names the
        minimum budget.
    """
    m, n = (int(s) for s in shape)
    in_dt, out_dt = np.dtype(in_dtype), np.dtype(out_dtype)
    order = order.upper()
    memory = int(memory)
    ur = max(1, min(int(unit[0]), max(m, 1)))
    uc = max(1, min(int(unit[1]), max(n, 1)))
    # zarr holds a raw, a decoded and a copied-in chunk per read in flight, a contiguous and an encoded
    # copy per write in flight (measured for the engine, see blocklin.plan.gemm).
    if prepare > memory:
        raise BudgetError(explain("memory", f"must hold the reader's staging step: {prepare_what}",
                                  f"{_mib(memory)} (needs {_mib(prepare)})",
                                  f"raise the budget to at least {_mib(prepare)} (--memory {_mib(prepare)})"),
                          minimum=int(prepare))
    chunk_cost = 3 * in_chunk_bytes + int(out_chunk_copies) * out_chunk_bytes
    concurrency = 1 if chunk_cost == 0 else int(max(1, min(MAX_CONCURRENCY, (memory // 4) // chunk_cost)))
    fixed_bytes = int(resident + fixed + concurrency * chunk_cost)
    cast = in_dt != out_dt
    # Work on the panel axis as "rows": transpose the problem for column panels.
    if order == "F":
        m_, n_, ur_, uc_ = n, m, uc, ur
        al = (align[1], align[0]) if align else None
    else:
        m_, n_, ur_, uc_ = m, n, ur, uc
        al = align
    min_elems = min(ur_, max(m_, 1)) * (n_ if full_span else min(uc_, max(n_, 1)))

    def per_elem(depth: int) -> int:
        return depth * in_dt.itemsize + (out_dt.itemsize if cast else 0) + \
            (out_dt.itemsize if relayout else 0) + int(extra_per_element)

    depth = 2 if prefetch else 1
    if fixed_bytes + per_elem(depth) * min_elems > memory and depth == 2:
        depth = 1
    need = fixed_bytes + per_elem(depth) * min_elems
    if need > memory and concurrency > 1:  # pragma: no cover - concurrency is sized to a quarter
        concurrency, fixed_bytes = 1, int(resident + fixed + chunk_cost)
        need = fixed_bytes + per_elem(depth) * min_elems
    if need > memory:
        raise _too_small(memory, need, resident=resident, fixed=fixed, resident_what=resident_what, order=order,
                         full_span=full_span, panel=(ur_, n_), unit=(ur, uc))
    pe = per_elem(depth)
    max_elems = max(min_elems, min((memory - fixed_bytes) // pe,
                                   max_block_bytes // max(in_dt.itemsize, out_dt.itemsize, 1)))
    br_, bc_ = _panel_block(m_, n_, ur_, uc_, al, full_span=full_span, max_elems=max_elems)
    block = (br_, bc_) if order == "C" else (bc_, br_)
    elems = block[0] * block[1] if m and n else 0
    n_blocks = (math.ceil(m / block[0]) * math.ceil(n / block[1])) if m and n else 0
    if n_blocks <= 1:
        depth = 1  # nothing to prefetch
    if chunk_cost and m and n:  # no more chunks in flight than one block touches
        per_block = math.ceil(block[0] / ur) * math.ceil(block[1] / uc)
        if align and align[0] and align[1]:
            per_block = max(per_block, math.ceil(block[0] / align[0]) * math.ceil(block[1] / align[1]))
        if per_block < concurrency:
            concurrency = per_block
            fixed_bytes = int(resident + fixed + concurrency * chunk_cost)
    block_bytes = elems * per_elem(depth)
    return ConvertPlan(
        shape=(m, n), in_dtype=in_dt.str, out_dtype=out_dt.str, order=order, block=block, unit=(ur, uc),
        depth=depth, concurrency=concurrency, memory=memory, fixed_bytes=fixed_bytes, block_bytes=block_bytes,
        peak_memory=max(fixed_bytes + block_bytes, int(prepare)), bytes_read=m * n * in_dt.itemsize,
        bytes_written=m * n * out_dt.itemsize, n_blocks=n_blocks, prepare_bytes=int(prepare),
    )


#: Narrowest mirror strip (and scratch chunk side): narrower ones make too many scratch chunks.
MIRROR_MIN_WIDTH = 64
#: Widest mirror strip: 8 MiB float64 scratch chunks, as the engine's own (larger ones read no faster).
MIRROR_MAX_WIDTH = 1024


@dataclasses.dataclass(frozen=True)
class MirrorPlan:
    """How a symmetric dense Matrix Market file is mirrored into a scratch zarr.

    The file stores column ``j``'s rows ``j..n-1`` (``j+1..n-1`` when skew-symmetric) column after
    column. One forward pass reads ``width`` columns at a time (an ``n x width`` strip, zeros above
    the diagonal) and writes it twice: as the scratch's column strip (its diagonal block completed
    from its lower triangle) and, transposed, as the row strip right of the diagonal block, whose
    values the file holds nowhere else. Scratch chunks are ``width x width``, so each is written
    once and whole.

    Attributes
    ----------
    n, itemsize : int
        Matrix side and bytes per value.
    width : int
        Columns per strip, and the scratch chunk side.
    memory : int
        Budget in bytes.
    peak_memory : int
        Bytes alive at once: the parse batch, the strip, and four chunk-sized buffers (the diagonal
        block's triangle copy; the contiguous copy, the encoding and, on an object store, the request
        body of the one chunk being written: the writes go one chunk at a time).
    bytes_written : int
        Bytes of the scratch (the full matrix).
    """

    n: int
    itemsize: int
    width: int
    memory: int
    peak_memory: int
    bytes_written: int

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def mirror_memory(n: int, itemsize: int, width: int, parse_bytes: int) -> int:
    """Peak bytes of mirroring with strips of ``width`` columns (see :class:`MirrorPlan`)."""
    return int(parse_bytes + n * width * itemsize + 4 * width * width * itemsize)


def plan_mirror(n: int, dtype, *, memory: int, parse_bytes: int) -> MirrorPlan:
    """The widest mirror strip (at most :data:`MIRROR_MAX_WIDTH`) whose buffers fit ``memory``.

    Raises
    ------
    BudgetError
        When a strip of :data:`MIRROR_MIN_WIDTH` columns (or all of them, for a smaller matrix) does
        not fit; the message names that minimum.
    """
    n, itemsize, memory = int(n), np.dtype(dtype).itemsize, int(memory)
    narrowest = max(1, min(n, MIRROR_MIN_WIDTH))
    need = mirror_memory(n, itemsize, narrowest, parse_bytes)
    if need > memory:
        raise BudgetError(explain("memory", f"must hold one strip of {narrowest} columns of the {n} x {n} symmetric "
                                  "matrix while it is mirrored into a scratch zarr", f"{format_size(memory)} (needs "
                                  f"{_mib(need)})", f"raise the budget to at least {_mib(need)} (--memory {_mib(need)})"),
                          minimum=need)
    width = narrowest
    hi = max(narrowest, min(n, MIRROR_MAX_WIDTH))
    while width < hi:  # the widest that fits (the memory grows with the width)
        mid = (width + hi + 1) // 2
        if mirror_memory(n, itemsize, mid, parse_bytes) <= memory:
            width = mid
        else:
            hi = mid - 1
    return MirrorPlan(n=n, itemsize=itemsize, width=width, memory=memory,
                      peak_memory=mirror_memory(n, itemsize, width, parse_bytes), bytes_written=n * n * itemsize)
