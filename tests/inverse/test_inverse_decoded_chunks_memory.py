"""Peak memory of the inverse's row passes over an input whose chunks zarr decodes whole (zstd chunks
taller than the strips): the temporaries of each strip's read are counted in the pass's plan.

Found by a randomized search of peak RSS against the budget: a 3072 x 3072 float64 matrix in zstd
chunks of 1536 x 1536 (18 MiB each) peaked at 101 MiB above the baseline for an inverse at 57 MiB
(plan 56.4 MiB), 139 MiB at 96 MiB: its residual probe, a row pass planned without the chunks'
temporaries, decoded the two chunks of each strip's rows at once beside its strips.
"""

from __future__ import annotations

import numpy as np
import pytest

from blocklin.errors import BudgetError
from blocklin.plan.chunks import chunk_io
from blocklin.plan.passes import PassMemory, plan_pass
from support.memcheck import margin, needs_hwm, run_child

MiB = 2**20

CHILD = """
    import numpy as np, blocklin as bl
    a_path, out, memory = sys.argv[1:4]
    bl.open(a_path)[0:1, 0:1]
    import dask.threaded  # noqa: F401  (imported by the run anyway; part of the baseline)
    import scipy.linalg  # noqa: F401
    warm(bl.inv)
    reset_hwm()
    base = hwm()
    r = bl.inv(a_path, out=out, memory=memory).report
    print(json.dumps({"baseline": base, "peak": hwm(), "plan_peak": r["plan"]["peak_memory"],
                      "method": r["method"], "eta": r["backward_error"]}))
"""


@pytest.fixture(scope="module")
def zstd_matrix(tmp_path_factory):
    import zarr

    n = 3072
    a = np.random.default_rng(1).standard_normal((n, n))
    a[np.diag_indices(n)] += 100.0  # well conditioned
    path = tmp_path_factory.mktemp("decoded") / "a.zarr"
    zarr.create_array(path, shape=(n, n), chunks=(1536, 1536), dtype="float64")[:] = a  # zstd, zarr's default
    return str(path)


@needs_hwm
@pytest.mark.slow
def test_inverse_of_large_compressed_chunks_within_budget(zstd_matrix, tmp_path):
    budget = 96 * MiB
    r = run_child(CHILD, zstd_matrix, str(tmp_path / "x.zarr"), "96MiB")
    used = r["peak"] - r["baseline"]
    assert r["plan_peak"] <= budget and r["method"] == "lu" and r["eta"] < 1e-14
    assert used <= budget + margin(budget), f"used {used / MiB:.1f} MiB over baseline, budget 96 MiB"


# the residual probe's declaration for n = 3072 (blocklin.linalg.inverse.kernels._probe_memory)
PROBE = PassMemory(fixed=3 * 3072 * 32 * 8, per_row=(3072 + 3 * 32) * 8)
DECODED = (1536, 1536, 8)


def _plan(mem: PassMemory, memory: int):
    return plan_pass(mem, 3072, 3072 * 8, chunk_rows=1536, memory=memory, chunk_bytes=1536 * 1536 * 8,
                     chunks_across=2, decoded=DECODED, decoded_width=3072)


@pytest.mark.parametrize("declared", [False, True])
@pytest.mark.parametrize("mib", [57, 64, 96, 128, 256, 512])
def test_row_pass_counts_the_temporaries_of_its_decoded_reads(declared, mib):
    """Whether or not the kernel declares chunk temporaries, the plan holds those of its strip's reads
    (two chunks across, or one at a time where the budget holds one) within the budget."""
    mem = PassMemory(PROBE.fixed, PROBE.per_row, chunk_temporaries=declared)
    p = _plan(mem, mib * MiB)
    read = min(3072, p.lanes * 1536) if p.lanes else 3072
    temporaries = chunk_io(p.strip, read, DECODED, (3072, 3072), 0)
    assert p.fixed_bytes >= PROBE.fixed + temporaries
    assert p.peak_memory <= mib * MiB
    # two chunks decoded at once (108 MiB of temporaries) only where their strips are as tall as one chunk at
    # a time gives (768 rows from 192 MiB)
    assert (p.lanes == 1) == (mib < 192)


def test_row_pass_strips_grow_with_the_budget():
    """A larger budget never gives shorter strips: each strip decodes every chunk its rows touch, so the plan
    takes the tallest strip of the chunk counts that fit. Two chunks at once had left 16-row strips at 112 MiB
    (each 1536-row chunk decoded 96 times) where one at a time gives 512 rows, and the inverse's working chunk
    fell from 256 at 96 MiB to 16 at 112 MiB."""
    from blocklin.linalg.inverse.inverse import MEMORY
    from blocklin.plan.inverse import plan_inverse

    strips = [_plan(PROBE, mib * MiB).strip for mib in range(57, 520, 5)]
    assert strips == sorted(strips)
    chunks = [plan_inverse(3072, np.float64, memory=mib * MiB, kernels=MEMORY, source_chunk_bytes=1536 * 1536 * 8,
                           source_chunks=(1536, 1536), source_decoded=DECODED, method="schur").chunk
              for mib in range(57, 250, 5)]
    assert chunks == sorted(chunks)


def test_row_pass_below_one_decoded_chunk_is_refused_with_the_fix():
    """Below the temporaries of one decoded chunk (3 x 18 MiB) no strip fits: refused, naming the least
    budget and rechunking as the fix."""
    with pytest.raises(BudgetError, match=r"decoded whole.*rechunk the input smaller") as e:
        _plan(PROBE, 48 * MiB)
    least = e.value.minimum
    assert 54 * MiB < least < 57 * MiB
    assert _plan(PROBE, least).peak_memory <= least


STAGING = """
    import numpy as np, blocklin as bl
    from blocklin.runtime.stages import Stages
    a_path, out, memory = sys.argv[1:4]
    bl.open(a_path)[0:1, 0:1]
    import dask.threaded  # noqa: F401
    import scipy.linalg  # noqa: F401
    warm(bl.inv)
    class Staged(Exception):
        pass
    run = Stages.run
    def staging_only(self, name, step):
        result = run(self, name, step)
        if name == "stage":
            raise Staged
        return result
    Stages.run = staging_only
    reset_hwm()
    base = hwm()
    try:
        bl.inv(a_path, out=out, memory=memory, method="schur")
    except Staged:
        pass
    print(json.dumps({"baseline": base, "peak": hwm()}))
"""


@needs_hwm
@pytest.mark.slow
def test_inverse_staging_pass_decodes_the_stored_chunks_within_budget(zstd_matrix, tmp_path):
    """The Schur route's staging pass (``W = M V``) aligns its strips to W's working chunks (256 rows at
    64 MiB): it had counted M's 1536 x 1536 chunks as 256 x 9216 (the chunk's bytes over the strip grid),
    one per strip row where a strip decodes two, and peaked at 78-81 MiB above the baseline for a plan of
    63 MiB. It now plans one chunk decoded at a time."""
    budget = 64 * MiB
    r = run_child(STAGING, zstd_matrix, str(tmp_path / "x.zarr"), "64MiB")
    used = r["peak"] - r["baseline"]
    assert used <= 1.1 * budget, f"staging used {used / MiB:.1f} MiB over baseline, budget 64 MiB"


def test_a_pass_aligned_to_another_grid_decodes_the_stored_chunks():
    """A source whose strips align to an output's chunk rows keeps its stored chunks for what a read
    decodes (``decoded_chunks``), and the pass's plan decodes one 1536 x 1536 chunk at a time at 64 MiB."""
    from blocklin.linalg.inverse.kernels import staging_memory
    from blocklin.runtime.passes import Source

    src = Source(path="m.zarr", name="a", rows=3072, width=3072, dtype=np.dtype("float64"), chunk_rows=1536,
                 chunk_bytes=1536 * 1536 * 8, chunks_across=2).aligned_to(256)
    assert (src.chunk_rows, src.chunks) == (256, (1536, 1536))
    p = plan_pass(staging_memory(3072, np.float64, np.float64), 3072, 3072 * 8, chunk_rows=src.chunk_rows,
                  memory=64 * MiB, chunk_bytes=src.chunk_bytes, chunks_across=2, max_strip=256, workers=1,
                  decoded=(*src.chunks, 8), decoded_width=3072)
    assert p.lanes == 1 and p.peak_memory <= 64 * MiB
    assert p.fixed_bytes >= chunk_io(p.strip, 1536, DECODED, (3072, 3072), 0)
