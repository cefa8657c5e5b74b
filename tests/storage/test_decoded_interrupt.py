"""Ctrl-C and SIGKILL while compressed chunks are decoded on the pool (rawchunks.DecodedChunks) leave
nothing behind but what --resume continues, and the rerun gives the uninterrupted run's bits."""

from __future__ import annotations

import os
import signal

import numpy as np
import pytest
import zarr

from blocklin.cli.main import main
from support.interrupts import cli_argv, interrupt, leftovers, load_output

N = 240
#: gemm reads k-panels that span several 40 x 40 zstd chunks (decoded on the pool); gram's tiles read
#: them one at a time (decoded on the loader thread).
COMMANDS = {
    "gemm": ["gemm", "Z.zarr", "Z.zarr", "-o", "OUT", "--memory", "256KiB"],
    "gram": ["gram", "Z.zarr", "-o", "OUT", "--memory", "256KiB"],
}


@pytest.fixture(scope="module")
def zdata(tmp_path_factory):
    d = tmp_path_factory.mktemp("decoded-signals")
    a = np.random.default_rng(8).standard_normal((N, N))
    z = zarr.create_array(str(d / "Z.zarr"), shape=a.shape, chunks=(40, 40), dtype="float64",
                          compressors=zarr.codecs.ZstdCodec(), zarr_format=3)
    z[...] = a
    (d / "tmp").mkdir()
    cwd = os.getcwd()
    os.chdir(d)
    try:
        for name, base in COMMANDS.items():
            assert main(cli_argv(base, f"ref-{name}.zarr", str(d / "tmp"))) == 0
    finally:
        os.chdir(cwd)
    return d


@pytest.mark.parametrize("sig", ["SIGINT", "SIGKILL"])
@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_interrupted_pooled_reads_leave_nothing_behind(zdata, name, sig, monkeypatch):
    out = f"{name}-{sig}.zarr"
    tmp = str(zdata / "tmp")
    monkeypatch.chdir(zdata)
    r = interrupt(zdata, cli_argv(COMMANDS[name], out, tmp, "--resume"), sig, "mid", out)
    assert not (zdata / out).exists()
    if sig == "SIGKILL":
        assert r.returncode == -signal.SIGKILL
    else:
        assert r.returncode == 130, r.stderr
        # only the resumable partial output may be kept, and the message says how to continue or remove it
        kept = [f for f in leftovers(zdata) if f.startswith(f".{out}.partial-")]
        assert [f for f in leftovers(zdata) if f not in kept] == [], r.stderr
        assert not kept or "--resume" in r.stderr and "blocklin clean" in r.stderr
    assert main(cli_argv(COMMANDS[name], out, tmp, "--resume")) == 0
    got, ref = load_output(zdata / out), load_output(zdata / f"ref-{name}.zarr")
    assert got.keys() == ref.keys()
    for key in ref:
        np.testing.assert_array_equal(got[key], ref[key], err_msg=f"{name} {key}")
    assert leftovers(zdata) == []
