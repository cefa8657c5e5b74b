"""GEMM within a budget too small for chunk-wide k-panels: panels narrower than the chunks.

A 1024 x 1024 float64 chunk is 8 MiB; one task with chunk-wide panels needs 80 MiB (accumulator,
two panel slots of two operands, zarr's read and write temporaries). Below that the planner reads
column (``op(A)``) or row (``op(B)``) sub-ranges of each chunk, re-reading every chunk once per
panel, and still owns whole output chunks per tile.
"""

from __future__ import annotations

import numpy as np
import pytest

import blocklin as bl
from blocklin.errors import BudgetError
from blocklin.plan import plan_gemm
from support.memcheck import margin, needs_hwm, run_child

MIB = 2**20


def _chunk_wide_minimum(n: int, chunk: int) -> int:
    """The smallest budget that chunk-wide panels need, read from the planner's own error."""
    for mib in range(1, 1024):
        try:
            plan = plan_gemm(n, n, n, "float64", a_chunks=(chunk, chunk), b_chunks=(chunk, chunk),
                             memory=mib * MIB, cores=2)
        except BudgetError:
            continue
        if plan.panel_rereads == 1:
            return mib * MIB
    raise AssertionError("no chunk-wide plan up to 1 GiB")


def test_plan_uses_sub_chunk_panels_when_chunk_wide_ones_do_not_fit():
    chunk, n = 1024, 4096
    wide = _chunk_wide_minimum(n, chunk)
    assert wide == 80 * MIB  # the budget of the example's crash report
    plan = plan_gemm(n, n, n, "float64", a_chunks=(chunk, chunk), b_chunks=(chunk, chunk), memory=64 * MIB, cores=2)
    assert plan.peak_memory <= 64 * MIB
    assert plan.tk < chunk and chunk % plan.tk == 0  # a panel never straddles two chunks
    assert plan.panel_rereads == chunk // plan.tk
    # Output tiles still own whole output chunks.
    assert plan.out_chunks == (chunk, chunk)
    for _, _, rows, cols in plan.tiles():
        assert rows.start % chunk == 0 and cols.start % chunk == 0
    # Bytes read count whole chunks per panel: each operand re-read per tile row/column and per panel.
    gm, gn = plan.grid
    assert plan.bytes_read == (n * n * 8 * gn + n * n * 8 * gm) * plan.panel_rereads
    assert f"a chunk is read up to {plan.panel_rereads} times per pass" in plan.explain()


def test_plan_keeps_chunk_wide_panels_when_they_fit():
    plan = plan_gemm(4096, 4096, 4096, "float64", a_chunks=(1024, 1024), b_chunks=(1024, 1024), memory=80 * MIB,
                     cores=2)
    assert plan.tk % 1024 == 0 and plan.panel_rereads == 1
    assert "read" in plan.explain() and "times per pass" not in plan.explain()


def test_budget_error_states_the_sub_chunk_minimum():
    with pytest.raises(BudgetError) as info:
        plan_gemm(4096, 4096, 4096, "float64", a_chunks=(1024, 1024), b_chunks=(1024, 1024), memory=40 * MIB, cores=2)
    msg = str(info.value)
    assert "64-wide panels" in msg and "memory='50MiB'" in msg
    # The stated minimum is enough.
    plan = plan_gemm(4096, 4096, 4096, "float64", a_chunks=(1024, 1024), b_chunks=(1024, 1024), memory=50 * MIB,
                     cores=2)
    assert plan.tk == 64 and plan.peak_memory <= 50 * MIB


def test_uneven_chunks_panels_divide_both():
    # k chunks of 600 (A) and 400 (B): 1200-wide panels need 46 MiB; 200 is the widest dividing both.
    plan = plan_gemm(2000, 1500, 3000, "float64", a_chunks=(500, 600), b_chunks=(400, 500), memory=16 * MIB, cores=2)
    assert plan.peak_memory <= 16 * MIB and plan.panel_rereads > 1
    for u in (600, 400):
        assert u % plan.tk == 0 or plan.tk % u == 0
    assert sum(b - a for a, b in plan.k_panels()) == 3000


@pytest.mark.parametrize("trans_a,trans_b", [(False, False), (True, True)])
@pytest.mark.parametrize("codec,memory", [("zstd", "4MiB"), ("none", "2MiB")])
def test_gemm_with_sub_chunk_panels_matches_numpy(tmp_path, trans_a, trans_b, codec, memory):
    # 256 x 256 float64 chunks (512 KiB). Read through zarr (zstd), chunk-wide panels need 5 MiB
    # and a 4 MiB budget forces 128-wide panels, each re-reading whole chunks; read straight from
    # uncompressed chunk files (no zarr temporaries) they fit 4 MiB, 2 MiB forces narrower ones,
    # and those read only their part of each chunk. Shapes are not chunk multiples, so edge
    # chunks are read in sub-ranges too.
    m, n, k = 700, 600, 1000
    a_shape = (k, m) if trans_a else (m, k)
    b_shape = (n, k) if trans_b else (k, n)
    a = bl.random(tmp_path / "a.zarr", a_shape, seed=1, chunks=(256, 256), codec=codec)
    b = bl.random(tmp_path / "b.zarr", b_shape, seed=2, chunks=(256, 256), codec=codec)
    plan = bl.matmul(a, b, trans_a=trans_a, trans_b=trans_b, memory=memory, explain=True)
    assert plan.tk < 256 and plan.peak_memory <= bl.config.parse_size(memory)
    assert plan.panel_rereads == 1 if codec == "none" else plan.panel_rereads > 1
    c = bl.matmul(a, b, tmp_path / "c.zarr", trans_a=trans_a, trans_b=trans_b, memory=memory)
    if codec == "none":  # no chunk read whole per panel: only rows, and segments of rows (mapped,
        # only the wanted columns copied): the bytes read are the bytes used
        assert c.report["bytes_read"] == c.report["bytes_logical"]
    an, bn = a.to_numpy(), b.to_numpy()
    opa, opb = (an.T if trans_a else an), (bn.T if trans_b else bn)
    ref = opa @ opb
    # Higham's bound for two computed dot products of length k (any summation order):
    # |C - ref| <= 2 * gamma_k * (|A| @ |B|), gamma_k = k*eps / (1 - k*eps).
    eps = np.finfo(np.float64).eps
    gamma = k * eps / (1 - k * eps)
    bound = 2 * gamma * (np.abs(opa) @ np.abs(opb))
    err = np.abs(c.to_numpy() - ref)
    assert (err <= bound).all(), f"max error {err.max():.3g} over the bound"
    assert c.report["plan"]["tk"] == plan.tk


CHILD = """
    import blocklin as bl
    a_path, b_path, out, memory = sys.argv[1:5]
    bl.open(a_path)[0:1, 0:1]
    import dask.threaded  # noqa: F401  (imported by the run anyway; part of the baseline)
    base = hwm()
    reset_hwm()
    c = bl.matmul(a_path, b_path, out, memory=memory)
    print(json.dumps({"baseline": base, "peak": hwm(), "plan": c.report["plan"], "tasks": c.report["tasks"]}))
"""


@needs_hwm
@pytest.mark.parametrize("codec,mib", [("zstd", 48), ("none", 18)])
def test_sub_chunk_gemm_peak_within_budget(tmp_path, codec, mib):
    """The example's own layout: 1024 x 1024 chunks, operands 72 MiB each, budgets that force
    panels narrower than a chunk: read through zarr (zstd, re-reading whole chunks) at 48 MiB, or
    straight from chunk files (no zarr temporaries, only the panel's part read) at 18 MiB, a
    quarter of one operand."""
    n = 3072
    a = bl.random(tmp_path / "a.zarr", (n, n), seed=1, chunks=(1024, 1024), codec=codec)
    b = bl.random(tmp_path / "b.zarr", (n, n), seed=2, chunks=(1024, 1024), codec=codec)
    budget = mib * MIB
    assert a.nbytes > budget
    r = run_child(CHILD, a.path, b.path, str(tmp_path / "c.zarr"), f"{mib}MiB")
    used = r["peak"] - r["baseline"]
    assert r["plan"]["tk"] < 1024 and r["plan"]["peak_memory"] <= budget
    assert r["plan"]["panel_rereads"] == 1 if codec == "none" else r["plan"]["panel_rereads"] > 1
    assert r["tasks"] > 1
    assert used <= budget + margin(budget), f"used {used / MIB:.1f} MiB over baseline, budget {mib} MiB"


def test_plan_when_a_and_b_are_chunked_differently_along_k():
    # A^T r for a tall A in 4096-row chunks and r in one 200000-row chunk (an in-memory vector
    # staged whole): panels as wide as r's chunk need 633 MiB; 4096-wide ones cut r's chunk.
    plan = plan_gemm(200, 1, 200_000, "float64", a_chunks=(200, 4096), b_chunks=(200_000, 1), memory=64 * MIB, cores=2)
    assert plan.peak_memory <= 64 * MIB
    assert plan.panel_rereads > 1 and plan.tk < 200_000
    assert sum(b - a for a, b in plan.k_panels()) == 200_000


def test_gemm_with_differently_chunked_k_matches_numpy(tmp_path):
    m, n = 20_000, 50
    a = bl.random(tmp_path / "a.zarr", (m, n), seed=3, chunks=(512, n))
    r = np.random.default_rng(4).standard_normal((m, 1))
    bl.from_array(r, tmp_path / "r.zarr", chunks=(m, 1))
    plan = bl.matmul(a, tmp_path / "r.zarr", trans_a=True, memory="2MiB", explain=True)
    # k runs along the stored rows of both (A transposed, r as is), uncompressed: panels cutting
    # r's one chunk read only their rows of it, so nothing is read twice.
    assert plan.tk < m and plan.panel_rereads == 1 and plan.peak_memory <= 2 * MIB
    res = bl.matmul(a, tmp_path / "r.zarr", trans_a=True, memory="2MiB")
    assert res.report["bytes_read"] == res.report["bytes_logical"] == a.nbytes + r.nbytes
    got = res.to_numpy()
    an = a.to_numpy()
    eps = np.finfo(np.float64).eps
    bound = 2 * m * eps / (1 - m * eps) * (np.abs(an.T) @ np.abs(r))  # Higham, as above
    assert (np.abs(got - an.T @ r) <= bound).all()


@pytest.mark.parametrize("device", ["cpu", pytest.param("gpu", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("trans_a,trans_b", [(False, False), (True, True)])
def test_narrow_first_panel_matches_numpy_and_schedulers(tmp_path, device, dtype, trans_a, trans_b):
    """Inputs read in part (uncompressed, local): the plan starts with a narrow k-panel so that
    compute starts after reading an eighth of the first panel pair; the k-panels still sum in one
    fixed order, so every scheduler gives the same bits, and the product matches NumPy."""
    from test_gemm import _check, _ref

    rng = np.random.default_rng(5)
    m, n, k = 150, 130, 1500
    a = rng.standard_normal((k, m) if trans_a else (m, k)).astype(dtype)
    b = rng.standard_normal((n, k) if trans_b else (k, n)).astype(dtype)
    ap = bl.from_array(a, tmp_path / "a.zarr", chunks=(750, m) if trans_a else (m, 750)).path
    bp = bl.from_array(b, tmp_path / "b.zarr", chunks=(n, 750) if trans_b else (750, n)).path
    kw = dict(trans_a=trans_a, trans_b=trans_b, memory="64MiB", device=device, device_memory="64MiB")
    plan = bl.matmul(ap, bp, explain=True, **kw)
    panels = list(plan.k_panels())
    assert plan.tk == 750 and plan.k_lead == 128 and panels[:3] == [(0, 128), (128, 750), (750, 1500)]
    assert plan.k_steps == len(panels) == 3 and f"the first {plan.k_lead} wide" in plan.explain()
    got = [bl.matmul(ap, bp, tmp_path / f"c-{s}.zarr", scheduler=s, **kw) for s in ("sync", "threads")]
    _check(got[0], _ref(a, b, ta=trans_a, tb=trans_b), dtype, k)
    np.testing.assert_array_equal(got[0].to_numpy(), got[1].to_numpy())
    assert got[0].report["bytes_read"] == got[0].report["bytes_logical"] == a.nbytes + b.nbytes


def test_no_narrow_first_panel_for_chunks_read_whole(tmp_path):
    """Compressed chunks are read whole: a narrow first panel would read them twice, so none."""
    plan = plan_gemm(150, 130, 1500, "float64", a_chunks=(150, 750), b_chunks=(750, 130), memory=64 * MIB,
                     cores=2, reads=("chunks", "chunks"))
    assert plan.tk == 750 and plan.k_lead == 0 and len(plan.k_panels()) == 2


def test_quarter_of_an_operand_plans_large_tiles_from_direct_reads():
    """4096 x 4096 float64 in 1024 x 1024 chunks at 32 MiB (a quarter of one operand): inputs read
    straight from their chunk files need no chunk temporaries, so the plan holds tiles of two
    chunks with panels a quarter chunk wide (the k-block of BLAS), reading each operand a few
    times and no chunk more than once per panel; read through zarr the same budget is refused."""
    kw = dict(a_chunks=(1024, 1024), b_chunks=(1024, 1024), memory=32 * MIB, cores=2)
    plan = plan_gemm(4096, 4096, 4096, "float64", reads=("direct", "direct"), direct_writes=True, **kw)
    assert plan.peak_memory <= 32 * MIB and plan.panel_rereads == 1
    assert plan.tm * plan.tn == 2 * 1024 * 1024 and plan.tk == 256
    assert plan.bytes_read == 6 * 4096 * 4096 * 8  # A twice and B four times (or the other way round)
    with pytest.raises(BudgetError, match="memory="):
        plan_gemm(4096, 4096, 4096, "float64", **kw)


def test_sub_chunk_panels_compete_when_reads_are_partial():
    """With partial reads a narrower panel costs no re-reads: at 40 MiB the planner takes 512-wide
    panels with twice the tiles' area (768 MiB read) over chunk-wide panels on single-chunk tiles
    (1 GiB), but never panels narrower than BLAS's k-block when chunk-wide ones fit."""
    kw = dict(a_chunks=(1024, 1024), b_chunks=(1024, 1024), cores=2, reads=("direct", "direct"), direct_writes=True)
    plan = plan_gemm(4096, 4096, 4096, "float64", memory=40 * MIB, **kw)
    assert (plan.tm * plan.tn, plan.tk, plan.bytes_read) == (2 * 1024 * 1024, 512, 6 * 4096 * 4096 * 8)
    small = plan_gemm(300, 300, 300, "float64", a_chunks=(100, 100), b_chunks=(100, 100), cores=2,
                      reads=("direct", "direct"), memory=2 * MIB)
    assert small.tk % 100 == 0
