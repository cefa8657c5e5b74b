"""Functions run on cluster workers by the tests; this module must not import blocklin.

(Functions of a test module are pickled by reference, so running one on a worker would import the
test module, and blocklin with it, before the test could look at the untouched worker.)
"""

from __future__ import annotations


def blocklin_imported() -> bool:
    import sys

    return "blocklin" in sys.modules


def settings() -> tuple:
    """BLAS thread count per loaded library and zarr's chunk I/O concurrency of this process."""
    import zarr
    from threadpoolctl import threadpool_info

    blas = {p["filepath"]: p["num_threads"] for p in threadpool_info() if p["user_api"] == "blas"}
    return blas, zarr.config.get("async.concurrency")
