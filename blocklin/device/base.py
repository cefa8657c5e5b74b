"""The device interface (selection lives in :mod:`blocklin.device.select`)."""

from __future__ import annotations

import abc
from typing import Any

import numpy as np


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


def __getattr__(name: str):
    """``get_device``, ``gpu_available`` and ``resolved_kind`` live in :mod:`blocklin.device.select`."""
    if name in ("get_device", "gpu_available", "resolved_kind"):
        from blocklin.device import select

        return getattr(select, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
