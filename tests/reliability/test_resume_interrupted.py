"""Resuming after Ctrl-C and SIGKILL: gemm, gram and solve give bit-identical results."""

from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import blocklin as bl

from support.interrupts import interrupt_after



def test_gemm_resume_after_ctrl_c_left_a_partial_without_metadata(tmp_path, monkeypatch):
    # Ctrl-C stops the scheduler, not the tasks in flight: they may write chunks and markers into the
    # partial output after the abort removed it. A partial without array metadata is started over
    # (its markers may name removed chunks), instead of failing with "convert it first".
    import blocklin.runtime.tiles as tiles_mod

    rng = np.random.default_rng(0)
    a = bl.from_array(rng.standard_normal((256, 192)), tmp_path / "a.zarr", chunks=(32, 32))
    ref = bl.matmul(a, a, trans_a=True, c=None, memory="96KiB", scheduler="sync", out_chunks=(32, 32)).to_numpy()
    out = tmp_path / "c.zarr"
    interrupt_after(monkeypatch, tiles_mod, "run_tile", 5)
    with pytest.raises(KeyboardInterrupt):
        bl.matmul(a, a, out, trans_a=True, memory="96KiB", scheduler="sync", resume=True, out_chunks=(32, 32))
    monkeypatch.undo()
    (partial,) = [p for p in tmp_path.iterdir() if p.name.startswith(".c.zarr.partial")]
    assert len(list((partial / ".blocklin-done").iterdir())) == 5
    (partial / "zarr.json").unlink()  # what the removed-then-rewritten partial looks like
    shutil.rmtree(partial / "c")  # and the chunks the markers name are gone
    c = bl.matmul(a, a, out, trans_a=True, memory="96KiB", scheduler="sync", resume=True, out_chunks=(32, 32))
    assert c.report["skipped"] == 0 and np.array_equal(c.to_numpy(), ref)
    assert not partial.exists()


def test_gemm_resume_after_ctrl_c_continues(tmp_path, monkeypatch):
    import blocklin.runtime.tiles as tiles_mod

    rng = np.random.default_rng(1)
    a = bl.from_array(rng.standard_normal((256, 192)), tmp_path / "a.zarr", chunks=(32, 32))
    b = bl.from_array(rng.standard_normal((192, 160)), tmp_path / "b.zarr", chunks=(32, 32))
    ref = bl.matmul(a, b, memory="96KiB", scheduler="sync").to_numpy()
    interrupt_after(monkeypatch, tiles_mod, "run_tile", 4)
    with pytest.raises(KeyboardInterrupt):
        bl.matmul(a, b, tmp_path / "c.zarr", memory="96KiB", scheduler="sync", resume=True)
    monkeypatch.undo()
    c = bl.matmul(a, b, tmp_path / "c.zarr", memory="96KiB", scheduler="sync", resume=True)
    assert c.report["skipped"] == 4 and np.array_equal(c.to_numpy(), ref)


KILL_SOLVE = """
import os, signal, sys
import numpy as np
import {module} as module
real = module.{victim}
def dying(*args, **kwargs):
    os.kill(os.getpid(), signal.SIG{sig})
module.{victim} = dying
import blocklin as bl
bl.solve(sys.argv[1], sys.argv[2], out=sys.argv[3], lam={lam!r}, refine=1, memory="2MiB", scheduler="sync"{extra})
"""


NORMAL, QR = "blocklin.linalg.solve.normal", "blocklin.linalg.solve.qr_route"  # where the victims are looked up


@pytest.mark.parametrize("lam,module,victim,extra,loaded", [
    (1e-3, NORMAL, "_run_residual_pass", "", ["gram-pass"]),
    ("gcv", NORMAL, "_run_residual_pass", "", ["gram-pass"]),
    ([1e-8, 1e-2], QR, "finish_spectral", ", method='qr'", ["tsqr-pass"]),
    (0.1, NORMAL, "_run_residual_pass", ", fit_intercept=True", ["gram-pass"]),
])
@pytest.mark.parametrize("sig", ["KILL", "INT"])
def test_solve_resume_is_bit_identical(tmp_path, lam, module, victim, extra, loaded, sig):
    rng = np.random.default_rng(4)
    a = bl.from_array(rng.standard_normal((900, 30)) + 3.0, tmp_path / "a.zarr", chunks=(128, 30))
    b = bl.from_array(rng.standard_normal((900, 2)), tmp_path / "b.zarr")
    kw = {"lam": lam, "refine": 1, "memory": "2MiB", "scheduler": "sync"}
    if "qr" in extra:
        kw["method"] = "qr"
    if "fit_intercept" in extra:
        kw["fit_intercept"] = True
    ref = bl.solve(a.path, b.path, out=tmp_path / "ref.zarr", **kw)
    out = tmp_path / "x.zarr"
    code = textwrap.dedent(KILL_SOLVE.format(module=module, victim=victim, sig=sig, lam=lam, extra=extra))
    proc = subprocess.run([sys.executable, "-c", code, a.path, b.path, str(out)], capture_output=True)
    assert proc.returncode != 0 and not out.exists()
    partials = [p for p in tmp_path.iterdir() if p.name.startswith(".x.zarr.partial")]
    assert len(partials) == 1  # Ctrl-C keeps the finished passes too (a solve is resumable)
    if sig == "INT":
        assert b"resume=True" in proc.stderr and b"blocklin clean" in proc.stderr
    x = bl.solve(a.path, b.path, out=out, resume=True, **kw)
    assert np.array_equal(x.to_numpy(), ref.to_numpy())
    assert x.report["resumed_passes"] == loaded
    assert x.report.get("passes", 0) < ref.report["passes"]
    if "fit_intercept" in kw:
        assert np.array_equal(x.intercept, ref.intercept)
