"""When a GPU tile stream is compute-bound: the compute/transfer crossover of its tiles.

A ``tm x tn`` accumulator fed ``tk``-wide panels performs ``2 tm tn tk`` flops for every
``(tm + tn) tk`` elements copied over the host link, an arithmetic intensity of
``2 tm tn / ((tm + tn) itemsize)`` flops per byte (``T / itemsize`` for square tiles). The GPU
computes at its peak only when that intensity reaches ``peak flops / link bandwidth``: for an H200
over PCIe 5 (about 55 GB/s measured), square float64 tiles of about 10k, float32 about 5k, TF32
about 36k. Below it the stream is transfer-bound whatever the overlap.
"""

from __future__ import annotations

import math

import numpy as np

#: Dense peak rates (flop/s, no sparsity) and measured host-link bandwidth (bytes/s) of known GPUs.
GPUS: dict[str, dict[str, float]] = {
    "H200": {"float64": 67e12, "float32": 67e12, "tf32": 494e12, "link": 55e9},
    "H100": {"float64": 67e12, "float32": 67e12, "tf32": 494e12, "link": 55e9},
    "A100": {"float64": 19.5e12, "float32": 19.5e12, "tf32": 156e12, "link": 25e9},
}
DEFAULT_GPU = "H200"


def intensity(tm: int, tn: int, itemsize: int) -> float:
    """Flops per byte copied to the device for a ``tm x tn`` tile (independent of ``tk``)."""
    return 2.0 * tm * tn / ((tm + tn) * itemsize)


def crossover_tile(dtype, *, gpu: str = DEFAULT_GPU, precision: str | None = None,
                   link: float | None = None) -> int:
    """Smallest square tile that keeps ``gpu`` compute-bound for ``dtype`` (TF32 when ``precision='tf32'``)."""
    dt = np.dtype(dtype)
    spec = GPUS[gpu]
    if dt.kind == "c":  # a complex multiply-add is four real ones: a quarter of the real peak in complex flops
        peak = spec[np.finfo(dt).dtype.name] / 4
    else:
        peak = spec["tf32"] if precision == "tf32" and dt == np.float32 else spec[dt.name]
    return math.ceil(peak / (link or spec["link"]) * dt.itemsize)


def transfer_bound(tm: int, tn: int, dtype, *, gpu: str = DEFAULT_GPU, precision: str | None = None,
                   link: float | None = None) -> bool:
    """Whether ``tm x tn`` tiles leave ``gpu`` waiting for the host link."""
    dt = np.dtype(dtype)
    c = crossover_tile(dt, gpu=gpu, precision=precision, link=link)
    return intensity(tm, tn, dt.itemsize) < c / dt.itemsize


def shortfall(tm: int, tn: int, dtype, *, gpu: str = DEFAULT_GPU, precision: str | None = None,
              link: float | None = None) -> float:
    """How far ``tm x tn`` tiles fall below the crossover, as a fraction of it (0 when compute-bound).

    The GEMM planner on a GPU prefers tilings with the smallest shortfall (tiles at or above the
    crossover when the budgets allow them), then the fewest bytes read.
    """
    dt = np.dtype(dtype)
    need = crossover_tile(dt, gpu=gpu, precision=precision, link=link) / dt.itemsize
    return max(0.0, 1.0 - intensity(tm, tn, dt.itemsize) / need)


def link_shortfall(flops: float, nbytes: float, dtype, *, gpu: str = DEFAULT_GPU, precision: str | None = None,
                   link: float | None = None) -> float:
    """:func:`shortfall` of a whole product that copies ``nbytes`` over the host link for ``flops``:
    with a device cache (:mod:`blocklin.device.resident`) a panel reused from the device crosses the
    link once, so the intensity is the product's, not one tile's."""
    dt = np.dtype(dtype)
    need = crossover_tile(dt, gpu=gpu, precision=precision, link=link) / dt.itemsize
    return max(0.0, 1.0 - flops / max(nbytes, 1.0) / need)


#: CuPy's pinned pool rounds every request up to a multiple of this (the alignment of
#: ``cudaHostAlloc``) and then up to a power of two (``cupy/cuda/pinned_memory.pyx``, CuPy 13/14).
PINNED_UNIT = 512


def pinned_nbytes(nbytes: int) -> int:
    """Pinned host bytes a buffer of ``nbytes`` really holds: CuPy's pinned pool serves every request
    with a block of the next power of two (of at least :data:`PINNED_UNIT` bytes), 1.0-2.0x the
    request; budgets count pinned buffers at this size."""
    nbytes = int(nbytes)
    if nbytes <= 0:
        return 0
    units = -(-nbytes // PINNED_UNIT) * PINNED_UNIT
    return 1 << (units - 1).bit_length()


#: CuPy's device memory pool serves every request in multiples of this (``ALLOCATION_UNIT_SIZE``
#: in ``cupy/cuda/memory.pyx``, CuPy 13/14).
DEVICE_UNIT = 512


def device_nbytes(nbytes: int) -> int:
    """Device bytes an array of ``nbytes`` really holds in CuPy's pool: the request rounded up to a
    multiple of :data:`DEVICE_UNIT`; the device operand cache counts its blocks at this size."""
    nbytes = int(nbytes)
    return -(-nbytes // DEVICE_UNIT) * DEVICE_UNIT if nbytes > 0 else 0
