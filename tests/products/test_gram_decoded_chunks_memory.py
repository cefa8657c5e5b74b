"""Peak memory of the Gram's tiled route over an input whose chunks zarr decodes whole (zstd chunks of
whole columns, 4096 x 256, 8 MiB): each slice read decodes the chunks it touches, counted in the plan
(:func:`blocklin.plan.chunks.chunk_io`), with smaller tiles where they touch fewer. Found by a randomized
search of peak RSS: 77-88 MiB above the baseline at a 48 MiB budget (plan 36 MiB)."""

from __future__ import annotations

import numpy as np
import pytest

from support.memcheck import margin, needs_hwm, run_child

CHILD = """
    import numpy as np, blocklin as bl
    a_path, out, memory = sys.argv[1:4]
    bl.open(a_path)[0:1, 0:1]
    import dask.threaded  # noqa: F401  (imported by the run anyway; part of the baseline)
    warm(bl.gram)
    reset_hwm()
    base = hwm()
    g = bl.gram(a_path, out, memory=memory)
    print(json.dumps({"baseline": base, "peak": hwm(), "plan_peak": g.report["plan"]["peak_memory"],
                      "route": g.report["route"]}))
"""


@needs_hwm
@pytest.mark.slow
def test_gram_tiles_of_whole_column_zstd_chunks_within_budget(tmp_path):
    import zarr

    a = np.random.default_rng(2).standard_normal((4096, 3072))
    zarr.create_array(tmp_path / "a.zarr", shape=a.shape, chunks=(4096, 256), dtype="float64")[:] = a  # zstd
    budget = 48 * 2**20
    r = run_child(CHILD, str(tmp_path / "a.zarr"), str(tmp_path / "g.zarr"), "48MiB")
    used = r["peak"] - r["baseline"]
    assert r["route"] == "tiles" and r["plan_peak"] <= budget
    assert used <= budget + margin(budget), f"used {used / 2**20:.1f} MiB over baseline, budget 48 MiB"
