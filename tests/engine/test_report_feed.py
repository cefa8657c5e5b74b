"""Reports say the bound: ``feed_gbps``, ``compute_fraction`` and ``bound`` (Job.report), checked
against their definitions recomputed from the report's own statistics, never against a fixed answer."""

from __future__ import annotations

import json

import numpy as np
import pytest

import blocklin as bl
from blocklin.cli.main import main
from blocklin.runtime.job import FEED_BOUND_WAIT, Job

KEYS = ("feed_gbps", "compute_fraction", "wait_fraction", "bound", "compute_seconds", "device_compute_seconds",
        "concurrent_tasks")


def assert_definitions(r: dict, *, one_graph: bool) -> None:
    """Every feed entry of report ``r`` as :meth:`Job.report` defines it."""
    assert set(KEYS) <= set(r)
    assert r["feed_gbps"] == pytest.approx(r["bytes_read"] / r["seconds"] / 1e9)
    assert r["bound"] in ("feed", "compute", "unknown")
    if r["bound"] == "unknown":
        assert r["compute_fraction"] is None and r["wait_fraction"] is None
        return
    waits, compute = r["wait_seconds"], r["compute_seconds"]
    assert r["wait_fraction"] == pytest.approx(waits / (waits + compute))
    assert r["bound"] == ("feed" if r["wait_fraction"] > FEED_BOUND_WAIT else "compute")
    assert 0.0 <= r["compute_fraction"] <= 1.0
    assert r["compute_fraction"] == pytest.approx(min(1.0, r["device_compute_seconds"] / r["seconds"]))
    # each task's compute shared the device with the tasks its graph ran at once
    w = r["concurrent_tasks"]
    assert w >= 1 and compute / w - 1e-9 <= r["device_compute_seconds"] <= compute + 1e-9
    if one_graph:
        assert r["device_compute_seconds"] == pytest.approx(compute / w)
    # the consumers' time fits in the run's task slots
    assert compute + waits <= r["seconds"] * w * 1.05 + 0.01


@pytest.mark.parametrize("device", ["cpu", pytest.param("gpu", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("workers", [1, 2])
def test_matmul_report_says_its_feed_and_bound(tmp_path, workers, device):
    rng = np.random.default_rng(0)
    a = bl.from_array(rng.standard_normal((600, 400)), tmp_path / "a.zarr", chunks=(100, 100))
    b = bl.from_array(rng.standard_normal((400, 500)), tmp_path / "b.zarr", chunks=(100, 100))
    r = bl.matmul(a, b, tmp_path / "c.zarr", memory="2MiB", workers=workers, device=device,
                  device_memory="64MiB").report
    assert r["device"] == device
    assert r["tasks"] > 1 and r["bytes_read"] > 0 and r["compute_seconds"] > 0
    assert r["concurrent_tasks"] == min(workers, r["tasks"])
    assert_definitions(r, one_graph=True)
    assert r["bound"] in ("feed", "compute")  # every GEMM tile streams its panels


def test_thin_product_over_a_stored_matrix_says_what_really_bounded_it(tmp_path):
    """A tall matrix times a few columns: 2 flops per element read. Whether the feed bounded it is
    what the consumers' waits say on this machine at this moment, so the report is checked against
    its own waits and loads, not against an expected answer."""
    t = bl.random(tmp_path / "t.zarr", (60000, 200), chunks=(5000, 200))
    x = bl.from_array(np.ones((200, 2)), tmp_path / "x.zarr")
    r = bl.matmul(t, x, tmp_path / "y.zarr", memory="64MiB").report
    assert r["route"] == "rows"
    assert_definitions(r, one_graph=False)  # two graphs: the pass that reads op(B), then A's
    assert r["load_seconds"] > 0 and r["bytes_read"] >= 60000 * 200 * 8
    assert r["bound"] == ("feed" if r["wait_seconds"] > FEED_BOUND_WAIT * (r["wait_seconds"] + r["compute_seconds"])
                          else "compute")


def test_row_pass_reports_follow_the_same_definitions(tmp_path):
    a = bl.random(tmp_path / "a.zarr", (40000, 100), chunks=(4000, 100))
    r = bl.gram(a, tmp_path / "g.zarr", memory="32MiB").report
    assert r["route"] == "pass"
    assert_definitions(r, one_graph=False)
    assert r["bound"] != "unknown"


def test_definitions_on_stats_added_by_hand():
    """Two tasks that ran at once, waiting 3 s of every 4: bound by the feed, the device's compute
    1 s (each task's second shared with the other), the fraction clamped to the run's length."""
    with Job("probe", memory="16MiB", scheduler="sync") as job:
        for _ in range(2):
            job.add_stats({"compute_seconds": 1.0, "wait_seconds": 3.0, "load_seconds": 3.5, "bytes_read": 10},
                          share=2)
        r = job.report()
    assert r["compute_seconds"] == 2.0 and r["device_compute_seconds"] == 1.0 and r["wait_fraction"] == 0.75
    assert r["bound"] == "feed" and r["compute_fraction"] == 1.0  # 1 s of compute in a run of milliseconds
    with Job("probe", memory="16MiB", scheduler="sync") as job:
        job.add_stats({"compute_seconds": 3.0, "wait_seconds": 1.0})
        assert job.report()["bound"] == "compute"
    with Job("probe", memory="16MiB", scheduler="sync") as job:
        job.add_stats({"bytes_read": 5, "bytes_written": 5})  # a task that streamed nothing
        r = job.report()
    assert r["bound"] == "unknown" and r["compute_fraction"] is None and r["wait_fraction"] is None
    assert r["concurrent_tasks"] == 0 and r["feed_gbps"] >= 0


def test_cli_prints_the_feed_line(tmp_path, capsys):
    rng = np.random.default_rng(1)
    pa = bl.from_array(rng.standard_normal((300, 200)), tmp_path / "a.zarr", chunks=(100, 100)).path
    pb = bl.from_array(rng.standard_normal((200, 100)), tmp_path / "b.zarr", chunks=(100, 100)).path
    assert main(["gemm", pa, pb, "-o", str(tmp_path / "c.zarr"), "--memory", "1MiB"]) == 0
    lines = capsys.readouterr().out.splitlines()
    feed = [x for x in lines if x.startswith("feed ")]
    assert len(feed) == 1 and " GB/s, device computing " in feed[0] and "% of the run: bound by " in feed[0]
    assert main(["gemm", pa, pb, "-o", str(tmp_path / "d.zarr"), "--memory", "1MiB", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["bound"] in ("feed", "compute") and 0 <= summary["compute_fraction"] <= 1
    from blocklin.cli import ui

    assert ui.feed_line({**summary, "feed_gbps": 1.234, "compute_fraction": 0.344, "bound": "feed"}) == \
        "feed 1.2 GB/s, device computing 34% of the run: bound by feed"
    assert ui.feed_line({"feed_gbps": 12.5, "compute_fraction": None, "bound": "unknown"}) == \
        "feed 12 GB/s; no task streamed its data: bound unknown"
    assert ui.feed_line({"seconds": 1.0}) is None  # a report without the entries: no line
