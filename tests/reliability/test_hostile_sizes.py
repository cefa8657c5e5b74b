"""Hostile sizes: declared shapes that the data does not back are refused up front, in bounded memory.

Every CLI case runs in a subprocess under an address-space limit (tests/support/hostile.py) and asserts the
one-line message, exit code 1 and that no partial output or work folder is left behind.
"""

from __future__ import annotations

import itertools
import os
import re
import tracemalloc

import numpy as np
import pytest

import blocklin
from blocklin.errors import BudgetError, DiskSpaceError
from blocklin.plan.chunks import Pieces, split
from blocklin.plan.convert import plan_convert
from blocklin.plan.passes import plan_row_pass
from support.hostile import assert_refused, declared_zarr, leftovers, run_many, small_tmpfs, write_zarr


def test_declared_shapes_refused_up_front_by_every_command(tmp_path):
    declared_zarr(tmp_path / "big.zarr", (10**6, 10**6), (1000, 1000))  # 8 TB declared, 8 KB stored
    declared_zarr(tmp_path / "tall.zarr", (10**12, 10), (1000, 10))
    write_zarr(tmp_path / "b.zarr", np.ones((10, 10)), (10, 10))
    (tmp_path / "huge.mtx").write_text("%%MatrixMarket matrix coordinate real general\n"
                                       "1000000000 1000000000 2\n1 1 1.0\n5 5 2.0\n")
    cases = [
        ["convert", "big.zarr", "o1.zarr", "--memory", "64MiB"],
        ["convert", "big.zarr", "o2.npy", "--memory", "64MiB"],
        ["inv", "big.zarr", "-o", "o3.zarr", "--memory", "64MiB"],
        ["convert", "huge.mtx", "o4.zarr", "--memory", "64MiB", "--dense"],
        ["gemm", "tall.zarr", "b.zarr", "-o", "o5.zarr", "--memory", "64MiB"],
        ["svd", "tall.zarr", "-k", "2", "-o", "o6", "--memory", "64MiB"],
    ]
    for args, proc in zip(cases, run_many(cases, tmp_path)):
        line = assert_refused(proc, "DiskSpaceError", "must fit the free space of its destination", "free", "TiB")
        assert "uncompressed" in line and str(tmp_path) in line, line
    assert leftovers(tmp_path, tmp_path / "tmp") == []
    assert not any((tmp_path / f"o{i}").exists() for i in range(1, 7))


def test_temp_data_that_does_not_fit_names_the_temp_dir(tmp_path):
    a = np.random.default_rng(0).standard_normal((20000, 40))
    write_zarr(tmp_path / "a.zarr", a, (2000, 40))
    with small_tmpfs(tmp_path / "small", "1m"):
        (proc,) = run_many([["svd", "a.zarr", "-k", "5", "-o", "u", "--memory", "2MiB"]], tmp_path,
                           env={"BLOCKLIN_TEMP_DIR": str(tmp_path / "small")})
        line = assert_refused(proc, "DiskSpaceError", "temp data in the temp dir", "BLOCKLIN_TEMP_DIR",
                              str(tmp_path / "small"))
        assert "20000 x" in line
        assert leftovers(tmp_path, tmp_path / "small") == []


def test_space_is_checked_for_outputs_through_the_api(tmp_path, monkeypatch):
    import shutil

    from blocklin.storage import space

    write_zarr(tmp_path / "a.zarr", np.ones((200, 30)), (100, 30))
    write_zarr(tmp_path / "b.zarr", np.ones((30, 200)), (30, 100))
    real = shutil.disk_usage
    monkeypatch.setattr(space.shutil, "disk_usage", lambda p: real(p)._replace(free=1000))
    with pytest.raises(DiskSpaceError, match=r"out: must fit the free space.*200 x 200 float64.*1000 B free.*-o"):
        blocklin.matmul(str(tmp_path / "a.zarr"), str(tmp_path / "b.zarr"), tmp_path / "c.zarr")
    assert leftovers(tmp_path) == [] and not (tmp_path / "c.zarr").exists()


def test_block_lists_are_never_materialised():
    pieces = split(10**15, 7)  # a shape no list could hold
    assert isinstance(pieces, Pieces) and len(pieces) == -(-10**15 // 7)
    assert pieces[0] == (0, 7) and pieces[-1] == (10**15 - 10**15 % 7, 10**15)
    assert list(itertools.islice(pieces, 2)) == [(0, 7), (7, 14)] == pieces[:2]
    plan = plan_row_pass(10**12, 80, chunk_rows=1000, memory=2**20)
    tracemalloc.start()
    strips = plan.strips(0)
    first = strips[0]
    size, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert len(strips) > 10**6 and first == (0, plan.strip) and peak < 2**16
    cplan = plan_convert((10**12, 10), "float64", "float64", memory=2**20, unit=(1000, 10))
    assert cplan.n_blocks > 10**6
    assert list(itertools.islice(cplan.blocks(), 2))[1][0] > 0  # a generator: the first blocks at once


def test_convert_copies_block_by_block_without_a_list(tmp_path):
    from blocklin.storage import convert as conv

    class Stub:
        sequential = False
        supports_resume = True

        def is_done(self, unit):
            return unit.startswith("block-0-")

    class Progress:
        count = 0

        def advance(self, k):
            self.count += k

    plan = plan_convert((10**12, 10), "float64", "float64", memory=2**20, unit=(1000, 10))
    prog = Progress()
    work = conv._work(Stub(), Stub(), plan, prog)
    first = next(work)  # the first unfinished block, found without listing the 10^9 others
    assert first[0][0] > 0 and first[1] is False and prog.count == 1


def test_a_graph_refuses_more_tasks_than_it_may_hold(tmp_path, monkeypatch):
    from blocklin.runtime import graph

    monkeypatch.setattr(graph, "MAX_GRAPH_TASKS", 3)
    a = np.ones((64, 64))
    write_zarr(tmp_path / "a.zarr", a, (8, 8))
    with pytest.raises(BudgetError, match="at most 3 tasks.*raise the memory budget"):
        blocklin.matmul(str(tmp_path / "a.zarr"), str(tmp_path / "a.zarr"), tmp_path / "c.zarr", memory="16KiB")
    assert leftovers(tmp_path) == [] and not (tmp_path / "c.zarr").exists()


def test_every_job_checks_its_output_and_temp_data_up_front(tmp_path):
    """Outputs that cannot fit their folder, and the inverse's and the square solve's work stores that
    cannot fit the temp dir, are refused before anything is claimed or written, with the figure."""
    n = 600  # a 600 x 600 float64 result is 2.75 MiB: more than the 1 MiB file systems below
    rng = np.random.default_rng(3)
    spd = rng.standard_normal((n, n))
    write_zarr(tmp_path / "a.zarr", spd @ spd.T + n * np.eye(n), (200, 200))
    write_zarr(tmp_path / "b.zarr", np.ones((n, 2)), (200, 2))
    small = tmp_path / "small"
    with small_tmpfs(small, "1m"):
        outs = [["gemm", "a.zarr", "a.zarr", "-o", "small/c.zarr"], ["gram", "a.zarr", "-o", "small/g.zarr"],
                ["factor", "cholesky", "a.zarr", "-o", "small/l.zarr"], ["factor", "lu", "a.zarr", "-o", "small/lu.zarr"],
                ["factor", "qr", "a.zarr", "-o", "small/r.zarr", "--method", "tiled"], ["inv", "a.zarr", "-o", "small/x.zarr"]]
        for proc in run_many([c + ["--memory", "8MiB"] for c in outs], tmp_path):
            line = assert_refused(proc, "DiskSpaceError", "out: must fit the free space", str(small))
            assert re.search(rf"\d+ x \d+ float64.* for .*{re.escape(str(small))}", line), line  # the figure
        temps = [["inv", "a.zarr", "-o", "x.zarr"], ["solve", "a.zarr", "b.zarr", "-o", "y.zarr"]]
        for proc in run_many([c + ["--memory", "8MiB"] for c in temps], tmp_path, env={"BLOCKLIN_TEMP_DIR": str(small)}):
            assert_refused(proc, "DiskSpaceError", "temp data in the temp dir", "BLOCKLIN_TEMP_DIR", str(small))
        assert leftovers(tmp_path, small) == [] and os.listdir(small) == []
    assert not (tmp_path / "x.zarr").exists() and not (tmp_path / "y.zarr").exists()
