"""Storage on a process-based ``LocalCluster``: the temp dir check, and data written by the workers.

Workers are separate processes, so a ``memory://`` temp dir (one per process) is exactly the case of
a temp dir the workers cannot see; an S3 API server on loopback is the shared storage.
"""

from __future__ import annotations

import numpy as np
import pytest

import blocklin
from blocklin.errors import BudgetError, TempDirError
from blocklin.storage.backend import backend
from blocklin.storage.recorded_peaks import recorded
from blocklin.storage.records import PEAKS_COLUMNS, PEAKS_RECORD
from blocklin.storage.location import as_location

distributed = pytest.importorskip("distributed")

RNG = np.random.default_rng(3)
A = RNG.standard_normal((150, 70))
B = RNG.standard_normal((70, 40))


@pytest.fixture(scope="module")
def client():
    cluster = distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                                       dashboard_address=None)
    with distributed.Client(cluster) as c:
        yield c
    cluster.close()


def _ran_on_workers(ts: list, name: str) -> bool:
    return any(name in str(t.get("key")) for t in ts)


def test_unreachable_temp_dir_fails_up_front_with_the_fix(client, s3):
    base, opts = s3
    blocklin.from_array(A, f"{base}/A.zarr", chunks=(50, 35), storage_options=opts)
    with pytest.raises(TempDirError, match=r"BLOCKLIN_TEMP_DIR.*temp_dir=.*s3://") as err:
        blocklin.matmul(f"{base}/A.zarr", B, f"{base}/C.zarr", storage_options=opts, temp_dir="memory://tmp",
                        scheduler=client)
    assert "2 of 2 workers" in str(err.value)
    assert not backend(as_location(f"{base}/C.zarr", opts)).keys("")  # nothing started


def test_gemm_on_cluster_with_s3_data_and_temp(client, s3, tmp_path):
    base, opts = s3
    blocklin.from_array(A, tmp_path / "A.zarr", chunks=(50, 35))
    ref = blocklin.matmul(tmp_path / "A.zarr", B, tmp_path / "C.zarr", memory="2MiB", scheduler="sync")
    blocklin.from_array(A, f"{base}/A.zarr", chunks=(50, 35), storage_options=opts)
    import dask.array as da

    got = blocklin.matmul(f"{base}/A.zarr", da.from_array(B, chunks=(30, 40)), f"{base}/C.zarr", memory="2MiB",
                          storage_options=opts, temp_dir=f"{base}/tmp", scheduler=client)
    np.testing.assert_array_equal(got.to_numpy(), ref.to_numpy())
    assert got.report["scheduler"] == "distributed"
    assert not backend(as_location(f"{base}/tmp", opts)).keys("")  # the staged B is gone
    assert not [p for p in (tmp_path / "blocklin-tmp").iterdir()]  # and nothing went to a local disk


def test_random_from_array_and_convert_write_from_workers(client, s3, tmp_path):
    import dask.array as da
    from distributed import get_task_stream

    base, opts = s3
    ref = blocklin.random(tmp_path / "R.zarr", (90, 30), seed=5, chunks=(20, 30))
    with get_task_stream(client) as ts:
        r = blocklin.random(f"{base}/R.zarr", (90, 30), seed=5, chunks=(20, 30), storage_options=opts,
                            scheduler=client)
    np.testing.assert_array_equal(r.to_numpy(), ref.to_numpy())
    assert _ran_on_workers(ts.data, "_random_rows_task")

    x = da.from_array(A, chunks=(40, 70))
    with get_task_stream(client) as ts:
        m = blocklin.from_array(x, f"{base}/X.zarr", chunks=(50, 35), storage_options=opts, scheduler=client)
    np.testing.assert_array_equal(m.to_numpy(), A)
    assert _ran_on_workers(ts.data, "write_block_task")

    with get_task_stream(client) as ts:
        rep = blocklin.convert(f"{base}/X.zarr", f"{base}/Y.zarr", chunks=(30, 70), dtype="float32",
                               storage_options=opts, scheduler=client, memory="128KiB")
    assert rep["on_cluster"] and _ran_on_workers(ts.data, "_copy_block_task")
    y = blocklin.open(f"{base}/Y.zarr", storage_options=opts)
    assert y.chunks == (30, 70)
    np.testing.assert_array_equal(y.to_numpy(), A.astype(np.float32))
    # the chunks, the metadata, and the peaks the workers saw, recorded with the output's stamp
    assert sorted(backend(y.location).keys("")) == sorted(["zarr.json", PEAKS_RECORD, PEAKS_COLUMNS] + [f"c/{i}/0" for i in range(5)])
    assert rep["peaks_recorded"]
    want = np.abs(A.astype(np.float32)).max(axis=0).astype(np.float64)
    np.testing.assert_array_equal(recorded(y.location, y.shape).columns, want)
    # a wide output: its rows' peaks (the side an SVD streams), merged from the workers' blocks
    blocklin.from_array(A.T.copy(), f"{base}/W.zarr", chunks=(35, 50), storage_options=opts)
    rep = blocklin.convert(f"{base}/W.zarr", f"{base}/W2.zarr", chunks=(35, 30), storage_options=opts,
                           scheduler=client, memory="128KiB")
    w = blocklin.open(f"{base}/W2.zarr", storage_options=opts)
    assert rep["on_cluster"] and rep["peaks_recorded"]
    np.testing.assert_array_equal(recorded(w.location, w.shape, transposed=True).columns, np.abs(A).max(axis=0))
    rw = blocklin.random(f"{base}/RW.zarr", (30, 90), seed=5, chunks=(10, 90), storage_options=opts, scheduler=client)
    np.testing.assert_array_equal(recorded(rw.location, rw.shape, transposed=True).columns,
                                  np.abs(rw.to_numpy()).max(axis=1))


def test_eigsh_of_numpy_data_on_cluster_with_s3_temp_runs_at_the_named_minimum(client, s3):
    """NumPy data staged by the cluster in an S3 temp dir is chunked from the budget, and S3 reads
    decode whole chunks: the minimum an eigsh refusal names runs (it had been refused again, by 3.5%)."""
    import scipy.linalg

    base, opts = s3
    q, _ = np.linalg.qr(np.random.default_rng(0).standard_normal((80, 80)))
    a = q * np.concatenate([np.linspace(-1, 1, 76), np.linspace(10, 20, 4)]) @ q.T
    a = (a + a.T) / 2

    def run(memory):
        return blocklin.eigsh(a, 4, memory=memory, storage_options=opts, temp_dir=f"{base}/tmp", scheduler=client,
                              order="ascending", tol=1e-10, seed=0)

    with pytest.raises(BudgetError) as err:
        run(16 << 10)
    res = run(err.value.minimum)  # not refused again
    assert not res.report["in_core"] and res.report["scheduler"] == "distributed"
    np.testing.assert_allclose(res.w, scipy.linalg.eigh(a, eigvals_only=True)[-4:], rtol=1e-9, atol=1e-9)
    assert not backend(as_location(f"{base}/tmp", opts)).keys("")  # the staged copy is gone


def test_factor_and_solve_on_cluster_with_s3_data_and_temp(client, s3):
    """Operands, outputs and the temp dir in the bucket, the workers reading and writing them with the
    call's storage_options: the square solve (LU, told square with those options), the Cholesky factor
    and the QR against NumPy. Bounds: forward error ``8 n eps cond(A) ||x||`` (Higham Thm 7.2, 9.4),
    ``||A - L L^T|| <= 2 n eps ||L||^2`` (Thm 10.3), ``||A - Q R|| <= 4 m eps ||A||`` (Thm 19.4)."""
    from support.tolerances import assert_factorization, assert_orthonormal, assert_solve

    base, opts = s3
    rng = np.random.default_rng(9)
    n = 70
    g = rng.standard_normal((n, n))
    sq = g + 8 * np.eye(n)
    spd = g @ g.T / n + np.eye(n)
    rhs = rng.standard_normal((n, 2))
    for name, x in (("sq", sq), ("spd", spd), ("rhs", rhs), ("tall", A)):
        blocklin.from_array(x, f"{base}/{name}.zarr", chunks=(35, 35), storage_options=opts)
    kw = {"memory": "512KiB", "storage_options": opts, "temp_dir": f"{base}/tmp", "scheduler": client}
    x = blocklin.solve(f"{base}/sq.zarr", f"{base}/rhs.zarr", out=f"{base}/x.zarr", **kw)
    assert x.report["method"] == "lu" and x.report["scheduler"] == "distributed"
    assert_solve(x.to_numpy(), np.linalg.solve(sq, rhs), sq)
    L = blocklin.cholesky(f"{base}/spd.zarr", f"{base}/L.zarr", **kw).to_numpy()
    assert_factorization(spd, L @ L.T, factors=(L, L))
    q, r = blocklin.qr(f"{base}/tall.zarr", f"{base}/R.zarr", q=f"{base}/Q.zarr", mode="reduced", **kw)
    q, r = q.to_numpy(), r.to_numpy()
    assert_factorization(A, q @ r, const=4.0)
    assert_orthonormal(q, const=4.0)
    assert not backend(as_location(f"{base}/tmp", opts)).keys("")  # nothing staged is left
