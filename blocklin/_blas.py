"""BLAS thread limits through one process-wide ``threadpoolctl`` controller.

``threadpoolctl.threadpool_limits`` finds the loaded BLAS libraries afresh on every call (it walks every
shared object of the process): about 2 ms a call here, which a block Lanczos step paid twice (0.13 s
of a 1.8 s sparse svd at ``k = 20``). The controller is made once, at the first limit, when NumPy's
and SciPy's BLAS are already loaded (``blocklin`` imports both)."""

from __future__ import annotations

import threading
from typing import Any

_CONTROLLER: list = []
_LOCK = threading.Lock()


def _controller() -> Any:
    if not _CONTROLLER:
        from threadpoolctl import ThreadpoolController

        with _LOCK:
            if not _CONTROLLER:
                _CONTROLLER.append(ThreadpoolController())
    return _CONTROLLER[0]


def blas_threads(limit: int | None) -> Any:
    """A context in which the BLAS libraries use at most ``limit`` threads (``None``: no limit), restored on
    leaving, as ``threadpoolctl.threadpool_limits(limits=limit, user_api="blas")``."""
    return _controller().limit(limits=limit, user_api="blas")
