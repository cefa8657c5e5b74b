"""Writes that meet a full disk part way: every byte is written or the write fails naming the file,
and nothing half written is left where a reader (or a commit) would take it for data.

A disk can fill after the up-front space check passed (another program writes to it), so these
tests fill a small tmpfs (root only; skipped where mounting is not permitted) instead of relying on
the check."""

from __future__ import annotations

import errno
import os

import numpy as np
import pytest

import blocklin
from blocklin.storage.backend import backend
from blocklin.storage.location import as_location
from blocklin.storage.rawchunks import raw_access
from blocklin.storage.space import describe_os_error
from blocklin.storage.zarr_store import create_array, write_block
from support.hostile import leftovers, small_tmpfs, write_zarr


def _fill(folder, leave: int) -> None:
    """Fill ``folder``'s file system until ``leave`` bytes (rounded to pages) are free."""
    free = os.statvfs(folder).f_bavail * os.statvfs(folder).f_frsize
    with open(folder / "filler", "wb") as f:
        f.write(b"\0" * max(0, free - leave))


def test_a_chunk_that_meets_a_full_disk_is_an_error_not_a_short_chunk(tmp_path):
    """An unbuffered write() returns a short count, without an error, when the disk fills part way;
    the chunk writer had renamed the short file into place as the chunk (80000 bytes expected, 28672
    on disk in a Cholesky factor on a full tmpfs), so the run failed later with a 'truncated or
    corrupt' read of its own output, or committed it where nothing read it back."""
    full = tmp_path / "full"
    with small_tmpfs(full, "1m"):
        arr = create_array(full / "x.zarr", shape=(100, 100), dtype="float64", chunks=(100, 100))
        assert raw_access(arr) is not None  # the direct chunk-file path is the one under test
        _fill(full, 32 * 1024)
        with pytest.raises(OSError) as info:
            write_block(arr, slice(0, 100), slice(0, 100), np.ones((100, 100)))
        assert info.value.errno == errno.ENOSPC
        message = describe_os_error(info.value)
        assert message is not None and str(full / "x.zarr") in message and "Fix: free space" in message
        assert not (full / "x.zarr" / "c" / "0" / "0").exists()
        assert [p for p in os.listdir(full / "x.zarr" / "c" / "0") if ".tmp-" in p] == []


def test_a_record_that_meets_a_full_disk_names_its_file_and_leaves_no_temporary(tmp_path):
    full = tmp_path / "full"
    with small_tmpfs(full, "1m"):
        (full / "store").mkdir()
        _fill(full, 8 * 1024)
        with pytest.raises(OSError) as info:
            backend(as_location(str(full / "store"))).write_bytes("records/r.bin", b"\1" * 200_000)
        message = describe_os_error(info.value)  # had been None: the error named no file
        assert message is not None and "records/r.bin" in message and "Fix: free space" in message
        assert os.listdir(full / "store" / "records") == []


@pytest.mark.parametrize("name", ["x.npy", "x.csv", "x.mtx"])
def test_a_file_export_that_meets_a_full_disk_names_the_file(tmp_path, monkeypatch, name):
    """A file export's ENOSPC had reached the user as 'OSError: [Errno 28] No space left on device'."""
    import shutil

    from blocklin.storage import space

    a = np.random.default_rng(1).standard_normal((300, 300))
    write_zarr(tmp_path / "a.zarr", a, (100, 100))
    full = tmp_path / "full"
    with small_tmpfs(full, "400k"):
        real = shutil.disk_usage  # the up-front check sees room that is gone by the time of the writes
        monkeypatch.setattr(space.shutil, "disk_usage", lambda p: real(p)._replace(free=1 << 40))
        with pytest.raises(OSError) as info:
            blocklin.convert(str(tmp_path / "a.zarr"), str(full / name), memory="8MiB")
        message = describe_os_error(info.value)
        assert message is not None and str(full / name) in message and "Fix: free space" in message, info.value
        assert os.listdir(full) == [] and leftovers(tmp_path, full) == []


def test_an_append_that_meets_a_full_disk_leaves_the_matrix_and_says_to_free_space(tmp_path, monkeypatch, capsys):
    """The fix of a full disk under an append had been 'write the output to a larger disk (another
    -o/out= path)': append has no -o, the matrix it writes into is where it is."""
    import shutil

    from blocklin.cli.main import main
    from blocklin.storage import space

    full = tmp_path / "full"
    a = np.random.default_rng(2).standard_normal((2000, 60))
    with small_tmpfs(full, "3m"):
        assert blocklin.convert(str(write_zarr(tmp_path / "t.zarr", a, (250, 60))), str(full / "T.zarr"),
                                chunks=(250, 60))
        np.save(tmp_path / "new.npy", np.ones((1500, 60)))
        real = shutil.disk_usage  # the up-front check sees room that is gone by the time of the writes
        monkeypatch.setattr(space.shutil, "disk_usage", lambda p: real(p)._replace(free=1 << 40))
        _fill(full, 200 * 1024)
        rc = main(["append", str(full / "T.zarr"), str(tmp_path / "new.npy"), "--no-progress"])
        err = capsys.readouterr().err.strip().splitlines()
        assert rc == 1 and len(err) == 1, err
        assert "no space left" in err[0] and str(full / "T.zarr") in err[0], err
        assert f"free space on the file system mounted at {full}" in err[0] and "-o/out=" not in err[0], err
        np.testing.assert_array_equal(blocklin.open(str(full / "T.zarr")).to_numpy(), a)
        assert not (full / "T.zarr" / ".blocklin-append.json").exists() and leftovers(full, full / "T.zarr") == []


@pytest.mark.parametrize("name", ["s.mtx", "s.npz"])
def test_a_sparse_export_that_meets_a_full_disk_names_the_file(tmp_path, name):
    """A sparse group's export had failed with 'OSError: [Errno 28] No space left on device'."""
    import scipy.io
    import scipy.sparse

    s = scipy.sparse.random(2000, 2000, density=0.01, random_state=1, format="csr")
    scipy.io.mmwrite(str(tmp_path / "s.mtx"), s)
    blocklin.convert(str(tmp_path / "s.mtx"), str(tmp_path / "S.zarr"))
    full = tmp_path / "full"
    with small_tmpfs(full, "100k"):  # under the export's size (an .npz of 40000 random values included)
        with pytest.raises(OSError) as info:
            blocklin.convert(str(tmp_path / "S.zarr"), str(full / name))
        message = describe_os_error(info.value)
        assert message is not None and str(full / name) in message and "Fix: free space" in message, info.value
        assert os.listdir(full) == [] and leftovers(tmp_path, full) == []


@pytest.mark.parametrize("order", ["C", "F"])
def test_an_npy_export_whose_writes_come_back_short_writes_every_byte(tmp_path, monkeypatch, order):
    """``write`` may write part of its bytes and return the count (a disk that fills mid-write, a signal); the
    ``.npy`` header had been written by one ``os.write`` whose count was ignored, so a short write left a file
    with part of its header (``np.load`` refused it, or read the data from the wrong offset)."""
    a = np.random.default_rng(2).standard_normal((40, 30))
    write_zarr(tmp_path / "a.zarr", a, (16, 16))
    real_write = os.write
    calls = []

    def short_write(fd, data):  # at most 7 bytes a call, as a file system may answer
        calls.append(len(data))
        return real_write(fd, bytes(memoryview(data)[:7]))

    def short_pwritev(fd, buffers, offset):
        calls.append(sum(len(b) for b in buffers))
        return os.pwrite(fd, bytes(memoryview(buffers[0]).cast("B")[:7]), offset)

    monkeypatch.setattr(os, "write", short_write)
    monkeypatch.setattr(os, "pwritev", short_pwritev)
    blocklin.convert(str(tmp_path / "a.zarr"), str(tmp_path / "a.npy"), out_order=order, memory="8MiB")
    monkeypatch.undo()
    assert calls  # the writes went through the short ones
    assert np.array_equal(np.load(tmp_path / "a.npy"), a)
    assert np.load(tmp_path / "a.npy").flags.f_contiguous == (order == "F")


@pytest.mark.parametrize("call", ["lu", "qr-tiled", "qr-tiles"])
@pytest.mark.parametrize("where", ["out", "temp dir"])
def test_a_factorization_that_meets_a_full_disk_names_its_output_not_its_work_store(tmp_path, monkeypatch, call,
                                                                                     where):
    """LU and QR keep their work stores inside the output's partial folder; a full disk met while writing them
    had been reported naming the work store's chunk (``R.zarr/.blocklin-done/qr-work.zarr/c/0/1``), a path that
    is gone once the run fails and no setting names. It names the output now (or, for a temporary result, the
    temp dir), with the fix: free space there or write elsewhere."""
    import shutil

    from blocklin.config import configure, get_config
    from blocklin.storage import space

    a = np.random.default_rng(3).standard_normal((200, 200))
    write_zarr(tmp_path / "a.zarr", a, (50, 50))
    full = tmp_path / "full"
    with small_tmpfs(full, "400k"):
        real = shutil.disk_usage  # the up-front check sees room that is gone by the time of the writes
        monkeypatch.setattr(space.shutil, "disk_usage", lambda p: real(p)._replace(free=1 << 40))
        old = get_config().temp_dir
        out = str(full / "F.zarr") if where == "out" else None
        if where == "temp dir":
            configure(temp_dir=str(full))
        try:
            with pytest.raises(OSError) as info:
                if call == "lu":
                    blocklin.lu(str(tmp_path / "a.zarr"), out, memory="1MiB", tile=50)
                else:
                    blocklin.qr(str(tmp_path / "a.zarr"), out, method=call[3:], memory="1MiB", tile=50)
            message = describe_os_error(info.value)
        finally:
            configure(temp_dir=old)
        assert info.value.errno == errno.ENOSPC
        assert message is not None and "work.zarr" not in message and ".blocklin-done" not in message, message
        if where == "out":
            assert message.startswith(f"out: must be writable with room for the job's data; got {full / 'F.zarr'}: "
                                       "no space left"), message
            assert message.endswith(f"Fix: free space in {full}, or write the output to a larger disk "
                                    "(another -o/out= path)"), message
        else:
            assert message.startswith(f"temp dir: must be writable with room for the job's data; got {full}"), message
            assert f"Fix: free space in {full}, or point the temp dir at a larger disk" in message, message
        assert "work store" in str(info.value)  # the raw error says what was being written
        assert leftovers(tmp_path, full) == []
