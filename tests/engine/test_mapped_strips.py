"""Strips mapped from the page cache (``blocklin.storage.mapped``, ``RawChunks.mapped``).

A mapped strip holds the stored bytes, read-only, and its mapping goes with its last view; a row
pass that maps its input (a job's first, which takes its peaks from the mapped strips a piece at a
time, or a later one) gives the bits of one that copies it, on every scheduler; inputs the probe
finds in small pages, scaled, transposed or compressed inputs and GPU passes are copied as before.
"""

from __future__ import annotations

import gc
import os

import numpy as np
import pytest

import blocklin as bl
from blocklin.errors import StoreReadError
from blocklin.plan.passes import PassMemory
from blocklin.runtime import passes
from blocklin.runtime.job import Job
from blocklin.runtime.passes import row_kernel, run_pass, source
from blocklin.runtime.tiles import open_array
from blocklin.storage import mapped as mapping
from blocklin.storage import rawchunks
from support.memcheck import margin, needs_hwm, run_child

pytestmark = pytest.mark.skipif(not mapping.AVAILABLE, reason="strips are mapped on Linux only")


@pytest.fixture
def stored(tmp_path):
    """float64, chunks of 128 x 32 (32 KiB: whole pages), a short last chunk row."""
    x = np.random.default_rng(11).standard_normal((1000, 32))
    return x, bl.from_array(x, tmp_path / "x.zarr", chunks=(128, 32))


def _raw(a):
    return rawchunks.raw_access(open_array(a.path))


def _mapped_files() -> str:
    with open("/proc/self/maps") as f:
        return f.read()


@pytest.mark.parametrize("rows", [(0, 128), (0, 1000), (2, 120), (100, 300), (126, 130), (512, 1000), (998, 1000)])
def test_mapped_rows_are_the_stored_rows_read_only(stored, rows):
    x, a = stored
    raw = _raw(a)
    assert raw.maps(slice(0, 32))
    v = raw.mapped(slice(*rows))
    assert v is not None and v.shape == (rows[1] - rows[0], 32) and v.dtype == x.dtype
    np.testing.assert_array_equal(v, x[slice(*rows)])
    assert not v.flags.writeable and v.ctypes.data % rawchunks.CACHE_LINE == 0
    with pytest.raises(ValueError, match="read-only"):
        v[0, 0] = 1.0


def test_rows_off_a_cache_line_are_not_mapped(tmp_path):
    """Rows of 160 bytes: odd rows start mid-line, and are read (None) rather than mapped; even rows
    start on a line (a copied strip starts on a page: a kernel's vector loops see the same alignment)."""
    x = np.arange(1000 * 40, dtype=np.float32).reshape(1000, 40)
    raw = _raw(bl.from_array(x, tmp_path / "x.zarr", chunks=(128, 40)))  # 20 KiB chunks: whole pages
    assert raw.mapped(slice(1, 50)) is None and raw.mapped(slice(131, 140)) is None
    np.testing.assert_array_equal(raw.mapped(slice(2, 300)), x[2:300])


def test_only_whole_width_page_multiple_chunks_are_mapped(tmp_path):
    x = np.ones((400, 40), dtype=np.float32)
    odd = _raw(bl.from_array(x, tmp_path / "odd.zarr", chunks=(100, 40)))  # 16000-byte chunks
    assert not odd.maps(slice(0, 40))
    across = _raw(bl.from_array(x[:, :32], tmp_path / "across.zarr", chunks=(128, 16)))  # two chunks across
    assert not across.maps(slice(0, 32))
    whole = _raw(bl.from_array(x[:, :32], tmp_path / "whole.zarr", chunks=(128, 32)))
    assert whole.maps(slice(0, 32)) and not whole.maps(slice(0, 16))


def test_missing_chunk_is_read_and_short_chunk_is_named(stored):
    x, a = stored
    raw = _raw(a)
    os.remove(os.path.join(str(a.path), "c", "2", "0"))
    assert raw.mapped(slice(200, 300)) is None  # its rows are the fill value: read, not mapped
    region = mapping.StripRegion(raw.map_bytes(256))
    assert raw.mapped(slice(128, 300), region) is None  # chunk 1 mapped, then chunk 2 missing
    gc.collect()
    assert os.path.join(str(a.path), "c", "1", "0") not in _mapped_files()  # chunk 1's pages went too
    np.testing.assert_array_equal(raw.mapped(slice(0, 256)), x[:256])
    short = os.path.join(str(a.path), "c", "3", "0")
    with open(short, "r+b") as f:
        f.truncate(1000)
    with pytest.raises(StoreReadError, match="c/3/0"):
        raw.mapped(slice(390, 500))  # refused before a page past its end is touched (a SIGBUS)


def test_a_mapping_goes_with_its_last_view(stored):
    _, a = stored
    first = os.path.join(str(a.path), "c", "0", "0")
    gc.collect()
    assert first not in _mapped_files()
    v = _raw(a).mapped(slice(0, 1000))
    part = v[10:20]
    del v
    gc.collect()
    assert first in _mapped_files()  # the part still reads it
    assert part.sum() != 0
    del part
    gc.collect()
    assert first not in _mapped_files()


def test_strips_mapped_in_turn_into_one_region(stored):
    """A region holds one strip at a time, as a slot does: the next strip is mapped over it, and an
    array of the earlier one then shows the later one; the region's range goes with it and its last
    array."""
    x, a = stored
    raw = _raw(a)
    region = mapping.StripRegion(raw.map_bytes(256))
    first = raw.mapped(slice(0, 256), region)
    np.testing.assert_array_equal(first, x[:256])
    second = raw.mapped(slice(512, 700), region)  # shorter, from another chunk
    np.testing.assert_array_equal(second, x[512:700])
    np.testing.assert_array_equal(first[:188], x[512:700])  # the slot's semantics
    with pytest.raises(ValueError, match="region"):
        raw.mapped(slice(0, 512), region)  # more than its room
    chunk = os.path.join(str(a.path), "c", "4", "0")
    del region, first
    gc.collect()
    assert chunk in _mapped_files()  # the second strip's array keeps the region
    del second
    gc.collect()
    assert chunk not in _mapped_files()


def test_the_large_page_probe(tmp_path, monkeypatch):
    big = tmp_path / "big.bin"
    np.random.default_rng(0).standard_normal(2**19).tofile(big)  # 4 MiB
    small = tmp_path / "small.bin"
    np.zeros(2**16).tofile(small)  # 512 KiB: shorter than a large page
    assert mapping.large_pages(str(big)) in (True, False)  # the kernel's choice for a file just written
    assert not mapping.large_pages(str(tmp_path / "missing.bin")) and not mapping.large_pages(str(small))
    seen = iter([0, 2048])  # FilePmdMapped before and during the probe's mapping, in KiB
    monkeypatch.setattr(mapping, "pmd_mapped_kib", lambda: next(seen))
    assert mapping.large_pages(str(big))
    seen = iter([512, 512])
    assert not mapping.large_pages(str(big))
    monkeypatch.setattr(mapping, "pmd_mapped_kib", lambda: None)  # not reported
    assert not mapping.large_pages(str(big))
    assert str(big) not in _mapped_files()


def _gram_memory(params, sources):
    return PassMemory(fixed=sources[0].width ** 2 * 8)


@row_kernel(memory=_gram_memory, device="cpu", read_only=True)
def _gram(device, arrays, rows, params, state):
    """Strip by strip ``x^T x`` (BLAS) and a NumPy sum: the bits show the strips' order and values."""
    (x,) = arrays
    g = x.T @ x + x.sum()
    return (g if state is None else state + g), None


@row_kernel(memory=_gram_memory, device="cpu")
def _column_sums(device, arrays, rows, params, state):
    """Not declared read-only: its strips are copied, whatever it does with them."""
    return (state or 0) + arrays[0].sum(axis=0), None


@row_kernel(memory=_gram_memory, device="cpu", read_only=True)
def _scales_in_place(device, arrays, rows, params, state):
    """Declared read-only, but writes into its strip."""
    x = arrays[0]
    x *= 2.0
    return state, None


@row_kernel(memory=_gram_memory, device="cpu", read_only=True)  # the plan of _gram: the same strips
def _copied_strips(device, arrays, rows, params, state):
    """How many strips the task was handed in a buffer of its own (writeable), not mapped."""
    return (state or 0) + int(arrays[0].flags.writeable), None


def _passes(path, scheduler, kernel=_gram):
    with Job("mapped-test", memory="160KiB", scheduler=scheduler, workers=2) as job:
        op = job.operand(path, "a")
        first, plan = run_pass(job, kernel, [source(op)], check_finite=False, min_tasks=4)
        later, _ = run_pass(job, kernel, [source(op)], check_finite=True, min_tasks=4)
        return first, later, plan, dict(job.mapped_inputs)


@pytest.mark.parametrize("scheduler", ["sync", "threads", "processes"])
def test_a_pass_that_maps_its_input_gives_the_bits_of_one_that_copies_it(stored, monkeypatch, scheduler):
    x, a = stored
    calls = []
    monkeypatch.setattr(mapping, "large_pages", lambda path: (calls.append(path), True)[1])
    monkeypatch.setattr(mapping, "within_budget", lambda budget, tasks: True)  # budgets of KiB
    maps = []
    real = rawchunks.RawChunks.mapped
    if scheduler != "processes":  # counted in this process
        monkeypatch.setattr(rawchunks.RawChunks, "mapped",
                            lambda self, rows, region=None: (maps.append(region), real(self, rows, region))[1])
    first, later, plan, decided = _passes(a.path, scheduler)
    assert decided == {str(a.path): True} and len(calls) == 1  # probed once, by the first pass
    assert plan.strip % 2 == 0 and len(plan.groups) >= 4
    if scheduler != "processes":
        strips = sum(len(plan.strips(g)) for g in range(len(plan.groups)))
        assert len(maps) == 2 * strips  # both passes' strips, all mapped
        # into one region per task and slot, in turn (the stream's two slots)
        assert len({id(r) for r in maps}) <= 4 * len(passes.group_runs(plan, scheduler)) < strips
    copied_first, copied_later, _, _ = _passes(a.path, scheduler, kernel=_copied_strips)  # seen by the tasks
    assert sum(copied_first) == sum(copied_later) == 0
    monkeypatch.setattr(mapping, "large_pages", lambda path: False)
    ref_first, ref_later, _, decided = _passes(a.path, scheduler)
    assert decided == {str(a.path): False}
    for s, t, u, v in zip(first, later, ref_first, ref_later):
        np.testing.assert_array_equal(s, u)
        np.testing.assert_array_equal(t, v)
        np.testing.assert_array_equal(s, t)
    # and the stored data's: within the products' bound, 2 m u |x|^T |x| + m u sum |x| (Higham, 2002, 3.5)
    m, u = len(x), 2.0**-53
    ref = x.T @ x + x.sum()
    bound = 2 * m * u * (np.abs(x).T @ np.abs(x)) + 4 * m * u * np.abs(x).sum()
    assert np.all(np.abs(sum(later) - ref) <= bound)


def test_a_kernel_that_writes_into_a_mapped_strip_fails_loudly(stored, monkeypatch):
    """Mapped strips are read-only: a kernel declared ``read_only`` that scaled its input in place
    fails, and never writes to the page cache of the input."""
    x, a = stored
    monkeypatch.setattr(mapping, "large_pages", lambda path: True)
    monkeypatch.setattr(mapping, "within_budget", lambda budget, tasks: True)  # budgets of KiB
    before = open_array(a.path)[:]
    with pytest.raises(ValueError, match="read-only"):
        _passes(a.path, "sync", kernel=_scales_in_place)
    np.testing.assert_array_equal(open_array(a.path)[:], before)


@pytest.mark.parametrize("case", ["mapped", "small pages", "first pass", "scaled", "transposed", "zstd", "gpu",
                                  "writes its strips"])
def test_which_inputs_a_pass_maps(stored, tmp_path, monkeypatch, case):
    x, a = stored
    monkeypatch.setattr(mapping, "large_pages", lambda path: case != "small pages")
    monkeypatch.setattr(mapping, "within_budget", lambda budget, tasks: True)  # budgets of KiB
    path = bl.from_array(x, tmp_path / "z.zarr", chunks=(128, 32), codec="zstd").path if case == "zstd" else a.path
    with Job("mapped-test", memory="160KiB", scheduler="sync") as job:
        op = job.operand(path, "a")
        kernel = _column_sums if case == "writes its strips" else _gram
        spec = passes.RowPassSpec(inputs=(str(path),), names=("a",), kernel=kernel, params=None, plan=None,
                                  device="gpu" if case == "gpu" else "cpu", device_memory=None, check_finite=False,
                                  amax=(case == "first pass",), scale=(3,) if case == "scaled" else None)
        got = passes.mapped_inputs(job, [source(op, transposed=case == "transposed")], spec)
    assert got == ((True,) if case in ("mapped", "first pass") else None)


def test_a_pass_maps_only_where_its_budget_allows_the_large_pages():
    """Two tasks' mapped strips can hold 2 large pages each beyond their bytes, the probe one more: 10 MiB.
    A plan sets that aside where it is at most a fifth of the budget; a plan that set nothing aside maps
    where it is at most a tenth."""
    assert mapping.reservation(2) == 10 << 20 and mapping.reservation(1) == 6 << 20
    assert not mapping.worth_reserving(49 << 20, 2) and mapping.worth_reserving(50 << 20, 2)
    assert mapping.worth_reserving(30 << 20, 1) and not mapping.worth_reserving(30 << 20, 2)
    assert not mapping.within_budget(2 << 20, 2) and not mapping.within_budget(99 << 20, 2)
    assert mapping.within_budget(100 << 20, 2) and not mapping.within_budget(100 << 20, 3)


@row_kernel(memory=lambda params, sources: PassMemory(), device="cpu", read_only=True)
def _reads_only(device, arrays, rows, params, state):
    return None, None


@row_kernel(memory=lambda params, sources: PassMemory(), device="cpu")
def _may_write(device, arrays, rows, params, state):
    return None, None


@pytest.mark.parametrize("case", ["reads only", "writes its strips", "zstd", "below a fifth"])
def test_a_plan_that_may_map_sets_the_large_pages_aside(tmp_path, case):
    """A read-only pass over local uncompressed chunks sets ``(2 tasks + 1) x 2 MiB`` aside from the budget
    its strips are sized from, whether or not the page cache holds the input in large pages (the strips,
    so the bits, do not depend on it), where that is at most a fifth of the budget; other passes, and
    smaller budgets, set nothing aside and size their strips from the whole budget."""
    x = np.zeros((65536, 64))  # 32 MiB in 2 MiB chunks
    a = bl.from_array(x, tmp_path / "x.zarr", chunks=(4096, 64), codec="zstd" if case == "zstd" else None)
    memory = "40MiB" if case == "below a fifth" else "64MiB"
    with Job("mapped-plan", memory=memory, scheduler="threads", workers=2) as job:
        op = job.operand(a.path, "a")
        kernel = _may_write if case == "writes its strips" else _reads_only
        plan = passes.plan_kernel_pass(job, kernel, [source(op)])
    assert plan.workers == 2 and plan.peak_memory <= plan.memory == job.cfg.memory
    if case == "reads only":
        assert plan.mapping_bytes == mapping.reservation(2) and "kept for the large pages" in plan.explain()
        # the strips are those of the budget less the reservation
        assert plan.peak_memory - plan.mapping_bytes <= job.cfg.memory - mapping.reservation(2)
        assert plan.to_dict()["mapping_bytes"] == plan.mapping_bytes
    else:
        assert plan.mapping_bytes == 0 and "mapping_bytes" not in plan.to_dict()


MEMORY_CHILD = """
    import numpy as np
    import blocklin.storage.mapped as mapping
    from blocklin.plan.passes import PassMemory
    from blocklin.runtime.job import Job
    from blocklin.runtime.passes import row_kernel, run_pass, source

    mapping.large_pages = lambda path: True  # whatever pages this machine's page cache holds
    mapping.within_budget = lambda budget, tasks: True  # the strips' own memory, at a budget of 8 MiB

    @row_kernel(memory=lambda params, sources: PassMemory(fixed=sources[0].width ** 2 * 8), device="cpu",
                read_only=True)
    def gram(device, arrays, rows, params, state):
        g = arrays[0].T @ arrays[0]
        return (g if state is None else state + g), None

    path, memory = sys.argv[1:3]
    with Job("mapped-memory", memory=memory, scheduler="threads") as job:
        op = job.operand(path, "a")
        run_pass(job, gram, [source(op)], check_finite=False)  # the first pass (its peaks)
        reset_hwm()
        base = hwm()
        states, plan = run_pass(job, gram, [source(op)], check_finite=False)
        print(json.dumps({"baseline": base, "peak": hwm(), "plan_peak": plan.peak_memory,
                          "mapped": job.mapped_inputs[path], "strips": plan.strip}))
"""


@needs_hwm
def test_a_pass_over_mapped_strips_peaks_within_its_budget(tmp_path):
    """Mapped strips count in the resident memory (the page cache's pages, while mapped): no more of
    them are mapped at once than the plan's slots, and the pass stays within its budget."""
    x = np.random.default_rng(2).standard_normal((32768, 256))  # 64 MiB: 8x the budget
    a = bl.from_array(x, tmp_path / "x.zarr", chunks=(1024, 256))
    budget = 8 * 2**20
    r = run_child(MEMORY_CHILD, str(a.path), "8MiB")
    used = r["peak"] - r["baseline"]
    assert r["mapped"] and r["plan_peak"] <= budget and r["strips"] < 32768 // 8
    assert used <= budget + margin(budget), f"used {used / 2**20:.1f} MiB over baseline, budget 8 MiB"


MAPPED_AT_64_CHILD = """
    import numpy as np
    import blocklin.storage.mapped as mapping
    from blocklin.plan.passes import PassMemory
    from blocklin.runtime.job import Job
    from blocklin.runtime.passes import row_kernel, run_pass, source

    mapping.large_pages = lambda path: True  # whatever pages this machine's page cache holds

    @row_kernel(memory=lambda params, sources: PassMemory(fixed=sources[0].width ** 2 * 8), device="cpu",
                read_only=True)
    def gram(device, arrays, rows, params, state):
        g = arrays[0].T @ arrays[0]
        return (g if state is None else state + g), None

    path, memory = sys.argv[1:3]
    warm_blas()
    # the baseline before the job: a pass's last mapped strips stay mapped until the thread's next pass
    # (as a copying pass's slots stay in the pool), so a baseline between passes would hold them
    reset_hwm()
    base = hwm()
    with Job("mapped-memory", memory=memory, scheduler="threads") as job:
        op = job.operand(path, "a")
        run_pass(job, gram, [source(op)], check_finite=False)  # the first pass (its peaks)
        states, plan = run_pass(job, gram, [source(op)], check_finite=False)  # a later pass
        print(json.dumps({"baseline": base, "peak": hwm(), "plan_peak": plan.peak_memory,
                          "reserved": getattr(plan, "mapping_bytes", 0), "workers": plan.workers, "strips": plan.strip,
                          "bytes_mapped": job.stats.get("bytes_mapped", 0)}))
"""


@needs_hwm
def test_a_pass_at_a_sixteenth_of_its_input_maps_within_its_budget(tmp_path):
    """At 64 MiB with two tasks a pass sets the large pages of its mapped strips aside (10 MiB) and maps
    them (they had been copied below about 100 MiB); a job's first pass and a later one, mapped pages
    and all, peak within the budget and the usual margin."""
    x = np.random.default_rng(5).standard_normal((131072, 128))  # 128 MiB in 2 MiB chunks: twice the budget
    a = bl.from_array(x, tmp_path / "x.zarr", chunks=(2048, 128))
    del x
    budget = 64 * 2**20
    r = run_child(MAPPED_AT_64_CHILD, str(a.path), "64MiB")
    used = r["peak"] - r["baseline"]
    assert r["bytes_mapped"] == 2 * 131072 * 128 * 8  # every strip of both passes mapped
    assert r["workers"] == 2 and r["reserved"] == 10 * 2**20 and r["plan_peak"] <= budget
    assert used <= budget + margin(budget), f"used {used / 2**20:.1f} MiB over baseline, budget 64 MiB"


@pytest.mark.slow
def test_an_svd_on_a_cluster_maps_with_the_bits_of_copied_strips(stored, monkeypatch, client):
    """The client decides (``RowPassSpec.mapped``), the workers map: the Lanczos passes of an svd on a
    two-process cluster, mapped and copied, give the same bits."""
    x, a = stored
    got = {}
    for mapped in (True, False):
        monkeypatch.setattr(mapping, "large_pages", lambda path, mapped=mapped: mapped)
        monkeypatch.setattr(mapping, "within_budget", lambda budget, tasks: True)  # budgets of KiB
        u, s, vt = r = bl.svd(a.path, 3, method="lanczos", memory="256KiB", scheduler=client, seed=0)
        got[mapped] = (s, u.to_numpy(), vt)
        assert r.report["passes_total"] > 4
        # every pass's strips, mapped by the workers (the first one's peaks taken from them)
        assert (r.report.get("bytes_mapped", 0) >= 4 * x.nbytes) if mapped else "bytes_mapped" not in r.report
    for m, c in zip(got[True], got[False]):
        np.testing.assert_array_equal(m, c)
    # and the data's: within Lanczos's tolerance of the leading singular values
    np.testing.assert_allclose(got[True][0], np.linalg.svd(x, compute_uv=False)[:3], rtol=1e-8)
