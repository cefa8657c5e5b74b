"""Peak memory of the tiled factorizations of an input whose chunks zarr decodes whole (zstd chunks
larger than the tiles): the temporaries of each tile or panel read are counted in the plan.

Found by a randomized search of peak RSS against the budget: a 3072 x 3072 float64 matrix in zstd
chunks of 1536 x 1536 (18 MiB each) peaked at 138 MiB above the baseline for a Cholesky at a 48 MiB
budget (plan 48 MiB), 84 MiB for an LU at 32 MiB (plan 28 MiB): every 512-tile read decoded a whole
chunk, which the plans did not count (:func:`blocklin.plan.chunks.chunk_io`).
"""

from __future__ import annotations

import re

import numpy as np
import pytest

import blocklin as bl
from blocklin.errors import BudgetError
from blocklin.plan.factor import plan_factor, plan_lu, plan_qr
from support.memcheck import margin, needs_hwm, run_child

CHILD = """
    import numpy as np, blocklin as bl
    op, a_path, out, memory = sys.argv[1:5]
    bl.open(a_path)[0:1, 0:1]
    import dask.threaded  # noqa: F401  (imported by the run anyway; part of the baseline)
    import scipy.linalg  # noqa: F401
    f = getattr(bl, op)
    warm((lambda x, memory: f(x @ x.T + 300 * np.eye(300), memory=memory)) if op == "cholesky" else f)
    reset_hwm()
    base = hwm()
    r = f(a_path, out, memory=memory)
    print(json.dumps({"baseline": base, "peak": hwm(), "plan_peak": r.report["plan"]["peak_memory"]}))
"""


@pytest.fixture(scope="module")
def spd_zstd(tmp_path_factory):
    import zarr

    n = 3072
    s = np.random.default_rng(1).standard_normal((n, n))
    s = (s + s.T) / 2
    s[np.diag_indices(n)] += 100.0  # SPD
    path = tmp_path_factory.mktemp("decoded") / "s.zarr"
    zarr.create_array(path, shape=(n, n), chunks=(1536, 1536), dtype="float64")[:] = s  # zstd, zarr's default
    return str(path)


@needs_hwm
@pytest.mark.slow
@pytest.mark.parametrize("op", ["cholesky", "lu"])
def test_factorization_of_large_compressed_chunks_within_budget(spd_zstd, op, tmp_path):
    budget = 64 * 2**20
    r = run_child(CHILD, op, spd_zstd, str(tmp_path / "f.zarr"), "64MiB")
    used = r["peak"] - r["baseline"]
    assert r["plan_peak"] <= budget
    assert used <= budget + margin(budget), f"{op}: used {used / 2**20:.1f} MiB over baseline, budget 64 MiB"


@pytest.mark.parametrize("op", ["cholesky", "lu", "qr"])
def test_a_budget_below_one_decoded_chunk_is_refused_with_the_fix(spd_zstd, op, tmp_path):
    """Below the temporaries of one decoded chunk (3 x 18 MiB) no tile fits: refused up front, naming the
    least budget and rechunking as the fix (blocklin convert --chunks)."""
    with pytest.raises(BudgetError, match=r"temporaries of the input's chunks, decoded whole.*rechunk the input"):
        getattr(bl, op)(spd_zstd, tmp_path / "f.zarr", memory="32MiB")


PLANS = {"cholesky": lambda n, **kw: plan_factor("cholesky", n, "float64", **kw),
         "lu": lambda n, **kw: plan_lu(n, "float64", **kw),
         "qr": lambda n, **kw: plan_qr(2 * n, n, "float64", **kw)}


@pytest.mark.parametrize("op", ["cholesky", "lu", "qr"])
@pytest.mark.parametrize("case", ["narrower than a tile", "small chunks", "large chunks"])
def test_a_refusal_names_the_least_budget_of_any_tile_side(op, case):
    """A refused budget names the least of any tile side, with the side it is the need of and the temporaries
    of the input's decoded chunks only where they count in it: a matrix narrower than the smallest side had
    been said to need tiles of 32, and chunks whose temporaries a tile's own buffers hold (8 x 8) had been
    named, with rechunking as the fix, where a larger budget is the only one. The least budget plans."""
    n, decoded = {"narrower than a tile": (20, None), "small chunks": (300, (8, 8, 8)),
                  "large chunks": (3072, (1536, 1536, 8))}[case]
    with pytest.raises(BudgetError) as info:
        PLANS[op](n, memory=1024, decoded=decoded)
    msg = str(info.value)
    side = min(n, 32)
    assert re.search(rf"of \d+ x {side} ", msg) and "that needs the least" in msg, msg
    counted = case == "large chunks"
    assert ("temporaries of the input's chunks, decoded whole" in msg) == counted, msg
    assert ("rechunk the input smaller" in msg) == counted, msg
    assert PLANS[op](n, memory=info.value.minimum, decoded=decoded).tile == side
