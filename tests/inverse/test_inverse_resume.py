"""``inv(..., resume=True)`` and ``blocklin inv --resume`` after SIGKILL and Ctrl-C (SIGINT).

A child process inverts a stored matrix (out of core: recursion, two leaves, one Newton-Schulz step)
and signals itself right after the first chunk write of its K-th step, that is in the middle of a
step whose output is partly written. The rerun with ``resume`` must skip the finished steps and give the same bits as an
uninterrupted run; the work folder and the partial output are gone afterwards.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import blocklin as bl

CHILD = textwrap.dedent("""
    import json, os, signal, sys
    a_path, out, tmp, sig, kill_in, how, resume, method = sys.argv[1:9]
    kill_in = int(kill_in)
    sig, _, times = sig.partition("*")  # SIGINT*2: the signal again after the step's next chunk write
    times, sent = int(times or 1), [0]
    import blocklin as bl
    import blocklin.linalg.factor.lu_panels as lu_panels
    import blocklin.linalg.inverse.kernels as kernels
    import blocklin.runtime.blockops as blockops
    import blocklin.runtime.passes as passes
    import blocklin.runtime.tiles as tiles
    from blocklin.runtime.stages import Stages

    step = [0]
    real_run = Stages.run

    def counting_run(self, name, fn):
        step[0] += 1
        return real_run(self, name, fn)

    def signalling(real):
        def write_block(*args, **kwargs):
            real(*args, **kwargs)
            if step[0] == kill_in and sent[0] < times:  # after the first chunk write(s) of step kill_in
                sent[0] += 1
                os.kill(os.getpid(), getattr(signal, sig))
        return write_block

    Stages.run = counting_run
    for module in (kernels, lu_panels, blockops, passes, tiles):
        module.write_block = signalling(module.write_block)
    options = dict(memory="256KiB", refine=1, temp_dir=tmp, scheduler="sync", method=method)
    if how == "cli":
        from blocklin.cli.main import main
        sys.exit(main(["inv", a_path, "-o", out, "--refine", "1", "--memory", "256KiB", "--scheduler", "sync",
                       "--temp-dir", tmp, "--json", "--method", method] + (["--resume"] if resume == "1" else [])))
    x = bl.inv(a_path, out=out, resume=resume == "1", **options)
    print(json.dumps({"steps_run": step[0], "resumed": x.report["resumed"], "skipped": x.report["stages_skipped"],
                      "steps": x.report["refine_steps"], "leaves": x.report["leaves"]}))
""")


def child(*args: str, method: str = "schur") -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", CHILD, *map(str, args), method], capture_output=True, text=True,
                          timeout=300)


@pytest.fixture(scope="module")
def problem(tmp_path_factory):
    """A stored 200 x 200 matrix and its uninterrupted inverse (same settings)."""
    d = tmp_path_factory.mktemp("resume")
    rng = np.random.default_rng(5)
    a = bl.from_array(rng.standard_normal((200, 200)), d / "a.zarr", chunks=(64, 64))
    tmp = d / "tmp"
    tmp.mkdir()
    done = child(a.path, d / "ref.zarr", tmp, "SIGKILL", -1, "api", 0)
    assert done.returncode == 0, done.stderr
    info = json.loads(done.stdout.strip().splitlines()[-1])
    assert info["leaves"] >= 2 and info["steps"] == 1  # recursion and one Newton-Schulz step
    assert os.listdir(tmp) == []  # the work folder is removed with a finished job
    assert info["steps_run"] == 17  # the step numbers below refer to this sequence
    return d, a, bl.open(d / "ref.zarr").to_numpy()


# Steps of this inversion: 1 staging pass, 2 leaf, 3-5 E, F, S = D - C E, 6 leaf (S^-1), 7-9 X12, X21,
# X11 = A^-1 - X12 F, 10 undo the butterfly, 11-12 probe products and probe, 13 R = I - A X,
# 14 X + X R, 15-16 probe products and probe, 17 copy.
@pytest.mark.parametrize(("sig", "kill_in", "how"), [
    ("SIGKILL", 5, "api"),   # the Schur complement update
    ("SIGINT", 9, "api"),    # Ctrl-C in X11 = A^-1 - X12 F
    ("SIGKILL", 14, "cli"),  # the Newton-Schulz step, resumed from the command line
    ("SIGINT", 17, "cli"),   # the final copy
])
def test_resume_gives_the_same_bits(problem, tmp_path, sig, kill_in, how):
    d, a, ref = problem
    out, tmp = tmp_path / "x.zarr", tmp_path / "tmp"
    tmp.mkdir()
    killed = child(a.path, out, tmp, sig, kill_in, how, 1)
    if sig == "SIGKILL":
        assert killed.returncode == -signal.SIGKILL, killed.stderr
    else:  # Ctrl-C: KeyboardInterrupt (the command line reports it and exits with its code)
        assert killed.returncode != 0 and "nterrupt" in killed.stderr, killed.stderr
    assert not out.exists()
    assert any(p.name.startswith(".x.zarr.partial-") for p in tmp_path.iterdir())
    assert len(os.listdir(tmp)) == 1  # the work folder kept for the rerun
    again = child(a.path, out, tmp, sig, -1, how, 1)
    assert again.returncode == 0, again.stderr
    info = json.loads(again.stdout.strip().splitlines()[-1])
    if how == "cli":
        info["skipped"] = info["stages_skipped"]
    assert info["resumed"] and info["skipped"] == kill_in - 1
    got = bl.open(out)
    assert got.dtype == np.float64
    np.testing.assert_array_equal(got.to_numpy(), ref)  # bit for bit
    assert os.listdir(tmp) == []
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_without_resume_an_interrupted_run_starts_over(problem, tmp_path):
    d, a, ref = problem
    out, tmp = tmp_path / "x.zarr", tmp_path / "tmp"
    tmp.mkdir()
    assert child(a.path, out, tmp, "SIGKILL", 6, "api", 0).returncode == -signal.SIGKILL
    again = child(a.path, out, tmp, "SIGKILL", -1, "api", 0)
    assert again.returncode == 0, again.stderr
    info = json.loads(again.stdout.strip().splitlines()[-1])
    assert not info["resumed"] and info["skipped"] == 0
    np.testing.assert_array_equal(bl.open(out).to_numpy(), ref)
    assert os.listdir(tmp) == []


def test_ctrl_c_without_resume_keeps_the_work_for_resume(problem, tmp_path):
    """Ctrl-C of a run started without resume keeps its partial output and work folder, and says how
    to continue (resume=True) or remove them (blocklin clean); the resumed run skips the finished
    steps and gives the uninterrupted run's bits. Nothing may land in either after the interrupt."""
    d, a, ref = problem
    out, tmp = tmp_path / "x.zarr", tmp_path / "tmp"
    tmp.mkdir()
    killed = child(a.path, out, tmp, "SIGINT", 6, "api", 0)
    assert killed.returncode != 0 and "KeyboardInterrupt" in killed.stderr
    assert "resume=True" in killed.stderr and "blocklin clean" in killed.stderr, killed.stderr
    (partial,) = [p for p in tmp_path.iterdir() if p.name.startswith(".x.zarr.partial-")]
    (work,) = os.listdir(tmp)
    assert str(partial) in killed.stderr and work in killed.stderr
    again = child(a.path, out, tmp, "SIGINT", -1, "api", 1)
    assert again.returncode == 0, again.stderr
    info = json.loads(again.stdout.strip().splitlines()[-1])
    assert info["resumed"] and info["skipped"] == 5
    np.testing.assert_array_equal(bl.open(out).to_numpy(), ref)  # bit for bit
    assert os.listdir(tmp) == [] and [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


@pytest.mark.slow  # timing decides where the second Ctrl-C lands; test_signals checks the handler itself
def test_ctrl_c_pressed_twice_still_keeps_the_work_and_says_so(problem, tmp_path):
    """A second Ctrl-C while the command stops (the leaf's next chunk write sends it) is absorbed: the
    partial output and the work folder are kept and named in the one line, and --resume continues
    them to the uninterrupted run's bits."""
    d, a, ref = problem
    out, tmp = tmp_path / "x.zarr", tmp_path / "tmp"
    tmp.mkdir()
    killed = child(a.path, out, tmp, "SIGINT*2", 6, "cli", 0)
    assert killed.returncode == 130, killed.stderr
    (partial,) = [p for p in tmp_path.iterdir() if p.name.startswith(".x.zarr.partial-")]
    (work,) = os.listdir(tmp)
    line = [ln for ln in killed.stderr.splitlines() if ln.startswith("blocklin inv: interrupted")]
    assert line and str(partial) in line[0] and work in line[0] and "--resume" in line[0], killed.stderr
    again = child(a.path, out, tmp, "SIGINT", -1, "cli", 1)
    assert again.returncode == 0, again.stderr
    info = json.loads(again.stdout.strip().splitlines()[-1])
    assert info["resumed"] and info["stages_skipped"] == 5
    np.testing.assert_array_equal(bl.open(out).to_numpy(), ref)  # bit for bit
    assert os.listdir(tmp) == [] and [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_resume_needs_an_output():
    with pytest.raises(ValueError, match="resume.*out="):
        bl.inv(np.eye(3), resume=True)


def test_a_killed_runs_work_folder_waits_for_resume_and_clean_removes_it(problem, tmp_path):
    """The work folder of a killed ``resume=True`` run survives other jobs' automatic sweep (it is
    the rerun's), and ``blocklin clean`` removes it, saying that --resume would continue it."""
    from blocklin.storage import clean
    from blocklin.storage.cleanup import sweep_stale
    from blocklin.storage.location import as_location

    d, a, ref = problem
    out, tmp = tmp_path / "x.zarr", tmp_path / "tmp"
    tmp.mkdir()
    assert child(a.path, out, tmp, "SIGKILL", 5, "api", 1).returncode == -signal.SIGKILL
    (work,) = os.listdir(tmp)
    assert sweep_stale(as_location(str(tmp))) == []  # what a new job does first in its temp dir
    assert os.listdir(tmp) == [work]
    (seen,) = clean([tmp], dry_run=True)
    assert seen.action == "would remove" and "--resume" in seen.reason
    (gone,) = clean([tmp])
    assert gone.action == "removed" and os.listdir(tmp) == []
    again = child(a.path, out, tmp, "SIGKILL", -1, "api", 1)  # nothing left to continue: starts over
    assert again.returncode == 0, again.stderr
    assert not json.loads(again.stdout.strip().splitlines()[-1])["resumed"]
    np.testing.assert_array_equal(bl.open(out).to_numpy(), ref)


@pytest.fixture(scope="module")
def problem_lu(problem, tmp_path_factory):
    """The same matrix inverted by method "lu" (panels, then row strips), uninterrupted."""
    d, a, _ = problem
    tmp = d / "tmp-lu"
    tmp.mkdir()
    done = child(a.path, d / "ref-lu.zarr", tmp, "SIGKILL", -1, "api", 0, method="lu")
    assert done.returncode == 0, done.stderr
    info = json.loads(done.stdout.strip().splitlines()[-1])
    assert info["leaves"] == 0 and info["steps"] == 1 and os.listdir(tmp) == []
    # steps: the row strips (one each), the probe, R = I - A X, X + X R, probe products and probe, copy
    assert info["steps_run"] >= 8
    return d, a, bl.open(d / "ref-lu.zarr").to_numpy(), info["steps_run"]


# kill_in 0: during the LU panels (before the first recorded step: the panels keep their own markers);
# 1: the first strip of rows of the inverse; -3 from the end: the Newton-Schulz step
@pytest.mark.parametrize(("sig", "kill_in", "how"), [("SIGKILL", 0, "api"), ("SIGINT", 1, "api"),
                                                      ("SIGKILL", 2, "cli"), ("SIGKILL", -4, "api")])
def test_lu_route_resume_gives_the_same_bits(problem_lu, tmp_path, sig, kill_in, how):
    d, a, ref, total = problem_lu
    kill_in = kill_in if kill_in >= 0 else total + kill_in + 1
    out, tmp = tmp_path / "x.zarr", tmp_path / "tmp"
    tmp.mkdir()
    killed = child(a.path, out, tmp, sig, kill_in, how, 1, method="lu")
    if sig == "SIGKILL":
        assert killed.returncode == -signal.SIGKILL, killed.stderr
    else:
        assert killed.returncode != 0 and "nterrupt" in killed.stderr, killed.stderr
    assert not out.exists() and len(os.listdir(tmp)) == 1
    again = child(a.path, out, tmp, sig, -1, how, 1, method="lu")
    assert again.returncode == 0, again.stderr
    info = json.loads(again.stdout.strip().splitlines()[-1])
    if how == "cli":
        info["skipped"] = info["stages_skipped"]
    assert info["resumed"] and info["skipped"] == max(0, kill_in - 1)
    np.testing.assert_array_equal(bl.open(out).to_numpy(), ref)  # bit for bit
    assert os.listdir(tmp) == []
