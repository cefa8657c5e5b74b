"""Compute devices and the tile-streaming pipeline. Knows nothing of zarr or Dask.

:class:`CpuDevice` computes with NumPy/BLAS; :class:`CudaDevice` with CuPy on separate
host-to-device, compute and device-to-host streams. Both are driven by one :class:`TileStream`.
"""

from blocklin.device.base import Device, get_device, gpu_available
from blocklin.device.cpu import CpuDevice
from blocklin.device.stream import TileStream

__all__ = ["CpuDevice", "Device", "TileStream", "get_device", "gpu_available"]
