"""Jobs on a distributed LocalCluster (2 worker processes, loopback) give the same bits as locally.

The client here is deliberately *not* the default client: nothing in blocklin may rely on one.
"""

from __future__ import annotations

import numpy as np
import pytest

import blocklin as bl

distributed = pytest.importorskip("distributed")


@pytest.fixture(scope="module")
def client():
    from distributed import Client, LocalCluster

    cluster = LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None,
                           host="127.0.0.1")
    c = Client(cluster, set_as_default=False)
    yield c
    c.close()
    cluster.close()


def test_gemm_on_cluster_equals_local(tmp_path, client):
    rng = np.random.default_rng(5)
    a = bl.from_array(rng.standard_normal((150, 120)), tmp_path / "a.zarr", chunks=(32, 32))
    b = bl.from_array(rng.standard_normal((120, 140)), tmp_path / "b.zarr", chunks=(32, 32))
    local = bl.matmul(a, b, tmp_path / "local.zarr", memory="256KiB", scheduler="threads")
    remote = bl.matmul(a, b, tmp_path / "remote.zarr", memory="256KiB", scheduler=client)
    assert remote.report["scheduler"] == "distributed"
    assert remote.report["tasks"] > 1
    np.testing.assert_array_equal(remote.to_numpy(), local.to_numpy())
    # An active client is picked up when no scheduler is named; and by address.
    with client.as_current():
        implicit = bl.matmul(a, b, tmp_path / "implicit.zarr", memory="256KiB")
    assert implicit.report["scheduler"] == "distributed"
    np.testing.assert_array_equal(implicit.to_numpy(), local.to_numpy())
    by_address = bl.matmul(a, b, tmp_path / "addr.zarr", memory="256KiB", scheduler=client.scheduler.address)
    np.testing.assert_array_equal(by_address.to_numpy(), local.to_numpy())


def test_task_keys_deterministic(tmp_path):
    from blocklin.runtime.graph import TileGraph

    g1 = TileGraph.named("gemm", "x", {"tm": 4})
    g2 = TileGraph.named("gemm", "x", {"tm": 4})
    g3 = TileGraph.named("gemm", "x", {"tm": 8})
    assert g1.name == g2.name != g3.name


def test_task_keys_include_every_argument():
    """Two graphs that differ in one argument (an output path, say) share no key when they run."""
    from blocklin.runtime.graph import TileGraph

    def graph(out: str) -> TileGraph:
        g = TileGraph.named("gemm", "same inputs")
        first = g.add((0,), print, {"out": out})
        g.add((1,), print, [first], out)
        return g

    one, two, again = graph("o1").distinct(), graph("o2").distinct(), graph("o1").distinct()
    assert set(one.tasks).isdisjoint(two.tasks)
    assert list(one.tasks) == list(again.tasks)  # deterministic
    # the dependency of task 1 is renamed with the graph
    assert one.tasks[(one.name, 1)][1] == [(one.name, 0)]


def test_identical_jobs_to_different_outputs_run_concurrently(tmp_path, client):
    """Two users submit the same GEMM to different outputs at once: both outputs are complete.

    With keys that ignore the output, the scheduler ran the shared tasks once and the second output
    stayed all zeros while the job reported success.
    """
    import threading

    from distributed import Client

    rng = np.random.default_rng(8)
    a_np, b_np = rng.standard_normal((256, 192)), rng.standard_normal((192, 224))
    a = bl.from_array(a_np, tmp_path / "a.zarr", chunks=(32, 32))
    b = bl.from_array(b_np, tmp_path / "b.zarr", chunks=(32, 32))
    ref = bl.matmul(a, b, tmp_path / "ref.zarr", memory="256KiB", scheduler="sync").to_numpy()
    second = Client(client.scheduler.address, set_as_default=False)
    errors: list[BaseException] = []
    start = threading.Barrier(2)

    def job(c, out):
        try:
            start.wait()
            bl.matmul(a, b, out, memory="256KiB", scheduler=c, progress=False)
        except BaseException as exc:  # reported below
            errors.append(exc)

    outs = [tmp_path / "o1.zarr", tmp_path / "o2.zarr"]
    threads = [threading.Thread(target=job, args=(c, o)) for c, o in zip((client, second), outs)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        second.close()
    assert not errors, errors
    for o in outs:
        np.testing.assert_array_equal(bl.open(o).to_numpy(), ref)


def test_cli_scheduler_address(tmp_path, client, capsys):
    from blocklin.cli.main import main

    rng = np.random.default_rng(9)
    a = bl.from_array(rng.standard_normal((90, 70)), tmp_path / "a.zarr", chunks=(32, 32))
    b = bl.from_array(rng.standard_normal((70, 80)), tmp_path / "b.zarr", chunks=(32, 32))
    out = tmp_path / "c.zarr"
    rc = main(["gemm", a.path, b.path, "-o", str(out), "--memory", "256KiB", "--scheduler",
               client.scheduler.address, "--json"])
    assert rc == 0, capsys.readouterr()
    assert '"scheduler": "distributed"' in capsys.readouterr().out
    local = bl.matmul(a, b, memory="256KiB", scheduler="sync").to_numpy()
    np.testing.assert_array_equal(bl.open(out).to_numpy(), local)
