"""Column peaks known from an earlier job (:mod:`blocklin.runtime.known_peaks`): a later job over an
unchanged input takes them instead of its first pass computing them, and any change to the input
makes the next job take them again.

What must hold: the peaks a later job takes are bit for bit those its own first pass would compute;
its results are those of a job that computed them; an input rewritten in place (new values, new
extremes, a NaN) is never served the old peaks; object stores are not recorded.
"""

from __future__ import annotations

import numpy as np
import pytest

import blocklin as bl
from blocklin.errors import NonFiniteError
from blocklin.plan.passes import PassMemory
from blocklin.runtime import known_peaks
from blocklin.runtime.job import Job
from blocklin.runtime.passes import row_kernel, run_pass, source
from blocklin.runtime.tiles import open_array
from blocklin.storage import mapped as mapping


def _memory(params, sources):
    return PassMemory(fixed=0, per_row=0)


@row_kernel(memory=_memory, device="cpu", read_only=True)
def _colsum(device, arrays, rows, params, state):
    s = np.asarray(arrays[0]).sum(axis=0)
    return (s if state is None else state + s), None


@pytest.fixture(autouse=True)
def _fresh():
    known_peaks.clear()
    yield
    known_peaks.clear()


@pytest.fixture
def stored(tmp_path, rng):
    x = rng.standard_normal((4096, 64))
    a = bl.from_array(x, tmp_path / "a.zarr", chunks=(512, 64))
    return x, a


def _job(path, **kw):
    """One job's first pass: ``(column sums, job.peaks, job.amax, job.stats)``."""
    with Job("known-peaks-test", memory="256KiB", **kw) as job:
        states, _ = run_pass(job, _colsum, [source(job.operand(path, "a"))], min_tasks=4)
        return sum(states), job.peaks[str(path)], job.amax[str(path)], dict(job.stats)


@pytest.mark.parametrize("scheduler", ["sync", "threads", "processes"])
def test_a_later_job_takes_the_peaks_its_first_pass_would_compute(stored, scheduler):
    x, a = stored
    s1, p1, m1, st1 = _job(a.path, scheduler=scheduler)
    s2, p2, m2, st2 = _job(a.path, scheduler=scheduler)
    assert "peaks_known" not in st1 and st2["peaks_known"] == 1
    assert np.array_equal(p1, np.abs(x).max(axis=0)) and np.array_equal(p2, p1) and m2 == m1 == np.abs(x).max()
    assert np.array_equal(s1, s2)  # the same strips, the same bits


def test_a_later_jobs_first_pass_maps_its_strips(stored, monkeypatch):
    """With its peaks known, a first pass is a later pass: mapped where the page cache allows."""
    _x, a = stored
    monkeypatch.setattr(mapping, "large_pages", lambda path: True)
    s1, *_, st1 = _job(a.path, scheduler="sync")
    s2, *_, st2 = _job(a.path, scheduler="sync")
    assert st1.get("bytes_mapped", 0) == 0 and st2["bytes_mapped"] == a.nbytes and np.array_equal(s1, s2)


def test_an_input_rewritten_in_place_takes_its_peaks_again(stored):
    x, a = stored
    _job(a.path, scheduler="sync")
    y = x.copy()
    y[700, 5] = 1e150  # new extremes: the scaling of data near overflow must see them
    open_array(a.path, mode="r+")[512:1024] = y[512:1024]
    _s, peaks, amax, st = _job(a.path, scheduler="sync")
    assert "peaks_known" not in st and amax == 1e150 and np.array_equal(peaks, np.abs(y).max(axis=0))
    # and an operation on it scales as it must: the Gram of the new data, not overflowed
    g = bl.gram(a.path, memory="64MiB")
    assert g.report["scaling"] is not None
    bound = 2 * len(y) * np.finfo(np.float64).eps * (np.abs(y).T @ np.abs(y))  # a sum of m products (Higham 3.5)
    assert np.all(np.abs(np.asarray(g) - y.T @ y) <= bound)


def test_a_nan_written_after_a_job_is_still_refused(stored):
    x, a = stored
    _job(a.path, scheduler="sync")
    open_array(a.path, mode="r+")[3000, 7] = np.nan
    with pytest.raises(NonFiniteError):
        _job(a.path, scheduler="sync")


def test_what_is_not_recorded(stored):
    """NaN peaks, peaks wider than MAX_COLUMNS and inputs off the local file system; the record keeps
    the ENTRIES most recently used, within MAX_BYTES."""
    _x, a = stored
    src = source(bl.open(a.path))
    known_peaks.remember(src, "s", np.array([1.0, np.nan]))
    assert known_peaks.lookup(src, "s") is None
    known_peaks.remember(src, "s", np.zeros(known_peaks.MAX_COLUMNS + 1))
    assert known_peaks.lookup(src, "s") is None
    known_peaks.remember(src, "s", np.ones(3))
    assert np.array_equal(known_peaks.lookup(src, "s"), np.ones(3)) and known_peaks.lookup(src, "t") is None
    for i in range(known_peaks.ENTRIES):
        known_peaks.remember(src, f"other-{i}", np.ones(3))
    assert known_peaks.lookup(src, "s") is None  # the least recently used left
    wide = np.ones(known_peaks.MAX_COLUMNS)
    for i in range(known_peaks.MAX_BYTES // wide.nbytes + 1):
        known_peaks.remember(src, f"wide-{i}", wide)
    assert known_peaks.lookup(src, "wide-0") is None and known_peaks.lookup(src, f"wide-{i}") is not None
    assert known_peaks.is_local(src)
    assert not known_peaks.is_local(type("S", (), {"path": "s3://bucket/a.zarr"})())
