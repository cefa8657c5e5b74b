"""The peaks a first pass saw of a local input no writer recorded, kept in the user's cache
(:mod:`blocklin.storage.seen_peaks`): a later job's first pass takes them, with the bits of a scan,
while the input's content stamp holds; a changed input scans again; nothing is written beside the
input; staged copies and changed-while-read inputs are not kept. Every test has its own
``XDG_CACHE_HOME`` (tests/conftest.py)."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import zarr

import blocklin
from blocklin.errors import InputChangedError, NonFiniteError
from blocklin.storage import seen_peaks, stamps
from support.tolerances import assert_gram

M, N = 3000, 24


def _foreign(path, scale=1e-100, seed=0):
    """A zarr array written by zarr itself: no writer's record beside it."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((M, N)) * scale
    x[:, 5] *= 1e-9  # a column far below the others: the SVD's squares ask each column's peak
    z = zarr.create_array(store=str(path), shape=x.shape, chunks=(500, N), dtype="float64", compressors=None)
    z[:] = x
    return x


def _entries():
    folder = seen_peaks.cache_dir()
    return sorted(os.listdir(folder)) if folder.exists() else []


def test_a_later_jobs_first_pass_takes_what_the_first_saw(tmp_path):
    x = _foreign(tmp_path / "A.zarr")  # squared near underflow: the pass scales
    files = sorted(os.listdir(tmp_path / "A.zarr"))
    first = blocklin.gram(tmp_path / "A.zarr", memory="1MiB")
    assert "peaks_seen" not in first.report and "peaks_recorded" not in first.report
    assert first.report["scaling"]["extra_passes"] == 1 and first.report["passes"] == 2
    assert len(_entries()) == 1  # the largest magnitude alone: a flat scan takes no column's peak
    again = blocklin.gram(tmp_path / "A.zarr", memory="1MiB")
    assert again.report["peaks_seen"] == ["a"]
    assert again.report["scaling"]["extra_passes"] == 0 and again.report["passes"] == 1
    np.testing.assert_array_equal(again.to_numpy(), first.to_numpy())
    assert_gram(first.to_numpy(), x.T @ x, x)
    assert sorted(os.listdir(tmp_path / "A.zarr")) == files  # nothing written beside the input


@pytest.mark.parametrize("scheduler", ["threads", "processes"])
def test_svd_keeps_each_columns_peak_with_the_bits_of_a_scan(tmp_path, scheduler):
    _foreign(tmp_path / "A.zarr", scale=1e200)
    kw = dict(k=3, method="gram", memory="1MiB", seed=1, scheduler=scheduler)
    scanned = blocklin.svd(tmp_path / "A.zarr", **kw)
    assert "peaks_seen" not in scanned.report and len(_entries()) == 2  # the record and its columns
    got = blocklin.svd(tmp_path / "A.zarr", **kw)
    assert got.report["peaks_seen"] == ["a"]
    assert got.report["passes"] == scanned.report["passes"] - 1  # no unscaled pass made again
    for g, s in zip((got.U, got.s, got.Vt), (scanned.U, scanned.s, scanned.Vt)):
        np.testing.assert_array_equal(np.asarray(g), np.asarray(s))
    # a later job that asks the largest magnitude alone takes it too
    assert blocklin.gram(tmp_path / "A.zarr", memory="1MiB", scale=2.0**-828).report["peaks_seen"] == ["a"]


@pytest.mark.parametrize("method", ["gram", "lanczos"])
def test_a_wide_inputs_row_peaks_are_kept_for_the_next_svd(tmp_path, method):
    """An SVD streams a wide input transposed and asks each of its stored rows' peak, which no writer
    records: the first job's scan keeps them, and the next job's first pass takes them, same bits."""
    rng = np.random.default_rng(4)
    x = rng.standard_normal((N, M)) * 1e200
    x[5] *= 1e-9  # a row far below the others
    z = zarr.create_array(store=str(tmp_path / "W.zarr"), shape=x.shape, chunks=(N, 500), dtype="float64",
                          compressors=None)
    z[:] = x
    kw = dict(k=3, method=method, memory="1MiB", seed=1)
    scanned = blocklin.svd(tmp_path / "W.zarr", **kw)
    assert "peaks_seen" not in scanned.report
    got = blocklin.svd(tmp_path / "W.zarr", **kw)
    assert got.report["peaks_seen"] == ["a"] and got.report["passes"] == scanned.report["passes"] - 1
    for g, s in zip((got.U, got.s, got.Vt), (scanned.U, scanned.s, scanned.Vt)):
        np.testing.assert_array_equal(np.asarray(g), np.asarray(s))
    kept = seen_peaks.seen(tmp_path / "W.zarr", x.shape, transposed=True)
    np.testing.assert_array_equal(kept.columns, np.abs(x).max(axis=1))  # each stored row's


def test_a_changed_input_scans_again(tmp_path):
    _foreign(tmp_path / "A.zarr")
    blocklin.gram(tmp_path / "A.zarr", memory="1MiB")
    zarr.open_array(str(tmp_path / "A.zarr"), mode="r+")[0, 0] = 1.0  # one chunk rewritten: out of the range
    got = blocklin.gram(tmp_path / "A.zarr", memory="1MiB")
    assert "peaks_seen" not in got.report and got.report["scaling"] is None
    assert blocklin.gram(tmp_path / "A.zarr", memory="1MiB").report["peaks_seen"] == ["a"]  # kept anew


def test_an_input_changed_during_the_pass_is_not_kept(tmp_path):
    _foreign(tmp_path / "A.zarr")
    stamp = seen_peaks.stamp_before(tmp_path / "A.zarr")
    zarr.open_array(str(tmp_path / "A.zarr"), mode="r+")[600, 3] = 2.0
    assert not seen_peaks.remember(tmp_path / "A.zarr", stamp, 2.0, (M, N))
    assert _entries() == []
    assert seen_peaks.remember(tmp_path / "A.zarr", seen_peaks.stamp_before(tmp_path / "A.zarr"), 2.0, (M, N))


def test_a_job_lists_its_input_only_for_its_own_stamps(tmp_path, monkeypatch):
    """The cache's stamps before and after a scanning pass are the run's own (its listing at the first
    open, before any read, and its check before it returns), as is the stamp a later job's first pass
    checks the kept peaks against: each job lists the input twice, where a scan had listed it four
    times (2-4 ms each for 128 chunk files on the 2-core machine) and a take three."""
    x = _foreign(tmp_path / "A.zarr")
    listed = []
    real = stamps.file_stamps
    monkeypatch.setattr(stamps, "file_stamps", lambda loc: listed.append(os.path.realpath(loc.url)) or real(loc))
    where = os.path.realpath(tmp_path / "A.zarr")
    first = blocklin.gram(tmp_path / "A.zarr", memory="1MiB")
    assert listed.count(where) == 2 and len(_entries()) == 1  # the scan's peaks kept
    listed.clear()
    again = blocklin.gram(tmp_path / "A.zarr", memory="1MiB")
    assert listed.count(where) == 2 and again.report["peaks_seen"] == ["a"]
    np.testing.assert_array_equal(again.to_numpy(), first.to_numpy())
    assert_gram(first.to_numpy(), x.T @ x, x)


def test_an_input_changed_after_the_scan_is_refused_and_not_kept(tmp_path, monkeypatch):
    """Rewritten after the scanning pass, before the run's check: the result is refused (the run's
    guard) and nothing is kept, though the pass itself saw one version."""
    from blocklin.runtime.job import Job

    _foreign(tmp_path / "A.zarr")
    keep = Job.keep_seen_peaks

    def then_rewrite(job, *args, **kwargs):
        keep(job, *args, **kwargs)
        zarr.open_array(str(tmp_path / "A.zarr"), mode="r+")[600, 3] = 2.0

    monkeypatch.setattr(Job, "keep_seen_peaks", then_rewrite)
    with pytest.raises(InputChangedError):
        blocklin.gram(tmp_path / "A.zarr", memory="1MiB")
    assert _entries() == []


def test_staged_copies_and_nonfinite_inputs_are_not_kept(tmp_path):
    x = np.random.default_rng(2).standard_normal((M, N)) * 1e-100
    blocklin.gram(x, memory="1MiB")  # a NumPy array: staged, a new path each run
    assert _entries() == []
    _foreign(tmp_path / "A.zarr")
    zarr.open_array(str(tmp_path / "A.zarr"), mode="r+")[7, 2] = np.nan
    with pytest.raises(NonFiniteError):
        blocklin.gram(tmp_path / "A.zarr", memory="1MiB")
    assert _entries() == []


def test_an_entry_of_another_location_or_torn_is_ignored(tmp_path):
    _foreign(tmp_path / "A.zarr", scale=1e200)
    blocklin.svd(tmp_path / "A.zarr", k=2, method="gram", memory="1MiB", seed=1)
    record = next(seen_peaks.cache_dir().glob("*.json"))
    data = json.loads(record.read_text())
    assert seen_peaks.seen(tmp_path / "A.zarr", (M, N)) is not None
    record.write_text(json.dumps(dict(data, location=str(tmp_path / "B.zarr"))))  # a digest's collision
    assert seen_peaks.seen(tmp_path / "A.zarr", (M, N), column_peaks=False) is None
    record.write_text(json.dumps(data))
    columns = record.with_suffix(".f8")
    columns.write_bytes(columns.read_bytes()[:-8])
    assert seen_peaks.seen(tmp_path / "A.zarr", (M, N)) is None  # the columns torn
    assert seen_peaks.seen(tmp_path / "A.zarr", (M, N), column_peaks=False) is not None  # the largest magnitude holds
    assert seen_peaks.seen(tmp_path / "A.zarr", (M, N + 1), column_peaks=False) is None  # another shape's
    assert seen_peaks.seen(tmp_path / "A.zarr", (M, N), transposed=True) is None  # the rows' were not kept


def test_the_cache_keeps_the_most_recent_inputs(tmp_path, monkeypatch):
    monkeypatch.setattr(seen_peaks, "MAX_ENTRIES", 2)
    for i, name in enumerate("ABC"):
        _foreign(tmp_path / f"{name}.zarr", seed=i)
        assert seen_peaks.remember(tmp_path / f"{name}.zarr", seen_peaks.stamp_before(tmp_path / f"{name}.zarr"),
                                   1.0 + i, (M, N), np.full(N, 1.0 + i))
        record = seen_peaks.cache_dir() / seen_peaks._keys(os.path.realpath(tmp_path / f"{name}.zarr"))[0]
        os.utime(record, ns=(i * 10**9, i * 10**9))  # written in this order
    assert len(_entries()) == 4  # two inputs, a record and the columns of each
    assert seen_peaks.seen(tmp_path / "A.zarr", (M, N), column_peaks=False) is None
    assert seen_peaks.seen(tmp_path / "C.zarr", (M, N)).amax == 3.0


def test_a_cache_that_cannot_be_written_is_skipped(tmp_path, monkeypatch):
    (tmp_path / "a-file").write_text("not a folder")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "a-file"))  # the cache folder cannot be made
    x = _foreign(tmp_path / "A.zarr")
    first = blocklin.gram(tmp_path / "A.zarr", memory="1MiB")
    again = blocklin.gram(tmp_path / "A.zarr", memory="1MiB")
    assert "peaks_seen" not in again.report and again.report["scaling"]["extra_passes"] == 1  # scanned again
    np.testing.assert_array_equal(again.to_numpy(), first.to_numpy())
    assert_gram(first.to_numpy(), x.T @ x, x)


def test_on_a_local_cluster_the_client_keeps_them(tmp_path):
    """The workers scan; the client, which plans the passes, keeps what they found: the next job on the
    cluster takes it, with the bits of a scan on the local scheduler."""
    distributed = pytest.importorskip("distributed")
    _foreign(tmp_path / "A.zarr", scale=1e200)
    kw = dict(k=3, method="gram", memory="1MiB", seed=1)
    ref = blocklin.svd(tmp_path / "A.zarr", scheduler="sync", **kw)
    seen_peaks.forget(tmp_path / "A.zarr")  # the cluster's first job scans too
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                                  dashboard_address=None) as cluster, distributed.Client(cluster) as client:
        scanned = blocklin.svd(tmp_path / "A.zarr", scheduler=client, **kw)
        got = blocklin.svd(tmp_path / "A.zarr", scheduler=client, **kw)
    assert "peaks_seen" not in scanned.report and got.report["peaks_seen"] == ["a"]
    for g, s, r in zip((got.U, got.s, got.Vt), (scanned.U, scanned.s, scanned.Vt), (ref.U, ref.s, ref.Vt)):
        np.testing.assert_array_equal(np.asarray(g), np.asarray(s))
        np.testing.assert_array_equal(np.asarray(g), np.asarray(r))
