"""Peak memory of out-of-core work over zstd chunks decoded on the pool (rawchunks.DecodedChunks)
stays within the budget (subprocess peak RSS, as tests/products/test_gemm_memory.py measures it): the pool's
encoded and decoded chunk buffers never exceed the chunk temporaries the plans count for zarr."""

from __future__ import annotations

import numpy as np
import zarr

from support.memcheck import GEMM_CHILD as CHILD, margin, needs_hwm, run_child


def _zstd(path, n, seed):
    z = zarr.create_array(str(path), shape=(n, n), chunks=(256, 256), dtype="float64",
                          compressors=zarr.codecs.ZstdCodec(level=1), zarr_format=3)
    rng = np.random.default_rng(seed)
    for r0 in range(0, n, 256):
        z[r0:r0 + 256] = rng.standard_normal((256, n))
    return path


@needs_hwm
def test_gemm_over_zstd_chunks_peak_within_budget(tmp_path):
    n = 3072  # each operand 72 MiB decoded: 3x the budget
    a, b = _zstd(tmp_path / "a.zarr", n, 1), _zstd(tmp_path / "b.zarr", n, 2)
    budget = 24 * 2**20
    r = run_child(CHILD, str(a), str(b), str(tmp_path / "c.zarr"), "24MiB")
    used = r["peak"] - r["baseline"]
    assert r["plan_peak"] <= budget and r["tasks"] > 1
    assert used <= budget + margin(budget), f"used {used / 2**20:.1f} MiB over baseline, budget 24 MiB"
