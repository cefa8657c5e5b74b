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

from blocklin.errors import BlocklinError, FormatError, StoreReadError, explain
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


#: Exceptions (by class name: botocore, aiohttp and urllib3 are optional) that mean the storage
#: endpoint could not be reached or dropped the connection, not that the data is damaged.
_CONNECTION_ERRORS = ("EndpointConnectionError", "ConnectTimeoutError", "ConnectionClosedError", "ReadTimeoutError",
                      "ClientConnectorError", "ClientConnectionError", "ServerDisconnectedError",
                      "NewConnectionError", "MaxRetryError", "ProxyConnectionError")


def _chain(exc: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        exc = exc.__cause__ or exc.__context__


def _endpoint(exc: BaseException) -> str:
    """The endpoint a connection failure was for: from the error (botocore names the URL), else the
    configured ``endpoint_url``, else ``"the storage endpoint"``."""
    from urllib.parse import urlsplit

    for e in _chain(exc):
        url = (getattr(e, "kwargs", None) or {}).get("endpoint_url")
        if url:
            parts = urlsplit(str(url))
            return f"{parts.scheme}://{parts.netloc}" if parts.netloc else str(url)
    try:
        from blocklin.config import get_config

        opts = get_config().storage_options or {}
        url = opts.get("endpoint_url") or (opts.get("client_kwargs") or {}).get("endpoint_url")
    except Exception:  # noqa: BLE001 - a broken configuration is reported elsewhere
        url = None
    return str(url) if url else "the storage endpoint"


def _is_connection_error(exc: BaseException) -> bool:
    for e in _chain(exc):
        if isinstance(e, BrokenPipeError):  # stdout's reader went away: not storage
            return False
        if isinstance(e, ConnectionError) or any(c.__name__ in _CONNECTION_ERRORS for c in type(e).__mro__):
            return True
    return False


#: Exceptions of the storage clients (botocore, google-auth) for credentials that are missing or incomplete;
#: none is an ``OSError``, so the CLI had printed their traceback.
_CREDENTIAL_ERRORS = ("NoCredentialsError", "PartialCredentialsError", "CredentialRetrievalError",
                      "DefaultCredentialsError")


def _is_missing_credentials(exc: BaseException) -> bool:
    return any(c.__name__ in _CREDENTIAL_ERRORS for e in _chain(exc) for c in type(e).__mro__)


def _is_missing_bucket(exc: BaseException) -> bool:
    for e in _chain(exc):
        code = str(((getattr(e, "response", None) or {}).get("Error") or {}).get("Code", ""))
        if code == "NoSuchBucket" or type(e).__name__ == "NoSuchBucket" or "specified bucket does not exist" in str(e):
            return True
    return False


def storage_error(exc: BaseException, urls: tuple[str, ...] = (),
                  used: tuple[str, ...] = ()) -> BlocklinError | None:
    """The blocklin error for a storage failure that is not about the data, or None.

    An endpoint that cannot be reached (no server listening, a server stopped mid-job, a dropped
    connection) becomes :class:`~blocklin.errors.StorageUnreachableError` naming the endpoint and
    saying that what is stored is kept and how to continue; a bucket that does not exist becomes
    :class:`~blocklin.errors.StoreNotFoundError` naming the bucket of ``urls`` (the object-store
    URLs of the operation, when the caller knows them); missing credentials become
    :class:`~blocklin.errors.StorageCredentialsError` naming ``used`` (every object-store URL the
    operation opens) and how to pass credentials. Reads and writes both come through here:
    :func:`reading` for chunk reads, the CLI's top-level handler for everything else.
    """
    from blocklin.errors import StorageCredentialsError, StorageUnreachableError, StoreNotFoundError

    if isinstance(exc, BlocklinError):
        return None
    if _is_connection_error(exc):
        where = _endpoint(exc)
        cause = next((e for e in _chain(exc) if e is not exc), exc)
        detail = f"{type(cause).__name__}: {str(cause).strip()[:160]}"
        return StorageUnreachableError(explain(
            "storage", "the storage endpoint must be reachable for the whole job", f"no connection to {where} "
            f"({detail})", f"check that the server at {where} is running and reachable (endpoint_url in "
            "--storage-option / storage_options=); nothing stored there was removed: inputs are unchanged, and "
            "a resumable operation's finished work is kept, so rerun the same command with --resume "
            "(resume=True) once it is back"))
    if _is_missing_credentials(exc):
        named = ", ".join(sorted(set(used) | set(urls))) or "the object store"
        cause = next(e for e in _chain(exc) if any(c.__name__ in _CREDENTIAL_ERRORS for c in type(e).__mro__))
        return StorageCredentialsError(explain(
            "storage_options", "an object store must be given credentials",
            f"none found for {named} ({type(cause).__name__}: {str(cause).strip()[:120]})",
            "set them in the environment (AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or AWS_PROFILE) or pass "
            "--storage-option key=... --storage-option secret=... (storage_options=); a public bucket: "
            "--storage-option anon=true"))
    if _is_missing_bucket(exc):
        named = " or ".join(sorted({"{}://{}".format(*u.split("://", 1)[:1], u.split("://", 1)[1].split("/", 1)[0])
                                   for u in urls if "://" in u})) or "the operation's bucket"
        return StoreNotFoundError(explain("bucket", "an object-store URL must name an existing bucket",
                                          f"{named} does not exist ({str(exc).strip()[:120]})",
                                          "create the bucket first (aws s3 mb s3://BUCKET, or s3fs's "
                                          "fs.mkdir('BUCKET')) or correct the URL"))
    return None


@contextlib.contextmanager
def reading(arr: Any, rows: slice, cols: slice, name: str = "input") -> Iterator[None]:
    """Run a read of ``arr[rows, cols]``; codec, checksum and decoding failures become
    :class:`StoreReadError` naming the array, the chunk and the fix. blocklin's own errors pass."""
    try:
        yield
    except FormatError as exc:  # a chunk blocklin decodes itself whose bytes are not what its metadata says
        raise read_error(arr, rows, cols, exc, name) from exc
    except (BlocklinError, MemoryError, KeyboardInterrupt):
        raise
    except Exception as exc:  # noqa: BLE001 - zarr and numcodecs raise many kinds for one damage
        unreachable = storage_error(exc, used=(_where(arr),))  # the server, not the data: no chunk probing, no "damaged"
        raise (unreachable or read_error(arr, rows, cols, exc, name)) from exc


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


__all__ = ["MAX_PROBED_CHUNKS", "check_metadata", "failing_chunk", "read_error", "reading", "storage_error"]
