"""Planner properties: every plan fits its budget and covers the output exactly once."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from blocklin.errors import BudgetError
from blocklin.plan import auto_chunks, plan_gemm
from blocklin.plan.passes import PassMemory, plan_pass, plan_row_pass
from blocklin.config import parse_size, ConfigError


@settings(derandomize=True, max_examples=150, deadline=None)
@given(m=st.integers(1, 5000), n=st.integers(1, 5000), k=st.integers(1, 5000),
       cm=st.integers(1, 700), cn=st.integers(1, 700), ck=st.integers(1, 700),
       dtype=st.sampled_from(["float32", "float64"]), memory=st.integers(2**14, 2**28),
       workers=st.integers(1, 4), with_c=st.booleans())
def test_gemm_plan_fits_and_covers(m, n, k, cm, cn, ck, dtype, memory, workers, with_c):
    try:
        plan = plan_gemm(m, n, k, dtype, a_chunks=(cm, ck), b_chunks=(ck, cn), memory=memory, workers=workers,
                         cores=4, c_chunks=(cm, cn) if with_c else None)
    except BudgetError as exc:
        assert "at least" in str(exc)
        # the minimum it names plans (what callers retry with)
        assert exc.minimum is not None and exc.minimum > memory
        again = plan_gemm(m, n, k, dtype, a_chunks=(cm, ck), b_chunks=(ck, cn), memory=exc.minimum, workers=workers,
                          cores=4, c_chunks=(cm, cn) if with_c else None)
        assert again.peak_memory <= exc.minimum
        return
    assert plan.peak_memory <= memory
    cover = np.zeros((min(m, 300), min(n, 300)), dtype=np.int32)
    count = 0
    for _, _, rows, cols in plan.tiles():
        count += 1
        cover[rows.start:min(rows.stop, 300), cols.start:min(cols.stop, 300)] += 1
        # whole output chunks per tile: starts on chunk boundaries
        assert rows.start % plan.out_chunks[0] == 0 and cols.start % plan.out_chunks[1] == 0
    assert count == plan.n_tasks
    assert (cover == 1).all()
    assert sum(b - a for a, b in plan.k_panels()) == k
    assert plan.flops == 2 * m * n * k
    assert plan.workers * plan.blas_threads <= max(4, plan.workers)


def test_gemm_plan_prefers_reading_each_operand_once_when_possible():
    plan = plan_gemm(2048, 2048, 2048, "float64", a_chunks=(256, 256), b_chunks=(256, 256), memory=2**30)
    assert plan.n_tasks == 1
    assert plan.bytes_read == 2 * 2048 * 2048 * 8


def test_gemm_plan_budget_error_names_minimum():
    # One 500 x 500 tile with 50-wide panels (a tenth of a chunk, the narrowest planned).
    with pytest.raises(BudgetError, match=r"50-wide panels.*raise it to at least 12.21 MiB \(memory='13MiB'\)"):
        plan_gemm(1000, 1000, 1000, "float64", a_chunks=(500, 500), b_chunks=(500, 500), memory=2**16)
    plan = plan_gemm(1000, 1000, 1000, "float64", a_chunks=(500, 500), b_chunks=(500, 500), memory=13 * 2**20)
    assert plan.peak_memory <= 13 * 2**20


@settings(derandomize=True, max_examples=60, deadline=None)
@given(m=st.integers(1, 4000), n=st.integers(1, 4000), k=st.integers(1, 4000), c=st.integers(16, 700),
       device_memory=st.integers(2**14, 2**26), workers=st.integers(1, 3))
def test_gemm_plan_device_budget_minimum_plans(m, n, k, c, device_memory, workers):
    """On a GPU with a roomy host budget the refusal names the device budget's minimum, and it plans."""
    kw = dict(a_chunks=(c, c), b_chunks=(c, c), memory=2**34, workers=workers, cores=4, device="gpu")
    try:
        plan_gemm(m, n, k, "float64", device_memory=device_memory, **kw)
    except BudgetError as exc:
        assert "device_memory" in str(exc) and exc.minimum > device_memory
        again = plan_gemm(m, n, k, "float64", device_memory=exc.minimum, **kw)
        assert again.device_peak <= exc.minimum


@settings(derandomize=True, max_examples=100, deadline=None)
@given(m=st.integers(1, 100000), row_bytes=st.integers(1, 10**5), chunk=st.integers(1, 5000),
       memory=st.integers(2**16, 2**30), workers=st.integers(1, 3))
def test_row_pass_plan_fits_and_covers(m, row_bytes, chunk, memory, workers):
    try:
        plan = plan_row_pass(m, row_bytes, chunk_rows=chunk, memory=memory, workers=workers, cores=2)
    except BudgetError:
        assert memory // workers < 2 * row_bytes
        return
    assert plan.peak_memory <= memory
    rows = [s for g in range(len(plan.groups)) for s in plan.strips(g)]
    assert rows[0][0] == 0 and rows[-1][1] == m
    assert all(a[1] == b[0] for a, b in zip(rows, rows[1:]))


@settings(derandomize=True, max_examples=150, deadline=None)
@given(m=st.integers(1, 100000), row_bytes=st.integers(1, 10**5), chunk=st.integers(1, 5000),
       memory=st.integers(2**16, 2**30), workers=st.integers(1, 3), fixed=st.integers(0, 2**24),
       per_row=st.integers(0, 10**5), temporaries=st.booleans(), cap=st.sampled_from([None, 2**20, 96 * 2**20]),
       min_rows=st.sampled_from([1, 64]), reserve=st.integers(0, 2**20), across=st.integers(1, 8))
def test_kernel_pass_plan_fits_its_declaration(m, row_bytes, chunk, memory, workers, fixed, per_row, temporaries,
                                               cap, min_rows, reserve, across):
    """What a kernel declares (PassMemory) plus the streamed rows fits the budget left after ``reserve``."""
    mem = PassMemory(fixed=fixed, per_row=per_row, chunk_temporaries=temporaries, max_strip_bytes=cap,
                     min_rows=min_rows)
    try:
        plan = plan_pass(mem, m, row_bytes, chunk_rows=chunk, memory=memory, reserve=reserve, workers=workers,
                         cores=2, chunks_across=across)
    except BudgetError as exc:
        assert "at least" in str(exc)
        return
    # every task holds its declared fixed bytes (plus chunk temporaries) and prefetch + 1 strips
    assert plan.peak_memory <= memory - reserve
    assert plan.peak_memory >= plan.workers * (fixed + (2 * row_bytes + per_row) * plan.strip)
    if temporaries:
        assert plan.fixed_bytes >= fixed + 3 * chunk * row_bytes  # at least one chunk in flight
    if cap is not None:
        assert plan.strip <= max(chunk, cap // row_bytes)
    # a kernel that needs min_rows rows per strip is refused rather than planned below that
    assert memory - reserve >= workers * (fixed + (2 * row_bytes + per_row) * min(m, min_rows))
    rows = [s for g in range(len(plan.groups)) for s in plan.strips(g)]
    assert rows[0][0] == 0 and rows[-1][1] == m
    assert all(a[1] == b[0] for a, b in zip(rows, rows[1:]))


@pytest.mark.parametrize("shape,dtype,memory", [((8192, 8192), "f8", 2**30), ((400000, 1000), "f8", 2**30),
                                                ((10, 10), "f4", None), ((1, 10**6), "f8", 2**20)])
def test_auto_chunks(shape, dtype, memory):
    c = auto_chunks(shape, dtype, memory)
    assert 1 <= c[0] <= shape[0] and 1 <= c[1] <= shape[1]
    assert c[0] * c[1] * np.dtype(dtype).itemsize <= 16 * 2**20


@pytest.mark.parametrize("text,value", [("1GiB", 2**30), ("512 MiB", 512 * 2**20), ("1e9", 10**9), ("2GB", 2 * 10**9),
                                        (4096, 4096)])
def test_parse_size(text, value):
    assert parse_size(text) == value


@pytest.mark.parametrize("text", ["lots", "-1GiB", "0", "1 parsec", True])
def test_parse_size_errors(text):
    with pytest.raises(ConfigError, match="memory: .*Fix:"):
        parse_size(text)


@settings(derandomize=True, max_examples=150, deadline=None)
@given(m=st.integers(1, 100000), row_bytes=st.integers(1, 10**4), chunk=st.integers(2, 5000),
       memory=st.integers(2**16, 2**28), workers=st.integers(1, 3), fixed=st.integers(0, 2**20),
       per_row=st.integers(0, 10**4), cache=st.booleans())
def test_whole_chunk_reads_cached_or_counted(m, row_bytes, chunk, memory, workers, fixed, per_row, cache):
    """Strips narrower than chunks read whole either keep the chunk band (counted in the plan, each chunk
    read once, tasks cut on chunk boundaries) or count the re-reads; read-ahead never costs strip height."""
    mem = PassMemory(fixed=fixed, per_row=per_row)
    kw = dict(chunk_rows=chunk, memory=memory, workers=workers, cores=2, partial_rows=False)
    try:
        plan = plan_pass(mem, m, row_bytes, cache_bytes=chunk * row_bytes if cache else 0, **kw)
    except BudgetError:
        return
    assert plan.peak_memory <= memory
    assert plan.peak_memory >= plan.workers * (fixed + plan.cache_bytes
                                               + ((plan.prefetch + 1) * row_bytes + per_row) * plan.strip)
    if plan.cached:
        assert cache and plan.rereads == 1 and plan.loaders == 1 and plan.cache_bytes == chunk * row_bytes
        assert chunk % plan.strip != 0 or all(r0 % chunk == 0 for r0, _ in plan.groups)
        assert plan.bytes_read == m * row_bytes
        assert "decoded once" in plan.explain()
    elif plan.strip < chunk and m > plan.strip:
        assert plan.rereads == -(-chunk // plan.strip)
        assert plan.bytes_read == m * row_bytes * plan.rereads
    assert 1 <= plan.prefetch <= 3
    rows = [s for g in range(len(plan.groups)) for s in plan.strips(g)]
    assert rows[0][0] == 0 and rows[-1][1] == m
    assert all(a[1] == b[0] for a, b in zip(rows, rows[1:]))


def test_read_ahead_from_the_budget():
    """A roomy budget reads up to 3 strips ahead with 2 loaders (direct reads); a tight one keeps one
    strip ahead rather than shorter strips; reads through zarr keep one loader."""
    mem = PassMemory(fixed=0, per_row=0)
    roomy = plan_pass(mem, 10000, 8000, chunk_rows=1000, memory=2**30, partial_rows=True, direct=True, loaders=2)
    one = plan_row_pass(10000, 8000, chunk_rows=1000, memory=2**30, prefetch=1)
    assert roomy.prefetch == 3 and roomy.loaders == 2 and roomy.strip == one.strip == 3000  # canonical tasks
    # plan_pass also counts threaded BLAS's copy of the strip (one more row_bytes per row)
    tight = plan_pass(mem, 10000, 8000, chunk_rows=1000, memory=50 * 2**20, partial_rows=True, direct=True, loaders=2)
    one = plan_row_pass(10000, 8000, chunk_rows=1000, memory=50 * 2**20, prefetch=1, strip_extra_row_bytes=8000)
    assert tight.prefetch == 1 and tight.strip == one.strip == 2000 and tight.peak_memory <= 50 * 2**20
    zarr_reads = plan_pass(PassMemory(chunk_temporaries=True), 10000, 8000, chunk_rows=1000, memory=2**30, loaders=2)
    assert zarr_reads.loaders == 1


def _kernel_plan(m, row_bytes, memory, cores=2):
    """``plan(workers, prefetch)`` as :func:`blocklin.runtime.passes.plan_kernel_pass` builds it."""
    mem = PassMemory(fixed=0, per_row=240)
    return lambda w, prefetch=None: plan_pass(mem, m, row_bytes, chunk_rows=2048, memory=memory, workers=w,
                                              cores=cores, partial_rows=True, direct=True, loaders=2,
                                              prefetch=prefetch)


def test_cpu_row_passes_split_between_tasks_when_the_budget_holds_them():
    """Unset concurrency: two tasks of one BLAS thread each (reading one strip ahead) where strips stay
    at least PASS_WORKERS_MIN_STRIP; else one task, which also keeps to one BLAS thread; a GPU pass keeps
    one task with every core. The strips never depend on the cores (the sums would)."""
    from blocklin.plan.passes import PASS_WORKERS, PASS_WORKERS_MIN_STRIP, pass_workers

    big = pass_workers(_kernel_plan(100000, 4000, 96 << 20), "cpu")
    assert (big.workers, big.blas_threads, big.prefetch, big.loaders) == (PASS_WORKERS, 1, 1, 1)
    assert big.strip * big.row_bytes >= PASS_WORKERS_MIN_STRIP and big.peak_memory <= 96 << 20
    assert pass_workers(_kernel_plan(100000, 4000, 96 << 20, cores=8), "cpu").strip == big.strip
    assert pass_workers(_kernel_plan(100000, 4000, 96 << 20, cores=8), "cpu").blas_threads == 4
    tight = pass_workers(_kernel_plan(100000, 4000, 3 << 20), "cpu")  # two tasks' strips would be < 1 MiB
    one = _kernel_plan(100000, 4000, 3 << 20)(1)
    assert (tight.workers, tight.blas_threads, tight.strip) == (1, 1, one.strip)
    small = pass_workers(_kernel_plan(4000, 320, 96 << 20), "cpu")  # one task's rows (canonical split)
    assert (small.workers, small.blas_threads, len(small.groups)) == (1, 1, 1)
    gpu = pass_workers(_kernel_plan(100000, 4000, 96 << 20), "gpu")
    assert (gpu.workers, gpu.blas_threads) == (1, 2)


def test_row_pass_strips_same_locally_and_on_a_one_thread_cluster():
    """A cluster whose workers run one task thread each plans a row pass as the local schedulers do
    (the same strips, so the same sums), with a ``workers=`` setting too; a setting is planned as given
    locally. (``Job.workers`` on a cluster is its threads per worker, whatever the setting.)"""
    from types import SimpleNamespace

    from blocklin.linalg.blocks.tall_kernels import normal_kernel
    from blocklin.runtime.passes import Source, plan_kernel_pass

    src = Source(path="a.zarr", name="a", rows=100000, width=500, dtype=np.dtype("float64"), chunk_rows=2048,
                 chunk_bytes=2048 * 500 * 8, chunks_across=1, reads="direct")
    params = {"Q": np.zeros((500, 30)), "gram": False, "write_y": False}

    def job(cluster_threads, setting=None):
        cluster = SimpleNamespace(threads_per_worker=cluster_threads) if cluster_threads else None
        return SimpleNamespace(cfg=SimpleNamespace(memory=96 << 20, workers=setting), device="cpu",
                               cluster=lambda: cluster, cores=lambda: 2,
                               workers=lambda d=1: cluster.threads_per_worker if cluster else setting or d)

    local = plan_kernel_pass(job(None), normal_kernel, [src], params)
    assert local.workers == 2 and local.strip == 2048
    assert plan_kernel_pass(job(1), normal_kernel, [src], params).strip == local.strip
    assert plan_kernel_pass(job(4), normal_kernel, [src], params).workers == 4
    given = plan_kernel_pass(job(None, setting=1), normal_kernel, [src], params)
    assert given.workers == 1 and given.blas_threads == 2
    # the setting's strips on the cluster too (they had been one task's, twice these)
    four = plan_kernel_pass(job(None, setting=4), normal_kernel, [src], params)
    assert four.strip < local.strip and plan_kernel_pass(job(1, setting=4), normal_kernel, [src], params).strip == four.strip
