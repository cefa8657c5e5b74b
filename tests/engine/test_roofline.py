"""The roofline of a GPU run (issue 25): ``roofline_seconds = max(flops / in-core rate, bytes moved /
feed limit)`` and ``roofline_efficiency = roofline_seconds / seconds`` in every GPU report, with the
rates it used and where they came from. Checked on the CuPy stand-in against the formula recomputed
from the report's own counts and rates injected through the rates cache, never a fixed answer."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from support import cupy_standin

import blocklin as bl
from blocklin.cli.main import main
from blocklin.device.calibrate import gpu_name
from blocklin.errors import ParameterError
from blocklin.plan import rates as R
from blocklin.plan.gpu import GPUS

MEASURED = dict(feed_gbps=2.0, write_gbps=1.0, cpu_gflops=10.0, cpu_gflops32=20.0, gpu_gflops=3000.0,
                gpu_gflops32=5000.0, gpu_gflops_tf32=40000.0, raw_feed_gbps=7.5,
                measured="2026-12-03T10:00:00+00:00")


def inject(**fields) -> R.Rates:
    """Rates cached for this machine's GPU, as ``blocklin calibrate`` or ``gpu_check`` leave them."""
    rates = R.Rates(**{**MEASURED, **fields}, key=R.machine_key(f"gpu {gpu_name()}"))
    R.save_rates(rates)
    return rates


def assert_roofline(r: dict, gflops: float, gbps: float) -> None:
    """The report's roofline entries as :meth:`blocklin.runtime.job.Job.report` defines them."""
    moved = r["bytes_read"] + r["bytes_written"]
    rl = r["roofline"]
    assert rl["flops"] == r["flops"] and rl["bytes_moved"] == moved > 0 and r["flops"] > 0
    assert rl["gflops"] == gflops and rl["feed_gbps"] == gbps
    want = max(r["flops"] / (gflops * 1e9), moved / (gbps * 1e9))
    assert r["roofline_seconds"] == pytest.approx(want, rel=1e-12) == rl["seconds"]
    assert r["roofline_efficiency"] == pytest.approx(want / r["seconds"], rel=1e-12)
    assert rl["bound"] == ("compute" if r["flops"] / gflops >= moved / gbps else "feed")


# -- the arithmetic (plan/rates.py) ------------------------------------------------------------------
def test_roofline_takes_the_larger_of_compute_and_feed_time():
    rates = R.Rates(**MEASURED)
    rl = R.roofline(6e12, 3e9, dtype="float64", rates=rates)
    assert (rl.compute_seconds, rl.feed_seconds) == (2.0, 0.4) and rl.seconds == 2.0 and rl.bound == "compute"
    assert rl.gflops_source == rl.feed_source == "measured 2026-12-03"
    assert rl.efficiency(4.0) == 0.5 and rl.efficiency(0.0) is None
    assert R.roofline(6e12, 3e9, dtype="float32", rates=rates).compute_seconds == 6e12 / 5e12
    tf32 = R.roofline(4e12, 75e9, dtype="float32", tf32=True, rates=rates)
    assert tf32.rate == "tf32" and tf32.compute_seconds == 0.1 and tf32.seconds == 10.0 and tf32.bound == "feed"
    # TF32 applies to float32 GEMMs only; complex arithmetic at a quarter of the real rate (plan/gpu.py)
    assert R.roofline(1e12, 0, dtype="float64", tf32=True, rates=rates).rate == "float64"
    assert R.roofline(3e12, 0, dtype="complex128", rates=rates).compute_seconds == pytest.approx(4.0)
    assert R.roofline(1e12, 0, dtype="complex64", tf32=True, rates=rates).gflops == 10000.0


def test_roofline_defaults_are_the_gpus_peaks_and_say_so():
    for name, key in (("NVIDIA H200", "H200"), ("NVIDIA A100-SXM4-80GB", "A100"), ("cuda:0", "H200"), (None, "H200")):
        rl = R.roofline(1e12, 1e9, dtype="float64", gpu=name)
        assert rl.gflops == GPUS[key]["float64"] / 1e9 and rl.feed_gbps == GPUS[key]["link"] / 1e9
        assert rl.gflops_source.startswith(f"default ({key} float64 peak") and rl.feed_source.startswith("default")
    assert R.roofline(1e12, 0, dtype="float32", tf32=True).gflops == GPUS["H200"]["tf32"] / 1e9
    # measured GEMM rates without a measured feed limit: each rate says where it came from
    part = R.Rates(**{**MEASURED, "raw_feed_gbps": None, "gpu_gflops_tf32": None})
    rl = R.roofline(1e12, 1e9, dtype="float32", tf32=True, rates=part, gpu="NVIDIA H200")
    assert rl.gflops_source.startswith("default (H200 tf32") and rl.feed_source.startswith("default (H200 host link")
    rl = R.roofline(1e12, 1e9, dtype="float64", rates=part, gpu="NVIDIA H200")
    assert rl.gflops == 3000.0 and rl.gflops_source == "measured 2026-12-03"
    # rates never measured (the defaults) carry no GPU figure: the peaks again
    assert R.roofline(1e12, 0, rates=R.Rates.defaults()).gflops_source.startswith("default")


@pytest.mark.parametrize("name, value", [("flops", -1.0), ("flops", float("inf")), ("bytes_moved", "many")])
def test_roofline_refuses_bad_counts(name, value):
    kw = {"flops": 1.0, "bytes_moved": 1.0, name: value}
    with pytest.raises(ParameterError, match=rf"^{name}: must be a finite count >= 0; got .*Fix: "):
        R.roofline(kw["flops"], kw["bytes_moved"])


def test_older_caches_without_the_roofline_rates_still_load(tmp_path):
    entry = {k: v for k, v in MEASURED.items() if k not in ("gpu_gflops_tf32", "raw_feed_gbps")}
    rates = R.Rates.from_dict(entry)
    assert rates.gpu_gflops_tf32 is None and rates.raw_feed_gbps is None


@pytest.mark.parametrize("name, value", [("raw_feed_gbps", 0.0), ("gpu_gflops_tf32", -5.0), ("gpu_gflops", "fast")])
def test_a_cached_roofline_rate_that_is_not_positive_is_refused_and_plans_take_the_defaults(tmp_path, name, value):
    from blocklin.errors import ConfigError

    with pytest.raises(ConfigError, match=rf"^rates\.{name}: must be a positive number, or null where not measured; "
                                          r"got .*Fix: run `blocklin calibrate`"):
        R.Rates.from_dict({**MEASURED, name: value})
    R.save_rates(R.Rates(**MEASURED, key=R.machine_key("gpu X")))
    path = R.cache_path()
    data = json.loads(path.read_text())
    data["machines"][R.machine_key("gpu X")][name] = value
    path.write_text(json.dumps(data))
    assert R.load_rates("gpu X") == R.Rates.defaults()  # a broken entry never reaches a roofline


# -- GPU reports on the stand-in ---------------------------------------------------------------------
@pytest.mark.parametrize("scheduler", ["sync", "threads"])
def test_gpu_matmul_reports_its_roofline_from_the_cached_rates(standin, tmp_path, scheduler):
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((320, 256)), rng.standard_normal((256, 192))
    inject()
    r = bl.matmul(bl.from_array(a, tmp_path / "a.zarr", chunks=(64, 64)), b, tmp_path / "c.zarr", device="gpu",
                  memory="512KiB", device_memory="256KiB", scheduler=scheduler, workers=2)
    # blocked float64 sums over k = 256: 4 k eps of |A||B| (tests/conftest.py gemm_tol)
    assert np.all(np.abs(r.to_numpy() - a @ b) <= 4 * 256 * np.finfo(float).eps * (np.abs(a) @ np.abs(b)))
    rep = r.report
    assert rep["device"] == "gpu" and rep["scheduler"] == scheduler
    assert rep["roofline"]["rate"] == "float64"
    assert rep["roofline"]["gflops_source"] == rep["roofline"]["feed_source"] == "measured 2026-12-03"
    assert_roofline(rep, 3000.0, 7.5)
    assert cupy_standin.take_races() == []


@pytest.mark.parametrize("precision, rate, gflops", [("float32", "float32", 5000.0), ("tf32", "tf32", 40000.0)])
def test_the_rate_follows_the_arithmetic_the_gemms_ran_in(standin, tmp_path, precision, rate, gflops):
    rng = np.random.default_rng(1)
    a, b = rng.standard_normal((192, 128)), rng.standard_normal((128, 96))
    inject()
    r = bl.matmul(a, b, tmp_path / "c.zarr", device="gpu", memory="256KiB", precision=precision)
    # float32 (TF32: 10-bit mantissa) products: |error| <= (k + 2) u |A||B| (Higham 2002, eq. 3.13)
    u = 2.0**-24 if precision == "float32" else 2.0**-11
    assert np.all(np.abs(r.to_numpy() - a @ b) <= (128 + 2) * u * (np.abs(a) @ np.abs(b)))
    assert r.report["roofline"]["rate"] == rate
    assert_roofline(r.report, gflops, 7.5)


def test_a_mixed_precision_solve_takes_the_rate_of_its_float32_factorization(standin):
    rng = np.random.default_rng(2)
    g = rng.standard_normal((160, 160))
    a, b = g @ g.T / 160 + np.eye(160), rng.standard_normal((160, 2))
    inject()
    x = bl.solve(a, b, assume_a="pos", precision="tf32", device="gpu", memory="256KiB")
    # refined to float64: backward error within a few n eps (the report's own figure, Higham 2002 ch. 12)
    assert x.report["backward_error"] <= 160 * np.finfo(float).eps
    assert x.report["roofline"]["rate"] == "tf32"
    assert_roofline(x.report, 40000.0, 7.5)


def test_without_measured_rates_the_report_says_default(standin, tmp_path):
    rng = np.random.default_rng(3)
    a = rng.standard_normal((200, 150))
    r = bl.matmul(a, a.T.copy(), tmp_path / "c.zarr", device="gpu", memory="256KiB").report
    spec = GPUS["H200"]  # the stand-in's device has no known name: the default GPU's peaks
    assert r["roofline"]["gflops_source"].startswith("default (H200 float64 peak")
    assert r["roofline"]["feed_source"].startswith("default (H200 host link")
    assert_roofline(r, spec["float64"] / 1e9, spec["link"] / 1e9)


@pytest.mark.parametrize("device", ["cpu", pytest.param("gpu", marks=pytest.mark.gpu)])
def test_gpu_reports_carry_a_roofline_and_cpu_reports_none(tmp_path, device):
    """Under ``--cupy-standin`` and on a real GPU: the entries follow the formula with the rates the
    report names (this machine's cached ones, else the defaults)."""
    rng = np.random.default_rng(5)
    a, b = rng.standard_normal((256, 128)), rng.standard_normal((128, 96))
    r = bl.matmul(bl.from_array(a, tmp_path / "a.zarr", chunks=(64, 64)), b, tmp_path / "c.zarr", device=device,
                  memory="256KiB").report
    if device == "cpu":
        assert not {"roofline", "roofline_seconds", "roofline_efficiency"} & set(r)
        return
    rl = r["roofline"]
    assert rl["rate"] == "float64" and rl["gflops"] > 0 and rl["feed_gbps"] > 0
    assert all(rl[k].startswith(("measured ", "default (")) for k in ("gflops_source", "feed_source"))
    assert_roofline(r, rl["gflops"], rl["feed_gbps"])


def test_the_cli_bound_line_mentions_the_efficiency_of_gpu_runs(standin, tmp_path, capsys):
    rng = np.random.default_rng(4)
    pa = bl.from_array(rng.standard_normal((256, 128)), tmp_path / "a.zarr", chunks=(64, 64)).path
    pb = bl.from_array(rng.standard_normal((128, 64)), tmp_path / "b.zarr", chunks=(64, 64)).path
    assert main(["gemm", pa, pb, "-o", str(tmp_path / "c.zarr"), "--memory", "256KiB", "--device", "gpu",
                 "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    eff = summary["roofline_efficiency"]
    assert 0 < eff and summary["roofline_seconds"] > 0 and summary["roofline"]["gflops_source"].startswith("default")
    assert main(["gemm", pa, pb, "-o", str(tmp_path / "d.zarr"), "--memory", "256KiB", "--device", "gpu"]) == 0
    (line,) = [x for x in capsys.readouterr().out.splitlines() if x.startswith("feed ")]
    assert re.search(r": bound by (feed|compute); \d+% of the roofline \([0-9.e-]+ s, default rates\)$", line), line
    assert main(["gemm", pa, pb, "-o", str(tmp_path / "e.zarr"), "--memory", "256KiB", "--device", "cpu"]) == 0
    (line,) = [x for x in capsys.readouterr().out.splitlines() if x.startswith("feed ")]
    assert "roofline" not in line
    from blocklin.cli import ui

    rep = {"feed_gbps": 1.0, "compute_fraction": 0.5, "bound": "feed", "roofline_seconds": 0.123,
           "roofline_efficiency": 0.42, "roofline": {"gflops_source": "measured 2026-12-03",
                                                     "feed_source": "default (H200 host link, plan/gpu.py)"}}
    assert ui.feed_line(rep) == ("feed 1 GB/s, device computing 50% of the run: bound by feed; "
                                 "42% of the roofline (0.12 s, measured and default rates)")


def test_calibrate_on_a_gpu_caches_the_tf32_rate_the_roofline_uses(standin, tmp_path, capsys):
    assert main(["calibrate", "--size", "1MiB", "--gemm-size", "64", "--device", "gpu", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    rates = R.load_rates(f"gpu {gpu_name()}")
    assert summary["key"] == R.machine_key(f"gpu {gpu_name()}") == rates.key
    assert min(rates.gpu_gflops, rates.gpu_gflops32, rates.gpu_gflops_tf32) > 0
    assert cupy_standin.STATE.counts.get("cublas.gemm tf32", 0) > 0  # the TF32 rate ran on TF32
    rl = R.roofline(1e9, 0, dtype="float32", tf32=True, rates=rates)
    assert rl.gflops == rates.gpu_gflops_tf32 and rl.gflops_source.startswith("measured ")
    R.save_rates(R.Rates(**{**rates.to_dict(), "raw_feed_gbps": 12.5}))  # as gpu_check adds it
    assert main(["calibrate", "--show"]) == 0
    text = capsys.readouterr().out
    assert f", {rates.gpu_gflops_tf32:.1f} TF32" in text and "raw feed limit 12.50 GB/s" in text


def test_a_cluster_gpu_report_says_why_it_has_no_roofline(standin):
    """The cached rates are one machine's: a cluster's report has null roofline figures and the reason."""
    from distributed import Client, LocalCluster

    rng = np.random.default_rng(6)
    a, b = rng.standard_normal((128, 96)), rng.standard_normal((96, 64))
    inject()
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=False, dashboard_address=":0") as cluster, \
            Client(cluster) as client:
        res = bl.matmul(a, b, scheduler=client, device="gpu", memory="256KiB")
    # blocked float64 sums over k = 96: 4 k eps of |A||B| (tests/conftest.py gemm_tol)
    assert np.all(np.abs(res.to_numpy() - a @ b) <= 4 * 96 * np.finfo(float).eps * (np.abs(a) @ np.abs(b)))
    r = res.report
    assert r["device"] == "gpu" and r["roofline_seconds"] is None and r["roofline_efficiency"] is None
    assert "not measured" in r["roofline"]["reason"]
