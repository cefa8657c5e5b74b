"""benchmarks/gpu_first_call.sh, the first call on a lent GPU machine, run here in its stand-in mode
(``STANDIN=1``: every step on the CuPy stand-in at small sizes): every step ends well, and the JSON
files it writes under ``$OUT`` hold what the device call is for, each timing's roofline checked
against the formula with the rates the run measured."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
STEPS = ["env", "probe", "pytest", "checks", "timing", "repro", "feed", "big"]


def assert_roofline(entry: dict, rates: dict, seconds: float) -> None:
    """``max(flops / in-core rate, bytes moved / raw feed limit)`` with the rates the run cached."""
    rl = entry["roofline"]
    gflops = {"float64": rates["gpu_gflops"], "float32": rates["gpu_gflops32"], "tf32": rates["gpu_gflops_tf32"]}
    assert rl["gflops"] == gflops[rl["rate"]] and rl["feed_gbps"] == rates["raw_feed_gbps"]
    assert rl["gflops_source"] == rl["feed_source"] == f"measured {rates['measured'][:10]}"
    want = max(rl["flops"] / (rl["gflops"] * 1e9), rl["bytes_moved"] / (rl["feed_gbps"] * 1e9))
    assert entry["roofline_seconds"] == pytest.approx(want, rel=1e-12)
    assert entry["roofline_efficiency"] == pytest.approx(want / seconds, rel=1e-12)


@pytest.mark.slow  # eight steps in separate processes (45-55 s on two shared cores)
def test_the_first_device_call_runs_on_the_standin(tmp_path):
    out = tmp_path / "out"
    res = tmp_path / "res"  # as on the device: results packed into one archive under $OUT after each step
    env = {**os.environ, "STANDIN": "1", "OUT": str(out), "RES": str(res), "PYTHON": sys.executable}
    proc = subprocess.run(["bash", "benchmarks/gpu_first_call.sh"], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=400)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, log[-3000:]
    assert [p.name for p in out.iterdir()] == ["first-call.tgz"]  # the device tool brings back 8 files at most
    with tarfile.open(out / "first-call.tgz") as tar:
        tar.extractall(out, filter="data")
    steps = json.loads((out / "steps.json").read_text())
    assert [s["step"] for s in steps] == STEPS and all(s["rc"] == 0 for s in steps), steps
    # the device call's plan, under 10 minutes: the fixed limits and the wheels' 30 s, the GEMM until 540 s
    assert sum(s["limit"] for s in steps if s["step"] != "big") + 30 <= 560
    assert 540 <= steps[-1]["at"] + steps[-1]["limit"] <= 542 and all(s["seconds"] <= s["limit"] for s in steps)
    assert (out / "run.log").read_text().rstrip().endswith("s)") and "== end" in (out / "run.log").read_text()

    env_json = json.loads((out / "env.json").read_text())
    assert env_json["gpu_available"] and "stand-in" in env_json["cupy_package"]
    assert {"numpy", "scipy", "dask", "zarr", "cupy", "cuda_runtime", "cuda_driver", "gpu"} <= set(env_json)
    assert "pinned_request_MiB" in json.loads((out / "probe.json").read_text())
    assert " passed" in (out / "pytest.log").read_text()

    checks = json.loads((out / "checks.json").read_text())
    assert checks["correct"] and len(checks["checks"]) >= 16 and checks["environment"] == {
        k: v for k, v in env_json.items() if k != "gpu_available"}

    timing = json.loads((out / "timing.json").read_text())
    assert not timing.get("timing_errors") and timing["dry_run"]
    rates = timing["roofline_rates"]["rates"]
    assert rates["raw_feed_gbps"] == timing["roofline_rates"]["raw_feed"]["raw_feed_gbps"] > 0
    cached = json.loads((out / "cache" / "blocklin" / "rates.json").read_text())["machines"]
    assert cached[rates["key"]] == rates  # the run's rates cache came back under $OUT
    for g in timing["gemm"] + timing["gemm_precision"]:
        assert_roofline(g, rates, g["out_of_core_seconds"])
    assert [g["roofline"]["rate"] for g in timing["gemm_precision"]] == ["float32", "tf32"]
    for key, precisions in (("solve", ("double", "mixed", "tf32")), ("inverse", ("float64", "mixed", "tf32"))):
        for p in precisions:
            assert_roofline(timing[key][p], rates, timing[key][p]["seconds"])
    assert all(g["rel_error"] < 1e-4 for g in timing["gemm"])

    repro = json.loads((out / "repro.json").read_text())
    assert repro["correct"] and repro["B1_fixed"] and repro["B2_fixed"] and repro["B3_fixed"], repro
    feed = json.loads((out / "feed.json").read_text())
    assert feed["gpu_backend"] == "standin" and set(feed["raw_limit"]) == {"none", "zstd"}
    assert all(r > 0 for r in feed["ratio_to_raw"].values()) and any(k.startswith("gpu ") for k in feed["ratio_to_raw"])
    big = json.loads((out / "big.json").read_text())
    assert big["n"] == 512 and big["corner_within_bound"] and "roofline_efficiency" in big
