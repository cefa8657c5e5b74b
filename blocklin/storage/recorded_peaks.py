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

The record is two files: a small JSON one (``PEAKS_RECORD``: the stamp, the largest magnitude, the
number of columns and the CRC-32 of their peaks) and the columns' peaks as raw little-endian float64
(``PEAKS_COLUMNS``), read only where they are asked for (an SVD's first pass over a tall input; every
other pass takes the largest magnitude alone). One JSON file with the peaks in base64 made every job
on a wide matrix decode them: 0.26-0.47 s and 160 MiB for the 4194304 columns of a 1 GiB float32
``64 x 4194304`` matrix, outside its budget. The same pair keeps what a first pass saw of data no writer
recorded, in the user's cache (:mod:`blocklin.storage.seen_peaks`).

Only finite peaks are recorded: an output holding NaN or Inf has no record, so that the first pass's
NaN/Inf check still runs and names the element. Maxima are exact in any order, so a recorded peak is
the same bits the scan would give, and the run the same bits with or without the record.
"""

from __future__ import annotations

import dataclasses
import json
import zlib
from typing import Any

import numpy as np

from blocklin.peaks import column_peaks
from blocklin.storage.backend import backend
from blocklin.storage.records import PEAKS_COLUMNS, PEAKS_RECORD
from blocklin.storage.stamps import content_stamp, input_location

_VERSION = 2


@dataclasses.dataclass(frozen=True)
class RecordedPeaks:
    """An input's recorded peaks: ``amax``, its largest magnitude, and ``columns``, each stored
    column's (``max(|Re|, |Im|)`` for complex data, as :func:`blocklin.peaks.column_peaks`; None where
    they were not asked for)."""

    amax: float
    columns: np.ndarray | None


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
    # the stamp leaves both files out (storage.stamps): taken after the columns' file is written
    return write_pair(backend(loc), PEAKS_RECORD, PEAKS_COLUMNS, lambda: {"stamp": content_stamp(loc)},
                      float(cols.max(initial=0.0)), len(cols), cols)


def recorded(loc: Any, columns: int | None = None, *, column_peaks: bool = True) -> RecordedPeaks | None:
    """The peaks recorded for the input at ``loc`` while its content stamp is the recorded one, else
    None (no record, another version, unreadable, a stamp that changed, or not ``columns`` of them).
    ``column_peaks``: read each column's too (else ``columns`` is None: the largest magnitude alone,
    without reading the columns' file)."""
    loc = input_location(loc)
    return read_pair(backend(loc), PEAKS_RECORD, PEAKS_COLUMNS, lambda data: data.get("stamp") == content_stamp(loc),
                     columns, column_peaks)


def write_pair(be: Any, record_key: str, columns_key: str, fields: Any, amax: float, count: int,
               cols: np.ndarray | None) -> bool:
    """Write a record of peaks: ``cols`` (each of ``count`` columns' peak, or None: the largest magnitude
    ``amax`` alone) as raw little-endian float64 at ``columns_key``, then the JSON record at
    ``record_key`` with ``fields()`` (called between the two: the stamp) and the columns' CRC-32, which
    a columns file of another record fails. False where either cannot be written."""
    try:
        crc = None
        if cols is not None:
            raw = np.asarray(cols, dtype="<f8").tobytes()
            be.write_bytes(columns_key, raw)
            crc = zlib.crc32(raw)
        data = {"version": _VERSION, **fields(), "amax": float(amax), "columns": int(count), "crc32": crc}
        be.write_text(record_key, json.dumps(data))
    except OSError:
        return False
    return True


def read_pair(be: Any, record_key: str, columns_key: str, holds: Any, columns: int | None,
              column_peaks: bool) -> RecordedPeaks | None:
    """The record :func:`write_pair` wrote, where ``holds(data)`` (its JSON fields) says it is today's, it
    has ``columns`` columns (None: any) and, with ``column_peaks``, its columns' file is whole and its."""
    raw = be.try_read(record_key)
    if raw is None:
        return None
    try:
        data = json.loads(raw)
        if not isinstance(data, dict) or data.get("version") != _VERSION:
            return None
        amax, count, crc = float(data["amax"]), int(data["columns"]), data["crc32"]
    except (ValueError, KeyError, TypeError):
        return None
    if columns is not None and count != columns or not np.isfinite(amax) or amax < 0:
        return None
    if not holds(data):
        return None
    if not column_peaks:
        return RecordedPeaks(amax=amax, columns=None)
    packed = be.try_read(columns_key) if isinstance(crc, int) else None
    if packed is None or len(packed) != 8 * count or zlib.crc32(packed) != crc:
        return None
    cols = np.frombuffer(packed, dtype="<f8").astype(np.float64)
    if not np.isfinite(cols).all() or amax != float(cols.max(initial=0.0)):
        return None
    return RecordedPeaks(amax=amax, columns=cols)
