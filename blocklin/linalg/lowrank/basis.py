"""The Krylov bases of block Lanczos (``V`` and its image ``W = Op V``, ``n x cap`` each): kept in
memory, or spilled to a scratch file in the job's work folder where they do not fit the budget.

Both keep the columns in the same fixed row strips (:func:`strip_bounds`: a function of ``n``, the
column count and the itemsize only, never of the budget), each strip column-major, so that the first
``m`` columns of a strip are one contiguous range (one read). Every product with a basis runs strip by
strip in the strips' order with the same operands (``V_s^H z_s`` summed in strip order, ``V_s c``,
``V_s Y``), so a spilled basis gives the bits of the one in memory. The spilled one reads and writes
its strips with ``pread``/``pwrite`` into buffers reused from strip to strip: no mapping, whose pages
would count in the resident set; the file lives in the job's work folder (removed with the job, on
success, error and Ctrl-C).

The operations are those of the block Lanczos step (:func:`blocklin.linalg.lowrank.lanczos.block_lanczos`;
Golub and Underwood 1977, Wu and Simon 2000 for the thick restart): put columns (:meth:`Basis.append`),
``V^H z`` (:meth:`Basis.dot`), ``z - V c`` in place (:meth:`Basis.subtract`; with the result's ``V^H z`` and
Gram matrix in the same read, :meth:`Basis.subtract_dot`, or its Gram matrix alone, :meth:`Basis.subtract_gram`),
``z - V V^H z``
(:meth:`Basis.project_out`, what :func:`~blocklin.linalg.blocks.orth.next_block` asks of ``V``), ``V Y``
in memory (:meth:`Basis.times`) or in place (:meth:`Basis.restart`: a thick restart, the Ritz vectors),
and the Ritz pairs' residual norms ``||W Y - V Y diag(theta)||`` per column (:func:`ritz_residuals`).
"""

from __future__ import annotations

import abc
import os
from collections.abc import Callable
from typing import Any

import numpy as np

from blocklin.errors import InternalError

#: Bytes of one row strip of a basis (all its columns): the unit of its products and of a spilled
#: basis's reads and writes. A constant, so the strips (and so the bits) never depend on the budget.
STRIP_BYTES = 2 << 20
#: Strip buffers a spilled basis pair holds at once: a read and a write buffer for ``V`` and ``W``.
SPILL_BUFFERS = 4


def strip_bounds(n: int, cols: int, itemsize: int) -> list[tuple[int, int]]:
    """``(r0, r1)`` of the row strips of an ``n x cols`` basis of ``itemsize``-byte elements: about
    :data:`STRIP_BYTES` each (at least one row)."""
    rows = max(1, min(n, STRIP_BYTES // max(1, cols * itemsize)))
    return [(r0, min(n, r0 + rows)) for r0 in range(0, n, rows)] or [(0, 0)]


def strip_buffer_bytes(n: int, cols: int, itemsize: int) -> int:
    """Bytes of one strip buffer of an ``n x cols`` basis (the largest strip)."""
    r0, r1 = strip_bounds(n, cols, itemsize)[0]
    return (r1 - r0) * cols * itemsize


def spilled_bytes(n: int, cap: int, itemsize: int) -> int:
    """Bytes on disk of a spilled pair ``V``, ``W`` of ``n x cap`` bases."""
    return 2 * n * cap * itemsize


class Basis(abc.ABC):
    """``n x cap`` columns in row strips, the first :attr:`m` in use (see module notes). Subclasses say
    where a strip's columns live (:meth:`_read`, :meth:`_write`)."""

    spilled = False

    def __init__(self, n: int, cap: int, dtype: Any, strips: list[tuple[int, int]] | None = None) -> None:
        self.n, self.cap, self.dtype = int(n), int(cap), np.dtype(dtype)
        self.m = 0
        #: Threads that run the strips' products at once (:meth:`map_strips`; one for a spilled basis)
        self.threads = 1
        # another basis's strips where the two are multiplied strip by strip (a Rayleigh-Ritz step's Z and V)
        self.strips = list(strips) if strips is not None else strip_bounds(self.n, self.cap, self.dtype.itemsize)

    @property
    def shape(self) -> tuple[int, int]:
        """``(n, m)``: the columns in use."""
        return self.n, self.m

    def _offset(self, s: int, c0: int) -> int:
        """Element offset of column ``c0`` of strip ``s``: the strip's ``rows x cap`` column-major."""
        r0, r1 = self.strips[s]
        return r0 * self.cap + c0 * (r1 - r0)

    @abc.abstractmethod
    def _read(self, s: int, c0: int, c1: int) -> np.ndarray:
        """Columns ``c0:c1`` of strip ``s`` (a view valid until the next read)."""

    @abc.abstractmethod
    def _write(self, s: int, c0: int, block: np.ndarray) -> None:
        """Put ``block`` into strip ``s`` from column ``c0``."""

    def map_strips(self, fn: Callable[[int], Any]) -> list:
        """``[fn(s) for s in strips]``, the strips cut into :attr:`threads` consecutive ranges run at once
        (the calling thread takes the last; each BLAS call on one thread). Every caller sums the per-strip
        results in strip order afterwards, so the bits do not depend on the threads: one core's BLAS
        reached 12-13 GFLOP/s on a step's ``10^5 x 68`` basis times 4 columns, and two threads halved a
        projection's time. A spilled basis reads through one buffer: its strips run in turn."""
        count = len(self.strips)
        # two strips a thread at least: a hand-off costs about what a strip's product of a small basis does
        threads = 1 if self.spilled else max(1, min(self.threads, count // 2))
        if threads == 1:
            return [fn(s) for s in range(count)]
        from blocklin._blas import blas_threads
        from blocklin.runtime.pools import compute_pool

        out: list = [None] * count
        cuts = [count * i // threads for i in range(threads + 1)]

        def run(i: int) -> None:
            for s in range(cuts[i], cuts[i + 1]):
                out[s] = fn(s)

        with blas_threads(1):
            others = [compute_pool(threads - 1).submit(run, i) for i in range(threads - 1)]
            try:
                run(threads - 1)
            finally:
                for f in others:
                    f.result()
        return out

    # -- the step's operations, strip by strip ---------------------------------------------------
    def append(self, x: np.ndarray) -> None:
        """Put the columns of ``x`` (``n x b``) after the :attr:`m` in use."""
        b = x.shape[1]
        if self.m + b > self.cap:
            raise InternalError(f"basis of {self.cap} columns cannot take {b} more after {self.m}")
        for s, (r0, r1) in enumerate(self.strips):
            self._write(s, self.m, x[r0:r1])
        self.m += b

    def dot(self, z: np.ndarray, c0: int = 0) -> np.ndarray:
        """``V[:, c0:]^H z`` (``(m - c0) x c``): the strips' products summed in strip order."""
        acc = np.zeros((self.m - c0, z.shape[1]), dtype=np.result_type(self.dtype, z.dtype))
        if self.m == c0:
            return acc
        for part in self.map_strips(lambda s: self._read(s, c0, self.m).conj().T @ self._rows(z, s)):
            acc += part
        return acc

    def subtract(self, z: np.ndarray, c: np.ndarray) -> np.ndarray:
        """``z -= V c`` in place (``z`` must be the caller's own), strip by strip; returns ``z``."""
        if self.m == 0:
            return z

        def strip(s: int) -> None:
            self._rows(z, s)[...] -= self._read(s, 0, self.m) @ c

        self.map_strips(strip)
        return z

    def subtract_gram(self, z: np.ndarray, c: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``z -= V c`` in place (``z`` the caller's own, :meth:`subtract`'s bits) and the result's ``z^H z``,
        summed in strip order, in the same read."""
        g = np.zeros((z.shape[1], z.shape[1]), dtype=np.result_type(self.dtype, z.dtype))

        def strip(s: int) -> np.ndarray:
            zs = self._rows(z, s)
            if self.m:
                zs -= self._read(s, 0, self.m) @ c
            return zs.conj().T @ zs

        for gram in self.map_strips(strip):
            g += gram
        return z, g

    def subtract_dot(self, z: np.ndarray, c: np.ndarray, c0: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``z -= V[:, c0:] c`` in place (``z`` the caller's own), and of the result ``V^H z`` (every column)
        and ``z^H z``: one read of each strip for what :meth:`subtract` then :meth:`dot` read twice (a
        block Lanczos step's projections, :func:`~blocklin.linalg.blocks.orth.reorthogonalize`). With
        ``c0 = 0``, ``z`` has :meth:`subtract`'s bits; the sums run in strip order."""
        dt = np.result_type(self.dtype, z.dtype)
        acc = np.zeros((self.m, z.shape[1]), dtype=dt)
        g = np.zeros((z.shape[1], z.shape[1]), dtype=dt)

        def strip(s: int) -> tuple:
            zs = self._rows(z, s)
            if not self.m:
                return None, zs.conj().T @ zs
            v = self._read(s, 0, self.m)
            zs -= v[:, c0:] @ c
            return v.conj().T @ zs, zs.conj().T @ zs

        for part, gram in self.map_strips(strip):
            if part is not None:
                acc += part
            g += gram
        return z, acc, g

    def gram(self) -> np.ndarray:
        """``V^H V`` (``m x m``): the strips' Gram matrices summed in strip order."""
        acc = np.zeros((self.m, self.m), dtype=self.dtype)

        def strip(s: int) -> np.ndarray:
            v = self._read(s, 0, self.m)
            return v.conj().T @ v

        for part in self.map_strips(strip):
            acc += part
        return acc

    def columns(self, c0: int, c1: int) -> np.ndarray:
        """Columns ``c0:c1`` as one ``n x (c1 - c0)`` array in memory."""
        out = np.empty((self.n, c1 - c0), dtype=self.dtype)

        def strip(s: int) -> None:
            self._rows(out, s)[...] = self._read(s, c0, c1)

        self.map_strips(strip)
        return out

    def project_out(self, q: np.ndarray) -> np.ndarray:
        """``q -= V (V^H q)`` in place: one projection against the basis."""
        return self.subtract(q, self.dot(q))

    def times(self, y: np.ndarray) -> np.ndarray:
        """``V Y`` (``n x r``, in memory)."""
        out = np.empty((self.n, y.shape[1]), dtype=np.result_type(self.dtype, y.dtype))
        yt = np.ascontiguousarray(y.T)

        def strip(s: int) -> None:
            self._rows(out, s)[...] = strip_times(self._read(s, 0, self.m), yt)

        self.map_strips(strip)
        return out

    def restart(self, y: np.ndarray) -> None:
        """``V[:, :r] = V Y`` in place (``r = y.shape[1] <= m``): a thick restart, or the Ritz vectors.

        Each strip's product (:func:`strip_times`) comes out in the strips' column-major layout, so writing
        it back is one contiguous copy."""
        yt = np.ascontiguousarray(y.T)
        self.map_strips(lambda s: self._write(s, 0, strip_times(self._read(s, 0, self.m), yt)))
        self.m = y.shape[1]

    def strip(self, s: int, cols: int | None = None) -> np.ndarray:
        """Rows of strip ``s``, its first ``cols`` columns (default :attr:`m`): a view, valid until the
        next read of this basis."""
        return self._read(s, 0, self.m if cols is None else cols)

    def to_numpy(self, cols: int | None = None) -> np.ndarray:
        """The first ``cols`` columns (default :attr:`m`) as one ``n x cols`` array."""
        c = self.m if cols is None else cols
        out = np.empty((self.n, c), dtype=self.dtype)

        def strip(s: int) -> None:
            self._rows(out, s)[...] = self._read(s, 0, c)

        self.map_strips(strip)
        return out

    def close(self) -> None:
        """Release what the basis holds."""

    def _rows(self, a: np.ndarray, s: int) -> np.ndarray:
        """The rows of strip ``s`` of an ``n``-row array."""
        r0, r1 = self.strips[s]
        return a[r0:r1]


class MemoryBasis(Basis):
    """A basis held in memory: one array in the strips' layout."""

    def __init__(self, n: int, cap: int, dtype: Any, strips: list[tuple[int, int]] | None = None) -> None:
        super().__init__(n, cap, dtype, strips)
        self.data = np.empty(self.n * self.cap, dtype=self.dtype)

    def _view(self, s: int, c0: int, c1: int) -> np.ndarray:
        r0, r1 = self.strips[s]
        o = self._offset(s, c0)
        return self.data[o:o + (c1 - c0) * (r1 - r0)].reshape(c1 - c0, r1 - r0).T

    def _read(self, s: int, c0: int, c1: int) -> np.ndarray:
        return self._view(s, c0, c1)

    def _write(self, s: int, c0: int, block: np.ndarray) -> None:
        self._view(s, c0, c0 + block.shape[1])[...] = block

    def close(self) -> None:
        self.data = np.empty(0, dtype=self.dtype)


class SpilledBasis(Basis):
    """A basis in a scratch file (the strips' layout on disk), read and written strip by strip into two
    reused buffers with ``pread``/``pwrite``."""

    spilled = True

    def __init__(self, n: int, cap: int, dtype: Any, path: str, strips: list[tuple[int, int]] | None = None) -> None:
        super().__init__(n, cap, dtype, strips)
        self.path = str(path)
        self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        os.ftruncate(self.fd, self.n * self.cap * self.dtype.itemsize)
        size = max((r1 - r0) for r0, r1 in self.strips) * self.cap
        self._rbuf = np.empty(size, dtype=self.dtype)
        self._wbuf = np.empty(size, dtype=self.dtype)

    def _read(self, s: int, c0: int, c1: int) -> np.ndarray:
        r0, r1 = self.strips[s]
        count = (c1 - c0) * (r1 - r0)
        mv = memoryview(self._rbuf[:count]).cast("B")
        pos, off = 0, self._offset(s, c0) * self.dtype.itemsize
        while pos < len(mv):
            got = _pread_into(self.fd, mv[pos:], off + pos)
            if got <= 0:
                raise OSError(f"short read of the spilled Lanczos basis {self.path} at byte {off + pos}")
            pos += got
        return self._rbuf[:count].reshape(c1 - c0, r1 - r0).T

    def _write(self, s: int, c0: int, block: np.ndarray) -> None:
        r0, r1 = self.strips[s]
        count = block.shape[1] * (r1 - r0)
        self._wbuf[:count].reshape(block.shape[1], r1 - r0).T[...] = block
        mv = memoryview(self._wbuf[:count]).cast("B")
        pos, off = 0, self._offset(s, c0) * self.dtype.itemsize
        while pos < len(mv):
            pos += _pwrite(self.fd, mv[pos:], off + pos)

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
            try:
                os.remove(self.path)
            except FileNotFoundError:
                pass
        self._rbuf = self._wbuf = np.empty(0, dtype=self.dtype)


def _pread_into(fd: int, mv: memoryview, offset: int) -> int:
    """Read into ``mv`` at ``offset`` without a copy (``preadv``; seek and ``readv`` where it is missing)."""
    if hasattr(os, "preadv"):
        return os.preadv(fd, [mv], offset)
    os.lseek(fd, offset, os.SEEK_SET)  # one thread owns a basis: the seek is not shared
    return os.readv(fd, [mv])


def _pwrite(fd: int, mv: memoryview, offset: int) -> int:
    if hasattr(os, "pwrite"):
        return os.pwrite(fd, mv, offset)
    os.lseek(fd, offset, os.SEEK_SET)
    return os.write(fd, mv)


def memory_bases(n: int, cap: int, dtype: Any) -> tuple[Basis, Basis]:
    """``V`` and ``W`` held in memory (what every route takes unless its caller spills them)."""
    return MemoryBasis(n, cap, dtype), MemoryBasis(n, cap, dtype)


def spilled_bases(job: Any, n: int, cap: int, dtype: Any, names: tuple[str, ...] = ("V", "W"),
                  strips: list[tuple[int, int]] | None = None) -> tuple[Basis, ...]:
    """Bases (``V`` and ``W`` by default) spilled to files ``lanczos-NAME.bin`` in ``job``'s work folder
    (closed with the job, the folder removed after it on success, error and Ctrl-C)."""
    from blocklin.storage.space import check_space

    folder = job.temp_dir()
    itemsize = np.dtype(dtype).itemsize
    check_space(folder / f"lanczos-{names[0]}.bin", len(names) * n * cap * itemsize, "spilled Lanczos basis",
                f"{len(names)} x {n} x {cap} {np.dtype(dtype).name}")
    made = []
    for name in names:
        b = SpilledBasis(n, cap, dtype, os.path.join(folder.path, f"lanczos-{name}.bin"), strips)
        job.stack.callback(b.close)
        made.append(b)
    return tuple(made)


def strip_times(v: np.ndarray, yt: np.ndarray) -> np.ndarray:
    """``V_s Y`` of a strip ``v`` (a column-major view) and ``yt = Y^T`` (row-major), formed as
    ``(Y^T V_s^T)^T``: column-major, the strips' layout, so that a thick restart writes it back with one
    contiguous copy (``V_s Y`` came out row-major, and its transposing copy took as long as the product).
    Every product of a strip with ``Y`` takes this form (:meth:`Basis.restart`, :meth:`Basis.times`,
    :func:`ritz_residuals`), so the Ritz vectors of a spilled run (a restart) have the bits of those formed
    in memory."""
    return (yt @ v.T).T


def ritz_residuals(V: Basis, W: Basis, y: np.ndarray, theta: np.ndarray,
                   keep: bool = False) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None]:
    """``(||W y_i - theta_i V y_i||` per column, V Y, W Y - V Y diag(theta))``: the norms summed strip by
    strip in strip order, the two blocks formed in memory only where ``keep`` (else ``None``)."""
    r = y.shape[1]
    sq = np.zeros(r, dtype=np.float64)
    dt = np.result_type(V.dtype, y.dtype)
    ritz = np.empty((V.n, r), dtype=dt) if keep else None
    res = np.empty((V.n, r), dtype=dt) if keep else None
    yt = np.ascontiguousarray(y.T)

    def strip(s: int) -> np.ndarray:
        vy = strip_times(V.strip(s), yt)
        wy = strip_times(W.strip(s), yt)
        wy -= vy * theta
        if keep:
            r0, r1 = V.strips[s]
            ritz[r0:r1], res[r0:r1] = vy, wy
        return np.sum((wy * wy.conj()).real if wy.dtype.kind == "c" else wy * wy, axis=0)

    # a spilled W reads through its own buffer while V's strip is held: both spilled or both in memory
    for part in (V if V.spilled == W.spilled else _InTurn(V)).map_strips(strip):
        sq += part
    return np.sqrt(sq), ritz, res


def residual_columns(V: Basis, W: Basis, theta: np.ndarray) -> None:
    """``W[:, :k] -= V[:, :k] diag(theta)`` in place, strip by strip (after :meth:`Basis.restart` of both to
    the Ritz vectors: ``W`` then holds their residual vectors)."""
    k = len(theta)

    def strip(s: int) -> None:
        v = V.strip(s, k)
        W._write(s, 0, W.strip(s, k) - v * theta)

    (V if V.spilled == W.spilled else _InTurn(V)).map_strips(strip)


class _InTurn:
    """A basis's strips run in turn (where two bases, one spilled, are read together)."""

    def __init__(self, basis: Basis) -> None:
        self.strips = basis.strips

    def map_strips(self, fn: Callable[[int], Any]) -> list:
        return [fn(s) for s in range(len(self.strips))]


class Columns:
    """The first ``k`` columns of a (spilled) basis, read strip by strip: the Ritz vectors (or their
    residual vectors) a spilled run returns without holding them in memory. Valid while the job that
    owns the basis runs."""

    def __init__(self, basis: Basis, k: int) -> None:
        self.basis, self.k = basis, int(k)

    @property
    def shape(self) -> tuple[int, int]:
        return self.basis.n, self.k

    @property
    def dtype(self) -> np.dtype:
        return self.basis.dtype

    def strips(self) -> Any:
        """``(r0, r1, block)`` per row strip, ``block`` a view valid until the next strip."""
        for s, (r0, r1) in enumerate(self.basis.strips):
            yield r0, r1, self.basis.strip(s, self.k)

    def to_numpy(self) -> np.ndarray:
        return self.basis.to_numpy(self.k)

    def rows_per_strip(self) -> int:
        r0, r1 = self.basis.strips[0]
        return max(1, r1 - r0)


__all__ = ["Basis", "Columns", "MemoryBasis", "SPILL_BUFFERS", "STRIP_BYTES", "SpilledBasis", "memory_bases",
           "residual_columns", "ritz_residuals", "spilled_bases", "spilled_bytes", "strip_bounds",
           "strip_buffer_bytes", "strip_times"]
