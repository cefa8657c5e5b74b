"""Device selection: which device ``auto``/``cpu``/``gpu`` means here, and the per-thread instances.

Kept apart from :mod:`blocklin.device.base` so that the device implementations import the interface
without an import cycle (``base`` -> ``cpu``/``cuda`` -> ``base``).
"""

from __future__ import annotations

import functools
import sys

from blocklin.device.base import Device
from blocklin.device.cpu import CpuDevice
from blocklin.errors import DeviceError, explain


@functools.cache
def gpu_available() -> bool:
    """True when CuPy imports and sees at least one CUDA device."""
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:
        return False


def get_device(kind: str = "auto", *, device_memory: int | None = None) -> Device:
    """Return the device for ``kind`` (``auto``, ``cpu`` or ``gpu``); GPU devices are per thread."""
    if kind == "auto":
        kind = "gpu" if gpu_available() else "cpu"
    if kind == "cpu":
        return CpuDevice()
    if kind == "gpu":
        if not gpu_available():
            raise DeviceError(explain("device", "'gpu' needs CuPy and a CUDA device", "none available",
                                      "install the extra (pip install 'blocklin[gpu]') on a GPU machine, "
                                      "or pass device='cpu'"))
        from blocklin.device.cuda import CudaDevice

        return CudaDevice.current(device_memory=device_memory)
    raise DeviceError(explain("device", "must be 'auto', 'cpu' or 'gpu'", repr(kind), "pass device='cpu'"))


def resolved_kind(kind: str) -> str:
    """``auto`` resolved to ``cpu`` or ``gpu`` on this machine."""
    return ("gpu" if gpu_available() else "cpu") if kind == "auto" else kind


#: Flops per byte read above which a pass over stored data keeps a CPU busy computing (tens of
#: GFLOP/s of BLAS against well under 1 GB/s of zarr reads, docs/benchmarks.md): below it the pass is
#: bound by reading, the GPU cannot speed it up, and ``device="auto"`` keeps it on the CPU.
CPU_BOUND_INTENSITY = 64.0


def pass_device(requested: str, flops: float, bytes_read: float, resolved: str | None = None) -> str:
    """Where a pass over stored data runs: as requested, or for ``auto`` on the GPU only where it wins.

    ``resolved`` is the job's device (``auto`` resolved where the tasks run): ``"cpu"`` there (a
    cluster without GPUs, say) keeps every pass on the CPU whatever this machine has.
    """
    if requested in ("cpu", "gpu"):
        return requested
    if resolved == "cpu":
        return "cpu"
    return "gpu" if gpu_available() and flops >= CPU_BOUND_INTENSITY * max(bytes_read, 1.0) else "cpu"


def release_device_caches() -> None:
    """End of a job: drain the GPU devices of this process and unpin their cached host buffers.

    Pinned buffers are counted in the host budget while a job runs; kept after it, they would hold
    page-locked memory that no budget accounts for. A no-op when CUDA was never used.
    """
    cuda = sys.modules.get("blocklin.device.cuda")
    if cuda is not None:
        cuda.CudaDevice.release_all()
