"""Row passes: stream row strips of tall operands through the device, reduce small partials.

Many algorithms read a tall matrix ``A`` (``m x n`` with ``n`` modest) strip by strip: Gram
matrices ``A^T A``, sketches ``A^T (A Q)``, the R factor of a streaming QR. A row pass cuts the
rows into groups (one task each); a task streams its strips with a :class:`TileStream` and calls
a kernel per strip that updates a small state and may return row blocks to write to tall outputs.
Partial states come back through the scheduler (they are small) and are reduced in group order,
so results do not depend on the scheduler or the number of workers.

This module is the one way to run a row pass:

* a kernel is a function ``kernel(device, arrays, rows, params, state) -> (state, writes)``
  (``writes`` maps output names to the strip's rows, or to ``(first row, block)`` for rows a kernel
  buffered over several strips to write whole chunks of an output chunked taller than the strip),
  marked with :func:`row_kernel`, which declares next to its code the memory one task allocates
  (a :class:`~blocklin.plan.passes.PassMemory` computed from the parameters and the streamed
  operands), its optional ``init`` and the device it runs on;
* :func:`run_pass` plans the pass from that declaration (:func:`blocklin.plan.passes.plan_pass`),
  builds the spec, runs it through the job (which counts it) and returns the per-group states;
* :func:`reduce_sum` and :func:`collect_rows` reduce the states in row order.
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import numpy as np

from blocklin.device import TileStream, get_device, pool
from blocklin.errors import InternalError
from blocklin.peaks import column_peaks as _column_peaks, flat_peaks as _flat_peaks, max_nan as _max_nan
from blocklin.plan.passes import MAX_LOADERS, PassMemory, RowPassPlan, pass_workers, plan_pass
from blocklin.progress import report_units
from blocklin.plan.rechunk import rechunk_advice
from blocklin.runtime.graph import TileGraph
from blocklin.runtime.powers import ldexp
from blocklin.runtime.tiles import check_finite, open_array, region, with_task_settings
from blocklin.storage.rawchunks import decoded_access, raw_access
from blocklin.storage.readerrors import reading
from blocklin.storage import seen_peaks
from blocklin.storage.recorded_peaks import recorded
from blocklin.storage.zarr_store import read_block, read_kind, write_block

#: ``kernel(device, arrays, rows, params, state) -> (state, writes)``; ``arrays`` are the strip's
#: operand blocks (on the device), ``writes`` maps output names to host blocks for ``rows``.
Kernel = Callable[[Any, tuple[Any, ...], slice, Any, Any], tuple[Any, dict[str, np.ndarray] | None]]


def row_kernel(*, memory: Callable[[Any, tuple[Source, ...]], PassMemory], init: Callable | None = None,
               device: str = "any", read_only: bool = False) -> Callable[[Kernel], Kernel]:
    """Mark a function as a row-pass kernel and declare what it needs.

    Parameters
    ----------
    memory : callable
        ``memory(params, sources) -> PassMemory``: the bytes one task allocates, from the kernel's
        parameters and the streamed operands (:class:`Source`).
    init : callable, optional
        ``init(device, params) -> state`` run once per task before the first strip.
    device : {"any", "cpu"}
        ``"cpu"`` for kernels written with NumPy/LAPACK on host arrays; ``"any"`` for kernels
        whose products go through the device (they then run on the job's device).
    read_only : bool
        The kernel never writes into the strips it is handed: on a GPU its passes over the
        operation's input may take them from the device operand cache, where earlier passes of the
        job kept them (:func:`resident_strips`), and on the CPU its later passes may map them from
        the page cache (:func:`mapped_inputs`). Kernels that overwrite their strip must leave it False.
    """
    def mark(kernel: Kernel) -> Kernel:
        kernel.memory = memory  # type: ignore[attr-defined]
        kernel.init = init  # type: ignore[attr-defined]
        kernel.device = device  # type: ignore[attr-defined]
        kernel.read_only = read_only  # type: ignore[attr-defined]
        return kernel

    return mark


class Params:
    """Kernel parameters carried by a pass spec through the scheduler.

    Hashable by identity (graph executors test task arguments against keys, and parameters may
    hold arrays) and tokenized by content, so graph names stay deterministic.
    """

    def __init__(self, **items: Any) -> None:
        self.__dict__.update(items)

    def __getitem__(self, key: str) -> Any:
        return self.__dict__[key]

    def get(self, key: str, default: Any = None) -> Any:
        return self.__dict__.get(key, default)

    def __dask_tokenize__(self) -> Any:
        from dask.base import tokenize

        return tokenize(sorted(self.__dict__.items()))


@dataclasses.dataclass(frozen=True)
class Source:
    """A stored operand streamed by a row pass (row strips, or column strips when ``transposed``).

    ``rows`` x ``width`` is the streamed orientation; ``chunk_rows`` the chunk height in that
    orientation; ``chunk_bytes`` one stored chunk; ``chunks_across`` the chunks one strip row crosses.
    """

    path: Any  # a Location (URL or path with its storage options), or a path
    name: str
    rows: int
    width: int
    dtype: np.dtype
    chunk_rows: int
    chunk_bytes: int
    chunks_across: int
    transposed: bool = False
    #: How the operand's chunks are read: ``"direct"`` (local uncompressed chunk files, no zarr
    #: temporaries, row ranges read alone), ``"ranges"`` (uncompressed on an object store: row
    #: ranges by range requests) or ``"chunks"`` (through zarr, every chunk touched read whole).
    reads: str = "chunks"
    #: The stored row where the streamed rows start (a pass over rows appended since a result,
    #: :mod:`blocklin.linalg.update`); row strips only.
    first_row: int = 0
    #: The stored chunks' height where ``chunk_rows`` is another grid the strips align to (the chunk
    #: rows of an output); 0: ``chunk_rows``. What a read decodes is the stored chunk.
    stored_rows: int = 0

    @property
    def partial_rows(self) -> bool:
        """Whether a strip narrower than a chunk reads only its part of the chunk (row ranges of
        uncompressed chunks; column ranges too from local files, one read per row)."""
        return self.reads == "direct" or self.reads == "ranges" and not self.transposed

    @property
    def row_bytes(self) -> int:
        return self.width * self.dtype.itemsize

    @property
    def chunks(self) -> tuple[int, int]:
        """The stored chunk shape in the streamed orientation (rows, columns)."""
        rows = self.stored_rows or self.chunk_rows
        return rows, self.chunk_bytes // max(1, rows * self.dtype.itemsize)

    def aligned_to(self, rows: int) -> "Source":
        """This operand with strips planned on a grid of ``rows`` (an output's chunk rows), its stored
        chunks unchanged."""
        return dataclasses.replace(self, chunk_rows=rows, stored_rows=self.chunks[0])


def source(operand: Any, *, transposed: bool = False, name: str | None = None) -> Source:
    """The :class:`Source` of an operand (anything with ``path``, ``shape``, ``dtype``, ``chunks``)."""
    return stored(operand.path, operand.shape, operand.dtype, operand.chunks,
                  name=name or getattr(operand, "name", "a"), transposed=transposed,
                  first_row=getattr(operand, "first_row", 0))


def stored(path: str, shape: tuple[int, int], dtype: Any, chunks: tuple[int, int], *, name: str = "a",
           transposed: bool = False, first_row: int = 0) -> Source:
    """The :class:`Source` of a stored array given its metadata (row strips, or column strips);
    ``shape`` is that of the streamed rows ``first_row:first_row + shape[0]``."""
    dt = np.dtype(dtype)
    r, w = (1, 0) if transposed else (0, 1)
    if first_row and transposed:
        raise InternalError("a pass streams a range of rows as row strips only")
    return Source(path=path, name=name, rows=shape[r], width=shape[w], dtype=dt, chunk_rows=chunks[r],
                  chunk_bytes=int(np.prod(chunks)) * dt.itemsize, chunks_across=-(-shape[w] // max(1, chunks[w])),
                  transposed=transposed, reads=read_kind(path), first_row=int(first_row))


@dataclasses.dataclass(frozen=True)
class RowPassSpec:
    """One pass as its tasks see it: inputs (paths), kernel, broadcast params, outputs (paths)."""

    inputs: tuple[str, ...]
    names: tuple[str, ...]
    kernel: Kernel
    params: Any
    plan: RowPassPlan
    device: str
    device_memory: int | None
    check_finite: bool
    outputs: tuple[tuple[str, str], ...] = ()
    init: Callable[[Any, Any], Any] | None = None
    blas_threads: int | None = None
    #: Per input: stream the stored array's transpose (row strips of ``X.T`` = column strips of ``X``).
    transposed: tuple[bool, ...] | None = None
    #: Outputs written transposed: a block for ``rows`` goes to ``out[:, rows] = block.T``.
    transposed_outputs: tuple[str, ...] = ()
    #: Per input: the power of two ``e`` its strips are divided by as they are read (``x 2^-e``,
    #: exact; :mod:`blocklin.linalg.blocks.scaling`), 0 for none; a tuple of one power per column of
    #: the streamed orientation for a right-hand side whose columns lie far apart.
    scale: tuple[int | tuple[int, ...], ...] | None = None
    #: Per input: whether the task records the largest magnitude it read (``peaks``): of each column
    #: where ``columns`` says so, else of the whole input (every entry of ``peaks`` that one value).
    amax: tuple[bool, ...] | None = None
    #: Per input: whether those peaks are each column's (``Job.column_peaks``) or the flat largest magnitude.
    columns: tuple[bool, ...] | None = None
    #: Per input: the stored row of streamed row 0 (:attr:`Source.first_row`); None for all 0.
    offsets: tuple[int, ...] | None = None
    #: Per input: the key prefix of its strips in the device operand cache (the job's scope, the
    #: store, its content stamp, orientation, offset and scaling), None where it is streamed; None
    #: for a pass that keeps nothing on the device (:func:`resident_strips`).
    resident: tuple | None = None
    #: Bytes of the device cache the pass keeps its strips in (within ``device_memory``).
    resident_bytes: int = 0
    #: Per input: whether its strips are mapped from the page cache rather than read into the slots
    #: (:func:`mapped_inputs`; the same bytes either way); None for none.
    mapped: tuple[bool, ...] | None = None


class PassResult(NamedTuple):
    """Per-group states of a pass in row order, and its plan."""

    states: list
    plan: RowPassPlan


def plan_kernel_pass(job: Any, kernel: Kernel, sources: Sequence[Source], params: Any = None, *,
                     memory: int | None = None, reserve: int = 0, max_strip: int | None = None,
                     min_tasks: int | None = None, workers: int | None = None,
                     device: str | None = None) -> RowPassPlan:
    """Plan a pass of ``kernel`` over ``sources`` from the kernel's memory declaration.

    ``memory`` is the budget of the pass (default: the job's); ``reserve`` the part of it held
    outside the pass; ``workers`` the concurrent tasks (default: the job's ``workers`` setting, else
    :func:`~blocklin.plan.passes.pass_workers` chooses for a CPU pass); ``device`` where the pass
    runs (default: the kernel's, else the job's).
    """
    from blocklin.operands import decoded_chunks
    from blocklin.plan.chunks import chunk_io

    sources = tuple(sources)
    first = sources[0]
    mem = kernel.memory(params if params is not None else {}, sources)  # type: ignore[attr-defined]
    # the operand whose chunks, decoded whole, need the most temporaries for a strip row (one strip is
    # read at a time, its operands in turn)
    decoded = max(((d, s.width) for s in sources if (d := decoded_chunks(s)) is not None),
                  key=lambda dw: chunk_io(1, dw[1], dw[0], (1, dw[1]), 0), default=(None, 0))

    if kernel.device != "any":  # type: ignore[attr-defined]
        device = kernel.device  # type: ignore[attr-defined]
    # whether the pass may map its strips (mapped_inputs): its plan then sets their large pages aside.
    # Decided from the kernel and the operands' layout only, not from the probe or the platform, so that
    # the strips (and the bits) do not depend on what the page cache holds or where the pass runs
    may_map = (device or job.device) == "cpu" and getattr(kernel, "read_only", False) and \
        any(s.reads == "direct" and not s.transposed and s.chunks_across == 1 for s in sources)

    def plan(w: int, prefetch: int | None = None) -> RowPassPlan:
        return plan_pass(mem, first.rows, sum(s.row_bytes for s in sources), chunk_rows=first.chunk_rows,
                         partial_rows=all(s.partial_rows for s in sources),
                         direct=all(s.reads == "direct" for s in sources),
                         memory=job.cfg.memory if memory is None else memory, reserve=reserve,
                         workers=w, cores=job.cores(),
                         chunk_bytes=first.chunk_bytes, chunks_across=first.chunks_across, max_strip=max_strip,
                         min_tasks=min_tasks,  # None: the canonical split (the same on every scheduler)
                         cache_bytes=sum(s.chunk_rows * s.row_bytes for s in sources if not s.partial_rows),
                         loaders=MAX_LOADERS if all(s.partial_rows for s in sources) else 1, prefetch=prefetch,
                         decoded=decoded[0], decoded_width=decoded[1], mapped=may_map)

    if workers is None:
        workers = job.workers(0)  # the setting, or a cluster's threads per worker; 0: not set
        if workers == 1 and job.cluster() is not None:
            # one task thread per worker process: planned as locally, by the workers= setting where one is
            # given (the same strips, so the same bits; one task of a process then holds less than its budget)
            workers = job.cfg.workers or 0
    if workers:
        return plan(workers)
    return pass_workers(plan, device or job.device)


def strip_exponent(e: Any) -> int | tuple[int, ...]:
    """A source's power of two for :attr:`RowPassSpec.scale`: one ``int``, or one per column (a tuple) where
    they differ; equal ones give the one ``int`` (the bits of a pass scaled by one power)."""
    if np.ndim(e) == 0:
        return int(e)
    cols = tuple(int(v) for v in np.asarray(e).ravel())
    return cols[0] if cols and len(set(cols)) == 1 else cols


def run_pass(job: Any, kernel: Kernel, sources: Sequence[Source], params: dict | None = None, *,
             plan: RowPassPlan | None = None, outputs: Sequence[tuple[str, str]] = (),
             transposed_outputs: Sequence[str] = (), check_finite: bool | None = None, over: str = "a",
             description: str = "pass", device: str | None = None, scale: dict[str, int] | None = None,
             peaks: bool = True, **planning: Any) -> PassResult:
    """Plan (unless ``plan`` is given) and run one pass of ``kernel``; the job counts it.

    Parameters
    ----------
    job : Job
    kernel : function marked with :func:`row_kernel`
    sources : sequence of Source
        The streamed operands (same rows).
    params : dict, optional
        Broadcast parameters; the kernel also sees ``strip`` (the plan's strip height) and ``ends``
        (the last row of each task's group).
    plan : RowPassPlan, optional
        A plan made earlier by :func:`plan_kernel_pass` (when outputs are created with its strip).
    outputs, transposed_outputs
        ``(name, path)`` of tall outputs the kernel writes, and which of them are written transposed.
    check_finite : bool, optional
        Check streamed blocks for NaN/Inf (default: the job's setting; ``False`` for data the
        operation wrote or checked itself).
    over : str
        What the pass reads, for the job's pass counts (``"a"``: the operation's input).
    device : {"cpu", "gpu"}, optional
        For a kernel that runs on any device: where this pass runs (default: the job's device).
    scale : dict, optional
        ``{path: e}``: the strips of that source are multiplied by ``2^-e`` as they are read (exact,
        never a scaled copy on disk; :mod:`blocklin.linalg.blocks.scaling`); ``e`` a tuple: column ``j``
        of the streamed orientation by ``2^-e[j]``. The largest magnitude of each
        operand input read for the first time in the job is recorded in ``job.amax[path]`` (and of
        each column of the streamed orientation in ``job.peaks[path]``).
    peaks : bool
        ``False`` for a pass that needs no scaling (a product): nothing is recorded, and where the
        job checks for NaN/Inf each strip is checked by itself (the peaks would stand in for it).
    **planning
        ``memory``, ``reserve``, ``max_strip``, ``min_tasks``, ``workers`` for :func:`plan_kernel_pass`.
    """
    sources = tuple(sources)
    params = dict(params or {})
    if kernel.device != "any":  # type: ignore[attr-defined]
        device = kernel.device  # type: ignore[attr-defined]
    device = device or job.device
    if plan is None:
        if device == "gpu":  # the strips and states live on the GPU too: within both budgets
            memory = planning.get("memory") or job.cfg.memory
            planning["memory"] = min(memory, job.device_memory() or memory)
        plan = plan_kernel_pass(job, kernel, sources, params, device=device, **planning)
    for s in sources:
        if plan.rereads > 1 and not s.partial_rows and s.chunk_rows > plan.strip:
            job.note_reads(reread_advice(s, plan))
    if peaks and over != "intermediate":
        take_recorded_peaks(job, sources)
    # A completed pass has read every element of its inputs: the operation's input, checked once for
    # NaN/Inf in this job, is not checked again (the check cost 8-10% of each pass of an iterative SVD).
    # Intermediates are checked on every pass (one path may be rewritten between passes).
    checked = {str(s.path) for s in sources} if over != "intermediate" else set()
    check = job.check_finite if check_finite is None else check_finite
    if check_finite is None and checked and checked <= job.checked_finite:
        check = False
    spec = RowPassSpec(inputs=tuple(s.path for s in sources), names=tuple(s.name for s in sources), kernel=kernel,
                       params=Params(**params, strip=plan.strip, ends=tuple(g[1] for g in plan.groups)), plan=plan,
                       device=device, device_memory=job.device_memory() if device == "gpu" else None,
                       check_finite=check,
                       outputs=tuple(outputs), init=kernel.init,  # type: ignore[attr-defined]
                       blas_threads=job.task_blas_threads(plan.blas_threads),
                       transposed=tuple(s.transposed for s in sources), transposed_outputs=tuple(transposed_outputs),
                       scale=tuple(strip_exponent((scale or {}).get(str(s.path), 0)) for s in sources) if scale else None,
                       amax=tuple(peaks and over != "intermediate" and str(s.path) not in job.amax for s in sources),
                       columns=tuple(str(s.path) in job.column_peaks for s in sources),
                       offsets=tuple(s.first_row for s in sources) if any(s.first_row for s in sources) else None)
    spec = dataclasses.replace(spec, mapped=mapped_inputs(job, sources, spec))
    # the stamps of the whole local inputs this pass scans, before it reads them (storage.seen_peaks):
    # the run's, taken when it first opened them, where it has one (a listing saved)
    before = [(job.input_stamp(s.path) or seen_peaks.stamp_before(s.path)) if spec.amax[j] and _whole_input(job, s)
              else None for j, s in enumerate(sources)]
    if device == "gpu":
        keep = resident_strips(job, kernel, sources, plan, spec, over)
        if keep is not None:
            plan = dataclasses.replace(plan, resident_bytes=keep[1])
            spec = dataclasses.replace(spec, plan=plan, resident=keep[0], resident_bytes=keep[1])
    graph = TileGraph.named("rowpass", spec.inputs, kernel.__module__, kernel.__qualname__, plan.to_dict(),
                            _params_token(spec.params), spec.outputs, spec.transposed, spec.transposed_outputs,
                            *(() if spec.offsets is None else (spec.offsets,)))
    for first, stop in group_runs(plan, job.scheduler.kind):
        rows = plan.groups[stop - 1][1] - plan.groups[first][0]
        graph.weigh(graph.add((first,), row_pass_task, spec, first, stop, units=stop - first), rows, "rows")
    # Tasks run in this process take the strip slots the previous ones left (pool.reusing): fresh
    # slots cost a page fault per page in every task (see blocklin.device.pool)
    with pool.reusing():
        results = job.run(graph, workers=plan.workers, blas_threads=plan.blas_threads, description=description,
                          count_pass=over)
    if check:
        job.checked_finite |= checked
    for j, s in enumerate(sources):  # the operands' largest magnitudes, from the first pass that read them
        if spec.amax[j]:
            peaks = _max_nan([r["peaks"][j] for r in results if "peaks" in r and r["peaks"][j] is not None])
            if spec.columns[j]:
                job.peaks[str(s.path)] = peaks
            job.amax[str(s.path)] = float("nan") if peaks is None or np.isnan(peaks).any() else \
                float(peaks.max(initial=0.0))
            if before[j] is not None:  # for a later job's first pass, once the run's check lists the input
                job.keep_seen_peaks(s.path, before[j], job.amax[str(s.path)], peaks if spec.columns[j] else None,
                                    transposed=s.transposed)
    return PassResult([state for r in results for state in r["states"]], plan)


def _whole_input(job: Any, s: Source) -> bool:
    """Whether ``s`` streams every value of an input the caller named (not a staged copy, an
    intermediate or a range of its rows)."""
    shape = job.input_shapes.get(str(s.path))
    return shape is not None and not s.first_row and shape == ((s.width, s.rows) if s.transposed else (s.rows, s.width))


def take_recorded_peaks(job: Any, sources: Sequence[Source]) -> None:
    """The peaks the writer of each input recorded (:mod:`blocklin.storage.recorded_peaks`), where
    they still hold for its content, in place of the first pass's scan: ``job.amax`` (and
    ``job.peaks`` for the inputs in ``job.column_peaks``), and the input counts as checked for
    NaN/Inf (the record holds finite peaks of every value). The report's ``peaks_recorded`` names
    them.

    Where the writer recorded none, the peaks an earlier job's first pass saw of the whole input, kept
    in the user's cache while its content stamp holds (:mod:`blocklin.storage.seen_peaks`; the report's
    ``peaks_seen`` names them).

    Not for a range of rows (its peaks are its own). A writer records the short side's peaks, the side an
    SVD streams (a wide input's rows); a pass that needs the other side's takes them from an earlier
    scan, or scans.
    """
    for s in sources:
        path = str(s.path)
        columns = path in job.column_peaks
        if path in job.amax or s.first_row:
            continue
        shape = (s.width, s.rows) if s.transposed else (s.rows, s.width)
        stamp = job.input_stamp(s.path)  # the run's, where it took one: no listing of its own
        got, names = recorded(s.path, shape, column_peaks=columns, transposed=s.transposed, stamp=stamp), \
            job.recorded_peaks
        if got is None and _whole_input(job, s):
            got, names = seen_peaks.seen(s.path, job.input_shapes[path], column_peaks=columns,
                                         transposed=s.transposed, stamp=stamp), job.seen_peaks
        if got is None:
            continue
        job.amax[path] = got.amax
        if columns:
            job.peaks[path] = got.columns
        job.checked_finite.add(path)
        names.append(s.name)


def mapped_inputs(job: Any, sources: Sequence[Source], spec: RowPassSpec) -> tuple[bool, ...] | None:
    """Per source, whether the pass's tasks map its strips from the page cache
    (:meth:`~blocklin.storage.rawchunks.RawChunks.mapped`) instead of copying them into their slots.

    Only for kernels that never write into their strips (``read_only``: a mapped strip is the page
    cache's, read-only), on the CPU, for local uncompressed inputs one chunk across, streamed by rows,
    unscaled (a job's first pass takes its peaks from the mapped strip a cached piece at a time,
    :func:`_peaks_in_pieces`: 9.2-9.3 GB/s against 7.4-8.2 copied, 1 GiB on the 2-core machine, medians of
    6 alternated); and only where the page cache holds the input's first chunk file in 2 MiB pages
    (:func:`blocklin.storage.mapped.large_pages`, probed once per input in the job): mapped small
    pages are slower than the copy (:mod:`blocklin.storage.mapped`). The same bytes reach the kernel
    either way. None where no source is mapped.

    Mapped pages are resident like the slots they replace, but 2 MiB at a time: a pass maps only where
    its plan set that rounding aside (``mapping_bytes``, :func:`blocklin.plan.passes.plan_pass` with
    ``mapped``: from budgets of five times :func:`blocklin.storage.mapped.reservation`), or where its
    budget's allowance holds it (:func:`blocklin.storage.mapped.within_budget`, for plans made without).
    """
    from blocklin.storage import mapped as mapping

    if spec.device != "cpu" or not mapping.AVAILABLE or not getattr(spec.kernel, "read_only", False):
        return None
    if spec.plan is not None and not spec.plan.mapping_bytes and \
            not mapping.within_budget(spec.plan.memory, spec.plan.workers):
        return None
    got = []
    for j, s in enumerate(sources):
        ok = not s.transposed and s.reads == "direct" and not (spec.scale and spec.scale[j])
        if ok:
            path = str(s.path)
            if path not in job.mapped_inputs:
                raw = raw_access(open_array(s.path))
                job.mapped_inputs[path] = raw is not None and raw.maps(slice(0, raw.shape[1])) and \
                    mapping.large_pages(raw.first_chunk())
            ok = job.mapped_inputs[path]
        got.append(ok)
    return tuple(got) if any(got) else None


def resident_strips(job: Any, kernel: Kernel, sources: Sequence[Source], plan: RowPassPlan, spec: RowPassSpec,
                    over: str) -> tuple[tuple, int] | None:
    """Whether a GPU pass keeps its strips on the device for the job's later passes, and how.

    Where the kernel only reads its strips (``read_only``), the pass reads the operation's input
    (not an intermediate the job may rewrite) and every strip fits the device budget beside the
    pass's own tasks, each strip is kept in the device operand cache (:mod:`blocklin.device.resident`)
    after its first read, and later passes of the job with the same strips take it from there
    instead of storage: the same blocks in the same order, so the same bits. Returns the per-source
    key prefixes and the cache bytes, or None (streamed as usual).

    The key covers everything that makes a strip's bits: the job (the cache is freed when it ends),
    the store and its content stamp (taken once per job), the orientation, the row offset and the
    power-of-two scaling applied as it is read; the strip's rows complete it.
    """
    from blocklin.device import resident
    from blocklin.plan.gpu import DEVICE_UNIT

    if not resident.ENABLED or over == "intermediate" or not getattr(kernel, "read_only", False):
        return None
    budget = spec.device_memory or 0
    strips = sum(len(plan.strips(g)) for g in range(len(plan.groups)))
    # each strip as CuPy's pool holds it: its bytes rounded up to DEVICE_UNIT
    need = sum(s.rows * s.row_bytes for s in sources) + strips * len(sources) * DEVICE_UNIT
    if not budget or plan.peak_memory + need > budget:
        return None
    scope = resident.job_scope(job)
    scale = spec.scale or (0,) * len(sources)
    keys = tuple((scope, str(s.path), _stamp(job, s.path), s.transposed, s.first_row, scale[j])
                 for j, s in enumerate(sources))
    return keys, need


#: Per job (gone with it): the content stamps of its sources, taken once.
_stamps: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _stamp(job: Any, path: Any) -> str:
    """The content stamp of a source (:func:`blocklin.storage.stamps.content_stamp`), once per job."""
    from blocklin.storage.stamps import content_stamp

    seen = _stamps.setdefault(job, {})
    key = str(path)
    if key not in seen:
        seen[key] = content_stamp(path)
    return seen[key]


def group_runs(plan: RowPassPlan, scheduler: str) -> list[tuple[int, int]]:
    """The tasks of a pass: runs ``(first, stop)`` of consecutive groups, each streamed by one task.

    The groups fix the floating-point sums (each group's state starts afresh and the states are
    reduced in group order), the runs only how the groups are scheduled, so results are the same
    bits however the groups are run. In one process (``threads``, ``sync``) a pass runs one run per
    concurrent task: one stream reads ahead across the groups of its run, where a task per group
    started cold at every group (its first strip read with nothing to overlap) and paid a task's
    set-up each time. Measured with ``benchmarks/feed.py`` (1 GiB, 32 groups, 2 tasks at once):
    3.8 GB/s for a task per group against 4.3-4.7 GB/s for two runs. Other schedulers keep a task
    per group: their tasks spread over processes and hosts, and a lost worker's retry redoes one group.
    """
    n = len(plan.groups)
    if scheduler not in ("threads", "sync"):
        return [(g, g + 1) for g in range(n)]
    k = max(1, min(n, plan.workers))
    return [(n * i // k, n * (i + 1) // k) for i in range(k)]


class _RunStrips:
    """The strips of groups ``first:stop`` of a plan, in order, computed on access."""

    def __init__(self, plan: RowPassPlan, first: int, stop: int) -> None:
        self.pieces = [plan.strips(g) for g in range(first, stop)]
        self.starts = np.cumsum([0] + [len(p) for p in self.pieces])
        self.first = first

    def __len__(self) -> int:
        return int(self.starts[-1])

    def locate(self, i: int) -> tuple[int, tuple[int, int]]:
        """The group of strip ``i`` and the strip's rows."""
        j = int(np.searchsorted(self.starts, i, side="right")) - 1
        return self.first + j, self.pieces[j][i - int(self.starts[j])]

    def __getitem__(self, i: int) -> tuple[int, int]:
        return self.locate(i)[1]


def reread_advice(s: Source, plan: RowPassPlan) -> str:
    """The advice for a source whose chunks the pass's strips read whole several times."""
    chunk_w = s.chunk_bytes // max(1, s.chunk_rows * s.dtype.itemsize)
    if s.transposed:
        shape, chunks, want = (s.width, s.rows), (chunk_w, s.chunk_rows), (s.width, plan.strip)
        why = f"column strips of {plan.strip} cut them across their width"
    else:
        shape, chunks, want = (s.rows, s.width), (s.chunk_rows, chunk_w), (plan.strip, s.width)
        why = f"strips of {plan.strip} rows read each compressed chunk whole"
    return rechunk_advice(s.name, s.path, shape, chunks, want, -(-s.chunk_rows // plan.strip), why)


@with_task_settings
def row_pass_task(spec: RowPassSpec, first: int, stop: int | None = None) -> dict:
    """Stream the strips of groups ``first:stop`` (default: ``first`` alone) and return
    ``{"states": [one per group], stats}``."""
    t0 = time.perf_counter()
    arrays = [open_array(p) for p in spec.inputs]
    trans = spec.transposed or (False,) * len(arrays)
    col_slices = [slice(0, a.shape[0 if t else 1]) for a, t in zip(arrays, trans)]
    outs = {name: open_array(path, mode="r+") for name, path in spec.outputs}
    device = get_device(spec.device, device_memory=spec.device_memory)
    strips = _RunStrips(spec.plan, first, first + 1 if stop is None else stop)
    shapes = [(cs.stop - cs.start, spec.plan.strip) if t else (spec.plan.strip, cs.stop - cs.start)
              for cs, t in zip(col_slices, trans)]
    nbytes = [0]
    scale = spec.scale or (0,) * len(arrays)
    want = spec.amax or (False,) * len(arrays)
    # per input: each column's peak (what the SVD's squares need), or the largest magnitude alone
    peaks_of = [_column_peaks if spec.columns and spec.columns[j] else _flat_peaks for j in range(len(arrays))]
    peaks: list[np.ndarray | None] = [None] * len(arrays)  # per input, max |x| of each column so far
    lock = threading.Lock()  # the loader threads update them
    bands = [_Band(arr, t) if spec.plan.cached and _Band.wanted(path, arr, t, spec.plan.strip) else None
             for path, arr, t in zip(spec.inputs, arrays, trans)]

    offsets = spec.offsets or (0,) * len(arrays)
    # Each row-streamed input's local chunk reader, resolved once per task: read_block resolves it for
    # every strip, parsing the array's metadata again (0.1 ms a strip beside a second loader here). A
    # local read uses no buffer of the reader's, so a GPU task's two loader threads may share it.
    direct = [None if t else raw_access(arr) for arr, t in zip(arrays, trans)]
    # inputs whose first pass reads its strips a piece at a time (local uncompressed chunks, rows)
    pieces = [w and d is not None for w, d in zip(want, direct)]
    # inputs whose first pass takes each decoded chunk's peaks in the thread that decoded it (local
    # compressed chunks, rows, read whole: no kept band)
    decoded = [decoded_access(arr) if w and not t and d is None and band is None else None
               for arr, w, t, d, band in zip(arrays, want, trans, direct, bands)]
    # inputs whose strips are mapped from the page cache, not copied into the slots (mapped_inputs)
    maps = [bool(spec.mapped and spec.mapped[j]) and device.host_resident and d is not None and band is None
            and d.maps(cs) for j, (d, band, cs) in enumerate(zip(direct, bands, col_slices))]
    regions: dict = {}  # per slot and mapped input: the address range its strips are mapped into in turn
    lanes = spec.plan.lanes or None  # chunks decoded at once where the plan holds fewer than a strip row's
    nmapped = [0]

    def load(i: int, bufs: tuple[np.ndarray, ...], skip: tuple[bool, ...] | None = None) -> tuple:
        r0, r1 = strips[i]
        views: list = []
        piece_peaks = None
        for arr, buf, name, cs, t, band, off in zip(arrays, bufs, spec.names, col_slices, trans, bands, offsets):
            if skip is not None and skip[len(views)]:  # kept on the device by an earlier pass of the job
                views.append(None)
                continue
            rs = slice(r0 + off, r1 + off)  # the stored rows of this strip
            j = len(views)
            # the strip's place in the slot, in the streamed orientation
            dest = region(buf, (cs.stop - cs.start, r1 - r0) if t else (r1 - r0, cs.stop - cs.start))
            if band is not None and band.covers(rs.start, rs.stop):  # rows of the kept chunk band (read once)
                stored = band.rows(rs.start, rs.stop, dest, lanes)
            elif t:  # column strip of the stored array, handed out as a transposed view
                stored = read_block(arr, cs, rs, out=dest, lanes=lanes)
            elif maps[j] and (view := _read_mapped(arr, direct[j], rs, cs, regions, (id(buf), j))) is not None:
                stored = view
                nmapped[0] += view.nbytes
                if want[j]:
                    piece_peaks = _peaks_in_pieces(view, peaks_of[j])
            elif want[j] and pieces[j]:
                stored, piece_peaks = _read_with_peaks(arr, rs, cs, dest, direct[j], peaks_of[j])
            elif _direct_into(decoded[j], arr, dest):
                stored, piece_peaks = _decode_with_peaks(arr, decoded[j], rs, cs, dest, peaks_of[j], lanes)
            elif _direct_into(direct[j], arr, dest):
                stored = _read_direct(arr, direct[j], rs, cs, dest)
            else:
                stored = read_block(arr, rs, cs, out=dest, lanes=lanes)
            v = stored.T if t else stored
            p = (piece_peaks if piece_peaks is not None else peaks_of[j](v)) if want[j] else None
            piece_peaks = None
            # Real data whose column peaks are finite holds no NaN or Inf (max and min propagate
            # both): the peaks, which the first pass computes anyway, stand in for the check.
            if spec.check_finite and not (p is not None and v.dtype.kind == "f" and np.isfinite(p).all()):
                check_finite(stored, name, *((cs, rs) if t else (rs, cs)))
            if p is not None:
                with lock:
                    peaks[j] = p if peaks[j] is None else _max_nan([peaks[j], p])
            e = -np.asarray(scale[j], dtype=np.int64) if isinstance(scale[j], tuple) else -scale[j]
            if scale[j] and v.flags.writeable and np.may_share_memory(v, buf):
                ldexp(v, e, out=v)  # the task's own read buffer (a per-column e broadcasts over its rows)
            elif scale[j]:
                v = ldexp(v, e)
            nbytes[0] += v.nbytes
            views.append(v)
        return tuple(views)

    # a task's share of the plan, held from the GPU's budget that this process's tasks share (the
    # device cache's strips are counted there as they are kept)
    kept = _kept_strips(spec, device, strips, want)
    with device.reserve(spec.plan.peak_memory // max(1, spec.plan.workers)):
        states, written, told, stream = _stream_strips(spec, device, strips, load, shapes, arrays, outs, kept)
    result = {"states": states, "peaks": peaks, "bytes_read": nbytes[0], "bytes_mapped": nmapped[0],
              "bytes_written": written,
              "seconds": time.perf_counter() - t0,
              "load_seconds": stream.load_seconds, "wait_seconds": stream.wait_seconds,
              "compute_seconds": stream.compute_seconds, "progress_units": told}
    if not device.host_resident:  # strips served from the device cache, and the most bytes it held after an upload
        result["bytes_device_cache"] = kept.served if kept is not None else 0
        result["device_resident"] = kept.peak if kept is not None else 0
    return result


def _kept_strips(spec: RowPassSpec, device: Any, strips: _RunStrips, want: tuple[bool, ...]) -> Any:
    """The strips a GPU task keeps on the device, or takes from there (:func:`resident_strips`)."""
    from blocklin.device import resident

    if spec.resident is None or device.host_resident or not resident.ENABLED:
        return None

    def keys(i: int) -> tuple:
        r0, r1 = strips[i]
        return tuple(None if prefix is None else (*prefix, r0, r1) for prefix in spec.resident)

    # the pass that records each column's largest magnitude reads every strip itself (and keeps it)
    return resident.Resident(resident.DeviceCache.of(device.device_id), keys, limit=spec.resident_bytes,
                             budget=spec.device_memory or 0, checked=spec.check_finite,
                             lookup=tuple(not w for w in want))


#: Bytes of a strip read at a time by a pass that records its column peaks from local uncompressed
#: chunks (:func:`_read_with_peaks`).
PEAK_PIECE_BYTES = 1 << 20


def _direct_into(raw: Any, arr: Any, out: np.ndarray) -> bool:
    """Whether ``raw`` (a task's resolved chunk reader, or None) reads ``arr``'s blocks into ``out``:
    what :func:`~blocklin.storage.zarr_store.read_block` checks before it reads through one."""
    return raw is not None and out.dtype == arr.dtype and out.flags.c_contiguous


def _read_direct(arr: Any, raw: Any, rows: slice, cols: slice, out: np.ndarray) -> np.ndarray:
    """``arr[rows, cols]`` into ``out`` through the task's chunk reader ``raw`` (:func:`_direct_into`),
    failures named as :func:`~blocklin.storage.zarr_store.read_block` names them."""
    with reading(arr, rows, cols):
        return raw.read(rows, cols, out)


def _read_mapped(arr: Any, raw: Any, rows: slice, cols: slice, regions: dict, key: tuple) -> np.ndarray | None:
    """``arr[rows, cols]`` mapped from the page cache by the task's chunk reader ``raw`` into the region
    ``regions[key]`` (made on first use, or where a strip needs more room; None where a chunk is
    missing), failures named as :func:`~blocklin.storage.zarr_store.read_block` names them."""
    from blocklin.storage.mapped import StripRegion

    with reading(arr, rows, cols):
        need = raw.map_bytes(rows.stop - rows.start)
        region = regions.get(key)
        if region is None or region.capacity < need:
            region = regions[key] = StripRegion(need)
        return raw.mapped(rows, region)


def _read_with_peaks(arr: Any, rows: slice, cols: slice, out: np.ndarray,
                     raw: Any = None, peaks_of: Any = None) -> tuple[np.ndarray, np.ndarray]:
    """``arr[rows, cols]`` read into ``out`` a piece of about :data:`PEAK_PIECE_BYTES` at a time, and
    the peaks of the whole (``peaks_of``: :func:`_column_peaks`, the default, or :func:`_flat_peaks`),
    each piece's taken right after its read.

    The peaks' max and min then read the piece from the core's cache, not from memory: one trip of
    the strip through memory instead of three. Measured on the 2-core machine (4096 x 512 float64
    strips of local chunks in the page cache, one thread): read and peaks of whole strips 4.4 GB/s,
    in 1 MiB pieces 7.4 GB/s (the read alone 16.8). The peaks are maxima, so the same bits.
    Where the task's chunk reader ``raw`` reads the strip's rows whole-width, its
    :meth:`~blocklin.storage.rawchunks.RawChunks.pieces` opens each chunk file once for all its
    pieces (a job's first pass 7.3 -> 8.2 GB/s on the 2-core machine, medians of 9 alternated).
    Failures are named as :func:`~blocklin.storage.zarr_store.read_block` names them.
    """
    peaks_of = peaks_of or _column_peaks
    step = max(1, PEAK_PIECE_BYTES // max(1, out.shape[1] * out.itemsize))
    # the chunk files' reader resolved once per task (``raw``), not per piece: each read_block of a piece
    # parsed the array's metadata again (a third of the GIL a first pass held on the H200 host: py-spy --gil)
    raw = raw if _direct_into(raw, arr, out) else None
    cols = slice(cols.start or 0, arr.shape[1] if cols.stop is None else cols.stop)
    peaks = peaks_of(out[:0])
    if raw is not None and raw.reads_pieces(cols, out):
        # closed here (its open chunk file too) even when a piece's peaks are interrupted
        with reading(arr, rows, cols), contextlib.closing(raw.pieces(rows, out, step)) as pieces:
            for a, b in pieces:
                peaks = np.maximum(peaks, peaks_of(out[a:b])) if a else peaks_of(out[a:b])
        return out, peaks
    for r0 in range(0, out.shape[0], step):
        r1 = min(out.shape[0], r0 + step)
        rs = slice(rows.start + r0, rows.start + r1)
        piece = _read_direct(arr, raw, rs, cols, out[r0:r1]) if raw is not None else \
            read_block(arr, rs, cols, out=out[r0:r1])
        peaks = np.maximum(peaks, peaks_of(piece)) if r0 else peaks_of(piece)  # maximum propagates NaN
    return out, peaks


def _peaks_in_pieces(v: np.ndarray, peaks_of: Any) -> np.ndarray:
    """The peaks (``peaks_of``: :func:`_column_peaks` or :func:`_flat_peaks`) of a strip mapped from the
    page cache, a piece of about :data:`PEAK_PIECE_BYTES` at a time: the max brings each piece from
    memory into the core's cache, where the min then reads it (one trip of the strip through memory,
    not two). Maxima: the same peaks as of the whole."""
    step = max(1, PEAK_PIECE_BYTES // max(1, v.shape[1] * v.itemsize))
    peaks = peaks_of(v[:step])
    for r0 in range(step, v.shape[0], step):
        peaks = np.maximum(peaks, peaks_of(v[r0:r0 + step]))  # maximum propagates NaN
    return peaks


def _decode_with_peaks(arr: Any, dec: Any, rows: slice, cols: slice, out: np.ndarray,
                       peaks_of: Any = None, lanes: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """``arr[rows, cols]`` decoded into ``out`` by the task's chunk decoder ``dec``
    (:class:`~blocklin.storage.rawchunks.DecodedChunks`), and the peaks of the whole (``peaks_of``:
    :func:`_column_peaks`, the default, or :func:`_flat_peaks`), each chunk's part's taken by the thread
    that decoded it right after.

    Taken after the whole strip, the peaks read it back from memory on the loader thread alone,
    while the decoding threads wait for the next strip: a first pass over zstd chunks read 0.72-0.81x
    of the raw decode rate at 1/4 of the operand (32 MiB strips), against 1.01-1.04x for later
    passes. Maxima in any order are the same bits; failures are named as
    :func:`~blocklin.storage.zarr_store.read_block` names them.
    """
    peaks_of = peaks_of or _column_peaks
    cols = slice(cols.start or 0, arr.shape[1] if cols.stop is None else cols.stop)
    peaks = np.zeros(out.shape[1])
    lock = threading.Lock()

    def each(part: np.ndarray, column: int) -> None:
        p = peaks_of(part)  # flat: the part's largest magnitude on each of its columns (their max is the whole's)
        with lock:  # parts of several chunks across merge into one row of peaks
            at = peaks[column:column + part.shape[1]]
            np.maximum(at, p, out=at)  # maximum propagates NaN

    with reading(arr, rows, cols):
        dec.read(rows, cols, out, each=each, lanes=lanes)
    return out, peaks


def _stream_strips(spec: RowPassSpec, device: Any, strips: _RunStrips, load: Any, shapes: list, arrays: list,
                   outs: dict, kept: Any = None) -> tuple[list, int, int, TileStream]:
    """Run the kernel over the strips of one task's groups, each group from a fresh state; returns
    the groups' states, the bytes written, the rows reported to the progress bar and the stream
    (``kept``: the strips kept on the device, :func:`_kept_strips`)."""
    states: list = []
    group, state = None, None
    stream = TileStream(device, len(strips), load, shapes, [a.dtype for a in arrays], depth=spec.plan.prefetch,
                        loaders=spec.plan.loaders, resident=kept)
    written = told = 0
    for i, dev_arrays in stream:
        g, (r0, r1) = strips.locate(i)
        if g != group:  # a group's first strip: its state starts afresh
            if group is not None:
                states.append(state)
            group, state = g, spec.init(device, spec.params) if spec.init else None
        state, writes = spec.kernel(device, dev_arrays, slice(r0, r1), spec.params, state)
        told += report_units(r1 - r0)  # the progress bar moves strip by strip
        for name, block in (writes or {}).items():
            w0 = r0
            if isinstance(block, tuple):  # (first row, block): rows the kernel buffered over several strips
                w0, block = block
            w1 = w0 + block.shape[0]
            if name in spec.transposed_outputs:
                write_block(outs[name], slice(0, block.shape[1]), slice(w0, w1), block.T)
            else:
                write_block(outs[name], slice(w0, w1), slice(0, block.shape[1]), block)
            written += block.nbytes
    if group is not None:
        states.append(state)
    while len(states) < len(strips.pieces):  # groups without rows (an empty operand) keep their initial state
        states.append(spec.init(device, spec.params) if spec.init else None)
    return states, written, told, stream


class _Band:
    """The chunk band (``chunk_rows`` streamed rows, whole width) that a task's strips share, read once.

    For operands whose chunks are read whole (compressed): strips narrower than a chunk copy their
    rows out of the band instead of decoding the chunk again. One band per operand and task, filled
    by the task's single loader thread (the plan gives a cached pass one loader), in row order.
    """

    def __init__(self, arr: Any, transposed: bool) -> None:
        self.arr, self.transposed = arr, transposed
        self.height = arr.chunks[1 if transposed else 0]
        self.rows_total = arr.shape[1 if transposed else 0]
        self.width = arr.shape[0 if transposed else 1]
        self.index = -1
        self.buf: np.ndarray | None = None

    @staticmethod
    def wanted(path: Any, arr: Any, transposed: bool, strip: int) -> bool:
        """Whether strips of ``strip`` rows would read ``arr``'s chunks whole, more than once each."""
        return read_kind(path) == "chunks" and arr.chunks[1 if transposed else 0] > strip

    def covers(self, r0: int, r1: int) -> bool:
        return r0 // self.height == (r1 - 1) // self.height

    def rows(self, r0: int, r1: int, out: np.ndarray, lanes: int | None = None) -> np.ndarray:
        """Rows ``r0:r1`` (streamed orientation) into ``out``, reading their band first if not kept
        (``lanes`` chunks decoded at once: :func:`~blocklin.storage.zarr_store.read_block`)."""
        b = r0 // self.height
        if b != self.index:
            b0, b1 = b * self.height, min(self.rows_total, (b + 1) * self.height)
            if self.buf is None:
                self.buf = pool.aligned_empty((self.width, self.height) if self.transposed else
                                              (self.height, self.width), self.arr.dtype)
            whole = slice(0, self.width)
            if self.transposed:
                read_block(self.arr, whole, slice(b0, b1), out=self.buf[:, :b1 - b0], lanes=lanes)
            else:
                read_block(self.arr, slice(b0, b1), whole, out=self.buf[:b1 - b0], lanes=lanes)
            self.index = b
        o0, o1 = r0 - b * self.height, r1 - b * self.height
        out[...] = self.buf[:, o0:o1] if self.transposed else self.buf[o0:o1]
        return out


def reduce_sum(states: list, name: str) -> np.ndarray:
    """Sum one accumulator over the groups, in row order (deterministic), in float64 (complex128 of
    complex accumulators)."""
    total = None
    for st in states:
        x = np.asarray(st[name])
        x = x.astype(np.complex128 if x.dtype.kind == "c" else np.float64, copy=False)
        total = x.copy() if total is None else total + x
    return total


def collect_rows(states: list, n_rows: int, width: int) -> np.ndarray:
    """Assemble the row blocks that kernels collected (``state["blocks"]``) into ``n_rows x width``
    (float64, or complex128 when a block is complex)."""
    cplx = any(np.asarray(blk).dtype.kind == "c" for st in states for _, blk in st["blocks"])
    out = np.empty((n_rows, width), dtype=np.complex128 if cplx else np.float64)
    for st in states:
        for r0, blk in st["blocks"]:
            out[r0:r0 + blk.shape[0]] = blk
    return out


def _params_token(params: Any) -> Any:
    from dask.base import tokenize

    return tokenize(params)
