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


@needs_hwm
def test_thin_product_with_two_loaders_peak_within_budget(tmp_path):
    """A thin product over zstd chunks on the tiles plans two loaders (each decoding a panel); its peak
    stays within the budget with both loaders' panels and chunk buffers. matmul's own route for it, the
    thin product's row pass, stays within it too."""
    rng = np.random.default_rng(5)
    a = zarr.create_array(str(tmp_path / "a.zarr"), shape=(49152, 256), chunks=(1024, 256), dtype="float64",
                          compressors=zarr.codecs.ZstdCodec(level=1), zarr_format=3)
    for r0 in range(0, 49152, 8192):
        a[r0:r0 + 8192] = rng.standard_normal((8192, 256))
    b = zarr.create_array(str(tmp_path / "b.zarr"), shape=(256, 4), chunks=(256, 4), dtype="float64", zarr_format=3)
    b[...] = rng.standard_normal((256, 4))
    budget = 20 * 2**20  # the operand is 96 MiB
    child = CHILD.replace('"tasks": c.report["tasks"]', '"tasks": c.report["tasks"], '
                          '"loaders": c.report["plan"].get("loaders", 1), "route": c.report.get("route")')
    tiles = child.replace("import blocklin as bl", "import blocklin as bl\n"
                          "    import blocklin.linalg.products.thin as thin\n"
                          "    thin.THIN_MAX_COLUMNS = 0  # the tiles this test is about")
    r = run_child(tiles, str(tmp_path / "a.zarr"), str(tmp_path / "b.zarr"), str(tmp_path / "c.zarr"), "20MiB")
    used = r["peak"] - r["baseline"]
    assert r["loaders"] == 2 and r["plan_peak"] <= budget and r["route"] is None
    assert used <= budget + margin(budget), f"used {used / 2**20:.1f} MiB over baseline, budget 20 MiB"
    # the same product by matmul's own choice: the thin route's row pass, within the same budget
    r = run_child(child, str(tmp_path / "a.zarr"), str(tmp_path / "b.zarr"), str(tmp_path / "d.zarr"), "20MiB")
    used = r["peak"] - r["baseline"]
    assert r["route"] == "rows" and r["plan_peak"] <= budget
    assert used <= budget + margin(budget), f"thin route used {used / 2**20:.1f} MiB over baseline, budget 20 MiB"
