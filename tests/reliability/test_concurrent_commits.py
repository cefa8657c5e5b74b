"""A commit publishes only the partial its run still owns, and no other run's claim removes it meanwhile.

Two gaps of the local commit, beside the live-owner refusal of ``tests/storage/test_writers.py``:

* a partial taken over during the run (a run on another host sharing the folder found this run's
  heartbeat older than the lease, as a process stopped that long leaves it, and continued the
  partial with ``--resume``) was still committed by the first run when it went on: it renamed the
  other run's half-written partial into place as the output, and an error had removed it;
* the commit deleted the partial's owner record before renaming it, outside the claim lock: a run
  claiming the same output in that window found a partial without a record, took its run for gone
  and removed it, and the commit failed with the finished result lost;
* a file export's commit renamed whatever file lay at its partial's name into place, the partial of
  a run that had taken it over included (a run on another host that took it for gone: file exports
  kept no heartbeat then, ``test_export_heartbeat.py``, and a process stopped past the lease still
  looks gone).
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import numpy as np
import pytest
import zarr

from blocklin.errors import OutputBusyError
from blocklin.storage import atomic, file_records, ownership
from blocklin.storage.atomic import AtomicOutput
from blocklin.storage.formats.base import AtomicFile


def _output(tmp_path, **kw) -> AtomicOutput:
    ao = AtomicOutput(tmp_path / "C.zarr", temp_dir=tmp_path / "tmp", **kw)
    zarr.create_array(str(ao.array_path()), shape=(2, 2), dtype="f8", chunks=(2, 2))[...] = 1.0
    return ao


def _taken_over(ao: AtomicOutput) -> dict:
    """The owner record a run on another host writes when it continues ``ao``'s partial."""
    other = {**ownership.new_record(output=ao.path.url, token=ao.token, resumable=True),
             "host": "node3", "pid": 4711, "run": "other-run"}
    ownership.write_record(ao.partial, other)
    return other


def test_a_partial_taken_over_during_the_run_is_neither_published_nor_removed(tmp_path):
    with pytest.raises(OutputBusyError, match=r"taken over during this run by pid 4711 on node3"), \
            _output(tmp_path, token="t0") as ao:
        _taken_over(ao)
        ao.commit("test")
    assert not (tmp_path / "C.zarr").exists()
    assert ownership.read_record(ao.partial)["run"] == "other-run"  # the other run's partial, left whole
    assert zarr.open_array(str(ao.partial.url))[0, 0] == 1.0


def test_no_claim_removes_a_partial_while_it_is_committed(tmp_path, monkeypatch):
    """A run claiming the output (``overwrite=True``) while the commit is between the removal of the
    owner record and the rename: it waits for the claim lock, and then replaces the committed output."""
    ao = _output(tmp_path)
    rival: dict = {}

    def claim():
        try:
            rival["ao"] = AtomicOutput(tmp_path / "C.zarr", temp_dir=tmp_path / "tmp", overwrite=True)
        except Exception as exc:  # noqa: BLE001 - reported below
            rival["error"] = exc

    real_swap = atomic.swap_in

    def swap_with_a_rival(partial, final):
        t = threading.Thread(target=claim)
        t.start()
        t.join(1.0)  # before the fix the rival's claim removed the record-less partial meanwhile
        rival["thread"] = t
        return real_swap(partial, final)

    monkeypatch.setattr(atomic, "swap_in", swap_with_a_rival)
    ao.commit("test")
    rival["thread"].join(30)
    assert "error" not in rival, rival.get("error")
    np.testing.assert_array_equal(zarr.open_array(str(tmp_path / "C.zarr"))[...], np.ones((2, 2)))
    rival["ao"].abort()
    assert [f for f in os.listdir(tmp_path) if ".partial-" in f or ".old-" in f] == []


def test_a_file_export_taken_over_during_the_run_is_neither_published_nor_removed(tmp_path):
    """A run on another host took the export for gone (its heartbeat older than the lease) and replaced
    its partial with its own, which the first run's commit then renamed into place as the output."""
    target = AtomicFile(tmp_path / "X.csv", kind="csv")
    target.partial.write_text("1,2\n")
    target.partial.rename(tmp_path / "taken")  # the other run removes the partial and writes its own
    (tmp_path / "X.half").write_text("3,")
    (tmp_path / "X.half").rename(target.partial)
    other = {**ownership.new_record(operation="export", for_output=str(target.path)), "host": "node3", "pid": 4711}
    Path(str(target.partial) + file_records.OWNER_SUFFIX).write_text(json.dumps(other))
    with pytest.raises(OutputBusyError, match=r"taken over during this run by pid 4711 on node3"):
        target.commit()
    target.abort()
    assert not (tmp_path / "X.csv").exists()
    assert target.partial.read_text() == "3," and file_records.read_owner(target.partial)["run"] == other["run"]
