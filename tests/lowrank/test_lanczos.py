"""blocklin.eigsh (block Lanczos) against scipy.linalg.eigh; the Lanczos core on its own."""

from __future__ import annotations

import json

import numpy as np
import pytest
import scipy.linalg

import blocklin as bl
from blocklin.errors import ConvergenceWarning, NonFiniteError, ShapeError
from blocklin.errors import NotSymmetricError
from blocklin.linalg.lowrank.lanczos import block_lanczos


def sym(n: int, eigs: np.ndarray, dtype=np.float64, seed: int = 0) -> np.ndarray:
    q, _ = np.linalg.qr(np.random.default_rng(seed).standard_normal((n, n)))
    a = (q * eigs) @ q.T
    a = (a + a.T) / 2
    return a.astype(dtype)


def projector_close(v: np.ndarray, ref: np.ndarray, tol: float) -> None:
    p = v.astype(np.float64) @ v.T.astype(np.float64)
    pr = ref @ ref.T
    assert np.abs(p - pr).max() < tol


@pytest.mark.parametrize("which", ["LA", "SA", "LM"])
def test_eigsh_out_of_core_float64(which):
    n = 400
    eigs = np.concatenate([np.linspace(-30, -10, 5), np.linspace(-1, 1, n - 10), np.linspace(10, 20, 5)])
    a = sym(n, eigs)
    res = bl.eigsh(a, 4, which=which, seed=1, memory="1280KiB", tol=1e-10)
    w, v = res
    assert not res.report["in_core"] and res.report["passes"] == res.report["lanczos_steps"]
    ref_w, ref_v = scipy.linalg.eigh(a)
    idx = {"LA": np.argsort(-ref_w)[:4], "SA": np.argsort(ref_w)[:4], "LM": np.argsort(-np.abs(ref_w))[:4]}[which]
    np.testing.assert_allclose(w, np.sort(ref_w[idx]), rtol=1e-9, atol=1e-9)
    assert np.all(np.diff(w) >= 0)  # ascending, like SciPy
    projector_close(v, ref_v[:, idx], 1e-7)
    assert max(res.report["residuals"]) <= 1e-10 * 30 * 1.01


def test_eigsh_float32_repeated_eigenvalues():
    n = 300
    eigs = np.concatenate([[9.0, 9.0, 9.0, 5.0, 5.0], np.linspace(0, 1, n - 5)])
    a = sym(n, eigs, np.float32, seed=2)
    w, v = bl.eigsh(a, 5, seed=0, memory="1088KiB")
    assert w.dtype == np.float32 and v.dtype == np.float32
    np.testing.assert_allclose(w, [5, 5, 9, 9, 9], rtol=1e-4)
    ref_w, ref_v = scipy.linalg.eigh(a.astype(np.float64))
    projector_close(v, ref_v[:, -5:], 1e-3)


def test_eigsh_in_core_reads_once():
    a = sym(100, np.linspace(0, 10, 100))
    res = bl.eigsh(a, 3, seed=0, memory="64MiB")
    assert res.report["in_core"] and res.report["passes"] == 1
    np.testing.assert_allclose(res.w, np.linspace(0, 10, 100)[-3:], rtol=1e-9)


def test_eigsh_rejects_non_symmetric_and_non_square():
    rng = np.random.default_rng(0)
    a = sym(200, np.linspace(1, 2, 200))
    a[3, 150] += 1e-3  # one asymmetric entry
    with pytest.raises(NotSymmetricError, match="symmetric.*asymmetry.*Fix"):
        bl.eigsh(a, 3, memory="640KiB", seed=0)
    with pytest.raises(NotSymmetricError):
        bl.eigsh(a, 3, memory="64MiB", seed=0)  # in core, same check
    with pytest.raises(ShapeError, match="square"):
        bl.eigsh(rng.standard_normal((30, 20)), 3)
    with pytest.raises(ValueError, match="k"):
        bl.eigsh(sym(20, np.arange(20.0)), 20)
    with pytest.raises(ValueError, match="which"):
        bl.eigsh(sym(20, np.arange(20.0)), 2, which="BE")
    b = sym(200, np.linspace(1, 2, 200))
    b[5, 5] = np.nan
    with pytest.raises(NonFiniteError):
        bl.eigsh(b, 2, memory="640KiB")


def test_eigsh_unreachable_tol_warns():
    a = sym(300, np.linspace(0, 1, 300))  # no gap: slow convergence
    with pytest.warns(ConvergenceWarning, match="reached a relative residual of"):
        res = bl.eigsh(a, 6, tol=1e-14, max_passes=3, memory="1088KiB", seed=0)
    assert res.report["passes"] == 3 and not res.report["converged"]


def test_block_lanczos_matches_eigh_with_restarts():
    rng = np.random.default_rng(3)
    n = 200
    q, _ = np.linalg.qr(rng.standard_normal((n, n)))
    lam = 1.0 / (1 + np.arange(n))
    a = (q * lam) @ q.T
    calls = []

    def apply(x, step):
        calls.append(step)
        return a @ x

    res = block_lanczos(apply, n, 6, which="LA", block=4, max_basis=24, max_steps=200,
                        threshold=lambda th: np.full(th.shape, 1e-10), seed=0)
    assert res.converged and res.restarts > 0
    np.testing.assert_allclose(np.sort(res.values), np.sort(lam[:6]), rtol=1e-9)
    assert len(calls) == res.steps


def test_cli_eigs(tmp_path, capsys):
    from blocklin.cli.main import main

    a = sym(200, np.linspace(0, 5, 200))
    bl.from_array(a, tmp_path / "s.zarr", chunks=(50, 200))
    rc = main(["eigs", str(tmp_path / "s.zarr"), "-k", "3", "-o", str(tmp_path / "e.zarr"), "--memory", "640KiB",
               "--json", "--seed", "0"])
    assert rc == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    np.testing.assert_allclose(out["w"], np.linspace(0, 5, 200)[-3:][::-1], rtol=1e-6)  # largest first, as svd
    import zarr

    g = zarr.open_group(str(tmp_path / "e.zarr"), mode="r")
    assert g["V"].shape == (200, 3) and g["w"].shape == (3,)
    assert g.attrs["blocklin"]["report"]["passes"] == out["passes"]
    b = np.triu(a) + 0.5  # not symmetric
    bl.from_array(b, tmp_path / "b.zarr")
    rc = main(["eigs", str(tmp_path / "b.zarr"), "-k", "3", "-o", str(tmp_path / "f.zarr")])
    assert rc == 1 and "NotSymmetricError" in capsys.readouterr().err
