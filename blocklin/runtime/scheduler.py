"""Scheduler resolution: threads (default), sync reference executor, processes, distributed."""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

from blocklin.config import scheduler_address
from blocklin.errors import ConfigError, explain

LOCAL = ("threads", "sync", "processes")


@dataclasses.dataclass(frozen=True)
class Scheduler:
    """A resolved scheduler: ``kind`` is one of threads/sync/processes/distributed."""

    kind: str
    client: Any = None

    @property
    def distributed(self) -> bool:
        return self.kind == "distributed"


def _active_client() -> Any:
    import sys

    if "distributed" not in sys.modules:  # no client can be active; skip a slow import
        return None
    try:
        from distributed import get_client

        return get_client()
    except (ImportError, ValueError):
        return None


#: Seconds a connection to a cluster's scheduler may take before it is called unreachable.
CONNECT_TIMEOUT = 10


def _reachable(host: str, port: int, address: str) -> None:
    """Refuse, within :data:`CONNECT_TIMEOUT`, a scheduler address where nothing listens (before
    ``distributed`` makes a client, whose failed start costs a minute more while it closes)."""
    import socket

    try:
        socket.create_connection((host, port), timeout=CONNECT_TIMEOUT).close()
    except OSError as exc:
        reason = "timed out" if isinstance(exc, TimeoutError) else (exc.strerror or str(exc))
        raise ConfigError(explain("scheduler", "must be a reachable Dask scheduler address", repr(address),
                                  f"start the cluster first (dask scheduler --port {port}) or check the address; "
                                  f"connecting to {host}:{port}: {reason}")) from None


@functools.lru_cache(maxsize=8)
def _client_for(address: str) -> Any:
    from distributed import Client

    _, host, port = scheduler_address(address)
    _reachable(host, port, address)
    return Client(address, set_as_default=False, timeout=CONNECT_TIMEOUT)


def resolve_scheduler(scheduler: Any = None) -> Scheduler:
    """Resolve ``scheduler=``.

    ``None`` uses the active ``distributed.Client`` when there is one, else Dask's threads;
    a ``Client`` object or ``"distributed"`` uses that client; ``"tcp://host:port"`` connects to a
    cluster; ``"threads"``, ``"sync"`` (plain in-order reference executor) and ``"processes"`` run
    locally.
    """
    if scheduler is None:
        client = _active_client()
        return Scheduler("distributed", client) if client is not None else Scheduler("threads")
    if hasattr(scheduler, "submit") and hasattr(scheduler, "get"):
        return Scheduler("distributed", scheduler)
    if not isinstance(scheduler, str):
        raise ConfigError(explain("scheduler", "must be a name, an address or a distributed.Client",
                                  repr(scheduler), "pass scheduler='threads'"))
    name = scheduler.strip().lower()
    if name in ("threads", "threading", "threaded"):
        return Scheduler("threads")
    if name in ("sync", "synchronous", "serial", "single-threaded"):
        return Scheduler("sync")
    if name in ("processes", "multiprocessing"):
        return Scheduler("processes")
    if name == "distributed":
        client = _active_client()
        if client is None:
            raise ConfigError(explain("scheduler", "'distributed' needs an active distributed.Client",
                                      "no client", "create one (distributed.Client(...)) or pass an address "
                                      "like 'tcp://host:8786'"))
        return Scheduler("distributed", client)
    if "://" in name:
        scheduler_address(scheduler)
        try:
            return Scheduler("distributed", _client_for(scheduler.strip()))
        except OSError as exc:
            raise ConfigError(explain("scheduler", "must be a reachable Dask scheduler address", repr(scheduler),
                                      f"start the cluster first or check the address ({exc})")) from exc
    raise ConfigError(explain("scheduler", "must be threads, sync, processes, distributed or tcp://host:port",
                              repr(scheduler), "pass scheduler='threads'"))
