"""Row bands of a tall stored array written by tasks on the job's scheduler: the long factor of an
updated SVD (affine maps of the old factor's rows and of ``A``'s rows) and copies of stored rows.

Each task writes whole chunk bands of its destination (no two tasks share a chunk) and computes
them from its rows alone, so the bits do not depend on the scheduler or on how many tasks ran at
once; the tasks run where the job's do (threads, processes, a cluster's workers next to the data).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np

from blocklin.config import format_size
from blocklin.device import pool
from blocklin.errors import BudgetError, explain
from blocklin.runtime.graph import TileGraph
from blocklin.runtime.tiles import open_array, with_task_settings
from blocklin.storage.zarr_store import create_array, open_zarr, read_block, write_block

#: Fewest rows of a band of a new long factor (chunks much shorter only add files).
MIN_BAND = 4096


@dataclasses.dataclass(frozen=True)
class AffineSpec:
    """``dest[r] = old[r] T + c`` for rows ``r < m0`` and ``dest[r] = A[r] W + b`` for ``m0 <= r < m1``
    (``A``'s rows as float64, read ``sub`` rows at a time); ``T, c`` in ``dtype``, ``W, b`` float64
    (complex128 of complex data)."""

    dest: Any
    old: Any
    a: Any
    m0: int
    T: np.ndarray
    c: np.ndarray
    W: np.ndarray
    b: np.ndarray
    dtype: str
    sub: int
    blas_threads: int | None
    sparse: bool = False  # ``a`` is a stored sparse matrix (a blocklin-csr group): its rows read as CSR


@with_task_settings
def affine_band(spec: AffineSpec, r0: int, r1: int) -> dict:
    """Rows ``r0:r1`` of ``dest`` (one chunk band), computed and written whole.

    The band, the old rows and the new rows as read are buffers the run's previous band left
    (:mod:`blocklin.device.pool`: fresh ones fault every page, which cost more than the reads); the maps
    are applied ``PIECE`` bytes of rows at a time, so their temporaries stay in cache. The pieces
    follow from the band alone, so the bits do not depend on the scheduler."""
    dt = np.dtype(spec.dtype)
    k0, k = spec.T.shape
    read = 0
    with pool.borrowed((r1 - r0, k), dt) as block:
        if r0 < spec.m0:  # the old rows' map in the factor's own dtype (stored in it anyway)
            e = min(r1, spec.m0)
            with pool.borrowed((e - r0, k0), dt) as old:
                read_block(open_array(spec.old), slice(r0, e), slice(0, k0), out=old)
                step = _piece_rows(max(k0, k) * dt.itemsize)
                for s0 in range(0, e - r0, step):
                    s1 = min(e - r0, s0 + step)
                    out = block[s0:s1]
                    np.matmul(old[s0:s1], spec.T, out=out)
                    out += spec.c
                read += old.nbytes
        if r1 > spec.m0:
            read += _new_rows(spec, block, r0, max(r0, spec.m0), r1)
        write_block(open_array(spec.dest, mode="r+"), slice(r0, r1), slice(0, k), block)
        written = block.nbytes
    return {"bytes_read": read, "bytes_written": written, "flops": 2 * (r1 - r0) * k * max(k0, 1)}


#: Bytes of rows a map is applied to at once (cache-resident temporaries).
PIECE = 2 << 20


def _piece_rows(row_bytes: int) -> int:
    return max(1, PIECE // max(1, row_bytes))


def _new_rows(spec: AffineSpec, block: np.ndarray, r0: int, lo: int, r1: int) -> int:
    """``block[lo - r0:r1 - r0] = A[lo:r1] W + b``: ``A``'s rows read ``spec.sub`` at a time, cast to
    ``W``'s dtype and mapped a piece at a time; returns the bytes read."""
    if spec.sparse:
        return _new_sparse_rows(spec, block, r0, lo, r1)
    arr = open_array(spec.a)
    n = arr.shape[1]
    wide = spec.W.dtype
    step = _piece_rows(n * wide.itemsize)
    read = 0
    with pool.borrowed((min(spec.sub, r1 - lo), n), arr.dtype) as buf, \
            pool.borrowed((min(step, r1 - lo), n), wide) as cast, \
            pool.borrowed((min(step, r1 - lo), spec.W.shape[1]), wide) as prod:
        for s0 in range(lo, r1, spec.sub):
            s1 = min(r1, s0 + spec.sub)
            rows = read_block(arr, slice(s0, s1), slice(0, n), out=buf[:s1 - s0])
            read += rows.nbytes
            for p0 in range(0, s1 - s0, step):
                h = min(step, s1 - s0 - p0)
                np.copyto(cast[:h], rows[p0:p0 + h])
                np.matmul(cast[:h], spec.W, out=prod[:h])
                prod[:h] += spec.b
                block[s0 + p0 - r0:s0 + p0 - r0 + h] = prod[:h]
    return read


def _new_sparse_rows(spec: AffineSpec, block: np.ndarray, r0: int, lo: int, r1: int) -> int:
    """:func:`_new_rows` of a stored sparse ``A``: its rows read ``spec.sub`` at a time as CSR, their
    values in ``W``'s dtype, mapped by one sparse product each."""
    import scipy.sparse

    from blocklin.storage.sparse import SparseStore

    store = SparseStore(spec.a, name="a")
    n = store.shape[1]
    read = 0
    for s0 in range(lo, r1, spec.sub):
        s1 = min(r1, s0 + spec.sub)
        ptr, idx, val = store.read_rows(s0, s1)
        read += ptr.nbytes + idx.nbytes + val.nbytes
        rows = scipy.sparse.csr_matrix((val.astype(spec.W.dtype), idx, ptr), shape=(s1 - s0, n))
        block[s0 - r0:s1 - r0] = rows @ spec.W + spec.b
    return read


def write_affine(job: Any, dest: Any, old: Any, a: Any, *, m0: int, m1: int, old_map: tuple, new_map: tuple,
                 dtype: Any, old_chunk: int, sparse: bool = False) -> int:
    """Create ``dest`` (``m1 x k``, ``dtype``) and write it by :func:`affine_band` tasks of ``job``;
    ``old`` (``m0 x k0``) and ``a`` (``>= m1`` rows) are stored arrays (``old`` unread when ``m0 == 0``;
    ``sparse``: ``a`` is a stored sparse matrix, its rows counted as dense ones in the budget).
    Returns the bytes written. Refused with the minimum when one band and a row of ``a`` do not fit
    the budget."""
    dt = np.dtype(dtype)
    T, c = (np.ascontiguousarray(x, dtype=dt) for x in old_map)
    wide = np.complex128 if dt.kind == "c" else np.float64  # the new rows' products: float64 or complex128
    W, b = (np.ascontiguousarray(x, dtype=wide) for x in new_map)
    e = np.dtype(wide).itemsize
    k = T.shape[1]
    if sparse:
        from blocklin.storage.sparse import SparseStore

        a_meta = SparseStore(a, name="a")
    else:
        a_meta = open_array(a)
    n = a_meta.shape[1]
    budget = job.cfg.memory
    if k == 0:  # no column to write: an m1 x 0 factor, no task (the sizes below divide by a row's bytes)
        create_array(dest, shape=(m1, 0), dtype=dt, chunks=(max(1, min(int(old_chunk), m1)), 1), codec=job.cfg.codec)
        return 0
    per_row = k * (2 * dt.itemsize + e)  # the band, the old rows read, a product row in float64
    ch = max(1, min(int(old_chunk), max(MIN_BAND, budget // 16 // per_row)))
    band_bytes = ch * per_row
    row_bytes = n * (e + a_meta.dtype.itemsize)  # a row of A as read and as float64
    if band_bytes + row_bytes > budget // 2:
        need = 2 * (band_bytes + row_bytes)
        raise BudgetError(explain("memory", "must hold one chunk band of the long factor while writing it",
                                  format_size(budget), f"pass memory='{format_size(need)}' or more"), minimum=need)
    sub = max(1, (budget // 2 - band_bytes) // row_bytes)
    task_memory = band_bytes + min(sub, ch) * row_bytes
    create_array(dest, shape=(m1, k), dtype=dt, chunks=(ch, k), codec=job.cfg.codec)
    spec = AffineSpec(dest=dest, old=old, a=a, m0=m0, T=T, c=c, W=W, b=b, dtype=dt.name, sub=int(sub),
                      blas_threads=job.task_blas_threads(1), sparse=sparse)
    graph = TileGraph.named("affine-bands", str(dest), m0, m1, ch)
    bands = math.ceil(m1 / ch)
    for i in range(bands):
        graph.add((i,), affine_band, spec, i * ch, min(m1, (i + 1) * ch))
    workers = max(1, min(job.workers(job.cores()), budget // max(1, task_memory), bands))
    # each band takes the buffers the previous one left (affine_band); BLAS threads split among the
    # bands running at once (more would spin against each other)
    with pool.reusing():
        job.run(graph, workers=workers, blas_threads=max(1, job.cores() // workers),
                description="write the long factor")
    return m1 * k * dt.itemsize


@dataclasses.dataclass(frozen=True)
class CopySpec:
    src: Any
    dest: Any
    blas_threads: int | None = None


@with_task_settings
def copy_band(spec: CopySpec, r0: int, r1: int) -> dict:
    """Rows ``r0:r1`` of ``src`` written to ``dest`` (whole chunk bands of ``dest``)."""
    src = open_array(spec.src)
    rows = read_block(src, slice(r0, r1), slice(0, src.shape[1]))
    write_block(open_array(spec.dest, mode="r+"), slice(r0, r1), slice(0, src.shape[1]), rows)
    return {"bytes_read": rows.nbytes, "bytes_written": rows.nbytes}


def copy_rows(job: Any, src: Any, dest: Any) -> None:
    """Copy the stored 2-D array ``src`` into ``dest`` (created with ``src``'s shape, dtype and chunks)
    by bands of chunk rows, as tasks of ``job`` within its budget."""
    arr = open_zarr(src)
    rows, width = arr.shape
    band = int(arr.chunks[0])
    per_task = 2 * band * width * arr.dtype.itemsize  # a band as read, and zarr's copy as written
    if per_task > job.cfg.memory:
        raise BudgetError(explain("memory", "must hold one chunk band of the stored result while copying it",
                                  format_size(job.cfg.memory), f"pass memory='{format_size(per_task)}' or more"),
                          minimum=per_task)
    graph = TileGraph.named("copy-rows", str(src), str(dest))
    for r0 in range(0, rows, band):
        graph.add((r0,), copy_band, CopySpec(src, dest, job.task_blas_threads(1)), r0, min(rows, r0 + band))
    workers = max(1, min(job.workers(job.cores()), job.cfg.memory // per_task, len(graph.tasks)))
    job.run(graph, workers=workers, description="copy the stored result")


__all__ = ["AffineSpec", "CopySpec", "MIN_BAND", "affine_band", "copy_band", "copy_rows", "write_affine"]
