"""blocklin.qr (tiled Householder and streaming TSQR routes) against NumPy/LAPACK."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

import blocklin as bl
from blocklin.cli.main import main
from blocklin.errors import BudgetError, ParameterError, WorkerLostError


def _signed(r):
    """LAPACK's R with its rows' signs flipped to a non-negative diagonal (blocklin's convention)."""
    d = np.sign(np.diag(r))
    d[d == 0] = 1
    return d[:, None] * r


def _check_r(a, r, dtype):
    m, n = a.shape
    eps = np.finfo(dtype).eps
    a64 = a.astype(np.float64)
    assert r.shape == (n, n) and r.dtype == dtype
    assert np.array_equal(r, np.triu(r)) and (np.diag(r) >= 0).all()
    # Householder QR is backward stable: R^T R = A^T A + E with ||E|| <= c m n u ||A||^2 (Higham 2002,
    # Thm. 19.4); 4 max(m, n) u covers the blocked sums in practice, as in the Cholesky tests.
    r64 = r.astype(np.float64)
    tol = 4 * max(m, n) * eps
    assert np.linalg.norm(r64.T @ r64 - a64.T @ a64) <= tol * np.linalg.norm(a64) ** 2
    # forward error of R: at most cond(A) times the backward error
    ref = _signed(np.linalg.qr(a64, mode="r"))
    assert np.linalg.norm(r64 - ref) <= tol * np.linalg.cond(a64) * np.linalg.norm(a64)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape,tile", [((1, 1), 32), ((13, 13), 32), ((37, 37), 8), ((64, 64), 16),
                                        ((101, 61), 16), ((130, 13), 32)],
                         ids=["1x1", "13-one-tile", "37-prime", "64-tile-multiple", "101x61", "130x13-tall"])
def test_tiled_qr_matches_numpy(tmp_path, dtype, shape, tile):
    m, n = shape
    a = np.random.default_rng(m + n).standard_normal(shape).astype(dtype)
    q, r = bl.qr(a, tmp_path / "r.zarr", q=tmp_path / "q.zarr", mode="reduced", method="tiled", tile=tile,
                 scheduler="sync")
    assert r.report["method"] == "tiled" and r.provenance["operation"] == "qr"
    _check_r(a, r[...], dtype)
    q64, r64, a64 = q[...].astype(np.float64), r[...].astype(np.float64), a.astype(np.float64)
    eps = np.finfo(dtype).eps
    assert q.shape == (m, n) and q.dtype == dtype
    # ||A - Q R|| <= c m n u ||A|| and ||Q^T Q - I|| <= c m n u (Higham 2002, Thm. 19.4 and 19.13)
    assert np.linalg.norm(a64 - q64 @ r64) <= 4 * max(m, n) * eps * np.linalg.norm(a64)
    assert np.linalg.norm(q64.T @ q64 - np.eye(n)) <= 4 * max(m, n) * eps


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_tsqr_route_for_r_alone(dtype):
    a = np.random.default_rng(3).standard_normal((300, 23)).astype(dtype)
    r = bl.qr(a, memory="4MiB", scheduler="sync")
    assert r.report["method"] == "tsqr" and "fits in core" in r.report["method_reason"]
    _check_r(a, r[...], dtype)
    t = bl.qr(a, method="tiled", tile=8, scheduler="sync")
    # both routes give the R with a non-negative diagonal
    np.testing.assert_allclose(t[...], r[...], rtol=0, atol=4 * 300 * np.finfo(dtype).eps * np.abs(a).max() * 23)


def test_auto_goes_tiled_when_r_exceeds_the_budget():
    a = np.random.default_rng(4).standard_normal((200, 200))
    r = bl.qr(a, memory="1MiB", scheduler="sync")  # R needs 5 n^2 floats = 1.5 MiB to hold and reduce
    assert r.report["method"] == "tiled" and "exceeds the budget" in r.report["method_reason"]
    assert r.report["plan"]["peak_memory"] <= 2**20
    _check_r(a, r[...], np.float64)
    b = np.random.default_rng(4).standard_normal((200, 100))
    r = bl.qr(b, memory="1MiB", scheduler="sync")  # R fits, but strips of 127 rows < 4 n: TSQR would refactor R
    assert r.report["method"] == "tiled" and "strip of 127 rows" in r.report["method_reason"]
    _check_r(b, r[...], np.float64)
    r = bl.qr(b, memory="1MiB", method="tiled", scheduler="sync")
    assert r.report["method"] == "tiled" and r.report["plan"]["peak_memory"] <= 2**20
    _check_r(b, r[...], np.float64)


def test_auto_falls_back_to_tiled_when_the_pass_is_refused(monkeypatch):
    import blocklin.linalg.factor.qr as qf

    def refused(*args, **kwargs):
        raise BudgetError("memory: the pass does not fit")

    monkeypatch.setattr(qf, "_tsqr", refused)
    a = np.random.default_rng(9).standard_normal((60, 20))
    r = bl.qr(a, scheduler="sync")
    assert r.report["method"] == "tiled" and "does not fit" in r.report["method_reason"]
    _check_r(a, r[...], np.float64)
    with pytest.raises(BudgetError):
        bl.qr(a, method="tsqr")


def test_rank_deficient_warns_and_still_factors():
    a = np.random.default_rng(5).standard_normal((40, 6))
    a[:, 3] = 0.0
    with pytest.warns(UserWarning, match="rank-deficient"):
        q, r = bl.qr(a, mode="reduced", tile=4, method="tiled", scheduler="sync")
    assert r.report["diag_ratio"] == 0.0
    np.testing.assert_allclose(q[...] @ r[...], a, atol=1e-13)


def test_qr_identical_bits_across_schedulers(tmp_path):
    a = bl.from_array(np.random.default_rng(6).standard_normal((90, 70)), tmp_path / "a.zarr", chunks=(32, 32))
    outs = [bl.qr(a, mode="reduced", method="tiled", scheduler=s) for s in ("sync", "threads", "processes")]
    for q, r in outs[1:]:
        np.testing.assert_array_equal(r[...], outs[0][1][...])
        np.testing.assert_array_equal(q[...], outs[0][0][...])


def test_qr_resume_keeps_finished_panels(tmp_path):
    a = bl.from_array(np.random.default_rng(7).standard_normal((80, 64)), tmp_path / "a.zarr", chunks=(16, 16))
    ref_q, ref_r = bl.qr(a, tmp_path / "ref-r.zarr", q=tmp_path / "ref-q.zarr", mode="reduced", tile=16,
                         method="tiled", scheduler="sync")
    import blocklin.linalg.factor.householder as hh

    real = hh._reflectors
    state = {"calls": 0}

    def flaky(spec, work, k, dt):
        if k == 2 and spec.out.path == work.path:  # panel 3 applies panel 2's reflectors: lose it there
            raise WorkerLostError("lost")
        return real(spec, work, k, dt)

    hh._reflectors = flaky
    try:
        with pytest.raises(WorkerLostError):
            bl.qr(a, tmp_path / "r.zarr", q=tmp_path / "q.zarr", mode="reduced", tile=16, method="tiled",
                  scheduler="sync", resume=True)
    finally:
        hh._reflectors = real
    assert len([p for p in os.listdir(tmp_path) if p.startswith(".r.zarr.partial")]) == 1
    q, r = bl.qr(a, tmp_path / "r.zarr", q=tmp_path / "q.zarr", mode="reduced", tile=16, method="tiled",
                 scheduler="sync", resume=True)
    assert r.report["skipped"] == 3
    np.testing.assert_array_equal(r[...], ref_r[...])
    np.testing.assert_array_equal(q[...], ref_q[...])
    assert not [p for p in os.listdir(tmp_path) if ".partial" in p]


def test_qr_errors(tmp_path):
    with pytest.raises(BudgetError, match="m x m leading block of a wide A"):  # wide: its m x m block in memory
        bl.qr(np.ones((300, 400)), memory="64KiB")
    with pytest.raises(ParameterError, match="mode='reduced'"):
        bl.qr(np.eye(4), q=tmp_path / "q.zarr")
    with pytest.raises(ParameterError, match="'tsqr' returns R only"):
        bl.qr(np.eye(4), mode="reduced", method="tsqr")
    with pytest.raises(ParameterError, match="mode"):
        bl.qr(np.eye(4), mode="complete")
    with pytest.raises(BudgetError, match="memory"):
        bl.qr(np.ones((4000, 50)), mode="reduced", memory="64KiB")
    # no output, no partial store, no staged temporaries left behind
    assert not [p for p in tmp_path.rglob("*") if p.name != "blocklin-tmp"]


def test_cli_factor_qr(tmp_path, capsys):
    a = bl.from_array(np.random.default_rng(8).standard_normal((120, 50)), tmp_path / "a.zarr", chunks=(32, 32))
    assert main(["factor", "qr", a.path, "-o", str(tmp_path / "r.zarr"), "--q", str(tmp_path / "q.zarr"),
                 "--json", "--no-progress"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["method"] == "tiled" and out["q"] == str(tmp_path / "q.zarr")
    q, r = bl.open(tmp_path / "q.zarr")[...], bl.open(tmp_path / "r.zarr")[...]
    np.testing.assert_allclose(q @ r, a[...], atol=1e-12)
    assert main(["factor", "qr", a.path, "-o", str(tmp_path / "r2.zarr"), "--json", "--no-progress"]) == 0
    assert json.loads(capsys.readouterr().out)["method"] == "tsqr"
    assert main(["factor", "qr", a.path, "-o", str(tmp_path / "r3.zarr"), "--explain", "--memory", "1MiB"]) == 0
    assert "one streaming TSQR pass" in capsys.readouterr().out  # R alone fits
    assert main(["factor", "qr", a.path, "-o", str(tmp_path / "r3.zarr"), "--q", str(tmp_path / "q3.zarr"),
                 "--explain", "--memory", "1MiB", "--method", "tiled"]) == 0
    assert "column panels" in capsys.readouterr().out
    assert not (tmp_path / "r3.zarr").exists() and not (tmp_path / "q3.zarr").exists()


@pytest.mark.parametrize("memory", ["256KiB", "64MiB"])
@pytest.mark.parametrize("mode", ["r", "reduced"])
def test_wide_qr_as_numpy(tmp_path, memory, mode):
    """A wide A (m < n): R m x n upper trapezoidal, Q m x m, as numpy.linalg.qr(a, "reduced") (Dask's
    ``test_linalg.py::test_qr`` wide shapes; NumPy's ``TestQR`` ``(2, 3)`` case): Householder QR of the
    leading block, R_2 = Q^T A_2 by a GEMM; backward error as Householder QR's (support.tolerances)."""
    from support.tolerances import assert_factorization, assert_orthonormal

    a = np.random.default_rng(7).standard_normal((60, 700))
    res = bl.qr(a, tmp_path / "r.zarr", q=(tmp_path / "q.zarr") if mode == "reduced" else None, mode=mode,
                memory=memory)
    Q, R = res if mode == "reduced" else (None, res)
    r = R.to_numpy()
    assert r.shape == (60, 700) and np.array_equal(r, np.triu(r)) and np.all(np.diag(r) >= 0)
    assert R.report["method"] == "wide"
    q_ref, r_ref = np.linalg.qr(a)
    d = np.sign(np.diag(r_ref))
    # R is unique up to the row signs: against NumPy's, each computed with a Householder bound
    assert np.linalg.norm(r - d[:, None] * r_ref) <= 4 * 700 * np.finfo(float).eps * np.linalg.norm(a)
    if Q is not None:
        assert_orthonormal(Q.to_numpy())
        assert_factorization(a, Q.to_numpy() @ r, const=4.0)


@pytest.mark.parametrize("where", [(40, 650), (3, 5)], ids=["A_2", "leading block"])
@pytest.mark.parametrize("bad", [np.nan, -np.inf])
@pytest.mark.parametrize("mode", ["r", "reduced"])
def test_wide_qr_refuses_nonfinite_data_by_position(tmp_path, where, bad, mode):
    """NaN/Inf in a wide A is refused with its position, as on every other route. The leading block's QR
    reached the diagonal check, but a NaN right of column m went only through the GEMM R_2 = Q^T A_2,
    unchecked: R came back with a NaN column and no error (found by a randomized search)."""
    from blocklin.errors import NonFiniteError

    a = np.random.default_rng(7).standard_normal((60, 700))
    a[where] = bad
    src = bl.from_array(a, tmp_path / "a.zarr", chunks=(32, 32))
    with pytest.raises(NonFiniteError, match=rf"a: must be finite.*at \[{where[0]}, {where[1]}\]"):
        bl.qr(src, tmp_path / "r.zarr", q=(tmp_path / "q.zarr") if mode == "reduced" else None, mode=mode,
              memory="256KiB")
    assert not os.path.exists(tmp_path / "r.zarr") and not os.path.exists(tmp_path / "q.zarr")
