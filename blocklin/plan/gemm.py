"""Planning a blocked GEMM ``C = alpha * op(A) @ op(B) + beta * C0``.

The output is cut into ``tm x tn`` tiles, one task each; a task streams its k-loop in
``tk``-wide panels through the device with ``prefetch`` panels read ahead. Tile sizes are multiples
of the input chunks (so every read covers whole chunks and every write owns whole output chunks)
and are chosen to minimize bytes read, since ``op(A)`` is re-read once per tile column and
``op(B)`` once per tile row, subject to every buffer of every concurrent task fitting the budget.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Iterator

import numpy as np

from blocklin.config import format_size, size_hint
from blocklin.errors import BudgetError, explain
from blocklin.plan.chunks import split
from blocklin.plan.gpu import DEFAULT_GPU, crossover_tile, transfer_bound

#: zarr reads/writes up to this many chunks at once; each may hold one chunk-sized temporary
#: (blocklin caps zarr's concurrency at this value, see blocklin._memory).
IO_CONCURRENCY = 4

#: Per-task bookkeeping cost, in bytes-read equivalents, to prefer fewer, larger tasks.
TASK_OVERHEAD_BYTES = 4 * 2**20
#: Target panel width of the k-loop: wide enough for BLAS efficiency, narrow enough to overlap.
TARGET_TK = 512


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

    @property
    def grid(self) -> tuple[int, int]:
        return (math.ceil(self.m / self.tm) if self.m else 0, math.ceil(self.n / self.tn) if self.n else 0)

    @property
    def k_steps(self) -> int:
        return math.ceil(self.k / self.tk) if self.k else 0

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
        return split(self.k, self.tk)

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["grid"] = list(self.grid)
        d["k_steps"] = self.k_steps
        d["n_tasks"] = self.n_tasks
        return d

    def explain(self) -> str:
        """Human summary of the plan."""
        gm, gn = self.grid
        lines = [
            f"GEMM plan: C[{self.m} x {self.n}] = op(A)[{self.m} x {self.k}] @ op(B)[{self.k} x {self.n}]"
            f" ({self.dtype}{', + beta*C0' if self.with_c else ''}) on {self.device}",
            f"  tiles     {self.tm} x {self.tn} (grid {gm} x {gn} = {self.n_tasks} tasks),"
            f" k-panels {self.tk} wide ({self.k_steps} steps), prefetch {self.prefetch}",
            f"  output    chunks {self.out_chunks[0]} x {self.out_chunks[1]}",
            f"  threads   {self.workers} concurrent task(s) x {self.blas_threads} BLAS thread(s)",
            f"  work      {self.flops / 1e9:.1f} GFLOP, read {format_size(self.bytes_read)},"
            f" write {format_size(self.bytes_written)}",
            f"  memory    peak {format_size(self.peak_memory)} of {format_size(self.memory)} host budget"
            f" ({format_size(self.task_memory)} per task)",
        ]
        if self.device_peak is not None:
            lines.append(f"  device    peak {format_size(self.device_peak)} of "
                         f"{format_size(self.device_memory or 0)} device budget")
            if transfer_bound(self.tm, self.tn, self.dtype):
                lines.append(f"  note      {self.tm} x {self.tn} tiles are transfer-bound on an {DEFAULT_GPU} over PCIe "
                             f"(compute-bound from ~{crossover_tile(self.dtype)} square for {self.dtype}); "
                             "a larger device_memory allows larger tiles")
        return "\n".join(lines)


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


def _task_memory(tm: int, tn: int, tk: int, *, isz: int, src_isz: tuple[int, int], prefetch: int, with_c: bool,
                 c_rows: int, io_chunk_bytes: int, out_chunk_bytes: int, on_gpu: bool,
                 read_chunks: int = IO_CONCURRENCY, write_chunks: int = IO_CONCURRENCY,
                 out_rows: int = 0, loaders: int = 1) -> tuple[int, int]:
    """(host bytes, device bytes) of one task's buffers (``loaders`` threads reading at once)."""
    slots = prefetch + 1
    panels_src = tm * tk * src_isz[0] + tk * tn * src_isz[1]
    cast = slots * (tm * tk + tk * tn) * isz if src_isz != (isz, isz) else 0
    # zarr holds a raw and a decoded copy of each chunk in flight on reads (plus our copy-in), and an
    # encoded copy on writes: measured, not guessed (tests/test_gemm_memory.py).
    io = (loaders * min(IO_CONCURRENCY, read_chunks) * 3 * io_chunk_bytes
          + min(IO_CONCURRENCY, write_chunks) * 2 * out_chunk_bytes)
    c_strip = (out_rows or c_rows) * tn * isz if with_c else 0  # C is read in output-chunk strips
    if on_gpu:
        host = slots * panels_src + cast + c_strip + 3 * out_rows * tn * isz + io
        device = tm * tn * isz + slots * (tm * tk + tk * tn) * isz + c_strip
        return host, device
    return tm * tn * isz + slots * panels_src + cast + c_strip + io, 0


def plan_gemm(m: int, n: int, k: int, dtype, *, a_chunks: tuple[int, int], b_chunks: tuple[int, int],
              memory: int, source_dtypes: tuple | None = None, c_chunks: tuple[int, int] | None = None,
              workers: int | None = None, cores: int | None = None, prefetch: int | None = None, device: str = "cpu",
              device_memory: int | None = None, out_chunks: tuple[int, int] | None = None) -> GemmPlan:
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
    isz = dt.itemsize
    auto_prefetch = prefetch is None
    prefetch = 1 if prefetch is None else max(0, int(prefetch))
    src = tuple(np.dtype(s) for s in (source_dtypes or (dt, dt)))
    src_isz = (src[0].itemsize, src[1].itemsize)
    cores = cores or os.cpu_count() or 1
    workers = max(1, int(workers or 1))
    blas_threads = max(1, cores // workers)
    on_gpu = device == "gpu"
    with_c = c_chunks is not None
    c_rows = min(m, c_chunks[0]) if with_c else 0
    if on_gpu and device_memory is None:
        raise BudgetError(explain("device_memory", "must be known to plan on a GPU", "None",
                                  "pass device_memory='8GiB' or let the runtime measure free memory"))
    mu, ku_a = max(1, a_chunks[0]), max(1, a_chunks[1])
    ku_b, nu = max(1, b_chunks[0]), max(1, b_chunks[1])
    ku = ku_a * ku_b // math.gcd(ku_a, ku_b)
    if ku > max(ku_a, ku_b) * 4 or ku > k:
        ku = max(ku_a, ku_b)
    ku = min(ku, max(1, k))
    io_chunk = max(a_chunks[0] * a_chunks[1] * src_isz[0], b_chunks[0] * b_chunks[1] * src_isz[1])

    def out_chunks_for(tm: int, tn: int) -> tuple[int, int]:
        if out_chunks is not None:
            return out_chunks
        # Prefer the input chunking (what later operations expect) when it tiles the output tile.
        r = mu if tm % mu == 0 or tm == m else tm
        c = nu if tn % nu == 0 or tn == n else tn
        return (max(1, min(r, m)), max(1, min(c, n)))

    best = None
    tk_target = min(max(1, k), max(ku, (TARGET_TK // ku) * ku))
    tk_options = sorted({t for t in (tk_target, ku) if t >= 1}, reverse=True)
    m_, n_ = max(m, 1), max(n, 1)
    for tm in _candidates(m_, mu):
        for tn in _candidates(n_, nu):
            oc = out_chunks_for(tm, tn)
            if tm % oc[0] and tm != m_ or tn % oc[1] and tn != n_:
                continue
            for tk in tk_options:
                host, dev = _task_memory(tm, tn, tk, isz=isz, src_isz=src_isz, prefetch=prefetch, with_c=with_c,
                                         c_rows=c_rows, io_chunk_bytes=io_chunk,
                                         out_chunk_bytes=oc[0] * oc[1] * isz, on_gpu=on_gpu,
                                         read_chunks=max(-(-tm // mu) * -(-tk // ku_a), -(-tk // ku_b) * -(-tn // nu)),
                                         write_chunks=-(-tm // oc[0]) * -(-tn // oc[1]), out_rows=oc[0])
                if host * workers > memory or (on_gpu and dev * workers > device_memory):
                    continue
                gm, gn = math.ceil(m_ / tm), math.ceil(n_ / tn)
                read = (m * k * src_isz[0]) * gn + (k * n * src_isz[1]) * gm
                tasks = gm * gn
                idle = max(0, workers - tasks)  # concurrent slots with no tile to run
                cost = read + tasks * TASK_OVERHEAD_BYTES + idle * (m * n * k * isz) // max(1, tasks * 64)
                key = (cost, -tk, -(tm * tn))
                if best is None or key < best[0]:
                    best = (key, tm, tn, tk, host, dev, oc, read)
                break  # the widest tk that fits
    if best is None:
        host, dev = _task_memory(min(m_, mu), min(n_, nu), min(max(1, k), ku), isz=isz, src_isz=src_isz,
                                 prefetch=prefetch, with_c=with_c, c_rows=c_rows, io_chunk_bytes=io_chunk,
                                 out_chunk_bytes=min(m_, mu) * min(n_, nu) * isz, on_gpu=on_gpu,
                                 read_chunks=1, write_chunks=1, out_rows=min(m_, mu))
        need = host * workers
        which = "memory"
        if on_gpu and host * workers <= memory:
            need, which = dev * workers, "device_memory"
        raise BudgetError(explain(
            which, "must hold the smallest tiles of every concurrent task "
            f"({workers} task(s) of {min(m_, mu)} x {min(n_, nu)} with {min(max(1, k), ku)}-wide panels)",
            f"{format_size(memory if which == 'memory' else device_memory)}",
            f"raise it to at least {format_size(need)} ({which}='{size_hint(need)}'), "
            "use fewer workers, or rechunk the inputs smaller (blocklin convert --chunks)"))
    _, tm, tn, tk, host, dev, oc, read = best
    if auto_prefetch and on_gpu:
        for depth in (3, 2):  # read further ahead when the budgets allow it with the same tiles
            h2, d2 = _task_memory(tm, tn, tk, isz=isz, src_isz=src_isz, prefetch=depth, with_c=with_c,
                                  c_rows=c_rows, io_chunk_bytes=io_chunk, out_chunk_bytes=oc[0] * oc[1] * isz,
                                  on_gpu=True,
                                  read_chunks=max(-(-tm // mu) * -(-tk // ku_a), -(-tk // ku_b) * -(-tn // nu)),
                                  write_chunks=-(-tm // oc[0]) * -(-tn // oc[1]), out_rows=oc[0], loaders=depth)
            if h2 * workers <= memory and d2 * workers <= device_memory:
                prefetch, host, dev = depth, h2, d2
                break
    c_read = m * n * isz if with_c else 0
    return GemmPlan(
        m=m, n=n, k=k, dtype=dt.name, source_dtypes=(src[0].name, src[1].name), tm=tm, tn=tn, tk=tk,
        out_chunks=oc, workers=workers, blas_threads=blas_threads, prefetch=prefetch, device=device,
        memory=memory, device_memory=device_memory, flops=2 * m * n * k, bytes_read=read + c_read,
        bytes_written=m * n * isz, peak_memory=host * workers, task_memory=host,
        device_peak=dev * workers if on_gpu else None, with_c=with_c,
    )
