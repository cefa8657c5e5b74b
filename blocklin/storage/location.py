"""Naming storage: one small value type for every input, output and temp location.

A :class:`Location` is a local path or an fsspec URL (``s3://``, ``gs://``, ``abfs://``,
``memory://``, ``file://``, ...) plus the storage options that reach it (credentials, endpoint).
It is frozen, hashable and picklable, so it travels inside plans and task specs: a task on a
cluster worker opens exactly what the client named, with the client's options, and never reads
storage options from its own process. :func:`as_location` turns whatever a user passed (a path, a
URL, a ``zarr`` store object, a ``zarr.Array``, a :class:`Location`) into one.

Storage options come, later ones winning, from the ``BLOCKLIN_STORAGE_OPTIONS`` environment variable
(JSON), :func:`blocklin.config.set(storage_options=...) <blocklin.config.set>`, the CLI's
``--storage-option KEY=VALUE`` and the ``storage_options=`` keyword of a call.
"""

from __future__ import annotations

import dataclasses
import json
import os
import posixpath
import re
from typing import Any

from blocklin.errors import ArgumentTypeError, ConfigError, StorageBackendError, explain

#: fsspec protocols whose implementation lives in a separate package, with that package.
BACKEND_PACKAGES = {
    "s3": "s3fs", "s3a": "s3fs", "gs": "gcsfs", "gcs": "gcsfs", "abfs": "adlfs", "az": "adlfs",
    "abfss": "adlfs", "adl": "adlfs", "http": "aiohttp", "https": "aiohttp",
}
#: Storage-option names that hold credentials (left out of task keys and resume tokens).
_CREDENTIALS = frozenset({"key", "secret", "token", "session_token", "password", "account_key", "sas_token",
                          "client_secret", "credentials", "aws_access_key_id", "aws_secret_access_key",
                          "aws_session_token", "connection_string"})
_SCHEME_RE = re.compile(r"^([a-zA-Z][a-zA-Z0-9+.\-]*)://")


def _canonical_options(options: Any) -> str:
    """Storage options as canonical JSON (hashable, deterministic in task keys, picklable)."""
    if not options:
        return ""
    if not isinstance(options, dict):
        raise ConfigError(explain("storage_options", "must be a dict of fsspec options", type(options).__name__,
                                  "pass storage_options={'key': ..., 'secret': ...}"))
    try:
        return json.dumps(options, sort_keys=True, separators=(",", ":"))
    except (TypeError, ValueError) as exc:
        raise ConfigError(explain("storage_options", "must hold plain values (strings, numbers, booleans, "
                                  "lists, dicts) so that tasks can carry them to workers", f"{exc}",
                                  "pass credentials and endpoints as strings")) from None


@dataclasses.dataclass(frozen=True)
class Location:
    """Where a store lives: a local path or an fsspec URL, with its storage options.

    Parameters
    ----------
    url : str
        Absolute local path (no scheme) or ``scheme://...``; normalized without a trailing slash.
    options : str
        Storage options as canonical JSON (see :attr:`storage_options`); build locations with
        :func:`as_location` rather than by hand.
    pending : bool
        Inside an output that is not committed yet (object-store commit protocol,
        :mod:`blocklin.storage.atomic`): zarr metadata is written to the pending record instead of
        ``zarr.json`` until the commit.
    """

    url: str
    options: str = ""
    pending: bool = False

    # -- naming ---------------------------------------------------------------------------------
    @property
    def storage_options(self) -> dict[str, Any]:
        return json.loads(self.options) if self.options else {}

    @property
    def scheme(self) -> str:
        """``"local"`` for plain paths, else the URL's protocol (``"s3"``, ``"memory"``, ...)."""
        m = _SCHEME_RE.match(self.url)
        return m.group(1).lower() if m else "local"

    @property
    def is_local(self) -> bool:
        """A plain local path (renames work, the raw-chunk fast path applies)."""
        return self.scheme == "local"

    @property
    def path(self) -> str:
        """The path inside the filesystem (the URL without its scheme)."""
        return self.url if self.is_local else self.url.split("://", 1)[1]

    @property
    def name(self) -> str:
        return posixpath.basename(self.url.rstrip("/"))

    @property
    def parent(self) -> Location:
        if self.is_local:
            return dataclasses.replace(self, url=os.path.dirname(self.url) or "/")
        scheme, rest = self.url.split("://", 1)
        head = posixpath.dirname(rest.rstrip("/"))
        return dataclasses.replace(self, url=f"{scheme}://{head}")

    def child(self, *names: str) -> Location:
        """The location ``self/name/...``."""
        parts = [str(n).strip("/") for n in names if str(n).strip("/")]
        if not parts:
            return self
        if self.is_local:
            return dataclasses.replace(self, url=os.path.join(self.url, *parts))
        return dataclasses.replace(self, url=self.url.rstrip("/") + "/" + "/".join(parts))

    def __truediv__(self, name: str) -> Location:
        return self.child(name)

    def with_name(self, name: str) -> Location:
        return self.parent.child(name)

    def with_pending(self, pending: bool = True) -> Location:
        return dataclasses.replace(self, pending=pending)

    def __str__(self) -> str:
        return self.url

    def __fspath__(self) -> str:
        """Local locations act as paths; a URL raises instead of being written to ``./s3:/...``."""
        if not self.is_local:
            raise ArgumentTypeError(f"{self.url!r} is not a local path; open it through blocklin.storage")
        return self.url

    def __dask_tokenize__(self) -> tuple:
        """Task keys and resume tokens name the store, not its credentials: a rerun with rotated keys
        still resumes, while another endpoint or bucket gives other keys."""
        opts = {k: v for k, v in self.storage_options.items() if k not in _CREDENTIALS}
        return ("blocklin.Location", self.url, self.pending, json.dumps(opts, sort_keys=True))

    def __repr__(self) -> str:
        opts = ", storage_options=..." if self.options else ""  # never print credentials
        return f"Location({self.url!r}{opts}{', pending=True' if self.pending else ''})"


def _split_url(url: str) -> tuple[str, str]:
    m = _SCHEME_RE.match(url)
    return (m.group(1).lower(), url[m.end():]) if m else ("local", url)


def check_backend(scheme: str, name: str = "path", url: str = "") -> None:
    """Raise a clear error when no fsspec implementation handles ``scheme``."""
    if scheme == "local":
        return
    import fsspec
    from fsspec.registry import known_implementations

    if scheme not in known_implementations and scheme not in fsspec.registry:
        raise StorageBackendError(explain(
            name, "must be a local path or a URL of a storage protocol fsspec knows",
            f"{url or scheme + '://'} (unknown protocol {scheme!r})",
            "use s3://, gs://, abfs://, memory:// or file:// (install s3fs, gcsfs or adlfs for the cloud ones), "
            "or a local path"))
    try:
        fsspec.get_filesystem_class(scheme)
    except ImportError as exc:
        pkg = BACKEND_PACKAGES.get(scheme) or str(known_implementations.get(scheme, {}).get("err", "")) or "its package"
        raise StorageBackendError(explain(
            name, f"needs the fsspec backend of {scheme}://", f"{url or scheme + '://'} ({exc})",
            f"pip install {pkg}" + (" (or pip install 'blocklin[s3]')" if pkg == "s3fs" else ""))) from None


def default_storage_options() -> dict[str, Any]:
    """Storage options in force here (config, else ``BLOCKLIN_STORAGE_OPTIONS``)."""
    from blocklin.config import get_config

    return dict(get_config().storage_options or {})


def as_location(x: Any, storage_options: dict[str, Any] | None = None, *, name: str = "path") -> Location:
    """Resolve a path, URL, :class:`Location`, zarr store object or ``zarr.Array`` to a :class:`Location`.

    ``storage_options`` (merged over the configured ones) apply to URLs; a :class:`Location` keeps
    its own unless new ones are given.

    Raises
    ------
    StorageBackendError
        For an unknown protocol or a missing fsspec backend (the message names the package).
    TypeError
        For objects that do not name storage.
    """
    if isinstance(x, Location):
        if storage_options:
            merged = {**x.storage_options, **options_for(storage_options, x.scheme)}
            return dataclasses.replace(x, options=_canonical_options(merged))
        return x
    if isinstance(x, os.PathLike) and not _is_zarr_object(x):
        x = os.fspath(x)
    if isinstance(x, bytes):
        x = x.decode()
    if isinstance(x, str):
        scheme, rest = _split_url(x)
        if scheme == "local":
            return Location(os.path.abspath(os.path.expanduser(x)))
        if scheme == "file":  # an fsspec URL on local disk: objects-store semantics, handy for testing
            return Location("file://" + os.path.abspath(rest), _canonical_options(options_for(storage_options, "file")))
        check_backend(scheme, name, x)
        return Location(f"{scheme}://{rest.rstrip('/')}", _canonical_options(_merged(storage_options, scheme)))
    if _is_zarr_object(x):
        return _from_zarr(x, storage_options, name)
    raise ArgumentTypeError(explain(name, "must name storage: a path, a URL such as s3://bucket/A.zarr, a zarr store or "
                            "array, or a blocklin.storage.Location", type(x).__name__, "pass a path or a URL"))


def options_for(options: dict | None, scheme: str) -> dict:
    """The options of one protocol: ``options`` may be flat or per protocol (``{"s3": {...}}``)."""
    opts = dict(options or {})
    if opts and all(isinstance(v, dict) for v in opts.values()) and set(opts) <= set(BACKEND_PACKAGES) | {
            "file", "memory"}:
        opts = dict(opts.get(scheme, {}))
    return opts


def _merged(storage_options: dict | None, scheme: str) -> dict:
    return {**options_for(default_storage_options(), scheme), **options_for(storage_options, scheme)}


def _is_zarr_object(x: Any) -> bool:
    return type(x).__module__.startswith("zarr")


def _from_zarr(x: Any, storage_options: dict | None, name: str) -> Location:
    """Location of a zarr store object or array (its store plus the array's path inside it)."""
    store = getattr(x, "store", x)
    store = getattr(store, "store", store)  # StorePath
    sub = getattr(x, "path", "") if hasattr(x, "store") else ""
    base = store_location(store, storage_options)
    if base is None:
        raise ArgumentTypeError(explain(name, "must be a zarr store that other processes can open (a LocalStore or an "
                                "FsspecStore)", type(store).__name__,
                                "write it to a path or URL first (blocklin.from_array(x, 's3://bucket/A.zarr'))"))
    return base.child(sub) if sub else base


def store_location(store: Any, storage_options: dict | None = None) -> Location | None:
    """Location of a zarr ``LocalStore`` or ``FsspecStore``; ``None`` for in-process stores."""
    kind = type(store).__name__
    if kind == "LocalStore":
        return Location(os.path.abspath(str(store.root)))
    if kind == "FsspecStore":
        fs = store.fs
        inner = getattr(fs, "sync_fs", fs)  # AsyncFileSystemWrapper around a sync filesystem
        url = inner.unstrip_protocol(store.path.rstrip("/"))
        opts = {k: v for k, v in dict(getattr(inner, "storage_options", {}) or {}).items() if k != "asynchronous"}
        opts.update(storage_options or {})
        scheme, rest = _split_url(url)
        if scheme == "file":
            return Location("file://" + rest, _canonical_options(opts))
        return Location(url.rstrip("/"), _canonical_options(opts))
    return None


def parse_storage_option(item: str) -> tuple[list[str], Any]:
    """Parse the CLI's ``KEY=VALUE`` (``endpoint_url=http://...``): dotted keys nest (``client_kwargs.region_name=...``),
    values are JSON when they parse (``anon=true``, ``retries=3``), else strings."""
    key, sep, raw = item.partition("=")
    if not sep or not key.strip():
        raise ConfigError(explain("--storage-option", "must be KEY=VALUE", repr(item),
                                  "write --storage-option anon=true or --storage-option "
                                  "endpoint_url=http://127.0.0.1:9000"))
    try:
        value = json.loads(raw)
    except ValueError:
        value = raw
    return key.strip().split("."), value


def storage_options_from_items(items: list[str] | None) -> dict[str, Any]:
    """A storage-options dict from repeated ``--storage-option KEY=VALUE`` items."""
    out: dict[str, Any] = {}
    for item in items or ():
        keys, value = parse_storage_option(item)
        node = out
        for k in keys[:-1]:
            node = node.setdefault(k, {})
        node[keys[-1]] = value
    return out


__all__ = ["BACKEND_PACKAGES", "Location", "as_location", "check_backend", "parse_storage_option",
           "storage_options_from_items", "store_location"]


#: ``file.npz:member`` and ``file.h5:/group/dataset``: a member of a container file.
_MEMBER_RE = re.compile(r"^(.*?\.(?:npz|h5|hdf5|he5|hdf))(?::(.*))?$", re.IGNORECASE)


def split_spec(spec: Any) -> tuple[str, str | None]:
    """Split ``file.npz:name`` or ``file.h5:/group/dataset`` into ``(path, member)``."""
    s = os.fspath(spec) if not isinstance(spec, str) else spec
    s = os.path.expanduser(s)
    if os.path.exists(s):
        return s, None
    m = _MEMBER_RE.match(s)
    if m:
        return m.group(1), (m.group(2) or None)
    head, sep, tail = s.rpartition(":")
    if sep and head and os.path.isfile(head):
        return head, tail or None
    return s, None
