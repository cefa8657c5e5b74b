"""GEMM tiles of fewer rows than a chunk, where chunk-row tiles fit only with narrow k-panels.

A k-panel narrower than a local uncompressed chunk reads part of every row of it (copied out of a
mapping of the chunk file, whose pages are faulted in whole: about a whole row's cost for a part),
while a tile of fewer rows reads one contiguous range of each chunk file. Measured on a thin
product (``A`` 524288 x 512 float64 in 2048-row chunks, ``B`` 512 x 4, tmpfs): 0.53 GB/s with
14336-row tiles and 64-wide panels at a 16 MiB budget, 3.0-3.4 GB/s with 512-row tiles reading
whole rows (``docs/benchmarks.md``, "Thin products at small budgets").
"""

from __future__ import annotations

import numpy as np
import pytest
import zarr

import blocklin as bl
from blocklin.errors import BudgetError
from blocklin.plan import plan_gemm

MIB = 2**20
DIRECT = dict(reads=("direct", "direct"), direct_writes=True)


def test_plan_cuts_chunk_rows_rather_than_chunk_width():
    plan = plan_gemm(262144, 4, 512, "float64", a_chunks=(2048, 512), b_chunks=(512, 4), memory=16 * MIB,
                     cores=2, **DIRECT)
    assert plan.tm < 2048 and 2048 % plan.tm == 0
    assert plan.tk == 512  # whole rows of A's chunks
    assert plan.out_chunks == (plan.tm, 4)  # each tile still owns whole output chunks
    assert plan.peak_memory <= 16 * MIB
    for _, _, rows, _ in plan.tiles():
        assert rows.start % plan.tm == 0


@pytest.mark.parametrize("case", ["through zarr", "transposed A"])
def test_plan_keeps_chunk_rows_where_a_row_range_is_not_one_read(case):
    # Through zarr every chunk touched is decoded whole, and the rows of op(A) = A^T are stored
    # columns: fewer rows than a chunk would read the chunk again per tile.
    if case == "through zarr":
        plan = plan_gemm(262144, 4, 512, "float64", a_chunks=(2048, 512), b_chunks=(512, 4), memory=32 * MIB, cores=2)
    else:
        plan = plan_gemm(262144, 4, 512, "float64", a_chunks=(2048, 512), b_chunks=(512, 4), memory=16 * MIB,
                         cores=2, trans=(True, False), **DIRECT)
    assert plan.tm % 2048 == 0


def test_smallest_budget_is_still_that_of_chunk_row_tiles():
    # 64-row tiles with whole-row panels would fit 1 MiB, but below the chunk-row minimum a rechunk
    # of the input beats any tiling: the refusal and its stated minimum are unchanged.
    with pytest.raises(BudgetError) as info:
        plan_gemm(30000, 3, 256, "float64", a_chunks=(4096, 256), b_chunks=(256, 3), memory=1 * MIB, cores=2, **DIRECT)
    assert "4096 x 3" in str(info.value)
    plan = plan_gemm(30000, 3, 256, "float64", a_chunks=(4096, 256), b_chunks=(256, 3), memory=info.value.minimum,
                     cores=2, **DIRECT)
    assert plan.peak_memory <= info.value.minimum


@pytest.fixture(scope="module")
def stored(tmp_path_factory):
    rng = np.random.default_rng(7)
    a = rng.standard_normal((30000, 256))
    path = str(tmp_path_factory.mktemp("sub_rows") / "A.zarr")
    arr = zarr.create_array(store=path, shape=a.shape, chunks=(4096, 256), dtype="float64", compressors=None,
                            zarr_format=3)
    arr[:] = a
    return path, a, rng.standard_normal((256, 3))


@pytest.mark.parametrize("scheduler", ["sync", "threads", "processes"])
def test_sub_row_tiles_give_the_product(stored, tmp_path, scheduler, monkeypatch):
    path, a, b = stored
    monkeypatch.setattr("blocklin.linalg.products.thin.THIN_MAX_COLUMNS", 0)  # the tiles this test is about
    res = bl.matmul(path, b, str(tmp_path / "C.zarr"), memory="4MiB", scheduler=scheduler)
    plan = res.report["plan"]
    assert plan["tm"] < 4096 and plan["tk"] == 256, plan  # the tiling this test is about
    assert 30000 % plan["tm"]  # and a last tile of fewer rows
    c = res.to_numpy()
    # Each entry is a dot product of length k: |fl(AB) - AB| <= gamma_k |A||B| (Higham, Accuracy and
    # Stability of Numerical Algorithms, 2nd ed., eq. 3.13), gamma_k = k u / (1 - k u), u = eps / 2.
    u = np.finfo(np.float64).eps / 2
    bound = 256 * u / (1 - 256 * u) * (np.abs(a) @ np.abs(b))
    assert np.all(np.abs(c - a @ b) <= bound)
    assert zarr.open_array(str(tmp_path / "C.zarr")).chunks == (plan["tm"], 3)


@pytest.mark.slow  # a two-process LocalCluster
def test_sub_row_tiles_on_a_local_cluster(stored, tmp_path, client, monkeypatch):
    """The plan and the bits of sync's, on a cluster's workers (processes of one thread each)."""
    path, a, b = stored
    monkeypatch.setattr("blocklin.linalg.products.thin.THIN_MAX_COLUMNS", 0)  # the tiles this test is about
    ref = bl.matmul(path, b, str(tmp_path / "ref.zarr"), memory="4MiB", scheduler="sync")
    res = bl.matmul(path, b, str(tmp_path / "C.zarr"), memory="4MiB", scheduler=client)
    assert res.report["plan"]["tm"] == ref.report["plan"]["tm"] < 4096
    assert res.to_numpy().tobytes() == ref.to_numpy().tobytes()
