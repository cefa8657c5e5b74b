"""benchmarks/gpu_check.py's own logic (issue 25): the phases that count as run elsewhere, where its
JSON goes, the versions it records, the roofline's rates it measures and caches (the raw feed limit
by benchmarks/feed.py's raw read), and no ``--install``. The whole script runs on the stand-in in
tests/engine/test_cupy_standin.py and, through the first device call, in test_gpu_first_call.py."""

from __future__ import annotations

import datetime
import importlib.util
from pathlib import Path

import numpy as np
import pytest

from support import cupy_standin

import blocklin as bl
from blocklin.device.calibrate import gpu_name
from blocklin.plan import rates as R

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def gc():
    spec = importlib.util.spec_from_file_location("gpu_check_under_test", ROOT / "benchmarks" / "gpu_check.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_only_phases_that_ran_off_the_device_count_as_elsewhere(gc):
    """A phase that never ran (None) was counted as running elsewhere."""
    checks = [
        {"check": "inv schur", "phases": {"GEMMs": "gpu", "leaf inverses": None, "butterfly transforms": "gpu"}},
        {"check": "lu", "phases": {"panel updates": "gpu", "panel factorization (getrf)": "cpu"}},
        {"check": "inv leaves", "phases": {"GEMMs": "gpu", "leaf inverses": "cpu/gpu"}},
        {"check": "matmul", "phases": {"GEMM tiles": "gpu", "reads and writes": "cpu"}},
        {"check": "svd spilled", "phases": {"products": "gpu", "Krylov bases": "spilled to the work folder (8 bytes)"}},
        {"check": "no phases", "error": 0.0},
    ]
    assert gc.phases_elsewhere(checks, "gpu") == {"lu": checks[1]["phases"], "inv leaves": checks[2]["phases"]}
    assert set(gc.phases_elsewhere(checks, "cpu")) == {"inv schur", "lu", "inv leaves", "matmul", "svd spilled"}
    assert not gc.ran_elsewhere(None, "gpu") and not gc.ran_elsewhere("gpu", "gpu")
    assert gc.ran_elsewhere("cpu", "gpu") and gc.ran_elsewhere("gpu/cpu", "gpu")


def test_the_summary_goes_to_benchmarks_results_by_default(gc, tmp_path, monkeypatch):
    assert gc.RESULTS == ROOT / "benchmarks" / "results" and (gc.RESULTS / "README.md").exists()
    monkeypatch.setattr(gc, "RESULTS", tmp_path)
    day = datetime.datetime(2026, 12, 3, 23, 59, tzinfo=datetime.timezone.utc)
    assert gc.default_json_path(day) == tmp_path / "gpu-2026-12-03.json"
    (tmp_path / "gpu-2026-12-03.json").write_text("{}")
    (tmp_path / "gpu-2026-12-03-2.json").write_text("{}")
    assert gc.default_json_path(day) == tmp_path / "gpu-2026-12-03-3.json"  # an earlier run is never replaced


def test_it_installs_nothing(gc, capsys):
    with pytest.raises(SystemExit) as exc:
        gc.main(["--install"])
    assert exc.value.code == 2 and "unrecognized arguments: --install" in capsys.readouterr().err
    assert not hasattr(gc, "install_and_rerun") and "subprocess" not in gc.__dict__


def test_the_environment_names_every_version_and_the_gpu(gc, standin):
    import dask
    import scipy
    import zarr

    env = gc.environment()
    assert (env["numpy"], env["scipy"], env["dask"], env["zarr"]) == (np.__version__, scipy.__version__,
                                                                      dask.__version__, zarr.__version__)
    assert env["cupy"] == standin.__version__ and "stand-in" in env["cupy_package"]
    assert env["gpu"] == gpu_name() and env["gpu_memory_bytes"] > 0
    assert {"cuda_runtime", "cuda_driver", "python", "cores"} <= set(env) and "cupy_error" not in env
    assert gc._cuda_version(13000) == "13.0" and gc._cuda_version(12080) == "12.8"


def test_the_raw_feed_limit_is_feed_py_s_raw_read(gc, tmp_path, monkeypatch):
    """Its reads are benchmarks/feed.py's ``raw_read`` (not a copy): every thread count, the best."""
    feed = gc._feed_module()
    calls = []
    raw_read = feed.raw_read

    def counted(files, threads, chunk_bytes, codec):
        calls.append((len(files), threads, chunk_bytes, codec))
        return raw_read(files, threads, chunk_bytes, codec)

    monkeypatch.setattr(feed, "raw_read", counted)
    monkeypatch.setattr(gc, "_feed_module", lambda: feed)
    got = gc.raw_feed_limit(str(tmp_path), 1 / 256, small=True, repeats=1)
    rates = got["gbps_by_threads"]
    assert "1" in rates and all(r > 0 for r in rates.values()) and got["raw_feed_gbps"] == max(rates.values())
    files = got["operand_bytes"] // got["chunk_bytes"]
    assert files > 1 and calls and all(c[0] == files and c[3] == "none" for c in calls)
    assert {c[1] for c in calls[1:]} == {int(t) for t in rates}  # after the read into the page cache
    assert not list(tmp_path.glob("blocklin-rawfeed-*"))  # its store is removed


def test_the_roofline_rates_are_measured_cached_and_used_by_reports(gc, standin, tmp_path):
    got = gc.roofline_rates("gpu", str(tmp_path), dry_run=True, feed_gib=1 / 256)
    rates = R.load_rates(f"gpu {gpu_name()}")
    assert rates.to_dict() == got["rates"] and rates.key == R.machine_key(f"gpu {gpu_name()}")
    assert rates.raw_feed_gbps == got["raw_feed"]["raw_feed_gbps"] > 0
    assert min(rates.gpu_gflops, rates.gpu_gflops32, rates.gpu_gflops_tf32) > 0
    assert cupy_standin.STATE.counts.get("cublas.gemm tf32", 0) > 0
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((128, 96)), rng.standard_normal((96, 64))
    r = bl.matmul(a, b, tmp_path / "c.zarr", device="gpu", memory="256KiB")
    # blocked float64 sums over k = 96: 4 k eps of |A||B| (tests/conftest.py gemm_tol)
    assert np.all(np.abs(r.to_numpy() - a @ b) <= 4 * 96 * np.finfo(float).eps * (np.abs(a) @ np.abs(b)))
    rl = r.report["roofline"]
    assert (rl["gflops"], rl["feed_gbps"]) == (rates.gpu_gflops, rates.raw_feed_gbps)
    assert rl["gflops_source"] == rl["feed_source"] == f"measured {rates.measured[:10]}"
    entry = {"roofline_seconds": 0.5, "roofline_efficiency": 0.25, "roofline": {**rl, "bound": "feed"}}
    assert gc._roof_text(entry) == "; roofline 0.5 s (measured rates, bound by feed): 25% of it"
    assert gc._roof_text({}) == "" and gc._roof(r.report)["roofline"] == rl
