"""blocklin.update of svd and pca results kept with updatable=True, against the SVD of the grown matrix."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest

import blocklin as bl
from blocklin.cli.main import main
from blocklin.errors import ConvergenceWarning, ParameterError
from support.placements import PLACEMENTS, placement_kwargs
from support.tolerances import assert_singular_values
from support.updated_factors import check_updated_factors

M, N, K = 2400, 48, 4


def _rows(rng, p, *, noise, dtype=np.float64, offset=3.0):
    """Rows of a rank-K signal (well separated singular values) plus noise, with column means of
    ``offset`` (an uncentered SVD of rank K wants 0: the means are a direction of their own)."""
    basis = np.linalg.qr(np.random.default_rng(99).standard_normal((N, N)))[0]
    signal = rng.standard_normal((p, K)) * np.array([40.0, 20.0, 10.0, 5.0])
    noise_part = noise * rng.standard_normal((p, N - K))
    return (np.hstack([signal, noise_part]) @ basis.T + offset).astype(dtype)


def _grown(tmp_path, *, noise, dtype=np.float64, p=120, offset=3.0):
    rng = np.random.default_rng(1)
    a = _rows(rng, M, noise=noise, dtype=dtype, offset=offset)
    bl.from_array(a, tmp_path / "A.zarr", chunks=(256, N))
    return a, _rows(rng, p, noise=noise, dtype=dtype, offset=offset), tmp_path / "A.zarr"


def _check_factors(res, x, *, center, dtype, u_errors=None):
    check_updated_factors(res, x, k=K, center=center, dtype=dtype, u_errors=u_errors)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("center", [False, True])
def test_update_rotates_the_scores_when_the_subspace_holds(tmp_path, dtype, center):
    a, new, path = _grown(tmp_path, noise=1e-6, dtype=dtype, offset=3.0 if center else 0.0)
    kw = dict(n_components=K) if center else dict(k=K)
    make = bl.pca if center else bl.svd
    make(path, **kw, out=tmp_path / "F.zarr", updatable=True)
    bl.append(path, new)
    res = bl.update(tmp_path / "F.zarr")
    r = res.report
    assert r["updated"]["scores"] == "rotated" and r["updated"]["rows_read"] == 120
    assert r["bytes_read"] < 0.5 * a.nbytes  # the old rows of A are not read (the stored scores are)
    assert r["converged"] and max(r["u_errors"]) <= r["tol"]
    _check_factors(res, np.vstack([a, new]), center=center, dtype=dtype, u_errors=r["u_errors"])
    stored = json.load(open(tmp_path / "F.zarr" / "zarr.json"))["attributes"]["blocklin"]
    assert stored["params"]["update"]["count"] == M + 120 and len(stored["updates"]) == 1
    assert bl.update(tmp_path / "F.zarr").report["current"]


def test_update_writes_the_scores_from_every_row_when_the_subspace_turns(tmp_path):
    a, new, path = _grown(tmp_path, noise=2.0)  # a heavy tail: new rows turn the subspace
    bl.pca(path, K, out=tmp_path / "F.zarr", updatable=True, scale=True)
    bl.append(path, new)
    res = bl.update(tmp_path / "F.zarr")
    assert res.report["updated"]["scores"] == "from every row" and res.report["updated"]["rows_read"] == M + 120
    x = np.vstack([a, new])
    xs = (x - x.mean(axis=0)) / x.std(axis=0)
    _check_factors(res, xs, center=True, dtype=np.float64)
    p = bl.pca(path, K, scale=True)  # a recompute: the same components
    assert np.linalg.norm(np.asarray(res.svd.Vt) - p.components_) <= 1e-8


def test_update_recomputes_where_the_gram_misses_tol(tmp_path):
    a, new, path = _grown(tmp_path, noise=1e-6, offset=0.0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)  # tol below the rounding: the first run warns too
        bl.svd(path, K, method="gram", tol=1e-15, out=tmp_path / "F.zarr", updatable=True)
        bl.append(path, new)
        res = bl.update(tmp_path / "F.zarr")
    assert res.report["updated"]["how"].startswith("recomputed: triplet(s)")
    _check_factors(res, np.vstack([a, new]), center=False, dtype=np.float64)
    assert bl.update(tmp_path / "F.zarr").report["current"]  # recomputed updatable: current again


def test_updatable_refusals(tmp_path):
    a, new, path = _grown(tmp_path, noise=1e-6)
    with pytest.raises(ParameterError, match="updatable: needs out="):
        bl.svd(path, K, updatable=True)
    with pytest.raises(ParameterError, match="updatable: needs a tall A"):
        bl.svd(bl.from_array(a[:40], tmp_path / "W.zarr"), 3, out=tmp_path / "FW.zarr", updatable=True)
    with pytest.raises(ParameterError, match="single-pass sketch"):  # centered: tests/update/test_update_sketch.py
        bl.pca(path, K, method="sketch", out=tmp_path / "FS.zarr", updatable=True)
    with pytest.raises(ParameterError, match="updatable: must be True or False"):
        bl.svd(path, K, out=tmp_path / "FX.zarr", updatable="yes")
    # refused for what it is, not first for a budget it would then be refused at
    with pytest.raises(ParameterError, match="single-pass sketch"):
        bl.svd(path, K, method="sketch", center=True, out=tmp_path / "FS.zarr", updatable=True, memory="16KiB")
    with pytest.raises(ParameterError, match="updatable: needs a tall A"):
        bl.svd(bl.from_array(a[:40], tmp_path / "W2.zarr"), 3, method="sketch", out=tmp_path / "FW.zarr",
               updatable=True, memory="16KiB")
    bl.svd(path, K, out=tmp_path / "F.zarr")
    bl.append(path, new)
    with pytest.raises(ParameterError, match="updatable=True.*--updatable"):
        bl.update(tmp_path / "F.zarr")


def test_cli_svd_updatable_then_update(tmp_path, capsys):
    a, new, path = _grown(tmp_path, noise=1e-6)
    np.save(tmp_path / "new.npy", new)
    assert main(["pca", str(path), "-k", str(K), "-o", str(tmp_path / "F.zarr"), "--updatable"]) == 0
    assert main(["append", str(path), str(tmp_path / "new.npy")]) == 0
    capsys.readouterr()
    assert main(["update", str(tmp_path / "F.zarr"), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["updated"]["scores"] == "rotated" and len(out["s"]) == K and out["converged"]


@pytest.mark.parametrize("scheduler", ["sync", "processes"])
def test_svd_update_on_every_scheduler(tmp_path, scheduler):
    a, new, path = _grown(tmp_path, noise=1e-6, offset=0.0)
    bl.svd(path, K, out=tmp_path / "F.zarr", updatable=True, scheduler=scheduler)
    bl.append(path, new)
    res = bl.update(tmp_path / "F.zarr", scheduler=scheduler)
    _check_factors(res, np.vstack([a, new]), center=False, dtype=np.float64, u_errors=res.report["u_errors"])


def test_svd_update_on_s3(s3):
    base, opts = s3
    rng = np.random.default_rng(3)
    a, new = _rows(rng, 600, noise=1e-6), _rows(rng, 50, noise=1e-6)
    bl.from_array(a, f"{base}/A.zarr", chunks=(128, N), storage_options=opts)
    bl.pca(f"{base}/A.zarr", K, out=f"{base}/F.zarr", updatable=True, storage_options=opts)
    bl.append(f"{base}/A.zarr", new, storage_options=opts)
    res = bl.update(f"{base}/F.zarr", storage_options=opts)
    assert res.report["updated"]["scores"] == "rotated"
    _check_factors(res, np.vstack([a, new]), center=True, dtype=np.float64, u_errors=res.report["u_errors"])


def test_updatable_pca_costs_no_pass_on_the_gram_route(tmp_path):
    """The centered Gram route's means pass makes the co-moments anyway: kept without another pass."""
    a, new, path = _grown(tmp_path, noise=1e-6)
    plain = bl.pca(path, K, memory="1MiB")
    kept = bl.pca(path, K, out=tmp_path / "F.zarr", updatable=True, memory="1MiB")
    assert plain.report["method"] == kept.report["method"] == "gram" and not plain.report["in_core"]
    assert kept.report["passes"] == plain.report["passes"]
    bl.append(path, new)
    res = bl.update(tmp_path / "F.zarr", memory="1MiB")
    _check_factors(res, np.vstack([a, new]), center=True, dtype=np.float64, u_errors=res.report["u_errors"])


def test_update_of_factors_kept_without_u(tmp_path):
    """return_singular_vectors='vh': no scores stored, none written; V and s of the grown matrix."""
    a, new, path = _grown(tmp_path, noise=1e-6, offset=0.0)
    bl.svd(path, K, return_singular_vectors="vh", out=tmp_path / "F.zarr", updatable=True)
    bl.append(path, new)
    res = bl.update(tmp_path / "F.zarr")
    assert res.U is None and res.report["updated"]["scores"] is None and res.report["updated"]["rows_read"] == 120
    _check_factors(res, np.vstack([a, new]), center=False, dtype=np.float64)


def test_updated_scores_have_the_same_bits_on_every_scheduler(tmp_path):
    """The new U is written in chunk bands, each by one task from its own rows: the scheduler and the
    number of tasks at once change nothing."""
    a, new, path = _grown(tmp_path, noise=1e-6)
    for name in ("F1.zarr", "F2.zarr", "F3.zarr"):
        bl.pca(path, K, out=tmp_path / name, updatable=True)
    bl.append(path, new)
    got = [bl.update(tmp_path / name, **kw) for name, kw in (("F1.zarr", {"scheduler": "sync"}),
                                                            ("F2.zarr", {"scheduler": "threads", "workers": 2}),
                                                            ("F3.zarr", {"scheduler": "processes", "workers": 2}))]
    assert got[0].report["updated"]["scores"] == "rotated" and got[1].report["tasks"] > 2
    u = [r.svd.U.to_numpy() for r in got]
    assert np.array_equal(u[0], u[1]) and np.array_equal(u[0], u[2])


@pytest.mark.parametrize("kind", ["svd", "pca"])
@pytest.mark.parametrize("mean", ["zero", "nonzero"])
def test_update_refuses_a_standardized_column_whose_variance_left_the_range(tmp_path, kind, mean):
    """``scale=True``: new rows that put entries ``2^-600`` into a column that was zero (summing to 0, or
    not) are refused by name, as ``svd`` refuses such a column: their squares underflow, so the merged
    co-moments gave the column variance 0 and the update standardized it as a constant column (finite,
    wrong singular values, converged=True). The result kept is unchanged."""
    rng = np.random.default_rng(4)
    a = rng.standard_normal((400, 8))
    a[:, 3] = 0.0
    bl.from_array(a, tmp_path / "A.zarr", chunks=(100, 8))
    fit = (lambda *a, **kw: bl.svd(*a, center=True, **kw)) if kind == "svd" else bl.pca  # pca centers
    fit(tmp_path / "A.zarr", 3, out=tmp_path / "F.zarr", updatable=True, scale=True)
    before = {p.name: p.read_bytes() for p in (tmp_path / "F.zarr").rglob("*") if p.is_file()}
    new = rng.standard_normal((40, 8))
    new[:, 3] = (np.tile([1.0, -1.0], 20) if mean == "zero" else 1.0 + rng.random(40)) * 2.0**-600
    bl.append(tmp_path / "A.zarr", new)
    with pytest.raises(ParameterError, match=r"scale: needs each column's variance.*column 4"):
        bl.update(tmp_path / "F.zarr")
    assert {p.name: p.read_bytes() for p in (tmp_path / "F.zarr").rglob("*") if p.is_file()} == before
    # the fix the message gives: that column times a power of two near 1 / its largest magnitude, then a
    # fresh fit matches NumPy's standardized SVD of the grown matrix
    grown = np.vstack([a, new])
    grown[:, 3] *= 2.0**600
    z = (grown - grown.mean(axis=0)) / grown.std(axis=0)
    ref = np.linalg.svd(z, compute_uv=False)[:3]
    got = bl.svd(bl.from_array(grown, tmp_path / "B.zarr", chunks=(100, 8)), 3, center=True, scale=True)
    assert_singular_values(got.s, ref, n=grown.shape[0], gram=True)  # the Gram route's bound covers every method


@pytest.mark.parametrize("dtype", [np.float64, np.complex128])
def test_co_moments_beyond_range_are_named(tmp_path, dtype):
    """A column near 2^600: its squares overflow the kept co-moments. Refused naming the overflow (of
    complex data the message had said "a largest column sum of squares of nan": inf - inf)."""
    a = np.random.default_rng(0).standard_normal((200, 3)).astype(dtype)
    a[:, 1] *= 2.0 ** 600
    bl.from_array(a, tmp_path / "A.zarr", chunks=(64, 3))
    with pytest.raises(ParameterError, match="updatable: .*got column sums of squares beyond float64's range.*"
                                             "scale A by a power of two"):
        bl.svd(tmp_path / "A.zarr", 1, out=tmp_path / "S.zarr", updatable=True)


@pytest.mark.parametrize("sparse", [False, True])
@pytest.mark.parametrize("kind", ["svd", "pca"])
def test_co_moments_that_underflow_to_zero_are_named(tmp_path, kind, sparse):
    """Every entry near 2^-600: the centered squares (2^-1200) underflow to exactly 0, which the bound on the
    largest sum of squares (``0 < top < tiny / eps``) let pass, so zero co-moments were kept; after an append
    the update read the grown matrix as having no variance (a PCA's ``explained_variance_ratio_`` NaN with a
    warning that every column is constant; found by a randomized search, 2026-12-07). Refused as the overflow
    is, for a dense and a stored sparse matrix; constant columns of a normal size keep their 0 co-moments."""
    import scipy.sparse

    a = np.ldexp(np.random.default_rng(0).standard_normal((40, 6)), -600)
    A = bl.from_sparse(scipy.sparse.csr_matrix(a), tmp_path / "S.zarr") if sparse else \
        bl.from_array(a, tmp_path / "A.zarr", chunks=(16, 6))
    with pytest.raises(ParameterError, match=r"^updatable: .*got column sums of squares that underflowed to 0 "
                                             r"\(column 0 holds nonzero entries.*scale A by a power of two"):
        getattr(bl, kind)(A, 2, out=tmp_path / "F.zarr", updatable=True, seed=0)
    assert not (tmp_path / "F.zarr").exists()
    c = np.full((6, 3), 3.0)  # constant columns: no variance, squares in range
    C = bl.from_sparse(scipy.sparse.csr_matrix(c), tmp_path / "C.zarr") if sparse else bl.from_array(c, tmp_path / "C.zarr")
    bl.svd(C, 1, out=tmp_path / "G.zarr", updatable=True, seed=0)


@pytest.mark.filterwarnings("error::RuntimeWarning")  # the overflowing merge is blocklin's to name, not NumPy's
def test_a_refused_recompute_says_it_came_from_the_update(tmp_path):
    """Rows of 1e200 appended (their own co-moments 0, merged with the old ones inf): the update had
    raised ValueError ("array must not contain infs or NaNs") from the eigensolver; it recomputes, the
    recompute refuses to keep co-moments, and the message says that the update recomputed and that the
    result is unchanged (not a refusal of an svd call the user never made)."""
    a = np.random.default_rng(0).standard_normal((200, 3))
    bl.from_array(a, tmp_path / "A.zarr", chunks=(64, 3))
    bl.svd(tmp_path / "A.zarr", 1, out=tmp_path / "S.zarr", updatable=True)
    bl.append(tmp_path / "A.zarr", np.full((2, 3), 1e200))
    with pytest.raises(ParameterError, match="updatable: keeps A's co-moments.*the update recomputed .*S.zarr from "
                                             "every row, since the grown matrix's co-moments .*leave float64's "
                                             "range; the result is unchanged"):
        bl.update(tmp_path / "S.zarr")
    assert bl.update.__globals__["status"](tmp_path / "S.zarr")["inputs"][0]["rows_then"] == 200


@pytest.mark.parametrize("placement", PLACEMENTS)
def test_pca_update_and_open_give_the_pca_wherever_it_ran(tmp_path, placement, request):
    """The update of a stored PCA, and ``bl.open`` of its group after it, are the ``PCAResult`` (its
    variances from the merged co-moments) on every scheduler and device: the grown matrix's factors to
    the bounds of :func:`_check_factors`, the open group's attributes the update's bits."""
    kw = placement_kwargs(placement, request)
    a, new, path = _grown(tmp_path, noise=1e-6)
    bl.pca(path, K, out=tmp_path / "P.zarr", updatable=True, **kw)
    bl.append(path, new)
    res = bl.update(tmp_path / "P.zarr", **kw)
    assert type(res).__name__ == "PCAResult" and res.n_components_ == K
    _check_factors(res, np.vstack([a, new]), center=True, dtype=np.float64, u_errors=res.svd.report["u_errors"])
    o = bl.open(tmp_path / "P.zarr")
    assert type(o).__name__ == "PCAResult"
    for name in ("components_", "explained_variance_", "singular_values_", "mean_"):
        np.testing.assert_array_equal(np.asarray(getattr(o, name)), np.asarray(getattr(res, name)), err_msg=name)
