"""Interrupts leave nothing: SIGINT, SIGTERM and SIGKILL for every command that writes an output.

Each command runs as ``blocklin`` in a subprocess (``tests/support/slow_cli.py``: the real CLI with a small
delay before each streamed item, so that the run is still writing when the signal comes) on small
matrices with KiB-MiB budgets. The signal is sent at a point the test waits for, not after a sleep:
``start`` (the partial output or the work folder has appeared) or ``mid`` (the second streamed
item or finished unit has begun; ``slow_cli`` creates a mark file then); each signal meets each
point, alternating over the commands. Then:

* SIGINT / SIGTERM: exit 130 / 143 with one line on stderr; a resumable command (with or without
  ``--resume``) keeps its partial output and, for operations made of steps over work stores, its
  work folder for a rerun with ``--resume``, and the line says how to continue or remove them;
  nothing else is left behind;
* SIGKILL: whatever the killed run left is found and removed by the rerun (or ``blocklin clean``);
* the rerun, with ``--resume`` where the command supports it and without, gives results identical
  to an uninterrupted run, and leaves nothing behind.
"""

from __future__ import annotations

import os
import signal
import time
import warnings

import numpy as np
import pytest

import blocklin
from blocklin.cli.main import main
from support.interrupts import COMMANDS, N, cli_argv, interrupt, leftovers, load_output, takes_resume

#: Each signal at both points, alternating over the commands (every command sees every signal).
CASES = [(name, sig, point if i % 2 == 0 else {"start": "mid", "mid": "start"}[point])
         for i, name in enumerate(COMMANDS)
         for sig, point in (("SIGINT", "start"), ("SIGTERM", "mid"), ("SIGKILL", "mid"))]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    d = tmp_path_factory.mktemp("signals")
    rng = np.random.default_rng(5)
    a = rng.standard_normal((N, N))
    np.save(d / "A.npy", a)
    blocklin.from_array(a, d / "A.zarr", chunks=(40, 40))
    blocklin.from_array(a @ a.T + N * np.eye(N), d / "S.zarr", chunks=(40, 40))
    blocklin.from_array(rng.standard_normal((N, 8)), d / "B.zarr", chunks=(40, 8))
    (d / "tmp").mkdir()
    return d


@pytest.fixture
def case(data, tmp_path):
    """A copy of the inputs in a folder of this case's own: what one failing case leaves behind does
    not fail the cases after it, and what a case finds left is its own."""
    import shutil

    d = tmp_path / "case"
    d.mkdir()
    for name in ("A.npy", "A.zarr", "S.zarr", "B.zarr"):
        (shutil.copytree if (data / name).is_dir() else shutil.copy2)(data / name, d / name)
    (d / "tmp").mkdir()
    return d


@pytest.fixture(scope="module")
def references(data):
    """Each command's output from an uninterrupted run (what every rerun must reproduce bit for bit)."""
    cwd, saved = os.getcwd(), warnings.formatwarning
    os.chdir(data)
    try:
        for name, base in COMMANDS.items():
            assert main(cli_argv(base, f"ref-{name}.zarr", str(data / "tmp"))) == 0
    finally:
        os.chdir(cwd)
        warnings.formatwarning = saved
    return {name: load_output(data / f"ref-{name}.zarr") for name in COMMANDS}


@pytest.mark.parametrize("name,sig,point", CASES)
def test_interrupt_then_rerun(case, references, name, sig, point, monkeypatch):
    data = case
    out = f"{name}-{sig}.zarr"
    tmp = str(data / "tmp")
    resumable = takes_resume(COMMANDS[name])
    resume = ["--resume"] if resumable and sig != "SIGINT" else []  # SIGINT: the rerun without --resume
    monkeypatch.setattr(warnings, "formatwarning", warnings.formatwarning)
    monkeypatch.chdir(data)

    r = interrupt(data, cli_argv(COMMANDS[name], out, tmp, *resume), sig, point, out)
    assert not (data / out).exists()
    if sig == "SIGKILL":
        assert r.returncode == -signal.SIGKILL
    else:
        # a first run with --resume says once that it has nothing to continue; then the one line
        lines = [ln for ln in r.stderr.strip().splitlines()
                 if not (resume and ln.startswith("blocklin: warning: resume: no unfinished run"))]
        word, code = ("interrupted", 130) if sig == "SIGINT" else ("terminated", 143)
        assert r.returncode == code, r.stderr
        assert len(lines) == 1 and lines[0].startswith(f"blocklin {COMMANDS[name][0]}: {word}"), r.stderr
        # resumable: the partial output and, for operations made of steps over work stores (inv, the square
        # solves), their work folder, kept for --resume (a signal at "start" may land before either exists)
        kept = [f for f in leftovers(data) if resumable and (
            f.startswith(f".{out}.partial-") or f.startswith(f"tmp/blocklin-{COMMANDS[name][0]}-"))]
        assert [f for f in leftovers(data) if f not in kept] == []
        assert len(kept) <= 2
        assert not kept or "--resume" in lines[0] and "blocklin clean" in lines[0], lines[0]
        assert point == "start" or kept  # mid-run, finished work exists and is kept

    assert main(cli_argv(COMMANDS[name], out, tmp, *resume)) == 0
    got, ref = load_output(data / out), references[name]
    assert got.keys() == ref.keys()
    for key in ref:
        np.testing.assert_array_equal(got[key], ref[key], err_msg=f"{name} {key}")
    assert leftovers(data) == []


@pytest.mark.parametrize("name", ["inv", "solve"])
def test_clean_removes_what_sigkill_left(case, monkeypatch, capsys, name):
    """``blocklin clean`` finds a killed run's work folder and partial output (an inverse, a square solve
    killed mid-factorization with ``--resume``), says what it removes with sizes, removes them, and finds
    nothing the second time."""
    import json

    data = case
    monkeypatch.setattr(warnings, "formatwarning", warnings.formatwarning)
    monkeypatch.chdir(data)
    tmp = str(data / "tmp")
    r = interrupt(data, cli_argv(COMMANDS[name], "killed.zarr", tmp, *(["--resume"] if name == "solve" else [])),
                   "SIGKILL", "mid", "killed.zarr")
    assert r.returncode == -signal.SIGKILL
    left = leftovers(data)
    assert left, "SIGKILL left nothing to clean"
    assert any(f.startswith(f"tmp/blocklin-{name}-") for f in left), left  # the work folder
    assert main(["clean", str(data), tmp, "--dry-run", "--json"]) == 0
    dry = json.loads(capsys.readouterr().out)
    assert {i["action"] for i in dry["items"]} == {"would remove"} and leftovers(data) == left
    assert main(["clean", str(data), tmp]) == 0
    text = capsys.readouterr().out
    assert text.count("removed ") == len(left) and "freed" in text
    assert leftovers(data) == []
    assert main(["clean", str(data), tmp]) == 0
    assert "nothing to clean" in capsys.readouterr().out


def test_keyboard_interrupt_waits_for_threaded_tasks(tmp_path, monkeypatch):
    """From Python: Ctrl-C while threaded tasks stream their panels stops them before the job lets
    the partial output go (kept for resume=True), so no task writes into it afterwards (without the
    wait, a task thread went on writing strips after the cleanup)."""

    import blocklin.device.stream as stream

    a = blocklin.from_array(np.random.default_rng(3).standard_normal((192, 192)), tmp_path / "A.zarr",
                            chunks=(32, 32))
    real, calls = stream.check_cancelled, []

    def slow_check():
        calls.append(1)
        if len(calls) == 8:
            os.kill(os.getpid(), signal.SIGINT)  # a real signal: it wakes the waiting main thread
        time.sleep(0.02)  # tasks are mid-tile, arrays open, when the main thread starts its cleanup
        real()

    monkeypatch.setattr(stream, "check_cancelled", slow_check)
    with pytest.raises(KeyboardInterrupt), pytest.warns(UserWarning, match="kept in partial output"):
        blocklin.matmul(a, a, tmp_path / "C.zarr", memory="256KiB", workers=2, scheduler="threads")

    def files() -> dict:
        return {os.path.relpath(os.path.join(r, f), tmp_path): os.stat(os.path.join(r, f)).st_mtime_ns
                for r, ds, fs in os.walk(tmp_path) for f in fs if "A.zarr" not in r}

    kept = files()
    time.sleep(0.5)  # a task that outlived the cleanup would write now
    assert files() == kept
    assert [f for f in os.listdir(tmp_path) if f not in ("A.zarr", "blocklin-tmp")] == \
        [p for p in os.listdir(tmp_path) if p.startswith(".C.zarr.partial-")]  # only the kept partial


def test_work_folder_removal_waits_for_writes_still_in_flight(tmp_path):
    """Ctrl-C lands in the thread that waits on zarr's I/O loop, not in the loop: a write the loop still
    runs must land before the job's deterministic work folder is removed, or it recreates the folder
    (what a Ctrl-C'd inverse left behind once in a while)."""
    import asyncio

    from zarr.core import sync as zsync

    from blocklin.runtime.job import Job

    async def late_write(folder: str) -> None:
        await asyncio.sleep(0.3)
        os.makedirs(os.path.join(folder, "X.zarr", "c", "0"), exist_ok=True)
        with open(os.path.join(folder, "X.zarr", "c", "0", "0"), "wb") as f:
            f.write(b"chunk")

    folder = []
    with pytest.raises(KeyboardInterrupt):
        with Job("inv", temp_dir=str(tmp_path)) as job:
            out = job.output(str(tmp_path / "X.zarr"), inputs=[])  # no token: nothing kept for a resume
            folder.append(job.work_dir("inv", "0123456789abcdef", output=out).url)
            zsync.sync(asyncio.sleep(0))  # zarr's loop is running, as in any job that wrote
            asyncio.run_coroutine_threadsafe(late_write(folder[0]), zsync.loop[0])
            raise KeyboardInterrupt
    time.sleep(0.5)  # long after the write
    assert folder[0].startswith(str(tmp_path)) and not os.path.exists(folder[0])


def test_a_join_cut_short_by_ctrl_c_still_waits_for_the_writer(tmp_path):
    """A writer thread outlives a join that Ctrl-C interrupts: interrupt.wait_through goes on waiting
    and re-raises afterwards, so the write lands before any cleanup (the partial a Ctrl-C'd inverse
    sometimes left under load: its leaf's writer pool was still writing after the removal)."""
    import threading

    from blocklin import interrupt

    release, target = threading.Event(), tmp_path / "late-chunk"

    def writer():
        release.wait()
        target.write_bytes(b"chunk")

    t = threading.Thread(target=writer)
    t.start()
    calls = []

    def join():
        calls.append(1)
        if len(calls) == 1:  # Ctrl-C lands in the first join, the writer still busy
            release.set()
            raise KeyboardInterrupt
        t.join()

    try:
        with pytest.raises(KeyboardInterrupt):
            interrupt.wait_through(join)
        assert target.exists() and not t.is_alive() and len(calls) == 2
        assert interrupt.cancelled()  # the tasks still running are told to stop
    finally:
        interrupt.reset()


def test_ctrl_c_again_while_stopping_is_absorbed_once(capfd):
    """Under the CLI's handlers the first Ctrl-C stops the command; one more while it stops (its cleanup
    keeps the finished work and says how to resume) is absorbed with a note; the next one stops at once
    (the test's child sent a SIGINT per chunk write and cut the inverse's cleanup short under load)."""
    from blocklin import interrupt

    def ctrl_c():
        os.kill(os.getpid(), signal.SIGINT)
        for _ in range(1000):  # the handler runs at the next bytecode of the main thread
            time.sleep(0)

    assert interrupt.ABSORBED == 1
    try:
        with interrupt.handle_signals():
            with pytest.raises(KeyboardInterrupt):
                ctrl_c()
            ctrl_c()  # while stopping: absorbed, said once on stderr
            assert "interrupt again to quit at once" in capfd.readouterr().err
            with pytest.raises(KeyboardInterrupt):
                ctrl_c()
        with interrupt.handle_signals():  # a new command starts counting again
            with pytest.raises(KeyboardInterrupt):
                ctrl_c()
    finally:
        interrupt.reset()


def test_ctrl_c_again_while_the_last_line_is_printed_is_absorbed(monkeypatch, capfd):
    """The second Ctrl-C may land while the command prints its one line (seen in CI under load):
    the line is printed under the handlers, so it is absorbed and the exit status is still 130."""
    import argparse

    from blocklin import interrupt
    from blocklin.cli import ui
    from blocklin.storage import cleanup

    def ctrl_c():
        os.kill(os.getpid(), signal.SIGINT)
        for _ in range(1000):  # the handler runs at the next bytecode of the main thread
            time.sleep(0)

    def command(args):
        ctrl_c()

    real = cleanup.take_kept
    monkeypatch.setattr(cleanup, "take_kept", lambda: (ctrl_c(), real())[1])  # while the line is made
    try:
        assert ui._run_command(argparse.Namespace(command="inv", func=command)) == ui.EXIT_INTERRUPTED
    finally:
        interrupt.reset()
    err = capfd.readouterr().err
    assert "interrupt again to quit at once" in err and "blocklin inv: interrupted; no output was written" in err


@pytest.mark.parametrize("hook", ["quiet_shutdown", "stop_io_at_exit"])
def test_a_command_waits_for_zarrs_io_thread_at_exit(tmp_path, hook):
    """A command's exit, interrupted (``quiet_shutdown``) or not (``run_command`` registers
    ``stop_io_at_exit``), waits for zarr's I/O thread to end its loop: zarr's own exit handler waits 0.2 s
    and then prints "Thread did not finish cleanly", which one CI run showed after every interrupted
    command's one line. Here the loop is kept busy for 1 s as the process exits."""
    import subprocess
    import sys

    script = (
        "import sys, time, zarr\n"
        "from zarr.core import sync\n"
        "from blocklin import interrupt\n"
        "z = zarr.create_array(store=sys.argv[1], shape=(4,), dtype='f8')\n"
        "z[:] = 1.0\n"  # zarr's loop and I/O thread are running
        f"interrupt.{hook}()\n"
        "sync.loop[0].call_soon_threadsafe(time.sleep, 1.0)\n"
    )
    r = subprocess.run([sys.executable, "-c", script, str(tmp_path / "z.zarr")], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0 and r.stderr == "", r.stderr


@pytest.mark.parametrize("name,rerun,first", [("inv", "--resume", "tmp"), ("solve", "--resume", "tmp"),
                                              ("solve-pos", "", "tmp"), ("inv", "", "."), ("solve", "--resume", ".")])
def test_rerun_with_another_temp_dir_removes_the_first_work_folder(case, references, name, rerun, first, monkeypatch):
    """A run killed mid-factorization with ``--temp-dir T1`` and rerun with ``--temp-dir T2``, with
    ``--resume`` or without, starts its steps over in T2 (the temp dir it is given now) and removes T1's
    work folder, which no rerun can continue any more (it had stayed forever), saying so in one line: the
    result has the bits of an uninterrupted run and nothing is left in T1 or T2. A file of the user's in T1
    stays. The first temp dir may be the output's own folder (the removal then waits for the claim's lock
    on that folder to be given back)."""
    data = case
    monkeypatch.setattr(warnings, "formatwarning", warnings.formatwarning)
    monkeypatch.chdir(data)
    out = f"{name}-moved{rerun}.zarr"
    t1, t2 = data if first == "." else data / first, data / "tmp2"
    t2.mkdir()
    (t1 / "notes.txt").write_text("the user's")
    before = sorted(os.listdir(t1))
    r = interrupt(data, cli_argv(COMMANDS[name], out, str(t1), "--resume"), "SIGKILL", "mid", out)
    assert r.returncode == -signal.SIGKILL
    kept = [f for f in os.listdir(t1) if f.startswith(f"blocklin-{COMMANDS[name][0]}-")]
    assert len(kept) == 1, os.listdir(t1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert main(cli_argv(COMMANDS[name], out, str(t2), *([rerun] if rerun else []))) == 0
    got, ref = load_output(data / out), references[name]
    assert got.keys() == ref.keys()
    for key in ref:
        np.testing.assert_array_equal(got[key], ref[key], err_msg=f"{name} {key}")
    assert sorted(f for f in os.listdir(t1) if f != out) == before and os.listdir(t2) == []
    assert (t1 / "notes.txt").read_text() == "the user's"
    said = [str(w.message) for w in caught if str(t1 / kept[0]) in str(w.message)]
    assert len(said) == 1 and "\n" not in said[0] and "removed" in said[0], [str(w.message) for w in caught]
    assert [f for f in os.listdir(data) if ".partial-" in f] == []


def test_clean_of_a_kept_partial_removes_the_work_folder_it_names(case, monkeypatch, capsys):
    """An interrupted resumable inverse says "remove it with `blocklin clean PARTIAL`": that command now
    removes the partial and the work folder its markers name (under the temp dir that run had), once the run
    is gone; it had removed the partial alone and left the steps in the temp dir."""
    data = case
    monkeypatch.setattr(warnings, "formatwarning", warnings.formatwarning)
    monkeypatch.chdir(data)
    tmp = data / "tmp"
    r = interrupt(data, cli_argv(COMMANDS["inv"], "kept.zarr", str(tmp), "--resume"), "SIGKILL", "mid", "kept.zarr")
    assert r.returncode == -signal.SIGKILL
    (partial,) = [f for f in os.listdir(data) if f.startswith(".kept.zarr.partial-")]
    (work,) = os.listdir(tmp)
    assert main(["clean", str(data / partial)]) == 0
    text = capsys.readouterr().out
    assert f"removed partial output {data / partial}" in text and f"removed work folder {tmp / work}" in text, text
    assert leftovers(data) == []


def test_ctrl_c_after_the_commit_says_the_output_was_written(tmp_path, monkeypatch, capfd):
    """Ctrl-C that lands after the output is committed, while the job removes its work folder: the
    output is complete (the bits of an uninterrupted run), and the one line says so; it had said "no
    output was written" beside a complete output."""
    from blocklin import interrupt
    from blocklin.runtime import job as job_module

    rng = np.random.default_rng(4)
    s = rng.standard_normal((64, 64)) + 64 * np.eye(64)
    a, b = blocklin.from_array(s, tmp_path / "a.zarr", chunks=(16, 16)), blocklin.from_array(
        rng.standard_normal((64, 3)), tmp_path / "b.zarr")
    argv = ["solve", a.path, b.path, "--memory", "1MiB", "--no-progress", "-o"]
    assert main(argv + [str(tmp_path / "ref.zarr")]) == 0
    real = job_module.end_work_folder

    def removed_then_ctrl_c(loc):
        real(loc)
        os.kill(os.getpid(), signal.SIGINT)
        for _ in range(1000):  # the handler runs at the next bytecode of the main thread
            time.sleep(0)

    monkeypatch.setattr(job_module, "end_work_folder", removed_then_ctrl_c)
    capfd.readouterr()
    try:
        assert main(argv + [str(tmp_path / "x.zarr")]) == 130
    finally:
        interrupt.reset()
    err = capfd.readouterr().err.strip()
    assert err == f"blocklin solve: interrupted; {tmp_path / 'x.zarr'} was written (complete)", err
    assert np.array_equal(blocklin.open(tmp_path / "x.zarr").to_numpy(), blocklin.open(tmp_path / "ref.zarr").to_numpy())
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith(".")]
