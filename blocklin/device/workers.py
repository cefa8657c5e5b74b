"""Which GPU a worker's tasks use: one GPU per worker, by the worker's name or ``BLOCKLIN_GPU``.

Kept apart from :mod:`blocklin.device.select` (which builds devices) so that the CUDA device reads
its ordinal without importing the selection that imports it.
"""

from __future__ import annotations

import os
import sys

from blocklin.errors import DeviceError, explain


#: Environment variable naming the GPU of this process's tasks (hand-started workers).
GPU_ENV = "BLOCKLIN_GPU"


def gpu_for_worker(name: object, count: int, *, explicit: str | None = None,
                   visible: str | None = None) -> int | None:
    """The GPU (device ordinal) for the tasks of a worker, one GPU per worker; None: CuPy's current device.

    Parameters
    ----------
    name : object
        The ``distributed`` worker's name (``None`` outside a worker). ``LocalCluster`` names its
        workers ``0 .. n-1``: worker ``i`` gets GPU ``i mod count``.
    count : int
        CUDA devices this process sees.
    explicit : str, optional
        ``BLOCKLIN_GPU``: this ordinal, whatever the worker (workers started by hand).
    visible : str, optional
        ``CUDA_VISIBLE_DEVICES``. When it is set the launcher has already mapped workers to GPUs
        (``dask-cuda`` lists each worker's own GPU first, so device 0 is the worker's): the current
        device is kept.
    """
    if explicit not in (None, ""):
        try:
            ordinal = int(str(explicit).strip())
        except ValueError:
            ordinal = -1
        if not 0 <= ordinal < max(count, 1):
            raise DeviceError(explain(GPU_ENV, f"must be a device ordinal below the {count} GPU(s) this process "
                                      "sees", repr(explicit), f"set {GPU_ENV}=0, or unset it"))
        return ordinal
    if visible not in (None, "") or count <= 1 or name is None:
        return None
    try:
        index = int(str(name))
    except ValueError:  # a named worker: no index to map from
        return None
    return index % count if index >= 0 else None


def worker_gpu() -> int | None:
    """:func:`gpu_for_worker` for the calling thread (the worker it runs in, if any, and the environment)."""
    import cupy

    name = None
    if "distributed" in sys.modules:
        from distributed import get_worker

        try:
            name = get_worker().name
        except ValueError:  # not in a worker
            name = None
    return gpu_for_worker(name, cupy.cuda.runtime.getDeviceCount(), explicit=os.environ.get(GPU_ENV),
                          visible=os.environ.get("CUDA_VISIBLE_DEVICES"))
