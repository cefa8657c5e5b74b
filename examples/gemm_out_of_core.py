"""Multiply two matrices larger than the memory budget, out of core, and check sampled rows.

    python examples/gemm_out_of_core.py [n] [budget]

By default two 4096 x 4096 float64 matrices (128 MiB each) are multiplied within a budget of half
of one operand (64 MiB), so neither operand ever sits in memory whole; the planner's minimum is used
instead if that budget cannot hold its smallest tiles (it names it before anything is written). ``BLOCKLIN_EXAMPLE_SIZE=small`` runs a 2048 x 2048
version (the test suite does). Everything is written under a temporary folder that is removed at
the end, the engine's own intermediates included (``temp_dir``).
"""

import os
import sys
import tempfile

import numpy as np

import blocklin as bl

small = os.environ.get("BLOCKLIN_EXAMPLE_SIZE") == "small"
n = int(sys.argv[1]) if len(sys.argv) > 1 else (2048 if small else 4096)

with tempfile.TemporaryDirectory() as d, bl.config.set(temp_dir=d):
    # 1. Data in: random operands written chunk row by chunk row (1024 x 1024 chunks of 8 MiB).
    a = bl.random(f"{d}/A.zarr", (n, n), seed=1)
    b = bl.random(f"{d}/B.zarr", (n, n), seed=2)
    # The budget: half of one operand (neither fits), or the planner's own minimum when that is more.
    budget = bl.config.parse_size(sys.argv[2]) if len(sys.argv) > 2 else a.nbytes // 2
    try:
        plan = bl.matmul(a, b, memory=budget, explain=True)
    except bl.errors.BudgetError as exc:
        print(f"{bl.config.format_size(budget)} cannot hold the smallest tiles; using the planner's minimum")
        budget = exc.minimum
        plan = bl.matmul(a, b, memory=budget, explain=True)
    print(f"A, B: {n} x {n} float64, {a.nbytes / 2**20:.0f} MiB each on disk, chunks {a.chunks}, "
          f"budget {bl.config.format_size(budget)}")

    # 2. The plan, without running: tiles, k-panels, bytes read, planned peak memory.
    print(plan.explain())

    # 3. The product, written to C.zarr (appears only when complete).
    c = bl.matmul(a, b, f"{d}/C.zarr", memory=budget)

    # 4. Check: a few rows against NumPy, within Higham's bound for dot products of length n,
    #    |error| <= 2 * gamma_n * (|A| @ |B|) with gamma_n = n*eps / (1 - n*eps).
    #    B is read in 1024-column blocks, so the check stays within the budget too.
    rows = np.sort(np.random.default_rng(0).choice(n, size=3, replace=False))
    a_rows = a.zarr.get_orthogonal_selection((rows, slice(None)))
    eps = np.finfo(np.float64).eps
    ref, bound = np.empty((3, n)), np.empty((3, n))
    for j in range(0, n, 1024):
        block = b[:, j:j + 1024]
        ref[:, j:j + 1024] = a_rows @ block
        bound[:, j:j + 1024] = 2 * n * eps / (1 - n * eps) * (np.abs(a_rows) @ np.abs(block))
    err = np.abs(c.zarr.get_orthogonal_selection((rows, slice(None))) - ref)
    worst = float((err / bound).max())
    print(f"check: rows {rows.tolist()} match NumPy, max error {err.max():.2e} "
          f"({worst:.1e} of the rounding-error bound)")
    if worst > 1:
        sys.exit("check failed: the product differs from NumPy beyond rounding error")

    # 5. What it cost.
    r = c.report
    print(f"cost: {r['seconds']:.2f} s, {r['gflops']:.1f} GFLOP/s, read {r['plan']['bytes_read'] / 2**20:.0f} MiB "
          f"from storage, "
          f"planned peak {r['plan']['peak_memory'] / 2**20:.0f} MiB of {bl.config.format_size(budget)}, "
          f"process peak RSS {r['peak_memory'] / 2**20:.0f} MiB (interpreter and libraries included)")
