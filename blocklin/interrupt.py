"""Stopping a job cleanly: the process-wide cancel flag and the CLI's signal handling.

An interrupt (Ctrl-C, SIGTERM) raises in the main thread only; tasks running on other threads
would go on writing while the job removes its partial output. So the local schedulers set
:func:`cancel` when a run ends by an interrupt, wait for the tasks in flight (each stops at its next
item, :func:`check_cancelled`), and only then does the job clean up. The flag is cleared when the
next run starts.
"""

from __future__ import annotations

import atexit
import os
import signal
import threading
from collections.abc import Callable
from typing import Any

from blocklin.errors import BlocklinError

_CANCEL = threading.Event()
#: Set while the CLI's :class:`handle_signals` is active: it reports interrupted work itself.
_HANDLED = threading.Event()
#: Exit status of a command stopped by SIGTERM (128 + 15, the shell's convention).
EXIT_TERMINATED = 143
#: Interrupts taken while :class:`handle_signals` is active (the first one stops the command).
_TAKEN = [0]
#: Further interrupts absorbed while the first is cleaned up (the next one stops at once): Ctrl-C
#: pressed twice must not cut short the cleanup that keeps the finished work for ``--resume``.
ABSORBED = 1


class Cancelled(BlocklinError, RuntimeError):
    """A task stopped because its run was interrupted."""


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised like Ctrl-C so that every cleanup that handles one handles the other."""


def cancel() -> None:
    """Ask every task of this process to stop at its next item."""
    _CANCEL.set()


def reset() -> None:
    _CANCEL.clear()


def cancelled() -> bool:
    return _CANCEL.is_set()


def check_cancelled() -> None:
    """Raise :class:`Cancelled` in a task whose run was interrupted."""
    if _CANCEL.is_set():
        raise Cancelled("the run was interrupted")


def signals_handled() -> bool:
    """Whether the CLI handles interrupts (and says in one line what an interrupted run kept)."""
    return _HANDLED.is_set()


def wait_through(wait: Callable[[], Any]) -> None:
    """Run ``wait`` (the join of threads that write) to its end even when an interrupt lands during
    it, then re-raise the interrupt.

    A writer thread outlives a join that Ctrl-C cut short and goes on writing while the job removes
    (or keeps) its output: a chunk landing after the removal recreates the folder. A signal sent
    while the main thread waits on another thread is handled at its next bytecode, which is often
    inside such a join.
    """
    stopped: BaseException | None = None
    while True:
        try:
            wait()
            break
        except KeyboardInterrupt as exc:
            cancel()
            stopped = exc
    if stopped is not None:
        raise stopped


def _take(stop: type[KeyboardInterrupt]) -> None:
    """The first interrupt stops the command; the next :data:`ABSORBED` ones while it stops only say
    so (its cleanup keeps the finished work and says how to resume it); one more stops at once."""
    cancel()
    _TAKEN[0] += 1
    if _TAKEN[0] == 1 or _TAKEN[0] > 1 + ABSORBED:
        raise stop()
    os.write(2, b"blocklin: stopping: keeping the finished work for --resume (interrupt again to quit at once)\n")


def _on_sigterm(signum: int, frame: Any) -> None:
    _take(Terminated)


def _on_sigint(signum: int, frame: Any) -> None:
    _take(KeyboardInterrupt)


class handle_signals:  # noqa: N801 - used as a context manager like a function
    """In the main thread: SIGINT and SIGTERM raise (``KeyboardInterrupt``, :class:`Terminated`)
    and set the cancel flag; a second one while the first is handled is absorbed (see :func:`_take`),
    so keep the cleanup inside. The previous handlers come back on exit."""

    def __enter__(self) -> handle_signals:
        self.saved: dict[int, Any] = {}
        _TAKEN[0] = 0
        if threading.current_thread() is threading.main_thread():
            for sig, handler in ((signal.SIGINT, _on_sigint), (signal.SIGTERM, _on_sigterm)):
                self.saved[sig] = signal.signal(sig, handler)
            _HANDLED.set()
        return self

    def __exit__(self, *exc: Any) -> None:
        for sig, handler in self.saved.items():
            signal.signal(sig, handler)
        if self.saved:
            _HANDLED.clear()


def quiet_shutdown() -> None:
    """Silence what an interrupted process would otherwise print while it exits: asyncio's
    complaints about the I/O tasks zarr's event loop still held ("coroutine ... was never
    awaited", "Task was destroyed but it is pending"), errors of daemon threads, and zarr's complaint
    about its I/O thread (:func:`stop_io_at_exit`)."""
    import logging
    import sys
    import warnings

    logging.getLogger("asyncio").setLevel(logging.CRITICAL + 1)
    warnings.simplefilter("ignore", RuntimeWarning)
    threading.excepthook = lambda args: None
    sys.unraisablehook = lambda unraisable: None
    stop_io_at_exit()


_IO_STOP_REGISTERED = threading.Event()


def stop_io_at_exit() -> None:
    """Have the process's exit wait for zarr's I/O thread (:func:`stop_zarr_io_thread`); once per process.

    Registered after zarr's own exit handler (importing zarr's module registers it first), so run
    before it: atexit runs its handlers last in, first out.
    """
    if _IO_STOP_REGISTERED.is_set():
        return
    import importlib

    try:
        importlib.import_module("zarr.core.sync")
    except ImportError:
        return
    _IO_STOP_REGISTERED.set()
    atexit.register(stop_zarr_io_thread)


#: How long an exiting process waits for zarr's I/O thread to finish its loop's last callbacks.
IO_THREAD_EXIT_WAIT = 30.0


def stop_zarr_io_thread(timeout: float = IO_THREAD_EXIT_WAIT) -> None:
    """Stop zarr's event loop and wait for its I/O thread, up to ``timeout`` seconds.

    zarr's own exit handler gives the thread 0.2 s and otherwise prints "Thread did not finish
    cleanly; forcefully closing the event loop.": in one CI run every interrupted command printed
    it after its one line. Stopped here, the thread has ended when zarr's handler runs, which then
    only closes the loop.
    """
    try:
        from zarr.core import sync
    except ImportError:  # zarr's layout changed: its own handler does the work
        return
    executor, loop, thread = getattr(sync, "_executor", None), getattr(sync, "loop", [None])[0], \
        getattr(sync, "iothread", [None])[0]
    if executor is not None:
        executor.shutdown(wait=True, cancel_futures=True)
        sync._executor = None
    if loop is None or thread is None or loop.is_closed():
        return
    loop.call_soon_threadsafe(loop.stop)
    thread.join(timeout=timeout)


__all__ = ["ABSORBED", "EXIT_TERMINATED", "Cancelled", "Terminated", "cancel", "cancelled", "check_cancelled",
           "handle_signals", "quiet_shutdown", "reset", "signals_handled", "stop_io_at_exit",
           "stop_zarr_io_thread", "wait_through"]
