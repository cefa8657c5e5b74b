"""Peaks recorded by ``convert`` beside its output stand in for a job's first-pass scan while the
output's content stamp holds, with the bits of a run that scanned; a changed output scans again."""

from __future__ import annotations

import json
import os
import shutil

import numpy as np
import pytest
import zarr

import blocklin
from blocklin.errors import NonFiniteError
from blocklin.linalg.lowrank.svd_tolerance import default_tol
from blocklin.storage.recorded_peaks import PeakTally, record, recorded
from blocklin.storage.records import PEAKS_COLUMNS, PEAKS_RECORD
from blocklin.storage.stamps import content_stamp
from support.tolerances import assert_gram

M, N, CH = 600, 40, (64, 40)


def _data(dtype, scale=1.0, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((M, N))
    if np.dtype(dtype).kind == "c":
        x = x + 1j * rng.standard_normal((M, N))
    x[:, 3] *= 1e-9  # a column far below the others: the SVD's squares ask each column's peak
    return (x * scale).astype(dtype)


def _converted(tmp_path, x, name="A"):
    np.save(tmp_path / f"{name}.npy", x)
    rep = blocklin.convert(tmp_path / f"{name}.npy", tmp_path / f"{name}.zarr", chunks=CH, memory="1MiB")
    return rep, tmp_path / f"{name}.zarr"


def _peaks(x):
    return np.maximum(np.abs(x.real), np.abs(x.imag)).max(axis=0) if x.dtype.kind == "c" else np.abs(x).max(axis=0)


@pytest.mark.parametrize("dtype", ["float32", "float64", "complex64", "complex128"])
def test_convert_records_every_columns_peak(tmp_path, dtype):
    x = _data(dtype)
    rep, out = _converted(tmp_path, x)
    assert rep["peaks_recorded"] is True
    got = recorded(out, (M, N))
    np.testing.assert_array_equal(got.columns, _peaks(x).astype(np.float64))  # maxima: exact
    assert got.amax == float(_peaks(x).max())
    assert recorded(out, (M, N + 1)) is None and recorded(out, (M + 1, N)) is None  # another shape's record is not this array's


def test_record_leaves_the_content_stamp_alone(tmp_path):
    """The record is not part of the stamp: resume records and the record's own stamp see the data only."""
    x = _data("float64")
    np.save(tmp_path / "A.npy", x)
    shutil.copytree(_converted(tmp_path, x)[1], tmp_path / "B.zarr")
    os.remove(tmp_path / "B.zarr" / PEAKS_RECORD)
    before = content_stamp(tmp_path / "B.zarr")
    tally = PeakTally(x.shape)
    tally.add(x, 0, 0)
    assert record(tmp_path / "B.zarr", tally)
    assert content_stamp(tmp_path / "B.zarr") == before and recorded(tmp_path / "B.zarr") is not None


@pytest.mark.parametrize("wide", [False, True], ids=["tall", "wide"])
@pytest.mark.parametrize("scale", [1.0, 1e200, 1e-200])
@pytest.mark.parametrize("method", ["lanczos", "rsvd", "gram", "sketch"])
def test_svd_takes_the_record_with_the_bits_of_a_scan(tmp_path, method, scale, wide):
    """The first SVD of a matrix blocklin wrote takes its peaks from the record (each column's of a tall
    one, each row's of a wide one: what it streams): the bits of a run that scanned them, one pass fewer
    where the data is far from 1."""
    x = _data("float64", scale)  # column 3 far below the others: each column's (row's) peak is asked
    x = x.T.copy() if wide else x
    _, a = _converted(tmp_path, x)
    shutil.copytree(a, tmp_path / "B.zarr")
    os.remove(tmp_path / "B.zarr" / PEAKS_RECORD)
    kw = dict(k=4, method=method, memory="256KiB", seed=1, scheduler="threads")
    got = blocklin.svd(a, **kw)
    scanned = blocklin.svd(tmp_path / "B.zarr", **kw)
    assert got.report["peaks_recorded"] == ["a"] and "peaks_recorded" not in scanned.report
    assert not got.report["in_core"]
    for g, s in zip((got.U, got.s, got.Vt), (scanned.U, scanned.s, scanned.Vt)):
        np.testing.assert_array_equal(np.asarray(g), np.asarray(s))
    if scale != 1.0:  # the record gave the power of two first: no unscaled pass to make again
        assert got.report["scaling"]["extra_passes"] == 0 and scanned.report["scaling"]["extra_passes"] == 1
        assert got.report["passes"] == scanned.report["passes"] - 1
    if method in ("lanczos", "gram"):  # rsvd and the sketch are approximations on a flat spectrum
        ref = np.linalg.svd(x / scale, compute_uv=False)
        # in s^2: Kato-Temple for Lanczos' residuals r_i <= tol s_1 at the default tol,
        # |s_i^2 - theta_i| <= r_i^2 / gap_i, plus the Gram's rounding, M eps s_1^2 (Weyl)
        s2 = ref[:5] ** 2
        gap = np.minimum(s2[:4] - s2[1:5], np.r_[np.inf, s2[:3] - s2[1:4]])
        err2 = (default_tol(np.float64) * ref[0]) ** 2 / gap + M * np.finfo(np.float64).eps * ref[0] ** 2
        assert np.all(np.abs(np.asarray(got.s) / scale - ref[:4]) <= err2 / ref[:4])  # |ds| <= d(s^2) / s


@pytest.mark.parametrize("scheduler", ["sync", "processes"])
def test_gram_takes_the_record(tmp_path, scheduler):
    x = _data("complex128", 1e-100)  # squared near underflow: the pass scales by the recorded peak
    _, a = _converted(tmp_path, x)
    shutil.copytree(a, tmp_path / "B.zarr")
    os.remove(tmp_path / "B.zarr" / PEAKS_RECORD)
    g = blocklin.gram(a, memory="256KiB", scheduler=scheduler)
    scanned = blocklin.gram(tmp_path / "B.zarr", memory="256KiB", scheduler=scheduler)
    assert g.report["peaks_recorded"] == ["a"]
    # the record gave the power of two first: one scaled pass, where the scan made an unscaled one again
    assert (g.report["passes"], scanned.report["passes"]) == (1, 2)
    np.testing.assert_array_equal(g.to_numpy(), scanned.to_numpy())
    want = x.conj().T @ x
    # each entry a sum of M products: gamma_M times the sum of magnitudes (Higham, eq. 3.11)
    bound = 2 * M * np.finfo(np.float64).eps * (np.abs(x).T @ np.abs(x))
    assert np.all(np.abs(g.to_numpy() - want) <= bound)


def test_a_changed_output_is_scanned_again(tmp_path):
    """A chunk rewritten after the record voids it: the first pass scans, and the result is today's."""
    x = _data("float64")
    _, a = _converted(tmp_path, x)
    arr = zarr.open_array(a, mode="r+")
    y = x.copy()
    y[70:80] *= 1e300  # now near overflow: a scaling the stale record would not choose
    arr[64:128] = y[64:128]
    assert recorded(a) is None
    got = blocklin.svd(a, k=3, method="lanczos", memory="256KiB", seed=1)
    assert "peaks_recorded" not in got.report
    assert got.report["scaling"] is not None
    want = np.linalg.svd(y / 1e300, compute_uv=False)[:3] * 1e300
    np.testing.assert_allclose(np.asarray(got.s), want, rtol=1e-6)


def test_a_forged_or_torn_record_is_ignored(tmp_path):
    x = _data("float64")
    _, a = _converted(tmp_path, x)
    rec = json.loads((a / PEAKS_RECORD).read_text())
    cols = (a / PEAKS_COLUMNS).read_bytes()
    (a / PEAKS_RECORD).write_text(json.dumps(dict(rec, amax=rec["amax"] * 2)))  # amax not its columns' max
    assert recorded(a) is None
    (a / PEAKS_RECORD).write_text(json.dumps(rec)[:40])
    assert recorded(a) is None
    (a / PEAKS_RECORD).write_text(json.dumps(dict(rec, version=99)))
    assert recorded(a) is None
    (a / PEAKS_RECORD).write_text(json.dumps(dict(rec, amax=float("inf"))))
    assert recorded(a, column_peaks=False) is None
    (a / PEAKS_RECORD).write_text(json.dumps(rec))
    assert recorded(a) is not None
    # the columns' file torn, forged (its CRC no longer the record's) or missing: no columns, but the
    # largest magnitude alone (the small file, which never reads them) still holds
    torn = cols[:-8]
    forged = np.frombuffer(cols, "<f8").copy()
    forged[0] = forged.max()  # finite, the same max: only the CRC tells
    for bad in (torn, forged.tobytes(), None):
        if bad is None:
            (a / PEAKS_COLUMNS).unlink()
        else:
            (a / PEAKS_COLUMNS).write_bytes(bad)
        assert recorded(a) is None
        got = recorded(a, column_peaks=False)
        assert got is not None and got.columns is None and got.amax == rec["amax"]
    (a / PEAKS_COLUMNS).write_bytes(cols)
    np.testing.assert_array_equal(recorded(a).columns, np.frombuffer(cols, "<f8"))


def test_only_a_pass_that_asks_each_columns_peak_reads_them(tmp_path, monkeypatch):
    """A first pass that takes the largest magnitude alone (``gram``) reads the small file only; an
    SVD's, which asks each column's peak, reads the columns' file too."""
    from blocklin.storage.backend import LocalBackend

    x = _data("float64", 1e-100)  # squared near underflow: scaled by the recorded peak
    _, a = _converted(tmp_path, x)
    read = []
    real = LocalBackend.read_bytes

    def spy(self, key):
        read.append(key)
        return real(self, key)

    monkeypatch.setattr(LocalBackend, "read_bytes", spy)
    g = blocklin.gram(a, memory="256KiB")
    assert g.report["peaks_recorded"] == ["a"] and g.report["passes"] == 1
    assert PEAKS_RECORD in read and PEAKS_COLUMNS not in read
    assert_gram(g.to_numpy(), x.T @ x, x)
    read.clear()
    got = blocklin.svd(a, k=2, method="gram", memory="256KiB", seed=1)
    assert got.report["peaks_recorded"] == ["a"] and PEAKS_COLUMNS in read



def test_no_record_for_nan_so_the_check_still_names_it(tmp_path):
    x = _data("float64")
    x[300, 7] = np.nan
    rep, a = _converted(tmp_path, x)
    assert rep["peaks_recorded"] is False and not (a / PEAKS_RECORD).exists()
    with pytest.raises(NonFiniteError, match=r"nan at \[300, 7\]"):
        blocklin.svd(a, k=3, memory="256KiB", check_finite=True)


def test_a_range_of_rows_scans_its_own(tmp_path):
    """A pass over appended rows alone (``Source.first_row``) takes no record: its peaks are its own."""
    from blocklin.runtime.passes import Source, take_recorded_peaks

    _, a = _converted(tmp_path, _data("float64"))

    class _Job:
        amax, peaks, column_peaks, checked_finite, recorded_peaks = {}, {}, set(), set(), []

        def input_stamp(self, path):  # no run's stamp: the take lists the input itself
            return None

    job = _Job()
    src = Source(path=str(a), name="a", rows=M - 64, width=N, dtype=np.dtype("float64"), chunk_rows=64,
                 chunk_bytes=64 * N * 8, chunks_across=1, first_row=64)
    take_recorded_peaks(job, [src])
    assert job.amax == {} and job.recorded_peaks == []
    take_recorded_peaks(job, [Source(**{**src.__dict__, "first_row": 0, "rows": M})])
    assert job.recorded_peaks == ["a"] and str(a) in job.checked_finite


def test_from_array_and_random_record_their_peaks(tmp_path):
    x = _data("complex64", 1e30)
    m = blocklin.from_array(x, tmp_path / "X.zarr", chunks=CH)
    np.testing.assert_array_equal(recorded(m.path, (M, N)).columns, _peaks(x).astype(np.float64))
    r = blocklin.random(tmp_path / "R.zarr", (M, N), seed=3, chunks=CH, dtype="float32")
    np.testing.assert_array_equal(recorded(r.path, (M, N)).columns, _peaks(r.to_numpy()).astype(np.float64))
    assert blocklin.gram(r, memory="256KiB").report["peaks_recorded"] == ["a"]
    # integers are cast to a staged float64 copy by the operations: nothing to record
    blocklin.from_array(np.arange(12).reshape(3, 4), tmp_path / "I.zarr")
    assert not (tmp_path / "I.zarr" / PEAKS_RECORD).exists()


def test_a_record_that_cannot_be_written_leaves_a_complete_output(tmp_path, monkeypatch):
    """The record is an aid: a store that refuses it still gets its output, and the passes scan."""
    import blocklin.storage.recorded_peaks as rp

    real = rp.backend

    class Refusing:
        def __init__(self, b):
            self.b = b

        def write_text(self, key, text):
            raise PermissionError(13, "read-only", key)

        def __getattr__(self, name):
            return getattr(self.b, name)

    x = _data("float64")
    monkeypatch.setattr(rp, "backend", lambda loc: Refusing(real(loc)))
    rep, a = _converted(tmp_path, x)
    monkeypatch.undo()
    assert rep["peaks_recorded"] is False and not (a / PEAKS_RECORD).exists()
    np.testing.assert_array_equal(blocklin.open(a).to_numpy(), x)
    assert "peaks_recorded" not in blocklin.gram(a, memory="256KiB").report


@pytest.mark.parametrize("lam", [0.0, 1e201])
def test_solve_takes_both_records(tmp_path, lam):
    """``A`` and ``b`` near overflow, both with records: one scaled pass, the bits of the scanned run's two."""
    rng = np.random.default_rng(5)
    x, y = rng.standard_normal((M, N)) * 1e200, rng.standard_normal((M, 2)) * 1e200
    for name, v in (("A", x), ("b", y)):
        blocklin.from_array(v, tmp_path / f"{name}.zarr", chunks=(64, v.shape[1]))
        shutil.copytree(tmp_path / f"{name}.zarr", tmp_path / f"{name}2.zarr")
        os.remove(tmp_path / f"{name}2.zarr" / PEAKS_RECORD)
    got = blocklin.solve(tmp_path / "A.zarr", tmp_path / "b.zarr", lam=lam, memory="512KiB")
    scanned = blocklin.solve(tmp_path / "A2.zarr", tmp_path / "b2.zarr", lam=lam, memory="512KiB")
    assert got.report["peaks_recorded"] == ["a", "b"] and "peaks_recorded" not in scanned.report
    assert (got.report["passes"], scanned.report["passes"]) == (1, 2)
    assert (got.report["scaling"]["extra_passes"], scanned.report["scaling"]["extra_passes"]) == (0, 1)
    np.testing.assert_array_equal(np.asarray(got), np.asarray(scanned))


def test_append_keeps_a_record_that_held(tmp_path):
    """Rows appended to a matrix whose record held: the record is the grown matrix's. Without a
    record before, the append writes none (the old rows' peaks were not seen)."""
    x, y = _data("float64"), _data("float64", 1e5, seed=9)[:100]
    m = blocklin.from_array(x, tmp_path / "A.zarr", chunks=CH)
    grown = blocklin.append(m, y)
    got = recorded(grown.path, (M + 100, N))
    np.testing.assert_array_equal(got.columns, _peaks(np.vstack([x, y])))
    assert blocklin.gram(grown, memory="256KiB").report["peaks_recorded"] == ["a"]
    os.remove(tmp_path / "A.zarr" / PEAKS_RECORD)
    blocklin.append(grown, y)
    assert not (tmp_path / "A.zarr" / PEAKS_RECORD).exists()


def _row_peaks(x):
    return _peaks(x.T)


def _wide_writes(tmp_path, writer, x):
    """``x`` (wide) written by ``writer``; returns the output and the values it holds."""
    if writer == "convert":
        return _converted(tmp_path, x)[1], x
    if writer == "from_array":
        return blocklin.from_array(x, tmp_path / "A.zarr", chunks=(16, 64)).path, x
    r = blocklin.random(tmp_path / "A.zarr", x.shape, seed=3, chunks=(16, 64), dtype=x.dtype)
    return r.path, r.to_numpy()


@pytest.mark.parametrize("writer", ["convert", "from_array", "random"])
@pytest.mark.parametrize("dtype", ["float32", "complex128"])
def test_a_wide_output_records_each_rows_peak(tmp_path, writer, dtype):
    """A wide output's record holds its rows' peaks (what an SVD streams, ``A^T``'s columns), not its
    columns': ``N`` values for an ``N x M`` matrix."""
    out, x = _wide_writes(tmp_path, writer, _data(dtype).T.copy())
    got = recorded(out, (N, M), transposed=True)
    np.testing.assert_array_equal(got.columns, _row_peaks(x).astype(np.float64))  # maxima: exact
    assert got.transposed and got.amax == float(_row_peaks(x).max())
    assert os.path.getsize(os.path.join(out, PEAKS_COLUMNS)) == 8 * N
    assert recorded(out, (N, M), transposed=False) is None  # the stored columns' were not recorded
    assert recorded(out, (N, M), column_peaks=False).amax == got.amax
    assert recorded(out, (M, N), column_peaks=False) is None


def test_a_columns_record_of_version_2_still_holds(tmp_path):
    """Records written before the rows' peaks (version 2: each stored column's, no shape) are read."""
    x = _data("float64", 1e-200)
    _, a = _converted(tmp_path, x)
    rec = json.loads((a / PEAKS_RECORD).read_text())
    old = {k: v for k, v in rec.items() if k not in ("shape", "transposed")}
    (a / PEAKS_RECORD).write_text(json.dumps(dict(old, version=2)))
    np.testing.assert_array_equal(recorded(a, (M, N)).columns, _peaks(x))
    assert recorded(a, (M, N + 1)) is None and recorded(a, (M, N), transposed=True) is None
    got = blocklin.svd(a, k=2, method="gram", memory="256KiB", seed=1)
    assert got.report["peaks_recorded"] == ["a"] and got.report["scaling"]["extra_passes"] == 0


@pytest.mark.parametrize("rows, added, side", [(20, 10, "rows"), (20, 30, "amax"), (600, 100, "columns")])
def test_append_records_the_grown_matrix_side(tmp_path, rows, added, side):
    """Rows appended: the grown matrix's record holds the side of its new shape (its rows' while it stays
    wide, its columns' when tall), or the largest magnitude alone where it turns tall (the kept rows'
    columns were never recorded)."""
    rng = np.random.default_rng(4)
    x, y = rng.standard_normal((rows, N)), rng.standard_normal((added, N)) * 1e3
    m = blocklin.from_array(x, tmp_path / "A.zarr", chunks=(8, 16))
    grown = blocklin.append(m, y)
    both = np.vstack([x, y])
    got = recorded(grown.path, both.shape, column_peaks=False)
    assert got.amax == float(np.abs(both).max())
    full = recorded(grown.path, both.shape)
    if side == "amax":
        assert full is None
    else:
        assert full.transposed is (side == "rows")
        np.testing.assert_array_equal(full.columns, _row_peaks(both) if side == "rows" else _peaks(both))
