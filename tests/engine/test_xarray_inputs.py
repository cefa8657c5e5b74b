"""xarray ``DataArray`` inputs (NumPy- and Dask-backed) to ``pca``, ``svd``, ``solve`` and ``gram``: the
results carry the dimensions and coordinates they map to (xeofs' conventions: a ``mode`` dimension
counted from 1), and their values are those of the same call on the bare data, bit for bit (the labels
change no arithmetic; the unlabelled results are checked against their references elsewhere)."""

from __future__ import annotations

import numpy as np
import pytest

import blocklin as bl

xr = pytest.importorskip("xarray")


@pytest.fixture(params=["numpy", "dask"])
def field(request):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((600, 12)) @ rng.standard_normal((12, 12)) + 3.0
    da = xr.DataArray(x, dims=("time", "station"),
                      coords={"time": np.arange(600) * 0.5, "station": [f"s{i}" for i in range(12)]})
    return x, (da if request.param == "numpy" else da.chunk({"time": 128}))


def test_pca_results_are_labelled(field):
    x, X = field
    p = bl.pca(X, 3, memory="64KiB", seed=1)
    ref = bl.pca(x, 3, memory="64KiB", seed=1)
    assert p.components_.dims == ("mode", "station") and list(p.components_["mode"].values) == [1, 2, 3]
    assert list(p.components_["station"].values) == list(X["station"].values)
    assert np.array_equal(p.components_.values, ref.components_)
    assert p.explained_variance_.dims == ("mode",) and np.array_equal(p.explained_variance_.values,
                                                                      ref.explained_variance_)
    assert p.mean_.dims == ("station",) and np.array_equal(p.mean_.values, ref.mean_)
    scores = p.transform(X)
    assert scores.dims == ("time", "mode") and np.array_equal(scores["time"].values, X["time"].values)
    assert np.array_equal(scores.values, ref.transform(x))
    back = p.inverse_transform(scores)
    assert back.dims == ("time", "station") and np.array_equal(back.values, ref.inverse_transform(ref.transform(x)))
    assert isinstance(p.transform(x), np.ndarray)  # bare samples stay bare


def test_svd_factors_are_labelled_and_lazy(field):
    x, X = field
    U, s, Vt = res = bl.svd(X, 4, seed=2, memory="64KiB")
    ref = bl.svd(x, 4, seed=2, memory="64KiB")
    assert U.dims == ("time", "mode") and s.dims == ("mode",) and Vt.dims == ("mode", "station")
    assert U.chunks is not None  # Dask-backed over the stored factor: nothing loaded
    assert np.array_equal(U.values, ref.U.to_numpy()) and np.array_equal(s.values, ref.s)
    assert np.array_equal(Vt.values, ref.Vt) and isinstance(res.stored.U, bl.Matrix)
    assert bl.svd(X, 2, return_singular_vectors=False, seed=2).dims == ("mode",)


def test_solve_and_gram_are_labelled(field):
    x, X = field
    y = np.random.default_rng(3).standard_normal(600)
    Y = xr.DataArray(y, dims=("time",))
    sol = bl.solve(X, Y)
    assert sol.dims == ("station",) and list(sol["station"].values) == list(X["station"].values)
    assert np.array_equal(sol.values, bl.solve(x, y).to_numpy().ravel())
    Y2 = xr.DataArray(np.stack([y, 2 * y], axis=1), dims=("time", "target"), coords={"target": ["a", "b"]})
    sol2 = bl.solve(X, Y2)
    assert sol2.dims == ("station", "target") and list(sol2["target"].values) == ["a", "b"]
    G = bl.gram(X)
    assert G.dims == ("station", "station_2")
    assert np.array_equal(G.values, bl.gram(x).to_numpy())
    Gt = bl.gram(X, trans=True, memory="16MiB")
    assert Gt.dims == ("time", "time_2") and Gt.shape == (600, 600)


def test_other_operations_take_the_data():
    X = xr.DataArray(np.eye(20) * 4.0, dims=("i", "j"))
    assert np.array_equal(bl.cholesky(X).to_numpy(), np.eye(20) * 2.0)


def _ridge(x, y, lam, intercept=False):
    """NumPy's ridge solution (and intercept) of ``min ||x w + 1 c - y||^2 + lam^2 ||w||^2``."""
    mu, ybar = (x.mean(axis=0), y.mean(axis=0)) if intercept else (np.zeros(x.shape[1]), np.zeros(y.shape[1:]))
    xc, yc = x - mu, y - ybar
    w = np.linalg.solve(xc.T @ xc + lam**2 * np.eye(x.shape[1]), xc.T @ yc)
    return w, ybar - mu @ w


def test_solve_keeps_both_column_dimensions_when_they_share_a_name():
    # (until 2026-12-06, found by a randomized search: x was over ('station', 'station') with B's labels on A's
    # features: the coordinates merged and the second dimension of one name was never renamed)
    rng = np.random.default_rng(6)
    x, y = rng.standard_normal((50, 3)), rng.standard_normal((50, 2))
    A = xr.DataArray(x, dims=("time", "station"), coords={"station": ["s1", "s2", "s3"]})
    B = xr.DataArray(y, dims=("time", "station"), coords={"station": ["s4", "s5"]})
    sol = bl.solve(A, B)
    assert sol.dims == ("station", "station_2") and sol.shape == (3, 2)
    assert list(sol["station"].values) == ["s1", "s2", "s3"] and list(sol["station_2"].values) == ["s4", "s5"]
    assert np.allclose(sol.values, np.linalg.lstsq(x, y, rcond=None)[0], rtol=1e-12, atol=1e-14)
    # a NumPy matrix b's columns are "rhs": renamed too where A's columns are called so
    sol = bl.solve(xr.DataArray(x, dims=("time", "rhs")), y)
    assert sol.dims == ("rhs", "rhs_2") and np.allclose(sol.values, np.linalg.lstsq(x, y, rcond=None)[0])


def test_a_mode_dimension_of_the_input_gives_the_components_another_name():
    # (until 2026-12-06, found by a randomized search: U was over ('mode', 'mode') with the samples' coordinates
    # replaced by 1..k, and a feature dimension called mode raised CoordinateValidationError after the SVD)
    x = np.random.default_rng(5).standard_normal((30, 4))
    d = xr.DataArray(x, dims=("mode", "feat"), coords={"mode": np.arange(100, 130), "feat": list("abcd")})
    U, s, Vt = bl.svd(d, 2, seed=0)
    ref = np.linalg.svd(x, full_matrices=False)
    assert U.dims == ("mode", "mode_2") and s.dims == ("mode_2",) and Vt.dims == ("mode_2", "feat")
    assert np.array_equal(U["mode"].values, np.arange(100, 130)) and list(U["mode_2"].values) == [1, 2]
    assert np.allclose(s.values, ref.S[:2], rtol=1e-10)
    assert np.allclose(np.abs(U.values.T @ ref.U[:, :2]), np.eye(2), atol=1e-8)
    U2, s2, Vt2 = bl.svd(xr.DataArray(x, dims=("t", "mode"), coords={"mode": list("abcd")}), 2, seed=0)
    assert U2.dims == ("t", "mode_2") and Vt2.dims == ("mode_2", "mode") and list(Vt2["mode"].values) == list("abcd")
    assert np.allclose(s2.values, ref.S[:2], rtol=1e-10)
    p, p0 = bl.pca(d, 2, seed=0), bl.pca(x, 2, seed=0)
    assert p.components_.dims == ("mode_2", "feat") and p.explained_variance_.dims == ("mode_2",)
    scores = p.transform(d)
    assert scores.dims == ("mode", "mode_2") and np.array_equal(scores["mode"].values, np.arange(100, 130))
    assert np.allclose(scores.values, p0.transform(x))
    pf = bl.pca(xr.DataArray(x, dims=("t", "mode")), 2, seed=0)
    assert pf.components_.dims == ("mode_2", "mode") and pf.transform(xr.DataArray(x, dims=("t", "mode"))).dims \
        == ("t", "mode_2")


def test_labelled_solve_keeps_the_intercept_and_report():
    # (until 2026-12-06, found by a randomized search: the labelled x had no intercept, report or cv_results_)
    rng = np.random.default_rng(3)
    x = rng.standard_normal((100, 4))
    y = x @ np.arange(1.0, 5.0) + 5.0
    X = xr.DataArray(x, dims=("t", "f"), coords={"f": list("abcd")})
    sol = bl.solve(X, xr.DataArray(y, dims=("t",)), lam=0.0, fit_intercept=True)
    assert sol.dims == ("f",) and np.allclose(sol.values, np.arange(1.0, 5.0), rtol=1e-12)
    assert isinstance(sol.intercept, np.ndarray) and np.allclose(sol.intercept, [5.0], rtol=1e-12)
    assert sol.report["intercept"] == pytest.approx([5.0]) and sol.report["method"] == "normal"
    assert isinstance(sol.stored, bl.Matrix) and np.array_equal(sol.stored.to_numpy().ravel(), sol.values)
    y2 = np.stack([y, rng.standard_normal(100)], axis=1)
    Y2 = xr.DataArray(y2, dims=("t", "target"), coords={"target": ["u", "v"]})
    sol2 = bl.solve(X, Y2, lam=0.5, fit_intercept=True)
    w, c = _ridge(x, y2, 0.5, intercept=True)
    assert np.allclose(sol2.values, w, rtol=1e-10, atol=1e-12)
    assert sol2.intercept.dims == ("target",) and list(sol2.intercept["target"].values) == ["u", "v"]
    assert np.allclose(sol2.intercept.values, c, rtol=1e-10)
    assert not hasattr(bl.solve(X, Y2), "cv_results_") and bl.solve(X, Y2).intercept is None  # as the Matrix
    loo = bl.solve(X, Y2, lam=("loo", [0.1, 1.0]), store_cv_results=True)
    assert np.array_equal(loo.cv_results_, bl.solve(x, y2, lam=("loo", [0.1, 1.0]), store_cv_results=True).cv_results_)
    import pickle

    back = pickle.loads(pickle.dumps(sol2))
    assert type(back) is type(sol2) and np.array_equal(back.values, sol2.values)
    assert np.allclose(back.intercept.values, c, rtol=1e-10)


def test_labelled_rows_must_agree_and_are_never_matched_by_position():
    # (until 2026-12-06, found by a randomized search: b = a's rows in reverse order gave the position-matched
    # solution, silently)
    rng = np.random.default_rng(4)
    x = rng.standard_normal((60, 3))
    y = x @ np.array([1.0, -2.0, 0.5]) + 0.01 * rng.standard_normal(60)
    t = np.arange(60)
    A = xr.DataArray(x, dims=("t", "f"), coords={"t": t})
    b = xr.DataArray(y, dims=("t",), coords={"t": t})
    with pytest.raises(bl.errors.ParameterError, match=r"b: must have the coordinates of a along the shared row "
                       r"dimension 't'.*t\[0\] = 0 in a but 59 in b.*b\.sel\(t=a\.t\)"):
        bl.solve(A, b[::-1])
    with pytest.raises(bl.errors.ParameterError, match=r"b: must have the row dimension of a \('t'\) first"):
        bl.solve(A, xr.DataArray(np.stack([y, y]), dims=("k", "t"), coords={"t": t}))
    ref = np.linalg.lstsq(x, y, rcond=None)[0]
    assert np.allclose(bl.solve(A, b[::-1].sel(t=A.t)).values, ref, rtol=1e-10)
    assert np.allclose(bl.solve(A, xr.DataArray(y, dims=("t",))).values, ref, rtol=1e-10)  # no labels: by position
    # pca.transform: the fitted features only
    X = xr.DataArray(x, dims=("t", "f"), coords={"f": ["p", "q", "r"]})
    p = bl.pca(X, 2, seed=0)
    with pytest.raises(bl.errors.ParameterError, match=r"x: must have the fitted coordinates along the feature "
                       r"dimension 'f'.*f\[0\] = 'p' when fitted but 'r' in x.*x\.sel\(f=model\.mean_\.f\)"):
        p.transform(X[:, ::-1])
    with pytest.raises(bl.errors.ParameterError, match="x: must have the fitted feature dimension 'f' last"):
        p.transform(X[:3].T)
    assert np.allclose(p.transform(X[:, ::-1].sel(f=p.mean_.f)).values, bl.pca(x, 2, seed=0).transform(x))


def test_lstsq_takes_dataarrays():
    # (until 2026-12-06, found by a randomized search: IndexError, the inner svd returned a labelled s)
    rng = np.random.default_rng(7)
    x, y = rng.standard_normal((40, 5)), rng.standard_normal((40, 2))
    t = np.arange(40)
    A = xr.DataArray(x, dims=("t", "f"), coords={"t": t})
    B = xr.DataArray(y, dims=("t", "k"), coords={"t": t})
    sol, res, rank, s = bl.lstsq(A.chunk({"t": 16}), B)
    ref = np.linalg.lstsq(x, y, rcond=None)
    assert isinstance(sol, np.ndarray) and rank == ref[2] == 5
    assert np.allclose(sol, ref[0], rtol=1e-10) and np.allclose(res, ref[1], rtol=1e-10)
    assert np.allclose(s, ref[3], rtol=1e-12)
    assert np.allclose(bl.lstsq(A, y[:, 0])[0], ref[0][:, 0], rtol=1e-10)
    with pytest.raises(bl.errors.ParameterError, match="b: must have the coordinates of a"):
        bl.lstsq(A, B[::-1])


def test_labelled_solve_of_a_lambda_sequence_has_a_lam_dimension():
    # (until 2026-12-06, found by a randomized search: CoordinateValidationError after the solve had run, x held
    # L blocks of k columns on b's k labels)
    rng = np.random.default_rng(8)
    x, y = rng.standard_normal((80, 4)), rng.standard_normal((80, 2))
    lams = [0.1, 1.0, 3.0]
    X = xr.DataArray(x, dims=("t", "f"), coords={"f": list("abcd")})
    Y = xr.DataArray(y, dims=("t", "target"), coords={"target": ["u", "v"]})
    sol = bl.solve(X, Y, lam=lams, fit_intercept=True)
    assert sol.dims == ("f", "lam", "target") and sol.shape == (4, 3, 2)
    assert list(sol["lam"].values) == lams and list(sol["target"].values) == ["u", "v"]
    assert sol.intercept.dims == ("lam", "target")
    for j, lam in enumerate(lams):
        w, c = _ridge(x, y, lam, intercept=True)
        assert np.allclose(sol.sel(lam=lam).values, w, rtol=1e-9, atol=1e-12)
        assert np.allclose(sol.intercept.sel(lam=lam).values, c, rtol=1e-9, atol=1e-12)
    vec = bl.solve(X, xr.DataArray(y[:, 0], dims=("t",)), lam=lams)
    assert vec.dims == ("f", "lam")
    assert np.allclose(vec.values, np.stack([_ridge(x, y[:, 0], lam)[0] for lam in lams], axis=1), rtol=1e-9)
    named = bl.solve(xr.DataArray(x, dims=("t", "lam")), y, lam=lams)  # A's features called lam
    assert named.dims == ("lam", "lam_2", "rhs") and list(named["lam_2"].values) == lams


def test_products_of_a_dataarray_and_a_matrix(tmp_path):
    """``X @ M`` with a ``DataArray`` on the left is refused by xarray before blocklin is asked (``DataArray.dot``
    raises ``TypeError: dot only operates on DataArrays``; ``np.matmul(X, M)`` xarray's ``NotImplementedError`` for
    generalized ufuncs), never a wrong product. ``np.dot(X, M)``, ``blocklin.matmul(X, M)`` and ``M @ Y`` take the
    ``DataArray``'s data by position (an unlabelled ``Matrix``, as every other operation): NumPy's product within
    the product bound ``2 k eps ||A||_F ||B||_F`` (support.tolerances), NumPy- and Dask-backed alike."""
    from support.tolerances import assert_product

    rng = np.random.default_rng(7)
    x, m, y = rng.standard_normal((6, 5)), rng.standard_normal((5, 4)), rng.standard_normal((4, 3))
    M = bl.from_array(m, tmp_path / "m.zarr")
    for X in (xr.DataArray(x, dims=("time", "station")), xr.DataArray(x, dims=("time", "station")).chunk({"time": 4})):
        with pytest.raises(TypeError, match="dot only operates on DataArrays"):
            X @ M
        with pytest.raises(NotImplementedError, match="generalized ufuncs"):
            np.matmul(X, M)
        for got in (np.dot(X, M), bl.matmul(X, M)):
            assert isinstance(got, bl.Matrix)
            assert_product(got.to_numpy(), x @ m, x, m)
    got = M @ xr.DataArray(y, dims=("feature", "target"))
    assert isinstance(got, bl.Matrix)
    assert_product(got.to_numpy(), m @ y, m, y)


@pytest.fixture
def blocklin_chunk_manager(monkeypatch):
    """xarray's chunk managers with blocklin's, as its ``xarray.chunkmanagers`` entry point in ``pyproject.toml``
    declares it (the installed package's metadata lists it once installed; this checkout may run from a copy
    installed before it was added)."""
    import importlib.metadata
    import pathlib
    import tomllib

    from xarray.namedarray import parallelcompat

    project = tomllib.loads((pathlib.Path(__file__).parents[2] / "pyproject.toml").read_text())["project"]
    declared = project["entry-points"]["xarray.chunkmanagers"]
    assert declared == {"blocklin": "blocklin.linalg.interop.xarray_chunks:MatrixChunkManager"}
    ours = [importlib.metadata.EntryPoint(name=k, value=v, group="xarray.chunkmanagers") for k, v in declared.items()]
    real = parallelcompat.entry_points
    monkeypatch.setattr(parallelcompat, "entry_points",
                        lambda group: [e for e in real(group=group) if e.name not in declared] + ours)
    parallelcompat.list_chunkmanagers.cache_clear()
    yield
    parallelcompat.list_chunkmanagers.cache_clear()


def test_a_dataarray_of_a_matrix_loads_to_numpy(tmp_path, blocklin_chunk_manager):
    """xarray takes a duck array with ``chunks`` for a chunked array of some chunk manager; none claimed
    ``Matrix``, so ``.load()``, ``.compute()`` and ``.chunk()`` of ``xr.DataArray(M)`` raised "Could not find a
    Chunk Manager which recognises type Matrix". blocklin's manager loads it whole into NumPy (the values, bit
    for bit), chunks it into the Dask array over its store, and refuses xarray's lazy operations on the handle
    itself naming ``M.to_dask()``; Dask stays xarray's default manager."""
    x = np.random.default_rng(4).standard_normal((7, 5))
    M = bl.from_array(x, tmp_path / "m.zarr", chunks=(3, 2))
    da = xr.DataArray(M, dims=("time", "station"), coords={"time": np.arange(7)})
    loaded = da.load()
    assert isinstance(loaded.data, np.ndarray) and np.array_equal(loaded.values, x)
    got = xr.DataArray(M, dims=("time", "station")).compute()
    assert isinstance(got.data, np.ndarray) and np.array_equal(got.values, x)
    ds = xr.Dataset({"m": xr.DataArray(M, dims=("time", "station"))}).load()
    assert isinstance(ds["m"].data, np.ndarray) and np.array_equal(ds["m"].values, x)
    lazy = xr.DataArray(M, dims=("time", "station")).chunk({"time": 4})
    assert type(lazy.data).__module__.startswith("dask") and lazy.chunks[0] == (4, 3)
    assert np.array_equal(lazy.values, x)
    with pytest.raises(bl.errors.ParameterError, match=r"^data: a blocklin\.Matrix in an xarray object .*Fix: wrap "
                       r"its Dask array instead: xr\.DataArray\(M\.to_dask\(\)"):
        xr.apply_ufunc(np.sin, xr.DataArray(M, dims=("time", "station")), dask="parallelized")
    plain = xr.DataArray(x, dims=("time", "station")).chunk({"time": 4})  # Dask's, as before
    assert type(plain.data).__module__.startswith("dask") and np.array_equal(plain.load().values, x)
