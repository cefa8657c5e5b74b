"""The ``blocklin`` command with every streamed item and finished unit delayed (tests only).

``python tests/slow_cli.py ARGS...`` runs ``blocklin ARGS...``; ``BLOCKLIN_TEST_DELAY`` (seconds,
default 0) is slept before each item a tile stream reads and before each resume marker, so that a
signal test can reach a run at a chosen point while it is still writing. The product code is
unchanged: the delay is patched in here.
"""

import os
import sys
import time

delay = float(os.environ.get("BLOCKLIN_TEST_DELAY", "0"))
if delay > 0:
    import blocklin.device.stream as stream
    import blocklin.storage.atomic as atomic

    _check, _mark = stream.check_cancelled, atomic.AtomicOutput.mark_done

    def slow_check() -> None:
        time.sleep(delay)
        _check()

    def slow_mark(self, unit: str) -> None:
        time.sleep(delay)
        _mark(self, unit)

    stream.check_cancelled = slow_check
    atomic.AtomicOutput.mark_done = slow_mark

from blocklin.cli.main import main  # noqa: E402

sys.exit(main(sys.argv[1:]))
