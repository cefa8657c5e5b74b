"""Reader and writer interfaces shared by every matrix file format, plus file-level helpers.

A *reader* exposes ``shape``, ``dtype``, ``order`` and ``read(rows, cols)``; a *writer* takes blocks
and publishes its output atomically on :meth:`Writer.commit`. Both are plain objects so that the
bounded-memory copy in :mod:`blocklin.storage.convert` can drive any pair of them.
"""

from __future__ import annotations

import abc
import errno
import os
import shlex
import uuid
from pathlib import Path
from typing import Any

import numpy as np

from blocklin.errors import (ConfigError, DTypeError, FormatError, OutputBusyError, OutputExistsError,
                             StoreNotFoundError, explain)
from blocklin.storage import file_records, input_guard, ownership, stamps
from blocklin.storage.atomic import busy_message, check_output_path
from blocklin.storage.cleanup import note_written
from blocklin.storage.space import folder_size
from blocklin.storage.guard import check_replaceable


def output_dtype(src: np.dtype, requested: Any) -> np.dtype:
    """The output dtype: the source's (native byte order) unless ``requested``; lossy kinds refused.

    Float to integer (or bool) and complex to real casts are refused; narrowing within a kind
    (float64 to float32, int64 to int32) is done because it was asked for, and integer narrowing is
    checked for overflow block by block.
    """
    src = np.dtype(src)
    if requested is None:
        return src.newbyteorder("=")
    try:
        out = np.dtype(requested)
    except TypeError:
        raise ConfigError(explain("dtype", "must be a numpy dtype name", repr(requested),
                                  "pass --dtype float64 (or float32, int64, ...)")) from None
    if out.kind not in "biufc":
        raise DTypeError(explain("dtype", "must be numeric", f"{out}", "pass --dtype float64"))
    if (src.kind == "f" and out.kind in "biu") or (src.kind == "c" and out.kind != "c") or \
            (src.kind in "iu" and out.kind == "b"):
        raise DTypeError(explain("dtype", f"the cast from {src.name} to {out.name} would lose values "
                                 "(fractions, imaginary parts or magnitudes)", f"{src.name} -> {out.name}",
                                 f"keep {src.name}, or pick a wider dtype (float64)"))
    return out.newbyteorder("=")


class Reader(abc.ABC):
    """A 2-D matrix in a file, read block by block.

    Attributes
    ----------
    format : str
        Format name (``"npy"``, ``"mtx"``, ...).
    path : str
        The file (or folder) read.
    shape : tuple of int
        ``(rows, cols)``.
    dtype : numpy.dtype
        Element type of the blocks :meth:`read` returns (as stored, byte order included).
    order : {"C", "F"}
        Layout on disk; the converter walks C sources by row panels and F sources by column panels.
    sequential : bool
        True when the source is only efficient read as forward, full-span panels in ``order``
        (text streams); the converter then plans that way or stages through a temporary zarr.
    chunks : tuple of int or None
        Storage chunks, so that panels can be aligned with them.
    resident_bytes : int
        Memory the reader holds for its whole life (the coordinate Matrix Market triplets).
    overhead_bytes : int
        Transient memory one :meth:`read` needs beyond the block it returns.
    bytes_read : int
        Bytes read from the file so far.
    """

    format = "?"
    sequential = False
    chunks: tuple[int, int] | None = None
    resident_bytes = 0
    overhead_bytes = 0
    resident_what = ""

    def __init__(self, path: str) -> None:
        self.path = path
        self.shape: tuple[int, int] = (0, 0)
        self.dtype = np.dtype("f8")
        self.order = "C"
        self.bytes_read = 0

    @abc.abstractmethod
    def read(self, rows: slice, cols: slice) -> np.ndarray:
        """Return ``A[rows, cols]`` as a new array (C or F contiguous)."""

    def prepare(self) -> None:
        """Load what the reader holds resident (called after the budget check)."""

    def locate(self, row: int, col: int) -> str:
        """Human position of element ``(row, col)`` (0-based) in the file."""
        return f"row {row + 1}, column {col + 1}"

    def describe(self) -> dict[str, Any]:
        """Facts for ``blocklin info`` (format, shape, dtype, order, chunks, codec, bytes)."""
        return {
            "format": self.format, "path": self.path, "shape": list(self.shape), "dtype": self.dtype.str,
            "order": self.order, "chunks": list(self.chunks) if self.chunks else None, "codec": "none",
            "bytes_on_disk": disk_usage(self.path), "bytes_in_memory": nbytes(self.shape, self.dtype),
            "provenance": None,
        }

    def close(self) -> None:
        pass

    def __enter__(self) -> Reader:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class Writer(abc.ABC):
    """Receives blocks of the output and publishes the result atomically.

    Attributes
    ----------
    order : {"C", "F"} or None
        Layout the writer prefers to receive (sequential writers require it).
    sequential : bool
        Blocks must come as forward full-span panels in ``order`` (text formats).
    unit : tuple of int
        Block edges must be multiples of this (zarr chunks) so that no two blocks share a chunk.
    overhead_per_element : int
        Extra bytes per block element the writer needs while writing (encoding, re-layout).
    overhead_bytes : int
        Fixed transient bytes while writing (text formatting batches, zarr chunks in flight).
    supports_resume : bool
        Whether :meth:`is_done`/:meth:`mark_done` persist across runs.
    """

    format = "?"
    order: str | None = None
    sequential = False
    supports_resume = False
    overhead_per_element = 0
    overhead_bytes = 0

    @property
    def partial_path(self) -> str | None:
        """The local file this writer is writing before its commit (None: a store or dataset, whose own
        writes name their files)."""
        atomic = getattr(self, "_atomic", None)
        return None if atomic is None else str(atomic.partial)

    def __init__(self, path: str, shape: tuple[int, int], dtype: Any) -> None:
        self.path = path
        self.shape = tuple(int(s) for s in shape)
        self.dtype = np.dtype(dtype)
        self.unit: tuple[int, int] = (1, 1)
        self.chunks: tuple[int, int] | None = None
        self.resumed = False

    @abc.abstractmethod
    def write(self, rows: slice, cols: slice, block: np.ndarray) -> None:
        """Write one planned block (whole output chunks)."""

    def is_done(self, unit: str) -> bool:
        return False

    def mark_done(self, unit: str) -> None:
        pass

    @abc.abstractmethod
    def commit(self, *, operation: str = "convert", plan: dict | None = None, params: dict | None = None,
               report: dict | None = None) -> str:
        """Publish the finished output under its final name; return that path."""

    def abort(self) -> None:
        pass


class AtomicFile:
    """A single output file written under ``.NAME.partial-<token>`` and renamed into place.

    ``kind`` is the file's format: ``overwrite`` replaces only a file of that format that blocklin
    wrote and nobody changed since, or an empty file (:func:`blocklin.storage.guard.check_replaceable`),
    never a folder or another program's file. The commit records the new file as blocklin's
    (:mod:`blocklin.storage.file_records`) once it is in place.
    """

    def __init__(self, path: str | os.PathLike, *, inputs: list[str] = (), overwrite: bool = False,
                 token: str | None = None, kind: str = "raw", name: str = "out") -> None:
        self.path = check_output_path(path, inputs, overwrite=overwrite, kind=kind, name=name)
        self.overwrite = overwrite
        self.name = name  # the parameter (or option) refusals name
        self.kind = kind
        self.partial = self.path.parent / f".{self.path.name}.partial-{token or uuid.uuid4().hex[:16]}"
        self.committed = False
        self._owner: dict | None = None
        # before the first block is read; the commit refuses if an input changed since (input_guard)
        self._inputs = [stamps.input_location(i) for i in inputs if i is not None]
        self._stamps = input_guard.stamps_for(self._inputs)  # the run's, where it opened them already
        self._covers = input_guard.coverage(self._inputs, self._stamps)
        with ownership.claim_lock(str(self.path.parent)):  # as `blocklin clean` judges and removes partials
            if os.path.lexists(self.partial):  # a stale partial of the same job: file outputs restart
                self._take_over()
            # who writes the partial, until it is committed or removed: `clean` removes it once that run is gone
            self._owner = file_records.write_owner(self.partial, operation="export", for_output=str(self.path))
            # its heartbeat, as a zarr output's: on another host a long export had looked gone
            file_records.keep_alive(self.partial, self._owner)
            AtomicFile._writing.add(str(self.partial))

    #: The partials this process is writing (a second writer of one in the same process is busy too).
    _writing: set[str] = set()

    def _take_over(self) -> None:
        """Remove the stale partial of an earlier run of this job, under the claim lock: never a live
        run's (the same export started twice: removing its partial had let its commit publish this
        run's half-written file as the output), never what is not a partial file."""
        if os.path.islink(self.partial) or not os.path.isfile(self.partial):
            raise OutputExistsError(explain(self.name, "needs its partial file's name free (a run writes there until "
                                            "it commits)", f"{str(self.partial)!r} exists and is not a partial file "
                                            "blocklin wrote", f"move it away (mv {shlex.quote(str(self.partial))} ...) and rerun"))
        owner = file_records.read_owner(self.partial)
        if ownership.is_alive(owner) and (not ownership.is_mine(owner) or str(self.partial) in AtomicFile._writing):
            raise OutputBusyError(busy_message(str(self.path), owner))
        self.partial.unlink()
        file_records.drop_owner(self.partial)

    def commit(self, *, datasets: list[str] | None = None) -> Path:
        """Rename the finished file into place and record it as blocklin's (``datasets``: HDF5's), unless
        an input changed during the run (:class:`~blocklin.errors.InputChangedError`)."""
        today = input_guard.check_unchanged(self._stamps, self._inputs, str(self.path), covers=self._covers)
        input_guard.checked(self._stamps, today)
        if os.path.lexists(self.path):  # checked again: it may have appeared during the run
            if not self.overwrite:
                raise OutputExistsError(explain(self.name, "must not exist unless overwriting is asked for",
                                                f"{str(self.path)!r} appeared during the run",
                                                "pass overwrite=True (CLI: --overwrite) or choose another path"))
            check_replaceable(self.path, self.kind, self.name)
        with ownership.claim_lock(str(self.path.parent)):  # as a takeover, which replaces the partial
            if not self._owns_partial():
                owner = file_records.read_owner(self.partial)
                raise OutputBusyError(explain(
                    self.name, "must stay this run's output until it commits",
                    f"{str(self.partial)!r} taken over during this run by "
                    f"{ownership.describe(owner) if owner else 'another run'}",
                    "run one export per output at a time; rerun this one once the other is done or gone"))
            file_records.let_go(self.partial)  # no beat recreates the record dropped below
            written = os.stat(self.partial)
            try:
                os.replace(self.partial, self.path)
                self.committed = True
            finally:  # a Ctrl-C once the file is in place (as os.replace returns, too) still records it (a
                # complete file without its record had been refused by a later overwrite, though the run
                # said it was written); the inode tells a rename that happened from one that did not
                if self.committed or _same_inode(self.path, written):
                    self.committed = True
                    try:
                        file_records.drop_owner(self.partial)
                    finally:
                        try:
                            AtomicFile._writing.discard(str(self.partial))
                            note_written(self.path)
                        finally:
                            file_records.write(self.path, self.kind, datasets=datasets)
        return self.path

    def _owns_partial(self) -> bool:
        """Whether the partial is still this run's: a run on another host that took this one for gone
        (its heartbeat older than the lease: a process stopped that long) replaced it with its own,
        which this run may neither publish nor remove."""
        owner = file_records.read_owner(self.partial)
        return owner is not None and self._owner is not None and owner.get("run") == self._owner["run"]

    def abort(self) -> None:
        if not self.committed:
            AtomicFile._writing.discard(str(self.partial))
            file_records.let_go(self.partial)
            with ownership.claim_lock(str(self.path.parent)):
                if not self._owns_partial() and file_records.read_owner(self.partial) is not None:
                    return  # another run's now
                try:
                    self.partial.unlink()
                except FileNotFoundError:
                    pass
                file_records.drop_owner(self.partial)


def _same_inode(path: Path, st: os.stat_result) -> bool:
    """Whether ``path`` is (not a link to) the file ``st`` was taken of."""
    try:
        now = os.lstat(path)
    except OSError:
        return False
    return (now.st_dev, now.st_ino) == (st.st_dev, st.st_ino)


def nbytes(shape: tuple[int, ...], dtype: Any) -> int:
    """Bytes of a dense array of ``shape`` and ``dtype``."""
    n = 1
    for s in shape:
        n *= int(s)
    return n * np.dtype(dtype).itemsize


def disk_usage(path: str | os.PathLike) -> int:
    """Bytes of a file, or of all files under a folder."""
    p = Path(path)
    return p.stat().st_size if p.is_file() else folder_size(str(p))


def require_file(path: str, name: str = "input") -> str:
    """Check that ``path`` is an existing file."""
    if not os.path.exists(path):
        raise StoreNotFoundError(explain(name, "must name an existing file", f"{path!r}, which does not exist",
                                         "check the path"))
    if os.path.isdir(path):
        raise FormatError(explain(name, "must be a file for this format", f"{path!r} is a folder",
                                  "name a file, or pass --from zarr for a zarr store"))
    return path


def check_matrix_dtype(dtype: Any, what: str) -> np.dtype:
    """Accept numeric (bool, int, uint, float, complex) dtypes only."""
    dt = np.dtype(dtype)
    if dt.kind not in "biufc" or dt.fields is not None or dt.subdtype is not None:
        raise DTypeError(explain(what, "must hold numbers (bool, integer, float or complex)", f"dtype {dt}",
                                 "convert the data to a numeric dtype first"))
    return dt


def check_2d(shape: tuple[int, ...], what: str, *, vector: bool = False) -> tuple[int, int]:
    """Accept 2-D shapes only (a matrix), and with ``vector`` a 1-D shape as an ``n x 1`` column (for
    formats whose bytes are the same either way); name the reshape fix otherwise."""
    if vector and len(shape) == 1:
        return int(shape[0]), 1
    if len(shape) != 2:
        raise FormatError(explain(what, "must be a 2-D matrix", f"shape {tuple(shape)} ({len(shape)}-D)",
                                  "reshape it to 2-D first (a vector as (n, 1))"))
    return int(shape[0]), int(shape[1])


def pread_into(fd: int, buf: np.ndarray, offset: int) -> int:
    """Fill the contiguous ``buf`` from ``fd`` at ``offset`` (looping over short reads)."""
    view = memoryview(buf.reshape(-1).view(np.uint8)) if buf.size else memoryview(b"")
    done, total = 0, len(view)
    while done < total:
        n = os.preadv(fd, [view[done:done + (1 << 30)]], offset + done)
        if n == 0:
            raise FormatError(explain("input", "must hold all the bytes its header announces",
                                      f"end of file at byte {offset + done}", "the file is truncated; re-create it"))
        done += n
    return total


def pwrite_from(fd: int, buf: np.ndarray, offset: int) -> int:
    """Write the contiguous ``buf`` to ``fd`` at ``offset`` (looping over short writes: a disk that fills part
    way returns a short count, and the next write raises its ``OSError``)."""
    view = memoryview(buf.reshape(-1).view(np.uint8)) if buf.size else memoryview(b"")
    done, total = 0, len(view)
    while done < total:
        n = os.pwritev(fd, [view[done:done + (1 << 30)]], offset + done)
        if not n:  # pragma: no cover - a regular file's write returns > 0 or raises
            raise OSError(errno.EIO, "write wrote nothing", None)
        done += n
    return total


class TextFileWriter(Writer):
    """A writer of one ASCII text file, published atomically (Matrix Market, CSV/TSV)."""

    sequential = True

    def _open_text(self, inputs: list[str], overwrite: bool, token: str | None) -> None:
        self._atomic = AtomicFile(self.path, inputs=list(inputs), overwrite=overwrite, token=token, kind=self.format)
        self._fh = open(self._atomic.partial, "w", encoding="ascii", newline="\n")
        self.bytes_written = 0

    def commit(self, **_: Any) -> str:
        self._fh.close()
        return str(self._atomic.commit())

    def abort(self) -> None:
        self._fh.close()
        self._atomic.abort()
