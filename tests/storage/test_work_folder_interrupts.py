"""An interrupt while a work folder is being made removes it: the folder is created and its owner
record written before the code that removes it on the way out could run, so an interrupt landing
between the two (what a Ctrl-C right after the folder appears does) left it behind. Each place that
makes a work folder of its own (the sparse conversion's sort, the mirrored copy of a symmetric
Matrix Market array, ``blocklin calibrate``) is interrupted there, deterministically: the heartbeat
that follows the record raises ``KeyboardInterrupt``."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.io
import scipy.sparse

import blocklin as bl
from blocklin.storage import ownership


def interrupt_at_hold(monkeypatch, prefix: str) -> list[str]:
    """``KeyboardInterrupt`` when the heartbeat of a work folder named ``prefix...`` would start (its
    record already written); other folders and outputs are held as usual. Returns the folders hit."""
    made, original = [], ownership.Heartbeat.hold.__func__

    def hold(cls, loc, rec):
        if loc.url.rstrip("/").rsplit("/", 1)[-1].startswith(prefix):
            made.append(loc.url)
            raise KeyboardInterrupt
        return original(cls, loc, rec)

    monkeypatch.setattr(ownership.Heartbeat, "hold", classmethod(hold))
    return made


def _left(temp) -> list[str]:
    return sorted(p.name for p in temp.iterdir()) if temp.exists() else []


def _coordinate_file(path):
    scipy.io.mmwrite(str(path), scipy.sparse.random(300, 200, density=0.05, random_state=0, format="coo"))
    return "64MiB"


def _symmetric_array_file(path):
    a = np.random.default_rng(1).standard_normal((1000, 1000))  # 8 MB: mirrored, not held
    scipy.io.mmwrite(str(path), a + a.T, symmetry="symmetric")
    return "5MiB"


@pytest.mark.parametrize("prefix, write", [("blocklin-sort-", _coordinate_file),  # the sparse conversion's sort
                                           ("blocklin-mirror-", _symmetric_array_file)])  # a symmetric array's mirror
def test_conversion_work_folder(tmp_path, monkeypatch, prefix, write):
    hit = interrupt_at_hold(monkeypatch, prefix)
    temp = tmp_path / "tmp"
    monkeypatch.setenv("BLOCKLIN_TEMP_DIR", str(temp))
    src = tmp_path / "s.mtx"
    memory = write(src)
    with pytest.raises(KeyboardInterrupt):
        bl.convert(str(src), str(tmp_path / "o.zarr"), memory=memory)
    assert hit
    assert _left(temp) == [] and not (tmp_path / "o.zarr").exists()


def test_calibrate_folder(tmp_path, monkeypatch):
    from blocklin.cli.main import main

    hit = interrupt_at_hold(monkeypatch, "blocklin-calibrate-")
    temp = tmp_path / "tmp"
    monkeypatch.setenv("BLOCKLIN_TEMP_DIR", str(temp))
    assert main(["calibrate", "--device", "cpu"]) == 130  # the CLI's interrupt exit
    assert hit
    assert _left(temp) == []
