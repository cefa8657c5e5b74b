"""Peaks recorded by the writer that saw every value, so that a job's first pass need not scan.

A job's first row pass over an input takes the largest magnitude of every value (and of each column,
for an SVD's input, :mod:`blocklin.peaks`): the scaling of data near overflow or underflow is chosen
from it (:mod:`blocklin.linalg.blocks.scaling`). That scan bounds the pass: on the 2-core machine a
bare loop that maps a chunk file, takes its max and min and sums it reads 0.66x of the raw rate, a
later pass (no scan) 1.0x (``docs/benchmarks.md``). A writer that holds every value anyway
(:func:`blocklin.convert`) takes the peaks an SVD's first pass would (each column's of a tall or square
output, each row's of a wide one, which an SVD streams transposed) as it writes, and :func:`record` keeps
them beside
the output with the output's content stamp (:mod:`blocklin.storage.stamps`), taken once the output
is complete. :func:`recorded` returns them only while that stamp is today's: a chunk or metadata file
rewritten, added or removed voids the record, and the pass scans as before. The stamp's limits (a
rewrite in place that keeps size, inode and both times within one clock tick of the write) are those
a resumed run relies on too.

The record is two files: a small JSON one (``PEAKS_RECORD``: the stamp, the largest magnitude, the
output's shape, which side's peaks it holds, their count and CRC-32) and those peaks as raw
little-endian float64 (``PEAKS_COLUMNS``), read only where they are asked for (an SVD's first pass;
every other pass takes the largest magnitude alone). Only the short side's peaks are kept: a
``64 x 4194304`` matrix's 64 rows', not its 4194304 columns' (32 MiB that no pass reads). One JSON file with the peaks in base64 made every job
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

from blocklin.peaks import block_peaks
from blocklin.storage.backend import backend
from blocklin.storage.records import PEAKS_COLUMNS, PEAKS_RECORD
from blocklin.storage.stamps import content_stamp, input_location

_VERSION = 3
#: Records of this version hold each stored column's peaks and no shape; still read.
_COLUMNS_ONLY_VERSION = 2


@dataclasses.dataclass(frozen=True)
class RecordedPeaks:
    """An input's recorded peaks: ``amax``, its largest magnitude, and ``columns``, each column's of the
    orientation an SVD streams (``max(|Re|, |Im|)`` for complex data, as
    :func:`blocklin.peaks.column_peaks`): the stored columns', or with ``transposed`` the stored rows'
    (a wide matrix's); None where they were not asked for."""

    amax: float
    columns: np.ndarray | None
    transposed: bool = False


class PeakTally:
    """The peaks of the blocks a writer wrote to an output of ``shape``, merged as they come (any order:
    the same bits): each column's of a tall or square output, each row's of a wide one (``transposed``:
    the side an SVD's first pass takes, :func:`blocklin.plan.svd.plan_svd` streams ``A^T`` where
    ``m < n``).

    ``complete`` turns False once a block is skipped unseen (a resumed conversion's finished blocks):
    then nothing is recorded. :meth:`merge_amax` adds values whose side's peaks are unknown (the rows an
    append kept, recorded for the other side): then the largest magnitude alone is recorded.
    """

    def __init__(self, shape: tuple[int, int]):
        m, n = int(shape[0]), int(shape[1])
        self.shape = (m, n)
        self.transposed = m < n
        self.columns = np.zeros(m if self.transposed else n)
        self.complete = True
        self.amax_only: float | None = None

    def peaks_of(self, block: np.ndarray) -> np.ndarray:
        """``block``'s peaks of the tallied side (what a worker returns for :meth:`merge`)."""
        return block_peaks(block, rows=self.transposed)

    def add(self, block: np.ndarray, first_row: int, first_column: int) -> None:
        self.merge(self.peaks_of(block), first_row, first_column)

    def merge(self, peaks: np.ndarray, first_row: int, first_column: int) -> None:
        """Merge the peaks of a block at ``(first_row, first_column)`` of the output."""
        first = first_row if self.transposed else first_column
        at = self.columns[first:first + len(peaks)]
        np.maximum(at, peaks, out=at)  # maximum propagates NaN

    def merge_amax(self, amax: float) -> None:
        self.amax_only = max(amax, self.amax_only or 0.0)

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
    amax = float(cols.max(initial=0.0))
    if tally.amax_only is not None:
        amax, cols = max(amax, tally.amax_only), None
    loc = input_location(loc)
    fields = {"shape": list(tally.shape), "transposed": tally.transposed}
    # the stamp leaves both files out (storage.stamps): taken after the columns' file is written
    return write_pair(backend(loc), PEAKS_RECORD, PEAKS_COLUMNS, lambda: {**fields, "stamp": content_stamp(loc)},
                      amax, len(tally.columns), cols)


def recorded(loc: Any, shape: tuple[int, int] | None = None, *, column_peaks: bool = True,
             transposed: bool | None = None, stamp: str | None = None) -> RecordedPeaks | None:
    """The peaks recorded for the input at ``loc`` (of stored ``shape``; None: any) while its content
    stamp is the recorded one, else None (no record, an unknown version, unreadable, a stamp that
    changed, another shape). ``column_peaks``: read the side's peaks too (else the largest magnitude
    alone, without reading the peaks' file), of the stored columns (``transposed`` False) or rows
    (True), or of the side recorded (None): None where the record holds the other side's or the
    largest magnitude alone. ``stamp``: the input's content stamp where the caller holds one that still
    stands (a run's, taken at its first open and checked before it returns), else one is taken here."""
    loc = input_location(loc)

    def holds(data: dict) -> bool:
        recorded_shape = data.get("shape")
        side = bool(data.get("transposed", False))
        if shape is not None:
            if recorded_shape is None:  # a record of version 2: each stored column's peak
                if int(data.get("columns", -1)) != int(shape[1]):
                    return False
            elif [int(x) for x in recorded_shape] != [int(shape[0]), int(shape[1])]:
                return False
        if column_peaks and transposed is not None and side is not bool(transposed):
            return False
        return data.get("stamp") == (content_stamp(loc) if stamp is None else stamp)

    got = read_pair(backend(loc), PEAKS_RECORD, PEAKS_COLUMNS, holds, None, column_peaks)
    if got is None or not column_peaks:
        return got
    return None if got.columns is None else got


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
    has ``columns`` columns (None: any) and, with ``column_peaks``, its columns' file is whole and its
    (``columns`` None in the result where the record holds the largest magnitude alone)."""
    raw = be.try_read(record_key)
    if raw is None:
        return None
    try:
        data = json.loads(raw)
        if not isinstance(data, dict) or data.get("version") not in (_VERSION, _COLUMNS_ONLY_VERSION):
            return None
        amax, count, crc = float(data["amax"]), int(data["columns"]), data["crc32"]
    except (ValueError, KeyError, TypeError):
        return None
    if columns is not None and count != columns or not np.isfinite(amax) or amax < 0:
        return None
    if not holds(data):
        return None
    side = bool(data.get("transposed", False))
    if not column_peaks or crc is None:
        return RecordedPeaks(amax=amax, columns=None, transposed=side)
    packed = be.try_read(columns_key) if isinstance(crc, int) else None
    if packed is None or len(packed) != 8 * count or zlib.crc32(packed) != crc:
        return None
    cols = np.frombuffer(packed, dtype="<f8").astype(np.float64)
    if not np.isfinite(cols).all() or amax != float(cols.max(initial=0.0)):
        return None
    return RecordedPeaks(amax=amax, columns=cols, transposed=side)
