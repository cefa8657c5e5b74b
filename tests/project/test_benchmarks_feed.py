"""benchmarks/feed.py at its --quick sizes: every reader runs and the JSON line has every field."""

from __future__ import annotations

import json
import math

from support import cupy_standin
from support.scripts import load_script


def _load():
    return load_script("benchmarks/feed.py", "feed_benchmark")


def _rate(x) -> bool:
    return isinstance(x, float) and math.isfinite(x) and x > 0


def test_feed_quick_reports_every_reader(standin, tmp_path, capsys):
    feed = _load()
    where = tmp_path / "feed"
    where.mkdir()
    assert feed.main(["--quick", "--dir", str(where), "--memory", "1/16,1/4"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert sum(line.startswith("{") for line in lines) == 1
    summary = json.loads(lines[-1])
    assert set(feed.FIELDS) <= set(summary), set(feed.FIELDS) - set(summary)
    assert summary["gpu_backend"] == "standin"  # the fixture's stand-in, measured through CudaDevice
    m, n = summary["shape"]
    assert summary["operand_bytes"] == m * n * 8 and summary["chunks"][1] == n
    for codec in feed.CODECS:
        raw = summary["raw"][codec]
        assert "1" in raw and str(summary["cores"]) in raw and all(_rate(r) for r in raw.values())
        assert summary["raw_limit"][codec] == max(raw.values())
        assert _rate(summary["zarr"][codec]) and _rate(summary["dask"][codec])
        # row passes (a first and a later) on both devices, and the thin product
        for dev in ("cpu", "columns", "recorded", "later", "gpu", "gpu_later", "gemm"):
            got = summary[f"blocklin_{dev}"][codec]
            assert set(got) == {"1/16", "1/4"}
            for frac, entry in got.items():
                # the thin product's row pass (B held), or its tiles where the budget holds no B
                assert _rate(entry["gbps"]) and (entry["plan"].get("strip") or entry["plan"]["tm"]) > 0
                ratio = summary["ratio_to_raw"][f"{dev} {codec} {frac}"]
                assert math.isclose(ratio, entry["gbps"] / summary["raw_limit"][codec])
                # the first passes with the writer's record took it, and only they
                assert entry["plan"].get("recorded", False) == (dev == "recorded")
    assert _rate(summary["numpy_fromfile"])
    touch = summary["touch"]  # every byte summed: copied into a buffer, and mapped where it lies
    assert touch["threads"] == summary["cores"] and _rate(touch["copy_sum"]) and _rate(touch["map_sum"])
    assert _rate(touch["map_peaks_sum"])
    assert touch["pmd_mapped"] is None or 0 <= touch["pmd_mapped"] <= 1
    assert summary["reread"] is False
    assert list(where.iterdir()) == []  # the operand and its work folder are gone
    assert cupy_standin.take_races() == []


def test_feed_reread_drops_the_written_files_from_the_page_cache(tmp_path, capsys):
    """``--reread``: the chunk files are evicted after they are written and read back before any reader."""
    feed = _load()
    where = tmp_path / "feed"
    where.mkdir()
    assert feed.main(["--quick", "--dir", str(where), "--codecs", "none", "--no-gpu", "--reread"]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert summary["reread"] is True and _rate(summary["touch"]["map_sum"]) and _rate(summary["raw_limit"]["none"])
    assert list(where.iterdir()) == []
