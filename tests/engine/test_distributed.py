"""Jobs on a distributed LocalCluster (2 worker processes, loopback) give the same bits as locally.

The client here is deliberately *not* the default client: nothing in blocklin may rely on one.
"""

from __future__ import annotations

import numpy as np
import pytest

import blocklin as bl
from support.tolerances import assert_gram

distributed = pytest.importorskip("distributed")


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


def test_writers_on_cluster_use_the_given_client_not_a_default_one(tmp_path, client):
    """``random`` and zarr-to-zarr ``convert`` wait on their tasks through the client they were given:
    with no default client (this module's), both had failed with distributed's ``No clients found``."""
    import dask.array as da

    from distributed import get_task_stream

    r = bl.random(tmp_path / "r.zarr", (90, 30), seed=5, chunks=(20, 30), scheduler=client)
    ref = bl.random(tmp_path / "r_local.zarr", (90, 30), seed=5, chunks=(20, 30), scheduler="sync")
    np.testing.assert_array_equal(r.to_numpy(), ref.to_numpy())
    x = np.random.default_rng(8).standard_normal((70, 50))
    m = bl.from_array(da.from_array(x, chunks=(30, 50)), tmp_path / "x.zarr", chunks=(25, 20), scheduler=client)
    with get_task_stream(client) as ts:
        rep = bl.convert(m, tmp_path / "y.zarr", chunks=(40, 15), dtype="float32", memory="128KiB", scheduler=client)
    assert rep["on_cluster"] and any("_copy_block_task" in str(t.get("key")) for t in ts.data)
    np.testing.assert_array_equal(bl.open(tmp_path / "y.zarr").to_numpy(), x.astype(np.float32))


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


# -- lost worker processes -----------------------------------------------------------------------


def _die_once(marker: str, value: int) -> dict:
    """A task whose first run kills its own process (as the kernel's OOM killer would)."""
    import os
    import signal

    if not os.path.exists(marker):
        open(marker, "w").close()
        os.kill(os.getpid(), signal.SIGKILL)
    return {"value": value}


def _die_always(value: int) -> dict:
    import os
    import signal

    os.kill(os.getpid(), signal.SIGKILL)
    return {"value": value}


def _ok(value: int) -> dict:
    return {"value": value}


def test_dead_pool_process_reruns_only_its_tasks(tmp_path):
    from blocklin.runtime.graph import TileGraph, execute

    g = TileGraph.named("faults", str(tmp_path))
    for i in range(6):
        if i == 3:
            g.add((i,), _die_once, str(tmp_path / "died"), i)
        else:
            g.add((i,), _ok, i)
    events: dict = {}
    with pytest.warns(bl.errors.BlocklinWarning, match="worker process died"):
        results = execute(g, scheduler="processes", workers=2, events=events)
    assert [r["value"] for r in results] == list(range(6))
    assert 1 <= events["retried_tasks"] <= 6


def test_processes_that_keep_dying_fail_with_resume_hint(tmp_path):
    from blocklin.errors import WorkerLostError
    from blocklin.runtime.graph import TileGraph, execute

    g = TileGraph.named("faults-always", str(tmp_path))
    g.add((0,), _die_always, 0)
    with pytest.warns(bl.errors.BlocklinWarning):
        with pytest.raises(WorkerLostError, match="resume=True"):
            execute(g, scheduler="processes", workers=1)


def test_killed_worker_on_cluster_gives_identical_result(tmp_path):
    """A worker killed mid-GEMM: distributed reruns its tasks; the output is complete and identical."""
    import os
    import signal

    from distributed import Client, LocalCluster

    rng = np.random.default_rng(12)
    a = bl.from_array(rng.standard_normal((384, 256)), tmp_path / "a.zarr", chunks=(32, 32))
    b = bl.from_array(rng.standard_normal((256, 320)), tmp_path / "b.zarr", chunks=(32, 32))
    # 128 KiB: about 20 tiles read straight from the chunk files, so the kill lands mid-job
    ref = bl.matmul(a, b, memory="128KiB", scheduler="sync").to_numpy()
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0",
                      host="127.0.0.1") as cluster, Client(cluster, set_as_default=False) as client:
        victim = sorted(client.run(os.getpid).values())[0]

        class KillAfterTenTiles:  # a progress display that kills a worker mid-job
            def start(self, total, description):
                self.n = 0

            def advance(self, k):  # k-panels of finished tiles
                self.n += k
                if self.n >= 10 and not getattr(self, "killed", False):
                    self.killed = True
                    os.kill(victim, signal.SIGKILL)

            def close(self):
                pass

        out = bl.matmul(a, b, tmp_path / "c.zarr", memory="128KiB", scheduler=client, progress=KillAfterTenTiles())
        assert out.report["tasks"] > 10
        assert out.report["retried_tasks"] is not None
    np.testing.assert_array_equal(out.to_numpy(), ref)
    leftovers = [p for p in (tmp_path / "c.zarr").rglob("*") if ".tmp" in p.name or "partial" in p.name]
    assert not leftovers


def test_worker_settings_unchanged_after_jobs(tmp_path):
    """BLAS threads and zarr's I/O concurrency of a shared worker are as before a job, import included."""
    from support import worker_probe
    from distributed import Client, LocalCluster

    rng = np.random.default_rng(13)
    low_rank = rng.standard_normal((200, 3)) @ rng.standard_normal((3, 120))  # rSVD is exact on it
    a = bl.from_array(low_rank, tmp_path / "a.zarr", chunks=(32, 32))
    with LocalCluster(n_workers=1, threads_per_worker=2, processes=True, dashboard_address=":0",
                      host="127.0.0.1") as cluster, Client(cluster, set_as_default=False) as client:
        before = client.run(worker_probe.settings)
        assert not any(client.run(worker_probe.blocklin_imported).values())
        c = bl.matmul(a, a, tmp_path / "g.zarr", trans_a=True, memory="256KiB", scheduler=client)
        s = bl.svd(a, 3, memory="320KiB", scheduler=client, seed=0)
        assert all(client.run(worker_probe.blocklin_imported).values())
        after = client.run(worker_probe.settings)
    for worker, (blas, io) in before.items():  # libraries loaded by the job itself are not compared
        assert after[worker][1] == io
        assert {lib: after[worker][0][lib] for lib in blas} == blas
    assert_gram(c.to_numpy(), a.to_numpy().T @ a.to_numpy(), a.to_numpy())
    np.testing.assert_allclose(s.s, np.linalg.svd(a.to_numpy(), compute_uv=False)[:3], rtol=1e-8)


def test_plans_come_from_the_workers(tmp_path, client):
    """memory= is per worker process; row passes split over every thread; reports name the workers."""
    from blocklin.errors import BudgetError

    rng = np.random.default_rng(14)
    tall = rng.standard_normal((640, 40))
    a = bl.from_array(tall, tmp_path / "t.zarr", chunks=(32, 40))
    lam = 0.5
    b = tall @ rng.standard_normal(40)
    x = bl.solve(a, b, lam=lam, memory="64MiB", scheduler=client)
    ref = np.linalg.lstsq(np.vstack([tall, lam * np.eye(40)]), np.concatenate([b, np.zeros(40)]), rcond=None)[0]
    # float64 normal equations at cond <= 1 + (s1/lam)^2 ~ 1e4: 1e-9 leaves a wide margin over eps * cond
    np.testing.assert_allclose(x.to_numpy().ravel(), ref, rtol=1e-9, atol=1e-12)
    rep = x.report
    assert rep["cluster"]["threads"] == 2 and rep["cluster"]["workers"] == 2
    workers = set(client.scheduler_info(n_workers=-1)["workers"])
    # a 64 MiB budget holds the whole 640 x 40 operand, yet both workers got a share of the pass
    assert set(rep["worker_peak_memory"]) == workers
    assert all(p > 0 for p in rep["worker_peak_memory"].values())
    limit = min(w["memory_limit"] for w in client.scheduler_info(n_workers=-1)["workers"].values())
    with pytest.raises(BudgetError, match="memory: is the budget of each worker process.*Fix: pass memory="):
        bl.solve(a, b, lam=lam, memory=2 * limit, scheduler=client)


def test_device_is_resolved_on_the_workers(tmp_path, client):
    """device='auto' follows the workers (no GPU there: CPU); 'gpu' without worker GPUs is refused."""
    from blocklin.errors import DeviceError

    a = np.arange(12.0).reshape(3, 4)
    c = bl.matmul(a, a.T, memory="64MiB", scheduler=client, device="auto")
    assert c.report["device"] == "cpu" and c.report["cluster"]["gpus"] == 0
    np.testing.assert_array_equal(c.to_numpy(), a @ a.T)
    with pytest.raises(DeviceError, match="device: 'gpu' on a cluster needs a GPU on every worker.*Fix: run one worker per GPU"):
        bl.matmul(a, a.T, memory="64MiB", scheduler=client, device="gpu")
