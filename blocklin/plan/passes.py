"""Planning a pass over the rows of one or more tall operands.

A row-pass kernel declares the memory it allocates (:class:`PassMemory`, written next to the
kernel's code); :func:`plan_pass` turns that declaration, the streamed rows and the budget into a
:class:`RowPassPlan`. :func:`plan_row_pass` is the strip-height arithmetic underneath.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable


from blocklin.config import format_size, size_hint
from blocklin.errors import BudgetError, explain
from blocklin._memory import IO_CONCURRENCY
from blocklin.plan.chunks import Pieces, read_temporaries, round_down_multiple


@dataclasses.dataclass(frozen=True)
class RowPassPlan:
    """Row strips of ``strip`` rows, grouped into ``len(groups)`` tasks of consecutive strips."""

    m: int
    strip: int
    groups: tuple[tuple[int, int], ...]
    workers: int
    blas_threads: int
    prefetch: int
    row_bytes: int
    fixed_bytes: int
    peak_memory: int
    memory: int
    bytes_read: int
    #: Chunk height of the streamed operands, and the most reads of one chunk in the pass: 1 when
    #: strips hold whole chunks or read only their rows of each chunk; more when strips narrower
    #: than a chunk read it whole each time (compressed chunks).
    chunk_rows: int = 0
    rereads: int = 1
    #: Whether each task keeps the decoded chunk rows its strips share (one band of ``chunk_rows``
    #: rows of every operand read whole, ``cache_bytes`` in all, counted in ``fixed_bytes``): strips
    #: narrower than a compressed chunk then read it once instead of ``rereads`` times.
    cached: bool = False
    cache_bytes: int = 0
    #: Loader threads of a task (reads in flight beside the compute), at most ``prefetch``.
    loaders: int = 1
    #: On a GPU: bytes of the device operand cache that keep the pass's strips for the job's later
    #: passes (0: streamed; :func:`blocklin.runtime.passes.resident_strips`).
    resident_bytes: int = 0
    #: Chunks a task decodes at once for a read whose chunks are decoded whole (0: as many as the
    #: reader's concurrency allows); fewer where the budget holds fewer chunks' temporaries than one
    #: strip row of chunks has (:func:`plan_pass`).
    lanes: int = 0
    #: Bytes of the budget set aside for the large pages of strips mapped from the page cache
    #: (:func:`blocklin.storage.mapped.reservation`, counted in ``peak_memory``; the strips are sized
    #: from the rest): 0 where the plan sets nothing aside, and the pass maps only where the budget's
    #: allowance holds them (:func:`blocklin.storage.mapped.within_budget`).
    mapping_bytes: int = 0

    def strips(self, group: int) -> Pieces:
        """The strips of one task's group of rows, computed on access (a group may hold millions)."""
        r0, r1 = self.groups[group]
        return Pieces(r1 - r0, self.strip, offset=r0)

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        if not d["resident_bytes"]:  # streamed (every CPU pass): as before the field
            del d["resident_bytes"]
        if not d["lanes"]:  # decoding as many chunks at once as the reader does: as before the field
            del d["lanes"]
        if not d["mapping_bytes"]:  # nothing set aside for mapped strips: as before the field
            del d["mapping_bytes"]
        return d

    @classmethod
    def from_dict(cls, d: dict) -> RowPassPlan:
        """The plan :meth:`to_dict` gave ``d`` of (a plan kept in another plan's dict, its groups lists)."""
        return cls(**{**d, "groups": tuple(tuple(g) for g in d["groups"])})

    def explain(self) -> str:
        text = (f"row pass: {self.m} rows in strips of {self.strip} ({len(self.groups)} task(s), "
                f"{self.workers} concurrent), read {format_size(self.bytes_read)}, "
                f"peak {format_size(self.peak_memory)} of {format_size(self.memory)}")
        if self.rereads > 1:
            text += (f"; strips of {self.strip} rows are narrower than the {self.chunk_rows}-row chunks, which "
                     f"are read whole {self.rereads} times per pass")
        elif self.cached:
            text += (f"; strips of {self.strip} rows share each {self.chunk_rows}-row chunk band, decoded once "
                     f"and kept ({format_size(self.cache_bytes)} per task)")
        if self.lanes:
            text += f"; {self.lanes} chunk(s) decoded at a time"
        if self.prefetch > 1 or self.loaders > 1:
            text += f"; {self.prefetch} strip(s) read ahead by {self.loaders} loader(s)"
        if self.mapping_bytes:
            text += (f"; {format_size(self.mapping_bytes)} kept for the large pages of strips mapped from the "
                     "page cache")
        if self.resident_bytes:
            text += (f"; strips kept on the device ({format_size(self.resident_bytes)}) for the job's later "
                     "passes")
        return text


#: Streamed bytes per task of a row pass (the canonical split: see :func:`canonical_tasks`).
TASK_BYTES = 32 << 20
#: Most tasks one row pass is split into.
MAX_TASKS = 64
#: Deepest read-ahead of a row pass: strips read ahead when the budget holds them beside strips
#: as tall as the plan would cut anyway (the budget never shrinks strips for read-ahead).
MAX_PREFETCH = 3
#: A kept chunk band saves ``rereads - 1`` decodes of each chunk but costs the strips the band's
#: memory takes from the strip height. Measured (a 40000 x 200 zstd array in 10000-row chunks, rsvd
#: at 64 MiB on the shared 2-core machine): a strip costs about half a chunk decode, so a band is kept
#: only when its strips per chunk are at most ``3 rereads - 2`` (keeping it with 11 strips per chunk
#: instead of 2 strips each decoding the chunk took 1.8-2.4x as long, for half the bytes read).
CACHE_STRIPS_PER_REREAD = 3
#: Loader threads of a task whose reads need no zarr temporaries (direct or range reads): two
#: reads in flight keep up with a fast device where one copy thread does not.
MAX_LOADERS = 2


#: Concurrent tasks of a CPU row pass when the ``workers`` setting is not given, each with
#: ``cores // PASS_WORKERS`` BLAS threads. A row pass's products are skinny (a strip times a
#: ``n x b`` block, ``b`` a few dozen): split over its rows by BLAS they synchronize the BLAS threads
#: every few milliseconds, and the threads spin beside the loader that reads the next strip.
#: Measured on the shared 2-core machine (``benchmarks/row_pass.py``: a Lanczos pass ``A^T (A Q)``,
#: 100000 x 500 float64 in the page cache, ``Q`` 500 x 30, 96 MiB): 0.21 s per pass against 0.23 s
#: for one task on two BLAS threads with the machine nearly quiet (load 2.8), 0.25-0.28 s against
#: 2.4-2.5 s beside other jobs (load 3.8-6.3). A constant, not the core count:
#: the strip height (and so every floating-point sum) follows from it, and must not depend on the
#: machine or the scheduler.
PASS_WORKERS = 2
#: Smallest strip (bytes of streamed rows) worth splitting the budget between :data:`PASS_WORKERS`
#: tasks for; below it a pass keeps one task (with the BLAS threads of one of them).
PASS_WORKERS_MIN_STRIP = 1 << 20
#: Smallest strip (bytes of streamed rows) of a pass with one task that keeps every BLAS thread.
PASS_WORKERS_ONE_TASK_STRIP = 16 << 20
#: Strips read ahead by each of :data:`PASS_WORKERS` tasks (by one loader thread): the other task's
#: products already overlap a task's reads. Measured as above (load average 3.5, 8 passes each,
#: alternated): 0.32 s per pass (median) reading one strip ahead with one loader, 0.36 s two ahead,
#: 0.44 s three ahead with two loaders (the read-ahead a budget this size gives one task).
PASS_WORKERS_PREFETCH = 1


def pass_workers(plan: Callable[..., RowPassPlan], device: str) -> RowPassPlan:
    """The plan of a pass whose concurrency is not set: ``plan(workers, prefetch)`` (``prefetch``
    ``None``: from the budget) with :data:`PASS_WORKERS` tasks at once on the CPU, each reading
    :data:`PASS_WORKERS_PREFETCH` strip ahead, where the budget holds their strips (each at least
    :data:`PASS_WORKERS_MIN_STRIP` and reading no chunk more often than one task would), else one.

    One task on the CPU gets the BLAS threads of one of :data:`PASS_WORKERS` tasks. A GPU pass keeps
    one task with every core (its products are not split by BLAS threads, and its strips share the
    device budget).
    """
    one = plan(1, None)
    if device == "gpu" or PASS_WORKERS <= 1:
        return one
    # One task keeps the BLAS threads of one of PASS_WORKERS tasks: its strips are small (one task's
    # rows, or strips too short to split) and so are its products; measured under load on the 2-core
    # machine, G += Y_i^T Y_i on 2048 x 40 strips of a 100000 x 40 block took 0.5 s on 2 BLAS threads.
    single = dataclasses.replace(one, blas_threads=max(1, one.blas_threads // PASS_WORKERS))
    if len(one.groups) < 2:
        # a lone strip (the pass reads nothing while it computes) of PASS_WORKERS_ONE_TASK_STRIP or
        # more keeps every BLAS thread: its products are large enough to split (the update's new rows
        # of a 500-column Gram, 20000 x 500 float32: the strip's float64 deviations and SYRK 0.170 s on
        # one thread, 0.148 s on two, medians of 8 under a load of 2.5 on the 2-core machine). A task
        # of several strips keeps the BLAS threads of one task, as below: its loader reads beside them
        lone = one.strip >= one.m
        return one if lone and one.strip * one.row_bytes >= PASS_WORKERS_ONE_TASK_STRIP else single
    try:
        more = plan(PASS_WORKERS, PASS_WORKERS_PREFETCH)
    except BudgetError:
        return single
    big = more.strip * more.row_bytes >= PASS_WORKERS_MIN_STRIP or more.strip >= one.strip
    return more if big and more.rereads <= one.rereads and more.cached == one.cached else single


def canonical_tasks(m: int, row_bytes: int) -> int:
    """Tasks a row pass over ``m`` rows is split into: one per :data:`TASK_BYTES` streamed, at most
    :data:`MAX_TASKS`.

    A function of the data only, never of the scheduler or its workers: every task accumulates its
    strips in order and the task states are summed in row order, so the task boundaries (and the
    strip heights) fix the floating-point sums. Deriving them from the cluster's thread count made a
    float32 SVD on a 2-worker ``LocalCluster`` differ from the threaded run in the last bits.
    """
    return max(1, min(MAX_TASKS, -(-m * row_bytes // TASK_BYTES)))


def plan_row_pass(m: int, row_bytes: int, *, chunk_rows: int, memory: int, fixed_bytes: int = 0,
                  strip_extra_row_bytes: int = 0, workers: int = 1, cores: int = 1, prefetch: int | None = 1,
                  max_strip: int | None = None, min_tasks: int | None = None, reserve: int = 0,
                  partial_rows: bool = True, cache_bytes: int = 0, loaders: int = 1) -> RowPassPlan:
    """Choose strip height so that every concurrent task fits ``memory``.

    Parameters
    ----------
    m : int
        Rows of the operands.
    row_bytes : int
        Bytes of one row of all streamed operands together (stored dtypes).
    chunk_rows : int
        Chunk height of the operands; strips are multiples of it where the budget allows.
    memory : int
        Host budget for all tasks.
    fixed_bytes : int
        Per-task memory independent of the strip (accumulators, broadcast parameters).
    strip_extra_row_bytes : int
        Per-row memory of a strip's temporaries (products, outputs being written).
    workers, cores : int
        Concurrency and the cores to share.
    prefetch : int or None
        Strips read ahead; ``None``: from the budget, one, or up to :data:`MAX_PREFETCH` where the
        budget holds the extra strips beside strips of the height one read-ahead gives.
    max_strip : int, optional
        Upper bound on strip height (smaller strips overlap better).
    min_tasks : int, optional
        Split the rows into this many tasks (default :func:`canonical_tasks`, which depends on the data
        only, so that the sums, and so the results, are the same bits on every scheduler).
    reserve : int
        Memory the caller holds outside ``memory`` (an in-core problem): added to the budget and
        to the minimum a refusal states, so that the stated minimum is the setting that works.
    partial_rows : bool
        Whether a strip narrower than a chunk reads only its rows of it (uncompressed C-order
        chunks); otherwise each such strip reads the chunk whole, strips are cut to divide the chunk
        height (no strip straddles two chunks) and the re-reads are counted in ``bytes_read``.
    cache_bytes : int
        Bytes of one chunk band (``chunk_rows`` rows) of the operands read whole. Where strips must be
        narrower than a chunk and the budget holds this band beside them, each task keeps the band
        decoded for the strips that share it (``cached``): every chunk is read once, and the task
        groups are cut on chunk boundaries so that no two tasks read the same chunk.
    loaders : int
        Loader threads wanted (used up to the read-ahead depth; one when a band is cached).
    """
    workers = max(1, workers)
    auto_prefetch = prefetch is None
    prefetch = 1 if auto_prefetch else max(0, int(prefetch))
    per_task = memory // workers - fixed_bytes
    per_row = row_bytes * (prefetch + 1) + strip_extra_row_bytes
    if per_task < per_row:
        # the whole budget: what the pass needs plus what its caller holds outside it (``reserve``)
        need = (fixed_bytes + per_row) * workers + reserve
        raise BudgetError(explain("memory", "must hold each task's fixed buffers and one strip row"
                                  + (f" beside {format_size(reserve)} of in-core work" if reserve else ""),
                                  format_size(memory + reserve), f"raise it to at least {format_size(need)} "
                                  f"(memory='{size_hint(need)}') or use fewer workers"), minimum=need)
    strip = min(max(1, m), per_task // per_row)
    if min_tasks is None:
        min_tasks = canonical_tasks(m, row_bytes)
    if max_strip:
        strip = min(strip, max_strip)
    if min_tasks and min_tasks > 1 and m:  # enough strips for every task that can run at once
        strip = min(strip, max(chunk_rows, math.ceil(m / min_tasks)))
    rereads, cached = 1, False
    if strip >= chunk_rows:
        strip = round_down_multiple(strip, chunk_rows)
    elif not partial_rows and m > strip:
        room = (per_task - cache_bytes) // per_row if cache_bytes else 0
        uncached = _dividing_strip(chunk_rows, strip)
        rereads = -(-chunk_rows // uncached)
        kept = _dividing_strip(chunk_rows, min(strip, room)) if room >= 1 else 0
        if kept and -(-chunk_rows // kept) <= CACHE_STRIPS_PER_REREAD * rereads - 2:
            # keep the band decoded for its strips: each chunk read once, in more (shorter) strips
            cached, rereads, strip = True, 1, kept
            fixed_bytes += cache_bytes
            per_task -= cache_bytes
        else:
            strip = uncached
    strip = max(1, strip)
    if auto_prefetch:  # deeper read-ahead only where the budget holds it beside strips this tall
        while prefetch < MAX_PREFETCH and per_task >= (row_bytes * (prefetch + 2) + strip_extra_row_bytes) * strip:
            prefetch += 1
        per_row = row_bytes * (prefetch + 1) + strip_extra_row_bytes
    n_strips = math.ceil(m / strip) if m else 0
    tasks = max(1, min(n_strips, min_tasks))
    per_group = math.ceil(n_strips / tasks) if n_strips else 1
    if cached and chunk_rows % strip == 0:  # groups of whole bands: no chunk is decoded by two tasks
        band = chunk_rows // strip
        per_group = -(-per_group // band) * band
    groups = tuple((s * strip * per_group, min(m, (s + 1) * strip * per_group)) for s in range(tasks)
                   if s * strip * per_group < m) or ((0, m),)
    peak = workers * (fixed_bytes + per_row * strip)
    return RowPassPlan(m=m, strip=strip, groups=groups, workers=workers, blas_threads=max(1, cores // workers),
                       prefetch=prefetch, row_bytes=row_bytes, fixed_bytes=fixed_bytes, peak_memory=peak,
                       memory=memory, bytes_read=m * row_bytes * rereads, chunk_rows=chunk_rows, rereads=rereads,
                       cached=cached, cache_bytes=cache_bytes if cached else 0,
                       loaders=1 if cached or prefetch < 1 else max(1, min(loaders, prefetch)))


def output_chunk_rows(plan: RowPassPlan, rows: int) -> int:
    """Chunk height of a tall output a pass writes a row at a time: the strip times the most strips (at
    most ``rows`` rows in all) that divide every task's share, so that no chunk is written by two tasks
    and a kernel gathers its strips' rows into whole chunks (few chunk files: each one a file to create,
    and a folder per chunk row)."""
    strip = plan.strip
    j_max = max(1, rows // strip)
    if len(plan.groups) > 1:
        per_group = (plan.groups[0][1] - plan.groups[0][0]) // strip
        j = max(d for d in range(1, min(j_max, per_group) + 1) if per_group % d == 0)
    else:
        j = min(j_max, -(-plan.m // strip))
    return strip * j


def _dividing_strip(chunk_rows: int, limit: int) -> int:
    """The tallest strip of at most ``limit`` rows that divides ``chunk_rows`` (no strip then straddles
    two chunks), looking at most at twice as many strips per chunk as ``limit`` allows; else the
    tallest of equal strips per chunk."""
    d0 = -(-chunk_rows // max(1, limit))
    for d in range(d0, 2 * d0 + 1):
        if chunk_rows % d == 0:
            return chunk_rows // d
    return max(1, chunk_rows // d0)


@dataclasses.dataclass(frozen=True)
class PassMemory:
    """The memory one task of a row-pass kernel allocates, declared next to the kernel.

    Attributes
    ----------
    fixed : int
        Bytes per task independent of the strip height (accumulators, broadcast operands and their
        device copies).
    per_row : int
        Bytes per strip row beyond the streamed rows themselves (products, blocks being written,
        cast copies); the streamed rows are counted by the planner (``prefetch + 1`` slots).
    chunk_temporaries : bool
        Count zarr's chunk temporaries (a raw and a decoded copy of each of up to
        :data:`IO_CONCURRENCY` chunks in flight, as measured for GEMM).
    max_strip_bytes : int, optional
        Cap strips at this many bytes of streamed rows (bigger strips only cost memory), but never
        below one chunk or ``strip_floor`` rows.
    strip_floor : int
        Rows a strip may always reach whatever ``max_strip_bytes`` says.
    min_rows : int
        Rows a strip must be able to hold for the pass to be worth running (amortizing per-strip
        work); a smaller budget is refused with :class:`~blocklin.errors.BudgetError`.
    write_row_bytes : int, optional
        Bytes per strip row of the tall outputs the kernel writes through zarr (0: it writes none).
        Those outputs are chunked by the strip, so zarr's temporaries for them (counted as three
        copies of each written row) grow with the strip, not with the input's chunks. ``None``:
        not declared, and a pass whose reads need no zarr temporaries still keeps room for three
        copies of one input chunk for its writes.
    """

    fixed: int = 0
    per_row: int = 0
    chunk_temporaries: bool = False
    max_strip_bytes: int | None = None
    strip_floor: int = 0
    min_rows: int = 1
    write_row_bytes: int | None = None


def plan_pass(mem: PassMemory, m: int, row_bytes: int, *, chunk_rows: int, memory: int, reserve: int = 0,
              workers: int = 1, cores: int = 1, chunk_bytes: int | None = None, chunks_across: int = 1,
              max_strip: int | None = None, min_tasks: int | None = None, partial_rows: bool = False,
              direct: bool = False, cache_bytes: int = 0, loaders: int = 1,
              prefetch: int | None = None, decoded: tuple[int, int, int] | None = None,
              decoded_width: int = 0, mapped: bool = False) -> RowPassPlan:
    """Plan a row pass of a kernel whose memory is ``mem``.

    Parameters
    ----------
    mem : PassMemory
        The kernel's declaration.
    m, row_bytes : int
        Rows streamed and bytes of one row of all streamed operands together (stored dtypes).
    chunk_rows : int
        Chunk height of the (first) streamed operand.
    memory : int
        Host budget of the operation.
    reserve : int
        Part of ``memory`` held outside the pass (an in-core problem); the pass gets the rest.
    workers, cores : int
        Concurrent tasks and the cores they share.
    chunk_bytes, chunks_across : int, optional
        Stored chunk size (default ``chunk_rows`` rows) and chunks one strip row crosses; they size
        the zarr chunk temporaries. A strip that spans fewer chunks than zarr's concurrency has
        only those in flight.
    max_strip : int, optional
        A caller's cap on the strip height (rows), for example to keep strips on output chunks.
    min_tasks : int, optional
        Split the rows into at least this many tasks.
    partial_rows : bool
        Whether strips narrower than a chunk read only their rows of it (see :func:`plan_row_pass`).
    direct : bool
        Whether every operand is read straight from its local chunk files into the strip slots
        (:mod:`blocklin.storage.rawchunks`): no zarr chunk temporaries, no buffer.
    cache_bytes : int
        One chunk band of the operands read whole (see :func:`plan_row_pass`); 0: never cache.
    loaders : int
        Loader threads for reads without zarr temporaries (through zarr one loader: zarr already
        keeps several chunks in flight, each with its temporaries).

    prefetch : int, optional
        Strips read ahead per task; default: from the budget (:func:`plan_row_pass` with ``prefetch=None``).
    decoded, decoded_width : optional
        Chunks (rows, columns, itemsize, in the streamed orientation) of a streamed operand that reads
        decode whole, and its width: the temporaries of a strip's read
        (:func:`blocklin.plan.chunks.chunk_io`) are counted whether or not the kernel declares
        ``chunk_temporaries``; where one strip row of chunks does not fit, the plan decodes fewer at a
        time (``lanes``), and a budget below one chunk's temporaries is refused with rechunking as the fix.
    mapped : bool
        Whether the pass may map its strips from the page cache (:mod:`blocklin.storage.mapped`): the plan
        then sets :func:`~blocklin.storage.mapped.reservation` aside for their large pages
        (``mapping_bytes``) and sizes the strips from the rest, where that is at most a
        :data:`~blocklin.storage.mapped.RESERVE_SHARE`-th of the budget and a plan fits the rest; else it
        sets nothing aside. Decided from the kernel, the operands and the budget only, never from
        whether the page cache holds the input in large pages, so that the strips (and the bits) do not
        depend on it.
    """
    from blocklin.storage.mapped import reservation, worth_reserving

    budget = memory - reserve
    workers = max(1, workers)
    if mapped and worth_reserving(budget, workers):
        kept = reservation(workers)
        try:
            plan = plan_pass(mem, m, row_bytes, chunk_rows=chunk_rows, memory=memory - kept, reserve=reserve,
                             workers=workers, cores=cores, chunk_bytes=chunk_bytes, chunks_across=chunks_across,
                             max_strip=max_strip, min_tasks=min_tasks, partial_rows=partial_rows, direct=direct,
                             cache_bytes=cache_bytes, loaders=loaders, prefetch=prefetch, decoded=decoded,
                             decoded_width=decoded_width)
        except BudgetError:  # the rest holds no plan: copied strips, from the whole budget
            pass
        else:
            return dataclasses.replace(plan, memory=plan.memory + kept, peak_memory=plan.peak_memory + kept,
                                       mapping_bytes=kept)
    if mem.min_rows > 1:
        need = workers * (mem.fixed + (2 * row_bytes + mem.per_row) * min(m, mem.min_rows))
        if budget < need:
            raise BudgetError(explain(
                "memory", f"must hold {format_size(reserve + need)}: {format_size(reserve)} of in-core work and "
                f"{min(m, mem.min_rows)} rows of each task's strip ({format_size(need)})", format_size(memory),
                f"raise it to at least {format_size(reserve + need)} (memory='{size_hint(reserve + need)}'), or "
                "reduce the number of columns"),
                minimum=reserve + need)
    if mem.max_strip_bytes is not None:
        cap = max(chunk_rows, mem.max_strip_bytes // max(1, row_bytes), mem.strip_floor)
        max_strip = cap if max_strip is None else min(max_strip, cap)
    cb = chunk_bytes if chunk_bytes is not None else chunk_rows * row_bytes
    # zarr's temporaries for the tall outputs written (chunked by the strip): a raw, an encoded and
    # a staged copy of each written row
    write_rows = 3 * mem.write_row_bytes if mem.chunk_temporaries and mem.write_row_bytes else 0
    # Threaded BLAS packs the streamed strip into its own buffer for the strip's products (B_i^T Y_i):
    # measured with OpenBLAS, 2 threads, a 4096-column float64 strip, the resident memory grew by the
    # strip's size (12.7 MiB for 376 rows; 0.9 MiB single-threaded); counted as one more strip copy,
    # whatever the BLAS threads: the strip height may not depend on the scheduler (the sums would).
    blas_rows = row_bytes
    per_row = mem.per_row + write_rows + blas_rows
    dec = decoded if decoded is not None and not direct else None
    if (not mem.chunk_temporaries and dec is None) or direct:
        # Direct reads need no temporaries. A kernel that declares its writes has them counted per
        # row; one that does not keeps one input chunk in flight for them (measured:
        # tests/lowrank/test_svd_memory.py, benchmarks/budgets.py).
        extra = 3 * cb if mem.chunk_temporaries and mem.write_row_bytes is None else 0
        return plan_row_pass(m, row_bytes, chunk_rows=chunk_rows, memory=budget, fixed_bytes=mem.fixed + extra,
                             strip_extra_row_bytes=per_row, workers=workers, cores=cores, max_strip=max_strip,
                             min_tasks=min_tasks, reserve=reserve, partial_rows=partial_rows, prefetch=prefetch,
                             cache_bytes=cache_bytes, loaders=loaders if direct or not mem.chunk_temporaries else 1)

    def attempt(temporaries: int, cap: int | None) -> RowPassPlan:
        return plan_row_pass(m, row_bytes, chunk_rows=chunk_rows, memory=budget,
                             fixed_bytes=mem.fixed + temporaries, strip_extra_row_bytes=per_row,
                             workers=workers, cores=cores, prefetch=prefetch, max_strip=cap, min_tasks=min_tasks,
                             reserve=reserve, partial_rows=partial_rows, cache_bytes=cache_bytes)

    if dec is not None:
        return _decoded_pass(attempt, dec, decoded_width, m, max_strip, memory)
    error = None
    for in_flight in range(IO_CONCURRENCY, 0, -1):
        try:
            plan = attempt(read_temporaries(in_flight, cb), max_strip)
        except BudgetError as exc:
            error = exc
            continue
        if in_flight == 1 or math.ceil(plan.strip / max(1, chunk_rows)) * max(1, chunks_across) >= in_flight:
            return plan
    raise error


def _decoded_pass(attempt: Callable[[int, int | None], RowPassPlan], decoded: tuple[int, int, int], width: int,
                  m: int, max_strip: int | None, memory: int) -> RowPassPlan:
    """The plan of a pass whose reads decode whole chunks of ``decoded`` (rows, columns, itemsize) of an
    operand ``width`` wide: ``attempt(temporaries, max_strip)`` plans with ``temporaries`` bytes per task
    counted (those of ``in_flight`` chunks), and a plan is taken only where its strip's reads need no more
    (:func:`~blocklin.plan.chunks.chunk_io`). Where a strip row of chunks needs more than the budget
    holds, strips of one chunk row decode ``in_flight`` chunks at a time (``lanes``): a 3072 x 3072
    operand in 1536 x 1536 zstd chunks had the inverse's residual probe (planned without them) decode two
    at once beside its strips, 96 MiB above the baseline for a plan of 51."""
    from blocklin.plan.chunks import chunk_io

    c0, c1 = max(1, decoded[0]), max(1, decoded[1])
    width = max(1, width)
    across = -(-width // c1)
    one = chunk_io(c0, c1, decoded, (m, width), 0)  # one chunk's temporaries

    def need(strip: int, lanes: int = 0) -> int:
        return chunk_io(strip, min(width, lanes * c1) if lanes else width, decoded, (m, width), 0)

    error, best = None, None
    for in_flight in range(IO_CONCURRENCY, 0, -1):
        held = in_flight * one
        try:
            plan = attempt(held, max_strip)
        except BudgetError as exc:
            error = exc
            continue
        if need(plan.strip) < held and in_flight > 1:  # fewer chunks in flight than counted: a lower count
            continue                                   # gives taller strips
        if need(plan.strip) > held:
            # the strip touches more chunks than counted: strips of whole chunk rows within the count, or
            # of one chunk row decoded ``in_flight`` chunks at a time
            rows = (in_flight // across) * c0 if in_flight >= across else c0
            plan = attempt(held, rows if max_strip is None else min(max_strip, rows))
            lanes = in_flight if in_flight < across else 0
            if need(plan.strip, lanes) > held:
                continue
            plan = dataclasses.replace(plan, lanes=lanes)
        # the tallest strip: each strip decodes every chunk its rows touch, so strips below a chunk row
        # decode each chunk again (16-row strips decoded 1536-row chunks 96 times where one chunk at a
        # time gave 256-row strips); among equal strips, the most chunks decoded at once
        if best is None or plan.strip > best.strip:
            best = plan
    if best is not None:
        return best
    least = getattr(error, "minimum", None) or memory
    raise BudgetError(explain(
        "memory", "must hold each task's strip and the temporaries of the input's chunks, decoded whole (a raw, "
        f"a decoded and a copied chunk of {c0} x {c1}: {format_size(one)})", format_size(memory),
        f"raise it to at least {format_size(least)} (memory='{size_hint(least)}'), or rechunk the input smaller "
        "(blocklin convert --chunks)"), minimum=least)
