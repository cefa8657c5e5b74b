"""Multiply two matrices larger than the memory budget, out of core, and check a few rows.

    python examples/gemm_out_of_core.py [n] [budget]
"""

import sys
import tempfile

import numpy as np

import blocklin as bl

n = int(sys.argv[1]) if len(sys.argv) > 1 else 4096
budget = sys.argv[2] if len(sys.argv) > 2 else "64MiB"

with tempfile.TemporaryDirectory() as d:
    a = bl.random(f"{d}/A.zarr", (n, n), seed=1)
    b = bl.random(f"{d}/B.zarr", (n, n), seed=2)
    print(bl.matmul(a, b, memory=budget, explain=True).explain())
    c = bl.matmul(a, b, f"{d}/C.zarr", memory=budget, progress=True)
    r = c.report
    print(f"{r['seconds']:.2f} s, {r['gflops']:.1f} GFLOP/s, peak RSS {r['peak_memory'] / 2**20:.0f} MiB")
    rows = a[:3, :] @ b.to_numpy()
    print("max error on 3 rows:", np.abs(c[:3, :] - rows).max())
