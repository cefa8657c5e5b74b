"""Tile tasks and row-pass kernels of the out-of-core inverse (:mod:`blocklin.linalg.inverse.inverse`).

Everything here runs inside a scheduler task: small frozen specs (paths, offsets, plans) come in,
stores are opened per process, blocks stream through the device, and small statistics (sums of
squares, probe products, reciprocal condition numbers) go back. Results are reduced by the caller
in a fixed order, so they do not depend on the scheduler.

Contents
--------
* the random butterfly transformation (RBT) of Givens rotations: :class:`Butterfly`;
* :class:`InverseEpilogue`: what each region GEMM tile (:mod:`blocklin.runtime.blockops`) adds for
  the inverse: ``+ I`` and ``||tile||_F^2``;
* :func:`leaf_inverse_task`: in-core LU inversion with partial pivoting of a diagonal region;
* :func:`unmix_columns_task`: ``X[:, cols] = V @ Y[:, cols]`` (undo the RBT), with ``||X||_F^2``;
* row-pass kernels, with their declared memory: :func:`mix_kernel` (``W = M V``),
  :func:`products_kernel` (the probe products ``X P``), :func:`probe_kernel` (``P - M (X P)``).
* :data:`MEMORY`: the tasks' memory declarations that the planner reads.
"""

from __future__ import annotations

import dataclasses
import math
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from blocklin.device import pool
from blocklin.device.cpu import CpuDevice, trsm_inplace
from blocklin.linalg.blocks.random import probes
from blocklin.linalg.blocks.scaling import exponent_for
from blocklin.plan.chunks import split
from blocklin._memory import IO_CONCURRENCY
from blocklin.plan.inverse import KernelMemory
from blocklin.plan.passes import PassMemory
from blocklin.runtime.passes import row_kernel
from blocklin.runtime.powers import ldexp
from blocklin.runtime.tiles import Epilogue, open_array, with_task_settings
from blocklin.storage.rawchunks import raw_access
from blocklin.storage.zarr_store import read_block, write_block


#: Probe vectors of the residual estimate (``linalg.refine``).
PROBES = 32
#: zarr chunk temporaries of one tile task: a chunk in flight reading and one writing, each of up to
#: ``IO_CONCURRENCY`` (see ``blocklin._memory``).
IO_CHUNKS = 2 * IO_CONCURRENCY
#: Most columns of the leaf's ``getri`` workspace (LAPACK's block size for it, 64 in the reference
#: ``ilaenv``); narrower where the working chunk is (a smaller workspace only narrows its blocks).
GETRI_BLOCK = 64
_HOST = CpuDevice()


def wide(dtype: Any) -> np.dtype:
    """The dtype the reductions of a ``dtype`` block run in: float64, or complex128 for complex data."""
    return np.dtype(np.complex128 if np.dtype(dtype).kind == "c" else np.float64)


def sumsq(x: np.ndarray) -> float:
    """``||x||_F^2`` (``sum |x_ij|^2`` of complex data) in float64 without a full-size temporary."""
    total = 0.0
    rows = max(1, (1 << 18) // max(1, x.shape[1])) if x.ndim == 2 and x.shape[1] else max(1, x.shape[0])
    for r0 in range(0, x.shape[0], rows):
        blk = np.asarray(x[r0:r0 + rows], dtype=wide(x.dtype))
        for part in ((blk.real, blk.imag) if blk.dtype.kind == "c" else (blk,)):
            total += float(np.einsum("ij,ij->", part, part))
    return total


def sumsq_acc(device: Any, cols: int, dtype: Any) -> Any:
    """The float64 accumulator of :func:`sumsq_cols_acc` on ``device`` for ``cols`` columns of ``dtype``
    (``2 cols`` of complex data: the real and imaginary parts' columns; only its total is read)."""
    return device.zeros((2 * cols if np.dtype(dtype).kind == "c" else cols,), np.float64)


def sumsq_cols_acc(device: Any, acc: Any, x: Any) -> None:
    """``acc += |x_ij|^2`` summed down the columns on ``device``: of complex data, the squares of the real
    and imaginary parts, interleaved (the device's ``x * x`` would square the complex numbers)."""
    device.sumsq_cols_acc(acc, x.view(np.finfo(x.dtype).dtype) if x.dtype.kind == "c" else x)



# -- the inverse's GEMM epilogue ----------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class InverseEpilogue(Epilogue):
    """What the inverse takes from each region GEMM tile (``out = alpha A B + beta C``).

    ``identity``: add ``I`` where the global output row equals the global column (``I - M X``);
    always the tile's ``sumsq`` (``||tile||_F^2`` in float64).
    """

    identity: bool = False
    #: On a GPU: ``+ I`` and the sums of squares on the device (no host flops).
    on_device = True

    def begin(self, rows: slice, cols: slice, out_off: tuple[int, int]) -> dict:
        return {"rows": rows, "cols": cols, "off": out_off, "sumsq": 0.0}

    def _diagonal(self, st: dict, r0: int, r1: int) -> tuple[int, int, int]:
        """The global diagonal entries in strip ``r0:r1``: ``(first row in the strip, its column, count)``."""
        rows, cols, (o0, o1) = st["rows"], st["cols"], st["off"]
        lo = max(o0 + rows.start + r0, o1 + cols.start)
        hi = min(o0 + rows.start + r1, o1 + cols.stop)
        return lo - o0 - rows.start - r0, lo - o1 - cols.start, max(0, hi - lo)

    def device_strip(self, st: dict, device: Any, acc: Any, r0: int, r1: int) -> None:
        if "ss" not in st:  # the tile's device state, downloaded once by end()
            st["device"], st["ss"] = device, sumsq_acc(device, acc.shape[1], acc.dtype)
        if self.identity:
            i0, c0, count = self._diagonal(st, r0, r1)
            if count:
                device.add_identity(acc[i0:i0 + count], c0)
        sumsq_cols_acc(device, st["ss"], acc)

    def strip(self, st: dict, block: np.ndarray, r0: int, r1: int) -> None:
        if self.identity:  # global diagonal entries that fall in this strip
            i0, c0, count = self._diagonal(st, r0, r1)
            if count:
                g = np.arange(count)
                block[i0 + g, c0 + g] += 1
        st["sumsq"] += sumsq(block)

    def end(self, st: dict) -> dict:
        if "device" in st:
            st["sumsq"] += float(np.asarray(st["device"].to_host(st["ss"])).sum())
        return {"sumsq": st["sumsq"]}


# -- random butterfly transformation ----------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Butterfly:
    """A random butterfly ``V = G_1 G_2 ... G_d`` of Givens rotations (orthogonal, ``n x n``).

    Level ``l`` cuts ``range(n)`` into ``2**(l-1)`` segments; in a segment of length ``L`` it rotates
    index ``s + i`` with ``s + h + i`` (``h = L // 2``, ``i < h``) by a random angle; with an odd
    ``L`` the last index of the segment is left alone at that level. This is the recursive butterfly
    of Parker (1995) with rotations in place of his random diagonal pairs, which keeps ``V``
    orthogonal (no loss of accuracy, ``||M V||_F = ||M||_F``), as in the "random butterfly
    matrices" studied by Peca-Medlin and Trogdon (2023). ``depth=0`` is the identity.
    """

    n: int
    depth: int
    seed: int

    def levels(self) -> list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]]:
        """``(p, q, cos, sin)`` index pairs and rotations of every level, outermost first."""
        rng = np.random.default_rng(self.seed)
        out = []
        segments = [(0, self.n)]
        for _ in range(self.depth):
            ps, qs, nxt = [], [], []
            for s, e in segments:
                h = (e - s) // 2
                if h == 0:
                    continue
                ps.append(np.arange(s, s + h))
                qs.append(np.arange(s + h, s + 2 * h))
                nxt += [(s, s + h), (s + h, e)]
            if not ps:
                break
            p, q = np.concatenate(ps), np.concatenate(qs)
            theta = rng.uniform(0.0, 2.0 * np.pi, size=p.size)
            out.append((p, q, np.cos(theta), np.sin(theta)))
            segments = nxt
        return out

    def coefficients(self, device: Any = None) -> list[list[tuple[int, int, int, Any, Any, Any]]]:
        """The levels as contiguous index-range pairs, ready for ``device``: per level the tuples
        ``(p0, q0, h, cos, sin, -sin)`` (indices ``p0 + i`` and ``q0 + i``, ``i < h``; vectors where
        ``device`` computes, the host by default). Built once per task, used for every strip."""
        put = device.to_device if device is not None else np.ascontiguousarray
        out = []
        for p, q, c, s in self.levels():
            breaks = (np.flatnonzero(np.diff(p) != 1) + 1).tolist()  # one range pair per segment
            out.append([(int(p[lo]), int(q[lo]), hi - lo, put(c[lo:hi]), put(s[lo:hi]), put(-s[lo:hi]))
                        for lo, hi in zip([0, *breaks], [*breaks, p.size])])
        return out

    def right(self, x: Any, transpose: bool = False, device: Any = None, coef: list | None = None) -> Any:
        """``x @ V`` (``x @ V^T`` with ``transpose``) in place on the columns of ``x`` (rows independent).

        ``x`` is a host array, or a device array of ``device`` with ``coef`` from :meth:`coefficients`."""
        dev = device or _HOST
        levels = coef if coef is not None else self.coefficients(device)
        for level in (reversed(levels) if transpose else levels):
            for p0, q0, h, c, s, neg in level:
                dev.rotate_pairs(x, p0, q0, h, c, neg if transpose else s, axis=1)
        return x

    def left(self, y: Any, transpose: bool = False, device: Any = None, coef: list | None = None) -> Any:
        """``V @ y`` (``V^T @ y`` with ``transpose``) in place on the rows of ``y`` (columns independent)."""
        dev = device or _HOST
        levels = coef if coef is not None else self.coefficients(device)
        for level in (levels if transpose else reversed(levels)):
            for p0, q0, h, c, s, neg in level:
                dev.rotate_pairs(y, p0, q0, h, c, s if transpose else neg, axis=0)
        return y


# -- row-pass kernels ----------------------------------------------------------------------------------


def mix_init(device: Any, params: Any) -> dict:
    return {"sumsq": 0.0}


def staging_memory(n: int, work_dtype: Any, source_dtype: Any) -> PassMemory:
    """Memory of one task of :func:`mix_kernel` streaming rows of width ``n``.

    Per row: the float64 copy (unless the stored rows are float64), the butterfly's gathered halves
    and their rotated sums (three halves at once) and the cast block written (unless the work dtype
    is float64). No zarr chunk temporaries are counted: strips of whole working-chunk rows go through
    the direct chunk-file path where the store allows it, and the budget must not refuse a matrix
    stored in chunks larger than the working ones.
    """
    f64 = wide(work_dtype)  # float64, complex128 for complex data
    per_row = 3 * n * f64.itemsize
    per_row += 0 if np.dtype(source_dtype) == f64 else n * f64.itemsize
    per_row += 0 if np.dtype(work_dtype) == f64 else n * np.dtype(work_dtype).itemsize
    return PassMemory(fixed=0, per_row=per_row)


def _mix_memory(params: Any, sources: tuple) -> PassMemory:
    return staging_memory(sources[0].width, params["dtype"], sources[0].dtype)


@row_kernel(memory=_mix_memory, init=mix_init, device="any")
def mix_kernel(device: Any, arrays: tuple, rows: slice, params: dict, state: dict) -> tuple[dict, dict]:
    """``W[rows] = (M[rows] @ V).astype(work dtype)`` (``I - M`` when ``shift``); accumulate ``||.||_F^2``.

    Runs where the caller chose (:func:`transform_device`): the rotations are a few flops per byte read."""
    if not device.host_resident:
        return _mix_on_device(device, arrays[0], rows, params, state)
    (m,) = arrays
    x = np.asarray(m, dtype=wide(params["dtype"]))
    if params["shift"]:  # stage I - M
        x = -x if x is not m else np.negative(x, out=x)
        idx = np.arange(rows.stop - rows.start)
        x[idx, rows.start + idx] += 1.0
    state["sumsq"] += sumsq(x)
    bf: Butterfly = params["butterfly"]
    if bf.depth:
        if "coef" not in state:
            state["coef"] = bf.coefficients()
        x = bf.right(x, transpose=params["transpose"], coef=state["coef"])  # in place: the strip buffer is not reused before the write
    if rows.stop in params["ends"]:
        state.pop("coef", None)
    return state, {"w": x.astype(params["dtype"], copy=False)}


def _mix_on_device(device: Any, m: Any, rows: slice, params: dict, state: dict) -> tuple[dict, dict]:
    """:func:`mix_kernel` with the strip on a GPU: rotations and norms there, ``W`` downloaded."""
    x = device.cast(m, wide(params["dtype"]))
    if not x.flags.c_contiguous:
        x = device.copy(x)
    n = x.shape[1]
    if "ss" not in state:  # the task's device state: norms, butterfly coefficients
        state["ss"] = sumsq_acc(device, n, x.dtype)
        state["coef"] = params["butterfly"].coefficients(device)
    if params["shift"]:  # stage I - M (the uploaded strip is ours to overwrite)
        device.axpby(x, -1.0, None, 0.0)
        device.add_identity(x, rows.start)
    sumsq_cols_acc(device, state["ss"], x)
    if params["butterfly"].depth:
        params["butterfly"].right(x, transpose=params["transpose"], device=device, coef=state["coef"])
    w = device.to_host(device.cast(x, params["dtype"]))
    if rows.stop in params["ends"]:  # the task's last strip: its state to the host for the reduction
        state = {"sumsq": state["sumsq"] + float(device.to_host(state["ss"]).sum())}
    return state, {"w": w}


def probe_init(device: Any, params: Any) -> dict:
    return {"sumsq": 0.0}


def _probe_memory(params: Any, sources: tuple) -> PassMemory:
    """The broadcast ``W = X P`` and the regenerated probes; per row a float64 strip and residual rows."""
    n, k = params["w"].shape
    isz = params["w"].dtype.itemsize  # float64, complex128 for complex data
    return PassMemory(fixed=3 * n * k * isz, per_row=(sources[0].width + 3 * k) * isz)


@row_kernel(memory=_probe_memory, init=probe_init, device="any")
def probe_kernel(device: Any, arrays: tuple, rows: slice, params: dict, state: dict) -> tuple[dict, None]:
    """Accumulate ``||P[rows] - M[rows] @ W||_F^2`` with ``W = X P`` (``P`` regenerated from its seed)."""
    (m,) = arrays
    w = params["w"]  # float64, or complex128 for complex data
    p = probes(params["n"], w.shape[1], params["seed"])[rows]
    if not device.host_resident:  # the GEMM on the GPU, W kept there for the task's strips
        if "wd" not in state:
            state["wd"] = device.to_device(w)
            state["ss"] = sumsq_acc(device, w.shape[1], w.dtype)
        r = device.to_device(p.astype(w.dtype, copy=False))
        device.gemm_acc(r, device.cast(m, w.dtype), state["wd"], alpha=-1.0)
        sumsq_cols_acc(device, state["ss"], r)
        if rows.stop in params["ends"]:
            state = {"sumsq": state["sumsq"] + float(device.to_host(state["ss"]).sum())}
        return state, None
    r = p - np.asarray(m, dtype=w.dtype) @ w
    state["sumsq"] += sumsq(r)
    return state, None


def transform_device(requested: str, n: int, flops_per_entry: float, resolved: str | None = None) -> str:
    """Where a butterfly or probe pass over an ``n x n`` float64 operand runs: ``requested``, or for
    ``"auto"`` the GPU only where it wins (:func:`blocklin.device.select.pass_device`; these passes
    do a few flops per byte read, so ``auto`` keeps them on the CPU)."""
    from blocklin.device.select import pass_device

    return pass_device(requested, flops_per_entry * n * n, 8.0 * n * n, resolved)


def products_init(device: Any, params: Any) -> dict:
    return {"p": probes(params["n"], params["k"], params["seed"]), "blocks": []}


def _products_memory(params: Any, sources: tuple) -> PassMemory:
    """The ``n x k`` probes regenerated once per task; per row a float64 copy of a non-float64
    strip and the collected rows of ``X P``."""
    n, k, isz = sources[0].width, params["k"], wide(sources[0].dtype).itemsize
    cast = 0 if sources[0].dtype == wide(sources[0].dtype) else n * isz
    return PassMemory(fixed=n * k * 8, per_row=cast + k * isz)


@row_kernel(memory=_products_memory, init=products_init, device="cpu")
def products_kernel(device: Any, arrays: tuple, rows: slice, params: dict, state: dict) -> tuple[dict, None]:
    """Rows ``(X P)[rows] = X[rows] @ P`` of the probe products (collected, disjoint across tasks)."""
    (x,) = arrays
    state["blocks"].append((rows.start, np.asarray(x, dtype=wide(x.dtype)) @ state["p"]))
    if rows.stop in params["ends"]:  # the task's last strip: send back the rows, not the probes
        del state["p"]
    return state, None


# -- leaf inversion ---------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class LeafSpec:
    """Invert the diagonal region ``[off, off + size)^2`` of ``src`` into ``[dst_off, dst_off + size)^2``
    of ``dst`` (``dst_off``: ``off`` when None).

    ``probe_seed`` (the whole matrix in one leaf, read straight from the input): the task also
    checks the input for NaN/Inf, returns ``||M||_F^2`` (``norm_sumsq``) and the probed residual
    ``||P^T - (P^T M) X||_F^2 / k`` (``probe_sumsq``) with the probes of that seed, so that nothing is
    staged and no pass is made after it.
    """

    src: str
    dst: str
    off: int
    size: int
    dtype: str
    blas_threads: int | None = None
    device: str = "cpu"
    device_memory: int | None = None
    dst_off: int | None = None
    probe_seed: int | None = None
    check_finite: bool = True
    #: Rows of the inverse solved and written at a time (whole chunk rows of ``dst``; None: all).
    width: int | None = None
    #: Gather the row and column maxima first (the one-leaf inverse of the input), and where LAPACK's rule
    #: equilibrates return them (``"equilibration"``, ``"equilibrate": True``) without inverting.
    equilibrate: bool = False

    @property
    def dst_slice(self) -> slice:
        d = self.off if self.dst_off is None else self.dst_off
        return slice(d, d + self.size)


def _leaf_on_gpu(spec: LeafSpec, a: np.ndarray, anorm: float) -> tuple[float, int]:
    """Inverse on the GPU (cuSOLVER LU), downloaded into ``a`` (no second host block); the exact
    ``1 / (||A||_inf ||A^-1||_inf)`` stands for gecon's estimate (LAPACK on the CPU factors ``A^T``
    in the 1-norm: the same quantity)."""
    from blocklin.device import get_device
    from blocklin.errors import SingularMatrixError

    dev = get_device("gpu", device_memory=spec.device_memory)
    try:
        with dev.reserve(3 * a.nbytes):  # the block, cuSOLVER's LU of it and the inverse
            dev.download(dev.inv(dev.to_device(a)), slice(0, a.shape[0]), out=a)
    except SingularMatrixError:
        return 0.0, 1
    xnorm = _inf_norm(a)  # ||A^-1||_inf
    return (1.0 / (anorm * xnorm) if anorm > 0 and xnorm > 0 else 0.0), 0


def _leaf_strip(size: int) -> int:
    """Rows of the strips the leaf task reduces (norms, finiteness, probes) without a block-sized
    temporary: 256, and at most an eighth of a small block."""
    return max(1, min(256, size // 8))


def _inf_norm(a: np.ndarray) -> float:
    # NumPy's max: a NaN of the data (check_finite=False) is kept, which Python's max drops. Row sums in
    # float64: a float32 block near 2^126 has row sums beyond float32's range, and an Inf norm had made
    # gecon's rcond 0 for a block that inverts.
    return float(np.max([np.abs(a[r0:r1]).sum(axis=1, dtype=np.float64).max()
                         for r0, r1 in split(a.shape[0], _leaf_strip(a.shape[0]))], initial=0.0))


def _max_abs(a: np.ndarray) -> float:
    """``max |a|`` strip by strip: ``np.abs(a)`` would be a second block beside the one the leaf
    declares (72 MiB more for a 3072 x 3072 float64 leaf). NaN is kept, as in :func:`_inf_norm`."""
    return float(np.max([np.abs(a[r0:r1]).max(initial=0.0) for r0, r1 in split(a.shape[0], _leaf_strip(a.shape[0]))],
                        initial=0.0))


def leaf_memory(size: int, work_dtype: Any, chunk_bytes: int, probed: bool = False) -> int:
    """Memory of :func:`leaf_inverse_task` on a ``size x size`` block.

    The block itself, factored and inverted in place (``getrf``, ``getri``), ``getri``'s workspace
    (at most :data:`GETRI_BLOCK` columns, and no wider than a working chunk); the probe's float64 copy of a written strip of a float32 block
    (as wide as a working chunk, ``sqrt(chunk_bytes / itemsize)`` rows, at most ``size``); a float64 strip and its absolute values for the reductions, and
    :func:`sumsq`'s float64 rows of a float32 block; with ``probed`` (the one-leaf inverse read
    straight from the input) the probes, ``P^T M`` and the probed residual (five ``k x size``
    float64 arrays); and zarr's chunk temporaries of the read and the write. Of complex data each
    float64 array is complex128 (:func:`wide`).
    """
    dt = np.dtype(work_dtype)
    item, wdt = dt.itemsize, wide(dt)
    strips = _leaf_strip(size) * size * (wdt.itemsize + item)
    if dt != wdt:
        strips += min(size * size, 1 << 18) * wdt.itemsize
    probes_ = 5 * PROBES * size * wdt.itemsize if probed else 0
    width = min(size, math.isqrt(chunk_bytes // item))
    work = size * min(width, GETRI_BLOCK) * item  # getri's workspace
    cast = width * size * wdt.itemsize if probed and dt != wdt else 0  # a strip's float64 probe copy
    return size * size * item + work + cast + strips + probes_ + IO_CHUNKS * chunk_bytes


def _getri_lwork(query: Any, n: int, width: int) -> int:
    """getri's workspace: its optimum (``n`` times its block size), at most ``min(width, GETRI_BLOCK)``
    columns (what :func:`leaf_memory` declares), at least one."""
    return max(n, min(int(np.real(query(n)[0])), n * min(width, GETRI_BLOCK)))  # complex getri: a complex lwork


def _read_leaf(spec: LeafSpec, dtype: np.dtype) -> np.ndarray:
    """The block in the work dtype, read into one preallocated array (a different stored dtype is
    cast strip by strip: no second block)."""
    src = open_array(spec.src)
    sl = slice(spec.off, spec.off + spec.size)
    a = pool.aligned_empty((spec.size, spec.size), dtype)  # a chunk read's destination: page-aligned
    if src.dtype == dtype:
        return read_block(src, sl, sl, out=a)
    for r0, r1 in split(spec.size, _leaf_strip(spec.size)):
        a[r0:r1] = read_block(src, slice(spec.off + r0, spec.off + r1), sl)
    return a


def _input_checks(spec: LeafSpec, a: np.ndarray) -> tuple[float, np.ndarray, float]:
    """NaN/Inf check, ``||M||_F^2``, ``Q = P^T M`` (``k x size``, float64) and ``||M||_inf`` of the
    one-leaf inverse, in one sweep over the block (each strip reduced while it is in cache)."""
    from blocklin.runtime.tiles import check_finite

    p = probes(spec.size, PROBES, spec.probe_seed)
    q = np.zeros((PROBES, spec.size), dtype=wide(a.dtype))
    ss = anorm = 0.0
    for r0, r1 in split(spec.size, _leaf_strip(spec.size)):
        blk = a[r0:r1]
        if spec.check_finite:
            check_finite(blk, "a", slice(r0, r1), slice(0, spec.size))
        blk = np.asarray(blk, dtype=q.dtype)
        ss += sumsq(blk)
        q += p[r0:r1].T @ blk
        anorm = float(np.maximum(anorm, np.abs(blk).sum(axis=1).max()))  # NaN kept
    return ss, q, anorm


def _equilibration(a: np.ndarray) -> Any:
    """LAPACK's scalings of the block and the decision to apply them, strip by strip (the strips' magnitudes
    are the reductions' strips :func:`leaf_memory` counts)."""
    from blocklin.linalg.blocks.equilibrate import ColumnMaxima, decide, strip_maxima

    rmax = np.empty(a.shape[0])
    cmax = ColumnMaxima.empty(a.shape[1])
    for r0, r1 in split(a.shape[0], _leaf_strip(a.shape[0])):
        rmax[r0:r1], c = strip_maxima(a[r0:r1])
        cmax.merge(c)
    return decide(rmax, cmax, a.dtype)


@with_task_settings
def leaf_inverse_task(spec: LeafSpec) -> dict:
    """LU with partial pivoting (LAPACK getrf/gecon/getri) of one block that fits the budget.

    Returns ``rcond`` (LAPACK's 1-norm reciprocal condition estimate), ``info`` (``> 0``: exact
    zero pivot) and the sum of squares of the inverse (and, with ``probe_seed``, see
    :class:`LeafSpec`). The block is stored row-major; LAPACK sees its transpose ``A^T`` and factors
    it in place, and ``getri`` inverts it in place (``(A^T)^-1``, which read row-major is ``A^-1``):
    ``2 n^3`` flops against ``8 n^3 / 3`` for ``getrs`` on the identity, and no right-hand side strip.
    With its optimal blocked workspace ``getri`` took 0.88 s against 1.3-1.7 s for ``getrs`` strips at
    n = 4096 here. The inverse is written ``width`` rows at a time. The residuals of ``getri``'s
    method are analysed by Du Croz and Higham (1992); the probe checks the right one, ``A X - I``.
    """
    from scipy.linalg import lapack

    t0 = time.perf_counter()
    dtype = np.dtype(spec.dtype)
    a = _read_leaf(spec, dtype)
    extra: dict = {}
    if spec.equilibrate:
        eq = _equilibration(a)
        extra["equilibration"] = eq
        if eq.applied:  # the route stages R A C and inverts that instead
            return {"equilibrate": True, "equilibration": eq, "info": 0, "rcond": math.nan, "sumsq": math.nan,
                    "flops": 0, "bytes_read": a.nbytes, "bytes_written": 0, "off": spec.off, "size": spec.size,
                    "anorm": math.nan, "seconds": time.perf_counter() - t0}
    if spec.probe_seed is not None:
        norm_ss, q, anorm = _input_checks(spec, a)
        extra["norm_sumsq"] = norm_ss
    else:
        anorm = _inf_norm(a)
    flops = 2 * spec.size**3
    nbytes = a.nbytes
    failed = {"rcond": 0.0, "sumsq": float("nan"), "flops": flops, "bytes_read": nbytes, "bytes_written": 0,
              "off": spec.off, "size": spec.size, "anorm": anorm, **extra}  # anorm: NaN data is not singular
    dst = open_array(spec.dst, mode="r+")
    d0 = spec.dst_slice.start
    cols = spec.dst_slice
    resid = probes(spec.size, PROBES, spec.probe_seed).T.astype(wide(dtype)) if spec.probe_seed is not None else None
    ss = 0.0

    def put_all() -> None:
        """Write the block's rows strip by strip, each strip's sums and probes computed while it is
        written. Strips of whole chunk files (no zarr temporaries, no cast copy, no chunk shared
        between strips) go two at a time, which halves the page-cache copy here; others in order."""
        nonlocal ss
        strips = split(spec.size, spec.width or spec.size)
        raw = raw_access(dst)
        parallel = raw is not None and np.dtype(dst.dtype) == a.dtype and all(raw.aligned(slice(d0 + r0, d0 + r1), cols) for r0, r1 in strips)
        writer = ThreadPoolExecutor(2 if parallel else 1, thread_name_prefix="blocklin-write")
        writes: list = []
        try:
            for r0, r1 in strips:
                rows = a[r0:r1]
                writes.append(writer.submit(write_block, dst, slice(d0 + r0, d0 + r1), cols, rows))
                # an inverse beyond the dtype's range holds Inf here (float32 data near 1e-39): its sums
                # and probe products overflow or make NaN, which the route names as a range error
                # (routes.invert_direct, _recursion_range) from the sums returned, not a NumPy warning
                with np.errstate(over="ignore", invalid="ignore"):
                    ss += sumsq(rows)
                    if resid is not None:
                        resid[...] -= q[:, r0:r1] @ np.asarray(rows, dtype=resid.dtype)
        finally:
            try:
                for w in writes:  # every strip on disk (or its error raised) before the block is freed
                    w.result()
            finally:  # to the end even when Ctrl-C lands here: no strip may land after the cleanup
                from blocklin.interrupt import wait_through

                wait_through(lambda: writer.shutdown(wait=True, cancel_futures=True))

    if spec.device == "gpu":
        rcond, info = _leaf_on_gpu(spec, a, anorm)
        extra["device"] = "gpu"
        if info:
            return {**failed, "info": info, "device": "gpu"}
        put_all()
    else:
        getrf, gecon, getri, getri_lwork = lapack.get_lapack_funcs(("getrf", "gecon", "getri", "getri_lwork"),
                                                                   (a.T,))
        # a block beyond the safe range (blocks.scaling) factored as 2^-e A, exactly: gecon's guards
        # against overflow returned rcond = 0 for a float32 block of 1e-37 whose inverse, 1e37, fits
        e = exponent_for(_max_abs(a), a.dtype)
        if e:
            ldexp(a, -e, out=a)
        lu, piv, info = getrf(a.T, overwrite_a=True)  # A^T = P L U, in the block's memory
        if info != 0:
            return {**failed, "info": int(info)}
        rcond = float(gecon(lu, float(np.ldexp(anorm, -e)), norm="1")[0])
        # In place: (A^T)^-1 = A^-T in the block's memory, which read row-major is A^-1.
        # getri's optimal (blocked) workspace matters: the default unblocked one is 2-3x slower.
        _, info = getri(lu, piv, lwork=_getri_lwork(getri_lwork, spec.size, spec.width or spec.size),
                        overwrite_lu=True)
        if info != 0:
            return {**failed, "info": int(info)}
        if e:  # (2^-e A)^-1 = 2^e A^-1
            with np.errstate(over="ignore", under="ignore"):
                ldexp(a, -e, out=a)
        put_all()
    if resid is not None:
        extra["probe_sumsq"] = sumsq(resid)
    return {"rcond": rcond, "info": 0, "sumsq": ss, "flops": flops,
            "bytes_read": nbytes, "bytes_written": nbytes, "seconds": time.perf_counter() - t0,
            "off": spec.off, "size": spec.size, "anorm": anorm, **extra}


# -- undo the butterfly: X = V Y ----------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class UnmixSpec:
    """``X[:, cols] = V @ Y[:, cols]`` (cast to ``dtype``) for column strips of ``width``."""

    src: str
    dst: str
    butterfly: Butterfly
    dtype: str
    blas_threads: int | None = None
    transpose: bool = False
    device: str = "cpu"
    device_memory: int | None = None


def column_memory(n: int, width: int, work_dtype: Any, out_dtype: Any, chunk_bytes: int) -> int:
    """Memory of :func:`unmix_columns_task` on an ``n x width`` strip: the strip read, its cast, the
    butterfly's gathered halves and their rotated sums, and zarr's chunk temporaries."""
    w_item, o_item = np.dtype(work_dtype).itemsize, np.dtype(out_dtype).itemsize
    return n * width * (w_item + 2 * o_item) + IO_CHUNKS * chunk_bytes


@with_task_settings
def unmix_columns_task(spec: UnmixSpec, c0: int, c1: int) -> dict:
    """One column strip: undo the RBT, write, return ``sumsq`` and ``X[:, c0:c1] @ P[c0:c1]``."""
    t0 = time.perf_counter()
    src = open_array(spec.src)
    n = src.shape[0]
    y = read_block(src, slice(0, n), slice(c0, c1)).astype(spec.dtype, copy=False)
    if y.dtype != np.dtype(spec.dtype) or not y.flags.writeable:
        y = np.array(y, dtype=spec.dtype)
    # a recursion whose products overflowed (an inverse near the top of the range) left Inf in Y: its
    # rotations and sums make NaN, which the route names as a range error (routes._recursion_range) from
    # the sum returned, not a NumPy warning
    with np.errstate(over="ignore", invalid="ignore"):
        if spec.butterfly.depth and spec.device == "gpu":  # rotations on the GPU, the strip back for the write
            from blocklin.device import get_device

            dev = get_device("gpu", device_memory=spec.device_memory)
            x = dev.to_host(spec.butterfly.left(dev.to_device(y), transpose=spec.transpose, device=dev))
        else:
            x = spec.butterfly.left(y, transpose=spec.transpose) if spec.butterfly.depth else y
        ss = sumsq(x)
    dst = open_array(spec.dst, mode="r+")
    write_block(dst, slice(0, n), slice(c0, c1), x)
    return {"sumsq": ss, "bytes_read": y.nbytes,
            "bytes_written": x.nbytes, "seconds": time.perf_counter() - t0}




# -- rows of the inverse from a stored LU -----------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class LURowsSpec:
    """Rows of ``X = A^-1`` from the panels of the out-of-core LU (:func:`blocklin.linalg.factor.lu.factor_lu_into`).

    ``work``: the panels' store (``L`` of panel ``j`` in the row order of its own swaps, ``U`` above);
    ``tile``: the panel width; ``dst``: the output (``dtype``); ``probe_seed``: the task also returns
    its rows of ``X P`` (the probe products of :func:`blocklin.linalg.inverse.refine.probe_estimate`).
    """

    work: Any
    dst: Any
    n: int
    tile: int
    dtype: str
    work_dtype: str
    probe_seed: int
    blas_threads: int | None = None


def lu_rows_memory(n: int, width: int, tile: int, work_dtype: Any, out_dtype: Any) -> int:
    """Memory of :func:`lu_inverse_rows_task` on ``width`` rows of an ``n x n`` inverse.

    The ``n x width`` block of right-hand sides (work dtype) and its cast for the write (another
    dtype); one buffer of a streamed row block of a panel (:func:`~blocklin.plan.factor.lu_stream_rows`
    rows of ``tile``), which also holds the ``tile x tile`` diagonal tile, with zarr's chunk
    temporaries (``tile x tile`` chunks); the ``tile x width`` accumulator and GEMM product; the
    rows one panel's swaps move (:func:`_swap_columns`); the ``X P`` rows of the whole inverse
    (``n x PROBES`` float64: the caller collects every task's rows for the probe pass) and one strip's
    product; and the strips of the final reductions (:func:`_strip_rows`): the regenerated probe
    rows, the finiteness mask and a float64 copy of a strip of another dtype (complex128 products and
    copies of complex data, :func:`wide`).
    """
    from blocklin.plan.factor import lu_stream_rows

    w_item, o_item = np.dtype(work_dtype).itemsize, np.dtype(out_dtype).itemsize
    f64 = wide(work_dtype)
    rb = lu_stream_rows(tile, n)
    block = n * width * w_item + (n * width * o_item if np.dtype(out_dtype) != np.dtype(work_dtype) else 0)
    stream = rb * tile * w_item + IO_CHUNKS * tile * tile * w_item + 2 * tile * width * w_item
    swaps = 2 * tile * _swap_columns(tile, width) * w_item
    pr = _strip_rows(n, width)
    strips = pr * PROBES * 8 + pr * width * (1 + (0 if np.dtype(work_dtype) == f64 else f64.itemsize))
    return block + stream + swaps + strips + (n + width) * PROBES * f64.itemsize


def _strip_rows(n: int, width: int) -> int:
    """Rows of ``Y`` (columns of the inverse's rows) reduced at a time at the end of
    :func:`lu_inverse_rows_task`: at most 128, and at most 32 Ki elements per strip."""
    return max(1, min(n, 128, (1 << 15) // max(1, width)))


def _swap_columns(tile: int, width: int) -> int:
    """Columns of ``Y`` one gather of :func:`_swap_back` moves at a time: its temporary (up to
    ``2 tile`` rows) stays within 16 Ki elements."""
    return max(1, min(width, (1 << 13) // max(1, tile)))


def _swap_back(y: np.ndarray, piv: np.ndarray, start: int, cols: int | None = None) -> None:
    """Undo the swaps ``i <-> piv[i - start]`` on the rows of ``y``: the swaps applied in reverse order.

    Composed once into a permutation of the rows they touch (``start + len(piv)`` rows and their
    partners), then applied by one gather per block of ``cols`` columns (default: all)."""
    piv = np.asarray(piv, dtype=np.int64)
    k = len(piv)
    if k == 0:
        return
    own = np.arange(start, start + k, dtype=np.int64)
    moved = piv != own
    if not moved.any():
        return
    rows = np.unique(np.concatenate([own[moved], piv[moved]]))  # every row a swap touches
    pos = np.searchsorted(rows, piv)
    mine = np.searchsorted(rows, own)
    # The forward swaps in order give y_f = y[rows[perm]] on these rows (swaps_to_permutation); undoing
    # them, applied in reverse, is the inverse permutation: y_new[rows[perm]] = y[rows].
    perm = np.arange(len(rows), dtype=np.int64)
    for i, p in zip(mine[moved].tolist(), pos[moved].tolist()):
        perm[i], perm[p] = perm[p], perm[i]
    keep = perm != np.arange(len(rows))
    dst, src = rows[perm[keep]], rows[keep]
    step = cols or y.shape[1]
    for c0 in range(0, y.shape[1], step):
        c = slice(c0, min(y.shape[1], c0 + step))
        y[dst, c] = y[src, c]


@with_task_settings
def lu_inverse_rows_task(spec: LURowsSpec, s0: int, s1: int, pivots: np.ndarray) -> dict:
    """Rows ``s0:s1`` of ``A^-1`` from the stored LU: ``A^-T e_i`` for the unit vectors ``e_i``, ``i`` in ``s0:s1``.

    The panels give ``A = S_1 M_1^-1 ... S_J M_J^-1 U`` (``S_j`` panel ``j``'s swaps, ``M_j`` its
    elimination as stored), so ``A^-T = S_1^T M_1^T ... S_J^T M_J^T U^-T``. The unit vectors are made
    here (no stored identity), and ``U^T z = e_i`` is a forward substitution whose first ``s0`` rows
    stay zero: the panels left of ``s0`` are not read (a third of the flops of a full solve saved,
    as LAPACK's ``getri`` saves them on ``L``). Then ``M_j^T`` and ``S_j^T`` panel by panel, right to
    left. Both sweeps read column panels only (``U[s0:c0, panel]``, ``L[c1:, panel]``), in row
    blocks, into one reused buffer. The block ``Y`` (``n x width``) is Fortran-ordered so that
    ``Y^T``, the rows of ``X``, is written C-ordered without a copy; each panel's rows of ``Y`` are
    updated in a contiguous ``tile x width`` accumulator (GEMM products into a second one, then the
    triangular solve in place, :func:`~blocklin.device.cpu.trsm_inplace`) and copied back once: no temporary of a strided
    update, nothing allocated per row block. Everything the task holds is in :func:`lu_rows_memory`.
    """
    from blocklin._memory import release_free_memory
    from blocklin.plan.factor import lu_stream_rows

    release_free_memory()  # the factorization's freed buffers: not part of this task's peak
    t0 = time.perf_counter()
    n, t, w = spec.n, spec.tile, s1 - s0
    wdt = np.dtype(spec.work_dtype)
    work = open_array(spec.work)
    rb = lu_stream_rows(t, n)
    y = np.zeros((n, w), dtype=wdt, order="F")
    y[s0 + np.arange(w), np.arange(w)] = 1
    buf = pool.aligned_empty(rb * t, wdt)  # every streamed block and diagonal tile, C-ordered, page-aligned
    acc = np.empty((t, w), dtype=wdt, order="F")
    prod = np.empty((t, w), dtype=wdt, order="F")
    nread = 0
    nt = -(-n // t)
    swap_cols = _swap_columns(t, w)

    def read(rows: slice, cols: slice) -> np.ndarray:
        nonlocal nread
        blk = buf[:(rows.stop - rows.start) * (cols.stop - cols.start)].reshape(rows.stop - rows.start, -1)
        blk = read_block(work, rows, cols, out=blk)
        nread += blk.nbytes
        return blk

    def step(c0: int, c1: int, below: range, upper: bool) -> None:
        """``y[c0:c1] = F[c0:c1, c0:c1]^-T (y[c0:c1] - F[below, c0:c1]^T y[below])``, streamed by row blocks."""
        a, p = acc[:c1 - c0], prod[:c1 - c0]
        np.copyto(a, y[c0:c1])
        for r0 in below:
            r1 = min(below.stop, r0 + rb)
            blk = read(slice(r0, r1), slice(c0, c1))
            np.matmul(blk.T, y[r0:r1], out=p)  # y[r0:r1] is a strided F-ordered block: BLAS takes it as is
            a -= p
        diag = read(slice(c0, c1), slice(c0, c1))
        # diag^T x = a in place (a is F-ordered): diag.T is lower exactly where diag is upper
        trsm_inplace(diag.T, a, lower=upper, unit=not upper)
        np.copyto(y[c0:c1], a)

    # rows of an inverse beyond the dtype's range (a tiny pivot, or float32 data near 1e-39) overflow in
    # the substitutions, and Inf - Inf makes NaN: the check below refuses them by name, which the route
    # turns into a range or singularity error (routes._lu_range_refusal), not a NumPy warning
    with np.errstate(over="ignore", invalid="ignore"):
        for j in range(s0 // t, nt):  # U^T z = e: rows above s0 stay zero
            c0, c1 = j * t, min(n, (j + 1) * t)
            step(c0, c1, range(s0, c0, rb), upper=True)
        for j in reversed(range(nt)):  # then M_j^T and S_j^T, right to left
            c0, c1 = j * t, min(n, (j + 1) * t)
            step(c0, c1, range(c1, n, rb), upper=False)
            _swap_back(y, pivots[c0:c1], c0, swap_cols)
    del buf, acc, prod
    # NaN/Inf check, ||X||_F^2 and X P by strips of Y's rows (X's columns), the probes regenerated
    # strip by strip from their stream (the same numbers as probes(n, PROBES, seed))
    rng = np.random.default_rng([spec.probe_seed, 7])
    xp, part = np.zeros((w, PROBES), dtype=wide(wdt)), np.empty((w, PROBES), dtype=wide(wdt))
    ss = 0.0
    for r0, r1 in split(n, _strip_rows(n, w)):
        blk = y[r0:r1]
        p = rng.standard_normal((r1 - r0, PROBES))
        if not np.isfinite(blk).all():
            from blocklin.errors import SingularMatrixError, explain

            raise SingularMatrixError(explain(
                "a", "must be nonsingular to be inverted", f"rows {s0}:{s1} of the inverse overflowed (a zero or "
                "tiny pivot of the LU)", "regularize: blocklin.solve(a, b, lam=...) (lam='gcv' chooses lam)"))
        b64 = np.asarray(blk, dtype=xp.dtype)
        ss += sumsq(b64)
        np.matmul(b64.T, p.astype(xp.dtype, copy=False), out=part)
        xp += part
    x = y.T  # rows s0:s1 of the inverse, C-ordered
    if x.dtype != np.dtype(spec.dtype):
        x = x.astype(spec.dtype)
    del y
    write_block(open_array(spec.dst, mode="r+"), slice(s0, s1), slice(0, n), x)
    nbytes = x.nbytes
    del x
    release_free_memory()
    return {"sumsq": ss, "xp": xp, "bytes_read": nread, "bytes_written": nbytes,
            "flops": w * (n * n + (n - s0) ** 2), "seconds": time.perf_counter() - t0}


#: The memory declarations of the tasks above, which :func:`blocklin.plan.inverse.plan_inverse` reads.
MEMORY = KernelMemory(leaf=leaf_memory, staging=staging_memory, column=column_memory, rows=lu_rows_memory)
