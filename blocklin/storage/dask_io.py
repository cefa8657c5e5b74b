"""Writing a Dask array into a store from wherever Dask computes it (the workers on a cluster).

Each task writes one block, opened through the storage opener from its
:class:`~blocklin.storage.location.Location`, so no zarr object is pickled and a worker holds one
block at a time.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from blocklin.storage.location import Location
from blocklin.storage.zarr_store import open_cached, write_block


def write_block_task(block: np.ndarray, loc: Location, r0: int, c0: int) -> int:
    """Task: write one block (whole chunks of the output) at ``(r0, c0)``; returns its bytes."""
    arr = open_cached(loc, "r+")
    write_block(arr, slice(r0, r0 + block.shape[0]), slice(c0, c0 + block.shape[1]), block)
    return int(block.nbytes)


def store_dask(x: Any, loc: Location, client: Any = None) -> int:
    """Write the 2-D Dask array ``x`` (chunked like the array at ``loc``) block by block.

    With ``client`` the blocks are computed and written on its workers; otherwise Dask's default
    scheduler runs them (an active ``distributed`` client included). Returns the bytes written.
    """
    import dask

    offsets = [np.concatenate([[0], np.cumsum(c)[:-1]]).astype(int) for c in x.chunks]
    blocks = x.to_delayed()
    tasks = [dask.delayed(write_block_task, pure=False)(blocks[i, j], loc, int(offsets[0][i]), int(offsets[1][j]))
             for i in range(blocks.shape[0]) for j in range(blocks.shape[1])]
    if client is not None:
        return int(sum(client.gather(client.compute(tasks))))
    return int(sum(dask.compute(*tasks)))


__all__ = ["store_dask", "write_block_task"]
