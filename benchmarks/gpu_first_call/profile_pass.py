"""Passes of ``benchmarks/feed.py``'s null kernel over one stored operand, repeated, for a sampling
profiler to watch (``py-spy record ... -- python3 profile_pass.py DIR``): where a pass's time goes on
a machine of many cores.

``python3 benchmarks/gpu_first_call/profile_pass.py SCRATCH_DIR [cpu|gpu] [first|later] [FRACTION]``:
a 1 GiB uncompressed operand (``benchmarks/feed.py``'s) in SCRATCH_DIR, then for about ``SECONDS``
(10 by default) passes at a budget of FRACTION of the operand (``1/16``), each a job's first pass or a
later pass of one job; prints each pass's GB/s.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
import tempfile
import time
from fractions import Fraction
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
spec = importlib.util.spec_from_file_location("feed", ROOT / "benchmarks" / "feed.py")
feed = importlib.util.module_from_spec(spec)
spec.loader.exec_module(feed)

scratch = sys.argv[1]
device = sys.argv[2] if len(sys.argv) > 2 else "cpu"
later = (sys.argv[3] if len(sys.argv) > 3 else "later") == "later"
fraction = Fraction(sys.argv[4] if len(sys.argv) > 4 else "1/16")
seconds = float(os.environ.get("SECONDS_", "10"))
work = tempfile.mkdtemp(prefix="blocklin-profile-", dir=scratch)
try:
    m, n = 262144, 512
    path = os.path.join(work, "a.zarr")
    feed.make(path, m, n, 2048, "none")
    feed.raw_read(feed.chunk_files(path), os.cpu_count() or 1, 2048 * n * 8, "none")
    budget = int(m * n * 8 * fraction)
    t_end = time.perf_counter() + seconds
    while time.perf_counter() < t_end:
        t0 = time.perf_counter()
        r = feed.blocklin_feed(path, budget, device, later=later)
        t = r.pop("seconds", time.perf_counter() - t0)
        print(f"{device} {'later' if later else 'first'} pass: {m * n * 8 / t / 1e9:.2f} GB/s {r}", flush=True)
finally:
    shutil.rmtree(work, ignore_errors=True)
