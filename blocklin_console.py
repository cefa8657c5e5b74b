"""The ``blocklin`` console script's entry, outside the package so that it imports nothing heavy.

Importing blocklin imports NumPy, zarr and Dask (a second or more). Ctrl-C in that time ends here
like an interrupted command: one line and exit status 130, not a traceback. Everything else is
:func:`blocklin.cli.main.main`'s, which says the same of an interrupt while it builds its parser.
"""

from __future__ import annotations

import sys

#: 128 + SIGINT, the shell's convention (the status of every interrupted blocklin command).
EXIT_INTERRUPTED = 130


def main(argv: list[str] | None = None) -> int:
    try:
        from blocklin.cli.main import main as run
    except KeyboardInterrupt:  # the line blocklin.cli.ui.interrupted_while_starting prints (not importable here)
        print("blocklin: interrupted while starting; nothing was run", file=sys.stderr)
        return EXIT_INTERRUPTED
    status = run(argv)
    _end_quietly_on_interrupt(status)
    return status


def _end_quietly_on_interrupt(status: int) -> None:
    """From here the command is done (its output committed, its line printed): Ctrl-C while the
    interpreter shuts down (joining zarr's and the executors' threads) had printed a KeyboardInterrupt
    traceback, or ended a complete run by SIGINT (status -2, no line). It now ends the process at
    once with the command's own status."""
    import os
    import signal

    def end(signum: int, frame: object) -> None:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):  # closed, or its reader gone
                pass
        os._exit(status)

    signal.signal(signal.SIGINT, end)
