"""Expected rates (plan/rates.py): the time split's arithmetic, the cache file and its defaults,
``blocklin calibrate`` and the expected line of ``--explain``."""

from __future__ import annotations

import json
import os
from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import pytest

import blocklin as bl
from blocklin.cli.main import main
from blocklin.device.calibrate import measure_gflops
from blocklin.device.cpu import CpuDevice
from blocklin.device.select import gpu_available
from blocklin.errors import ConfigError, ParameterError
from blocklin.plan import rates as R
from blocklin.plan.factor import plan_factor, plan_lu, plan_qr
from blocklin.plan.gemm import plan_gemm
from blocklin.plan.gram import plan_gram
from blocklin.plan.qrtiles import plan_tile_qr
from blocklin.plan.svd import plan_svd
from blocklin.storage.location import as_location
from blocklin.storage.probe import measure_storage

MEASURED = R.Rates(feed_gbps=2.0, write_gbps=1.0, cpu_gflops=10.0, cpu_gflops32=20.0, gpu_gflops=1000.0,
                   gpu_gflops32=4000.0, measured="2026-12-02T10:00:00+00:00", key=R.machine_key("cpu"))


def test_time_split_divides_each_count_by_its_rate_and_names_the_largest():
    s = R.time_split(4e9, 1e9, 50e9, "cpu", MEASURED)
    assert (s.feed_seconds, s.compute_seconds, s.write_seconds) == (2.0, 5.0, 1.0)
    assert s.bound == "compute" and s.seconds == 5.0 and s.device == "cpu"
    assert R.time_split(4e9, 1e9, 50e9, "cpu", MEASURED, dtype=np.float32).compute_seconds == 2.5
    assert R.time_split(4e9, 1e9, 50e9, "cpu", MEASURED, dtype=np.complex64).compute_seconds == 2.5
    gpu = R.time_split(4e9, 1e9, 50e9, "gpu", MEASURED)
    assert gpu.compute_seconds == 0.05 and gpu.bound == "feed"
    assert R.time_split(4e9, 1e9, 50e9, "gpu", MEASURED, dtype="float32").compute_seconds == 0.0125
    assert R.time_split(0, 9e9, 1e9, "cpu", MEASURED).bound == "write"
    # ties: feed before compute before write
    assert R.time_split(2e9, 1e9, 10e9, "cpu", MEASURED).bound == "feed"
    assert R.time_split(0, 0, 0, "cpu", MEASURED).bound == "feed"
    # a GPU not measured: the default GPU rate
    cpu_only = R.Rates(feed_gbps=1.0, write_gbps=1.0, cpu_gflops=1.0, cpu_gflops32=2.0)
    assert R.time_split(0, 0, 1e13, "gpu", cpu_only).compute_seconds == 1e13 / (R.DEFAULT_GPU_GFLOPS * 1e9)
    # no rates: the defaults
    assert R.time_split(1e9, 0, 0, "cpu").feed_seconds == 1 / R.DEFAULT_FEED_GBPS


@pytest.mark.parametrize("args, name", [((-1, 0, 0, "cpu"), "bytes_read"), ((0, float("nan"), 0, "cpu"), "bytes_written"),
                                        ((0, 0, "many", "cpu"), "flops"), ((0, 0, 0, "tpu"), "device")])
def test_time_split_refuses_bad_arguments(args, name):
    with pytest.raises(ParameterError, match=rf"^{name}: .*; got .*Fix: "):
        R.time_split(*args)


def test_defaults_without_a_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "empty"))
    assert R.cache_path() == tmp_path / "empty" / "blocklin" / "rates.json"
    rates = R.load_rates()
    assert rates == R.Rates.defaults() and rates.measured is None and rates.source == "default rates"
    four = R.Rates.defaults(cores=4)
    assert four.cpu_gflops == 4 * R.DEFAULT_CPU_GFLOPS_PER_CORE and four.cpu_gflops32 == 2 * four.cpu_gflops
    assert four.gpu_gflops is None and four.gflops("gpu") == R.DEFAULT_GPU_GFLOPS
    # XDG's rule: a relative XDG_CACHE_HOME is ignored
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/cache")
    assert R.cache_path() == Path.home() / ".cache" / "blocklin" / "rates.json"


def test_cache_round_trip_keyed_by_machine(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    path = R.save_rates(MEASURED)
    assert path == tmp_path / "xdg" / "blocklin" / "rates.json" and path.exists()
    assert R.load_rates() == MEASURED and R.load_rates("cpu") == MEASURED
    assert R.load_rates().source == "rates measured 2026-12-02"
    # another machine's entry is kept beside it and never read here; the newest of this machine wins
    other = R.Rates(**{**MEASURED.to_dict(), "key": R.machine_key("cpu", host="elsewhere"), "feed_gbps": 9.0,
                       "measured": "2027-01-01T00:00:00+00:00"})
    newer = R.Rates(**{**MEASURED.to_dict(), "key": R.machine_key("gpu NVIDIA X"), "feed_gbps": 3.0,
                       "measured": "2026-12-03T00:00:00+00:00"})
    R.save_rates(other)
    R.save_rates(newer)
    assert set(R.read_cache()) == {MEASURED.key, other.key, newer.key}
    assert R.load_rates() == newer and R.load_rates("cpu") == MEASURED
    assert R.load_rates(host="elsewhere") == other
    assert R.load_rates(cores=(os.cpu_count() or 1) + 1) == R.Rates.defaults((os.cpu_count() or 1) + 1)
    assert R.machine_key("cpu", host="h", cores=3) == "h/3 cores/cpu"
    with pytest.raises(ParameterError, match="rates.key"):
        R.save_rates(R.Rates.defaults())


def test_a_broken_cache_gives_the_defaults_and_is_replaced(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    R.cache_path().parent.mkdir(parents=True)
    R.cache_path().write_text("not json")
    with pytest.raises(ConfigError, match=r"rates cache: .*Fix: remove it"):
        R.read_cache()
    assert R.load_rates() == R.Rates.defaults()
    R.save_rates(MEASURED)
    assert R.load_rates() == MEASURED
    # an entry with a missing rate is skipped, the file's other layout versions ignored
    data = json.loads(R.cache_path().read_text())
    data["machines"][MEASURED.key]["feed_gbps"] = None
    R.cache_path().write_text(json.dumps(data))
    assert R.load_rates() == R.Rates.defaults()
    R.cache_path().write_text(json.dumps({"version": 99, "machines": {MEASURED.key: MEASURED.to_dict()}}))
    assert R.read_cache() == {} and R.load_rates() == R.Rates.defaults()


def test_every_plan_explains_its_expected_split():
    rates = MEASURED
    gemm = plan_gemm(4000, 4000, 4000, "float64", a_chunks=(1000, 1000), b_chunks=(1000, 1000), memory=2**30)
    split = R.time_split(gemm.bytes_read, gemm.bytes_written, gemm.flops, "cpu", rates)
    line = gemm.explain(rates).splitlines()[-1]
    assert line == (f"  expected on cpu: feed {R.format_seconds(split.feed_seconds)}, compute "
                    f"{R.format_seconds(split.compute_seconds)}, write {R.format_seconds(split.write_seconds)} "
                    f"(rates measured 2026-12-02): bound by {split.bound}")
    plans = [plan_gram((100000, 500), "float64", chunks=(10000, 500), memory=2**28),
             plan_factor("cholesky", 4096, "float64", memory=2**28), plan_lu(4096, "float64", memory=2**28),
             plan_qr(8192, 1024, "float64", memory=2**28), plan_tile_qr(8192, 1024, "float64", memory=2**28),
             plan_svd(100000, 1000, 10, np.float64, method="rsvd", oversample=10, power_iters=2, memory=2**28,
                      max_passes=10),
             bl.inv_plan(np.eye(600), memory="1MiB"), bl.inv_plan(np.eye(600), memory="64MiB")]
    for plan in plans:
        assert plan.bytes_read > 0 and plan.bytes_written > 0 and plan.flops > 0
        last = plan.explain(rates).splitlines()[-1]
        assert "expected" in last and "(rates measured 2026-12-02): bound by " in last, last
        assert plan.explain().splitlines()[-1].endswith(tuple(f"(default rates): bound by {b}" for b in R.BOUNDS))
    lanczos = plan_svd(100000, 1000, 10, np.float64, method="lanczos", oversample=10, power_iters=None,
                       memory=2**28, max_passes=7)
    assert "expected at 7 passes (the most) on cpu" in lanczos.explain(rates)
    # the counts added for it are properties: plans, and the resume tokens made from them, are unchanged
    factor, svd, inverse = plans[1:5], plans[5], plans[6:]
    assert not any("bytes_written" in p.to_dict() for p in factor + [svd] + inverse)
    assert not any(k in p.to_dict() for p in [svd] + inverse for k in ("bytes_read", "bytes_written"))
    assert "flops" not in svd.to_dict()


def test_measurements_refuse_bad_sizes_and_measure(tmp_path):
    with pytest.raises(ParameterError, match="^n: must be at least 1"):
        measure_gflops(CpuDevice(), n=0)
    assert measure_gflops(CpuDevice(), np.float32, 64, seconds=0.01) > 0
    with pytest.raises(ParameterError, match="^nbytes: must be at least one row"):
        measure_storage(as_location(str(tmp_path / "p")), 100)
    io = measure_storage(as_location(str(tmp_path / "p")), 2**20)
    assert io.nbytes == 2**20 and min(io.read_gbps, io.cached_read_gbps, io.write_gbps) > 0


def test_calibrate_measures_caches_and_explain_uses_it(tmp_path, capsys):
    assert main(["calibrate", "--show"]) == 0
    assert "no rates cached" in capsys.readouterr().out
    assert main(["calibrate", "--size", "2MiB", "--gemm-size", "128", "--device", "cpu", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    cached = R.read_cache()
    assert summary["key"] == R.machine_key("cpu") and set(cached) == {summary["key"]}
    rates = R.load_rates()
    assert rates.to_dict() == summary["rates"] and summary["storage"]["bytes"] == 2**20 * 2
    assert min(rates.feed_gbps, rates.write_gbps, rates.cpu_gflops, rates.cpu_gflops32) > 0
    today = datetime.now(timezone.utc).date().isoformat()
    assert rates.measured.startswith(today)
    # the probe store is gone with its work folder
    assert not any(p.name.startswith("blocklin-calibrate") for p in (tmp_path / "blocklin-tmp").iterdir())
    assert main(["calibrate", "--show"]) == 0
    text = capsys.readouterr().out
    assert summary["key"] in text and f"use the rates measured {today}" in text
    a = bl.from_array(np.ones((64, 48)), tmp_path / "a.zarr", chunks=(16, 16)).path
    b = bl.from_array(np.ones((48, 32)), tmp_path / "b.zarr", chunks=(16, 16)).path
    assert main(["gemm", a, b, "-o", str(tmp_path / "c.zarr"), "--explain", "--memory", "64KiB"]) == 0
    line = [x for x in capsys.readouterr().out.splitlines() if "expected" in x]
    assert len(line) == 1 and line[0].startswith("  expected on cpu: feed ")
    assert f"(rates measured {today}): bound by " in line[0]
    with pytest.raises(SystemExit) as exc:
        main(["calibrate", "--size", "4KiB"])
    assert exc.value.code == 2 and "--size: must be at least 1MiB" in capsys.readouterr().err


@pytest.mark.skipif(gpu_available(), reason="checks the error without a GPU")
def test_calibrate_on_a_missing_gpu_fails_before_writing(tmp_path, capsys):
    assert main(["calibrate", "--device", "gpu", "--size", "1MiB"]) == 1
    assert "DeviceError" in capsys.readouterr().err and not R.cache_path().exists()


@pytest.mark.gpu
def test_calibrate_measures_the_gpu_and_gemm_expects_on_it(tmp_path, capsys):
    """On a GPU (or the CuPy stand-in, ``pytest --cupy-standin``): the GPU's rates are measured and
    keyed by its name, and a GPU plan's expected line uses them."""
    assert main(["calibrate", "--size", "1MiB", "--gemm-size", "64", "--device", "gpu", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    assert summary["key"].startswith(R.machine_key("gpu ")) and summary["rates"]["gpu_gflops"] > 0
    assert R.load_rates().gpu_gflops32 > 0
    a = bl.from_array(np.ones((64, 48)), tmp_path / "a.zarr", chunks=(16, 16)).path
    b = bl.from_array(np.ones((48, 32)), tmp_path / "b.zarr", chunks=(16, 16)).path
    assert main(["gemm", a, b, "-o", str(tmp_path / "c.zarr"), "--explain", "--device", "gpu", "--memory", "1MiB"]) == 0
    assert "  expected on gpu: feed " in capsys.readouterr().out
    # a plan without a device of its own (the Gram route of one operand) follows --device
    assert main(["gemm", a, a, "--trans-a", "-o", str(tmp_path / "g.zarr"), "--explain", "--device", "gpu",
                 "--memory", "1MiB"]) == 0
    assert "  expected on gpu: feed " in capsys.readouterr().out
