"""Planning a blocked GEMM ``C = alpha * op(A) @ op(B) + beta * C0``.

The output is cut into ``tm x tn`` tiles, one task each; a task streams its k-loop in
``tk``-wide panels through the device with ``prefetch`` panels read ahead. Tile sizes are multiples
of the input chunks (so every read covers whole chunks and every write owns whole output chunks)
and are chosen to minimize bytes read, since ``op(A)`` is re-read once per tile column and
``op(B)`` once per tile row, subject to every buffer of every concurrent task fitting the budget.

When no chunk-wide panel fits (a budget small for the inputs' chunks), k-panels narrower than a
chunk are planned instead: each panel reads a column (``op(A)``) or row (``op(B)``) sub-range of its
chunks, so a stored chunk is read up to ``panel_rereads`` times per pass, counted so in the bytes
read; the chunk-sized read temporaries stay in the peak memory. Output tiles still own whole chunks.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
from collections.abc import Iterator, Sequence

import numpy as np

from blocklin._memory import IO_CONCURRENCY  # zarr's chunks in flight; each holds chunk temporaries
from blocklin.config import format_size, size_hint
from blocklin.errors import BudgetError, explain
from blocklin.plan.chunks import LazyPieces, chunk_io, read_temporaries, split
from blocklin.plan.gpu import pinned_nbytes  # pinned buffers as CuPy's pool allocates them
from blocklin.plan.gpu import DEFAULT_GPU, DEVICE_UNIT, crossover_tile, link_shortfall, shortfall, transfer_bound
from blocklin.plan.rates import Rates, expected_line

#: Per-task bookkeeping cost, in bytes-read equivalents, to prefer fewer, larger tasks.
TASK_OVERHEAD_BYTES = 4 * 2**20
#: Per k-panel cost (a read, a GEMM call and the hand-offs between the loader and the task), in
#: bytes-read equivalents, so that narrow panels are not chosen to save a few bytes.
STEP_OVERHEAD_BYTES = 256 * 2**10
#: Target panel width of the k-loop: wide enough for BLAS efficiency, narrow enough to overlap.
TARGET_TK = 512
#: The k-block of OpenBLAS's double-precision kernels: narrower k-panels make BLAS re-read and
#: re-write the accumulator more often than it would anyway.
BLAS_KC = 256
#: Narrowest first k-panel planned to start compute early (see ``GemmPlan.k_lead``).
LEAD_MIN = 128
#: Cost of reading part of each row of a local chunk (a k-panel narrower than the chunk's width),
#: in tiles bound by their reads (:data:`FEED_BOUND_FLOPS_PER_BYTE`; elsewhere the reads are hidden
#: and the fewest bytes win), as a multiple of reading the whole rows: the parts are copied out of a
#: mapping of the chunk file, whose pages are faulted in whole, so a part costs about a whole row.
#: Measured on the 2-core machine (14336-row panels of 2048 x 512 float64 chunks in the page cache,
#: one thread, ``RawChunks.read``): whole rows 18 GB/s; half, a quarter and an eighth of the width
#: 5.2, 3.0 and 1.6 GB/s of the bytes used, i.e. 1.7, 1.5 and 1.4 times the whole rows' time.
PARTIAL_READ_COST = 1.4
#: Fewest rows of a tile cut from a chunk's rows (:attr:`_Space.sub_rows`).
SUB_CHUNK_ROWS_MIN = 16
#: Flops per byte read below which a CPU tile is bound by its reads (a core reads the page cache at
#: about 2.7 GB/s and multiplies at about 30 GFLOP/s, so below about 10 flops a byte the reads take
#: longer). Such tiles get half the cores' BLAS threads (at least one): OpenBLAS's threads spin
#: between the small GEMM calls and took the cores from the reads; measured, a thin product
#: (``benchmarks/feed.py``, ``A @ B`` with ``B`` 512 x 4) delivered 0.6-0.9 GB/s on two BLAS threads
#: against 1.3-1.6 GB/s on one.
FEED_BOUND_FLOPS_PER_BYTE = 16
#: Largest panel of ``op(A)`` in a CPU tile bound by its reads (:data:`FEED_BOUND_FLOPS_PER_BYTE`)
#: that the search prefers: a panel and the next one being read stay in the last-level cache, so the
#: GEMM reads what the loader just wrote from there, not from memory. Measured on the 2-core machine
#: (32 MiB L3; ``A @ B``, ``A`` 524288 x 512 float64 in 2048-row chunks on tmpfs, ``B`` 512 x 4, five
#: alternated rounds): 2048-row tiles (8 MiB panels) 6.55 GB/s median, 14336-row tiles 4.77, 1024-row
#: tiles 5.54 (more tiles, smaller output chunks).
FEED_PANEL_BYTES = 8 * 2**20
#: Narrowest sub-chunk panel, as a fraction of a k chunk: below it re-reading each chunk this many
#: times costs more than rechunking the inputs once.
MAX_PANEL_REREADS = 16


@dataclasses.dataclass(frozen=True)
class GemmPlan:
    """A blocked GEMM plan (all sizes in elements unless named ``bytes``)."""

    m: int
    n: int
    k: int
    dtype: str
    source_dtypes: tuple[str, str]
    tm: int
    tn: int
    tk: int
    out_chunks: tuple[int, int]
    workers: int
    blas_threads: int
    prefetch: int
    device: str
    memory: int
    device_memory: int | None
    flops: int
    bytes_read: int
    bytes_written: int
    peak_memory: int
    task_memory: int
    device_peak: int | None
    with_c: bool
    #: Most reads of one stored chunk per pass: 1 unless k-panels cut through chunks (panels
    #: narrower than the chunks, for a budget too small for chunk-wide ones; or A and B chunked
    #: differently along k).
    panel_rereads: int = 1
    #: Output dtype when it differs from the compute dtype ``dtype`` (``matmul(precision=...)``):
    #: finished strips are cast on the host, through two rotating strip buffers.
    out_dtype: str | None = None
    #: Width of a first k-panel narrower than ``tk`` (0: none). The first panel pair is read before
    #: anything can be computed; a narrow one is read quickly and the rest of the first ``tk``
    #: columns are read while it is multiplied. Planned only where panels read just their part of
    #: each chunk from local files (no chunk is read twice for it, no request more to a store).
    k_lead: int = 0
    #: On a GPU: bytes of the device operand cache (:mod:`blocklin.device.resident`) that the tile
    #: runs keep panels in, within ``device_peak`` (0: none), and whether it holds every panel of
    #: ``op(A)`` and ``op(B)`` that a run needs (each then read from storage once, ``bytes_read``).
    cache_bytes: int = 0
    resident: bool = False
    #: Loader threads of a task's stream on a CPU (a GPU's has ``prefetch``): 2 where a tile bound by
    #: its reads decodes its panels of ``op(A)`` (compressed chunks, or reads through zarr), so two
    #: panels are decoded at once, and the budget holds the second one in flight (:func:`plan_gemm`).
    loaders: int = 1

    @property
    def grid(self) -> tuple[int, int]:
        return (math.ceil(self.m / self.tm) if self.m else 0, math.ceil(self.n / self.tn) if self.n else 0)

    @property
    def k_steps(self) -> int:
        return len(self.k_panels()) if self.k else 0

    @property
    def n_tasks(self) -> int:
        gm, gn = self.grid
        return gm * gn

    def tiles(self) -> Iterator[tuple[int, int, slice, slice]]:
        """Yield ``(i, j, rows, cols)`` for every output tile, row-major."""
        for i, (r0, r1) in enumerate(split(self.m, self.tm)):
            for j, (c0, c1) in enumerate(split(self.n, self.tn)):
                yield i, j, slice(r0, r1), slice(c0, c1)

    def k_panels(self) -> list[tuple[int, int]]:
        """The k-panels in summation order: ``tk`` wide, the first split at ``k_lead``."""
        panels = split(self.k, self.tk)
        if len(panels) and 0 < self.k_lead < panels[0][1]:
            return _Led(panels, self.k_lead)
        return panels

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        if d["out_dtype"] is None:  # the usual case: plans (and resume tokens) as before the field
            del d["out_dtype"]
        if not d["cache_bytes"]:  # no device cache (every CPU plan): as before the fields
            del d["cache_bytes"], d["resident"]
        if d["loaders"] == 1:  # one loader: as before the field
            del d["loaders"]
        d["grid"] = list(self.grid)
        d["k_steps"] = self.k_steps
        d["n_tasks"] = self.n_tasks
        return d

    def explain(self, rates: Rates | None = None, device: str | None = None) -> str:
        """Human summary of the plan, with the expected split of its time on ``device`` (default the
        plan's) at ``rates`` (default those ``blocklin calibrate`` cached, else the defaults:
        :func:`~blocklin.plan.rates.load_rates`)."""
        gm, gn = self.grid
        lines = [
            f"GEMM plan: C[{self.m} x {self.n}] = op(A)[{self.m} x {self.k}] @ op(B)[{self.k} x {self.n}]"
            f" ({self.dtype if self.out_dtype is None else f'computed in {self.dtype}, output {self.out_dtype}'}"
            f"{', + beta*C0' if self.with_c else ''}) on {self.device}",
            f"  tiles     {self.tm} x {self.tn} (grid {gm} x {gn} = {self.n_tasks} tasks),"
            f" k-panels {self.tk} wide ({self.k_steps} steps{f', the first {self.k_lead} wide' if self.k_lead else ''}),"
            f" prefetch {self.prefetch}",
            f"  output    chunks {self.out_chunks[0]} x {self.out_chunks[1]}",
            f"  threads   {self.workers} concurrent task(s) x {self.blas_threads} BLAS thread(s)",
            f"  work      {self.flops / 1e9:.1f} GFLOP, read {format_size(self.bytes_read)},"
            f" write {format_size(self.bytes_written)}",
            f"  memory    peak {format_size(self.peak_memory)} of {format_size(self.memory)} host budget"
            f" ({format_size(self.task_memory)} per task)",
            "  " + expected_line(self.bytes_read, self.bytes_written, self.flops, device or self.device, rates,
                                 dtype=self.dtype),
        ]
        if self.panel_rereads > 1:
            lines.append(f"  note      k-panels cut through the inputs' chunks: a chunk is read up to"
                         f" {self.panel_rereads} times per pass (counted in the bytes read; see the"
                         " rechunk advice)")
        if self.device_peak is not None:
            lines.append(f"  device    peak {format_size(self.device_peak)} of "
                         f"{format_size(self.device_memory or 0)} device budget")
            if self.resident:
                lines.append(f"  device    A and B resident on the device ({format_size(self.cache_bytes)} cache): "
                             "each panel read from storage once and reused by every tile")
            elif self.cache_bytes:
                lines.append(f"  device    operand cache {format_size(self.cache_bytes)}: panels a run's later "
                             "tiles need are reused from the device (counted in the bytes read)")
            if transfer_bound(self.tm, self.tn, self.dtype) and not self.resident:
                lines.append(f"  note      {self.tm} x {self.tn} tiles are transfer-bound on an {DEFAULT_GPU} over PCIe "
                             f"(compute-bound from ~{crossover_tile(self.dtype)} square for {self.dtype}); "
                             "a larger device_memory allows larger tiles")
        return "\n".join(lines)


class _Led(LazyPieces):
    """``panels`` with the first one split at ``lead`` (computed on access, like the pieces)."""

    def __init__(self, panels: Sequence, lead: int) -> None:
        self.panels, self.lead = panels, lead

    def __len__(self) -> int:
        return len(self.panels) + 1

    def piece(self, i: int) -> tuple[int, int]:
        if i == 0:
            return 0, self.lead
        if i == 1:
            return self.lead, self.panels[0][1]
        return self.panels[i - 1]


def _candidates(dim: int, unit: int) -> list[int]:
    """Tile sizes along one dimension: multiples of ``unit`` up to ``dim``, and ``dim`` itself."""
    unit = max(1, min(unit, dim))
    count = math.ceil(dim / unit)
    if count <= 48:
        mults = range(1, count + 1)
    else:  # geometric set keeps the search small for huge grids
        mults = sorted({1, count} | {int(round(1.25**e)) for e in range(0, int(math.log(count, 1.25)) + 2)})
        mults = [c for c in mults if 1 <= c <= count]
    return sorted({min(dim, unit * c) for c in mults})


def _sub_chunk_panels(ku: int, ku_a: int, ku_b: int, k: int) -> list[int]:
    """Panel widths below ``ku``, widest first: fractions (down to 1/MAX_PANEL_REREADS) of ``ku`` and of
    each operand's k chunk, so that panels mostly stay inside one chunk of each operand."""
    widths = {c // d for c in (ku, ku_a, ku_b) for d in range(1, MAX_PANEL_REREADS + 1) if c % d == 0}
    return sorted((t for t in widths if 1 <= t < ku and t <= k), reverse=True)


@functools.lru_cache(maxsize=4096)
def _panel_reads(t: int, unit: int, k: int, partial: bool = False) -> tuple[int, int, float]:
    """How ``t``-wide k-panels read an operand stored in ``unit``-wide chunks along ``k``.

    Returns (most chunks one panel touches, most panels touching one chunk, bytes read from storage
    per byte of the operand): every panel reads each chunk it touches whole, unless ``partial``
    (k runs along the rows of uncompressed C-order chunks, so a panel reads only its rows of them).
    """
    if k <= 0:
        return 1, 1, 1.0
    if t % unit == 0:  # panels of whole chunks
        return t // unit, 1, 1.0
    touched, per_chunk, read = 0, {}, 0
    for p0 in range(0, k, t):
        c0, c1 = p0 // unit, (min(p0 + t, k) - 1) // unit
        touched = max(touched, c1 - c0 + 1)
        for c in range(c0, c1 + 1):
            per_chunk[c] = per_chunk.get(c, 0) + 1
            read += min(unit, k - c * unit)
    if partial:  # each panel reads only its rows of the chunks it touches
        return touched, 1, 1.0
    return touched, max(per_chunk.values()), read / k


def _task_memory(tm: int, tn: int, tk: int, *, isz: int, src_isz: tuple[int, int], prefetch: int, with_c: bool,
                 c_rows: int, io_chunk_bytes: int, out_chunk_bytes: int, on_gpu: bool,
                 read_chunks: int = IO_CONCURRENCY, write_chunks: int = IO_CONCURRENCY,
                 out_rows: int = 0, loaders: int = 1, direct: tuple[bool, bool] = (False, False),
                 osz: int = 0, read_reserve: bool = False, c_io: int = 0,
                 read_io: int | None = None) -> tuple[int, int]:
    """(host bytes, device bytes) of one task's buffers (``loaders`` threads reading at once).

    ``direct``: the inputs, and the output, are read and written straight from and to their chunk
    files (:mod:`blocklin.storage.rawchunks`): reads go straight into the panel slots and need no
    chunk temporaries (``read_reserve`` keeps one set per loader for callers that measured a need
    for it beside their own buffers); writes need one chunk buffer only to pad edge chunks
    (``out_chunk_bytes`` is then that buffer, or 0 without edge chunks). ``osz``: the output's
    itemsize when it differs from the compute dtype's (two strips of the output dtype on the host,
    where finished strips are cast). ``c_io``: zarr's temporaries of one strip read of ``C0`` read through
    zarr, sized by ``C0``'s chunks, beside those of the panel reads (which may be in flight at once). ``read_io``: zarr's
    temporaries of one panel read where not both are read directly (default: ``read_chunks`` chunks of
    ``io_chunk_bytes``).
    """
    slots = prefetch + 1
    panels_src = tm * tk * src_isz[0] + tk * tn * src_isz[1]
    cast = slots * (tm * tk + tk * tn) * isz if src_isz != (isz, isz) else 0
    # zarr holds a raw and a decoded copy of each chunk in flight on reads (plus our copy-in), and an
    # encoded copy on writes: measured, not guessed (tests/products/test_gemm_memory.py).
    # Direct reads fill the slots in place (a scratch row at most); the ridge solve's GEMMs keep one
    # chunk set (measured over budget without it, benchmarks/budgets.py, solve at 16 MiB).
    reads_io = read_temporaries(1 if read_reserve else 0, io_chunk_bytes) if direct[0] else \
        read_temporaries(read_chunks, io_chunk_bytes) if read_io is None else read_io
    io = (loaders * reads_io
          # C0's whole chunks decoded for a strip: counted beside direct A and B only, a 256-row strip of
          # 1536 x 1536 zstd chunks beside zstd A and B had peaked at 129 MiB on a 48 MiB plan
          + (c_io if with_c else 0)
          + (out_chunk_bytes if direct[1] else min(IO_CONCURRENCY, write_chunks) * 2 * out_chunk_bytes))
    c_strip = (out_rows or c_rows) * tn * isz if with_c else 0  # C is read in output-chunk strips
    out_cast = 2 * (out_rows or tm) * tn * osz if osz else 0
    if osz and with_c:  # C read in its stored (the output's) dtype, added on the host
        c_strip = (out_rows or c_rows) * tn * osz
    if on_gpu:  # panel slots and download strips pinned, at the block sizes CuPy's pinned pool gives
        pinned = slots * (pinned_nbytes(tm * tk * src_isz[0]) + pinned_nbytes(tk * tn * src_isz[1])) \
            + 3 * pinned_nbytes(out_rows * tn * isz)
        host = pinned + cast + c_strip + io + out_cast
        device = tm * tn * isz + slots * (tm * tk + tk * tn) * isz + (0 if osz else c_strip)
        return host, device
    return tm * tn * isz + slots * panels_src + cast + c_strip + io + out_cast, 0


def plan_gemm(m: int, n: int, k: int, dtype, *, a_chunks: tuple[int, int], b_chunks: tuple[int, int],
              memory: int, source_dtypes: tuple | None = None, c_chunks: tuple[int, int] | None = None,
              workers: int | None = None, cores: int | None = None, prefetch: int | None = None, device: str = "cpu",
              device_memory: int | None = None, out_chunks: tuple[int, int] | None = None,
              reads: tuple[str, ...] = ("chunks", "chunks"), trans: tuple[bool, bool] = (False, False),
              direct_writes: bool = False, out_dtype=None, read_reserve: bool = False) -> GemmPlan:
    """Choose tiles for ``op(A)[m x k] @ op(B)[k x n]`` within ``memory`` bytes.

    Parameters
    ----------
    m, n, k : int
        Problem sizes.
    dtype : dtype
        Compute and output dtype.
    a_chunks, b_chunks : (int, int)
        Chunks of ``op(A)`` and ``op(B)`` in their operated orientation.
    memory : int
        Host budget in bytes for all concurrent tasks.
    source_dtypes : (dtype, dtype), optional
        Stored dtypes of A and B when they are cast on the fly.
    c_chunks : (int, int), optional
        Chunks of ``C0`` when ``beta != 0``.
    workers : int, optional
        Concurrent tasks; default one task with every core given to BLAS.
    cores : int, optional
        Cores to share between tasks and BLAS threads (default: this machine's).
    prefetch : int, optional
        Panels read ahead per task. Default: 1 on a CPU; on a GPU the deepest of 1-3 that the budgets
        allow with the chosen tiles (the task then reads with as many loader threads), so that reads
        and uploads keep a fast device fed.
    device : {"cpu", "gpu"}
        Where accumulators live.
    device_memory : int, optional
        Device budget (required for ``device="gpu"``).
    out_chunks : (int, int), optional
        Output chunks; by default the largest chunks dividing the tile that match the inputs.
    reads : (str, str) or (str, str, str)
        How A's and B's chunks are read (:func:`blocklin.storage.zarr_store.read_kind`):
        ``"direct"``, ``"ranges"`` or ``"chunks"`` (default, through zarr: every chunk touched read
        whole, with zarr's temporaries); a third entry, C0's (default ``"chunks"``).
    trans : (bool, bool)
        Whether A and B are stored transposed: k runs along the stored rows of ``A.T`` and ``B``,
        where a k-panel narrower than a chunk reads only its rows (``reads`` not ``"chunks"``).
    direct_writes : bool
        The output is written straight to its chunk files (local, uncompressed).
    out_dtype : dtype, optional
        Output dtype when it differs from the compute dtype ``dtype`` (a product computed in lower or
        higher precision than it is stored in: ``matmul(precision=...)``).
    read_reserve : bool
        Plan one set of chunk temporaries per loader even for direct reads (which need none): for a
        caller whose own memory beside the GEMM is not otherwise counted.

    Returns
    -------
    GemmPlan

    Raises
    ------
    BudgetError
        When one task with the smallest tiles does not fit; the message states the minimum.

    Notes
    -----
    Bytes read are ``m*k*ceil(n/tn) + k*n*ceil(m/tm)`` elements (plus ``C0`` once); flops are
    ``2*m*n*k``. Peak memory is ``workers`` times the per-task buffers: the accumulator, ``prefetch+1``
    panel slots for each operand, cast buffers, the ``C0`` strip and zarr's chunk temporaries.
    """
    dt = np.dtype(dtype)
    odt = np.dtype(out_dtype) if out_dtype is not None else dt
    src = tuple(np.dtype(s) for s in (source_dtypes or (dt, dt)))
    workers = max(1, int(workers or 1))
    if device == "gpu" and device_memory is None:
        raise BudgetError(explain("device_memory", "must be known to plan on a GPU", "None",
                                  "pass device_memory='8GiB' or let the runtime measure free memory"))
    auto_prefetch = prefetch is None
    prefetch = 1 if prefetch is None else max(0, int(prefetch))
    space = _Space.of(m, n, k, dt, src, a_chunks=a_chunks, b_chunks=b_chunks, c_chunks=c_chunks, prefetch=prefetch,
                      on_gpu=device == "gpu", out_chunks=out_chunks)
    space = dataclasses.replace(
        # a k-panel reads only its part of a chunk along stored rows of uncompressed chunks, and
        # across columns too from local files (one read per row)
        space, osz=odt.itemsize if odt != dt else 0, partial=(reads[0] == "direct" or reads[0] == "ranges" and trans[0],
                        reads[1] == "direct" or reads[1] == "ranges" and not trans[1]),
        direct=(reads[0] == "direct" and reads[1] == "direct", direct_writes),
        c_chunks=space.c_chunks if len(reads) < 3 or reads[2] != "direct" else None,
        zarr_reads=(reads[0] != "direct", reads[1] != "direct"),
        read_reserve=read_reserve)
    # Chunk-wide panels first; narrower ones only when the budget leaves no other way, unless both
    # operands are local files read in part: then narrower panels at least as wide as BLAS's
    # k-blocks cost no extra reads and may allow larger tiles (fewer reads in all), so both compete
    # on cost (on object stores every panel is one more request per chunk, with its latency).
    local_parts = reads[0] == reads[1] == "direct"
    best = _search(space, workers=workers, memory=memory, device_memory=device_memory)
    if best is None or local_parts:
        widths = [w for w in space.sub_chunk_panels() if best is None or w >= BLAS_KC]
        found = [x for x in (best, _search(space, workers=workers, memory=memory, device_memory=device_memory,
                                           widths=widths) if widths else None) if x is not None]
        best = min(found, key=lambda x: x[0]) if found else None
    if best is None:
        raise _smallest_does_not_fit(space, workers=workers, memory=memory, device_memory=device_memory)
    if device == "cpu" and reads[0] == "direct" and not trans[0]:
        # Tiles of fewer rows than a chunk compete too, with chunk-wide panels: where chunk-row
        # tiles fit only with narrow panels, whole-row reads of fewer rows are faster (see
        # PARTIAL_READ_COST). Only once some plan fits: the smallest budget stays the one that
        # holds chunk-row tiles, below which a rechunk of the inputs beats any tiling.
        rows = _search(dataclasses.replace(space, sub_rows=True), workers=workers, memory=memory,
                       device_memory=device_memory)
        if rows is not None and rows[0] < best[0]:
            best = rows
    _, tm, tn, tk, host, dev, oc, read, rereads, cache, resident = best

    def ahead(depth: int, loaders: int) -> tuple[int, int] | None:
        """The chosen tiles' host and device bytes per task reading ``depth`` panels ahead with
        ``loaders`` threads, where both budgets hold them (the tiles, so the sums, stay the same)."""
        deeper = dataclasses.replace(space, prefetch=depth, loaders=loaders)
        h2, d2 = deeper.task_memory(tm, tn, tk, oc, read_chunks=deeper.read_chunks(tm, tn, tk),
                                    write_chunks=-(-tm // oc[0]) * -(-tn // oc[1]))
        on_device = not space.on_gpu or d2 * workers + cache <= (device_memory or 0)
        return (h2, d2) if h2 * workers <= memory and on_device else None

    if auto_prefetch and space.on_gpu:
        for depth in (3, 2):  # read further ahead, with as many loader threads, when the budgets allow
            fits = ahead(depth, depth)
            if fits is not None:
                prefetch, (host, dev) = depth, fits
                break
    feed_bound = device == "cpu" and _flops_per_byte(tm, tn, tk, space.src_isz) < FEED_BOUND_FLOPS_PER_BYTE
    loaders = 1
    if auto_prefetch and feed_bound and reads[0] != "direct" and (cores or os.cpu_count() or 1) >= 2:
        # One loader decoding a panel at a time bounds such a tile (a panel of one chunk is decoded
        # on the loader's own thread): a second loader decodes the next panel beside it, where the
        # budget holds its slots and chunk temporaries. The same tiles, so the same bits on every
        # scheduler (a cluster's single-core workers plan one loader). Measured on the 2-core
        # machine (A @ B, A 262144 x 512 in zstd chunks of 2048 rows, B 512 x 4, 128 MiB,
        # alternated): 1.34 -> 1.85 GB/s.
        fits = ahead(2, 2)
        if fits is not None:
            prefetch, host, loaders = 2, fits[0], 2
    c_read = m * n * odt.itemsize if space.with_c else 0
    # A narrow first panel, where panels read only their part of each chunk: compute starts after
    # reading an eighth of the first panel pair instead of all of it. Not for CPU tiles bound by their
    # reads: there the lead gains the first tile of a run a little, but turns every tile's whole-row
    # reads of A into two partial ones (PARTIAL_READ_COST); measured on the thin product of
    # benchmarks/feed.py (A 262144 x 512, B 512 x 4, 64 MiB, alternated in one process): 3.1 GB/s without the lead, 2.2 with it.
    k_lead = max(LEAD_MIN, tk // 8) if (local_parts and tk >= 4 * LEAD_MIN and k > tk // 8
                                        and not feed_bound) else 0
    return GemmPlan(
        m=m, n=n, k=k, dtype=dt.name, source_dtypes=(src[0].name, src[1].name), tm=tm, tn=tn, tk=tk,
        out_chunks=oc, workers=workers, blas_threads=_blas_threads(tm, tn, tk, src, cores, workers, device),
        prefetch=prefetch, device=device, memory=memory, device_memory=device_memory, flops=2 * m * n * k,
        bytes_read=read + c_read, bytes_written=m * n * odt.itemsize, peak_memory=host * workers, task_memory=host,
        device_peak=dev * workers + cache if space.on_gpu else None, with_c=space.with_c, panel_rereads=rereads,
        out_dtype=odt.name if odt != dt else None,
        k_lead=k_lead, cache_bytes=cache, resident=resident, loaders=loaders,
    )


def _blas_threads(tm: int, tn: int, tk: int, src: tuple, cores: int | None, workers: int, device: str) -> int:
    """BLAS threads of each task: the task's share of the cores, halved (at least one) for CPU tiles
    bound by their reads (:data:`FEED_BOUND_FLOPS_PER_BYTE`), whose reads need the cores more."""
    share = max(1, (cores or os.cpu_count() or 1) // workers)
    if device == "cpu" and _flops_per_byte(tm, tn, tk, (src[0].itemsize, src[1].itemsize)) < FEED_BOUND_FLOPS_PER_BYTE:
        return max(1, share // 2)
    return share


def _flops_per_byte(tm: int, tn: int, tk: int, isz: tuple[int, int]) -> float:
    """A tile's flops per byte of its panels read."""
    return 2 * tm * tn * tk / max(1, tm * tk * isz[0] + tk * tn * isz[1])


@dataclasses.dataclass(frozen=True)
class _Space:
    """The search space of one GEMM plan: sizes, chunk units of the tiles, what a task holds."""

    m: int
    n: int
    k: int
    isz: int
    src_isz: tuple[int, int]
    prefetch: int
    on_gpu: bool
    with_c: bool
    c_rows: int
    mu: int
    nu: int
    ku: int
    ku_a: int
    ku_b: int
    io_chunk: int
    out_chunks: tuple[int, int] | None
    loaders: int = 1
    dtype: str = "float64"
    #: Per operand: a k-panel narrower than a chunk reads only its part (k along stored rows of
    #: uncompressed chunks).
    partial: tuple[bool, bool] = (False, False)
    #: (inputs read, output written) straight from and to chunk files: no zarr temporaries.
    direct: tuple[bool, bool] = (False, False)
    #: Output itemsize when the output dtype differs from the compute dtype (else 0).
    osz: int = 0
    #: One chunk set per loader planned even for direct reads (see :func:`plan_gemm`).
    read_reserve: bool = False
    #: Tiles of fewer rows than ``op(A)``'s chunks may be planned (its rows are stored rows of local
    #: uncompressed chunks: one contiguous range of a chunk file per tile; see :func:`plan_gemm`).
    sub_rows: bool = False
    #: Bytes of one stored chunk of ``op(A)`` and of ``op(B)``, and whether each is read through zarr.
    chunk_bytes: tuple[int, int] = (0, 0)
    zarr_reads: tuple[bool, bool] = (True, True)
    #: ``C0``'s chunks where it is read through zarr (``None`` without ``C0`` or where its strips are
    #: read straight from its chunk files).
    c_chunks: tuple[int, int] | None = None

    @classmethod
    def of(cls, m: int, n: int, k: int, dt: np.dtype, src: tuple, *, a_chunks: tuple[int, int],
           b_chunks: tuple[int, int], c_chunks: tuple[int, int] | None, prefetch: int, on_gpu: bool,
           out_chunks: tuple[int, int] | None) -> _Space:
        src_isz = (src[0].itemsize, src[1].itemsize)
        mu, ku_a = max(1, a_chunks[0]), max(1, a_chunks[1])
        ku_b, nu = max(1, b_chunks[0]), max(1, b_chunks[1])
        # k-panels cover whole chunks of both operands when their common multiple is not too wide
        ku = ku_a * ku_b // math.gcd(ku_a, ku_b)
        if ku > max(ku_a, ku_b) * 4 or ku > k:
            ku = max(ku_a, ku_b)
        ku = min(ku, max(1, k))
        io_chunk = max(a_chunks[0] * a_chunks[1] * src_isz[0], b_chunks[0] * b_chunks[1] * src_isz[1])
        return cls(m=m, n=n, k=k, isz=dt.itemsize, src_isz=src_isz, prefetch=prefetch, on_gpu=on_gpu,
                   with_c=c_chunks is not None, c_rows=min(m, c_chunks[0]) if c_chunks is not None else 0, mu=mu,
                   nu=nu, ku=ku, ku_a=ku_a, ku_b=ku_b, io_chunk=io_chunk, out_chunks=out_chunks, dtype=dt.name,
                   c_chunks=tuple(c_chunks) if c_chunks is not None else None,
                   chunk_bytes=(a_chunks[0] * a_chunks[1] * src_isz[0], b_chunks[0] * b_chunks[1] * src_isz[1]))

    def c_io(self, rows: int, tn: int) -> int:
        """zarr's temporaries of the ``C0`` chunks one strip of ``rows x tn`` touches (:func:`chunk_io`: a
        strip may straddle chunks), in the output's dtype."""
        if self.c_chunks is None:
            return 0
        return chunk_io(rows, tn, (*self.c_chunks, self.osz or self.isz), (self.m, self.n))

    def row_candidates(self) -> list[int]:
        """Tile rows to try: multiples of the chunk rows (:func:`_candidates`), and with
        :attr:`sub_rows` halvings of them down to :data:`SUB_CHUNK_ROWS_MIN`."""
        m = max(self.m, 1)
        rows = _candidates(m, self.mu)
        if self.sub_rows:
            t = min(self.mu, m) // 2
            while t >= SUB_CHUNK_ROWS_MIN:
                rows.append(t)
                t //= 2
        return sorted(set(rows))

    def out_chunks_for(self, tm: int, tn: int) -> tuple[int, int]:
        if self.out_chunks is not None:
            return self.out_chunks
        # Prefer the input chunking (what later operations expect) when it tiles the output tile.
        r = self.mu if tm % self.mu == 0 or tm == self.m else tm
        c = self.nu if tn % self.nu == 0 or tn == self.n else tn
        return (max(1, min(r, self.m)), max(1, min(c, self.n)))

    def sub_chunk_panels(self) -> list[int]:
        return _sub_chunk_panels(self.ku, self.ku_a, self.ku_b, max(1, self.k))

    def task_memory(self, tm: int, tn: int, tk: int, oc: tuple[int, int], read_chunks: int,
                    write_chunks: int) -> tuple[int, int]:
        edges = self.m % oc[0] or self.n % oc[1]  # padded edge chunks need a buffer on direct writes
        return _task_memory(tm, tn, tk, isz=self.isz, src_isz=self.src_isz, prefetch=self.prefetch,
                            with_c=self.with_c, c_rows=self.c_rows, io_chunk_bytes=self.io_chunk,
                            c_io=self.c_io(oc[0], tn), read_io=self.read_io(tm, tn, tk),
                            out_chunk_bytes=oc[0] * oc[1] * (self.osz or self.isz) if edges or not self.direct[1] else 0,
                            on_gpu=self.on_gpu, read_chunks=read_chunks, write_chunks=write_chunks, out_rows=oc[0],
                            loaders=self.loaders, direct=self.direct, osz=self.osz, read_reserve=self.read_reserve)

    def read_chunks(self, tm: int, tn: int, tk: int) -> int:
        """Chunks one panel read touches (the larger of the two operands; panels may cut chunks)."""
        return max(self._touched(tm, tn, tk))

    def _touched(self, tm: int, tn: int, tk: int) -> tuple[int, int]:
        ta = _panel_reads(tk, self.ku_a, self.k, self.partial[0])[0]
        tb = _panel_reads(tk, self.ku_b, self.k, self.partial[1])[0]
        return -(-tm // self.mu) * ta, tb * -(-tn // self.nu)

    def read_io(self, tm: int, tn: int, tk: int) -> int:
        """zarr's temporaries (:func:`read_temporaries`) of one panel read: the larger of the
        operands read through zarr, each at its own chunk size (an operand read straight from its chunk
        files holds none: a user's compressed ``A`` beside a work store had been counted at the larger
        of the two chunk sizes)."""
        return max((read_temporaries(t, b) for t, b, z in zip(self._touched(tm, tn, tk), self.chunk_bytes,
                                                               self.zarr_reads) if z), default=0)


def _search(sp: _Space, *, workers: int, memory: int, device_memory: int | None,
            widths: list[int] | None = None) -> tuple | None:
    """The cheapest tiling that fits: fewest bytes read plus task overheads (and accumulator
    traffic for panels narrower than BLAS's own k-blocks), then widest panels.

    ``widths`` are the k-panel widths to try, widest first (default: chunk-wide panels). Returns
    ``(key, tm, tn, tk, host, device, out_chunks, bytes_read, rereads, cache_bytes, resident)``, the
    smallest ``key`` best. On a GPU the device budget left beside the tasks is a cache of panels
    (:func:`cached_reads`): its expected reads count, and so does the link traffic it saves (a panel
    reused from the device crosses the host link once: :func:`~blocklin.plan.gpu.link_shortfall`), so
    that tilings whose runs keep ``op(A)`` and ``op(B)`` on the device are preferred where they fit.
    """
    m, n, k = sp.m, sp.n, sp.k
    best = None
    tk_target = min(max(1, k), max(sp.ku, (TARGET_TK // sp.ku) * sp.ku))
    tk_options = widths if widths is not None else sorted({t for t in (tk_target, sp.ku) if t >= 1}, reverse=True)
    m_, n_ = max(m, 1), max(n, 1)
    for tm in sp.row_candidates():
        for tn in _candidates(n_, sp.nu):
            oc = sp.out_chunks_for(tm, tn)
            if tm % oc[0] and tm != m_ or tn % oc[1] and tn != n_:
                continue
            for tk in tk_options:
                _, ra_max, ra = _panel_reads(tk, sp.ku_a, k, sp.partial[0])
                _, rb_max, rb = _panel_reads(tk, sp.ku_b, k, sp.partial[1])
                host, dev = sp.task_memory(tm, tn, tk, oc, read_chunks=sp.read_chunks(tm, tn, tk),
                                           write_chunks=-(-tm // oc[0]) * -(-tn // oc[1]))
                if host * workers > memory or (sp.on_gpu and dev * workers > device_memory):
                    continue
                gm, gn = math.ceil(m_ / tm), math.ceil(n_ / tn)
                # Whole chunks are read per panel: panels that cut chunks re-read them.
                read = round((m * k * sp.src_isz[0]) * gn * ra + (k * n * sp.src_isz[1]) * gm * rb)
                tasks = gm * gn
                idle = max(0, workers - tasks)  # concurrent slots with no tile to run
                # where the reads bound the tiles, their rate decides: parts of rows read slower
                slow = sum(nbytes * (PARTIAL_READ_COST * max(1, unit / tk) - 1) for nbytes, part, unit in (
                    (m * k * sp.src_isz[0] * gn, sp.partial[0], sp.ku_a), (k * n * sp.src_isz[1] * gm, sp.partial[1], sp.ku_b))
                    if part and sp.direct[0] and tk % unit and tk < k) \
                    if not sp.on_gpu and _flops_per_byte(tm, tn, tk, sp.src_isz) < FEED_BOUND_FLOPS_PER_BYTE else 0
                cost = (read + round(slow) + tasks * (TASK_OVERHEAD_BYTES + math.ceil(k / tk) * STEP_OVERHEAD_BYTES)
                        + idle * (m * n * k * sp.isz) // max(1, tasks * 64))
                if tk < min(BLAS_KC, k):  # BLAS re-reads and re-writes the accumulator once per panel
                    cost += m * n * sp.isz * math.ceil(k / tk)
                # On a GPU, tiles below the compute/transfer crossover leave it waiting for the host
                # link whatever the overlap: the largest tiles towards it first, then the cheapest.
                below = round(shortfall(tm, tn, sp.dtype), 3) if sp.on_gpu else 0.0
                cache, resident = 0, False
                if sp.on_gpu:
                    cached, cache, resident = cached_reads(sp, tm, tn, tk, workers=workers,
                                                           cache=device_memory - dev * workers, rereads=(ra, rb))
                    if cache:  # fewer panels cross the link: the whole product's intensity
                        cost -= read - cached
                        read = cached
                        uploaded = read * sp.isz / ((sp.src_isz[0] + sp.src_isz[1]) / 2)
                        below = min(below, round(link_shortfall(2 * m * n * k, uploaded, sp.dtype), 3))
                # a read-bound CPU tile whose panel of op(A) leaves the cache: any that fits comes first
                spills = not sp.on_gpu and tm * tk * sp.src_isz[0] > FEED_PANEL_BYTES and \
                    _flops_per_byte(tm, tn, tk, sp.src_isz) < FEED_BOUND_FLOPS_PER_BYTE
                key = (below, spills, cost, -tk, -(tm * tn))
                if best is None or key < best[0]:
                    best = (key, tm, tn, tk, host, dev, oc, read, max(ra_max, rb_max), cache, resident)
                break  # the widest tk that fits
    return best


def cached_reads(sp: _Space, tm: int, tn: int, tk: int, *, workers: int, cache: int,
                 rereads: tuple[float, float] = (1.0, 1.0)) -> tuple[int, int, bool]:
    """Bytes read from storage with a device cache of ``cache`` bytes (least recently used blocks
    evicted first, as BLASX's tile cache): ``(bytes read, cache bytes planned, resident)``.

    The tiles run in ``workers`` runs of consecutive row-major tiles (:func:`blocklin.runtime.tiles.gemm_runs`),
    each keeping its own panels (a run's share of the cache: ``cache / runs``). A run that holds every
    panel its tiles need reads each once (``resident`` when every run does). Otherwise, by the
    stack distance of least-recently-used caching: a run's tiles of one row reuse ``op(A)``'s row
    panels when its share holds them beside one tile column of ``op(B)`` (and the panels in flight),
    and its rows reuse ``op(B)``'s panels when the share holds all the columns it touches beside two
    row blocks of ``op(A)``; else every tile reads its own. Blocks are counted as CuPy's pool
    allocates them (:func:`~blocklin.plan.gpu.device_nbytes`, bounded by 512 bytes a panel). Zero cache
    bytes where no panel would be reused.
    """
    m, n, k = max(sp.m, 1), max(sp.n, 1), sp.k
    gm, gn = math.ceil(m / tm), math.ceil(n / tn)
    tiles = gm * gn
    runs = max(1, min(tiles, workers))
    kp = math.ceil(k / tk) + 1 if k else 0  # a split first panel (k_lead) at most one more
    sa, sb = tm * k * sp.isz + kp * DEVICE_UNIT, k * tn * sp.isz + kp * DEVICE_UNIT  # one row block, one column
    flight = (sp.prefetch + 1) * (tm * tk + tk * tn) * sp.isz
    # bytes read per row of op(A) and per column of op(B)
    a_row, b_col = k * sp.src_isz[0] * rereads[0], k * sp.src_isz[1] * rereads[1]

    def width(j0: int, j1: int) -> int:  # columns of tile columns j0..j1
        return min(n, (j1 + 1) * tn) - j0 * tn

    streamed = m * a_row * gn + n * b_col * gm
    if cache <= 0 or tiles < 2 or not k:
        return round(streamed), 0, False
    need, whole, reused = 0, 0.0, 0.0
    share = cache / runs
    for r in range(runs):
        t0, t1 = tiles * r // runs, tiles * (r + 1) // runs
        count, rows = t1 - t0, (t1 - 1) // gn - t0 // gn + 1
        a_once = a_each = b_each = 0.0
        for i in range(t0 // gn, (t1 - 1) // gn + 1):  # the run's tiles in tile row i: columns j0..j1
            j0, j1 = max(t0, i * gn) - i * gn, min(t1, (i + 1) * gn) - 1 - i * gn
            h = min(m, (i + 1) * tm) - i * tm
            a_once += h * a_row
            a_each += (j1 - j0 + 1) * h * a_row
            b_each += width(j0, j1) * b_col
        j0, j1 = t0 % gn, (t1 - 1) % gn
        cols = gn if count >= gn else count
        b_once = n * b_col if count >= gn else (width(j0, j1) if j0 <= j1 else width(j0, gn - 1) + width(0, j1)) * b_col
        need += rows * sa + cols * sb
        whole += a_once + b_once
        reused += (a_once if count > 1 and share >= sa + sb + flight else a_each) + \
            (b_once if rows > 1 and share >= cols * sb + 2 * sa + flight else b_each)
    if need <= cache:
        return round(whole), need, True
    if reused >= streamed:
        return round(streamed), 0, False
    return round(reused), cache, False


def _smallest_does_not_fit(sp: _Space, *, workers: int, memory: int, device_memory: int | None) -> BudgetError:
    """The error naming the smallest budget that plans: the least a task needs over every tiling the
    search tries, counted as the search counts it (chunks each panel touches, output chunks written),
    so a budget of ``minimum`` finds a plan."""
    m_, n_ = max(sp.m, 1), max(sp.n, 1)
    widths = sorted({min(max(1, sp.k), sp.ku), *sp.sub_chunk_panels()})
    tilings = []
    for tm in sp.row_candidates():
        for tn in _candidates(n_, sp.nu):
            oc = sp.out_chunks_for(tm, tn)
            if tm % oc[0] and tm != m_ or tn % oc[1] and tn != n_:
                continue
            for tk in widths:
                host, dev = sp.task_memory(tm, tn, tk, oc, read_chunks=sp.read_chunks(tm, tn, tk),
                                           write_chunks=-(-tm // oc[0]) * -(-tn // oc[1]))
                tilings.append((host * workers, dev * workers, tm, tn, tk))
    host_fits = [t for t in tilings if t[0] <= memory] if sp.on_gpu else []
    if host_fits:  # the host budget holds some tiling: the device budget is what is short
        need, _, tm, tn, tk = min(((t[1], t[0], *t[2:]) for t in host_fits))
        which = "device_memory"
    else:
        need, _, tm, tn, tk = min(tilings)
        which = "memory"
    return BudgetError(explain(
        which, "must hold the smallest tiles of every concurrent task "
        f"({workers} task(s) of {tm} x {tn} with {tk}-wide panels)",
        f"{format_size(memory if which == 'memory' else device_memory)}",
        f"raise it to at least {format_size(need)} ({which}='{size_hint(need)}'), "
        "use fewer workers, or rechunk the inputs smaller (blocklin convert --chunks)"), minimum=need)
