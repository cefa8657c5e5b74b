"""Compute devices and the tile-streaming pipeline. Knows nothing of zarr or Dask.

:class:`CpuDevice` computes with NumPy/BLAS; :class:`CudaDevice` with CuPy on separate
host-to-device, compute and device-to-host streams. Both are driven by one :class:`TileStream`.
"""

from blocklin.device.base import Device
from blocklin.device.cpu import CpuDevice
from blocklin.device.select import get_device, gpu_available, pass_device, release_device_caches, resolved_kind
from blocklin.device.stream import TileStream

__all__ = ["CpuDevice", "Device", "TileStream", "get_device", "gpu_available", "pass_device",
           "release_device_caches", "resolved_kind"]
