"""Peak memory of an out-of-core GEMM stays within its budget (subprocess peak RSS).

The child measures its own baseline (interpreter, NumPy, zarr, Dask, blocklin imported and one
store opened), resets the kernel's high-water mark, runs a GEMM whose operands are each several
times the budget, and reports the new high-water mark. Allowed: budget + baseline + margin, where
the margin (10% of the budget + 24 MiB) covers allocator slack, thread stacks and Python objects.
"""

from __future__ import annotations

import pytest

import blocklin as bl
from support.memcheck import GEMM_CHILD as CHILD, margin, needs_hwm, run_child


@needs_hwm
# 48 MiB (the same plan with larger tiles) in the slow job
@pytest.mark.parametrize("memory_mib, precision", [(24, None), pytest.param(48, None, marks=pytest.mark.slow),
                                                   (24, "float32")])
def test_gemm_peak_within_budget(tmp_path, memory_mib, precision):
    """``precision="float32"``: float64 operands cast to float32 tiles, strips cast back (the plan
    counts the cast panels and the two output-dtype strips)."""
    n = 3072  # each operand 72 MiB: 1.5x to 3x the budget
    a = bl.random(tmp_path / "a.zarr", (n, n), seed=1, chunks=(256, 256))
    b = bl.random(tmp_path / "b.zarr", (n, n), seed=2, chunks=(256, 256))
    budget = memory_mib * 2**20
    assert a.nbytes >= 1.5 * budget
    r = run_child(CHILD, a.path, b.path, str(tmp_path / "c.zarr"), f"{memory_mib}MiB",
                  *([precision] if precision else []))
    used = r["peak"] - r["baseline"]
    assert r["plan_peak"] <= budget
    assert r["tasks"] > 1
    assert used <= budget + margin(budget), f"used {used / 2**20:.1f} MiB over baseline, budget {memory_mib} MiB"


@needs_hwm
def test_thin_product_peak_within_budget(tmp_path):
    """A thin product (``B`` 512 x 8) takes the row-pass route: strips of ``A`` (uncompressed, read
    straight into the slots), ``B`` held, each strip's product written; the peak stays within the
    budget with ``B`` and the output's writes counted."""
    import numpy as np

    a = bl.random(tmp_path / "a.zarr", (98304, 512), seed=1, chunks=(2048, 512))  # 384 MiB: 16x the budget
    bl.from_array(np.random.default_rng(2).standard_normal((512, 8)), tmp_path / "b.zarr", chunks=(512, 8))
    budget = 24 * 2**20
    child = CHILD.replace('"tasks": c.report["tasks"]', '"tasks": c.report["tasks"], "route": c.report.get("route")')
    r = run_child(child, a.path, str(tmp_path / "b.zarr"), str(tmp_path / "c.zarr"), "24MiB")
    used = r["peak"] - r["baseline"]
    assert r["route"] == "rows" and r["plan_peak"] <= budget and r["tasks"] > 1
    assert used <= budget + margin(budget), f"used {used / 2**20:.1f} MiB over baseline, budget 24 MiB"


@needs_hwm
@pytest.mark.parametrize("c_codec", ["none", "zstd"])
def test_gemm_with_c_peak_within_budget(tmp_path, c_codec):
    """``A B + beta C`` with ``A`` and ``B`` read straight from their chunk files: ``C``'s strips are read
    through zarr where compressed, and the plan counts those temporaries at ``C``'s chunk size (a plan
    that counted none for ``A`` and ``B`` once a ``C`` was given had chosen tiles a third smaller)."""
    import zarr

    n = 3072
    a = bl.random(tmp_path / "a.zarr", (n, n), seed=1, chunks=(256, 256))
    b = bl.random(tmp_path / "b.zarr", (n, n), seed=2, chunks=(256, 256))
    c = bl.random(tmp_path / "c0.zarr", (n, n), seed=3, chunks=(256, 256))
    c_path = c.path
    if c_codec == "zstd":
        z = zarr.create_array(tmp_path / "cz.zarr", shape=(n, n), chunks=(256, 256), dtype="float64")  # zstd
        z[:] = c.to_numpy()
        c_path = str(tmp_path / "cz.zarr")
    child = CHILD.replace("precision=precision)", "precision=precision, c=sys.argv[5], beta=0.5)").replace(
        "precision = sys.argv[5] if len(sys.argv) > 5 else None", "precision = None")
    budget = 24 * 2**20
    r = run_child(child, a.path, b.path, str(tmp_path / "out.zarr"), "24MiB", c_path)
    used = r["peak"] - r["baseline"]
    assert r["plan_peak"] <= budget and r["tasks"] > 1
    assert used <= budget + margin(budget), f"used {used / 2**20:.1f} MiB over baseline, budget 24 MiB"


@needs_hwm
def test_gemm_of_a_compressed_and_a_direct_operand_within_budget(tmp_path):
    """``A`` in zstd chunks of 512 x 128 (read through zarr, its temporaries counted at its chunk size)
    times ``B`` read straight from its files: the plan counts the temporaries of ``A``'s chunks alone (it
    had counted them at the larger of the two operands' chunks), and the peak stays within the budget."""
    import zarr

    n = 3072
    src = bl.random(tmp_path / "a0.zarr", (n, n), seed=1, chunks=(512, 512))
    z = zarr.create_array(tmp_path / "a.zarr", shape=(n, n), chunks=(512, 128), dtype="float64")  # zstd
    z[:] = src.to_numpy()
    b = bl.random(tmp_path / "b.zarr", (n, n), seed=2, chunks=(512, 512))
    budget = 24 * 2**20
    r = run_child(CHILD, str(tmp_path / "a.zarr"), b.path, str(tmp_path / "c.zarr"), "24MiB")
    used = r["peak"] - r["baseline"]
    assert r["plan_peak"] <= budget and r["tasks"] > 1
    assert used <= budget + margin(budget), f"used {used / 2**20:.1f} MiB over baseline, budget 24 MiB"


@needs_hwm
@pytest.mark.slow
def test_gemm_with_c_in_larger_chunks_than_compressed_operands_within_budget(tmp_path):
    """``A`` and ``B`` in zstd chunks of 256 x 256, ``C`` in zstd chunks of 1536 x 1536 (18 MiB): each
    strip of ``C`` decodes whole chunks of ``C``, counted beside the panel reads' temporaries. They had
    been counted beside directly read ``A`` and ``B`` only: the plan said 63 MiB and the run peaked at
    110 MiB above the baseline at a 64 MiB budget."""
    import numpy as np
    import zarr

    n = 3072
    paths = []
    for name, chunk in (("a", 256), ("b", 256), ("c", 1536)):
        z = zarr.create_array(tmp_path / f"{name}.zarr", shape=(n, n), chunks=(chunk, chunk), dtype="float64")
        z[:] = np.random.default_rng(len(paths)).standard_normal((n, n))  # zstd, zarr's default
        paths.append(str(tmp_path / f"{name}.zarr"))
    child = CHILD.replace("precision=precision)", "precision=precision, c=sys.argv[5], beta=0.5)").replace(
        "precision = sys.argv[5] if len(sys.argv) > 5 else None", "precision = None")
    budget = 64 * 2**20
    r = run_child(child, paths[0], paths[1], str(tmp_path / "out.zarr"), "64MiB", paths[2])
    used = r["peak"] - r["baseline"]
    assert r["plan_peak"] <= budget and r["tasks"] > 1
    assert used <= budget + margin(budget), f"used {used / 2**20:.1f} MiB over baseline, budget 64 MiB"
