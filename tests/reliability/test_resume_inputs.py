"""A resumed run never mixes an input's old values with its new ones, and interrupted work is kept.

For every resumable command of ``tests/reliability/test_signals.py`` (its ``COMMANDS``, run through
``slow_cli.py`` the same way): SIGKILL mid-run, rewrite the input's values in place with zarr (same
shape, chunks and dtype: nothing in the zarr metadata changes), rerun with ``--resume``. The result
must equal, bit for bit, a fresh uninterrupted run on the new input, with a warning that names the
changed input. One case runs ``gemm`` on S3 (moto) after SIGTERM; unit tests check the content stamp
itself (local files, ``memory://``, S3 ETags). Last, Ctrl-C without ``--resume`` keeps the finished
work, says how to continue or remove it, and a ``--resume`` rerun continues it to the fresh result.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import warnings

import numpy as np
import pytest
import zarr

import blocklin
from blocklin.cli.main import main
from blocklin.storage.location import Location
from blocklin.storage.stamps import content_stamp
from support.interrupts import COMMANDS, N, cli_argv, interrupt, leftovers, load_output, takes_resume

RESUMABLE = [name for name, argv in COMMANDS.items() if takes_resume(argv)]


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """The inputs of the commands (as in test_signals), copied afresh for each test."""
    d = tmp_path_factory.mktemp("inputs")
    rng = np.random.default_rng(7)
    a = rng.standard_normal((N, N))
    np.save(d / "A.npy", a)
    blocklin.from_array(a, d / "A.zarr", chunks=(40, 40))
    blocklin.from_array(a @ a.T + N * np.eye(N), d / "S.zarr", chunks=(40, 40))
    blocklin.from_array(rng.standard_normal((N, 8)), d / "B.zarr", chunks=(40, 8))
    return d


#: The streamed item or unit at which each command is killed: about half its run (measured at N = 240),
#: so that finished units (markers, checkpoints, recorded steps) exist that a careless resume would reuse.
KILL_AT = {"gemm": 20, "convert": 5, "svd": 20, "inv": 8, "solve": 2, "solve-pos": 12, "solve-gram": 16,
           "cholesky": 12, "lu": 5, "qr": 5, "gram": 5, "pca": 30, "eigs": 30, "qr-tiles": 30}


@pytest.fixture
def data(base, tmp_path):
    d = tmp_path / "run"
    shutil.copytree(base, d)
    (d / "tmp").mkdir()
    return d


def _rewrite(path, seed: int) -> None:
    """New values in place: the same file or chunk files, shape, chunks and dtype (zarr.json untouched)."""
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((N, N))
    if str(path).endswith(".npy"):
        np.lib.format.open_memmap(path, mode="r+")[...] = a  # the same file, rewritten
        return
    x = a @ a.T + N * np.eye(N) if os.path.basename(str(path)).startswith("S") else a  # S stays positive definite
    zarr.open_array(str(path), mode="r+")[...] = x


def _first_input(argv: list[str]) -> str:
    return next(a for a in argv[1:] if a.endswith((".zarr", ".npy")) and a != "OUT")


def _warnings_of(fn) -> tuple[int, list[str]]:
    saved = warnings.formatwarning
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        try:
            rc = fn()
        finally:
            warnings.formatwarning = saved
    return rc, [str(w.message) for w in seen]


@pytest.mark.parametrize("name", RESUMABLE)
def _finished_units(data) -> list[str]:
    """What the killed run finished: resume markers and checkpoints in its partial, recorded steps and
    tile markers in its work folder."""
    found = []
    for root, _dirs, files in os.walk(data):
        parts = os.path.relpath(root, data).split(os.sep)
        if ".out.zarr.partial-" in parts[0] or parts[0] == "tmp":
            if any(p in (".blocklin-done", "work", "stages") or p.endswith("markers") for p in parts[1:]):
                found += files
    return found


def test_kill_points_leave_finished_units(data, monkeypatch):
    """The kill points of KILL_AT name every resumable command."""
    assert set(KILL_AT) == set(RESUMABLE)


@pytest.mark.parametrize("name", RESUMABLE)
def test_changed_input_is_not_mixed_into_a_resumed_run(data, monkeypatch, name):
    monkeypatch.chdir(data)
    monkeypatch.setenv("BLOCKLIN_TEST_MARK_AFTER", str(KILL_AT[name]))
    tmp, base_argv = str(data / "tmp"), COMMANDS[name]
    src = _first_input(base_argv)
    r = interrupt(data, cli_argv(base_argv, "out.zarr", tmp), "SIGKILL", "mid", "out.zarr")
    assert r.returncode == -signal.SIGKILL, r.stderr
    assert _finished_units(data), leftovers(data)  # work that a resume without the check would reuse
    _rewrite(data / src, seed=99)

    rc, said = _warnings_of(lambda: main(cli_argv(base_argv, "out.zarr", tmp, "--resume")))
    assert rc == 0
    changed = [w for w in said if "changed since the interrupted run" in w]
    assert len(changed) == 1 and f"input {data / src} " in changed[0] and "starting over" in changed[0], said
    assert main(cli_argv(base_argv, "fresh.zarr", tmp)) == 0  # an uninterrupted run on the new input
    got, ref = load_output(data / "out.zarr"), load_output(data / "fresh.zarr")
    assert got.keys() == ref.keys()
    for key in ref:
        np.testing.assert_array_equal(got[key], ref[key], err_msg=f"{name} {key}")
    assert leftovers(data) == []  # the old run's partial and work folder went with the restart


def test_changed_s3_input_after_sigterm(s3_server, tmp_path, monkeypatch):
    """gemm on S3: SIGTERM without --resume keeps the pending output; the input rewritten in place (new
    ETags, same sizes) is detected by the --resume rerun, which equals a fresh run on the new input."""
    import uuid

    import s3fs
    import zarr.storage

    opts = dict(s3_server)
    base = f"s3://blocklin-{uuid.uuid4().hex[:10]}"
    s3fs.S3FileSystem(**opts).mkdir(base[5:])
    n = N // 2  # object-store requests are the cost here
    rng = np.random.default_rng(3)
    blocklin.from_array(rng.standard_normal((n, n)), f"{base}/A.zarr", chunks=(40, 40), storage_options=opts)
    so = [f"--storage-option={k}={v}" for k, v in opts.items()]
    (tmp_path / "tmp").mkdir()
    monkeypatch.chdir(tmp_path)
    argv = ["gemm", f"{base}/A.zarr", f"{base}/A.zarr", "-o", "OUT", "--memory", "256KiB", *so]
    monkeypatch.setenv("BLOCKLIN_TEST_MARK_AFTER", "6")  # of about 12: a tile or two finished
    r = interrupt(tmp_path, cli_argv(argv, f"{base}/C.zarr", str(tmp_path / "tmp")), "SIGTERM", "mid", "C.zarr")
    assert r.returncode == 143 and "--resume" in r.stderr and "blocklin clean" in r.stderr, r.stderr
    assert s3fs.S3FileSystem(**opts).find(f"{base[5:]}/C.zarr/.blocklin-done")  # finished tiles, kept
    new = np.random.default_rng(4).standard_normal((n, n))
    store = zarr.storage.FsspecStore.from_url(f"{base}/A.zarr", storage_options=opts)
    zarr.open_array(store, mode="r+")[...] = new

    rc, said = _warnings_of(lambda: main(cli_argv(argv, f"{base}/C.zarr", str(tmp_path / "tmp"), "--resume")))
    assert rc == 0 and any(f"input {base}/A.zarr changed since the interrupted run" in w for w in said), said
    assert main(cli_argv(argv, f"{base}/F.zarr", str(tmp_path / "tmp"))) == 0
    got, ref = (blocklin.open(f"{base}/{x}.zarr", storage_options=opts).to_numpy() for x in ("C", "F"))
    np.testing.assert_array_equal(got, ref)
    # and it is new @ new: ||C - A A|| <= k eps ||A||^2 (float64 products of k = n terms)
    assert np.linalg.norm(got - new @ new) <= n * np.finfo(float).eps * np.linalg.norm(new) ** 2


def test_ctrl_c_without_resume_keeps_the_work_and_says_how_to_continue(data, monkeypatch, capsys):
    monkeypatch.chdir(data)
    monkeypatch.setenv("BLOCKLIN_TEST_MARK_AFTER", str(KILL_AT["gemm"]))
    tmp, argv = str(data / "tmp"), COMMANDS["gemm"]
    r = interrupt(data, cli_argv(argv, "out.zarr", tmp), "SIGINT", "mid", "out.zarr")
    assert r.returncode == 130
    (line,) = r.stderr.strip().splitlines()
    (partial,) = [f for f in leftovers(data) if f.startswith(".out.zarr.partial-")]
    assert "--resume" in line and f"blocklin clean {data / partial}" in line, line
    assert os.listdir(data / partial / ".blocklin-done")  # finished tiles, kept
    rc, said = _warnings_of(lambda: main(cli_argv(argv, "out.zarr", tmp, "--resume", "--json")))
    assert rc == 0 and not [w for w in said if "starting" in w], said
    assert json.loads(capsys.readouterr().out)["skipped"] > 0  # continued, not started over
    assert main(cli_argv(argv, "fresh.zarr", tmp)) == 0
    np.testing.assert_array_equal(load_output(data / "out.zarr")[""], load_output(data / "fresh.zarr")[""])
    assert leftovers(data) == []


def test_resume_with_nothing_to_resume_says_it_starts_fresh(data, monkeypatch):
    monkeypatch.chdir(data)
    rc, said = _warnings_of(lambda: main(cli_argv(COMMANDS["gemm"], "out.zarr", str(data / "tmp"), "--resume")))
    assert rc == 0 and [w for w in said if "no unfinished run" in w and "starting fresh" in w], said


# -- the content stamp ---------------------------------------------------------------------------------
def _backdate(folder) -> None:
    """Move every file's times an hour back, so that a rewrite now differs by more than a clock tick."""
    for root, _dirs, files in os.walk(folder):
        for f in files:
            p = os.path.join(root, f)
            t = os.stat(p).st_mtime - 3600
            os.utime(p, (t, t))


def test_content_stamp_of_a_local_zarr_folder(tmp_path):
    a = blocklin.from_array(np.arange(64.0).reshape(8, 8), tmp_path / "A.zarr", chunks=(4, 4))
    _backdate(a.path)
    before = content_stamp(a.path)
    assert content_stamp(a.path) == before and content_stamp(Location(str(tmp_path / "A.zarr"))) == before
    blocklin.open(a.path).to_numpy()  # reading changes nothing
    assert content_stamp(a.path) == before
    zarr.open_array(a.path, mode="r+")[0:4, 0:4] = np.ones((4, 4))  # one chunk, same size (no codec)
    assert content_stamp(a.path) != before


def test_content_stamp_of_a_file_and_a_file_spec(tmp_path):
    np.savez(tmp_path / "A.npz", a=np.zeros((4, 4)))
    _backdate(tmp_path)
    before = content_stamp(str(tmp_path / "A.npz"))
    assert content_stamp(f"{tmp_path / 'A.npz'}:a") == before  # the member's file
    np.savez(tmp_path / "A.npz", a=np.ones((4, 4)))  # same size
    assert content_stamp(str(tmp_path / "A.npz")) != before


def test_content_stamp_on_fsspec_memory():
    import uuid

    url = f"memory://stamps-{uuid.uuid4().hex[:8]}/A.zarr"
    blocklin.from_array(np.zeros((8, 8)), url, chunks=(4, 4))
    before = content_stamp(url)
    assert content_stamp(url) == before
    store = zarr.storage.FsspecStore.from_url(url)
    zarr.open_array(store, mode="r+")[4:8, 4:8] = np.ones((4, 4))
    assert content_stamp(url) != before


def test_content_stamp_on_s3_uses_etags(s3_server):
    import uuid

    import s3fs

    opts = dict(s3_server)
    base = f"s3://blocklin-{uuid.uuid4().hex[:10]}"
    s3fs.S3FileSystem(**opts).mkdir(base[5:])
    blocklin.from_array(np.zeros((8, 8)), f"{base}/A.zarr", chunks=(4, 4), storage_options=opts)
    before = content_stamp(f"{base}/A.zarr", opts)
    assert content_stamp(f"{base}/A.zarr", opts) == before
    store = zarr.storage.FsspecStore.from_url(f"{base}/A.zarr", storage_options=opts)
    zarr.open_array(store, mode="r+")[0:4, 0:4] = np.full((4, 4), 2.0)  # same size, new ETag
    assert content_stamp(f"{base}/A.zarr", opts) != before


def test_tall_solve_records_are_not_reused_for_a_changed_input(tmp_path):
    """The tall solve's recorded passes (StepRecords beside the output's markers) go with the restart: a
    solve killed after its Gram pass, its ``a`` rewritten in place, resumes to a fresh run's bits."""
    import subprocess
    import sys
    import textwrap

    from test_resume_interrupted import KILL_SOLVE, NORMAL

    rng = np.random.default_rng(8)
    a = blocklin.from_array(rng.standard_normal((900, 30)) + 3.0, tmp_path / "a.zarr", chunks=(128, 30))
    b = blocklin.from_array(rng.standard_normal((900, 2)), tmp_path / "b.zarr")
    kw = {"lam": 1e-3, "refine": 1, "memory": "2MiB", "scheduler": "sync"}
    code = textwrap.dedent(KILL_SOLVE.format(module=NORMAL, victim="_run_residual_pass", sig="KILL", lam=1e-3,
                                             extra=""))
    out = tmp_path / "x.zarr"
    assert subprocess.run([sys.executable, "-c", code, a.path, b.path, str(out)]).returncode == -signal.SIGKILL
    new = rng.standard_normal((900, 30)) + 3.0
    zarr.open_array(a.path, mode="r+")[...] = new
    with pytest.warns(UserWarning, match=f"input {a.path} changed since the interrupted run"):
        x = blocklin.solve(a.path, b.path, out=out, resume=True, **kw)
    assert x.report["resumed_passes"] == []  # the old Gram pass was not reused
    ref = blocklin.solve(a.path, b.path, out=tmp_path / "ref.zarr", **kw)
    np.testing.assert_array_equal(x.to_numpy(), ref.to_numpy())


def test_changed_complex_input_is_not_mixed_into_a_resumed_stored_gram_solve(tmp_path, monkeypatch):
    """The complex stored-Gram route (``A^H A + lam^2 I`` stored and factored ``L L^H`` out of core) takes
    the same stages and stamps as the real one: killed mid-run, its complex ``A`` rewritten in place,
    ``--resume`` restarts and gives a fresh run's bits on the new input."""
    rng = np.random.default_rng(11)

    def crandn(shape):
        return rng.standard_normal(shape) + 1j * rng.standard_normal(shape)

    blocklin.from_array(crandn((N, N)), tmp_path / "A.zarr", chunks=(40, 40))
    blocklin.from_array(crandn((N, 8)), tmp_path / "B.zarr", chunks=(40, 8))
    (tmp_path / "tmp").mkdir()
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("BLOCKLIN_TEST_MARK_AFTER", str(KILL_AT["solve-gram"]))
    tmp, argv = str(tmp_path / "tmp"), COMMANDS["solve-gram"]
    r = interrupt(tmp_path, cli_argv(argv, "out.zarr", tmp), "SIGKILL", "mid", "out.zarr")
    assert r.returncode == -signal.SIGKILL, r.stderr
    assert _finished_units(tmp_path), leftovers(tmp_path)
    zarr.open_array(str(tmp_path / "A.zarr"), mode="r+")[...] = crandn((N, N))

    rc, said = _warnings_of(lambda: main(cli_argv(argv, "out.zarr", tmp, "--resume", "--json")))
    assert rc == 0
    changed = [w for w in said if "changed since the interrupted run" in w]
    assert len(changed) == 1 and f"input {tmp_path / 'A.zarr'} " in changed[0], said
    assert main(cli_argv(argv, "fresh.zarr", tmp)) == 0
    got, ref = load_output(tmp_path / "out.zarr"), load_output(tmp_path / "fresh.zarr")
    assert got.keys() == ref.keys() and np.iscomplexobj(ref[""])
    for key in ref:
        np.testing.assert_array_equal(got[key], ref[key], err_msg=key)
    assert leftovers(tmp_path) == []


def test_integer_input_resumes_and_is_checked(data, monkeypatch):
    """Integer data is read through a staged float64 copy, new each run; the resume is named and checked by
    the stored array: a killed ``svd`` of an int32 matrix continues (its partial was removed as another
    run's and the work done again), and after the matrix is rewritten in place it starts over, giving a
    fresh run's bits."""
    monkeypatch.chdir(data)
    monkeypatch.setenv("BLOCKLIN_TEST_MARK_AFTER", str(KILL_AT["svd"]))
    rng = np.random.default_rng(5)
    blocklin.from_array(rng.integers(-99, 99, (N, N)).astype(np.int32), data / "I.zarr", chunks=(40, 40))
    tmp, base_argv = str(data / "tmp"), ["svd", "I.zarr", "-k", "4", "-o", "OUT", "--memory", "1MiB", "--seed", "1"]
    for rewrite in (False, True):
        r = interrupt(data, cli_argv(base_argv, "out.zarr", tmp), "SIGKILL", "mid", "out.zarr")
        assert r.returncode == -signal.SIGKILL, r.stderr
        if rewrite:
            zarr.open_array(str(data / "I.zarr"), mode="r+")[...] = rng.integers(-99, 99, (N, N)).astype(np.int32)
        rc, said = _warnings_of(lambda: main(cli_argv(base_argv, "out.zarr", tmp, "--resume")))
        assert rc == 0 and not [w for w in said if "removed the partial output" in w], said
        changed = [w for w in said if "changed since the interrupted run" in w]
        assert len(changed) == int(rewrite) and all(f"input {data / 'I.zarr'} " in w for w in changed), said
        assert main(cli_argv(base_argv, "fresh.zarr", tmp, "--overwrite")) == 0
        got, ref = load_output(data / "out.zarr"), load_output(data / "fresh.zarr")
        for key in ref:
            np.testing.assert_array_equal(got[key], ref[key], err_msg=key)
        shutil.rmtree(data / "out.zarr")
