"""The same GEMM on a distributed LocalCluster (2 worker processes, loopback) as locally."""

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
    c = Client(cluster)
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
