"""Backends: byte-level operations under a :class:`~blocklin.storage.location.Location`.

Two implementations behind one interface: :class:`LocalBackend` (POSIX calls; whole-object writes
go to a temporary name and are renamed into place) and :class:`FsspecBackend` (any fsspec
filesystem: S3, GCS, Azure, memory, ``file://``), where each object write is atomic by the store's
own semantics and nothing is ever renamed. :func:`zarr_store` opens the matching zarr store:
``LocalStore`` for local paths (which the raw-chunk fast path recognises) and ``FsspecStore`` for
URLs. The same test suite (``tests/storage/test_storage_backends.py``) runs against both.
"""

from __future__ import annotations

import abc
import contextlib

import functools
import os
import shutil
import uuid
from typing import Any

from blocklin.storage.location import Location
from blocklin.storage.records import OWNER_RECORD
from blocklin.storage.space import raise_naming


def rmtree_owner_last(path: str) -> None:
    """Remove a local folder, its owner record (:mod:`blocklin.storage.ownership`) last: a removal that
    is killed leaves a folder that still says whose it was, which ``blocklin clean`` removes once that
    run is gone (in any order, a killed removal had left 12 MiB without its record, which ``clean``
    never removes; found by a randomized search). Errors are ignored, as ``shutil.rmtree``'s."""
    record = os.path.join(path, OWNER_RECORD)
    if not os.path.lexists(record):
        shutil.rmtree(path, ignore_errors=True)
        return
    try:
        entries = list(os.scandir(path))
    except OSError:
        entries = []
    for entry in entries:
        if entry.name == OWNER_RECORD:
            continue
        if entry.is_dir(follow_symlinks=False):
            shutil.rmtree(entry.path, ignore_errors=True)
        else:
            try:
                os.unlink(entry.path)
            except OSError:
                pass
    shutil.rmtree(path, ignore_errors=True)


class Backend(abc.ABC):
    """Operations on the keys (``"zarr.json"``, ``"c/0/1"``, ``""`` for the root itself) under a location."""

    def __init__(self, loc: Location) -> None:
        self.loc = loc

    @abc.abstractmethod
    def exists(self, key: str = "") -> bool:
        """Whether ``key`` (an object, or a prefix holding objects) exists."""

    @abc.abstractmethod
    def read_bytes(self, key: str) -> bytes:
        """The whole object at ``key``."""

    @abc.abstractmethod
    def write_bytes(self, key: str, data: bytes) -> None:
        """Write the whole object at ``key``; readers never see half of it."""

    @abc.abstractmethod
    def remove(self, key: str = "") -> None:
        """Remove a key or a whole prefix (recursively); missing keys are fine."""

    @abc.abstractmethod
    def delete(self, key: str) -> None:
        """Delete one object (one request on object stores); a missing one is fine."""

    def delete_many(self, keys: list[str]) -> None:
        """Delete objects (batched where the store allows)."""
        for k in keys:
            self.delete(k)

    @abc.abstractmethod
    def keys(self, key: str = "") -> list[str]:
        """Every object (file) under ``key``, as keys relative to the root, sorted."""

    @abc.abstractmethod
    def size(self, key: str = "") -> int:
        """Bytes of one object, or of every object under a prefix."""

    @abc.abstractmethod
    def stamp(self, key: str) -> Any:
        """A value that changes whenever the object is rewritten (``None`` when missing)."""

    def metadata_stamp(self) -> Any:
        """The stamp of the array's zarr metadata (v3 ``zarr.json``, else v2 ``.zarray``): what a commit
        or an overwrite changes (``None`` when the store has none)."""
        return self.stamp("zarr.json") or self.stamp(".zarray")

    @abc.abstractmethod
    def file_stamps(self) -> dict[str, tuple]:
        """Every object (file) under the location, or the location itself when it is one object, as
        ``{key: stamp}`` from one listing: what a rewrite of the object changes (see
        :mod:`blocklin.storage.stamps`, the one place that turns these into an input's content stamp)."""

    def read_text(self, key: str) -> str:
        return self.read_bytes(key).decode()

    def try_read(self, key: str) -> bytes | None:
        """The object's bytes, or None when it is missing (one request on object stores)."""
        try:
            return self.read_bytes(key)
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
            return None

    def write_text(self, key: str, text: str) -> None:
        self.write_bytes(key, text.encode())


class LocalBackend(Backend):
    """A local folder."""

    def _p(self, key: str) -> str:
        return os.path.join(self.loc.url, key) if key else self.loc.url

    def exists(self, key: str = "") -> bool:
        return os.path.exists(self._p(key))

    def read_bytes(self, key: str) -> bytes:
        with open(self._p(key), "rb") as f:
            return f.read()

    def write_bytes(self, key: str, data: bytes) -> None:
        p = self._p(key)
        os.makedirs(os.path.dirname(p), exist_ok=True)
        tmp = f"{p}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        try:
            with open(tmp, "wb") as f:
                f.write(data)
        except OSError as exc:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise_naming(exc, p)  # a full disk's write() names no file
        os.replace(tmp, p)  # readers never see half an object

    def remove(self, key: str = "") -> None:
        p = self._p(key)
        if os.path.isdir(p) and not os.path.islink(p):
            rmtree_owner_last(p)
        else:
            try:
                os.unlink(p)
            except (FileNotFoundError, NotADirectoryError):  # not there (a file in its parent's place)
                pass

    def delete(self, key: str) -> None:
        try:
            os.unlink(self._p(key))
        except FileNotFoundError:
            pass

    def keys(self, key: str = "") -> list[str]:
        base = self._p(key)
        if os.path.isfile(base):
            return [key]
        out = []
        for root, _dirs, files in os.walk(base):
            for f in files:
                out.append(os.path.relpath(os.path.join(root, f), self.loc.url).replace(os.sep, "/"))
        return sorted(out)

    def size(self, key: str = "") -> int:
        total = 0
        for k in self.keys(key):
            try:
                total += os.stat(self._p(k)).st_size
            except OSError:
                pass
        return total

    def stamp(self, key: str) -> Any:
        try:
            st = os.stat(self._p(key))
        except OSError:
            return None
        return (st.st_mtime_ns, st.st_size, st.st_ino)

    def file_stamps(self) -> dict[str, tuple]:
        """Size, modification and change times (ns) and inode of each file: an in-place rewrite
        changes the times, a rewrite by rename the inode. One ``scandir`` walk, symlinks followed
        (each folder once)."""
        try:
            st = os.stat(self.loc.url)
        except OSError:
            return {}
        if not os.path.isdir(self.loc.url):
            return {"": _stat_tuple(st)}
        out: dict[str, tuple] = {}
        seen = {(st.st_dev, st.st_ino)}
        todo = [("", self.loc.url)]
        while todo:
            rel, folder = todo.pop()
            try:
                entries = list(os.scandir(folder))
            except OSError:
                continue
            for e in entries:
                key = f"{rel}{e.name}"
                try:
                    est = e.stat()
                except OSError:  # removed meanwhile, or a dangling link
                    continue
                if e.is_dir():
                    if (est.st_dev, est.st_ino) not in seen:
                        seen.add((est.st_dev, est.st_ino))
                        todo.append((key + "/", e.path))
                else:
                    out[key] = _stat_tuple(est)
        return out


def _stat_tuple(st: os.stat_result) -> tuple:
    return (st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino)


class FsspecBackend(Backend):
    """Any fsspec filesystem; no renames (object stores have none)."""

    def __init__(self, loc: Location) -> None:
        super().__init__(loc)
        self.fs, self.root = _filesystem(loc.url, loc.options)

    def _p(self, key: str) -> str:
        return f"{self.root.rstrip('/')}/{key}" if key else self.root

    def exists(self, key: str = "") -> bool:
        # Listing caches of this instance do not see writes made through zarr's own (async) instance.
        self.fs.invalidate_cache()
        try:
            return bool(self.fs.exists(self._p(key)))
        except FileNotFoundError:
            return False

    def read_bytes(self, key: str) -> bytes:
        return self.fs.cat_file(self._p(key))

    def write_bytes(self, key: str, data: bytes) -> None:
        p = self._p(key)
        if self.fs.protocol in ("file", "local") or "file" in (self.fs.protocol or ()):
            self.fs.makedirs(p.rsplit("/", 1)[0], exist_ok=True)
        self.fs.pipe_file(p, data)

    def remove(self, key: str = "") -> None:
        p = self._p(key)
        try:
            self.fs.rm(p, recursive=True)
        except FileNotFoundError:
            pass
        self.fs.invalidate_cache()

    def delete(self, key: str) -> None:
        try:
            self.fs.rm_file(self._p(key))
        except FileNotFoundError:
            pass
        self.fs.invalidate_cache()

    def delete_many(self, keys: list[str]) -> None:
        if keys:
            try:
                self.fs.rm([self._p(k) for k in keys])  # one batched request per 1000 keys on S3
            except FileNotFoundError:
                pass
            self.fs.invalidate_cache()

    def keys(self, key: str = "") -> list[str]:
        base = self._p(key)
        self.fs.invalidate_cache()
        try:
            found = self.fs.find(base)
        except FileNotFoundError:
            return []
        root = self.fs._strip_protocol(self.root).rstrip("/")
        out = []
        for f in found:
            f = self.fs._strip_protocol(f)
            out.append(f[len(root) + 1:] if f.startswith(root + "/") else f)
        return sorted(out)

    def size(self, key: str = "") -> int:
        self.fs.invalidate_cache()
        try:
            return int(self.fs.du(self._p(key), total=True))
        except FileNotFoundError:
            return 0

    def stamp(self, key: str) -> Any:
        self.fs.invalidate_cache()
        try:
            info = self.fs.info(self._p(key))
        except (FileNotFoundError, OSError):
            return None
        return tuple(str(info.get(k)) for k in ("ETag", "LastModified", "mtime", "created", "size"))

    def file_stamps(self) -> dict[str, tuple]:
        """Size and version of each object from one listing: the ETag (S3, Azure), the generation
        (GCS), else the modification or creation time the store reports (``file://``, ``memory://``)."""
        self.fs.invalidate_cache()
        try:
            found = self.fs.find(self.root, detail=True)
        except (FileNotFoundError, OSError):
            return {}
        root = self.fs._strip_protocol(self.root).rstrip("/")
        out: dict[str, tuple] = {}
        for name, info in found.items():
            name = self.fs._strip_protocol(name)
            key = name[len(root) + 1:] if name.startswith(root + "/") else ("" if name == root else name)
            out[key] = (info.get("size"),) + tuple(str(info[k]) for k in _VERSION_FIELDS if info.get(k) is not None)
        return out


#: Fields of an fsspec listing that change when an object is rewritten (whichever the store reports).
_VERSION_FIELDS = ("ETag", "etag", "generation", "version_id", "mtime", "LastModified", "last_modified", "created",
                   "ino")


@functools.lru_cache(maxsize=64)
def _filesystem(url: str, options: str) -> tuple[Any, str]:
    from fsspec.core import url_to_fs

    return url_to_fs(url, **_fs_options(url, options))


def _fs_options(url: str, options: str) -> dict:
    import json

    opts = json.loads(options) if options else {}
    if url.startswith("file://"):  # object-store semantics: writing a key creates its folders
        opts = {"auto_mkdir": True, **opts}
    if url.startswith(("s3://", "s3a://")) and _s3_has_max_concurrency():
        # s3fs asks for an object's size (a HEAD) before every whole-object GET when it may split
        # the GET; chunks are far below its split size, so that is one wasted request per chunk.
        opts = {"max_concurrency": 1, **opts}
    return opts


@functools.lru_cache(maxsize=1)
def _s3_has_max_concurrency() -> bool:
    import inspect

    try:
        import s3fs
    except ImportError:
        return False
    return "max_concurrency" in inspect.signature(s3fs.S3FileSystem.__init__).parameters


def backend(loc: Location) -> Backend:
    """The backend of ``loc``: local paths get :class:`LocalBackend`, URLs :class:`FsspecBackend`."""
    return LocalBackend(loc) if loc.is_local else FsspecBackend(loc)


def zarr_store(loc: Location, *, read_only: bool = False) -> Any:
    """A zarr store rooted at ``loc`` (``LocalStore`` for local paths, ``FsspecStore`` for URLs)."""
    import zarr.storage

    if loc.is_local:
        return zarr.storage.LocalStore(loc.url, read_only=read_only)
    return zarr.storage.FsspecStore.from_url(loc.url, storage_options=_fs_options(loc.url, loc.options) or None,
                                             read_only=read_only)


def remove(loc: Location) -> None:
    """Remove everything at ``loc`` (a store or a temp folder), wherever it lives; missing is fine."""
    backend(loc).remove("")


__all__ = ["Backend", "FsspecBackend", "LocalBackend", "backend", "remove", "zarr_store"]
