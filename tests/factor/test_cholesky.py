"""Out-of-core Cholesky (blocklin.cholesky) against SciPy: dtypes, shapes, schedulers, resume, errors."""

from __future__ import annotations

import os

import numpy as np
import pytest
import scipy.linalg as sl

import blocklin as bl
from blocklin.errors import NotPositiveDefiniteError, ShapeError

DTYPES = [np.float32, np.float64]


def _spd(n, dtype, seed=0):
    rng = np.random.default_rng(seed)
    g = rng.standard_normal((n, n))
    return (g @ g.T / n + np.eye(n)).astype(dtype)


def _backward_error(a, low):
    """``||A - L L^T||_F / ||A||_F`` in float64."""
    l64 = low.astype(np.float64)
    return np.linalg.norm(a.astype(np.float64) - l64 @ l64.T) / np.linalg.norm(a.astype(np.float64))


def _bound(n, dtype):
    # Cholesky is backward stable: ||A - L L^T|| <= c n u ||A|| for an SPD A (Higham 2002, Thm 10.3);
    # c = 4 leaves room for the tile sums and for converting the stored factor.
    return 4 * n * np.finfo(dtype).eps


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n,tile", [(1, 32), (13, 32), (37, 32), (64, 32), (101, 32), (97, 97)])
@pytest.mark.parametrize("lower", [True, False])
def test_cholesky_matches_scipy(tmp_path, dtype, n, tile, lower):
    a = _spd(n, dtype, seed=n)
    f = bl.cholesky(a, tmp_path / "l.zarr", lower=lower, tile=tile, scheduler="sync")
    got = f[...]
    assert got.dtype == dtype and got.shape == (n, n)
    low = got if lower else got.T
    assert not np.triu(low, 1).any()
    assert _backward_error(a, low) <= _bound(n, dtype)
    ref = sl.cholesky(a.astype(np.float64), lower=True)
    # forward error: the factor is as accurate as cond(A) allows (cond <= a few here)
    assert np.abs(low - ref).max() <= 16 * _bound(n, dtype) * np.abs(ref).max()
    assert f.report["tasks"] == -(-n // tile) * (-(-n // tile) + 1) // 2
    assert f.provenance["operation"] == "cholesky"


def test_cholesky_reads_only_its_triangle(tmp_path):
    a = _spd(50, np.float64)
    junk = a + np.triu(np.full((50, 50), 7.0), 1)  # upper triangle garbage
    got = bl.cholesky(junk, tile=16, scheduler="sync")[...]
    np.testing.assert_allclose(got, sl.cholesky(a, lower=True), rtol=0, atol=1e-12)
    junk = a + np.tril(np.full((50, 50), 7.0), -1)
    got = bl.cholesky(junk, lower=False, tile=16, scheduler="sync")[...]
    np.testing.assert_allclose(got, sl.cholesky(a, lower=False), rtol=0, atol=1e-12)


def test_identical_bits_across_schedulers(tmp_path):
    a = bl.from_array(_spd(150, np.float64, seed=3), tmp_path / "a.zarr", chunks=(32, 32))
    outs = [bl.cholesky(a, tmp_path / f"{s}.zarr", scheduler=s, workers=2)[...]
            for s in ("sync", "threads", "processes")]
    for x in outs[1:]:
        np.testing.assert_array_equal(x, outs[0])


def test_not_positive_definite_names_pivot(tmp_path):
    a = _spd(70, np.float64, seed=4)
    a[45, 45] = -5.0  # a negative diagonal entry: a pivot at 45 at the latest
    with pytest.raises(NotPositiveDefiniteError) as e:
        bl.cholesky(a, tmp_path / "l.zarr", tile=16, scheduler="sync")
    assert e.value.pivot is not None and e.value.pivot <= 45
    msg = str(e.value)
    assert f"row/column {e.value.pivot}" in msg and "lam" in msg and "assume_a='gen'" in msg
    assert not (tmp_path / "l.zarr").exists()  # no output that looks finished
    assert not [p for p in os.listdir(tmp_path) if "partial" in p]


def test_not_positive_definite_across_processes(tmp_path):
    a = np.eye(40)
    a[33, 33] = 0.0
    with pytest.raises(NotPositiveDefiniteError, match="row/column 33"):
        bl.cholesky(a, tile=16, scheduler="processes")


def test_not_square_refused(tmp_path):
    with pytest.raises(ShapeError, match="square"):
        bl.cholesky(np.ones((3, 4)))


def test_resume_skips_finished_tiles(tmp_path):
    a = bl.from_array(_spd(100, np.float64, seed=5), tmp_path / "a.zarr", chunks=(25, 25))
    ref = bl.cholesky(a, tmp_path / "ref.zarr", scheduler="sync", tile=25)[...]
    # an interrupted run (its worker lost: the finished tiles stay) in the last diagonal tile
    import blocklin.linalg.factor.cholesky_tiles as bo
    from blocklin.errors import WorkerLostError

    calls = {"n": 0}
    real = bo._factor_diagonal

    def flaky(dev, acc, offset, spec):
        calls["n"] += 1
        if offset == 75 and calls["n"] < 10:
            raise WorkerLostError("lost")
        return real(dev, acc, offset, spec)

    bo._factor_diagonal = flaky
    try:
        with pytest.raises(WorkerLostError):
            bl.cholesky(a, tmp_path / "l.zarr", scheduler="sync", resume=True, tile=25)
    finally:
        bo._factor_diagonal = real
    partial = [p for p in os.listdir(tmp_path) if p.startswith(".l.zarr.partial")]
    assert not (tmp_path / "l.zarr").exists()
    f = bl.cholesky(a, tmp_path / "l.zarr", scheduler="sync", resume=True, tile=25)
    if partial:  # the interrupted run left its finished tiles: they are skipped
        assert f.report["skipped"] == 9
    np.testing.assert_array_equal(f[...], ref)


KILLED_CHILD = """
import sys, time
import blocklin as bl
import blocklin.linalg.factor.cholesky_tiles as bo
real = bo._factor_diagonal
def slow(dev, acc, offset, spec):
    if offset >= 50:
        time.sleep(30)  # the parent kills the process here
    return real(dev, acc, offset, spec)
bo._factor_diagonal = slow
bl.cholesky(sys.argv[1], sys.argv[2], scheduler="sync", resume=True, tile=25)
"""


def test_kill_and_resume(tmp_path):
    """A SIGKILLed run leaves its finished tiles; a rerun with resume=True skips them, same bits."""
    import subprocess
    import sys
    import time

    a = bl.from_array(_spd(100, np.float64, seed=6), tmp_path / "a.zarr", chunks=(25, 25))
    ref = bl.cholesky(a, tmp_path / "ref.zarr", scheduler="sync", tile=25)[...]
    out = tmp_path / "l.zarr"
    child = subprocess.Popen([sys.executable, "-c", KILLED_CHILD, a.path, str(out)])
    try:
        deadline = time.time() + 120
        done = []
        while time.time() < deadline and child.poll() is None:
            parts = list(tmp_path.glob(".l.zarr.partial-*/.blocklin-done"))
            done = [p for p in parts[0].iterdir() if p.name.startswith("chol-")] if parts else []
            if len(done) >= 7:  # columns 0 and 1 (4 + 3 tiles): the child now sleeps in the (2, 2) tile
                break
            time.sleep(0.2)
        assert len(done) == 7, "the child did not reach the slow tile"
    finally:
        child.kill()
        child.wait()
    assert not out.exists()
    f = bl.cholesky(a, out, scheduler="sync", resume=True, tile=25)
    assert f.report["skipped"] == 7  # every tile before the (2, 2) diagonal tile: columns 0 and 1
    np.testing.assert_array_equal(f[...], ref)
