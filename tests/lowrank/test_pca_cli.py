"""CLI: blocklin pca, svd --center/--scale, and negative numbers as option values."""

from __future__ import annotations

import json

import numpy as np
import pytest
from sklearn.decomposition import PCA

import blocklin as bl
from blocklin.cli.main import main
from support.tolerances import (assert_explained_variance, assert_mean, assert_product, assert_singular_values,
                        assert_std)


@pytest.fixture
def data(tmp_path):
    rng = np.random.default_rng(0)
    a = rng.standard_normal((800, 4)) * [6.0, 3.0, 2.0, 1.0] @ rng.standard_normal((4, 25))
    a += 0.01 * rng.standard_normal(a.shape) + 40.0
    path = str(tmp_path / "a.zarr")
    bl.from_array(a, path, chunks=(100, 25))
    return a, path


def test_pca_json_matches_sklearn(tmp_path, data, capsys):
    a, path = data
    (tmp_path / "t").mkdir()
    assert main(["pca", path, "-k", "3", "--json", "--seed", "0", "--memory", "128KiB", "--power-iters", "4",
                 "--temp-dir", str(tmp_path / "t")]) == 0
    out = json.loads(capsys.readouterr().out)
    ref = PCA(n_components=3, svd_solver="full").fit(a)
    # float64 data, a gap of 100 after the sketch's width: agreement to rounding, at the size of the means
    assert_explained_variance(out["explained_variance"], ref.explained_variance_, out["explained_variance_ratio"],
                              ref.explained_variance_ratio_, a)
    assert out["operation"] == "pca" and out["passes"] == 4 + 1 and "output" not in out
    assert [p for p in (tmp_path / "t").rglob("*") if p.is_file()] == []


def test_pca_out_and_human(tmp_path, data, capsys):
    a, path = data
    out = tmp_path / "p.zarr"
    assert main(["pca", path, "-k", "2", "-o", str(out), "--scale", "--seed", "1"]) == 0
    text = capsys.readouterr().out
    assert "explain" in text and str(out) in text
    import zarr

    g = zarr.open_group(str(out), mode="r")
    assert_mean(g["mean"][:], a)
    assert_std(g["scale"][:], a)


def test_svd_center_flag(tmp_path, data, capsys):
    a, path = data
    assert main(["svd", path, "-k", "3", "-o", str(tmp_path / "f.zarr"), "--center", "--json", "--seed", "0"]) == 0
    out = json.loads(capsys.readouterr().out)
    s0 = np.linalg.svd(a - a.mean(axis=0), compute_uv=False)[:3]
    # the centered products are rounded at ||A|| (means included): Weyl with s_1 of the uncentered A
    assert_singular_values(out["s"], s0, n=a.shape[0], s1=np.linalg.norm(a, 2), gram=out["method"] == "gram")
    assert out["center"] is True and out["scale"] is False


@pytest.mark.parametrize("value", ["-3.3e-06", "-2", "-.5", "-1E+3"])
def test_negative_numbers_as_option_values(tmp_path, value, capsys):
    x = np.arange(12.0).reshape(3, 4)
    pa, pb = str(tmp_path / "a.zarr"), str(tmp_path / "b.zarr")
    bl.from_array(x, pa)
    bl.from_array(x.T.copy(), pb)
    assert main(["gemm", pa, pb, "-o", str(tmp_path / "c.zarr"), "--alpha", value, "--json"]) == 0
    assert_product(bl.open(str(tmp_path / "c.zarr")).to_numpy(), float(value) * (x @ x.T), x, x.T, alpha=float(value))


@pytest.mark.parametrize("argv", [["gemm", "a.zarr", "b.zarr", "-o", "c.zarr"], ["factor", "cholesky", "a.zarr", "-o", "l.zarr"]])
@pytest.mark.parametrize("value", ["-5MiB", "-1GB", "-0.5KiB"])
def test_negative_memory_refused_by_its_own_check(argv, value, capsys):
    # a negative size is --memory's value, refused by the size check naming the rule and the fix; argparse
    # had read it as an option and said "expected one argument"
    with pytest.raises(SystemExit) as info:
        main(argv + ["--memory", value])
    err = capsys.readouterr().err
    assert info.value.code == 2 and "argument --memory: must be a byte size" in err and f"got '{value}'" in err, err
    assert "Fix: " in err and "expected one argument" not in err


def test_unknown_dash_option_still_refused(capsys):
    with pytest.raises(SystemExit):
        main(["gemm", "a", "b", "-o", "c", "--alpha", "-x"])


@pytest.mark.parametrize("which", ["LA", "SA", "LM"])
def test_eigsh_order(which, tmp_path):
    rng = np.random.default_rng(0)
    q, _ = np.linalg.qr(rng.standard_normal((120, 120)))
    lam = np.linspace(-6, 4, 120)
    a = (q * lam) @ q.T
    a = (a + a.T) / 2
    up = bl.eigsh(a, 3, which=which, seed=0, temp_dir=str(tmp_path))
    down = bl.eigsh(a, 3, which=which, seed=0, order="descending", temp_dir=str(tmp_path))
    np.testing.assert_array_equal(up.w, np.sort(up.w))  # SciPy's convention by default
    key = np.abs(down.w) if which == "LM" else down.w
    np.testing.assert_array_equal(key, np.sort(key)[::-1])
    # the same pairs, columns moved with their values
    order = np.argsort(-np.abs(up.w) if which == "LM" else -up.w, kind="stable")
    np.testing.assert_array_equal(down.V, up.V[:, order])


def test_convert_refuses_arrays_with_a_fix(tmp_path):
    from blocklin.errors import ParameterError

    with pytest.raises(ParameterError, match="src.*from_array"):
        bl.convert(np.ones((3, 3)), str(tmp_path / "x.zarr"))


def test_pca_of_data_with_no_variance_says_so(tmp_path, capsys):
    """Constant data: the ratios are nan (0 / 0, as scikit-learn's): the line says the data have no
    variance instead of explaining 'nan%' of it, and the JSON holds null for each ratio."""
    path = str(tmp_path / "c.zarr")
    bl.from_array(np.full((40, 5), 3.0), path)
    with pytest.warns(bl.errors.BlocklinWarning, match="no variance"):
        assert main(["pca", path, "-k", "2"]) == 0
    line = capsys.readouterr().out
    assert "of data with no variance" in line and "nan%" not in line
    with pytest.warns(bl.errors.BlocklinWarning, match="no variance"):
        assert main(["pca", path, "-k", "2", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["explained_variance_ratio"] == [None, None]
