"""Peak memory of a sparse conversion (external sort) whose entries are several times the budget, and
what a signal during it leaves (nothing).

The child converts a coordinate file of 1.5 million entries (36 MB of run records, 18 MB of CSR
arrays, 50 MB of text) with a 24 MiB budget; its peak resident set (``VmHWM``) must stay within
the import baseline (a child that imports the same modules) plus the budget plus the margin of
:mod:`support.memcheck` (measured: about 13 MiB above the baseline).
"""

from __future__ import annotations

import numpy as np
import pytest

from support.memcheck import margin, needs_hwm, run_child

MiB = 2**20
BUDGET = 24 * MiB
ENTRIES = 1_500_000

_CODE = """
import json, sys
import numpy, scipy.sparse, zarr
import blocklin
from blocklin.storage import sparse_convert  # noqa: F401 - imported in the baseline too
args = json.loads(sys.argv[1])
report = None
if args:
    report = blocklin.convert(args["src"], args["out"], memory=args["memory"])
    report = {k: report[k] for k in ("planned_memory", "runs", "row_blocks", "nnz")}
print(json.dumps({"peak": hwm(), "report": report}))
"""


@pytest.fixture(scope="module")
def coordinate_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("sparse-mem") / "big.mtx"
    rng = np.random.default_rng(5)
    m, n = 50_000, 20_000
    with open(path, "w") as f:
        f.write(f"%%MatrixMarket matrix coordinate integer general\n{m} {n} {ENTRIES}\n")
        for s in range(0, ENTRIES, 250_000):
            k = min(250_000, ENTRIES - s)
            r, c, v = rng.integers(1, m + 1, k), rng.integers(1, n + 1, k), rng.integers(-99, 100, k)
            f.write("".join(f"{a} {b} {d}\n" for a, b, d in zip(r.tolist(), c.tolist(), v.tolist())))
    return path


@pytest.fixture(scope="module")
def real_symmetric_file(tmp_path_factory):
    """Real values in every written form (the fast parse's check holds the most for them), lower
    triangle mirrored: 1.5 million entries stored from 0.75 million lines."""
    path = tmp_path_factory.mktemp("sparse-mem") / "sym.mtx"
    rng = np.random.default_rng(6)
    n, lines = 40_000, ENTRIES // 2
    with open(path, "w") as f:
        f.write(f"%%MatrixMarket matrix coordinate real symmetric\n{n} {n} {lines}\n")
        for s in range(0, lines, 250_000):
            k = min(250_000, lines - s)
            r, c = rng.integers(1, n + 1, k), rng.integers(1, n + 1, k)
            r, c = np.maximum(r, c), np.minimum(r, c)
            v = (rng.standard_normal(k) * 10.0 ** rng.integers(-20, 20, k)).tolist()
            f.write("".join(f"{a} {b} {d!r}\n" for a, b, d in zip(r.tolist(), c.tolist(), v)))
    return path


@pytest.mark.slow  # about 3 s each: a 50 MB file parsed in a child process
@needs_hwm
@pytest.mark.parametrize("which", ["integer general", "real symmetric"])
def test_sparse_conversion_stays_within_budget(tmp_path, request, which):
    import json

    src = request.getfixturevalue("coordinate_file" if which == "integer general" else "real_symmetric_file")
    base = run_child(_CODE, json.dumps({}))["peak"]
    res = run_child(_CODE, json.dumps({"src": str(src), "out": str(tmp_path / "o.zarr"),
                                       "memory": BUDGET}))
    rep = res["report"]
    assert rep["runs"] >= 4 and rep["planned_memory"] <= BUDGET and rep["nnz"] > 0.98 * ENTRIES
    used = res["peak"] - base
    assert used <= BUDGET + margin(BUDGET), f"{used / MiB:.1f} MiB above the baseline for a {BUDGET / MiB} MiB budget"


@pytest.mark.parametrize("sig", ["SIGINT", "SIGTERM", "SIGKILL"])
def test_interrupted_sparse_conversion_leaves_nothing(tmp_path, coordinate_file, sig):
    """A signal while the run files are written: exit 130/143, no partial output, no work folder; what
    a SIGKILL leaves (both, with owner records) ``blocklin clean`` finds and removes."""
    import os
    import signal
    import subprocess
    import sys
    import time

    temp = tmp_path / "blocklin-tmp"
    env = {**os.environ, "BLOCKLIN_TEMP_DIR": str(temp)}
    proc = subprocess.Popen([sys.executable, "-m", "blocklin.cli.main", "convert", str(coordinate_file),
                             str(tmp_path / "o.zarr"), "--memory", "24MiB"], env=env, stderr=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and proc.poll() is None:  # until run files exist
        if any(any(d.iterdir()) for d in temp.glob("blocklin-sort-*") if d.is_dir()):
            break
        time.sleep(0.005)
    assert proc.poll() is None, "the conversion ended before the signal"
    proc.send_signal(getattr(signal, sig))
    _out, err = proc.communicate(timeout=60)
    if sig == "SIGKILL":
        from blocklin.storage.cleanup import clean

        removed = clean([temp, tmp_path / "o.zarr"])
        assert {i.kind for i in removed} == {"partial output", "work folder"}
        assert all(i.action == "removed" for i in removed), removed
    else:
        assert proc.returncode == {"SIGINT": 130, "SIGTERM": 143}[sig], err
    assert not (tmp_path / "o.zarr").exists()
    assert [p.name for p in tmp_path.iterdir() if p.name != "blocklin-tmp"] == []
    assert list(temp.iterdir()) == []
