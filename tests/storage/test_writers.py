"""Two writers, one output: each run owns its partial output.

A second run to an output that a live run is writing fails with "another run is writing OUT (pid P
on HOST since T)" and a fix, with or without ``resume``, and leaves the first run's data alone; the
partial of a run that is gone (dead pid on this host, a reused pid, a stale heartbeat from another
host) is removed, or taken over with ``resume``. Readers through blocklin never see a mix of old and
new data while ``overwrite=True`` replaces an output. Sizes are small: a few hundred rows, KiB
budgets.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

import blocklin
from blocklin.errors import OutputBusyError
from blocklin.storage import ownership
from blocklin.storage.backend import backend, remove
from blocklin.storage.location import as_location

RNG = np.random.default_rng(12)
A = RNG.standard_normal((96, 80))
B = RNG.standard_normal((80, 72))
SUPPORT = Path(__file__).resolve().parents[1] / "support"
BUSY = r"another run is writing \S+C\.zarr \(pid \d+ on \S+ since \S+\)\. Fix: .*--resume"


@pytest.fixture
def ops(tmp_path):
    a = blocklin.from_array(A, tmp_path / "A.zarr", chunks=(32, 40))
    b = blocklin.from_array(B, tmp_path / "B.zarr", chunks=(40, 24))
    return a, b, tmp_path / "C.zarr"


@pytest.fixture
def sleeper():
    """A live process of this host whose pid a fake owner record names."""
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    yield p
    p.kill()
    p.wait()


def _fake_partial(out: Path, pid: int, **fields) -> Path:
    """A partial output of ``out`` with some data, owned by ``pid`` (as a writer would leave it)."""
    part = out.parent / f".{out.name}.partial-0123456789abcdef"
    (part / "c" / "0").mkdir(parents=True)
    (part / "c" / "0" / "0").write_bytes(b"x" * 1000)
    rec = ownership.new_record(output=str(out), token="0123456789abcdef")
    rec.update(pid=pid, proc_start=ownership._proc_start(pid), **fields)
    (part / ownership.OWNER_RECORD).write_text(json.dumps(rec))
    return part


def _leftovers(folder: Path) -> list[str]:
    return sorted(f for f in os.listdir(folder) if ".partial-" in f or ".old-" in f)


@pytest.mark.parametrize("resume", [False, True])
def test_live_writer_refused_and_left_alone(ops, sleeper, resume):
    a, b, out = ops
    part = _fake_partial(out, sleeper.pid)
    with pytest.raises(OutputBusyError, match=BUSY) as err:
        blocklin.matmul(a, b, out, memory="64KiB", scheduler="sync", resume=resume)
    assert f"pid {sleeper.pid} " in str(err.value)
    assert (part / "c" / "0" / "0").read_bytes() == b"x" * 1000  # the live run's data is untouched
    assert not out.exists()


def test_gone_writer_partial_removed(ops, sleeper):
    a, b, out = ops
    part = _fake_partial(out, sleeper.pid)
    sleeper.kill()
    sleeper.wait()
    with pytest.warns(UserWarning, match="removed the partial output of a run that is gone"):
        c = blocklin.matmul(a, b, out, memory="64KiB", scheduler="sync")
    assert not part.exists() and _leftovers(out.parent) == []
    # a length-k float64 dot product is off by at most k eps |a||b| (Higham, Accuracy and Stability, 3.1)
    bound = A.shape[1] * np.finfo(np.float64).eps * (np.abs(A) @ np.abs(B))
    assert np.all(np.abs(c.to_numpy() - A @ B) <= bound)


def test_reused_pid_is_gone(ops, sleeper):
    """A live pid that belongs to a process started at another time is not the owner."""
    a, b, out = ops
    _fake_partial(out, sleeper.pid)
    rec_path = next(out.parent.glob(".C.zarr.partial-*")) / ownership.OWNER_RECORD
    rec = json.loads(rec_path.read_text())
    rec["proc_start"] = str(int(rec["proc_start"]) - 1)
    rec_path.write_text(json.dumps(rec))
    assert not ownership.is_alive(rec)
    with pytest.warns(UserWarning, match="gone"):
        blocklin.matmul(a, b, out, memory="64KiB", scheduler="sync")
    assert _leftovers(out.parent) == []


def test_other_host_uses_the_heartbeat_lease(ops):
    a, b, out = ops
    _fake_partial(out, 1, host="elsewhere.example", heartbeat=time.time())
    with pytest.raises(OutputBusyError, match=r"pid 1 on elsewhere\.example"):
        blocklin.matmul(a, b, out, memory="64KiB", scheduler="sync")
    rec_path = next(out.parent.glob(".C.zarr.partial-*")) / ownership.OWNER_RECORD
    rec = json.loads(rec_path.read_text())
    rec["heartbeat"] = time.time() - ownership.LEASE_SECONDS - 1
    rec_path.write_text(json.dumps(rec))
    with pytest.warns(UserWarning, match="gone"):
        blocklin.matmul(a, b, out, memory="64KiB", scheduler="sync")
    assert _leftovers(out.parent) == []


def test_heartbeat_refreshes_and_never_resurrects(tmp_path, monkeypatch):
    monkeypatch.setattr(ownership, "HEARTBEAT_SECONDS", 0.05)
    loc = as_location(tmp_path / "work")
    rec = ownership.start_work_folder(loc, operation="test")
    first = rec["heartbeat"]
    ownership.Heartbeat._wake.set()
    deadline = time.time() + 5
    while ownership.read_record(loc)["heartbeat"] == first and time.time() < deadline:
        time.sleep(0.02)
    assert ownership.read_record(loc)["heartbeat"] > first
    ownership.end_work_folder(loc)
    ownership.Heartbeat._wake.set()
    time.sleep(0.2)
    assert not (tmp_path / "work").exists()  # a beat after the end does not recreate the folder


def stopped_after_two_tiles(monkeypatch, run):
    """``run()`` (a resumable matmul) stopped by an error in its third tile: its partial is kept."""
    import blocklin.runtime.tiles as tiles_mod

    real, calls = tiles_mod.run_tile, []

    def failing(*args, **kw):
        if len(calls) == 2:
            raise RuntimeError("stop")
        calls.append(1)
        return real(*args, **kw)

    monkeypatch.setattr(tiles_mod, "run_tile", failing)
    with pytest.raises(RuntimeError, match="stop"):
        run()
    monkeypatch.undo()


def test_resume_takes_over_a_killed_run(ops, monkeypatch):
    """A partial kept for resume whose owner died is continued by the next resume, same bits."""
    a, b, out = ops
    ref = blocklin.matmul(a, b, out.parent / "ref.zarr", memory="64KiB", scheduler="sync")
    stopped_after_two_tiles(monkeypatch, lambda: blocklin.matmul(a, b, out, memory="64KiB", scheduler="sync",
                                                                 resume=True))
    (part,) = out.parent.glob(".C.zarr.partial-*")
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    rec = ownership.new_record(output=str(out))
    rec.update(pid=int(dead.stdout), proc_start=None)  # as SIGKILL leaves it: the record of a dead pid
    (part / ownership.OWNER_RECORD).write_text(json.dumps(rec))
    done = blocklin.matmul(a, b, out, memory="64KiB", scheduler="sync", resume=True)
    assert done.report["skipped"] == 2
    np.testing.assert_array_equal(done.to_numpy(), ref.to_numpy())
    assert _leftovers(out.parent) == []


def _slow_gemm(tmp_path: Path, *extra: str) -> subprocess.Popen:
    env = {**os.environ, "BLOCKLIN_TEST_DELAY": "0.05", "BLOCKLIN_TEMP_DIR": str(tmp_path)}
    return subprocess.Popen([sys.executable, str(SUPPORT / "slow_cli.py"), "gemm", str(tmp_path / "A.zarr"),
                             str(tmp_path / "B.zarr"), "-o", str(tmp_path / "C.zarr"), "--memory", "64KiB",
                             "--no-progress", *extra], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env)


def _wait_for(pattern: str, folder: Path, proc: subprocess.Popen, timeout: float = 60) -> None:
    deadline = time.time() + timeout
    while not list(folder.glob(pattern)):
        assert proc.poll() is None, proc.communicate()
        assert time.time() < deadline, f"{pattern} never appeared"
        time.sleep(0.005)


def test_two_cli_writers(ops, capsys, monkeypatch):
    """A second ``blocklin gemm`` to the output a first one writes fails in one line, exit 1, with
    and without --resume and with --overwrite; the first run finishes with the right result."""
    from blocklin.cli.main import main

    a, b, out = ops
    monkeypatch.setattr("warnings.formatwarning", __import__("warnings").formatwarning)
    first = _slow_gemm(out.parent)
    try:
        _wait_for(".C.zarr.partial-*/zarr.json", out.parent, first)  # written after the claim
        first.send_signal(signal.SIGSTOP)  # held mid-run (alive) however fast the machine is
        for extra in ([], ["--resume"], ["--overwrite"]):
            rc = main(["gemm", str(a.path), str(b.path), "-o", str(out), "--memory", "64KiB", "--no-progress", *extra])
            err = capsys.readouterr().err.strip().splitlines()
            assert rc == 1 and len(err) == 1, err
            assert f"pid {first.pid} " in err[0] and "another run is writing" in err[0]
        assert first.poll() is None  # still running: the second writer did not disturb it
    finally:
        first.send_signal(signal.SIGCONT)
        stdout, stderr = first.communicate(timeout=120)
    assert first.returncode == 0, stderr
    ref = blocklin.matmul(a, b, out.parent / "ref.zarr", memory="64KiB")
    np.testing.assert_array_equal(blocklin.open(out).to_numpy(), ref.to_numpy())
    assert _leftovers(out.parent) == []


def test_readers_never_see_a_mix_during_overwrite(tmp_path):
    """Outputs of all 1.0 and all 2.0 replace each other while a thread reads: every read is one
    of them whole, never a mix and never missing."""
    ones = blocklin.from_array(np.ones((96, 16)), tmp_path / "ones.zarr", chunks=(16, 16))
    eye = blocklin.from_array(np.eye(16), tmp_path / "eye.zarr", chunks=(16, 16))
    twos = blocklin.from_array(2 * np.ones((96, 16)), tmp_path / "twos.zarr", chunks=(16, 16))
    out = tmp_path / "C.zarr"
    blocklin.matmul(ones, eye, out, memory="64KiB")
    reader = blocklin.open(out)
    seen, bad, stop = [], [], threading.Event()

    def read_loop():
        while not stop.is_set():
            x = reader.to_numpy()
            vals = np.unique(x)
            (seen if len(vals) == 1 and vals[0] in (1.0, 2.0) else bad).append(vals)

    t = threading.Thread(target=read_loop)
    t.start()
    try:
        for i in range(12):
            blocklin.matmul(twos if i % 2 == 0 else ones, eye, out, memory="64KiB", overwrite=True)
    finally:
        stop.set()
        t.join()
    assert not bad, bad[:3]
    assert len(seen) > 12
    assert _leftovers(tmp_path) == []


def test_commit_swaps_in_one_step(tmp_path):
    """The path always holds one whole output: an exchange, never a moment without it."""
    from blocklin.storage.atomic import publish

    old, new = tmp_path / "out", tmp_path / ".out.partial-1"
    old.mkdir()
    (old / "v").write_text("old")
    new.mkdir()
    (new / "v").write_text("new")
    publish(str(new), str(old))
    assert (old / "v").read_text() == "new" and not new.exists()


def test_clean_never_removes_a_live_run(ops, sleeper):
    from blocklin.storage.cleanup import clean

    a, b, out = ops
    live = _fake_partial(out, sleeper.pid)
    items = clean([out.parent])
    assert [(i.path, i.action) for i in items] == [(str(live), "kept")]
    assert live.exists()
    sleeper.kill()
    sleeper.wait()
    assert [i.action for i in clean([out], dry_run=True)] == ["would remove"] and live.exists()
    (item,) = clean([out])
    assert item.action == "removed" and item.bytes >= 1000 and not live.exists()


def test_object_store_second_writer_refused(sleeper):
    """The in-place protocol (no rename) keeps its owner record next to the pending record."""
    pytest.importorskip("fsspec")
    from blocklin.storage.atomic import AtomicOutput

    url = f"memory://writers-{os.getpid()}/C.zarr"
    first = AtomicOutput(url, token="t1")
    try:
        with pytest.raises(OutputBusyError, match="another run is writing memory://"):
            AtomicOutput(url, token="t1", resume=True)
        rec = ownership.read_record(first.owner_location)
        rec.update(pid=sleeper.pid, proc_start=ownership._proc_start(sleeper.pid), run="other")
        ownership.write_record(first.owner_location, rec)
        ownership.Heartbeat.release(first.owner_location)
        first.owner = None
        sleeper.kill()
        sleeper.wait()
        second = AtomicOutput(url, token="t1", resume=True)  # the owner is gone: taken over
        assert second.resumed
        second.abort()
    finally:
        remove(as_location(url))


def test_clean_object_store_output_of_a_gone_run(sleeper):
    """An output prefix left pending by a killed run on an object store is found and removed."""
    from blocklin.storage.atomic import AtomicOutput
    from blocklin.storage.cleanup import clean

    url = f"memory://clean-{os.getpid()}/C.zarr"
    left = AtomicOutput(url, token="t1")
    backend_ = backend(left.path)
    backend_.write_bytes("c/0/0", b"x" * 100)
    rec = ownership.read_record(left.owner_location)
    rec.update(pid=sleeper.pid, proc_start=ownership._proc_start(sleeper.pid), run="killed")
    ownership.write_record(left.owner_location, rec)
    ownership.Heartbeat.release(left.owner_location)
    try:
        assert [i.action for i in clean([url])] == ["kept"]  # its owner is alive
        sleeper.kill()
        sleeper.wait()
        (item,) = clean([url])
        assert item.action == "removed" and item.bytes >= 100
        assert not backend_.keys("")
    finally:
        remove(as_location(url))


def test_overwriting_an_owned_array_keeps_its_heartbeat(tmp_path, monkeypatch):
    """zarr's overwrite empties the folder and blocklin restores the owner record; a heartbeat in between
    raced it (a record renamed into the folder being emptied: FileNotFoundError) or found no record and
    stopped refreshing the output. Beats are paused meanwhile: with beats as fast as they go, the
    record survives every overwrite and is still refreshed."""
    import threading

    from blocklin.storage import ownership
    from blocklin.storage.location import as_location
    from blocklin.storage.zarr_store import create_array

    monkeypatch.setattr(ownership, "HEARTBEAT_SECONDS", 0.0)
    loc = as_location(str(tmp_path / "out.zarr"))
    rec = ownership.start_work_folder(loc)
    stop = threading.Event()

    def beat() -> None:
        while not stop.is_set():
            ownership.Heartbeat._wake.set()

    waker = threading.Thread(target=beat, daemon=True)
    waker.start()
    try:
        for _ in range(100):
            create_array(loc, shape=(8, 8), dtype="float64", chunks=(4, 4), overwrite=True)
            assert ownership.read_record(loc)["run"] == rec["run"]
        assert ownership.Heartbeat.holds(rec)
    finally:
        stop.set()
        waker.join()
        ownership.end_work_folder(loc)


@pytest.mark.parametrize("where", ["local", "memory"])
def test_resume_of_a_complete_output_says_it_is_complete(ops, where, capsys):
    """``resume=True`` on an output a finished run committed refuses, saying that it is complete,
    naming it and how to open or recompute it; the output is left as it was."""
    from blocklin.cli.main import main

    a, b, out = ops
    if where == "memory":
        out = f"memory://blocklin-done-{os.getpid()}/C.zarr"
    first = blocklin.matmul(a, b, out, memory="64KiB", scheduler="sync")
    before = first.to_numpy()
    with pytest.raises(blocklin.errors.OutputExistsError,
                       match=r"resume continues an unfinished run, and this output is complete.*the complete result "
                             r"of matmul written .*Fix: open it \(blocklin\.open\(.*overwrite=True"):
        blocklin.matmul(a, b, out, memory="64KiB", scheduler="sync", resume=True)
    rc = main(["gemm", str(a.path), str(b.path), "-o", str(out), "--memory", "64KiB", "--no-progress", "--resume"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 1 and len(err) == 1 and "this output is complete" in err[0] and "--overwrite" in err[0], err
    np.testing.assert_array_equal(blocklin.open(out).to_numpy(), before)
    again = blocklin.matmul(a, b, out, memory="64KiB", scheduler="sync", resume=True, overwrite=True)
    np.testing.assert_array_equal(again.to_numpy(), before)  # the same bits, computed again
    if where == "local":
        assert _leftovers(out.parent) == []


def test_resume_after_an_interrupted_overwrite_is_not_called_complete(ops, monkeypatch):
    """Where an overwriting run of a complete output was interrupted (its partial kept), ``resume``
    without ``overwrite`` is refused as before (the fix: overwrite=True continues it), not told that
    no unfinished run is left."""
    a, b, out = ops
    blocklin.matmul(a, b, out, memory="64KiB", scheduler="sync")
    stopped_after_two_tiles(monkeypatch, lambda: blocklin.matmul(a, b, out, memory="64KiB", scheduler="sync",
                                                                 resume=True, overwrite=True))
    with pytest.raises(blocklin.errors.OutputExistsError, match="must not exist unless overwriting") as e:
        blocklin.matmul(a, b, out, memory="64KiB", scheduler="sync", resume=True)
    assert "complete" not in str(e.value)
    done = blocklin.matmul(a, b, out, memory="64KiB", scheduler="sync", resume=True, overwrite=True)
    assert done.report["skipped"] == 2


def test_resume_of_a_complete_conversion_says_it_is_complete(tmp_path):
    """The conversion's own early check of its output says the same (it runs before the writer's)."""
    np.save(tmp_path / "A.npy", A)
    blocklin.convert(tmp_path / "A.npy", tmp_path / "A.zarr")
    with pytest.raises(blocklin.errors.OutputExistsError, match=r"this output is complete.*the complete result of "
                                                                r"convert .*overwrite=True"):
        blocklin.convert(tmp_path / "A.npy", tmp_path / "A.zarr", resume=True)
    np.testing.assert_array_equal(blocklin.open(tmp_path / "A.zarr").to_numpy(), A)


def test_second_file_export_of_one_job_leaves_the_live_partial_alone(tmp_path, sleeper):
    """A file export's partial has the job's token as its name, so the same export started twice
    meets the first run's partial: the second run is refused as busy (it had removed that partial, so
    that the first run's commit renamed the second's half-written file into place as the output). A
    partial whose run is gone is removed and the export starts over."""
    from blocklin.storage import file_records
    from blocklin.storage.formats.base import AtomicFile

    out = tmp_path / "X.csv"
    first = AtomicFile(out, token="0123456789abcdef", kind="csv")
    first.partial.write_text("1,2\n")  # the first run's rows so far
    with pytest.raises(OutputBusyError, match="another run is writing"):
        AtomicFile(out, token="0123456789abcdef", kind="csv")  # the same process, the partial still open
    assert first.partial.read_text() == "1,2\n"
    first.abort()
    file_records.write_owner(first.partial, operation="export")  # another live process's partial
    rec = file_records.read_owner(first.partial)
    rec.update(pid=sleeper.pid, proc_start=ownership._proc_start(sleeper.pid))
    Path(str(first.partial) + file_records.OWNER_SUFFIX).write_text(json.dumps(rec))
    first.partial.write_text("3,4\n")
    with pytest.raises(OutputBusyError, match=f"pid {sleeper.pid} "):
        AtomicFile(out, token="0123456789abcdef", kind="csv")
    assert first.partial.read_text() == "3,4\n" and not out.exists()
    sleeper.kill()
    sleeper.wait()
    second = AtomicFile(out, token="0123456789abcdef", kind="csv")  # its run is gone: removed, started over
    assert not second.partial.exists()
    second.partial.write_text("5,6\n")
    assert second.commit().read_text() == "5,6\n"


def test_ctrl_c_right_after_a_file_export_is_renamed_still_records_it(tmp_path, monkeypatch):
    """Ctrl-C between the rename of a file export into place and the writing of its record
    (``.NAME.blocklin``) had left a complete file without one: the CLI said it "was written
    (complete)", yet a later ``--overwrite`` refused it as a file blocklin did not write. The record
    is written whatever interrupts the commit after the rename."""
    from blocklin.storage import file_records
    from blocklin.storage.formats import base

    a = np.arange(12.0).reshape(3, 4)
    np.save(tmp_path / "a.npy", a)

    def interrupted(path):
        raise KeyboardInterrupt

    monkeypatch.setattr(base, "note_written", interrupted)
    out = tmp_path / "o.npy"
    with pytest.raises(KeyboardInterrupt):
        blocklin.convert(tmp_path / "a.npy", out)
    np.testing.assert_array_equal(np.load(out), a)
    assert file_records.matches(out, file_records.read(out))
    monkeypatch.undo()
    blocklin.convert(tmp_path / "a.npy", out, overwrite=True)  # blocklin's file: replaced
    np.testing.assert_array_equal(np.load(out), a)


def test_ctrl_c_as_the_rename_returns_still_records_the_file(tmp_path, monkeypatch):
    """The interrupt can land as ``os.replace`` returns, before the commit's protected part began: the
    file was in place without its record, and its partial's owner record was left beside it. The
    commit tells a rename that happened (the partial's inode is now the output's) and records it; a
    rename that failed records nothing."""
    from blocklin.storage import file_records

    a = np.arange(12.0).reshape(3, 4)
    np.save(tmp_path / "a.npy", a)
    out = tmp_path / "o.npy"
    rename = os.replace

    def interrupted_after(src, dst):
        rename(src, dst)
        if os.fspath(dst) == str(out):
            raise KeyboardInterrupt

    monkeypatch.setattr(os, "replace", interrupted_after)
    with pytest.raises(KeyboardInterrupt):
        blocklin.convert(tmp_path / "a.npy", out)
    monkeypatch.undo()
    np.testing.assert_array_equal(np.load(out), a)
    assert file_records.matches(out, file_records.read(out))
    assert not [p for p in os.listdir(tmp_path) if ".partial" in p]

    def failing(src, dst):
        if os.fspath(dst) == str(tmp_path / "p.npy"):
            raise OSError("no rename")
        rename(src, dst)

    monkeypatch.setattr(os, "replace", failing)
    with pytest.raises(OSError, match="no rename"):
        blocklin.convert(tmp_path / "a.npy", tmp_path / "p.npy")
    monkeypatch.undo()
    assert not (tmp_path / "p.npy").exists() and file_records.read(tmp_path / "p.npy") is None
    assert not [p for p in os.listdir(tmp_path) if ".partial" in p]
