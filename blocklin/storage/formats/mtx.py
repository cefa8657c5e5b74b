"""Matrix Market ``.mtx`` files: ``array`` and ``coordinate`` read, dense ``array`` written.

Readers:

* ``array`` ``general``: values in column-major order, one per line; streamed forward by column
  panels (never whole).
* ``array`` ``symmetric``/``skew-symmetric``: the lower triangle, column by column. A block of the
  full matrix needs values from columns far apart in the file, so the reader first mirrors the file
  into a scratch zarr under the temp dir in strips of columns (:meth:`MtxReader.stage`, planned by
  :func:`blocklin.plan.convert.plan_mirror` within the budget) and then reads the scratch by blocks.
* every ``coordinate`` file (entries in any order) is held in memory: the reader states the bytes
  it needs (:attr:`MtxReader.resident_bytes`) and the converter refuses, naming that figure, when
  the budget cannot hold them. Symmetric and skew-symmetric entries are mirrored; duplicates are
  summed (as :func:`scipy.io.mmread` does); ``pattern`` entries read as 1. :meth:`MtxReader.entries`
  streams them block by block for the sparse conversion; each block is parsed by SciPy's C++ reader
  when :mod:`blocklin.storage.formats.mtx_parse` finds it in a grammar both parsers read alike, else
  line by line by ``np.loadtxt`` (which names a bad line).

The writer emits ``array`` ``general`` files (``real`` or ``integer``), one column panel at a time.
"""

from __future__ import annotations

import io
import itertools
import os
from typing import Any

import numpy as np

from blocklin.errors import DTypeError, FormatError, InternalError, explain
from blocklin.storage.formats.base import Reader, TextFileWriter, check_matrix_dtype, require_file
from blocklin.storage.formats.mtx_parse import AVAILABLE, parse_coordinate_block
from blocklin.storage.formats.text_util import (
    FORMAT_BATCH, PARSE_BATCH_BYTES, check_mtx_integers, check_parsed, field_error, formatter,
)

_FIELDS = {"real": np.float64, "double": np.float64, "integer": np.int64, "pattern": np.float64}
_SYMMETRIES = ("general", "symmetric", "skew-symmetric")
#: Bytes per stored coordinate entry while loading: row and column (int64), value, and the
#: permutation and gathered copies of the sort by row.
COORD_BYTES_PER_ENTRY = 48
_PARSE_SLACK = 8 << 20


#: Fewest bytes of one coordinate entry (``"1 1 1\n"``; pattern files ``"1 1\n"``) and one array value.
MIN_ENTRY_BYTES = 4
MIN_VALUE_BYTES = 2


def _nth_newline(text: str, k: int, count: int) -> int:
    """Index of the ``k``-th newline (from 1) of ``text``, which holds ``count >= k`` of them."""
    extra = count - k
    if extra <= 64:  # the usual case: a read a few lines past the block, searched from the end
        pos = len(text)
        for _ in range(extra + 1):
            pos = text.rfind("\n", 0, pos)
        return pos
    # one code point a byte ("?" for any other), so the offsets are the text's
    codes = np.frombuffer(text.encode("ascii", "replace"), np.uint8)
    return int(np.flatnonzero(codes == 10)[k - 1])


def _runs_between(cuts: np.ndarray, k: int) -> list[tuple[int, int]]:
    """The non-empty ranges of ``0..k`` between the sorted positions ``cuts`` (each left out)."""
    bounds = [-1, *cuts.tolist(), k]
    return [(a + 1, b) for a, b in zip(bounds[:-1], bounds[1:]) if b > a + 1]


def _as_text(block, first: int) -> str:
    """A block of bytes (lines from ``first``) as text: ASCII (other bytes as U+FFFD), ``"\\r\\n"``
    read as ``"\\n"``; a carriage return elsewhere (old Mac line ends) is refused."""
    text = bytes(block).decode("ascii", "replace")
    if "\r" not in text:
        return text
    text = text.replace("\r\n", "\n")
    if "\r" in text:
        at = text.index("\r")
        raise _bad("lines must end with LF or CR LF", f"a carriage return alone at line "
                   f"{first + text.count(chr(10), 0, at)}", "convert the line ends (dos2unix, or mac2unix)")
    return text


def _holds_inf(values: np.ndarray) -> bool:
    """Whether a fast-parsed block of real values holds an Inf: its grammar has no ``inf``, so the C++
    reader made it of a finite number beyond float64 (``1e400``), which the line-by-line parse
    refuses (:func:`~blocklin.storage.formats.text_util.check_parsed`)."""
    return bool(np.isinf(values).any())


def _bad(rule: str, actual: str, fix: str = "check the file (see https://math.nist.gov/MatrixMarket/formats.html)"):
    return FormatError(explain("mtx input", rule, actual, fix))


class MtxReader(Reader):
    """Reader of a Matrix Market file (see the module notes for what is streamed)."""

    format = "mtx"
    # a parse block: its text, and either its bytes and the fast parse's check (two block-sized bool
    # arrays, the field starts' positions: mtx_parse) or its lines as str and their values (np.loadtxt);
    # measured: a real symmetric file of 1.5 million entries converts 15 MiB above the baseline at 24 MiB
    # with 1 MiB blocks; four times the block (use_blocks)
    overhead_bytes = 4 << 20

    def __init__(self, path: str, **_: Any) -> None:
        super().__init__(require_file(path))
        self._fh = open(path, encoding="ascii", errors="replace")
        try:
            self._parse_header()
        except BaseException:
            self._fh.close()
            raise
        self._data = None  # resident matrix or triplets, filled by prepare()
        self.block_bytes = PARSE_BATCH_BYTES  # bytes of text per fast-parsed block (use_blocks)

    # -- header -----------------------------------------------------------------------------------
    def _parse_header(self) -> None:
        banner = self._fh.readline()
        toks = banner.strip().split()
        if not toks or toks[0].lower() != "%%matrixmarket":
            raise _bad("line 1 must be the banner '%%MatrixMarket matrix FORMAT FIELD SYMMETRY'",
                       f"{banner.strip()[:60]!r}", "check that the file is Matrix Market, or pass --from")
        if len(toks) != 5 or toks[1].lower() != "matrix":
            raise _bad("the banner must read '%%MatrixMarket matrix FORMAT FIELD SYMMETRY'", f"{banner.strip()!r}")
        self.layout, field, symmetry = (t.lower() for t in toks[2:])
        if self.layout not in ("array", "coordinate"):
            raise _bad("FORMAT must be 'array' or 'coordinate'", repr(self.layout))
        if field == "complex":
            raise DTypeError(explain("mtx input", "complex Matrix Market files are not supported",
                                     "field 'complex'", "convert the real and imaginary parts separately"))
        if field not in _FIELDS:
            raise _bad("FIELD must be real, integer or pattern", repr(field))
        if symmetry == "hermitian":
            raise _bad("SYMMETRY 'hermitian' needs complex values, which are not supported", repr(symmetry))
        if symmetry not in _SYMMETRIES:
            raise _bad(f"SYMMETRY must be one of {_SYMMETRIES}", repr(symmetry))
        if field == "pattern" and self.layout == "array":
            raise _bad("'pattern' is only valid for coordinate files", "array pattern")
        self.field, self.symmetry = field, symmetry
        self.dtype = np.dtype(_FIELDS[field])
        self._parse_size_line()
        self._plan_reading()

    def _parse_size_line(self) -> None:
        """The first line after the banner and comments: ``ROWS COLS [NNZ]``."""
        line_no = 1
        while True:
            line = self._fh.readline()
            line_no += 1
            if not line:
                raise _bad("must have a size line after the banner and comments", "end of file",
                           "the file is truncated; re-create it")
            if line.strip() and not line.lstrip().startswith("%"):
                break
        parts = line.split()
        want = 3 if self.layout == "coordinate" else 2
        try:
            nums = [int(p) for p in parts]
        except ValueError:
            nums = []
        if len(nums) != want or min(nums) < 0:
            raise _bad(f"the size line must hold {want} non-negative integers "
                       f"({'ROWS COLS NNZ' if want == 3 else 'ROWS COLS'})", f"{line.strip()!r} at line {line_no}")
        self.shape = (nums[0], nums[1])
        self.nnz = nums[2] if want == 3 else None
        self._data_line = line_no + 1
        self._next_line = self._data_line
        self._check_size_backed(line_no)

    def _check_size_backed(self, line_no: int) -> None:
        """The rest of the file can hold what the size line announces (a header that says more is a
        truncated file, refused before a budget is sized for it)."""
        m, n = self.shape
        if self.layout == "coordinate":
            count, least, what = self.nnz, MIN_ENTRY_BYTES, "entries"
        else:
            count = m * n if self.symmetry == "general" else (n * (n + 1) // 2 if self.symmetry == "symmetric"
                                                             else n * (n - 1) // 2)
            least, what = MIN_VALUE_BYTES, "values"
        left = max(0, os.fstat(self._fh.fileno()).st_size - self._fh.tell())
        if count * least > left + least:  # the last line may lack its newline
            raise _bad(f"must hold the {count} {what} its size line (line {line_no}) announces, at least {least} "
                       f"bytes each", f"{left} bytes after the size line", "the file is truncated (or its size line "
                       "is wrong); re-create it")

    def _plan_reading(self) -> None:
        """Order, value count and what the reader must hold, from the layout and symmetry."""
        m, n = self.shape
        if self.symmetry != "general" and m != n:
            raise _bad(f"a {self.symmetry} matrix must be square", f"shape {m} x {n}")
        if self.layout == "array":
            self.order = "F"
            if self.symmetry == "general":
                self.count = m * n
                self.sequential = True
            else:  # mirrored through a scratch zarr (stage), then read by blocks
                self.count = n * (n + 1) // 2 if self.symmetry == "symmetric" else n * (n - 1) // 2
                self.mirrored = True
        else:
            self.order = "C"
            stored = self.nnz * (1 if self.symmetry == "general" else 2)
            self.resident_bytes = stored * COORD_BYTES_PER_ENTRY + _PARSE_SLACK
            self.resident_what = (f"the coordinate reader holds its {self.nnz} entries"
                                  f"{' (mirrored)' if self.symmetry != 'general' else ''} as triplets")

    def use_blocks(self, nbytes: int) -> None:
        """Parse the entries in blocks of ``nbytes`` of text (at least :data:`PARSE_BATCH_BYTES`) where
        the fast parse reads them; :attr:`overhead_bytes` grows with them. The C++ reader's cost per
        block is fixed: 1 MiB blocks of a 138 MB pattern file parsed at 91 MB/s with their check,
        8 MiB blocks at 116 MB/s."""
        self.block_bytes = max(PARSE_BATCH_BYTES, int(nbytes))
        self.overhead_bytes = 4 * self.block_bytes

    # -- parsing ----------------------------------------------------------------------------------
    def _lines(self, count: int):
        """Yield batches of (first_line_number, [lines]) for the next ``count`` data lines."""
        left = count
        while left > 0:
            take = max(1, min(left, PARSE_BATCH_BYTES // 32))
            batch = list(itertools.islice(self._fh, take))
            if len(batch) < take:
                got = count - left + len(batch)
                what = "entries" if self.layout == "coordinate" else "values"
                raise _bad(f"must hold the {self.nnz if self.nnz is not None else self.count} {what} "
                           "the header announces", f"end of file at line {self._next_line + len(batch)} "
                           f"({self._consumed + got} found)", "the file is truncated; re-create it")
            self.bytes_read += sum(len(s) for s in batch)
            yield self._next_line, batch
            self._next_line += len(batch)
            left -= len(batch)

    def _entry_blocks(self, count: int):
        """Yield ``(first_line_number, text, lines)`` for the next ``count`` data lines: blocks of at most
        ``PARSE_BATCH_BYTES // 32`` whole lines (as :meth:`_lines` batches them, so a batch's entries stay
        within the plan) read as text blocks, not line by line (a Python list of lines and their
        lengths cost more than the parse). What is read past the last line is kept for
        :meth:`_check_end`."""
        cap = max(1, PARSE_BATCH_BYTES // 32)
        left, buf, eof, per_line = count, "", False, 16.0
        while left > 0:
            take = min(left, cap)
            have = buf.count("\n")
            while have < take and not eof:
                # sized from the lines seen so far, so a read rarely overshoots by more than a few lines
                chunk = self._fh.read(int(min(PARSE_BATCH_BYTES, (take - have) * per_line + 256)))
                eof = not chunk
                have += chunk.count("\n")
                buf += chunk
            if have >= take:
                cut, lines = _nth_newline(buf, take, have) + 1, take
            else:  # end of file: a last line without its newline counts
                lines = have + (1 if buf and not buf.endswith("\n") else 0)
                if lines < take:
                    self._pending = ""
                    raise _bad(f"must hold the {self.nnz} entries the header announces",
                               f"end of file at line {self._next_line + lines} ({count - left + lines} found)",
                               "the file is truncated; re-create it")
                cut = len(buf)
            text, buf = buf[:cut], buf[cut:]
            per_line = max(4.0, len(text) / lines)
            self.bytes_read += len(text)
            yield self._next_line, text, lines
            self._next_line += lines
            left -= lines
        self._pending = buf

    def _open_raw(self):
        """A binary handle at the text handle's position (the first entry line), or None when the text
        handle's position is not a byte offset (a decoder state in its cookie)."""
        try:
            pos = self._fh.tell()
        except OSError:  # pragma: no cover - the header is read by readline, which keeps tell()
            return None
        if pos >> 63:
            return None
        raw = open(self.path, "rb")
        raw.seek(pos)
        return raw

    def _raw_blocks(self, raw, count: int):
        """:meth:`_entry_blocks` read as bytes into one buffer kept from block to block: yields
        ``(first_line_number, block, lines)``, ``block`` a memoryview of the buffer valid until the
        next (no text decoded and encoded again, and no new block-sized objects: the process maps
        every large one afresh, :mod:`blocklin._memory`, and their page faults cost more than the
        parse). Lines end at ``"\\n"``; a ``"\\r"`` before it stays in the line (the parse reads it
        as a space). What is read past the last line is kept for :meth:`_check_end_raw`."""
        block = self.block_bytes
        cap = max(1, block // 32)
        buf = bytearray(2 * block)
        left, fill, eof, per_line = count, 0, False, 16.0
        while left > 0:
            take = min(left, cap)
            have = buf.count(b"\n", 0, fill)
            while have < take and not eof:
                # sized from the lines seen so far, so a read rarely overshoots by more than a few lines
                want = int(min(block, (take - have) * per_line + 256))
                if fill + want > len(buf):
                    buf.extend(bytes(fill + want - len(buf)))
                with memoryview(buf) as view:
                    got = raw.readinto(view[fill:fill + want])
                eof = not got
                have += buf.count(b"\n", fill, fill + got)
                fill += got
            if have >= take:
                cut, pos = 0, fill
                if have - take <= 64:  # the usual case: a read a few lines past the block
                    for _ in range(have - take + 1):
                        pos = buf.rfind(b"\n", 0, pos)
                    cut = pos + 1
                else:
                    cut = int(np.flatnonzero(np.frombuffer(buf, np.uint8, fill) == 10)[take - 1]) + 1
                lines = take
            else:  # end of file: a last line without its newline counts
                lines = have + (1 if fill and buf[fill - 1] != 10 else 0)
                if lines < take:
                    raise _bad(f"must hold the {self.nnz} entries the header announces",
                               f"end of file at line {self._next_line + lines} ({count - left + lines} found)",
                               "the file is truncated; re-create it")
                cut = fill
            per_line = max(4.0, cut / lines)
            self.bytes_read += cut
            with memoryview(buf) as view:
                yield self._next_line, view[:cut], lines
            self._next_line += lines
            left -= lines
            buf[:fill - cut] = buf[cut:fill]  # the part of a line read past, to the front
            fill -= cut
        self._pending_raw = bytes(buf[:fill])

    def _check_end_raw(self, raw) -> None:
        """:meth:`_check_end` on the binary handle: only blank lines may follow the entries."""
        pending, self._pending_raw = self._pending_raw, b""
        # bytes read past the entries (_raw_blocks), completed to their line's end, then the rest
        head = io.BytesIO(pending + raw.readline()) if pending else ()
        for k, line in enumerate(itertools.chain(head, raw)):
            if line.strip():
                text = line.decode("ascii", "replace").strip()
                raise _bad("must end after the entries the header announces",
                           f"extra data at line {self._next_line + k}: {text[:40]!r}",
                           "fix the count in the size line or remove the extra lines")

    _pending_raw = b""

    def _parse_block(self, first: int, text: str, lines: int, ncols: int, dtype: np.dtype) -> np.ndarray:
        """:meth:`_parse` of a block of ``lines`` lines given as one text (see :meth:`_entry_blocks`)."""
        batch = text.split("\n")  # only "\n" ends a line, as when the file is read line by line
        if len(batch) > lines:
            batch.pop()  # the empty piece after the last newline
        return self._parse(first, batch, ncols, dtype)

    def _parse(self, first: int, batch: list[str], ncols: int, dtype: np.dtype) -> np.ndarray:
        try:
            arr = np.loadtxt(batch, dtype=dtype, ndmin=2, comments=None)
        except (ValueError, OverflowError):  # OverflowError: an integer beyond dtype (a uint64 2^64 - 1)
            arr = None
        if arr is not None and arr.shape == (len(batch), ncols):
            # a real file's values are declared real: an integer literal rounds as any other number
            check_parsed(arr, lambda k: batch[k].split(), lambda k: first + k, "mtx input", integer_fix="")
            return arr
        for k, line in enumerate(batch):  # find the first bad line for the message
            fields = line.split()
            if len(fields) != ncols:
                raise _bad(f"each data line must hold {ncols} fields", f"{len(fields)} at line {first + k}: "
                           f"{line.strip()[:60]!r}", "fix or remove that line")
            for c, f in enumerate(fields):
                try:
                    np.array([f]).astype(dtype)
                except (ValueError, OverflowError):
                    raise field_error("mtx input", f, first + k, c + 1, dtype, "fix that value") from None
        raise _bad("data lines must be numbers", f"lines {first}-{first + len(batch) - 1}")  # pragma: no cover

    def prepare(self) -> None:
        """Load the resident data (coordinate triplets); a symmetric array file is staged instead."""
        if self._data is not None:
            return
        if self.mirrored:
            if self._scratch is None:
                raise InternalError("a symmetric array file is read after MtxReader.stage()")  # pragma: no cover
            return
        if self.resident_bytes == 0:  # nothing to load; no panel will be read when nothing is stored
            if self.layout == "coordinate" or self.shape[0] * self.shape[1] == 0:
                self._check_end()
            return
        self._consumed = 0
        self._data = self._load_coordinate()
        self._check_end()

    # -- symmetric array files: mirrored into a scratch zarr ------------------------------------------
    mirrored = False
    _scratch = None
    _work = None

    def plan_mirror(self, memory: int) -> Any:
        """The mirror plan for ``memory`` (:func:`blocklin.plan.convert.plan_mirror`); once planned,
        the reader reads the scratch, by blocks aligned to its square chunks."""
        from blocklin.plan.convert import plan_mirror

        plan = plan_mirror(self.shape[0], self.dtype, memory=memory, parse_bytes=self.overhead_bytes)
        self.chunks = (plan.width, plan.width)
        self.chunk_bytes = plan.width * plan.width * self.dtype.itemsize
        return plan

    def stage(self, plan: Any, root: Any) -> None:
        """Mirror the file into a scratch zarr in a work folder under ``root`` (the temp dir), one
        strip of ``plan.width`` columns at a time; the folder goes when the reader is closed."""
        import uuid

        import zarr

        from blocklin.storage.cleanup import sweep_stale
        from blocklin.storage.ownership import start_work_folder
        from blocklin.storage.space import check_space
        from blocklin.storage.zarr_store import create_array

        n, w = self.shape[0], plan.width
        self.chunks = (w, w)
        if root.is_local:  # what killed runs left there goes first, as a job's first temp_dir() does
            sweep_stale(root)
        work = root / f"blocklin-mirror-{uuid.uuid4().hex[:12]}"
        check_space(work, n * n * self.dtype.itemsize, "temp_dir", f"a {n} x {n} {self.dtype.name} scratch copy of "
                    f"the {self.symmetry} file")
        self._work = work  # set first: close() removes it even if an interrupt lands while it is made
        try:
            start_work_folder(work, operation="convert-mirror")
            scratch = create_array(work / "mirror.zarr", shape=self.shape, dtype=self.dtype, chunks=(w, w),
                                   codec="none")
            with zarr.config.set({"async.concurrency": 1}):  # one chunk in flight, as planned
                self._mirror_into(scratch, w)
            self._check_end()
        except BaseException:
            self.close()
            raise
        self._scratch = scratch

    def _mirror_into(self, scratch: Any, w: int) -> None:
        """Write every strip of ``w`` columns twice: below the diagonal as it is stored, right of the
        diagonal block transposed (negated when skew-symmetric)."""
        from blocklin.storage.zarr_store import write_block

        n = self.shape[0]
        skew = self.symmetry == "skew-symmetric"
        values = self._stored_values()
        for c0 in range(0, n, w):
            c1 = min(c0 + w, n)
            strip = np.zeros((n - c0, c1 - c0), self.dtype, order="F")  # rows c0..n of columns c0..c1
            for j in range(c0, c1):
                strip[(j + 1 if skew else j) - c0:, j - c0] = next(values)
            diag = strip[:c1 - c0]
            lower = np.tril(diag, -1)
            if skew:
                diag -= lower.T
            else:
                diag += lower.T
            del lower
            write_block(scratch, slice(c0, n), slice(c0, c1), strip)
            if c1 < n:
                below = strip[c1 - c0:]
                if skew:
                    np.negative(below, out=below)
                write_block(scratch, slice(c0, c1), slice(c1, n), below.T)  # rows of it are contiguous
            del strip, diag

    def _stored_values(self):
        """The stored values column by column: yields one array per stored column (its rows from the
        diagonal, or below it when skew-symmetric)."""
        n = self.shape[0]
        skew = self.symmetry == "skew-symmetric"
        col = np.empty(n, self.dtype)
        j, i = 0, 1 if skew else 0  # next stored (column, row)
        for first, batch in self._lines(self.count):
            vals = self._parse(first, batch, 1, self.dtype)[:, 0]
            k = 0
            while k < len(vals):
                take = min(n - i, len(vals) - k)
                col[i:i + take] = vals[k:k + take]
                i += take
                k += take
                if i == n:
                    yield col[(j + 1 if skew else j):]  # a view: the caller copies it before the next
                    j += 1
                    i = j + 1 if skew else j
            self._consumed += len(vals)
        while j < n:  # skew-symmetric: the last column stores nothing
            yield col[:0]
            j += 1

    def _check_end(self) -> None:
        pending, self._pending = self._pending, ""
        # text read past the entries (_entry_blocks), completed to its line's end, then the rest
        head = io.StringIO(pending + self._fh.readline()) if pending else ()
        for k, line in enumerate(itertools.chain(head, self._fh)):
            if line.strip():
                raise _bad("must end after the entries the header announces",
                           f"extra data at line {self._next_line + k}: {line.strip()[:40]!r}",
                           "fix the count in the size line or remove the extra lines")

    def entries(self):
        """Yield the coordinate entries batch by batch, checked, as ``(first_line, rows, cols, values,
        stored)``: 0-based ``rows``/``cols`` (int64), ``values`` in the reader's dtype (pattern: 1), the
        batch's ``stored`` entries in file order (entry ``i`` on line ``first_line + i``) followed by
        their mirror images (symmetric, skew-symmetric: off-diagonal entries transposed, negated when
        skew). Ends by checking that nothing follows the announced entries.

        The arrays are views of buffers reused from batch to batch (valid until the next batch): the
        process maps every large array afresh (:mod:`blocklin._memory`), and the page faults of a
        batch's new arrays cost more than parsing it.
        """
        ncols = 2 if self.field == "pattern" else 3
        parse_dt = np.int64 if self.field in ("integer", "pattern") else np.float64
        mirror = self.symmetry != "general"
        cap = max(1, self.block_bytes // 32) * (2 if mirror else 1)
        rows, cols, vals = np.empty(cap, np.int64), np.empty(cap, np.int64), np.empty(cap, self.dtype)
        self._consumed = 0
        fast_field = "integer" if self.field == "integer" else "pattern" if self.field == "pattern" else "real"
        work = np.empty(0, bool)  # the fast parse's check, reused from block to block
        raw = self._open_raw() if AVAILABLE else None
        try:
            yield from self._entry_batches(raw, rows, cols, vals, work, fast_field, ncols, parse_dt)
        finally:
            if raw is not None:
                raw.close()

    def _entry_batches(self, raw, rows, cols, vals, work, fast_field, ncols, parse_dt):
        """The body of :meth:`entries`: blocks as bytes from ``raw`` (else as text), each parsed fast
        or line by line, checked and mirrored into the buffers."""
        m, n = self.shape
        mirror = self.symmetry != "general"
        blocks = self._raw_blocks(raw, self.nnz) if raw is not None else self._entry_blocks(self.nnz)
        for first, block, k in blocks:
            r, c, v = rows[:k], cols[:k], vals[:k]
            if len(work) < 2 * len(block) + 2:  # the bytes, and the newline added after a last line
                work = np.empty(2 * len(block) + 2, bool)
            if not parse_coordinate_block(block, k, (m, n), fast_field, r, c, v, work) or \
                    (fast_field == "real" and _holds_inf(v)):
                # outside the fast parse's grammar, or refused by it, or holding an Inf (1e400 read as
                # Inf): line by line, as np.loadtxt reads, which names such a value's line
                text = block if isinstance(block, str) else _as_text(block, first)
                arr = self._parse_block(first, text, k, ncols, parse_dt)
                if parse_dt is np.float64:  # a real file's lines are parsed as floats: "1.5" is no index
                    frac = np.flatnonzero(np.any(arr[:, :2] != np.trunc(arr[:, :2]), axis=1))
                    if frac.size:
                        b = frac[0]
                        raise _bad("entry indices must be integers", f"({arr[b, 0]:g}, {arr[b, 1]:g}) at line "
                                   f"{first + b}", "fix the entry")
                    self._check_range(first, arr[:, 0], arr[:, 1])  # before the cast, which would wrap
                np.copyto(r, arr[:, 0], casting="unsafe")  # as astype(np.int64)
                np.copyto(c, arr[:, 1], casting="unsafe")
                if self.field != "pattern":
                    np.copyto(v, arr[:, 2], casting="unsafe")
                del arr, text
                r -= 1
                c -= 1
            del block
            self._check_range(first, r, c, 0)
            unit = self.field == "pattern" and self.symmetry != "skew-symmetric"
            if self.field == "pattern" and not unit:
                v.fill(1)
            total = k
            if mirror:
                off = r != c
                if self.symmetry == "skew-symmetric" and np.any(v[~off] != 0):
                    b = np.flatnonzero(~off & (v != 0))[0]
                    raise _bad("a skew-symmetric matrix has a zero diagonal",
                               f"a nonzero diagonal entry at line {first + b}", "fix the entry or the symmetry")
                total = k + int(np.count_nonzero(off))
                if 2 * k - total <= 64:  # a few diagonal entries (the usual block): copies between them
                    at = k
                    for a, b in _runs_between(np.flatnonzero(~off), k):
                        rows[at:at + b - a], cols[at:at + b - a] = c[a:b], r[a:b]
                        if not unit:
                            vals[at:at + b - a] = v[a:b]
                        at += b - a
                else:
                    np.compress(off, c, out=rows[k:total])
                    np.compress(off, r, out=cols[k:total])
                    if not unit:
                        np.compress(off, v, out=vals[k:total])
                if self.symmetry == "skew-symmetric":
                    np.negative(vals[k:total], out=vals[k:total])
                del off
            if unit:  # pattern: every value (mirrors too) 1
                vals[:total].fill(1)
            self._consumed += k
            yield first, rows[:total], cols[:total], vals[:total], k
        if raw is not None:
            self._check_end_raw(raw)
            self._fh.seek(0, io.SEEK_END)  # read to its end, as after the text path
        else:
            self._check_end()

    def _check_range(self, first: int, r: np.ndarray, c: np.ndarray, base: int = 1) -> None:
        """Refuse an entry index outside the size line, naming its line (``base``: 1 or 0-based)."""
        m, n = self.shape
        # four reductions, no temporaries; the masks only to name a bad entry
        if len(r) and (r.min() < base or r.max() >= m + base or c.min() < base or c.max() >= n + base):
            b = np.flatnonzero((r < base) | (r >= m + base) | (c < base) | (c >= n + base))[0]
            shown = [f"{x:g}" if isinstance(x, float) else str(x) for x in (r[b] + 1 - base, c[b] + 1 - base)]
            raise _bad(f"entry indices must lie in 1..{m} (rows) and 1..{n} (columns)",
                       f"({shown[0]}, {shown[1]}) at line {first + b}", "fix the entry or the size line")

    def _load_coordinate(self):
        cap = self.nnz * (1 if self.symmetry == "general" else 2)
        rows, cols, vals = np.empty(cap, np.int64), np.empty(cap, np.int64), np.empty(cap, self.dtype)
        pos = 0
        for _first, r, c, v, _k in self.entries():
            rows[pos:pos + len(r)], cols[pos:pos + len(r)], vals[pos:pos + len(r)] = r, c, v
            pos += len(r)
        rows, cols, vals = rows[:pos], cols[:pos], vals[:pos]
        perm = np.argsort(rows, kind="stable")
        return rows[perm], cols[perm], vals[perm]

    # -- reading ----------------------------------------------------------------------------------
    def read(self, rows: slice, cols: slice) -> np.ndarray:
        m, n = self.shape
        r0, r1, _ = rows.indices(m)
        c0, c1, _ = cols.indices(n)
        if self.resident_bytes and self._data is None:
            self.prepare()
        if self.mirrored:
            from blocklin.storage.zarr_store import read_block

            self.prepare()
            out = np.empty((r1 - r0, c1 - c0), self.dtype)
            read_block(self._scratch, slice(r0, r1), slice(c0, c1), out)
            return out
        if self.layout == "coordinate":
            rr, cc, vv = self._data
            lo, hi = np.searchsorted(rr, [r0, r1])
            rr, cc, vv = rr[lo:hi], cc[lo:hi], vv[lo:hi]
            keep = (cc >= c0) & (cc < c1)
            out = np.zeros((r1 - r0, c1 - c0), self.dtype)
            np.add.at(out, (rr[keep] - r0, cc[keep] - c0), vv[keep])
            return out
        # array general: forward full-height column panels
        if (r0, r1) != (0, m) or c0 != self._next_col:
            from blocklin.errors import StoreReadError

            raise StoreReadError(explain("mtx input", "array files are read forward in full-height column panels",
                                         f"columns {c0}:{c1} after column {self._next_col}",
                                         "convert to zarr first (blocklin convert FILE.mtx OUT.zarr)"))
        out = np.empty((m, c1 - c0), self.dtype, order="F")
        flat = out.reshape(-1, order="F")  # a view: the buffer is F-contiguous
        pos = 0
        for first, batch in self._lines(m * (c1 - c0)):
            flat[pos:pos + len(batch)] = self._parse(first, batch, 1, self.dtype)[:, 0]
            pos += len(batch)
        self._next_col = c1
        if c1 == n:
            self._check_end()
        return out

    _next_col = 0
    _consumed = 0
    _pending = ""

    def locate(self, row: int, col: int) -> str:
        if self.layout == "array" and self.symmetry == "general":
            return f"row {row + 1}, column {col + 1} (line {self._data_line + col * self.shape[0] + row})"
        return super().locate(row, col)

    def describe(self) -> dict[str, Any]:
        d = super().describe()
        d.update(layout=self.layout, field=self.field, symmetry=self.symmetry, nnz=self.nnz, codec="text")
        if self.resident_bytes:
            d["reader_memory"] = self.resident_bytes
        return d

    def close(self) -> None:
        self._fh.close()
        self._data = self._scratch = None
        if self._work is not None:
            from blocklin.storage.ownership import end_work_folder

            work, self._work = self._work, None
            end_work_folder(work)


class MtxWriter(TextFileWriter):
    """Dense Matrix Market ``array general`` output, column panel after column panel."""

    format = "mtx"
    order = "F"
    sequential = True
    overhead_bytes = FORMAT_BATCH * 128

    def __init__(self, path: str, shape: tuple[int, int], dtype: Any, *, inputs: list[str] = (),
                 overwrite: bool = False, token: str | None = None, **_: Any) -> None:
        dt = check_matrix_dtype(dtype, "dtype")
        if dt.kind == "c":
            raise DTypeError(explain("dtype", "Matrix Market output holds real or integer values",
                                     f"dtype {dt}", "convert to a real dtype (--dtype float64)"))
        super().__init__(path, shape, dt)
        self._fmt = formatter(dt)
        self._open_text(inputs, overwrite, token)
        field = "integer" if dt.kind in "iub" else "real"
        self._fh.write(f"%%MatrixMarket matrix array {field} general\n% written by blocklin\n"
                       f"{self.shape[0]} {self.shape[1]}\n")
        self._next_col = 0
        self.bytes_written = 0

    def write(self, rows: slice, cols: slice, block: np.ndarray) -> None:
        c0, c1, _ = cols.indices(self.shape[1])
        if c0 != self._next_col:  # pragma: no cover - the planner guarantees the order
            raise InternalError("MtxWriter needs forward column panels")
        r0 = rows.indices(self.shape[0])[0]
        check_mtx_integers(np.asarray(block), lambda ij: f"row {r0 + ij[0] + 1}, column {c0 + ij[1] + 1}")
        flat = np.asarray(block).reshape(-1, order="F")
        for s in range(0, flat.size, FORMAT_BATCH):
            text = "\n".join(self._fmt(flat[s:s + FORMAT_BATCH])) + "\n"
            self._fh.write(text)
            self.bytes_written += len(text)
        self._next_col = c1

