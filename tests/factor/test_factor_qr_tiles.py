"""blocklin.qr's tile Householder QR (method="tiles") against NumPy/LAPACK."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

import blocklin as bl
from blocklin.cli.main import main
from blocklin.errors import WorkerLostError


def _signed(r):
    """LAPACK's R with its rows' signs flipped to a non-negative diagonal (blocklin's convention)."""
    d = np.sign(np.diag(r))
    d[d == 0] = 1
    return d[:, None] * r


def _check(a, q, r, dtype):
    """Householder QR is backward stable (Higham 2002, Thm. 19.4 and 19.13): ``A + E = Q R`` with
    ``||E|| <= c m n u ||A||`` and ``||Q^T Q - I|| <= c m n u``; the tile algorithm is a product of
    the same Householder reflectors grouped by tiles, so the same bound holds with a modest ``c``:
    ``4 max(m, n) u`` (as the column-panel tests). ``R`` against NumPy's: the forward error is at
    most ``cond(A)`` times the backward error."""
    m, n = a.shape
    eps = np.finfo(dtype).eps
    a64 = a.astype(np.float64)
    tol = 4 * max(m, n) * eps
    assert r.shape == (n, n) and r.dtype == dtype
    assert np.array_equal(r, np.triu(r)) and (np.diag(r) >= 0).all()
    r64 = r.astype(np.float64)
    assert np.linalg.norm(r64.T @ r64 - a64.T @ a64) <= tol * np.linalg.norm(a64) ** 2
    ref = _signed(np.linalg.qr(a64, mode="r"))
    cond = np.linalg.cond(a64)
    if np.isfinite(cond) and cond < 1 / eps:
        assert np.linalg.norm(r64 - ref) <= tol * cond * np.linalg.norm(a64)
    else:  # rank-deficient: R is not unique past the rank; |R| agrees only in the leading columns
        assert np.linalg.norm(np.abs(r64[:, :1]) - np.abs(ref[:, :1])) <= tol * np.linalg.norm(a64)
    if q is not None:
        q64 = q.astype(np.float64)
        assert q.shape == (m, n) and q.dtype == dtype
        assert np.linalg.norm(a64 - q64 @ r64) <= tol * np.linalg.norm(a64)
        assert np.linalg.norm(q64.T @ q64 - np.eye(n)) <= tol


SHAPES = [((1, 1), 32), ((13, 13), 32), ((37, 37), 8), ((64, 64), 16), ((67, 67), 16), ((101, 61), 16),
          ((130, 13), 32), ((96, 40), 16)]
IDS = ["1x1", "13-one-tile", "37-prime", "64-tile-multiple", "67-prime-many", "101x61", "130x13-tall",
       "96x40-three-row-tiles-per-column"]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape,tile", SHAPES, ids=IDS)
def test_tile_qr_matches_numpy(tmp_path, dtype, shape, tile):
    a = np.random.default_rng(sum(shape)).standard_normal(shape).astype(dtype)
    q, r = bl.qr(a, tmp_path / "r.zarr", q=tmp_path / "q.zarr", mode="reduced", method="tiles", tile=tile,
                 scheduler="sync")
    assert r.report["method"] == "tiles" and r.report["plan"]["operation"] == "qr-tiles"
    assert r.report["plan"]["tile"] == min(tile, shape[1])
    _check(a, q[...], r[...], dtype)
    # R alone: the same bits as with Q (Q is formed after R from the stored reflectors)
    r2 = bl.qr(a, method="tiles", tile=tile, scheduler="sync")
    np.testing.assert_array_equal(r2[...], r[...])


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_tile_qr_rank_deficient_columns(dtype):
    a = np.random.default_rng(5).standard_normal((45, 45)).astype(dtype)
    a[:, 7] = 0.0  # an exactly zero column in the first tile
    a[:, 30] = a[:, 2]  # a repeated column in a later tile
    with pytest.warns(UserWarning, match="rank-deficient"):
        q, r = bl.qr(a, mode="reduced", method="tiles", tile=16, scheduler="sync")
    assert r.report["diag_ratio"] < 100 * np.finfo(dtype).eps
    _check(a, q[...], r[...], dtype)


def test_q_strips_divide_the_tile():
    from blocklin.plan.qrtiles import plan_tile_qr, q_strip_width

    assert q_strip_width(1000, 96, 8, 4 * 96 * 96 * 8 + 2 * 1000 * 50 * 8) == 48  # 50 fit: 48 divides 96
    plan = plan_tile_qr(5000, 3000, np.float64, memory=2**23)
    assert plan.tile % plan.q_width == 0 and plan.peak_memory <= 2**23


def test_tile_qr_agrees_with_the_column_panels():
    a = np.random.default_rng(6).standard_normal((150, 150))
    tiles = bl.qr(a, method="tiles", tile=32, scheduler="sync")[...]
    panels = bl.qr(a, method="tiled", tile=32, scheduler="sync")[...]
    # both are the R with a non-negative diagonal: equal up to the forward error bound
    tol = 4 * 150 * np.finfo(float).eps * np.linalg.cond(a) * np.linalg.norm(a)
    assert np.linalg.norm(tiles - panels) <= tol


def test_auto_route_keeps_column_panels_and_tiles_on_request():
    sq = np.random.default_rng(7).standard_normal((120, 100))
    q, r = bl.qr(sq, mode="reduced", memory="1MiB", scheduler="sync")
    assert r.report["method"] == "tiled" and "Q requested" in r.report["method_reason"]
    assert "column panels" in r.report["method_reason"]
    _check(sq, q[...], r[...], np.float64)
    plan = bl.qr(sq, mode="reduced", memory="1MiB", method="tiles", explain=True)
    assert plan.operation == "qr-tiles" and plan.peak_memory <= 2**20
    assert "tile Householder QR on" in plan.explain()


def test_tile_qr_identical_bits_across_schedulers(tmp_path):
    a = bl.from_array(np.random.default_rng(9).standard_normal((90, 70)), tmp_path / "a.zarr", chunks=(32, 32))
    outs = [bl.qr(a, mode="reduced", method="tiles", scheduler=s) for s in ("sync", "threads", "processes")]
    for q, r in outs[1:]:
        np.testing.assert_array_equal(r[...], outs[0][1][...])
        np.testing.assert_array_equal(q[...], outs[0][0][...])


@pytest.mark.parametrize("fail_in", ["tpmqrt", "tpqrt", "q"])
def test_tile_qr_resume_identical_bits(tmp_path, fail_in):
    a = bl.from_array(np.random.default_rng(10).standard_normal((80, 64)), tmp_path / "a.zarr", chunks=(16, 16))
    ref_q, ref_r = bl.qr(a, tmp_path / "ref-r.zarr", q=tmp_path / "ref-q.zarr", mode="reduced", tile=16,
                         method="tiles", scheduler="sync")
    import blocklin.linalg.factor.qr_tiles as qt

    name = "tpmqrt" if fail_in != "tpqrt" else "tpqrt"
    real = getattr(qt, name)
    state = {"calls": 0}

    def flaky(*args, **kwargs):
        # in the middle of the factorization (the 7th call), or in forming Q (trans=False)
        if (fail_in != "q" and state["calls"] == 6) or (fail_in == "q" and kwargs.get("trans") is False):
            raise WorkerLostError("lost")
        state["calls"] += 1
        return real(*args, **kwargs)

    setattr(qt, name, flaky)
    try:
        with pytest.raises(WorkerLostError):
            bl.qr(a, tmp_path / "r.zarr", q=tmp_path / "q.zarr", mode="reduced", tile=16, method="tiles",
                  scheduler="sync", resume=True)
    finally:
        setattr(qt, name, real)
    assert len([p for p in os.listdir(tmp_path) if p.startswith(".r.zarr.partial")]) == 1
    assert not (tmp_path / "r.zarr").exists()
    q, r = bl.qr(a, tmp_path / "r.zarr", q=tmp_path / "q.zarr", mode="reduced", tile=16, method="tiles",
                 scheduler="sync", resume=True)
    assert r.report["skipped"] >= 6
    np.testing.assert_array_equal(r[...], ref_r[...])
    np.testing.assert_array_equal(q[...], ref_q[...])
    assert not [p for p in os.listdir(tmp_path) if ".partial" in p]


def test_tile_qr_input_unchanged_and_nonfinite(tmp_path):
    a = np.random.default_rng(11).standard_normal((40, 40))
    keep = a.copy()
    bl.qr(a, method="tiles", tile=16, scheduler="sync")
    np.testing.assert_array_equal(a, keep)
    a[33, 5] = np.nan
    with pytest.raises(Exception, match="finite"):
        bl.qr(a, tmp_path / "r.zarr", method="tiles", tile=16, scheduler="sync")
    assert not [p for p in os.listdir(tmp_path) if "r.zarr" in p]  # no output, no partial (the work stores' folder)


def test_cli_factor_qr_tiles(tmp_path, capsys):
    a = bl.from_array(np.random.default_rng(12).standard_normal((100, 100)), tmp_path / "a.zarr", chunks=(32, 32))
    assert main(["factor", "qr", a.path, "-o", str(tmp_path / "r.zarr"), "--q", str(tmp_path / "q.zarr"),
                 "--method", "tiles", "--json", "--no-progress"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["method"] == "tiles"
    q, r = bl.open(tmp_path / "q.zarr")[...], bl.open(tmp_path / "r.zarr")[...]
    _check(a[...], q, r, np.float64)
    assert main(["factor", "qr", a.path, "-o", str(tmp_path / "r2.zarr"), "--q", str(tmp_path / "q2.zarr"),
                 "--method", "tiles", "--explain", "--memory", "1MiB"]) == 0
    assert "tile Householder QR" in capsys.readouterr().out
