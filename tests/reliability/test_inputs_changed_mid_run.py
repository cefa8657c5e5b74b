"""An input rewritten while a run reads it: the run commits nothing, never a mix of old and new values.

Another program writes new chunks into ``A.zarr`` (zarr, same shape, chunks and dtype: its metadata
unchanged) while ``blocklin gemm A A`` is half way through its tiles: the product had been committed
with exit 0, each tile computed from whichever values it read (measured: max |C - A0 A0| / max |A0 A0|
= 1.30 and max |C - A1 A1| / max |A1 A1| = 1.35, a product of neither). Every output stamps its
stored inputs at the claim and its commit compares them again (``storage/input_guard``): the run is
refused, naming the input, and leaves nothing; a rerun with ``--resume`` then starts over and equals a
fresh run on the new values, bit for bit. Rows appended by ``blocklin.append`` during a run are the
one change it may meet (the result covers the rows it opened). The same check guards file exports.
The stamps are taken when the run first opens an input, before reads made ahead of the output's
claim (an integer input's float64 copy, a text file's shape scan).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time

import numpy as np
import pytest
import zarr

import blocklin
from blocklin.cli.main import main
from blocklin.errors import BlocklinWarning, InputChangedError
from blocklin.storage.atomic import AtomicOutput
from blocklin.storage.formats.zarrfmt import ZarrReader
from support.interrupts import SUPPORT, cli_argv, leftovers

N = 240
GEMM = ["gemm", "A.zarr", "A.zarr", "-o", "OUT", "--memory", "256KiB"]


@pytest.fixture
def data(tmp_path):
    d = tmp_path / "run"
    (d / "tmp").mkdir(parents=True)
    blocklin.from_array(np.random.default_rng(7).standard_normal((N, N)), d / "A.zarr", chunks=(40, 40))
    return d


def _rewrite(path) -> np.ndarray:
    """New values in place, as another program writes them (zarr.json untouched)."""
    new = np.random.default_rng(8).standard_normal((N, N))
    zarr.open_array(str(path), mode="r+")[...] = new
    return new


def _gemm_rewritten_mid_run(data, *extra: str) -> subprocess.CompletedProcess:
    """``blocklin gemm A A`` through ``slow_cli.py``, ``A`` rewritten once 10 of its 36 tiles have started."""
    mark = data / "C.mark"
    env = {**os.environ, "BLOCKLIN_TEST_DELAY": "0.02", "BLOCKLIN_TEST_MARK": str(mark),
           "BLOCKLIN_TEST_MARK_AFTER": "10"}
    argv = cli_argv(GEMM, "C.zarr", "tmp", *extra)
    proc = subprocess.Popen([sys.executable, str(SUPPORT / "slow_cli.py"), *argv], cwd=data, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 60
    while not mark.exists():
        assert proc.poll() is None, f"finished before the rewrite: {proc.communicate()}"
        assert time.time() < deadline, "the run never reached its 10th tile"
        time.sleep(0.002)
    _rewrite(data / "A.zarr")
    out, err = proc.communicate(timeout=120)
    mark.unlink()
    return subprocess.CompletedProcess(argv, proc.returncode, out, err)


@pytest.mark.parametrize("resume", [False, True], ids=["plain", "resume"])
def test_gemm_whose_input_is_rewritten_mid_run_commits_nothing(data, tmp_path, monkeypatch, resume):
    extra = ("--resume",) if resume else ()
    run = _gemm_rewritten_mid_run(data, *extra)
    assert run.returncode == 1, run
    assert "InputChangedError" in run.stderr and f"input {data / 'A.zarr'} changed during the run" in run.stderr
    errors = [line for line in run.stderr.splitlines() if not line.startswith("blocklin: warning: resume:")]
    assert len(errors) == 1 and "nothing was written" in errors[0]
    assert not (data / "C.zarr").exists()
    kept = leftovers(data)
    if not resume:
        assert kept == []
        return
    assert kept and all(".C.zarr.partial-" in k or k.startswith("tmp/blocklin-") for k in kept)
    # the kept work is of the old values: the rerun starts over, and equals a fresh run on the new ones
    monkeypatch.chdir(data)
    with pytest.warns(BlocklinWarning, match="A.zarr changed since the interrupted run .*starting over"):
        assert main(cli_argv(GEMM, "C.zarr", "tmp", "--resume")) == 0
    fresh = tmp_path / "fresh"
    shutil.copytree(data / "A.zarr", fresh / "A.zarr")
    (fresh / "tmp").mkdir()
    monkeypatch.chdir(fresh)
    assert main(cli_argv(GEMM, "C.zarr", "tmp")) == 0
    np.testing.assert_array_equal(zarr.open_array(str(data / "C.zarr"))[...],
                                  zarr.open_array(str(fresh / "C.zarr"))[...])
    assert leftovers(data) == []


@pytest.mark.parametrize("out", ["X.npy", "X.csv", "X.zarr"])
def test_export_whose_input_is_rewritten_mid_run_commits_nothing(data, monkeypatch, out):
    real, seen = ZarrReader.read, []

    def read_then_rewrite(self, rows, cols):
        block = real(self, rows, cols)
        if not seen:  # another program rewrites the input after the first block was read
            seen.append(_rewrite(data / "A.zarr"))
        return block

    monkeypatch.setattr(ZarrReader, "read", read_then_rewrite)
    with pytest.raises(InputChangedError, match=r"inputs: must keep their values .* changed during the run"):
        blocklin.convert(data / "A.zarr", data / out, memory="4MiB", chunks=(40, 40))
    assert seen and sorted(os.listdir(data)) == ["A.zarr", "tmp"]


def _output_of(data, token=None, **kw) -> AtomicOutput:
    ao = AtomicOutput(data / "C.zarr", inputs=[str(data / "A.zarr")], token=token, temp_dir=data / "tmp", **kw)
    zarr.create_array(str(ao.array_path()), shape=(2, 2), dtype="f8", chunks=(2, 2))[...] = 1.0
    return ao


@pytest.mark.parametrize("token", [None, "t0"], ids=["plain", "resumable"])
def test_commit_refuses_a_rewritten_input_and_takes_appended_rows(data, token):
    ao = _output_of(data, token)
    blocklin.open(data / "A.zarr").to_numpy()  # reading an input changes nothing of its stamp
    blocklin.append(data / "A.zarr", np.ones((3, N)))  # the run covers the rows it opened
    ao.commit("test")
    assert zarr.open_array(str(data / "C.zarr"))[0, 0] == 1.0

    with pytest.raises(InputChangedError, match="A.zarr changed during"), _output_of(data, token, overwrite=True) as ao:
        zarr.open_array(str(data / "A.zarr"), mode="r+")[0, 0] = 5.0  # one chunk of the rows it read
        ao.commit("test")
    assert zarr.open_array(str(data / "C.zarr")).attrs["blocklin"]["operation"] == "test"  # the old output stays
    assert sorted(os.listdir(data)) == ["A.zarr", "C.zarr", "tmp"], os.listdir(data)


def test_commit_refuses_an_input_another_run_replaced(data):
    """Another run's ``--overwrite`` of A.zarr swaps the folder this run reads (with zeros: no chunk files)."""
    with pytest.raises(InputChangedError, match=r"A.zarr changed during the run \(37 files differ, 37 then, 1 now\)"), \
            _output_of(data, "t0") as ao:
        blocklin.from_array(np.zeros((N, N)), data / "A.zarr", chunks=(40, 40), overwrite=True)
        ao.commit("test")
    assert sorted(os.listdir(data)) == ["A.zarr", "tmp"]


# -- reads made before the output is claimed: the stamps of the run's first open, not of the claim -----

def test_an_integer_input_rewritten_while_it_is_cast_commits_nothing(data, monkeypatch):
    """``lu`` of an integer ``A`` reads it whole into a float64 copy before it claims its output: the
    claim's stamps had been taken after that read, so a rewrite during the copy committed the LU of a
    copy of both versions."""
    import blocklin.operands as operands

    a = data / "I.zarr"
    blocklin.from_array(np.random.default_rng(3).integers(-9, 9, (N, N)), a, chunks=(40, 40))
    real, reads = operands.open_zarr, []

    class RewrittenAfterItsFirstRead:
        def __init__(self, arr):
            self._arr = arr

        def __getattr__(self, name):
            return getattr(self._arr, name)

        def __getitem__(self, key):
            block = self._arr[key]
            reads.append(key)
            if len(reads) == 1:
                zarr.open_array(str(a), mode="r+")[...] = np.random.default_rng(8).integers(-9, 9, (N, N))
            return block

    monkeypatch.setattr(operands, "open_zarr", lambda *args, **kw: RewrittenAfterItsFirstRead(real(*args, **kw)))
    with pytest.raises(InputChangedError, match=r"I\.zarr changed during the run .*nothing was written"):
        blocklin.lu(a, data / "LU.zarr", memory="512KiB", scheduler="sync")
    assert len(reads) > 1 and sorted(os.listdir(data)) == ["A.zarr", "I.zarr", "tmp"]


def test_a_text_file_rewritten_after_its_shape_scan_is_refused(tmp_path, monkeypatch):
    """``convert A.csv X.npy`` scans the file for its shape when it opens it, before the export claims
    its output: a rewrite in between (12 rows where the scan counted 6) had been exported as the new
    file's first 6 rows, with exit 0."""
    import blocklin.storage.convert as convert

    tmp_path = tmp_path / "run"
    tmp_path.mkdir()
    np.savetxt(tmp_path / "A.csv", np.arange(12.0).reshape(6, 2), delimiter=",")
    real = convert.open_reader

    def opened_then_rewritten(*args, **kw):
        reader = real(*args, **kw)
        np.savetxt(tmp_path / "A.csv", -np.arange(24.0).reshape(12, 2), delimiter=",")  # another program
        return reader

    monkeypatch.setattr(convert, "open_reader", opened_then_rewritten)
    with pytest.raises(InputChangedError, match=r"A\.csv changed during the run \(its file differs\)"):
        blocklin.convert(tmp_path / "A.csv", tmp_path / "X.npy")
    assert sorted(os.listdir(tmp_path)) == ["A.csv"]
