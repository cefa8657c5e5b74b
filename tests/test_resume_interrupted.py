"""Resuming after Ctrl-C and SIGKILL: gemm, gram and solve give bit-identical results."""

from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import blocklin as bl


def _interrupt_after(monkeypatch, module, name, n):
    real, seen = getattr(module, name), [0]

    def dying(*args, **kwargs):
        seen[0] += 1
        if seen[0] > n:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(module, name, dying)


def test_gemm_resume_after_ctrl_c_left_a_partial_without_metadata(tmp_path, monkeypatch):
    # Ctrl-C stops the scheduler, not the tasks in flight: they may write chunks and markers into the
    # partial output after the abort removed it. A partial without array metadata is started over
    # (its markers may name removed chunks), instead of failing with "convert it first".
    import blocklin.linalg.gemm as gemm_mod

    rng = np.random.default_rng(0)
    a = bl.from_array(rng.standard_normal((256, 192)), tmp_path / "a.zarr", chunks=(32, 32))
    ref = bl.matmul(a, a, trans_a=True, c=None, memory="256KiB", scheduler="sync", out_chunks=(32, 32)).to_numpy()
    out = tmp_path / "c.zarr"
    _interrupt_after(monkeypatch, gemm_mod, "gemm_tile", 5)
    with pytest.raises(KeyboardInterrupt):
        bl.matmul(a, a, out, trans_a=True, memory="256KiB", scheduler="sync", resume=True, out_chunks=(32, 32))
    monkeypatch.undo()
    (partial,) = [p for p in tmp_path.iterdir() if p.name.startswith(".c.zarr.partial")]
    assert len(list((partial / ".blocklin-done").iterdir())) == 5
    (partial / "zarr.json").unlink()  # what the removed-then-rewritten partial looks like
    shutil.rmtree(partial / "c")  # and the chunks the markers name are gone
    c = bl.matmul(a, a, out, trans_a=True, memory="256KiB", scheduler="sync", resume=True, out_chunks=(32, 32))
    assert c.report["skipped"] == 0 and np.array_equal(c.to_numpy(), ref)
    assert not partial.exists()


def test_gemm_resume_after_ctrl_c_continues(tmp_path, monkeypatch):
    import blocklin.linalg.gemm as gemm_mod

    rng = np.random.default_rng(1)
    a = bl.from_array(rng.standard_normal((256, 192)), tmp_path / "a.zarr", chunks=(32, 32))
    b = bl.from_array(rng.standard_normal((192, 160)), tmp_path / "b.zarr", chunks=(32, 32))
    ref = bl.matmul(a, b, memory="256KiB", scheduler="sync").to_numpy()
    _interrupt_after(monkeypatch, gemm_mod, "gemm_tile", 4)
    with pytest.raises(KeyboardInterrupt):
        bl.matmul(a, b, tmp_path / "c.zarr", memory="256KiB", scheduler="sync", resume=True)
    monkeypatch.undo()
    c = bl.matmul(a, b, tmp_path / "c.zarr", memory="256KiB", scheduler="sync", resume=True)
    assert c.report["skipped"] == 4 and np.array_equal(c.to_numpy(), ref)
