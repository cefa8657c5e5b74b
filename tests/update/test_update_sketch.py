"""blocklin.update of a single-pass sketch kept with updatable=True (blocklin.linalg.update.sketch).

The updated state must be the state of the sketch of the grown matrix with the same seed up to the
order of its sums, so it is compared with a recompute's stored state within the rounding bounds of
those sums (Higham Thm 3.5: ``|fl(AB) - AB| <= gamma_k |A| |B|`` for any order, twice for two
computations). The singular values come from the same finishing step applied to the two states; they
are compared within ``c eps kappa s_1`` with ``kappa = cond(Phi Q) cond(Psi^T P)``, the condition of the
two least-squares problems that make the core (``cond(R)`` cancels: ``Q C P^T = Y (Phi Y)^+ Z ...``).
Measured ratios to ``eps kappa s_1`` are at most 0.27 (float64, streamed) and 0.02 (float32), so
``c = 8``. Both are also compared with LAPACK's SVD of the grown matrix within the sketch's own error
(Tropp, Yurtsever, Udell, Cevher 2019, Thm 5.1, with Weyl).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import blocklin as bl
from blocklin.cli.main import main
from blocklin.errors import ParameterError
from blocklin.linalg.blocks import random as rnd
from blocklin.linalg.lowrank.methods import psi_t
from blocklin.linalg.lowrank.updatable import SKETCH_CORE, SKETCH_GRAM, SKETCH_XT, SKETCH_Y
from support.tolerances import eps

M, N, K, SEED = 1200, 40, 5, 7


def _rows(rng, p, dtype):
    """Rows with singular values decaying as 0.5^i (a sketch of k + oversample = 15 columns leaves a
    tail near 0.5^15 s_1)."""
    basis = np.linalg.qr(np.random.default_rng(99).standard_normal((N, N)))[0]
    return ((rng.standard_normal((p, N)) * 0.5 ** np.arange(N)) @ basis.T).astype(dtype)


def _stored(tmp_path, dtype, appends=(97,)):
    rng = np.random.default_rng(1)
    a = _rows(rng, M, dtype)
    bl.from_array(a, tmp_path / "A.zarr", chunks=(256, N))
    return a, [_rows(rng, p, dtype) for p in appends], tmp_path / "A.zarr"


def _gamma(k, dtype):
    u = eps(dtype) / 2
    return k * u / (1 - k * u)


def _state(path):
    return {name: bl.open(path / name).to_numpy().astype(np.float64)
            for name in (SKETCH_XT, SKETCH_CORE, SKETCH_GRAM, SKETCH_Y)}


def _state_bounds(b, kp, s, dtype):
    """Entry-wise bounds on the difference of two computations of each sum over the rows of ``b``."""
    m, n = b.shape
    ab = np.abs(b.astype(np.float64))
    op = np.abs(rnd.sketch_test_matrices(SEED, n, kp, s, dtype).astype(np.float64))
    ups = np.abs(rnd.row_test_rows(SEED, rnd.STREAM_UPSILON, kp).rows(0, m).astype(dtype).astype(np.float64))
    phi = np.abs(rnd.row_test_rows(SEED, rnd.STREAM_PHI, s).rows(0, m).astype(dtype).astype(np.float64))
    by = ab @ op  # |B| |[Omega Psi]|: Y and T are themselves rounded products
    return {SKETCH_XT: 2 * _gamma(m, dtype) * ab.T @ ups,
            SKETCH_CORE: 2 * _gamma(m + n, dtype) * phi.T @ by,
            SKETCH_GRAM: 2 * _gamma(m + n, dtype) * by[:, :kp].T @ by[:, :kp],
            SKETCH_Y: 2 * _gamma(n, dtype) * by[:, :kp]}


def _core_condition(state, kp):
    """``cond(Phi Q) cond(Psi^T P)`` of a state: the condition of the core's two least-squares solves."""
    r = np.linalg.qr(state[SKETCH_Y], mode="r")  # (float32's Gram of Y need not be positive definite)
    phiq = state[SKETCH_CORE][:, :kp] @ np.linalg.inv(r)
    p = np.linalg.qr(state[SKETCH_XT])[0]
    return np.linalg.cond(phiq) * np.linalg.cond(psi_t(SEED, state[SKETCH_CORE].shape[0], p))


def _sketch_error(s_ref, kp, s):
    """Tropp et al. 2019, Thm 5.1: ``E ||A - A_hat||_F^2 <= (1 + f(kp, s)) min_r (1 + f(r, kp)) tau_{r+1}^2``,
    ``f(r, k) = r / (k - r - 1)``; a singular value of ``A_hat`` moves by at most ``||A - A_hat||_2``
    (Weyl). Ten times the root of the expectation (Markov: exceeded with probability <= 1 %)."""
    tails = np.sqrt(np.cumsum((s_ref ** 2)[::-1])[::-1])  # tails[r] = tau_{r+1}
    expect = min((1 + kp / (s - kp - 1)) * (1 + r / (kp - r - 1)) * tails[r] ** 2 for r in range(kp - 1))
    return 10 * np.sqrt(expect)


def _check_against_recompute(tmp_path, res, grown, dtype, **kw):
    """The updated result against a recompute of the sketch (same seed, updatable) and LAPACK."""
    rec = bl.svd(tmp_path / "A.zarr", K, method="sketch", seed=SEED, out=tmp_path / "R.zarr", updatable=True,
                 overwrite=True, **kw)
    got, ref = _state(tmp_path / "F.zarr"), _state(tmp_path / "R.zarr")
    kp, s = rec.report["sketch_size"]
    bounds = _state_bounds(grown, kp, s, dtype)
    for name, bound in bounds.items():
        assert got[name].shape == ref[name].shape, name
        assert (np.abs(got[name] - ref[name]) <= bound).all(), (name, np.max(np.abs(got[name] - ref[name]) / bound))
    s1 = float(rec.s[0])
    kappa = _core_condition(ref, kp)
    assert np.abs(res.s.astype(np.float64) - rec.s).max() <= 8 * eps(dtype) * kappa * s1
    s_ref = np.linalg.svd(grown.astype(np.float64), compute_uv=False)
    assert np.abs(res.s.astype(np.float64) - s_ref[:K]).max() <= _sketch_error(s_ref, kp, s) + 4 * M * eps(dtype) * s1
    if res.U is not None:  # the same U up to signs, to the rounding the singular values show
        u, ur = res.U.to_numpy().astype(np.float64), rec.U.to_numpy().astype(np.float64)
        assert u.shape == (grown.shape[0], K)
        gaps = np.abs(np.diff(rec.s.astype(np.float64)))
        assert np.abs(np.abs(u) - np.abs(ur)).max() <= 64 * eps(dtype) * kappa * s1 / gaps.min()
    return bounds, got, ref


@pytest.mark.parametrize("dtype,memory", [(np.float64, None), (np.float32, None), (np.float64, "256KiB"),
                                          (np.float32, "256KiB")])
def test_update_after_one_append_is_the_sketch_of_the_grown_matrix(tmp_path, dtype, memory):
    kw = {"memory": memory} if memory else {}
    a, (new,), path = _stored(tmp_path, dtype)
    first = bl.svd(path, K, method="sketch", seed=SEED, out=tmp_path / "F.zarr", updatable=True, **kw)
    assert first.report["in_core"] is (memory is None) and first.report["passes"] == 1
    bl.append(path, new)
    res = bl.update(tmp_path / "F.zarr", **kw)
    r = res.report
    assert r["updated"]["rows_read"] == len(new) and r["updated"]["rows_before"] == M and r["passes"] == 1
    assert res.s.dtype == dtype and np.asarray(res.Vt).shape == (K, N)
    grown = np.vstack([a, new])
    bounds, got, ref = _check_against_recompute(tmp_path, res, grown, dtype, **kw)
    # the bound tells the right state from a wrong one: the appended rows sketched with the test
    # matrices' first rows (their index in the new rows, not in A) leave it
    kp = got[SKETCH_XT].shape[1]
    wrong = got[SKETCH_XT] + new.astype(np.float64).T @ (
        rnd.row_test_rows(SEED, rnd.STREAM_UPSILON, kp).rows(0, len(new)).astype(dtype)
        - rnd.row_test_rows(SEED, rnd.STREAM_UPSILON, kp).rows(M, M + len(new)).astype(dtype))
    assert not (np.abs(wrong - ref[SKETCH_XT]) <= bounds[SKETCH_XT]).all()
    stored = json.load(open(tmp_path / "F.zarr" / "zarr.json"))["attributes"]["blocklin"]
    assert stored["params"]["update"]["count"] == M + len(new) and len(stored["updates"]) == 1
    assert bl.update(tmp_path / "F.zarr").report["current"]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_two_appends_compose(tmp_path, dtype):
    a, news, path = _stored(tmp_path, dtype, appends=(97, 61))
    bl.svd(path, K, method="sketch", seed=SEED, out=tmp_path / "F.zarr", updatable=True, memory="256KiB")
    for new in news:
        bl.append(path, new)
        res = bl.update(tmp_path / "F.zarr")  # in memory now: the pass's strips differ, the numbers do not
        assert res.report["updated"]["rows_read"] == len(new) and res.report["passes"] == 1
    _check_against_recompute(tmp_path, res, np.vstack([a, *news]), dtype)
    stored = json.load(open(tmp_path / "F.zarr" / "zarr.json"))["attributes"]["blocklin"]
    assert [u["rows_read"] for u in stored["updates"]] == [97, 61]


def test_update_without_u(tmp_path):
    a, (new,), path = _stored(tmp_path, np.float64)
    bl.svd(path, K, method="sketch", seed=SEED, out=tmp_path / "F.zarr", updatable=True,
           return_singular_vectors="vh")
    bl.append(path, new)
    res = bl.update(tmp_path / "F.zarr")
    assert res.U is None and not (tmp_path / "F.zarr" / "U").exists()
    _check_against_recompute(tmp_path, res, np.vstack([a, new]), np.float64)


def test_update_of_data_near_overflow_keeps_its_power_of_two(tmp_path):
    """Entries near 1e210: the kept state is that of 2^-e A, and the new rows are divided by the same 2^e."""
    rng = np.random.default_rng(2)
    a, new = _rows(rng, 600, np.float64) * 2.0 ** 700, _rows(rng, 40, np.float64) * 2.0 ** 700
    bl.from_array(a, tmp_path / "A.zarr", chunks=(256, N))
    first = bl.svd(tmp_path / "A.zarr", K, method="sketch", seed=SEED, out=tmp_path / "F.zarr", updatable=True)
    e = first.report["scaling"]["exponent"]
    assert e > 600
    bl.append(tmp_path / "A.zarr", new)
    res = bl.update(tmp_path / "F.zarr", memory="256KiB")
    assert res.report["passes"] == 1 and res.report["scaling"] == {"exponent": e}
    rec = bl.svd(tmp_path / "A.zarr", K, method="sketch", seed=SEED, out=tmp_path / "R.zarr", updatable=True)
    kappa = _core_condition(_state(tmp_path / "R.zarr"), K + 10)
    assert np.abs(res.s - rec.s).max() <= 8 * eps(np.float64) * kappa * rec.s[0]


def test_update_recomputes_when_the_new_rows_leave_the_kept_scale(tmp_path):
    """Rows near 1e300 appended to data near 1: their sketch overflows at the kept state's scale, so the
    sketch is recomputed (scaled by its power of two), updatable again."""
    a, _, path = _stored(tmp_path, np.float64)
    bl.svd(path, K, method="sketch", seed=SEED, out=tmp_path / "F.zarr", updatable=True)
    bl.append(path, np.random.default_rng(5).standard_normal((30, N)) * 1e300)
    res = bl.update(tmp_path / "F.zarr")
    assert res.report["updated"]["how"].startswith("recomputed: the new rows' sketch leaves float64's range")
    assert np.isfinite(res.s).all() and res.report["scaling"]["exponent"] > 0
    assert bl.update(tmp_path / "F.zarr").report["current"]


def test_refusals(tmp_path):
    a, (new,), path = _stored(tmp_path, np.float64)
    wide = bl.from_array(np.ascontiguousarray(a[:30]), tmp_path / "W.zarr")  # 30 x 40
    with pytest.raises(ParameterError, match="updatable: needs a tall A"):
        bl.svd(wide, 3, method="sketch", out=tmp_path / "FW.zarr", updatable=True)
    with pytest.raises(ParameterError, match="updatable: keeps the single-pass sketch of A itself.*center=True"):
        bl.pca(path, K, method="sketch", out=tmp_path / "FP.zarr", updatable=True)
    with pytest.raises(ParameterError, match="centered or scaled sketch.*scale=True"):
        bl.svd(path, K, method="sketch", scale=True, out=tmp_path / "FS.zarr", updatable=True)
    with pytest.raises(ParameterError, match="updatable: needs out="):
        bl.svd(path, K, method="sketch", updatable=True)
    bl.svd(path, K, method="sketch", seed=SEED, out=tmp_path / "F.zarr")  # not updatable
    bl.append(path, new)
    with pytest.raises(ParameterError, match="computed without them.*updatable=True"):
        bl.update(tmp_path / "F.zarr")
    assert not any(f.startswith(".F") for f in os.listdir(tmp_path))


_KILL = textwrap.dedent("""
    import os, signal, sys
    import blocklin as bl
    import blocklin.linalg.update.sketch as sk
    def killed(*args, **kw):  # the new rows are sketched and Y appended; killed as the factors are made
        os.kill(os.getpid(), signal.SIGKILL)
    sk.sketch_finish = killed
    bl.update(sys.argv[1], scheduler="sync")
""")


def test_sigkill_during_update_keeps_the_old_result_then_resume(tmp_path):
    a, (new,), path = _stored(tmp_path, np.float64)
    old = bl.svd(path, K, method="sketch", seed=SEED, out=tmp_path / "F.zarr", updatable=True)
    bl.append(path, new)
    p = subprocess.run([sys.executable, "-c", _KILL, str(tmp_path / "F.zarr")], cwd=tmp_path)
    assert p.returncode == -9
    assert np.array_equal(bl.open(tmp_path / "F.zarr" / "S").to_numpy(), old.s)  # the old result, whole
    assert bl.open(tmp_path / "F.zarr" / SKETCH_Y).shape == (M, old.report["sketch_size"][0])
    assert any(f.startswith(".F.zarr.partial-") for f in os.listdir(tmp_path))
    res = bl.update(tmp_path / "F.zarr", resume=True)
    assert res.report["updated"]["rows_read"] == len(new)
    assert not any(f.startswith(".F.zarr.partial-") for f in os.listdir(tmp_path))
    _check_against_recompute(tmp_path, res, np.vstack([a, new]), np.float64)


def test_cli_sketch_updatable_then_update_and_info(tmp_path, capsys):
    a, (new,), path = _stored(tmp_path, np.float64)
    np.save(tmp_path / "new.npy", new)
    out = str(tmp_path / "F.zarr")
    assert main(["svd", str(path), "-k", str(K), "--method", "sketch", "--seed", str(SEED), "--updatable",
                 "-o", out]) == 0
    assert main(["append", str(path), str(tmp_path / "new.npy")]) == 0
    capsys.readouterr()
    assert main(["info", out, "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["current"]["current"] is False and info["current"]["updatable"]
    assert SKETCH_Y in info["arrays"]
    assert main(["update", out, "--json"]) == 0
    done = json.loads(capsys.readouterr().out)
    assert done["updated"]["rows_read"] == len(new) and len(done["s"]) == K and done["passes"] == 1
    assert main(["info", out]) == 0
    assert "current      yes" in capsys.readouterr().out
    _check_against_recompute(tmp_path, bl.update(out), np.vstack([a, new]), np.float64)


def test_sketch_update_on_s3(s3, tmp_path):
    """On an object store the kept Y is copied before the claim removes the old result."""
    base, opts = s3
    rng = np.random.default_rng(3)
    a, new = _rows(rng, 300, np.float64), _rows(rng, 30, np.float64)
    bl.from_array(a, f"{base}/A.zarr", chunks=(128, N), storage_options=opts)
    bl.svd(f"{base}/A.zarr", K, method="sketch", seed=SEED, out=f"{base}/F.zarr", updatable=True,
           storage_options=opts)
    bl.append(f"{base}/A.zarr", new, storage_options=opts)
    res = bl.update(f"{base}/F.zarr", storage_options=opts)
    assert res.report["updated"]["rows_read"] == 30
    rec = bl.svd(np.vstack([a, new]), K, method="sketch", seed=SEED, out=tmp_path / "R.zarr", updatable=True)
    kappa = _core_condition(_state(tmp_path / "R.zarr"), K + 10)
    assert np.abs(res.s - rec.s).max() <= 8 * eps(np.float64) * kappa * rec.s[0]
