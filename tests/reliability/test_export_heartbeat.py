"""A file export keeps its owner record's heartbeat, as a zarr output does, so a long one stays live.

A file export (``.npy``, CSV, Matrix Market, raw, ``.npz``) writes its partial ``.X.partial-TOKEN`` and
an owner record beside it, but had refreshed no heartbeat: on another host sharing the folder, one that
ran longer than the lease looked gone, and ``blocklin clean`` removed its partial (or a second run of
the same export took it over), so the first run failed at its commit with its work lost. The export
now beats as zarr outputs do (``storage/ownership.Heartbeat``) until its commit or abort.

The exporter here is a real process whose host name says another machine, beating every 0.05 s; this
process judges it with a lease of 0.5 s and waits three leases before asking.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time

import pytest

from blocklin.errors import OutputBusyError
from blocklin.storage import file_records, ownership
from blocklin.storage.cleanup import clean
from blocklin.storage.formats.base import AtomicFile

TOKEN = "0123456789abcdef"
EXPORTER = textwrap.dedent("""
    import os, sys, time
    from blocklin.storage import ownership
    ownership.host = lambda: "node-a.example"  # another machine sharing the folder
    ownership.HEARTBEAT_SECONDS = 0.05
    from blocklin.storage.formats.base import AtomicFile

    out, ready, go = sys.argv[1:]
    target = AtomicFile(out, kind="csv", token="%s")
    with open(target.partial, "w") as f:
        f.write("1,2\\n")
    open(ready, "w").close()
    deadline = time.time() + 60
    while not os.path.exists(go) and time.time() < deadline:  # a long export, still writing
        time.sleep(0.01)
    target.commit()
    print("committed")
""" % TOKEN)


@pytest.fixture
def exporter(tmp_path):
    """A live export of ``X.csv`` by another host's process, held until ``go`` exists."""
    ready, go = tmp_path / "ready", tmp_path / "go"
    proc = subprocess.Popen([sys.executable, "-c", EXPORTER, str(tmp_path / "X.csv"), str(ready), str(go)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 60
    while not ready.exists():
        assert proc.poll() is None, proc.communicate()
        assert time.time() < deadline, "the export never started"
        time.sleep(0.01)
    yield proc, go
    go.touch()
    if proc.poll() is None:
        proc.communicate(timeout=60)


def test_clean_and_a_second_run_take_a_long_export_for_live(tmp_path, monkeypatch, exporter):
    proc, go = exporter
    monkeypatch.setattr(ownership, "LEASE_SECONDS", 0.5)
    time.sleep(1.5)  # three leases: without a heartbeat its record would say it is gone
    partial = tmp_path / f".X.csv.partial-{TOKEN}"
    items = clean([tmp_path])
    assert [i.action for i in items if i.path == str(partial)] == ["kept"], [(i.path, i.action) for i in items]
    with pytest.raises(OutputBusyError, match=r"another run is writing .*X\.csv \(pid \d+ on node-a\.example"):
        AtomicFile(tmp_path / "X.csv", kind="csv", token=TOKEN)
    assert partial.read_text() == "1,2\n"
    owner = file_records.read_owner(partial)
    assert owner["host"] == "node-a.example" and time.time() - owner["heartbeat"] < 0.5, owner
    go.touch()
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0 and out.strip() == "committed", err
    assert (tmp_path / "X.csv").read_text() == "1,2\n"
    assert sorted(p.name for p in tmp_path.iterdir() if "X.csv" in p.name) == [".X.csv.blocklin", "X.csv"]


def test_a_committed_or_aborted_export_stops_beating(tmp_path, monkeypatch):
    """No beat recreates the owner record once the commit (or the abort) dropped it."""
    monkeypatch.setattr(ownership, "HEARTBEAT_SECONDS", 0.0)
    for end in ("commit", "abort"):
        target = AtomicFile(tmp_path / f"{end}.csv", kind="csv")
        target.partial.write_text("1\n")
        ownership.Heartbeat._wake.set()
        getattr(target, end)()
        for _ in range(20):
            ownership.Heartbeat._wake.set()
            time.sleep(0.005)
        assert not [p.name for p in tmp_path.iterdir() if ".partial-" in p.name], end
