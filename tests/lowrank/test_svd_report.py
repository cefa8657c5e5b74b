"""Reports that tell the truth about each triplet, the default method, and eigsh's order and centering.

References: NumPy's dense SVD and ``eigh`` of the covariance on the same data.
"""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest

import blocklin as bl
from blocklin.errors import ConvergenceWarning
from support.tolerances import assert_ritz_values


def _pca_like(seed: int = 0) -> np.ndarray:
    """Samples with a large mean direction (s_1 about 20x s_2) over a slowly decaying spectrum."""
    rng = np.random.default_rng(seed)
    return rng.standard_normal((800, 60)) * np.linspace(1.0, 0.3, 60) + 5.0


def test_residuals_are_relative_to_each_triplets_own_singular_value():
    a = _pca_like()
    with pytest.warns(ConvergenceWarning, match=r"worst: triplet (\d+)"):
        # one power iteration: the trailing triplets are far from converged relative to themselves
        res = bl.svd(a, 8, power_iters=1, tol=1e-2, seed=0, memory="192KiB")
    r = res.report
    s, resid, rel = res.s.astype(np.float64), np.array(r["residuals"]), np.array(r["relative_residuals"])
    assert s[0] > 15 * s[1]  # the mean direction dominates
    # own singular value, not s_1: one quotient each, so relative to one rounding (2 eps: ours and this one)
    np.testing.assert_allclose(rel, resid / s, rtol=2 * np.finfo(np.float64).eps, atol=0)
    # the exact residual ||A^T u - s v|| per triplet from the dense data
    u, vt = res.U.to_numpy(), res.Vt
    np.testing.assert_allclose(resid, np.linalg.norm(a.T @ u - vt.T * s, axis=0), rtol=1e-6, atol=1e-12 * s[0])
    worst = int(np.argmax(rel))
    assert r["worst_triplet"]["index"] == worst + 1 and r["worst_triplet"]["relative_residual"] == rel[worst]
    assert r["converged_triplets"] == [bool(x <= 1e-2 * (1 + 1e-9)) for x in rel]
    assert not r["converged"] and not r["converged_triplets"][worst] and r["converged_triplets"][0]
    # relative to s_1 every triplet would look converged (as the issue saw: off by 0.2 of their own size)
    assert np.max(resid / s[0]) < 1e-2 and rel[worst] > 0.1


def test_cli_headline_names_the_worst_triplet(tmp_path, capsys):
    from blocklin.cli.main import main

    path = str(bl.from_array(_pca_like(), tmp_path / "a.zarr", chunks=(100, 60)).path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        assert main(["svd", path, "-k", "6", "-o", str(tmp_path / "f.zarr"), "--power-iters", "1", "--tol", "1e-2",
                     "--seed", "0", "--memory", "256KiB"]) == 0
    err = capsys.readouterr()
    text = err.out + err.err
    assert "worst triplet " in text and "NOT converged to tol 1.0e-02" in text
    assert main(["svd", path, "-k", "6", "-o", str(tmp_path / "g.zarr"), "--seed", "0", "--json"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["method"] == "gram" and all(out["converged_triplets"])
    assert out["worst_triplet"]["index"] == int(np.argmax(out["relative_residuals"])) + 1


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_default_is_lanczos_to_tol_and_accurate(dtype):
    a = (_pca_like(1) - 5.0).astype(dtype)
    exact = np.linalg.svd(a.astype(np.float64), compute_uv=False)[:5]
    res = bl.svd(a, 5, seed=0, memory="192KiB")
    r = res.report
    assert r["method"] == "lanczos" and r["method_requested"] == "auto" and r["converged"]
    eps = np.finfo(dtype).eps
    # the default residual tolerance targets the singular values: sqrt(10 sqrt(eps))
    assert r["tol"] == np.sqrt(10 * np.sqrt(eps)) and max(r["relative_residuals"]) <= r["tol"]
    # singular values to the documented target 10 sqrt(eps) relative (the square of the default tol)
    np.testing.assert_allclose(res.s, exact, rtol=10 * np.sqrt(eps))
    # an explicit tol still converges to it: residuals at 10 sqrt(eps), singular values then to within
    # the residual's square over the gap, plus the rounding of the products with A (Weyl)
    tight = bl.svd(a, 5, seed=0, memory="192KiB", tol=10 * np.sqrt(eps))
    assert tight.report["converged"] and max(tight.report["relative_residuals"]) <= 10 * np.sqrt(eps)
    assert tight.report["passes"] >= r["passes"]
    spectrum = np.linalg.svd(a.astype(np.float64), compute_uv=False)
    assert_ritz_values(tight.s, exact, spectrum=spectrum, residuals=np.asarray(tight.report["residuals"]),
                       n=a.shape[0], norm=spectrum[0], dtype=dtype)
    assert bl.svd(a, 5, seed=0, memory="192KiB", power_iters=3).report["method"] == "rsvd"  # a fixed cost


def test_eigsh_order_deprecation_and_svd_consistency():
    rng = np.random.default_rng(2)
    x = rng.standard_normal((150, 150))
    a = x + x.T + 30 * np.eye(150)  # positive definite: eigenpairs are the singular triplets
    with pytest.warns(FutureWarning, match="default order will become 'descending'"):
        w_default, _ = bl.eigsh(a, 4, seed=0)
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        w_asc, V_asc = bl.eigsh(a, 4, seed=0, order="ascending")
        w, V = bl.eigsh(a, 4, seed=0, order="descending")
    np.testing.assert_array_equal(w_default, w_asc)
    np.testing.assert_array_equal(w, w_asc[::-1])
    assert V.shape == (150, 4)  # columns, as svd's U
    U, s, Vt = bl.svd(a, 4, seed=0, tol=10 * np.sqrt(np.finfo(np.float64).eps))  # eigsh's default tol
    # both converged to tol relative residuals: Ritz values within residual^2 / gap of the exact ones
    exact = np.linalg.eigvalsh(a)
    for got in (w, s):  # same order as svd's s
        assert_ritz_values(got, exact[::-1][:4], spectrum=exact, residuals=10 * np.sqrt(np.finfo(np.float64).eps) * got,
                           n=150, norm=np.abs(exact).max())
    np.testing.assert_allclose(np.abs(V.T @ U.to_numpy()), np.eye(4), atol=1e-7)


@pytest.mark.parametrize("memory", ["256KiB", "64MiB"])
def test_eigsh_center_gives_the_covariance_eigenpairs(memory):
    a = _pca_like(3)
    cov = np.cov(a, rowvar=False)
    ew, ev = np.linalg.eigh(cov)
    ew, ev = ew[::-1][:4], ev[:, ::-1][:, :4]
    w, V = res = bl.eigsh(a, 4, center=True, seed=0, memory=memory, order="descending")
    # Ritz values to the residual^2 / gap; the centered products are rounded at the uncentered ||A||^2 / (m - 1)
    assert_ritz_values(w, ew, spectrum=np.linalg.eigvalsh(cov), residuals=10 * np.sqrt(np.finfo(np.float64).eps) * w,
                       n=a.shape[0], norm=np.linalg.norm(a, 2) ** 2 / (a.shape[0] - 1))
    gaps = np.abs(np.diff(np.r_[ew, np.linalg.eigvalsh(cov)[::-1][4]]))
    # the eigenvectors to the residual over the gap (tol 10 sqrt(eps) relative, Davis-Kahan)
    np.testing.assert_allclose(np.abs(np.sum(V * ev, axis=0)), 1.0, atol=1e-6 * ew[0] / gaps.min())
    np.testing.assert_allclose(cov @ V, V * w, atol=1e-6 * ew[0])
    assert res.report["center"] and len(res.report["residuals"]) == 4
    w_asc, _ = bl.eigsh(a, 4, center=True, seed=0, memory=memory, order="ascending")
    np.testing.assert_array_equal(w_asc, w[::-1])
    with pytest.raises(bl.errors.ParameterError, match="which"):
        bl.eigsh(a, 4, center=True, which="SA", order="descending")


@pytest.mark.parametrize("dtype", [np.float64, np.complex128])
def test_eigsh_budget_refusal_names_a_budget_that_runs(dtype, tmp_path):
    """A refused budget names one at which every step plans: the Lanczos state and the first step's
    pass (its symmetry check takes ``A X`` beside ``A^H X``: twice the columns for complex data). The
    complex minimum had named the in-core work alone, refused again by the pass."""
    rng = np.random.default_rng(0)
    g = rng.standard_normal((200, 200)) + (1j * rng.standard_normal((200, 200)) if dtype == np.complex128 else 0)
    q, _ = np.linalg.qr(g)
    s = (q * np.linspace(-5, 20, 200)) @ q.conj().T
    s = (s + s.conj().T) / 2
    with pytest.raises(bl.errors.BudgetError) as info:
        bl.eigsh(s, 3, order="descending", memory="64KiB", seed=0)
    got = bl.eigsh(s, 3, order="descending", memory=int(info.value.minimum), seed=0, temp_dir=str(tmp_path))
    assert got.report["converged"] and not got.report["in_core"]
    full = np.linalg.eigvalsh(s)
    assert_ritz_values(got.w, full[::-1][:3], spectrum=full, residuals=np.asarray(got.report["residuals"]), n=200,
                       norm=20.0)


@pytest.mark.parametrize("memory", [None, "192KiB"])
def test_fixed_cost_rsvd_is_judged_against_the_default_tol(memory):
    """``rsvd`` with a fixed ``power_iters`` and no ``tol``: ``converged`` says whether the measured residuals
    met the documented default ``tol = sqrt(10 sqrt(eps))``, not that nothing was checked (every triplet
    had read as converged, relative residuals of 0.07 included)."""
    a = _pca_like()
    kw = {"memory": memory} if memory else {}
    with pytest.warns(ConvergenceWarning, match="tol="):
        res = bl.svd(a, 8, power_iters=1, seed=0, **kw)
    r = res.report
    tol = np.sqrt(10 * np.sqrt(np.finfo(np.float64).eps))
    s, vt = res.s, res.Vt
    rel = np.linalg.norm(a.T @ res.U.to_numpy() - vt.T * s, axis=0) / s  # measured here, from the dense data
    assert rel.max() > 10 * tol  # one power pass leaves the trailing triplets far from converged
    assert r["tol"] == pytest.approx(tol, rel=1e-12)
    assert r["converged"] is False
    assert r["converged_triplets"] == [bool(x <= tol * (1 + 1e-9)) for x in r["relative_residuals"]]
    np.testing.assert_allclose(r["relative_residuals"], rel, rtol=1e-6)
    # converged where the residuals do meet it: a fast decay (0.5^i) within four power passes
    b = np.random.default_rng(1).standard_normal((800, 60)) * 0.5 ** np.arange(60)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConvergenceWarning)
        done = bl.svd(b, 8, power_iters=4, seed=0, **kw)
    assert done.report["converged"] is True and max(done.report["relative_residuals"]) <= tol
