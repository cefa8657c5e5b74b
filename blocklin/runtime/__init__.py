"""Runtime: tile plans -> Dask graphs with deterministic keys, executed on a chosen scheduler.

Numerics stay in the device layer and the algorithms; tasks pass paths and tile indices only.
"""

from blocklin.runtime.graph import TileGraph, execute
from blocklin.progress import NullProgress, ProgressRecorder, make_progress
from blocklin.runtime.scheduler import resolve_scheduler

__all__ = ["NullProgress", "ProgressRecorder", "TileGraph", "execute", "make_progress", "resolve_scheduler"]
