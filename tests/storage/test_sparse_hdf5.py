"""HDF5 groups holding a CSR or CSC matrix (anndata, 10x Genomics, h5sparse, plain) to ``blocklin-csr``.

Conversions do no arithmetic but duplicate sums, so the results are compared exactly with SciPy's
canonical CSR (duplicates summed, indices sorted); where duplicates are summed the values are
integers, so every summation order gives the same bits.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import scipy.sparse

import blocklin
from blocklin.cli.main import main
from blocklin.errors import BudgetError, ConfigError, DTypeError, FormatError, NonFiniteError
from support.hostile import leftovers

h5py = pytest.importorskip("h5py")


def _canonical(x) -> scipy.sparse.csr_matrix:
    c = scipy.sparse.csr_matrix(x, copy=True)
    c.sum_duplicates()
    c.sort_indices()
    return c


def _assert_same(got, want) -> None:
    want = _canonical(want)
    assert got.shape == want.shape and got.dtype == want.dtype
    np.testing.assert_array_equal(got.indptr, want.indptr)
    np.testing.assert_array_equal(got.indices, want.indices)
    np.testing.assert_array_equal(got.data, want.data)  # bit-identical (NaN-free here)


def _write(path, name, arrays, *, attrs=None, shape_dataset=None, extra=None, mode="a"):
    """A group ``name`` of ``path`` with the datasets ``arrays`` (and ``extra``) and ``attrs``."""
    with h5py.File(path, mode) as f:
        g = f.create_group(name)
        for k, v in {**arrays, **(extra or {})}.items():
            g.create_dataset(k, data=v)
        if shape_dataset is not None:
            g.create_dataset("shape", data=np.asarray(shape_dataset, np.uint64))
        for k, v in (attrs or {}).items():
            g.attrs[k] = v


def _parts(x) -> dict:
    return {"data": x.data, "indices": x.indices, "indptr": x.indptr}


def _anndata(path, name, x, fmt):
    y = x.tocsr() if fmt == "csr" else x.tocsc()
    _write(path, name, _parts(y), attrs={"encoding-type": f"{fmt}_matrix", "encoding-version": "0.1.0",
                                         "shape": np.asarray(x.shape, np.int64)})


def _nothing_left(tmp_path, *outputs):
    assert leftovers(tmp_path) == []
    for out in outputs:
        assert not (tmp_path / out).exists()


def _random(rng, m, n, k, dtype):
    r, c = rng.integers(0, m, k), rng.integers(0, n, k)
    v = rng.integers(-9, 10, k).astype(dtype)
    if np.dtype(dtype).kind == "f":
        v /= 4  # quarters: exact in float32 and float64
    return scipy.sparse.coo_matrix((v, (r, c)), shape=(m, n))


# -- the layouts --------------------------------------------------------------------------------------

@pytest.mark.parametrize("fmt", ["csr", "csc"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int64])
def test_anndata_groups_match_scipy(tmp_path, rng, fmt, dtype):
    x = _canonical(_random(rng, 70, 45, 600, dtype))
    _anndata(tmp_path / "a.h5ad", "X", x, fmt)
    rep = blocklin.convert(f"{tmp_path / 'a.h5ad'}:/X", tmp_path / "x.zarr", memory="64MiB")
    assert rep["layout"] == "sparse" and rep["from"] == "hdf5" and rep["sparse_format"] == fmt
    assert rep["convention"] == "anndata" and rep["dtype"] == np.dtype(dtype).name
    s = blocklin.open(tmp_path / "x.zarr")
    assert s.dtype == np.dtype(dtype) and s.nnz == x.nnz == rep["nnz"]
    _assert_same(s.to_scipy(), x)
    assert s.provenance["params"]["sparse_format"] == fmt and s.provenance["params"]["group"] == "/X"


def test_tenx_matrix_is_features_by_barcodes_csc(tmp_path, rng):
    """10x Genomics: /matrix holds a CSC matrix (one column per barcode) with a shape dataset and uint32
    counts; no attribute says CSC."""
    counts = _canonical(scipy.sparse.random(60, 25, density=0.2, random_state=2) * 50).astype(np.uint32)
    csc = counts.tocsc()
    csc.indptr, csc.indices = csc.indptr.astype(np.int64), csc.indices.astype(np.int64)
    _write(tmp_path / "f.h5", "matrix", _parts(csc), shape_dataset=counts.shape,
           extra={"barcodes": np.array([b"AAAC-%d" % i for i in range(25)])})
    with h5py.File(tmp_path / "f.h5", "a") as f:
        f["matrix"].create_group("features").create_dataset("id", data=np.array([b"g%d" % i for i in range(60)]))
    rep = blocklin.convert(f"{tmp_path / 'f.h5'}:/matrix", tmp_path / "f.zarr")
    assert rep["convention"] == "10x" and rep["sparse_format"] == "csc" and rep["dtype"] == "uint32"
    _assert_same(blocklin.open(tmp_path / "f.zarr").to_scipy(), counts)


def test_h5sparse_and_plain_groups(tmp_path, rng):
    x = _canonical(_random(rng, 30, 80, 300, np.float64))
    _write(tmp_path / "h.h5", "sparse/matrix", _parts(x),
           attrs={"h5sparse_format": "csr", "h5sparse_shape": np.asarray(x.shape)})
    rep = blocklin.convert(f"{tmp_path / 'h.h5'}:/sparse/matrix", tmp_path / "h.zarr")
    assert rep["convention"] == "h5sparse"
    _assert_same(blocklin.open(tmp_path / "h.zarr").to_scipy(), x)
    _write(tmp_path / "p.h5", "M", _parts(x.tocsc()), attrs={"format": b"csc", "shape": np.asarray(x.shape)})
    blocklin.convert(f"{tmp_path / 'p.h5'}:/M", tmp_path / "p.zarr")
    _assert_same(blocklin.open(tmp_path / "p.zarr").to_scipy(), x)


def test_undeterminable_format_is_refused_then_named(tmp_path, rng, capsys):
    x = _canonical(_random(rng, 40, 40, 200, np.float64))
    _write(tmp_path / "u.h5", "M", _parts(x.tocsc()), shape_dataset=x.shape)
    with pytest.raises(ConfigError, match=r"sparse_format: an HDF5 group .* must say whether it is CSR or CSC.*"
                                          r"--sparse-format csr or --sparse-format csc"):
        blocklin.convert(f"{tmp_path / 'u.h5'}:/M", tmp_path / "u.zarr")
    _nothing_left(tmp_path, "u.zarr")
    assert main(["convert", f"{tmp_path / 'u.h5'}:/M", str(tmp_path / "u.zarr"), "--sparse-format", "csc",
                 "--no-progress"]) == 0
    _assert_same(blocklin.open(tmp_path / "u.zarr").to_scipy(), x)
    _anndata(tmp_path / "u.h5", "A", x, "csr")
    with pytest.raises(ConfigError, match="sparse_format: must agree with what the group says"):
        blocklin.convert(f"{tmp_path / 'u.h5'}:/A", tmp_path / "v.zarr", sparse_format="csc")
    np.save(tmp_path / "d.npy", np.ones((2, 2)))
    with pytest.raises(ConfigError, match="sparse_format: applies to an HDF5 group"):
        blocklin.convert(tmp_path / "d.npy", tmp_path / "d.zarr", sparse_format="csr")
    _nothing_left(tmp_path, "v.zarr", "d.zarr")


# -- bounded memory: several row blocks (CSR, streamed) and several runs (CSC, sorted) ------------------

@pytest.mark.parametrize("fmt", ["csr", "csc"])
def test_budget_forces_several_blocks(tmp_path, rng, fmt):
    m, n, k = 4000, 3000, 450_000  # a 13 MiB budget holds about 176000 entries a block, 878 rows
    coo = _random(rng, m, n, k, np.float64)
    major, minor = (coo.row, coo.col) if fmt == "csr" else (coo.col, coo.row)
    order = np.argsort(major, kind="stable")  # compressed, minor indices unsorted and repeated
    indptr = np.concatenate([[0], np.cumsum(np.bincount(major, minlength=m if fmt == "csr" else n))])
    parts = {"data": coo.data[order], "indices": minor[order], "indptr": indptr}
    _write(tmp_path / "b.h5", "X", parts, attrs={"encoding-type": f"{fmt}_matrix", "shape": [m, n]})
    rep = blocklin.convert(f"{tmp_path / 'b.h5'}:/X", tmp_path / "b.zarr", memory="13MiB")
    assert rep["row_blocks"] > 2 and rep["planned_memory"] <= 13 * 2**20
    assert rep["runs"] == (0 if fmt == "csr" else rep["row_blocks"]) and (fmt == "csr" or rep["runs"] > 2)
    _assert_same(blocklin.open(tmp_path / "b.zarr").to_scipy(), coo)
    _nothing_left(tmp_path)


def test_one_row_beyond_the_budget_is_refused(tmp_path):
    n = 400_000
    x = scipy.sparse.csr_matrix((np.ones(n), np.arange(n), [0, n, n]), shape=(2, n))
    _anndata(tmp_path / "r.h5", "X", x, "csr")
    with pytest.raises(BudgetError, match=f"row 1 holds {n} entries.*--memory") as info:
        blocklin.convert(f"{tmp_path / 'r.h5'}:/X", tmp_path / "r.zarr", memory="13MiB")
    _nothing_left(tmp_path, "r.zarr")
    hint = str(info.value).rsplit("--memory ", 1)[1].rstrip(")")
    assert blocklin.convert(f"{tmp_path / 'r.h5'}:/X", tmp_path / "r.zarr", memory=hint)["nnz"] == n


# -- hostile input: refused, nothing left behind ------------------------------------------------------

def _hostile(kind):
    x = scipy.sparse.csr_matrix(([1.0, 2.0, 3.0], [0, 2, 1], [0, 2, 2, 3]), shape=(3, 4))
    parts = {k: np.array(v) for k, v in _parts(x).items()}
    shape = [3, 4]
    if kind == "indptr decreasing":
        parts["indptr"] = np.array([0, 2, 1, 3])
    elif kind == "indptr short of nnz":
        parts["indptr"] = np.array([0, 1, 2, 2])
    elif kind == "index out of range":
        parts["indices"] = np.array([0, 4, 1])
    elif kind == "shape disagrees":
        shape = [4, 4]
    elif kind == "negative index":
        parts["indices"] = np.array([0, -1, 1])
    elif kind == "nan":
        parts["data"] = np.array([1.0, np.nan, 3.0])
    return parts, shape


HOSTILE = {
    "indptr decreasing": (FormatError, "indptr must .*non-decreasing"),
    "indptr short of nnz": (FormatError, "indptr must .*end at nnz"),
    "index out of range": (FormatError, r"hdf5 input: (column|row) indices must lie in 0..[23]; got 4"),
    "negative index": (FormatError, r"indices must lie in 0..[23]; got -1"),
    "shape disagrees": (FormatError, "arrays must agree with its shape"),
    "nan": (NonFiniteError, "must not hold NaN when nan='error'.*--nan allow"),
}


@pytest.mark.parametrize("fmt", ["csr", "csc"])
@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_hostile_groups_are_refused_and_leave_nothing(tmp_path, case, fmt):
    parts, shape = _hostile(case)
    if fmt == "csc":  # the same arrays read as CSC: the transpose's shape
        shape = shape[::-1]
    _write(tmp_path / "h.h5", "X", parts, attrs={"encoding-type": f"{fmt}_matrix", "shape": shape})
    error, pattern = HOSTILE[case]
    with pytest.raises(error, match=pattern):
        blocklin.convert(f"{tmp_path / 'h.h5'}:/X", tmp_path / "h.zarr", nan="error")
    _nothing_left(tmp_path, "h.zarr")


def test_dense_datasets_and_other_groups(tmp_path, rng):
    x = _canonical(_random(rng, 12, 9, 40, np.float64))
    _anndata(tmp_path / "m.h5", "X", x, "csr")
    with h5py.File(tmp_path / "m.h5", "a") as f:
        f.create_dataset("dense/A", data=np.arange(12.0).reshape(3, 4))
        f.create_group("obs").create_dataset("names", data=np.arange(12))
    blocklin.convert(f"{tmp_path / 'm.h5'}:/dense/A", tmp_path / "a.zarr")  # a dataset stays dense
    a = blocklin.open(tmp_path / "a.zarr")
    assert isinstance(a, blocklin.Matrix)
    np.testing.assert_array_equal(a.to_numpy(), np.arange(12.0).reshape(3, 4))
    with pytest.raises(FormatError, match=r"hdf5 input: a group must hold a sparse matrix.*/obs/names"):
        blocklin.convert(f"{tmp_path / 'm.h5'}:/obs", tmp_path / "o.zarr")
    _anndata(tmp_path / "only.h5ad", "X", x, "csr")
    with pytest.raises(FormatError, match=r"hdf5 input: must name the group of a sparse matrix.*\['/X'\].*only.h5ad:/X"):
        blocklin.convert(tmp_path / "only.h5ad", tmp_path / "o.zarr")
    with pytest.raises(FormatError, match="layout: an HDF5 sparse group converts to a sparse matrix only"):
        blocklin.convert(f"{tmp_path / 'm.h5'}:/X", tmp_path / "d.zarr", layout="dense")
    with pytest.raises(FormatError, match="out: a sparse matrix is written to a .zarr group"):
        blocklin.convert(f"{tmp_path / 'm.h5'}:/X", tmp_path / "x.npy")
    with pytest.raises(ConfigError, match="checksum: applies to dense outputs only"):
        blocklin.convert(f"{tmp_path / 'm.h5'}:/X", tmp_path / "c.zarr", checksum=True)
    _nothing_left(tmp_path, "o.zarr", "d.zarr", "x.npy", "c.zarr")


# -- command line -------------------------------------------------------------------------------------

def test_cli_convert_and_info(tmp_path, rng, capsys):
    x = _canonical(_random(rng, 50, 30, 300, np.float32))
    _anndata(tmp_path / "a.h5ad", "X", x, "csr")
    _anndata(tmp_path / "a.h5ad", "layers/counts", x, "csc")
    assert main(["convert", f"{tmp_path / 'a.h5ad'}:/X", str(tmp_path / "a.zarr"), "--memory", "32MiB",
                 "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "sparse float32" in out and "1 row block streamed from CSR" in out
    assert main(["convert", f"{tmp_path / 'a.h5ad'}:/layers/counts", str(tmp_path / "c.zarr"), "--json",
                 "--no-progress"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["sparse_format"] == "csc" and d["runs"] == 1 and d["nnz"] == x.nnz
    assert main(["info", str(tmp_path / "a.zarr")]) == 0
    out = capsys.readouterr().out
    assert "blocklin-csr" in out and "50 x 30" in out and f"{x.nnz} stored" in out and "convert of" in out
    for name in ("a.zarr", "c.zarr"):
        _assert_same(blocklin.open(tmp_path / name).to_scipy(), x)
    with pytest.raises(SystemExit):
        main(["convert", "--help"])
    assert "--sparse-format" in capsys.readouterr().out


# -- peak memory: a group several times the budget ------------------------------------------------------

_MEM_CODE = """
import json, sys
import numpy, scipy.sparse, zarr, h5py
import blocklin
from blocklin.storage import sparse_convert, sparse_hdf5  # noqa: F401 - imported in the baseline too
args = json.loads(sys.argv[1])
report = None
if args:
    report = blocklin.convert(args["src"], args["out"], memory=args["memory"])
    report = {k: report[k] for k in ("planned_memory", "runs", "row_blocks", "nnz")}
print(json.dumps({"peak": hwm(), "report": report}))
"""


@pytest.mark.slow  # about 4 s: two conversions of 1.5 million entries in child processes
@pytest.mark.parametrize("fmt", ["csr", "csc"])
def test_conversion_stays_within_budget(tmp_path, fmt):
    """1.5 million entries (18 MB of CSR arrays, 36 MB of sort runs for CSC) at a 24 MiB budget: the
    child's peak above an import baseline stays within the budget and support.memcheck's margin
    (measured: 13.8 MiB for CSR, streamed in 11 row blocks; 12.5 MiB for CSC, 11 runs)."""
    from support.memcheck import margin, needs_hwm, run_child

    if needs_hwm.args[0]:
        pytest.skip(needs_hwm.kwargs["reason"])
    budget, entries = 24 * 2**20, 1_500_000
    rng = np.random.default_rng(6)
    m, n = 50_000, 20_000
    major, minor = (m, n) if fmt == "csr" else (n, m)
    counts = rng.multinomial(entries, np.ones(major) / major)
    parts = {"indptr": np.concatenate([[0], np.cumsum(counts)]), "indices": rng.integers(0, minor, entries),
             "data": rng.integers(-99, 100, entries).astype(np.float64)}  # unsorted, with repeats
    _write(tmp_path / "big.h5", "X", parts, attrs={"encoding-type": f"{fmt}_matrix", "shape": [m, n]})
    base = run_child(_MEM_CODE, json.dumps({}))["peak"]
    res = run_child(_MEM_CODE, json.dumps({"src": f"{tmp_path / 'big.h5'}:/X", "out": str(tmp_path / "o.zarr"),
                                           "memory": budget}))
    rep = res["report"]
    assert rep["row_blocks"] >= 4 and rep["planned_memory"] <= budget and rep["nnz"] > 0.95 * entries
    used = res["peak"] - base
    assert used <= budget + margin(budget), f"{used / 2**20:.1f} MiB above the baseline for a 24 MiB budget"
    _nothing_left(tmp_path)


@pytest.mark.parametrize("fmt", ["csr", "csc"])
def test_a_narrower_float_dtype_refuses_a_value_it_cannot_hold(tmp_path, fmt):
    """``dtype=`` narrower than the values: a finite value beyond the narrower float's range is refused
    naming its entry, on the streamed CSR path (rows in order, no sort) as on the sorted CSC one (it
    became inf on the streamed path); values in range are stored as NumPy casts them."""
    y = scipy.sparse.csr_matrix(np.array([[1.5, 0, 0], [0, 7e44, 0], [0, 0, 1e-9]]))
    _anndata(tmp_path / "y.h5ad", "X", y, fmt)
    with pytest.raises(DTypeError, match=r"dtype: must hold every value .*7e\+44 at entry 1"):
        blocklin.convert(f"{tmp_path / 'y.h5ad'}:/X", tmp_path / "y.zarr", dtype="float32")
    _nothing_left(tmp_path, "y.zarr")
    z = scipy.sparse.csr_matrix(np.array([[1.5, 0, 0], [0, 7e4, 0], [0, 0, 1e-9]]))
    _anndata(tmp_path / "z.h5ad", "X", z, fmt)
    blocklin.convert(f"{tmp_path / 'z.h5ad'}:/X", tmp_path / "z.zarr", dtype="float32")
    got = blocklin.open(tmp_path / "z.zarr").to_scipy()
    assert got.dtype == np.float32 and np.array_equal(got.toarray(), z.toarray().astype(np.float32))


def test_complex_hdf5_data_is_refused_naming_the_dataset_and_the_rewrite(tmp_path, capsys):
    """Complex values HDF5 files hold in other writers' layout (a compound of ``real``/``imag`` or ``re``/``im``
    floats) had been refused as "must hold numbers (bool, integer, float or complex)" without the dataset's
    name or a way out, and a sparse group's complex values as "must hold real numbers; got complex128. Fix:
    convert the values to a numeric dtype" (complex128 is numeric). Each refusal names the dataset, the rule,
    what it holds and a fix that works: the rewrite it names converts to the complex matrix."""
    z = (np.arange(6.0) + 1j * np.arange(6.0)[::-1]).reshape(3, 2)
    h5 = tmp_path / "c.h5"
    with h5py.File(h5, "w") as f:
        for re, im in (("real", "imag"), ("re", "im")):
            rec = np.empty(z.shape, dtype=[(re, "<f8"), (im, "<f8")])
            rec[re], rec[im] = z.real, z.imag
            f[f"d_{re}"] = rec
    for re, im in (("real", "imag"), ("re", "im")):
        with pytest.raises(DTypeError, match=rf"^hdf5 dataset /d_{re}: must hold numbers; complex values must be in "
                                             rf"h5py's complex layout.*got complex values as a compound of fields "
                                             rf"'{re}' and '{im}' \(float64 each\)\. Fix: rewrite them"):
            blocklin.convert(f"{h5}:/d_{re}", tmp_path / "z.zarr")
        _nothing_left(tmp_path, "z.zarr")
    with h5py.File(h5, "r+") as f:  # the rewrite the fix names
        f["/d_real_c"] = f["/d_real"]["real"] + 1j * f["/d_real"]["imag"]
    blocklin.convert(f"{h5}:/d_real_c", tmp_path / "z.zarr")
    np.testing.assert_array_equal(blocklin.open(tmp_path / "z.zarr").to_numpy(), z)
    x = scipy.sparse.csr_matrix(([1.0 + 2j, 2.0, 3.0j], [0, 2, 1], [0, 2, 2, 3]), shape=(3, 4))
    _write(tmp_path / "s.h5", "X", _parts(x), attrs={"encoding-type": "csr_matrix", "shape": [3, 4]})
    with pytest.raises(DTypeError, match=r"^hdf5 dataset /X/data: must hold real numbers: a sparse matrix is "
                                         r"converted with real values only.*; got complex values \(complex128\)\. "
                                         r"Fix: write the real and imaginary parts as two real groups"):
        blocklin.convert(f"{tmp_path / 's.h5'}:/X", tmp_path / "s.zarr")
    _nothing_left(tmp_path, "s.zarr")
    assert main(["convert", f"{h5}:/d_re", str(tmp_path / "y.zarr")]) != 0
    assert "hdf5 dataset /d_re: must hold numbers; complex values" in capsys.readouterr().err
