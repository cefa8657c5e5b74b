"""GPU planning: the compute/transfer crossover in the GEMM planner (no device needed)."""

from __future__ import annotations

import pytest

from blocklin.plan.gemm import plan_gemm
from blocklin.plan.gpu import crossover_tile, intensity, shortfall, transfer_bound

GIB = 1 << 30


def test_crossover_of_an_h200_over_pcie():
    # 67 TFLOP/s over 55 GB/s: square tiles of peak/link x itemsize elements
    assert crossover_tile("float64") == pytest.approx(67e12 / 55e9 * 8, abs=1)
    assert crossover_tile("float32") == pytest.approx(67e12 / 55e9 * 4, abs=1)
    assert crossover_tile("float32", precision="tf32") > 7 * crossover_tile("float32")
    t = crossover_tile("float64")
    assert not transfer_bound(t, t, "float64") and transfer_bound(t // 2, t // 2, "float64")
    assert shortfall(t, t, "float64") == 0.0
    assert shortfall(t // 2, t // 2, "float64") == pytest.approx(0.5, abs=1e-3)


@pytest.mark.parametrize("workers", [8, 16])
def test_gpu_plan_prefers_tiles_above_the_crossover(workers):
    """With several tasks per GPU the cheapest tiling by bytes read splits the output into many small
    tiles (transfer-bound); the GPU planner takes the largest tiles towards the crossover that fit."""
    kw = dict(a_chunks=(4096, 4096), b_chunks=(4096, 4096), memory=64 * GIB, workers=workers)
    cpu = plan_gemm(16384, 16384, 65536, "float64", **kw)
    gpu = plan_gemm(16384, 16384, 65536, "float64", device="gpu", device_memory=60 * GIB, **kw)
    assert intensity(gpu.tm, gpu.tn, 8) > intensity(cpu.tm, cpu.tn, 8)
    assert gpu.device_peak <= 60 * GIB and gpu.peak_memory <= 64 * GIB
    if workers == 8:  # room for tiles above the crossover for all 8 tasks
        assert not transfer_bound(gpu.tm, gpu.tn, "float64")
        assert transfer_bound(cpu.tm, cpu.tn, "float64")


def test_gpu_plan_within_a_small_device_budget_stays_within_it():
    p = plan_gemm(40960, 40960, 40960, "float64", a_chunks=(4096, 4096), b_chunks=(4096, 4096), memory=64 * GIB,
                  workers=4, device="gpu", device_memory=6 * GIB)
    assert p.device_peak <= 6 * GIB
    assert transfer_bound(p.tm, p.tn, "float64")  # 6 GiB for 4 tasks cannot hold 10k tiles: explain says so
    assert "compute-bound from" in p.explain()
