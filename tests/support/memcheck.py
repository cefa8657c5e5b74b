"""Shared harness for the subprocess peak-memory tests.

A child process runs the given code after a prelude that defines ``hwm()`` (the kernel's
high-water mark of resident memory, VmHWM), ``reset_hwm()``, ``warm(op)`` (warm-up before a
strict baseline) and ``warm_blas()`` (its BLAS part: the work buffers of concurrent callers); the child
prints one JSON line,
which :func:`run_child` returns. The allowed peak above the child's baseline is the budget plus
:func:`margin` (10% of the budget + 24 MiB for allocator slack, thread stacks and Python objects).
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

PRELUDE = textwrap.dedent("""
    import json, sys
    def hwm():
        for line in open('/proc/self/status'):
            if line.startswith('VmHWM'):
                return int(line.split()[1]) * 1024
    def reset_hwm():
        open('/proc/self/clear_refs', 'w').write('5')
    def warm_blas(own_threads=False):
        # the BLAS work buffers of full-size products made by two tasks at once (the host BLAS runs
        # without the GIL, so each concurrent caller gets its own buffer: once per process, as the
        # thread pools; blocklin.device.host_blas); own_threads: also those of OpenBLAS's own threads,
        # for an operation whose tasks run alone on all the cores (Job.run's blas_threads: the LU panels)
        import os
        import threading
        import numpy as np
        from blocklin._blas import blas_threads
        from blocklin.device import host_blas
        from blocklin.plan.passes import PASS_WORKERS
        def product(dt):
            a = np.asfortranarray(np.random.default_rng(3).standard_normal((1024, 1024)).astype(dt))
            host_blas.gemm(1.0, a, a, beta=0.0, c=np.zeros((1024, 1024), dt, order="F"))
            host_blas.syrk(1.0, a, beta=0.0, c=np.zeros((1024, 1024), dt, order="F"))
        def both():
            for dt in ("float64", "float32", "complex128", "complex64"):
                product(dt)
        with blas_threads(1):
            ths = [threading.Thread(target=both) for _ in range(PASS_WORKERS)]
            [t.start() for t in ths]
            [t.join() for t in ths]
        if own_threads:
            with blas_threads(os.cpu_count() or 1):
                both()
    def warm(op):
        # before a strict baseline: one small out-of-core call of the operation (its threads and
        # imports), then BLAS and LAPACK work buffers of full-size calls
        import numpy as np
        import dask.threaded  # noqa: F401
        op(np.random.default_rng(1).standard_normal((300, 300)), memory="1MiB")
        g = np.random.default_rng(2).standard_normal((1024, 1024))
        np.linalg.inv(g @ g)
        warm_blas()
""")


def _can_reset_hwm() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


#: Skip marker for systems without a resettable high-water mark.
needs_hwm = pytest.mark.skipif(sys.platform != "linux" or not _can_reset_hwm(),
                               reason="needs Linux /proc high-water mark")


def margin(budget: int) -> float:
    return 0.10 * budget + 24 * 2**20


def run_child(code: str, *args: str, timeout: int = 300) -> dict:
    """Run ``PRELUDE + code`` with ``args`` in a fresh interpreter; return its last JSON line."""
    proc = subprocess.run([sys.executable, "-c", PRELUDE + textwrap.dedent(code), *args], capture_output=True,
                          text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


#: A child that runs one out-of-core GEMM (argv: A, B, OUT, memory[, precision]) and prints its
#: baseline, peak, planned peak and task count (tests/products/test_gemm_memory.py and the decoded-chunk
#: memory test).
GEMM_CHILD = """
    import blocklin as bl
    a_path, b_path, out, memory = sys.argv[1:5]
    precision = sys.argv[5] if len(sys.argv) > 5 else None
    bl.open(a_path)[0:1, 0:1]
    import dask.threaded  # noqa: F401  (imported by the run anyway; part of the baseline)
    base = hwm()
    reset_hwm()
    c = bl.matmul(a_path, b_path, out, memory=memory, precision=precision)
    print(json.dumps({"baseline": base, "peak": hwm(), "plan_peak": c.report["plan"]["peak_memory"],
                      "tasks": c.report["tasks"]}))
"""
