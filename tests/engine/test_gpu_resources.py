"""GPU resources on the CuPy stand-in: the device budget every device task holds, pinned host memory
within the host budget, and one GPU per worker."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from support import cupy_standin

import blocklin as bl
from blocklin.device.cuda import CudaDevice, DeviceBudget
from blocklin.config import parse_size
from blocklin.device.workers import gpu_for_worker
from blocklin.errors import DeviceError
from support.tolerances import assert_gram, assert_product, assert_ritz_values




def _spd(n, seed=0):
    g = np.random.default_rng(seed).standard_normal((n, n))
    return g @ g.T / n + np.eye(n)


# -- one device budget for every device task ----------------------------------------------------------
def test_factorization_tile_tasks_share_the_device_budget(standin):
    """Cholesky's tile tasks (GEMM updates, POTRF, TRSM) hold their tiles from the GPU's one budget:
    three concurrent tasks whose tiles together exceed it take turns."""
    t, n = 32, 160
    a = _spd(n)
    one_task = 5 * t * t * 8  # cholesky_tile_task: accumulator, two factor tiles, L(j,j), the solve
    budget = DeviceBudget.of(0)
    f = bl.cholesky(a, tile=t, device="gpu", workers=3, scheduler="threads", device_memory=one_task + 1024)
    # Cholesky's backward error is about n eps ||A|| (Higham 2002, Thm. 10.3): 4 n eps as a forward
    # bound for cond(A) of a few
    np.testing.assert_allclose(f[...], np.linalg.cholesky(a), rtol=0, atol=4 * n * np.finfo(float).eps * 4)
    assert budget.peak == one_task  # never two tasks at once within a budget for one
    assert budget.held == 0
    budget.peak = 0
    bl.cholesky(a, tile=t, device="gpu", workers=3, scheduler="threads", device_memory="64MiB")
    assert one_task <= budget.peak <= 3 * one_task and budget.held == 0
    assert cupy_standin.take_races() == []


@pytest.fixture
def holds(monkeypatch):
    """The bytes of every ``DeviceBudget.hold`` during the test, in order."""
    seen = []
    hold = DeviceBudget.hold

    def record(self, nbytes, limit):
        seen.append(nbytes)
        return hold(self, nbytes, limit)

    monkeypatch.setattr(DeviceBudget, "hold", record)
    return seen


@pytest.mark.parametrize("op", ["syrk", "trsm", "lu", "qr"])
def test_every_block_operation_holds_the_device_budget(standin, holds, op):
    rng = np.random.default_rng(4)
    n, t = 96, 32
    budget = DeviceBudget.of(0)
    if op == "syrk":
        x = rng.standard_normal((200, n))
        g = bl.gram(x, device="gpu", memory="256KiB")
        assert_gram(g[...], x.T @ x, x)
    elif op == "trsm":
        low = np.tril(rng.standard_normal((n, n))) / 8 + 2 * np.eye(n)
        b = rng.standard_normal((n, 3))
        x = bl.solve_triangular(low, b, lower=True, tile=t, device="gpu")[...]
        np.testing.assert_allclose(low @ x, b, rtol=0, atol=1e-12)
    elif op == "lu":
        g = rng.standard_normal((n, n))
        f = bl.lu(g, tile=t, device="gpu")
        import scipy.linalg as sl

        np.testing.assert_allclose(f[...], sl.lu_factor(g)[0], rtol=0, atol=1e-11)
    else:
        a = rng.standard_normal((120, n))
        q, r = bl.qr(a, mode="reduced", tile=t, device="gpu")
        assert np.linalg.norm(a - q[...] @ r[...]) <= 4 * 120 * np.finfo(float).eps * np.linalg.norm(a)
    assert holds and min(holds) > 0 and budget.held == 0
    assert cupy_standin.take_races() == []


@pytest.mark.parametrize("op", ["svd", "eigsh"])
def test_in_memory_steps_hold_the_device_budget(standin, holds, op):
    """A matrix that fits is kept on the GPU for the whole job: held from the shared budget until it ends."""
    rng = np.random.default_rng(5)
    a = rng.standard_normal((300, 40))
    budget = DeviceBudget.of(0)
    if op == "svd":
        # tol=10 sqrt(eps): converged to rounding (the default targets the singular values to 10 sqrt(eps))
        u, s, vt = bl.svd(a, 5, device="gpu", memory="64MiB", tol=10 * np.sqrt(np.finfo(np.float64).eps))
        exact = np.linalg.svd(a, compute_uv=False)
        assert_ritz_values(s, exact[:5], spectrum=exact, residuals=np.asarray(u.report["residuals"]), n=a.shape[0],
                           norm=exact[0])
        assert u.report["phases"]["products with A"] == "gpu"
    else:
        m = a.T @ a
        w, _ = bl.eigsh(m, 5, order="descending", device="gpu", memory="64MiB")
        exact = np.linalg.eigvalsh(m)
        assert_ritz_values(w, exact[::-1][:5], spectrum=exact, residuals=10 * np.sqrt(np.finfo(np.float64).eps) * w,
                           n=m.shape[0], norm=exact[-1])
    assert int(1.5 * a.nbytes) in holds or int(1.5 * (a.T @ a).nbytes) in holds
    assert budget.held == 0  # released when the job ends
    assert cupy_standin.take_races() == []


# -- pinned host memory ---------------------------------------------------------------------------
def test_cached_pinned_buffers_of_other_shapes_are_unpinned_before_pinning_more(standin):
    """Pinned buffers of an earlier plan were kept cached on top of the next plan's, beyond ``memory=``."""
    dev = CudaDevice.current()
    first = [dev.host_empty((64, 64), np.float64) for _ in range(3)]
    for b in first:
        dev.release_host(b)
    del first, b
    assert cupy_standin.pinned_bytes_held() == 3 * 64 * 64 * 8
    again = dev.host_empty((64, 64), np.float64)  # same shape: reused, nothing pinned
    assert cupy_standin.pinned_bytes_held() == 3 * 64 * 64 * 8
    dev.release_host(again)
    del again
    other = dev.host_empty((32, 16), np.float32)
    assert cupy_standin.pinned_bytes_held() == 32 * 16 * 4  # the idle 64 x 64 buffers were unpinned
    dev.release_host(other)
    del other
    dev.release_pinned()
    assert cupy_standin.pinned_bytes_held() == 0
    assert cupy_standin.take_races() == []


def test_pinned_memory_stays_within_the_host_budget_across_plans(standin):
    """The inverse runs GEMMs of many shapes in one job: its pinned buffers stay within ``memory=``
    and are all unpinned when the job ends."""
    rng = np.random.default_rng(2)
    n = 256
    m = rng.standard_normal((n, n)) + np.sqrt(n) * np.eye(n)
    cupy_standin.STATE.pinned_peak = 0
    x = bl.inv(m, device="gpu", memory="384KiB")
    assert np.linalg.norm(np.eye(n) - m @ x.to_numpy()) < n * np.finfo(float).eps * np.linalg.norm(m) * \
        np.linalg.norm(x.to_numpy())
    assert x.report["gemm_steps"] > 2  # several GEMM plans in one job
    assert 0 < cupy_standin.STATE.pinned_peak <= 384 << 10
    assert cupy_standin.pinned_bytes_held() == 0
    assert cupy_standin.take_races() == []


def test_host_buffers_are_pinned_only_when_they_carry_enough_copies(standin):
    """Pinning a buffer that carries one or two copies costs more than pageable copies (measured on an
    H200 host: PIN_MIN_USES); such buffers come from the run's pool and nothing is pinned."""
    from blocklin.device.cuda import PIN_MIN_USES

    dev = CudaDevice.current()
    few = dev.host_empty((64, 64), np.float64, uses=PIN_MIN_USES - 1)
    assert cupy_standin.pinned_bytes_held() == 0 and not cupy_standin.is_pinned(few)
    many = dev.host_empty((64, 64), np.float64, uses=PIN_MIN_USES)
    default = dev.host_empty((64, 64), np.float64)  # callers that do not know: pinned, as before
    assert cupy_standin.is_pinned(many) and cupy_standin.is_pinned(default)
    for b in (few, many, default):
        dev.release_host(b)
    del few, many, default, b
    assert cupy_standin.pinned_bytes_held() == 2 * 64 * 64 * 8  # the pageable one is not cached as pinned
    dev.release_pinned()
    assert cupy_standin.pinned_bytes_held() == 0


@pytest.mark.parametrize("chunks, pinned", [((256, 256), False), ((32, 32), True)])
def test_gemm_pins_its_slots_only_when_the_job_reuses_them(standin, tmp_path, chunks, pinned):
    """One tile of two k-panels: pageable slots and download buffers (staged within their copy calls);
    many tiles and k-panels: pinned ones. Same product, no race, on either."""
    rng = np.random.default_rng(5)
    a, b = rng.standard_normal((256, 256)), rng.standard_normal((256, 192))
    A = bl.from_array(a, tmp_path / "a.zarr", chunks=chunks)
    cupy_standin.STATE.pinned_peak = 0
    memory, device_memory = ("64MiB", "64MiB") if not pinned else ("256KiB", "96KiB")
    c = bl.matmul(A, b, tmp_path / "c.zarr", device="gpu", memory=memory, device_memory=device_memory)
    assert_product(c.to_numpy(), a @ b, a, b)
    plan = c.report["plan"]
    uses = plan["n_tasks"] * plan["k_steps"] / min(plan["prefetch"] + 1, plan["k_steps"])
    assert (uses >= 3) == pinned, plan
    assert (cupy_standin.STATE.pinned_peak > 0) == pinned
    assert cupy_standin.pinned_bytes_held() == 0
    assert cupy_standin.take_races() == []


# -- one GPU per worker ---------------------------------------------------------------------------
def test_gpu_for_worker_mapping():
    assert gpu_for_worker(None, 4) is None  # not in a worker: CuPy's current device
    assert gpu_for_worker(0, 1) is None  # one GPU: nothing to map
    assert [gpu_for_worker(i, 4) for i in range(6)] == [0, 1, 2, 3, 0, 1]  # LocalCluster names 0 .. n-1
    assert gpu_for_worker("3", 4) == 3
    assert gpu_for_worker("tcp://10.0.0.1:4000", 4) is None  # no index in the name
    assert gpu_for_worker(2, 4, visible="2,3,0,1") is None  # dask-cuda: device 0 is the worker's own
    assert gpu_for_worker(2, 4, explicit="1") == 1  # BLOCKLIN_GPU wins
    with pytest.raises(DeviceError, match="BLOCKLIN_GPU.*below the 4 GPU"):
        gpu_for_worker(None, 4, explicit="4")
    with pytest.raises(DeviceError, match="BLOCKLIN_GPU"):
        gpu_for_worker(None, 4, explicit="first")


def test_each_worker_thread_drives_its_own_gpu(standin, monkeypatch):
    """Threads of workers 0..3 on a 4-GPU machine get devices 0..3, each with its own budget."""
    import distributed

    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.delenv("BLOCKLIN_GPU", raising=False)
    cupy_standin.STATE.device_count = 4
    seen = {}

    class FakeWorker:
        def __init__(self, name):
            self.name = name

    local = threading.local()
    monkeypatch.setattr(distributed, "get_worker", lambda: FakeWorker(local.name), raising=True)
    alive = threading.Barrier(4)

    def run(name):
        local.name = name
        dev = CudaDevice.current()
        seen[name] = (dev.device_id, standin.cuda.runtime.getDevice())
        with dev.reserve(100):
            seen[name] += (DeviceBudget.of(dev.device_id).held,)
        alive.wait()  # all four threads alive together: four thread identifiers, four devices

    threads = [threading.Thread(target=run, args=(name,)) for name in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert seen == {i: (i, i, 100) for i in range(4)}
    assert sorted(d.device_id for d in CudaDevice.instances()) == [0, 1, 2, 3]
    monkeypatch.setenv("BLOCKLIN_GPU", "2")
    CudaDevice.reset()
    alive = threading.Barrier(1)
    th = threading.Thread(target=run, args=("named-worker",))
    th.start()
    th.join()
    assert seen["named-worker"][:2] == (2, 2)


def test_a_local_cluster_on_two_gpus_runs_one_worker_per_gpu(standin, monkeypatch):
    """End to end: a two-worker LocalCluster (in-process, so the workers see the stand-in) on a machine
    with two GPUs multiplies with every worker on its own GPU, each within its own device budget."""
    from distributed import Client, LocalCluster

    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.delenv("BLOCKLIN_GPU", raising=False)
    cupy_standin.STATE.device_count = 2
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((256, 128)), rng.standard_normal((128, 192))
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=False, dashboard_address=":0") as cluster, \
            Client(cluster) as client:
        r = bl.matmul(a, b, scheduler=client, device="gpu", memory="256KiB", device_memory="128KiB")
    assert r.report["tasks"] > 2
    # blocked float64 sums over k = 128: 4 k eps relative to |A||B| (tests/conftest.py gemm_tol)
    assert np.all(np.abs(r.to_numpy() - a @ b) <= 4 * 128 * np.finfo(float).eps * (np.abs(a) @ np.abs(b)))
    assert sorted(d.device_id for d in CudaDevice.instances()) == [0, 1]
    assert all(0 < DeviceBudget.of(i).peak <= 128 << 10 for i in (0, 1))
    assert cupy_standin.take_races() == []


# -- devices that persist across the jobs of one process --------------------------------------------
@pytest.fixture
def limits(monkeypatch):
    """``(bytes, budget)`` of every ``DeviceBudget.hold`` during the test, in order."""
    seen = []
    hold = DeviceBudget.hold

    def record(self, nbytes, limit):
        seen.append((nbytes, limit))
        return hold(self, nbytes, limit)

    monkeypatch.setattr(DeviceBudget, "hold", record)
    return seen


@pytest.mark.parametrize("first, second", [("4MiB", "512MiB"), ("512MiB", "4MiB")])
def test_each_job_holds_its_own_device_budget(standin, limits, first, second):
    """A thread's device outlives the job that created it: the next job on the same threads holds its
    tasks to its own ``device_memory``, not the first job's (a smaller first budget serialized the
    second job's tasks; a larger one let the second exceed its budget)."""
    t, n = 32, 160
    a = _spd(n)
    budget = DeviceBudget.of(0)
    for mem in (first, second):
        del limits[:]
        budget.peak = 0
        f = bl.cholesky(a, tile=t, device="gpu", workers=4, scheduler="threads", device_memory=mem)
        # Cholesky's backward error is about n eps ||A|| (Higham 2002, Thm. 10.3): 4 n eps as a
        # forward bound for cond(A) of a few
        np.testing.assert_allclose(f[...], np.linalg.cholesky(a), rtol=0, atol=4 * n * np.finfo(float).eps * 4)
        want = parse_size(mem)
        assert limits and {lim for _, lim in limits} == {want}, (mem, {lim for _, lim in limits})
        assert budget.peak <= max(want, max(b for b, _ in limits)) and budget.held == 0
    assert cupy_standin.take_races() == []


def test_new_device_slots_replace_the_old_ones_without_holding_both(standin):
    """A change of slot shapes freed the old slots only after the new ones were allocated: the peak
    was old plus new."""
    dev = CudaDevice.current()
    dev.slots(2, [(64, 32), (32, 64)], np.float64)
    old = 2 * 2 * 64 * 32 * 8
    assert cupy_standin.STATE.device_used == old
    cupy_standin.STATE.device_peak = 0
    dev.slots(2, [(128, 32), (32, 128)], np.float64)
    new = 2 * 2 * 128 * 32 * 8
    assert cupy_standin.STATE.device_used == new
    assert cupy_standin.STATE.device_peak == new
    assert cupy_standin.take_races() == []


@pytest.mark.parametrize("workers", [1, 3])
def test_no_device_bytes_stay_allocated_after_a_job(standin, tmp_path, workers):
    """Each thread's panel slots outlived the job (CuPy's pool never returns live blocks, and the next
    job's default budget counted them as free): after a job, nothing blocklin allocated is live on
    the device, and the pool caches nothing either."""
    rng = np.random.default_rng(6)
    a, b = rng.standard_normal((256, 256)), rng.standard_normal((256, 192))
    A = bl.from_array(a, tmp_path / "a.zarr", chunks=(32, 32))
    base = cupy_standin.STATE.device_used
    c = bl.matmul(A, b, tmp_path / "c.zarr", device="gpu", memory="256KiB", device_memory="96KiB",
                  workers=workers, scheduler="threads")
    assert_product(c.to_numpy(), a @ b, a, b)
    assert cupy_standin.STATE.device_peak > base  # the job did use the device
    assert cupy_standin.STATE.device_used == base
    assert cupy_standin.STATE.device_cached == 0
    assert all(not inst._dev_slots for inst in CudaDevice.instances())
    assert cupy_standin.take_races() == []


# -- pinned memory as CuPy's pinned pool allocates it ------------------------------------------------
def test_pinned_bytes_are_counted_at_the_pinned_pool_block_size(standin):
    """CuPy's pinned pool serves each request with a power-of-two block: blocklin counted ``nbytes``
    (here 1.33-1.9x less than what the pool held)."""
    from blocklin.plan.gpu import pinned_nbytes

    dev = CudaDevice.current()
    shapes = [(3000, 300), (300, 1200), (600, 1200), (1000, 350), (7, 3)]
    bufs = [dev.host_empty(s, np.float64) for s in shapes]
    for s in shapes:
        n = int(np.prod(s)) * 8
        assert pinned_nbytes(n) == cupy_standin.pinned_block(n) and n <= pinned_nbytes(n) < 2 * n + 512
    for b in bufs:
        dev.release_host(b)
    del bufs, b
    held = cupy_standin.pinned_bytes_held()
    assert held > sum(int(np.prod(s)) * 8 for s in shapes)  # the shapes of real plans are rounded up
    assert dev.pinned_bytes() >= held
    dev.release_pinned()
    assert cupy_standin.pinned_bytes_held() == 0


@pytest.mark.parametrize("m, n, k, chunks, memory", [(3000, 3000, 3000, (600, 600), "48MiB"),
                                                      (5000, 3000, 7000, (1000, 700), "96MiB"),
                                                      (1200, 900, 1500, (300, 300), "8MiB")])
def test_gpu_gemm_plans_count_their_pinned_buffers_as_the_pool_allocates_them(m, n, k, chunks, memory):
    """A GPU GEMM task pins ``prefetch + 1`` pairs of panel slots and three download strips: the
    plan's host bytes hold them at the pinned pool's block sizes (reads straight into the slots, so
    no chunk temporaries hide a shortfall)."""
    from blocklin.plan.gemm import plan_gemm

    p = plan_gemm(m, n, k, np.float64, a_chunks=chunks, b_chunks=chunks, memory=parse_size(memory), device="gpu",
                  device_memory=parse_size(memory) * 2, reads=("direct", "direct"), direct_writes=True)
    block = cupy_standin.pinned_block
    strip = min(p.out_chunks[0], p.tm) * p.tn * 8
    pinned = (p.prefetch + 1) * (block(p.tm * p.tk * 8) + block(p.tk * p.tn * 8)) + 3 * block(strip)
    assert pinned <= p.task_memory and p.peak_memory <= parse_size(memory), p


def test_a_gpu_gemm_with_c_pins_no_staging_blocks_and_unpins_everything(standin, tmp_path):
    """``cupy.asarray`` of pageable data (C's strips, to_device) copies through a block of the pinned
    pool that stays pinned after the copy: the device copies straight from host memory instead, the
    pinned peak stays within the plan's host bytes, and nothing stays pinned after the job."""
    rng = np.random.default_rng(7)
    a, b, c0 = rng.standard_normal((288, 224)), rng.standard_normal((224, 160)), rng.standard_normal((288, 160))
    A = bl.from_array(a, tmp_path / "a.zarr", chunks=(48, 56))
    C0 = bl.from_array(c0, tmp_path / "c0.zarr", chunks=(48, 40))
    cupy_standin.STATE.pinned_peak = 0
    cupy_standin.STATE.counts.clear()
    c = bl.matmul(A, b, tmp_path / "c.zarr", c=C0, beta=0.5, device="gpu", memory="384KiB", device_memory="160KiB")
    assert_product(c.to_numpy() - 0.5 * c0, a @ b, a, b)
    assert cupy_standin.STATE.counts.get("asarray pinned staging", 0) == 0
    assert 0 < cupy_standin.STATE.pinned_peak <= c.report["plan"]["peak_memory"]
    assert cupy_standin.pinned_bytes_held() == 0
    assert cupy_standin.take_races() == []
