"""Peaks recorded by the writer that saw every value, so that a job's first pass need not scan.

A job's first row pass over an input takes the largest magnitude of every value (and of each column,
for an SVD's input, :mod:`blocklin.peaks`): the scaling of data near overflow or underflow is chosen
from it (:mod:`blocklin.linalg.blocks.scaling`). That scan bounds the pass: on the 2-core machine a
bare loop that maps a chunk file, takes its max and min and sums it reads 0.66x of the raw rate, a
later pass (no scan) 1.0x (``docs/benchmarks.md``). A writer that holds every value anyway
(:func:`blocklin.convert`) takes each column's peak as it writes, and :func:`record` keeps them beside
the output with the output's content stamp (:mod:`blocklin.storage.stamps`), taken once the output
is complete. :func:`recorded` returns them only while that stamp is today's: a chunk or metadata file
rewritten, added or removed voids the record, and the pass scans as before. The stamp's limits (a
rewrite in place that keeps size, inode and both times within one clock tick of the write) are those
a resumed run relies on too.

Only finite peaks are recorded: an output holding NaN or Inf has no record, so that the first pass's
NaN/Inf check still runs and names the element. Maxima are exact in any order, so a recorded peak is
the same bits the scan would give, and the run the same bits with or without the record.
"""

from __future__ import annotations

import base64
import dataclasses
import json
from typing import Any

import numpy as np

from blocklin.peaks import column_peaks
from blocklin.storage.backend import backend
from blocklin.storage.records import PEAKS_RECORD
from blocklin.storage.stamps import content_stamp, input_location

_VERSION = 1


@dataclasses.dataclass(frozen=True)
class RecordedPeaks:
    """An input's recorded peaks: ``amax``, its largest magnitude, and ``columns``, each stored
    column's (``max(|Re|, |Im|)`` for complex data, as :func:`blocklin.peaks.column_peaks`)."""

    amax: float
    columns: np.ndarray


class PeakTally:
    """The column peaks of the blocks a writer wrote, merged as they come (any order: the same bits).

    ``complete`` turns False once a block is skipped unseen (a resumed conversion's finished blocks):
    then nothing is recorded.
    """

    def __init__(self, columns: int):
        self.columns = np.zeros(columns)
        self.complete = True

    def add(self, block: np.ndarray, first_column: int) -> None:
        self.merge(column_peaks(block), first_column)

    def merge(self, peaks: np.ndarray, first_column: int) -> None:
        at = self.columns[first_column:first_column + len(peaks)]
        np.maximum(at, peaks, out=at)  # maximum propagates NaN

    def skipped(self) -> None:
        self.complete = False


def recordable(dtype: Any) -> bool:
    """Whether an output of ``dtype`` gets a record: floating and complex data (what the first pass
    scales; integer inputs reach operations as staged float64 copies)."""
    return np.dtype(dtype).kind in "fc"


def record(loc: Any, tally: PeakTally) -> bool:
    """Record ``tally``'s peaks beside the complete output at ``loc``, with its content stamp taken now.

    Nothing is recorded (False) for an incomplete tally or peaks that are not all finite, nor where the
    record cannot be written (a read-only or full store: the output is complete without it, and its
    first passes scan). Call it only once the output is committed: a file written after the stamp
    voids the record.
    """
    cols = tally.columns
    if not tally.complete or not np.isfinite(cols).all():
        return False
    loc = input_location(loc)
    try:
        data = {"version": _VERSION, "stamp": content_stamp(loc), "amax": float(cols.max(initial=0.0)),
                "columns": base64.b64encode(cols.astype("<f8").tobytes()).decode("ascii")}
        backend(loc).write_text(PEAKS_RECORD, json.dumps(data))
    except OSError:
        return False
    return True


def recorded(loc: Any, columns: int | None = None) -> RecordedPeaks | None:
    """The peaks recorded for the input at ``loc`` while its content stamp is the recorded one, else
    None (no record, another version, unreadable, a stamp that changed, or not ``columns`` of them)."""
    loc = input_location(loc)
    raw = backend(loc).try_read(PEAKS_RECORD)
    if raw is None:
        return None
    try:
        data = json.loads(raw)
        if not isinstance(data, dict) or data.get("version") != _VERSION:
            return None
        cols = np.frombuffer(base64.b64decode(data["columns"]), dtype="<f8").astype(np.float64)
        amax = float(data["amax"])
        stamp = str(data["stamp"])
    except (ValueError, KeyError, TypeError):
        return None
    if columns is not None and len(cols) != columns or not np.isfinite(cols).all() or \
            amax != float(cols.max(initial=0.0)):
        return None
    if stamp != content_stamp(loc):
        return None
    return RecordedPeaks(amax=amax, columns=cols)
