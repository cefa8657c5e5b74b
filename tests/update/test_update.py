"""blocklin.update: results brought up to date from appended rows, checked against a recompute."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import blocklin as bl
from blocklin.errors import ParameterError
from support.tolerances import assert_gram, eps


def _stored(tmp_path, m=900, n=40, dtype=np.float64, seed=0, chunks=(128, 40)):
    a = np.random.default_rng(seed).standard_normal((m, n)).astype(dtype)
    bl.from_array(a, tmp_path / "A.zarr", chunks=chunks)
    return a, tmp_path / "A.zarr"


def _check_gram(g, a, dtype):
    """The update's bound: the Gram's (any summation order), plus one rounding of the stored old
    result in the result's dtype per update (``u ||A||_F^2``)."""
    a64 = a.astype(np.float64)
    assert_gram(g, a64.T @ a64, a, dtype=dtype, extra=eps(dtype) * float(np.linalg.norm(a64)) ** 2)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("memory", ["32MiB", "96KiB"])
def test_gram_update_matches_a_recompute(tmp_path, dtype, memory):
    a, path = _stored(tmp_path, n=100, dtype=dtype, chunks=(128, 100))
    g = bl.gram(path, tmp_path / "G.zarr", memory=memory)
    assert g.report["route"] == ("pass" if memory == "32MiB" else "tiles")
    rows = [np.random.default_rng(s).standard_normal((p, 100)).astype(dtype) for s, p in ((1, 77), (2, 300))]
    for r in rows:
        bl.append(path, r)
    u = bl.update(g.path, memory=memory)
    full = np.vstack([a] + rows)
    assert u.report["updated"]["rows_read"] == 377 and u.report["updated"]["rows_before"] == 900
    assert u.report["bytes_read"] >= 377 * 100 * np.dtype(dtype).itemsize
    r = bl.gram(path, tmp_path / "R.zarr", memory=memory)  # the recompute reads every row (as often)
    assert u.report["bytes_read"] < 0.5 * r.report["bytes_read"]
    got = u.to_numpy()
    assert got.dtype == dtype and np.array_equal(got, got.T)
    _check_gram(got, full, dtype)
    assert bl.update(g.path).report["current"]  # a second update has nothing to read


@pytest.mark.parametrize("scheduler", ["sync", "threads", "processes"])
def test_gram_update_on_every_scheduler(tmp_path, scheduler):
    a, path = _stored(tmp_path)
    g = bl.gram(path, tmp_path / "G.zarr", scheduler=scheduler)
    new = np.random.default_rng(5).standard_normal((250, 40))
    bl.append(path, new)
    got = bl.update(g.path, scheduler=scheduler).to_numpy()
    _check_gram(got, np.vstack([a, new]), np.float64)


def test_float64_update_equals_recompute_up_to_summation_order(tmp_path):
    """Old result plus new rows' sums, rounded once: the recompute sums the same rows in other groups."""
    a, path = _stored(tmp_path)
    g = bl.gram(path, tmp_path / "G.zarr")
    bl.append(path, np.random.default_rng(6).standard_normal((256, 40)))
    u = bl.update(g.path).to_numpy()
    r = bl.gram(path, tmp_path / "R.zarr").to_numpy()
    full = bl.open(path).to_numpy()
    assert_gram(u, r, full)


def test_what_cannot_be_updated_is_refused_with_the_recompute(tmp_path):
    a, path = _stored(tmp_path)
    gt = bl.gram(path, tmp_path / "GT.zarr", trans=True)
    p = bl.matmul(path, np.ones((40, 3)), tmp_path / "P.zarr")
    inmem = bl.gram(a, tmp_path / "GM.zarr")
    bl.append(path, np.ones((5, 40)))
    with pytest.raises(ParameterError, match="A A\\^T.*recompute it: blocklin gram A OUT --trans --overwrite"):
        bl.update(gt.path)
    with pytest.raises(ParameterError, match="a matmul result.*--overwrite"):
        bl.update(p.path)
    with pytest.raises(ParameterError, match="records none"):
        bl.update(inmem.path)


def test_inputs_changed_other_than_by_appends_are_refused(tmp_path):
    a, path = _stored(tmp_path)
    g = bl.gram(path, tmp_path / "G.zarr")
    bl.from_array(np.ones((950, 41)), path, chunks=(128, 41), overwrite=True)  # columns added
    with pytest.raises(ParameterError, match="columns 40 then, 41 now"):
        bl.update(g.path)
    bl.from_array(np.ones((950, 40)), path, chunks=(128, 40), overwrite=True)  # replaced: rows differ
    with pytest.raises(ParameterError, match="not by blocklin.append"):
        bl.update(g.path)
    bl.from_array(np.ones((10, 40)), path, chunks=(128, 40), overwrite=True)
    with pytest.raises(ParameterError, match="900 rows then, 10 now"):
        bl.update(g.path)
    assert np.array_equal(bl.open(g.path).to_numpy(), g.to_numpy())  # the result is untouched by a refusal


_KILL = textwrap.dedent("""
    import os, signal, sys
    import blocklin as bl
    import blocklin.linalg.products.gram as gm
    def killed(*args, **kw):  # the new rows are summed; killed as the result is written
        os.kill(os.getpid(), signal.SIGKILL)
    gm.write_block = killed
    bl.update(sys.argv[1], scheduler="sync")
""")


def test_sigkill_during_update_keeps_the_old_result_then_resume(tmp_path):
    a, path = _stored(tmp_path)
    g = bl.gram(path, tmp_path / "G.zarr")
    new = np.random.default_rng(7).standard_normal((300, 40))
    bl.append(path, new)
    before = g.to_numpy()
    p = subprocess.run([sys.executable, "-c", _KILL, str(g.path)], cwd=tmp_path)
    assert p.returncode == -9
    assert np.array_equal(bl.open(g.path).to_numpy(), before)  # the old result, whole
    assert any(f.startswith(".G.zarr.partial-") for f in os.listdir(tmp_path))
    u = bl.update(g.path, resume=True)
    _check_gram(u.to_numpy(), np.vstack([a, new]), np.float64)
    assert not any(f.startswith(".G.zarr.partial-") for f in os.listdir(tmp_path))


def test_append_and_update_on_s3(s3):
    base, opts = s3
    a = np.random.default_rng(8).standard_normal((500, 20))
    bl.from_array(a, f"{base}/A.zarr", chunks=(64, 20), storage_options=opts)
    g = bl.gram(f"{base}/A.zarr", f"{base}/G.zarr", storage_options=opts)
    new = np.random.default_rng(9).standard_normal((130, 20))
    m = bl.append(f"{base}/A.zarr", new, storage_options=opts)
    assert m.shape == (630, 20) and np.array_equal(m.to_numpy(), np.vstack([a, new]))
    u = bl.update(f"{base}/G.zarr", storage_options=opts)
    assert u.report["updated"]["rows_read"] == 130
    _check_gram(u.to_numpy(), np.vstack([a, new]), np.float64)
    assert bl.update(f"{base}/G.zarr", storage_options=opts).report["current"]
