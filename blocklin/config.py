"""Configuration: budgets, device, scheduler, temp dir and codec.

Three ways to set a value, later ones winning:

1. ``BLOCKLIN_*`` environment variables read at import (``BLOCKLIN_MEMORY=2GiB``);
2. :func:`configure` for the rest of the process;
3. :func:`set` as a scoped context manager (thread- and task-local through :mod:`contextvars`);

and per call, the ``memory=``, ``device=``, ``scheduler=`` keywords of every operation.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import os
import re
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TypedDict

from blocklin.errors import ConfigError, ParameterError, explain

_UNITS = {
    "": 1, "b": 1,
    "k": 10**3, "kb": 10**3, "m": 10**6, "mb": 10**6, "g": 10**9, "gb": 10**9, "t": 10**12, "tb": 10**12,
    "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
}
_SIZE_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([a-zA-Z]*)\s*$")

DEVICES = ("auto", "cpu", "gpu")
#: The largest byte size a budget may be (what an int64 holds).
MAX_BYTES = 2**63 - 1
#: Most concurrent tile tasks ``workers=`` may ask for (planners try counts downward from it, and
#: tasks beyond the cores only queue).
MAX_WORKERS = 4096
CODECS = ("none", "zstd", "blosc-lz4", "blosc-zstd", "gzip")


def parse_size(value: int | float | str | None, name: str = "memory") -> int | None:
    """Parse a byte size such as ``"1GiB"``, ``"512 MB"``, ``2**30`` or ``"1e9"``.

    Raises
    ------
    ConfigError
        When the value is not a positive size.
    """
    if value is None:
        return None
    if isinstance(value, bool):
        raise ConfigError(explain(name, "must be a byte size like '1GiB' or an integer", repr(value),
                                  f"pass {name}='1GiB'"))
    if isinstance(value, (int, float)):
        exact = value
    else:
        m = _SIZE_RE.match(str(value))
        unit = m.group(2).lower() if m else None
        if not m or unit not in _UNITS:
            raise ConfigError(explain(name, "must be a byte size such as '512MiB', '2GiB' or 1073741824",
                                      repr(value), f"write {name}='1GiB' (units: B, KB, MB, GB, KiB, MiB, GiB, TiB)"))
        number = float(m.group(1)) if "." in m.group(1) or "e" in m.group(1).lower() else int(m.group(1))
        # a fraction of a larger unit rounds down ("0.3GiB"); a bare byte count must be whole ("5.5")
        exact = number * _UNITS[unit] if _UNITS[unit] == 1 else int(number * _UNITS[unit])
    if exact != exact or exact in (float("inf"), float("-inf")) or exact != int(exact):
        raise ConfigError(explain(name, "must be a whole number of bytes", repr(value), f"pass {name}='1GiB'"))
    size = int(exact)
    if size <= 0:
        raise ConfigError(explain(name, "must be positive", repr(value), f"pass {name}='1GiB'"))
    if size > MAX_BYTES:
        raise ConfigError(explain(name, f"must be at most {MAX_BYTES} bytes (8 EiB)", repr(value),
                                  f"pass {name}='1GiB'"))
    return size


#: The address schemes of a Dask scheduler that blocklin connects to.
SCHEDULER_SCHEMES = ("tcp", "tls", "ws", "wss")


def scheduler_address(address: str) -> tuple[str, str, int]:
    """``(scheme, host, port)`` of a Dask scheduler address such as ``"tcp://10.0.0.5:8786"``.

    Checked before any connection is tried: ``distributed`` raises a bare ``ValueError`` for a
    missing port and then hangs a minute closing the half-made client.

    Raises
    ------
    ConfigError
        When the scheme is not one of :data:`SCHEDULER_SCHEMES` or the host or port is missing.
    """
    from urllib.parse import urlsplit

    fix = "pass an address with host and port, e.g. --scheduler tcp://127.0.0.1:8786 (scheduler='tcp://host:8786')"
    text = address.strip()
    try:
        parts = urlsplit(text)
        port = parts.port
    except ValueError:  # a port that is not a number in 0..65535
        raise ConfigError(explain("scheduler", "must be SCHEME://HOST:PORT with a port in 1..65535", repr(address),
                                  fix)) from None
    if parts.scheme.lower() not in SCHEDULER_SCHEMES:
        raise ConfigError(explain("scheduler", f"an address must start with one of "
                                  f"{', '.join(s + '://' for s in SCHEDULER_SCHEMES)}", repr(address), fix))
    if not parts.hostname:
        raise ConfigError(explain("scheduler", "an address must name the scheduler's host", repr(address), fix))
    if not port:
        raise ConfigError(explain("scheduler", "an address must name the scheduler's port (8786 by default)",
                                  repr(address), fix))
    return parts.scheme.lower(), parts.hostname, port


def user_cache_dir() -> Path:
    """blocklin's folder in the user's cache: ``$XDG_CACHE_HOME/blocklin``, else ``~/.cache/blocklin`` (a
    relative ``XDG_CACHE_HOME`` is invalid by the XDG spec, and ignored). The measured rates
    (:mod:`blocklin.plan.rates`) and the peaks seen of inputs (:mod:`blocklin.storage.seen_peaks`) live there."""
    root = os.environ.get("XDG_CACHE_HOME") or ""
    return (Path(root) if os.path.isabs(root) else Path.home() / ".cache") / "blocklin"


def format_size(nbytes: float) -> str:
    """Format bytes as a short human string (``'1.50 GiB'``)."""
    nbytes = float(nbytes)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(nbytes) < 1024 or unit == "TiB":
            return f"{nbytes:.0f} {unit}" if unit == "B" else f"{nbytes:.2f} {unit}"
        nbytes /= 1024
    return f"{nbytes:.2f} TiB"  # pragma: no cover


def size_hint(nbytes: float) -> str:
    """A budget string at least ``nbytes`` that users can paste (``'69KiB'``, ``'513MiB'``, ``'3GiB'``)."""
    import math

    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if nbytes >= 4 * size or unit == "KiB":
            return f"{math.ceil(nbytes / size)}{unit}"
    return f"{int(nbytes)}B"  # pragma: no cover


@dataclasses.dataclass(frozen=True)
class Config:
    """Resolved settings of one operation.

    Attributes
    ----------
    memory : int
        Host memory budget in bytes for the buffers of one operation (all concurrent tasks together).
    device_memory : int or None
        Device (GPU) memory budget in bytes; ``None`` uses 80% of what this process may use on the GPU
        (total memory minus what other processes hold).
    device : {"auto", "cpu", "gpu"}
        Compute device; ``auto`` picks the GPU when CuPy and a device are present.
    scheduler : str or None
        ``None``/``"threads"`` (Dask's threaded scheduler), ``"sync"``, ``"processes"``,
        ``"distributed"`` (the active client) or an address such as ``"tcp://host:8786"``. When a
        ``distributed.Client`` is active and ``scheduler`` is None, that client is used.
    workers : int or None
        Concurrent tile tasks on local schedulers; ``None`` lets the planner choose.
    temp_dir : str or Location
        Folder or URL (``s3://bucket/tmp``) for staged inputs and intermediates. On a cluster every
        worker must reach it (checked before a job starts).
    storage_options : dict or None
        fsspec options for URLs (credentials, ``endpoint_url``), flat or per
        protocol (``{"s3": {...}, "gs": {...}}``); a call's ``storage_options=`` adds to them.
    codec : str
        Codec of the engine's own intermediates (``"none"`` by default: random floats do not compress).
    require_complete : bool
        Refuse input zarr stores with a chunk file missing from their grid (blocklin's own outputs
        are always checked against the chunk files they were committed with).
    check_finite : bool
        Check operands for NaN/Inf while streaming them.
    progress : bool or None
        Show progress bars; ``None`` shows them only on an interactive terminal (CLI).
    """

    memory: int = 1 << 30
    device_memory: int | None = None
    device: str = "auto"
    scheduler: Any = None
    workers: int | None = None
    temp_dir: str = dataclasses.field(default_factory=tempfile.gettempdir)
    codec: str = "none"
    check_finite: bool = True
    require_complete: bool = False
    progress: bool | None = None
    storage_options: dict | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "memory", parse_size(self.memory, "memory"))
        object.__setattr__(self, "device_memory", parse_size(self.device_memory, "device_memory"))
        if self.device not in DEVICES:
            raise ConfigError(explain("device", f"must be one of {DEVICES}", repr(self.device),
                                      "pass device='cpu' (or 'gpu' with CuPy installed)"))
        if self.codec not in CODECS:
            raise ConfigError(explain("codec", f"must be one of {CODECS}", repr(self.codec), "pass codec='none'"))
        if self.storage_options is not None and not isinstance(self.storage_options, dict):
            raise ConfigError(explain("storage_options", "must be a dict of fsspec options",
                                      type(self.storage_options).__name__,
                                      "pass storage_options={'anon': True}, or a JSON object in "
                                      "BLOCKLIN_STORAGE_OPTIONS"))
        if not isinstance(self.temp_dir, str) and type(self.temp_dir).__name__ != "Location":
            object.__setattr__(self, "temp_dir", os.fspath(self.temp_dir))  # a Location keeps its storage options
        if self.workers is not None and (not isinstance(self.workers, int) or isinstance(self.workers, bool)
                                         or not 1 <= self.workers <= MAX_WORKERS):
            raise ConfigError(explain("workers", f"must be None or an integer in 1..{MAX_WORKERS}", repr(self.workers),
                                      "pass workers=1 (or about the number of cores)"))

        if isinstance(self.scheduler, str) and "://" in self.scheduler:
            scheduler_address(self.scheduler)

    def replace(self, **changes: Any) -> Config:
        """Return a copy with the non-None ``changes`` applied."""
        changes = {k: v for k, v in changes.items() if v is not None}
        return dataclasses.replace(self, **changes) if changes else self


class Settings(TypedDict, total=False):
    """The settings every operation takes as keywords; ``None`` (or leaving one out) keeps the value in force.

    ``memory``, ``device_memory``: budgets (``"1GiB"`` or bytes); ``device``: ``"auto"``, ``"cpu"`` or
    ``"gpu"``; ``scheduler``: see :class:`Config`; ``workers``: concurrent tile tasks; ``progress``:
    show progress (or a progress object); ``check_finite``: check operands for NaN/Inf;
    ``require_complete``: refuse input stores with missing chunk files;
    ``temp_dir``: folder or URL for staged inputs and intermediates; ``storage_options``: fsspec
    options for URL operands, outputs and temp dir, added to the configured ones (``docs/cluster.md``).
    """

    memory: Any
    device_memory: Any
    device: str | None
    scheduler: Any
    workers: int | None
    progress: Any
    check_finite: bool | None
    require_complete: bool | None
    temp_dir: Any
    storage_options: dict | None


#: Names of :class:`Settings`.
SETTINGS: tuple[str, ...] = tuple(Settings.__annotations__)


#: Keywords of the functions blocklin stands in for (docs/porting.md) that blocklin spells otherwise or
#: does not have: what each is and the fix. They had been refused as misspelt settings ("check the spelling").
_PORTED_KEYWORDS: dict[str, tuple[str, str]] = {
    "sigma": ("is SciPy's shift-invert, which blocklin does not have",
              "pass which='LA', 'SA' or 'LM' for the extreme eigenpairs, or compute the ones near sigma in memory "
              "(scipy.sparse.linalg.eigsh(A, k, sigma=...))"),
    "mode": ("is SciPy's shift-invert mode, which blocklin does not have", "drop it (and sigma)"),
    "ncv": ("is SciPy's Lanczos basis size", "pass max_basis="),
    "maxiter": ("is SciPy's iteration limit", "pass max_passes= (svd, eigsh) or max_iter= (solve of a sparse matrix)"),
    "random_state": ("is scikit-learn's seed", "pass seed= (an integer, a Generator or a RandomState)"),
    "rng": ("is SciPy's seed", "pass seed= (an integer, a Generator or a RandomState)"),
    "return_eigenvectors": ("is SciPy's", "drop it: blocklin.eigsh returns (w, V) (blocklin.svd takes "
                            "return_singular_vectors=)"),
    "compute_uv": ("is NumPy's", "pass return_singular_vectors=False"),
    "full_matrices": ("is NumPy's", "drop it: blocklin.svd returns the thin factors (NumPy's full_matrices=False)"),
    "n_oversamples": ("is scikit-learn's", "pass oversample="),
    "svd_solver": ("is scikit-learn's", "pass method= ('full'; 'gram' for 'covariance_eigh', 'rsvd' for "
                   "'randomized', 'lanczos' for 'arpack'; 'auto')"),
    "solver": ("is scikit-learn's", "drop it: blocklin picks its route (method='auto', the report's method_reason)"),
    "alpha": ("is scikit-learn's ridge penalty", "pass lam=sqrt(alpha) (alpha = lam^2)"),
    "alphas": ("is scikit-learn's RidgeCV grid", "pass lam=('loo', sqrt(alphas))"),
}


def check_settings(settings: dict[str, Any]) -> None:
    """Refuse keywords that are not settings (a misspelt ``memroy=`` would otherwise be ignored); a keyword
    of the NumPy, SciPy or scikit-learn function blocklin stands in for is named as such, with blocklin's."""
    unknown = sorted(k for k in settings if k not in SETTINGS)  # (set is shadowed in this module)
    if unknown:
        name = unknown[0]
        rule, fix = _PORTED_KEYWORDS.get(name, (f"is not a setting (settings are {', '.join(SETTINGS)})",
                                                "check the spelling"))
        if name in _PORTED_KEYWORDS:
            rule = f"{rule}, not a keyword of this blocklin function"
        raise ParameterError(explain(name, rule, f"{name}={settings[name]!r}", fix))


_ENV = {
    "memory": "BLOCKLIN_MEMORY",
    "device_memory": "BLOCKLIN_DEVICE_MEMORY",
    "device": "BLOCKLIN_DEVICE",
    "scheduler": "BLOCKLIN_SCHEDULER",
    "workers": "BLOCKLIN_WORKERS",
    "temp_dir": "BLOCKLIN_TEMP_DIR",
    "codec": "BLOCKLIN_CODEC",
    "check_finite": "BLOCKLIN_CHECK_FINITE",
    "require_complete": "BLOCKLIN_REQUIRE_COMPLETE",
    "storage_options": "BLOCKLIN_STORAGE_OPTIONS",
}


def _env_value(field: str, var: str, raw: str) -> Any:
    if field == "workers":
        try:
            return int(raw)
        except ValueError:
            raise ConfigError(explain(var, "must be an integer", repr(raw), f"export {var}=1")) from None
    if field == "storage_options":
        import json

        try:
            return json.loads(raw)
        except ValueError:
            raise ConfigError(explain(var, "must be a JSON object", repr(raw),
                                      f"export {var}='{{\"anon\": true}}'")) from None
    if field == "check_finite":
        return raw.strip().lower() not in ("0", "false", "no", "off")
    if field == "require_complete":
        return raw.strip().lower() in ("1", "true", "yes", "on")
    return raw


#: Settings whose environment variable is malformed, with the error; raised by :func:`resolve` only
#: when the call does not give the setting itself (``--memory 1GiB`` works under a broken
#: ``BLOCKLIN_MEMORY``).
_env_errors: dict[str, ConfigError] = {}


def _from_env(environ: dict[str, str] | os._Environ = os.environ) -> Config:
    values: dict[str, Any] = {}
    _env_errors.clear()
    for field, var in _ENV.items():
        raw = environ.get(var)
        if raw is None or raw == "":
            continue
        try:
            value = _env_value(field, var, raw)
            Config(**{field: value})  # each setting checked alone, so one bad variable spoils only itself
        except ConfigError as exc:
            option = "--" + field.replace("_", "-")
            _env_errors[field] = ConfigError(f"from environment variable {var}: {exc} (or unset {var}, or give "
                                             f"the setting per call: {option} on the command line, {field}= in "
                                             "Python)")
            continue
        values[field] = value
    return Config(**values)


_global: Config | None = None
_scoped: contextvars.ContextVar[Config | None] = contextvars.ContextVar("blocklin_config", default=None)
_scoped_given: contextvars.ContextVar[frozenset] = contextvars.ContextVar("blocklin_config_given", default=frozenset())


def get_config() -> Config:
    """Return the settings in force here (scoped, else global, else environment defaults)."""
    global _global
    scoped = _scoped.get()
    if scoped is not None:
        return scoped
    if _global is None:
        _global = _from_env()
    return _global


def configure(**settings: Any) -> Config:
    """Change settings for the rest of the process; returns the new :class:`Config`.

    Examples
    --------
    >>> import blocklin
    >>> cfg = blocklin.configure(memory="2GiB", device="cpu")
    >>> cfg.memory, cfg.device
    (2147483648, 'cpu')
    >>> with blocklin.config.set(memory="512MiB"):
    ...     blocklin.config.get_config().memory
    536870912
    >>> blocklin.config.reset()
    """
    global _global
    _global = dataclasses.replace(get_config() if _scoped.get() is None else (_global or _from_env()), **settings)
    for field in settings:  # given now: the environment's value no longer matters
        _env_errors.pop(field, None)
    return _global


@contextlib.contextmanager
def set(**settings: Any) -> Iterator[Config]:  # noqa: A001 - mirrors dask.config.set
    """Scoped settings: ``with blocklin.config.set(memory="512MiB"): ...``."""
    new = dataclasses.replace(get_config(), **settings)
    token = _scoped.set(new)
    given = _scoped_given.set(_scoped_given.get() | frozenset(settings))
    try:
        yield new
    finally:
        _scoped_given.reset(given)
        _scoped.reset(token)


def resolve(**overrides: Any) -> Config:
    """Settings for one call: the config in force with the call's non-None keywords applied.

    Raises the error of a malformed ``BLOCKLIN_*`` variable whose setting the call does not give.
    """
    cfg = get_config().replace(**overrides)
    for field, exc in _env_errors.items():
        if overrides.get(field) is None and field not in _scoped_given.get():
            raise exc
    return cfg


def reset() -> None:
    """Forget :func:`configure` changes and re-read the environment (used by tests)."""
    global _global
    _global = None
