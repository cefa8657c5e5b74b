"""blocklin.svd against scipy.linalg.svd on matrices with known spectra (sign-free comparisons)."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest
import scipy.linalg

import blocklin as bl
from blocklin.errors import ConvergenceWarning, NonFiniteError
from blocklin.linalg.blocks.orth import orthonormalize
from blocklin.plan.svd import svd_passes
from support.tolerances import assert_singular_values

SPECTRA = {
    "fast": lambda r: 2.0 ** -np.arange(r),
    "slow": lambda r: 1.0 / (1.0 + np.arange(r)),
    "flat_tail": lambda r: np.maximum(np.exp(-np.arange(r) / 4.0), 1e-3),
    "repeated": lambda r: np.concatenate([[5.0] * 3, [3.0] * 3, 0.8 ** np.arange(1, r - 5)]),
}


def make(m: int, n: int, spectrum: str, dtype=np.float64, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    r = min(m, n)
    s = SPECTRA[spectrum](r)
    u, _ = np.linalg.qr(rng.standard_normal((m, r)))
    v, _ = np.linalg.qr(rng.standard_normal((n, r)))
    return ((u * s) @ v.T).astype(dtype), s


def dense(x) -> np.ndarray:
    return np.asarray(x)


def best_rank_k(a: np.ndarray, k: int) -> np.ndarray:
    u, s, vt = scipy.linalg.svd(a.astype(np.float64), full_matrices=False)
    return (u[:, :k] * s[:k]) @ vt[:k]


def check_factors(a, res, k, s_ref, *, s_rtol, rec_rtol, dtype):
    U, s, Vt = (dense(x) for x in res)
    m, n = a.shape
    assert U.shape == (m, k) and s.shape == (k,) and Vt.shape == (k, n)
    assert U.dtype == dtype and Vt.dtype == dtype and s.dtype == dtype
    orth_tol = 50 * np.finfo(dtype).eps ** 0.5 if dtype == np.float32 else 1e-8
    assert np.abs(U.T.astype(np.float64) @ U - np.eye(k)).max() < orth_tol
    assert np.abs(Vt.astype(np.float64) @ Vt.T - np.eye(k)).max() < orth_tol
    assert np.all(np.diff(s.astype(np.float64)) <= 1e-6 * s[0])
    np.testing.assert_allclose(s, s_ref[:k], rtol=s_rtol, atol=s_rtol * s_ref[0])
    ak = best_rank_k(a, k)
    rec = (U.astype(np.float64) * s) @ Vt
    assert np.linalg.norm(rec - ak) <= rec_rtol * np.linalg.norm(ak)


# k at a spectral gap (the best rank-k approximation is unique there)
K_FOR = {"fast": 6, "slow": 6, "flat_tail": 6, "repeated": 6}


@pytest.mark.parametrize("spectrum", list(SPECTRA))
@pytest.mark.parametrize("method", ["rsvd", "lanczos", "gram"])
def test_accuracy_tall_float64_out_of_core(spectrum, method):
    a, s = make(1500, 90, spectrum)
    k = K_FOR[spectrum]
    kw = {"power_iters": 8} if method == "rsvd" else {"tol": 1e-10}
    res = bl.svd(a, k, method=method, seed=3, memory="512KiB", **kw)
    assert not res.report["in_core"]
    check_factors(a, res, k, s, s_rtol=1e-7, rec_rtol=1e-6, dtype=np.float64)
    assert max(res.report["relative_residuals"]) < 1e-5


@pytest.mark.parametrize("spectrum", ["fast", "flat_tail"])
@pytest.mark.parametrize("method", ["rsvd", "sketch", "lanczos", "gram"])
def test_accuracy_wide_float32(spectrum, method):
    a, s = make(70, 1300, spectrum, np.float32, seed=1)
    k = 5
    kw = {"oversample": 30} if method == "sketch" else {}
    memory = {"sketch": "1MiB", "gram": "384KiB"}.get(method, "256KiB")  # gram: the 70 x 70 Gram and its eigh
    res = bl.svd(a, k, method=method, seed=4, memory=memory, **kw)
    assert not res.report["in_core"]
    assert isinstance(res.Vt, bl.Matrix) and isinstance(res.U, np.ndarray)
    tol = 1e-3 if method != "sketch" else 2e-2
    check_factors(a, res, k, s, s_rtol=tol, rec_rtol=10 * tol, dtype=np.float32)


def test_sketch_fast_decay_float64_tall():
    a, s = make(2000, 100, "fast", seed=2)
    res = bl.svd(a, 5, method="sketch", seed=0, memory="512KiB")
    # the sketch's error follows the tail beyond its sketch size (2^-15 here)
    check_factors(a, res, 5, s, s_rtol=5e-4, rec_rtol=5e-4, dtype=np.float64)
    assert res.report["residuals"] is None and "pass" in res.report["residual_note"]
    assert res.report["passes"] == 1


def test_square_in_core_read_once():
    a, s = make(120, 120, "flat_tail", seed=5)
    for method in ("rsvd", "sketch", "lanczos", "gram"):
        res = bl.svd(a, 4, method=method, seed=1, memory="64MiB")
        assert res.report["in_core"] and res.report["passes"] == 1
        assert res.report["bytes_read"] == a.nbytes
        assert isinstance(res.U, bl.Matrix) and isinstance(res.Vt, np.ndarray)  # the same types as streamed
        np.testing.assert_allclose(res.s, s[:4], rtol=1e-6 if method != "sketch" else 0.15)


@pytest.mark.parametrize("q", [0, 1, 3])
def test_rsvd_pass_formula(q):
    a, _ = make(1200, 60, "fast")
    res = bl.svd(a, 4, power_iters=q, seed=0, memory="256KiB")
    assert res.report["passes"] == q + 1 == svd_passes("rsvd", in_core=False, power_iters=q)
    assert res.report["intermediate_passes"] == 2  # CholeskyQR2 refinement + writing U
    assert res.report["passes_total"] == q + 3
    assert res.report["bytes_read"] >= (q + 1) * a.nbytes


def test_lanczos_and_sketch_pass_formulas():
    a, _ = make(1200, 60, "flat_tail")
    r = bl.svd(a, 4, method="lanczos", seed=0, memory="256KiB").report
    assert r["passes"] == r["lanczos_steps"] + 1 == svd_passes("lanczos", in_core=False, lanczos_steps=r["lanczos_steps"])
    # the final Rayleigh-Ritz step orthonormalizes the stored B V: one refinement pass and the write of U
    assert r["passes_total"] == r["passes"] + 2 == r["passes"] + r["intermediate_passes"]
    r = bl.svd(a, 4, method="sketch", seed=0, memory="256KiB").report
    assert r["passes"] == 1 and r["passes_total"] == 3


def test_deterministic_across_budgets_and_schedulers():
    a, _ = make(1500, 80, "slow", seed=7)
    base = bl.svd(a, 5, seed=11, memory="512KiB")
    again = bl.svd(a, 5, seed=11, memory="512KiB", scheduler="sync")
    np.testing.assert_array_equal(base.s, again.s)
    other = bl.svd(a, 5, seed=11, memory="2MiB")  # different strips, same random numbers
    # another strip height sums in another order: Weyl's bound on the rounding (the Gram route's if taken)
    gram = base.report["method"] == "gram"
    assert_singular_values(other.s, base.s, n=a.shape[0], gram=gram)
    np.testing.assert_allclose(np.abs(dense(other.U)), np.abs(dense(base.U)), atol=1e-10)
    in_core = bl.svd(a, 5, seed=11, memory="64MiB")
    assert_singular_values(in_core.s, base.s, n=a.shape[0], gram=gram)
    assert in_core.report["in_core"]
    diff = bl.svd(a, 5, seed=12, memory="512KiB", power_iters=0)
    assert not np.array_equal(diff.s, base.s)


def test_out_group(tmp_path):
    a, s = make(900, 50, "fast")
    res = bl.svd(a, 3, out=tmp_path / "f.zarr", seed=0, memory="256KiB")
    import zarr

    g = zarr.open_group(str(tmp_path / "f.zarr"), mode="r")
    assert set(g.array_keys()) == {"U", "S", "Vt"}
    np.testing.assert_allclose(g["S"][:], s[:3], rtol=1e-6)
    assert g["U"].shape == (900, 3) and g["Vt"].shape == (3, 50)
    rep = g.attrs["blocklin"]["report"]
    assert rep["passes"] == res.report["passes"] and len(rep["residuals"]) == 3
    assert isinstance(res.U, bl.Matrix) and res.U.shape == (900, 3)


@pytest.mark.parametrize("k", [0, -1, 41, 2.5])  # 40 = min(m, n): every triplet (test_svd_full.py)
def test_bad_k(k):
    a, _ = make(200, 40, "fast")
    with pytest.raises((ValueError, TypeError), match="k"):
        bl.svd(a, k)


def test_budget_too_small_says_why():
    a, _ = make(1000, 80, "slow")
    with pytest.raises(bl.errors.BudgetError, match="in-core work"):
        bl.svd(a, 10, method="lanczos", memory="128KiB")


def test_bad_arguments():
    a, _ = make(200, 40, "fast")
    with pytest.raises(ValueError, match="method"):
        bl.svd(a, 3, method="qr")
    with pytest.raises(ValueError, match="power_iters"):
        bl.svd(a, 3, power_iters=-1)
    with pytest.raises(ValueError, match="tol"):
        bl.svd(a, 3, tol=0.0)


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_non_finite(bad):
    a, _ = make(600, 40, "fast")
    a[123, 7] = bad
    with pytest.raises(NonFiniteError, match=r"\[123, 7\]"):
        bl.svd(a, 3, memory="128KiB")
    with pytest.raises(NonFiniteError):
        bl.svd(a.T.copy(), 3, memory="128KiB")  # wide: column strips


def test_unreachable_tol_warns_with_what_was_reached():
    a, _ = make(1000, 80, "slow")
    with pytest.warns(ConvergenceWarning, match=r"worst: triplet \d+ \(s = [0-9.e+-]+\), relative residual "
                                                r"\|\|A\^T u - s v\|\| / s = [0-9.e+-]+"):
        res = bl.svd(a, 10, tol=1e-13, max_passes=2, seed=0, memory="320KiB")
    assert res.report["passes"] == 2 and not res.report["converged"]
    with pytest.warns(ConvergenceWarning, match="lanczos"):
        bl.svd(a, 10, method="lanczos", tol=1e-14, max_passes=3, seed=0, memory="768KiB")


def test_rsvd_adaptive_tol_converges():
    a, _ = make(1000, 80, "fast")
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConvergenceWarning)
        res = bl.svd(a, 5, tol=1e-8, seed=0, memory="256KiB")
    assert res.report["converged"] and max(res.report["relative_residuals"]) <= 1e-8
    assert res.report["passes"] <= 20


def test_orthonormalize_out_of_core_and_fallbacks(tmp_path):
    rng = np.random.default_rng(0)
    y = rng.standard_normal((3000, 12))
    q, r = orthonormalize(y, memory="128KiB")
    qd = dense(q)
    assert q.report["orth"]["method"] == "cholqr2"
    np.testing.assert_allclose(qd @ r, y, atol=1e-10)
    assert np.abs(qd.T @ qd - np.eye(12)).max() < 1e-12
    # cond(Y) ~ 1e12: the Gram matrix is numerically singular -> shifted CholeskyQR3 or TSQR
    u, _ = np.linalg.qr(rng.standard_normal((3000, 12)))
    v, _ = np.linalg.qr(rng.standard_normal((12, 12)))
    y = (u * np.logspace(0, -12, 12)) @ v.T
    q, r = orthonormalize(y, memory="128KiB")
    qd = dense(q)
    assert q.report["orth"]["method"] == "shifted-cholqr3"
    assert np.abs(qd.T @ qd - np.eye(12)).max() < 1e-12
    np.testing.assert_allclose(qd @ r, y, atol=1e-10)


def test_orthonormalize_in_core_returns_the_same_type():
    y = np.random.default_rng(3).standard_normal((200, 7))
    q, r = orthonormalize(y, memory="64MiB")  # fits: Householder QR of the block read once
    assert isinstance(q, bl.Matrix) and q.report["orth"]["method"].startswith("householder")
    qd = dense(q)
    assert np.abs(qd.T @ qd - np.eye(7)).max() < 1e-12
    assert np.all(np.diag(r) >= 0) and np.allclose(np.tril(r, -1), 0)
    np.testing.assert_allclose(qd @ r, y, atol=1e-12)


def test_cholqr_falls_back_to_tsqr():
    from blocklin.linalg.blocks.orth import cholqr_r
    from blocklin.linalg.blocks.tallblock import ArrayBlock as _ArrayBlock

    rng = np.random.default_rng(1)
    y = rng.standard_normal((500, 6)) @ np.diag(np.logspace(0, -8, 6))
    # a Gram matrix that no (shifted) Cholesky accepts forces the streaming TSQR path
    r, chain, info, base = cholqr_r(_ArrayBlock(y), -np.eye(6))
    assert info["method"] == "tsqr"
    q = base.apply_to(chain, None)
    assert np.abs(q.T @ q - np.eye(6)).max() < 1e-12
    np.testing.assert_allclose(q @ r, y, atol=1e-12)


def test_cli_svd_and_plot(tmp_path, capsys):
    from blocklin.cli.main import main

    a, s = make(800, 40, "fast")
    bl.from_array(a, tmp_path / "a.zarr", chunks=(100, 40))
    rc = main(["svd", str(tmp_path / "a.zarr"), "-k", "4", "-o", str(tmp_path / "f.zarr"), "--memory", "256KiB",
               "--seed", "1", "--json", "--plot", str(tmp_path / "s.png"), "--power-iters", "2"])
    assert rc == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["passes"] == 3 and len(out["residuals"]) == 4
    np.testing.assert_allclose(out["s"], s[:4], rtol=1e-6)
    assert (tmp_path / "s.png").stat().st_size > 1000
    rc = main(["svd", str(tmp_path / "a.zarr"), "-k", "41", "-o", str(tmp_path / "g.zarr")])  # 40: every triplet
    assert rc == 1 and "k: must satisfy" in capsys.readouterr().err
    assert not (tmp_path / "g.zarr").exists()


@pytest.mark.slow  # a LocalCluster of its own; svd on a cluster is also checked bit for bit in test_determinism
def test_distributed_matches_local():
    distributed = pytest.importorskip("distributed")
    a, _ = make(1500, 60, "flat_tail", seed=3)
    local = {m: bl.svd(a, 4, method=m, seed=5, memory="512KiB") for m in ("rsvd", "sketch", "lanczos", "gram")}
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as cl, \
            distributed.Client(cl) as client:
        for m, ref in local.items():
            res = bl.svd(a, 4, method=m, seed=5, memory="512KiB", scheduler=client)
            assert res.report["scheduler"] == "distributed"
            assert res.report["passes"] == ref.report["passes"]
            assert_singular_values(res.s, ref.s, n=a.shape[0], gram=m == "gram")
            np.testing.assert_allclose(dense(res.U), dense(ref.U), atol=1e-9)


@pytest.mark.gpu
@pytest.mark.parametrize("method", ["rsvd", "sketch", "lanczos", "gram"])
def test_gpu_matches_cpu(method):
    a, _ = make(3000, 120, "flat_tail", seed=9)
    cpu = bl.svd(a, 5, method=method, seed=2, memory="1MiB", device="cpu")
    gpu = bl.svd(a, 5, method=method, seed=2, memory="1MiB", device="gpu")
    assert gpu.report["device"] == "gpu" and gpu.report["passes"] == cpu.report["passes"]
    assert_singular_values(gpu.s, cpu.s, n=a.shape[0], gram=method == "gram")
    np.testing.assert_allclose(np.abs(dense(gpu.U)), np.abs(dense(cpu.U)), atol=1e-8)
    w = bl.eigsh(a.T @ a, 3, seed=0, memory="360KiB", device="gpu")
    np.testing.assert_allclose(w.w, np.sort(cpu.s[:3] ** 2), rtol=1e-8) if method == "lanczos" else None


def test_input_checked_for_non_finite_values_once_per_job(monkeypatch):
    """Every pass over A reads all of it: the first completed one checks it for NaN/Inf, later passes of
    the same job do not (each element is checked exactly once); check_finite=False checks none."""
    import blocklin.runtime.passes as passes

    checked, peaked = [], []
    real, real_peaks = passes.check_finite, passes._column_peaks
    monkeypatch.setattr(passes, "check_finite",  # A's strips only (the basis Y it writes is checked too)
                        lambda block, *a: (block.shape[1] == 60 and checked.append(block.size), real(block, *a)))
    # the first pass's column peaks stand in for the check where they are finite (max and min propagate NaN, Inf)
    monkeypatch.setattr(passes, "_column_peaks",
                        lambda v: (v.shape[1] == 60 and peaked.append(v.size), real_peaks(v))[1])
    a, s_ref = make(3000, 60, "slow")
    res = bl.svd(a, 5, method="lanczos", memory="256KiB", seed=0)
    assert res.report["passes"] >= 3 and not res.report["in_core"]
    assert sum(checked) == 0 and sum(peaked) == a.size
    np.testing.assert_allclose(res.s, s_ref[:5], rtol=1e-8)  # Lanczos default tolerance: s to ~sqrt(tol)
    checked.clear()
    bl.svd(a, 5, method="lanczos", memory="256KiB", seed=0, check_finite=False)
    assert checked == []
