"""Expected rates of this machine, and how a plan's time splits between the feed, compute and writes.

A plan knows what it will read and write (bytes) and compute (flops); with the machine's rates
(:class:`Rates`: host feed and write GB/s, the devices' GEMM GFLOP/s) :func:`time_split` turns
them into expected seconds of each and names the one that bounds the run. ``--explain`` prints it
(:func:`expected_line`).

Where things live (the plan layer stays pure arithmetic): the measuring is done below or beside it,
``blocklin.storage.probe.measure_storage`` (a temp zarr written and read back by blocklin's own
writer and reader) and ``blocklin.device.calibrate.measure_gflops`` (one GEMM), run by
``blocklin calibrate`` (``blocklin/cli/calibrate.py``). This module holds the arithmetic, the
defaults and the cache file of measured rates: :func:`load_rates` only reads that one JSON file
(a plan's ``explain`` calls it when it is given no rates, so that the API's plans and the CLI's
print the same line) and :func:`save_rates` writes it; nothing else here touches a file.

The cache is ``$XDG_CACHE_HOME/blocklin/rates.json`` (``~/.cache/blocklin/rates.json`` without
``XDG_CACHE_HOME``), one entry per machine key (:func:`machine_key`: hostname, core count and
device), so that a home folder shared by the nodes of a cluster keeps each node's figures.
"""

from __future__ import annotations

import dataclasses
import json
import os
import socket
from pathlib import Path
from typing import Any

import numpy as np

from blocklin.errors import ConfigError, ParameterError, explain

#: Version of the cache file's layout (entries of another version are ignored).
CACHE_VERSION = 1
CACHE_NAME = "rates.json"

#: Default host feed, 10^9 bytes/s: what blocklin's reader delivers from storage. Measured on the
#: 2-core development machine (``blocklin calibrate``, 256 MiB uncompressed, two loader threads):
#: 1.1-1.3 GB/s from its disk (pages dropped first), 2.2 GB/s from the page cache (3.3 in a quiet
#: moment; raw page-cache reads 5.2 GB/s with two threads, 2.7 with one). Data that does not fit
#: in memory comes from the disk, where a SATA SSD gives about 0.5 GB/s and an NVMe drive 2-3: the
#: default takes 1, so that a plan errs towards "bound by feed" (add loaders, rechunk, compress less)
#: rather than promising compute the storage cannot feed.
DEFAULT_FEED_GBPS = 1.0
#: Default write rate, 10^9 bytes/s. blocklin writes whole chunks without fsync, so the OS absorbs
#: them until its dirty-page limit (measured here: 0.7-2.4 GB/s for a 256 MiB store, varying with
#: the other jobs' writes); half a GB/s is what a SATA SSD sustains once the pages must reach it.
DEFAULT_WRITE_GBPS = 0.5
#: Default float64 GEMM rate per core, GFLOP/s. Measured on this 2-core machine (OpenBLAS,
#: 2048 x 2048, both cores, beside another job's benchmarks): 36-60 GFLOP/s float64 (18-30 per
#: core), 63-82 float32; 15 per core stays below that for an older core or one shared with another
#: job. float32 runs at twice the rate.
DEFAULT_CPU_GFLOPS_PER_CORE = 15.0
#: Default GPU GEMM rate, GFLOP/s, float64 and float32 alike: half an A100's 19.5 TFLOP/s (the
#: slowest GPU of :data:`blocklin.plan.gpu.GPUS`; an H100 or H200 peaks at 67), since a GEMM fed by
#: tiles rarely reaches the peak.
DEFAULT_GPU_GFLOPS = 10_000.0

#: What may bound a run, in the order ties are named.
BOUNDS = ("feed", "compute", "write")
DEVICES = ("cpu", "gpu")


@dataclasses.dataclass(frozen=True)
class Rates:
    """Expected rates of one machine (10^9 bytes/s, 10^9 flop/s).

    Attributes
    ----------
    feed_gbps : float
        Bytes per second blocklin's reader delivers from storage into host memory.
    write_gbps : float
        Bytes per second blocklin's writer puts into storage.
    cpu_gflops, cpu_gflops32 : float
        GEMM rate of all the cores, float64 and float32.
    gpu_gflops, gpu_gflops32 : float or None
        GEMM rate of the GPU (None: not measured; :meth:`gflops` then uses the default).
    measured : str or None
        When they were measured (ISO 8601, UTC); None for the defaults.
    key : str or None
        The machine key they were measured under (:func:`machine_key`).
    cached_feed_gbps : float or None
        The same reads from the page cache (a second read of the store), where measured.
    """

    feed_gbps: float
    write_gbps: float
    cpu_gflops: float
    cpu_gflops32: float
    gpu_gflops: float | None = None
    gpu_gflops32: float | None = None
    measured: str | None = None
    key: str | None = None
    cached_feed_gbps: float | None = None

    @classmethod
    def defaults(cls, cores: int | None = None) -> Rates:
        """The conservative defaults (see the module's constants) for ``cores`` cores (default: this machine's)."""
        cores = max(1, int(cores or os.cpu_count() or 1))
        cpu = DEFAULT_CPU_GFLOPS_PER_CORE * cores
        return cls(feed_gbps=DEFAULT_FEED_GBPS, write_gbps=DEFAULT_WRITE_GBPS, cpu_gflops=cpu, cpu_gflops32=2 * cpu)

    @property
    def source(self) -> str:
        """``"rates measured 2026-12-02"`` or ``"default rates"`` (what an expected line names)."""
        return f"rates measured {self.measured[:10]}" if self.measured else "default rates"

    def gflops(self, device: str, dtype: Any = None) -> float:
        """GEMM GFLOP/s on ``device`` (``"cpu"``/``"gpu"``) for ``dtype`` (32-bit types: the float32 rate)."""
        single = dtype is not None and np.dtype(dtype) in (np.dtype(np.float32), np.dtype(np.complex64))
        if device == "gpu":
            rate = self.gpu_gflops32 if single else self.gpu_gflops
            return float(rate) if rate else DEFAULT_GPU_GFLOPS
        return float(self.cpu_gflops32 if single else self.cpu_gflops)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> Rates:
        """From :meth:`to_dict` (unknown keys ignored; a missing or non-positive rate is a ``ConfigError``)."""
        names = {f.name for f in dataclasses.fields(cls)}
        kw = {k: v for k, v in d.items() if k in names}
        for name in ("feed_gbps", "write_gbps", "cpu_gflops", "cpu_gflops32"):
            if not isinstance(kw.get(name), (int, float)) or not kw[name] > 0:
                raise ConfigError(explain(f"rates.{name}", "must be a positive number of the cached rates",
                                          repr(kw.get(name)), "run `blocklin calibrate` again to measure it"))
        return cls(**kw)


@dataclasses.dataclass(frozen=True)
class TimeSplit:
    """Expected seconds of a run's feed (reads), compute and writes, and which one bounds it.

    The three overlap in blocklin's pipelines (loader threads read ahead while the device computes,
    writes follow each tile), so the run takes at least :attr:`seconds`, their largest, and at most
    their sum; ``bound`` names the largest (ties in the order feed, compute, write).
    """

    feed_seconds: float
    compute_seconds: float
    write_seconds: float
    bound: str
    device: str
    rates: Rates

    @property
    def seconds(self) -> float:
        return max(self.feed_seconds, self.compute_seconds, self.write_seconds)

    def to_dict(self) -> dict:
        return {"feed_seconds": self.feed_seconds, "compute_seconds": self.compute_seconds,
                "write_seconds": self.write_seconds, "bound": self.bound, "device": self.device,
                "rates": self.rates.source}


def time_split(bytes_read: float, bytes_written: float, flops: float, device: str, rates: Rates | None = None,
               *, dtype: Any = None) -> TimeSplit:
    """Expected feed, compute and write seconds of a run, and which bounds it.

    Parameters
    ----------
    bytes_read, bytes_written : float
        Bytes the run reads from and writes to storage.
    flops : float
        Floating-point operations it computes.
    device : {"cpu", "gpu"}
        Where it computes.
    rates : Rates, optional
        The machine's rates (default :meth:`Rates.defaults`; :func:`load_rates` for the measured ones).
    dtype : dtype, optional
        Compute dtype: float32 and complex64 use the float32 GEMM rate, others the float64 one.

    Returns
    -------
    TimeSplit
        ``bytes_read / feed``, ``flops / gflops(device, dtype)``, ``bytes_written / write`` in seconds.

    Raises
    ------
    ParameterError
        A negative or non-finite count, or a device other than ``"cpu"``/``"gpu"``.
    """
    for name, value in (("bytes_read", bytes_read), ("bytes_written", bytes_written), ("flops", flops)):
        if not isinstance(value, (int, float, np.integer, np.floating)) or not np.isfinite(value) or value < 0:
            raise ParameterError(explain(name, "must be a finite count >= 0", repr(value),
                                         f"pass the plan's {name} (0 when there is none)"))
    if device not in DEVICES:
        raise ParameterError(explain("device", "must be 'cpu' or 'gpu' (where the run computes)", repr(device),
                                     "pass the plan's device, or 'cpu'"))
    rates = rates or Rates.defaults()
    secs = (float(bytes_read) / (rates.feed_gbps * 1e9), float(flops) / (rates.gflops(device, dtype) * 1e9),
            float(bytes_written) / (rates.write_gbps * 1e9))
    bound = BOUNDS[max(range(3), key=lambda i: (secs[i], -i))]
    return TimeSplit(feed_seconds=secs[0], compute_seconds=secs[1], write_seconds=secs[2], bound=bound,
                     device=device, rates=rates)


def format_seconds(seconds: float) -> str:
    """``2.1 s``, ``0.43 s``, ``0.004 s``: two significant digits below 10 s."""
    if seconds >= 10:
        return f"{seconds:.0f} s"
    if seconds >= 1:
        return f"{seconds:.1f} s"
    return f"{seconds:.2g} s"


def expected_line(bytes_read: float, bytes_written: float, flops: float, device: str = "cpu",
                  rates: Rates | None = None, *, dtype: Any = None, label: str = "expected") -> str:
    """One line for a plan's ``explain``: ``expected on cpu: feed 2.1 s, compute 0.4 s, write 0.3 s
    (rates measured 2026-12-02): bound by feed``. Without ``rates``, those :func:`load_rates` finds."""
    split = time_split(bytes_read, bytes_written, flops, device, rates if rates is not None else load_rates(),
                       dtype=dtype)
    return (f"{label} on {device}: feed {format_seconds(split.feed_seconds)}, compute "
            f"{format_seconds(split.compute_seconds)}, write {format_seconds(split.write_seconds)} "
            f"({split.rates.source}): bound by {split.bound}")


# -- the cache file (the only I/O of this module) -----------------------------------------------------
def cache_path() -> Path:
    """``$XDG_CACHE_HOME/blocklin/rates.json``, else ``~/.cache/blocklin/rates.json``."""
    root = os.environ.get("XDG_CACHE_HOME") or ""
    # the XDG spec: a relative value is invalid and ignored
    base = Path(root) if os.path.isabs(root) else Path.home() / ".cache"
    return base / "blocklin" / CACHE_NAME


def machine_key(device: str = "cpu", *, host: str | None = None, cores: int | None = None) -> str:
    """``host/N cores/device``: the cache key of this machine's rates (``device``: ``"cpu"``, or
    ``"gpu NAME"`` where a GPU was measured)."""
    return f"{host or socket.gethostname()}/{int(cores or os.cpu_count() or 1)} cores/{device}"


def read_cache(path: Path | None = None) -> dict[str, dict]:
    """The cached entries by machine key (empty without a file).

    Raises
    ------
    ConfigError
        The file exists but is not a rates cache (unreadable, not JSON, another layout).
    """
    path = path or cache_path()
    try:
        text = path.read_text()
    except FileNotFoundError:
        return {}
    except OSError as exc:
        raise ConfigError(explain("rates cache", "must be readable", f"{path} ({exc})",
                                  f"fix its permissions or remove it (rm {path}) and run `blocklin calibrate`")) from exc
    try:
        data = json.loads(text)
    except ValueError:
        data = None
    if not isinstance(data, dict) or not isinstance(data.get("machines"), dict):
        raise ConfigError(explain("rates cache", "must be the JSON that `blocklin calibrate` writes",
                                  f"{path}: {text[:60]!r}", f"remove it (rm {path}) and run `blocklin calibrate`"))
    if data.get("version") != CACHE_VERSION:
        return {}
    return {k: v for k, v in data["machines"].items() if isinstance(v, dict)}


def load_rates(device: str | None = None, *, path: Path | None = None, host: str | None = None,
               cores: int | None = None) -> Rates:
    """This machine's measured rates, else :meth:`Rates.defaults`; never raises.

    ``device``: the device part of the key (``"cpu"``, ``"gpu NAME"``); without it, the most
    recently measured entry of this host and core count, whatever its device.
    """
    try:
        entries = read_cache(path)
    except ConfigError:  # a broken cache never stops a plan: `blocklin calibrate --show` says why
        entries = {}
    prefix = machine_key("", host=host, cores=cores)
    mine = [(k, v) for k, v in entries.items() if (k == prefix + device if device else k.startswith(prefix))]
    for _, entry in sorted(mine, key=lambda kv: str(kv[1].get("measured", "")), reverse=True):
        try:
            return Rates.from_dict(entry)
        except (ConfigError, TypeError):
            continue
    return Rates.defaults(cores)


def save_rates(rates: Rates, *, path: Path | None = None) -> Path:
    """Store ``rates`` under their ``key`` (other machines' entries kept; an unreadable cache
    replaced) by writing a new file and renaming it over the old one. Returns the path."""
    if not rates.key:
        raise ParameterError(explain("rates.key", "must name the machine the rates were measured on", "None",
                                     "build them with key=machine_key(...)"))
    path = path or cache_path()
    try:
        entries = read_cache(path)
    except ConfigError:
        entries = {}
    entries[rates.key] = rates.to_dict()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps({"version": CACHE_VERSION, "machines": entries}, indent=1, sort_keys=True))
    os.replace(tmp, path)
    return path


__all__ = ["BOUNDS", "DEFAULT_CPU_GFLOPS_PER_CORE", "DEFAULT_FEED_GBPS", "DEFAULT_GPU_GFLOPS", "DEFAULT_WRITE_GBPS",
           "Rates", "TimeSplit", "cache_path", "expected_line", "format_seconds", "load_rates", "machine_key",
           "read_cache", "save_rates", "time_split"]
