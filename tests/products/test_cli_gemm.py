"""CLI: gemm, demo; exit codes, JSON output, one-line errors."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

import blocklin as bl
from blocklin.cli.main import main


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "blocklin.cli.main", *args], capture_output=True, text=True,
                          timeout=300)


@pytest.fixture
def ab(tmp_path):
    rng = np.random.default_rng(3)
    a = rng.standard_normal((70, 50))
    b = rng.standard_normal((50, 60))
    return (a, b, bl.from_array(a, tmp_path / "a.zarr", chunks=(16, 16)).path,
            bl.from_array(b, tmp_path / "b.zarr", chunks=(16, 16)).path)


def test_gemm_json(tmp_path, ab, capsys):
    a, b, pa, pb = ab
    out = tmp_path / "c.zarr"
    assert main(["gemm", pa, pb, "-o", str(out), "--memory", "64KiB", "--json"]) == 0
    summary = json.loads(capsys.readouterr().out)
    for key in ("seconds", "flops", "bytes_read", "bytes_written", "peak_memory", "output"):
        assert key in summary
    assert summary["output"] == str(out)
    assert summary["flops"] == 2 * 70 * 60 * 50
    np.testing.assert_allclose(bl.open(out).to_numpy(), a @ b, atol=1e-12)


def test_gemm_options(tmp_path, ab, capsys):
    a, b, pa, pb = ab
    c0 = bl.from_array(np.ones((50, 50)), tmp_path / "c0.zarr").path
    assert main(["gemm", pa, pa, "-o", str(tmp_path / "c.zarr"), "--trans-a", "--c", c0, "--alpha", "2",
                 "--beta", "-1"]) == 0
    np.testing.assert_allclose(bl.open(tmp_path / "c.zarr").to_numpy(), 2 * a.T @ a - 1, atol=1e-11)
    capsys.readouterr()
    assert main(["gemm", pa, pb, "-o", str(tmp_path / "d.zarr"), "--explain", "--memory", "64KiB"]) == 0
    text = capsys.readouterr().out
    assert "GEMM plan" in text and "tiles" in text
    assert not (tmp_path / "d.zarr").exists()


def test_gemm_errors_are_one_line(tmp_path, ab):
    a, b, pa, pb = ab
    r = run_cli("gemm", pa, pa, "-o", str(tmp_path / "c.zarr"))
    assert r.returncode == 1
    assert "ShapeError" in r.stderr and "no broadcasting" in r.stderr and "Traceback" not in r.stderr
    r = run_cli("gemm", str(tmp_path / "missing.zarr"), pb, "-o", str(tmp_path / "c.zarr"))
    assert r.returncode == 1 and "does not exist" in r.stderr and "Traceback" not in r.stderr
    r = run_cli("gemm", pa, pb, "-o", pa, "--overwrite")
    assert r.returncode == 1 and "must differ from every input" in r.stderr
    r = run_cli("gemm", pa, pb, "-o", str(tmp_path / "c.zarr"), "--memory", "lots")
    assert r.returncode == 2 and "--memory" in r.stderr and "Fix" in r.stderr  # a usage error, found while parsing
    r = run_cli("gemm", pa, pa, "-o", str(tmp_path / "c.zarr"), "--debug")
    assert r.returncode == 1 and "Traceback" in r.stderr
    r = run_cli("gemm", pa, pb, "-o", str(tmp_path / "c.zarr"), "--json", "--memory", "1KiB")
    assert r.returncode == 1
    assert json.loads(r.stdout)["error"] == "BudgetError"


def test_gemm_refuses_existing_output(tmp_path, ab):
    a, b, pa, pb = ab
    out = str(tmp_path / "c.zarr")
    assert run_cli("gemm", pa, pb, "-o", out).returncode == 0
    r = run_cli("gemm", pa, pb, "-o", out)
    assert r.returncode == 1 and "--overwrite" in r.stderr
    assert run_cli("gemm", pa, pb, "-o", out, "--overwrite").returncode == 0


def test_demo_small(tmp_path):
    r = run_cli("demo", "--size", "768", "--memory", "2MiB", "--json", "--dir", str(tmp_path / "d"), "--keep")
    assert r.returncode == 0, r.stderr
    s = json.loads(r.stdout)
    assert s["verified"] is True
    assert s["matrix_bytes"] > s["memory_budget"]
    assert s["planned_peak_memory"] <= s["memory_budget"]
    assert (tmp_path / "d" / "C.zarr").exists()
    for key in ("seconds", "flops", "bytes_read", "bytes_written", "peak_memory", "output"):
        assert key in s


def test_no_command_prints_help():
    r = run_cli()
    assert r.returncode == 2 and "usage" in r.stderr.lower()
