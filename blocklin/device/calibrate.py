"""How fast a device multiplies: one square GEMM timed through the device interface.

``blocklin calibrate`` records the result as the machine's expected compute rate
(:class:`blocklin.plan.rates.Rates`); the GEMM is the one the tile tasks call (``gemm_acc``), so the
rate is what the GEMM tiles can reach, BLAS threads as the device sets them. On a GPU the in-core
rates per arithmetic (float64, float32, and float32 on TF32 tensor cores: :func:`measure_gemm_rates`)
are also the compute side of every GPU report's roofline (:func:`blocklin.plan.rates.roofline`).
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from blocklin.device.base import Device
from blocklin.errors import ParameterError, explain

#: Default GEMM side per device: large enough for BLAS (or cuBLAS) to run near its peak, small
#: enough to take well under a second (2048: 17 GFLOP, 0.4 s at 40 GFLOP/s on two cores).
DEFAULT_SIDE = {"cpu": 2048, "gpu": 8192}


def measure_gflops(device: Device, dtype: Any = np.float64, n: int = 2048, *, seconds: float = 0.3) -> float:
    """GFLOP/s of ``acc += a @ b`` with ``n x n`` operands on ``device`` (``2 n^3`` flops per call).

    One untimed call first (BLAS threads started, device memory and cuBLAS handles allocated), then
    calls until ``seconds`` have passed (at least two), with the device synchronized before each
    clock reading.

    Raises
    ------
    ParameterError
        ``n`` < 1 or ``seconds`` <= 0.
    """
    if int(n) < 1 or not seconds > 0:
        bad, rule, value = ("n", "must be at least 1", n) if int(n) < 1 else ("seconds", "must be > 0", seconds)
        raise ParameterError(explain(bad, rule, repr(value), "pass n=2048 and seconds=0.3 (the defaults)"))
    dt = np.dtype(dtype)
    rng = np.random.default_rng(0)
    a = device.to_device(rng.standard_normal((n, n)).astype(dt))
    b = device.to_device(rng.standard_normal((n, n)).astype(dt))
    acc = device.zeros((n, n), dt)
    device.gemm_acc(acc, a, b)
    device.synchronize()
    calls = 0
    t0 = time.perf_counter()
    while True:
        device.gemm_acc(acc, a, b)
        calls += 1
        if calls >= 2:
            device.synchronize()
            elapsed = time.perf_counter() - t0
            if elapsed >= seconds:
                return 2.0 * n**3 * calls / elapsed / 1e9


def measure_gemm_rates(device: Device, n: int, *, seconds: float = 0.3) -> dict[str, float]:
    """GFLOP/s of :func:`measure_gflops` per arithmetic: ``{"float64": .., "float32": .., "tf32": ..}``.

    ``"tf32"`` is the float32 GEMM inside ``device.math("tf32")`` (TF32 tensor cores), measured only
    on a GPU (a CPU has no such mode: its entry would repeat float32's).
    """
    out = {name: measure_gflops(device, dt, n, seconds=seconds)
           for name, dt in (("float64", np.float64), ("float32", np.float32))}
    if device.name == "gpu":
        with device.math("tf32"):
            out["tf32"] = measure_gflops(device, np.float32, n, seconds=seconds)
    return out


def gpu_name() -> str:
    """The current CUDA device's name (``"NVIDIA H200"``), part of the rates' cache key."""
    import cupy

    dev = cupy.cuda.runtime.getDevice()
    try:
        name = cupy.cuda.runtime.getDeviceProperties(dev)["name"]
    except Exception:  # noqa: BLE001 - a runtime without the call (the CuPy stand-in): its index then
        return f"cuda:{dev}"
    return name.decode() if isinstance(name, bytes) else str(name)


__all__ = ["DEFAULT_SIDE", "gpu_name", "measure_gemm_rates", "measure_gflops"]
