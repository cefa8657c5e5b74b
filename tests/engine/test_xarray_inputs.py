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
