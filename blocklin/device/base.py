"""The device interface and device selection."""

from __future__ import annotations

import abc
import functools
from typing import Any

import numpy as np

from blocklin.errors import DeviceError, explain


class Device(abc.ABC):
    """What a tile kernel needs from a compute device.

    Host buffers come from :meth:`host_empty` (pinned on a GPU) and are filled by the caller;
    :meth:`upload` makes them usable by :meth:`gemm_acc` (asynchronously on a GPU, with the
    returned handle released through :meth:`after_use`). Results come back with :meth:`download`.
    """

    name = "device"
    #: Whether accumulator tiles live in host memory (CPU) or device memory (GPU).
    host_resident = True

    def host_empty(self, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
        return np.empty(shape, dtype=dtype)

    def release_host(self, buf: np.ndarray) -> None:
        """Return a host buffer from :meth:`host_empty` for reuse (pinned buffers are costly)."""

    def slots(self, n: int, shapes: list[tuple[int, ...]], dtype: Any) -> None:
        """Prepare ``n`` device slots of the given operand shapes (no-op on the CPU)."""

    def upload(self, slot: int, arrays: tuple[np.ndarray, ...]) -> tuple[Any, ...]:
        return arrays

    def after_use(self, slot: int) -> None:
        """Called after the compute that read ``slot`` was issued."""

    def host_slot_free(self, slot: int) -> None:
        """Block until the host buffers of ``slot`` may be overwritten."""

    @abc.abstractmethod
    def zeros(self, shape: tuple[int, int], dtype: Any) -> Any:
        """A zeroed accumulator tile where the device computes."""

    @abc.abstractmethod
    def gemm_acc(self, acc: Any, a: Any, b: Any) -> None:
        """``acc += a @ b`` in place (``a``/``b`` may be transposed views)."""

    @abc.abstractmethod
    def axpby(self, acc: Any, alpha: float, c: np.ndarray | None, beta: float) -> None:
        """``acc = alpha * acc + beta * c`` in place (``c`` a host block of ``acc``'s shape)."""

    @abc.abstractmethod
    def download(self, acc: Any, rows: slice, out: np.ndarray | None = None) -> np.ndarray:
        """Host copy of ``acc[rows]`` (a view on the CPU)."""

    def synchronize(self) -> None:
        """Wait for all queued work (before reading a clock)."""


@functools.cache
def gpu_available() -> bool:
    """True when CuPy imports and sees at least one CUDA device."""
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:
        return False


def get_device(kind: str = "auto", *, device_memory: int | None = None) -> Device:
    """Return the device for ``kind`` (``auto``, ``cpu`` or ``gpu``)."""
    if kind == "auto":
        kind = "gpu" if gpu_available() else "cpu"
    if kind == "cpu":
        from blocklin.device.cpu import CpuDevice

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
