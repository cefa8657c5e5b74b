"""blocklin._memory: the allocator settings around loops that reuse their temporaries."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

_CODE = textwrap.dedent("""
    import json, resource, sys
    import numpy as np
    import blocklin
    from blocklin import _memory

    def faults(n):
        # 1 MiB arrays (below NumPy's 4 MiB huge-page advice): each mapping faults in 256 pages
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        for _ in range(n):
            a = np.ones(1 << 17)
            del a
        return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before

    outside = faults(40)
    with _memory.reused_allocations(1 << 30):  # arrays up to 16 MiB reused
        with _memory.reused_allocations(1 << 30):  # nested: the inner exit leaves the setting on
            pass
        inside = faults(40)
    after = faults(40)
    with _memory.reused_allocations(32 << 20):  # a 32 MiB budget: arrays up to 512 KiB only
        small_budget = faults(40)
    print(json.dumps({"tuned": bool(_memory._tuned), "outside": outside, "inside": inside, "after": after,
                      "small_budget": small_budget}))
""")


def _run(env_extra: dict) -> dict:
    env = {**os.environ, **env_extra}
    proc = subprocess.run([sys.executable, "-c", _CODE], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc and the kernel's fault counts")
def test_reused_allocations_take_no_new_pages_and_restore_the_threshold():
    """Inside, a freed 1 MiB array's pages serve the next one (no page faults); outside, before and after,
    each is a fresh mapping the kernel faults in (the threshold tune() set is back), and so where the
    budget's 1/64 is below the array's size."""
    r = _run({"BLOCKLIN_MALLOC_TUNING": "1"})
    if not r["tuned"]:
        pytest.skip("malloc not tunable here (not glibc)")
    assert r["outside"] >= 40 * 200 and r["after"] >= 40 * 200 and r["small_budget"] >= 40 * 200, r
    assert r["inside"] <= 40 * 20, r


def test_reused_allocations_leave_an_untuned_malloc_alone():
    r = _run({"BLOCKLIN_MALLOC_TUNING": "0"})
    assert not r["tuned"]
