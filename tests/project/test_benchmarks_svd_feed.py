"""benchmarks/svd_feed.py at its --quick sizes: every method runs, with and without the GIL-free BLAS."""

from __future__ import annotations

import json
import math

from support.scripts import load_script


def _load():
    return load_script("benchmarks/svd_feed.py", "svd_feed_benchmark")


def test_svd_feed_quick(tmp_path, monkeypatch, capsys):
    bench = _load()
    where, temp = tmp_path / "data", tmp_path / "temp"
    where.mkdir()
    temp.mkdir()
    monkeypatch.setenv("BLOCKLIN_TEMP_DIR", str(temp))
    assert bench.main(["--quick", "--dir", str(where), "--gil"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    summary = json.loads(lines[-1])
    assert summary["host_blas"] is True
    (shape, entry), = summary["shapes"].items()
    m, n = (int(x) for x in shape.split("x"))
    assert entry["bytes"] == m * n * 4 and entry["recorded"] is True  # blocklin.random records the peaks
    assert entry["feed_seconds"] > 0 and entry["feed_later_seconds"] > 0
    names = {f"{meth}{gil}" for meth in ("sketch", "gram", "lanczos") for gil in ("", " (GIL held)")}
    assert set(entry["methods"]) == names
    for name, r in entry["methods"].items():
        assert r["passes"] >= 1 and r["bytes_read"] >= m * n * 4, (name, r)
        # the sketch makes no residual check (one pass); the others converge to tol
        assert r["converged"] is (None if name.startswith("sketch") else True), (name, r)
        assert math.isclose(r["of_feed"], r["seconds"] / entry["feed_seconds"])
    # the same passes with the GIL held or not (only the BLAS calls' path differs)
    for meth in ("sketch", "gram", "lanczos"):
        assert entry["methods"][meth]["passes"] == entry["methods"][f"{meth} (GIL held)"]["passes"]
    assert list(where.iterdir()) == [] and list(temp.iterdir()) == []  # matrices and svd outputs removed
