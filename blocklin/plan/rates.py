"""Expected rates of this machine, and how a plan's time splits between the feed, compute and writes.

A plan knows what it will read and write (bytes) and compute (flops); with the machine's rates
(:class:`Rates`: host feed and write GB/s, the devices' GEMM GFLOP/s) :func:`time_split` turns
them into expected seconds of each and names the one that bounds the run. ``--explain`` prints it
(:func:`expected_line`). After a GPU run, :func:`roofline` turns its counts into the least time the
device and the storage allow (the report's ``roofline_seconds`` and ``roofline_efficiency``).

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

from blocklin.config import user_cache_dir
from blocklin.errors import ConfigError, ParameterError, explain
from blocklin.plan.gpu import DEFAULT_GPU, GPUS

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
    gpu_gflops_tf32 : float or None
        In-core float32 GEMM rate of the GPU on TF32 tensor cores, where measured.
    raw_feed_gbps : float or None
        The storage's raw read limit (chunk files read by every core into reused buffers, as
        ``benchmarks/feed.py`` measures it), where measured: the feed limit of a run's roofline
        (:func:`roofline`).
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
    gpu_gflops_tf32: float | None = None
    raw_feed_gbps: float | None = None

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
        """From :meth:`to_dict` (unknown keys ignored; a missing or non-positive rate, or a measured-only
        rate that is neither null nor positive, is a ``ConfigError``)."""
        names = {f.name for f in dataclasses.fields(cls)}
        kw = {k: v for k, v in d.items() if k in names}
        for name in ("feed_gbps", "write_gbps", "cpu_gflops", "cpu_gflops32"):
            if not isinstance(kw.get(name), (int, float)) or not kw[name] > 0:
                raise ConfigError(explain(f"rates.{name}", "must be a positive number of the cached rates",
                                          repr(kw.get(name)), "run `blocklin calibrate` again to measure it"))
        for name in ("gpu_gflops", "gpu_gflops32", "gpu_gflops_tf32", "raw_feed_gbps", "cached_feed_gbps"):
            value = kw.get(name)
            if value is not None and (not isinstance(value, (int, float)) or not value > 0):
                raise ConfigError(explain(f"rates.{name}", "must be a positive number, or null where not measured",
                                          repr(value), "run `blocklin calibrate` (or benchmarks/gpu_check.py) again"))
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


# -- the roofline of a run ------------------------------------------------------------------------------
#: Arithmetic a roofline's compute rate is taken for: the real GEMM rates, TF32 tensor cores.
ROOFLINE_RATES = ("float64", "float32", "tf32")


@dataclasses.dataclass(frozen=True)
class Roofline:
    """The least time a run could take: ``max(flops / gflops, bytes moved / feed)`` (the roofline model
    of Williams, Waterman and Patterson, CACM 2009, with storage as the memory).

    ``gflops`` is the device's in-core GEMM rate for the arithmetic the run used (:attr:`rate`) and
    ``feed_gbps`` the storage's raw read limit; ``bytes_moved`` counts the bytes read and written, all
    at the read limit (writes are usually slower, so the roofline time is never overstated). A run's
    :meth:`efficiency` is ``seconds / measured seconds``: 1 at the roofline.
    """

    flops: float
    bytes_moved: float
    gflops: float
    feed_gbps: float
    rate: str
    gflops_source: str
    feed_source: str

    @property
    def compute_seconds(self) -> float:
        return float(self.flops) / (self.gflops * 1e9)

    @property
    def feed_seconds(self) -> float:
        return float(self.bytes_moved) / (self.feed_gbps * 1e9)

    @property
    def seconds(self) -> float:
        return max(self.compute_seconds, self.feed_seconds)

    @property
    def bound(self) -> str:
        """``"compute"`` or ``"feed"``: which side of the roofline the run's counts fall on."""
        return "compute" if self.compute_seconds >= self.feed_seconds else "feed"

    def efficiency(self, seconds: float) -> float | None:
        """``self.seconds / seconds`` (None for a run of no measurable time)."""
        return self.seconds / seconds if seconds > 0 else None

    def to_dict(self) -> dict:
        return {"seconds": self.seconds, "compute_seconds": self.compute_seconds,
                "feed_seconds": self.feed_seconds, "bound": self.bound, "flops": self.flops,
                "bytes_moved": self.bytes_moved, "rate": self.rate, "gflops": self.gflops,
                "gflops_source": self.gflops_source, "feed_gbps": self.feed_gbps, "feed_source": self.feed_source}


def roofline_rate(dtype: Any, *, tf32: bool = False) -> str:
    """The arithmetic a run in ``dtype`` uses: ``"tf32"`` for float32 (or complex64) GEMMs on TF32
    tensor cores, else its real dtype's name (complex types: their real part's)."""
    dt = np.dtype(dtype)
    real = np.finfo(dt).dtype if dt.kind == "c" else dt
    if real == np.float32 and tf32:
        return "tf32"
    return "float32" if real.itemsize <= 4 else "float64"


def gpu_spec(name: str | None) -> tuple[str, dict[str, float]]:
    """The entry of :data:`blocklin.plan.gpu.GPUS` whose key ``name`` contains (``"NVIDIA H200"``:
    ``"H200"``), else the default GPU's: ``(key, spec)``."""
    for key in GPUS:
        if name and key.lower() in name.lower():
            return key, GPUS[key]
    return DEFAULT_GPU, GPUS[DEFAULT_GPU]


def roofline(flops: float, bytes_moved: float, *, dtype: Any = np.float64, tf32: bool = False,
             rates: Rates | None = None, gpu: str | None = None) -> Roofline:
    """A GPU run's :class:`Roofline`, from the measured rates where the cache holds them, else the peaks
    of :data:`blocklin.plan.gpu.GPUS`.

    Parameters
    ----------
    flops : float
        The run's floating-point operations (complex runs: ``2 m n k`` for a product, as the plans count).
    bytes_moved : float
        Bytes the run read from and wrote to storage.
    dtype : dtype
        The lowest precision the run computed in (a mixed-precision solve: its float32 factorization):
        the fastest rate it could reach, so that the roofline time is a lower bound.
    tf32 : bool
        Its float32 GEMMs ran on TF32 tensor cores.
    rates : Rates, optional
        The machine's rates (:func:`load_rates`); their ``gpu_gflops``/``gpu_gflops32``/``gpu_gflops_tf32``
        and ``raw_feed_gbps`` where measured. Without them (or for a rate not measured), the GPU's dense
        peak and its host link bandwidth from :data:`blocklin.plan.gpu.GPUS` (the conservative defaults:
        upper limits, so that a default roofline never overstates the efficiency).
    gpu : str, optional
        The device's name (``"NVIDIA H200"``), to find its defaults; unknown names take the default GPU's.

    Returns
    -------
    Roofline
        Its ``gflops_source``/``feed_source`` say ``"measured YYYY-MM-DD"`` or ``"default (H200 ...)"``.
        Complex arithmetic runs at a quarter of the real rate in the plans' complex flop count (a
        complex multiply-add is four real ones), as :func:`blocklin.plan.gpu.crossover_tile` counts it.

    Raises
    ------
    ParameterError
        A negative or non-finite count.
    """
    for name, value in (("flops", flops), ("bytes_moved", bytes_moved)):
        if not isinstance(value, (int, float, np.integer, np.floating)) or not np.isfinite(value) or value < 0:
            raise ParameterError(explain(name, "must be a finite count >= 0", repr(value),
                                         f"pass the report's {name} (0 when there is none)"))
    rate = roofline_rate(dtype, tf32=tf32)
    key, spec = gpu_spec(gpu)
    measured = rates is not None and rates.measured
    when = f"measured {rates.measured[:10]}" if measured else ""
    got = {"float64": rates.gpu_gflops, "float32": rates.gpu_gflops32,
           "tf32": rates.gpu_gflops_tf32}[rate] if measured else None
    gflops, gsource = (float(got), when) if got else (spec[rate] / 1e9, f"default ({key} {rate} peak, plan/gpu.py)")
    if np.dtype(dtype).kind == "c":
        gflops /= 4
    feed = rates.raw_feed_gbps if measured else None
    gbps, fsource = (float(feed), when) if feed else (spec["link"] / 1e9, f"default ({key} host link, plan/gpu.py)")
    return Roofline(flops=float(flops), bytes_moved=float(bytes_moved), gflops=gflops, feed_gbps=gbps, rate=rate,
                    gflops_source=gsource, feed_source=fsource)


# -- the cache file (the only I/O of this module) -----------------------------------------------------
def cache_path() -> Path:
    """``$XDG_CACHE_HOME/blocklin/rates.json``, else ``~/.cache/blocklin/rates.json``
    (:func:`blocklin.config.user_cache_dir`)."""
    return user_cache_dir() / CACHE_NAME


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
           "ROOFLINE_RATES", "Rates", "Roofline", "TimeSplit", "cache_path", "expected_line", "format_seconds",
           "gpu_spec", "load_rates", "machine_key", "read_cache", "roofline", "roofline_rate", "save_rates",
           "time_split"]
