"""One place that turns failures of reading stored chunks into :class:`~blocklin.errors.StoreReadError`.

A chunk that does not decode (a corrupt zstd/blosc/gzip frame), fails its crc32c checksum, or has a
size or shape its metadata does not promise raises, deep inside zarr's codec pipeline, a
``RuntimeError``, a ``ValueError`` or an ``OSError`` whose text names neither the array nor the
chunk. Every reader of stored blocks (:func:`blocklin.storage.zarr_store.read_block`, which the tile
tasks, the row passes, the block operations and the format readers call, and
:class:`blocklin.Matrix`) wraps its read in :func:`reading`; on failure the first failing chunk of
the region is located (only then: a read that succeeds costs nothing) and named in the message with
its file and a fix. :func:`check_metadata` refuses, when an array is opened, metadata that would
otherwise fail later with ``ZeroDivisionError`` (a zero chunk dimension) or a raw zarr message.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from blocklin.errors import BlocklinError, StoreReadError, explain
from blocklin.storage.location import store_location

#: Chunks probed one by one to find the failing one (a failed read of more names the region only).
MAX_PROBED_CHUNKS = 256

_CODEC_WORDS = ("zstd", "blosc", "gzip", "zlib", "lz4", "decompress", "codec", "frame")


def _where(arr: Any) -> str:
    """The array's location as a user would type it (path or URL), else its zarr repr."""
    try:
        loc = store_location(arr.store)
        sub = getattr(arr, "path", "") or ""
        loc = loc.child(sub) if loc is not None and sub else loc
    except Exception:  # noqa: BLE001 - a store with no location is still named by zarr
        loc = None
    return loc.url if loc is not None else repr(getattr(arr, "store", arr))


def _chunk_key(arr: Any, index: tuple[int, ...]) -> str:
    try:
        return str(arr.metadata.encode_chunk_key(index))
    except Exception:  # noqa: BLE001 - exotic metadata: the grid index still names the chunk
        return "chunk " + ",".join(str(i) for i in index)


def _rule(exc: BaseException) -> str:
    text = f"{type(exc).__name__} {exc}".lower()
    if "checksum" in text or "crc32" in text:
        return "every chunk must pass its crc32c checksum"
    if any(word in text for word in _CODEC_WORDS):
        return "every chunk must decode with the array's codecs"
    return "every chunk must decode to the array's dtype and chunk shape"


def _chunk_ranges(arr: Any, rows: slice, cols: slice) -> Iterator[tuple[int, int]]:
    ch_r, ch_c = (int(c) for c in arr.chunks)
    r0, r1, _ = rows.indices(arr.shape[0])
    c0, c1, _ = cols.indices(arr.shape[1])
    for ci in range(r0 // ch_r, -(-r1 // ch_r)):
        for cj in range(c0 // ch_c, -(-c1 // ch_c)):
            yield ci, cj


def failing_chunk(arr: Any, rows: slice, cols: slice) -> tuple[tuple[int, int], BaseException] | None:
    """The first chunk of ``arr[rows, cols]`` whose read fails, with its error (None when none does
    among the first :data:`MAX_PROBED_CHUNKS`)."""
    try:
        ch_r, ch_c = (int(c) for c in arr.chunks)
        for n, (ci, cj) in enumerate(_chunk_ranges(arr, rows, cols)):
            if n >= MAX_PROBED_CHUNKS:
                return None
            try:
                arr[ci * ch_r:(ci + 1) * ch_r, cj * ch_c:(cj + 1) * ch_c]
            except Exception as exc:  # noqa: BLE001 - any failure is what is looked for
                return (ci, cj), exc
    except Exception:  # noqa: BLE001 - a region that cannot be probed is still reported
        return None
    return None


def read_error(arr: Any, rows: slice, cols: slice, exc: BaseException, name: str = "input") -> StoreReadError:
    """The :class:`StoreReadError` for a failed read of ``arr[rows, cols]`` (naming the chunk)."""
    where = _where(arr)
    found = failing_chunk(arr, rows, cols) if len(getattr(arr, "shape", ())) == 2 else None
    cause = found[1] if found is not None else exc
    detail = f"{type(cause).__name__}: {str(cause).strip()[:160]}"
    if found is not None:
        key = _chunk_key(arr, found[0])
        what = f"chunk {key} of {where} failed ({detail})"
        fix = (f"the store is damaged: re-create it from its source, or restore {where}/{key} from a copy "
               "(write stores with --checksum so that damage is caught as soon as it is read)")
    else:
        r0, r1, _ = rows.indices(arr.shape[0]) if getattr(arr, "ndim", 0) else (0, 0, 1)
        what = f"a chunk in rows {r0}:{r1} of {where} failed ({detail})"
        fix = "the store is damaged: re-create it from its source, or restore it from a copy"
    return StoreReadError(explain(name, _rule(cause), what, fix))


@contextlib.contextmanager
def reading(arr: Any, rows: slice, cols: slice, name: str = "input") -> Iterator[None]:
    """Run a read of ``arr[rows, cols]``; codec, checksum and decoding failures become
    :class:`StoreReadError` naming the array, the chunk and the fix. blocklin's own errors pass."""
    try:
        yield
    except (BlocklinError, MemoryError, KeyboardInterrupt):
        raise
    except Exception as exc:  # noqa: BLE001 - zarr and numcodecs raise many kinds for one damage
        raise read_error(arr, rows, cols, exc, name) from exc


def check_metadata(arr: Any, where: str, name: str = "input") -> None:
    """Refuse metadata a reader cannot use: chunk dimensions that are not positive integers, or a
    negative extent (zarr itself accepts a zero chunk dimension and fails at the first read)."""
    try:
        chunks = tuple(int(c) for c in arr.chunks)
        shape = tuple(int(s) for s in arr.shape)
    except Exception as exc:  # noqa: BLE001 - e.g. an irregular chunk grid
        raise StoreReadError(explain(name, "must have a regular chunk grid", f"{where!r} ({exc})",
                                     "rechunk it: blocklin convert IN OUT.zarr --chunks auto")) from exc
    if any(c < 1 for c in chunks) or any(s < 0 for s in shape):
        raise StoreReadError(explain(name, "metadata must give positive chunk dimensions and non-negative extents",
                                     f"shape {shape}, chunks {chunks} in {where!r}",
                                     "the metadata (zarr.json or .zarray) is damaged: re-create the store from "
                                     "its source"))


__all__ = ["MAX_PROBED_CHUNKS", "check_metadata", "failing_chunk", "read_error", "reading"]
