"""The ``blocklin`` command with every streamed item and finished unit delayed (tests only).

``python tests/support/slow_cli.py ARGS...`` runs ``blocklin ARGS...`` with two test hooks patched in (the
product code is unchanged):

* ``BLOCKLIN_TEST_DELAY`` (seconds, default 0) is slept before each item a tile stream reads and
  before each resume marker, so the run is still writing when a signal test reaches it;
* ``BLOCKLIN_TEST_MARK`` (a path) is created when the ``BLOCKLIN_TEST_MARK_AFTER``-th such item
  (default 2) starts, just before its delay, and touched again as each later one starts: a test that
  waits for that file and then sends a signal reaches the run mid-way, deterministically, however fast
  the machine is (and one that removes it waits for the next item).
"""

import os
import sys
import threading
import time

delay = float(os.environ.get("BLOCKLIN_TEST_DELAY", "0"))
mark = os.environ.get("BLOCKLIN_TEST_MARK")
mark_after = int(os.environ.get("BLOCKLIN_TEST_MARK_AFTER", "2"))
if delay > 0 or mark:
    import blocklin.device.stream as stream
    import blocklin.runtime.blockops as blockops
    import blocklin.runtime.tiles as tiles
    import blocklin.storage.atomic as atomic
    import blocklin.storage.convert as convert

    _check, _mark = stream.check_cancelled, atomic.mark_done
    _lock, _count = threading.Lock(), [0]

    def _tick() -> None:
        with _lock:
            _count[0] += 1
            if mark and _count[0] >= mark_after:
                open(mark, "w").close()
        time.sleep(delay)

    def slow_check() -> None:
        _tick()
        _check()

    def slow_mark(done, unit: str) -> None:
        _tick()
        _mark(done, unit)

    stream.check_cancelled = slow_check
    for module in (atomic, blockops, tiles, convert):  # each imported mark_done by name
        module.mark_done = slow_mark

from blocklin.cli.main import main  # noqa: E402

sys.exit(main(sys.argv[1:]))
